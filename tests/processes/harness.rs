//! The one harness every process test runs the real binary through: its command,
//! spawned with its log in the test's directory and killed if the test fails, run
//! to its end within a limit, signalled as an operator or an orchestrator would,
//! waited for until a condition or a log line holds; and the configuration files
//! the tests write, built from tables rather than copied text.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support;

const BINARY: &str = env!("CARGO_BIN_EXE_mssql-ces");

/// How long a run that is expected to end may take before the test fails: a bound
/// for a loaded machine (a debug build through the stand-in), not an expectation.
pub(crate) const RUN_LIMIT: Duration = Duration::from_secs(240);

/// `mssql-ces <args> --config <config>`, its output discarded until the caller
/// says where it goes.
pub(crate) fn command(args: &[&str], config: &Path) -> Command {
    let mut command = Command::new(BINARY);
    command
        .args(args)
        .arg("--config")
        .arg(config)
        .stdout(Stdio::null());
    command
}

/// `mssql-ces <args>` with no configuration (`probe`, `schema`, `--help`).
pub(crate) fn bare(args: &[&str]) -> Command {
    let mut command = Command::new(BINARY);
    command.args(args);
    command
}

/// Runs `command` to its end within [`RUN_LIMIT`] and returns what it printed;
/// past the limit the child is killed and the test fails naming `what`.
pub(crate) fn output(command: &mut Command, what: &str) -> Output {
    support::tools::output_within(command, RUN_LIMIT, what)
}

/// `mssql-ces run --until-idle --config <config>` to its end within [`RUN_LIMIT`].
pub(crate) fn run_until_idle(config: &Path, what: &str) -> Output {
    output(&mut command(&["run", "--until-idle"], config), what)
}

/// Runs `command` to its end from a test on tokio's runtime, whose workers go on
/// serving (a stand-in) meanwhile, with its standard error in `<dir>/<name>.log`;
/// past [`RUN_LIMIT`] the child is killed and the test fails naming `what`.
pub(crate) async fn run_logged(
    mut command: Command,
    dir: &Path,
    name: &str,
    what: &str,
) -> ExitStatus {
    let log = log_file(dir, name);
    command.stderr(log);
    let what = format!("{what}; logs in {}", dir.display());
    tokio::task::spawn_blocking(move || {
        support::tools::status_within(&mut command, RUN_LIMIT, &what)
    })
    .await
    .expect("the wait")
}

/// `<dir>/<name>.log`, created for a child's standard error.
fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(format!("{name}.log"))).expect("log")
}

/// Both of a finished command's streams, as text, for assertions and failures.
pub(crate) fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `mssql-ces run --config <config> <extra>`, its log in `<dir>/<name>.log`.
pub(crate) fn spawn(config: &Path, dir: &Path, name: &str, extra: &[&str]) -> Running {
    let mut command = command(&["run"], config);
    command.args(extra);
    spawn_logged(command, dir, name)
}

/// Starts `command` with its standard error in `<dir>/<name>.log`.
pub(crate) fn spawn_logged(mut command: Command, dir: &Path, name: &str) -> Running {
    let log = log_file(dir, name);
    Running::new(command.stderr(log).spawn().expect("spawn mssql-ces"))
}

/// A spawned binary that is killed when dropped: a test that fails while it runs
/// leaves no process behind to load the machine for the tests after it.
pub(crate) struct Running(Child);

impl Running {
    /// Takes a child the test spawned itself.
    pub(crate) fn new(child: Child) -> Self {
        Running(child)
    }
}

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Already ended (the usual case): both are no-ops that fail harmlessly.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `signal` to the child.
pub(crate) fn signal(child: &Child, signal: i32) {
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// Asks the child to stop as an orchestrator does (SIGTERM) and waits for it to
/// end within a minute; returns how it ended.
pub(crate) fn stop(child: &mut Child, logs: &Path, what: &str) -> ExitStatus {
    signal(child, libc::SIGTERM);
    exit_within(child, Duration::from_secs(60), logs, what)
}

/// Waits for `child` (what the test calls `what`) to end within `limit`; past it the
/// child is killed and the test fails, naming the directory of its logs.
pub(crate) fn exit_within(
    child: &mut Child,
    limit: Duration,
    logs: &Path,
    what: &str,
) -> ExitStatus {
    support::tools::wait_within(child, limit).unwrap_or_else(|| {
        panic!(
            "{what} did not end within {limit:?} (killed); logs in {}",
            logs.display()
        )
    })
}

/// Polls `check` every 50 ms until it holds, failing the test once `limit` passed
/// without it, saying it waited for `what`.
pub(crate) fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to a minute for the file checkpoint at `path` to hold a delivered event:
/// the run is past its start and publishing. A test that lets a run go before it
/// acts on it waits for this rather than for a time a loaded machine may not keep.
pub(crate) fn wait_for_delivery(path: &Path) {
    wait_until(
        &format!("a delivered event in {}", path.display()),
        Duration::from_secs(60),
        || std::fs::read_to_string(path).is_ok_and(|text| text.contains("\"last_event\"")),
    );
}

/// [`wait_until`] for a minute from a test on tokio's multi-threaded runtime: the
/// runtime's other workers go on serving (a stand-in, a simulator's clock) while
/// this one waits. The failure names the directory of the logs.
pub(crate) fn wait_in_runtime(what: &str, logs: &Path, check: impl FnMut() -> bool) {
    let what = format!("{what}; logs in {}", logs.display());
    tokio::task::block_in_place(|| wait_until(&what, Duration::from_secs(60), check));
}

/// Waits up to `limit` for the log at `log` to hold a line containing `needle`,
/// and returns that line; the failure shows the log.
pub(crate) fn wait_for_line(log: &Path, needle: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains(needle)) {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no line with {needle:?} in {} within {limit:?}:\n{text}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The random moments of a kill test (how long to let a run go, which member to
/// stop): a xorshift generator seeded from `MSSQL_CES_TEST_SEED` when it is set, to
/// replay a failure, else from the clock. A failure while it lives names its seed.
pub(crate) struct Moments {
    state: u64,
    seed: support::Seed,
}

impl Moments {
    pub(crate) fn new() -> Self {
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos() as u64);
        let seed = support::test_seeds(&[clock]).pop().expect("one seed");
        Moments {
            // xorshift never leaves zero.
            state: seed.0 | 1,
            seed,
        }
    }

    /// The seed, for a test's own messages.
    pub(crate) fn seed(&self) -> u64 {
        self.seed.0
    }

    /// A number in `low..high`.
    pub(crate) fn between(&mut self, low: u64, high: u64) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        low + self.state % (high - low)
    }

    /// A duration of `low..high` milliseconds.
    pub(crate) fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.between(low, high))
    }
}

/// The source section of a SQL Server source reached through the TDS stand-in,
/// whose connection string the test puts in `MSSQL_CES_TEST_STANDIN`.
pub(crate) const STANDIN_SOURCE: &str = "kind = \"sqlserver\"\nconnection_string = { env = \"MSSQL_CES_TEST_STANDIN\" }\nencrypt = false";

/// A configuration file a test writes: TOML tables in the order first named, each
/// with its lines in the order given, so that tests share the parts they have in
/// common (a file sink, a file checkpoint, the stand-in source) and state only what
/// is their own.
#[derive(Clone, Default)]
pub(crate) struct ConfigFile {
    tables: Vec<(String, Vec<String>)>,
}

impl ConfigFile {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds `lines` (`key = value` lines, `\n`-separated) to table `[table]`.
    pub(crate) fn set(mut self, table: &str, lines: &str) -> Self {
        let lines = lines
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned);
        match self.tables.iter_mut().find(|(name, _)| name == table) {
            Some((_, existing)) => existing.extend(lines),
            None => self.tables.push((table.to_owned(), lines.collect())),
        }
        self
    }

    /// A file sink writing to `path`.
    pub(crate) fn file_sink(self, path: &Path) -> Self {
        self.set(
            "sink",
            &format!("kind = \"file\"\npath = \"{}\"", path.display()),
        )
    }

    /// A file checkpoint at `path`, written every `interval_ms`.
    pub(crate) fn file_checkpoint(self, path: &Path, interval_ms: u64) -> Self {
        self.set(
            "checkpoint",
            &format!("path = \"{}\"\ninterval_ms = {interval_ms}", path.display()),
        )
    }

    /// The configuration's text.
    pub(crate) fn text(&self) -> String {
        let mut text = String::new();
        for (table, lines) in &self.tables {
            text.push_str(&format!("[{table}]\n"));
            for line in lines {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// Writes the text to `<dir>/config.toml` and returns that path.
    pub(crate) fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("config.toml");
        std::fs::write(&path, self.text()).expect("config");
        path
    }
}

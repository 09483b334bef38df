//! Running the real binary in the process tests: spawned with its log in the test's
//! directory, signalled as an operator or an orchestrator would, waited for within a
//! limit that fails the test saying where the logs are.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::support;

const BINARY: &str = env!("CARGO_BIN_EXE_mssql-ces");

/// `mssql-ces run --config <config> <extra>`, its log in `<dir>/<name>.log`.
pub(crate) fn spawn(config: &Path, dir: &Path, name: &str, extra: &[&str]) -> Running {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
    Running(
        Command::new(BINARY)
            .args(["run", "--config"])
            .arg(config)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn mssql-ces"),
    )
}

/// A spawned binary that is killed when dropped: a test that fails while it runs
/// leaves no process behind to load the machine for the tests after it.
pub(crate) struct Running(Child);

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

/// Polls `check` every 100 ms until it holds, failing the test once `limit` passed
/// without it, saying it waited for `what`.
pub(crate) fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

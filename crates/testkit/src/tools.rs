//! The programs the tests run beside cargo, as `bash tests/setup` installs them under
//! `target/test-tools`, and running a child process with a deadline.
//!
//! A test that needs a tool that is not installed fails with the command that
//! installs it; it never skips.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The command that installs every tool below.
pub const SETUP: &str = "bash tests/setup";

/// Where `tests/setup` installs: `$MSSQL_CES_TEST_TOOLS`, else `test-tools` in the
/// cargo target directory (`$CARGO_TARGET_DIR`, else the workspace's `target`).
pub fn dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MSSQL_CES_TEST_TOOLS") {
        return PathBuf::from(dir);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("test-tools")
}

fn installed(path: PathBuf, what: &str) -> PathBuf {
    assert!(
        path.exists(),
        "{what} is not installed ({} is missing): run `{SETUP}` (the README's test command, `bash tests/run`, does)",
        path.display()
    );
    path
}

/// The Python of the test environment, with Confluent's client and its Avro
/// deserializer (`tests/readers/requirements.txt`).
pub fn python() -> PathBuf {
    installed(dir().join("venv/bin/python"), "the tests' Python readers")
}

/// The class path of Apache Kafka 4.4.0 and the Java reader (`tests/kafka/`), by
/// canonical paths: the class-data archive ([`kafka_class_archive`]) holds for the
/// class path it was made with, which `tests/setup` spells the same way.
pub fn kafka_classpath() -> String {
    let kafka = installed(dir().join("kafka/lib"), "Apache Kafka 4.4.0");
    let classes = installed(dir().join("kafka/classes"), "the Java reader");
    let canonical = |path: PathBuf| std::fs::canonicalize(&path).unwrap_or(path);
    format!(
        "{}/*:{}",
        canonical(kafka).display(),
        canonical(classes).display()
    )
}

/// The class-data archive `tests/setup` makes of a broker's start, if it is there:
/// a JVM given it maps Kafka's classes from it instead of loading and verifying
/// them again (a broker starts on 60 % of the CPU time).
pub fn kafka_class_archive() -> Option<PathBuf> {
    Some(dir().join("kafka/kafka.jsa")).filter(|path| path.exists())
}

/// The log configuration of the test brokers.
pub fn kafka_log_config() -> PathBuf {
    installed(dir().join("kafka/log4j2.yaml"), "Apache Kafka 4.4.0")
}

/// Runs `command` to its end and returns what it printed, failing the test (after
/// killing the child) if it has not ended within `limit`; `what` says in the failure
/// what was waited for.
pub fn output_within(command: &mut Command, limit: Duration, what: &str) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: could not start {command:?}: {e}"));
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let Some(status) = wait_within(&mut child, limit) else {
        let printed = stderr.join().unwrap_or_default();
        panic!(
            "{what}: still running after {limit:?}, killed; it printed: {}",
            String::from_utf8_lossy(&printed)
        )
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// As [`output_within`], with `input` on the child's standard input.
pub fn output_with_input_within(
    command: &mut Command,
    input: &[u8],
    limit: Duration,
    what: &str,
) -> Output {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: could not start {command:?}: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input);
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let Some(status) = wait_within(&mut child, limit) else {
        panic!("{what}: still running after {limit:?}, killed");
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// Runs `command` as it is set up (its output where it sends it) and returns how it
/// ended, failing the test (after killing it) if it has not ended within `limit`.
pub fn status_within(
    command: &mut Command,
    limit: Duration,
    what: &str,
) -> std::process::ExitStatus {
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: could not start {command:?}: {e}"));
    wait_within(&mut child, limit)
        .unwrap_or_else(|| panic!("{what}: still running after {limit:?}, killed"))
}

/// Waits for `child` to end for at most `limit`: how it ended, or `None` once it
/// was killed (and reaped) at the limit.
pub fn wait_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut out);
        }
        out
    })
}

/// `future`, failing the test with `what` if it has not finished within `limit`.
pub async fn within<T>(
    what: &str,
    limit: Duration,
    future: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: not done within {limit:?}"),
    }
}

//! Running the real binary in the process tests: spawned with its log in the test's
//! directory, and signalled as an operator or an orchestrator would.

use std::path::Path;
use std::process::{Child, Command, Stdio};

const BINARY: &str = env!("CARGO_BIN_EXE_mssql-ces");

/// `mssql-ces run --config <config> <extra>`, its log in `<dir>/<name>.log`.
pub(crate) fn spawn(config: &Path, dir: &Path, name: &str, extra: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
    Command::new(BINARY)
        .args(["run", "--config"])
        .arg(config)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn mssql-ces")
}

/// Sends `signal` to the child.
pub(crate) fn signal(child: &Child, signal: i32) {
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

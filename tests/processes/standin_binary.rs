//! The real binary with `kind = "sqlserver"` against the TDS stand-in (a test double
//! following [MS-TDS], serving the synthetic workload; `support::tds`): the whole
//! SQL Server path — connection string, login, every query through tiberius, decoding
//! — writes the very bytes the synthetic source writes directly, also when killed at
//! random moments; and `check` passes through it.

use crate::harness::{self, ConfigFile, Moments, STANDIN_SOURCE, spawn_logged};
use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};
use support::tds::StandIn;
use support::temp_dir;

pub(crate) const USER: &str = "mssql_ces";
pub(crate) const PASSWORD: &str = "Ces_Poller_Passw0rd!";
const SEED: u64 = 17;
const TRANSACTIONS: u64 = 400;
const EXISTING_ROWS: u64 = 20_000;

fn workload() -> SyntheticConfig {
    SyntheticConfig {
        seed: SEED,
        transactions: Some(TRANSACTIONS),
        rate_per_second: None,
        large_value_every: 97,
        existing_rows: EXISTING_ROWS,
        oversized_value_every: 0,
    }
}

/// A configuration writing to `dir/events.jsonl`: from the stand-in when `sqlserver`,
/// else from the synthetic source in-process.
fn config(dir: &Path, sqlserver: bool) -> PathBuf {
    let config = if sqlserver {
        ConfigFile::new()
            .set("source", STANDIN_SOURCE)
            .set("source", "query_timeout_ms = 5000")
    } else {
        ConfigFile::new().set("source", "kind = \"synthetic\"").set(
            "source.synthetic",
            &format!(
                "seed = {SEED}\ntransactions = {TRANSACTIONS}\nrate_per_second = 0\nlarge_value_every = 97\nexisting_rows = {EXISTING_ROWS}"
            ),
        )
    };
    config
        .set("source", "poll_interval_ms = 20\nbatch_size = 200")
        .set("snapshot", "mode = \"initial\"\nchunk_size = 250")
        .set("event", "max_message_size_kb = 128")
        .file_sink(&dir.join("events.jsonl"))
        .file_checkpoint(&dir.join("cp.json"), 20)
        .write(dir)
}

/// `mssql-ces <args> --config <config>` connecting to `standin`.
pub(crate) fn command(config: &Path, standin: &StandIn, args: &[&str]) -> Command {
    let mut command = harness::command(args, config);
    command.env(
        "MSSQL_CES_TEST_STANDIN",
        standin.connection_string(USER, PASSWORD),
    );
    command
}

async fn standin() -> StandIn {
    let source = SyntheticSource::new(workload()).keep_history();
    StandIn::start(USER, PASSWORD, support::tds_cdc::handler(source))
        .await
        .expect("stand-in")
}

/// What the synthetic source writes in-process, uninterrupted.
async fn reference() -> Vec<u8> {
    let dir = temp_dir("standin-reference");
    let config = config(&dir, false);
    let run = harness::command(&["run", "--until-idle"], &config);
    let status = harness::run_logged(run, &dir, "run", "the synthetic reference run").await;
    assert!(status.success(), "logs in {}", dir.display());
    let bytes = std::fs::read(dir.join("events.jsonl")).expect("reference output");
    std::fs::remove_dir_all(dir).ok();
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kind_sqlserver_through_the_wire_writes_the_bytes_the_synthetic_source_writes() {
    let expected = reference().await;
    assert!(
        expected.split(|b| *b == b'\n').count() > EXISTING_ROWS as usize,
        "the load and the changes"
    );
    let standin = standin().await;
    let dir = temp_dir("standin-run");
    let config = config(&dir, true);
    let run = command(&config, &standin, &["run", "--until-idle"]);
    let status = harness::run_logged(run, &dir, "run", "the run through the stand-in").await;
    assert!(status.success(), "logs in {}", dir.display());
    let got = std::fs::read(dir.join("events.jsonl")).expect("output");
    assert_eq!(got.len(), expected.len(), "logs in {}", dir.display());
    assert!(got == expected, "byte for byte");

    let mut check = command(&config, &standin, &["check"]);
    check.stdout(Stdio::piped()).stderr(Stdio::null());
    let output = tokio::task::spawn_blocking(move || {
        harness::output(&mut check, "check through the stand-in")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{text}");
    assert!(text.contains(", 0 failed,"), "{text}");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_on_the_sqlserver_path_loses_nothing_and_ends_with_the_same_bytes() {
    let expected = reference().await;
    let standin = standin().await;
    let dir = temp_dir("standin-kills");
    let config = config(&dir, true);
    let mut moments = Moments::new();
    let seed = moments.seed();
    let mut cut_short = 0;
    for run in 0..6 {
        let mut child = spawn_logged(
            command(&config, &standin, &["run"]),
            &dir,
            &format!("run-{run}"),
        );
        tokio::time::sleep(moments.millis(50, 450)).await;
        child.kill().expect("kill");
        child.wait().expect("reap");
        let written = std::fs::metadata(dir.join("events.jsonl")).map_or(0, |m| m.len());
        if written > 0 && (written as usize) < expected.len() {
            cut_short += 1;
        }
    }
    assert!(cut_short > 0, "no kill landed mid-stream (seed {seed})");
    let last = command(&config, &standin, &["run", "--until-idle"]);
    let started = Instant::now();
    let status =
        harness::run_logged(last, &dir, "run-last", "the last run through the stand-in").await;
    assert!(
        status.success(),
        "final run after {:?} (seed {seed}); logs in {}",
        started.elapsed(),
        dir.display()
    );
    let got = std::fs::read(dir.join("events.jsonl")).expect("output");
    assert_eq!(
        got.len(),
        expected.len(),
        "seed {seed}; logs in {}",
        dir.display()
    );
    assert!(got == expected, "byte for byte (seed {seed})");
    println!("{cut_short} of 6 kills cut the stream short");
    std::fs::remove_dir_all(dir).ok();
}

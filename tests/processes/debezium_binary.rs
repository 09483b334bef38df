//! The binary with `event.format = "debezium"`, as a user runs it: the synthetic
//! source (a load, then changes as they come) into a file, read back by an
//! independent reader of Kafka Connect's JSON (`tests/readers/connect_json_reader.py`,
//! written from JsonConverter's and Debezium's rules), then killed and restarted.

use crate::harness::{self, ConfigFile};
use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::temp_dir;

/// The synthetic workload in Debezium's format, `extra` added to
/// `[event.debezium]`, to `dir/out.lines`.
fn config(dir: &Path, extra: &str) -> std::path::PathBuf {
    ConfigFile::new()
        .set("source", "kind = \"synthetic\"\npoll_interval_ms = 20")
        .set(
            "source.synthetic",
            "seed = 3\ntransactions = 300\nrate_per_second = 1000\nexisting_rows = 15",
        )
        .set("snapshot", "mode = \"initial\"")
        .set("event", "format = \"debezium\"")
        .set(
            "event.debezium",
            "topic_prefix = \"server1\"\nprovide_transaction_metadata = true",
        )
        .set("event.debezium", extra)
        .file_sink(&dir.join("out.lines"))
        .set("sink", "schema_changes = \"topic\"")
        .file_checkpoint(&dir.join("cp.json"), 20)
        .write(dir)
}

/// The reader's summary of `file`; fails the test with its errors.
fn read(file: &Path) -> serde_json::Value {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/readers/connect_json_reader.py"
    );
    let output = support::tools::output_within(
        Command::new(support::tools::python()).arg(script).arg(file),
        std::time::Duration::from_secs(120),
        "the Connect-style reader",
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("the reader prints a summary");
    assert!(
        output.status.success(),
        "a Connect-style reader refuses records: {summary}"
    );
    summary
}

#[test]
fn a_connect_style_reader_takes_every_record_through_a_kill_and_restart() {
    let dir = temp_dir("dbz-bin");
    let config = config(&dir, "");
    // Killed mid-run, then run to the end.
    let mut child = harness::spawn(&config, &dir, "run-1", &[]);
    let out = dir.join("out.lines");
    harness::wait_until("the first records", Duration::from_secs(60), || {
        std::fs::metadata(&out).is_ok_and(|m| m.len() > 0)
    });
    harness::signal(&child, libc::SIGKILL);
    let _ = child.wait();
    let mut child = harness::spawn(&config, &dir, "run-2", &["--until-idle"]);
    let status = harness::exit_within(&mut child, harness::RUN_LIMIT, &dir, "mssql-ces");
    assert!(status.success());
    let summary = read(&dir.join("out.lines"));
    let ops = &summary["ops"];
    for op in ["r", "c", "u", "d"] {
        assert!(ops[op].as_u64().unwrap_or(0) > 0, "{summary}");
    }
    assert_eq!(summary["tombstones"], ops["d"], "{summary}");
    // One CREATE per table, before its first event (four tables in the source).
    assert_eq!(summary["schema_changes"], 4, "{summary}");
    // Transactions the load covers are in it, not in the stream.
    assert!(
        summary["transactions"].as_u64().unwrap_or(0) > 100,
        "{summary}"
    );
    // Exactly once in the file: the restart cut what the checkpoint did not cover.
    let text = std::fs::read_to_string(dir.join("out.lines")).expect("out");
    let mut ids = std::collections::HashSet::new();
    for line in text.lines() {
        let record: serde_json::Value = serde_json::from_str(line).expect("json");
        let id = record["headers"]["id"].as_str().expect("id").to_owned();
        assert!(ids.insert(id), "a record written twice: {line}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn settings_that_do_not_combine_with_the_format_are_refused_by_name() {
    let dir = temp_dir("dbz-refused");
    for (extra, setting) in [
        ("transaction_topic = 5", "transaction_topic"),
        ("decimal_handling_mode = \"exact\"", "decimal_handling_mode"),
    ] {
        let config = config(&dir, extra);
        let output = harness::run_until_idle(&config, "a run with a refused setting");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(setting), "{stderr}");
    }
    std::fs::remove_dir_all(dir).ok();
}

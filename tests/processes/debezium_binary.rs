//! The binary with `event.format = "debezium"`, as a user runs it: the synthetic
//! source (a load, then changes as they come) into a file, read back by an
//! independent reader of Kafka Connect's JSON (`tests/readers/connect_json_reader.py`,
//! written from JsonConverter's and Debezium's rules), then killed and restarted.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::temp_dir;

const BINARY: &str = env!("CARGO_BIN_EXE_mssql-ces");

fn config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[source]
kind = "synthetic"
poll_interval_ms = 20
[source.synthetic]
seed = 3
transactions = 300
rate_per_second = 1000
existing_rows = 15
[snapshot]
mode = "initial"
[event]
format = "debezium"
[event.debezium]
topic_prefix = "server1"
provide_transaction_metadata = true
{extra}
[sink]
kind = "file"
path = "{out}"
schema_changes = "topic"
[checkpoint]
path = "{cp}"
interval_ms = 20
"#,
            out = dir.join("out.lines").display(),
            cp = dir.join("cp.json").display(),
        ),
    )
    .expect("config");
    path
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
    let mut child = crate::binary::spawn(&config, &dir, "run-1", &[]);
    std::thread::sleep(Duration::from_millis(150));
    crate::binary::signal(&child, libc::SIGKILL);
    let _ = child.wait();
    let mut child = crate::binary::spawn(&config, &dir, "run-2", &["--until-idle"]);
    let status =
        crate::binary::exit_within(&mut child, Duration::from_secs(120), &dir, "mssql-ces");
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
        let output = Command::new(BINARY)
            .args(["run", "--until-idle", "--config"])
            .arg(&config)
            .output()
            .expect("run");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(setting), "{stderr}");
    }
    std::fs::remove_dir_all(dir).ok();
}

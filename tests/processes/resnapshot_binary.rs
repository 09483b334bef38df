//! `mssql-ces snapshot` against the real binary streaming the synthetic workload to
//! a file: the re-snapshot asked through the admin endpoint goes out while changes
//! stream on, survives a SIGTERM and a restart, and what cannot be asked is refused
//! by name.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::harness::{self, ConfigFile, exit_within, signal, spawn, wait_until};
use crate::support::temp_dir;

const ROWS: usize = 60_000;

fn write_config(dir: &Path, port: u16) -> PathBuf {
    ConfigFile::new()
        .set("source", "kind = \"synthetic\"\npoll_interval_ms = 50")
        .set(
            "source.synthetic",
            &format!("seed = 5\nexisting_rows = {ROWS}\ntransactions = 0\nrate_per_second = 300"),
        )
        .set("snapshot", "chunk_size = 100")
        .file_sink(&dir.join("out.jsonl"))
        .file_checkpoint(&dir.join("cp.json"), 50)
        .set(
            "metrics",
            &format!("listen = \"127.0.0.1:{port}\"\nadmin = \"loopback\""),
        )
        .write(dir)
}

fn snapshot(config: &Path, args: &[&str]) -> Output {
    harness::output(
        harness::command(&["snapshot"], config).args(args),
        "mssql-ces snapshot",
    )
}

/// The re-snapshot's rows in the output: loaded rows (`beginlsn` zero) at `at`.
fn resnapshot_rows(out: &Path, at: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|event| {
            let data: serde_json::Value = serde_json::from_str(event["data"].as_str()?).ok()?;
            let transaction = &data["eventsource"]["transaction"];
            let loaded = transaction["beginlsn"] == "00000000:00000000:0000"
                && transaction["commitlsn"] == at;
            loaded.then_some(data)
        })
        .collect()
}

#[test]
fn a_table_asked_for_is_re_read_while_changes_stream_and_resumes_after_a_restart() {
    let dir = temp_dir("resnapshot-binary");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let config = write_config(&dir, port);
    let out = dir.join("out.jsonl");
    let mut run = spawn(&config, &dir, "first", &[]);
    wait_until("the stream's first events", Duration::from_secs(30), || {
        std::fs::metadata(&out).is_ok_and(|m| m.len() > 0)
    });

    let asked = snapshot(&config, &["--table", "dbo.products", "--table", "dbo.nope"]);
    let stdout = String::from_utf8_lossy(&asked.stdout);
    let stderr = String::from_utf8_lossy(&asked.stderr);
    assert_eq!(
        asked.status.code(),
        Some(1),
        "one table refused: {stdout} {stderr}"
    );
    let answer: serde_json::Value = serde_json::from_str(stdout.trim()).expect("a JSON line");
    assert_eq!(answer["table"], "dbo.products");
    assert_eq!(answer["new"], true);
    assert!(
        stderr.contains("dbo.nope") && stderr.contains("dbo.products"),
        "the refusal names the table and what the stream reads: {stderr}"
    );
    let at = answer["at_lsn"].as_str().expect("at_lsn").to_owned();

    // Stopped part-way (the checkpoint shows it under way), then started again: it
    // goes on from its last chunk.
    let checkpoint = || -> serde_json::Value {
        std::fs::read_to_string(dir.join("cp.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default()
    };
    let under_way = |cp: &serde_json::Value| {
        cp["position"]["resnapshots"]["dbo_products"]["rows"]
            .as_u64()
            .unwrap_or(0)
    };
    wait_until(
        "the re-snapshot in the checkpoint",
        Duration::from_secs(60),
        || under_way(&checkpoint()) > 0,
    );
    signal(&run, libc::SIGTERM);
    let status = exit_within(&mut run, Duration::from_secs(30), &dir, "the first run");
    assert!(status.success(), "logs in {}", dir.display());
    let stopped_at = under_way(&checkpoint());
    assert!(
        stopped_at > 0 && stopped_at < ROWS as u64,
        "stopped part-way: {stopped_at} rows"
    );
    let mut run = spawn(&config, &dir, "second", &[]);
    harness::wait_for_line(
        &dir.join("second.log"),
        "table re-snapshot finished",
        Duration::from_secs(120),
    );
    // The log says so when the last chunk leaves the source; the checkpoint, once
    // the sink has written it. A stop in between sends that chunk again next time.
    wait_until(
        "the finished re-snapshot delivered",
        Duration::from_secs(60),
        || {
            let cp = checkpoint();
            cp["position"].is_object()
                && cp["position"]["resnapshots"].get("dbo_products").is_none()
        },
    );
    let again = snapshot(&config, &["--table", "dbo.products"]);
    signal(&run, libc::SIGTERM);
    let status = exit_within(&mut run, Duration::from_secs(30), &dir, "the second run");
    assert!(status.success(), "logs in {}", dir.display());
    let second_log = std::fs::read_to_string(dir.join("second.log")).expect("log");
    assert!(
        second_log.contains(&format!("resumed_after_rows={stopped_at}")),
        "resumed after the rows the first run's checkpoint holds: {second_log}"
    );
    let rows = resnapshot_rows(&out, &at);
    assert_eq!(
        rows.last()
            .map(|row| &row["eventsource"]["transaction"]["finalevent"]),
        Some(&serde_json::Value::Bool(true)),
        "the last row is final"
    );
    let keys: std::collections::HashSet<String> = rows
        .iter()
        .map(|row| {
            row["eventrow"]["current"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert!(
        rows.len() <= ROWS + 100,
        "at most a chunk sent twice: {}",
        rows.len()
    );
    assert!(
        keys.len() >= ROWS - 200,
        "every product row, less those a change superseded"
    );
    // Asked again once finished: a new re-snapshot, at a later LSN.
    let stdout = String::from_utf8_lossy(&again.stdout);
    let answer: serde_json::Value = serde_json::from_str(stdout.trim()).expect("a JSON line");
    assert!(again.status.success());
    assert_eq!(answer["new"], true, "{stdout}");
    assert!(answer["at_lsn"].as_str() > Some(at.as_str()));

    // Without the admin endpoint in the configuration, nothing is asked.
    let off = snapshot(
        &config,
        &["--table", "dbo.products", "--set", "metrics.admin=\"off\""],
    );
    assert_eq!(off.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&off.stderr).contains("metrics.admin"));
    // And with no stream running, the command says so.
    let down = snapshot(&config, &["--table", "dbo.products"]);
    assert_eq!(down.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&down.stderr).contains("no answer"));
    std::fs::remove_dir_all(&dir).ok();
}

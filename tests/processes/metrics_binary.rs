//! `[metrics] listen` through the real binary, against Apache Kafka and the
//! synthetic source: the counters scraped from `/metrics` equal what the topic
//! holds, and `/readyz` follows the broker dying and coming back.

use crate::harness::{self, Running, wait_until};
use crate::support;

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use mssql_ces::event::readback::{Reassembler, decode_json_message};
use support::apache_kafka::{Cluster, NodeOptions};
use support::kafka::{by_partition, consume_quietly};
use support::temp_dir;

const PARTITIONS: i32 = 4;

fn write_config(dir: &Path, bootstrap: &str) -> PathBuf {
    let path = dir.join("config.toml");
    let text = format!(
        r#"
[source]
kind = "synthetic"
poll_interval_ms = 50
batch_size = 100
# The capture job's log scan is read as often as the catalog.
catalog_refresh_ms = 200

[source.synthetic]
seed = 31
transactions = 600
large_value_every = 40

[event]
max_message_size_kb = 128

[sink]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "ces"
partition_key = "table"
heartbeat_interval_ms = 300
heartbeat_topic = "ces.beat"

[checkpoint]
path = "{checkpoint}"
interval_ms = 50

[metrics]
listen = "127.0.0.1:0"
"#,
        checkpoint = dir.join("cp.json").display()
    );
    std::fs::write(&path, text).expect("config");
    path
}

/// Starts the binary with JSON logs on a pipe and returns it with the address its
/// metrics server listens on (read from its log line).
fn start(config: &Path) -> (Running, String, std::thread::JoinHandle<Vec<String>>) {
    let mut child = Running::new(
        harness::command(&["run", "--log-format", "json"], config)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mssql-ces"),
    );
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    // Keeps reading so the pipe never fills; hands the listen address over.
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(&line)
                && let Some(listen) = value["listen"].as_str()
            {
                let _ = tx.send(listen.to_owned());
            }
            lines.push(line);
        }
        lines
    });
    let address = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the binary logs the metrics address");
    (child, address, reader)
}

/// `GET path` over HTTP/1.0: the status code and the body.
pub(crate) fn get(address: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect to the metrics server");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let body = response
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, b)| b.to_owned());
    (status, body)
}

/// Every sample of `name` (labels text → value).
fn samples(text: &str, name: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let labels = match series.strip_prefix(name)? {
                "" => "",
                rest => rest.strip_prefix('{')?.strip_suffix('}')?,
            };
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn total(text: &str, name: &str) -> f64 {
    samples(text, name).values().sum()
}

#[test]
fn scraped_counters_equal_the_topic_and_readyz_follows_the_brokers() {
    // A real broker, killed and started again: a MockCluster broker set down keeps
    // its connections open in any child another test spawns meanwhile (its accepted
    // sockets are inherited), so the client could stay connected to it.
    let mut kafka = Cluster::start("metrics", 1, NodeOptions::default());
    let bootstrap = kafka.bootstrap();
    kafka.create_topic("ces", PARTITIONS, 1, &[]);
    kafka.create_topic("ces.beat", 1, 1, &[]);
    let dir = temp_dir("metrics");
    let config = write_config(&dir, &bootstrap);
    let (mut child, address, logs) = start(&config);

    // Caught up: the source idle and nothing in flight.
    let mut page = String::new();
    wait_until("the run to catch up", Duration::from_secs(90), || {
        page = get(&address, "/metrics").1;
        total(&page, "mssql_ces_events_total") > 0.0
            && total(&page, "mssql_ces_batches_in_flight") == 0.0
            && total(&page, "mssql_ces_lag_seconds") == 0.0
    });
    let messages = total(&page, "mssql_ces_messages_total") as usize;
    let consumed = consume_quietly(
        &bootstrap,
        "ces",
        PARTITIONS,
        Duration::from_secs(60),
        Duration::from_millis(500),
        |m| m.len() >= messages,
    );
    assert_eq!(
        consumed.len(),
        messages,
        "messages_total = messages in the topic"
    );
    let bytes: usize = consumed.iter().map(|m| m.payload.len()).sum();
    assert_eq!(
        total(&page, "mssql_ces_delivered_bytes_total") as usize,
        bytes,
        "delivered_bytes_total = the payloads' bytes"
    );
    // Logical events by table and operation, segments joined.
    let mut events: BTreeMap<String, f64> = BTreeMap::new();
    let mut segmented = 0.0;
    for (_, partition) in by_partition(&consumed) {
        let mut joiner = Reassembler::new();
        for message in partition {
            let segment = decode_json_message(&message.payload).expect("a CES message");
            let first_of_many = segment.segmentindex == 1 && !segment.finalsegment;
            if let Some(event) = joiner.push(segment).expect("segments in order") {
                let data = event
                    .data_json(mssql_ces::event::Encoding::Json)
                    .expect("data");
                let source = &data["eventsource"];
                let labels = format!(
                    "table=\"{}.{}\",operation=\"{}\"",
                    source["schema"].as_str().expect("schema"),
                    source["tbl"].as_str().expect("tbl"),
                    event.event.operation
                );
                *events.entry(labels).or_default() += 1.0;
            }
            if first_of_many {
                segmented += 1.0;
            }
        }
    }
    assert!(
        events.len() >= 3,
        "several tables and operations: {events:?}"
    );
    assert_eq!(samples(&page, "mssql_ces_events_total"), events);
    assert!(segmented > 0.0, "large values made segmented events");
    assert_eq!(total(&page, "mssql_ces_segmented_events_total"), segmented);
    assert!(total(&page, "mssql_ces_source_polls_total") > 0.0);
    assert!(total(&page, "mssql_ces_capture_instances") >= 1.0);
    // Each table whose events were read has its shape version (the synthetic
    // tables never change shape: 1).
    let versions = samples(&page, "mssql_ces_table_shape_version");
    assert!(!versions.is_empty(), "{page}");
    assert!(versions.values().all(|&v| v == 1.0), "{versions:?}");
    assert!(total(&page, "mssql_ces_checkpoint_writes_total") >= 1.0);
    assert_eq!(total(&page, "mssql_ces_lsn_lag"), 0.0);
    // The capture job's last log scan, as the synthetic server reports it: each
    // commit scanned on its own, at once.
    assert_eq!(
        total(&page, "mssql_ces_capture_job_latency_seconds"),
        0.0,
        "{page}"
    );
    assert_eq!(total(&page, "mssql_ces_capture_job_scan_transactions"), 1.0);
    assert_eq!(
        samples(&page, "mssql_ces_capture_job_transactions_total").len(),
        1,
        "{page}"
    );
    // Caught up: nothing waits; each table's last delivered commit is a time of
    // the synthetic clock (August 2026).
    assert_eq!(total(&page, "mssql_ces_oldest_undelivered_seconds"), 0.0);
    // Caught up, the whole retention is ahead (the synthetic server's cleanup job
    // keeps three days).
    assert_eq!(
        total(&page, "mssql_ces_retention_headroom_seconds"),
        3.0 * 86_400.0
    );
    let delivered = samples(&page, "mssql_ces_table_delivered_commit_timestamp_seconds");
    assert_eq!(
        delivered.keys().collect::<Vec<_>>(),
        versions.keys().collect::<Vec<_>>(),
        "one per table read"
    );
    assert!(
        delivered.values().all(|&t| (1.78e9..1.80e9).contains(&t)),
        "{delivered:?}"
    );
    // Every kind is there from the start, at 0: no error happened.
    let errors = samples(&page, "mssql_ces_delivery_errors_total");
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors.values().all(|&n| n == 0.0), "{errors:?}");
    assert_eq!(
        samples(&page, "mssql_ces_build_info"),
        BTreeMap::from([(format!("version=\"{}\"", env!("CARGO_PKG_VERSION")), 1.0)])
    );

    // Caught up and quiet, the stream beats on its own topic, keyed by the stream,
    // standing where its last event left it.
    wait_until("heartbeats", Duration::from_secs(30), || {
        page = get(&address, "/metrics").1;
        total(&page, "mssql_ces_heartbeats_total") >= 3.0
    });
    let beats_counted = total(&page, "mssql_ces_heartbeats_total") as usize;
    assert!(total(&page, "mssql_ces_heartbeat_timestamp_seconds") > 1.7e9);
    let beats = consume_quietly(
        &bootstrap,
        "ces.beat",
        1,
        Duration::from_secs(30),
        Duration::from_millis(500),
        |m| m.len() >= beats_counted,
    );
    assert!(beats.len() >= beats_counted, "{} records", beats.len());
    // The commit LSN of the last event sent, from the logicalids (every segment
    // carries its event's).
    let last_sent = consumed
        .iter()
        .filter_map(|m| decode_json_message(&m.payload).ok())
        .filter_map(|segment| segment.logicalid.split(':').nth(1).map(str::to_owned))
        .max();
    // Beats during the busy start ride on batches and stand where those did; the
    // quiet stream's last beat stands at its last event.
    let mut stood = Vec::new();
    for beat in &beats {
        assert_eq!(beat.key.as_deref(), Some(b"default".as_slice()));
        let v: serde_json::Value = serde_json::from_slice(&beat.payload).expect("JSON");
        assert_eq!(v["type"], "mssql-ces.heartbeat");
        assert_eq!(v["stream"], "default");
        assert_eq!(v["database"], "synthetic");
        stood.push(
            v["last_event"]["commit_lsn"]
                .as_str()
                .map(|lsn| lsn.replace(':', "")),
        );
    }
    assert!(stood.is_sorted(), "{stood:?}");
    assert_eq!(stood.last(), Some(&last_sent), "{stood:?}");
    // The producer reports its brokers every second.
    wait_until("ready", Duration::from_secs(15), || {
        get(&address, "/readyz").0 == 200
    });
    assert_eq!(get(&address, "/healthz").0, 200);
    kafka.node(1).kill();
    let mut unready = String::new();
    wait_until(
        "unready with the broker down",
        Duration::from_secs(20),
        || {
            let (status, body) = get(&address, "/readyz");
            unready = body;
            status == 503
        },
    );
    assert!(unready.contains("sink: not connected"), "{unready}");
    // The container health check's command gives the same verdicts.
    let probe = |path: &str| {
        harness::output(
            &mut harness::bare(&["probe", "--address", &address, "--path", path]),
            "probe",
        )
    };
    let readyz = probe("/readyz");
    assert_eq!(readyz.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&readyz.stdout).contains("not ready"));
    assert_eq!(probe("/healthz").status.code(), Some(0));
    // Idle polls go on: alive.
    assert_eq!(get(&address, "/healthz").0, 200);
    kafka.node(1).restart();
    wait_until("ready again", Duration::from_secs(60), || {
        get(&address, "/readyz").0 == 200
    });
    let ready = probe("/readyz");
    assert_eq!(ready.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&ready.stdout), "ready\n");

    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait().expect("wait");
    let logs = logs.join().expect("log reader");
    assert!(status.success(), "{status}: {}", logs.join("\n"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_metrics_address_in_use_fails_the_start_naming_the_setting() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("address");
    let dir = temp_dir("metrics-in-use");
    let text = format!(
        "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"stdout\"\n[checkpoint]\npath = \"{cp}\"\n[metrics]\nlisten = \"{address}\"\n",
        cp = dir.join("cp.json").display()
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, text).expect("config");
    let run = || harness::run_until_idle(&path, "a run with a metrics address");
    let output = run();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("metrics.listen = {address}")),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "nothing was sent");
    // Not an address at all: refused with the configuration.
    let bad = std::fs::read_to_string(&path)
        .expect("config")
        .replace(&address.to_string(), "localhost");
    std::fs::write(&path, bad).expect("config");
    let output = run();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("metrics.listen"), "{stderr}");
    drop(taken);
    std::fs::remove_dir_all(dir).ok();
}

/// `probe`'s answers when something is off: a non-200 says what the server answered;
/// a path without its slash and a port without its host are refused with the
/// fix.
#[test]
fn probe_says_what_was_answered_and_corrects_its_arguments() {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let server = std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
            // The whole request, so that closing does not reset the connection.
            let mut request = Vec::new();
            let mut chunk = [0u8; 256];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = stream.write_all(b"HTTP/1.0 503 Service Unavailable\r\n\r\nnot ready\n");
        }
    });
    let output = support::tools::output_within(
        &mut harness::bare(&["probe", "--address", &address, "--path", "/readyz"]),
        Duration::from_secs(60),
        "probe",
    );
    // A probe that never connected leaves the server in accept: connect to end it.
    let _ = std::net::TcpStream::connect(&address);
    server.join().expect("server");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "not ready\n",
        "{output:?}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/readyz: answered 503 Service Unavailable"),
        "{stderr}"
    );

    let run = |args: &[&str]| {
        let output = harness::output(harness::bare(&["probe"]).args(args), "probe");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(&["--path", "healthz"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--path /healthz"), "{stderr}");
    let (code, stderr) = run(&["--address", "19187"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--address 127.0.0.1:19187"), "{stderr}");
}

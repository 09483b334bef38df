//! The real `mssql-ces` binary as a child process, against an in-process Kafka
//! (`MockCluster`) and the synthetic source: crash recovery under SIGKILL, graceful
//! SIGTERM, and configuration errors reported before any connection.

use crate::harness::{self, Moments, exit_within, run_until_idle};
use crate::support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use mssql_ces::event::readback::{Reassembler, decode_json_message};
use mssql_ces::event::{EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit};
use mssql_ces::source::synthetic::SyntheticConfig;
use rdkafka::mocking::MockCluster;
use support::kafka::{by_partition, consume_quietly, position_of};
use support::temp_dir;

const PARTITIONS: i32 = 4;

fn config(dir: &Path, bootstrap: &str, synthetic: &str) -> PathBuf {
    let path = dir.join("config.toml");
    let text = format!(
        r#"
[source]
kind = "synthetic"
poll_interval_ms = 20
batch_size = 100

[source.synthetic]
{synthetic}

[event]
max_message_size_kb = 128

[sink]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "ces"
partition_key = "table"
delivery_timeout_ms = 60000

[checkpoint]
path = "{checkpoint}"
interval_ms = 20
"#,
        checkpoint = dir.join("cp.json").display()
    );
    std::fs::write(&path, text).expect("config");
    path
}

/// The binary's `run`-th start in `dir`, its log in `run-<run>.log`.
fn spawn(config: &Path, dir: &Path, extra: &[&str], run: usize) -> harness::Running {
    harness::spawn(config, dir, &format!("run-{run}"), extra)
}

/// The events of `transactions` synthetic transactions of `seed`, with no large
/// values and no rows before them.
fn plain_events(seed: u64, transactions: u64) -> BTreeMap<String, Vec<u8>> {
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(expected_events(SyntheticConfig {
            seed,
            transactions: Some(transactions),
            ..SyntheticConfig::default()
        }))
}

/// What topic `ces` holds once `expected` may have arrived (waiting `limit` at
/// most), and 2 s of quiet after, for duplicates.
fn consume_expected(
    bootstrap: &str,
    expected: &BTreeMap<String, Vec<u8>>,
    limit: Duration,
) -> Vec<support::kafka::Consumed> {
    consume_quietly(
        bootstrap,
        "ces",
        PARTITIONS,
        limit,
        Duration::from_secs(2),
        |m| m.len() >= expected.len(),
    )
}

/// The events the synthetic source must produce: `logicalid` → whole `data`.
async fn expected_events(synthetic: SyntheticConfig) -> BTreeMap<String, Vec<u8>> {
    let options = |guid| EncoderOptions {
        stream_guid: guid,
        encoding: Encoding::Json,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size: MessageSizeLimit::from_kb(128).expect("valid"),
    };
    support::expected::events(synthetic, options, Encoding::Json).await
}

#[test]
fn sigkill_at_random_moments_loses_nothing_and_resends_identical_bytes() {
    let cluster = MockCluster::new(3).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces", PARTITIONS, 1).expect("topic");
    let dir = temp_dir("crash");
    let synthetic = "seed = 21\ntransactions = 4000\nlarge_value_every = 150";
    let config = config(&dir, &bootstrap, synthetic);
    let mut moments = Moments::new();
    let seed = moments.seed();
    let mut killed_while_running = 0;
    let checkpoint = dir.join("cp.json");
    let rounds = support::soak_rounds(10, 20);
    for run in 0..rounds {
        let before = std::fs::read(&checkpoint).ok();
        let mut child = spawn(&config, &dir, &[], run);
        // Kill while it publishes: once this run has checkpointed something (or has
        // had time to), at a random moment after. Under a loaded machine a fixed
        // delay could land every kill in start-up, before anything is sent.
        let started = Instant::now();
        while std::fs::read(&checkpoint).ok() == before
            && started.elapsed() < Duration::from_secs(2)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(moments.between(1, 150)));
        if child.try_wait().expect("try_wait").is_none() {
            killed_while_running += 1;
        }
        // SIGKILL: no chance to flush, drain or checkpoint.
        child.kill().expect("kill");
        child.wait().expect("reap");
    }
    assert_eq!(
        killed_while_running, rounds,
        "every kill hit a running process (seed {seed})"
    );
    let mut last = spawn(&config, &dir, &["--until-idle"], 20);
    let status = exit_within(&mut last, Duration::from_secs(180), &dir, "mssql-ces");
    assert!(
        status.success(),
        "final run: {status} (seed {seed}); logs in {}",
        dir.display()
    );

    let expected = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(expected_events(SyntheticConfig {
            seed: 21,
            transactions: Some(4000),
            rate_per_second: None,
            large_value_every: 150,
            existing_rows: 0,
            oversized_value_every: 0,
        }));
    let consumed = consume_expected(&bootstrap, &expected, Duration::from_secs(120));

    let mut first_copy: HashMap<String, Vec<u8>> = HashMap::new();
    let mut arrived: HashMap<String, Vec<u8>> = HashMap::new();
    let mut resent = 0;
    let mut abandoned = 0;
    for (partition, list) in by_partition(&consumed) {
        let mut seen = HashSet::new();
        let mut highest: Option<(String, u64)> = None;
        let mut reassembler = Reassembler::new();
        for m in &list {
            let event = decode_json_message(&m.payload).expect("message decodes");
            // Every re-sent message is byte-identical to its first copy.
            match first_copy.get(&event.id) {
                Some(first) => {
                    assert!(
                        first == &m.payload,
                        "message {} re-sent with other bytes",
                        event.id
                    );
                    resent += 1;
                }
                None => {
                    first_copy.insert(event.id.clone(), m.payload.clone());
                }
            }
            // Positions never go backwards within a partition, except for re-sends.
            let at = position_of(&event.logicalid);
            let is_resend = !seen.insert(event.id.clone());
            if let Some(high) = &highest
                && at < *high
            {
                assert!(
                    is_resend,
                    "partition {partition}: {} went backwards without being a re-send",
                    event.logicalid
                );
            }
            if highest.as_ref().is_none_or(|h| at > *h) {
                highest = Some(at);
            }
            if let Some(done) = reassembler.push(event).expect("segments fit together") {
                arrived.insert(done.event.logicalid.clone(), done.event.data);
            }
        }
        abandoned += reassembler.abandoned();
    }
    // Every expected event arrived at least once, with the right data.
    let missing: Vec<_> = expected
        .keys()
        .filter(|id| !arrived.contains_key(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} events never arrived, first {:?} (seed {seed})",
        missing.len(),
        missing.first()
    );
    for (id, data) in &expected {
        assert!(&arrived[id] == data, "event {id} arrived with other data");
    }
    assert_eq!(
        arrived.len(),
        expected.len(),
        "no event that should not exist"
    );
    assert!(resent > 0, "the kills caused re-sends (seed {seed})");
    println!(
        "crash test: {} messages, {resent} re-sent, {abandoned} partial events abandoned",
        consumed.len()
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn sigterm_drains_checkpoints_the_last_delivered_event_and_exits_zero() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces", PARTITIONS, 1).expect("topic");
    let dir = temp_dir("sigterm");
    let config = config(
        &dir,
        &bootstrap,
        "seed = 3\ntransactions = 0\nrate_per_second = 3000",
    );
    let mut child = spawn(&config, &dir, &[], 0);
    harness::wait_for_delivery(&dir.join("cp.json"));
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = exit_within(&mut child, Duration::from_secs(30), &dir, "mssql-ces");
    assert_eq!(
        status.code(),
        Some(0),
        "graceful exit; logs in {}",
        dir.display()
    );
    // The start said how such a run stops.
    let log = std::fs::read_to_string(dir.join("run-0.log")).expect("log");
    assert!(
        log.contains("running until stopped: Ctrl-C or SIGTERM") && log.contains("--until-idle"),
        "{log}"
    );

    let checkpoint: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("cp.json")).expect("checkpoint written"),
    )
    .expect("checkpoint is JSON");
    let last = &checkpoint["position"]["last_event"];
    let checkpointed = (
        last["commit_lsn"].as_str().expect("lsn").replace(':', ""),
        last["sequence_number"].as_u64().expect("sequence"),
    );
    let consumed = consume_quietly(
        &bootstrap,
        "ces",
        PARTITIONS,
        Duration::from_secs(30),
        Duration::from_secs(2),
        |m| !m.is_empty(),
    );
    assert!(consumed.len() > 100, "it ran ({} messages)", consumed.len());
    let delivered_max = consumed
        .iter()
        .map(|m| position_of(&decode_json_message(&m.payload).expect("decode").logicalid))
        .max()
        .expect("messages");
    assert_eq!(
        checkpointed, delivered_max,
        "checkpoint = last delivered event"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Runs the binary on a config text; returns (exit code, stderr, elapsed).
fn run_config(text: &str, env: &[(&str, &str)]) -> (Option<i32>, String, Duration) {
    let dir = temp_dir("badconfig");
    let path = dir.join("config.toml");
    std::fs::write(&path, text).expect("config");
    let started = Instant::now();
    // In its own directory: a configuration without a checkpoint path writes the
    // default one (and its lock) where the process runs.
    let output = harness::output(
        harness::command(&["run"], &path)
            .current_dir(&dir)
            .envs(env.iter().copied()),
        "a run of a configuration",
    );
    std::fs::remove_dir_all(dir).ok();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        started.elapsed(),
    )
}

/// A column rule that matches no column (a misspelt privacy rule) refuses the run
/// with exit code 2 before any event is written, naming the rule; the setting that
/// allows it lets the run go on with a warning.
#[test]
fn a_column_rule_that_matches_nothing_refuses_the_run_by_name() {
    let dir = temp_dir("unmatched-rule");
    let path = dir.join("config.toml");
    let write = |allow: bool| {
        std::fs::write(
            &path,
            format!(
                "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 5\n[event]\nallow_unmatched_column_rules = {allow}\n[[event.columns]]\ncolumn = \"dbo.customers.emial\"\nmask = \"redact\"\n[sink]\nkind = \"stdout\"\n[checkpoint]\npath = \"{}\"\n",
                dir.join(format!("cp-{allow}.json")).display()
            ),
        )
        .expect("config");
        run_until_idle(&path, "a run with a misspelt column rule")
    };
    let refused = write(false);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("dbo.customers.emial")
            && stderr.contains("event.allow_unmatched_column_rules"),
        "{stderr}"
    );
    assert!(refused.stdout.is_empty(), "nothing was written");
    let allowed = write(true);
    let stderr = String::from_utf8_lossy(&allowed.stderr);
    assert_eq!(allowed.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("matches no column"), "{stderr}");
    assert!(!allowed.stdout.is_empty());
    // A rule a key column cannot take is the configuration's fault too: exit 2.
    std::fs::write(
        &path,
        format!(
            "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 5\n[[event.columns]]\ncolumn = \"dbo.customers.id\"\nexclude = true\n[sink]\nkind = \"stdout\"\n[checkpoint]\npath = \"{}\"\n",
            dir.join("cp-key.json").display()
        ),
    )
    .expect("config");
    let key = run_until_idle(&path, "a run excluding a key column");
    let stderr = String::from_utf8_lossy(&key.stderr);
    assert_eq!(key.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("dbo.customers.id"), "{stderr}");
    assert!(key.stdout.is_empty(), "nothing was written");
    std::fs::remove_dir_all(dir).ok();
}

/// The start says what the run writes (CES events or Debezium records), which
/// variables named like settings it does not read, and, when its checkpoint is past
/// the stream's start, that the configured initial load does not run and how to run
/// one.
#[test]
fn a_run_says_what_it_writes_and_why_a_configured_load_does_not_run() {
    let dir = temp_dir("start-lines");
    let path = dir.join("config.toml");
    let run = |format: &str| {
        std::fs::write(
            &path,
            format!(
                "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 5\nexisting_rows = 3\n[snapshot]\nmode = \"initial\"\n[event]\nformat = \"{format}\"\n[sink]\nkind = \"stdout\"\n[checkpoint]\npath = \"{}\"\n",
                dir.join(format!("cp-{format}.json")).display()
            ),
        )
        .expect("config");
        let output = harness::output(
            harness::command(&["run", "--until-idle"], &path)
                .env("MSSQL_CES_SINK_TOPIC", "a-value-never-said"),
            "a run to stdout",
        );
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        stderr
    };
    let first = run("ces");
    assert!(first.contains("writing CES events"), "{first}");
    // A variable named like a setting that nothing reads is said, by name only.
    assert!(
        first.contains("MSSQL_CES_SINK_TOPIC is not read"),
        "{first}"
    );
    assert!(!first.contains("a-value-never-said"), "{first}");
    assert!(!first.contains("no initial load"), "{first}");
    let again = run("ces");
    assert!(
        again.contains("no initial load") && again.contains("checkpoint.path"),
        "{again}"
    );
    let debezium = run("debezium");
    assert!(debezium.contains("writing Debezium records"), "{debezium}");
    std::fs::remove_dir_all(dir).ok();
}

/// A checkpoint or output file that cannot be written fails the run naming the
/// setting, what to do and whether a restart helps.
#[test]
fn unwritable_files_name_the_setting_the_fix_and_whether_a_restart_helps() {
    let dir = temp_dir("unwritable");
    let missing = dir.join("no-such-directory");
    let cases = [
        (
            format!(
                "[sink]\nkind = \"stdout\"\n[checkpoint]\npath = \"{}\"\n",
                missing.join("cp.json").display()
            ),
            vec![
                "checkpoint.path",
                "does not exist",
                "a restart repeats this",
            ],
        ),
        (
            format!(
                "[sink]\nkind = \"file\"\npath = \"{}\"\n[checkpoint]\npath = \"{}\"\n",
                missing.join("out.jsonl").display(),
                dir.join("cp-sink.json").display()
            ),
            vec!["sink.path", "does not exist", "a restart repeats this"],
        ),
        // A device that is always full, as a full disk answers.
        (
            format!(
                "[sink]\nkind = \"file\"\npath = \"/dev/full\"\n[checkpoint]\npath = \"{}\"\n",
                dir.join("cp-full.json").display()
            ),
            vec!["is full", "a restart resumes from the last checkpoint"],
        ),
    ];
    for (sink, needles) in cases {
        let path = dir.join("config.toml");
        std::fs::write(
            &path,
            format!("[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 5\n{sink}"),
        )
        .expect("config");
        let output = run_until_idle(&path, "a run with a file it cannot write");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{sink}\n{stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{needle}: {stderr}");
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn bad_configuration_fails_before_connecting_and_names_the_setting() {
    // Kafka at a port where nothing listens: a connection attempt would hang or
    // log broker errors; a configuration error must come first.
    let kafka = "[sink]\nkind = \"kafka\"\nbootstrap_servers = \"127.0.0.1:1\"\n";
    let cases = [
        (
            format!("[source]\nkind = \"synthetic\"\ncolour = \"blue\"\n{kafka}"),
            vec!["colour"],
        ),
        (
            format!("[source]\nkind = \"synthetic\"\n[event]\nmax_message_size_kb = 2000\n{kafka}"),
            vec!["max_message_size_kb", "2000"],
        ),
        (
            "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"event_hubs_kafka\"\ncompression = \"lz4\"\nconnection_string = { env = \"EH_CS\" }\n".to_owned(),
            vec!["sink.compression", "lz4"],
        ),
        (
            format!("[source]\nkind = \"sqlserver\"\nconnection_string = {{ env = \"MSSQL_CES_TEST_UNSET_VARIABLE\" }}\n{kafka}"),
            vec!["source.connection_string", "MSSQL_CES_TEST_UNSET_VARIABLE"],
        ),
        // A negative number is said as such, not as serde's "invalid value".
        (
            format!("[source]\nkind = \"synthetic\"\npage_size = -5\n{kafka}"),
            vec!["source.page_size", "must not be negative"],
        ),
        // Kafka's own spellings are taken (any case), so only the later error is said.
        (
            format!("[source]\nkind = \"synthetic\"\npage_size = 0\n{kafka}security_protocol = \"PLAINTEXT\"\ncompression = \"LZ4\"\npartitioner = \"MURMUR2_RANDOM\"\n"),
            vec!["source.page_size", "at least 1"],
        ),
    ];
    for (text, needles) in cases {
        let (code, stderr, elapsed) = run_config(&text, &[]);
        assert_eq!(code, Some(2), "exit code 2 for:\n{text}\nstderr: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "stderr names `{needle}`: {stderr}");
        }
        assert!(
            elapsed < Duration::from_secs(5),
            "failed fast ({elapsed:?})"
        );
    }
}

#[test]
fn secrets_never_reach_the_output() {
    let text = "[source]\nkind = \"sqlserver\"\nconnection_string = { env = \"MSSQL_CES_TEST_CS\" }\n\
                [sink]\nkind = \"event_hubs_kafka\"\nconnection_string = { env = \"MSSQL_CES_TEST_EH\" }\n\
                [sink.kafka]\n\"sasl.password\" = \"x\"\n";
    let (code, stderr, _) = run_config(
        text,
        &[
            (
                "MSSQL_CES_TEST_CS",
                "Server=tcp:127.0.0.1,1;User Id=sa;Password=hunter2-sql",
            ),
            (
                "MSSQL_CES_TEST_EH",
                "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKey=hunter2-eh",
            ),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("sasl.password"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "a secret leaked: {stderr}");
    // Pass-through properties librdkafka refuses: its message would quote the
    // value (this build has no OIDC, so the client secret is always refused).
    for (key, value) in [
        ("sasl.oauthbearer.client.secret", "hunter2-oidc"),
        ("ssl.key.password", "hunter2-key"),
        ("linger.ms", "hunter2-linger"),
    ] {
        let text = format!(
            "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"kafka\"\nbootstrap_servers = \"127.0.0.1:1\"\ndelivery_timeout_ms = 1000\nsecurity_protocol = \"ssl\"\n[sink.kafka]\n\"{key}\" = \"{value}\"\n"
        );
        let (_, stderr, _) = run_config(&text, &[]);
        assert!(!stderr.contains("hunter2"), "{key} leaked: {stderr}");
    }
}

/// A secret pasted where a variable name or a path belongs, or left unquoted, is
/// refused as a configuration error by `run`, `check` and `check --format json`
/// without ever being printed.
#[test]
fn a_secret_pasted_in_the_wrong_place_is_refused_without_echo() {
    let secret = "Server=tcp:db,1433;User Id=sa;Password=HUNTER2pasted";
    let configs = [
        format!(
            "[source]\nkind = \"sqlserver\"\nconnection_string = {{ env = {secret:?} }}\n[sink]\nkind = \"stdout\"\n"
        ),
        format!(
            "[source]\nkind = \"sqlserver\"\nconnection_string = {{ file = {secret:?} }}\n[sink]\nkind = \"stdout\"\n"
        ),
        format!(
            "[source]\nkind = \"sqlserver\"\nconnection_string = {secret}\n[sink]\nkind = \"stdout\"\n"
        ),
        "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"event_hubs_kafka\"\nconnection_string = { env = \"Endpoint=sb://x/;SharedAccessKey=HUNTER2eh\" }\n"
            .to_owned(),
    ];
    let dir = temp_dir("pasted");
    let path = dir.join("config.toml");
    for text in &configs {
        std::fs::write(&path, text).expect("config");
        for args in [&["run"][..], &["check"], &["check", "--format", "json"]] {
            let output = harness::output(&mut harness::command(args, &path), "mssql-ces");
            let all = harness::printed(&output);
            assert!(
                !all.contains("HUNTER2"),
                "{args:?} printed the secret:\n{text}\n{all}"
            );
            assert!(
                all.contains("not shown") || all.contains("line 3"),
                "{args:?} says why:\n{all}"
            );
            let expected = if args[0] == "run" { 2 } else { 1 };
            assert_eq!(output.status.code(), Some(expected), "{args:?}: {all}");
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

/// No broker at the address: one warning when the outage starts (not one per
/// connection attempt), and a failure after the delivery timeout that names the
/// brokers and the setting.
#[test]
fn kafka_unreachable_is_said_once_and_the_failure_names_brokers_and_setting() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let text = format!(
        "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 20\n[sink]\nkind = \"kafka\"\nbootstrap_servers = \"127.0.0.1:{port}\"\ndelivery_timeout_ms = 3000\n"
    );
    let (code, stderr, elapsed) = run_config(&text, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains("Kafka unreachable"), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("an error line: {stderr}"));
    assert!(
        error.contains(&format!("127.0.0.1:{port}")) && error.contains("sink.delivery_timeout_ms"),
        "{error}"
    );
}

#[test]
fn the_file_sink_holds_every_event_exactly_once_whatever_the_kills() {
    let dir = temp_dir("file-exactly-once");
    let out = dir.join("events.jsonl");
    let config_path = dir.join("config.toml");
    std::fs::write(
        &config_path,
        format!(
            r#"
[source]
kind = "synthetic"
poll_interval_ms = 20
batch_size = 50

[source.synthetic]
seed = 5
transactions = 3000
rate_per_second = 3000
large_value_every = 200

[event]
max_message_size_kb = 128

[sink]
kind = "file"
path = "{out}"

[checkpoint]
path = "{checkpoint}"
interval_ms = 30
"#,
            out = out.display(),
            checkpoint = dir.join("cp.json").display()
        ),
    )
    .expect("config");
    let mut moments = Moments::new();
    let seed = moments.seed();
    let mut torn_before_restart = 0;
    for run in 0..support::soak_rounds(12, 25) {
        let mut child = spawn(&config_path, &dir, &[], run);
        std::thread::sleep(Duration::from_millis(moments.between(80, 350)));
        child.kill().expect("kill");
        child.wait().expect("reap");
        let text = std::fs::read(&out).unwrap_or_default();
        if !text.is_empty() && !text.ends_with(b"\n") {
            torn_before_restart += 1;
        }
    }
    // The history depends on the seed only; unpaced, the last run reaches its end.
    let mut last = spawn(
        &config_path,
        &dir,
        &[
            "--until-idle",
            "--set",
            "source.synthetic.rate_per_second=0",
        ],
        25,
    );
    let status = exit_within(&mut last, Duration::from_secs(180), &dir, "mssql-ces");
    assert!(
        status.success(),
        "final run: {status} (seed {seed}); logs in {}",
        dir.display()
    );
    let expected = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(expected_events(SyntheticConfig {
            seed: 5,
            transactions: Some(3000),
            rate_per_second: None,
            large_value_every: 200,
            existing_rows: 0,
            oversized_value_every: 0,
        }));
    let text = std::fs::read_to_string(&out).expect("output");
    assert!(text.ends_with('\n'), "no torn last line");
    let mut ids = HashSet::new();
    let mut reassembler = Reassembler::new();
    let mut arrived = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let event = decode_json_message(line.as_bytes())
            .unwrap_or_else(|e| panic!("line {n} is not a whole message ({e}) (seed {seed})"));
        assert!(
            ids.insert(event.id.clone()),
            "line {n}: message {} written twice (seed {seed})",
            event.id
        );
        if let Some(done) = reassembler.push(event).expect("segments fit together") {
            arrived.insert(done.event.logicalid.clone(), done.event.data);
        }
    }
    assert_eq!(
        arrived.len(),
        expected.len(),
        "every event, once (seed {seed})"
    );
    assert!(
        arrived == expected,
        "every event with its data (seed {seed})"
    );
    println!(
        "file sink: {} lines, {torn_before_restart} kills left a torn line that the next start cut off",
        text.lines().count()
    );

    // The checkpoint names the file and its last event.
    let checkpoint: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cp.json")).expect("checkpoint"))
            .expect("json");
    let position = &checkpoint["position"];
    assert_eq!(position["sink_length"], text.len() as u64);
    let last_line = text.lines().last().expect("lines");
    let last = decode_json_message(last_line.as_bytes()).expect("last line");
    assert_eq!(position["sink_file"]["last_id"], last.id.as_str());
    assert_eq!(
        position["sink_file"]["path"],
        std::path::absolute(&out).unwrap().display().to_string()
    );

    // The same checkpoint with sink.path at another file: refused before anything
    // in that file is cut.
    let other = dir.join("someone-elses.jsonl");
    let foreign = "{\"theirs\":1}\n".repeat(text.len() / 10);
    std::fs::write(&other, &foreign).expect("foreign file");
    let mut moved = spawn(
        &config_path,
        &dir,
        &[
            "--until-idle",
            "--set",
            &format!("sink.path={}", other.display()),
        ],
        26,
    );
    let status = exit_within(&mut moved, Duration::from_secs(60), &dir, "mssql-ces");
    assert_eq!(status.code(), Some(1), "refused: {status}");
    assert_eq!(
        std::fs::read_to_string(&other).unwrap(),
        foreign,
        "untouched"
    );
    let log = std::fs::read_to_string(dir.join("run-26.log")).unwrap_or_default();
    assert!(
        log.contains("not the file the checkpoint was written for"),
        "{log}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn sigterm_with_every_broker_down_exits_within_the_drain_timeout() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces", PARTITIONS, 1).expect("topic");
    let dir = temp_dir("sigterm-down");
    let config = config(
        &dir,
        &bootstrap,
        "seed = 4\ntransactions = 0\nrate_per_second = 5000",
    );
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        format!("{text}\n[shutdown]\ndrain_timeout_ms = 2000\n"),
    )
    .expect("config");
    let mut child = spawn(&config, &dir, &[], 0);
    harness::wait_for_delivery(&dir.join("cp.json"));
    cluster.broker_down(1).expect("broker down");
    // Long enough for the producer queue and the in-flight batches to fill.
    std::thread::sleep(Duration::from_millis(2500));
    let pid = i32::try_from(child.id()).expect("pid");
    let signalled = Instant::now();
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = exit_within(&mut child, Duration::from_secs(30), &dir, "mssql-ces");
    let took = signalled.elapsed();
    assert_eq!(status.code(), Some(0), "logs in {}", dir.display());
    assert!(
        took < Duration::from_millis(2000 + 1500),
        "exited {took:?} after SIGTERM with a 2 s drain timeout; logs in {}",
        dir.display()
    );
    // What was acknowledged before the outage is checkpointed.
    let checkpoint = std::fs::read_to_string(dir.join("cp.json")).expect("checkpoint written");
    assert!(checkpoint.contains("last_event"), "{checkpoint}");
    // The last line tells delivered from abandoned, and names the checkpoint.
    let log = std::fs::read_to_string(dir.join("run-0.log")).expect("log");
    let stopped = log
        .lines()
        .find(|l| l.contains(" stopped "))
        .unwrap_or_else(|| panic!("a stopped line: {log}"));
    let field = |name: &str| -> u64 {
        let at = stopped
            .find(&format!(" {name}="))
            .unwrap_or_else(|| panic!("{name}: {stopped}"));
        stopped[at + name.len() + 2..]
            .split(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} a number: {stopped}"))
    };
    assert!(
        field("events") > 0,
        "delivered before the outage: {stopped}"
    );
    assert!(
        field("undelivered_events") > 0,
        "sent into the outage: {stopped}"
    );
    assert!(!stopped.contains("checkpoint=none"), "{stopped}");
    cluster.broker_up(1).expect("broker up");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_standby_on_the_same_stream_waits_then_takes_over_and_nothing_is_lost() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces", PARTITIONS, 1).expect("topic");
    let dir = temp_dir("standby");
    let synthetic = "seed = 13\ntransactions = 3000\nrate_per_second = 1000";
    let config = config(&dir, &bootstrap, synthetic);
    let mut active = spawn(&config, &dir, &[], 0);
    harness::wait_for_delivery(&dir.join("cp.json"));
    // The same stream: it must wait, not publish.
    let mut standby = spawn(
        &config,
        &dir,
        &[
            "--until-idle",
            "--set",
            "source.synthetic.rate_per_second=0",
        ],
        1,
    );
    let waiting = harness::wait_for_line(
        &dir.join("run-1.log"),
        "hot standby",
        Duration::from_secs(60),
    );
    assert!(
        waiting.contains("held_by"),
        "the standby says it waits and for whom: {waiting}"
    );
    let standby_log = std::fs::read_to_string(dir.join("run-1.log")).expect("log");
    assert!(
        !standby_log.contains("resuming from the checkpoint")
            && !standby_log.contains("no checkpoint"),
        "the standby has not started: {standby_log}"
    );
    assert!(
        standby.try_wait().expect("try_wait").is_none(),
        "still waiting"
    );
    let killed_at = Instant::now();
    active.kill().expect("kill");
    active.wait().expect("reap");
    let status = exit_within(&mut standby, Duration::from_secs(120), &dir, "mssql-ces");
    assert!(
        status.success(),
        "standby: {status}; logs in {}",
        dir.display()
    );
    let log = std::fs::read_to_string(dir.join("run-1.log")).expect("log");
    assert!(log.contains("took over"), "{log}");
    assert!(killed_at.elapsed() < Duration::from_secs(120));

    let expected = plain_events(13, 3000);
    let consumed = consume_expected(&bootstrap, &expected, Duration::from_secs(60));
    let mut arrived = BTreeMap::new();
    for (_, list) in by_partition(&consumed) {
        let mut reassembler = Reassembler::new();
        for m in &list {
            let event = decode_json_message(&m.payload).expect("decodes");
            if let Some(done) = reassembler.push(event).expect("segments fit") {
                arrived.insert(done.event.logicalid.clone(), done.event.data);
            }
        }
    }
    assert_eq!(arrived.len(), expected.len(), "every event arrived");
    assert!(arrived == expected, "with its data");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn json_logs_are_one_object_a_line_and_no_line_dumps_rust_debug() {
    let dir = temp_dir("jsonlog");
    let text = format!(
        "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 50\n[sink]\nkind = \"file\"\npath = \"{out}\"\n[checkpoint]\npath = \"{cp}\"\n",
        out = dir.join("out.ndjson").display(),
        cp = dir.join("cp.json").display()
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, text).expect("config");
    let run = |extra: &[&str]| {
        let output = harness::output(
            harness::command(&["run", "--until-idle"], &path)
                .args(extra)
                .env("RUST_LOG", "info"),
            "a run with its log at info",
        );
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    // First run: JSON from the flag.
    let stderr = run(&["--log-format", "json"]);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let stopped = lines
        .iter()
        .find(|l| l["message"] == "stopped")
        .expect("a stop line");
    assert_eq!(stopped["level"], "INFO");
    // The start says where events come from and go, and how they are written.
    let said = |message: &str| {
        lines
            .iter()
            .find(|l| l["message"] == message)
            .unwrap_or_else(|| panic!("a {message:?} line: {stderr}"))
    };
    let source = said("source: the synthetic workload (generated changes, not a database)");
    assert_eq!(source["transactions"], 50);
    let writing = said("writing CES events");
    assert_eq!(
        writing["destination"],
        format!("file {}", dir.join("out.ndjson").display())
    );
    assert_eq!(writing["encoding"], "json");
    assert_eq!(writing["mode"], "structured");
    assert!(
        writing.get("topic").is_none(),
        "no topic for a file: {writing}"
    );
    let checkpoint = stopped["checkpoint"].as_str().expect("checkpoint as text");
    assert!(
        checkpoint.contains(':') && checkpoint.contains(" #"),
        "LSN and sequence number: {checkpoint}"
    );
    // Second run, resuming: the setting gives the same, text lines by default.
    let stderr = run(&["--set", "log.format=\"text\""]);
    assert!(stderr.contains("resuming from the checkpoint"), "{stderr}");
    // Nothing new to send: the stop line still names the checkpoint it resumed from.
    let stopped = stderr
        .lines()
        .find(|l| l.contains(" stopped "))
        .unwrap_or_else(|| panic!("a stop line: {stderr}"));
    assert!(
        stopped.contains(&format!("checkpoint={checkpoint}")) && stopped.contains(" events=0 "),
        "{stopped}"
    );
    for line in stderr.lines() {
        assert!(
            !line.contains("Some(") && !line.contains("EventPosition {") && !line.contains("Lsn("),
            "no Debug dump: {line}"
        );
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_err(),
            "text, not JSON: {line}"
        );
    }
    // A run that fails: its reason is a JSON line too, the last one.
    let blocker = dir.join("a-file");
    std::fs::write(&blocker, "x").expect("file");
    let output = harness::output(
        harness::command(&["run", "--until-idle", "--log-format", "json"], &path)
            .args([
                "--set",
                &format!("sink.path=\"{}\"", blocker.join("out").display()),
            ])
            .args(["--checkpoint-path", &dir.join("cp2.json").to_string_lossy()]),
        "a run into a path it cannot write",
    );
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let last = lines.last().expect("a line");
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert_eq!(last["message"], "stopped with an error", "{stderr}");
    assert!(
        last["error"].as_str().is_some_and(|e| e.contains("a-file")),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// `read … | head`: the reader of the output stops early, and `read` ends quietly
/// with exit code 0, as a command-line tool does.
#[test]
fn read_into_a_pipe_closed_early_ends_quietly() {
    let dir = temp_dir("read-pipe");
    let path = dir.join("config.toml");
    let events = dir.join("events.ndjson");
    std::fs::write(
        &path,
        format!(
            "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 2000\n[sink]\nkind = \"file\"\npath = \"{}\"\n[checkpoint]\npath = \"{}\"\n",
            events.display(),
            dir.join("cp.json").display()
        ),
    )
    .expect("config");
    let written = run_until_idle(&path, "a run into a file");
    assert!(written.status.success());
    let mut child = harness::bare(&["read", "--file"])
        .arg(&events)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn read");
    let mut first = [0u8; 100];
    std::io::Read::read_exact(child.stdout.as_mut().expect("stdout"), &mut first)
        .expect("some output");
    drop(child.stdout.take());
    let status = support::tools::wait_within(&mut child, Duration::from_secs(30))
        .expect("read ends once its reader stopped");
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    std::fs::remove_dir_all(dir).ok();
}

/// A structured Avro topic says its encoding in `content-type`: `read` decodes it
/// without `--encoding avro`.
#[test]
fn read_takes_a_structured_message_s_encoding_from_its_content_type() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces", PARTITIONS, 1).expect("topic");
    let dir = temp_dir("read-avro");
    let config = config(&dir, &bootstrap, "seed = 9\ntransactions = 30");
    let mut child = spawn(
        &config,
        &dir,
        &["--until-idle", "--set", "event.encoding=\"avro\""],
        0,
    );
    assert_eq!(
        exit_within(&mut child, Duration::from_secs(60), &dir, "mssql-ces").code(),
        Some(0)
    );
    let output = support::tools::output_within(
        harness::bare(&["read", "--topic", "ces", "--bootstrap-servers", &bootstrap])
            .args(["--idle-ms", "1500"]),
        Duration::from_secs(60),
        "read of an Avro topic",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("0 problems"), "{stderr}");
    assert!(!output.stdout.is_empty());
    std::fs::remove_dir_all(dir).ok();
}

/// `mssql-ces read` on a topic the binary wrote in binary mode, killed once midway:
/// every event back once, segments joined, duplicates from the restart dropped.
#[test]
fn read_gives_back_every_event_once_from_a_topic_written_with_a_restart() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces", PARTITIONS, 1).expect("topic");
    let dir = temp_dir("read");
    let synthetic = "seed = 8\ntransactions = 600\nlarge_value_every = 40";
    let config = config(&dir, &bootstrap, synthetic);
    let binary_mode = ["--set", "sink.mode=\"binary\""];
    let mut child = spawn(&config, &dir, &binary_mode, 0);
    harness::wait_for_delivery(&dir.join("cp.json"));
    child.kill().expect("kill");
    child.wait().expect("reap");
    let mut args = binary_mode.to_vec();
    args.push("--until-idle");
    let mut child = spawn(&config, &dir, &args, 1);
    assert_eq!(
        exit_within(&mut child, Duration::from_secs(60), &dir, "mssql-ces").code(),
        Some(0)
    );

    let expected = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(expected_events(SyntheticConfig {
            seed: 8,
            transactions: Some(600),
            rate_per_second: None,
            large_value_every: 40,
            existing_rows: 0,
            oversized_value_every: 0,
        }));
    let output = harness::output(
        harness::bare(&["read", "--topic", "ces", "--bootstrap-servers", &bootstrap])
            .args(["--idle-ms", "1500"]),
        "mssql-ces read",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let mut got: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let event: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let logicalid = event["logicalid"].as_str().expect("logicalid").to_owned();
        let data = event["data"].as_str().expect("data").as_bytes().to_vec();
        assert!(got.insert(logicalid, data).is_none(), "each event once");
    }
    assert_eq!(got.len(), expected.len(), "{stderr}");
    assert!(
        got == expected,
        "every event's data, reassembled, as the encoder made it"
    );
    assert!(
        stderr.contains(&format!("{} events", expected.len())) && stderr.contains("0 problems"),
        "{stderr}"
    );
    // A consumer group reads everything once, then continues where it left off.
    let in_group =
        || {
            harness::output(
                harness::bare(&["read", "--topic", "ces", "--bootstrap-servers", &bootstrap])
                    .args(["--idle-ms", "1500", "--group", "audit"]),
                "mssql-ces read --group",
            )
        };
    let first = in_group();
    assert_eq!(first.status.code(), Some(0));
    let first_lines = String::from_utf8_lossy(&first.stdout).lines().count();
    assert_eq!(
        first_lines,
        expected.len(),
        "the group's first read: everything"
    );
    let again = in_group();
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).lines().count(),
        0,
        "nothing new for the group: {}",
        String::from_utf8_lossy(&again.stderr)
    );
    // Small reads with --max-events: each stops mid-topic, often mid-event, and the
    // next continues from its first segment: every event, no gap. (The restart's
    // re-sends are in the topic too; one read drops them, separate reads cannot.)
    let mut pieces: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..200 {
        let output = harness::bare(&["read", "--topic", "ces", "--bootstrap-servers", &bootstrap])
            .args([
                "--idle-ms",
                "1000",
                "--group",
                "pieces",
                "--max-events",
                "97",
            ])
            .output()
            .expect("run mssql-ces read --max-events");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        assert!(stderr.contains("0 problems"), "{stderr}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        if stdout.is_empty() {
            break;
        }
        for line in stdout.lines() {
            let event: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let id = event["logicalid"].as_str().expect("logicalid").to_owned();
            *pieces.entry(id).or_default() += 1;
        }
    }
    assert_eq!(pieces.len(), expected.len(), "every event, in pieces");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn an_initial_load_killed_at_random_moments_resumes_to_the_same_bytes_as_one_uninterrupted() {
    let write_config = |dir: &Path| -> PathBuf {
        let path = dir.join("config.toml");
        std::fs::write(
            &path,
            format!(
                r#"
[source]
kind = "synthetic"
poll_interval_ms = 20

[source.synthetic]
seed = 9
transactions = 400
rate_per_second = 0
existing_rows = 60000

[snapshot]
mode = "initial"
chunk_size = 700

[sink]
kind = "file"
path = "{out}"

[checkpoint]
path = "{checkpoint}"
interval_ms = 25
"#,
                out = dir.join("events.jsonl").display(),
                checkpoint = dir.join("cp.json").display()
            ),
        )
        .expect("config");
        path
    };
    let reference_dir = temp_dir("load-reference");
    let reference_config = write_config(&reference_dir);
    let mut whole = spawn(&reference_config, &reference_dir, &["--until-idle"], 0);
    assert!(
        exit_within(
            &mut whole,
            Duration::from_secs(180),
            &reference_dir,
            "mssql-ces"
        )
        .success()
    );
    let reference = std::fs::read(reference_dir.join("events.jsonl")).expect("reference");
    let lines = reference
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    assert!(
        lines > 60_000,
        "{lines} lines: the products table and the other tables' rows"
    );

    let dir = temp_dir("load-killed");
    let config_path = write_config(&dir);
    let mut moments = Moments::new();
    let seed = moments.seed();
    let mut mid_load = 0;
    for run in 0..8 {
        let mut child = spawn(&config_path, &dir, &[], run);
        std::thread::sleep(Duration::from_millis(moments.between(150, 700)));
        child.kill().expect("kill");
        child.wait().expect("reap");
        let checkpoint = std::fs::read_to_string(dir.join("cp.json")).unwrap_or_default();
        if checkpoint.contains("\"loads\"") {
            mid_load += 1;
        }
    }
    let mut last = spawn(&config_path, &dir, &["--until-idle"], 8);
    let status = exit_within(&mut last, Duration::from_secs(180), &dir, "mssql-ces");
    assert!(
        status.success(),
        "final run: {status} (seed {seed}); logs in {}",
        dir.display()
    );
    let resumed = std::fs::read(dir.join("events.jsonl")).expect("output");
    assert!(
        mid_load > 0,
        "no kill landed in the middle of the load (seed {seed})"
    );
    assert_eq!(
        resumed.len(),
        reference.len(),
        "the same number of bytes (seed {seed}, {mid_load} kills mid-load)"
    );
    assert!(
        resumed == reference,
        "byte for byte what an uninterrupted run writes (seed {seed})"
    );
    std::fs::remove_dir_all(dir).ok();
    std::fs::remove_dir_all(reference_dir).ok();
}

/// The help a new user reads first names every destination, and `run --help` the
/// environment overrides and the exit codes.
#[test]
fn help_names_every_destination_the_overrides_and_the_exit_codes() {
    let help = |args: &[&str]| {
        let output = harness::output(&mut harness::bare(args), "--help");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let top = help(&["--help"]);
    for destination in ["Kafka", "Event Hubs", "file", "stdout"] {
        assert!(top.contains(destination), "{destination}: {top}");
    }
    let run = help(&["run", "--help"]);
    assert!(
        run.contains("MSSQL_CES__SOURCE__CONNECTION_STRING"),
        "{run}"
    );
    assert!(run.contains("Exit codes") && run.contains("2 the"), "{run}");
}

/// Through the binary, as a user runs it: the synthetic workload's oversized values
/// (`oversized_value_every`) are cut to what CES keeps, in both encodings, and read
/// back so; the stop line counts the cut values.
#[test]
fn the_binary_cuts_values_over_one_mib_and_says_how_many() {
    const LIMIT: usize = 1_048_576;
    for encoding in ["json", "avro"] {
        let dir = temp_dir("oversized");
        let out = dir.join("out.ndjson");
        let path = dir.join("config.toml");
        std::fs::write(
            &path,
            format!(
                "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 12\noversized_value_every = 5\n[event]\nencoding = \"{encoding}\"\n[sink]\nkind = \"file\"\npath = \"{}\"\n[checkpoint]\npath = \"{}\"\n",
                out.display(),
                dir.join("cp.json").display()
            ),
        )
        .expect("config");
        let output = harness::run_until_idle(&path, "a run with attachments");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        // Transactions 0, 5 and 10: a name and a content each.
        assert!(stderr.contains("truncated_values=6"), "{stderr}");
        let read = harness::output(
            harness::bare(&["read", "--data", "--encoding", encoding, "--file"]).arg(&out),
            "read --data",
        );
        assert!(
            read.status.success(),
            "{}",
            String::from_utf8_lossy(&read.stderr)
        );
        let attachments: Vec<serde_json::Value> = String::from_utf8_lossy(&read.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON"))
            .filter(|e| e["eventsource"]["tbl"] == "attachments")
            .collect();
        assert_eq!(attachments.len(), 3, "{encoding}");
        for event in attachments {
            let row = &event["eventrow"]["current"];
            let name = row["name"].as_str().expect("name");
            let content = row["content"].as_str().expect("content");
            // "a" and whole 4-byte characters up to the cut; 0x and whole bytes.
            assert_eq!(name.len(), LIMIT - 3, "{encoding}");
            assert!(name.starts_with("a😀") && name.ends_with('😀'));
            assert_eq!(content.len(), LIMIT, "{encoding}");
            assert!(content.starts_with("0x000102"), "{encoding}");
        }
        std::fs::remove_dir_all(dir).ok();
    }
}

/// `start_position = "latest"` is settled and saved before anything is read: a first
/// run killed before its first checkpoint interval still leaves the start, so that the
/// next run does not start at a later "latest" and skip the changes in between.
#[test]
fn a_latest_start_is_saved_before_the_first_poll() {
    let dir = temp_dir("latest");
    let path = dir.join("config.toml");
    let checkpoint = dir.join("cp.json");
    std::fs::write(
        &path,
        format!(
            "[source]\nkind = \"synthetic\"\nstart_position = \"latest\"\n[source.synthetic]\ntransactions = 0\nrate_per_second = 50\n[sink]\nkind = \"stdout\"\n[checkpoint]\npath = \"{}\"\ninterval_ms = 600000\n",
            checkpoint.display()
        ),
    )
    .expect("config");
    let mut child = harness::Running::new(
        harness::command(&["run"], &path)
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    harness::wait_until("the start saved", Duration::from_secs(10), || {
        std::fs::read_to_string(&checkpoint).is_ok_and(|text| text.contains("\"instances\""))
    });
    let saved = std::fs::read_to_string(&checkpoint).expect("checkpoint");
    // Killed long before the checkpoint interval.
    child.kill().expect("kill");
    child.wait().expect("wait");
    let checkpoint: serde_json::Value =
        serde_json::from_str(&saved).unwrap_or_else(|e| panic!("{e}: {saved:?}"));
    let instances = checkpoint["position"]["instances"]
        .as_object()
        .or_else(|| checkpoint["instances"].as_object())
        .unwrap_or_else(|| panic!("the start's instances: {checkpoint}"));
    assert_eq!(instances.len(), 3, "every capture instance: {checkpoint}");
    std::fs::remove_dir_all(dir).ok();
}

/// `/dev/stdout` (or any name of fd 1) redirected to a file is a stream, not a file
/// of ours: a restart neither empties nor cuts it, and a stream restarted after a
/// torn line starts on a line of its own.
#[test]
fn standard_output_redirected_to_a_file_is_a_stream_not_ours_to_cut() {
    let dir = temp_dir("stdout-file");
    let out = dir.join("out.jsonl");
    for (kind, path) in [
        ("file", Some("/dev/stdout")),
        ("file", Some("/proc/self/fd/1")),
        ("stdout", None),
    ] {
        std::fs::write(&out, "the user's own line\n{\"torn\":").expect("a torn line");
        let path_line = path.map_or_else(String::new, |p| format!("path = \"{p}\"\n"));
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 5\n[sink]\nkind = \"{kind}\"\n{path_line}[checkpoint]\npath = \"{}\"\n",
                dir.join("cp.json").display()
            ),
        )
        .expect("config");
        std::fs::remove_file(dir.join("cp.json")).ok();
        for run in 0..2 {
            let file = std::fs::OpenOptions::new()
                .append(true)
                .open(&out)
                .expect("out");
            let output = harness::command(&["run", "--until-idle"], &config)
                .stdout(Stdio::from(file))
                .output()
                .expect("run");
            assert!(
                output.status.success(),
                "{kind} {path:?} run {run}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let text = std::fs::read_to_string(&out).expect("out");
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("the user's own line"),
            "{kind} {path:?}: kept"
        );
        assert_eq!(
            lines.next(),
            Some("{\"torn\":"),
            "{kind} {path:?}: the torn line ends"
        );
        let events: Vec<serde_json::Value> = lines
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{kind} {path:?}: {e}: {l}"))
            })
            .collect();
        assert!(!events.is_empty(), "{kind} {path:?}");
        assert!(events.iter().all(|e| e["specversion"] == "1.0"));
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A cluster that needs a login (the SASL front before a MockCluster broker): with
/// each mechanism the binary gets in with the right password, given as the secret
/// itself in MSSQL_CES__SINK__SASL_PASSWORD, and delivers everything; with a wrong
/// one it stops within seconds, definitely, naming the settings to check, and never
/// prints the password.
#[test]
fn a_sasl_cluster_takes_the_right_password_and_refuses_a_wrong_one_by_name() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("ces", 1, 1).expect("topic");
    let front = support::kafka_sasl::start(
        &cluster.bootstrap_servers(),
        &[("ces-writer", "Right-Passw0rd")],
    );
    let dir = temp_dir("sasl");
    let path = dir.join("config.toml");
    for (mechanism, round) in [("PLAIN", 0), ("SCRAM-SHA-256", 1), ("SCRAM-SHA-512", 2)] {
        std::fs::write(
            &path,
            format!(
                "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 10\nseed = {round}\n[sink]\nkind = \"kafka\"\nbootstrap_servers = \"{}\"\ntopic = \"ces\"\nsecurity_protocol = \"sasl_plaintext\"\nsasl_mechanism = \"{mechanism}\"\nsasl_username = \"ces-writer\"\n[checkpoint]\npath = \"{}\"\n",
                front.address,
                dir.join(format!("cp-{round}.json")).display()
            ),
        )
        .expect("config");
        let run = |password: &str| {
            let started = Instant::now();
            let output = harness::output(
                harness::command(&["run", "--until-idle"], &path)
                    .env("MSSQL_CES__SINK__SASL_PASSWORD", password),
                "a run with a SASL password",
            );
            (output, started.elapsed())
        };
        let (output, _) = run("Right-Passw0rd");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{mechanism}: {stderr}");
        assert!(!stderr.contains("Right-Passw0rd"), "{stderr}");
        std::fs::remove_file(dir.join(format!("cp-{round}.json"))).ok();
        let (output, took) = run("Wrong-Passw0rd");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{mechanism}: {stderr}");
        assert!(
            took < Duration::from_secs(20),
            "{mechanism}: refused after {took:?}"
        );
        assert!(
            stderr.contains("refused this client") && stderr.contains("sink.sasl_password"),
            "{mechanism}: {stderr}"
        );
        assert!(
            stderr.contains("a restart repeats it"),
            "definite: {stderr}"
        );
        assert!(!stderr.contains("Wrong-Passw0rd"), "{stderr}");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A cluster with topic `ces` and the checkpoint topic, and a configuration in a new
/// directory named `name` whose checkpoint is in Kafka (`extra_sink`: more `[sink]`
/// lines).
fn kafka_store_setup(
    name: &str,
    synthetic: &str,
    extra_sink: &str,
) -> (
    MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    String,
    PathBuf,
    PathBuf,
) {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces", PARTITIONS, 1).expect("topic");
    cluster
        .create_topic("mssql-ces-checkpoints", 1, 1)
        .expect("checkpoint topic");
    let dir = temp_dir(name);
    let config = config(&dir, &bootstrap, synthetic);
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        text.replace("[checkpoint]\n", "[checkpoint]\nstore = \"kafka\"\n")
            .replace(
                "delivery_timeout_ms = 60000",
                &format!("delivery_timeout_ms = 20000\n{extra_sink}"),
            ),
    )
    .expect("config");
    (cluster, bootstrap, dir, config)
}

/// How many records the checkpoint topic holds (its high watermark).
fn checkpoint_records(bootstrap: &str) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("consumer");
    consumer
        .fetch_watermarks("mssql-ces-checkpoints", 0, Duration::from_secs(5))
        .map_or(0, |(_, high)| high)
}

/// `checkpoint.store = "kafka"`: the checkpoint lives in a compacted topic on the
/// same brokers. Killed three times while it publishes and restarted, the binary
/// resumes from the topic each time: every event arrives, with its data, and the
/// checkpoint topic ends at the last event.
#[test]
fn a_checkpoint_in_kafka_survives_kills_and_nothing_is_lost() {
    // At 300 transactions a second a run takes 5 s: each is killed while it
    // publishes, some way into it, however slow the machine is to start it.
    let (_cluster, bootstrap, dir, config) = kafka_store_setup(
        "kafka-store",
        "seed = 31\ntransactions = 1500\nrate_per_second = 300",
        "",
    );
    for run in 0..3 {
        let mut child = spawn(&config, &dir, &[], run);
        if run == 0 {
            // However slowly a busy machine starts it, the first run is killed only
            // once it has written a checkpoint: the last run must find one.
            harness::wait_until("the first checkpoint", Duration::from_secs(60), || {
                checkpoint_records(&bootstrap) > 0
            });
        } else {
            std::thread::sleep(Duration::from_millis(1500 + 200 * run as u64));
        }
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "run {run} still publishing; logs in {}",
            dir.display()
        );
        child.kill().expect("kill");
        child.wait().expect("reap");
    }
    let mut last = spawn(&config, &dir, &["--until-idle"], 3);
    let status = exit_within(&mut last, Duration::from_secs(120), &dir, "mssql-ces");
    assert!(
        status.success(),
        "final run: {status}; logs in {}",
        dir.display()
    );
    assert!(
        !dir.join("cp.json").exists(),
        "no checkpoint file with the Kafka store"
    );
    let log = std::fs::read_to_string(dir.join("run-3.log")).expect("log");
    assert!(log.contains("resuming from the checkpoint"), "{log}");
    let expected = plain_events(31, 1500);
    let consumed = consume_expected(&bootstrap, &expected, Duration::from_secs(60));
    let mut arrived: HashMap<String, Vec<u8>> = HashMap::new();
    for m in &consumed {
        let event = decode_json_message(&m.payload).expect("message decodes");
        arrived.insert(event.logicalid.clone(), event.data.clone());
    }
    for (id, data) in &expected {
        assert!(
            arrived.get(id) == Some(data),
            "event {id} missing or changed"
        );
    }
    assert_eq!(
        arrived.len(),
        expected.len(),
        "no event that should not exist"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// `sink.exactly_once` with the binary (on `MockCluster`, which runs transactions):
/// a run to the end, a second that resumes from the position its last transaction
/// committed and has nothing to send, and `read --isolation read_committed` that
/// finds every event once, with no duplicate to drop.
#[test]
fn an_exactly_once_stream_reads_back_without_duplicates() {
    let (_cluster, bootstrap, dir, config) = kafka_store_setup(
        "exactly-once-read",
        "seed = 33\ntransactions = 600",
        "exactly_once = true",
    );
    for run in 0..2 {
        let mut child = spawn(&config, &dir, &["--until-idle"], run);
        let status = exit_within(&mut child, Duration::from_secs(60), &dir, "mssql-ces");
        assert!(status.success(), "run {run}; logs in {}", dir.display());
    }
    let second = std::fs::read_to_string(dir.join("run-1.log")).expect("log");
    assert!(second.contains("resuming from the checkpoint"), "{second}");
    assert!(
        second.contains(" events=0 "),
        "nothing left to send: {second}"
    );
    let output = harness::output(
        harness::bare(&["read", "--topic", "ces", "--bootstrap-servers", &bootstrap]).args([
            "--idle-ms",
            "1500",
            "--isolation",
            "read_committed",
        ]),
        "read --isolation read_committed",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("0 duplicates dropped"), "{stderr}");
    let events = String::from_utf8_lossy(&output.stdout).lines().count();
    assert!(events > 600, "{events} events; {stderr}");
    assert!(stderr.contains(&format!("{events} events")), "{stderr}");
    std::fs::remove_dir_all(dir).ok();
}

/// A file written as Avro (base64 lines) is read without `--encoding`: its first
/// record says how it was written. Said wrongly, each line names the flag that reads
/// it, and past a few the rest are counted.
#[test]
fn read_takes_a_file_s_encoding_from_its_first_record() {
    let dir = temp_dir("read-file-avro");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[source]\nkind = \"synthetic\"\n[source.synthetic]\nseed = 5\ntransactions = 20\n[event]\nencoding = \"avro\"\n[sink]\nkind = \"file\"\npath = \"{}\"\n[checkpoint]\npath = \"{}\"\n",
            dir.join("events.ndjson").display(),
            dir.join("cp.json").display()
        ),
    )
    .expect("config");
    let run = harness::run_until_idle(&config, "an Avro run into a file");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let read = |extra: &[&str]| {
        harness::output(
            harness::bare(&["read", "--file"])
                .arg(dir.join("events.ndjson"))
                .args(extra),
            "read of an Avro file",
        )
    };
    let detected = read(&[]);
    let stderr = String::from_utf8_lossy(&detected.stderr);
    assert_eq!(detected.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("0 problems"), "{stderr}");
    let events = String::from_utf8_lossy(&detected.stdout).lines().count();
    assert!(events > 20, "{events} events");
    let wrong = read(&["--encoding", "json"]);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("read with --encoding avro"), "{stderr}");
    std::fs::remove_dir_all(dir).ok();
}

/// A producer that loses its idempotence state (the broker answers a produce with
/// OUT_OF_ORDER_SEQUENCE_NUMBER: librdkafka's fatal "sequence desynchronization")
/// cannot go on, but a new one can: the run replaces it, resumes from the
/// checkpoint, says so, and ends with every event delivered and its exit code 0.
#[test]
fn a_producer_that_lost_its_state_is_replaced_and_the_run_delivers_everything() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces", PARTITIONS, 1).expect("topic");
    let dir = temp_dir("producer-lost");
    let config = config(
        &dir,
        &bootstrap,
        "seed = 37\ntransactions = 400\nrate_per_second = 200",
    );
    let mut child = spawn(&config, &dir, &["--until-idle"], 0);
    harness::wait_for_delivery(&dir.join("cp.json"));
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER],
    );
    let status = exit_within(&mut child, Duration::from_secs(90), &dir, "mssql-ces");
    let log = std::fs::read_to_string(dir.join("run-0.log")).expect("log");
    assert!(status.success(), "{status}: {log}");
    assert!(
        log.contains("the Kafka producer lost its state")
            && log.contains("sequence desynchronization"),
        "{log}"
    );
    let expected = plain_events(37, 400);
    let consumed = consume_expected(&bootstrap, &expected, Duration::from_secs(60));
    let arrived: HashSet<String> = consumed
        .iter()
        .map(|m| {
            decode_json_message(&m.payload)
                .expect("message decodes")
                .logicalid
        })
        .collect();
    let missing = expected.keys().filter(|id| !arrived.contains(*id)).count();
    assert_eq!(missing, 0, "events missing; logs in {}", dir.display());
    std::fs::remove_dir_all(dir).ok();
}

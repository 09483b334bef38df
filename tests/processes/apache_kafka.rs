//! The delivery promises on Apache Kafka 4.4 itself (KRaft, started by the test kit
//! from the jars `bash tests/setup` assembles), read back by Kafka's own Java client:
//! what MockCluster cannot show — aborted records hidden from a
//! `read_committed` reader, fencing of a second writer, a last stable offset pinned
//! by a transaction left open, leaders that die.

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use mssql_ces::event::readback::decode_json_message;
use mssql_ces::event::{EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit};
use mssql_ces::source::synthetic::SyntheticConfig;
use support::apache_kafka::{self, Cluster};
use support::kafka::Consumed;
use support::temp_dir;

use crate::harness::{exit_within, run_until_idle, signal, spawn};

/// Names of a test's own (topics, transactional id), so tests share one broker.
fn unique(what: &str) -> String {
    format!(
        "{what}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// The events of the synthetic workload with `seed` and `transactions` (JSON,
/// structured, the default message size), whatever its pace.
pub(crate) fn expected(seed: u64, transactions: u64) -> BTreeMap<String, Vec<u8>> {
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(support::expected::events(
            SyntheticConfig {
                seed,
                transactions: Some(transactions),
                rate_per_second: None,
                large_value_every: 0,
                existing_rows: 0,
                oversized_value_every: 0,
            },
            |guid| EncoderOptions {
                stream_guid: guid,
                encoding: Encoding::Json,
                final_event: FinalEventMode::LastInTransaction,
                max_message_size: MessageSizeLimit::default(),
            },
            Encoding::Json,
        ))
}

struct Stream {
    topic: String,
    checkpoint_topic: String,
    transactional_id: String,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            topic: unique("ces"),
            checkpoint_topic: unique("checkpoints"),
            transactional_id: unique("mssql-ces"),
        }
    }

    /// A configuration streaming synthetic transactions (seed 41) into this
    /// stream's topic as `settings` say.
    fn config(&self, dir: &Path, bootstrap: &str, settings: &Settings) -> PathBuf {
        let path = dir.join("config.toml");
        let checkpoint = if settings.file_checkpoint {
            format!("path = \"{}\"", dir.join("cp.json").display())
        } else {
            format!("store = \"kafka\"\ntopic = \"{}\"", self.checkpoint_topic)
        };
        std::fs::write(
            &path,
            format!(
                r#"
[source]
kind = "synthetic"
poll_interval_ms = 20
batch_size = 100

[source.synthetic]
seed = 41
transactions = {transactions}
rate_per_second = {rate}

[sink]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
delivery_timeout_ms = {delivery_timeout_ms}
exactly_once = {exactly_once}
transactional_id = "{transactional_id}"

[checkpoint]
{checkpoint}
interval_ms = 20
{extra}
"#,
                transactions = settings.transactions,
                rate = settings.rate,
                delivery_timeout_ms = settings.delivery_timeout_ms,
                exactly_once = settings.exactly_once,
                extra = settings.extra,
                topic = self.topic,
                transactional_id = self.transactional_id,
            ),
        )
        .expect("config");
        path
    }
}

/// How a test runs its stream, beyond the stream's names.
struct Settings<'a> {
    exactly_once: bool,
    transactions: u64,
    rate: u32,
    delivery_timeout_ms: u64,
    /// The checkpoint in a file of the test's directory, not in the Kafka store.
    file_checkpoint: bool,
    /// More TOML at the end (tables of their own: `[sink.kafka]`, `[metrics]`).
    extra: &'a str,
}

impl<'a> Settings<'a> {
    /// Exactly-once with the Kafka store: `transactions` at `rate` a second.
    fn exactly_once(transactions: u64, rate: u32) -> Self {
        Settings {
            exactly_once: true,
            transactions,
            rate,
            delivery_timeout_ms: 20_000,
            file_checkpoint: false,
            extra: "",
        }
    }

    /// At least once, the checkpoint in a file, a delivery time-out long enough to
    /// outlast the brokers' faults, and `extra`.
    fn at_least_once(transactions: u64, rate: u32, extra: &'a str) -> Self {
        Settings {
            exactly_once: false,
            transactions,
            rate,
            delivery_timeout_ms: 120_000,
            file_checkpoint: true,
            extra,
        }
    }
}

/// Each record's `logicalid` and `data`, in offset order per partition.
fn decoded(records: &[Consumed]) -> BTreeMap<i32, Vec<(String, Vec<u8>)>> {
    let mut out: BTreeMap<i32, Vec<(i64, String, Vec<u8>)>> = BTreeMap::new();
    for r in records {
        let event = decode_json_message(&r.payload).expect("a CES event");
        out.entry(r.partition).or_default().push((
            r.offset,
            event.logicalid.clone(),
            event.data.clone(),
        ));
    }
    out.into_iter()
        .map(|(p, mut list)| {
            list.sort_by_key(|(offset, ..)| *offset);
            (
                p,
                list.into_iter().map(|(_, id, data)| (id, data)).collect(),
            )
        })
        .collect()
}

/// Every expected event exactly once with its bytes, nothing else, and each
/// partition's events in the order of the source (strictly ascending positions: no
/// repeat, no step back).
fn assert_exactly_once(expected: &BTreeMap<String, Vec<u8>>, records: &[Consumed], logs: &Path) {
    let repeated = assert_nothing_lost_in_order(expected, records, logs);
    assert!(
        repeated.is_empty(),
        "events read more than once: {:?} (logs in {})",
        &repeated[..repeated.len().min(5)],
        logs.display()
    );
}

/// What an at-least-once stream promises through broker faults: every expected
/// event with its bytes, nothing else, each partition in the order of the source;
/// a repeat only of an event its partition already holds (the producer's epoch
/// bumped and what was in flight sent again). Returns the repeats, in the order
/// read.
fn assert_nothing_lost_in_order(
    expected: &BTreeMap<String, Vec<u8>>,
    records: &[Consumed],
    logs: &Path,
) -> Vec<String> {
    let mut seen: HashMap<String, i32> = HashMap::new();
    let mut repeated = Vec::new();
    for (partition, events) in decoded(records) {
        let mut last: Option<(String, u64)> = None;
        for (id, data) in events {
            assert_eq!(
                expected.get(&id),
                Some(&data),
                "event {id} is not the workload's (logs in {})",
                logs.display()
            );
            if let Some(first) = seen.get(&id) {
                assert_eq!(
                    *first,
                    partition,
                    "event {id} in partitions {first} and {partition} (logs in {})",
                    logs.display()
                );
                repeated.push(id);
                continue;
            }
            let position = support::kafka::position_of(&id);
            if let Some(last) = &last {
                assert!(
                    position > *last,
                    "partition {partition}: {id} after {last:?}: a step back (logs in {})",
                    logs.display()
                );
            }
            last = Some(position);
            seen.insert(id, partition);
        }
    }
    let missing: Vec<_> = expected
        .keys()
        .filter(|id| !seen.contains_key(*id))
        .take(5)
        .collect();
    assert!(
        missing.is_empty(),
        "events missing: {missing:?} (logs in {})",
        logs.display()
    );
    assert_eq!(seen.len(), expected.len());
    repeated
}

fn shared_broker() -> &'static Cluster {
    apache_kafka::shared()
}

/// A writer SIGKILLed mid-transaction, its successor SIGSTOPped mid-stream and a
/// third process taking the stream over while it is frozen: Kafka fences the frozen
/// one (it stops with exit 1, naming the takeover), aborts what each left open, and
/// a `read_committed` reader sees every event exactly once and in order.
#[test]
fn exactly_once_through_a_kill_a_freeze_and_a_takeover_read_committed_sees_each_event_once() {
    let kafka = shared_broker();
    let dir = temp_dir("apache-eo");
    let stream = Stream::new();
    kafka.create_topic(&stream.topic, 4, 1, &[]);
    let config = stream.config(&dir, &kafka.bootstrap(), &Settings::exactly_once(2500, 700));

    let mut first = spawn(&config, &dir, "first", &[]);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        first.try_wait().expect("try_wait").is_none(),
        "the first writer runs"
    );
    signal(&first, libc::SIGKILL);
    let _ = first.wait();

    let mut second = spawn(&config, &dir, "second", &[]);
    std::thread::sleep(Duration::from_millis(2000));
    assert!(
        second.try_wait().expect("try_wait").is_none(),
        "the second writer runs"
    );
    signal(&second, libc::SIGSTOP);
    let mut third = spawn(&config, &dir, "third", &["--until-idle"]);
    std::thread::sleep(Duration::from_millis(3000));
    signal(&second, libc::SIGCONT);
    let status = exit_within(
        &mut second,
        Duration::from_secs(60),
        &dir,
        "the frozen writer",
    );
    let log = std::fs::read_to_string(dir.join("second.log")).expect("log");
    assert_eq!(
        status.code(),
        Some(1),
        "the fenced writer stops with exit 1: {log}"
    );
    assert!(
        log.contains("another process took over this stream"),
        "Kafka fenced it: {log}"
    );
    let finished = exit_within(&mut third, Duration::from_secs(180), &dir, "the successor");
    assert!(
        finished.success(),
        "the successor ends; logs in {}",
        dir.display()
    );

    let expected = expected(41, 2500);
    assert_eq!(expected.len(), 9950, "the workload's events");
    let committed = kafka.read(&stream.topic, "read_committed", &[]);
    assert_exactly_once(&expected, &committed, &dir);
    let all = kafka.read(&stream.topic, "read_uncommitted", &[]);
    println!(
        "Apache Kafka, exactly-once through a kill, a freeze and a takeover: {} events read committed once each; {} records with the aborted ones",
        expected.len(),
        all.len()
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Another stream's transaction left open on the checkpoint topic pins its last
/// stable offset below this stream's newest checkpoint. A restart must not take the
/// older checkpoint below it (and commit those batches again): it waits until the
/// open transaction ends (Kafka aborts it at its `transaction.timeout.ms`) and
/// resumes from the newest.
#[test]
fn a_transaction_left_open_on_the_checkpoint_topic_does_not_make_a_restart_resume_from_an_older_checkpoint()
 {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let kafka = shared_broker();
    let dir = temp_dir("apache-lso");
    let stream = Stream::new();
    kafka.create_topic(&stream.topic, 4, 1, &[]);
    kafka.create_topic(
        &stream.checkpoint_topic,
        1,
        1,
        &[("cleanup.policy", "compact")],
    );
    let config = stream.config(&dir, &kafka.bootstrap(), &Settings::exactly_once(2500, 800));

    let mut writer = spawn(&config, &dir, "first", &[]);
    std::thread::sleep(Duration::from_millis(1200));
    // Another stream's writer opens a transaction on the checkpoint partition and
    // stops there (as one SIGSTOPped or SIGKILLed mid-commit would).
    let other: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap())
        .set("transactional.id", unique("another-stream"))
        .set("transaction.timeout.ms", "15000")
        .create()
        .expect("producer");
    other
        .init_transactions(Duration::from_secs(30))
        .expect("init");
    other.begin_transaction().expect("begin");
    other
        .send(
            BaseRecord::to(&stream.checkpoint_topic)
                .key("another-stream")
                .payload("{}"),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    other.flush(Duration::from_secs(30)).expect("flush");
    let opened = Instant::now();
    // This stream commits well past the open transaction, then is killed.
    std::thread::sleep(Duration::from_millis(2500));
    signal(&writer, libc::SIGKILL);
    let _ = writer.wait();
    assert!(
        opened.elapsed() < Duration::from_secs(12),
        "restarted while the other transaction is still open"
    );
    let mut successor = spawn(&config, &dir, "second", &["--until-idle"]);
    let finished = exit_within(
        &mut successor,
        Duration::from_secs(180),
        &dir,
        "the restarted writer",
    );
    assert!(
        finished.success(),
        "the restart ends; logs in {}",
        dir.display()
    );
    drop(other);

    let expected = expected(41, 2500);
    let committed = kafka.read(&stream.topic, "read_committed", &[]);
    assert_exactly_once(&expected, &committed, &dir);
    std::fs::remove_dir_all(dir).ok();
}

/// Three brokers, replication factor 3, `min.insync.replicas=2`, `acks=all` and
/// idempotence (the sink's defaults): the leader of a partition killed mid-stream
/// and brought back, a broker frozen for longer than the producer's request
/// time-out, and the whole cluster restarted with messages waiting. The stream goes
/// on, and the reader finds every event once (no loss, and no duplicate, since the
/// process never restarted) and each partition in the source's order.
/// A free port on loopback, for a run's metrics server.
fn metrics_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    format!("127.0.0.1:{port}")
}

/// `/readyz` of a run, asked every 250 ms on a thread of its own until the run's
/// server stops answering: (when, status, body) of each answer.
struct ReadinessWatch {
    samples: std::sync::Arc<std::sync::Mutex<Vec<(Instant, u16, String)>>>,
}

impl ReadinessWatch {
    fn start(address: &str) -> ReadinessWatch {
        let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (address, into) = (address.to_owned(), std::sync::Arc::clone(&samples));
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut answered = false;
            // Until the server goes away after answering (the run ended), or 10 min.
            while started.elapsed() < Duration::from_secs(600) {
                match std::net::TcpStream::connect(&address) {
                    Ok(_) => {
                        let (status, body) = crate::metrics_binary::get(&address, "/readyz");
                        answered = true;
                        if let Ok(mut samples) = into.lock() {
                            samples.push((Instant::now(), status, body));
                        }
                    }
                    Err(_) if answered => return,
                    Err(_) => {}
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        ReadinessWatch { samples }
    }

    /// The answers between `from` and `to`.
    fn between(&self, from: Instant, to: Instant) -> Vec<(u16, String)> {
        self.samples
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|(at, _, _)| *at >= from && *at <= to)
                    .map(|(_, status, body)| (*status, body.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Three brokers, topics replicated three times: the leader killed and restarted,
/// another leader frozen, the whole cluster killed and started again, under a
/// stream at least once. Every event arrives, each partition in order (a repeat is
/// what the producer sent again in a new epoch); `/readyz` and the log follow the
/// outage; and a topic short of its in-sync replicas stops the run by name.
#[test]
fn three_brokers_through_a_dead_leader_a_frozen_broker_and_a_cluster_restart_lose_nothing_and_keep_order()
 {
    let mut kafka = Cluster::start(
        "three",
        3,
        apache_kafka::NodeOptions {
            properties: vec![
                "min.insync.replicas=2".into(),
                "replica.lag.time.max.ms=5000".into(),
            ],
            ..Default::default()
        },
    );
    let dir = temp_dir("apache-three");
    let stream = Stream::new();
    kafka.create_topic(&stream.topic, 4, 3, &[("min.insync.replicas", "2")]);
    let address = metrics_address();
    let config = stream.config(
        &dir,
        &kafka.bootstrap(),
        &Settings::at_least_once(
            2500,
            50,
            &format!(
                "[metrics]\nlisten = \"{address}\"\n[sink.kafka]\n\"request.timeout.ms\" = \"5000\""
            ),
        ),
    );
    let mut run = spawn(&config, &dir, "run", &["--until-idle"]);
    let readiness = ReadinessWatch::start(&address);
    let running = |run: &mut Child| {
        assert!(
            run.try_wait().expect("try_wait").is_none(),
            "the run goes on; logs in {}",
            dir.display()
        )
    };

    std::thread::sleep(Duration::from_secs(3));
    let started = Instant::now();
    let leader = kafka.leader_of(&stream.topic, 0);
    kafka.node(leader).kill();
    std::thread::sleep(Duration::from_secs(3));
    running(&mut run);
    kafka.node(leader).restart();

    std::thread::sleep(Duration::from_secs(2));
    let frozen = kafka.leader_of(&stream.topic, 1);
    kafka.node(frozen).freeze();
    std::thread::sleep(Duration::from_secs(8));
    running(&mut run);
    kafka.node(frozen).thaw();

    std::thread::sleep(Duration::from_secs(2));
    let all_down = Instant::now();
    kafka.restart_all(Duration::from_secs(4));
    let all_up = Instant::now();
    running(&mut run);
    std::thread::sleep(Duration::from_secs(3));
    let after = Instant::now();

    let status = exit_within(&mut run, Duration::from_secs(240), &dir, "the run");
    assert!(status.success(), "the run ends; logs in {}", dir.display());
    let expected = expected(41, 2500);
    let records = kafka.read(&stream.topic, "read_uncommitted", &[]);
    let repeats = assert_nothing_lost_in_order(&expected, &records, &dir).len();
    // Readiness said what happened while it happened: ready before the faults,
    // not ready (naming the sink) while every broker was down, ready again after.
    let before = readiness.between(Instant::now() - Duration::from_secs(3600), started);
    assert!(before.iter().any(|(s, _)| *s == 200), "{before:?}");
    let down = readiness.between(all_down, all_up + Duration::from_secs(2));
    assert!(
        down.iter()
            .any(|(s, body)| *s == 503 && body.contains("sink:")),
        "not ready while the cluster restarted: {down:?}; logs in {}",
        dir.display()
    );
    let again = readiness.between(all_up, after + Duration::from_secs(60));
    assert!(
        again.iter().any(|(s, _)| *s == 200),
        "ready again: {again:?}"
    );
    let log = std::fs::read_to_string(dir.join("run.log")).expect("log");
    assert!(
        log.contains("Kafka unreachable") && log.contains("Kafka reachable again"),
        "the log says the outage: {log}"
    );
    println!(
        "three brokers: {} events, none lost, in order, {repeats} repeated, through a dead leader (node {leader}), a frozen broker (node {frozen}) and a cluster restart; /readyz during the restart: {} answers 503, {} answers 200",
        expected.len(),
        down.iter().filter(|(s, _)| *s == 503).count(),
        down.iter().filter(|(s, _)| *s == 200).count(),
    );

    // A topic with fewer in-sync replicas than its min.insync.replicas: Kafka refuses
    // each write with NOT_ENOUGH_REPLICAS, which it calls retriable. The run retries
    // up to sink.delivery_timeout_ms, then stops naming the refusal, the topic and
    // the setting, exit 1.
    let short = Stream::new();
    kafka.create_topic(&short.topic, 1, 3, &[("min.insync.replicas", "3")]);
    let follower = (1..=3)
        .find(|n| *n != kafka.leader_of(&short.topic, 0))
        .expect("a follower");
    kafka.node(follower).kill();
    // The leader drops it from the in-sync replicas after replica.lag.time.max.ms;
    // until then it accepts the writes and waits for the dead follower (the
    // messages time out in flight, with no refusal to name).
    kafka.wait_out_of_sync(&short.topic, 0, follower);
    let short_dir = temp_dir("apache-not-enough-replicas");
    let settings = Settings {
        delivery_timeout_ms: 6000,
        ..Settings::at_least_once(50, 0, "")
    };
    let config = short.config(&short_dir, &kafka.bootstrap(), &settings);
    let started = Instant::now();
    let mut run = spawn(&config, &short_dir, "run", &["--until-idle"]);
    let status = exit_within(&mut run, Duration::from_secs(60), &short_dir, "the run");
    let took = started.elapsed();
    let log = std::fs::read_to_string(short_dir.join("run.log")).expect("log");
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        took >= Duration::from_secs(6),
        "at the delivery timeout: {took:?}"
    );
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("NOT_ENOUGH_REPLICAS")
            && last.contains(&short.topic)
            && last.contains("min.insync.replicas"),
        "the last line names the refusal, the topic and the setting: {last}"
    );
    std::fs::remove_dir_all(short_dir).ok();
    std::fs::remove_dir_all(dir).ok();
}

/// A broker frozen (SIGSTOP) under a running stream: its connection stays up, so
/// readiness follows acknowledgements instead. Within seconds `/readyz` answers 503
/// saying that messages wait unacknowledged, and the log says so once; thawed, the
/// stream goes on, `/readyz` is ready again, and every event arrives, in order.
#[test]
fn a_frozen_broker_makes_the_run_not_ready_until_it_acknowledges_again() {
    let mut kafka = Cluster::start("frozen", 1, apache_kafka::NodeOptions::default());
    let dir = temp_dir("apache-frozen");
    let stream = Stream::new();
    kafka.create_topic(&stream.topic, 4, 1, &[]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let address = format!("127.0.0.1:{port}");
    let metrics = format!("[metrics]\nlisten = \"{address}\"");
    let config = stream.config(
        &dir,
        &kafka.bootstrap(),
        &Settings::at_least_once(2500, 100, &metrics),
    );
    let mut run = spawn(&config, &dir, "run", &["--until-idle"]);
    let readyz = || {
        std::net::TcpStream::connect(&address)
            .ok()
            .map(|_| crate::metrics_binary::get(&address, "/readyz"))
    };
    let wait_for = |what: &str, limit: Duration, ok: &dyn Fn(u16, &str) -> bool| {
        let deadline = Instant::now() + limit;
        loop {
            if let Some((status, body)) = readyz()
                && ok(status, &body)
            {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{what} within {limit:?}; logs in {}",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    wait_for("ready", Duration::from_secs(60), &|status, _| status == 200);
    kafka.node(1).freeze();
    let frozen_at = Instant::now();
    // Connected, and nothing acknowledged. A client that was (re)connecting when the
    // broker froze says first that it is not connected, which is true too; the
    // test waits for the state it is about.
    let body = wait_for(
        "not ready, nothing acknowledged, while the broker is frozen",
        Duration::from_secs(30),
        &|status, body| status == 503 && body.contains("none was acknowledged"),
    );
    let took = frozen_at.elapsed();
    // The log line comes with the producer's statistics, once a second or so.
    std::thread::sleep(Duration::from_secs(6));
    kafka.node(1).thaw();
    wait_for(
        "ready again once it acknowledges",
        Duration::from_secs(60),
        &|status, _| status == 200,
    );
    let status = exit_within(&mut run, Duration::from_secs(240), &dir, "the run");
    assert!(status.success(), "logs in {}", dir.display());
    let log = std::fs::read_to_string(dir.join("run.log")).expect("log");
    assert_eq!(
        log.matches("Kafka acknowledges nothing though connected")
            .count(),
        1,
        "said once: {log}"
    );
    assert!(log.contains("Kafka acknowledges deliveries again"), "{log}");
    let records = kafka.read(&stream.topic, "read_uncommitted", &[]);
    let repeats = assert_nothing_lost_in_order(&expected(41, 2500), &records, &dir).len();
    println!(
        "a frozen broker: not ready {:.1} s after the freeze: {body}; {repeats} events repeated",
        took.as_secs_f64()
    );
    std::fs::remove_dir_all(dir).ok();
}

/// With exactly-once every position the stream writes, the first one included
/// (the initial load's plan, written before the first batch), is committed in a
/// transaction by the fenced producer: on the checkpoint topic each of the stream's records is followed by a
/// transaction marker, which takes an offset of its own.
#[test]
fn every_position_an_exactly_once_stream_writes_is_in_a_transaction_the_first_one_too() {
    let kafka = shared_broker();
    let dir = temp_dir("apache-first-position");
    let stream = Stream::new();
    kafka.create_topic(&stream.topic, 4, 1, &[]);
    kafka.create_topic(
        &stream.checkpoint_topic,
        1,
        1,
        &[("cleanup.policy", "compact")],
    );
    let config = stream.config(&dir, &kafka.bootstrap(), &Settings::exactly_once(300, 0));
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .expect("config")
            .replace("rate_per_second = 0\n", "existing_rows = 50\n")
            .replace(
                "[checkpoint]\n",
                "[snapshot]\nmode = \"initial\"\n\n[checkpoint]\n",
            ),
    )
    .expect("config");
    let mut run = spawn(&config, &dir, "run", &["--until-idle"]);
    let status = exit_within(&mut run, Duration::from_secs(120), &dir, "the run");
    assert!(status.success(), "logs in {}", dir.display());
    let records = kafka.read(&stream.checkpoint_topic, "read_uncommitted", &[]);
    let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
    assert!(
        !offsets.is_empty(),
        "positions were written; logs in {}",
        dir.display()
    );
    assert_eq!(offsets[0], 0, "the first record is the load's plan");
    for pair in offsets.windows(2) {
        assert!(
            pair[1] - pair[0] >= 2,
            "a record without its transaction marker: offsets {offsets:?}"
        );
    }
    let committed = kafka.read(&stream.checkpoint_topic, "read_committed", &[]);
    assert_eq!(committed.len(), records.len(), "each of them committed");
    std::fs::remove_dir_all(dir).ok();
}

/// A topic template over the synthetic workload's tables, one of them
/// `sales.order details`: Apache Kafka refuses a topic name with a space, so the
/// names put in have `_` in its place and the run delivers every table's events.
#[test]
fn a_table_name_with_a_space_goes_to_a_topic_kafka_accepts() {
    let kafka = apache_kafka::shared();
    let prefix = unique("names");
    let dir = temp_dir("apache-topic-names");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[source]\nkind = \"synthetic\"\npoll_interval_ms = 20\n[source.synthetic]\nseed = 41\ntransactions = 40\n[sink]\nkind = \"kafka\"\nbootstrap_servers = \"{}\"\ntopic = \"{prefix}.{{db}}.{{schema}}.{{tbl}}\"\n[checkpoint]\npath = \"{}\"\n",
            kafka.bootstrap(),
            dir.join("cp.json").display()
        ),
    )
    .expect("config");
    let output = run_until_idle(&config, "a run into per-table topics");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let details = kafka.read(
        &format!("{prefix}.synthetic.sales.order_details"),
        "read_uncommitted",
        &[],
    );
    assert!(!details.is_empty(), "{stderr}");
    for message in &details {
        let event = decode_json_message(&message.payload).expect("a CES message");
        assert!(
            String::from_utf8_lossy(&event.data).contains(r#""tbl":"order details""#),
            "{}",
            String::from_utf8_lossy(&event.data)
        );
    }
    // The other tables' topics hold theirs.
    assert!(
        !kafka
            .read(
                &format!("{prefix}.synthetic.dbo.orders"),
                "read_uncommitted",
                &[]
            )
            .is_empty()
    );
    std::fs::remove_dir_all(dir).ok();
}

/// The column rules an oversized record's error suggests, as TOML's inline tables
/// (`{ column = "…", truncate = N }, …`).
fn suggested_rules(stderr: &str) -> Vec<String> {
    stderr
        .split("{ column = ")
        .skip(1)
        .filter_map(|rest| {
            rest.split_once(" }")
                .map(|(rule, _)| format!("{{ column = {rule} }}"))
        })
        .collect()
}

#[test]
fn a_debezium_record_is_bounded_by_the_destination_and_an_oversized_one_names_the_rules_that_fit() {
    let kafka = apache_kafka::shared();
    let prefix = unique("dbz");
    let dir = temp_dir("apache-debezium-bound");
    let config = dir.join("config.toml");
    // Every fourth transaction carries a 300 KB value (over CES's default 256 KiB
    // segment, which once bounded Debezium records too); every tenth inserts an
    // attachment of two values CES cuts to 1 MiB each: a record of about 2 MiB,
    // over Kafka's default 1 MiB.
    let write = |rules: &str| {
        std::fs::write(
            &config,
            format!(
                "[source]\nkind = \"synthetic\"\npoll_interval_ms = 20\n[source.synthetic]\nseed = 41\ntransactions = 30\nlarge_value_every = 4\noversized_value_every = 10\n[event]\nformat = \"debezium\"\ncolumns = [{rules}]\n[event.debezium]\ntopic_prefix = \"{prefix}\"\n[sink]\nkind = \"kafka\"\nbootstrap_servers = \"{}\"\n[checkpoint]\npath = \"{}\"\n",
                kafka.bootstrap(),
                dir.join("cp.json").display()
            ),
        )
        .expect("config");
    };
    let run = |what: &str| run_until_idle(&config, what);
    write("");
    let refused = run("a Debezium run meeting an oversized record");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("dbo.attachments")
            && stderr.contains("1047564 bytes")
            && stderr.contains(r#"sink.kafka."message.max.bytes""#),
        "{stderr}"
    );
    let rules = suggested_rules(&stderr);
    assert!(
        !rules.is_empty() && rules.iter().all(|r| r.contains("dbo.attachments.")),
        "{stderr}"
    );
    // With the rules it names, the run goes on from its checkpoint and ends.
    write(&rules.join(", "));
    let fitted = run("the Debezium run with the suggested column rules");
    let stderr = String::from_utf8_lossy(&fitted.stderr);
    assert!(fitted.status.success(), "{stderr}");
    let largest = |table: &str| {
        kafka
            .read(
                &format!("{prefix}.synthetic.dbo.{table}"),
                "read_uncommitted",
                &[],
            )
            .iter()
            .map(|m| m.payload.len())
            .max()
            .unwrap_or(0)
    };
    // A 300 KB value went as one record, past CES's 256 KiB segments.
    let order = largest("orders");
    assert!(order > 300_000, "{order}");
    let attachment = largest("attachments");
    assert!(
        attachment > 1_000_000 && attachment <= 1_047_564,
        "{attachment}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// A checkpoint topic whose policy deletes records would lose a quiet stream's only
/// checkpoint after its retention: the run refuses it, and `check` fails on it,
/// each naming the command that makes it compacted.
#[test]
fn a_checkpoint_topic_that_deletes_records_is_refused_with_the_fix() {
    let kafka = shared_broker();
    let dir = temp_dir("apache-delete-policy");
    let stream = Stream::new();
    kafka.create_topic(&stream.topic, 1, 1, &[]);
    kafka.create_topic(
        &stream.checkpoint_topic,
        1,
        1,
        &[("cleanup.policy", "delete"), ("retention.ms", "3600000")],
    );
    let config = stream.config(&dir, &kafka.bootstrap(), &Settings::exactly_once(20, 0));
    let run = run_until_idle(&config, "a run on a deleting checkpoint topic");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("cleanup.policy=delete")
            && last.contains("retention.ms 3600000")
            && last.contains("--add-config cleanup.policy=compact"),
        "{last}"
    );
    let check = crate::harness::output(
        &mut crate::harness::command(&["check"], &config),
        "check on a deleting checkpoint topic",
    );
    let said = String::from_utf8_lossy(&check.stdout);
    let kept = said
        .lines()
        .find(|l| l.contains("checkpoint: kept"))
        .unwrap_or_default();
    assert!(
        kept.starts_with('✘') && kept.contains("cleanup.policy=delete"),
        "{said}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// A topic whose `max.message.bytes` is below the largest message the run may
/// write is found out before the first message reaches it: the run stops naming
/// both settings, and the topic holds nothing, so no later oversized message can
/// leave a gap behind records already written.
#[test]
fn a_topic_limit_below_the_largest_message_stops_the_run_before_its_first_message() {
    let kafka = shared_broker();
    let dir = temp_dir("apache-topic-limit");
    let stream = Stream::new();
    kafka.create_topic(&stream.topic, 1, 1, &[("max.message.bytes", "65536")]);
    let config = stream.config(
        &dir,
        &kafka.bootstrap(),
        &Settings::at_least_once(20, 0, "[event]\nmax_message_size_kb = 256\n"),
    );
    let run = run_until_idle(&config, "a run into a topic of a small limit");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains(&stream.topic)
            && last.contains("max.message.bytes")
            && last.contains("event.max_message_size_kb"),
        "{last}"
    );
    let written = kafka.read(&stream.topic, "read_uncommitted", &[]);
    assert!(
        written.is_empty(),
        "{} messages reached the topic before its limit was checked",
        written.len()
    );
    std::fs::remove_dir_all(dir).ok();
}

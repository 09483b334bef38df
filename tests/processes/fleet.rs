//! A fleet of real binaries (`fleet.group_id`) sharing twelve databases of the
//! synthetic server through Kafka's consumer group protocol.
//!
//! - Kills, joins and leaves run on `MockCluster` (librdkafka's in-process brokers:
//!   the classic group protocol with the cooperative-sticky assignor, and
//!   transactions). It keeps aborted transactions' records visible, so there the
//!   tests check what a killed member leaves instead: per database and partition the
//!   records are ascending runs, and a run restarts only where a member was killed,
//!   going back at most one transaction.
//! - A member paused past its session time-out, and kills, run on Apache Kafka with
//!   each group protocol, read back `read_committed` by Kafka's Java client: there
//!   every event is committed exactly once.

use crate::harness::signal;
use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mssql_ces::event::readback::decode_json_message;
use mssql_ces::event::{EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit};
use mssql_ces::source::synthetic::SyntheticConfig;
use rdkafka::mocking::MockCluster;
use support::kafka::{consume_quietly, position_of};
use support::temp_dir;

const PARTITIONS: i32 = 4;
const DATABASES: u32 = 12;
const TRANSACTIONS: u64 = 150;
const SEED: u64 = 41;
const SLOTS: i32 = 24;
/// Change rows a poll reads at most: a batch, and so a transaction, holds fewer
/// events than this.
const BATCH: usize = 100;

fn write_config(dir: &Path, bootstrap: &str, extra: &str) -> PathBuf {
    let path = dir.join("config.toml");
    let text = format!(
        r#"
[source]
kind = "synthetic"
databases = ["tenant*"]
max_connections = 13
poll_interval_ms = 20
batch_size = {BATCH}

[source.synthetic]
seed = {SEED}
databases = {DATABASES}
transactions = {TRANSACTIONS}
rate_per_second = 15

[event]
max_message_size_kb = 128

[sink]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "ces"
partition_key = "table"
delivery_timeout_ms = 20000
exactly_once = true

[checkpoint]
store = "kafka"
interval_ms = 50

[shutdown]
drain_timeout_ms = 10000

[fleet]
group_id = "fleet-test"
session_timeout_ms = 4000
{extra}
"#
    );
    std::fs::write(&path, text).expect("config");
    path
}

struct Fleet {
    config: PathBuf,
    dir: PathBuf,
    members: Vec<(usize, crate::harness::Running)>,
    started: usize,
}

impl Fleet {
    fn add(&mut self) {
        let n = self.started;
        self.started += 1;
        let child = crate::harness::spawn(&self.config, &self.dir, &format!("member-{n}"), &[]);
        self.members.push((n, child));
    }

    /// Takes a member out at `pick` (modulo the members running).
    fn take(&mut self, pick: u64) -> (usize, crate::harness::Running) {
        let at = (pick % self.members.len() as u64) as usize;
        self.members.remove(at)
    }

    /// SIGTERM to every member still running; each exits 0 within 30 s.
    fn stop_every_member(&mut self) {
        for (n, child) in &mut self.members {
            signal(child, libc::SIGTERM);
            let status = support::tools::wait_within(child, Duration::from_secs(30));
            assert!(
                status.is_some_and(|s| s.success()),
                "member {n}: {status:?}"
            );
        }
    }

    fn log(&self, n: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("member-{n}.log"))).unwrap_or_default()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (_, child) in &mut self.members {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Every database's events: `logicalid` → (database, `data`).
type Expected = HashMap<String, (String, Vec<u8>)>;

fn expected() -> Expected {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut all = HashMap::new();
    for i in 1..=DATABASES {
        let database = format!("tenant{i:03}");
        let events = runtime.block_on(support::expected::database_events(
            SyntheticConfig {
                seed: SEED,
                transactions: Some(TRANSACTIONS),
                rate_per_second: None,
                large_value_every: 0,
                existing_rows: 0,
                oversized_value_every: 0,
            },
            &database,
            |guid| EncoderOptions {
                stream_guid: guid,
                encoding: Encoding::Json,
                final_event: FinalEventMode::LastInTransaction,
                max_message_size: MessageSizeLimit::from_kb(128).expect("valid"),
            },
            Encoding::Json,
        ));
        for (id, data) in events {
            all.insert(id, (database.clone(), data));
        }
    }
    all
}

/// What the topic holds once every expected event may have arrived (and a quiet
/// while after, for duplicates that follow).
fn consume_all(bootstrap: &str, expected: &Expected) -> Vec<support::kafka::Consumed> {
    consume_quietly(
        bootstrap,
        "ces",
        PARTITIONS,
        Duration::from_secs(150),
        // Longer than a session time-out and a rebalance: duplicates can make up
        // the count while a killed member's databases are still to move.
        Duration::from_secs(8),
        |m| m.len() >= expected.len(),
    )
}

/// Every event of every database arrived, with its bytes, and nothing else. Each
/// database and partition: ascending runs; a run restarts only after a kill or a
/// pause (at most `kills` times), and repeats at most the one transaction the
/// member left open. Returns the restarts and the events repeated.
fn check_delivery(
    consumed: &[support::kafka::Consumed],
    expected: &Expected,
    kills: usize,
    dir: &Path,
) -> (usize, usize) {
    let mut arrived: HashMap<&str, usize> = HashMap::new();
    // (database, partition) → positions in offset order.
    let mut runs: BTreeMap<(String, i32), Vec<(String, u64)>> = BTreeMap::new();
    for m in consumed {
        let event = decode_json_message(&m.payload).expect("message decodes");
        let Some((id, (database, data))) = expected.get_key_value(&event.logicalid) else {
            panic!("an event that should not exist: {}", event.logicalid);
        };
        assert_eq!(&event.data, data, "{id}: the bytes of the workload");
        *arrived.entry(id.as_str()).or_default() += 1;
        runs.entry((database.clone(), m.partition))
            .or_default()
            .push(position_of(&event.logicalid));
    }
    let missing: Vec<&String> = expected
        .keys()
        .filter(|id| !arrived.contains_key(id.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} events missing, e.g. {:?}; logs in {}",
        missing.len(),
        expected.len(),
        missing.first(),
        dir.display()
    );
    let mut restarts_seen = 0;
    let mut repeated = 0;
    for ((database, partition), positions) in &runs {
        let mut kept: Vec<&(String, u64)> = Vec::new();
        let mut restarts = 0;
        for position in positions {
            if kept.last().is_some_and(|last| *last >= position) {
                restarts += 1;
                let before = kept.len();
                kept.retain(|p| *p < position);
                let back = before - kept.len();
                repeated += back;
                assert!(
                    back <= BATCH,
                    "{database} partition {partition}: went back {back} events, more than one transaction"
                );
            }
            kept.push(position);
        }
        assert!(
            restarts <= kills,
            "{database} partition {partition}: {restarts} restarts with {kills} kills (two writers?); logs in {}",
            dir.display()
        );
        restarts_seen += restarts;
    }
    (restarts_seen, repeated)
}

/// The brokers of a test: in-process, or Apache Kafka.
enum Brokers {
    Mock(MockCluster<'static, rdkafka::producer::DefaultProducerContext>),
    Apache(support::apache_kafka::Cluster),
}

/// Which brokers a test runs on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum On {
    Mock,
    Apache,
}

impl Brokers {
    fn bootstrap(&self) -> String {
        match self {
            Brokers::Mock(cluster) => cluster.bootstrap_servers(),
            Brokers::Apache(cluster) => cluster.bootstrap(),
        }
    }

    /// The checkpoint topic, compacted as the Kafka store requires.
    fn create_checkpoint_topic(&self, topic: &str) {
        match self {
            Brokers::Mock(cluster) => cluster.create_topic(topic, 1, 1).expect("topic"),
            Brokers::Apache(cluster) => {
                cluster.create_topic(topic, 1, 1, &[("cleanup.policy", "compact")]);
            }
        }
    }

    fn create_topic(&self, topic: &str, partitions: i32) {
        match self {
            Brokers::Mock(cluster) => cluster.create_topic(topic, partitions, 1).expect("topic"),
            Brokers::Apache(cluster) => cluster.create_topic(topic, partitions, 1, &[]),
        }
    }
}

/// The brokers with the topics, the members' configuration, and every event the
/// databases will produce.
fn setup(name: &str, on: On, extra: &str) -> (Brokers, Fleet, Expected) {
    let dir = temp_dir(name);
    let brokers = match on {
        On::Mock => Brokers::Mock(MockCluster::new(1).expect("mock cluster")),
        // A broker of the test's own (the topics and group have fixed names). Kafka's
        // default least session time-outs (6 s classic, 45 s consumer) are lowered
        // to what the test uses, and the consumer protocol's heartbeat with them.
        On::Apache => Brokers::Apache(support::apache_kafka::Cluster::start(
            name,
            1,
            support::apache_kafka::NodeOptions {
                properties: vec![
                    "group.min.session.timeout.ms=1000".into(),
                    "group.consumer.min.session.timeout.ms=1000".into(),
                    "group.consumer.session.timeout.ms=4000".into(),
                    "group.consumer.min.heartbeat.interval.ms=500".into(),
                    "group.consumer.heartbeat.interval.ms=1000".into(),
                    "transaction.abort.timed.out.transaction.cleanup.interval.ms=2000".into(),
                ],
                ..Default::default()
            },
        )),
    };
    brokers.create_topic("ces", PARTITIONS);
    brokers.create_checkpoint_topic("mssql-ces-checkpoints");
    brokers.create_topic("mssql-ces-fleet.fleet-test", SLOTS);
    let fleet = Fleet {
        config: write_config(&dir, &brokers.bootstrap(), extra),
        dir,
        members: Vec::new(),
        started: 0,
    };
    (brokers, fleet, expected())
}

/// Waits until `what` holds of a member's log, up to `timeout`.
fn wait_log(fleet: &Fleet, n: usize, timeout: Duration, what: impl Fn(&str) -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if what(&fleet.log(n)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Seconds from `moment` to the first "slots assigned" any log shows after it.
fn assigned_after(logs: &[String], moment: chrono::DateTime<chrono::Utc>) -> f64 {
    logs.iter()
        .flat_map(|log| log.lines())
        .filter(|l| l.contains("slots assigned"))
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .parse::<chrono::DateTime<chrono::Utc>>()
                .ok()
        })
        .filter(|at| *at > moment)
        .min()
        .map_or(f64::NAN, |at| {
            (at - moment).num_milliseconds() as f64 / 1000.0
        })
}

/// Three members, then at random moments: one SIGKILLed and replaced, one stopped
/// with SIGTERM (it hands its databases over and exits 0), one added, one more
/// SIGKILLed. Every event of every database arrives with its bytes; duplicates are
/// only what a killed member's open transaction left, at most one transaction a
/// database and partition a kill; and every database's slot moved to a live member.
#[test]
fn a_fleet_of_three_shares_twelve_databases_through_kills_joins_and_leaves() {
    let (brokers, mut fleet, expected) = setup("fleet", On::Mock, "");
    let bootstrap = brokers.bootstrap();
    let dir = fleet.dir.clone();
    let mut moments = crate::harness::Moments::new();
    eprintln!(
        "fleet test: moments seed {}; logs in {}",
        moments.seed(),
        dir.display()
    );
    let mut next = move |low: u64, high: u64| moments.between(low, high);
    for _ in 0..3 {
        fleet.add();
    }
    let mut kills = 0;
    std::thread::sleep(Duration::from_millis(next(3000, 5000)));
    let (killed, mut child) = fleet.take(next(0, 1000));
    let first_kill = chrono::Utc::now();
    signal(&child, libc::SIGKILL);
    child.wait().expect("reap");
    kills += 1;
    fleet.add();
    std::thread::sleep(Duration::from_millis(next(2000, 4000)));
    let (stopped, mut child) = fleet.take(next(0, 1000));
    let leave = chrono::Utc::now();
    signal(&child, libc::SIGTERM);
    let status = support::tools::wait_within(&mut child, Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "member {stopped} stopped with SIGTERM: {status:?}; its log: {}",
        fleet.log(stopped)
    );
    std::thread::sleep(Duration::from_millis(next(1000, 3000)));
    fleet.add();
    std::thread::sleep(Duration::from_millis(next(2000, 4000)));
    let (_, mut child) = fleet.take(next(0, 1000));
    signal(&child, libc::SIGKILL);
    child.wait().expect("reap");
    kills += 1;

    let consumed = consume_all(&bootstrap, &expected);
    let (restarts_seen, repeated) = check_delivery(&consumed, &expected, kills, &dir);
    // Members: the one stopped handed its slots over and left; the later ones were
    // assigned slots; the survivors stop cleanly.
    let log = fleet.log(stopped);
    assert!(log.contains("left the fleet"), "{log}");
    fleet.stop_every_member();
    let took_over = (0..fleet.started)
        .filter(|n| *n != killed && fleet.log(*n).matches("slots assigned").count() > 1)
        .count();
    assert!(
        took_over >= 1,
        "a member was assigned slots after a change; logs in {}",
        dir.display()
    );
    let logs: Vec<String> = (0..fleet.started).map(|n| fleet.log(n)).collect();
    eprintln!(
        "fleet test: {} events of {DATABASES} databases, {} messages read, {restarts_seen} restarts after {kills} kills repeating {repeated} events; \
         first assignment after the first SIGKILL {:.1} s (session time-out 4 s), after the SIGTERM {:.1} s",
        expected.len(),
        consumed.len(),
        assigned_after(&logs, first_kill),
        assigned_after(&logs, leave),
    );
    fleet.members.clear();
    if std::env::var_os("FLEET_KEEP").is_none() {
        std::fs::remove_dir_all(dir).ok();
    }
}

/// Every committed event of the fleet's topic, as Kafka's Java client reads it
/// `read_committed`, once `expected` many have been committed (or 150 s passed).
fn read_committed_all(
    cluster: &support::apache_kafka::Cluster,
    expected: &Expected,
) -> Vec<support::kafka::Consumed> {
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let committed = cluster.read("ces", "read_committed", &[]);
        if committed.len() >= expected.len() || Instant::now() > deadline {
            return committed;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The fleet on Apache Kafka's group coordinator, with `protocol` (`fleet.group_protocol`):
/// three members, one SIGKILLed, one paused (SIGSTOP) past its session time-out
/// and resumed, one added. Kafka aborts what the killed and the fenced member
/// left open, so a `read_committed` reader sees every event of every database
/// exactly once, each database and partition in the source's order: no database
/// was written by two members at once.
fn fleet_on_apache_kafka(protocol: &str) {
    let (brokers, mut fleet, expected) = setup(
        &format!("fleet-apache-{protocol}"),
        On::Apache,
        &format!("group_protocol = \"{protocol}\""),
    );
    let Brokers::Apache(cluster) = &brokers else {
        unreachable!("set up on Apache Kafka")
    };
    let dir = fleet.dir.clone();
    for _ in 0..3 {
        fleet.add();
    }
    let reading = |log: &str| log.contains("slots assigned");
    for n in 0..3 {
        assert!(
            wait_log(&fleet, n, Duration::from_secs(60), reading),
            "member {n} is assigned slots; logs in {}",
            dir.display()
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    let (_, mut killed) = fleet.take(0);
    signal(&killed, libc::SIGKILL);
    killed.wait().expect("reap");
    std::thread::sleep(Duration::from_secs(2));
    let paused = fleet.members[0].0;
    let paused_at = fleet.log(paused).len();
    signal(&fleet.members[0].1, libc::SIGSTOP);
    // Past the session time-out (4 s), and the other member takes the slots over.
    std::thread::sleep(Duration::from_secs(9));
    signal(&fleet.members[0].1, libc::SIGCONT);
    fleet.add();
    let after = |log: &str| log.get(paused_at..).unwrap_or_default().to_owned();
    assert!(
        wait_log(&fleet, paused, Duration::from_secs(60), |log| after(log)
            .contains("slots revoked")),
        "the resumed member stops its databases; logs in {}",
        dir.display()
    );
    // And rejoins the group: slots are assigned to it again.
    let rejoined = |log: &str| {
        let resumed = after(log);
        resumed
            .find("slots revoked")
            .is_some_and(|at| resumed[at..].contains("slots assigned"))
    };
    assert!(
        wait_log(&fleet, paused, Duration::from_secs(90), rejoined),
        "the resumed member rejoins and is assigned slots; logs in {}",
        dir.display()
    );
    let committed = read_committed_all(cluster, &expected);
    let (restarts, repeated) = check_delivery(&committed, &expected, 0, &dir);
    assert_eq!(
        (restarts, repeated),
        (0, 0),
        "exactly once: nothing repeated"
    );
    assert_eq!(
        committed.len(),
        expected.len(),
        "each event once; logs in {}",
        dir.display()
    );
    fleet.stop_every_member();
    eprintln!(
        "fleet on Apache Kafka ({protocol} protocol): {} events of {DATABASES} databases read committed once each through a kill and a pause",
        expected.len()
    );
    fleet.members.clear();
    if std::env::var_os("FLEET_KEEP").is_none() {
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn a_fleet_on_apache_kafka_s_classic_group_protocol_commits_each_event_once_through_a_kill_and_a_pause()
 {
    fleet_on_apache_kafka("classic");
}

#[test]
fn a_fleet_on_apache_kafka_s_consumer_group_protocol_commits_each_event_once_through_a_kill_and_a_pause()
 {
    fleet_on_apache_kafka("consumer");
}

//! The whole pipeline into Kafka (rdkafka's `MockCluster`: in-process brokers speaking
//! the real protocol): the synthetic source → encode → Kafka sink, then everything is
//! consumed back, reassembled per partition, and compared with the events computed
//! independently from the same source. Every partition-key scheme, both CloudEvents
//! modes, both encodings.

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use mssql_ces::checkpoint::{CheckpointStore, file::FileStore};
use mssql_ces::event::readback::{CloudEvent, Reassembler, decode_message};
use mssql_ces::event::{EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit};
use mssql_ces::pipeline::{self, PipelineSettings, RunSummary};
use mssql_ces::sink::kafka::KafkaSinkConfig;
use mssql_ces::sink::kafka::{KafkaFlavour, KafkaSettings, KafkaSink};
use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};
use mssql_ces::sink::{Router, Sink};
use mssql_ces::source::poller::{Poller, PollerConfig};
use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};
use rdkafka::mocking::MockCluster;
use support::kafka::{Consumed, by_partition, consume, position_of};
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 4;

fn synthetic(transactions: u64) -> SyntheticConfig {
    SyntheticConfig {
        seed: 11,
        transactions: Some(transactions),
        rate_per_second: None,
        large_value_every: 40,
        existing_rows: 0,
        oversized_value_every: 0,
    }
}

fn options(guid: uuid::Uuid, encoding: Encoding) -> EncoderOptions {
    EncoderOptions {
        stream_guid: guid,
        encoding,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size: MessageSizeLimit::from_kb(128).expect("valid"),
    }
}

/// What each event should carry: `logicalid` → whole `data`.
async fn expected(transactions: u64, encoding: Encoding) -> BTreeMap<String, Vec<u8>> {
    support::expected::events(
        synthetic(transactions),
        |guid| options(guid, encoding),
        encoding,
    )
    .await
}

fn sink_settings(bootstrap: &str) -> KafkaSinkConfig {
    KafkaSinkConfig {
        delivery_timeout: Duration::from_secs(60),
        ..KafkaSinkConfig::new(bootstrap)
    }
}

/// A Kafka sink at `bootstrap` with the tests' settings (`config` when given).
pub(crate) fn kafka_sink_with(bootstrap: &str, config: Option<KafkaSinkConfig>) -> KafkaSink {
    let config = config.unwrap_or_else(|| sink_settings(bootstrap));
    let settings =
        KafkaSettings::new(&config, KafkaFlavour::Kafka, 128 * 1024, None).expect("settings");
    KafkaSink::new(&settings, 128 * 1024).expect("sink")
}

async fn run(
    bootstrap: &str,
    topic: &str,
    scheme: PartitionKeyScheme,
    key_column: Option<&str>,
    mode: CloudEventsMode,
    encoding: Encoding,
    transactions: u64,
) -> RunSummary {
    let sink = Sink::Kafka(kafka_sink_with(bootstrap, None));
    let router = Router::new(
        topic,
        scheme,
        key_column.map(str::to_owned),
        mode,
        encoding,
        "group",
    );
    let dir = std::env::temp_dir().join(format!("mssql-ces-kp-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let store = CheckpointStore::File(FileStore::new(dir.join("cp.json"), "test"));
    let poller = Poller::new(
        SyntheticSource::new(synthetic(transactions)),
        PollerConfig {
            batch_size: 50,
            ..PollerConfig::default()
        },
        None,
    );
    let summary = pipeline::run(
        poller,
        Box::new(move |guid| options(guid, encoding)),
        router,
        sink,
        store,
        until_idle(),
        CancellationToken::new(),
    )
    .await
    .expect("run");
    std::fs::remove_dir_all(dir).ok();
    summary
}

/// A run until the source is idle, with short intervals.
pub(crate) fn until_idle() -> PipelineSettings {
    PipelineSettings {
        poll_interval: Duration::from_millis(10),
        checkpoint_interval: Duration::from_millis(10),
        drain_timeout: Duration::from_secs(30),
        idle_drain_timeout: Duration::from_secs(30),
        until_idle: true,
        metrics: Default::default(),
    }
}

fn header<'a>(m: &'a Consumed, name: &str) -> Option<&'a [u8]> {
    m.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_slice())
}

/// A consumed message as a CloudEvent, from either mode.
fn cloud_event(m: &Consumed, mode: CloudEventsMode, encoding: Encoding) -> CloudEvent {
    match mode {
        CloudEventsMode::Structured => {
            let expected = match encoding {
                Encoding::Json => "application/cloudevents+json; charset=UTF-8",
                Encoding::Avro => "application/vnd.mssql-ces.changeevent+avro",
            };
            assert_eq!(header(m, "content-type"), Some(expected.as_bytes()));
            decode_message(&m.payload, encoding).expect("structured message decodes")
        }
        CloudEventsMode::Binary => {
            let text = |name: &str| {
                String::from_utf8(
                    header(m, name)
                        .unwrap_or_else(|| panic!("no {name}"))
                        .to_vec(),
                )
                .expect("utf-8 header")
            };
            CloudEvent {
                specversion: text("ce_specversion"),
                event_type: text("ce_type"),
                source: text("ce_source"),
                id: text("ce_id"),
                logicalid: text("ce_logicalid"),
                time: text("ce_time"),
                datacontenttype: text("content-type"),
                operation: text("ce_operation"),
                segmentindex: text("ce_segmentindex").parse().expect("index"),
                finalsegment: text("ce_finalsegment").parse().expect("bool"),
                data: m.payload.clone(),
            }
        }
    }
}

/// A reassembled event: its whole data, its partition and its key.
struct Arrived {
    data: Vec<u8>,
    partition: i32,
    key: Option<Vec<u8>>,
}

/// Reassembles every partition; returns `logicalid` → what arrived.
fn reassemble(
    messages: &[Consumed],
    mode: CloudEventsMode,
    encoding: Encoding,
) -> HashMap<String, Arrived> {
    let mut events = HashMap::new();
    for (partition, list) in by_partition(messages) {
        let mut reassembler = Reassembler::new();
        let mut keys = Vec::new();
        for m in &list {
            keys.push(m.key.clone());
            if let Some(event) = reassembler
                .push(cloud_event(m, mode, encoding))
                .expect("segments in order")
            {
                let first_key = keys.first().cloned().flatten();
                assert!(
                    keys.iter().all(|k| *k == keys[0]),
                    "every segment has the same key"
                );
                keys.clear();
                events.insert(
                    event.event.logicalid.clone(),
                    Arrived {
                        data: event.event.data,
                        partition,
                        key: first_key,
                    },
                );
            }
        }
        reassembler
            .finish()
            .expect("no partial event left in a partition");
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scheme_mode_and_encoding_delivers_every_event() {
    let cluster = MockCluster::new(3).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    let transactions = 120;
    let cases = [
        (
            PartitionKeyScheme::Table,
            None,
            CloudEventsMode::Structured,
            Encoding::Json,
        ),
        (
            PartitionKeyScheme::None,
            None,
            CloudEventsMode::Structured,
            Encoding::Json,
        ),
        (
            PartitionKeyScheme::StreamGroup,
            None,
            CloudEventsMode::Binary,
            Encoding::Json,
        ),
        (
            PartitionKeyScheme::Column,
            Some("id"),
            CloudEventsMode::Structured,
            Encoding::Avro,
        ),
        (
            PartitionKeyScheme::PrimaryKey,
            None,
            CloudEventsMode::Binary,
            Encoding::Avro,
        ),
    ];
    let mut expected_by_encoding = HashMap::new();
    for (i, (scheme, column, mode, encoding)) in cases.into_iter().enumerate() {
        let topic = format!("ces-{i}");
        cluster.create_topic(&topic, PARTITIONS, 1).expect("topic");
        let summary = run(
            &bootstrap,
            &topic,
            scheme,
            column,
            mode,
            encoding,
            transactions,
        )
        .await;
        if let std::collections::hash_map::Entry::Vacant(slot) =
            expected_by_encoding.entry(encoding)
        {
            slot.insert(expected(transactions, encoding).await);
        }
        let expected = &expected_by_encoding[&encoding];
        let count = summary.messages as usize;
        let consumed = consume(
            &bootstrap,
            &topic,
            PARTITIONS,
            Duration::from_secs(30),
            |m| m.len() >= count,
        );
        assert_eq!(consumed.len(), count, "{scheme:?}: every message consumed");
        assert!(
            count > expected.len(),
            "{scheme:?}: some events were segmented"
        );
        let events = reassemble(&consumed, mode, encoding);
        assert_eq!(events.len(), expected.len(), "{scheme:?}: every event once");
        for (logicalid, data) in expected {
            let got = &events
                .get(logicalid)
                .unwrap_or_else(|| panic!("{scheme:?}: missing {logicalid}"));
            assert!(&got.data == data, "{scheme:?}: data of {logicalid} differs");
        }
        // Key checks per scheme.
        let keys: Vec<Option<Vec<u8>>> = events.values().map(|a| a.key.clone()).collect();
        match scheme {
            PartitionKeyScheme::None => assert!(keys.iter().all(Option::is_none)),
            PartitionKeyScheme::StreamGroup => {
                assert!(
                    keys.iter()
                        .all(|k| k.as_deref() == Some(b"group".as_slice()))
                )
            }
            PartitionKeyScheme::Table => {
                let tables: std::collections::HashSet<_> = keys.iter().flatten().collect();
                assert_eq!(tables.len(), 3, "one key per table");
                let mut partition_of_table = HashMap::new();
                for arrived in events.values() {
                    let previous =
                        partition_of_table.insert(arrived.key.clone(), arrived.partition);
                    assert!(
                        previous.is_none_or(|p| p == arrived.partition),
                        "a table stays in one partition"
                    );
                }
            }
            PartitionKeyScheme::Column => {
                assert!(
                    keys.iter()
                        .flatten()
                        .all(|k| std::str::from_utf8(k).unwrap().parse::<i64>().is_ok())
                )
            }
            PartitionKeyScheme::PrimaryKey => {
                assert!(keys.iter().flatten().all(|k| k.contains(&0x1F)))
            }
        }
        // Within a partition, events of one key come in commit order.
        for (_, list) in by_partition(&consumed) {
            let mut last: HashMap<Option<Vec<u8>>, (String, u64)> = HashMap::new();
            for m in list.iter() {
                let event = cloud_event(m, mode, encoding);
                let at = position_of(&event.logicalid);
                if let Some(previous) = last.insert(m.key.clone(), at.clone()) {
                    assert!(previous <= at, "{scheme:?}: order within a key");
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_mid_run_loses_nothing() {
    let cluster = MockCluster::new(3).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster
        .create_topic("outage", PARTITIONS, 3)
        .expect("topic");
    let transactions = 1500;
    let expected = expected(transactions, Encoding::Json).await;
    let sink = Sink::Kafka(kafka_sink_with(&bootstrap, None));
    let router = Router::new(
        "outage",
        PartitionKeyScheme::PrimaryKey,
        None,
        CloudEventsMode::Structured,
        Encoding::Json,
        "group",
    );
    let dir = std::env::temp_dir().join(format!("mssql-ces-outage-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let store = CheckpointStore::File(FileStore::new(dir.join("cp.json"), "test"));
    // Paced at 500 transactions/s, so the run spans the outage.
    let source = SyntheticSource::new(SyntheticConfig {
        rate_per_second: Some(500.0),
        ..synthetic(transactions)
    });
    let poller = Poller::new(
        source,
        PollerConfig {
            batch_size: 50,
            ..PollerConfig::default()
        },
        None,
    );
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(pipeline::run(
        poller,
        Box::new(|guid| options(guid, Encoding::Json)),
        router,
        sink,
        store,
        PipelineSettings {
            poll_interval: Duration::from_millis(10),
            checkpoint_interval: Duration::from_millis(50),
            drain_timeout: Duration::from_secs(30),
            idle_drain_timeout: Duration::from_secs(30),
            until_idle: false,
            metrics: Default::default(),
        },
        shutdown.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(700)).await;
    for broker in 1..=3 {
        cluster.broker_down(broker).expect("broker down");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !run.is_finished(),
        "the run waits out the outage instead of failing"
    );
    for broker in 1..=3 {
        cluster.broker_up(broker).expect("broker up");
    }
    let total_messages: usize = expected.len();
    let consumed = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || {
            support::kafka::consume_quietly(
                &bootstrap,
                "outage",
                PARTITIONS,
                Duration::from_secs(60),
                Duration::from_secs(2),
                move |m| m.len() >= total_messages,
            )
        }
    })
    .await
    .expect("consumer");
    shutdown.cancel();
    let summary = run.await.expect("join").expect("run succeeds");
    assert_eq!(summary.events as usize, expected.len());
    let mut first_copy: HashMap<String, Vec<u8>> = HashMap::new();
    for m in &consumed {
        let id = decode_message(&m.payload, Encoding::Json)
            .expect("decode")
            .id;
        let first = first_copy.entry(id).or_insert_with(|| m.payload.clone());
        assert!(*first == m.payload, "a duplicate differs from its original");
    }
    let events = reassemble(&consumed, CloudEventsMode::Structured, Encoding::Json);
    for (logicalid, data) in &expected {
        let got = events
            .get(logicalid)
            .unwrap_or_else(|| panic!("lost {logicalid}"));
        assert!(&got.data == data, "data of {logicalid} differs");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A two-byte message to topic `ces` under key `k`.
fn small_message() -> mssql_ces::sink::OutgoingMessage {
    mssql_ces::sink::OutgoingMessage {
        topic: "ces".into(),
        key: Some(b"k".to_vec()),
        partition_hint: None,
        headers: Vec::new(),
        payload: b"{}".to_vec(),
        message_id: None,
        tombstone: false,
    }
}

/// An `--until-idle` run of 20 transactions to a cluster whose broker is down, with
/// these drain bounds.
async fn idle_run_with_the_broker_down(
    drain_timeout: Duration,
    idle_drain_timeout: Duration,
    shutdown: CancellationToken,
    metrics: std::sync::Arc<mssql_ces::metrics::Metrics>,
) -> Result<RunSummary, mssql_ces::pipeline::PipelineError> {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("ces", 1, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    cluster.broker_down(1).expect("broker down");
    let sink = Sink::Kafka(kafka_sink_with(&bootstrap, None));
    let router = Router::new(
        "ces",
        PartitionKeyScheme::Table,
        None,
        CloudEventsMode::Structured,
        Encoding::Json,
        "group",
    );
    let poller = Poller::new(
        SyntheticSource::new(synthetic(20)),
        PollerConfig::default(),
        None,
    );
    let result = pipeline::run(
        poller,
        Box::new(move |guid| options(guid, Encoding::Json)),
        router,
        sink,
        CheckpointStore::Memory(mssql_ces::checkpoint::memory::MemoryStore::default()),
        PipelineSettings {
            poll_interval: Duration::from_millis(10),
            checkpoint_interval: Duration::from_millis(10),
            drain_timeout,
            idle_drain_timeout,
            until_idle: true,
            metrics,
        },
        shutdown,
    )
    .await;
    cluster.broker_up(1).expect("broker up");
    result
}

/// `--until-idle` with the brokers gone: the run waits for the deliveries up to its
/// idle drain bound (the delivery timeout), and then fails naming how many events
/// were not delivered, rather than exiting as if all were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stop_with_events_undelivered_fails_naming_how_many() {
    let started = std::time::Instant::now();
    // A shutdown's bound is shorter than the idle one: the idle stop waits the longer.
    let result = idle_run_with_the_broker_down(
        Duration::from_millis(100),
        Duration::from_secs(2),
        CancellationToken::new(),
        Default::default(),
    )
    .await;
    let waited = started.elapsed();
    let error = match result {
        Err(error) => error,
        Ok(summary) => panic!("an idle stop with the brokers down succeeded: {summary:?}"),
    };
    let text = error.to_string();
    assert!(
        matches!(error, mssql_ces::pipeline::PipelineError::Undelivered { events, .. } if events > 0),
        "{error:?}"
    );
    assert!(text.contains("sink.delivery_timeout_ms"), "{text}");
    assert!(
        waited >= Duration::from_secs(2),
        "waited the idle bound: {waited:?}"
    );
}

/// librdkafka never gives up on one message while it sends the ones after it (its
/// `message.timeout.ms` is infinite): the delivery timeout is the run's, counted on
/// the oldest outstanding message, and names the brokers and the setting. A message
/// waited on past a long outage is still delivered, in order, once a broker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_delivery_timeout_fails_the_oldest_and_reorders_nothing() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("ces", 1, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let config = KafkaSinkConfig {
        delivery_timeout: Duration::from_secs(1),
        ..sink_settings(&bootstrap)
    };
    let mut sink = kafka_sink_with(&bootstrap, Some(config));
    assert_eq!(sink.delivery_timeout(), Duration::from_secs(1));
    let message = |n: u32| mssql_ces::sink::OutgoingMessage {
        topic: "ces".into(),
        key: Some(b"k".to_vec()),
        partition_hint: None,
        headers: Vec::new(),
        payload: format!("{{\"n\":{n}}}").into_bytes(),
        message_id: None,
        tombstone: false,
    };
    // Metadata first, so that the messages are queued for a known partition.
    sink.send(message(0))
        .await
        .expect("queued")
        .wait()
        .await
        .expect("delivered");
    cluster.broker_down(1).expect("broker down");
    let first = sink.send(message(1)).await.expect("queued");
    let second = sink.send(message(2)).await.expect("queued");
    let started = std::time::Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    let error = first
        .wait_until(Some(deadline))
        .await
        .expect_err("the run's deadline");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    let text = error.to_string();
    assert!(
        text.contains(&bootstrap) && text.contains("sink.delivery_timeout_ms"),
        "{text}"
    );
    // librdkafka itself does not time the second one out, however long the outage.
    let still = tokio::time::timeout(Duration::from_secs(2), second.wait()).await;
    if let Ok(result) = still {
        panic!("librdkafka settled a message on its own during the outage: {result:?}");
    }
    cluster.broker_up(1).expect("broker up");
    // What reaches the partition is in send order: 0, then 1 and 2 (in order) once
    // the broker is back.
    let seen: Vec<String> = tokio::task::spawn_blocking(move || {
        consume(&bootstrap, "ces", 1, Duration::from_secs(30), |m| {
            m.len() >= 3
        })
        .into_iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect()
    })
    .await
    .expect("consumer");
    assert_eq!(seen, ["{\"n\":0}", "{\"n\":1}", "{\"n\":2}"]);
    drop(sink);
}

/// A fatal error of the idempotent producer (the cluster refuses InitProducerId:
/// CLUSTER_AUTHORIZATION_FAILED) fails the delivery at once as definite, naming the
/// cause, rather than as a transient purge after the delivery timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_producer_error_fails_deliveries_at_once_by_name() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("ces", 1, 1).expect("topic");
    cluster.request_errors(
        RDKafkaApiKey::InitProducerId,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED; 5],
    );
    let bootstrap = cluster.bootstrap_servers();
    let mut sink = kafka_sink_with(&bootstrap, None);
    let started = std::time::Instant::now();
    let error = match sink.send(small_message()).await {
        Ok(delivery) => delivery
            .wait_until(Some(tokio::time::Instant::now() + Duration::from_secs(60)))
            .await
            .expect_err("refused"),
        Err(e) => e,
    };
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(!error.is_transient(), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("refused this client") && text.contains("uthoriz"),
        "{text}"
    );
}

/// Gap-less or nothing: a message the broker refuses for good (too large) is not
/// followed by later messages of its partition, as the idempotent producer would
/// otherwise do once it renumbers them: the producer stops, and every later send
/// fails too, so the topic holds a prefix of what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_refused_for_good_is_not_followed_by_later_ones() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("ces", 1, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let mut sink = kafka_sink_with(&bootstrap, None);
    let deadline = || Some(tokio::time::Instant::now() + Duration::from_secs(60));
    // A first message delivered: the producer has its id.
    sink.send(small_message())
        .await
        .expect("send")
        .wait_until(deadline())
        .await
        .expect("delivered");
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    let refused = sink
        .send(small_message())
        .await
        .expect("send")
        .wait_until(deadline())
        .await
        .expect_err("refused");
    assert!(!refused.is_transient(), "{refused:?}");
    let later = match sink.send(small_message()).await {
        Ok(delivery) => delivery.wait_until(deadline()).await.err(),
        Err(e) => Some(e),
    };
    // The producer stopped (a restart resumes from the checkpoint, before the
    // refused message, and stops on it again).
    assert!(
        later
            .as_ref()
            .is_some_and(|e| e.to_string().contains("gap-less")
                && e.to_string().contains("Message size too large")),
        "a later message of the partition must not be delivered: {later:?}"
    );
    let consumed = consume(&bootstrap, "ces", 1, Duration::from_secs(5), |m| {
        m.len() > 1
    });
    assert_eq!(consumed.len(), 1, "only the message before the refused one");
}

/// Keyless events to a topic that is being created wait for its partitions within
/// the delivery timeout instead of failing at once; a topic the user may not write
/// fails at once, definite and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_being_created_is_waited_for_and_a_forbidden_one_is_named() {
    use rdkafka::types::RDKafkaRespErr;
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster
        .topic_error(
            "new",
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        )
        .expect("topic error");
    let config = KafkaSinkConfig {
        delivery_timeout: Duration::from_secs(20),
        ..sink_settings(&bootstrap)
    };
    let mut sink = kafka_sink_with(&bootstrap, Some(config));
    let keyless = |topic: &str| mssql_ces::sink::OutgoingMessage {
        topic: topic.into(),
        key: None,
        partition_hint: Some(7),
        headers: Vec::new(),
        payload: b"{}".to_vec(),
        message_id: None,
        tombstone: false,
    };
    let send = tokio::spawn(async move {
        let delivery = sink.send(keyless("new")).await;
        (sink, delivery)
    });
    // Created a moment later (the error cleared: the mock made the topic already).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!send.is_finished(), "waiting for the topic's partitions");
    cluster
        .topic_error("new", RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .expect("clear");
    let (mut sink, delivery) = send.await.expect("task");
    delivery
        .expect("queued once the topic has partitions")
        .wait()
        .await
        .expect("delivered");

    cluster
        .topic_error(
            "forbidden",
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .expect("topic error");
    let started = std::time::Instant::now();
    let error = sink
        .send(keyless("forbidden"))
        .await
        .err()
        .expect("refused");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(!error.is_transient(), "{error:?}");
    assert!(error.to_string().contains("not authorized"), "{error}");
}

/// A producer queue that stays full (brokers gone) is waited out for the delivery
/// timeout at most, then the send fails naming the brokers: librdkafka itself times
/// nothing out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_that_stays_full_fails_the_send_after_the_delivery_timeout() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("ces", 1, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    cluster.broker_down(1).expect("broker down");
    let mut config = KafkaSinkConfig {
        delivery_timeout: Duration::from_secs(1),
        ..sink_settings(&bootstrap)
    };
    config
        .kafka
        .insert("queue.buffering.max.messages".into(), "1".into());
    let mut sink = kafka_sink_with(&bootstrap, Some(config));
    let _first = sink.send(small_message()).await.expect("queued");
    let started = std::time::Instant::now();
    let error = sink
        .send(small_message())
        .await
        .err()
        .expect("the queue stays full");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(error.is_transient(), "{error:?}");
    assert!(error.to_string().contains("queue stayed full"), "{error}");
    cluster.broker_up(1).expect("broker up");
}

/// A signal during an idle stop's long drain (the delivery timeout) brings the wait
/// down to `shutdown.drain_timeout_ms` from then, and the stop is a shutdown's: what
/// is undelivered is left for the next start, not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_during_the_idle_drain_bounds_it_by_the_drain_timeout() {
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    let metrics = std::sync::Arc::new(mssql_ces::metrics::Metrics::default());
    let watched = std::sync::Arc::clone(&metrics);
    let signalled_at = std::sync::Arc::new(std::sync::Mutex::new(None));
    let at = std::sync::Arc::clone(&signalled_at);
    tokio::spawn(async move {
        // Once batches are out (the source is then soon idle, and the run in its
        // long drain), not after a fixed time a loaded machine may not keep to.
        while !watched
            .render()
            .lines()
            .any(|l| l.starts_with("mssql_ces_batches_in_flight ") && !l.ends_with(" 0"))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        *at.lock().unwrap() = Some(std::time::Instant::now());
        signal.cancel();
    });
    let result = idle_run_with_the_broker_down(
        Duration::from_millis(500),
        Duration::from_secs(60),
        shutdown,
        metrics,
    )
    .await;
    let started = signalled_at.lock().unwrap().expect("signalled");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "the signal bounded the wait: {took:?} after it"
    );
    let summary = result.expect("a signalled stop");
    assert!(summary.events > summary.delivered_events, "{summary:?}");
}

/// A shutdown while a batch is being sent finishes that batch: its messages are in
/// the producer's queue and are delivered anyway, so the final checkpoint is the
/// last event delivered, not a batch behind it. Batches of 2,000 changes span many
/// chunks, so most moments of a busy run are inside one; the shutdown comes at
/// three different moments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_inside_a_batch_finishes_it_and_checkpoints_the_last_delivered_event() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    for (round, after_ms) in [300u64, 550, 800].into_iter().enumerate() {
        let topic = format!("cut-{round}");
        cluster.create_topic(&topic, PARTITIONS, 1).expect("topic");
        let router = Router::new(
            &topic,
            PartitionKeyScheme::Table,
            None,
            CloudEventsMode::Structured,
            Encoding::Json,
            "group",
        );
        let source = SyntheticSource::new(SyntheticConfig {
            rate_per_second: Some(20_000.0),
            large_value_every: 0,
            ..synthetic(1_000_000)
        });
        let poller = Poller::new(
            source,
            PollerConfig {
                batch_size: 2_000,
                ..PollerConfig::default()
            },
            None,
        );
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(pipeline::run(
            poller,
            Box::new(|guid| options(guid, Encoding::Json)),
            router,
            Sink::Kafka(kafka_sink_with(&bootstrap, None)),
            CheckpointStore::Memory(mssql_ces::checkpoint::memory::MemoryStore::default()),
            PipelineSettings {
                poll_interval: Duration::from_millis(10),
                checkpoint_interval: Duration::from_millis(50),
                drain_timeout: Duration::from_secs(20),
                idle_drain_timeout: Duration::from_secs(20),
                until_idle: false,
                metrics: Default::default(),
            },
            shutdown.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(after_ms)).await;
        shutdown.cancel();
        let summary = run.await.expect("join").expect("a clean shutdown");
        let last = summary
            .checkpoint
            .and_then(|p| p.last_event)
            .expect("something was checkpointed");
        let checkpointed = (
            last.commit_lsn.to_string().replace(':', ""),
            last.sequence_number,
        );
        let consumed = tokio::task::spawn_blocking({
            let (bootstrap, topic) = (bootstrap.clone(), topic.clone());
            move || {
                support::kafka::consume_quietly(
                    &bootstrap,
                    &topic,
                    PARTITIONS,
                    Duration::from_secs(30),
                    Duration::from_secs(2),
                    |m| !m.is_empty(),
                )
            }
        })
        .await
        .expect("consumer");
        let delivered = consumed
            .iter()
            .map(|m| {
                let event = decode_message(&m.payload, Encoding::Json).expect("decode");
                position_of(&event.logicalid)
            })
            .max()
            .expect("messages");
        assert_eq!(
            checkpointed, delivered,
            "shutdown after {after_ms} ms: the checkpoint is the last delivered event ({} events sent, {} delivered)",
            summary.events, summary.delivered_events
        );
        assert_eq!(
            summary.events, summary.delivered_events,
            "nothing abandoned"
        );
    }
}

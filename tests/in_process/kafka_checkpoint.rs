//! `checkpoint.store = "kafka"`: each stream's checkpoint is the last record under
//! its name in a compacted topic on `MockCluster` brokers (which keep every record:
//! the reader's last-record-wins is what is tested, not compaction).

use std::time::Duration;

use mssql_ces::checkpoint::CheckpointStore;
use mssql_ces::checkpoint::kafka::KafkaStore;
use mssql_ces::pipeline::{self, PipelineSettings};
use mssql_ces::position::{EventPosition, Position};
use mssql_ces::sink::Sink;
use mssql_ces::source::poller::{Poller, PollerConfig};
use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};
use rdkafka::mocking::MockCluster;
use tokio_util::sync::CancellationToken;

use crate::kafka_pipeline::kafka_sink_with;
use crate::pipeline_faults::factory;

fn store(bootstrap: &str, stream: &str) -> KafkaStore {
    store_within(bootstrap, stream, Duration::from_secs(10))
}

/// A store of `stream` on the default topic whose reads and writes take `timeout`
/// at most.
fn store_within(bootstrap: &str, stream: &str, timeout: Duration) -> KafkaStore {
    KafkaStore::new(
        vec![("bootstrap.servers".into(), bootstrap.into())],
        "mssql-ces-checkpoints",
        stream,
        timeout,
    )
}

fn at(sequence_number: u64) -> Position {
    Position {
        last_event: Some(EventPosition {
            commit_lsn: mssql_ces::lsn::Lsn::from_parts(0xB1, 0x10, 2),
            sequence_number,
        }),
        ..Position::default()
    }
}

/// A checkpoint topic of several partitions is refused by name, at the first read
/// and before any write: positions in two partitions cannot be ordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_topic_of_several_partitions_is_refused_by_name() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster
        .create_topic("mssql-ces-checkpoints", 3, 1)
        .expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let error = store(&bootstrap, "orders")
        .load()
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains("checkpoint.topic has 3 partitions") && error.contains("--partitions 1"),
        "{error}"
    );
    let error = store(&bootstrap, "orders")
        .save(&at(1))
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains("checkpoint.topic has 3 partitions"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stream_reads_back_its_own_last_write() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster
        .create_topic("mssql-ces-checkpoints", 1, 1)
        .expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let mut fresh = store(&bootstrap, "orders");
    assert_eq!(
        fresh.load().await.expect("read"),
        None,
        "nothing written yet"
    );
    let mut orders = store(&bootstrap, "orders");
    let mut billing = store(&bootstrap, "billing");
    orders.save(&at(1)).await.expect("write");
    billing.save(&at(7)).await.expect("write");
    orders.save(&at(2)).await.expect("write");
    assert_eq!(
        store(&bootstrap, "orders").load().await.expect("read"),
        Some(at(2))
    );
    assert_eq!(
        store(&bootstrap, "billing").load().await.expect("read"),
        Some(at(7))
    );
    assert_eq!(store(&bootstrap, "other").load().await.expect("read"), None);
    // The cleanup after delivery's reader: every other key's last write.
    let peers = store(&bootstrap, "orders").peers().await.expect("peers");
    let found: Vec<_> = peers
        .iter()
        .map(|p| (p.stream_name.as_str(), p.position.clone()))
        .collect();
    assert_eq!(found, [("billing", at(7))]);
    billing.save(&at(8)).await.expect("write");
    let mut audit = store(&bootstrap, "audit");
    audit.save(&at(3)).await.expect("write");
    let peers = store(&bootstrap, "orders").peers().await.expect("peers");
    let mut found: Vec<_> = peers
        .iter()
        .map(|p| (p.stream_name.as_str(), p.position.clone()))
        .collect();
    found.sort_by(|a, b| a.0.cmp(b.0));
    assert_eq!(found, [("audit", at(3)), ("billing", at(8))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_reach_its_brokers_says_so_as_a_fault_that_can_pass() {
    let mut unreachable = store_within("127.0.0.1:1", "orders", Duration::from_millis(500));
    let error = unreachable.load().await.expect_err("no broker");
    assert!(error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("mssql-ces-checkpoints"),
        "{error}"
    );
}

/// A run to Kafka with its checkpoint in Kafka; a second run reads it back and has
/// nothing left to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_resumes_from_its_checkpoint_in_the_topic() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("ces", 4, 1).expect("topic");
    cluster
        .create_topic("mssql-ces-checkpoints", 1, 1)
        .expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let run = |position: Option<Position>| {
        let bootstrap = bootstrap.clone();
        async move {
            let source = SyntheticSource::new(SyntheticConfig {
                seed: 5,
                transactions: Some(200),
                rate_per_second: None,
                large_value_every: 0,
                existing_rows: 0,
                oversized_value_every: 0,
            });
            let mut source = source;
            if let Some(p) = &position {
                source.resume_from(p);
            }
            pipeline::run(
                Poller::new(source, PollerConfig::default(), position),
                factory(),
                crate::pipeline_faults::router(),
                Sink::Kafka(kafka_sink_with(&bootstrap, None)),
                CheckpointStore::Kafka(Box::new(store(&bootstrap, "s"))),
                PipelineSettings {
                    poll_interval: Duration::from_millis(10),
                    checkpoint_interval: Duration::from_millis(20),
                    drain_timeout: Duration::from_secs(10),
                    idle_drain_timeout: Duration::from_secs(10),
                    until_idle: true,
                    metrics: Default::default(),
                },
                CancellationToken::new(),
            )
            .await
            .expect("run")
        }
    };
    let first = run(None).await;
    assert!(first.events > 200, "{first:?}");
    let stored = store(&bootstrap, "s").load().await.expect("read");
    assert_eq!(
        stored, first.checkpoint,
        "the topic holds the run's last checkpoint"
    );
    let second = run(stored).await;
    assert_eq!(second.events, 0, "resumed at the end: {second:?}");
}

/// A run with `sink.exactly_once` on `MockCluster` (which runs transactions but
/// neither fences nor hides aborted records, so only the path without faults and an
/// injected fence are tested here; the zombie test runs against a broker that
/// fences, `processes::exactly_once`).
async fn exactly_once_run(
    bootstrap: &str,
    stream: &str,
    position: Option<Position>,
) -> Result<mssql_ces::pipeline::RunSummary, mssql_ces::pipeline::PipelineError> {
    exactly_once_run_with(
        bootstrap,
        stream,
        position,
        mssql_ces::sink::kafka::TransactionBound::EACH_BATCH,
        None,
    )
    .await
}

/// As [`exactly_once_run`], with batches sharing transactions up to `bound`.
async fn exactly_once_run_with(
    bootstrap: &str,
    stream: &str,
    position: Option<Position>,
    bound: mssql_ces::sink::kafka::TransactionBound,
    paced: Option<(u64, f64)>,
) -> Result<mssql_ces::pipeline::RunSummary, mssql_ces::pipeline::PipelineError> {
    let mut source = SyntheticSource::new(SyntheticConfig {
        seed: 9,
        transactions: Some(paced.map_or(300, |(transactions, _)| transactions)),
        rate_per_second: paced.map(|(_, rate)| rate),
        large_value_every: 0,
        existing_rows: 0,
        oversized_value_every: 0,
    });
    if let Some(p) = &position {
        source.resume_from(p);
    }
    let config = mssql_ces::sink::kafka::KafkaSinkConfig {
        delivery_timeout: Duration::from_secs(20),
        transaction: Some(mssql_ces::sink::kafka::TransactionSettings {
            id: format!("mssql-ces.{stream}"),
            checkpoint_topic: "mssql-ces-checkpoints".into(),
            stream_name: stream.into(),
            bound,
        }),
        ..mssql_ces::sink::kafka::KafkaSinkConfig::new(bootstrap)
    };
    let mut sink = kafka_sink_with(bootstrap, Some(config));
    sink.init_transactions()
        .await
        .map_err(mssql_ces::pipeline::PipelineError::Sink)?;
    let mut checkpoints = store(bootstrap, stream);
    checkpoints.hand_over_writes();
    pipeline::run(
        Poller::new(
            source,
            PollerConfig {
                batch_size: 100,
                ..PollerConfig::default()
            },
            position,
        ),
        factory(),
        crate::pipeline_faults::router(),
        Sink::Kafka(sink),
        CheckpointStore::Kafka(Box::new(checkpoints)),
        PipelineSettings {
            poll_interval: Duration::from_millis(10),
            checkpoint_interval: Duration::from_millis(20),
            drain_timeout: Duration::from_secs(10),
            idle_drain_timeout: Duration::from_secs(10),
            until_idle: true,
            metrics: Default::default(),
        },
        CancellationToken::new(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_commits_each_batch_with_its_position_and_a_fence_stops_the_run() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("ces", 4, 1).expect("topic");
    cluster
        .create_topic("mssql-ces-checkpoints", 1, 1)
        .expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let summary = exactly_once_run(&bootstrap, "once", None)
        .await
        .expect("run");
    assert!(summary.events > 300, "{summary:?}");
    // The position came from the transactions: the store wrote nothing itself.
    let stored = store(&bootstrap, "once").load().await.expect("read");
    assert_eq!(
        stored, summary.checkpoint,
        "the last transaction's position"
    );
    let messages = summary.messages as usize;
    let consumed = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || {
            crate::support::kafka::consume_quietly(
                &bootstrap,
                "ces",
                4,
                Duration::from_secs(30),
                Duration::from_secs(2),
                move |m| m.len() >= messages,
            )
        }
    })
    .await
    .expect("consumer");
    assert_eq!(consumed.len() as u64, summary.messages, "each message once");
    let again = exactly_once_run(&bootstrap, "once", stored)
        .await
        .expect("rerun");
    assert_eq!(again.events, 0, "resumed after the last committed batch");

    // A newer producer took the transactional id: the commit is fenced, a fatal
    // error that stops the run and names why.
    cluster.request_errors(
        rdkafka::types::RDKafkaApiKey::EndTxn,
        &[rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED],
    );
    let error = exactly_once_run(&bootstrap, "fenced", None)
        .await
        .expect_err("fenced");
    let text = error.to_string();
    assert!(
        text.contains("another process took over this stream"),
        "{text}"
    );
    assert!(matches!(
        error,
        mssql_ces::pipeline::PipelineError::Sink(mssql_ces::sink::SinkError::Definite { .. })
    ));
    // (Whether the fenced transaction's records stay hidden is the broker's part:
    // MockCluster shows aborted records, so that is not asserted here.)
}

/// The records of `stream` on the checkpoint topic: one a committed transaction.
fn positions_written(bootstrap: &str, stream: &str) -> usize {
    crate::support::kafka::consume_quietly(
        bootstrap,
        "mssql-ces-checkpoints",
        1,
        Duration::from_secs(10),
        Duration::from_secs(1),
        |m| !m.is_empty(),
    )
    .iter()
    .filter(|m| m.key.as_deref() == Some(stream.as_bytes()))
    .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_share_a_transaction_until_it_is_due_or_the_stream_pauses() {
    use mssql_ces::sink::kafka::TransactionBound;
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("ces", 4, 1).expect("topic");
    cluster
        .create_topic("mssql-ces-checkpoints", 1, 1)
        .expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    // Each batch its own transaction: a position record a batch.
    let each = exactly_once_run(&bootstrap, "each", None)
        .await
        .expect("run");
    let batches = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || positions_written(&bootstrap, "each")
    })
    .await
    .expect("count");
    assert!(
        batches >= 4,
        "{batches} transactions for {} events",
        each.events
    );
    // Long and large bounds: every batch in one transaction, committed when the
    // stream has nothing more to send.
    let long = TransactionBound {
        max_open: Duration::from_secs(60),
        max_bytes: u64::MAX,
    };
    let shared = exactly_once_run_with(&bootstrap, "shared", None, long, None)
        .await
        .expect("run");
    assert_eq!(shared.events, each.events);
    let written = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || positions_written(&bootstrap, "shared")
    })
    .await
    .expect("count");
    assert_eq!(written, 1, "one transaction for {batches} batches");
    let stored = store(&bootstrap, "shared").load().await.expect("read");
    assert_eq!(stored, shared.checkpoint, "the last batch's position");
    // A byte bound below one batch: a transaction a batch again.
    let small = TransactionBound {
        max_open: Duration::from_secs(60),
        max_bytes: 1,
    };
    exactly_once_run_with(&bootstrap, "small", None, small, None)
        .await
        .expect("run");
    let written = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || positions_written(&bootstrap, "small")
    })
    .await
    .expect("count");
    assert_eq!(written, batches, "each batch committed at its end");
    // Every message of the shared transaction was delivered once.
    let messages = (each.messages + shared.messages + each.messages) as usize;
    let consumed = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || {
            crate::support::kafka::consume_quietly(
                &bootstrap,
                "ces",
                4,
                Duration::from_secs(30),
                Duration::from_secs(2),
                move |m| m.len() >= messages,
            )
        }
    })
    .await
    .expect("consumer");
    assert_eq!(consumed.len(), messages);
    // A stream that pauses between batches (two transactions a second, each its
    // own batch) commits each when the bound comes due, without waiting for the
    // next batch to end the transaction: one commit a batch.
    let due = TransactionBound {
        max_open: Duration::from_millis(100),
        max_bytes: u64::MAX,
    };
    let paced = exactly_once_run_with(&bootstrap, "paced", None, due, Some((6, 2.0)))
        .await
        .expect("run");
    let written = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || positions_written(&bootstrap, "paced")
    })
    .await
    .expect("count");
    assert!(
        written >= 5,
        "{written} commits for 6 paced transactions ({} events)",
        paced.events
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_time_out_the_brokers_refuse_is_definite_and_names_the_setting() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster
        .create_topic("mssql-ces-checkpoints", 1, 1)
        .expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    cluster.request_errors(
        rdkafka::types::RDKafkaApiKey::InitProducerId,
        &[rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_TRANSACTION_TIMEOUT],
    );
    let config = mssql_ces::sink::kafka::KafkaSinkConfig {
        delivery_timeout: Duration::from_secs(20),
        transaction: Some(mssql_ces::sink::kafka::TransactionSettings {
            id: "mssql-ces.timeout".into(),
            checkpoint_topic: "mssql-ces-checkpoints".into(),
            stream_name: "timeout".into(),
            bound: mssql_ces::sink::kafka::TransactionBound::EACH_BATCH,
        }),
        ..mssql_ces::sink::kafka::KafkaSinkConfig::new(&bootstrap)
    };
    let mut sink = kafka_sink_with(&bootstrap, Some(config));
    let error = sink.init_transactions().await.expect_err("refused");
    let text = error.to_string();
    assert!(
        matches!(error, mssql_ces::sink::SinkError::Definite { .. })
            && text.contains("INVALID_TRANSACTION_TIMEOUT")
            && text.contains("25000 ms")
            && text.contains("sink.delivery_timeout_ms"),
        "{text}"
    );
}

/// Where the topic's cleanup policy cannot be read (MockCluster answers no
/// DescribeConfigs), the store goes on without waiting for the answer, and once the
/// question has timed out writes the last position again whenever it is old, so
/// that retention never removes a quiet stream's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_of_unknown_retention_has_the_last_position_written_again() {
    use mssql_ces::checkpoint::kafka::Retention;
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster
        .create_topic("mssql-ces-checkpoints", 1, 1)
        .expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    // Writes get all the time a loaded machine may need; the question that is
    // never answered is given up after 2 s.
    let question = Duration::from_secs(2);
    let mut store = store_within(&bootstrap, "quiet", Duration::from_secs(30))
        .with_question_timeout(question)
        .with_rewrite_every(Duration::from_secs(2));
    assert!(
        matches!(store.retention(question).await, Retention::Unknown(_)),
        "MockCluster does not describe topic configs"
    );
    let started = std::time::Instant::now();
    store.save(&at(3)).await.expect("save");
    assert!(
        started.elapsed() < question,
        "the first write waited for the unanswered question: {:?}",
        started.elapsed()
    );
    // The question has timed out and the position is due: written again; 0.7 s
    // later it is not due again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    store.keep_alive().await.expect("keep alive");
    tokio::time::sleep(Duration::from_millis(700)).await;
    store.keep_alive().await.expect("keep alive");
    let written = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || positions_written(&bootstrap, "quiet")
    })
    .await
    .expect("count");
    assert_eq!(written, 2, "the position, and the same again once due");
    assert_eq!(store.load().await.expect("read"), Some(at(3)));
}

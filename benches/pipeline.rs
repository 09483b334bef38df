//! End-to-end throughput: the synthetic source → the whole pipeline → Kafka
//! (rdkafka's in-process `MockCluster`), next to raw librdkafka producing the very
//! same message bytes, measured in the same run.
//!
//! Run: `cargo bench --bench pipeline` (`PIPELINE_BENCH_TRANSACTIONS`, default 20000).
//! The end-to-end figure includes generating the synthetic changes, merging,
//! encoding, routing and ordered acknowledgement; the raw figure is only the
//! producer, so the ratio is what the rest of the pipeline costs.

use std::time::{Duration, Instant};

use mssql_ces::checkpoint::{CheckpointStore, file::FileStore};
use mssql_ces::config::{CloudEventsMode, KafkaSinkConfig, PartitionKeyScheme};
use mssql_ces::event::{Encoder, EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit};
use mssql_ces::pipeline::{self, PipelineSettings};
use mssql_ces::sink::kafka::{KafkaFlavour, KafkaSettings, KafkaSink};
use mssql_ces::sink::{OutgoingMessage, Router, Sink};
use mssql_ces::source::poller::{PollOutcome, Poller, PollerConfig};
use mssql_ces::source::sim::synthetic::{SyntheticConfig, SyntheticSource};
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_util::sync::CancellationToken;

fn synthetic(transactions: u64) -> SyntheticConfig {
    SyntheticConfig {
        seed: 1,
        transactions: Some(transactions),
        rate_per_second: None,
        large_value_every: 0,
    }
}

fn options(guid: uuid::Uuid) -> EncoderOptions {
    EncoderOptions {
        stream_guid: guid,
        encoding: Encoding::Json,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size: MessageSizeLimit::default(),
    }
}

fn router(topic: &str) -> Router {
    Router::new(
        topic,
        PartitionKeyScheme::PrimaryKey,
        None,
        CloudEventsMode::Structured,
        Encoding::Json,
        "bench",
    )
}

fn sink_settings(bootstrap: &str) -> KafkaSinkConfig {
    KafkaSinkConfig {
        kafka: [("linger.ms".to_string(), "5".to_string())].into(),
        ..KafkaSinkConfig::new(bootstrap)
    }
}

/// The messages the pipeline would send, built in advance.
async fn messages(transactions: u64, topic: &str) -> Vec<OutgoingMessage> {
    let mut poller = Poller::new(
        SyntheticSource::new(synthetic(transactions)),
        PollerConfig::default(),
        None,
    );
    let router = router(topic);
    let mut encoder = None;
    let mut out = Vec::new();
    while let Ok(PollOutcome::Batch(batch)) = poller.poll().await {
        let guid = poller.stream_guid().expect("stream GUID");
        let encoder = encoder.get_or_insert_with(|| Encoder::new(options(guid)));
        for change in &batch.changes {
            let Ok(event) = encoder.encode(change) else {
                continue;
            };
            if let Ok(routed) = router.route(change, event) {
                out.extend(routed);
            }
        }
    }
    out
}

fn main() {
    let transactions: u64 = std::env::var("PIPELINE_BENCH_TRANSACTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        eprintln!("cannot start the runtime");
        return;
    };
    let Ok(cluster) = MockCluster::new(1) else {
        eprintln!("cannot start the mock cluster");
        return;
    };
    let bootstrap = cluster.bootstrap_servers();
    for topic in ["e2e", "raw"] {
        let _ = cluster.create_topic(topic, 4, 1);
    }
    let Ok(settings) = KafkaSettings::new(
        &sink_settings(&bootstrap),
        KafkaFlavour::Kafka,
        256 * 1024,
        None,
    ) else {
        return;
    };

    // End to end.
    let dir = std::env::temp_dir().join(format!("mssql-ces-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let Ok(sink) = KafkaSink::new(&settings, MessageSizeLimit::default().bytes()) else {
        return;
    };
    let poller = Poller::new(
        SyntheticSource::new(synthetic(transactions)),
        PollerConfig::default(),
        None,
    );
    let started = Instant::now();
    let summary = runtime.block_on(pipeline::run(
        poller,
        Box::new(options),
        router("e2e"),
        Sink::Kafka(sink),
        CheckpointStore::File(FileStore::new(dir.join("cp.json"), "bench")),
        PipelineSettings {
            poll_interval: Duration::from_millis(10),
            checkpoint_interval: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(60),
            until_idle: true,
            metrics: Default::default(),
        },
        CancellationToken::new(),
    ));
    let e2e = started.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    let Ok(summary) = summary else {
        eprintln!("pipeline failed: {summary:?}");
        return;
    };

    // Raw librdkafka, the same bytes.
    let batch = runtime.block_on(messages(transactions, "raw"));
    let mut config = ClientConfig::new();
    for (k, v) in &settings.properties {
        config.set(k, v);
    }
    let Ok(producer) = config.create::<FutureProducer>() else {
        return;
    };
    let started = Instant::now();
    runtime.block_on(async {
        let mut deliveries = Vec::with_capacity(batch.len());
        for m in &batch {
            loop {
                let mut record: FutureRecord<'_, [u8], [u8]> =
                    FutureRecord::to(&m.topic).payload(m.payload.as_slice());
                if let Some(key) = &m.key {
                    record = record.key(key.as_slice());
                }
                match producer.send_result(record) {
                    Ok(future) => {
                        deliveries.push(future);
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            }
        }
        for d in deliveries {
            let _ = d.await;
        }
    });
    let raw = started.elapsed();

    let per_second = |n: u64, d: Duration| n as f64 / d.as_secs_f64();
    println!(
        "transactions: {transactions}, events: {}, messages: {}, bytes: {}",
        summary.events, summary.messages, summary.bytes
    );
    println!(
        "end to end (synthetic source -> pipeline -> MockCluster): {:.0} events/s, {:.0} messages/s, {:.1} MiB/s, {:.2} s",
        per_second(summary.events, e2e),
        per_second(summary.messages, e2e),
        summary.bytes as f64 / 1048576.0 / e2e.as_secs_f64(),
        e2e.as_secs_f64()
    );
    println!(
        "raw librdkafka, same {} messages: {:.0} messages/s, {:.2} s",
        batch.len(),
        per_second(batch.len() as u64, raw),
        raw.as_secs_f64()
    );
    println!(
        "end-to-end messages/s as a share of raw: {:.0}%",
        100.0 * per_second(summary.messages, e2e) / per_second(batch.len() as u64, raw)
    );
}

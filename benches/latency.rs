//! End-to-end latency at a steady rate: from a change's commit to the moment a
//! consumer of its topic reads it, through the whole pipeline into Kafka
//! (rdkafka's in-process `MockCluster`, four partitions, the sink's defaults).
//!
//! The source commits changes at `rate` a second on the wall clock (the synthetic
//! workload's changes, each given the time it is due as its commit time) and the
//! pipeline polls it as it polls a database: what is due, up to `source.batch_size`
//! (1,000) a batch, and after a poll that found nothing it waits
//! `source.poll_interval_ms`. The consumer reads every message and takes now minus
//! the event's `time` (CES's commit time, to the millisecond). The capture job's own
//! latency (commit → change table) is not in it: it is SQL Server's, and a metric
//! of its own (`mssql_ces_capture_job_latency_seconds`).
//!
//! Run: `cargo bench --bench latency` (`LATENCY_BENCH_RATES`, default `1000,50000`
//! changes/s; `LATENCY_BENCH_SECONDS`, default 10, changes of the first second not counted;
//! `LATENCY_BENCH_POLL_MS`, default 1000 as `source.poll_interval_ms`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use mssql_ces::checkpoint::{CheckpointStore, memory::MemoryStore};
use mssql_ces::event::{Change, EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit};
use mssql_ces::pipeline::{self, BatchSource, PipelineSettings};
use mssql_ces::position::Position;
use mssql_ces::sink::kafka::{KafkaFlavour, KafkaSettings, KafkaSink, KafkaSinkConfig};
use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};
use mssql_ces::sink::{Router, Sink};
use mssql_ces::source::SourceError;
use mssql_ces::source::poller::{Batch, PollOutcome, Poller, PollerConfig};
use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use tokio_util::sync::CancellationToken;

/// The binary's allocator, so the figures are the binary's.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const TOPIC: &str = "latency";
const PARTITIONS: i32 = 4;
const BATCH_SIZE: usize = 1_000;

/// Changes committed at `rate` a second from `started`: change `k` is due at
/// `started + k / rate`, with that time as its commit time.
struct Paced {
    template: Arc<Vec<Change>>,
    position: Position,
    guid: uuid::Uuid,
    rate: f64,
    started: Instant,
    started_utc: DateTime<Utc>,
    released: u64,
    until: Instant,
}

impl BatchSource for Paced {
    async fn poll(&mut self) -> Result<PollOutcome, SourceError> {
        let now = Instant::now();
        if now >= self.until || self.template.is_empty() {
            return Ok(PollOutcome::Idle);
        }
        let due = ((now - self.started).as_secs_f64() * self.rate) as u64;
        if due <= self.released {
            return Ok(PollOutcome::Idle);
        }
        let count = (due - self.released).min(BATCH_SIZE as u64);
        let changes = (self.released..self.released + count)
            .map(|k| {
                let mut change = self.template[k as usize % self.template.len()].clone();
                let at = Duration::from_secs_f64(k as f64 / self.rate);
                change.commit_time =
                    self.started_utc + chrono::Duration::from_std(at).unwrap_or_default();
                change
            })
            .collect();
        self.released += count;
        Ok(PollOutcome::Batch(Batch {
            changes,
            schema_changes: Vec::new(),
            position: self.position.clone(),
            max_lsn: mssql_ces::lsn::Lsn::ZERO,
            heartbeat: false,
        }))
    }

    fn stream_guid(&self) -> Option<uuid::Uuid> {
        Some(self.guid)
    }

    fn tracked_instances(&self) -> usize {
        3
    }

    /// Changes are due until the run's end: an idle poll is only "not yet".
    fn more_expected(&self) -> bool {
        Instant::now() < self.until
    }
}

/// The synthetic workload's changes, its last position and its stream GUID.
async fn template() -> (Vec<Change>, Position, uuid::Uuid) {
    let mut poller = Poller::new(
        SyntheticSource::new(SyntheticConfig {
            seed: 5,
            transactions: Some(20_000),
            ..SyntheticConfig::default()
        }),
        PollerConfig::default(),
        None,
    );
    let mut changes = Vec::new();
    let mut position = Position::default();
    while let Ok(PollOutcome::Batch(batch)) = poller.poll().await {
        changes.extend(batch.changes);
        position = batch.position;
    }
    (changes, position, poller.stream_guid().unwrap_or_default())
}

/// The CES `time` attribute of a structured JSON message (the first `"time":"`
/// key: the envelope's, which precedes `data`).
fn event_time(payload: &[u8]) -> Option<DateTime<Utc>> {
    const KEY: &[u8] = b"\"time\":\"";
    let at = payload.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = payload.get(at..)?;
    let end = rest.iter().position(|&b| b == b'"')?;
    let text = std::str::from_utf8(&rest[..end]).ok()?;
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Reads every partition of the topic from its start until `stop` (assigned, not
/// subscribed: no group to join), noting the latency in milliseconds of each event
/// committed at or after `from`.
fn consume(bootstrap: String, from: DateTime<Utc>, stop: Instant) -> Vec<f64> {
    let Ok(consumer) = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "latency-bench")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .create::<BaseConsumer>()
    else {
        return Vec::new();
    };
    let mut partitions = rdkafka::TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        if partitions
            .add_partition_offset(TOPIC, partition, rdkafka::Offset::Beginning)
            .is_err()
        {
            return Vec::new();
        }
    }
    if consumer.assign(&partitions).is_err() {
        return Vec::new();
    }
    let mut latencies = Vec::new();
    while Instant::now() < stop {
        let Some(Ok(message)) = consumer.poll(Duration::from_millis(50)) else {
            continue;
        };
        let read = Utc::now();
        if let Some(time) = message.payload().and_then(event_time)
            && time >= from
        {
            let micros = (read - time).num_microseconds().unwrap_or(0);
            latencies.push(micros as f64 / 1000.0);
        }
    }
    latencies
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at]
}

async fn run_at(rate: f64, seconds: Duration, poll: Duration) -> Option<()> {
    let cluster = MockCluster::new(1).ok()?;
    cluster.create_topic(TOPIC, PARTITIONS, 1).ok()?;
    let bootstrap = cluster.bootstrap_servers();
    let settings = KafkaSettings::new(
        &KafkaSinkConfig::new(&bootstrap),
        KafkaFlavour::Kafka,
        MessageSizeLimit::default().bytes(),
        None,
    )
    .ok()?;
    let mut sink = KafkaSink::new(&settings, MessageSizeLimit::default().bytes()).ok()?;
    sink.init_transactions().await.ok()?;
    let (changes, position, guid) = template().await;
    let started = Instant::now();
    let started_utc = Utc::now();
    let until = started + seconds;
    let source = Paced {
        template: Arc::new(changes),
        position,
        guid,
        rate,
        started,
        started_utc,
        released: 0,
        until,
    };
    let consumer = std::thread::spawn(move || {
        consume(
            bootstrap,
            started_utc + chrono::Duration::seconds(1),
            until + Duration::from_secs(5),
        )
    });
    let cpu = mssql_ces_testkit::process_cpu_time();
    let summary = pipeline::run(
        source,
        Box::new(move |guid| EncoderOptions {
            stream_guid: guid,
            encoding: Encoding::Json,
            final_event: FinalEventMode::LastInTransaction,
            max_message_size: MessageSizeLimit::default(),
        }),
        Router::new(
            TOPIC,
            PartitionKeyScheme::PrimaryKey,
            None,
            CloudEventsMode::Structured,
            Encoding::Json,
            "bench",
        ),
        Sink::Kafka(sink),
        CheckpointStore::Memory(MemoryStore::default()),
        PipelineSettings {
            poll_interval: poll,
            checkpoint_interval: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(60),
            idle_drain_timeout: Duration::from_secs(60),
            until_idle: true,
            metrics: Default::default(),
        },
        CancellationToken::new(),
    )
    .await
    .ok()?;
    let cpu = mssql_ces_testkit::process_cpu_time() - cpu;
    let mut latencies = consumer.join().ok()?;
    latencies.sort_by(f64::total_cmp);
    println!(
        "{rate:>7.0} changes/s, poll {} ms: {} events read of {} sent; commit → read p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {:.2} µs of CPU a message",
        poll.as_millis(),
        latencies.len(),
        summary.messages,
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN),
        cpu.as_secs_f64() * 1e6 / summary.messages.max(1) as f64,
    );
    Some(())
}

fn main() {
    let rates: Vec<f64> = std::env::var("LATENCY_BENCH_RATES")
        .unwrap_or_else(|_| "1000,50000".into())
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    let seconds = Duration::from_secs(
        std::env::var("LATENCY_BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    );
    let poll = Duration::from_millis(
        std::env::var("LATENCY_BENCH_POLL_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1000),
    );
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        return;
    };
    for rate in rates {
        if runtime.block_on(run_at(rate, seconds, poll)).is_none() {
            eprintln!("{rate} changes/s: the run could not be set up");
        }
    }
}

//! Where the pipeline's time goes, at steady state, in one run:
//!
//! - (a) the synthetic source alone (poll, merge, pair: changes/s);
//! - (b) encode + route alone, on pre-built changes;
//! - (c) the pipeline fed by pre-built batches (a source that costs a clone) into
//!   Kafka;
//! - (d) end to end: the synthetic source → the pipeline → Kafka;
//! - (e) raw librdkafka producing the very same message bytes, same settings;
//! - (f) as (c), with `sink.exactly_once`: batches committed in Kafka transactions
//!   with their position (`PIPELINE_BENCH_TRANSACTION_MS`, default the setting's);
//!
//! each for JSON and Avro, structured and binary CloudEvents mode. Kafka is rdkafka's
//! in-process `MockCluster` (one broker), a fresh one per measurement. Each side runs
//! for `PIPELINE_BENCH_SECONDS` (default 5); the ratios (c)/(e) and (d)/(e) are what the
//! pipeline costs over the producer.
//!
//! The Kafka sides take turns for `PIPELINE_BENCH_ROUNDS` (default 3) rounds and the
//! median of each is reported, with the CPU time per message of the whole process
//! (librdkafka's and the in-process broker's threads included) and the cores it kept
//! busy: what bounds (c) on this machine is printed next to it.
//!
//! Run: `cargo bench --bench pipeline` (`PIPELINE_BENCH_SECONDS`, `PIPELINE_BENCH_ROUNDS`,
//! `PIPELINE_BENCH_CASES=json-structured,avro-binary,…` to pick cases,
//! `PIPELINE_BENCH_SIDES=c` to run some sides only, e.g. under a profiler;
//! `PIPELINE_BENCH_BOOTSTRAP=127.0.0.1:9092`: brokers of your own instead of
//! `MockCluster`, e.g. Apache Kafka from `bash tests/kafka/broker`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mssql_ces::checkpoint::{CheckpointStore, memory::MemoryStore};
use mssql_ces::event::{
    Change, Encoder, EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit,
};
use mssql_ces::pipeline::{self, BatchSource, PipelineSettings};
use mssql_ces::sink::kafka::KafkaSinkConfig;
use mssql_ces::sink::kafka::{KafkaFlavour, KafkaSettings, KafkaSink, librdkafka_headers};
use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};
use mssql_ces::sink::{OutgoingMessage, Router, Sink};
use mssql_ces::source::SourceError;
use mssql_ces::source::poller::{Batch, PollOutcome, Poller, PollerConfig};
use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_util::sync::CancellationToken;

/// The binary's allocator, so the figures are the binary's.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const TOPIC: &str = "bench";
/// Pre-built changes for (b), (c) and (e).
const SAMPLE_TRANSACTIONS: u64 = 50_000;
/// Changes per second of running time that (c) gets ready-made copies for.
const REPLAY_COPIES_PER_SECOND: f64 = 400_000.0;

fn synthetic(transactions: Option<u64>) -> SyntheticConfig {
    SyntheticConfig {
        seed: 1,
        transactions,
        rate_per_second: None,
        large_value_every: 0,
        existing_rows: 0,
        oversized_value_every: 0,
    }
}

#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    encoding: Encoding,
    mode: CloudEventsMode,
}

const CASES: [Case; 4] = [
    Case {
        name: "json-structured",
        encoding: Encoding::Json,
        mode: CloudEventsMode::Structured,
    },
    Case {
        name: "json-binary",
        encoding: Encoding::Json,
        mode: CloudEventsMode::Binary,
    },
    Case {
        name: "avro-structured",
        encoding: Encoding::Avro,
        mode: CloudEventsMode::Structured,
    },
    Case {
        name: "avro-binary",
        encoding: Encoding::Avro,
        mode: CloudEventsMode::Binary,
    },
];

fn options(encoding: Encoding) -> impl Fn(uuid::Uuid) -> EncoderOptions + Send + Clone + 'static {
    move |guid| EncoderOptions {
        stream_guid: guid,
        encoding,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size: MessageSizeLimit::default(),
    }
}

fn router(case: Case) -> Router {
    Router::new(
        TOPIC,
        PartitionKeyScheme::PrimaryKey,
        None,
        case.mode,
        case.encoding,
        "bench",
    )
}

/// The brokers of a measurement: a fresh in-process one, or the brokers at
/// `PIPELINE_BENCH_BOOTSTRAP` (e.g. Apache Kafka from `bash tests/kafka/broker`).
enum Brokers {
    Mock(MockCluster<'static, rdkafka::producer::DefaultProducerContext>),
    External(String),
}

/// Creates `topic` on brokers at `bootstrap` (nothing if it cannot).
fn create_external_topic(bootstrap: &str, topic: &str, partitions: i32) -> Option<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .ok()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    let topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    runtime
        .block_on(admin.create_topics([&topic], &options))
        .ok()?;
    Some(())
}

/// Brokers with the topic, and the sink's settings for them (the defaults, as a run
/// has them).
fn cluster(exactly_once: bool) -> Option<(Brokers, KafkaSettings)> {
    let brokers = match std::env::var("PIPELINE_BENCH_BOOTSTRAP") {
        // The same topics every measurement (created once; what they already hold
        // does not matter to a rate).
        Ok(bootstrap) => {
            create_external_topic(&bootstrap, TOPIC, 4)?;
            create_external_topic(&bootstrap, "mssql-ces-checkpoints", 1)?;
            Brokers::External(bootstrap)
        }
        Err(_) => {
            let cluster = MockCluster::new(1).ok()?;
            cluster.create_topic(TOPIC, 4, 1).ok()?;
            cluster.create_topic("mssql-ces-checkpoints", 1, 1).ok()?;
            Brokers::Mock(cluster)
        }
    };
    let bootstrap = match &brokers {
        Brokers::Mock(cluster) => cluster.bootstrap_servers(),
        Brokers::External(bootstrap) => bootstrap.clone(),
    };
    let settings = KafkaSettings::new(
        &KafkaSinkConfig {
            transaction: exactly_once.then(|| mssql_ces::sink::kafka::TransactionSettings {
                id: "mssql-ces.bench".into(),
                checkpoint_topic: "mssql-ces-checkpoints".into(),
                stream_name: "bench".into(),
                // PIPELINE_BENCH_TRANSACTION_MS: the transaction bound (default the
                // setting's default; 0 commits each batch on its own).
                bound: mssql_ces::sink::kafka::TransactionBound {
                    max_open: std::env::var("PIPELINE_BENCH_TRANSACTION_MS")
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .map_or_else(
                            mssql_ces::sink::kafka::default_transaction_max,
                            Duration::from_millis,
                        ),
                    max_bytes: std::env::var("PIPELINE_BENCH_TRANSACTION_BYTES")
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(mssql_ces::sink::kafka::DEFAULT_TRANSACTION_MAX_BYTES),
                },
            }),
            ..KafkaSinkConfig::new(&bootstrap)
        },
        KafkaFlavour::Kafka,
        MessageSizeLimit::default().bytes(),
        None,
    )
    .ok()?;
    Some((brokers, settings))
}

/// Pre-built batches of the synthetic workload, and its stream GUID.
async fn batches(transactions: u64) -> (Vec<Batch>, uuid::Uuid) {
    let mut poller = Poller::new(
        SyntheticSource::new(synthetic(Some(transactions))),
        PollerConfig::default(),
        None,
    );
    let mut out = Vec::new();
    while let Ok(PollOutcome::Batch(batch)) = poller.poll().await {
        out.push(batch);
    }
    (out, poller.stream_guid().unwrap_or_default())
}

/// Copies of the pre-built batches, made before a measurement starts, so that the
/// source of (c) costs nothing while it runs.
type Copies = Arc<std::sync::Mutex<VecDeque<Batch>>>;

/// Enough copies for `seconds` at `per_second` changes, in replay order.
fn copies(batches: &[Batch], seconds: Duration, per_second: f64) -> Copies {
    let changes = batches
        .iter()
        .map(|b| b.changes.len())
        .sum::<usize>()
        .max(1);
    let wanted = (seconds.as_secs_f64() * per_second) as usize;
    let count = batches.len() * wanted.div_ceil(changes);
    let copies = (0..count)
        .map(|i| batches[i % batches.len()].clone())
        .collect();
    Arc::new(std::sync::Mutex::new(copies))
}

/// Replays pre-built batches until `until`, then is idle: ready copies first, then
/// (should they run out) a clone each.
struct Replay {
    batches: Arc<Vec<Batch>>,
    ready: Copies,
    next: usize,
    guid: uuid::Uuid,
    until: Instant,
}

impl BatchSource for Replay {
    async fn poll(&mut self) -> Result<PollOutcome, SourceError> {
        if Instant::now() >= self.until || self.batches.is_empty() {
            return Ok(PollOutcome::Idle);
        }
        let ready = self.ready.lock().ok().and_then(|mut r| r.pop_front());
        let batch = ready.unwrap_or_else(|| self.batches[self.next % self.batches.len()].clone());
        self.next += 1;
        Ok(PollOutcome::Batch(batch))
    }

    fn stream_guid(&self) -> Option<uuid::Uuid> {
        Some(self.guid)
    }

    fn tracked_instances(&self) -> usize {
        3
    }
}

fn pipeline_settings(until_idle: bool) -> PipelineSettings {
    PipelineSettings {
        poll_interval: Duration::from_millis(10),
        checkpoint_interval: Duration::from_secs(1),
        drain_timeout: Duration::from_secs(60),
        idle_drain_timeout: Duration::from_secs(60),
        until_idle,
        metrics: Default::default(),
    }
}

fn cpu_time() -> Duration {
    mssql_ces_testkit::process_cpu_time()
}

/// A rate, the bytes per second behind it, and what it cost in CPU.
struct Rate {
    count: u64,
    per_second: f64,
    mib_per_second: f64,
    /// CPU time of the whole process per message, in microseconds.
    cpu_micros: f64,
    /// CPU time over wall time: how many cores were busy.
    cores: f64,
}

impl Rate {
    fn new(count: u64, bytes: u64, took: Duration) -> Self {
        let seconds = took.as_secs_f64().max(1e-9);
        Rate {
            count,
            per_second: count as f64 / seconds,
            mib_per_second: bytes as f64 / 1_048_576.0 / seconds,
            cpu_micros: f64::NAN,
            cores: f64::NAN,
        }
    }

    /// Runs `side`, measuring its CPU time along with its rate.
    fn measured(side: impl FnOnce() -> Rate) -> Rate {
        let (cpu, wall) = (cpu_time(), Instant::now());
        let mut rate = side();
        let (cpu, wall) = (cpu_time() - cpu, wall.elapsed());
        rate.cpu_micros = cpu.as_secs_f64() * 1e6 / rate.count.max(1) as f64;
        rate.cores = cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9);
        rate
    }
}

/// (a) the synthetic source alone.
async fn source_alone(seconds: Duration) -> Rate {
    let mut poller = Poller::new(
        SyntheticSource::new(synthetic(None)),
        PollerConfig::default(),
        None,
    );
    let started = Instant::now();
    let mut changes = 0u64;
    while started.elapsed() < seconds {
        if let Ok(PollOutcome::Batch(batch)) = poller.poll().await {
            changes += batch.changes.len() as u64;
        }
    }
    Rate::new(changes, 0, started.elapsed())
}

/// (b) encode + route, cycling over `changes`; counts messages.
fn encode_route(case: Case, changes: &[&Change], guid: uuid::Uuid, seconds: Duration) -> Rate {
    let router = router(case);
    let encoder = Encoder::new(options(case.encoding)(guid)).data_only(router.binary());
    let started = Instant::now();
    let (mut messages, mut bytes) = (0u64, 0u64);
    'outer: loop {
        for chunk in changes.chunks(1000) {
            for change in chunk {
                let Ok(event) = encoder.encode(change) else {
                    continue;
                };
                if let Ok(routed) = router.route(change, event) {
                    messages += routed.len() as u64;
                    bytes += routed.iter().map(|m| m.payload.len() as u64).sum::<u64>();
                }
            }
            if started.elapsed() >= seconds {
                break 'outer;
            }
        }
    }
    Rate::new(messages, bytes, started.elapsed())
}

/// (e) raw librdkafka: the same messages, cycling, for `seconds`, then every
/// delivery awaited.
async fn raw(messages: &[OutgoingMessage], settings: &KafkaSettings, seconds: Duration) -> Rate {
    let mut config = ClientConfig::new();
    for (k, v) in &settings.properties {
        config.set(k, v);
    }
    let Ok(producer) = config.create::<FutureProducer>() else {
        return Rate::new(0, 0, Duration::from_secs(1));
    };
    let started = Instant::now();
    let mut outstanding = VecDeque::new();
    let (mut sent, mut bytes) = (0u64, 0u64);
    'outer: loop {
        for m in messages {
            if started.elapsed() >= seconds {
                break 'outer;
            }
            loop {
                let mut record: FutureRecord<'_, [u8], [u8]> =
                    FutureRecord::to(&m.topic).payload(m.payload.as_slice());
                if let Some(key) = &m.key {
                    record = record.key(key.as_slice());
                }
                // Binary mode's `ce_` headers are part of the same bytes.
                if let Some(headers) = librdkafka_headers(&m.headers) {
                    record = record.headers(headers);
                }
                match producer.send_result(record) {
                    Ok(future) => {
                        outstanding.push_back(future);
                        sent += 1;
                        bytes += m.payload.len() as u64;
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                        if let Some(oldest) = outstanding.pop_front() {
                            let _ = oldest.await;
                        }
                    }
                    Err(_) => break 'outer,
                }
            }
        }
    }
    for future in outstanding {
        let _ = future.await;
    }
    Rate::new(sent, bytes, started.elapsed())
}

/// (c) the pipeline, fed pre-built batches for `seconds`.
async fn pipeline_replay(
    case: Case,
    batches: Arc<Vec<Batch>>,
    ready: Copies,
    guid: uuid::Uuid,
    settings: &KafkaSettings,
    seconds: Duration,
) -> Rate {
    let Ok(mut sink) = KafkaSink::new(settings, MessageSizeLimit::default().bytes()) else {
        return Rate::new(0, 0, Duration::from_secs(1));
    };
    if sink.init_transactions().await.is_err() {
        return Rate::new(0, 0, Duration::from_secs(1));
    }
    let replay = Replay {
        batches,
        ready,
        next: 0,
        guid,
        until: Instant::now() + seconds,
    };
    run_pipeline(replay, case, sink, true, CancellationToken::new()).await
}

/// The pipeline from `source` into `sink`, timed from the start to its end.
async fn run_pipeline<B: BatchSource>(
    source: B,
    case: Case,
    sink: KafkaSink,
    until_idle: bool,
    stop: CancellationToken,
) -> Rate {
    let started = Instant::now();
    let summary = pipeline::run(
        source,
        Box::new(options(case.encoding)),
        router(case),
        Sink::Kafka(sink),
        CheckpointStore::Memory(MemoryStore::default()),
        pipeline_settings(until_idle),
        stop,
    )
    .await;
    match summary {
        Ok(s) => Rate::new(s.messages, s.bytes, started.elapsed()),
        Err(e) => {
            eprintln!("pipeline failed: {e}");
            Rate::new(0, 0, Duration::from_secs(1))
        }
    }
}

/// (d) end to end: the endless synthetic source for `seconds`, then a graceful stop.
async fn end_to_end(case: Case, settings: &KafkaSettings, seconds: Duration) -> Rate {
    let Ok(mut sink) = KafkaSink::new(settings, MessageSizeLimit::default().bytes()) else {
        return Rate::new(0, 0, Duration::from_secs(1));
    };
    if sink.init_transactions().await.is_err() {
        return Rate::new(0, 0, Duration::from_secs(1));
    }
    let poller = Poller::new(
        SyntheticSource::new(synthetic(None)),
        PollerConfig::default(),
        None,
    );
    let stop = CancellationToken::new();
    let timer = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(seconds).await;
        timer.cancel();
    });
    run_pipeline(poller, case, sink, false, stop).await
}

/// The middle rate of several rounds (the upper one of an even count).
fn median(mut rates: Vec<Rate>) -> Rate {
    rates.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
    let middle = rates.len() / 2;
    rates.swap_remove(middle)
}

/// Runs `what` against a fresh in-process broker, measuring its rate and CPU time.
fn measure(exactly_once: bool, what: impl FnOnce(KafkaSettings) -> Rate) -> Rate {
    match cluster(exactly_once) {
        Some((cluster, settings)) => {
            let rate = Rate::measured(|| what(settings));
            drop(cluster);
            rate
        }
        None => Rate::new(0, 0, Duration::from_secs(1)),
    }
}

fn main() {
    let seconds = Duration::from_secs_f64(
        std::env::var("PIPELINE_BENCH_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5.0),
    );
    let wanted = std::env::var("PIPELINE_BENCH_CASES").ok();
    let sides = std::env::var("PIPELINE_BENCH_SIDES").unwrap_or_else(|_| "abcdef".into());
    let side = |s: char| sides.contains(s);
    let skipped = || Rate::new(0, 0, Duration::from_secs(1));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let rounds: usize = std::env::var("PIPELINE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        eprintln!("cannot start the runtime");
        return;
    };
    println!(
        "each side {:.0} s, {rounds} rounds (medians); Kafka: {}, 4 partitions; sink defaults",
        seconds.as_secs_f64(),
        std::env::var("PIPELINE_BENCH_BOOTSTRAP").map_or_else(
            |_| "MockCluster, one broker".to_owned(),
            |b| format!("the brokers at {b}")
        )
    );
    let source = if side('a') {
        runtime.block_on(source_alone(seconds))
    } else {
        skipped()
    };
    println!(
        "(a) synthetic source alone: {:.0} changes/s",
        source.per_second
    );
    let (batches, guid) = runtime.block_on(batches(SAMPLE_TRANSACTIONS));
    let batches = Arc::new(batches);
    let changes: Vec<&Change> = batches.iter().flat_map(|b| &b.changes).collect();
    println!(
        "pre-built: {} transactions, {} changes in {} batches",
        SAMPLE_TRANSACTIONS,
        changes.len(),
        batches.len()
    );
    println!(
        "{:<16} {:>22} {:>22} {:>22} {:>22} {:>6} {:>6}",
        "case",
        "(b) encode+route",
        "(c) pipeline,pre-built",
        "(d) end to end",
        "(e) raw librdkafka",
        "c/e",
        "d/e"
    );
    for case in CASES {
        if wanted
            .as_deref()
            .is_some_and(|w| !w.split(',').any(|c| c == case.name))
        {
            continue;
        }
        // The bytes (e) sends: the pre-built changes, encoded and routed once.
        let router = router(case);
        let encoder = Encoder::new(options(case.encoding)(guid)).data_only(router.binary());
        let messages: Vec<OutgoingMessage> = changes
            .iter()
            .filter_map(|c| {
                let event = encoder.encode(c).ok()?;
                router.route(c, event).ok()
            })
            .flatten()
            .collect();
        // The sides take turns, round after round, so that a slow spell of this
        // shared machine falls on all of them; the median of each is reported.
        let mut sides: [Vec<Rate>; 5] = Default::default();
        for round in 1..=rounds {
            let encoded = if side('b') {
                Rate::measured(|| encode_route(case, &changes, guid, seconds))
            } else {
                skipped()
            };
            let raw = if side('e') {
                measure(false, |s| runtime.block_on(raw(&messages, &s, seconds)))
            } else {
                skipped()
            };
            let replay_with = |exactly_once: bool| {
                // Copies for a rate well above what (c) reaches here; more are
                // cloned on the fly should they run out.
                let ready = copies(&batches, seconds, REPLAY_COPIES_PER_SECOND);
                let rate = measure(exactly_once, |s| {
                    runtime.block_on(pipeline_replay(
                        case,
                        Arc::clone(&batches),
                        Arc::clone(&ready),
                        guid,
                        &s,
                        seconds,
                    ))
                });
                drop(ready);
                rate
            };
            let replay = if side('c') {
                replay_with(false)
            } else {
                skipped()
            };
            let transactional = if side('f') {
                replay_with(true)
            } else {
                skipped()
            };
            let e2e = if side('d') {
                measure(false, |s| runtime.block_on(end_to_end(case, &s, seconds)))
            } else {
                skipped()
            };
            println!(
                "  {} round {round}: (b) {:.0}/s (c) {:.0}/s (d) {:.0}/s (e) {:.0}/s (f) {:.0}/s  c/e {:.2} d/e {:.2} f/c {:.2}",
                case.name,
                encoded.per_second,
                replay.per_second,
                e2e.per_second,
                raw.per_second,
                transactional.per_second,
                replay.per_second / raw.per_second,
                e2e.per_second / raw.per_second,
                transactional.per_second / replay.per_second
            );
            for (all, rate) in sides
                .iter_mut()
                .zip([encoded, replay, e2e, raw, transactional])
            {
                all.push(rate);
            }
        }
        let [encoded, replay, e2e, raw, transactional] = sides.map(median);
        let cell = |r: &Rate| format!("{:.0}/s {:.0} MiB/s", r.per_second, r.mib_per_second);
        println!(
            "{:<16} {:>22} {:>22} {:>22} {:>22} {:>6.2} {:>6.2}",
            case.name,
            cell(&encoded),
            cell(&replay),
            cell(&e2e),
            cell(&raw),
            replay.per_second / raw.per_second,
            e2e.per_second / raw.per_second
        );
        println!(
            "{:<16} (f) exactly-once {} ({:.2} µs on {:.2} cores a message) = {:.2} × (c)",
            "",
            cell(&transactional),
            transactional.cpu_micros,
            transactional.cores,
            transactional.per_second / replay.per_second
        );
        let cpu = |r: &Rate| format!("{:.2} µs on {:.2} cores", r.cpu_micros, r.cores);
        println!(
            "{:<16} {:>22} {:>22} {:>22} {:>22}",
            "  cpu per msg",
            cpu(&encoded),
            cpu(&replay),
            cpu(&e2e),
            cpu(&raw),
        );
        // (c) does the work of (b) and of (e) per message, plus the pipeline's own:
        // even with every core busy it cannot beat cores / ((b) + (e)).
        let bound = cores / ((encoded.cpu_micros + raw.cpu_micros) * 1e-6);
        println!(
            "{:<16} (c) − (b) − (e) = {:.2} µs of pipeline per message; CPU bound on {cores:.0} \
             cores: (c) ≤ {cores:.0} / ((b) + (e)) = {:.0}/s = {:.2} × (e); (c) reaches {:.2} of it",
            "",
            replay.cpu_micros - encoded.cpu_micros - raw.cpu_micros,
            bound,
            bound / raw.per_second,
            replay.per_second / bound,
        );
    }
}

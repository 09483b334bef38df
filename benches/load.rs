//! Initial load throughput at steady state, against reading the same rows raw:
//!
//! - (r) `TableReads::read_table` alone, chunk after chunk over the whole table: what
//!   reading the rows costs with no pipeline;
//! - (l) the poller's load: the same reads, plus building the events (keys, ids);
//! - (p) the whole pipeline: the load → encode → route → Kafka (`MockCluster`, one
//!   broker), checkpoints in memory.
//!
//! The table is in the CDC simulator (`dbo.items`, `LOAD_BENCH_ROWS` rows, default
//! 200000, of seven columns: integers, text, decimal, datetime2 and a 120-character
//! note). Each side repeats whole passes for `LOAD_BENCH_SECONDS` (default 5); the
//! ratios (l)/(r) and (p)/(r) are what the load costs over reading.
//!
//! Run: `cargo bench --bench load`.

use std::time::{Duration, Instant};

use cdc_sim::{CdcSimulator, SimColumn};
use chrono::NaiveDate;
use mssql_ces::checkpoint::{CheckpointStore, memory::MemoryStore};
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::event::{EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit, Value};
use mssql_ces::pipeline::{self, PipelineSettings};
use mssql_ces::sink::kafka::KafkaSinkConfig;
use mssql_ces::sink::kafka::{KafkaFlavour, KafkaSettings, KafkaSink};
use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};
use mssql_ces::sink::{Router, Sink};
use mssql_ces::source::initial_load::SnapshotMode;
use mssql_ces::source::poller::{PollOutcome, Poller, PollerConfig};
use mssql_ces::source::{CdcReads, TableCursor, TableReads};
use rdkafka::mocking::MockCluster;
use tokio_util::sync::CancellationToken;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const CHUNK: usize = 1000;

/// A database whose `dbo.items` holds `rows` rows from before CDC was enabled.
fn database(rows: u64) -> CdcSimulator {
    let sim = CdcSimulator::new("bench", uuid::Uuid::from_u128(42), 0);
    sim.create_table(
        "dbo",
        "items",
        vec![
            SimColumn::new("id", SqlType::BigInt),
            SimColumn::new("sku", SqlType::VarChar(Length::Bounded(20))),
            SimColumn::new("name", SqlType::NVarChar(Length::Bounded(100))),
            SimColumn::new(
                "price",
                SqlType::Decimal {
                    precision: 10,
                    scale: 2,
                },
            ),
            SimColumn::new("qty", SqlType::Int),
            SimColumn::new("updated", SqlType::DateTime2 { scale: 3 }),
            SimColumn::new("note", SqlType::NVarChar(Length::Max)),
        ],
        &["id"],
    );
    let start = NaiveDate::from_ymd_opt(2025, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or_default();
    let mut id = 0u64;
    while id < rows {
        let mut txn = sim.transaction();
        for _ in 0..10_000.min(rows - id) {
            id += 1;
            txn = txn.insert(
                "dbo.items",
                vec![
                    Value::BigInt(id as i64),
                    Value::Text(format!("SKU-{id:08}")),
                    Value::Text(format!("Item {id} – “quoted” ünïcode")),
                    Value::Decimal {
                        unscaled: i128::from(id % 1_000_000),
                        scale: 2,
                    },
                    Value::Int((id % 5000) as i32),
                    Value::DateTime2 {
                        value: start + chrono::Duration::milliseconds(id as i64 * 997),
                        scale: 3,
                    },
                    Value::Text(format!("{id:>10} ").repeat(11)),
                ],
            );
        }
        if let Err(e) = txn.commit() {
            eprintln!("building the table failed: {e}");
            return sim;
        }
    }
    // CDC enabled after the rows: only a load can deliver them.
    if let Err(e) = sim.enable_table("dbo.items", None) {
        eprintln!("enabling CDC failed: {e}");
    }
    sim
}

fn config(mode: SnapshotMode) -> PollerConfig {
    PollerConfig {
        snapshot: mode,
        load_chunk: CHUNK,
        ..PollerConfig::default()
    }
}

struct Rate {
    rows: u64,
    took: Duration,
}

impl Rate {
    fn per_second(&self) -> f64 {
        self.rows as f64 / self.took.as_secs_f64().max(1e-9)
    }
}

/// (r) raw reads of the whole table, pass after pass.
async fn raw(sim: &CdcSimulator, seconds: Duration) -> Rate {
    let mut source = sim.clone();
    let catalog = match source.catalog().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("catalog: {e}");
            return Rate {
                rows: 0,
                took: Duration::from_secs(1),
            };
        }
    };
    let Some(instance) = catalog.instances.first().cloned() else {
        return Rate {
            rows: 0,
            took: Duration::from_secs(1),
        };
    };
    let started = Instant::now();
    let mut rows = 0u64;
    while started.elapsed() < seconds {
        let mut after: Option<Vec<Option<String>>> = None;
        loop {
            let cursor = match &after {
                None => TableCursor::Start,
                Some(key) => TableCursor::AfterKey(key),
            };
            let chunk = match source.read_table(&instance, cursor, CHUNK + 1).await {
                Ok(chunk) => chunk,
                Err(e) => {
                    eprintln!("read_table: {e}");
                    return Rate {
                        rows,
                        took: started.elapsed(),
                    };
                }
            };
            let done = chunk.len() <= CHUNK;
            rows += chunk.len().min(CHUNK) as u64;
            match chunk.get(CHUNK - 1) {
                Some(last) if !done => after = Some(vec![last[0].to_text()]),
                _ => break,
            }
        }
    }
    Rate {
        rows,
        took: started.elapsed(),
    }
}

/// (l) the poller's load, pass after pass (a new stream each time).
async fn poller_load(sim: &CdcSimulator, seconds: Duration) -> Rate {
    let started = Instant::now();
    let mut rows = 0u64;
    while started.elapsed() < seconds {
        let mut poller = Poller::new(sim.clone(), config(SnapshotMode::InitialOnly), None);
        loop {
            match poller.poll().await {
                Ok(PollOutcome::Batch(batch)) => rows += batch.changes.len() as u64,
                Ok(PollOutcome::Idle) => break,
                Err(e) => {
                    eprintln!("poll: {e}");
                    return Rate {
                        rows,
                        took: started.elapsed(),
                    };
                }
            }
        }
    }
    Rate {
        rows,
        took: started.elapsed(),
    }
}

/// (p) the whole pipeline into Kafka, pass after pass (`initial_only` ends each).
async fn pipeline_load(sim: &CdcSimulator, seconds: Duration) -> Rate {
    let Ok(cluster) = MockCluster::new(1) else {
        return Rate {
            rows: 0,
            took: Duration::from_secs(1),
        };
    };
    if cluster.create_topic("bench", 4, 1).is_err() {
        return Rate {
            rows: 0,
            took: Duration::from_secs(1),
        };
    }
    let Ok(settings) = KafkaSettings::new(
        &KafkaSinkConfig::new(&cluster.bootstrap_servers()),
        KafkaFlavour::Kafka,
        MessageSizeLimit::default().bytes(),
        None,
    ) else {
        return Rate {
            rows: 0,
            took: Duration::from_secs(1),
        };
    };
    let started = Instant::now();
    let mut rows = 0u64;
    while started.elapsed() < seconds {
        let Ok(sink) = KafkaSink::new(&settings, MessageSizeLimit::default().bytes()) else {
            break;
        };
        let poller = Poller::new(sim.clone(), config(SnapshotMode::InitialOnly), None);
        let router = Router::new(
            "bench",
            PartitionKeyScheme::PrimaryKey,
            None,
            CloudEventsMode::Structured,
            Encoding::Json,
            "bench",
        );
        let options = |guid| EncoderOptions {
            stream_guid: guid,
            encoding: Encoding::Json,
            final_event: FinalEventMode::LastInTransaction,
            max_message_size: MessageSizeLimit::default(),
        };
        let summary = pipeline::run(
            poller,
            Box::new(options),
            router,
            Sink::Kafka(sink),
            CheckpointStore::Memory(MemoryStore::default()),
            PipelineSettings {
                poll_interval: Duration::from_millis(10),
                checkpoint_interval: Duration::from_secs(1),
                drain_timeout: Duration::from_secs(60),
                idle_drain_timeout: Duration::from_secs(60),
                until_idle: true,
                metrics: Default::default(),
            },
            CancellationToken::new(),
        )
        .await;
        match summary {
            Ok(s) => rows += s.events,
            Err(e) => {
                eprintln!("pipeline: {e}");
                break;
            }
        }
    }
    Rate {
        rows,
        took: started.elapsed(),
    }
}

fn main() {
    let rows = mssql_ces_testkit::bench_setting("LOAD_BENCH_ROWS", 200_000u64);
    let seconds = Duration::from_secs(mssql_ces_testkit::bench_setting("LOAD_BENCH_SECONDS", 5u64));
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    else {
        eprintln!("no runtime");
        return;
    };
    let built = Instant::now();
    let sim = database(rows);
    println!(
        "table: {rows} rows of dbo.items built in {:.1} s; chunk {CHUNK}; {} s per side",
        built.elapsed().as_secs_f64(),
        seconds.as_secs()
    );
    let r = runtime.block_on(raw(&sim, seconds));
    println!(
        "(r) read_table alone        {:>10.0} rows/s",
        r.per_second()
    );
    let l = runtime.block_on(poller_load(&sim, seconds));
    println!(
        "(l) the poller's load       {:>10.0} rows/s   (l)/(r) = {:.2}",
        l.per_second(),
        l.per_second() / r.per_second().max(1e-9)
    );
    let p = runtime.block_on(pipeline_load(&sim, seconds));
    println!(
        "(p) load → pipeline → Kafka {:>10.0} rows/s   (p)/(r) = {:.2}",
        p.per_second(),
        p.per_second() / r.per_second().max(1e-9)
    );
}

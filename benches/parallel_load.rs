//! The initial load over several connections (`snapshot.max_connections`) against
//! one: rows per second, CPU per row and the memory the load adds.
//!
//! A read from a server costs time that is not this process's: the statement's
//! round trip and the rows' reading and transfer. The doubles are given that cost
//! (`ReadLatency`: `PARALLEL_LOAD_STATEMENT_MS`, default 2 ms per statement, and
//! `PARALLEL_LOAD_ROW_US`, default 1 µs per row, about 330,000 rows/s on one
//! connection with 1,000-row chunks), and the poller loads `dbo.items` (a bigint
//! key, a name, a quantity) until idle, events built, nothing sent:
//!
//! - (s) the CDC simulator, `PARALLEL_LOAD_ROWS` rows (default 10,000,000);
//! - (t) the real `SqlServerSource` through the TDS stand-in serving the simulator,
//!   `PARALLEL_LOAD_STANDIN_ROWS` rows (default 1,000,000): tiberius and our
//!   decoding on every connection, the stand-in's encoding in the same process.
//!
//! Each over 1 connection and over `PARALLEL_LOAD_CONNECTIONS` (default 4). The
//! memory is the resident set's peak during the load less what it was before (the
//! simulated table itself is not counted).
//!
//! Run: `cargo bench --bench parallel_load`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cdc_sim::{CdcSimulator, ReadLatency, SimColumn};
use mssql_ces::event::Value;
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::source::ChangeSource;
use mssql_ces::source::initial_load::SnapshotMode;
use mssql_ces::source::poller::{ChunkReader, PollOutcome, Poller, PollerConfig};
use mssql_ces::source::sqlserver::{ConnectionString, SqlServerConfig, SqlServerSource};
use mssql_ces_testkit::tds::{Handler, Reply, Request, StandIn};

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USER: &str = "bench";
const PASSWORD: &str = "Bench_Passw0rd!";
const CHUNK: usize = 1000;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn latency() -> ReadLatency {
    ReadLatency {
        statement: Duration::from_millis(setting("PARALLEL_LOAD_STATEMENT_MS", 2)),
        per_row: Duration::from_micros(setting("PARALLEL_LOAD_ROW_US", 1)),
    }
}

/// `dbo.items` with `rows` rows from before CDC was enabled.
fn database(rows: u64) -> CdcSimulator {
    let sim = CdcSimulator::new("bench", uuid::Uuid::from_u128(42), 0);
    sim.create_table(
        "dbo",
        "items",
        vec![
            SimColumn::new("id", SqlType::BigInt),
            SimColumn::new("name", SqlType::NVarChar(Length::Bounded(40))),
            SimColumn::new("qty", SqlType::Int),
        ],
        &["id"],
    );
    let mut id = 0i64;
    while id < rows as i64 {
        let mut txn = sim.transaction();
        for _ in 0..100_000.min(rows as i64 - id) {
            id += 1;
            txn = txn.insert(
                "dbo.items",
                vec![
                    Value::BigInt(id),
                    Value::Text(format!("item number {id}")),
                    Value::Int((id % 1000) as i32),
                ],
            );
        }
        txn.commit().expect("commit");
    }
    sim.enable_table("dbo.items", None).expect("enable");
    sim
}

fn config(connections: usize) -> PollerConfig {
    PollerConfig {
        snapshot: SnapshotMode::InitialOnly,
        load_chunk: CHUNK,
        batch_size: CHUNK,
        load_connections: connections,
        ..PollerConfig::default()
    }
}

/// This process's resident set, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

struct Measured {
    rows: u64,
    seconds: f64,
    cpu_micros_per_row: f64,
    added_mb: f64,
}

/// Loads until idle, sampling the resident set every 50 ms.
async fn load<S: ChangeSource + 'static>(mut poller: Poller<S>) -> Measured {
    let before = rss();
    let peak = Arc::new(AtomicU64::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (Arc::clone(&peak), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let (cpu, wall) = (mssql_ces_testkit::process_cpu_time(), Instant::now());
    let mut rows = 0u64;
    while let PollOutcome::Batch(batch) = poller.poll().await.expect("poll") {
        rows += batch.changes.len() as u64;
    }
    let (cpu, seconds) = (
        mssql_ces_testkit::process_cpu_time() - cpu,
        wall.elapsed().as_secs_f64(),
    );
    done.store(true, Ordering::Relaxed);
    sampler.join().ok();
    Measured {
        rows,
        seconds,
        cpu_micros_per_row: cpu.as_secs_f64() * 1e6 / rows.max(1) as f64,
        added_mb: peak.load(Ordering::Relaxed).saturating_sub(before) as f64 / 1e6,
    }
}

fn report(side: &str, connections: usize, m: &Measured) {
    println!(
        "{side} {connections} connection(s): {} rows in {:.1} s = {:.0} rows/s, {:.2} µs CPU/row, +{:.0} MB RSS",
        m.rows,
        m.seconds,
        m.rows as f64 / m.seconds,
        m.cpu_micros_per_row,
        m.added_mb
    );
}

/// A simulator poller over `connections`, its readers the simulator too.
fn sim_poller(sim: &CdcSimulator, connections: usize) -> Poller<CdcSimulator> {
    let mut poller = Poller::new(sim.clone(), config(connections), None);
    let sim = sim.clone();
    poller.read_loads_with(Arc::new(move || {
        Box::new(sim.clone()) as Box<dyn ChunkReader>
    }));
    poller
}

/// The stand-in's answers from `sim`, each table read given the read's time.
fn slow_reads(sim: &CdcSimulator, latency: ReadLatency) -> Handler {
    let inner = mssql_ces_testkit::tds_cdc::handler(sim.clone());
    Arc::new(move |request: &Request| {
        let reply = inner(request);
        match &reply {
            Reply::Rows(sets) if request.sql.contains("FROM [dbo].[items] AS ct") => {
                let rows = sets.iter().map(|s| s.rows.len()).sum();
                Reply::Slow(latency.of(rows), Box::new(reply))
            }
            _ => reply,
        }
    })
}

fn settings(standin: &StandIn) -> SqlServerConfig {
    SqlServerConfig {
        connection_string: ConnectionString::new(standin.connection_string(USER, PASSWORD)),
        trust_server_certificate: true,
        encrypt: false,
        connect_timeout: Duration::from_secs(5),
        query_timeout: Duration::from_secs(60),
    }
}

fn standin_poller(standin: &StandIn, connections: usize) -> Poller<SqlServerSource> {
    let settings = settings(standin);
    let mut poller = Poller::new(
        SqlServerSource::new(settings.clone()),
        config(connections),
        None,
    );
    poller.read_loads_with(Arc::new(move || {
        Box::new(SqlServerSource::new(settings.clone())) as Box<dyn ChunkReader>
    }));
    poller
}

#[tokio::main]
async fn main() {
    let connections = setting("PARALLEL_LOAD_CONNECTIONS", 4) as usize;
    let latency = latency();
    println!(
        "read cost: {:?} per statement, {:?} per row; chunks of {CHUNK} rows",
        latency.statement, latency.per_row
    );

    let rows = setting("PARALLEL_LOAD_ROWS", 10_000_000);
    let built = Instant::now();
    let sim = database(rows);
    sim.set_read_latency(Some(latency));
    println!(
        "(s) simulator: {rows} rows built in {:.0} s",
        built.elapsed().as_secs_f64()
    );
    let one = load(sim_poller(&sim, 1)).await;
    report("(s)", 1, &one);
    let many = load(sim_poller(&sim, connections)).await;
    report("(s)", connections, &many);
    println!(
        "(s) {connections} connections / 1: {:.2}x the rate",
        one.seconds / many.seconds
    );
    drop(sim);

    let rows = setting("PARALLEL_LOAD_STANDIN_ROWS", 1_000_000);
    let sim = database(rows);
    let standin = StandIn::start(USER, PASSWORD, slow_reads(&sim, latency))
        .await
        .expect("stand-in");
    let one = load(standin_poller(&standin, 1)).await;
    report("(t)", 1, &one);
    let many = load(standin_poller(&standin, connections)).await;
    report("(t)", connections, &many);
    println!(
        "(t) {connections} connections / 1: {:.2}x the rate",
        one.seconds / many.seconds
    );
}

//! What the SQL Server path costs on our side, at steady state: the real
//! `SqlServerSource` (tiberius' TDS decoding, our value decoding) and the poller's
//! merge, fed by the TDS stand-in replaying answers it encoded once (so the server
//! side costs next to nothing: a copy of bytes onto loopback).
//!
//! - (w) read: `read_changes` page after page through the wire, no merge;
//! - (p) poll: the poller over the wire (pages, merge, pairing, numbering);
//! - (s) the same poller over the CDC simulator directly: what the wire and the
//!   decoding add is (p) − (s).
//!
//! For a narrow table (10 columns) and a wide one (80 columns, two of them LOBs of
//! 300 characters and 300 bytes). Each side runs whole passes for
//! `SQLSERVER_BENCH_SECONDS` (default 5), `SQLSERVER_BENCH_ROUNDS` rounds (default 3,
//! medians reported), with the CPU time per row of the whole process (the stand-in's
//! replay included). The pipeline after the poller (encode, route, Kafka) costs what
//! `cargo bench --bench pipeline` measures as (c).
//!
//! Run: `cargo bench --bench sqlserver_path` (`SQLSERVER_BENCH_SHAPE=narrow` or `wide`
//! for one table).

use mssql_ces::source::CdcReads;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cdc_sim::{CdcSimulator, SimColumn};
use chrono::NaiveDate;
use mssql_ces::event::Value;
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::lsn::Lsn;
use mssql_ces::source::poller::{PollOutcome, Poller, PollerConfig, StartPosition};
use mssql_ces::source::sqlserver::{ConnectionString, SqlServerConfig, SqlServerSource};
use mssql_ces::source::{ChangeSource, RowKey};
use mssql_ces_testkit::tds::{Handler, Reply, Request, StandIn, encode_reply};

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USER: &str = "bench";
const PASSWORD: &str = "Bench_Passw0rd!";
const PAGE: usize = 1000;

struct Shape {
    name: &'static str,
    columns: Vec<SimColumn>,
    rows: usize,
}

fn narrow() -> Shape {
    Shape {
        name: "narrow (10 columns)",
        columns: mssql_ces_testkit::narrow_table()
            .into_iter()
            .map(|(name, sql_type)| SimColumn::new(name, sql_type))
            .collect(),
        rows: 100_000,
    }
}

fn wide() -> Shape {
    let mut columns = vec![SimColumn::new("id", SqlType::BigInt)];
    for n in 1..78 {
        let sql_type = match n % 4 {
            0 => SqlType::Int,
            1 => SqlType::NVarChar(Length::Bounded(40)),
            2 => SqlType::Decimal {
                precision: 18,
                scale: 4,
            },
            _ => SqlType::DateTime2 { scale: 3 },
        };
        columns.push(SimColumn::new(&format!("c{n:02}"), sql_type));
    }
    columns.push(SimColumn::new("body", SqlType::NVarChar(Length::Max)));
    columns.push(SimColumn::new("blob", SqlType::VarBinary(Length::Max)));
    Shape {
        name: "wide (80 columns, 2 LOBs)",
        columns,
        rows: 20_000,
    }
}

fn value(sql_type: SqlType, n: i64) -> Value {
    let day = NaiveDate::from_ymd_opt(2026, 8, 7)
        .and_then(|d| d.and_hms_nano_opt(16, 25, 0, 883_333_300));
    match sql_type {
        SqlType::BigInt => Value::BigInt(n),
        SqlType::Int => Value::Int(n as i32),
        SqlType::SmallInt => Value::SmallInt((n % 1000) as i16),
        SqlType::Bit => Value::Bit(n % 2 == 0),
        SqlType::Float => Value::Float(n as f64 / 7.0),
        SqlType::Decimal { scale, .. } => Value::Decimal {
            unscaled: i128::from(n) * 1234,
            scale,
        },
        SqlType::DateTime2 { scale } => Value::DateTime2 {
            value: day.unwrap_or_default(),
            scale,
        },
        SqlType::UniqueIdentifier => Value::Guid(uuid::Uuid::from_u128(n as u128)),
        SqlType::VarChar(_) => Value::Text(format!("SKU-{n:08}")),
        SqlType::NVarChar(Length::Max) => Value::Text("ü".repeat(300)),
        SqlType::NVarChar(_) => Value::Text(format!("name {n} — ñ")),
        SqlType::VarBinary(_) => Value::Binary(vec![(n % 251) as u8; 300]),
        _ => Value::Null,
    }
}

/// The table with its rows inserted after CDC was enabled, 100 a transaction.
fn database(shape: &Shape) -> CdcSimulator {
    let sim = CdcSimulator::new("bench", uuid::Uuid::from_u128(42), 0);
    sim.create_table("dbo", "t", shape.columns.clone(), &["id"]);
    sim.enable_table("dbo.t", None).expect("enable");
    sim.run_capture_job();
    for start in (0..shape.rows).step_by(100) {
        let mut transaction = sim.transaction();
        for n in start..(start + 100).min(shape.rows) {
            let row = shape
                .columns
                .iter()
                .map(|c| value(c.sql_type.clone().unwrap_or(SqlType::Int), n as i64))
                .collect();
            transaction = transaction.insert("dbo.t", row);
        }
        transaction.commit().expect("commit");
    }
    sim.run_capture_job();
    sim
}

/// The simulator's answers, each encoded once and replayed as bytes after.
fn replaying(sim: CdcSimulator) -> Handler {
    let inner = mssql_ces_testkit::tds_cdc::handler(sim);
    let cache: Mutex<HashMap<String, Arc<Vec<u8>>>> = Mutex::new(HashMap::new());
    Arc::new(move |request: &Request| {
        let key = format!("{}|{:?}", request.sql, request.params);
        if let Some(bytes) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Reply::Raw(bytes);
        }
        let reply = inner(request);
        match encode_reply(&reply, request.rpc) {
            Some(bytes) => {
                let bytes = Arc::new(bytes);
                if let Ok(mut c) = cache.lock() {
                    c.insert(key, Arc::clone(&bytes));
                }
                Reply::Raw(bytes)
            }
            None => reply,
        }
    })
}

fn source(standin: &StandIn) -> SqlServerSource {
    SqlServerSource::new(SqlServerConfig {
        connection_string: ConnectionString::new(standin.connection_string(USER, PASSWORD)),
        trust_server_certificate: true,
        encrypt: false,
        connect_timeout: Duration::from_secs(5),
        query_timeout: Duration::from_secs(30),
    })
}

fn config() -> PollerConfig {
    PollerConfig {
        page_size: PAGE,
        batch_size: PAGE,
        start_position: StartPosition::Earliest,
        catalog_refresh: Duration::from_secs(3600),
        ..PollerConfig::default()
    }
}

fn cpu_time() -> Duration {
    mssql_ces_testkit::process_cpu_time()
}

/// Rows per second and CPU microseconds per row.
#[derive(Clone, Copy)]
struct Rate {
    per_second: f64,
    cpu_micros: f64,
}

/// Repeats `pass` (which returns the rows it read) for `seconds`.
async fn measure<F, Fut>(seconds: Duration, mut pass: F) -> Rate
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let (cpu, wall) = (cpu_time(), Instant::now());
    let mut rows = 0usize;
    while wall.elapsed() < seconds {
        rows += pass().await;
    }
    let (cpu, wall) = (cpu_time() - cpu, wall.elapsed());
    Rate {
        per_second: rows as f64 / wall.as_secs_f64(),
        cpu_micros: cpu.as_secs_f64() * 1e6 / rows.max(1) as f64,
    }
}

/// A poller from the start through every change; the changes it made.
async fn poll_all<S: ChangeSource>(source: S) -> usize {
    let mut poller = Poller::new(source, config(), None);
    let mut changes = 0;
    loop {
        match poller.poll().await {
            Ok(PollOutcome::Batch(batch)) => changes += batch.changes.len(),
            Ok(PollOutcome::Idle) => return changes,
            Err(e) => panic!("poll: {e}"),
        }
    }
}

/// `read_changes` page after page over the whole change table, through the wire, on
/// a new connection (as the poll side's passes have).
async fn read_all(mut source: SqlServerSource) -> usize {
    let catalog = source.catalog().await.expect("catalog");
    let instance = &catalog.instances[0];
    let to = source.max_lsn().await.expect("max_lsn").lsn.expect("max");
    let mut after = RowKey::after_lsn(Lsn::ZERO);
    let mut rows = 0;
    loop {
        let page = source
            .read_changes(instance, after, to, PAGE)
            .await
            .expect("page");
        rows += page.len();
        match page.last() {
            Some(last) if page.len() == PAGE => after = last.key,
            _ => return rows,
        }
    }
}

fn median(mut rates: Vec<Rate>) -> Rate {
    rates.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
    rates[rates.len() / 2]
}

fn main() {
    let number = mssql_ces_testkit::bench_setting::<f64>;
    let seconds = Duration::from_secs_f64(number("SQLSERVER_BENCH_SECONDS", 5.0));
    let rounds = number("SQLSERVER_BENCH_ROUNDS", 3.0).max(1.0) as usize;
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        eprintln!("cannot start the runtime");
        return;
    };
    println!(
        "each side {:.0} s, {rounds} rounds (medians); pages of {PAGE}; the stand-in replays answers encoded once",
        seconds.as_secs_f64()
    );
    // `SQLSERVER_BENCH_SHAPE=narrow` (or `wide`) runs one table, e.g. under a profiler.
    let only = std::env::var("SQLSERVER_BENCH_SHAPE").unwrap_or_default();
    for shape in [narrow(), wide()] {
        if !shape.name.starts_with(only.as_str()) {
            continue;
        }
        let sim = database(&shape);
        runtime.block_on(async {
            let standin = StandIn::start(USER, PASSWORD, replaying(sim.clone()))
                .await
                .expect("stand-in");
            // Warm the replay cache: every answer encoded once before measuring.
            assert_eq!(poll_all(source(&standin)).await, shape.rows);
            assert_eq!(read_all(source(&standin)).await, shape.rows);
            let mut sides: [Vec<Rate>; 3] = Default::default();
            for _ in 0..rounds {
                sides[0].push(measure(seconds, || read_all(source(&standin))).await);
                sides[1].push(measure(seconds, || poll_all(source(&standin))).await);
                sides[2].push(measure(seconds, || poll_all(sim.clone())).await);
            }
            let [read, poll, direct] = sides.map(median);
            println!(
                "{:<26} (w) read {:>9.0} rows/s {:>6.2} µs/row | (p) poll {:>9.0} rows/s {:>6.2} µs/row | (s) simulator {:>9.0} rows/s {:>6.2} µs/row | (p) − (s) {:.2} µs/row",
                shape.name,
                read.per_second,
                read.cpu_micros,
                poll.per_second,
                poll.cpu_micros,
                direct.per_second,
                direct.cpu_micros,
                poll.cpu_micros - direct.cpu_micros
            );
        });
    }
}

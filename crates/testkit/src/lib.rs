//! The test doubles of mssql-ces, in a crate of their own so that they compile once
//! for every test binary, bench and example that uses them:
//!
//! - [`tds`]: a TDS-speaking stand-in on loopback that follows [MS-TDS] far enough
//!   for the driver the daemon uses — a test double, not SQL Server — and
//!   [`tds_cdc`], which answers the daemon's own queries from the CDC simulator,
//!   and [`tds_checkpoint`], a model of the table checkpoint store and its leases;
//! - [`amqp_peer`]: a local AMQP 1.0 peer standing in for Event Hubs, and
//!   [`event_hubs`], which drives the sink against it;
//! - [`kafka`]: consuming what `MockCluster` holds;
//! - [`apache_kafka`]: Apache Kafka 4.4 brokers started on loopback, and Kafka's
//!   Java client reading back;
//! - [`tools`]: where `bash tests/setup` installed the readers and brokers, and
//!   child processes with a deadline;
//! - [`expected`]: the events a synthetic workload must produce, computed without
//!   the pipeline;
//! - [`seek_cost`]: what the change query's seeks examine on SQL Server, from its
//!   text, for the CDC simulator to charge;
//! - builders for tables, rows and changes (below).

pub mod amqp_peer;
pub mod apache_kafka;
pub mod event_hubs;
pub mod expected;
pub mod kafka;
pub mod kafka_sasl;
pub mod registry;
pub mod seek_cost;
pub mod tds;
pub mod tds_cdc;
pub mod tds_checkpoint;
pub mod tools;

use std::sync::Arc;

use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use mssql_ces::event::{
    Change, ColumnDescription, EncoderOptions, Encoding, FinalEventMode, Length, MessageSizeLimit,
    Operation, Row, SqlType, TableDescription, Value,
};
use mssql_ces::lsn::Lsn;
use uuid::Uuid;

/// The rounds of a soak loop (kills, restarts): `quick` on a plain `cargo test`, as CI
/// runs it, and `full` with `MSSQL_CES_SOAK=full` (the sizes the guarantees were first
/// proven with; `docs/src/dev/testing.md` says how to run them).
pub fn soak_rounds(quick: usize, full: usize) -> usize {
    match std::env::var("MSSQL_CES_SOAK").as_deref() {
        Ok("full") => full,
        _ => quick,
    }
}

/// The seeds a randomized test runs: `defaults`, or only the one in
/// `MSSQL_CES_TEST_SEED` when it is set, to replay a failure. Hold the [`Seed`] each
/// iteration gets while it runs: a failure then names its seed.
pub fn test_seeds(defaults: &[u64]) -> Vec<Seed> {
    let seeds = match std::env::var("MSSQL_CES_TEST_SEED") {
        Ok(text) => match text.trim().parse() {
            Ok(seed) => vec![seed],
            Err(_) => panic!("MSSQL_CES_TEST_SEED={text:?} is not a number"),
        },
        Err(_) => defaults.to_vec(),
    };
    seeds.into_iter().map(Seed).collect()
}

/// One seed of a randomized test; says how to replay it if the test panics while
/// it is held.
#[derive(Debug)]
pub struct Seed(pub u64);

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "this failure came with seed {seed}: run it alone with MSSQL_CES_TEST_SEED={seed}",
                seed = self.0
            );
        }
    }
}

/// A bench's setting: the environment variable `name` parsed, else `default` (also
/// when it does not parse).
pub fn bench_setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time of the calling thread (benches that run on one thread report CPU per
/// operation with it).
pub fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The 10-column table the SQL Server path benches measure (`sqlserver_path`'s
/// narrow table, whose rows `decode_rows` decodes): name and type of each column.
pub fn narrow_table() -> Vec<(&'static str, mssql_ces::event::value::SqlType)> {
    use mssql_ces::event::value::{Length, SqlType};
    vec![
        ("id", SqlType::BigInt),
        ("customer", SqlType::Int),
        ("sku", SqlType::VarChar(Length::Bounded(20))),
        ("name", SqlType::NVarChar(Length::Bounded(100))),
        (
            "price",
            SqlType::Decimal {
                precision: 10,
                scale: 2,
            },
        ),
        ("qty", SqlType::SmallInt),
        ("at", SqlType::DateTime2 { scale: 7 }),
        ("active", SqlType::Bit),
        ("ratio", SqlType::Float),
        ("ref", SqlType::UniqueIdentifier),
    ]
}

/// The CPU time this process has used so far, on every thread (librdkafka's, an
/// in-process broker's or stand-in's included): what benchmarks report per message.
pub fn process_cpu_time() -> std::time::Duration {
    // SAFETY: `getrusage` writes the struct it is given and nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    std::time::Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// A fresh directory under the system's temp directory.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mssql-ces-{name}-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The stream GUID of the CES documentation's examples.
pub const DOCS_STREAM_GUID: &str = "1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0";

pub fn column(name: &str, sql_type: SqlType, index: u32) -> ColumnDescription {
    ColumnDescription {
        name: name.into(),
        sql_type,
        index,
        mask: None,
        nullable: true,
        default: None,
    }
}

/// `EmployeesDb.dbo.Employees` of the CES documentation's examples.
pub fn employees() -> Arc<TableDescription> {
    Arc::new(
        TableDescription::new(
            "EmployeesDb",
            "dbo",
            "Employees",
            vec![
                column("Id", SqlType::Int, 0),
                column("FirstName", SqlType::NVarChar(Length::Bounded(50)), 1),
                column("LastName", SqlType::NVarChar(Length::Bounded(50)), 2),
                column("SignupDate", SqlType::DateTime2 { scale: 7 }, 3),
            ],
            vec![0],
        )
        .expect("valid table"),
    )
}

pub fn employee(id: i32, first: &str, last: &str) -> Row {
    let signup = NaiveDate::from_ymd_opt(2026, 8, 7)
        .and_then(|d| d.and_hms_nano_opt(16, 25, 0, 883_333_300))
        .expect("valid date");
    vec![
        Value::Int(id),
        Value::Text(first.into()),
        Value::Text(last.into()),
        Value::DateTime2 {
            value: signup,
            scale: 7,
        },
    ]
}

/// A UTC instant from `2026-08-07T16:25:00.890`-style text.
pub fn utc(text: &str) -> DateTime<Utc> {
    let naive = chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
        .expect("valid timestamp");
    Utc.from_utc_datetime(&naive)
}

pub fn lsn(text: &str) -> Lsn {
    Lsn::parse(text).expect("valid LSN")
}

/// A change with the given images; positions and time are set by the caller.
pub struct ChangeBuilder {
    change: Change,
}

impl ChangeBuilder {
    pub fn new(table: Arc<TableDescription>, operation: Operation) -> Self {
        ChangeBuilder {
            change: Change {
                table,
                operation,
                commit_lsn: Lsn::from_parts(1, 2, 3),
                begin_lsn: Lsn::from_parts(1, 2, 1),
                change_lsn: Lsn::from_parts(1, 2, 2),
                sequence_number: 1,
                last_in_transaction: true,
                commit_time: utc("2026-01-01T00:00:00.000"),
                old: None,
                current: None,
                origin: mssql_ces::event::Origin::Cdc,
            },
        }
    }
    pub fn lsns(mut self, commit: &str, begin: &str) -> Self {
        self.change.commit_lsn = lsn(commit);
        self.change.begin_lsn = lsn(begin);
        self
    }
    pub fn sequence(mut self, n: u64, last: bool) -> Self {
        self.change.sequence_number = n;
        self.change.last_in_transaction = last;
        self
    }
    pub fn time(mut self, text: &str) -> Self {
        self.change.commit_time = utc(text);
        self
    }
    pub fn old(mut self, row: Row) -> Self {
        self.change.old = Some(row);
        self
    }
    pub fn current(mut self, row: Row) -> Self {
        self.change.current = Some(row);
        self
    }
    pub fn build(self) -> Change {
        self.change
    }
}

pub fn options(encoding: Encoding, final_event: FinalEventMode, kb: u32) -> EncoderOptions {
    EncoderOptions {
        stream_guid: Uuid::parse_str(DOCS_STREAM_GUID).expect("valid GUID"),
        encoding,
        final_event,
        max_message_size: MessageSizeLimit::from_kb(kb).expect("valid size"),
    }
}

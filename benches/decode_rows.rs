//! Our side of decoding a change row, apart from the driver's: the 10-column row of
//! `sqlserver_path`'s narrow table, as tiberius hands its values over (text as the
//! UTF-16 bytes the change query casts it to), decoded by `decode_change_row` into a
//! `ChangeRow`. The rows are built before each timed pass; the pass times only the
//! decoding. `DECODE_BENCH_SECONDS` (default 3), medians of `DECODE_BENCH_ROUNDS`
//! (default 5).
//!
//! Run: `cargo bench --bench decode_rows`.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mssql_ces::event::value::SqlType;
use mssql_ces::lsn::Lsn;
use mssql_ces::source::catalog::{ColumnIndex, NamedRow};
use mssql_ces::source::queries::fixed;
use mssql_ces::source::sqlserver::decode_change_row_for_bench;
use tiberius::ColumnData;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const BATCH: usize = 1000;

fn columns() -> Vec<(String, SqlType)> {
    mssql_ces_testkit::narrow_table()
        .into_iter()
        .map(|(n, t)| (n.to_owned(), t))
        .collect()
}

fn utf16(text: &str) -> ColumnData<'static> {
    ColumnData::Binary(Some(Cow::Owned(
        text.encode_utf16().flat_map(u16::to_le_bytes).collect(),
    )))
}

fn lsn(n: u64) -> ColumnData<'static> {
    let lsn = Lsn::from_parts(0xB1, u32::try_from(n / 100).unwrap_or(0), 1);
    ColumnData::Binary(Some(Cow::Owned(lsn.to_vec())))
}

/// The names of the change query's result: the fixed columns, then the table's.
fn names() -> Vec<String> {
    let mut names: Vec<String> = fixed::IN_ORDER.map(str::to_owned).to_vec();
    names.extend(columns().into_iter().map(|(n, _)| n));
    names
}

fn row(n: u64) -> Vec<ColumnData<'static>> {
    let time = tiberius::time::DateTime::new(46_000, 300);
    let date = tiberius::time::Date::new(739_834);
    vec![
        lsn(n),
        ColumnData::I32(Some(1)),
        ColumnData::Binary(Some(Cow::Owned(
            Lsn::from_u128(u128::from(n)).unwrap_or(Lsn::MAX).to_vec(),
        ))),
        ColumnData::I32(Some(2)),
        ColumnData::Binary(Some(Cow::Owned(vec![0x03, 0xFF]))),
        lsn(n),
        ColumnData::DateTime(Some(time)),
        ColumnData::I32(Some(0)),
        ColumnData::I32(Some(0)),
        lsn(n),
        ColumnData::DateTime(Some(time)),
        ColumnData::I64(Some(n as i64)),
        ColumnData::I32(Some(n as i32)),
        utf16(&format!("SKU-{n:08}")),
        utf16(&format!("name {n} — ñ")),
        ColumnData::Numeric(Some(tiberius::numeric::Numeric::new_with_scale(
            i128::from(n) * 1234,
            2,
        ))),
        ColumnData::I16(Some((n % 1000) as i16)),
        ColumnData::DateTime2(Some(tiberius::time::DateTime2::new(
            date,
            tiberius::time::Time::new(591_008_833_333, 7),
        ))),
        ColumnData::Bit(Some(n.is_multiple_of(2))),
        ColumnData::F64(Some(n as f64 / 7.0)),
        ColumnData::Guid(Some(uuid::Uuid::from_u128(u128::from(n)))),
    ]
}

fn main() {
    let number = mssql_ces_testkit::bench_setting::<f64>;
    let seconds = Duration::from_secs_f64(number("DECODE_BENCH_SECONDS", 3.0));
    let rounds = number("DECODE_BENCH_ROUNDS", 5.0).max(1.0) as usize;
    let columns = columns();
    let names = names();
    let index = Arc::new(ColumnIndex::of(names.iter().map(String::as_str)));
    let template: Vec<Vec<ColumnData<'static>>> = (0..BATCH as u64).map(row).collect();
    // A decoded row must be what was put in: the bench measures working code.
    let first = decode_change_row_for_bench(
        NamedRow::with_index(Arc::clone(&index), template[7].clone()),
        &columns,
    )
    .expect("decodes");
    assert_eq!(first.values.len(), 10);
    assert_eq!(
        first.values[2],
        mssql_ces::event::Value::Text("SKU-00000007".into())
    );
    let mut results = Vec::new();
    for _ in 0..rounds {
        let (mut cpu, mut rows, wall) = (Duration::ZERO, 0usize, Instant::now());
        while wall.elapsed() < seconds {
            let batch: Vec<NamedRow> = template
                .iter()
                .map(|values| NamedRow::with_index(Arc::clone(&index), values.clone()))
                .collect();
            let start = mssql_ces_testkit::process_cpu_time();
            for row in batch {
                let decoded = decode_change_row_for_bench(row, &columns).expect("decodes");
                std::hint::black_box(decoded);
            }
            cpu += mssql_ces_testkit::process_cpu_time() - start;
            rows += BATCH;
        }
        results.push(cpu.as_secs_f64() * 1e9 / rows as f64);
    }
    results.sort_by(f64::total_cmp);
    println!(
        "decode a 10-column change row (our side, after the driver): {:.0} ns CPU/row (median of {rounds}; min {:.0}, max {:.0})",
        results[results.len() / 2],
        results[0],
        results[results.len() - 1]
    );
}

//! Encoding throughput: a 10-column mixed-type change as JSON and as Avro, and the
//! truncation + segmentation of a 5 MiB event.
//!
//! Run: `cargo bench --bench encode`. Criterion reports time per event; events/s per
//! core is 1 / that time (the benchmark is single-threaded).

use std::hint::black_box;
use std::sync::Arc;

use chrono::{FixedOffset, NaiveDate, TimeZone, Utc};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mssql_ces::event::{
    Change, ColumnDescription, Encoder, EncoderOptions, Encoding, FinalEventMode, Length,
    MessageSizeLimit, Operation, SqlType, TableDescription, Value,
};
use mssql_ces::lsn::Lsn;
use uuid::Uuid;

fn column(name: &str, sql_type: SqlType, index: u32) -> ColumnDescription {
    ColumnDescription {
        name: name.into(),
        sql_type,
        index,
        mask: None,
        nullable: true,
        default: None,
    }
}

fn table() -> Arc<TableDescription> {
    let columns = vec![
        column("OrderId", SqlType::BigInt, 0),
        column("CustomerId", SqlType::Int, 1),
        column("Status", SqlType::TinyInt, 2),
        column(
            "Total",
            SqlType::Decimal {
                precision: 18,
                scale: 2,
            },
            3,
        ),
        column("Weight", SqlType::Float, 4),
        column("PlacedAt", SqlType::DateTime2 { scale: 7 }, 5),
        column("ShippedAt", SqlType::DateTimeOffset { scale: 3 }, 6),
        column("TrackingId", SqlType::UniqueIdentifier, 7),
        column("Customer", SqlType::NVarChar(Length::Bounded(100)), 8),
        column("Notes", SqlType::NVarChar(Length::Max), 9),
    ];
    Arc::new(TableDescription::new("Shop", "sales", "Orders", columns, vec![0]).expect("table"))
}

fn row(notes: Value) -> Vec<Value> {
    let placed = NaiveDate::from_ymd_opt(2026, 8, 7)
        .and_then(|d| d.and_hms_nano_opt(16, 25, 0, 883_333_300))
        .expect("date");
    let offset = FixedOffset::east_opt(7200).expect("offset");
    vec![
        Value::BigInt(1_234_567_890),
        Value::Int(42_001),
        Value::TinyInt(3),
        Value::Decimal {
            unscaled: 1_234_599,
            scale: 2,
        },
        Value::Float(12.375),
        Value::DateTime2 {
            value: placed,
            scale: 7,
        },
        Value::DateTimeOffset {
            value: offset.from_local_datetime(&placed).single().expect("time"),
            scale: 3,
        },
        Value::Guid(Uuid::from_u128(0x6F9619FF_8B86_D011_B42D_00C04FD430C8)),
        Value::Text("Zoë \"Quick\" O'Brien".into()),
        notes,
    ]
}

fn change(operation: Operation, notes: Value) -> Change {
    Change {
        table: table(),
        operation,
        commit_lsn: Lsn::from_parts(0xB1, 0x930, 9),
        begin_lsn: Lsn::from_parts(0xB1, 0x930, 2),
        change_lsn: Lsn::from_parts(0xB1, 0x930, 3),
        sequence_number: 1,
        last_in_transaction: true,
        commit_time: Utc::now(),
        old: Some(row(notes.clone())),
        current: Some(row(notes)),
        origin: mssql_ces::event::Origin::Cdc,
    }
}

fn encoder(encoding: Encoding) -> Encoder {
    Encoder::new(EncoderOptions {
        stream_guid: Uuid::from_u128(0x1bf2756a_c15f_4d2e_a2d5_7d3f9dbf85b0),
        encoding,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size: MessageSizeLimit::default(),
    })
}

fn bench_encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode_10_columns");
    group.throughput(Throughput::Elements(1));
    for (name, encoding) in [("json", Encoding::Json), ("avro", Encoding::Avro)] {
        let encoder = encoder(encoding);
        let notes = Value::Text("Leave at the back door, ring twice.".into());
        // An update carries both images: the largest common event.
        let update = change(Operation::Update, notes.clone());
        group.bench_function(format!("{name}/update"), |b| {
            b.iter(|| black_box(encoder.encode(&update)))
        });
        let mut insert = change(Operation::Insert, notes);
        insert.old = None;
        group.bench_function(format!("{name}/insert"), |b| {
            b.iter(|| black_box(encoder.encode(&insert)))
        });
    }
    group.finish();
}

fn bench_segment(c: &mut Criterion) {
    let mut group = c.benchmark_group("segment_5mib_event");
    group.sample_size(20);
    // An update whose before and after images each hold 2.5 MiB of notes: 5 MiB of
    // values, each truncated to 1 MiB, then split at the default 256 KiB.
    let unit = "Large text with \"quotes\" and é. ";
    let big = unit.repeat(5 * 1024 * 1024 / 2 / unit.len());
    let event = change(Operation::Update, Value::Text(big));
    group.throughput(Throughput::Bytes(5 * 1024 * 1024));
    for (name, encoding) in [("json", Encoding::Json), ("avro", Encoding::Avro)] {
        let encoder = encoder(encoding);
        group.bench_function(name, |b| b.iter(|| black_box(encoder.encode(&event))));
    }
    group.finish();
}

criterion_group!(benches, bench_encode, bench_segment);
criterion_main!(benches);

//! Properties of truncation and segmentation over random events, in both encodings:
//! every message within the limit, contiguous segment indexes, `finalsegment` only on
//! the last, a shared `logicalid`, distinct ids, and reassembly giving back the
//! original `data` byte for byte.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;

use mssql_ces::event::readback::{CloudEvent, Reassembler, decode_message};
use mssql_ces::event::segment::{MAX_VALUE_TEXT_BYTES, truncate_row};
use mssql_ces::event::{
    Change, Encoder, Encoding, FinalEventMode, Length, Operation, SqlType, TableDescription, Value,
    avro, format_time, json,
};
use proptest::prelude::*;
use support::*;

/// Pieces that stress JSON escaping: quotes, backslashes, control characters,
/// non-ASCII and 4-byte characters.
const PIECES: &[&str] = &[
    "\"",
    "\\",
    "\u{0}",
    "\u{1f}",
    "\n",
    "\t",
    "é",
    "😀",
    "𝄞",
    "a",
    "plain text ",
    "\\\"",
];

fn big_text() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(prop::sample::select(PIECES), 1..8),
        0usize..400_000,
    )
        .prop_map(|(unit, repeat)| unit.concat().repeat(repeat / 8 + 1))
}

fn table() -> Arc<TableDescription> {
    Arc::new(
        TableDescription::new(
            "db\"x",
            "sch😀",
            "order details",
            vec![
                column("Id", SqlType::BigInt, 0),
                column("Doc", SqlType::NVarChar(Length::Max), 1),
                column("Blob", SqlType::VarBinary(Length::Max), 2),
                column("Note \"q\"", SqlType::VarChar(Length::Bounded(100)), 4),
                column("Amount", SqlType::Float, 5),
            ],
            vec![0],
        )
        .expect("valid table"),
    )
}

fn row() -> impl Strategy<Value = Vec<Value>> {
    (
        any::<i64>(),
        big_text(),
        prop::collection::vec(any::<u8>(), 0..64).prop_flat_map(|unit| {
            (Just(unit), 0usize..40_000).prop_map(|(u, n)| u.repeat(n / 8 + 1))
        }),
        prop::option::of(".{0,20}"),
        any::<f64>().prop_filter("finite", |f| f.is_finite()),
    )
        .prop_map(|(id, doc, blob, note, amount)| {
            vec![
                Value::BigInt(id),
                Value::Text(doc),
                Value::Binary(blob),
                note.map_or(Value::Null, Value::Text),
                Value::Float(amount),
            ]
        })
}

fn change() -> impl Strategy<Value = Change> {
    (row(), row(), 0u8..3, 1u64..1_000_000, any::<bool>()).prop_map(
        |(old, current, op, sequence, last)| {
            let operation = [Operation::Insert, Operation::Update, Operation::Delete][op as usize];
            let builder = ChangeBuilder::new(table(), operation).sequence(sequence, last);
            match operation {
                Operation::Insert => builder.current(current),
                Operation::Update => builder.old(old).current(current),
                Operation::Delete => builder.old(old),
            }
            .build()
        },
    )
}

/// The unsegmented `data` of a change, computed from the public building blocks.
fn expected_data(change: &Change, encoding: Encoding) -> Vec<u8> {
    let mut change = change.clone();
    for row in [change.old.as_mut(), change.current.as_mut()]
        .into_iter()
        .flatten()
    {
        truncate_row(row);
    }
    let time = format_time(change.commit_time);
    match encoding {
        Encoding::Json => json::data_text(&change, &time, change.last_in_transaction).into_bytes(),
        Encoding::Avro => avro::data_datum(&change, &time, change.last_in_transaction)
            .expect("sequence number fits"),
    }
}

fn check_event(change: Change, encoding: Encoding, kb: u32) -> Result<(), TestCaseError> {
    let encoder = Encoder::new(options(encoding, FinalEventMode::LastInTransaction, kb));
    let expected = expected_data(&change, encoding);
    let encoded = encoder.encode(&change).expect("encodes");
    let again = encoder.encode(&change).expect("encodes");
    prop_assert_eq!(&encoded, &again, "encoding is deterministic");

    let limit = kb as usize * 1024;
    let count = encoded.messages.len();
    let mut ids = HashSet::new();
    let mut reassembler = Reassembler::new();
    let mut whole = None;
    let mut first: Option<CloudEvent> = None;
    for (i, message) in encoded.messages.iter().enumerate() {
        prop_assert!(
            message.bytes.len() <= limit,
            "{} > {}",
            message.bytes.len(),
            limit
        );
        let decoded = decode_message(&message.bytes, encoding).expect("message decodes");
        prop_assert_eq!(decoded.segmentindex as usize, i);
        prop_assert_eq!(decoded.finalsegment, i + 1 == count);
        prop_assert_eq!(&decoded.logicalid, &encoded.logical_id);
        prop_assert_eq!(decoded.id.clone(), message.id.to_string());
        prop_assert!(ids.insert(decoded.id.clone()), "ids are distinct");
        if let Some(first) = &first {
            prop_assert_eq!(&first.time, &decoded.time);
            prop_assert_eq!(&first.operation, &decoded.operation);
        } else {
            first = Some(decoded.clone());
        }
        if let Some(event) = reassembler.push(decoded).expect("segments fit together") {
            whole = Some(event);
        }
    }
    reassembler.finish().expect("nothing left open");
    let whole = whole.expect("the final segment completes the event");
    prop_assert_eq!(whole.segment_ids.len(), count);
    prop_assert!(
        whole.event.data == expected,
        "reassembled data differs from the original"
    );
    // The whole data also decodes: JSON text cut only at character boundaries.
    prop_assert!(whole.data_json(encoding).is_ok());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn json_segments_fit_and_reassemble(change in change(), kb in 128u32..=1024) {
        check_event(change, Encoding::Json, kb)?;
    }

    #[test]
    fn avro_segments_fit_and_reassemble(change in change(), kb in 128u32..=1024) {
        check_event(change, Encoding::Avro, kb)?;
    }

    #[test]
    fn smallest_limit_with_escape_heavy_text(
        unit in prop::collection::vec(prop::sample::select(&PIECES[..6]), 1..4),
        repeat in 10_000usize..80_000,
    ) {
        let mut row = employee(1, "a", "b");
        row[1] = Value::Text(unit.concat().repeat(repeat));
        let change = ChangeBuilder::new(employees(), Operation::Insert).current(row).build();
        check_event(change.clone(), Encoding::Json, 128)?;
        check_event(change, Encoding::Avro, 128)?;
    }
}

#[test]
fn values_over_one_mib_are_truncated_and_counted() {
    let mut row = employee(1, "a", "b");
    row[1] = Value::Text("😀".repeat(MAX_VALUE_TEXT_BYTES / 4 + 10));
    row[2] = Value::Text("x".repeat(MAX_VALUE_TEXT_BYTES));
    let change = ChangeBuilder::new(employees(), Operation::Update)
        .old(row.clone())
        .current(row)
        .build();
    let encoder = Encoder::new(options(
        Encoding::Json,
        FinalEventMode::LastInTransaction,
        1024,
    ));
    let encoded = encoder.encode(&change).expect("encodes");
    assert_eq!(encoded.truncated_values, 2, "FirstName in old and current");
    assert!(encoded.messages.len() > 4);
    let bytes: Vec<&[u8]> = encoded
        .messages
        .iter()
        .map(|m| m.bytes.as_slice())
        .collect();
    let events =
        mssql_ces::event::readback::reassemble(bytes, Encoding::Json).expect("reassembles");
    let data = events[0].data_json(Encoding::Json).expect("data is JSON");
    let current: serde_json::Value =
        serde_json::from_str(data["eventrow"]["current"].as_str().unwrap()).unwrap();
    assert_eq!(
        current["FirstName"].as_str().unwrap().len(),
        MAX_VALUE_TEXT_BYTES
    );
    assert_eq!(
        current["LastName"].as_str().unwrap().len(),
        MAX_VALUE_TEXT_BYTES
    );
}

/// Through `Encoder::encode`, in both encodings: text and binary values just under,
/// at and just over the 1 MiB CES keeps of a value's text form, and a 4-byte
/// character straddling the cut. What comes back is each value whole, or cut to the
/// limit (text at the last character boundary before it, binary on whole bytes),
/// and the count of cut values says how many.
#[test]
fn values_at_the_one_mib_limit_through_the_encoder() {
    const LIMIT: usize = MAX_VALUE_TEXT_BYTES;
    // (text, binary bytes, (text kept, binary hex digits kept), values cut)
    let straddling = format!("a{}", "😀".repeat(LIMIT / 4));
    let cases: Vec<(String, usize, (usize, usize), usize)> = vec![
        (
            "x".repeat(LIMIT - 1),
            (LIMIT - 2) / 2 - 1,
            (LIMIT - 1, LIMIT - 4),
            0,
        ),
        ("x".repeat(LIMIT), (LIMIT - 2) / 2, (LIMIT, LIMIT - 2), 0),
        (
            "x".repeat(LIMIT + 1),
            (LIMIT - 2) / 2 + 1,
            (LIMIT, LIMIT - 2),
            2,
        ),
        (straddling.clone(), LIMIT, (LIMIT - 3, LIMIT - 2), 2),
    ];
    for encoding in [Encoding::Json, Encoding::Avro] {
        let encoder = Encoder::new(options(encoding, FinalEventMode::LastInTransaction, 1024));
        for (text, binary, (text_kept, hex_kept), cut) in &cases {
            let row = vec![
                Value::BigInt(1),
                Value::Text(text.clone()),
                Value::Binary(vec![0xAB; *binary]),
                Value::Null,
                Value::Float(0.5),
            ];
            let change = ChangeBuilder::new(table(), Operation::Insert)
                .current(row)
                .build();
            let encoded = encoder.encode(&change).expect("encodes");
            assert_eq!(
                encoded.truncated_values,
                *cut,
                "{encoding:?}, {} text bytes",
                text.len()
            );
            let bytes: Vec<&[u8]> = encoded
                .messages
                .iter()
                .map(|m| m.bytes.as_slice())
                .collect();
            let events =
                mssql_ces::event::readback::reassemble(bytes, encoding).expect("reassembles");
            let data = events[0].data_json(encoding).expect("data");
            let current: serde_json::Value =
                serde_json::from_str(data["eventrow"]["current"].as_str().expect("text"))
                    .expect("row");
            let doc = current["Doc"].as_str().expect("Doc");
            let blob = current["Blob"].as_str().expect("Blob");
            assert_eq!(doc.len(), *text_kept, "{encoding:?}");
            assert!(text.starts_with(doc), "a prefix of the value");
            assert_eq!(
                blob.len(),
                2 + hex_kept,
                "{encoding:?}: 0x and the hex digits"
            );
            assert!(blob.starts_with("0xABAB"), "{}", &blob[..8]);
        }
    }
    // The straddling character is dropped whole: what is kept ends before it.
    assert!(straddling.is_char_boundary(LIMIT - 3) && !straddling.is_char_boundary(LIMIT));
}

/// Binary mode from the encoder's parts gives the messages that CloudEvents' Kafka
/// binding makes of the structured messages: each attribute of the structured
/// message, read back, as a `ce_` header, `datacontenttype` as `content-type`, and
/// `data` as the value; segmented exactly where the structured event is.
fn binary_paths_agree(change: &Change, encoding: Encoding, kb: u32) -> Result<bool, TestCaseError> {
    use mssql_ces::sink::OutgoingMessage;
    use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};
    let router = mssql_ces::sink::Router::new(
        "t",
        PartitionKeyScheme::PrimaryKey,
        None,
        CloudEventsMode::Binary,
        encoding,
        "s",
    );
    let options = options(encoding, FinalEventMode::LastInTransaction, kb);
    let structured = Encoder::new(options.clone())
        .encode(change)
        .expect("encodes");
    prop_assert!(!structured.data_only);
    let parts = Encoder::new(options)
        .data_only(true)
        .encode(change)
        .expect("encodes");
    prop_assert!(parts.data_only);
    prop_assert_eq!(
        parts.messages.len(),
        structured.messages.len(),
        "segmented alike"
    );
    let whole = structured.messages.len() == 1;
    let expected: Vec<OutgoingMessage> = structured
        .messages
        .iter()
        .map(|m| {
            let e = decode_message(&m.bytes, encoding).expect("structured message decodes");
            // The message id a destination of its own carries: the CloudEvent's.
            let message_id = Some(e.id.parse().expect("a UUID"));
            let headers = [
                ("ce_specversion", e.specversion),
                ("ce_type", e.event_type),
                ("ce_source", e.source),
                ("ce_id", e.id),
                ("ce_time", e.time),
                ("ce_logicalid", e.logicalid),
                ("ce_operation", e.operation),
                ("ce_segmentindex", e.segmentindex.to_string()),
                ("ce_finalsegment", e.finalsegment.to_string()),
                ("content-type", e.datacontenttype),
            ]
            .into_iter()
            .map(|(name, value)| (name, value.into_bytes()))
            .collect();
            OutgoingMessage {
                topic: "t".into(),
                key: router.key(change),
                partition_hint: None,
                headers,
                payload: e.data,
                message_id,
                tombstone: false,
            }
        })
        .collect();
    let from_parts = router.route(change, parts).expect("routes");
    prop_assert_eq!(expected, from_parts);
    // A structured event never reaches a binary-mode router: the pipeline builds
    // the encoder from the router.
    prop_assert!(router.route(change, structured).is_err());
    Ok(whole)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn binary_mode_from_parts_equals_binary_mode_from_the_message(
        change in change(),
        kb in 128u32..=1024,
        avro in any::<bool>(),
    ) {
        let encoding = if avro { Encoding::Avro } else { Encoding::Json };
        binary_paths_agree(&change, encoding, kb)?;
    }
}

/// At the limit: a message of exactly the limit is one message in both paths, one
/// byte more is segmented in both.
#[test]
fn binary_mode_paths_agree_at_the_size_limit() {
    for encoding in [Encoding::Json, Encoding::Avro] {
        let with_text = |len: usize| {
            let mut row = employee(1, "a", "b");
            row[1] = Value::Text("x".repeat(len));
            ChangeBuilder::new(employees(), Operation::Insert)
                .current(row)
                .build()
        };
        let limit = 128 * 1024;
        // Long enough that Avro's length prefixes have the width they have at the limit.
        let base_len = 100_000;
        let base = Encoder::new(options(encoding, FinalEventMode::LastInTransaction, 128))
            .encode(&with_text(base_len))
            .expect("encodes");
        let exact = base_len + limit - base.messages[0].bytes.len();
        let mut kinds = Vec::new();
        for len in exact - 2..=exact + 2 {
            let fast = binary_paths_agree(&with_text(len), encoding, 128)
                .unwrap_or_else(|e| panic!("{encoding:?} at {len}: {e}"));
            kinds.push(fast);
        }
        assert_eq!(kinds, [true, true, true, false, false], "{encoding:?}");
    }
}

//! Read-back of segmented events: reassembly, and clear errors for a missing segment,
//! a gap in indexes, events mixed together, and a stream that ends mid-event.

use crate::support;

use mssql_ces::event::readback::{ReadError, Reassembler, decode_json_message, reassemble};
use mssql_ces::event::{Encoder, Encoding, FinalEventMode, Message, Operation, Value};
use support::*;

/// A JSON event of `segments` segments (at 128 KiB each) with sequence number `seq`.
fn segmented(seq: u64, text_len: usize) -> Vec<Message> {
    let mut row = employee(1, "a", "b");
    row[1] = Value::Text("é".repeat(text_len / 2));
    let change = ChangeBuilder::new(employees(), Operation::Insert)
        .sequence(seq, true)
        .current(row)
        .build();
    Encoder::new(options(
        Encoding::Json,
        FinalEventMode::LastInTransaction,
        128,
    ))
    .encode(&change)
    .expect("encodes")
    .messages
}

fn feed(messages: &[&Message]) -> Result<usize, ReadError> {
    let mut reassembler = Reassembler::new();
    let mut complete = 0;
    for m in messages {
        let event = decode_json_message(&m.bytes).expect("decodes");
        if reassembler.push(event)?.is_some() {
            complete += 1;
        }
    }
    reassembler.finish()?;
    Ok(complete)
}

#[test]
fn whole_stream_reassembles() {
    let a = segmented(1, 300_000);
    let b = segmented(2, 10);
    assert_eq!(a.len(), 3);
    assert_eq!(b.len(), 1);
    let all: Vec<&[u8]> = a.iter().chain(&b).map(|m| m.bytes.as_slice()).collect();
    let events = reassemble(all, Encoding::Json).expect("reassembles");
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].segment_ids.len(), 3);
    assert!(events[0].event.finalsegment);
    assert!(events[0].data_json(Encoding::Json).is_ok());
}

#[test]
fn a_missing_segment_is_a_gap() {
    let a = segmented(1, 300_000);
    let err = feed(&[&a[0], &a[2]]).unwrap_err();
    assert!(
        matches!(
            err,
            ReadError::SegmentGap {
                expected: 1,
                found: 2,
                ..
            }
        ),
        "{err}"
    );
    let err = feed(&[&a[1], &a[2]]).unwrap_err();
    assert!(
        matches!(
            err,
            ReadError::SegmentGap {
                expected: 0,
                found: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn mixed_events_are_reported() {
    let a = segmented(1, 300_000);
    let b = segmented(2, 10);
    let err = feed(&[&a[0], &b[0], &a[1], &a[2]]).unwrap_err();
    assert!(
        matches!(err, ReadError::Interleaved { found_index: 0, .. }),
        "{err}"
    );
    assert!(err.to_string().contains(":00000000000000000001"), "{err}");
}

#[test]
fn an_unfinished_event_is_reported_at_the_end() {
    let a = segmented(1, 300_000);
    let err = feed(&[&a[0], &a[1]]).unwrap_err();
    assert!(
        matches!(err, ReadError::Incomplete { received: 2, .. }),
        "{err}"
    );
}

#[test]
fn a_resend_from_segment_zero_restarts_the_event() {
    // At-least-once: a producer that crashed mid-event re-sends it from the start.
    let a = segmented(1, 300_000);
    assert_eq!(feed(&[&a[0], &a[1], &a[0], &a[1], &a[2]]), Ok(1));
}

#[test]
fn a_resend_of_an_earlier_event_after_a_crash_abandons_the_partial_one() {
    // Crash after event 2's first segment; the restart re-sends from event 1.
    let one = segmented(1, 10);
    let two = segmented(2, 300_000);
    assert_eq!(
        feed(&[&one[0], &two[0], &one[0], &two[0], &two[1], &two[2]]),
        Ok(3)
    );
    // A later event in the middle of an earlier one is not a re-send.
    let three = segmented(3, 10);
    let err = feed(&[&two[0], &three[0]]).unwrap_err();
    assert!(matches!(err, ReadError::Interleaved { .. }), "{err}");
}

#[test]
fn a_segment_that_changes_attributes_is_reported() {
    let a = segmented(1, 300_000);
    let mut tampered: serde_json::Value = serde_json::from_slice(&a[1].bytes).unwrap();
    tampered["operation"] = "DEL".into();
    let mut reassembler = Reassembler::new();
    reassembler
        .push(decode_json_message(&a[0].bytes).unwrap())
        .unwrap();
    let err = reassembler
        .push(decode_json_message(&serde_json::to_vec(&tampered).unwrap()).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            ReadError::Inconsistent {
                attribute: "operation",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn malformed_messages_are_rejected() {
    assert!(matches!(
        decode_json_message(b"{}"),
        Err(ReadError::Json { .. })
    ));
    assert!(matches!(
        mssql_ces::event::readback::decode_avro_message(&[1, 2, 3]),
        Err(ReadError::Avro { .. })
    ));
    let a = segmented(1, 10);
    let mut extra: serde_json::Value = serde_json::from_slice(&a[0].bytes).unwrap();
    extra["unexpected"] = 1.into();
    assert!(decode_json_message(&serde_json::to_vec(&extra).unwrap()).is_err());
}

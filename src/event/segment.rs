//! Truncation of large values and segmentation of large events (`docs/src/event-format.md`, *Truncation and segmentation*).
//!
//! Order matters and matches CES: first every value whose text form exceeds 1 MiB is
//! cut to at most 1 MiB ([`truncate_row`]), then `data` is serialized, then the message
//! is split so that every message sent — envelope included — is at most
//! `max_message_size_kb` × 1024 bytes.
//!
//! Invariants of the segments of one event: indexes 0, 1, 2… without gaps,
//! `finalsegment` true only on the last, every other attribute repeated, a distinct
//! id each, and the concatenation of their `data` equal to the unsegmented `data`
//! (JSON: text cut at character boundaries; Avro: byte ranges).

use uuid::Uuid;

use super::value::Value;
use super::{EnvelopeFields, EventError, Message, avro, json};

/// Largest text form of a single value, in UTF-8 bytes (1 MiB).
pub const MAX_VALUE_TEXT_BYTES: usize = 1_048_576;

/// The smallest and largest `max_message_size_kb` CES allows.
pub const MESSAGE_SIZE_KB_RANGE: std::ops::RangeInclusive<u32> = 128..=1024;
/// CES's default `max_message_size_kb`.
pub const DEFAULT_MESSAGE_SIZE_KB: u32 = 256;

/// `max_message_size_kb`, validated to CES's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageSizeLimit(u32);

/// A `max_message_size_kb` outside CES's range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "max_message_size_kb = {value} is outside the allowed range {min}..={max} (KiB per message, as in CES)",
    min = MESSAGE_SIZE_KB_RANGE.start(),
    max = MESSAGE_SIZE_KB_RANGE.end()
)]
pub struct MessageSizeError {
    pub value: u32,
}

impl MessageSizeLimit {
    pub fn from_kb(kb: u32) -> Result<Self, MessageSizeError> {
        if MESSAGE_SIZE_KB_RANGE.contains(&kb) {
            Ok(MessageSizeLimit(kb))
        } else {
            Err(MessageSizeError { value: kb })
        }
    }

    pub fn kb(self) -> u32 {
        self.0
    }

    /// The limit in bytes.
    pub fn bytes(self) -> usize {
        self.0 as usize * 1024
    }
}

impl Default for MessageSizeLimit {
    fn default() -> Self {
        MessageSizeLimit(DEFAULT_MESSAGE_SIZE_KB)
    }
}

impl serde::Serialize for MessageSizeLimit {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u32(self.0)
    }
}

impl schemars::JsonSchema for MessageSizeLimit {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MessageSizeLimit".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "integer",
            "minimum": MESSAGE_SIZE_KB_RANGE.start(),
            "maximum": MESSAGE_SIZE_KB_RANGE.end()
        })
    }
}

impl<'de> serde::Deserialize<'de> for MessageSizeLimit {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let kb = u32::deserialize(deserializer)?;
        MessageSizeLimit::from_kb(kb).map_err(serde::de::Error::custom)
    }
}

/// True when the value's text form is longer than [`MAX_VALUE_TEXT_BYTES`].
pub fn exceeds_value_limit(value: &Value) -> bool {
    match value {
        Value::Text(s) => s.len() > MAX_VALUE_TEXT_BYTES,
        Value::Binary(b) => 2 + 2 * b.len() > MAX_VALUE_TEXT_BYTES,
        _ => false,
    }
}

/// Cuts every value in `row` whose text form exceeds [`MAX_VALUE_TEXT_BYTES`]; returns
/// how many were cut. Text is cut at a character boundary; binary is cut on whole
/// bytes so that `0x` plus the hex digits is at most 1 MiB.
pub fn truncate_row(row: &mut [Value]) -> usize {
    let mut truncated = 0;
    for value in row {
        match value {
            Value::Text(s) if s.len() > MAX_VALUE_TEXT_BYTES => {
                let mut cut = MAX_VALUE_TEXT_BYTES;
                while !s.is_char_boundary(cut) {
                    cut -= 1;
                }
                s.truncate(cut);
                truncated += 1;
            }
            Value::Binary(b) if 2 + 2 * b.len() > MAX_VALUE_TEXT_BYTES => {
                b.truncate((MAX_VALUE_TEXT_BYTES - 2) / 2);
                truncated += 1;
            }
            _ => {}
        }
    }
    truncated
}

/// Room for data in a segment, or an error when the envelope leaves too little (a
/// 4-byte character or a 6-byte `\u00XX` escape must always fit).
fn capacity(limit: usize, overhead: usize) -> Result<usize, EventError> {
    match limit.checked_sub(overhead) {
        Some(available) if available >= 16 => Ok(available),
        available => Err(EventError::EnvelopeTooLarge {
            overhead,
            available: available.unwrap_or(0),
        }),
    }
}

/// Splits a JSON event whose single message would exceed `limit` bytes into messages
/// of at most `limit` bytes. With `data_only`, each message holds its part of `data`
/// alone, cut where the structured message would be.
pub(crate) fn split_json(
    fields: &EnvelopeFields<'_>,
    data: &str,
    limit: usize,
    id_for: impl Fn(u32) -> Uuid,
    data_only: bool,
) -> Result<Vec<Message>, EventError> {
    let mut messages = Vec::new();
    let mut rest = data;
    let mut index = 0u32;
    while !rest.is_empty() {
        // Sized as a non-final segment: `false` is one byte longer than `true`.
        let room = capacity(limit, json::envelope_overhead(fields, index, false))?;
        let mut used = 0;
        let mut cut = rest.len();
        for (at, c) in rest.char_indices() {
            let len = json::escaped_len(c);
            if used + len > room {
                cut = at;
                break;
            }
            used += len;
        }
        let (chunk, tail) = rest.split_at(cut);
        let final_segment = tail.is_empty();
        let id = id_for(index);
        messages.push(Message {
            id,
            segment_index: index,
            final_segment,
            bytes: if data_only {
                chunk.as_bytes().to_vec()
            } else {
                json::envelope(fields, &id, index, final_segment, chunk)
            },
        });
        rest = tail;
        index += 1;
    }
    Ok(messages)
}

/// Splits an Avro event whose single message would exceed `limit` bytes into
/// messages of at most `limit` bytes. With `data_only`, each message holds its byte
/// range of `data` alone, cut where the structured message would be.
pub(crate) fn split_avro(
    fields: &EnvelopeFields<'_>,
    data: &[u8],
    limit: usize,
    id_for: impl Fn(u32) -> Uuid,
    data_only: bool,
) -> Result<Vec<Message>, EventError> {
    let mut messages = Vec::new();
    let mut rest = data;
    let mut index = 0u32;
    while !rest.is_empty() {
        let room = capacity(limit, avro::envelope_overhead(fields, index, false)?)?;
        // The largest chunk whose length prefix and bytes fit in `room`.
        let mut take = rest.len().min(room - avro::long_len(room as i64));
        while take < rest.len() && take + 1 + avro::long_len(take as i64 + 1) <= room {
            take += 1;
        }
        let (chunk, tail) = rest.split_at(take);
        let final_segment = tail.is_empty();
        let id = id_for(index);
        messages.push(Message {
            id,
            segment_index: index,
            final_segment,
            bytes: if data_only {
                chunk.to_vec()
            } else {
                avro::envelope(fields, &id, index, final_segment, chunk)?
            },
        });
        rest = tail;
        index += 1;
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_size_is_validated_and_named() {
        assert_eq!(
            MessageSizeLimit::from_kb(128).map(|l| l.bytes()),
            Ok(131_072)
        );
        assert_eq!(MessageSizeLimit::from_kb(1024).map(|l| l.kb()), Ok(1024));
        assert_eq!(MessageSizeLimit::default().bytes(), 256 * 1024);
        for bad in [0, 127, 1025, 2000] {
            let err = MessageSizeLimit::from_kb(bad).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("max_message_size_kb"), "{text}");
            assert!(text.contains(&bad.to_string()), "{text}");
        }
        let parsed: Result<MessageSizeLimit, _> = serde_json::from_str("2000");
        assert!(
            parsed
                .unwrap_err()
                .to_string()
                .contains("max_message_size_kb")
        );
    }

    #[test]
    fn text_is_cut_at_a_character_boundary() {
        // 1 MiB - 1 byte of ASCII then a 4-byte character straddling the limit.
        let mut text = "a".repeat(MAX_VALUE_TEXT_BYTES - 1);
        text.push('😀');
        text.push_str("tail");
        let mut row = vec![Value::Text(text), Value::Int(1), Value::Null];
        assert_eq!(truncate_row(&mut row), 1);
        let Value::Text(cut) = &row[0] else {
            panic!("not text")
        };
        assert_eq!(cut.len(), MAX_VALUE_TEXT_BYTES - 1);
        assert!(cut.chars().all(|c| c == 'a'));
        // Exactly 1 MiB is kept whole.
        let mut row = vec![Value::Text("é".repeat(MAX_VALUE_TEXT_BYTES / 2))];
        assert_eq!(truncate_row(&mut row), 0);
        assert_eq!(row[0].text_len(), MAX_VALUE_TEXT_BYTES);
    }

    #[test]
    fn binary_is_cut_before_hex_formatting() {
        let mut row = vec![Value::Binary(vec![0xAB; MAX_VALUE_TEXT_BYTES])];
        assert_eq!(truncate_row(&mut row), 1);
        assert_eq!(row[0].text_len(), MAX_VALUE_TEXT_BYTES);
        assert!(row[0].text_len() <= MAX_VALUE_TEXT_BYTES);
        let Value::Binary(b) = &row[0] else {
            panic!("not binary")
        };
        assert_eq!(b.len(), (MAX_VALUE_TEXT_BYTES - 2) / 2);
        // The largest binary that fits is left alone.
        let mut row = vec![Value::Binary(vec![1; (MAX_VALUE_TEXT_BYTES - 2) / 2])];
        assert_eq!(truncate_row(&mut row), 0);
    }

    #[test]
    fn the_value_limit_is_1_mib_of_text_form_for_text_and_binary_alike() {
        let text = |len: usize| Value::Text("a".repeat(len));
        assert!(!exceeds_value_limit(&text(MAX_VALUE_TEXT_BYTES)));
        assert!(exceeds_value_limit(&text(MAX_VALUE_TEXT_BYTES + 1)));
        // Binary's text form is `0x` and two hex digits a byte: 524,287 bytes make
        // exactly 1 MiB, one more byte is over.
        let binary = |len: usize| Value::Binary(vec![0xAB; len]);
        let fits = (MAX_VALUE_TEXT_BYTES - 2) / 2;
        assert!(!exceeds_value_limit(&binary(fits)));
        assert!(exceeds_value_limit(&binary(fits + 1)));
        assert!(!exceeds_value_limit(&Value::Int(1)));
        // One byte over is cut back to what fits, and counted.
        let mut row = vec![binary(fits + 1), text(MAX_VALUE_TEXT_BYTES + 1)];
        assert_eq!(truncate_row(&mut row), 2);
        assert_eq!(row[0].text_len(), MAX_VALUE_TEXT_BYTES);
        assert_eq!(row[1].text_len(), MAX_VALUE_TEXT_BYTES);
    }

    #[test]
    fn a_segment_needs_room_for_the_longest_character_escape() {
        assert_eq!(capacity(1000, 984), Ok(16));
        assert!(matches!(
            capacity(1000, 985),
            Err(EventError::EnvelopeTooLarge {
                overhead: 985,
                available: 15
            })
        ));
        assert!(matches!(
            capacity(100, 200),
            Err(EventError::EnvelopeTooLarge {
                overhead: 200,
                available: 0
            })
        ));
    }

    fn fields() -> EnvelopeFields<'static> {
        EnvelopeFields {
            event_type: crate::event::EVENT_TYPE,
            logical_id: "1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0:000000B1000008A80007:00000000000000000001",
            time: "2026-08-07T16:25:00.883Z",
            content_type: "application/json",
            operation: "INS",
        }
    }

    #[test]
    fn json_segments_are_filled_to_the_byte_the_limit_allows() {
        let data = "x".repeat(300_000);
        let limit = 128 * 1024;
        let messages = split_json(
            &fields(),
            &data,
            limit,
            |i| Uuid::from_u128(u128::from(i)),
            false,
        )
        .unwrap();
        let (last, full) = messages.split_last().unwrap();
        assert!(!full.is_empty());
        for m in full {
            // One-byte characters: a segment ends exactly at the limit.
            assert_eq!(m.bytes.len(), limit, "segment {}", m.segment_index);
        }
        assert!(last.bytes.len() <= limit && last.final_segment);
        // Data alone is cut where the structured messages are.
        let parts = split_json(
            &fields(),
            &data,
            limit,
            |i| Uuid::from_u128(u128::from(i)),
            true,
        )
        .unwrap();
        assert_eq!(parts.len(), messages.len());
        let joined: Vec<u8> = parts.iter().flat_map(|m| m.bytes.clone()).collect();
        assert_eq!(joined, data.as_bytes());
    }

    #[test]
    fn avro_segments_take_the_largest_chunk_whose_length_prefix_still_fits() {
        let fields = EnvelopeFields {
            event_type: crate::event::EVENT_TYPE,
            content_type: "application/avro",
            ..fields()
        };
        let overhead = avro::envelope_overhead(&fields, 0, false).unwrap();
        // Room just past a varint boundary: 8,193 bytes of room need a 3-byte prefix
        // for a chunk that size, but 8,191 bytes with a 2-byte prefix fit exactly.
        let limit = overhead + 8_193;
        let data = vec![7u8; 20_000];
        let messages = split_avro(
            &fields,
            &data,
            limit,
            |i| Uuid::from_u128(u128::from(i)),
            false,
        )
        .unwrap();
        assert_eq!(
            messages[0].bytes.len(),
            limit,
            "the first segment fills the limit"
        );
        let parts = split_avro(
            &fields,
            &data,
            limit,
            |i| Uuid::from_u128(u128::from(i)),
            true,
        )
        .unwrap();
        assert_eq!(parts[0].bytes.len(), 8_191);
        let joined: Vec<u8> = parts.iter().flat_map(|m| m.bytes.clone()).collect();
        assert_eq!(joined, data);
        // One byte more room: 8,192 bytes would need a 3-byte prefix (8,195 > 8,194),
        // so the chunk stays 8,191 and the segment one byte short of the limit,
        // never over it.
        let limit = overhead + 8_194;
        let id = |i| Uuid::from_u128(u128::from(i));
        let messages = split_avro(&fields, &data, limit, id, false).unwrap();
        assert!(messages.iter().all(|m| m.bytes.len() <= limit));
        assert_eq!(messages[0].bytes.len(), limit - 1);
        let parts = split_avro(&fields, &data, limit, id, true).unwrap();
        assert_eq!(parts[0].bytes.len(), 8_191);
    }
}

//! The Avro encoding of CES events.
//!
//! A message is one Avro binary datum of the `ChangeEvent` schema, and its `data` is
//! one Avro binary datum of the `Data` schema (no container file, no single-object
//! header). Both schemas are shipped in `schemas/` exactly as the CES documentation
//! gives them. The writer below emits the binary encoding directly — records are their
//! fields in order, strings and bytes are a zig-zag varint length then the bytes, an
//! array is one block (count, items) then a zero count — and the tests decode its
//! output with `apache-avro` against the shipped schemas.

use std::sync::OnceLock;

use apache_avro::Schema;

use super::value::Value;
use super::{Change, ColumnDescription, EVENT_SOURCE, EnvelopeFields, EventError, SPEC_VERSION};

/// The `ChangeEvent` schema text, as shipped.
pub const CHANGE_EVENT_SCHEMA: &str = include_str!("../../schemas/ChangeEvent.avsc");
/// The `Data` schema text, as shipped.
pub const DATA_SCHEMA: &str = include_str!("../../schemas/Data.avsc");

/// Why a shipped schema did not parse (a build defect, reported rather than panicking).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the shipped Avro schema {name} does not parse: {message}")]
pub struct SchemaError {
    name: &'static str,
    message: String,
}

pub(crate) fn parsed(
    cell: &'static OnceLock<Result<Schema, String>>,
    name: &'static str,
    text: &str,
) -> Result<&'static Schema, SchemaError> {
    cell.get_or_init(|| Schema::parse_str(text).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|message| SchemaError {
            name,
            message: message.clone(),
        })
}

/// The parsed `ChangeEvent` schema.
pub fn change_event_schema() -> Result<&'static Schema, SchemaError> {
    static CELL: OnceLock<Result<Schema, String>> = OnceLock::new();
    parsed(&CELL, "ChangeEvent.avsc", CHANGE_EVENT_SCHEMA)
}

/// The parsed `Data` schema.
pub fn data_schema() -> Result<&'static Schema, SchemaError> {
    static CELL: OnceLock<Result<Schema, String>> = OnceLock::new();
    parsed(&CELL, "Data.avsc", DATA_SCHEMA)
}

/// Reads one raw binary datum of `schema` from the front of `reader` (the reference
/// decoder, used to read messages back and to check our writer in tests).
pub fn read_datum(
    schema: &Schema,
    reader: &mut &[u8],
) -> Result<apache_avro::types::Value, apache_avro::Error> {
    apache_avro::reader::datum::GenericDatumReader::builder(schema)
        .build()?
        .read_value(reader)
}

/// Appends a `long` (or `int`): zig-zag, then base-128 varint.
pub(crate) fn write_long(out: &mut Vec<u8>, value: i64) {
    let mut n = ((value << 1) ^ (value >> 63)) as u64;
    while n >= 0x80 {
        out.push((n as u8 & 0x7F) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Bytes that [`write_long`] takes for `value`.
pub fn long_len(value: i64) -> usize {
    let mut n = ((value << 1) ^ (value >> 63)) as u64;
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

fn write_len(out: &mut Vec<u8>, len: usize) {
    // Lengths come from in-memory buffers, far below i64::MAX.
    write_long(out, len as i64);
}

/// Appends a `bytes` value.
fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    write_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Appends a `string` value.
pub(crate) fn write_string(out: &mut Vec<u8>, s: &str) {
    write_bytes(out, s.as_bytes());
}

fn write_bool(out: &mut Vec<u8>, b: bool) {
    out.push(u8::from(b));
}

fn int_field(field: &'static str, value: u64) -> Result<i64, EventError> {
    i32::try_from(value)
        .map(i64::from)
        .map_err(|_| EventError::AvroIntOverflow { field, value })
}

/// The table-dependent start of the Data datum: db, schema, tbl and cols.
pub(crate) fn eventsource_prefix(
    database: &str,
    schema: &str,
    table: &str,
    columns: &[ColumnDescription],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + columns.len() * 32);
    write_string(&mut out, database);
    write_string(&mut out, schema);
    write_string(&mut out, table);
    if !columns.is_empty() {
        write_len(&mut out, columns.len());
        for column in columns {
            write_string(&mut out, &column.name);
            write_string(&mut out, &column.type_label());
            write_long(&mut out, i64::from(column.index));
        }
    }
    write_long(&mut out, 0);
    out
}

/// The Data datum of a change.
pub fn data_datum(
    change: &Change,
    committime: &str,
    final_event: bool,
) -> Result<Vec<u8>, EventError> {
    let table = &change.table;
    let old = super::json::row_text(table, change.old.as_deref());
    let current = super::json::row_text(table, change.current.as_deref());
    let mut out = Vec::with_capacity(table.avro_prefix().len() + 128 + old.len() + current.len());
    out.extend_from_slice(table.avro_prefix());
    let keys: Vec<(&str, &Value)> = change.key_values().collect();
    if !keys.is_empty() {
        write_len(&mut out, keys.len());
        let mut text = String::new();
        for (name, value) in keys {
            write_string(&mut out, name);
            // The schema's `value` is a non-null string: a NULL key part (possible only
            // in a unique index) is written as the empty string.
            text.clear();
            value.write_text(&mut text);
            write_string(&mut out, &text);
        }
    }
    write_long(&mut out, 0);
    write_string(&mut out, &change.commit_lsn.to_colon_string());
    write_string(&mut out, &change.begin_lsn.to_colon_string());
    write_long(
        &mut out,
        int_field("sequencenumber", change.sequence_number)?,
    );
    write_bool(&mut out, final_event);
    write_string(&mut out, committime);
    write_string(&mut out, &old);
    write_string(&mut out, &current);
    Ok(out)
}

/// The `ChangeEvent` datum up to (not including) `data`.
fn envelope_head(
    out: &mut Vec<u8>,
    fields: &EnvelopeFields<'_>,
    id: &uuid::Uuid,
    segment_index: u32,
    final_segment: bool,
) -> Result<(), EventError> {
    write_string(out, SPEC_VERSION);
    write_string(out, fields.event_type);
    write_string(out, EVENT_SOURCE);
    let mut buf = uuid::Uuid::encode_buffer();
    write_string(out, id.hyphenated().encode_lower(&mut buf));
    write_string(out, fields.logical_id);
    write_string(out, fields.time);
    write_string(out, fields.content_type);
    write_string(out, fields.operation);
    write_long(out, int_field("segmentindex", u64::from(segment_index))?);
    write_bool(out, final_segment);
    Ok(())
}

/// A whole Avro message whose `data` is `chunk`.
pub(crate) fn envelope(
    fields: &EnvelopeFields<'_>,
    id: &uuid::Uuid,
    segment_index: u32,
    final_segment: bool,
    chunk: &[u8],
) -> Result<Vec<u8>, EventError> {
    let mut out = Vec::with_capacity(200 + chunk.len());
    envelope_head(&mut out, fields, id, segment_index, final_segment)?;
    write_bytes(&mut out, chunk);
    Ok(out)
}

/// Bytes of a message before its `data` value (length prefix and bytes).
pub(crate) fn envelope_overhead(
    fields: &EnvelopeFields<'_>,
    segment_index: u32,
    final_segment: bool,
) -> Result<usize, EventError> {
    let mut out = Vec::with_capacity(200);
    envelope_head(
        &mut out,
        fields,
        &uuid::Uuid::nil(),
        segment_index,
        final_segment,
    )?;
    Ok(out.len())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;
    use super::*;
    use apache_avro::types::Value as AvroValue;

    #[test]
    fn shipped_schemas_parse() {
        assert!(change_event_schema().is_ok());
        assert!(data_schema().is_ok());
    }

    #[test]
    fn longs_match_the_avro_spec() {
        // Examples from the Avro specification's zig-zag table.
        for (value, bytes) in [
            (0i64, vec![0x00]),
            (-1, vec![0x01]),
            (1, vec![0x02]),
            (-2, vec![0x03]),
            (2, vec![0x04]),
            (-64, vec![0x7f]),
            (64, vec![0x80, 0x01]),
        ] {
            let mut out = Vec::new();
            write_long(&mut out, value);
            assert_eq!(out, bytes, "{value}");
            assert_eq!(long_len(value), bytes.len());
        }
        for value in [i64::MIN, i64::MAX, 1 << 40, -(1 << 40)] {
            let mut out = Vec::new();
            write_long(&mut out, value);
            assert_eq!(out.len(), long_len(value));
            let decoded = read_datum(&Schema::Long, &mut out.as_slice()).unwrap();
            assert_eq!(decoded, AvroValue::Long(value));
        }
    }

    #[test]
    fn data_datum_decodes_with_the_shipped_schema() {
        let change = insert(employees(), employee_row(8, "Nikola", "Nikolić"));
        let bytes = data_datum(&change, "2026-08-07T16:25:00.890Z", false).unwrap();
        let schema = data_schema().unwrap();
        let value = read_datum(schema, &mut bytes.as_slice()).unwrap();
        let json = serde_json::Value::try_from(value).unwrap();
        let expected: serde_json::Value =
            serde_json::from_str(&json::data_text(&change, "2026-08-07T16:25:00.890Z", false))
                .unwrap();
        assert_eq!(json, expected);
    }

    #[test]
    fn sequence_numbers_beyond_an_avro_int_are_an_error() {
        let mut change = insert(employees(), employee_row(8, "a", "b"));
        change.sequence_number = u64::from(u32::MAX);
        assert!(matches!(
            data_datum(&change, "t", false),
            Err(EventError::AvroIntOverflow {
                field: "sequencenumber",
                ..
            })
        ));
    }
}

//! The JSON encoding of CES events.
//!
//! CES nests JSON three deep: the envelope's `data` attribute is a JSON *string* whose
//! text is the Data object, and inside it `eventrow.old` and `eventrow.current` are
//! strings whose text is a JSON object mapping column names to values. We write the
//! text directly (no intermediate tree) because this is the hot path; the tests parse
//! every level back with `serde_json` to prove the output is what CES writes.
//!
//! Key order follows the CES documentation's examples: envelope attributes in the order
//! of the CloudEvent schema, `eventsource` (db, schema, tbl, cols, pkkey, transaction)
//! then `eventrow` (old, current), row columns in table order.

use std::fmt::Write as _;

use super::value::Value;
use super::{Change, ColumnDescription, EVENT_SOURCE, EVENT_TYPE, EnvelopeFields, SPEC_VERSION};

/// Appends `s` as a JSON string literal, quotes included.
pub fn push_string(out: &mut String, s: &str) {
    out.push('"');
    push_escaped(out, s);
    out.push('"');
}

/// Appends the JSON escaping of `s` (no quotes): `"`, `\` and control characters are
/// escaped; everything else, non-ASCII included, is written as UTF-8.
pub fn push_escaped(out: &mut String, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !needs_escape(b) {
            continue;
        }
        out.push_str(&s[start..i]);
        push_escape_sequence(out, b);
        start = i + 1;
    }
    out.push_str(&s[start..]);
}

fn needs_escape(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

fn push_escape_sequence(out: &mut String, b: u8) {
    match b {
        b'"' => out.push_str("\\\""),
        b'\\' => out.push_str("\\\\"),
        b'\n' => out.push_str("\\n"),
        b'\r' => out.push_str("\\r"),
        b'\t' => out.push_str("\\t"),
        0x08 => out.push_str("\\b"),
        0x0C => out.push_str("\\f"),
        other => {
            let _ = write!(out, "\\u{other:04x}");
        }
    }
}

/// Bytes that `c` takes once escaped by [`push_escaped`].
pub fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{08}' | '\u{0C}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// `"name":`, escaped: the key of a column in a row object.
pub(crate) fn object_key(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 3);
    push_string(&mut out, name);
    out.push(':');
    out
}

/// The table-dependent start of the Data text, up to and including `"pkkey":`.
pub(crate) fn eventsource_prefix(
    database: &str,
    schema: &str,
    table: &str,
    columns: &[ColumnDescription],
) -> String {
    let mut out = String::with_capacity(128 + columns.len() * 48);
    out.push_str("{\"eventsource\":{\"db\":");
    push_string(&mut out, database);
    out.push_str(",\"schema\":");
    push_string(&mut out, schema);
    out.push_str(",\"tbl\":");
    push_string(&mut out, table);
    out.push_str(",\"cols\":[");
    for (i, column) in columns.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"name\":");
        push_string(&mut out, &column.name);
        out.push_str(",\"type\":");
        push_string(&mut out, &column.sql_type.to_string());
        let _ = write!(out, ",\"index\":{}}}", column.index);
    }
    out.push_str("],\"pkkey\":");
    out
}

/// Appends a value as a JSON string literal (or `null`).
fn push_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Text(s) => push_string(out, s),
        // Every other text form is plain ASCII with nothing to escape.
        other => {
            out.push('"');
            other.write_text(out);
            out.push('"');
        }
    }
}

/// The row object text, `{"Id":"8",...}`; `{}` for a missing image.
pub(crate) fn row_text(keys: &[String], row: Option<&[Value]>) -> String {
    let Some(row) = row else {
        return "{}".to_owned();
    };
    let mut out = String::with_capacity(2 + row.len() * 24);
    out.push('{');
    for (i, (key, value)) in keys.iter().zip(row).enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(key);
        push_value(&mut out, value);
    }
    out.push('}');
    out
}

/// The Data object's JSON text: what the envelope's `data` string holds.
pub fn data_text(change: &Change, committime: &str, final_event: bool) -> String {
    let table = &change.table;
    let old = row_text(table.row_keys_json(), change.old.as_deref());
    let current = row_text(table.row_keys_json(), change.current.as_deref());
    let mut out =
        String::with_capacity(table.json_prefix().len() + 256 + 2 * (old.len() + current.len()));
    out.push_str(table.json_prefix());
    out.push('[');
    for (i, (name, value)) in change.key_values().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"columnname\":");
        push_string(&mut out, name);
        out.push_str(",\"value\":");
        push_value(&mut out, value);
        out.push('}');
    }
    out.push_str("],\"transaction\":{\"commitlsn\":\"");
    change.commit_lsn.write_colon(&mut out);
    out.push_str("\",\"beginlsn\":\"");
    change.begin_lsn.write_colon(&mut out);
    let _ = write!(
        out,
        "\",\"sequencenumber\":{},\"finalevent\":{},\"committime\":",
        change.sequence_number, final_event
    );
    push_string(&mut out, committime);
    out.push_str("}},\"eventrow\":{\"old\":");
    push_string(&mut out, &old);
    out.push_str(",\"current\":");
    push_string(&mut out, &current);
    out.push_str("}}");
    out
}

/// The envelope text before the `data` string's contents.
fn envelope_head(
    out: &mut String,
    fields: &EnvelopeFields<'_>,
    id: &uuid::Uuid,
    segment_index: u32,
    final_segment: bool,
) {
    out.push_str("{\"specversion\":\"");
    out.push_str(SPEC_VERSION);
    out.push_str("\",\"type\":\"");
    out.push_str(EVENT_TYPE);
    out.push_str("\",\"source\":\"");
    out.push_str(EVENT_SOURCE);
    out.push_str("\",\"id\":\"");
    let mut buf = uuid::Uuid::encode_buffer();
    out.push_str(id.hyphenated().encode_lower(&mut buf));
    out.push_str("\",\"logicalid\":");
    push_string(out, fields.logical_id);
    out.push_str(",\"time\":");
    push_string(out, fields.time);
    out.push_str(",\"datacontenttype\":");
    push_string(out, fields.content_type);
    out.push_str(",\"operation\":");
    push_string(out, fields.operation);
    let _ = write!(
        out,
        ",\"segmentindex\":{segment_index},\"finalsegment\":{final_segment},\"data\":\""
    );
}

const ENVELOPE_TAIL: &str = "\"}";

/// A whole JSON message whose `data` string holds `data_chunk` (unescaped text).
pub(crate) fn envelope(
    fields: &EnvelopeFields<'_>,
    id: &uuid::Uuid,
    segment_index: u32,
    final_segment: bool,
    data_chunk: &str,
) -> Vec<u8> {
    let mut out = String::with_capacity(320 + data_chunk.len() + data_chunk.len() / 4);
    envelope_head(&mut out, fields, id, segment_index, final_segment);
    push_escaped(&mut out, data_chunk);
    out.push_str(ENVELOPE_TAIL);
    out.into_bytes()
}

/// Bytes of a message with an empty `data` string.
pub(crate) fn envelope_overhead(
    fields: &EnvelopeFields<'_>,
    segment_index: u32,
    final_segment: bool,
) -> usize {
    let mut out = String::with_capacity(320);
    envelope_head(
        &mut out,
        fields,
        &uuid::Uuid::nil(),
        segment_index,
        final_segment,
    );
    out.len() + ENVELOPE_TAIL.len()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn escaping_matches_a_json_parser() {
        let nasty = "q\"b\\s/\n\r\t\u{08}\u{0C}\u{01}\u{1F}\u{7F}é😀\u{2028}";
        let mut out = String::new();
        push_string(&mut out, nasty);
        let back: String = serde_json::from_str(&out).unwrap();
        assert_eq!(back, nasty);
        let sized: usize = nasty.chars().map(escaped_len).sum();
        assert_eq!(sized + 2, out.len());
    }

    #[test]
    fn data_has_ces_structure_with_nested_strings() {
        let change = insert(employees(), employee_row(8, "Nikola", "Nik\"olic"));
        let text = data_text(&change, "2026-08-07T16:25:00.890Z", true);
        let data: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(data["eventsource"]["db"], "EmployeesDb");
        assert_eq!(
            data["eventsource"]["cols"][1],
            json!({"name": "FirstName", "type": "nvarchar(50)", "index": 1})
        );
        assert_eq!(
            data["eventsource"]["pkkey"],
            json!([{"columnname": "Id", "value": "8"}])
        );
        assert_eq!(data["eventsource"]["transaction"]["finalevent"], true);
        assert_eq!(data["eventrow"]["old"], "{}");
        let current: serde_json::Value =
            serde_json::from_str(data["eventrow"]["current"].as_str().unwrap()).unwrap();
        assert_eq!(current["LastName"], "Nik\"olic");
        assert_eq!(current["SignupDate"], "2026-08-07 16:25:00.8833333");
    }

    #[test]
    fn null_values_are_json_null() {
        let mut row = employee_row(8, "a", "b");
        row[2] = Value::Null;
        let text = row_text(employees().row_keys_json(), Some(&row));
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["LastName"], serde_json::Value::Null);
        assert_eq!(parsed["Id"], "8");
    }

    #[test]
    fn overhead_is_the_size_of_an_empty_data_message() {
        let fields = EnvelopeFields {
            logical_id: "g:000000B1000008A80007:00000000000000000001",
            time: "2026-08-07T16:25:00.890Z",
            content_type: JSON_CONTENT_TYPE,
            operation: "UPD",
        };
        let id = Uuid::new_v4();
        for (index, last) in [(0, true), (9, false), (10, true), (123_456, false)] {
            assert_eq!(
                envelope(&fields, &id, index, last, "").len(),
                envelope_overhead(&fields, index, last)
            );
        }
    }
}

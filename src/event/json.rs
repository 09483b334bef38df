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
use std::sync::OnceLock;

use super::value::Value;
use super::{
    Change, ColumnDescription, EVENT_SOURCE, EnvelopeFields, SPEC_VERSION, TableDescription,
};

/// How many times text may be escaped by [`push_escaped_n`]: the value text inside a
/// row object, inside `data`, inside the envelope.
pub const MAX_ESCAPE_LEVELS: usize = 3;

/// Appends `s` as a JSON string literal, quotes included.
fn push_string(out: &mut String, s: &str) {
    push_string_at(out, s, 0);
}

/// Appends the JSON escaping of `s` (no quotes): `"`, `\` and control characters are
/// escaped; everything else, non-ASCII included, is written as UTF-8.
fn push_escaped(out: &mut String, s: &str) {
    push_escaped_n(out, s, 1);
}

fn needs_escape(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

fn escape_once(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// `TABLE[n - 1][b]`: byte `b` (a quote, backslash or control character) escaped `n`
/// times. Escaping `n` times in one pass is what makes CES's three-deep nesting cheap.
fn escape_table() -> &'static [[String; 128]; MAX_ESCAPE_LEVELS] {
    static TABLE: OnceLock<[[String; 128]; MAX_ESCAPE_LEVELS]> = OnceLock::new();
    TABLE.get_or_init(|| {
        std::array::from_fn(|level| {
            std::array::from_fn(|b| {
                let mut text = char::from(b as u8).to_string();
                if needs_escape(b as u8) {
                    for _ in 0..=level {
                        let mut next = String::with_capacity(text.len() * 2);
                        escape_once(&mut next, &text);
                        text = next;
                    }
                }
                text
            })
        })
    })
}

/// Appends `s` escaped `levels` times (0: as is). `levels` is at most
/// [`MAX_ESCAPE_LEVELS`]; deeper levels are escaped the slow way, one pass each.
fn push_escaped_n(out: &mut String, s: &str, levels: usize) {
    if levels == 0 {
        out.push_str(s);
        return;
    }
    if levels > MAX_ESCAPE_LEVELS {
        let mut inner = String::with_capacity(s.len() * 2);
        push_escaped_n(&mut inner, s, levels - 1);
        let mut text = String::with_capacity(inner.len() * 2);
        escape_once(&mut text, &inner);
        out.push_str(&text);
        return;
    }
    let table = &escape_table()[levels - 1];
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Skip eight clean bytes at a time; most text has nothing to escape.
        if let Some(chunk) = bytes.get(i..i + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            if !word_needs_escape(u64::from_le_bytes(word)) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        if needs_escape(b) {
            out.push_str(&s[start..i]);
            out.push_str(&table[usize::from(b)]);
            start = i + 1;
        }
        i += 1;
    }
    out.push_str(&s[start..]);
}

/// Whether any of the eight bytes of `word` is a quote, a backslash or a control
/// character. Exact when it says no; a yes may be a false alarm (then the bytes are
/// checked one by one).
fn word_needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS != 0;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS != 0;
    below_space
        || has_zero(word ^ (ONES * u64::from(b'"')))
        || has_zero(word ^ (ONES * u64::from(b'\\')))
}

/// `"` escaped 0, 1, 2 and 3 times.
const QUOTES: [&str; MAX_ESCAPE_LEVELS + 1] = ["\"", "\\\"", "\\\\\\\"", "\\\\\\\\\\\\\\\""];

/// A `"` as it appears in text that will be nested `depth` strings deep.
fn push_quote(out: &mut String, depth: usize) {
    match QUOTES.get(depth) {
        Some(quote) => out.push_str(quote),
        None => push_escaped_n(out, "\"", depth),
    }
}

/// A string literal written `depth` strings deep: its quotes are escaped `depth`
/// times and its contents `depth + 1` times.
pub fn push_string_at(out: &mut String, s: &str, depth: usize) {
    push_quote(out, depth);
    push_escaped_n(out, s, depth + 1);
    push_quote(out, depth);
}

/// Bytes that `text` takes once escaped by [`push_escaped`].
pub fn escaped_size(text: &str) -> usize {
    text.len()
        + text
            .bytes()
            .map(|b| match b {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0C => 1,
                b if b < 0x20 => 5,
                _ => 0,
            })
            .sum::<usize>()
}

/// Bytes that `c` takes once escaped by [`push_escaped`].
pub fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{08}' | '\u{0C}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// The table-dependent start of the Data text, up to and including `"pkkey":`,
/// written `depth` strings deep.
pub(crate) fn eventsource_prefix(
    database: &str,
    schema: &str,
    table: &str,
    columns: &[ColumnDescription],
    depth: usize,
) -> String {
    let mut out = String::with_capacity(128 + columns.len() * 48);
    let key = |out: &mut String, name: &str| {
        push_string_at(out, name, depth);
        out.push(':');
    };
    out.push('{');
    key(&mut out, "eventsource");
    out.push('{');
    for (i, (name, value)) in [("db", database), ("schema", schema), ("tbl", table)]
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            out.push(',');
        }
        key(&mut out, name);
        push_string_at(&mut out, value, depth);
    }
    out.push(',');
    key(&mut out, "cols");
    out.push('[');
    for (i, column) in columns.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('{');
        key(&mut out, "name");
        push_string_at(&mut out, &column.name, depth);
        out.push(',');
        key(&mut out, "type");
        push_string_at(&mut out, &column.type_label(), depth);
        out.push(',');
        key(&mut out, "index");
        let _ = write!(out, "{}}}", column.index);
    }
    out.push_str("],");
    key(&mut out, "pkkey");
    out
}

/// Appends a value as a JSON string literal (or `null`), `depth` strings deep.
fn push_value(out: &mut String, value: &Value, depth: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Text(s) => push_string_at(out, s, depth),
        // Every other text form is plain ASCII with nothing to escape.
        other => {
            push_quote(out, depth);
            other.write_text(out);
            push_quote(out, depth);
        }
    }
}

/// `"name":` written `depth` strings deep: a key of a row object.
pub(crate) fn object_key(name: &str, depth: usize) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    push_string_at(&mut out, name, depth);
    out.push(':');
    out
}

/// Appends the row object, `{"Id":"8",...}` (`{}` for a missing image), `depth`
/// strings deep; `keys` are the table's row keys at that depth.
fn push_row(out: &mut String, keys: &[String], row: Option<&[Value]>, depth: usize) {
    out.push('{');
    for (i, (key, value)) in keys.iter().zip(row.unwrap_or_default()).enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(key);
        push_value(out, value, depth);
    }
    out.push('}');
}

/// The row object text at depth 0: what `eventrow.old`/`current` hold.
pub(crate) fn row_text(table: &TableDescription, row: Option<&[Value]>) -> String {
    let mut out = String::with_capacity(2 + row.map_or(0, |r| r.len() * 24));
    push_row(&mut out, table.row_keys(0), row, 0);
    out
}

/// Appends the Data object `depth` strings deep (0: the text itself; 1: as the
/// contents of the envelope's `data` string).
fn push_data(out: &mut String, change: &Change, committime: &str, final_event: bool, depth: usize) {
    let table = &change.table;
    let key = |out: &mut String, name: &str| {
        push_string_at(out, name, depth);
        out.push(':');
    };
    out.push_str(table.json_prefix(depth));
    out.push('[');
    for (i, (name, value)) in change.key_values().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('{');
        key(out, "columnname");
        push_string_at(out, name, depth);
        out.push(',');
        key(out, "value");
        push_value(out, value, depth);
        out.push('}');
    }
    out.push_str("],");
    key(out, "transaction");
    out.push('{');
    key(out, "commitlsn");
    push_quote(out, depth);
    change.commit_lsn.write_colon(out);
    push_quote(out, depth);
    out.push(',');
    key(out, "beginlsn");
    push_quote(out, depth);
    change.begin_lsn.write_colon(out);
    push_quote(out, depth);
    out.push(',');
    key(out, "sequencenumber");
    out.push_str(itoa::Buffer::new().format(change.sequence_number));
    out.push(',');
    key(out, "finalevent");
    out.push_str(if final_event { "true" } else { "false" });
    out.push(',');
    key(out, "committime");
    push_string_at(out, committime, depth);
    out.push_str("}},");
    key(out, "eventrow");
    out.push('{');
    key(out, "old");
    push_quote(out, depth);
    push_row(
        out,
        table.row_keys(depth + 1),
        change.old.as_deref(),
        depth + 1,
    );
    push_quote(out, depth);
    out.push(',');
    key(out, "current");
    push_quote(out, depth);
    push_row(
        out,
        table.row_keys(depth + 1),
        change.current.as_deref(),
        depth + 1,
    );
    push_quote(out, depth);
    out.push_str("}}");
}

/// The Data object's JSON text: what the envelope's `data` string holds.
pub fn data_text(change: &Change, committime: &str, final_event: bool) -> String {
    let mut out = String::with_capacity(change.table.json_prefix(0).len() + 512);
    push_data(&mut out, change, committime, final_event, 0);
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
    out.push_str(fields.event_type);
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
    out.push_str(",\"segmentindex\":");
    out.push_str(itoa::Buffer::new().format(segment_index));
    out.push_str(if final_segment {
        ",\"finalsegment\":true,\"data\":\""
    } else {
        ",\"finalsegment\":false,\"data\":\""
    });
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

/// The whole single-segment message of a change, written in one pass: `data` is
/// written directly in its escaped form rather than built and escaped afterwards.
pub(crate) fn single_message(
    fields: &EnvelopeFields<'_>,
    id: &uuid::Uuid,
    change: &Change,
    final_event: bool,
) -> Vec<u8> {
    let mut out = String::with_capacity(1024 + change.table.json_prefix(1).len());
    envelope_head(&mut out, fields, id, 0, true);
    push_data(&mut out, change, fields.time, final_event, 1);
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
    fn the_word_check_never_misses_a_byte_to_escape() {
        for b in 0..=255u8 {
            for position in 0..8 {
                let mut word = *b"abcdefgh";
                word[position] = b;
                let flagged = word_needs_escape(u64::from_le_bytes(word));
                if needs_escape(b) {
                    assert!(flagged, "byte {b:#x} at {position}");
                }
            }
        }
        assert!(!word_needs_escape(u64::from_le_bytes(*b"plain te")));
        assert!(!word_needs_escape(u64::from_le_bytes(
            "é😀ab".as_bytes().try_into().unwrap()
        )));
    }

    #[test]
    fn escaping_matches_a_json_parser() {
        let nasty = "q\"b\\s/\n\r\t\u{08}\u{0C}\u{01}\u{1F}\u{7F}é😀\u{2028}";
        let mut out = String::new();
        push_string(&mut out, nasty);
        let back: String = serde_json::from_str(&out).unwrap();
        assert_eq!(back, nasty);
        let sized: usize = nasty.chars().map(escaped_len).sum();
        assert_eq!(sized + 2, out.len());
        for (depth, quote) in QUOTES.iter().enumerate() {
            let mut slow = String::new();
            push_escaped_n(&mut slow, "\"", depth);
            assert_eq!(*quote, slow, "quote at depth {depth}");
        }
        // Escaping n times in one pass equals escaping once, n times over.
        for levels in 1..=MAX_ESCAPE_LEVELS + 1 {
            let mut once_each = nasty.to_owned();
            for _ in 0..levels {
                let mut next = String::new();
                escape_once(&mut next, &once_each);
                once_each = next;
            }
            let mut direct = String::new();
            push_escaped_n(&mut direct, nasty, levels);
            assert_eq!(direct, once_each, "{levels} levels");
        }
    }

    #[test]
    fn the_one_pass_message_equals_data_text_escaped_into_the_envelope() {
        let mut row = employee_row(8, "Ni\"k\\o\nla😀", "\u{1}");
        row[2] = Value::Null;
        let mut change = insert(employees(), row.clone());
        change.operation = Operation::Update;
        change.old = Some(row);
        let fields = EnvelopeFields {
            event_type: crate::event::EVENT_TYPE,
            logical_id: "g:000000B1000008A80007:00000000000000000001",
            time: "2026-08-07T16:25:00.890Z",
            content_type: JSON_CONTENT_TYPE,
            operation: "UPD",
        };
        let id = Uuid::new_v4();
        let data = data_text(&change, fields.time, true);
        assert_eq!(
            single_message(&fields, &id, &change, true),
            envelope(&fields, &id, 0, true, &data)
        );
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
        let text = row_text(&employees(), Some(&row));
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["LastName"], serde_json::Value::Null);
        assert_eq!(parsed["Id"], "8");
    }

    #[test]
    fn overhead_is_the_size_of_an_empty_data_message() {
        let fields = EnvelopeFields {
            event_type: crate::event::EVENT_TYPE,
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

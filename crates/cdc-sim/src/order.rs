//! Key order in the simulator: how SQL Server sorts the values of a key's types, so
//! that a keyset-paginated read of a simulated table meets rows in the order the real
//! server's `ORDER BY` would give.
//!
//! Modelled: numbers by value (`decimal` within one column's scale), `float`/`real`
//! by value, date and time types by time (`datetimeoffset` by its UTC instant),
//! `uniqueidentifier` the way SQL Server compares it — the last six bytes first, then
//! the groups before them from right to left (*Comparing GUID and uniqueidentifier
//! values*, SQL Server docs) — binary by bytes, and NULL before everything. Text is
//! compared by code point, as a binary (`_BIN2`) collation does; the case- and
//! accent-insensitive collations of real servers are not modelled, which is why the
//! loader never compares keys itself but always asks the source for the rows after one.

use chrono::DateTime;
use uuid::Uuid;

use mssql_ces::event::Value;
use mssql_ces::event::value::SqlType;

/// One value's place in key order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeyPart {
    Null,
    /// Integers, `bit`, and `decimal`/`money` unscaled (one column has one scale).
    Number(i128),
    /// `float`/`real`, mapped so that integer order is numeric order.
    Float(i64),
    /// Date and time types with a fixed text layout per column, and text.
    Text(String),
    /// `datetimeoffset`: nanoseconds since 1970 UTC.
    Instant(i128),
    Bytes(Vec<u8>),
}

/// A row's place in its table's key order.
pub type SortKey = Vec<KeyPart>;

/// `f64` to an `i64` whose order is the number's (total order, `-0.0 < 0.0`).
fn float_order(f: f64) -> i64 {
    let bits = f.to_bits() as i64;
    bits ^ (((bits >> 63) as u64) >> 1) as i64
}

/// SQL Server's comparison order of a `uniqueidentifier`'s bytes (in the order of its
/// text form): bytes 10–15, then 8–9, 6–7, 4–5 and 0–3.
fn guid_order(guid: &Uuid) -> Vec<u8> {
    let b = guid.as_bytes();
    [&b[10..16], &b[8..10], &b[6..8], &b[4..6], &b[0..4]].concat()
}

/// The key part of a value.
pub fn part(value: &Value) -> KeyPart {
    match value {
        Value::Null => KeyPart::Null,
        Value::Bit(b) => KeyPart::Number(i128::from(*b)),
        Value::TinyInt(n) => KeyPart::Number(i128::from(*n)),
        Value::SmallInt(n) => KeyPart::Number(i128::from(*n)),
        Value::Int(n) => KeyPart::Number(i128::from(*n)),
        Value::BigInt(n) => KeyPart::Number(i128::from(*n)),
        Value::Decimal { unscaled, .. } => KeyPart::Number(*unscaled),
        Value::Float(f) => KeyPart::Float(float_order(*f)),
        Value::Real(f) => KeyPart::Float(float_order(f64::from(*f))),
        Value::DateTimeOffset { value, .. } => KeyPart::Instant(
            value
                .timestamp_nanos_opt()
                .map_or(i128::from(value.timestamp()) * 1_000_000_000, i128::from),
        ),
        Value::Guid(g) => KeyPart::Bytes(guid_order(g)),
        Value::Binary(b) => KeyPart::Bytes(b.clone()),
        Value::Text(t) => KeyPart::Text(t.clone()),
        other => KeyPart::Text(other.to_text().unwrap_or_default()),
    }
}

/// The key part of a value given as its text form (what a load's checkpoint holds)
/// with its column's type; `None` when the text is not a value of that type.
pub fn part_of_text(sql_type: SqlType, text: Option<&str>) -> Option<KeyPart> {
    let Some(text) = text else {
        return Some(KeyPart::Null);
    };
    Some(match sql_type {
        SqlType::Bit | SqlType::TinyInt | SqlType::SmallInt | SqlType::Int | SqlType::BigInt => {
            KeyPart::Number(text.parse().ok()?)
        }
        SqlType::Decimal { .. } | SqlType::Money | SqlType::SmallMoney => {
            KeyPart::Number(text.replacen('.', "", 1).parse().ok()?)
        }
        SqlType::Float => KeyPart::Float(float_order(text.parse().ok()?)),
        SqlType::Real => KeyPart::Float(float_order(f64::from(text.parse::<f32>().ok()?))),
        SqlType::DateTimeOffset { .. } => {
            let value = DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f %:z").ok()?;
            KeyPart::Instant(i128::from(value.timestamp_nanos_opt()?))
        }
        SqlType::UniqueIdentifier => KeyPart::Bytes(guid_order(&Uuid::parse_str(text).ok()?)),
        SqlType::Binary(_) | SqlType::VarBinary(_) => {
            let hex = text.strip_prefix("0x")?;
            KeyPart::Bytes(
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                    .collect::<Option<Vec<u8>>>()?,
            )
        }
        _ => KeyPart::Text(text.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{FixedOffset, NaiveDate, TimeZone};
    use mssql_ces::event::value::Length;

    #[test]
    fn values_and_their_text_forms_sort_alike() {
        let at = |h, offset_hours| {
            FixedOffset::east_opt(offset_hours * 3600)
                .unwrap()
                .from_local_datetime(
                    &NaiveDate::from_ymd_opt(2026, 1, 1)
                        .unwrap()
                        .and_hms_opt(h, 0, 0)
                        .unwrap(),
                )
                .unwrap()
        };
        let cases: Vec<(SqlType, Vec<Value>)> = vec![
            (
                SqlType::Int,
                vec![Value::Null, Value::Int(-10), Value::Int(9), Value::Int(10)],
            ),
            (
                SqlType::Decimal {
                    precision: 9,
                    scale: 2,
                },
                vec![
                    Value::Decimal {
                        unscaled: -150,
                        scale: 2,
                    },
                    Value::Decimal {
                        unscaled: 5,
                        scale: 2,
                    },
                    Value::Decimal {
                        unscaled: 100,
                        scale: 2,
                    },
                ],
            ),
            (
                SqlType::Float,
                vec![Value::Float(-2.5), Value::Float(0.1), Value::Float(3.0)],
            ),
            (
                SqlType::DateTimeOffset { scale: 0 },
                // 10:00 at +02:00 is 08:00 UTC: before 09:00 UTC.
                vec![
                    Value::DateTimeOffset {
                        value: at(10, 2),
                        scale: 0,
                    },
                    Value::DateTimeOffset {
                        value: at(9, 0),
                        scale: 0,
                    },
                ],
            ),
            (
                SqlType::UniqueIdentifier,
                // The last group decides first.
                vec![
                    Value::Guid(Uuid::parse_str("FFFFFFFF-FFFF-FFFF-FFFF-000000000001").unwrap()),
                    Value::Guid(Uuid::parse_str("00000000-0000-0000-0000-000000000002").unwrap()),
                ],
            ),
            (
                SqlType::VarBinary(Length::Bounded(4)),
                vec![
                    Value::Binary(vec![0x01]),
                    Value::Binary(vec![0x01, 0x00]),
                    Value::Binary(vec![0x02]),
                ],
            ),
            (
                SqlType::NVarChar(Length::Bounded(5)),
                vec![
                    Value::Text("A".into()),
                    Value::Text("B".into()),
                    Value::Text("a".into()),
                ],
            ),
        ];
        for (sql_type, values) in cases {
            for pair in values.windows(2) {
                assert!(part(&pair[0]) < part(&pair[1]), "{sql_type}: {pair:?}");
            }
            for value in &values {
                assert_eq!(
                    part_of_text(sql_type, value.to_text().as_deref()),
                    Some(part(value)),
                    "{sql_type}: {value:?}"
                );
            }
        }
        assert_eq!(part_of_text(SqlType::Int, Some("x")), None);
        assert_eq!(
            part_of_text(SqlType::VarBinary(Length::Max), Some("0xZZ")),
            None
        );
    }
}

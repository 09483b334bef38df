//! tiberius `ColumnData` → our [`Value`], as pure functions.
//!
//! The TDS wire forms are decoded here rather than through tiberius's conversions,
//! which lose facts we need: its `Decimal` conversion panics above 28 digits (we keep
//! the `i128` and scale), and its chrono conversions drop the column scale. Dates and
//! times follow the TDS definitions: `datetime` is days since 1900-01-01 plus 1/300 s
//! ticks, `smalldatetime` days since 1900-01-01 plus minutes, `date` days since
//! 0001-01-01, `time` increments of 10^-scale s since midnight, and `datetimeoffset`
//! the UTC date and time plus an offset in minutes.

use chrono::{DateTime, Duration, FixedOffset, NaiveDate, NaiveDateTime, NaiveTime};
use tiberius::ColumnData;

use crate::event::value::{SqlType, Value};
use crate::lsn::Lsn;

/// A column value that does not match its catalog type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column `{column}`: {message}")]
pub struct DecodeError {
    pub column: String,
    pub message: String,
}

fn mismatch(column: &str, sql_type: &SqlType, data: &ColumnData<'_>) -> DecodeError {
    DecodeError {
        column: column.to_owned(),
        message: format!("a {sql_type} column arrived as {}", variant_name(data)),
    }
}

fn out_of_range(column: &str, what: &str) -> DecodeError {
    DecodeError {
        column: column.to_owned(),
        message: format!("{what} is out of range"),
    }
}

fn variant_name(data: &ColumnData<'_>) -> &'static str {
    match data {
        ColumnData::U8(_) => "U8",
        ColumnData::I16(_) => "I16",
        ColumnData::I32(_) => "I32",
        ColumnData::I64(_) => "I64",
        ColumnData::F32(_) => "F32",
        ColumnData::F64(_) => "F64",
        ColumnData::Bit(_) => "Bit",
        ColumnData::String(_) => "String",
        ColumnData::Guid(_) => "Guid",
        ColumnData::Binary(_) => "Binary",
        ColumnData::Numeric(_) => "Numeric",
        ColumnData::Xml(_) => "Xml",
        ColumnData::DateTime(_) => "DateTime",
        ColumnData::SmallDateTime(_) => "SmallDateTime",
        ColumnData::Time(_) => "Time",
        ColumnData::Date(_) => "Date",
        ColumnData::DateTime2(_) => "DateTime2",
        ColumnData::DateTimeOffset(_) => "DateTimeOffset",
    }
}

fn epoch_1900() -> NaiveDate {
    NaiveDate::from_ymd_opt(1900, 1, 1).unwrap_or_default()
}

fn epoch_0001() -> NaiveDate {
    NaiveDate::from_ymd_opt(1, 1, 1).unwrap_or_default()
}

/// `date`: days since 0001-01-01.
fn date_from_days(days: u32) -> Option<NaiveDate> {
    epoch_0001().checked_add_signed(Duration::days(i64::from(days)))
}

/// `time(scale)`: `increments` of 10^-scale seconds since midnight.
fn time_from_increments(increments: u64, scale: u8) -> Option<NaiveTime> {
    if scale > 7 {
        return None;
    }
    let nanos_per_increment = 10u64.pow(9 - u32::from(scale));
    let nanos = increments.checked_mul(nanos_per_increment)?;
    let seconds = nanos / 1_000_000_000;
    if seconds >= 86_400 {
        return None;
    }
    NaiveTime::from_num_seconds_from_midnight_opt(
        u32::try_from(seconds).ok()?,
        u32::try_from(nanos % 1_000_000_000).ok()?,
    )
}

/// `datetime`: days since 1900-01-01 (negative back to 1753) and 1/300 s ticks since
/// midnight, kept to the millisecond SQL Server prints (ticks 1 and 2 are .003 and
/// .007: 10/3 ms per tick, rounded).
pub fn datetime_from_ticks(days: i32, ticks: u32) -> Option<NaiveDateTime> {
    if ticks >= 300 * 86_400 {
        return None;
    }
    let date = epoch_1900().checked_add_signed(Duration::days(i64::from(days)))?;
    let millis = (u64::from(ticks) * 10 + 1) / 3;
    date.and_hms_opt(0, 0, 0)?
        .checked_add_signed(Duration::milliseconds(i64::try_from(millis).ok()?))
}

/// A time as a `datetime` column keeps it (`cdc.lsn_time_mapping.tran_end_time`,
/// `cdc.change_tables.create_date`): rounded to the nearest 1/300 s tick and read
/// back as [`datetime_from_ticks`] reads a tick count.
pub fn as_datetime_column(t: NaiveDateTime) -> NaiveDateTime {
    let midnight = t.date().and_time(NaiveTime::MIN);
    let nanos = (t - midnight).num_nanoseconds().unwrap_or(0);
    let ticks = (nanos * 300 + 500_000_000) / 1_000_000_000;
    midnight + Duration::milliseconds((ticks * 10 + 1) / 3)
}

/// `smalldatetime`: days since 1900-01-01 and minutes since midnight.
fn smalldatetime_from_parts(days: u16, minutes: u16) -> Option<NaiveDateTime> {
    if minutes >= 24 * 60 {
        return None;
    }
    let date = epoch_1900().checked_add_signed(Duration::days(i64::from(days)))?;
    date.and_hms_opt(0, 0, 0)?
        .checked_add_signed(Duration::minutes(i64::from(minutes)))
}

/// Decodes one value of a column of type `sql_type`.
fn decode_value(
    column: &str,
    sql_type: &SqlType,
    data: ColumnData<'_>,
) -> Result<Value, DecodeError> {
    use ColumnData as C;
    use SqlType as T;
    let bad = |data: &ColumnData<'_>| mismatch(column, sql_type, data);
    let value = match (sql_type, data) {
        (T::Bit, C::Bit(v)) => v.map(Value::Bit),
        (T::TinyInt, C::U8(v)) => v.map(Value::TinyInt),
        (T::SmallInt, C::I16(v)) => v.map(Value::SmallInt),
        (T::Int, C::I32(v)) => v.map(Value::Int),
        (T::BigInt, C::I64(v)) => v.map(Value::BigInt),
        (T::Decimal { .. } | T::Numeric { .. } | T::Money | T::SmallMoney, C::Numeric(v)) => {
            v.map(|n| Value::Decimal {
                unscaled: n.value(),
                scale: n.scale(),
            })
        }
        // Money read without the decimal(19,4) cast arrives as a lossy f64; it is only
        // accepted when it converts back exactly to a whole number of 1/10000 units.
        (T::Money | T::SmallMoney, C::F64(v)) => match v {
            None => None,
            Some(f) => {
                let scaled = (f * 10_000.0).round();
                if !scaled.is_finite() || scaled.abs() > 9.2e18 {
                    return Err(out_of_range(column, "money"));
                }
                Some(Value::Decimal {
                    unscaled: scaled as i128,
                    scale: 4,
                })
            }
        },
        (T::Float, C::F64(v)) => v.map(Value::Float),
        (T::Real, C::F32(v)) => v.map(Value::Real),
        (T::Date, C::Date(v)) => match v {
            None => None,
            Some(d) => Some(Value::Date(
                date_from_days(d.days()).ok_or_else(|| out_of_range(column, "date"))?,
            )),
        },
        (T::Time { scale }, C::Time(v)) => match v {
            None => None,
            Some(t) => Some(Value::Time {
                value: time_from_increments(t.increments(), t.scale())
                    .ok_or_else(|| out_of_range(column, "time"))?,
                scale: *scale,
            }),
        },
        (T::DateTime, C::DateTime(v)) => match v {
            None => None,
            Some(dt) => Some(Value::DateTime(
                datetime_from_ticks(dt.days(), dt.seconds_fragments())
                    .ok_or_else(|| out_of_range(column, "datetime"))?,
            )),
        },
        (T::SmallDateTime, C::SmallDateTime(v)) => match v {
            None => None,
            Some(dt) => Some(Value::SmallDateTime(
                smalldatetime_from_parts(dt.days(), dt.seconds_fragments())
                    .ok_or_else(|| out_of_range(column, "smalldatetime"))?,
            )),
        },
        (T::DateTime2 { scale }, C::DateTime2(v)) => match v {
            None => None,
            Some(dt) => {
                let date = date_from_days(dt.date().days());
                let time = time_from_increments(dt.time().increments(), dt.time().scale());
                let value = date
                    .zip(time)
                    .map(|(d, t)| d.and_time(t))
                    .ok_or_else(|| out_of_range(column, "datetime2"))?;
                Some(Value::DateTime2 {
                    value,
                    scale: *scale,
                })
            }
        },
        (T::DateTimeOffset { scale }, C::DateTimeOffset(v)) => match v {
            None => None,
            Some(dto) => {
                let dt = dto.datetime2();
                let utc = date_from_days(dt.date().days())
                    .zip(time_from_increments(
                        dt.time().increments(),
                        dt.time().scale(),
                    ))
                    .map(|(d, t)| d.and_time(t))
                    .ok_or_else(|| out_of_range(column, "datetimeoffset"))?;
                let offset = FixedOffset::east_opt(i32::from(dto.offset()) * 60)
                    .ok_or_else(|| out_of_range(column, "datetimeoffset offset"))?;
                Some(Value::DateTimeOffset {
                    value: DateTime::from_naive_utc_and_offset(utc, offset),
                    scale: *scale,
                })
            }
        },
        (T::UniqueIdentifier, C::Guid(v)) => v.map(Value::Guid),
        (T::Char(_) | T::VarChar(_) | T::NChar(_) | T::NVarChar(_), C::String(v)) => {
            v.map(|s| Value::Text(s.into_owned()))
        }
        (T::Binary(_) | T::VarBinary(_), C::Binary(v)) => v.map(|b| Value::Binary(b.into_owned())),
        (_, other) => return Err(bad(&other)),
    };
    Ok(value.unwrap_or(Value::Null))
}

/// Text that arrives as UTF-16LE bytes (the change query casts every text column so):
/// the string, and whether an invalid sequence (a lone surrogate, legal in UCS-2
/// `nvarchar`) was replaced with U+FFFD. An odd byte count is an error.
fn decode_utf16(column: &str, bytes: &[u8]) -> Result<(String, bool), DecodeError> {
    if !bytes.len().is_multiple_of(2) {
        return Err(DecodeError {
            column: column.to_owned(),
            message: format!("{} bytes cannot be UTF-16", bytes.len()),
        });
    }
    // Mostly ASCII: each unit's high byte 0 and its low byte below 0x80 is that
    // byte in UTF-8, without decoding characters.
    if bytes
        .chunks_exact(2)
        .all(|pair| pair[1] == 0 && pair[0] < 0x80)
    {
        let ascii: Vec<u8> = bytes.iter().step_by(2).copied().collect();
        // Every byte is below 0x80: valid UTF-8.
        return match String::from_utf8(ascii) {
            Ok(text) => Ok((text, false)),
            Err(e) => Err(DecodeError {
                column: column.to_owned(),
                message: e.to_string(),
            }),
        };
    }
    let units = bytes
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]));
    let mut replaced = false;
    let text = char::decode_utf16(units)
        .map(|c| {
            c.unwrap_or_else(|_| {
                replaced = true;
                char::REPLACEMENT_CHARACTER
            })
        })
        .collect();
    Ok((text, replaced))
}

/// Decodes one value of a change row: as [`decode_value`], and text of every kind
/// also from its UTF-16LE bytes. The flag says that invalid UTF-16 was replaced.
pub fn decode_change_value(
    column: &str,
    sql_type: &SqlType,
    data: ColumnData<'_>,
) -> Result<(Value, bool), DecodeError> {
    use SqlType as T;
    match (sql_type, data) {
        (T::Char(_) | T::VarChar(_) | T::NChar(_) | T::NVarChar(_), ColumnData::Binary(v)) => {
            match v {
                None => Ok((Value::Null, false)),
                Some(bytes) => {
                    let (text, replaced) = decode_utf16(column, &bytes)?;
                    Ok((Value::Text(text), replaced))
                }
            }
        }
        (_, data) => Ok((decode_value(column, sql_type, data)?, false)),
    }
}

/// An LSN column (`binary(10)`); `None` for NULL.
pub fn decode_lsn(column: &str, data: ColumnData<'_>) -> Result<Option<Lsn>, DecodeError> {
    match data {
        ColumnData::Binary(None) => Ok(None),
        ColumnData::Binary(Some(bytes)) => {
            Lsn::from_bytes(&bytes).map(Some).map_err(|e| DecodeError {
                column: column.to_owned(),
                message: e.to_string(),
            })
        }
        other => Err(DecodeError {
            column: column.to_owned(),
            message: format!("an LSN arrived as {}", variant_name(&other)),
        }),
    }
}

/// A `binary`/`varbinary` column as bytes (empty for NULL).
pub fn decode_bytes(column: &str, data: ColumnData<'_>) -> Result<Vec<u8>, DecodeError> {
    match data {
        ColumnData::Binary(v) => Ok(v.map(|b| b.into_owned()).unwrap_or_default()),
        other => Err(DecodeError {
            column: column.to_owned(),
            message: format!("expected bytes, got {}", variant_name(&other)),
        }),
    }
}

/// An integer column of any width.
pub fn decode_int(column: &str, data: ColumnData<'_>) -> Result<Option<i64>, DecodeError> {
    match data {
        ColumnData::U8(v) => Ok(v.map(i64::from)),
        ColumnData::I16(v) => Ok(v.map(i64::from)),
        ColumnData::I32(v) => Ok(v.map(i64::from)),
        ColumnData::I64(v) => Ok(v),
        ColumnData::Bit(v) => Ok(v.map(i64::from)),
        other => Err(DecodeError {
            column: column.to_owned(),
            message: format!("expected an integer, got {}", variant_name(&other)),
        }),
    }
}

/// A text column; `None` for NULL.
pub fn decode_string(column: &str, data: ColumnData<'_>) -> Result<Option<String>, DecodeError> {
    match data {
        ColumnData::String(v) => Ok(v.map(|s| s.into_owned())),
        other => Err(DecodeError {
            column: column.to_owned(),
            message: format!("expected text, got {}", variant_name(&other)),
        }),
    }
}

/// A `datetime`/`datetime2`/`smalldatetime` column as a local date-time.
pub fn decode_naive_datetime(
    column: &str,
    data: ColumnData<'_>,
) -> Result<Option<NaiveDateTime>, DecodeError> {
    let value = match data {
        ColumnData::DateTime(None)
        | ColumnData::DateTime2(None)
        | ColumnData::SmallDateTime(None) => return Ok(None),
        ref d @ ColumnData::DateTime(_) => decode_value(column, &SqlType::DateTime, d.clone())?,
        ref d @ ColumnData::DateTime2(_) => {
            decode_value(column, &SqlType::DateTime2 { scale: 7 }, d.clone())?
        }
        ref d @ ColumnData::SmallDateTime(_) => {
            decode_value(column, &SqlType::SmallDateTime, d.clone())?
        }
        other => {
            return Err(DecodeError {
                column: column.to_owned(),
                message: format!("expected a date-time, got {}", variant_name(&other)),
            });
        }
    };
    Ok(match value {
        Value::DateTime(v) | Value::SmallDateTime(v) | Value::DateTime2 { value: v, .. } => Some(v),
        _ => None,
    })
}

/// A `uniqueidentifier` column; `None` for NULL.
pub fn decode_guid(column: &str, data: ColumnData<'_>) -> Result<Option<uuid::Uuid>, DecodeError> {
    match data {
        ColumnData::Guid(v) => Ok(v),
        other => Err(DecodeError {
            column: column.to_owned(),
            message: format!("expected a GUID, got {}", variant_name(&other)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::value::Length;
    use std::borrow::Cow;
    use tiberius::numeric::Numeric;
    use tiberius::time::{Date, DateTime2, DateTimeOffset, SmallDateTime, Time};

    fn text(sql_type: SqlType, data: ColumnData<'static>) -> String {
        decode_value("c", &sql_type, data)
            .expect("decodes")
            .to_text()
            .unwrap_or_else(|| "<null>".into())
    }

    #[test]
    fn integers_bit_and_null() {
        assert_eq!(text(SqlType::TinyInt, ColumnData::U8(Some(255))), "255");
        assert_eq!(text(SqlType::SmallInt, ColumnData::I16(Some(-5))), "-5");
        assert_eq!(
            text(SqlType::Int, ColumnData::I32(Some(i32::MIN))),
            "-2147483648"
        );
        assert_eq!(
            text(SqlType::BigInt, ColumnData::I64(Some(i64::MAX))),
            i64::MAX.to_string()
        );
        assert_eq!(text(SqlType::Bit, ColumnData::Bit(Some(true))), "1");
        assert_eq!(text(SqlType::Int, ColumnData::I32(None)), "<null>");
    }

    #[test]
    fn numeric_with_38_digits_keeps_every_digit() {
        let max = 10i128.pow(38) - 1;
        let decimal = |p, s| SqlType::Decimal {
            precision: p,
            scale: s,
        };
        assert_eq!(
            text(
                decimal(38, 0),
                ColumnData::Numeric(Some(Numeric::new_with_scale(max, 0)))
            ),
            "9".repeat(38)
        );
        assert_eq!(
            text(
                decimal(38, 38),
                ColumnData::Numeric(Some(Numeric::new_with_scale(-max, 38)))
            ),
            format!("-0.{}", "9".repeat(38))
        );
        assert_eq!(
            text(
                decimal(18, 2),
                ColumnData::Numeric(Some(Numeric::new_with_scale(-1050, 2)))
            ),
            "-10.50"
        );
        // money cast to decimal(19,4) in the query.
        assert_eq!(
            text(
                SqlType::Money,
                ColumnData::Numeric(Some(Numeric::new_with_scale(i64::MIN.into(), 4)))
            ),
            "-922337203685477.5808"
        );
        assert_eq!(
            text(SqlType::SmallMoney, ColumnData::F64(Some(-1.5))),
            "-1.5000"
        );
    }

    #[test]
    fn floats() {
        assert_eq!(text(SqlType::Float, ColumnData::F64(Some(0.1))), "0.1");
        assert_eq!(text(SqlType::Real, ColumnData::F32(Some(0.1))), "0.1");
        assert_eq!(text(SqlType::Float, ColumnData::F64(Some(-0.0))), "-0");
    }

    #[test]
    fn dates_and_times_from_wire_forms() {
        // 2026-08-07 is day 739_834 since 0001-01-01.
        let days = (NaiveDate::from_ymd_opt(2026, 8, 7).unwrap() - epoch_0001()).num_days() as u32;
        assert_eq!(
            text(SqlType::Date, ColumnData::Date(Some(Date::new(days)))),
            "2026-08-07"
        );
        assert_eq!(
            text(SqlType::Date, ColumnData::Date(Some(Date::new(0)))),
            "0001-01-01"
        );
        let t7 = Time::new(164_208_833_333, 7);
        assert_eq!(
            text(SqlType::Time { scale: 7 }, ColumnData::Time(Some(t7))),
            "04:33:40.8833333"
        );
        assert_eq!(
            text(
                SqlType::Time { scale: 0 },
                ColumnData::Time(Some(Time::new(86_399, 0)))
            ),
            "23:59:59"
        );
        assert_eq!(
            text(
                SqlType::Time { scale: 3 },
                ColumnData::Time(Some(Time::new(1, 3)))
            ),
            "00:00:00.001"
        );
        let t = Time::new(591_008_833_333, 7); // 16:25:00.8833333
        assert_eq!(
            text(
                SqlType::DateTime2 { scale: 7 },
                ColumnData::DateTime2(Some(DateTime2::new(Date::new(days), t)))
            ),
            "2026-08-07 16:25:00.8833333"
        );
        assert_eq!(
            text(
                SqlType::DateTime2 { scale: 0 },
                ColumnData::DateTime2(Some(DateTime2::new(Date::new(days), Time::new(59_100, 0))))
            ),
            "2026-08-07 16:25:00"
        );
    }

    #[test]
    fn datetime_ticks_round_like_sql_server() {
        let day = (NaiveDate::from_ymd_opt(2025, 3, 14).unwrap() - epoch_1900()).num_days() as i32;
        let at = |ticks| {
            text(
                SqlType::DateTime,
                ColumnData::DateTime(Some(tiberius::time::DateTime::new(day, ticks))),
            )
        };
        let base = (16 * 3600 + 45 * 60 + 1) * 300;
        assert_eq!(at(base), "2025-03-14 16:45:01.000");
        assert_eq!(at(base + 1), "2025-03-14 16:45:01.003");
        assert_eq!(at(base + 2), "2025-03-14 16:45:01.007");
        assert_eq!(at(base + 299), "2025-03-14 16:45:01.997");
        // 1753-01-01, the earliest datetime, is a negative day count.
        let early = (NaiveDate::from_ymd_opt(1753, 1, 1).unwrap() - epoch_1900()).num_days() as i32;
        assert_eq!(
            text(
                SqlType::DateTime,
                ColumnData::DateTime(Some(tiberius::time::DateTime::new(early, 0)))
            ),
            "1753-01-01 00:00:00.000"
        );
        let sdt = SmallDateTime::new(day as u16, 16 * 60 + 45);
        assert_eq!(
            text(SqlType::SmallDateTime, ColumnData::SmallDateTime(Some(sdt))),
            "2025-03-14 16:45:00"
        );
    }

    #[test]
    fn datetimeoffset_is_utc_on_the_wire_and_local_in_text() {
        let days = (NaiveDate::from_ymd_opt(2026, 8, 7).unwrap() - epoch_0001()).num_days() as u32;
        // 14:25:00.8833333 UTC at +02:00 is 16:25:00.8833333 local.
        let utc = DateTime2::new(Date::new(days), Time::new(519_008_833_333, 7));
        assert_eq!(
            text(
                SqlType::DateTimeOffset { scale: 7 },
                ColumnData::DateTimeOffset(Some(DateTimeOffset::new(utc, 120)))
            ),
            "2026-08-07 16:25:00.8833333 +02:00"
        );
        // 02:00 UTC at -05:30 is the previous day locally.
        let utc = DateTime2::new(Date::new(days), Time::new(7_200, 0));
        assert_eq!(
            text(
                SqlType::DateTimeOffset { scale: 0 },
                ColumnData::DateTimeOffset(Some(DateTimeOffset::new(utc, -330)))
            ),
            "2026-08-06 20:30:00 -05:30"
        );
        let utc = DateTime2::new(Date::new(days), Time::new(0, 0));
        assert_eq!(
            text(
                SqlType::DateTimeOffset { scale: 0 },
                ColumnData::DateTimeOffset(Some(DateTimeOffset::new(utc, 14 * 60)))
            ),
            "2026-08-07 14:00:00 +14:00"
        );
    }

    #[test]
    fn guid_text_and_binary() {
        let g = uuid::Uuid::parse_str("6F9619FF-8B86-D011-B42D-00C04FD430C8").unwrap();
        assert_eq!(
            text(SqlType::UniqueIdentifier, ColumnData::Guid(Some(g))),
            "6F9619FF-8B86-D011-B42D-00C04FD430C8"
        );
        assert_eq!(
            text(
                SqlType::NVarChar(Length::Max),
                ColumnData::String(Some(Cow::Borrowed("😀 x")))
            ),
            "😀 x"
        );
        assert_eq!(
            text(
                SqlType::Char(Length::Bounded(4)),
                ColumnData::String(Some("ab  ".into()))
            ),
            "ab  "
        );
        assert_eq!(
            text(
                SqlType::VarBinary(Length::Max),
                ColumnData::Binary(Some(vec![].into()))
            ),
            "0x"
        );
        assert_eq!(
            text(
                SqlType::Binary(Length::Bounded(2)),
                ColumnData::Binary(Some(vec![0xAB, 1].into()))
            ),
            "0xAB01"
        );
    }

    #[test]
    fn text_arrives_as_utf16_bytes_and_lone_surrogates_are_replaced() {
        let utf16 = |s: &str| -> Vec<u8> { s.encode_utf16().flat_map(u16::to_le_bytes).collect() };
        let nvarchar = SqlType::NVarChar(Length::Bounded(20));
        let (value, replaced) = decode_change_value(
            "c",
            &nvarchar,
            ColumnData::Binary(Some(Cow::Owned(utf16("Grüße 😀 ")))),
        )
        .unwrap();
        assert_eq!(value, Value::Text("Grüße 😀 ".into()));
        assert!(!replaced);
        // 'a', a lone high surrogate, 'b'.
        let lone = vec![0x61, 0x00, 0x3D, 0xD8, 0x62, 0x00];
        let (value, replaced) =
            decode_change_value("c", &nvarchar, ColumnData::Binary(Some(Cow::Owned(lone))))
                .unwrap();
        assert_eq!(value, Value::Text("a\u{FFFD}b".into()));
        assert!(replaced);
        let char10 = SqlType::Char(Length::Bounded(10));
        assert_eq!(
            decode_change_value("c", &char10, ColumnData::Binary(None)).unwrap(),
            (Value::Null, false)
        );
        let odd = decode_change_value("c", &char10, ColumnData::Binary(Some(Cow::Owned(vec![1]))));
        assert!(odd.is_err());
        // ASCII takes a shortcut; a unit with a high byte, or a low byte of 0x80 or
        // more (U+0080..U+00FF), does not.
        for text in [
            "",
            "SKU-00000042",
            "\u{7f}",
            "\u{80}",
            "é",
            "\u{100}",
            "a\u{3000}b",
        ] {
            let (value, replaced) = decode_change_value(
                "c",
                &nvarchar,
                ColumnData::Binary(Some(Cow::Owned(utf16(text)))),
            )
            .unwrap();
            assert_eq!(value, Value::Text(text.into()), "{text:?}");
            assert!(!replaced);
        }
        let odd_ascii = vec![0x61, 0x00, 0x62];
        let odd = decode_change_value(
            "c",
            &char10,
            ColumnData::Binary(Some(Cow::Owned(odd_ascii))),
        );
        assert!(odd.is_err());
        // Other types decode as before.
        assert_eq!(
            decode_change_value("c", &SqlType::Int, ColumnData::I32(Some(5))).unwrap(),
            (Value::Int(5), false)
        );
    }

    #[test]
    fn mismatched_and_malformed_values_are_errors() {
        let err = decode_value(
            "Amount",
            &SqlType::Int,
            ColumnData::String(Some("1".into())),
        )
        .unwrap_err();
        assert!(err.to_string().contains("Amount"));
        assert!(err.to_string().contains("int column arrived as String"));
        assert!(
            decode_value(
                "t",
                &SqlType::Time { scale: 7 },
                ColumnData::Time(Some(Time::new(u64::MAX, 7)))
            )
            .is_err()
        );
        assert!(decode_lsn("lsn", ColumnData::Binary(Some(vec![1, 2].into()))).is_err());
        assert_eq!(
            decode_lsn("lsn", ColumnData::Binary(Some(vec![0; 10].into()))),
            Ok(Some(Lsn::ZERO))
        );
        assert_eq!(decode_lsn("lsn", ColumnData::Binary(None)), Ok(None));
    }
}

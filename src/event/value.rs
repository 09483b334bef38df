//! SQL Server column types and values, and the text forms CES gives them.
//!
//! Every non-NULL value in a CES event is a JSON string holding SQL Server's canonical
//! text form of the value (`docs/src/event-format.md`, *Values*); NULL is JSON `null`. [`Value`] carries what the
//! text needs, including the column's fractional-second scale, so that formatting
//! needs no other context. [`SqlType`] is built from the catalog facts that
//! `cdc.captured_columns`/`sys.columns` give (type name, `max_length`, precision,
//! scale) and prints the `cols[].type` string.

use std::fmt::{self, Write as _};

use chrono::{DateTime, Datelike, FixedOffset, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use uuid::Uuid;

use crate::lsn::push_hex;

/// Length of a character or binary column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Length {
    /// `(max)`: up to 2 GB, stored as a LOB.
    Max,
    /// A fixed bound, in characters for `char`/`nchar`/`varchar`/`nvarchar` and in
    /// bytes for `binary`/`varbinary`.
    Bounded(u32),
}

impl fmt::Display for Length {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Length::Max => f.write_str("max"),
            Length::Bounded(n) => write!(f, "{n}"),
        }
    }
}

/// A column type that CES streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SqlType {
    Bit,
    TinyInt,
    SmallInt,
    Int,
    BigInt,
    Decimal { precision: u8, scale: u8 },
    Numeric { precision: u8, scale: u8 },
    Money,
    SmallMoney,
    Float,
    Real,
    Date,
    Time { scale: u8 },
    DateTime,
    SmallDateTime,
    DateTime2 { scale: u8 },
    DateTimeOffset { scale: u8 },
    UniqueIdentifier,
    Char(Length),
    VarChar(Length),
    NChar(Length),
    NVarChar(Length),
    Binary(Length),
    VarBinary(Length),
}

/// Type names that CES does not stream. Columns of these types are left out of
/// `cols`, `old` and `current`, with one warning per column at startup.
pub const EXCLUDED_TYPE_NAMES: &[&str] = &[
    "geography",
    "geometry",
    "hierarchyid",
    "image",
    "json",
    "rowversion",
    "timestamp",
    "sql_variant",
    "text",
    "ntext",
    "vector",
    "xml",
];

/// Why a catalog column cannot be streamed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TypeError {
    #[error("type `{type_name}` is not streamed by CES")]
    Excluded { type_name: String },
    #[error("`{type_name}` is a user-defined type, which CES does not stream")]
    UserDefined { type_name: String },
    #[error("type `{type_name}` is not known")]
    Unknown { type_name: String },
    #[error("type `{type_name}` has an invalid {fact} of {value}")]
    InvalidFacts {
        type_name: String,
        fact: &'static str,
        value: i64,
    },
}

impl SqlType {
    /// Builds the type from catalog facts: the system type name as in `sys.types`
    /// (or `cdc.captured_columns.column_type`), `max_length` in bytes (`-1` for
    /// `(max)`), precision and scale as in `sys.columns`.
    pub fn from_catalog(
        type_name: &str,
        max_length: i16,
        precision: u8,
        scale: u8,
    ) -> Result<Self, TypeError> {
        let name = type_name.to_ascii_lowercase();
        let invalid = |fact, value: i64| TypeError::InvalidFacts {
            type_name: name.clone(),
            fact,
            value,
        };
        let length = |unit_bytes: i16| -> Result<Length, TypeError> {
            match max_length {
                -1 => Ok(Length::Max),
                n if n > 0 && n % unit_bytes == 0 => Ok(Length::Bounded(u32::from(
                    n.unsigned_abs() / unit_bytes.unsigned_abs(),
                ))),
                n => Err(invalid("max_length", i64::from(n))),
            }
        };
        let fraction_scale = || {
            if scale <= 7 {
                Ok(scale)
            } else {
                Err(invalid("scale", i64::from(scale)))
            }
        };
        let decimal_facts = || {
            if (1..=38).contains(&precision) && scale <= precision {
                Ok((precision, scale))
            } else {
                Err(invalid("precision", i64::from(precision)))
            }
        };
        Ok(match name.as_str() {
            "bit" => SqlType::Bit,
            "tinyint" => SqlType::TinyInt,
            "smallint" => SqlType::SmallInt,
            "int" => SqlType::Int,
            "bigint" => SqlType::BigInt,
            "decimal" => {
                let (precision, scale) = decimal_facts()?;
                SqlType::Decimal { precision, scale }
            }
            "numeric" => {
                let (precision, scale) = decimal_facts()?;
                SqlType::Numeric { precision, scale }
            }
            "money" => SqlType::Money,
            "smallmoney" => SqlType::SmallMoney,
            "float" => SqlType::Float,
            "real" => SqlType::Real,
            "date" => SqlType::Date,
            "time" => SqlType::Time {
                scale: fraction_scale()?,
            },
            "datetime" => SqlType::DateTime,
            "smalldatetime" => SqlType::SmallDateTime,
            "datetime2" => SqlType::DateTime2 {
                scale: fraction_scale()?,
            },
            "datetimeoffset" => SqlType::DateTimeOffset {
                scale: fraction_scale()?,
            },
            "uniqueidentifier" => SqlType::UniqueIdentifier,
            "char" => SqlType::Char(length(1)?),
            "varchar" => SqlType::VarChar(length(1)?),
            "nchar" => SqlType::NChar(length(2)?),
            "nvarchar" => SqlType::NVarChar(length(2)?),
            "binary" => SqlType::Binary(length(1)?),
            "varbinary" => SqlType::VarBinary(length(1)?),
            excluded if EXCLUDED_TYPE_NAMES.contains(&excluded) => {
                return Err(TypeError::Excluded { type_name: name });
            }
            _ => return Err(TypeError::Unknown { type_name: name }),
        })
    }

    /// True for `varchar(max)`, `nvarchar(max)` and `varbinary(max)`: the columns whose
    /// unchanged value is NULL in an update's before-image (op 3).
    pub fn is_lob(&self) -> bool {
        matches!(
            self,
            SqlType::VarChar(Length::Max)
                | SqlType::NVarChar(Length::Max)
                | SqlType::VarBinary(Length::Max)
        )
    }
}

impl fmt::Display for SqlType {
    /// The `cols[].type` string: the type name with its length, precision or scale.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SqlType::Bit => f.write_str("bit"),
            SqlType::TinyInt => f.write_str("tinyint"),
            SqlType::SmallInt => f.write_str("smallint"),
            SqlType::Int => f.write_str("int"),
            SqlType::BigInt => f.write_str("bigint"),
            SqlType::Decimal { precision, scale } => write!(f, "decimal({precision},{scale})"),
            SqlType::Numeric { precision, scale } => write!(f, "numeric({precision},{scale})"),
            SqlType::Money => f.write_str("money"),
            SqlType::SmallMoney => f.write_str("smallmoney"),
            SqlType::Float => f.write_str("float"),
            SqlType::Real => f.write_str("real"),
            SqlType::Date => f.write_str("date"),
            SqlType::Time { scale } => write!(f, "time({scale})"),
            SqlType::DateTime => f.write_str("datetime"),
            SqlType::SmallDateTime => f.write_str("smalldatetime"),
            SqlType::DateTime2 { scale } => write!(f, "datetime2({scale})"),
            SqlType::DateTimeOffset { scale } => write!(f, "datetimeoffset({scale})"),
            SqlType::UniqueIdentifier => f.write_str("uniqueidentifier"),
            SqlType::Char(n) => write!(f, "char({n})"),
            SqlType::VarChar(n) => write!(f, "varchar({n})"),
            SqlType::NChar(n) => write!(f, "nchar({n})"),
            SqlType::NVarChar(n) => write!(f, "nvarchar({n})"),
            SqlType::Binary(n) => write!(f, "binary({n})"),
            SqlType::VarBinary(n) => write!(f, "varbinary({n})"),
        }
    }
}

/// One column value of a change row.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bit(bool),
    TinyInt(u8),
    SmallInt(i16),
    Int(i32),
    BigInt(i64),
    /// `decimal`, `numeric`, and `money`/`smallmoney` (scale 4): the value is
    /// `unscaled / 10^scale`. 38 digits fit in an `i128`.
    Decimal {
        unscaled: i128,
        scale: u8,
    },
    Float(f64),
    Real(f32),
    Date(NaiveDate),
    /// `time(scale)`.
    Time {
        value: NaiveTime,
        scale: u8,
    },
    /// `datetime`: 1/300-second ticks, printed rounded to milliseconds.
    DateTime(NaiveDateTime),
    /// `smalldatetime`: whole minutes.
    SmallDateTime(NaiveDateTime),
    /// `datetime2(scale)`.
    DateTime2 {
        value: NaiveDateTime,
        scale: u8,
    },
    /// `datetimeoffset(scale)`: printed as the local time with its offset.
    DateTimeOffset {
        value: DateTime<FixedOffset>,
        scale: u8,
    },
    Guid(Uuid),
    /// `char`, `varchar`, `nchar`, `nvarchar`, including `(max)`, as stored.
    Text(String),
    /// `binary`, `varbinary`, including `(max)`.
    Binary(Vec<u8>),
}

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The canonical text form, `None` for NULL.
    pub fn to_text(&self) -> Option<String> {
        if self.is_null() {
            return None;
        }
        let mut out = String::new();
        self.write_text(&mut out);
        Some(out)
    }

    /// Appends the canonical text form to `out` (nothing for NULL).
    ///
    /// Only [`Value::Text`] can produce characters that need JSON escaping; every
    /// other form is ASCII digits, letters and `-:. +`.
    pub fn write_text(&self, out: &mut String) {
        match self {
            Value::Null => {}
            Value::Bit(b) => out.push(if *b { '1' } else { '0' }),
            Value::TinyInt(v) => push_int(out, *v),
            Value::SmallInt(v) => push_int(out, *v),
            Value::Int(v) => push_int(out, *v),
            Value::BigInt(v) => push_int(out, *v),
            Value::Decimal { unscaled, scale } => write_decimal(out, *unscaled, *scale),
            Value::Float(v) => write_float(out, *v),
            Value::Real(v) => write_real(out, *v),
            Value::Date(d) => write_date(out, *d),
            Value::Time { value, scale } => write_time(out, *value, *scale),
            Value::DateTime(v) => write_datetime_millis(out, *v, ' '),
            Value::SmallDateTime(v) => {
                write_date(out, v.date());
                out.push(' ');
                write_time(out, v.time(), 0);
            }
            Value::DateTime2 { value, scale } => {
                write_date(out, value.date());
                out.push(' ');
                write_time(out, value.time(), *scale);
            }
            Value::DateTimeOffset { value, scale } => {
                let local = value.naive_local();
                write_date(out, local.date());
                out.push(' ');
                write_time(out, local.time(), *scale);
                out.push(' ');
                write_offset(out, value.offset().local_minus_utc());
            }
            Value::Guid(g) => {
                let mut buf = Uuid::encode_buffer();
                out.push_str(g.hyphenated().encode_upper(&mut buf));
            }
            Value::Text(s) => out.push_str(s),
            Value::Binary(b) => {
                out.push_str("0x");
                push_hex(out, b);
            }
        }
    }

    /// Length in bytes of the text form, without building it for the large kinds.
    pub fn text_len(&self) -> usize {
        match self {
            Value::Null => 0,
            Value::Text(s) => s.len(),
            Value::Binary(b) => 2 + 2 * b.len(),
            other => other.to_text().map_or(0, |t| t.len()),
        }
    }
}

fn push_display(out: &mut String, value: impl fmt::Display) {
    // Writing into a String cannot fail.
    let _ = write!(out, "{value}");
}

fn push_int(out: &mut String, value: impl itoa::Integer) {
    out.push_str(itoa::Buffer::new().format(value));
}

/// Plain decimal with exactly `scale` fraction digits and no exponent.
fn write_decimal(out: &mut String, unscaled: i128, scale: u8) {
    if unscaled < 0 {
        out.push('-');
    }
    let mut buffer = itoa::Buffer::new();
    let digits = buffer.format(unscaled.unsigned_abs());
    let scale = usize::from(scale);
    if scale == 0 {
        out.push_str(digits);
        return;
    }
    if digits.len() > scale {
        let (int_part, frac_part) = digits.split_at(digits.len() - scale);
        out.push_str(int_part);
        out.push('.');
        out.push_str(frac_part);
    } else {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', scale - digits.len()));
        out.push_str(digits);
    }
}

/// Shortest text that reads back to the same `f64`. Plain notation for magnitudes in
/// `[1e-5, 1e16)` (and zero), otherwise `d.dddE±x` notation, which is what SQL Server
/// itself uses for very large and very small floats.
fn write_float(out: &mut String, v: f64) {
    let magnitude = v.abs();
    if magnitude == 0.0 || (1e-5..1e16).contains(&magnitude) {
        push_display(out, v);
    } else {
        push_exponent(out, format!("{v:E}"));
    }
}

/// As [`write_float`], for `real` (shortest text that reads back to the same `f32`).
fn write_real(out: &mut String, v: f32) {
    let magnitude = v.abs();
    if magnitude == 0.0 || (1e-5..1e16).contains(&magnitude) {
        push_display(out, v);
    } else {
        push_exponent(out, format!("{v:E}"));
    }
}

/// Rust prints `1E300` / `1E-7`; write `1E+300` / `1E-7`.
fn push_exponent(out: &mut String, text: String) {
    match text.split_once('E') {
        Some((mantissa, exp)) if !exp.starts_with('-') => {
            out.push_str(mantissa);
            out.push_str("E+");
            out.push_str(exp);
        }
        _ => out.push_str(&text),
    }
}

/// "00" to "99".
const TWO_DIGITS: &str = "00010203040506070809101112131415161718192021222324252627282930313233343536373839404142434445464748495051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";

/// `value % 100` as two digits.
fn push_two(out: &mut String, value: u32) {
    let at = (value % 100) as usize * 2;
    out.push_str(&TWO_DIGITS[at..at + 2]);
}

/// `value` with at least `width` digits, zero-padded.
fn push_padded(out: &mut String, value: u32, width: usize) {
    match (width, value) {
        (2, 0..=99) => push_two(out, value),
        (4, 0..=9999) => {
            push_two(out, value / 100);
            push_two(out, value);
        }
        _ => {
            let mut buffer = itoa::Buffer::new();
            let digits = buffer.format(value);
            out.extend(std::iter::repeat_n('0', width.saturating_sub(digits.len())));
            out.push_str(digits);
        }
    }
}

/// `2026-08-07`.
fn write_date(out: &mut String, d: NaiveDate) {
    push_padded(out, d.year().unsigned_abs(), 4);
    out.push('-');
    push_padded(out, d.month(), 2);
    out.push('-');
    push_padded(out, d.day(), 2);
}

/// `16:25:00.8833333` with `scale` fraction digits (none when 0). Digits beyond the
/// scale are dropped; a value decoded from a column of that scale has none.
fn write_time(out: &mut String, t: NaiveTime, scale: u8) {
    push_padded(out, t.hour(), 2);
    out.push(':');
    push_padded(out, t.minute(), 2);
    out.push(':');
    push_padded(out, t.second(), 2);
    if scale > 0 {
        let scale = scale.min(9);
        // A leap-second nanosecond value (>= 1e9) is not a SQL Server value; clamp it.
        let nanos = t.nanosecond().min(999_999_999);
        let digits = nanos / 10u32.pow(9 - u32::from(scale));
        out.push('.');
        push_padded(out, digits, usize::from(scale));
    }
}

/// `2025-03-14 16:45:01.000` (with `separator` between date and time): rounded to the
/// millisecond, as SQL Server prints `datetime` (1/300 s ticks: .000, .003, .007).
pub fn write_datetime_millis(out: &mut String, v: NaiveDateTime, separator: char) {
    let millis = (v.nanosecond().min(999_999_999) + 500_000) / 1_000_000;
    let whole = v.with_nanosecond(0).unwrap_or(v);
    let rounded = whole + chrono::Duration::milliseconds(i64::from(millis));
    write_date(out, rounded.date());
    out.push(separator);
    write_time(out, rounded.time(), 3);
}

/// `+02:00`, `-05:30`.
fn write_offset(out: &mut String, seconds: i32) {
    out.push(if seconds < 0 { '-' } else { '+' });
    let minutes = seconds.unsigned_abs() / 60;
    push_padded(out, minutes / 60, 2);
    out.push(':');
    push_padded(out, minutes % 60, 2);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: Value) -> String {
        v.to_text().unwrap_or_else(|| "<null>".into())
    }

    fn dt(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").unwrap()
    }

    #[test]
    fn integers_and_bit() {
        assert_eq!(text(Value::Bit(true)), "1");
        assert_eq!(text(Value::Bit(false)), "0");
        assert_eq!(text(Value::TinyInt(255)), "255");
        assert_eq!(text(Value::SmallInt(-32768)), "-32768");
        assert_eq!(text(Value::Int(i32::MIN)), "-2147483648");
        assert_eq!(text(Value::BigInt(i64::MAX)), "9223372036854775807");
        assert_eq!(Value::Null.to_text(), None);
    }

    #[test]
    fn decimals_keep_exactly_scale_digits() {
        let d = |unscaled, scale| text(Value::Decimal { unscaled, scale });
        assert_eq!(d(12345, 2), "123.45");
        assert_eq!(d(-12345, 2), "-123.45");
        assert_eq!(d(5, 3), "0.005");
        assert_eq!(d(-5, 3), "-0.005");
        assert_eq!(d(0, 2), "0.00");
        assert_eq!(d(0, 0), "0");
        assert_eq!(d(-42, 0), "-42");
        let max38 = 10i128.pow(38) - 1;
        assert_eq!(d(max38, 0), "9".repeat(38));
        assert_eq!(d(-max38, 0), format!("-{}", "9".repeat(38)));
        assert_eq!(d(max38, 38), format!("0.{}", "9".repeat(38)));
        assert_eq!(d(-1, 38), format!("-0.{}1", "0".repeat(37)));
        assert_eq!(
            d(max38, 10),
            format!("{}.{}", "9".repeat(28), "9".repeat(10))
        );
    }

    #[test]
    fn money_has_four_fraction_digits() {
        // money/smallmoney arrive as decimal(19,4) (the source casts them).
        let m = |unscaled| text(Value::Decimal { unscaled, scale: 4 });
        assert_eq!(m(-9_223_372_036_854_775_808), "-922337203685477.5808");
        assert_eq!(m(9_223_372_036_854_775_807), "922337203685477.5807");
        assert_eq!(m(-1), "-0.0001");
        assert_eq!(m(1_000_000), "100.0000");
    }

    #[test]
    fn floats_are_shortest_and_lossless() {
        for v in [
            0.0,
            -0.0,
            0.1,
            1.0,
            -1.5,
            1e15,
            1e16,
            123456789.125,
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            5e-324,
            1e-5,
            9.99e-6,
            std::f64::consts::PI,
        ] {
            let t = text(Value::Float(v));
            let back: f64 = t.parse().unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{v:e} printed as {t}");
            assert!(t.len() <= 24, "{t} is not short");
        }
        assert_eq!(text(Value::Float(0.1)), "0.1");
        assert_eq!(text(Value::Float(-0.0)), "-0");
        assert_eq!(text(Value::Float(1.0)), "1");
        assert_eq!(text(Value::Float(1e300)), "1E+300");
        assert_eq!(text(Value::Float(f64::MAX)), "1.7976931348623157E+308");
        assert_eq!(text(Value::Float(5e-324)), "5E-324");
        assert_eq!(text(Value::Float(2.5e-7)), "2.5E-7");
        for v in [0.1f32, f32::MAX, f32::MIN_POSITIVE, -3.4e38, 16_777_217.0] {
            let t = text(Value::Real(v));
            let back: f32 = t.parse().unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{v:e} printed as {t}");
        }
        assert_eq!(text(Value::Real(0.1)), "0.1");
        assert_eq!(text(Value::Real(f32::MAX)), "3.4028235E+38");
    }

    #[test]
    fn dates_and_times() {
        let date = NaiveDate::from_ymd_opt(2026, 8, 7).unwrap();
        assert_eq!(text(Value::Date(date)), "2026-08-07");
        assert_eq!(
            text(Value::Date(NaiveDate::from_ymd_opt(1, 1, 1).unwrap())),
            "0001-01-01"
        );
        let t = NaiveTime::from_hms_nano_opt(16, 25, 0, 883_333_300).unwrap();
        assert_eq!(text(Value::Time { value: t, scale: 7 }), "16:25:00.8833333");
        assert_eq!(text(Value::Time { value: t, scale: 3 }), "16:25:00.883");
        assert_eq!(text(Value::Time { value: t, scale: 0 }), "16:25:00");
        let midnight = NaiveTime::from_hms_opt(0, 0, 0).unwrap();
        assert_eq!(
            text(Value::Time {
                value: midnight,
                scale: 1
            }),
            "00:00:00.0"
        );
        let v = dt("2026-08-07 16:25:00.8833333");
        let expected = [
            "2026-08-07 16:25:00",
            "2026-08-07 16:25:00.8",
            "2026-08-07 16:25:00.88",
            "2026-08-07 16:25:00.883",
            "2026-08-07 16:25:00.8833",
            "2026-08-07 16:25:00.88333",
            "2026-08-07 16:25:00.883333",
            "2026-08-07 16:25:00.8833333",
        ];
        for (scale, want) in expected.iter().enumerate() {
            let scale = u8::try_from(scale).unwrap();
            assert_eq!(text(Value::DateTime2 { value: v, scale }), *want);
        }
        assert_eq!(
            text(Value::DateTime2 {
                value: dt("9999-12-31 23:59:59.9999999"),
                scale: 7
            }),
            "9999-12-31 23:59:59.9999999"
        );
    }

    #[test]
    fn datetime_prints_ticks_rounded_to_milliseconds() {
        // datetime has 1/300 s ticks; 299 ticks = 996.67 ms, which SQL Server shows as .997.
        let tick = |n: i64| {
            dt("2025-03-14 16:45:01") + chrono::Duration::nanoseconds(n * 1_000_000_000 / 300)
        };
        assert_eq!(text(Value::DateTime(tick(0))), "2025-03-14 16:45:01.000");
        assert_eq!(text(Value::DateTime(tick(1))), "2025-03-14 16:45:01.003");
        assert_eq!(text(Value::DateTime(tick(2))), "2025-03-14 16:45:01.007");
        assert_eq!(text(Value::DateTime(tick(299))), "2025-03-14 16:45:01.997");
        // Rounding that carries into the next second, minute and day.
        assert_eq!(
            text(Value::DateTime(dt("2025-12-31 23:59:59.9996"))),
            "2026-01-01 00:00:00.000"
        );
        assert_eq!(
            text(Value::SmallDateTime(dt("2025-03-14 16:45:00"))),
            "2025-03-14 16:45:00"
        );
    }

    #[test]
    fn datetimeoffset_prints_local_time_and_offset() {
        let at = |offset_secs: i32, local: &str, scale| {
            let offset = FixedOffset::east_opt(offset_secs).unwrap();
            let value = dt(local).and_local_timezone(offset).unwrap();
            text(Value::DateTimeOffset { value, scale })
        };
        assert_eq!(
            at(7200, "2026-08-07 16:25:00.8833333", 7),
            "2026-08-07 16:25:00.8833333 +02:00"
        );
        assert_eq!(
            at(-(5 * 3600 + 30 * 60), "2026-01-01 00:00:00", 0),
            "2026-01-01 00:00:00 -05:30"
        );
        assert_eq!(
            at(14 * 3600, "2026-01-01 12:00:00.5", 1),
            "2026-01-01 12:00:00.5 +14:00"
        );
        assert_eq!(
            at(-14 * 3600, "0001-01-01 00:00:00", 3),
            "0001-01-01 00:00:00.000 -14:00"
        );
        assert_eq!(
            at(0, "2026-01-01 00:00:00", 0),
            "2026-01-01 00:00:00 +00:00"
        );
    }

    #[test]
    fn padding() {
        let pad = |v, w| {
            let mut out = String::new();
            push_padded(&mut out, v, w);
            out
        };
        assert_eq!(pad(0, 0), "0");
        assert_eq!(pad(0, 4), "0000");
        assert_eq!(pad(7, 2), "07");
        assert_eq!(pad(12345, 2), "12345");
        assert_eq!(pad(8833333, 7), "8833333");
        assert_eq!(pad(5, 7), "0000005");
        assert_eq!(pad(u32::MAX, 3), "4294967295");
    }

    #[test]
    fn guid_binary_and_text() {
        let g = Uuid::parse_str("6f9619ff-8b86-d011-b42d-00c04fd430c8").unwrap();
        assert_eq!(text(Value::Guid(g)), "6F9619FF-8B86-D011-B42D-00C04FD430C8");
        assert_eq!(text(Value::Binary(vec![])), "0x");
        assert_eq!(text(Value::Binary(vec![0, 0xAB, 0x0f])), "0x00AB0F");
        assert_eq!(text(Value::Text("a😀\"\\".into())), "a😀\"\\");
        assert_eq!(text(Value::Text("ab        ".into())), "ab        ");
        assert_eq!(text(Value::Text(String::new())), "");
        assert_eq!(Value::Binary(vec![1, 2, 3]).text_len(), 8);
        assert_eq!(Value::Text("😀".into()).text_len(), 4);
        assert_eq!(Value::Int(-12).text_len(), 3);
    }

    #[test]
    fn type_strings_from_catalog_facts() {
        let t = |name, len, p, s| SqlType::from_catalog(name, len, p, s).unwrap().to_string();
        assert_eq!(t("int", 4, 10, 0), "int");
        assert_eq!(t("nvarchar", 100, 0, 0), "nvarchar(50)");
        assert_eq!(t("nvarchar", -1, 0, 0), "nvarchar(max)");
        assert_eq!(t("nchar", 10, 0, 0), "nchar(5)");
        assert_eq!(t("varchar", -1, 0, 0), "varchar(max)");
        assert_eq!(t("char", 10, 0, 0), "char(10)");
        assert_eq!(t("varbinary", 16, 0, 0), "varbinary(16)");
        assert_eq!(t("varbinary", -1, 0, 0), "varbinary(max)");
        assert_eq!(t("binary", 8, 0, 0), "binary(8)");
        assert_eq!(t("decimal", 9, 18, 2), "decimal(18,2)");
        assert_eq!(t("numeric", 17, 38, 38), "numeric(38,38)");
        assert_eq!(t("datetime2", 8, 27, 7), "datetime2(7)");
        assert_eq!(t("datetime2", 6, 19, 0), "datetime2(0)");
        assert_eq!(t("time", 5, 12, 3), "time(3)");
        assert_eq!(t("datetimeoffset", 10, 34, 7), "datetimeoffset(7)");
        assert_eq!(t("float", 8, 53, 0), "float");
        assert_eq!(t("real", 4, 24, 0), "real");
        assert_eq!(t("money", 8, 19, 4), "money");
        assert_eq!(t("smallmoney", 4, 10, 4), "smallmoney");
        assert_eq!(t("DATETIME", 8, 23, 3), "datetime");
        assert_eq!(t("smalldatetime", 4, 16, 0), "smalldatetime");
        assert_eq!(t("uniqueidentifier", 16, 0, 0), "uniqueidentifier");
        assert_eq!(t("date", 3, 10, 0), "date");
        assert_eq!(t("tinyint", 1, 3, 0), "tinyint");
        assert_eq!(t("smallint", 2, 5, 0), "smallint");
        assert_eq!(t("bigint", 8, 19, 0), "bigint");
        assert_eq!(t("bit", 1, 1, 0), "bit");
    }

    #[test]
    fn excluded_unknown_and_malformed_types() {
        for name in EXCLUDED_TYPE_NAMES {
            assert!(matches!(
                SqlType::from_catalog(name, 16, 0, 0),
                Err(TypeError::Excluded { .. })
            ));
        }
        assert!(matches!(
            SqlType::from_catalog("mytype", 4, 0, 0),
            Err(TypeError::Unknown { .. })
        ));
        assert!(matches!(
            SqlType::from_catalog("nvarchar", 7, 0, 0),
            Err(TypeError::InvalidFacts {
                fact: "max_length",
                ..
            })
        ));
        assert!(matches!(
            SqlType::from_catalog("decimal", 17, 39, 0),
            Err(TypeError::InvalidFacts { .. })
        ));
        assert!(matches!(
            SqlType::from_catalog("time", 5, 16, 8),
            Err(TypeError::InvalidFacts { .. })
        ));
    }

    #[test]
    fn lob_types() {
        let lob = |n, l| SqlType::from_catalog(n, l, 0, 0).unwrap().is_lob();
        assert!(lob("varchar", -1));
        assert!(lob("nvarchar", -1));
        assert!(lob("varbinary", -1));
        assert!(!lob("nvarchar", 100));
        assert!(!lob("varbinary", 8000));
    }
}

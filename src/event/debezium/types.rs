//! SQL Server types and values as Debezium's SQL Server connector maps them
//! (`SqlServerValueConverters`, on `JdbcValueConverters`; the connector's
//! documentation, "Data type mappings"; the datatype tests that pin each case,
//! `AbstractSqlServerDatatypesTest`). Where the documentation and the code differ,
//! the code is followed and the difference named.

use base64::Engine as _;
use chrono::{NaiveDateTime, Timelike};
use serde::Deserialize;

use super::connect::{Schema, Type, write_double, write_float, write_string};
use super::{DebeziumError, DebeziumSettings};
use crate::event::columns::ColumnMask;
use crate::event::{ColumnDescription, SqlType, Value};

/// `decimal.handling.mode`: how `decimal`, `numeric` and `money` are written.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DecimalMode {
    /// Connect's `Decimal`: bytes, the unscaled value in two's complement, big-endian.
    #[default]
    Precise,
    /// A `double`.
    Double,
    /// The exact text.
    String,
}

/// `time.precision.mode`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum TimePrecisionMode {
    /// Milli-, micro- or nanoseconds by the column's scale (0–3, 4–6, 7).
    #[default]
    Adaptive,
    /// Kafka Connect's `Date`, `Time` and `Timestamp`, in milliseconds.
    Connect,
}

/// `binary.handling.mode`: how binary values are written.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
pub enum BinaryMode {
    /// Connect's `bytes` (JSON: base64).
    #[default]
    #[serde(rename = "bytes")]
    Bytes,
    /// A base64 string.
    #[serde(rename = "base64")]
    Base64,
    /// A URL-safe base64 string.
    #[serde(rename = "base64-url-safe")]
    Base64UrlSafe,
    /// A hex string.
    #[serde(rename = "hex")]
    Hex,
}

/// Scale and precision of the decimal kinds (`money` is `decimal(19,4)`,
/// `smallmoney` `decimal(10,4)`, as the connector's test pins them).
fn decimal_facts(sql_type: SqlType) -> Option<(u8, u8)> {
    match sql_type {
        SqlType::Decimal { precision, scale } | SqlType::Numeric { precision, scale } => {
            Some((precision, scale))
        }
        SqlType::Money => Some((19, 4)),
        SqlType::SmallMoney => Some((10, 4)),
        _ => None,
    }
}

/// The Connect schema of a column, with the column's default where it is a
/// constant of the column's type ([`defaults`](super::defaults)).
pub fn column_schema(column: &ColumnDescription, settings: &DebeziumSettings) -> Schema {
    let mut schema = type_schema(column, settings);
    schema.default = default_json(column, settings);
    schema
}

/// The column's default as JSON text, written as its values are; `None` without
/// a constant default, or when a column rule changes the values.
fn default_json(column: &ColumnDescription, settings: &DebeziumSettings) -> Option<String> {
    if column.mask.is_some() {
        return None;
    }
    let value = super::defaults::parse(column.default.as_deref()?, column.sql_type)?;
    let mut out = String::new();
    write_value(&mut out, column, &value, settings).ok()?;
    Some(out)
}

/// The Connect schema of a column's type.
fn type_schema(column: &ColumnDescription, settings: &DebeziumSettings) -> Schema {
    let optional = column.nullable;
    let plain = |ty| Schema::of(ty, optional);
    // Hashed and redacted values are text whatever the column's type.
    if matches!(column.mask, Some(ColumnMask::Hashed | ColumnMask::Redacted)) {
        return plain(Type::String);
    }
    let adaptive = settings.time_precision_mode == TimePrecisionMode::Adaptive;
    let timestamp = |scale: u8| {
        if !adaptive {
            plain(Type::Int64).named("org.apache.kafka.connect.data.Timestamp", Some(1))
        } else if scale <= 3 {
            plain(Type::Int64).named("io.debezium.time.Timestamp", Some(1))
        } else if scale <= 6 {
            plain(Type::Int64).named("io.debezium.time.MicroTimestamp", Some(1))
        } else {
            plain(Type::Int64).named("io.debezium.time.NanoTimestamp", Some(1))
        }
    };
    if let Some((precision, scale)) = decimal_facts(column.sql_type) {
        return match settings.decimal_handling_mode {
            DecimalMode::Precise => plain(Type::Bytes)
                .named("org.apache.kafka.connect.data.Decimal", Some(1))
                .parameter("scale", scale.to_string())
                .parameter("connect.decimal.precision", precision.to_string()),
            DecimalMode::Double => plain(Type::Float64),
            DecimalMode::String => plain(Type::String),
        };
    }
    match column.sql_type {
        SqlType::Bit => plain(Type::Boolean),
        // The connector's override: 0–255 does not fit int8.
        SqlType::TinyInt | SqlType::SmallInt => plain(Type::Int16),
        SqlType::Int => plain(Type::Int32),
        SqlType::BigInt => plain(Type::Int64),
        SqlType::Real => plain(Type::Float32),
        SqlType::Float => plain(Type::Float64),
        SqlType::Date if adaptive => plain(Type::Int32).named("io.debezium.time.Date", Some(1)),
        SqlType::Date => plain(Type::Int32).named("org.apache.kafka.connect.data.Date", Some(1)),
        // Kafka's `Time` is int32 milliseconds (the documentation's table says int64).
        SqlType::Time { .. } if !adaptive => {
            plain(Type::Int32).named("org.apache.kafka.connect.data.Time", Some(1))
        }
        SqlType::Time { scale } if scale <= 3 => {
            plain(Type::Int32).named("io.debezium.time.Time", Some(1))
        }
        SqlType::Time { scale } if scale <= 6 => {
            plain(Type::Int64).named("io.debezium.time.MicroTime", Some(1))
        }
        SqlType::Time { .. } => plain(Type::Int64).named("io.debezium.time.NanoTime", Some(1)),
        SqlType::DateTime => timestamp(3),
        SqlType::SmallDateTime => timestamp(0),
        SqlType::DateTime2 { scale } => timestamp(scale),
        SqlType::DateTimeOffset { .. } => {
            plain(Type::String).named("io.debezium.time.ZonedTimestamp", Some(1))
        }
        SqlType::Binary(_) | SqlType::VarBinary(_) => match settings.binary_handling_mode {
            BinaryMode::Bytes => plain(Type::Bytes),
            _ => plain(Type::String),
        },
        // uniqueidentifier is a plain string (the JDBC driver reports CHAR).
        _ => plain(Type::String),
    }
}

/// Writes one value of `column` as `JsonConverter` writes it.
pub fn write_value(
    out: &mut String,
    column: &ColumnDescription,
    value: &Value,
    settings: &DebeziumSettings,
) -> Result<(), DebeziumError> {
    let adaptive = settings.time_precision_mode == TimePrecisionMode::Adaptive;
    let out_of_range = || DebeziumError::OutOfRange {
        column: column.name.clone(),
        value: value.to_text().unwrap_or_default(),
    };
    let scale_of = |sql_type: SqlType| match sql_type {
        SqlType::Time { scale } | SqlType::DateTime2 { scale } => scale,
        _ => 7,
    };
    match value {
        Value::Null => out.push_str("null"),
        _ if matches!(column.mask, Some(ColumnMask::Hashed | ColumnMask::Redacted)) => {
            write_string(out, &value.to_text().unwrap_or_default());
        }
        Value::Bit(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::TinyInt(v) => push_number(out, i64::from(*v)),
        Value::SmallInt(v) => push_number(out, i64::from(*v)),
        Value::Int(v) => push_number(out, i64::from(*v)),
        Value::BigInt(v) => push_number(out, *v),
        Value::Decimal { unscaled, scale } => {
            let column_scale = decimal_facts(column.sql_type).map_or(*scale, |(_, s)| s);
            let unscaled = rescale(*unscaled, *scale, column_scale).ok_or_else(out_of_range)?;
            write_decimal(out, unscaled, column_scale, settings.decimal_handling_mode);
        }
        Value::Float(v) => write_double(out, *v),
        Value::Real(v) => write_float(out, *v),
        Value::Date(d) => {
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
            push_number(out, d.signed_duration_since(epoch).num_days());
        }
        Value::Time { value, .. } => {
            let nanos = i64::from(value.num_seconds_from_midnight()) * 1_000_000_000
                + i64::from(value.nanosecond().min(999_999_999));
            let scale = scale_of(column.sql_type);
            push_number(
                out,
                match (adaptive, scale) {
                    (false, _) | (true, 0..=3) => nanos / 1_000_000,
                    (true, 4..=6) => nanos / 1_000,
                    _ => nanos,
                },
            );
        }
        // datetime: 1/300-second ticks, read as the driver reports them, to the
        // nearest millisecond.
        Value::DateTime(v) => push_number(
            out,
            timestamp(*v + chrono::Duration::microseconds(500), 3, adaptive)
                .ok_or_else(out_of_range)?,
        ),
        Value::SmallDateTime(v) => {
            push_number(out, timestamp(*v, 0, adaptive).ok_or_else(out_of_range)?);
        }
        Value::DateTime2 { value, .. } => push_number(
            out,
            timestamp(*value, scale_of(column.sql_type), adaptive).ok_or_else(out_of_range)?,
        ),
        Value::DateTimeOffset { value, .. } => write_string(out, &zoned_timestamp(value)),
        Value::Guid(_) | Value::Text(_) => write_string(out, &value.to_text().unwrap_or_default()),
        Value::Binary(bytes) => {
            write_string(out, &binary_text(bytes, settings.binary_handling_mode))
        }
    }
    Ok(())
}

fn push_number(out: &mut String, n: i64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// A timestamp in the unit its scale calls for (milliseconds with `connect`);
/// `None` past what the unit holds (nanoseconds end in 2262).
fn timestamp(v: NaiveDateTime, scale: u8, adaptive: bool) -> Option<i64> {
    let utc = v.and_utc();
    match (adaptive, scale) {
        (false, _) | (true, 0..=3) => Some(utc.timestamp_millis()),
        (true, 4..=6) => Some(utc.timestamp_micros()),
        _ => utc.timestamp_nanos_opt(),
    }
}

/// A decimal in `mode`: the Connect `Decimal`'s bytes (base64 in JSON), a double,
/// or its plain text at the column's scale.
fn write_decimal(out: &mut String, unscaled: i128, scale: u8, mode: DecimalMode) {
    let mut text = String::new();
    Value::Decimal { unscaled, scale }.write_text(&mut text);
    match mode {
        DecimalMode::Precise => write_string(
            out,
            &base64::engine::general_purpose::STANDARD.encode(twos_complement(unscaled)),
        ),
        DecimalMode::Double => write_double(out, text.parse().unwrap_or(f64::NAN)),
        DecimalMode::String => write_string(out, &text),
    }
}

/// Binary data in `mode` (JsonConverter writes `bytes` as standard base64).
fn binary_text(bytes: &[u8], mode: BinaryMode) -> String {
    match mode {
        BinaryMode::Bytes | BinaryMode::Base64 => {
            base64::engine::general_purpose::STANDARD.encode(bytes)
        }
        BinaryMode::Base64UrlSafe => base64::engine::general_purpose::URL_SAFE.encode(bytes),
        BinaryMode::Hex => bytes.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// `unscaled / 10^from` as an unscaled value at scale `to`.
fn rescale(unscaled: i128, from: u8, to: u8) -> Option<i128> {
    match to.cmp(&from) {
        std::cmp::Ordering::Equal => Some(unscaled),
        std::cmp::Ordering::Greater => {
            unscaled.checked_mul(10i128.checked_pow(u32::from(to - from))?)
        }
        std::cmp::Ordering::Less => Some(unscaled / 10i128.checked_pow(u32::from(from - to))?),
    }
}

/// Java's `BigInteger.toByteArray`: the shortest big-endian two's complement.
pub fn twos_complement(v: i128) -> Vec<u8> {
    let bytes = v.to_be_bytes();
    let mut start = 0;
    while start < bytes.len() - 1 {
        let (b, next) = (bytes[start], bytes[start + 1]);
        if (b == 0x00 && next & 0x80 == 0) || (b == 0xFF && next & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    bytes[start..].to_vec()
}

/// `io.debezium.time.ZonedTimestamp`: Java's `ISO_OFFSET_DATE_TIME` of the value in
/// its own offset (the documentation says GMT; the code keeps the offset): seconds
/// always, the fraction without trailing zeros, `Z` for +00:00.
pub fn zoned_timestamp(value: &chrono::DateTime<chrono::FixedOffset>) -> String {
    let local = value.naive_local();
    let mut out = local.format("%Y-%m-%dT%H:%M:%S").to_string();
    let nanos = local.nanosecond().min(999_999_999);
    if nanos > 0 {
        let fraction = format!("{nanos:09}");
        out.push('.');
        out.push_str(fraction.trim_end_matches('0'));
    }
    let offset = value.offset().local_minus_utc();
    if offset == 0 {
        out.push('Z');
    } else {
        let sign = if offset < 0 { '-' } else { '+' };
        let minutes = offset.unsigned_abs() / 60;
        out.push_str(&format!("{sign}{:02}:{:02}", minutes / 60, minutes % 60));
    }
    out
}

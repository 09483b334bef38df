//! The JSON payloads JsonConverter would write: rows, keys, times.

use super::DebeziumError;
use super::DebeziumSettings;
use super::connect::write_string;
use super::types;
use crate::event::{Row, TableDescription};

pub(super) enum TimeField {
    Millis,
    Micros,
    Nanos,
}

pub(super) fn push_times(
    out: &mut String,
    name: &str,
    at: chrono::DateTime<chrono::Utc>,
    unit: TimeField,
) {
    out.push_str(",\"");
    out.push_str(name);
    out.push_str("\":");
    let n = match unit {
        TimeField::Millis => at.timestamp_millis(),
        TimeField::Micros => at.timestamp_micros(),
        TimeField::Nanos => at.timestamp_nanos_opt().unwrap_or(i64::MAX),
    };
    out.push_str(itoa::Buffer::new().format(n));
}

pub(super) fn row_payload(
    out: &mut String,
    table: &TableDescription,
    row: Option<&Row>,
    settings: &DebeziumSettings,
) -> Result<(), DebeziumError> {
    let Some(row) = row else {
        out.push_str("null");
        return Ok(());
    };
    out.push('{');
    for (i, (column, value)) in table.columns().iter().zip(row).enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(out, &column.name);
        out.push(':');
        types::write_value(out, column, value, settings)?;
    }
    out.push('}');
    Ok(())
}

/// The key payload (`{"Id":7}`) of a row; also the `__debezium.*key` headers.
pub(super) fn key_payload(
    table: &TableDescription,
    row: &Row,
    settings: &DebeziumSettings,
) -> String {
    let mut out = String::from("{");
    for (i, &position) in table.key().iter().enumerate() {
        let (Some(column), Some(value)) = (table.columns().get(position), row.get(position)) else {
            continue;
        };
        if i > 0 {
            out.push(',');
        }
        write_string(&mut out, &column.name);
        out.push(':');
        if types::write_value(&mut out, column, value, settings).is_err() {
            write_string(&mut out, &value.to_text().unwrap_or_default());
        }
    }
    out.push('}');
    out
}

//! Values in the simulated tables: converted as `ALTER COLUMN` converts them, and
//! checked against a column's type as the real decoder checks them.

use mssql_ces::event::Value;
use mssql_ces::event::value::SqlType;

/// A value converted to a column's new type, as `ALTER COLUMN` converts stored rows.
pub(super) fn convert(value: &Value, to: SqlType) -> Value {
    match (value, to) {
        (Value::TinyInt(v), SqlType::SmallInt) => Value::SmallInt(i16::from(*v)),
        (Value::TinyInt(v), SqlType::Int) => Value::Int(i32::from(*v)),
        (Value::SmallInt(v), SqlType::Int) => Value::Int(i32::from(*v)),
        (Value::Int(v), SqlType::BigInt) => Value::BigInt(i64::from(*v)),
        (Value::SmallInt(v), SqlType::BigInt) => Value::BigInt(i64::from(*v)),
        (other, _) => other.clone(),
    }
}

/// Whether a value can be a value of `sql_type` (what the real decoder checks): the
/// simulator models integer type changes, so only integers are checked.
pub(super) fn fits(value: &Value, sql_type: SqlType) -> bool {
    match value {
        Value::TinyInt(_) => sql_type == SqlType::TinyInt,
        Value::SmallInt(_) => sql_type == SqlType::SmallInt,
        Value::Int(_) => sql_type == SqlType::Int,
        Value::BigInt(_) => sql_type == SqlType::BigInt,
        _ => true,
    }
}

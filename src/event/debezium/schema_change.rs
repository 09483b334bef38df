//! Schema-change events in the form of Debezium's SQL Server connector's schema
//! change topic (`<topic_prefix>`; `EventDispatcher.schemaChangeRecordValue`,
//! `ConnectTableChangeSerializer`, `SchemaFactory`): key
//! `io.debezium.connector.sqlserver.SchemaChangeKey` (`databaseName`), value
//! `io.debezium.connector.sqlserver.SchemaChangeValue` with `source`, `ts_ms`,
//! `databaseName`, `schemaName`, `ddl` and `tableChanges` (`CREATE` for a table's
//! first shape, `ALTER` for a change).
//!
//! Where Debezium has nothing to say, this is what we write:
//! - `ddl`: the DDL `cdc.ddl_history` recorded for the change, one statement per
//!   line; `"N/A"` when it recorded none (Debezium writes `"N/A"` for every
//!   streaming change, and null during its snapshot).
//! - `jdbcType`, `length` and `scale`: what Microsoft's JDBC driver reports for the
//!   type (`java.sql.Types`, `COLUMN_SIZE`, `DECIMAL_DIGITS`), which is where
//!   Debezium takes them from.
//! - `typeName` and `typeExpression`: the type's name (`nvarchar`), as the driver
//!   names it; `position` is 1-based; `autoIncremented` and `generated` false
//!   (CDC does not say); `defaultValueExpression` null (not read).

use std::sync::Arc;

use super::connect::{Schema, Type, write_string};
use super::payload::{TimeField, push_times};
use super::{AvroSchemas, DebeziumError, Record, SOURCE_VERSION, lsn_text};
use crate::event::schema_change::SchemaChange;

/// The key and value schemas of the schema-change topic.
pub(super) fn schemas(source: Schema) -> (Schema, Schema) {
    let required = |ty| Schema::of(ty, false);
    let optional = |ty| Schema::of(ty, true);
    let key = required(Type::Struct(vec![(
        "databaseName".into(),
        required(Type::String),
    )]))
    .named("io.debezium.connector.sqlserver.SchemaChangeKey", Some(1));
    let column = required(Type::Struct(vec![
        ("name".into(), required(Type::String)),
        ("jdbcType".into(), required(Type::Int32)),
        ("nativeType".into(), optional(Type::Int32)),
        ("typeName".into(), required(Type::String)),
        ("typeExpression".into(), optional(Type::String)),
        ("charsetName".into(), optional(Type::String)),
        ("length".into(), optional(Type::Int32)),
        ("scale".into(), optional(Type::Int32)),
        ("position".into(), required(Type::Int32)),
        ("optional".into(), optional(Type::Boolean)),
        ("autoIncremented".into(), optional(Type::Boolean)),
        ("generated".into(), optional(Type::Boolean)),
        ("comment".into(), optional(Type::String)),
        ("defaultValueExpression".into(), optional(Type::String)),
        (
            "enumValues".into(),
            optional(Type::Array(Box::new(required(Type::String)))),
        ),
    ]))
    .named("io.debezium.connector.schema.Column", Some(1));
    let table = optional(Type::Struct(vec![
        ("defaultCharsetName".into(), optional(Type::String)),
        (
            "primaryKeyColumnNames".into(),
            optional(Type::Array(Box::new(required(Type::String)))),
        ),
        ("columns".into(), required(Type::Array(Box::new(column)))),
        ("comment".into(), optional(Type::String)),
    ]))
    .named("io.debezium.connector.schema.Table", Some(1));
    let change = required(Type::Struct(vec![
        ("type".into(), required(Type::String)),
        ("id".into(), required(Type::String)),
        ("table".into(), table),
    ]))
    .named("io.debezium.connector.schema.Change", Some(1));
    let value = required(Type::Struct(vec![
        ("source".into(), source),
        ("ts_ms".into(), required(Type::Int64)),
        ("databaseName".into(), optional(Type::String)),
        ("schemaName".into(), optional(Type::String)),
        ("ddl".into(), optional(Type::String)),
        (
            "tableChanges".into(),
            required(Type::Array(Box::new(change))),
        ),
    ]))
    .named("io.debezium.connector.sqlserver.SchemaChangeValue", Some(1));
    (key, value)
}

/// `java.sql.Types`, `COLUMN_SIZE` and `DECIMAL_DIGITS` of a CES type string
/// (`nvarchar(50)`, `decimal(18,2)`, `time(7)`) as Microsoft's JDBC driver reports
/// them; the type's name.
pub fn jdbc_facts(type_label: &str) -> (i32, String, Option<i32>, Option<i32>) {
    let (name, args) = match type_label.split_once('(') {
        Some((name, rest)) => (name, rest.trim_end_matches(')')),
        None => (type_label, ""),
    };
    let mut parts = args.split(',').map(str::trim);
    let first = parts.next().filter(|s| !s.is_empty());
    let second = parts.next();
    let max = first == Some("max");
    let n = |s: Option<&str>| s.and_then(|s| s.parse::<i32>().ok());
    let fraction = |base: i32| {
        let s = n(first).unwrap_or(7);
        (Some(if s > 0 { base + 1 + s } else { base }), Some(s))
    };
    let (jdbc, length, scale) = match name {
        "bit" => (-7, Some(1), None),
        "tinyint" => (-6, Some(3), Some(0)),
        "smallint" => (5, Some(5), Some(0)),
        "int" => (4, Some(10), Some(0)),
        "bigint" => (-5, Some(19), Some(0)),
        "decimal" | "numeric" => (if name == "decimal" { 3 } else { 2 }, n(first), n(second)),
        "money" => (3, Some(19), Some(4)),
        "smallmoney" => (3, Some(10), Some(4)),
        "float" => (8, Some(53), None),
        "real" => (7, Some(24), None),
        "date" => (91, Some(10), None),
        "time" => {
            let (length, scale) = fraction(8);
            (92, length, scale)
        }
        "datetime" => (93, Some(23), Some(3)),
        "smalldatetime" => (93, Some(16), Some(0)),
        "datetime2" => {
            let (length, scale) = fraction(19);
            (93, length, scale)
        }
        "datetimeoffset" => {
            let (length, scale) = fraction(26);
            (-155, length, scale)
        }
        "uniqueidentifier" => (1, Some(36), None),
        "char" => (1, n(first), None),
        "varchar" if max => (-1, Some(i32::MAX), None),
        "varchar" => (12, n(first), None),
        "nchar" => (-15, n(first), None),
        "nvarchar" if max => (-16, Some(1_073_741_823), None),
        "nvarchar" => (-9, n(first), None),
        "binary" => (-2, n(first), None),
        "varbinary" if max => (-4, Some(i32::MAX), None),
        "varbinary" => (-3, n(first), None),
        _ => (1111, None, None),
    };
    (jdbc, name.to_owned(), length, scale)
}

/// The value payload (JSON) of a schema-change event; `source` is written by the
/// caller's `write_source`.
pub(super) fn value_payload(change: &SchemaChange, source: &str) -> String {
    let mut p = String::with_capacity(1024);
    p.push_str("{\"source\":");
    p.push_str(source);
    p.push_str(",\"ts_ms\":");
    p.push_str(itoa::Buffer::new().format(change.time.timestamp_millis()));
    p.push_str(",\"databaseName\":");
    write_string(&mut p, &change.database);
    p.push_str(",\"schemaName\":");
    write_string(&mut p, &change.schema);
    p.push_str(",\"ddl\":");
    let ddl: Vec<&str> = change.ddl.iter().map(|d| d.command.trim()).collect();
    write_string(
        &mut p,
        &if ddl.is_empty() {
            "N/A".to_owned()
        } else {
            ddl.join("\n")
        },
    );
    p.push_str(",\"tableChanges\":[{\"type\":");
    write_string(
        &mut p,
        match change.reason {
            crate::event::schema_change::SchemaChangeReason::Initial => "CREATE",
            crate::event::schema_change::SchemaChangeReason::Changed => "ALTER",
        },
    );
    p.push_str(",\"id\":");
    write_string(
        &mut p,
        &format!(
            "\"{}\".\"{}\".\"{}\"",
            change.database, change.schema, change.table
        ),
    );
    p.push_str(",\"table\":{\"defaultCharsetName\":null,\"primaryKeyColumnNames\":[");
    let mut keys: Vec<_> = change
        .after
        .cols
        .iter()
        .filter_map(|c| Some((c.key_position?, &c.name)))
        .collect();
    keys.sort();
    for (i, (_, name)) in keys.iter().enumerate() {
        if i > 0 {
            p.push(',');
        }
        write_string(&mut p, name);
    }
    p.push_str("],\"columns\":[");
    for (i, c) in change.after.cols.iter().enumerate() {
        if i > 0 {
            p.push(',');
        }
        write_column(&mut p, c);
    }
    p.push_str("],\"comment\":null}}]}");
    p
}

impl super::DebeziumEncoder {
    /// A schema-change event as Debezium's schema change topic carries it, keyed by
    /// the database name.
    pub fn encode_schema_change(
        &mut self,
        change: &crate::event::schema_change::SchemaChange,
    ) -> Result<Record, DebeziumError> {
        let mut source = String::from("{\"version\":");
        write_string(&mut source, SOURCE_VERSION);
        source.push_str(",\"connector\":\"sqlserver\",\"name\":");
        write_string(&mut source, &self.settings.topic_prefix);
        push_times(&mut source, "ts_ms", change.time, TimeField::Millis);
        source.push_str(",\"snapshot\":\"false\",\"db\":");
        write_string(&mut source, &change.database);
        source.push_str(",\"sequence\":null");
        push_times(&mut source, "ts_us", change.time, TimeField::Micros);
        push_times(&mut source, "ts_ns", change.time, TimeField::Nanos);
        source.push_str(",\"schema\":");
        write_string(&mut source, &change.schema);
        source.push_str(",\"table\":");
        write_string(&mut source, &change.table);
        source.push_str(",\"change_lsn\":null,\"commit_lsn\":");
        write_string(&mut source, &lsn_text(change.lsn));
        source.push_str(",\"event_serial_no\":null}");
        let value = value_payload(change, &source);
        let mut key = String::from("{\"databaseName\":");
        write_string(&mut key, &change.database);
        key.push('}');
        let shapes = Arc::clone(&self.schema_change_shapes);
        let id = crate::event::schema_change::schema_message_id(
            self.stream_guid,
            &change.qualified_name(),
            change.version,
            0,
        );
        Ok(Record {
            topic: Some(crate::event::sanitize_topic(&crate::event::expand_names(
                &self.schema_topic,
                &change.database,
                &change.schema,
                &change.table,
            ))),
            key: Some(self.serialize(&shapes.0, &key)?),
            value: Some(self.serialize(&shapes.1, &value)?),
            headers: vec![("id", id.hyphenated().to_string().into_bytes())],
            id,
            avro: self.avro.then(|| AvroSchemas {
                key: Some(shapes.0.avro_schema()),
                value: Some(shapes.1.avro_schema()),
            }),
        })
    }
}

/// One column of `tableChanges[].table.columns` (`io.debezium.connector.schema.Column`).
fn write_column(p: &mut String, c: &crate::position::ShapeColumn) {
    let (jdbc, name, length, scale) = jdbc_facts(&c.sql_type);
    let int = |p: &mut String, v: Option<i32>| match v {
        Some(v) => p.push_str(itoa::Buffer::new().format(v)),
        None => p.push_str("null"),
    };
    p.push_str("{\"name\":");
    write_string(p, &c.name);
    p.push_str(",\"jdbcType\":");
    p.push_str(itoa::Buffer::new().format(jdbc));
    p.push_str(",\"nativeType\":null,\"typeName\":");
    write_string(p, &name);
    p.push_str(",\"typeExpression\":");
    write_string(p, &name);
    p.push_str(",\"charsetName\":null,\"length\":");
    int(p, length);
    p.push_str(",\"scale\":");
    int(p, scale);
    p.push_str(",\"position\":");
    p.push_str(itoa::Buffer::new().format(c.index + 1));
    p.push_str(",\"optional\":");
    p.push_str(match c.nullable {
        Some(false) => "false",
        _ => "true",
    });
    p.push_str(",\"autoIncremented\":false,\"generated\":false,\"comment\":null,\"defaultValueExpression\":null,\"enumValues\":null}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes of the documentation's example (`int` 10/0, `varchar(255)` 255)
    /// and the driver's for the rest.
    #[test]
    fn jdbc_facts_are_the_drivers() {
        assert_eq!(jdbc_facts("int"), (4, "int".into(), Some(10), Some(0)));
        assert_eq!(
            jdbc_facts("varchar(255)"),
            (12, "varchar".into(), Some(255), None)
        );
        assert_eq!(
            jdbc_facts("nvarchar(max)"),
            (-16, "nvarchar".into(), Some(1_073_741_823), None)
        );
        assert_eq!(
            jdbc_facts("decimal(18,2)"),
            (3, "decimal".into(), Some(18), Some(2))
        );
        assert_eq!(
            jdbc_facts("datetime2(7)"),
            (93, "datetime2".into(), Some(27), Some(7))
        );
        assert_eq!(
            jdbc_facts("datetime2(0)"),
            (93, "datetime2".into(), Some(19), Some(0))
        );
        assert_eq!(
            jdbc_facts("datetimeoffset(3)"),
            (-155, "datetimeoffset".into(), Some(30), Some(3))
        );
    }
}

#[cfg(test)]
mod encoder_tests {
    use std::sync::Arc;

    use super::super::{DebeziumEncoder, DebeziumSettings};
    use crate::event::schema_change::tests::added_email;

    #[test]
    fn a_schema_change_is_debeziums_schema_change_record() {
        let change = added_email();
        let mut encoder = DebeziumEncoder::new(
            Arc::new(DebeziumSettings {
                topic_prefix: "server1".into(),
                ..DebeziumSettings::default()
            }),
            uuid::Uuid::nil(),
            crate::event::debezium::bound(1 << 20),
            None,
        )
        .with_schema_topic("server1".into());
        let record = encoder.encode_schema_change(&change).unwrap();
        assert_eq!(record.topic.as_deref(), Some("server1"));
        let key: serde_json::Value = serde_json::from_slice(&record.key.unwrap()).unwrap();
        assert_eq!(
            key["schema"]["name"],
            "io.debezium.connector.sqlserver.SchemaChangeKey"
        );
        assert_eq!(
            key["payload"],
            serde_json::json!({"databaseName": change.database})
        );
        let value: serde_json::Value = serde_json::from_slice(&record.value.unwrap()).unwrap();
        assert_eq!(
            value["schema"]["name"],
            "io.debezium.connector.sqlserver.SchemaChangeValue"
        );
        let p = &value["payload"];
        let fields: Vec<&str> = p.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            fields,
            [
                "source",
                "ts_ms",
                "databaseName",
                "schemaName",
                "ddl",
                "tableChanges"
            ]
        );
        assert_eq!(p["source"]["snapshot"], "false");
        assert_eq!(p["source"]["table"], change.table.as_str());
        let table_change = &p["tableChanges"][0];
        assert_eq!(table_change["type"], "ALTER");
        assert_eq!(
            table_change["id"],
            format!(
                "\"{}\".\"{}\".\"{}\"",
                change.database, change.schema, change.table
            )
        );
        let columns = table_change["table"]["columns"].as_array().unwrap();
        assert_eq!(columns.len(), change.after.cols.len());
        assert_eq!(columns[0]["position"], 1);
        let ddl = p["ddl"].as_str().unwrap();
        assert!(
            change.ddl.iter().all(|d| ddl.contains(d.command.trim())),
            "{ddl}"
        );
        // The payload fits its own schema, field for field.
        let schema_fields: Vec<&str> = value["schema"]["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["field"].as_str().unwrap())
            .collect();
        assert_eq!(schema_fields, fields);
    }
}

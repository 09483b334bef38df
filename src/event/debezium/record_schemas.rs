//! The Connect schemas of Debezium's records (`TableSchemaBuilder`,
//! `SchemaFactory`), built once per table and written in both forms.

use std::sync::Arc;

use super::DebeziumSettings;
use super::connect::{Schema, Type};
use super::types;
use crate::event::TableDescription;
use crate::event::sanitize_topic;

/// A Connect schema with its two written forms, made once.
#[derive(Debug)]
pub(super) struct Shape {
    pub(super) schema: Schema,
    /// As JsonConverter writes it.
    pub(super) json: String,
    /// As AvroData derives it.
    pub(super) avro: Arc<str>,
}

impl Shape {
    pub(super) fn of(schema: Schema) -> Self {
        let mut json = String::new();
        schema.write(&mut json, None);
        let avro = schema.avro_json().into();
        Shape { schema, json, avro }
    }

    /// The Avro schema and the record's full name, for a registry.
    pub(super) fn avro_schema(&self) -> (Arc<str>, String) {
        (
            Arc::clone(&self.avro),
            self.schema.record_name().unwrap_or_default(),
        )
    }
}

/// What a table's records share: the key's and the envelope's schemas.
#[derive(Debug)]
pub(super) struct TableSchemas {
    pub(super) key: Option<Shape>,
    pub(super) value: Shape,
    pub(super) data_collection: String,
}

/// `snapshot`'s allowed values (Debezium 3.0.5 and later).
pub(super) const SNAPSHOT_ALLOWED: &str =
    "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental";

pub(super) fn build_schemas(table: &TableDescription, settings: &DebeziumSettings) -> TableSchemas {
    let prefix = sanitize_topic(&format!(
        "{}.{}.{}.{}",
        settings.topic_prefix,
        table.database(),
        table.schema(),
        table.table()
    ));
    let fields: Vec<(String, Schema)> = table
        .columns()
        .iter()
        .map(|c| (c.name.clone(), types::column_schema(c, settings)))
        .collect();
    let key_schema = (!table.key().is_empty()).then(|| {
        Schema::of(
            Type::Struct(
                table
                    .key()
                    .iter()
                    .filter_map(|&p| fields.get(p).cloned())
                    .collect(),
            ),
            false,
        )
        .named(format!("{prefix}.Key"), None)
    });
    let row = Schema::of(Type::Struct(fields), true).named(format!("{prefix}.Value"), None);
    let optional = |ty| Schema::of(ty, true);
    let required = |ty| Schema::of(ty, false);
    let source = source_schema();
    let block = optional(Type::Struct(vec![
        ("id".into(), required(Type::String)),
        ("total_order".into(), required(Type::Int64)),
        ("data_collection_order".into(), required(Type::Int64)),
    ]))
    .named("event.block", Some(1));
    let envelope = required(Type::Struct(vec![
        ("before".into(), row.clone()),
        ("after".into(), row),
        ("source".into(), source),
        ("transaction".into(), block),
        ("op".into(), required(Type::String)),
        ("ts_ms".into(), optional(Type::Int64)),
        ("ts_us".into(), optional(Type::Int64)),
        ("ts_ns".into(), optional(Type::Int64)),
    ]))
    .named(format!("{prefix}.Envelope"), Some(2));
    TableSchemas {
        key: key_schema.map(Shape::of),
        value: Shape::of(envelope),
        data_collection: format!("{}.{}.{}", table.database(), table.schema(), table.table()),
    }
}

/// `io.debezium.connector.sqlserver.Source` (version 1, Debezium 3.1 and later).
pub(super) fn source_schema() -> Schema {
    let optional = |ty| Schema::of(ty, true);
    let required = |ty| Schema::of(ty, false);
    let mut snapshot = optional(Type::String)
        .named("io.debezium.data.Enum", Some(1))
        .parameter("allowed", SNAPSHOT_ALLOWED);
    snapshot.default = Some("\"false\"".into());
    required(Type::Struct(vec![
        ("version".into(), required(Type::String)),
        ("connector".into(), required(Type::String)),
        ("name".into(), required(Type::String)),
        ("ts_ms".into(), required(Type::Int64)),
        ("snapshot".into(), snapshot),
        ("db".into(), required(Type::String)),
        ("sequence".into(), optional(Type::String)),
        ("ts_us".into(), optional(Type::Int64)),
        ("ts_ns".into(), optional(Type::Int64)),
        ("schema".into(), required(Type::String)),
        ("table".into(), required(Type::String)),
        ("change_lsn".into(), optional(Type::String)),
        ("commit_lsn".into(), optional(Type::String)),
        ("event_serial_no".into(), optional(Type::Int64)),
    ]))
    .named("io.debezium.connector.sqlserver.Source", Some(1))
}

/// The transaction topic's key and value schemas (`SchemaFactory`).
pub(super) fn transaction_shapes() -> (Shape, Shape) {
    let required = |ty| Schema::of(ty, false);
    let optional = |ty| Schema::of(ty, true);
    let key = required(Type::Struct(vec![("id".into(), required(Type::String))])).named(
        "io.debezium.connector.common.TransactionMetadataKey",
        Some(1),
    );
    let collection = optional(Type::Struct(vec![
        ("data_collection".into(), required(Type::String)),
        ("event_count".into(), required(Type::Int64)),
    ]))
    .named("event.collection", Some(1));
    let value = required(Type::Struct(vec![
        ("status".into(), required(Type::String)),
        ("id".into(), required(Type::String)),
        ("event_count".into(), optional(Type::Int64)),
        (
            "data_collections".into(),
            optional(Type::Array(Box::new(collection))),
        ),
        ("ts_ms".into(), required(Type::Int64)),
    ]))
    .named(
        "io.debezium.connector.common.TransactionMetadataValue",
        Some(1),
    );
    (Shape::of(key), Shape::of(value))
}

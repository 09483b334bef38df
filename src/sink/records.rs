//! The router's part for Debezium records and the schema registry: topics and keys
//! of the records a [`DebeziumEncoder`](crate::event::debezium::DebeziumEncoder)
//! makes.

use super::{Change, Encoding, OutgoingMessage, Router, fnv1a, registry};

/// What a stream's Debezium encoder is made of.
#[derive(Debug, Clone)]
pub struct DebeziumRouting {
    pub settings: std::sync::Arc<crate::event::debezium::DebeziumSettings>,
    /// The transaction the checkpoint says is open.
    pub open: Option<crate::position::OpenTransaction>,
    /// The largest record the destination takes ([`SinkConfig::record_bound`](super::SinkConfig::record_bound)).
    pub bound: crate::event::debezium::RecordBound,
}

impl Router {
    /// Avro in the Confluent wire format, ids from the registry of `settings`
    /// (waited for up to `patience` when it is down).
    pub fn with_registry(
        mut self,
        settings: Option<registry::SchemaRegistrySettings>,
        patience: std::time::Duration,
    ) -> Self {
        self.registry = settings.map(|s| (s, patience));
        self
    }

    /// The schema registry's settings and patience, when one is configured.
    pub fn registry(&self) -> Option<&(registry::SchemaRegistrySettings, std::time::Duration)> {
        self.registry.as_ref()
    }

    /// Events in Debezium's envelope.
    pub fn with_debezium(mut self, debezium: DebeziumRouting) -> Self {
        self.debezium = Some(debezium);
        self
    }

    /// The Debezium encoder for a stream, when events are in Debezium's envelope.
    pub fn debezium_encoder(
        &self,
        stream_guid: uuid::Uuid,
    ) -> Option<crate::event::debezium::DebeziumEncoder> {
        let debezium = self.debezium.as_ref()?;
        Some(
            crate::event::debezium::DebeziumEncoder::new(
                std::sync::Arc::clone(&debezium.settings),
                stream_guid,
                debezium.bound,
                debezium.open.clone(),
            )
            .with_avro(self.encoding == Encoding::Avro)
            .with_schema_topic(self.schema_topic.clone()),
        )
    }

    /// The messages of Debezium schema-change records (each names its topic).
    pub fn route_schema_records(
        &self,
        records: Vec<crate::event::debezium::Record>,
    ) -> Vec<OutgoingMessage> {
        records
            .into_iter()
            .map(|record| OutgoingMessage {
                topic: record
                    .topic
                    .unwrap_or_else(|| crate::event::sanitize_topic(&self.schema_topic)),
                key: record.key,
                partition_hint: None,
                headers: record.headers,
                tombstone: record.value.is_none(),
                payload: record.value.unwrap_or_default(),
                message_id: Some(record.id),
            })
            .collect()
    }

    /// A table's topic as Debezium names it: the template expanded, characters
    /// Kafka does not allow replaced by `_`.
    pub fn debezium_topic(&self, table: &crate::event::TableDescription) -> String {
        crate::event::sanitize_topic(&self.topic(table))
    }

    /// The messages of a change's Debezium records: `table_topic`
    /// ([`debezium_topic`](Self::debezium_topic)) or the record's own, the key as
    /// the record has it; with no key, one partition per change so that its
    /// records stay in order.
    pub fn route_records(
        &self,
        change: &Change,
        records: Vec<crate::event::debezium::Record>,
        table_topic: &str,
    ) -> Vec<OutgoingMessage> {
        records
            .into_iter()
            .map(|record| {
                let partition_hint = record.key.is_none().then(|| {
                    fnv1a(format!("{} {}", change.commit_lsn, change.sequence_number).as_bytes())
                });
                OutgoingMessage {
                    topic: record.topic.unwrap_or_else(|| table_topic.to_owned()),
                    key: record.key,
                    partition_hint,
                    headers: record.headers,
                    tombstone: record.value.is_none(),
                    payload: record.value.unwrap_or_default(),
                    message_id: Some(record.id),
                }
            })
            .collect()
    }
}

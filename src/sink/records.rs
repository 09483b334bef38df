//! The router's part for Debezium records and the schema registry: topics and keys
//! of the records a [`DebeziumEncoder`](crate::event::debezium::DebeziumEncoder)
//! makes.

use super::{Change, Encoding, OutgoingMessage, Router, fnv1a, registry};

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

    /// Events in Debezium's envelope, with `settings`; `open` is the transaction
    /// the checkpoint says is open.
    pub fn with_debezium(
        mut self,
        settings: std::sync::Arc<crate::event::debezium::DebeziumSettings>,
        open: Option<crate::position::OpenTransaction>,
    ) -> Self {
        self.debezium = Some((settings, open));
        self
    }

    /// The Debezium encoder for a stream, when events are in Debezium's envelope.
    pub fn debezium_encoder(
        &self,
        stream_guid: uuid::Uuid,
        max_message_size: usize,
    ) -> Option<crate::event::debezium::DebeziumEncoder> {
        let (settings, open) = self.debezium.as_ref()?;
        Some(
            crate::event::debezium::DebeziumEncoder::new(
                std::sync::Arc::clone(settings),
                stream_guid,
                max_message_size,
                open.clone(),
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

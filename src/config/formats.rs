//! What `event.format` and `[sink.schema_registry]` do not combine with, refused by
//! name before anything connects.

use super::Config;
use crate::setting::{ConfigError, invalid};

impl Config {
    /// `[sink.schema_registry]`: Avro only, on Kafka (or a file), structured CES.
    pub(super) fn validate_registry(&self) -> Result<(), ConfigError> {
        let Some(registry) = &self.sink.routing.schema_registry else {
            return Ok(());
        };
        registry.validate()?;
        if self.event.encoding != crate::event::Encoding::Avro {
            return Err(invalid(
                "sink.schema_registry",
                "applies to Avro messages: set event.encoding = \"avro\" (JSON needs no registry)",
            ));
        }
        if matches!(self.sink.kind, crate::sink::SinkConfig::EventHubsAmqp(_)) {
            return Err(invalid(
                "sink.schema_registry",
                "a Confluent-API schema registry goes with Kafka clients; Event Hubs over AMQP does not use one (Azure Schema Registry is another API, not supported): use kind = \"event_hubs_kafka\" with a Confluent-compatible registry, or remove it",
            ));
        }
        if self.event.format == crate::event::settings::EventFormat::Ces
            && self.sink.routing.mode == crate::sink::settings::CloudEventsMode::Binary
        {
            return Err(invalid(
                "sink.mode",
                "with [sink.schema_registry] the registered schema is CES's whole ChangeEvent record: use mode = \"structured\"",
            ));
        }
        Ok(())
    }

    /// `event.format = "debezium"`: what it does not combine with, by name.
    pub(super) fn validate_debezium(&self) -> Result<(), ConfigError> {
        use crate::event::settings::EventFormat;
        if self.event.format != EventFormat::Debezium {
            return Ok(());
        }
        let d = &self.event.debezium;
        if d.topic_prefix.trim().is_empty() || d.topic_prefix.contains(['{', '}']) {
            return Err(invalid(
                "event.debezium.topic_prefix",
                "must be a plain, non-empty name (Debezium's topic.prefix): it starts every topic and is source.name",
            ));
        }
        if self.event.encoding == crate::event::Encoding::Avro
            && self.sink.routing.schema_registry.is_none()
        {
            return Err(invalid(
                "event.encoding",
                "Debezium's Avro form is Confluent's (AvroConverter): it needs [sink.schema_registry] with url = \"http://…\"; or use encoding = \"json\"",
            ));
        }
        if self.sink.routing.schema_changes == crate::sink::settings::SchemaChangePlacement::Inline
        {
            return Err(invalid(
                "sink.schema_changes",
                "Debezium writes schema changes to a topic of their own (its schema change topic, by default the topic prefix): use \"topic\" (or \"off\") with event.format = \"debezium\"",
            ));
        }
        if self.sink.routing.mode == crate::sink::settings::CloudEventsMode::Binary {
            return Err(invalid(
                "sink.mode",
                "\"binary\" is a CloudEvents mode; Debezium records have none: remove it with event.format = \"debezium\"",
            ));
        }
        if self.event.max_message_size_kb != crate::event::MessageSizeLimit::default() {
            let bound = match self.sink.kind.record_bound().raised_by {
                Some(setting) => format!("set by {setting}"),
                None => "the destination's largest".to_owned(),
            };
            return Err(invalid(
                "event.max_message_size_kb",
                format!(
                    "is CES's segment size; a Debezium record has no segments and is bounded by what the destination takes ({bound}): remove it with event.format = \"debezium\""
                ),
            ));
        }
        if matches!(self.sink.kind, crate::sink::SinkConfig::EventHubsAmqp(_))
            && d.tombstones_on_delete
        {
            return Err(invalid(
                "event.debezium.tombstones_on_delete",
                "an Event Hubs message over AMQP cannot have a null body, so there are no tombstones: set it to false (or use kind = \"event_hubs_kafka\")",
            ));
        }
        Ok(())
    }
}

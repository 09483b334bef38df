//! `[checkpoint]` with `store = "kafka"`: what it needs of the sink.

use super::{CheckpointStoreKind, Config};
use crate::setting::{ConfigError, invalid};
use crate::sink::SinkConfig;

pub(super) fn default_checkpoint_topic() -> String {
    crate::checkpoint::kafka::DEFAULT_TOPIC.to_owned()
}

impl Config {
    pub(super) fn validate_kafka_store(&self) -> Result<(), ConfigError> {
        match &self.sink.kind {
            SinkConfig::EventHubsKafka(c) if c.exactly_once => {
                return Err(invalid(
                    "sink.exactly_once",
                    "is for Kafka: Event Hubs' Kafka endpoint has no transactions on the Basic and Standard tiers, and this release does not support them on Premium or Dedicated",
                ));
            }
            SinkConfig::Kafka(c)
                if c.exactly_once && self.checkpoint.store != CheckpointStoreKind::Kafka =>
            {
                return Err(invalid(
                    "sink.exactly_once",
                    "needs checkpoint.store = \"kafka\": the position is committed in the same transaction as the batch",
                ));
            }
            _ => {}
        }
        if self.checkpoint.store != CheckpointStoreKind::Kafka {
            return Ok(());
        }
        if !matches!(
            self.sink.kind,
            SinkConfig::Kafka(_) | SinkConfig::EventHubsKafka(_)
        ) {
            return Err(invalid(
                "checkpoint.store",
                "\"kafka\" keeps checkpoints on the sink's brokers: it needs sink.kind = \"kafka\" or \"event_hubs\" (its Kafka endpoint); use \"file\" or \"table\" with this sink",
            ));
        }
        if self.checkpoint.topic.trim().is_empty() {
            return Err(invalid(
                "checkpoint.topic",
                "must name a topic (the default is mssql-ces-checkpoints)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(sink: &str, checkpoint: &str) -> Result<Config, ConfigError> {
        Config::from_parts(
            &format!(
                "[source]\nkind = \"synthetic\"\n[sink]\n{sink}\n[checkpoint]\n{checkpoint}\n"
            ),
            &[],
            &[],
        )
    }

    #[test]
    fn the_kafka_store_needs_a_kafka_sink_and_a_topic() {
        let kafka = "kind = \"kafka\"\nbootstrap_servers = \"b:9092\"";
        let c = load(kafka, "store = \"kafka\"").expect("valid");
        assert_eq!(c.checkpoint.store, CheckpointStoreKind::Kafka);
        assert_eq!(c.checkpoint.topic, "mssql-ces-checkpoints");
        let named = load(kafka, "store = \"kafka\"\ntopic = \"cp\"").expect("valid");
        assert_eq!(named.checkpoint.topic, "cp");
        let error = load("kind = \"stdout\"", "store = \"kafka\"")
            .expect_err("stdout")
            .to_string();
        assert!(
            error.contains("checkpoint.store") && error.contains("kafka"),
            "{error}"
        );
        let once = format!("{kafka}\nexactly_once = true");
        let c = load(&once, "store = \"kafka\"").expect("valid");
        assert!(matches!(&c.sink.kind, SinkConfig::Kafka(k) if k.exactly_once));
        let error = load(&once, "").expect_err("file store").to_string();
        assert!(
            error.contains("sink.exactly_once") && error.contains("checkpoint.store"),
            "{error}"
        );
        let hubs = "kind = \"event_hubs_kafka\"\nconnection_string = { env = \"EH\" }\nexactly_once = true";
        let error = load(hubs, "store = \"kafka\"")
            .expect_err("event hubs")
            .to_string();
        assert!(
            error.contains("sink.exactly_once") && error.contains("Event Hubs"),
            "{error}"
        );
        let error = load(kafka, "store = \"kafka\"\ntopic = \" \"")
            .expect_err("empty")
            .to_string();
        assert!(error.contains("checkpoint.topic"), "{error}");
    }
}

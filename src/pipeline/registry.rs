//! The encode thread's schema registry: ids for the schemas of Avro messages, and
//! the Confluent wire format around each datum. A registry that cannot be reached
//! is waited for (with backoff, up to the sink's delivery timeout); a refusal stops
//! the run, naming the subject.

use std::time::{Duration, Instant};

use super::PipelineError;
use crate::event::debezium::Record;
use crate::sink::OutgoingMessage;
use crate::sink::registry::{Part, SchemaRegistry, SchemaRegistrySettings, wire_format};

/// The record name of CES's Avro envelope (`schemas/ChangeEvent.avsc`).
const CES_RECORD: &str = "ChangeEvent";

pub(super) struct Registrar {
    registry: SchemaRegistry,
    handle: tokio::runtime::Handle,
    patience: Duration,
}

impl Registrar {
    /// On the encode thread (a blocking thread of the runtime).
    pub(super) fn new(
        settings: &SchemaRegistrySettings,
        patience: Duration,
    ) -> Result<Self, PipelineError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|e| {
            PipelineError::Registry(crate::sink::registry::RegistryError::Setting(e.to_string()))
        })?;
        Ok(Registrar {
            registry: SchemaRegistry::new(settings)?,
            handle,
            patience,
        })
    }

    /// The id of `schema` under `subject`, waiting out a registry that is down.
    fn id(&mut self, subject: &str, schema: &str) -> Result<u32, PipelineError> {
        let started = Instant::now();
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        loop {
            match self.handle.block_on(self.registry.id(subject, schema)) {
                Ok(id) => return Ok(id),
                Err(e) if e.is_transient() && started.elapsed() < self.patience => {
                    let wait = backoff.next_wait();
                    tracing::warn!(error = %e, %subject, retry_in_ms = wait.as_millis() as u64, "schema registry unavailable; retrying");
                    std::thread::sleep(wait);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// CES Avro messages: each datum of the `ChangeEvent` schema in the wire format.
    pub(super) fn ces(&mut self, messages: &mut [OutgoingMessage]) -> Result<(), PipelineError> {
        for message in messages {
            let subject = self
                .registry
                .settings
                .subject(&message.topic, Part::Value, CES_RECORD);
            let id = self.id(&subject, crate::event::avro::CHANGE_EVENT_SCHEMA)?;
            message.payload = wire_format(id, &message.payload);
        }
        Ok(())
    }

    /// Debezium Avro records: key and value in the wire format with their own ids
    /// (a tombstone's null value stays null).
    pub(super) fn debezium(
        &mut self,
        records: &mut [Record],
        table_topic: &str,
    ) -> Result<(), PipelineError> {
        for record in records {
            let Some(schemas) = record.avro.clone() else {
                continue;
            };
            let topic = record
                .topic
                .clone()
                .unwrap_or_else(|| table_topic.to_owned());
            for (part, bytes, schema) in [
                (Part::Key, &mut record.key, &schemas.key),
                (Part::Value, &mut record.value, &schemas.value),
            ] {
                let (Some(datum), Some((schema, name))) = (bytes.as_mut(), schema) else {
                    continue;
                };
                let subject = self.registry.settings.subject(&topic, part, name);
                let id = self.id(&subject, schema)?;
                *datum = wire_format(id, datum);
            }
        }
        Ok(())
    }
}

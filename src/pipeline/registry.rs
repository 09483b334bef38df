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
    /// Cancelled when the pipeline stops: a wait for the registry ends at once.
    stop: tokio_util::sync::CancellationToken,
}

impl Registrar {
    /// On the encode thread (a blocking thread of the runtime).
    pub(super) fn new(
        settings: &SchemaRegistrySettings,
        patience: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<Self, PipelineError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|e| {
            PipelineError::Registry(crate::sink::registry::RegistryError::Setting(e.to_string()))
        })?;
        Ok(Registrar {
            registry: SchemaRegistry::new(settings)?,
            handle,
            patience,
            stop,
        })
    }

    /// The id of `schema` under `subject`, waiting out a registry that is down. A
    /// stop of the pipeline ends the wait (a request or a pause) at once.
    fn id(&mut self, subject: &str, schema: &str) -> Result<u32, PipelineError> {
        let started = Instant::now();
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        let url = self.registry.settings.url.clone();
        let stopped = || {
            PipelineError::Registry(crate::sink::registry::RegistryError::Transient {
                url: url.clone(),
                reason: "the run stopped while waiting for it".into(),
            })
        };
        loop {
            let (registry, stop) = (&mut self.registry, &self.stop);
            let asked = self.handle.block_on(async {
                tokio::select! {
                    asked = registry.id(subject, schema) => Some(asked),
                    () = stop.cancelled() => None,
                }
            });
            match asked {
                None => return Err(stopped()),
                Some(Ok(id)) => return Ok(id),
                Some(Err(e)) if e.is_transient() && started.elapsed() < self.patience => {
                    let wait = backoff.next_wait();
                    tracing::warn!(error = %crate::error::Chain(&e), %subject, retry_in_ms = wait.as_millis() as u64, "schema registry unavailable; retrying");
                    let stop = &self.stop;
                    let slept = self.handle.block_on(async {
                        tokio::select! {
                            () = tokio::time::sleep(wait) => true,
                            () = stop.cancelled() => false,
                        }
                    });
                    if !slept {
                        return Err(stopped());
                    }
                }
                Some(Err(e)) => return Err(e.into()),
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

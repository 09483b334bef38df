//! The encode thread: each batch from the source encoded and routed into bounded
//! chunks of whole changes, a few chunks ahead of the send loop.

use super::*;
use crate::sink::settings::SchemaChangePlacement;
use crate::source::poller::BatchEvent;

/// Messages handed from the encode task to the send loop, at most, per chunk: a
/// chunk ends after the change that reaches either bound, or with its batch.
pub(super) const CHUNK_MESSAGES: usize = 256;

pub(super) const CHUNK_BYTES: u64 = 1 << 20;

/// Chunks encoded ahead of the one being sent. Between encoding and sending there
/// are at most six chunks (these, one being sent, one being built), each at most
/// [`CHUNK_MESSAGES`] messages or [`CHUNK_BYTES`] plus one change's messages.
pub(super) const ENCODED_CHUNKS_AHEAD: usize = 4;

/// What the encode task hands on.
pub(super) enum Encoded {
    Chunk(Chunk),
    /// The source had nothing new (only sent when the run stops once idle).
    Idle,
}

/// The messages of whole changes of one batch, in order.
#[derive(Default)]
pub(super) struct Chunk {
    pub(super) messages: Vec<OutgoingMessage>,
    /// Changes encoded into `messages`.
    pub(super) events: u64,
    pub(super) truncated_values: u64,
    /// Payload bytes of `messages`.
    pub(super) bytes: u64,
    /// Set on a batch's last chunk.
    pub(super) end: Option<Box<BatchEnd>>,
}

impl Chunk {
    pub(super) fn full(&self) -> bool {
        self.messages.len() >= CHUNK_MESSAGES || self.bytes >= CHUNK_BYTES
    }
}

/// What the send loop needs once a batch's messages are all sent.
pub(super) struct BatchEnd {
    pub(super) position: Position,
    pub(super) counts: BatchCounts,
    pub(super) max_lsn: Lsn,
    pub(super) last_commit: Option<chrono::DateTime<chrono::Utc>>,
}

/// Encodes and routes each batch from the source into chunks of messages; builds
/// the encoder once the first batch brings the stream GUID. Ends when the source
/// ends, after an error (handed on), or when the send loop stops listening. Blocks:
/// runs on a thread of its own.
pub(super) fn encode_batches(
    mut batches: mpsc::Receiver<Result<SourceItem, SourceError>>,
    factory: EncoderFactory,
    router: Router,
    out: mpsc::Sender<Result<Encoded, PipelineError>>,
    stop: CancellationToken,
) {
    let mut factory = Some(factory);
    let mut format: Option<Format> = None;
    let mut registrar = match router.registry() {
        Some((settings, patience)) => {
            match super::registry::Registrar::new(settings, *patience, stop) {
                Ok(registrar) => Some(registrar),
                Err(e) => {
                    let _ = out.blocking_send(Err(e));
                    return;
                }
            }
        }
        None => None,
    };
    while let Some(item) = batches.blocking_recv() {
        let (batch, database_guid) = match item {
            Ok(SourceItem::Batch(batch, guid)) => (*batch, guid),
            Ok(SourceItem::Idle) => {
                let _ = out.blocking_send(Ok(Encoded::Idle));
                return;
            }
            Err(e) => {
                let _ = out.blocking_send(Err(e.into()));
                return;
            }
        };
        if format.is_none()
            && let Some(factory) = factory.take()
        {
            let options = factory(database_guid);
            format = Some(match router.debezium_encoder(options.stream_guid) {
                Some(debezium) => Format::Debezium(Box::new(debezium)),
                None => Format::Ces(Encoder::new(options).data_only(router.binary())),
            });
        }
        let Some(format) = format.as_mut() else {
            continue;
        };
        let result = encode_batch(format, &router, registrar.as_mut(), batch, &out);
        match result {
            Ok(true) => {}
            Ok(false) => return, // the send loop stopped
            Err(e) => {
                let _ = out.blocking_send(Err(e));
                return;
            }
        }
    }
}

/// The envelope events are written in, with its encoder.
pub(super) enum Format {
    Ces(Encoder),
    /// Debezium's: stateful (serial numbers, the open transaction).
    Debezium(Box<crate::event::debezium::DebeziumEncoder>),
}

impl Format {
    /// The messages of a schema-change event.
    fn schema_messages(
        &mut self,
        router: &Router,
        registrar: Option<&mut super::registry::Registrar>,
        schema: &crate::event::schema_change::SchemaChange,
    ) -> Result<Vec<OutgoingMessage>, PipelineError> {
        match self {
            Format::Ces(encoder) => {
                let mut messages =
                    router.route_schema_change(schema, encoder.encode_schema_change(schema)?)?;
                if let Some(registrar) = registrar {
                    registrar.ces(&mut messages)?;
                }
                Ok(messages)
            }
            Format::Debezium(encoder) => {
                let mut records = vec![encoder.encode_schema_change(schema)?];
                if let Some(registrar) = registrar {
                    registrar.debezium(&mut records, "")?;
                }
                Ok(router.route_schema_records(records))
            }
        }
    }

    /// The messages of a change, and how many of its values were truncated.
    fn change_messages(
        &mut self,
        router: &Router,
        registrar: Option<&mut super::registry::Registrar>,
        change: &crate::event::Change,
    ) -> Result<(Vec<OutgoingMessage>, u64), PipelineError> {
        match self {
            Format::Ces(encoder) => {
                let event = encoder.encode(change)?;
                let truncated = event.truncated_values as u64;
                let mut messages = router.route(change, event)?;
                if let Some(registrar) = registrar {
                    registrar.ces(&mut messages)?;
                }
                Ok((messages, truncated))
            }
            Format::Debezium(encoder) => {
                let mut records = encoder.encode(change)?;
                let topic = router.debezium_topic(&change.table);
                if let Some(registrar) = registrar {
                    registrar.debezium(&mut records, &topic)?;
                }
                Ok((router.route_records(change, records, &topic), 0))
            }
        }
    }
}

/// Encodes one batch into chunks; false once the send loop no longer listens.
pub(super) fn encode_batch(
    format: &mut Format,
    router: &Router,
    mut registrar: Option<&mut super::registry::Registrar>,
    mut batch: Batch,
    out: &mpsc::Sender<Result<Encoded, PipelineError>>,
) -> Result<bool, PipelineError> {
    let mut counts = BatchCounts::default();
    let mut chunk = Chunk::default();
    for event in batch.events() {
        let change = match event {
            BatchEvent::Change(change) => change,
            // A poller with them on behind a router with them off sends none.
            BatchEvent::Schema(_) if router.schema_changes() == SchemaChangePlacement::Off => {
                continue;
            }
            BatchEvent::Schema(schema) => {
                let messages = format.schema_messages(router, registrar.as_deref_mut(), schema)?;
                counts.add_schema_change(schema.qualified_name(), messages.len() as u64);
                chunk.bytes += messages.iter().map(|m| m.payload.len() as u64).sum::<u64>();
                chunk.messages.extend(messages);
                continue;
            }
        };
        let (messages, truncated) =
            format.change_messages(router, registrar.as_deref_mut(), change)?;
        let (count, bytes) = (
            messages.len() as u64,
            messages.iter().map(|m| m.payload.len() as u64).sum::<u64>(),
        );
        counts.add(
            &change.table,
            change.operation,
            change.commit_time,
            count,
            bytes,
            truncated,
        );
        chunk.events += 1;
        chunk.truncated_values += truncated;
        chunk.bytes += bytes;
        chunk.messages.extend(messages);
        if out.is_closed() {
            return Ok(false); // the send loop stopped: no need to finish the chunk
        }
        if chunk.full() {
            let full = std::mem::take(&mut chunk);
            if out.blocking_send(Ok(Encoded::Chunk(full))).is_err() {
                return Ok(false);
            }
        }
    }
    if batch.heartbeat {
        let (message, made) = heartbeat_message(router, &batch);
        chunk.bytes += message.payload.len() as u64;
        chunk.messages.push(message);
        counts.add_heartbeat(made);
    }
    let last_commit = batch.changes.last().map(|change| {
        counts.set_last_commit(change.commit_time, change.commit_lsn);
        change.commit_time
    });
    if let Format::Debezium(encoder) = format {
        // Where a large transaction stands, for a restart inside it.
        batch.position.open_transaction = encoder.open_transaction();
    }
    chunk.end = Some(Box::new(BatchEnd {
        position: batch.position,
        counts,
        max_lsn: batch.max_lsn,
        last_commit,
    }));
    Ok(out.blocking_send(Ok(Encoded::Chunk(chunk))).is_ok())
}

/// The heartbeat record a batch carries, standing where the batch leaves the
/// stream, and when it was made.
fn heartbeat_message(
    router: &Router,
    batch: &Batch,
) -> (OutgoingMessage, chrono::DateTime<chrono::Utc>) {
    let made = chrono::Utc::now();
    let beat = crate::event::heartbeat::Heartbeat {
        stream: router.stream_key().to_owned(),
        database: batch.position.source.as_ref().map(|s| s.database.clone()),
        time: made,
        max_lsn: batch.max_lsn,
        last_event: batch.position.last_event,
    };
    (router.route_heartbeat(&beat), made)
}

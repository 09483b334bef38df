//! Wires the stages: poll → encode → route → send, and acknowledgements → checkpoint.
//!
//! ```text
//! poller ──batch──▶ encode + route ──chunks──▶ send (waits on a full queue) ──▶ sink
//!   (task)            (thread)                  │ deliveries, in send order
//!                                bounded channel ▼
//!                                  acker: awaits each delivery in order,
//!                                  then releases the batch's position ──▶ checkpoint
//! ```
//!
//! The three stages run at once on different threads: on two cores, sending from
//! the thread that also encoded was the pipeline's bottleneck.
//!
//! Invariants:
//! - The checkpoint only moves to a position whose every earlier message the
//!   destination acknowledged (the acker awaits deliveries strictly in send order).
//! - Memory is bounded: at most `source.batch_size` events per batch,
//!   `ENCODED_CHUNKS_AHEAD` chunks of encoded messages waiting to be sent, and
//!   [`IN_FLIGHT_BATCHES`] batches awaiting acknowledgement; the sink's queue applies
//!   backpressure to `send`.
//! - Shutdown (the token is cancelled) stops at once wherever the loop waits (a full
//!   producer queue, a free in-flight slot, a sink's batch send), waits up to the drain
//!   timeout for outstanding acknowledgements, and writes the final checkpoint of what
//!   was delivered: the whole shutdown is bounded by the drain timeout, brokers down or
//!   not.
//! - A source task that ends on its own (a panic, a closed channel) fails the run with
//!   the cause; only a shutdown or `until_idle` ends it cleanly.
//! - Checkpoint-store faults that can pass (deadlock victim, failover, a reset
//!   connection) are retried with backoff; the last acknowledged batch is checkpointed
//!   during idle periods too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{CheckpointError, CheckpointStore};
use crate::event::{Encoder, EncoderOptions, EventError};
use crate::lsn::Lsn;
use crate::metrics::{BatchCounts, Metrics};
use crate::position::Position;
use crate::sink::{Delivery, OutgoingMessage, Router, Sink, SinkError};
use crate::source::poller::{Batch, PollOutcome, Poller};
use crate::source::{ChangeSource, SourceError};

/// Where the pipeline's batches come from: the [`Poller`] (every run), or anything
/// else that hands out ready batches (benchmarks that measure the pipeline alone).
pub trait BatchSource: Send + 'static {
    /// The next batch, or [`PollOutcome::Idle`].
    fn poll(
        &mut self,
    ) -> impl std::future::Future<Output = Result<PollOutcome, SourceError>> + Send;
    /// The stream GUID, known once the first batch is out.
    fn stream_guid(&self) -> Option<uuid::Uuid>;
    /// Capture instances read (for the metrics).
    fn tracked_instances(&self) -> usize;
    /// The initial loads not finished (for the metrics); none by default.
    fn load_status(&self) -> Vec<crate::source::load::LoadStatus> {
        Vec::new()
    }
}

impl<S: ChangeSource + 'static> BatchSource for Poller<S> {
    async fn poll(&mut self) -> Result<PollOutcome, SourceError> {
        Poller::poll(self).await
    }

    fn stream_guid(&self) -> Option<uuid::Uuid> {
        Poller::stream_guid(self)
    }

    fn tracked_instances(&self) -> usize {
        Poller::tracked_instances(self)
    }

    fn load_status(&self) -> Vec<crate::source::load::LoadStatus> {
        Poller::load_status(self)
    }
}

/// Batches sent but not yet acknowledged, at most.
pub const IN_FLIGHT_BATCHES: usize = 16;

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Event(#[from] EventError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("the source stopped unexpectedly: {cause}")]
    SourceStopped { cause: String },
}

/// Timing settings of a run.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    pub poll_interval: Duration,
    pub checkpoint_interval: Duration,
    pub drain_timeout: Duration,
    /// Stop (successfully) once the source has nothing new and every message is
    /// acknowledged: for batch runs, benchmarks and tests.
    pub until_idle: bool,
    /// Where the run reports its progress (served when `[metrics] listen` is set).
    pub metrics: Arc<Metrics>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    pub events: u64,
    pub messages: u64,
    pub bytes: u64,
    pub truncated_values: u64,
    /// The last position written to the checkpoint store.
    pub checkpoint: Option<Position>,
}

struct Pending {
    deliveries: Vec<Delivery>,
    position: Position,
    counts: BatchCounts,
}

/// Builds the encoder once the stream GUID is known (from the catalog by default).
pub type EncoderFactory = Box<dyn FnOnce(uuid::Uuid) -> EncoderOptions + Send>;

/// How often a busy run logs a progress line.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Runs until `shutdown` is cancelled (or, with `until_idle`, until caught up).
pub async fn run<B: BatchSource>(
    poller: B,
    encoder_options: EncoderFactory,
    router: Router,
    mut sink: Sink,
    store: CheckpointStore,
    settings: PipelineSettings,
    shutdown: CancellationToken,
) -> Result<RunSummary, PipelineError> {
    let (tx, rx) = mpsc::channel::<Pending>(IN_FLIGHT_BATCHES);
    let failed = CancellationToken::new();
    let abandon = CancellationToken::new();
    let metrics = Arc::clone(&settings.metrics);
    let acker = tokio::spawn(acknowledge(
        rx,
        store,
        settings.checkpoint_interval,
        Arc::clone(&metrics),
        failed.clone(),
        abandon.clone(),
    ));

    // The source runs in its own task, a couple of batches ahead, so that reading
    // and generating changes overlaps encoding and sending.
    let (batch_tx, batch_rx) = mpsc::channel::<Result<SourceItem, SourceError>>(2);
    let stop_source = CancellationToken::new();
    let source = tokio::spawn(poll_source(
        poller,
        batch_tx,
        settings.poll_interval,
        settings.until_idle,
        Arc::clone(&metrics),
        stop_source.clone(),
    ));

    // Encoding runs on its own thread, a few chunks ahead of sending, so that
    // building the messages of one batch overlaps handing the previous ones to the
    // sink. A thread rather than a task: a task woken by the source would wait in the
    // source's worker's LIFO slot, where no other worker can take it, until the
    // source yields; the two would take turns instead of running at once.
    let (encoded_tx, mut encoded_rx) =
        mpsc::channel::<Result<Encoded, PipelineError>>(ENCODED_CHUNKS_AHEAD);
    let encode = tokio::task::spawn_blocking(move || {
        encode_batches(batch_rx, encoder_options, router, encoded_tx);
    });

    let mut summary = RunSummary::default();
    let mut last_report = Instant::now();
    // (events, messages) at the last progress line.
    let mut reported = (0u64, 0u64);
    let mut last_commit: Option<chrono::DateTime<chrono::Utc>> = None;
    let mut last_sent = None;
    // The deliveries of the batch being sent, until its last chunk.
    let mut deliveries = Vec::new();
    // Set when the source's channel closed without a word.
    let mut source_vanished = false;
    let outcome: Result<(), PipelineError> = async {
        loop {
            let item = tokio::select! {
                item = encoded_rx.recv() => item,
                () = shutdown.cancelled() => return Ok(()),
                () = failed.cancelled() => return Ok(()),
            };
            let chunk = match item {
                Some(Ok(Encoded::Idle)) => return Ok(()),
                None => {
                    source_vanished = true;
                    return Ok(());
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(Encoded::Chunk(chunk))) => chunk,
            };
            let counted = |e: SinkError| {
                metrics.delivery_failed(&e);
                e
            };
            summary.events += chunk.events;
            summary.truncated_values += chunk.truncated_values;
            summary.messages += chunk.messages.len() as u64;
            summary.bytes += chunk.bytes;
            for message in chunk.messages {
                // A full producer queue (brokers down) must not hold a shutdown.
                // `biased`: a send that can complete does, so a shutdown cuts a
                // batch short only while the queue is really full.
                let delivery = tokio::select! {
                    biased;
                    delivery = sink.send(message) => delivery.map_err(counted)?,
                    () = shutdown.cancelled() => return Ok(()),
                    () = failed.cancelled() => return Ok(()),
                };
                deliveries.push(delivery);
            }
            let Some(end) = chunk.end else {
                continue;
            };
            tokio::select! {
                biased;
                ended = sink.end_batch() => ended.map_err(counted)?,
                () = shutdown.cancelled() => return Ok(()),
                () = failed.cancelled() => return Ok(()),
            }
            last_commit = end.last_commit.or(last_commit);
            let mut position = end.position;
            position.sink_length = sink.durable_length();
            last_sent = position.last_event.or(last_sent);
            let pending = Pending {
                deliveries: std::mem::take(&mut deliveries),
                position,
                counts: end.counts,
            };
            // Counted before the acker can see it, so that it never counts down first.
            metrics.batch_sent(end.max_lsn);
            let sent = tokio::select! {
                biased;
                sent = tx.send(pending) => sent,
                () = shutdown.cancelled() => return Ok(()),
                // The acker failed: it may be retrying its last checkpoint, and the
                // drain deadline that bounds that starts only once this loop ends.
                () = failed.cancelled() => return Ok(()),
            };
            if sent.is_err() {
                return Ok(()); // the acker stopped: its error is reported below
            }
            if last_report.elapsed() >= PROGRESS_EVERY {
                let seconds = last_report.elapsed().as_secs_f64();
                let lag = last_commit
                    .map(|t| (chrono::Utc::now() - t).num_milliseconds() as f64 / 1000.0);
                tracing::info!(
                    events = summary.events,
                    messages = summary.messages,
                    events_per_second = ((summary.events - reported.0) as f64 / seconds) as u64,
                    messages_per_second = ((summary.messages - reported.1) as f64 / seconds) as u64,
                    // A number (tenths), absent until an event's commit time is known.
                    lag_seconds = lag.map(|l| (l * 10.0).round() / 10.0),
                    position = %last_sent.map_or_else(|| "none".to_owned(), |p| p.to_string()),
                    "progress"
                );
                last_report = Instant::now();
                reported = (summary.events, summary.messages);
            }
        }
    }
    .await;
    // What was sent of a batch cut short is not acknowledged here: it is sent again
    // on the next start.
    drop(deliveries);
    let deadline = tokio::time::Instant::now() + settings.drain_timeout;
    stop_source.cancel();
    // The encode task stops when it can no longer hand anything on, and with it goes
    // the source's channel.
    drop(encoded_rx);
    let encode_result = encode.await;
    let source_result = source.await;
    let source_failure = match (&source_result, &encode_result, source_vanished) {
        (Err(e), _, _) => Some(format!("the source task failed: {e}")),
        (_, Err(e), _) => Some(format!("the encode task failed: {e}")),
        (Ok(()), Ok(()), true) => Some("the source task ended without a result".to_owned()),
        (Ok(()), Ok(()), false) => None,
    };

    // Stop feeding the acker; let it finish what is in flight, within the bound.
    drop(tx);
    let mut acker = acker;
    let acker_result = match tokio::time::timeout_at(deadline, &mut acker).await {
        Ok(joined) => joined,
        Err(_) => {
            tracing::warn!(
                timeout_ms = settings.drain_timeout.as_millis() as u64,
                "shutdown.drain_timeout_ms passed with deliveries outstanding; they will be re-sent on the next start"
            );
            abandon.cancel();
            acker.await
        }
    };
    let acker_result =
        acker_result.map_err(|e| SinkError::Definite(format!("acknowledgement task: {e}")))?;
    // What is left of the bound, at most a moment each, for the flush and the close.
    let moment = |cap: Duration| {
        deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(cap)
    };
    if let Err(e) = sink.flush(moment(Duration::from_millis(100))).await {
        tracing::debug!(error = %e, "final flush");
    }
    match tokio::time::timeout(moment(Duration::from_secs(1)), sink.close()).await {
        Ok(Err(e)) => tracing::warn!(error = %e, "closing the sink"),
        Err(_) => tracing::warn!("closing the sink took too long; left behind"),
        Ok(Ok(())) => {}
    }
    let (store, acker_result) = acker_result;
    // Only now, with the sink closed, may a standby take the stream over.
    drop(store);
    summary.checkpoint = acker_result?;
    outcome?;
    if let Some(cause) = source_failure {
        return Err(PipelineError::SourceStopped { cause });
    }
    Ok(summary)
}

/// What the source task hands on.
enum SourceItem {
    /// A batch, with the database GUID (the default stream GUID).
    Batch(Box<Batch>, uuid::Uuid),
    /// Nothing new (only sent when the run stops once idle).
    Idle,
}

/// Messages handed from the encode task to the send loop, at most, per chunk: a
/// chunk ends after the change that reaches either bound, or with its batch.
const CHUNK_MESSAGES: usize = 256;
const CHUNK_BYTES: u64 = 1 << 20;
/// Chunks encoded ahead of the one being sent. Between encoding and sending there
/// are at most six chunks (these, one being sent, one being built), each at most
/// [`CHUNK_MESSAGES`] messages or [`CHUNK_BYTES`] plus one change's messages.
const ENCODED_CHUNKS_AHEAD: usize = 4;

/// What the encode task hands on.
enum Encoded {
    Chunk(Chunk),
    /// The source had nothing new (only sent when the run stops once idle).
    Idle,
}

/// The messages of whole changes of one batch, in order.
#[derive(Default)]
struct Chunk {
    messages: Vec<OutgoingMessage>,
    /// Changes encoded into `messages`.
    events: u64,
    truncated_values: u64,
    /// Payload bytes of `messages`.
    bytes: u64,
    /// Set on a batch's last chunk.
    end: Option<Box<BatchEnd>>,
}

impl Chunk {
    fn full(&self) -> bool {
        self.messages.len() >= CHUNK_MESSAGES || self.bytes >= CHUNK_BYTES
    }
}

/// What the send loop needs once a batch's messages are all sent.
struct BatchEnd {
    position: Position,
    counts: BatchCounts,
    max_lsn: Lsn,
    last_commit: Option<chrono::DateTime<chrono::Utc>>,
}

/// Encodes and routes each batch from the source into chunks of messages; builds
/// the encoder once the first batch brings the stream GUID. Ends when the source
/// ends, after an error (handed on), or when the send loop stops listening. Blocks:
/// runs on a thread of its own.
fn encode_batches(
    mut batches: mpsc::Receiver<Result<SourceItem, SourceError>>,
    factory: EncoderFactory,
    router: Router,
    out: mpsc::Sender<Result<Encoded, PipelineError>>,
) {
    let mut factory = Some(factory);
    let mut encoder: Option<Encoder> = None;
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
        if encoder.is_none()
            && let Some(factory) = factory.take()
        {
            encoder = Some(Encoder::new(factory(database_guid)).data_only(router.binary()));
        }
        let Some(encoder) = encoder.as_ref() else {
            continue;
        };
        match encode_batch(encoder, &router, batch, &out) {
            Ok(true) => {}
            Ok(false) => return, // the send loop stopped
            Err(e) => {
                let _ = out.blocking_send(Err(e));
                return;
            }
        }
    }
}

/// Encodes one batch into chunks; false once the send loop no longer listens.
fn encode_batch(
    encoder: &Encoder,
    router: &Router,
    batch: Batch,
    out: &mpsc::Sender<Result<Encoded, PipelineError>>,
) -> Result<bool, PipelineError> {
    let mut counts = BatchCounts::default();
    let mut chunk = Chunk::default();
    for change in &batch.changes {
        let event = encoder.encode(change)?;
        let truncated = event.truncated_values as u64;
        let messages = router.route(change, event)?;
        let (count, bytes) = (
            messages.len() as u64,
            messages.iter().map(|m| m.payload.len() as u64).sum::<u64>(),
        );
        counts.add(&change.table, change.operation, count, bytes, truncated);
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
    let last_commit = batch.changes.last().map(|change| {
        counts.set_last_commit(change.commit_time, change.commit_lsn);
        change.commit_time
    });
    chunk.end = Some(Box::new(BatchEnd {
        position: batch.position,
        counts,
        max_lsn: batch.max_lsn,
        last_commit,
    }));
    Ok(out.blocking_send(Ok(Encoded::Chunk(chunk))).is_ok())
}

/// Polls until stopped; retries transient errors with backoff; sends batches on.
async fn poll_source<B: BatchSource>(
    mut poller: B,
    tx: mpsc::Sender<Result<SourceItem, SourceError>>,
    poll_interval: Duration,
    until_idle: bool,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new();
    loop {
        let started = Instant::now();
        let polled = tokio::select! {
            polled = poller.poll() => polled,
            () = stop.cancelled() => return,
        };
        match &polled {
            Ok(outcome) => {
                let rows = match outcome {
                    PollOutcome::Batch(batch) => Some(batch.changes.len()),
                    PollOutcome::Idle => None,
                };
                metrics.poll_finished(started.elapsed(), rows, poller.tracked_instances());
                metrics.set_loads(&poller.load_status());
            }
            Err(e) => metrics.poll_failed(e),
        }
        match polled {
            Ok(PollOutcome::Batch(batch)) => {
                backoff.reset();
                // Known once the catalog was read, which precedes every batch; the
                // poller fails instead of inventing one.
                let Some(guid) = poller.stream_guid() else {
                    let _ = tx.send(Err(SourceError::DatabaseGuidUnreadable)).await;
                    return;
                };
                if tx
                    .send(Ok(SourceItem::Batch(Box::new(batch), guid)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Ok(PollOutcome::Idle) => {
                backoff.reset();
                if until_idle {
                    let _ = tx.send(Ok(SourceItem::Idle)).await;
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(poll_interval) => {}
                    () = stop.cancelled() => return,
                }
            }
            Err(e) if e.is_transient() => {
                let wait = backoff.next();
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "transient source error; retrying");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = stop.cancelled() => return,
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
}

/// Awaits deliveries in send order; writes the checkpoint of what is delivered at
/// most every `interval` — also when no later batch comes — and once more at the end.
async fn acknowledge(
    mut rx: mpsc::Receiver<Pending>,
    mut store: CheckpointStore,
    interval: Duration,
    metrics: Arc<Metrics>,
    failed: CancellationToken,
    abandon: CancellationToken,
) -> (CheckpointStore, Result<Option<Position>, PipelineError>) {
    let outcome =
        acknowledge_into(&mut rx, &mut store, interval, &metrics, &failed, &abandon).await;
    // The store (and with it the stream's lease) goes back to the caller, which
    // releases it only after the sink is closed.
    (store, outcome)
}

async fn acknowledge_into(
    rx: &mut mpsc::Receiver<Pending>,
    store: &mut CheckpointStore,
    interval: Duration,
    metrics: &Metrics,
    failed: &CancellationToken,
    abandon: &CancellationToken,
) -> Result<Option<Position>, PipelineError> {
    let mut delivered: Option<Position> = None;
    let mut written: Option<Position> = None;
    let mut last_write = Instant::now();
    let result: Result<(), PipelineError> = async {
        loop {
            // Wake up at the next moment a write is due, even with nothing new.
            let due = last_write + interval;
            let next = tokio::select! {
                next = rx.recv() => next,
                () = abandon.cancelled() => None,
                () = tokio::time::sleep_until(due.into()), if delivered != written => {
                    if let Some(position) = &delivered {
                        save(store, position, metrics, abandon).await?;
                        written = delivered.clone();
                        last_write = Instant::now();
                    }
                    continue;
                }
            };
            let Some(pending) = next else {
                break;
            };
            for delivery in pending.deliveries {
                tokio::select! {
                    result = delivery.wait() => result.inspect_err(|e| metrics.delivery_failed(e))?,
                    () = abandon.cancelled() => return Ok(()),
                }
            }
            metrics.batch_delivered(&pending.counts);
            delivered = Some(pending.position);
            if last_write.elapsed() >= interval
                && delivered != written
                && let Some(position) = &delivered
            {
                save(store, position, metrics, abandon).await?;
                written = delivered.clone();
                last_write = Instant::now();
            }
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        failed.cancel();
    }
    // The final checkpoint: everything acknowledged, even after a delivery failure.
    if delivered != written
        && let Some(position) = &delivered
    {
        save(store, position, metrics, abandon).await?;
        written = delivered.clone();
    }
    result?;
    Ok(written)
}

/// Writes a checkpoint, retrying faults that can pass with backoff (a few times for
/// the final write, until `abandon` otherwise).
async fn save(
    store: &mut CheckpointStore,
    position: &Position,
    metrics: &Metrics,
    abandon: &CancellationToken,
) -> Result<(), CheckpointError> {
    let mut backoff = Backoff::new();
    let mut attempts = 0;
    loop {
        match store.save(position).await {
            Ok(()) => {
                metrics.checkpoint_written();
                return Ok(());
            }
            Err(e)
                if e.is_transient()
                    && (!abandon.is_cancelled() || attempts < SAVE_ATTEMPTS_AFTER_ABANDON) =>
            {
                attempts += 1;
                let wait = backoff.next();
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "checkpoint write failed; retrying");
                // Past the drain timeout, the waits are cut short.
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = abandon.cancelled(), if !abandon.is_cancelled() => {}
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// How often a final checkpoint write is tried when the store's faults persist.
const SAVE_ATTEMPTS_AFTER_ABANDON: u32 = 5;

/// Exponential backoff for transient errors: 100 ms doubling to 30 s.
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Backoff {
            next: Duration::from_millis(100),
        }
    }

    fn reset(&mut self) {
        self.next = Duration::from_millis(100);
    }

    fn next(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(Duration::from_secs(30));
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::event::{Encoding, FinalEventMode, MessageSizeLimit};
    use crate::sink::settings::{CloudEventsMode, PartitionKeyScheme};
    use crate::source::poller::PollerConfig;
    use crate::source::sim::synthetic::{SyntheticConfig, SyntheticSource};

    /// A batch of the synthetic workload, with a 1.5 MiB text value (cut to 1 MiB,
    /// then segmented) every `large` changes.
    fn batch(large: u64) -> Batch {
        let config = SyntheticConfig {
            seed: 3,
            transactions: Some(400),
            rate_per_second: None,
            large_value_every: 0,
            existing_rows: 0,
        };
        let mut poller = Poller::new(SyntheticSource::new(config), PollerConfig::default(), None);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut batch = match runtime.block_on(poller.poll()) {
            Ok(PollOutcome::Batch(batch)) => batch,
            other => panic!("no batch: {other:?}"),
        };
        if large > 0 {
            for change in batch.changes.iter_mut().step_by(large as usize) {
                let text = change
                    .current
                    .iter_mut()
                    .flatten()
                    .find(|v| matches!(v, crate::event::Value::Text(_)));
                if let Some(value) = text {
                    *value = crate::event::Value::Text("x".repeat(1_500_000));
                }
            }
        }
        batch
    }

    fn encoder() -> Encoder {
        Encoder::new(EncoderOptions {
            stream_guid: uuid::Uuid::nil(),
            encoding: Encoding::Json,
            final_event: FinalEventMode::LastInTransaction,
            max_message_size: MessageSizeLimit::default(),
        })
    }

    fn router() -> Router {
        Router::new(
            "t",
            PartitionKeyScheme::PrimaryKey,
            None,
            CloudEventsMode::Structured,
            Encoding::Json,
            "test",
        )
    }

    /// Chunks hold whole changes, stay within their bounds (but for one change's
    /// messages), carry the batch's end on the last one only, and add up to encoding
    /// the batch change by change.
    #[test]
    fn a_batch_is_encoded_into_bounded_chunks_of_whole_changes() {
        for large in [0, 7] {
            let batch = batch(large);
            let (encoder, router) = (encoder(), router());
            let mut truncated = 0;
            let expected: Vec<Vec<u8>> = batch
                .changes
                .iter()
                .flat_map(|c| {
                    let event = encoder.encode(c).unwrap();
                    truncated += event.truncated_values as u64;
                    router.route(c, event).unwrap()
                })
                .map(|m| m.payload)
                .collect();
            let (position, max_lsn) = (batch.position.clone(), batch.max_lsn);
            let changes = batch.changes.len() as u64;
            let (tx, mut rx) = mpsc::channel(1_000);
            assert!(encode_batch(&encoder, &router, batch, &tx).unwrap());
            drop(tx);
            let mut chunks = Vec::new();
            while let Some(Ok(Encoded::Chunk(chunk))) = rx.blocking_recv() {
                chunks.push(chunk);
            }
            assert!(chunks.len() > 1, "{} chunks", chunks.len());
            let (last, full) = chunks.split_last().unwrap();
            for chunk in full {
                assert!(chunk.end.is_none());
                assert!(chunk.full(), "a chunk before the last is full");
                let without_last_change = chunk.messages.len() - 1;
                assert!(without_last_change < CHUNK_MESSAGES || large > 0);
            }
            let end = last.end.as_ref().unwrap();
            assert_eq!(end.position, position);
            assert_eq!(end.max_lsn, max_lsn);
            assert_eq!(chunks.iter().map(|c| c.events).sum::<u64>(), changes);
            let cut: u64 = chunks.iter().map(|c| c.truncated_values).sum();
            assert_eq!(cut, truncated);
            assert_eq!(cut > 0, large > 0, "1.5 MiB values are cut to 1 MiB");
            let bytes: u64 = expected.iter().map(|p| p.len() as u64).sum();
            assert_eq!(chunks.iter().map(|c| c.bytes).sum::<u64>(), bytes);
            let got: Vec<Vec<u8>> = chunks
                .into_iter()
                .flat_map(|c| c.messages)
                .map(|m| m.payload)
                .collect();
            assert_eq!(got, expected);
            if large > 0 {
                assert!(bytes > 2 * CHUNK_BYTES, "large values reach the byte bound");
            }
        }
    }

    /// The encode task stops as soon as the send loop stops listening.
    #[test]
    fn encoding_stops_when_nobody_listens() {
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        assert!(!encode_batch(&encoder(), &router(), batch(0), &tx).unwrap());
    }

    #[test]
    fn backoff_doubles_to_a_cap_and_resets() {
        let mut b = Backoff::new();
        let waits: Vec<u128> = (0..12).map(|_| b.next().as_millis()).collect();
        assert_eq!(&waits[..4], &[100, 200, 400, 800]);
        assert_eq!(waits[11], 30_000);
        b.reset();
        assert_eq!(b.next().as_millis(), 100);
    }
}

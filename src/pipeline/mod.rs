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
//! - Shutdown (the token is cancelled) stops at once between batches; a batch begun
//!   is finished (its messages are in the producer's queue and are delivered
//!   anyway), except that every wait (a full producer queue, a free in-flight slot, a
//!   sink's batch send) ends at the drain timeout from the signal. Then it waits up to
//!   the same deadline for outstanding acknowledgements and writes the final
//!   checkpoint of what was delivered: the whole shutdown is bounded by the drain
//!   timeout, brokers down or not.
//! - A source task that ends on its own (a panic, a closed channel) fails the run with
//!   the cause; only a shutdown or `until_idle` ends it cleanly.
//! - Checkpoint-store faults that can pass (deadlock victim, failover, a reset
//!   connection) are retried with backoff; the last acknowledged batch is checkpointed
//!   during idle periods too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::checkpoint::{CheckpointError, CheckpointStore};
use crate::event::{Encoder, EncoderOptions, EventError};
use crate::lsn::Lsn;
use crate::metrics::{BatchCounts, Metrics};
use crate::position::Position;
use crate::sink::{Delivery, OutgoingMessage, Router, Sink, SinkError};
use crate::source::poller::{Batch, PollOutcome, Poller};
use crate::source::{ChangeSource, SourceError};

mod acker;
mod encode;
mod registry;
mod send;
mod signals;
mod source;

use acker::{AckerResult, CommitTicket, LeaseKeeper, LeaseView, Pending, acknowledge};
use encode::{Chunk, ENCODED_CHUNKS_AHEAD, Encoded, encode_batches};
use send::Sender;
use signals::Signals;
use source::poll_source;

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
    fn load_status(&self) -> Vec<crate::source::initial_load::LoadStatus> {
        Vec::new()
    }
    /// Whether an idle poll only means "nothing yet" (see
    /// [`CdcReads::more_expected`](crate::source::CdcReads::more_expected)): `until_idle` then keeps polling.
    fn more_expected(&self) -> bool {
        false
    }
    /// What the source did to the CDC configuration (none by default).
    fn capture_actions(&self) -> crate::source::poller::CaptureActions {
        Default::default()
    }
    /// The capture job's latest log scan session, when read (for the metrics);
    /// none by default.
    fn capture_job(&self) -> Option<crate::source::LogScan> {
        None
    }
    /// The cleanup job's retention, when read (for the metrics); unknown by
    /// default.
    fn cleanup_retention(&self) -> crate::source::poller::Retention {
        crate::source::poller::Retention::Unknown
    }
    /// Hands the source the positions the checkpoint holds, as each is written;
    /// ignored by default.
    fn watch_checkpoints(&mut self, _checkpoints: tokio::sync::watch::Receiver<Option<Position>>) {}
    /// Where requests to re-snapshot a table go; none by default.
    fn snapshot_handle(&self) -> Option<crate::source::poller::SnapshotHandle> {
        None
    }
    /// The re-snapshots under way and the last finished (for the metrics); none by
    /// default.
    fn resnapshot_status(&self) -> Vec<crate::source::poller::ResnapshotStatus> {
        Vec::new()
    }
}

/// Takes the poller's re-snapshot handle back from the metrics when dropped.
struct SnapshotHandleGuard(Arc<Metrics>);

impl Drop for SnapshotHandleGuard {
    fn drop(&mut self) {
        self.0.set_snapshot_handle(None);
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

    fn load_status(&self) -> Vec<crate::source::initial_load::LoadStatus> {
        Poller::load_status(self)
    }

    fn more_expected(&self) -> bool {
        Poller::more_expected(self)
    }

    fn watch_checkpoints(&mut self, checkpoints: tokio::sync::watch::Receiver<Option<Position>>) {
        Poller::watch_checkpoints(self, checkpoints);
    }

    fn capture_actions(&self) -> crate::source::poller::CaptureActions {
        Poller::capture_actions(self)
    }

    fn capture_job(&self) -> Option<crate::source::LogScan> {
        Poller::capture_job_scan(self).cloned()
    }

    fn cleanup_retention(&self) -> crate::source::poller::Retention {
        Poller::cleanup_retention(self)
    }

    fn snapshot_handle(&self) -> Option<crate::source::poller::SnapshotHandle> {
        Some(Poller::snapshot_handle(self))
    }

    fn resnapshot_status(&self) -> Vec<crate::source::poller::ResnapshotStatus> {
        Poller::resnapshot_status(self)
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
    Debezium(#[from] crate::event::debezium::DebeziumError),
    #[error(transparent)]
    Registry(#[from] crate::sink::registry::RegistryError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("the source stopped unexpectedly: {cause}")]
    SourceStopped { cause: StageFailure },
    /// The source was idle, but not everything was delivered in time.
    #[error(
        "the source is idle but {events} events were not delivered within {} ms (sink.delivery_timeout_ms); the checkpoint holds what was, and a restart sends the rest",
        waited.as_millis()
    )]
    Undelivered { events: u64, waited: Duration },
    /// The task that awaits deliveries and writes checkpoints is gone: a defect, not
    /// a sink's verdict. The checkpoint holds the last position it wrote.
    #[error(
        "the acknowledgement stage stopped unexpectedly ({cause}); the checkpoint holds the last position it wrote, and a restart resumes from there"
    )]
    AckerStopped { cause: StageFailure },
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
    /// How long a stop because the source is idle waits for what is outstanding
    /// (the sink's delivery timeout): anything still undelivered then fails the run,
    /// naming how many events.
    pub idle_drain_timeout: Duration,
    /// Where the run reports its progress (served when `[metrics] listen` is set).
    pub metrics: Arc<Metrics>,
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Events handed to the sink (delivered or not).
    pub events: u64,
    /// Messages handed to the sink (delivered or not).
    pub messages: u64,
    pub bytes: u64,
    pub truncated_values: u64,
    /// Events of the batches delivered in full (what the checkpoint covers).
    pub delivered_events: u64,
    /// Messages of the batches delivered in full.
    pub delivered_messages: u64,
    /// The last position written to the checkpoint store.
    pub checkpoint: Option<Position>,
}

/// Builds the encoder once the stream GUID is known (from the catalog by default).
pub type EncoderFactory = Box<dyn FnOnce(uuid::Uuid) -> EncoderOptions + Send>;

/// Runs until `shutdown` is cancelled (or, with `until_idle`, until caught up).
pub async fn run<B: BatchSource>(
    poller: B,
    encoder_options: EncoderFactory,
    router: Router,
    sink: Sink,
    store: CheckpointStore,
    settings: PipelineSettings,
    shutdown: CancellationToken,
) -> Result<RunSummary, PipelineError> {
    let (tx, rx) = mpsc::channel::<Pending>(IN_FLIGHT_BATCHES);
    let signals = Signals::new(shutdown);
    let metrics = Arc::clone(&settings.metrics);
    let (lease_keeper, lease) = LeaseKeeper::for_store(&store);
    // Positions as they are checkpointed, for the source.
    let (durable_tx, durable_rx) = tokio::sync::watch::channel(None);
    let acker = tokio::spawn(acknowledge(
        rx,
        store,
        settings.checkpoint_interval,
        Arc::clone(&metrics),
        signals.clone(),
        lease_keeper,
        durable_tx,
    ));

    let mut poller = poller;
    poller.watch_checkpoints(durable_rx);
    // Taken back when the run ends: a request then finds no stream to answer it.
    metrics.set_snapshot_handle(poller.snapshot_handle());
    let _no_more_snapshots = SnapshotHandleGuard(Arc::clone(&metrics));
    let mut upstream = spawn_source_and_encoder(
        poller,
        encoder_options,
        router,
        &settings,
        Arc::clone(&metrics),
    );
    let transactions = sink.transaction_bound();
    let mut sender = Sender::new(sink, tx, metrics, &signals, lease, settings.drain_timeout)
        .with_transactions(transactions);
    let outcome = sender.run(&mut upstream.encoded).await;
    let Sender {
        sink,
        tx,
        summary,
        deliveries,
        source_vanished,
        idle,
        cut,
        ..
    } = sender;
    // What was sent of a batch cut short is not acknowledged here: it is sent again
    // on the next start.
    drop(deliveries);
    // Idle: everything sent is to be delivered, within the delivery timeout. A
    // shutdown: within the drain timeout, the rest re-sent on the next start.
    let drain = if idle {
        settings.idle_drain_timeout.max(settings.drain_timeout)
    } else {
        settings.drain_timeout
    };
    // A shutdown's bound counts from the signal: finishing the batch begun took
    // part of it.
    let from_now = tokio::time::Instant::now() + drain;
    let deadline = cut.deadline().map_or(from_now, |bound| bound.min(from_now));
    drop(cut);
    let source_failure = upstream.stop(source_vanished).await;
    // Stop feeding the acker; let it finish what is in flight, within the bound.
    drop(tx);
    let acker_result = drain_acker(acker, deadline, drain, &signals, settings.drain_timeout).await;
    close_sink(sink, deadline).await;
    let AckerResult {
        store,
        checkpoint,
        delivered,
    } = acker_result?;
    // Only now, with the sink closed, may a standby take the stream over.
    drop(store);
    let mut summary = summary;
    summary.delivered_events = delivered.events;
    summary.delivered_messages = delivered.messages;
    // A message abandoned because of the send loop's failure (a transaction that
    // could not commit) is not the cause: the send loop's error is.
    let abandoned = matches!(
        &checkpoint,
        Err(PipelineError::Sink(SinkError::Abandoned(_)))
    );
    let outcome = match outcome {
        Err(e) if abandoned => return Err(e),
        other => other,
    };
    summary.checkpoint = checkpoint?;
    outcome?;
    if let Some(cause) = source_failure {
        return Err(PipelineError::SourceStopped { cause });
    }
    let undelivered = summary.events.saturating_sub(summary.delivered_events);
    // A signal during the idle drain makes it a shutdown: what is abandoned is sent
    // again on the next start, as after any signal.
    if idle && undelivered > 0 && !signals.shutdown.is_cancelled() {
        return Err(PipelineError::Undelivered {
            events: undelivered,
            waited: drain,
        });
    }
    Ok(summary)
}

/// The task that reads the source a couple of batches ahead (so that reading and
/// generating changes overlaps encoding and sending), and the thread that encodes a
/// few chunks ahead of sending (so that building the messages of one batch overlaps
/// handing the previous ones to the sink). A thread rather than a task: a task woken
/// by the source would wait in the source's worker's LIFO slot, where no other worker
/// can take it, until the source yields; the two would take turns instead of running
/// at once.
fn spawn_source_and_encoder<B: BatchSource>(
    poller: B,
    encoder_options: EncoderFactory,
    router: Router,
    settings: &PipelineSettings,
    metrics: Arc<Metrics>,
) -> Upstream {
    let (batch_tx, batch_rx) = mpsc::channel::<Result<SourceItem, SourceError>>(2);
    let stop_source = CancellationToken::new();
    let source = tokio::spawn(poll_source(
        poller,
        batch_tx,
        settings.poll_interval,
        settings.until_idle,
        source::Heartbeats::new(router.heartbeat_interval()),
        metrics,
        stop_source.clone(),
    ));
    let (encoded_tx, encoded_rx) =
        mpsc::channel::<Result<Encoded, PipelineError>>(ENCODED_CHUNKS_AHEAD);
    let stop_encoder = stop_source.clone();
    let encode = tokio::task::spawn_blocking(move || {
        encode_batches(batch_rx, encoder_options, router, encoded_tx, stop_encoder);
    });
    Upstream {
        source,
        encode,
        stop_source,
        encoded: encoded_rx,
    }
}

/// The stages before the send loop, as `run` holds them.
struct Upstream {
    source: tokio::task::JoinHandle<()>,
    encode: tokio::task::JoinHandle<()>,
    /// Cancels the source task.
    stop_source: CancellationToken,
    /// The encoded chunks, in order.
    encoded: mpsc::Receiver<Result<Encoded, PipelineError>>,
}

impl Upstream {
    /// Stops the source and the encode thread; why either ended badly, if it did.
    async fn stop(self, source_vanished: bool) -> Option<StageFailure> {
        self.stop_source.cancel();
        // The encode task stops when it can no longer hand anything on, and with it
        // goes the source's channel.
        drop(self.encoded);
        let encode_result = self.encode.await;
        let source_result = self.source.await;
        match (source_result, encode_result, source_vanished) {
            (Err(e), _, _) => Some(StageFailure::of("source", e)),
            (_, Err(e), _) => Some(StageFailure::of("encode", e)),
            (Ok(()), Ok(()), true) => Some(StageFailure::Vanished),
            (Ok(()), Ok(()), false) => None,
        }
    }
}

/// Waits for the acker to release what is in flight, up to `deadline`; after it,
/// abandons the rest (re-sent on the next start) and waits for the final checkpoint.
///
/// A shutdown signalled meanwhile (during an idle stop's longer wait) brings the
/// deadline to `signal_bound` (`shutdown.drain_timeout_ms`) from then, the bound a
/// signal promises.
async fn drain_acker(
    mut acker: tokio::task::JoinHandle<AckerResult>,
    mut deadline: tokio::time::Instant,
    drain_timeout: Duration,
    signals: &Signals,
    signal_bound: Duration,
) -> Result<AckerResult, PipelineError> {
    let waited = loop {
        tokio::select! {
            joined = &mut acker => break Ok(joined),
            () = tokio::time::sleep_until(deadline) => break Err(()),
            () = signals.shutdown.cancelled(), if deadline > tokio::time::Instant::now() + signal_bound => {
                deadline = tokio::time::Instant::now() + signal_bound;
            }
        }
    };
    let joined = match waited {
        Ok(joined) => joined,
        // The acker takes what is settled and says what it abandons, if anything
        // (a drain timeout of 0 with everything delivered abandons nothing).
        Err(_) => {
            tracing::debug!(
                timeout_ms = drain_timeout.as_millis() as u64,
                "shutdown.drain_timeout_ms passed: abandoning what is not delivered"
            );
            signals.abandon.cancel();
            acker.await
        }
    };
    joined.map_err(|e| PipelineError::AckerStopped {
        cause: StageFailure::of("acknowledgement", e),
    })
}

/// Flushes and closes the sink with what is left of the drain bound, at most a
/// moment each.
async fn close_sink(mut sink: Sink, deadline: tokio::time::Instant) {
    let moment = |cap: Duration| {
        deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(cap)
    };
    if let Err(e) = sink.flush(moment(Duration::from_millis(100))).await {
        tracing::debug!(error = %crate::error::Chain(&e), "final flush");
    }
    match tokio::time::timeout(moment(Duration::from_secs(1)), sink.close()).await {
        Ok(Err(e)) => tracing::warn!(error = %crate::error::Chain(&e), "closing the sink"),
        Err(_) => tracing::warn!("closing the sink took too long; left behind"),
        Ok(Ok(())) => {}
    }
}

/// A stage of the pipeline that ended without its result.
#[derive(Debug, thiserror::Error)]
pub enum StageFailure {
    #[error("the {stage} task panicked: {message}")]
    Panicked {
        stage: &'static str,
        message: String,
    },
    #[error("the {stage} task was cancelled")]
    Cancelled { stage: &'static str },
    #[error("the source task ended without a result")]
    Vanished,
}

impl StageFailure {
    /// Why a task's join failed: its panic's message, or its cancellation.
    fn of(stage: &'static str, error: tokio::task::JoinError) -> Self {
        if !error.is_panic() {
            return StageFailure::Cancelled { stage };
        }
        let payload = error.into_panic();
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(the panic carried no message)".to_owned());
        StageFailure::Panicked { stage, message }
    }
}

/// What the source task hands on.
enum SourceItem {
    /// A batch, with the database GUID (the default stream GUID).
    Batch(Box<Batch>, uuid::Uuid),
    /// Nothing new (only sent when the run stops once idle).
    Idle,
}

/// The backoff of the source's polls and of checkpoint writes: 100 ms doubling to
/// 30 s.
fn backoff() -> Backoff {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;
    use encode::{CHUNK_BYTES, CHUNK_MESSAGES, encode_batch};

    #[tokio::test]
    async fn a_stage_that_panics_or_is_cancelled_says_which_and_why() {
        let panicked = tokio::spawn(async { panic!("boom at row 7") }).await;
        let failure = StageFailure::of("acknowledgement", panicked.unwrap_err());
        assert!(
            matches!(&failure, StageFailure::Panicked { stage: "acknowledgement", message } if message == "boom at row 7"),
            "{failure:?}"
        );
        assert_eq!(
            failure.to_string(),
            "the acknowledgement task panicked: boom at row 7"
        );
        let formatted = tokio::spawn(async { panic!("{} rows", 3) }).await;
        assert!(matches!(
            StageFailure::of("source", formatted.unwrap_err()),
            StageFailure::Panicked { message, .. } if message == "3 rows"
        ));
        let pending = tokio::spawn(std::future::pending::<()>());
        pending.abort();
        let cancelled = StageFailure::of("encode", pending.await.unwrap_err());
        assert!(matches!(
            cancelled,
            StageFailure::Cancelled { stage: "encode" }
        ));
        let stopped = PipelineError::AckerStopped { cause: failure };
        assert!(
            stopped.to_string().contains("restart resumes"),
            "an honest operator message, not a sink's verdict: {stopped}"
        );
    }

    use crate::event::{Encoding, FinalEventMode, MessageSizeLimit};
    use crate::sink::settings::{CloudEventsMode, PartitionKeyScheme};
    use crate::source::poller::PollerConfig;
    use crate::source::synthetic::{SyntheticConfig, SyntheticSource};

    /// A batch of the synthetic workload, with a 1.5 MiB text value (cut to 1 MiB,
    /// then segmented) every `large` changes.
    fn batch(large: u64) -> Batch {
        let config = SyntheticConfig {
            seed: 3,
            transactions: Some(400),
            rate_per_second: None,
            large_value_every: 0,
            existing_rows: 0,
            oversized_value_every: 0,
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
            assert!(
                encode_batch(
                    &mut encode::Format::Ces(encoder.clone()),
                    &router,
                    None,
                    batch,
                    &tx
                )
                .unwrap()
            );
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
        assert!(
            !encode_batch(
                &mut encode::Format::Ces(encoder()),
                &router(),
                None,
                batch(0),
                &tx
            )
            .unwrap()
        );
    }

    #[test]
    fn the_pipelines_backoff_is_100_ms_doubling_to_30_s() {
        let mut b = backoff();
        let waits: Vec<u128> = (0..12).map(|_| b.next_wait().as_millis()).collect();
        for (wait, step) in waits.iter().zip([100, 200, 400, 800]) {
            assert!(step / 2 <= *wait && *wait <= step, "{waits:?}");
        }
        assert!((15_000..=30_000).contains(&waits[11]), "{waits:?}");
    }
}

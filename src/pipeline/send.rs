//! The send loop: hands each chunk's messages to the sink (waiting on a full queue,
//! never past a shutdown's drain bound) and each finished batch, with its
//! deliveries, to the acker; logs progress.
//!
//! A shutdown between batches stops the loop at once. A batch begun is finished
//! first, up to the drain timeout from the signal: its messages are in the
//! producer's queue and will be delivered whether or not it is checkpointed, so
//! cutting it would leave delivered events behind the checkpoint (re-sent on the
//! next start). Past the drain timeout it is cut all the same (brokers down).

use super::*;

/// The send loop: hands each chunk's messages to the sink, and each finished batch,
/// with its deliveries, to the acker.
pub(super) struct Sender {
    pub(super) sink: Sink,
    pub(super) tx: mpsc::Sender<Pending>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) shutdown: CancellationToken,
    /// Cancelled `shutdown.drain_timeout_ms` after the shutdown: what stops a batch
    /// begun.
    pub(super) cut: Cut,
    /// Cancelled when the acker failed.
    pub(super) failed: CancellationToken,
    pub(super) summary: RunSummary,
    /// The deliveries of the batch being sent, until its last chunk.
    pub(super) deliveries: Vec<Delivery>,
    /// Set when the encode task's channel closed without a word.
    pub(super) source_vanished: bool,
    /// Set when the run stopped because the source was idle (`until_idle`).
    pub(super) idle: bool,
    /// When the batch being sent sent its first message.
    pub(super) batch_started: Option<tokio::time::Instant>,
    pub(super) progress: Progress,
    /// What the acker last confirmed of the stream's lease.
    pub(super) lease: tokio::sync::watch::Receiver<LeaseView>,
    /// With Kafka transactions: when the transaction batches share is committed.
    transaction_bound: Option<crate::sink::kafka::TransactionBound>,
    /// The Kafka transaction not committed yet.
    open: Option<OpenTransaction>,
    /// The number of the last transaction committed, which the acker waits for
    /// before a batch of it counts.
    commits: tokio::sync::watch::Sender<u64>,
    /// Transactions begun.
    transactions: u64,
    /// Payload bytes of the batch being sent.
    batch_bytes: u64,
}

/// A Kafka transaction whose batches are sent (and handed to the acker, which
/// awaits their deliveries) but not committed yet.
struct OpenTransaction {
    /// Its number (the first is 1).
    number: u64,
    /// The transaction's first send.
    since: tokio::time::Instant,
    bytes: u64,
    /// The position after its last batch, which the commit writes.
    position: Position,
}

impl OpenTransaction {
    /// When `bound`'s time makes it due.
    fn due_at(&self, bound: crate::sink::kafka::TransactionBound) -> tokio::time::Instant {
        self.since + bound.max_open
    }

    /// Whether `bound`'s time or bytes make it due.
    fn is_due(&self, bound: crate::sink::kafka::TransactionBound) -> bool {
        tokio::time::Instant::now() >= self.due_at(bound) || self.bytes >= bound.max_bytes
    }
}

impl Sender {
    pub(super) fn new(
        sink: Sink,
        tx: mpsc::Sender<Pending>,
        metrics: Arc<Metrics>,
        signals: &Signals,
        lease: tokio::sync::watch::Receiver<LeaseView>,
        drain_timeout: Duration,
    ) -> Self {
        Sender {
            sink,
            tx,
            metrics,
            cut: Cut::after(&signals.shutdown, drain_timeout),
            shutdown: signals.shutdown.clone(),
            failed: signals.acker_failed.clone(),
            summary: RunSummary::default(),
            deliveries: Vec::new(),
            source_vanished: false,
            idle: false,
            batch_started: None,
            progress: Progress::new(),
            lease,
            transaction_bound: None,
            open: None,
            commits: tokio::sync::watch::Sender::new(0),
            transactions: 0,
            batch_bytes: 0,
        }
    }

    /// Batches share a transaction up to `bound` (Kafka with `sink.exactly_once`).
    pub(super) fn with_transactions(
        mut self,
        bound: Option<crate::sink::kafka::TransactionBound>,
    ) -> Self {
        self.transaction_bound = bound;
        self
    }

    /// Why a batch whose end failed (a Kafka transaction not committed) failed, as
    /// its own messages' delivery reports say: the commit says only that some
    /// failed (librdkafka's "N message(s) failed delivery"), each report says why
    /// (a topic the login may not write, say). Its messages have settled by then
    /// (a commit flushes them), so this waits briefly at most.
    async fn refusal_in_batch(&mut self) -> Option<SinkError> {
        let deliveries = std::mem::take(&mut self.deliveries);
        let reports = async {
            for delivery in deliveries {
                if let Err(e) = delivery.wait().await {
                    return Some(e);
                }
            }
            None
        };
        tokio::time::timeout(Duration::from_secs(2), reports)
            .await
            .ok()
            .flatten()
    }

    /// What ends a wait of the loop: the shutdown between batches; within a batch
    /// begun, the drain timeout after it.
    fn stop(&self) -> CancellationToken {
        if self.batch_started.is_some() || self.open.is_some() {
            self.cut.token.clone()
        } else {
            self.shutdown.clone()
        }
    }

    /// Waits, when the lease lapses with a session, until its last confirmation is
    /// recent: a process that may have lost its stream to a standby hands nothing
    /// more to the sink. `false` when the run is to stop.
    async fn lease_confirmed(&mut self) -> bool {
        let stop = self.stop();
        let mut waited: Option<tokio::time::Instant> = None;
        loop {
            let view = *self.lease.borrow_and_update();
            let LeaseView::ConfirmedAt { at, trusted_for } = view else {
                return true;
            };
            if at.elapsed() <= trusted_for {
                if let Some(since) = waited {
                    tracing::info!(
                        paused_ms = since.elapsed().as_millis() as u64,
                        "the stream's lease is confirmed: sending again"
                    );
                }
                return true;
            }
            if waited.is_none() {
                tracing::warn!(
                    last_confirmed_ms_ago = at.elapsed().as_millis() as u64,
                    "sending paused: the checkpoint store has not confirmed that this process still holds the stream's lease"
                );
                waited = Some(tokio::time::Instant::now());
            }
            tokio::select! {
                changed = self.lease.changed() => {
                    if changed.is_err() {
                        return false; // the acker is gone: its error ends the run
                    }
                }
                () = stop.cancelled() => return false,
                () = self.failed.cancelled() => return false,
            }
        }
    }

    /// Until the source is idle (with `until_idle`) or gone, a shutdown, the acker's
    /// failure or an error. Every wait ends on a shutdown or the acker's failure.
    pub(super) async fn run(
        &mut self,
        encoded: &mut mpsc::Receiver<Result<Encoded, PipelineError>>,
    ) -> Result<(), PipelineError> {
        loop {
            let stop = self.stop();
            // A transaction of whole batches is committed when it is due, also
            // while nothing more comes, and at a shutdown between batches.
            let due = self
                .open
                .as_ref()
                .zip(self.transaction_bound)
                .filter(|_| self.batch_started.is_none())
                .map(|(open, bound)| open.due_at(bound));
            // An open transaction must commit before the coordinator aborts it
            // (its time-out is the delivery timeout and 5 s): a batch whose next
            // messages do not come in time (an encoder waiting on the schema
            // registry) fails the run, saying so, rather than the commit later.
            let expires = self
                .transaction_bound
                .and(self.transaction_since())
                .zip(self.sink.delivery_timeout())
                .map(|(since, timeout)| since + timeout);
            let item = tokio::select! {
                item = encoded.recv() => item,
                () = sleep_until_some(expires) => {
                    let e = SinkError::transient(format!(
                        "the open Kafka transaction would outlive sink.delivery_timeout_ms ({} s) waiting for its batch's next messages (is the schema registry answering?); it is aborted, and a restart resumes from the checkpoint",
                        self.sink.delivery_timeout().unwrap_or_default().as_secs()
                    ));
                    self.metrics.delivery_failed(&e);
                    return Err(e.into());
                }
                () = sleep_until_some(due) => {
                    if !self.commit_open().await? {
                        return Ok(());
                    }
                    continue;
                }
                () = self.shutdown.cancelled(), if due.is_some() => {
                    self.commit_open().await?;
                    return Ok(());
                }
                () = stop.cancelled() => return Ok(()),
                () = self.failed.cancelled() => return Ok(()),
            };
            let chunk = match item {
                Some(Ok(Encoded::Idle)) => {
                    self.idle = true;
                    self.commit_open().await?;
                    return Ok(());
                }
                None => {
                    self.source_vanished = true;
                    return Ok(());
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(Encoded::Chunk(chunk))) => chunk,
            };
            if !self.send_chunk(chunk).await? {
                return Ok(());
            }
        }
    }

    /// When the open transaction (or the batch that will open one) first sent.
    fn transaction_since(&self) -> Option<tokio::time::Instant> {
        self.open
            .as_ref()
            .map(|open| open.since)
            .or(self.batch_started)
    }

    /// Commits the open transaction, which lets the acker count its batches.
    /// `false` when the run is to stop. A commit that fails because messages were
    /// refused leaves their refusals to the acker, which awaits every delivery
    /// and reports the first (the commit says only that some failed).
    async fn commit_open(&mut self) -> Result<bool, PipelineError> {
        let Some(open) = self.open.as_ref() else {
            return Ok(true);
        };
        let (number, position) = (open.number, open.position.clone());
        let stop = self.stop();
        // Not cut short by the acker's failure: a message it found purged by an
        // aborted transaction is a consequence, and the commit's error the cause.
        let ended = tokio::select! {
            biased;
            ended = self.sink.end_batch(&position) => ended,
            () = stop.cancelled() => return Ok(false),
        };
        self.open = None;
        if let Err(e) = ended {
            self.metrics.delivery_failed(&e);
            return Err(e.into());
        }
        self.commits.send_replace(number);
        Ok(true)
    }

    /// Hands a batch whose end is done to the acker. `false` when the run is to stop.
    async fn hand_over(&mut self, pending: Pending, max_lsn: Lsn) -> bool {
        // Counted before the acker can see it, so that it never counts down first.
        self.metrics.batch_sent(max_lsn, &pending.counts);
        let stop = self.stop();
        let sent = tokio::select! {
            biased;
            sent = self.tx.send(pending) => sent,
            () = stop.cancelled() => return false,
            // The acker failed: it may be retrying its last checkpoint, and the
            // drain deadline that bounds that starts only once this loop ends.
            () = self.failed.cancelled() => return false,
        };
        // An error: the acker stopped, and its error is reported after the loop.
        sent.is_ok()
    }

    /// Sends a chunk's messages and, after its batch's last, hands the batch to the
    /// acker. `false` when the run is to stop.
    async fn send_chunk(&mut self, chunk: Chunk) -> Result<bool, PipelineError> {
        if !self.lease_confirmed().await {
            return Ok(false);
        }
        let metrics = Arc::clone(&self.metrics);
        let counted = |e: SinkError| {
            metrics.delivery_failed(&e);
            e
        };
        self.summary.events += chunk.events;
        self.summary.truncated_values += chunk.truncated_values;
        self.summary.messages += chunk.messages.len() as u64;
        self.summary.bytes += chunk.bytes;
        self.batch_bytes += chunk.bytes;
        if self.batch_started.is_none() {
            self.batch_started = Some(tokio::time::Instant::now());
        }
        let stop = self.stop();
        for message in chunk.messages {
            // The lease's bound holds per message: a send that waited on a full
            // queue past it does not hand the rest of the chunk over unconfirmed.
            if !self.lease_confirmed().await {
                return Ok(false);
            }
            // A full producer queue (brokers down) must not hold a shutdown past
            // its drain timeout.
            let delivery = tokio::select! {
                biased;
                delivery = self.sink.send(message) => delivery.map_err(counted)?,
                () = stop.cancelled() => return Ok(false),
                () = self.failed.cancelled() => return Ok(false),
            };
            self.deliveries.push(delivery);
        }
        let Some(end) = chunk.end else {
            return Ok(true);
        };
        if self.transaction_bound.is_none() {
            let ended = tokio::select! {
                biased;
                ended = self.sink.end_batch(&end.position) => ended,
                () = stop.cancelled() => return Ok(false),
                () = self.failed.cancelled() => return Ok(false),
            };
            if let Err(e) = ended {
                return Err(counted(self.refusal_in_batch().await.unwrap_or(e)).into());
            }
        }
        self.progress.last_commit = end.last_commit.or(self.progress.last_commit);
        let mut position = end.position;
        position.sink_length = self.sink.durable_length();
        position.sink_file = self.sink.durable_file();
        self.progress.last_sent = position.last_event.or(self.progress.last_sent);
        // The delivery timeout counts from the batch's first send.
        let started = self.batch_started.take();
        let deadline = self
            .sink
            .delivery_timeout()
            .zip(started)
            .map(|(timeout, started)| started + timeout);
        let batch_bytes = std::mem::take(&mut self.batch_bytes);
        // In a transaction, the batch counts once the transaction commits, which
        // comes once it is due (or the stream pauses or stops: see `run`); the
        // acker meanwhile awaits its deliveries.
        let commit = self.transaction_bound.map(|_| {
            let number = match &mut self.open {
                Some(open) => {
                    open.bytes += batch_bytes;
                    open.position = position.clone();
                    open.number
                }
                None => {
                    self.transactions += 1;
                    self.open = Some(OpenTransaction {
                        number: self.transactions,
                        since: started.unwrap_or_else(tokio::time::Instant::now),
                        bytes: batch_bytes,
                        position: position.clone(),
                    });
                    self.transactions
                }
            };
            CommitTicket {
                number,
                committed: self.commits.subscribe(),
            }
        });
        let pending = Pending {
            deliveries: std::mem::take(&mut self.deliveries),
            position,
            counts: end.counts,
            deadline,
            commit,
        };
        if !self.hand_over(pending, end.max_lsn).await {
            return Ok(false);
        }
        let due = self
            .open
            .as_ref()
            .zip(self.transaction_bound)
            .is_some_and(|(open, bound)| open.is_due(bound));
        if due && !self.commit_open().await? {
            return Ok(false);
        }
        self.progress.report(&self.summary);
        Ok(true)
    }
}

/// Sleeps until `at`; for ever without one.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The progress line a busy run logs every [`PROGRESS_EVERY`].
pub(super) struct Progress {
    last_report: tokio::time::Instant,
    /// (events, messages) at the last progress line.
    reported: (u64, u64),
    last_commit: Option<chrono::DateTime<chrono::Utc>>,
    last_sent: Option<crate::position::EventPosition>,
}

impl Progress {
    fn new() -> Self {
        Progress {
            last_report: tokio::time::Instant::now(),
            reported: (0, 0),
            last_commit: None,
            last_sent: None,
        }
    }

    fn report(&mut self, summary: &RunSummary) {
        if self.last_report.elapsed() < PROGRESS_EVERY {
            return;
        }
        let seconds = self.last_report.elapsed().as_secs_f64();
        let lag = self
            .last_commit
            .map(|t| (chrono::Utc::now() - t).num_milliseconds() as f64 / 1000.0);
        tracing::info!(
            events = summary.events,
            messages = summary.messages,
            events_per_second = ((summary.events - self.reported.0) as f64 / seconds) as u64,
            messages_per_second = ((summary.messages - self.reported.1) as f64 / seconds) as u64,
            // A number (tenths), absent until an event's commit time is known.
            lag_seconds = lag.map(|l| (l * 10.0).round() / 10.0),
            position = %self.last_sent.map_or_else(|| "none".to_owned(), |p| p.to_string()),
            "progress"
        );
        self.last_report = tokio::time::Instant::now();
        self.reported = (summary.events, summary.messages);
    }
}

/// How often a busy run logs a progress line.
pub(super) const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// A token cancelled a fixed time after a shutdown, and when that was; its watcher
/// ends with it.
pub(super) struct Cut {
    pub(super) token: CancellationToken,
    /// When the shutdown was seen.
    signalled_at: Arc<std::sync::OnceLock<tokio::time::Instant>>,
    bound: Duration,
    _watcher: tokio_util::sync::DropGuard,
}

impl Cut {
    fn after(shutdown: &CancellationToken, bound: Duration) -> Self {
        let token = CancellationToken::new();
        let ended = CancellationToken::new();
        let signalled_at = Arc::new(std::sync::OnceLock::new());
        tokio::spawn({
            let (shutdown, token, ended) = (shutdown.clone(), token.clone(), ended.clone());
            let signalled_at = Arc::clone(&signalled_at);
            async move {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = ended.cancelled() => return,
                }
                let at = tokio::time::Instant::now();
                signalled_at.get_or_init(|| at);
                tokio::select! {
                    () = tokio::time::sleep_until(at + bound) => token.cancel(),
                    () = ended.cancelled() => {}
                }
            }
        });
        Cut {
            token,
            signalled_at,
            bound,
            _watcher: ended.drop_guard(),
        }
    }

    /// When the shutdown's drain bound ends, if the watcher has seen it.
    pub(super) fn deadline(&self) -> Option<tokio::time::Instant> {
        self.signalled_at.get().map(|at| *at + self.bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_busy_run_says_its_progress_every_ten_seconds_with_its_rates() {
        let log = crate::test_log::capture();
        let mut progress = Progress::new();
        let mut summary = RunSummary::default();
        let at = Lsn::from_parts(0x2A, 0x10, 3);
        progress.last_sent = Some(crate::position::EventPosition {
            commit_lsn: at,
            sequence_number: 6,
        });
        for _ in 0..25 {
            summary.events += 400;
            summary.messages += 500;
            progress.report(&summary);
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let lines: Vec<serde_json::Value> = log
            .lines()
            .into_iter()
            .filter(|l| l["message"] == "progress")
            .collect();
        // At 10 s and 20 s, not at every batch.
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0]["events"], 4400);
        assert_eq!(lines[0]["events_per_second"], 440);
        assert_eq!(lines[1]["messages_per_second"], 500);
        assert_eq!(lines[1]["position"], "0000002A:00000010:0003 #6");
        assert!(
            lines[0]
                .get("lag_seconds")
                .is_none_or(serde_json::Value::is_null)
        );
    }
}

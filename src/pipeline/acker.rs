//! The acker: an ordered finalizer. It awaits each batch's deliveries strictly in
//! send order and only then releases the batch's position to the checkpoint, with
//! backoff on store faults that can pass.

use super::*;

// The acker's clock is tokio's, so that its intervals and backoff run in simulated
// time under test (it is the system's monotonic clock otherwise).
use tokio::time::Instant;

pub(super) struct Pending {
    pub(super) deliveries: Vec<Delivery>,
    pub(super) position: Position,
    pub(super) counts: BatchCounts,
    /// When the batch's deliveries must have settled (its first send plus the
    /// sink's delivery timeout), where the run counts it.
    pub(super) deadline: Option<Instant>,
    /// In a Kafka transaction: the batch counts only once it is committed.
    pub(super) commit: Option<CommitTicket>,
}

/// Which transaction a batch is in, and the number of the last one committed.
pub(super) struct CommitTicket {
    pub(super) number: u64,
    pub(super) committed: tokio::sync::watch::Receiver<u64>,
}

impl CommitTicket {
    /// Whether the batch's transaction is committed.
    fn is_committed(&self) -> bool {
        *self.committed.borrow() >= self.number
    }

    /// Until the batch's transaction is committed; for ever when it never will be
    /// (the sender is gone: the acker's input ends then).
    async fn committed(&mut self) {
        let number = self.number;
        if self
            .committed
            .wait_for(|last| *last >= number)
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }
}

/// The batches of a Kafka transaction whose deliveries are acknowledged and that
/// waits for its commit to count: they count together (the checkpoint can only
/// move to a committed transaction's position). Only their counts and the last
/// position are kept, so the acker goes on taking batches meanwhile.
struct Uncommitted {
    ticket: CommitTicket,
    position: Position,
    counts: Vec<BatchCounts>,
}

/// Awaits deliveries in send order; writes the checkpoint of what is delivered at
/// most every `interval` — also when no later batch comes — and once more at the end.
/// What the acker hands back.
pub(super) struct AckerResult {
    /// The store, with the stream's lease (released only after the sink is closed).
    pub(super) store: CheckpointStore,
    /// The last position it checkpointed.
    pub(super) checkpoint: Result<Option<Position>, PipelineError>,
    /// What the batches delivered in full held.
    pub(super) delivered: Delivered,
}

/// Events and messages of the batches whose every delivery was acknowledged.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Delivered {
    pub(super) events: u64,
    pub(super) messages: u64,
}

/// What the sender knows of the stream's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LeaseView {
    /// It lasts as long as the process (a file lock, a memory store).
    Lasting,
    /// It lapses with a session: last confirmed `at`, and trusted for
    /// `trusted_for` after that (the store's
    /// [`LeaseTiming`](crate::checkpoint::table::LeaseTiming)).
    ConfirmedAt { at: Instant, trusted_for: Duration },
}

impl LeaseView {
    /// For a run on `store`, confirmed now (the run took it and read the
    /// checkpoint under it just before).
    pub(super) fn of(store: &CheckpointStore) -> Self {
        match store.lapsing_lease() {
            Some(timing) => LeaseView::ConfirmedAt {
                at: Instant::now(),
                trusted_for: timing.trusted_for,
            },
            None => LeaseView::Lasting,
        }
    }
}

/// The acker's side of the lease: confirms it every `confirm_every` of the store's
/// [`LeaseTiming`](crate::checkpoint::table::LeaseTiming) (between batches, and
/// while a delivery is awaited) and after every checkpoint write, and tells the
/// sender. A store whose lease lasts is asked as often (the default's), for what it
/// does in the meantime (the Kafka store writes its last position again).
pub(super) struct LeaseKeeper {
    view: tokio::sync::watch::Sender<LeaseView>,
    confirm_every: Duration,
    next_check: Instant,
    /// Since when confirming has failed with faults that can pass.
    failing_since: Option<Instant>,
}

impl LeaseKeeper {
    /// The keeper of a run on `store`, and the sender's view of the lease.
    pub(super) fn for_store(
        store: &CheckpointStore,
    ) -> (Self, tokio::sync::watch::Receiver<LeaseView>) {
        let (view, seen) = tokio::sync::watch::channel(LeaseView::of(store));
        let confirm_every = store.lapsing_lease().unwrap_or_default().confirm_every;
        let keeper = LeaseKeeper {
            view,
            confirm_every,
            next_check: Instant::now() + confirm_every,
            failing_since: None,
        };
        (keeper, seen)
    }

    fn due(&self) -> bool {
        Instant::now() >= self.next_check
    }

    /// Confirms the lease; a lease another process holds fails the run, a fault
    /// that can pass only withholds the confirmation (so the sender pauses once
    /// the last one is `trusted_for` old).
    async fn check(&mut self, store: &mut CheckpointStore) -> Result<(), CheckpointError> {
        let checked = store.verify_lease().await;
        self.next_check = Instant::now() + self.confirm_every;
        match checked {
            Ok(()) => {
                self.confirmed();
                Ok(())
            }
            Err(e) if e.is_transient() => {
                if self.failing_since.is_none() {
                    tracing::warn!(error = %crate::error::Chain(&e), "cannot confirm this process still holds the stream's lease; sending pauses until it can");
                    self.failing_since = Some(Instant::now());
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn confirmed(&mut self) {
        if let Some(since) = self.failing_since.take() {
            tracing::info!(
                after_ms = since.elapsed().as_millis() as u64,
                "the stream's lease is confirmed again"
            );
        }
        let view = *self.view.borrow();
        if let LeaseView::ConfirmedAt { trusted_for, .. } = view {
            self.view.send_replace(LeaseView::ConfirmedAt {
                at: Instant::now(),
                trusted_for,
            });
        }
    }
}

pub(super) async fn acknowledge(
    mut rx: mpsc::Receiver<Pending>,
    mut store: CheckpointStore,
    interval: Duration,
    metrics: Arc<Metrics>,
    signals: Signals,
    mut lease: LeaseKeeper,
    durable: tokio::sync::watch::Sender<Option<Position>>,
) -> AckerResult {
    let mut state = Checkpointed::new(durable);
    let checkpoint = acknowledge_into(
        &mut rx, &mut store, interval, &metrics, &signals, &mut lease, &mut state,
    )
    .await;
    // The store (and with it the stream's lease) goes back to the caller, which
    // releases it only after the sink is closed.
    AckerResult {
        store,
        checkpoint,
        delivered: state.tally,
    }
}

/// What is delivered and what the checkpoint holds of it.
pub(super) struct Checkpointed {
    delivered: Option<Position>,
    written: Option<Position>,
    last_write: Instant,
    /// Where each position written is told (the poller, which retires a capture
    /// instance only once what it had to deliver is checkpointed).
    durable: tokio::sync::watch::Sender<Option<Position>>,
    /// The events and messages of the batches counted so far.
    tally: Delivered,
}

impl Checkpointed {
    pub(super) fn new(durable: tokio::sync::watch::Sender<Option<Position>>) -> Self {
        Checkpointed {
            delivered: None,
            written: None,
            last_write: Instant::now(),
            durable,
            tally: Delivered::default(),
        }
    }

    /// Counts batches whose deliveries are acknowledged (and, in a transaction,
    /// committed): the checkpoint may move to `position`.
    fn count(&mut self, position: Position, counts: &[BatchCounts], metrics: &Metrics) {
        for batch in counts {
            metrics.batch_delivered(batch);
            let (events, messages) = batch.totals();
            self.tally.events += events;
            self.tally.messages += messages;
        }
        self.delivered = Some(position);
    }

    fn behind(&self) -> bool {
        self.delivered != self.written
    }

    /// Writes what is delivered when a write is due (`interval` since the last), or
    /// confirms the lease when that is due: a busy acker never idles into the
    /// timers of its loop.
    async fn write_if_due(
        &mut self,
        interval: Duration,
        store: &mut CheckpointStore,
        lease: &mut LeaseKeeper,
        metrics: &Metrics,
        abandon: &CancellationToken,
    ) -> Result<(), CheckpointError> {
        if self.last_write.elapsed() >= interval && self.behind() {
            self.write(store, lease, metrics, abandon).await?;
        } else if lease.due() && !abandon.is_cancelled() {
            lease.check(store).await?;
        }
        Ok(())
    }

    /// Writes what is delivered if the checkpoint is behind it (which also confirms
    /// the lease).
    async fn write(
        &mut self,
        store: &mut CheckpointStore,
        lease: &mut LeaseKeeper,
        metrics: &Metrics,
        abandon: &CancellationToken,
    ) -> Result<(), CheckpointError> {
        if let Some(position) = self.delivered.as_ref().filter(|_| self.behind()) {
            save(store, position, metrics, abandon).await?;
            lease.confirmed();
            self.written = self.delivered.clone();
            self.last_write = Instant::now();
            self.durable.send_replace(self.written.clone());
        }
        Ok(())
    }
}

async fn acknowledge_into(
    rx: &mut mpsc::Receiver<Pending>,
    store: &mut CheckpointStore,
    interval: Duration,
    metrics: &Metrics,
    signals: &Signals,
    lease: &mut LeaseKeeper,
    state: &mut Checkpointed,
) -> Result<Option<Position>, PipelineError> {
    let abandon = &signals.abandon;
    let mut uncommitted: Option<Uncommitted> = None;
    let result: Result<(), PipelineError> = async {
        loop {
            // Wake up at the next moment a write is due, even with nothing new.
            let due = state.last_write + interval;
            // `biased`: what is queued is looked at before an abandon, so that a batch
            // already delivered is never called outstanding.
            let next = tokio::select! {
                biased;
                next = rx.recv() => next,
                () = abandon.cancelled() => None,
                () = commit_of(&mut uncommitted) => {
                    if let Some(batches) = uncommitted.take() {
                        state.count(batches.position, &batches.counts, metrics);
                        state.write_if_due(interval, store, lease, metrics, abandon).await?;
                    }
                    continue;
                }
                () = tokio::time::sleep_until(due), if state.behind() => {
                    state.write(store, lease, metrics, abandon).await?;
                    continue;
                }
                // Past the drain deadline, no more checks: they could take a
                // connect and a fence wait, which the exit must not.
                () = tokio::time::sleep_until(lease.next_check), if !abandon.is_cancelled() => {
                    lease.check(store).await?;
                    continue;
                }
            };
            let Some(mut pending) = next else {
                // The last transaction may have committed as the sender stopped.
                if let Some(batches) = uncommitted.take_if(|u| u.ticket.is_committed()) {
                    state.count(batches.position, &batches.counts, metrics);
                }
                break;
            };
            let deliveries = std::mem::take(&mut pending.deliveries);
            if !settle(deliveries, pending.deadline, store, lease, metrics, abandon).await? {
                tracing::warn!(
                    batches = 1 + rx.len(),
                    "shutdown.drain_timeout_ms passed with deliveries outstanding; they will be re-sent on the next start"
                );
                return Ok(());
            }
            match pending.commit.take() {
                None => state.count(pending.position, &[pending.counts], metrics),
                // In a Kafka transaction: it counts once committed. A transaction
                // that never commits counts for nothing: its batches are aborted,
                // and sent again from the last committed position.
                Some(ticket) => {
                    // The transaction before this one has committed by now (the
                    // sender commits one before it begins the next).
                    if let Some(earlier) = uncommitted.take_if(|u| u.ticket.number != ticket.number)
                        && earlier.ticket.is_committed()
                    {
                        state.count(earlier.position, &earlier.counts, metrics);
                    }
                    let batches = uncommitted.get_or_insert_with(|| Uncommitted {
                        ticket,
                        position: pending.position.clone(),
                        counts: Vec::new(),
                    });
                    batches.position = pending.position;
                    batches.counts.push(pending.counts);
                    if batches.ticket.is_committed()
                        && let Some(batches) = uncommitted.take()
                    {
                        state.count(batches.position, &batches.counts, metrics);
                    }
                }
            }
            state.write_if_due(interval, store, lease, metrics, abandon).await?;
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        signals.acker_failed.cancel();
    }
    // The final checkpoint: everything acknowledged, even after a delivery failure.
    state.write(store, lease, metrics, abandon).await?;
    result?;
    Ok(state.written.clone())
}

/// Until the transaction of the batches waiting for it commits; for ever without
/// one.
async fn commit_of(uncommitted: &mut Option<Uncommitted>) {
    match uncommitted {
        Some(batches) => batches.ticket.committed().await,
        None => std::future::pending().await,
    }
}

/// Awaits a batch's deliveries in order, confirming the lease meanwhile (a delivery
/// awaited for long, brokers down, does not hold its confirmation). `Ok(false)` when
/// the drain deadline came first; a settled delivery counts even then.
async fn settle(
    deliveries: Vec<Delivery>,
    deadline: Option<Instant>,
    store: &mut CheckpointStore,
    lease: &mut LeaseKeeper,
    metrics: &Metrics,
    abandon: &CancellationToken,
) -> Result<bool, PipelineError> {
    for delivery in deliveries {
        let wait = delivery.wait_until(deadline);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                biased;
                result = &mut wait => {
                    result.inspect_err(|e| metrics.delivery_failed(e))?;
                    break;
                }
                () = abandon.cancelled() => return Ok(false),
                () = tokio::time::sleep_until(lease.next_check), if !abandon.is_cancelled() => {
                    lease.check(store).await?;
                }
            }
        }
    }
    Ok(true)
}

/// Writes a checkpoint, retrying faults that can pass with backoff (a few times for
/// the final write, until `abandon` otherwise).
pub(super) async fn save(
    store: &mut CheckpointStore,
    position: &Position,
    metrics: &Metrics,
    abandon: &CancellationToken,
) -> Result<(), CheckpointError> {
    let mut backoff = backoff();
    let mut attempts = 0;
    // Past the drain deadline, the final write has a wall-time budget of its own:
    // a store that hangs (a connect, a fence wait, a hung mount) must not hold the
    // exit.
    let mut budget_end: Option<Instant> = None;
    loop {
        if abandon.is_cancelled() && budget_end.is_none() {
            budget_end = Some(Instant::now() + FINAL_SAVE_BUDGET);
        }
        // A write under way when the drain deadline passes gets the budget from
        // then on: a store that hangs in a write begun earlier does not hold the exit.
        let write = store.save(position);
        tokio::pin!(write);
        let saved = loop {
            match budget_end {
                Some(end) => match tokio::time::timeout_at(end, &mut write).await {
                    Ok(saved) => break saved,
                    Err(_) => {
                        return Err(CheckpointError::Transient {
                            cause: None,
                            location: "checkpoint".into(),
                            reason: format!(
                                "the last write did not finish within {} s after shutdown.drain_timeout_ms; the next start resumes from the checkpoint before it",
                                FINAL_SAVE_BUDGET.as_secs()
                            ),
                        });
                    }
                },
                None => tokio::select! {
                    biased;
                    saved = &mut write => break saved,
                    () = abandon.cancelled() => {
                        budget_end = Some(Instant::now() + FINAL_SAVE_BUDGET);
                    }
                },
            }
        };
        match saved {
            Ok(()) => {
                metrics.checkpoint_written();
                return Ok(());
            }
            Err(e)
                if e.is_transient()
                    && (!abandon.is_cancelled() || attempts < SAVE_ATTEMPTS_AFTER_ABANDON) =>
            {
                attempts += 1;
                let wait = backoff.next_wait();
                tracing::warn!(error = %crate::error::Chain(&e), retry_in_ms = wait.as_millis() as u64, "checkpoint write failed; retrying");
                // Past the drain timeout, the waits are cut short, and end with
                // the budget.
                let wait = match budget_end {
                    Some(end) => wait.min(end.saturating_duration_since(Instant::now())),
                    None => wait,
                };
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
pub(super) const SAVE_ATTEMPTS_AFTER_ABANDON: u32 = 5;

/// How long the final checkpoint write may take, all attempts together, once the
/// drain deadline has passed.
pub(super) const FINAL_SAVE_BUDGET: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::memory::MemoryStore;
    use crate::position::EventPosition;

    fn position(sequence_number: u64) -> Position {
        Position {
            last_event: Some(EventPosition {
                commit_lsn: Lsn::from_parts(0xB1, 1, 1),
                sequence_number,
            }),
            ..Position::default()
        }
    }

    fn pending(sequence_number: u64, deliveries: Vec<Delivery>) -> Pending {
        Pending {
            deliveries,
            position: position(sequence_number),
            counts: BatchCounts::default(),
            deadline: None,
            commit: None,
        }
    }

    /// An acker on a memory store, with its input and the store; `failed` is
    /// cancelled when it fails.
    fn acker_with(
        interval: Duration,
        failed: CancellationToken,
    ) -> (
        mpsc::Sender<Pending>,
        MemoryStore,
        tokio::task::JoinHandle<AckerResult>,
    ) {
        let memory = MemoryStore::default();
        let (tx, rx) = mpsc::channel(IN_FLIGHT_BATCHES);
        let store = CheckpointStore::Memory(memory.clone());
        let (keeper, _) = LeaseKeeper::for_store(&store);
        let task = tokio::spawn(acknowledge(
            rx,
            store,
            interval,
            Arc::new(Metrics::default()),
            Signals {
                acker_failed: failed,
                ..Signals::default()
            },
            keeper,
            tokio::sync::watch::channel(None).0,
        ));
        (tx, memory, task)
    }

    fn acker(
        interval: Duration,
    ) -> (
        mpsc::Sender<Pending>,
        MemoryStore,
        tokio::task::JoinHandle<AckerResult>,
    ) {
        acker_with(interval, CancellationToken::new())
    }

    #[tokio::test(start_paused = true)]
    async fn positions_are_released_in_send_order_whatever_order_deliveries_settle_in() {
        let (tx, memory, task) = acker(Duration::from_millis(10));
        let (first_done, first) = tokio::sync::oneshot::channel();
        tx.send(pending(1, vec![Delivery::Pending(first)]))
            .await
            .unwrap();
        // The second batch is delivered at once; the first is not yet.
        tx.send(pending(2, vec![Delivery::Settled(Ok(()))]))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(memory.writes(), 0, "nothing past an unsettled delivery");
        first_done.send(Ok(())).unwrap();
        drop(tx);
        let written = task.await.unwrap().checkpoint;
        assert_eq!(written.expect("checkpointed"), Some(position(2)));
        assert_eq!(memory.position(), Some(position(2)));
    }

    /// A batch of transaction `number`, delivered, whose commit `commits` tells.
    fn in_transaction(
        sequence_number: u64,
        number: u64,
        commits: &tokio::sync::watch::Sender<u64>,
    ) -> Pending {
        Pending {
            commit: Some(CommitTicket {
                number,
                committed: commits.subscribe(),
            }),
            ..pending(sequence_number, vec![Delivery::Settled(Ok(()))])
        }
    }

    #[tokio::test(start_paused = true)]
    async fn batches_of_a_transaction_count_at_its_commit_and_the_acker_takes_more_meanwhile() {
        let (tx, memory, task) = acker(Duration::from_millis(10));
        let commits = tokio::sync::watch::Sender::new(0);
        // More batches of one transaction than the channel holds: the acker takes
        // them all (awaiting their deliveries) while the commit has not come.
        for n in 1..=(IN_FLIGHT_BATCHES as u64 + 4) {
            tokio::time::timeout(
                Duration::from_secs(1),
                tx.send(in_transaction(n, 1, &commits)),
            )
            .await
            .expect("the acker takes batches while their transaction is open")
            .unwrap();
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(memory.writes(), 0, "nothing counts before the commit");
        // The commit comes while nothing more is sent: the last batch counts.
        commits.send_replace(1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            memory.position(),
            Some(position(IN_FLIGHT_BATCHES as u64 + 4))
        );
        // A second transaction, never committed (the sender stops): nothing of it.
        tx.send(in_transaction(100, 2, &commits)).await.unwrap();
        drop(commits);
        drop(tx);
        let result = task.await.unwrap();
        assert_eq!(
            result.checkpoint.expect("checkpointed"),
            Some(position(IN_FLIGHT_BATCHES as u64 + 4)),
            "an uncommitted transaction counts for nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_transaction_committed_as_the_sender_stops_still_counts() {
        let (tx, memory, task) = acker(Duration::from_secs(60));
        let commits = tokio::sync::watch::Sender::new(0);
        tx.send(in_transaction(1, 1, &commits)).await.unwrap();
        tx.send(in_transaction(2, 1, &commits)).await.unwrap();
        commits.send_replace(1);
        drop(commits);
        drop(tx);
        let written = task.await.unwrap().checkpoint;
        assert_eq!(written.expect("checkpointed"), Some(position(2)));
        assert_eq!(memory.position(), Some(position(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivered_batch_is_checkpointed_once_the_interval_passes_with_nothing_new() {
        let (tx, memory, task) = acker(Duration::from_secs(1));
        tx.send(pending(1, vec![Delivery::Settled(Ok(()))]))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(memory.writes(), 0, "within the interval of the start");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            memory.writes(),
            1,
            "written when due, no later batch needed"
        );
        assert_eq!(memory.position(), Some(position(1)));
        drop(tx);
        let written = task.await.unwrap().checkpoint;
        assert_eq!(written.expect("checkpointed"), Some(position(1)));
        assert_eq!(memory.writes(), 1, "no second write of the same position");
    }

    #[tokio::test(start_paused = true)]
    async fn store_faults_that_can_pass_are_retried_with_backoff() {
        let (tx, memory, task) = acker(Duration::from_secs(60));
        memory.fail_next(3);
        tx.send(pending(1, vec![Delivery::Settled(Ok(()))]))
            .await
            .unwrap();
        drop(tx);
        let started = Instant::now();
        let written = task.await.unwrap().checkpoint;
        assert_eq!(written.expect("checkpointed"), Some(position(1)));
        assert_eq!(memory.writes(), 1);
        // The final write failed three times: 100 + 200 + 400 ms of backoff, each
        // drawn from the upper half of its step.
        let waited = started.elapsed();
        assert!(
            (Duration::from_millis(350)..=Duration::from_millis(700)).contains(&waited),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_delivery_fails_the_run_after_checkpointing_what_came_before() {
        let failed = CancellationToken::new();
        let (tx, memory, task) = acker_with(Duration::from_secs(60), failed.clone());
        tx.send(pending(1, vec![Delivery::Settled(Ok(()))]))
            .await
            .unwrap();
        tx.send(pending(
            2,
            vec![Delivery::Settled(Err(SinkError::definite("refused")))],
        ))
        .await
        .unwrap();
        let written = task.await.unwrap().checkpoint;
        assert!(matches!(
            written,
            Err(PipelineError::Sink(SinkError::Definite { .. }))
        ));
        assert!(failed.is_cancelled(), "the send loop is told");
        assert_eq!(
            memory.position(),
            Some(position(1)),
            "what was delivered stays"
        );
    }

    /// Past the drain deadline, what is already delivered still counts and nothing
    /// is called outstanding; what is not is abandoned with one warning saying how
    /// many batches.
    #[tokio::test]
    async fn an_abandon_takes_what_is_settled_and_warns_only_of_what_is_not() {
        let log = crate::test_log::capture();
        for _ in 0..20 {
            let memory = MemoryStore::default();
            let (tx, rx) = mpsc::channel(IN_FLIGHT_BATCHES);
            let abandon = CancellationToken::new();
            abandon.cancel();
            tx.send(pending(1, vec![Delivery::Settled(Ok(()))]))
                .await
                .unwrap();
            tx.send(pending(2, vec![Delivery::Settled(Ok(()))]))
                .await
                .unwrap();
            drop(tx);
            let store = CheckpointStore::Memory(memory.clone());
            let (keeper, _) = LeaseKeeper::for_store(&store);
            let result = acknowledge(
                rx,
                store,
                Duration::from_secs(3600),
                Arc::new(Metrics::default()),
                Signals {
                    abandon,
                    ..Signals::default()
                },
                keeper,
                tokio::sync::watch::channel(None).0,
            )
            .await;
            assert_eq!(result.checkpoint.unwrap(), Some(position(2)));
            assert_eq!(
                result.delivered.events, 0,
                "no events in these batches' counts"
            );
        }
        assert!(
            log.lines().iter().all(|l| l["level"] != "WARN"),
            "{:?}",
            log.lines()
        );

        let (tx, rx) = mpsc::channel(IN_FLIGHT_BATCHES);
        let abandon = CancellationToken::new();
        abandon.cancel();
        let (_never, waiting) = tokio::sync::oneshot::channel();
        tx.send(pending(1, vec![Delivery::Settled(Ok(()))]))
            .await
            .unwrap();
        tx.send(pending(2, vec![Delivery::Pending(waiting)]))
            .await
            .unwrap();
        tx.send(pending(3, vec![Delivery::Settled(Ok(()))]))
            .await
            .unwrap();
        drop(tx);
        let store = CheckpointStore::Memory(MemoryStore::default());
        let (keeper, _) = LeaseKeeper::for_store(&store);
        let result = acknowledge(
            rx,
            store,
            Duration::from_secs(3600),
            Arc::new(Metrics::default()),
            Signals {
                abandon,
                ..Signals::default()
            },
            keeper,
            tokio::sync::watch::channel(None).0,
        )
        .await;
        assert_eq!(
            result.checkpoint.unwrap(),
            Some(position(1)),
            "up to the outstanding one"
        );
        let warned: Vec<_> = log
            .lines()
            .into_iter()
            .filter(|l| l["level"] == "WARN")
            .collect();
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert_eq!(
            warned[0]["batches"], 2,
            "the outstanding batch and the one after it"
        );
    }

    /// A write that hangs, begun before the drain deadline, is cut at the budget once
    /// the deadline passes.
    #[tokio::test(start_paused = true)]
    async fn a_write_that_hangs_across_the_deadline_is_cut_at_the_budget() {
        let memory = MemoryStore::default();
        memory.delay_writes(Duration::from_secs(3600));
        let mut store = CheckpointStore::Memory(memory);
        let abandon = CancellationToken::new();
        let later = abandon.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            later.cancel();
        });
        let started = Instant::now();
        let result = save(&mut store, &position(1), &Metrics::default(), &abandon).await;
        assert!(result.is_err());
        let took = started.elapsed();
        assert!(
            took <= Duration::from_secs(1) + FINAL_SAVE_BUDGET,
            "{took:?}"
        );
    }

    /// Past the drain deadline, a store that hangs (each write 60 s) or keeps failing
    /// holds the final checkpoint write for the budget at most, not attempt after
    /// attempt.
    #[tokio::test(start_paused = true)]
    async fn the_final_write_after_the_deadline_has_a_wall_time_budget() {
        for hang in [true, false] {
            let memory = MemoryStore::default();
            if hang {
                memory.delay_writes(Duration::from_secs(60));
            } else {
                memory.fail_next(1_000);
            }
            let mut store = CheckpointStore::Memory(memory);
            let abandon = CancellationToken::new();
            abandon.cancel();
            let started = Instant::now();
            let result = save(&mut store, &position(1), &Metrics::default(), &abandon).await;
            assert!(result.is_err(), "hang {hang}");
            let took = started.elapsed();
            assert!(took <= FINAL_SAVE_BUDGET, "hang {hang}: {took:?}");
        }
    }
}

//! The source task: polls until stopped, retries what can pass with backoff, and
//! hands batches on, a couple ahead.

use super::*;

/// When heartbeat records are due (`sink.heartbeat_interval_ms`; zero: never), and
/// where the stream stands for a quiet one's.
pub(super) struct Heartbeats {
    every: Duration,
    next: tokio::time::Instant,
    /// The last batch's position and `max_lsn`: where a quiet stream's heartbeat
    /// stands (none before the first batch, so none is sent before it).
    stands_at: Option<(Position, Lsn)>,
}

impl Heartbeats {
    /// Every `every`, the first one `every` from now.
    pub(super) fn new(every: Duration) -> Self {
        Heartbeats {
            every,
            next: tokio::time::Instant::now() + every,
            stands_at: None,
        }
    }

    /// Whether one is due now; if so the next is due an interval later.
    fn due(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if self.every.is_zero() || now < self.next {
            return false;
        }
        self.next = now + self.every;
        true
    }

    /// A batch is going out: it carries the heartbeat when one is due.
    fn on_batch(&mut self, batch: &mut Batch) {
        if self.every.is_zero() {
            return;
        }
        batch.heartbeat = self.due();
        self.stands_at = Some((batch.position.clone(), batch.max_lsn));
    }

    /// The poll found nothing new: a batch of no event that carries the heartbeat,
    /// when one is due and a batch went out before.
    fn on_idle(&mut self) -> Option<Batch> {
        if self.stands_at.is_none() || !self.due() {
            return None;
        }
        let (position, max_lsn) = self.stands_at.clone()?;
        Some(Batch {
            changes: Vec::new(),
            schema_changes: Vec::new(),
            position,
            max_lsn,
            heartbeat: true,
        })
    }
}

/// What a poll tells the metrics: its time and rows, or its error, and the
/// source's state after it.
fn report_poll<B: BatchSource>(
    metrics: &Metrics,
    poller: &B,
    polled: &Result<PollOutcome, SourceError>,
    took: Duration,
) {
    match polled {
        Ok(outcome) => {
            let rows = match outcome {
                PollOutcome::Batch(batch) => Some(batch.changes.len()),
                PollOutcome::Idle => None,
            };
            metrics.poll_finished(took, rows, poller.tracked_instances());
            metrics.set_loads(&poller.load_status());
            metrics.set_resnapshots(&poller.resnapshot_status());
            metrics.set_capture_actions(poller.capture_actions());
            metrics.set_capture_job(poller.capture_job().as_ref());
            metrics.set_retention(poller.cleanup_retention());
        }
        Err(e) => metrics.poll_failed(e),
    }
}

/// Polls until stopped; retries transient errors with backoff; sends batches on.
pub(super) async fn poll_source<B: BatchSource>(
    mut poller: B,
    tx: mpsc::Sender<Result<SourceItem, SourceError>>,
    poll_interval: Duration,
    until_idle: bool,
    mut heartbeats: Heartbeats,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut backoff = backoff();
    // The table versions last shown in the metrics: set again only when they move.
    let mut versions_shown = std::collections::BTreeMap::new();
    loop {
        let started = Instant::now();
        let polled = tokio::select! {
            polled = poller.poll() => polled,
            () = stop.cancelled() => return,
        };
        report_poll(&metrics, &poller, &polled, started.elapsed());
        match polled {
            Ok(PollOutcome::Batch(mut batch)) => {
                backoff.reset();
                heartbeats.on_batch(&mut batch);
                if batch.position.table_versions != versions_shown {
                    metrics.set_table_versions(&batch.position.table_versions);
                    versions_shown.clone_from(&batch.position.table_versions);
                }
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
                // Idle means the source has nothing new and expects nothing: a
                // paced workload between two transactions is not idle.
                if until_idle && !poller.more_expected() {
                    let _ = tx.send(Ok(SourceItem::Idle)).await;
                    return;
                }
                // A quiet stream's heartbeat: no event, the position it stands at.
                if let (Some(beat), Some(guid)) = (heartbeats.on_idle(), poller.stream_guid())
                    && tx
                        .send(Ok(SourceItem::Batch(Box::new(beat), guid)))
                        .await
                        .is_err()
                {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(poll_interval) => {}
                    () = stop.cancelled() => return,
                }
            }
            Err(e) if e.is_transient() => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %crate::error::Chain(&e), retry_in_ms = wait.as_millis() as u64, "transient source error; retrying");
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers each poll from a script; records when each poll came.
    struct Scripted {
        answers: std::collections::VecDeque<Result<PollOutcome, SourceError>>,
        polled_at: Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
        /// More is expected until this many polls were made.
        expecting_until: usize,
    }

    impl BatchSource for Scripted {
        async fn poll(&mut self) -> Result<PollOutcome, SourceError> {
            if let Ok(mut at) = self.polled_at.lock() {
                at.push(tokio::time::Instant::now());
            }
            self.answers.pop_front().unwrap_or(Ok(PollOutcome::Idle))
        }
        fn stream_guid(&self) -> Option<uuid::Uuid> {
            Some(uuid::Uuid::from_u128(1))
        }
        fn tracked_instances(&self) -> usize {
            1
        }
        fn more_expected(&self) -> bool {
            self.polled_at
                .lock()
                .is_ok_and(|at| at.len() < self.expecting_until)
        }
    }

    fn transient() -> Result<PollOutcome, SourceError> {
        Err(SourceError::transient("connection reset"))
    }

    async fn run_script(
        answers: Vec<Result<PollOutcome, SourceError>>,
        until_idle: bool,
        stop: CancellationToken,
    ) -> (Vec<Duration>, Vec<Result<SourceItem, SourceError>>) {
        run_script_expecting(answers, until_idle, stop, 0, Duration::ZERO).await
    }

    async fn run_script_expecting(
        answers: Vec<Result<PollOutcome, SourceError>>,
        until_idle: bool,
        stop: CancellationToken,
        expecting_until: usize,
        heartbeat: Duration,
    ) -> (Vec<Duration>, Vec<Result<SourceItem, SourceError>>) {
        let polled_at = Arc::new(std::sync::Mutex::new(Vec::new()));
        let source = Scripted {
            answers: answers.into(),
            polled_at: Arc::clone(&polled_at),
            expecting_until,
        };
        let (tx, mut rx) = mpsc::channel(8);
        let start = tokio::time::Instant::now();
        poll_source(
            source,
            tx,
            Duration::from_secs(1),
            until_idle,
            Heartbeats::new(heartbeat),
            Arc::new(Metrics::default()),
            stop,
        )
        .await;
        let mut items = Vec::new();
        while let Ok(item) = rx.try_recv() {
            items.push(item);
        }
        let at = polled_at.lock().map(|v| v.clone()).unwrap_or_default();
        (at.into_iter().map(|t| t - start).collect(), items)
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_after_doubling_waits_and_a_success_resets_them() {
        let stop = CancellationToken::new();
        let stopper = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2_900)).await;
            stopper.cancel();
        });
        let (at, items) = run_script(
            vec![
                transient(),
                transient(),
                transient(),
                Ok(PollOutcome::Idle),
                transient(),
                Ok(PollOutcome::Idle),
            ],
            false,
            stop,
        )
        .await;
        let ms: Vec<u128> = at.iter().map(Duration::as_millis).collect();
        let gaps: Vec<u128> = ms.windows(2).map(|w| w[1] - w[0]).collect();
        // 100, 200 and 400 ms after three failures (each drawn from the upper half
        // of its step); the poll interval (1 s) after an idle poll; 100 ms again
        // after the next failure: the success reset it. The stop at 2.9 s ends the
        // wait for the next poll.
        assert_eq!(gaps.len(), 6, "{ms:?}");
        for (gap, step) in gaps.iter().zip([100, 200, 400, 1_000, 100, 1_000]) {
            let low = if step == 1_000 { step } else { step / 2 };
            assert!((low..=step).contains(gap), "{ms:?}");
        }
        assert!(items.is_empty(), "nothing to hand on");
    }

    #[tokio::test(start_paused = true)]
    async fn a_definite_error_is_handed_on_and_ends_the_task() {
        let (at, items) = run_script(
            vec![
                transient(),
                Err(SourceError::Sql(crate::mssql::SqlErrorKind::LoginFailed)),
                Ok(PollOutcome::Idle),
            ],
            true,
            CancellationToken::new(),
        )
        .await;
        assert_eq!(at.len(), 2, "no poll after the definite error");
        assert!(matches!(
            items.as_slice(),
            [Err(SourceError::Sql(
                crate::mssql::SqlErrorKind::LoginFailed
            ))]
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn with_until_idle_the_first_idle_poll_ends_the_task() {
        let (at, items) =
            run_script(vec![Ok(PollOutcome::Idle)], true, CancellationToken::new()).await;
        assert_eq!(at, [Duration::ZERO]);
        assert!(matches!(items.as_slice(), [Ok(SourceItem::Idle)]));
    }

    /// A source that expects more (a paced workload between transactions) is not
    /// idle: the task polls on at the interval until it expects nothing more.
    #[tokio::test(start_paused = true)]
    async fn with_until_idle_an_idle_poll_that_expects_more_polls_again() {
        let (at, items) = run_script_expecting(
            vec![
                Ok(PollOutcome::Idle),
                Ok(PollOutcome::Idle),
                Ok(PollOutcome::Idle),
            ],
            true,
            CancellationToken::new(),
            2,
            Duration::ZERO,
        )
        .await;
        let ms: Vec<u128> = at.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 1000]);
        assert!(matches!(items.as_slice(), [Ok(SourceItem::Idle)]));
    }

    fn batch_at(sequence_number: u64) -> Result<PollOutcome, SourceError> {
        Ok(PollOutcome::Batch(Batch {
            changes: Vec::new(),
            schema_changes: Vec::new(),
            position: Position {
                last_event: Some(crate::position::EventPosition {
                    commit_lsn: Lsn::from_parts(1, 2, 3),
                    sequence_number,
                }),
                ..Position::default()
            },
            max_lsn: Lsn::from_parts(1, 2, 3),
            heartbeat: false,
        }))
    }

    /// What each item handed on is: (changes, heartbeat, the last event's number).
    fn shapes(items: &[Result<SourceItem, SourceError>]) -> Vec<(usize, bool, Option<u64>)> {
        items
            .iter()
            .map(|item| match item {
                Ok(SourceItem::Batch(batch, _)) => (
                    batch.changes.len(),
                    batch.heartbeat,
                    batch.position.last_event.map(|e| e.sequence_number),
                ),
                Ok(SourceItem::Idle) => panic!("an idle item"),
                Err(e) => panic!("{e}"),
            })
            .collect()
    }

    /// A quiet stream sends a heartbeat every interval, standing where its last
    /// batch left it; with the interval zero, none.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_beats_at_the_interval_where_its_last_batch_stands() {
        let stopping = |after| {
            let stop = CancellationToken::new();
            let stopper = stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after)).await;
                stopper.cancel();
            });
            stop
        };
        // Idle polls at 0, 1, 2, … s: due at 2.5 s, so at 3 s, and again at 6 s.
        let (_, items) = run_script_expecting(
            vec![batch_at(7)],
            false,
            stopping(7_500),
            0,
            Duration::from_millis(2_500),
        )
        .await;
        assert_eq!(
            shapes(&items),
            [(0, false, Some(7)), (0, true, Some(7)), (0, true, Some(7))]
        );
        let (_, items) =
            run_script_expecting(vec![batch_at(7)], false, stopping(7_500), 0, Duration::ZERO)
                .await;
        assert_eq!(shapes(&items), [(0, false, Some(7))], "no heartbeats");
        // Nothing sent yet: nowhere to stand, so no heartbeat.
        let (_, items) =
            run_script_expecting(vec![], false, stopping(7_500), 0, Duration::from_secs(1)).await;
        assert!(items.is_empty());
    }

    /// A busy stream's heartbeat rides on the batch due when it is.
    #[tokio::test(start_paused = true)]
    async fn a_busy_stream_beats_on_its_batches() {
        let stop = CancellationToken::new();
        let stopper = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(4_500)).await;
            stopper.cancel();
        });
        // A batch, then idle polls a second apart, a batch at every third.
        let script = vec![
            batch_at(1),
            Ok(PollOutcome::Idle),
            batch_at(2),
            Ok(PollOutcome::Idle),
            batch_at(3),
            Ok(PollOutcome::Idle),
            batch_at(4),
        ];
        let (_, items) =
            run_script_expecting(script, false, stop, 0, Duration::from_millis(1_500)).await;
        let beats: Vec<bool> = shapes(&items).iter().map(|s| s.1).collect();
        // Batches at 0, 1, 2, 3 s (each after an idle second): due at 1.5 s and
        // 3.5 s, so on the batch at 2 s only, until the stop at 4.5 s; then the
        // idle poll at 4 s is due at 3.5 s: an empty one.
        assert_eq!(
            beats,
            [false, false, true, false, true],
            "{:?}",
            shapes(&items)
        );
    }
}

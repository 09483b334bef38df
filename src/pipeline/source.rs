//! The source task: polls until stopped, retries what can pass with backoff, and
//! hands batches on, a couple ahead.

use super::*;

/// Polls until stopped; retries transient errors with backoff; sends batches on.
pub(super) async fn poll_source<B: BatchSource>(
    mut poller: B,
    tx: mpsc::Sender<Result<SourceItem, SourceError>>,
    poll_interval: Duration,
    until_idle: bool,
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
        match &polled {
            Ok(outcome) => {
                let rows = match outcome {
                    PollOutcome::Batch(batch) => Some(batch.changes.len()),
                    PollOutcome::Idle => None,
                };
                metrics.poll_finished(started.elapsed(), rows, poller.tracked_instances());
                metrics.set_loads(&poller.load_status());
                metrics.set_resnapshots(&poller.resnapshot_status());
                metrics.set_capture_actions(poller.capture_actions());
                metrics.set_capture_job(poller.capture_job().as_ref());
                metrics.set_retention(poller.cleanup_retention());
            }
            Err(e) => metrics.poll_failed(e),
        }
        match polled {
            Ok(PollOutcome::Batch(batch)) => {
                backoff.reset();
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
        run_script_expecting(answers, until_idle, stop, 0).await
    }

    async fn run_script_expecting(
        answers: Vec<Result<PollOutcome, SourceError>>,
        until_idle: bool,
        stop: CancellationToken,
        expecting_until: usize,
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
        )
        .await;
        let ms: Vec<u128> = at.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 1000]);
        assert!(matches!(items.as_slice(), [Ok(SourceItem::Idle)]));
    }
}

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
                let wait = backoff.next_wait();
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

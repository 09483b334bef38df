//! The acker: an ordered finalizer. It awaits each batch's deliveries strictly in
//! send order and only then releases the batch's position to the checkpoint, with
//! backoff on store faults that can pass.

use super::*;

pub(super) struct Pending {
    pub(super) deliveries: Vec<Delivery>,
    pub(super) position: Position,
    pub(super) counts: BatchCounts,
}

/// Awaits deliveries in send order; writes the checkpoint of what is delivered at
/// most every `interval` — also when no later batch comes — and once more at the end.
/// What the acker hands back: the store (with the stream's lease, released only
/// after the sink is closed) and the last position it checkpointed.
pub(super) type AckerResult = (CheckpointStore, Result<Option<Position>, PipelineError>);

pub(super) async fn acknowledge(
    mut rx: mpsc::Receiver<Pending>,
    mut store: CheckpointStore,
    interval: Duration,
    metrics: Arc<Metrics>,
    failed: CancellationToken,
    abandon: CancellationToken,
) -> AckerResult {
    let outcome =
        acknowledge_into(&mut rx, &mut store, interval, &metrics, &failed, &abandon).await;
    // The store (and with it the stream's lease) goes back to the caller, which
    // releases it only after the sink is closed.
    (store, outcome)
}

pub(super) async fn acknowledge_into(
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
pub(super) async fn save(
    store: &mut CheckpointStore,
    position: &Position,
    metrics: &Metrics,
    abandon: &CancellationToken,
) -> Result<(), CheckpointError> {
    let mut backoff = backoff();
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
                let wait = backoff.next_wait();
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
pub(super) const SAVE_ATTEMPTS_AFTER_ABANDON: u32 = 5;

//! Exactly-once into Kafka (`sink.exactly_once`): each batch and the stream's new
//! position are written in one Kafka transaction, the position as a record of the
//! compacted checkpoint topic (`checkpoint.store = "kafka"`), as Kafka Connect's
//! exactly-once sources commit their offsets (KIP-618). A `read_committed`
//! consumer sees a batch's events only with the position after them, so a restart
//! resumes exactly after the last committed batch.
//!
//! Fencing: the transactional id is the stream's, so a new process on the stream
//! initialises it, which bumps the producer epoch and aborts what the old one left
//! open; the old one's next send or commit fails as fenced, a fatal error: it stops
//! and says why.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use crate::position::Position;
use crate::sink::SinkError;

/// What the transactions are tied to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionSettings {
    /// `transactional.id`: one per stream.
    pub id: String,
    /// Where the position goes, and under which key.
    pub checkpoint_topic: String,
    pub stream_name: String,
    /// When a transaction of several batches is committed.
    pub bound: TransactionBound,
}

/// When the open transaction is committed: once it has been open this long
/// (`sink.transaction_max_ms`) or holds this many payload bytes
/// (`sink.transaction_max_bytes`), at a batch's end; and whenever the stream pauses
/// (nothing more to send) or stops. A `read_committed` consumer sees a batch at
/// its transaction's commit, so `max_open` bounds how late it sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionBound {
    pub max_open: Duration,
    pub max_bytes: u64,
}

impl TransactionBound {
    /// One batch a transaction.
    pub const EACH_BATCH: TransactionBound = TransactionBound {
        max_open: Duration::ZERO,
        max_bytes: 0,
    };
}

/// The producer's transaction state.
#[derive(Debug)]
pub(super) struct Transactions {
    pub(super) settings: TransactionSettings,
    /// A transaction is open (begun at a batch's first send), since then.
    open_since: Option<std::time::Instant>,
    timeout: Duration,
}

/// A transactional producer's `message.timeout.ms`: the delivery time-out (a
/// second at least).
pub(super) fn message_timeout(delivery_timeout: Duration) -> Duration {
    delivery_timeout.max(Duration::from_secs(1))
}

/// A transactional producer's `transaction.timeout.ms`, after which the
/// coordinator aborts a transaction still open: its messages' time-out and 5 s.
pub(super) fn coordinator_timeout(delivery_timeout: Duration) -> Duration {
    message_timeout(delivery_timeout) + Duration::from_secs(5)
}

/// What a producer fenced by a newer one of its transactional id is told.
/// `id`: the transactional id, or where it is set.
pub(super) fn fenced(id: &str, detail: &str) -> SinkError {
    SinkError::definite(format!(
        "another process took over this stream ({id}: {detail}); this one stops, and what it had not committed is aborted"
    ))
}

impl Transactions {
    pub(super) fn new(settings: TransactionSettings, timeout: Duration) -> Self {
        Transactions {
            settings,
            open_since: None,
            timeout,
        }
    }

    /// Registers the transactional id with the coordinator: fences every earlier
    /// producer of the stream and aborts its open transaction.
    pub(super) async fn init<C: rdkafka::client::ClientContext + 'static>(
        &self,
        producer: &FutureProducer<C>,
    ) -> Result<(), SinkError> {
        let producer = producer.clone();
        let timeout = self.timeout;
        let id = self.settings.id.clone();
        let grant = format!("WRITE on transactional id {id}");
        let coordinator_timeout = self.coordinator_timeout();
        blocking(move || producer.init_transactions(timeout))
            .await
            .map_err(|e| match crate::kafka_client::refused_right(&e, &grant) {
                Some(refused) => SinkError::definite(format!(
                    "cannot initialise transactions for transactional id {id} (sink.exactly_once, sink.transactional_id): {refused} ({e})"
                )),
                // A time-out the brokers do not allow is the same at every try.
                None if crate::kafka_client::error_code(&e)
                    == Some(rdkafka::types::RDKafkaErrorCode::InvalidTransactionTimeout) =>
                {
                    SinkError::definite(format!(
                        "cannot initialise transactions for transactional id {id}: the brokers refuse a transaction.timeout.ms of {} ms (INVALID_TRANSACTION_TIMEOUT: more than their transaction.max.timeout.ms, 900000 by default); it is sink.delivery_timeout_ms and 5 s: lower sink.delivery_timeout_ms, or raise the brokers' transaction.max.timeout.ms ({e})",
                        coordinator_timeout.as_millis()
                    ))
                }
                None => SinkError::transient(format!(
                    "cannot initialise transactions for transactional id {id} (sink.exactly_once): {e}"
                )),
            })
    }

    /// Begins a transaction unless one is open.
    pub(super) fn begin<C: rdkafka::client::ClientContext + 'static>(
        &mut self,
        producer: &FutureProducer<C>,
    ) -> Result<(), SinkError> {
        if self.open_since.is_none() {
            producer
                .begin_transaction()
                .map_err(|e| self.classify(&e))?;
            self.open_since = Some(std::time::Instant::now());
        }
        Ok(())
    }

    /// Writes `position` into the open transaction and commits it. A transaction
    /// that cannot commit is aborted (nothing of it is visible to `read_committed`
    /// consumers) and the run fails; fenced, it fails as definite.
    pub(super) async fn commit<C: rdkafka::client::ClientContext + 'static>(
        &mut self,
        producer: &FutureProducer<C>,
        position: &Position,
    ) -> Result<(), SinkError> {
        self.begin(producer)?;
        let location = format!("topic {}", self.settings.checkpoint_topic);
        let document = crate::checkpoint::render(&self.settings.stream_name, position, &location)
            .map_err(|e| SinkError::definite_because("the checkpoint record", e))?;
        let record = FutureRecord::to(&self.settings.checkpoint_topic)
            .key(self.settings.stream_name.as_bytes())
            .payload(document.as_bytes());
        let sent = producer
            .send_result(record)
            .map_err(|(e, _)| self.classify(&e));
        let committed = match sent {
            Ok(_delivery) => self.commit_retrying(producer).await,
            Err(e) => Err(e),
        };
        self.open_since = None;
        if let Err(e) = &committed
            && !matches!(e, SinkError::Definite { .. })
        {
            self.abort(producer).await;
        }
        committed
    }

    /// Commits, calling again while librdkafka says the call may be retried (a
    /// time-out: the process may have been paused meanwhile), up to the time-out
    /// from the first call. A fenced producer learns it here.
    async fn commit_retrying<C: rdkafka::client::ClientContext + 'static>(
        &self,
        producer: &FutureProducer<C>,
    ) -> Result<(), SinkError> {
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            let (p, timeout) = (producer.clone(), self.timeout);
            match blocking(move || p.commit_transaction(timeout)).await {
                Ok(()) => return Ok(()),
                Err(KafkaError::Transaction(e))
                    if e.is_retriable() && std::time::Instant::now() < deadline =>
                {
                    tracing::debug!(error = %crate::error::Chain(&e), "committing again");
                }
                Err(e) => return Err(self.classify(&e)),
            }
        }
    }

    /// Aborts an open transaction (at a failure or a cut shutdown), bounded.
    pub(super) async fn abort<C: rdkafka::client::ClientContext + 'static>(
        &mut self,
        producer: &FutureProducer<C>,
    ) {
        let producer = producer.clone();
        let timeout = self.timeout.min(Duration::from_secs(5));
        if let Err(e) = blocking(move || producer.abort_transaction(timeout)).await {
            tracing::debug!(error = %crate::error::Chain(&e), "aborting the transaction");
        }
        self.open_since = None;
    }

    pub(super) fn is_open(&self) -> bool {
        self.open_since.is_some()
    }

    /// librdkafka's `transaction.timeout.ms`.
    fn coordinator_timeout(&self) -> Duration {
        coordinator_timeout(self.timeout)
    }

    fn classify(&self, error: &KafkaError) -> SinkError {
        use rdkafka::types::RDKafkaErrorCode as C;
        let code = crate::kafka_client::error_code(error);
        let grant = match code {
            Some(C::TransactionalIdAuthorizationFailed) => {
                format!("WRITE on transactional id {}", self.settings.id)
            }
            _ => format!(
                "WRITE on the sink's topic and on topic {} (the checkpoint topic)",
                self.settings.checkpoint_topic
            ),
        };
        if let Some(refused) = crate::kafka_client::refused_right(error, &grant) {
            return SinkError::definite(format!(
                "transactional id {}: {refused} ({error})",
                self.settings.id
            ));
        }
        match error {
            // Fenced (librdkafka says so of PRODUCER_FENCED and
            // INVALID_PRODUCER_EPOCH alike): a newer producer of the same
            // transactional id exists — or the coordinator aborted a transaction
            // that stayed open past transaction.timeout.ms, bumping the epoch the
            // same way. Only the second outlives that time-out.
            KafkaError::Transaction(e)
                if e.is_fatal()
                    && matches!(
                        e.code(),
                        C::ProducerFenced | C::InvalidProducerEpoch | C::Fenced
                    ) =>
            {
                fenced_or_timed_out(
                    &self.settings.id,
                    self.open_since.map(|since| since.elapsed()),
                    self.coordinator_timeout(),
                    &e.string(),
                )
            }
            // Fatal for another reason (the coordinator aborted a transaction that
            // outlived transaction.timeout.ms, a refused configuration): this
            // producer cannot go on; a new one resumes from the checkpoint.
            KafkaError::Transaction(e) if e.is_fatal() => SinkError::definite(format!(
                "the producer of transactional id {} failed for good ({:?}: {}); what it had not committed is aborted, and a restart resumes from the checkpoint",
                self.settings.id,
                e.code(),
                e.string()
            )),
            other => SinkError::transient(format!(
                "the transaction of transactional id {} failed: {other}",
                self.settings.id
            )),
        }
    }
}

/// A fenced producer's error: taken over by a newer producer of the id, unless its
/// transaction was open longer than the coordinator's time-out (`open_for`), which
/// then aborted it and bumped the epoch as a takeover does.
fn fenced_or_timed_out(
    id: &str,
    open_for: Option<Duration>,
    coordinator_timeout: Duration,
    detail: &str,
) -> SinkError {
    match open_for.filter(|open| *open >= coordinator_timeout) {
        Some(open) => SinkError::definite(format!(
            "Kafka's transaction coordinator aborted the transaction of transactional id {id}, open for {} s, longer than transaction.timeout.ms ({} s: sink.delivery_timeout_ms and 5 s; was the process paused?): what it had not committed is aborted, and a restart resumes from the checkpoint ({detail})",
            open.as_secs(),
            coordinator_timeout.as_secs(),
        )),
        None => fenced(&format!("transactional id {id}"), detail),
    }
}

/// Runs a blocking librdkafka call off the async workers.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, KafkaError> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result,
        Err(e) => {
            tracing::debug!(error = %crate::error::Chain(&e), "a blocking Kafka call's thread failed");
            Err(KafkaError::Canceled)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_open_past_the_coordinator_s_time_out_is_not_called_a_takeover() {
        let timeout = Duration::from_secs(25);
        let taken =
            fenced_or_timed_out("t", Some(Duration::from_secs(3)), timeout, "Fenced").to_string();
        assert!(taken.contains("another process took over"), "{taken}");
        let unknown = fenced_or_timed_out("t", None, timeout, "Fenced").to_string();
        assert!(unknown.contains("another process took over"), "{unknown}");
        let aborted =
            fenced_or_timed_out("t", Some(Duration::from_secs(40)), timeout, "Fenced").to_string();
        assert!(
            aborted.contains("coordinator aborted")
                && aborted.contains("open for 40 s")
                && aborted.contains("transaction.timeout.ms (25 s")
                && !aborted.contains("took over"),
            "{aborted}"
        );
    }
}

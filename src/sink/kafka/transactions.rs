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
}

/// The producer's transaction state.
#[derive(Debug)]
pub(super) struct Transactions {
    pub(super) settings: TransactionSettings,
    /// A transaction is open (begun at a batch's first send).
    open: bool,
    timeout: Duration,
}

impl Transactions {
    pub(super) fn new(settings: TransactionSettings, timeout: Duration) -> Self {
        Transactions {
            settings,
            open: false,
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
        blocking(move || producer.init_transactions(timeout))
            .await
            .map_err(|e| match crate::kafka_client::refused_right(&e, &grant) {
                Some(refused) => SinkError::Definite(format!(
                    "cannot initialise transactions for transactional id {id} (sink.exactly_once, sink.transactional_id): {refused} ({e})"
                )),
                None => SinkError::Transient(format!(
                    "cannot initialise transactions for transactional id {id} (sink.exactly_once): {e}"
                )),
            })
    }

    /// Begins a transaction unless one is open.
    pub(super) fn begin<C: rdkafka::client::ClientContext + 'static>(
        &mut self,
        producer: &FutureProducer<C>,
    ) -> Result<(), SinkError> {
        if !self.open {
            producer
                .begin_transaction()
                .map_err(|e| self.classify(&e))?;
            self.open = true;
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
            .map_err(|e| SinkError::Definite(e.to_string()))?;
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
        self.open = false;
        if let Err(e) = &committed
            && !matches!(e, SinkError::Definite(_))
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
                    tracing::debug!(error = %e, "committing again");
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
            tracing::debug!(error = %e, "aborting the transaction");
        }
        self.open = false;
    }

    pub(super) fn is_open(&self) -> bool {
        self.open
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
            return SinkError::Definite(format!(
                "transactional id {}: {refused} ({error})",
                self.settings.id
            ));
        }
        match error {
            // Fenced: a newer producer of the same transactional id exists.
            KafkaError::Transaction(e)
                if e.is_fatal()
                    && matches!(
                        e.code(),
                        C::ProducerFenced | C::InvalidProducerEpoch | C::Fenced
                    ) =>
            {
                SinkError::Definite(format!(
                    "another process took over this stream (transactional id {}: {}); this one stops, and what it had not committed is aborted",
                    self.settings.id,
                    e.string()
                ))
            }
            // Fatal for another reason (the coordinator aborted a transaction that
            // outlived transaction.timeout.ms, a refused configuration): this
            // producer cannot go on; a new one resumes from the checkpoint.
            KafkaError::Transaction(e) if e.is_fatal() => SinkError::Definite(format!(
                "the producer of transactional id {} failed for good ({:?}: {}); what it had not committed is aborted, and a restart resumes from the checkpoint",
                self.settings.id,
                e.code(),
                e.string()
            )),
            other => SinkError::Transient(format!(
                "the transaction of transactional id {} failed: {other}",
                self.settings.id
            )),
        }
    }
}

/// Runs a blocking librdkafka call off the async workers.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, KafkaError> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result,
        Err(e) => {
            tracing::debug!(error = %e, "a blocking Kafka call's thread failed");
            Err(KafkaError::Canceled)
        }
    }
}

//! Kafka, and Azure Event Hubs through its Kafka endpoint (the protocol CES itself
//! uses).
//!
//! The producer is idempotent with `acks=all`, so librdkafka's retries neither
//! duplicate nor reorder messages within a partition. A full producer queue is waited
//! out (backpressure), never buffered without bound. With a key, librdkafka's
//! partitioner sends equal keys to one partition; without one, the partition is chosen
//! from the event's `logicalid` so that its segments stay together.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::{Delivery, OutgoingMessage, SinkError, SinkHealth};

mod admin;
mod transactions;
pub use transactions::{TransactionBound, TransactionSettings};
mod config;
mod outage;
mod stall;
pub use stall::DIAGNOSIS_WITHIN;

pub use outage::BrokerLog;

pub use admin::{
    DestinationFacts, RECORD_OVERHEAD_BYTES, TopicFacts, check_topic_limit, connection_properties,
    describe_destination,
};
pub use config::{
    Compression, DEFAULT_TRANSACTION_MAX_BYTES, EVENT_HUBS_MAX_MESSAGE_KB,
    EVENT_HUBS_RECORD_OVERHEAD, EVENT_HUBS_REQUEST_LIMIT, KafkaFlavour, KafkaSettings,
    KafkaSinkConfig, Partitioner, default_delivery_timeout, default_transaction_max,
    parse_event_hubs_connection_string,
};

pub use crate::kafka_client::config_error;

/// A Kafka error as a [`SinkError`]: definite where the broker refuses the message
/// itself or the client's rights (resending cannot help), else transient.
pub fn delivery_error(error: &KafkaError) -> SinkError {
    delivery_error_to(error, None)
}

/// [`delivery_error`] of a message to `topic`: a refused right names the ACL the
/// login lacks on it.
pub fn delivery_error_to(error: &KafkaError, topic: Option<&str>) -> SinkError {
    let grant = match topic {
        Some(topic) => format!("WRITE on topic {topic}"),
        None => "WRITE on the topic the event is routed to".to_owned(),
    };
    if let Some(refused) = crate::kafka_client::refused_right(error, &grant) {
        return SinkError::definite_because(refused, error.clone());
    }
    use RDKafkaErrorCode as C;
    let code = match error {
        KafkaError::MessageProduction(code) => Some(*code),
        other => other.rdkafka_error_code(),
    };
    let definite = matches!(
        code,
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::MessageBatchTooLarge
                | C::InvalidRecord
                | C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::TransactionalIdAuthorizationFailed
                | C::SaslAuthenticationFailed
                | C::InvalidTopic
                | C::UnknownTopic
                | C::PolicyViolation
                | C::UnsupportedCompressionType
                | C::UnsupportedForMessageFormat
        )
    );
    let said = match topic {
        Some(topic) => format!("topic {topic}"),
        None => "Kafka".to_owned(),
    };
    // The idempotent producer's sequence and the broker's no longer agree, or the
    // broker forgot its producer id: librdkafka stops the producer (a fatal error).
    if matches!(
        code,
        Some(C::OutOfOrderSequenceNumber | C::UnknownProducerId | C::InvalidProducerIdMapping)
    ) {
        return SinkError::ProducerLost {
            reason: said,
            cause: Some(crate::error::cause(error.clone())),
        };
    }
    if definite {
        SinkError::definite_because(said, error.clone())
    } else {
        SinkError::transient_because(said, error.clone())
    }
}

/// The property that keeps a partition free of gaps when a message is refused for
/// good (librdkafka calls it experimental, and warns of it at start).
const GAPLESS_PROPERTY: &str = "enable.gapless.guarantee";

/// The producer's context: turns librdkafka's statistics (every second, when the
/// health is watched) into the sink's health: connected while a broker is up, and
/// the brokers' re-send count.
pub struct HealthContext {
    health: Arc<SinkHealth>,
    brokers: Arc<BrokerLog>,
}

impl rdkafka::ClientContext for HealthContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        let up = statistics
            .brokers
            .values()
            .any(|broker| broker.state == "UP");
        self.health.set_connected(up);
        if up {
            self.brokers.reachable();
        }
        self.brokers.watch_acknowledgements(&self.health);
        self.health.raise_retries_to(
            statistics
                .brokers
                .values()
                .map(|broker| broker.txretries)
                .sum(),
        );
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.health.set_connected(false);
        }
        // Once per outage (and a reminder a minute), not once per attempt.
        self.brokers.error(&error, reason);
    }

    /// librdkafka's own log lines repeat what the error callback reports, many times
    /// a second while a broker is down: they are debug lines, but for configuration
    /// warnings. Written as our lines (no source path of the build machine).
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            // The one experimental property set on purpose (`enable.gapless.guarantee`,
            // see the sink's properties): not a warning the operator can act on.
            _ if fac == "CONFWARN" && log_message.contains(GAPLESS_PROPERTY) => {
                tracing::debug!(facility = fac, "librdkafka: {log_message}")
            }
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning if fac == "CONFWARN" => {
                tracing::warn!(facility = fac, "librdkafka: {log_message}")
            }
            _ => tracing::debug!(facility = fac, "librdkafka: {log_message}"),
        }
    }
}

/// A message in the producer's hands: counted as waiting until it is settled or
/// dropped.
pub struct KafkaTicket {
    brokers: Arc<BrokerLog>,
    /// Its topic, asked why it takes no writes when the message stalls.
    topic: Arc<stall::TopicProbe>,
}

impl KafkaTicket {
    fn new(brokers: &Arc<BrokerLog>, topic: &Arc<stall::TopicProbe>) -> Self {
        brokers.sent();
        KafkaTicket {
            brokers: Arc::clone(brokers),
            topic: Arc::clone(topic),
        }
    }

    /// The message's delivery report, said as the run reports it: a time-out names
    /// the brokers and the setting that bounds it.
    pub fn outcome<Closed>(
        &self,
        report: Result<rdkafka::producer::future_producer::OwnedDeliveryResult, Closed>,
    ) -> Result<(), SinkError> {
        match report {
            Ok(Ok(_)) => {
                self.brokers.reachable();
                Ok(())
            }
            Ok(Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut), _))) => {
                Err(self.timed_out())
            }
            // Refused as an older epoch of the transactional id: a newer producer
            // took the stream over (librdkafka reports the same as fatal `Fenced`).
            Ok(Err((
                KafkaError::MessageProduction(
                    RDKafkaErrorCode::InvalidProducerEpoch
                    | RDKafkaErrorCode::ProducerFenced
                    | RDKafkaErrorCode::Fenced,
                ),
                _,
            ))) => Err(transactions::fenced(
                "its transactional id, sink.transactional_id",
                "a message was refused as one of an older producer epoch",
            )),
            // Failed because the producer hit a fatal error: said by its cause, which
            // the error callback may not have reported yet.
            Ok(Err((KafkaError::MessageProduction(RDKafkaErrorCode::Fatal), _))) => {
                Err(self.brokers.fatal(self.topic.fatal_error()))
            }
            // Purged because the producer hit a fatal error: the refusal says why.
            Ok(Err((
                KafkaError::MessageProduction(
                    RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight,
                ),
                _,
            ))) if self.brokers.refused().is_some() => Err(self.brokers.refusal_error()),
            // Purged for another reason: its transaction was aborted (the commit's
            // failure says why).
            Ok(Err((
                KafkaError::MessageProduction(
                    RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight,
                ),
                _,
            ))) => Err(SinkError::Abandoned(
                "purged from the producer when its transaction was aborted".into(),
            )),
            Ok(Err((error, message))) => {
                use rdkafka::Message as _;
                Err(delivery_error_to(&error, Some(message.topic())))
            }
            Err(_) => Err(SinkError::transient("the producer was closed")),
        }
    }
}

impl KafkaTicket {
    /// Settles when the brokers refuse this client, with the error saying so.
    pub async fn refused(&self) -> SinkError {
        let mut refusals = self.brokers.refusals();
        let reason = refusals
            .wait_for(Option::is_some)
            .await
            .ok()
            .map(|reason| reason.clone().unwrap_or_default());
        if reason.is_none() {
            // The log is gone with the producer: never refused.
            return std::future::pending().await;
        }
        self.brokers.refusal_error()
    }

    /// The error of a message not delivered within `sink.delivery_timeout_ms`.
    pub fn timed_out(&self) -> SinkError {
        SinkError::transient(format!(
            "a message to topic {} was not delivered to Kafka at {} within sink.delivery_timeout_ms{}",
            self.topic.topic(),
            self.brokers.brokers(),
            if self.brokers.is_down() {
                " (no broker could be reached)"
            } else {
                ""
            }
        ))
    }

    /// As [`timed_out`](Self::timed_out), saying why where the brokers answer but
    /// the topic takes no writes (its partitions as the cluster describes them).
    pub async fn timed_out_why(&self) -> SinkError {
        // Asked even while a broker is down (one of several, say): a cluster that
        // cannot be reached answers nothing, and the plain error stands.
        if let Some(why) = self.topic.why_stalled().await {
            return SinkError::transient(format!(
                "a message to topic {} was not delivered within sink.delivery_timeout_ms though the brokers answer: {why}",
                self.topic.topic()
            ));
        }
        self.timed_out()
    }
}

impl Drop for KafkaTicket {
    fn drop(&mut self) {
        self.brokers.settled();
    }
}

/// How often librdkafka reports statistics when the health is watched.
const STATISTICS_INTERVAL_MS: &str = "1000";

pub struct KafkaSink {
    producer: FutureProducer<HealthContext>,
    brokers: Arc<BrokerLog>,
    /// `sink.delivery_timeout_ms`, enforced on the oldest outstanding message.
    delivery_timeout: Duration,
    partitions: HashMap<String, i32>,
    admin: Option<Arc<rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>>>,
    /// The largest record batch this producer sends (the largest segment, or a
    /// batch of smaller ones), checked against each topic's limit.
    largest_message: usize,
    /// The setting that sets the largest message.
    sized_by: &'static str,
    /// Each topic met (its limit checked at its first message), for a stalled
    /// message's diagnosis.
    probes: HashMap<String, Arc<stall::TopicProbe>>,
    topic_error: Arc<Mutex<Option<SinkError>>>,
    /// `sink.exactly_once`: each batch in a transaction with its position.
    transactions: Option<transactions::Transactions>,
}

/// How long the first message to a topic waits for the topic's limit to be read.
const TOPIC_CHECK_WAIT: Duration = Duration::from_millis(500);

impl KafkaSink {
    /// A producer; `largest_message` (the encoder's `max_message_size_kb` in bytes) is
    /// checked against each topic's `max.message.bytes` before the first message to it.
    pub fn new(settings: &KafkaSettings, largest_message: usize) -> Result<Self, SinkError> {
        Self::with_health(settings, largest_message, Arc::default())
    }

    /// As [`new`](Self::new), reporting the brokers' state to `health`.
    pub fn with_health(
        settings: &KafkaSettings,
        largest_message: usize,
        health: Arc<SinkHealth>,
    ) -> Result<Self, SinkError> {
        let mut config = ClientConfig::new();
        for (key, value) in &settings.properties {
            config.set(key, value);
        }
        if health.watched() {
            config.set("statistics.interval.ms", STATISTICS_INTERVAL_MS);
        }
        let bootstrap = settings
            .properties
            .iter()
            .rev()
            .find(|(k, _)| k == "bootstrap.servers")
            .map_or_else(String::new, |(_, v)| v.clone());
        let brokers = Arc::new(BrokerLog::new(bootstrap).with_health(Arc::clone(&health)));
        let producer: FutureProducer<HealthContext> = config
            .create_with_context(HealthContext {
                health,
                brokers: Arc::clone(&brokers),
            })
            .map_err(|e| {
                SinkError::definite(format!(
                    "cannot create the Kafka producer: {}",
                    config_error(&e)
                ))
            })?;
        // Event Hubs' endpoint limit is enforced by the configuration instead.
        let admin = if settings.check_topic_limits {
            match admin::admin_config(settings).create() {
                Ok(admin) => Some(Arc::new(admin)),
                Err(e) => {
                    tracing::warn!(error = %config_error(&e), "cannot create a Kafka admin client, so topics' max.message.bytes are not checked before sending: make sure each topic's limit exceeds event.max_message_size_kb");
                    None
                }
            }
        } else {
            None
        };
        Ok(KafkaSink {
            producer,
            brokers,
            delivery_timeout: settings.delivery_timeout,
            partitions: HashMap::new(),
            admin,
            largest_message: settings.largest_record_batch(largest_message),
            sized_by: settings.sized_by,
            probes: HashMap::new(),
            topic_error: Arc::new(Mutex::new(None)),
            transactions: settings
                .transaction
                .clone()
                .map(|t| transactions::Transactions::new(t, settings.delivery_timeout)),
        })
    }

    /// Reads `topic`'s `max.message.bytes` (the admin API's DescribeConfigs, which
    /// reports the broker's `message.max.bytes` where the topic does not override it)
    /// before the first message to it: a limit below the largest segment fails the
    /// send, naming both settings, before anything reaches the topic. The answer is
    /// awaited [`TOPIC_CHECK_WAIT`] at most (a broker answers in milliseconds), then
    /// taken in the background, so that one slow to answer never holds deliveries;
    /// where the limit cannot be read (no such topic yet, an endpoint without the
    /// API), that is said and the run goes on.
    async fn check_topic(&self, probe: &Arc<stall::TopicProbe>) {
        let Some(admin) = self.admin.clone() else {
            return;
        };
        let mut checked = tokio::spawn(admin::check_topic_in_background(
            admin,
            Arc::clone(probe),
            crate::sink::LargestMessage {
                bytes: self.largest_message,
                setting: self.sized_by,
            },
            Arc::clone(&self.topic_error),
        ));
        if tokio::time::timeout(TOPIC_CHECK_WAIT, &mut checked)
            .await
            .is_err()
        {
            tracing::debug!(
                topic = probe.topic(),
                "the topic's max.message.bytes is not known yet; checked in the background"
            );
        }
    }

    /// A topic limit found too small, if any.
    fn topic_error(&self) -> Option<SinkError> {
        self.topic_error.lock().ok().and_then(|slot| slot.clone())
    }

    /// The number of partitions of `topic` (asked once, then remembered).
    async fn partition_count(&mut self, topic: &str) -> Result<i32, SinkError> {
        if let Some(count) = self.partitions.get(topic) {
            return Ok(*count);
        }
        // A topic being created (auto-creation, or just made) has no partitions or
        // no leader for a moment: asked again until the delivery timeout. A refusal
        // is definite at once.
        let deadline = tokio::time::Instant::now() + self.delivery_timeout;
        let mut wait = Duration::from_millis(100);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let producer = self.producer.clone();
            let name = topic.to_owned();
            let asked = tokio::task::spawn_blocking(move || {
                producer
                    .client()
                    .fetch_metadata(
                        Some(&name),
                        left.clamp(Duration::from_millis(100), Duration::from_secs(30)),
                    )
                    .map(|m| {
                        m.topics().first().map_or((0, None), |t| {
                            let count = i32::try_from(t.partitions().len()).unwrap_or(0);
                            (count, t.error().map(RDKafkaErrorCode::from))
                        })
                    })
            })
            .await
            .map_err(|e| SinkError::transient_because("the metadata request's thread failed", e))?;
            let why = match asked {
                Ok((count, None)) if count > 0 => {
                    self.partitions.insert(topic.to_owned(), count);
                    return Ok(count);
                }
                Ok((_, Some(RDKafkaErrorCode::TopicAuthorizationFailed))) => {
                    return Err(SinkError::definite(format!(
                        "topic {topic}: not authorized (TOPIC_AUTHORIZATION_FAILED): grant the user (sink.sasl_username) Describe and Write on it"
                    )));
                }
                Ok((_, Some(RDKafkaErrorCode::InvalidTopic))) => {
                    return Err(SinkError::definite(format!(
                        "topic {topic}: not a valid topic name (check sink.topic)"
                    )));
                }
                Ok((_, Some(code))) => code.to_string(),
                Ok((_, None)) => "no partitions yet".to_owned(),
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() + wait >= deadline {
                return Err(SinkError::transient(format!(
                    "topic {topic} had no partitions to write to within sink.delivery_timeout_ms ({why}): is it being created, and does the broker create topics (auto.create.topics.enable)?"
                )));
            }
            tracing::debug!(topic, reason = %why, "topic not ready; asking again");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
        }
    }

    /// With `sink.exactly_once`: when the open transaction is committed.
    pub fn transaction_bound(&self) -> Option<TransactionBound> {
        self.transactions.as_ref().map(|t| t.settings.bound)
    }

    /// How long a message may stay undelivered before the run fails.
    pub fn delivery_timeout(&self) -> Duration {
        self.delivery_timeout
    }

    /// With `sink.exactly_once`: takes the stream's transactional id, fencing
    /// every earlier producer of it.
    pub async fn init_transactions(&mut self) -> Result<(), SinkError> {
        match &self.transactions {
            Some(t) => t.init(&self.producer).await,
            None => Ok(()),
        }
    }

    /// Ends a batch: with `sink.exactly_once`, writes `position` into the batch's
    /// transaction and commits it.
    pub async fn end_batch(
        &mut self,
        position: &crate::position::Position,
    ) -> Result<(), SinkError> {
        match &mut self.transactions {
            Some(t) => t.commit(&self.producer, position).await,
            None => Ok(()),
        }
    }

    /// Aborts a transaction left open (a shutdown that cut a batch): nothing of it
    /// becomes visible, and `read_committed` consumers are not held up by it.
    pub async fn close(&mut self) {
        if let Some(t) = &mut self.transactions
            && t.is_open()
        {
            t.abort(&self.producer).await;
        }
    }

    pub async fn send(&mut self, message: OutgoingMessage) -> Result<Delivery, SinkError> {
        if let Some(e) = self.topic_error() {
            return Err(e);
        }
        if let Some(t) = &mut self.transactions {
            t.begin(&self.producer)?;
        }
        if self.brokers.refused().is_some() {
            return Err(self.brokers.refusal_error());
        }
        let probe = match self.probes.get(&message.topic) {
            Some(probe) => Arc::clone(probe),
            None => {
                let probe = Arc::new(stall::TopicProbe::new(
                    &message.topic,
                    self.producer.clone(),
                    self.admin.clone(),
                ));
                self.probes
                    .insert(message.topic.clone(), Arc::clone(&probe));
                self.check_topic(&probe).await;
                if let Some(e) = self.topic_error() {
                    return Err(e);
                }
                probe
            }
        };
        let partition = match message.partition_hint {
            Some(hint) => {
                let count = self.partition_count(&message.topic).await?;
                Some(i32::try_from(hint % u64::try_from(count).unwrap_or(1)).unwrap_or(0))
            }
            None => None,
        };
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&message.topic);
        // A tombstone's value is null, not empty.
        if !message.tombstone {
            record = record.payload(message.payload.as_slice());
        }
        if let Some(headers) = librdkafka_headers(&message.headers) {
            record = record.headers(headers);
        }
        if let Some(key) = &message.key {
            record = record.key(key.as_slice());
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        // A queue that stays full (brokers gone, one batch larger than the queue) is
        // waited out for the delivery timeout at most: librdkafka times nothing out.
        let full_since = tokio::time::Instant::now();
        loop {
            match self.producer.send_result(record) {
                Ok(future) => {
                    return Ok(Delivery::Kafka(
                        future,
                        KafkaTicket::new(&self.brokers, &probe),
                    ));
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    if self.brokers.refused().is_some() {
                        return Err(self.brokers.refusal_error());
                    }
                    if full_since.elapsed() >= self.delivery_timeout {
                        return Err(SinkError::transient(format!(
                            "the producer's queue stayed full for sink.delivery_timeout_ms (Kafka at {}{})",
                            self.brokers.brokers(),
                            if self.brokers.is_down() {
                                ": no broker could be reached"
                            } else {
                                ""
                            }
                        )));
                    }
                    // Backpressure: wait for the queue to drain a little, then offer
                    // the same record again.
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                // The producer stopped on a fatal error: said by its cause, which
                // the error callback may not have reported yet.
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::Fatal), _)) => {
                    return Err(self.brokers.fatal(self.producer.client().fatal_error()));
                }
                Err((e, record)) => return Err(delivery_error_to(&e, Some(record.topic))),
            }
        }
    }

    pub async fn flush(&mut self, timeout: Duration) -> Result<(), SinkError> {
        let producer = self.producer.clone();
        tokio::task::spawn_blocking(move || producer.flush(timeout))
            .await
            .map_err(|e| SinkError::transient_because("the flush's thread failed", e))?
            .map_err(|e| delivery_error(&e))
    }
}

/// A message's headers as librdkafka takes them; `None` for none (the router always
/// sets at least `content-type`, so only a message built elsewhere has none), which
/// spares librdkafka an empty header list to allocate and free.
pub fn librdkafka_headers(headers: &crate::sink::Headers) -> Option<OwnedHeaders> {
    if headers.is_empty() {
        return None;
    }
    let mut owned = OwnedHeaders::new_with_capacity(headers.len());
    for (name, value) in headers {
        owned = owned.insert(Header {
            key: name,
            value: Some(value),
        });
    }
    Some(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink() -> KafkaSinkConfig {
        KafkaSinkConfig {
            kafka: config::PassThrough([("linger.ms".to_string(), "5".to_string())].into()),
            ..KafkaSinkConfig::new("localhost:9092")
        }
    }

    use KafkaFlavour::{EventHubs, Kafka};

    /// No headers make no header list; headers arrive every one, in order.
    #[test]
    fn headers_reach_librdkafka_in_order_and_no_list_is_made_for_none() {
        use rdkafka::message::Headers as _;
        assert!(librdkafka_headers(&Vec::new()).is_none());
        let headers: crate::sink::Headers =
            vec![("ce_id", b"1".to_vec()), ("ce_type", b"t".to_vec())];
        let owned = librdkafka_headers(&headers).unwrap();
        assert_eq!(owned.count(), 2);
        let got: Vec<(String, Vec<u8>)> = owned
            .iter()
            .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
            .collect();
        let want: Vec<(String, Vec<u8>)> = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        assert_eq!(got, want);
    }

    fn get<'a>(s: &'a KafkaSettings, key: &str) -> Option<&'a str> {
        s.properties
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn kafka_defaults_are_idempotent_lz4_and_sized() {
        let s = KafkaSettings::new(&sink(), Kafka, 256 * 1024, None).unwrap();
        assert_eq!(get(&s, "enable.idempotence"), Some("true"));
        assert_eq!(get(&s, "enable.gapless.guarantee"), Some("true"));
        assert_eq!(get(&s, "acks"), Some("all"));
        assert_eq!(get(&s, "compression.type"), Some("lz4"));
        assert_eq!(get(&s, "message.max.bytes"), Some("327680"));
        assert_eq!(get(&s, "linger.ms"), Some("5"));
        assert_eq!(
            get(&s, "partitioner"),
            Some("murmur2_random"),
            "Java's placement"
        );
        let mut consistent = sink();
        consistent.partitioner = Partitioner::ConsistentRandom;
        let s = KafkaSettings::new(&consistent, Kafka, 256 * 1024, None).unwrap();
        assert_eq!(get(&s, "partitioner"), Some("consistent_random"));
    }

    /// A topic's limit must take the producer's largest record batch: the largest
    /// segment with its headers, or a batch of smaller ones up to
    /// `min(batch.size, message.max.bytes)`, whichever is more.
    #[test]
    fn a_topic_limit_below_the_largest_record_batch_names_the_settings() {
        const SIZED_BY: &str = "event.max_message_size_kb";
        let bound = |kb: usize, batch_size: Option<&str>| {
            let mut config = sink();
            if let Some(size) = batch_size {
                config.kafka.insert("batch.size".into(), size.into());
            }
            KafkaSettings::new(&config, Kafka, kb * 1024, None)
                .unwrap()
                .largest_record_batch(kb * 1024)
        };
        // 256 KiB segments: librdkafka batches up to message.max.bytes (320 KiB).
        assert_eq!(bound(256, None), 256 * 1024 + 64 * 1024);
        // A limit that takes one segment but not a batch of them is refused.
        assert!(check_topic_limit("ces", 300_000, bound(256, None), SIZED_BY).is_err());
        assert!(check_topic_limit("ces", 327_680, bound(256, None), SIZED_BY).is_ok());
        // A smaller batch.size lowers the bound to the segment with its headers.
        assert_eq!(
            bound(256, Some("100000")),
            256 * 1024 + RECORD_OVERHEAD_BYTES
        );
        // 1000 KiB: batch.size (1,000,000) is less than one segment.
        assert_eq!(bound(1000, None), 1000 * 1024 + RECORD_OVERHEAD_BYTES);
        assert!(check_topic_limit("ces", 1_048_588, bound(1000, None), SIZED_BY).is_ok());
        let err = check_topic_limit("ces", 1_048_588, bound(1024, None), SIZED_BY)
            .unwrap_err()
            .to_string();
        assert!(err.contains("max.message.bytes"), "{err}");
        assert!(
            err.contains("event.max_message_size_kb") && err.contains("batch.size"),
            "{err}"
        );
    }

    #[test]
    fn event_hubs_requests_stay_below_the_service_limit() {
        let cs = "Endpoint=sb://myns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0";
        let eh = sink();
        let s =
            KafkaSettings::new(&eh, EventHubs, EVENT_HUBS_MAX_MESSAGE_KB * 1024, Some(cs)).unwrap();
        let limit: usize = get(&s, "message.max.bytes").unwrap().parse().unwrap();
        assert!(limit < EVENT_HUBS_REQUEST_LIMIT, "{limit}");
        assert!(limit >= EVENT_HUBS_MAX_MESSAGE_KB * 1024 + EVENT_HUBS_RECORD_OVERHEAD);
        assert_eq!(get(&s, "socket.keepalive.enable"), Some("true"));
        assert_eq!(get(&s, "metadata.max.age.ms"), Some("180000"));
        for kb in [128, 256, 512] {
            assert!(
                KafkaSettings::new(&eh, EventHubs, kb * 1024, Some(cs)).is_ok(),
                "{kb}"
            );
        }
        let err = KafkaSettings::new(&eh, EventHubs, 1024 * 1024, Some(cs))
            .err()
            .unwrap();
        let text = err.to_string();
        assert!(text.contains("event.max_message_size_kb"), "{text}");
        assert!(
            text.contains(&EVENT_HUBS_MAX_MESSAGE_KB.to_string()),
            "{text}"
        );
    }

    /// `sb://host:9/` would make `host:9:9093`: an endpoint with a port (or a path)
    /// is refused, naming it, at configuration time.
    #[test]
    fn an_event_hubs_endpoint_with_a_port_is_refused_naming_it() {
        let cs = "Endpoint=sb://127.0.0.1:9/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0";
        let err = KafkaSettings::new(&sink(), EventHubs, 1000 * 1024, Some(cs))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("sb://127.0.0.1:9/") && err.contains("9093"),
            "{err}"
        );
        assert!(!err.contains("c2VjcmV0"), "{err}");
        let mut config = sink();
        let path = std::env::temp_dir().join(format!("mssql-ces-ehport-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, cs).unwrap();
        config.connection_string.file = Some(path.clone());
        let err = config.check_secrets(EventHubs).unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(err.contains("gives a port"), "{err}");
        assert!(!err.contains("delivery cannot succeed"), "{err}");
    }

    #[test]
    fn event_hubs_endpoint_settings_come_from_the_connection_string() {
        let cs = "Endpoint=sb://myns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0;EntityPath=orders";
        assert_eq!(
            parse_event_hubs_connection_string(cs).unwrap(),
            (
                "myns.servicebus.windows.net".to_string(),
                Some("orders".to_string())
            )
        );
        let s = KafkaSettings::new(&sink(), EventHubs, 1000 * 1024, Some(cs)).unwrap();
        assert_eq!(
            get(&s, "bootstrap.servers"),
            Some("myns.servicebus.windows.net:9093")
        );
        assert_eq!(get(&s, "security.protocol"), Some("SASL_SSL"));
        assert_eq!(get(&s, "sasl.mechanism"), Some("PLAIN"));
        assert_eq!(get(&s, "sasl.username"), Some("$ConnectionString"));
        assert_eq!(get(&s, "sasl.password"), Some(cs));
        assert_eq!(get(&s, "request.timeout.ms"), Some("60000"));
        assert_eq!(get(&s, "compression.type"), Some("none"));
        let err = parse_event_hubs_connection_string("SharedAccessKey=c2VjcmV0").unwrap_err();
        assert!(!err.to_string().contains("c2VjcmV0"), "{err}");
    }

    /// librdkafka's configuration errors quote the value, which may be a secret: the
    /// message keeps the property's name and the reason, never the value.
    #[test]
    fn a_configuration_error_never_shows_the_value() {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("sasl.oauthbearer.client.secret", "HUNTER2oauth");
        let Err(e) = config.create::<rdkafka::producer::BaseProducer>() else {
            panic!("this build has no OIDC");
        };
        assert!(
            e.to_string().contains("HUNTER2oauth"),
            "rdkafka's own text quotes it: {e}"
        );
        let text = config_error(&e);
        assert!(text.contains("sasl.oauthbearer.client.secret"), "{text}");
        assert!(!text.contains("HUNTER2"), "{text}");
        let mut config = ClientConfig::new();
        config.set("linger.ms", "HUNTER2linger");
        let Err(e) = config.create::<rdkafka::producer::BaseProducer>() else {
            panic!("not a number");
        };
        let text = config_error(&e);
        assert!(
            text.contains("linger.ms") && !text.contains("HUNTER2"),
            "{text}"
        );
    }

    #[test]
    fn refusals_of_the_message_or_of_rights_are_definite_the_rest_transient() {
        use RDKafkaErrorCode as C;
        for code in [
            C::MessageSizeTooLarge,
            C::TopicAuthorizationFailed,
            C::UnknownTopic,
            C::InvalidTopic,
            C::SaslAuthenticationFailed,
        ] {
            let e = delivery_error(&KafkaError::MessageProduction(code));
            assert!(matches!(e, SinkError::Definite { .. }), "{code:?}: {e:?}");
        }
        for code in [
            C::MessageTimedOut,
            C::BrokerTransportFailure,
            C::NotEnoughReplicas,
            C::RequestTimedOut,
            C::AllBrokersDown,
        ] {
            let e = delivery_error(&KafkaError::MessageProduction(code));
            assert!(matches!(e, SinkError::Transient { .. }), "{code:?}: {e:?}");
        }
        // The idempotent producer's lost state: a new producer resumes.
        for code in [
            C::OutOfOrderSequenceNumber,
            C::UnknownProducerId,
            C::InvalidProducerIdMapping,
        ] {
            let e = delivery_error(&KafkaError::MessageProduction(code));
            assert!(
                matches!(e, SinkError::ProducerLost { .. }),
                "{code:?}: {e:?}"
            );
        }
        // A message's error names its topic.
        let invalid = delivery_error_to(
            &KafkaError::MessageProduction(C::InvalidTopic),
            Some("ces.CesDemo.sales.order details"),
        );
        let said = crate::error::Chain(&invalid).to_string();
        assert!(
            said.contains("topic ces.CesDemo.sales.order details: "),
            "{said}"
        );
        // The client's error is the cause, shown once.
        assert_eq!(said.matches("Broker: Invalid topic").count(), 1, "{said}");
    }
}

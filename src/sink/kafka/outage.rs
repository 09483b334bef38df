//! What the log says about the brokers: an outage once when it starts and once when
//! it ends (with how many messages wait), a reminder at most every
//! [`REMINDER_EVERY`] while it lasts, and any other librdkafka error once per
//! [`REMINDER_EVERY`] rather than once per occurrence. librdkafka reports a broker
//! that cannot be reached many times a second, on every connection attempt.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// How often a lasting outage (or a repeated error) is logged again.
pub(super) const REMINDER_EVERY: Duration = Duration::from_secs(60);

/// The brokers' story as the log tells it, and the messages waiting for them.
#[derive(Debug)]
pub struct BrokerLog {
    /// `bootstrap.servers`, to name in every line.
    brokers: String,
    /// Messages handed to the producer and not yet settled.
    waiting: AtomicU64,
    state: Mutex<State>,
    /// Set when the brokers refuse this client (bad credentials, no rights to the
    /// cluster, a fatal producer error): what waits for a delivery fails at once.
    refusal: tokio::sync::watch::Sender<Option<String>>,
    /// The sink's health, which counts the same messages for readiness.
    health: Option<std::sync::Arc<crate::sink::SinkHealth>>,
}

#[derive(Debug, Default)]
struct State {
    /// Since when no broker could be reached.
    down_since: Option<Instant>,
    /// When the outage was last logged.
    said_at: Option<Instant>,
    /// Connection errors not logged since then.
    unsaid: u64,
    /// Other errors: the last one logged, and when.
    last_error: Option<(String, Instant)>,
    /// Messages wait and none has been acknowledged for a while (said once).
    unacknowledged: bool,
}

/// Whether an error means the brokers refuse this client, which retrying cannot
/// change: a failed login, no rights to the cluster, or a fatal producer error
/// (the idempotent producer's state is lost).
pub(super) fn is_refusal(error: &KafkaError, reason: &str) -> bool {
    use RDKafkaErrorCode as C;
    match error.rdkafka_error_code() {
        Some(
            C::Authentication
            | C::SaslAuthenticationFailed
            | C::ClusterAuthorizationFailed
            | C::Fatal
            // The idempotent producer's state lost: fatal (reported with its cause).
            | C::OutOfOrderSequenceNumber
            | C::UnknownProducerId
            | C::InvalidProducerIdMapping
            // A transactional producer fenced by a newer one of its id: fatal.
            | C::Fenced
            | C::ProducerFenced,
        ) => true,
        // A TLS handshake that ends in a certificate the client does not trust, or in
        // the broker's alert (a client certificate it requires, missing or not
        // trusted): the same again next time. A handshake cut by the network is not.
        // Under TLS 1.3 the broker's alert arrives after the handshake, as a failed
        // receive ("sslv3 alert bad certificate").
        Some(C::SSL | C::BrokerTransportFailure) => is_certificate_refusal(reason),
        _ => false,
    }
}

/// Whether a refusal is a transactional producer's fencing.
fn is_fencing(refusal: &str) -> bool {
    refusal.contains("Fenced") || refusal.contains("fenced")
}

/// Whether a fatal error means the idempotent producer lost its state, which a new
/// producer does not inherit: librdkafka's reasons for a sequence that no longer
/// agrees with the broker's, or a producer id the broker forgot. (A message refused
/// for good, "unable to satisfy gap-less guarantee", would be refused again.)
fn is_lost_state(refusal: &str) -> bool {
    [
        "OutOfOrderSequenceNumber",
        "UnknownProducerId",
        "InvalidProducerIdMapping",
        "sequence desynchronization",
        "rewound sequence number",
        "unknown producer id",
    ]
    .iter()
    .any(|reason| refusal.contains(reason))
}

/// Whether a failure's reason is TLS's, about certificates (either side's).
fn is_certificate_refusal(reason: &str) -> bool {
    let reason = reason.to_ascii_lowercase();
    reason.contains("ssl")
        && [
            "certificate",
            "unknown ca",
            "verify failed",
            "handshake failure",
        ]
        .iter()
        .any(|word| reason.contains(word))
}

/// Whether an error means the brokers cannot be reached (rather than that they
/// refuse something).
fn is_unreachable(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(C::AllBrokersDown | C::BrokerTransportFailure | C::Resolve | C::BrokerNotAvailable)
    )
}

impl BrokerLog {
    pub fn new(brokers: impl Into<String>) -> Self {
        BrokerLog {
            brokers: brokers.into(),
            waiting: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            refusal: tokio::sync::watch::Sender::new(None),
            health: None,
        }
    }

    /// Follows the refusal: set once the brokers refuse this client.
    pub fn refusals(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.refusal.subscribe()
    }

    /// Records the first refusal, and says it.
    fn refuse(&self, error: &KafkaError, reason: &str) {
        if self.refused().is_some() {
            return;
        }
        if is_fencing(&error.to_string()) {
            tracing::warn!(brokers = %self.brokers, error = %crate::error::Chain(&error), reason, "another process with this stream's transactional id took over: this one stops");
        } else if is_lost_state(&format!("{error}: {reason}")) {
            tracing::warn!(brokers = %self.brokers, error = %crate::error::Chain(&error), reason, "the Kafka producer lost its idempotence state and stops");
        } else {
            tracing::error!(brokers = %self.brokers, error = %crate::error::Chain(&error), reason, "Kafka refused this client");
        }
        self.refusal
            .send_replace(Some(format!("{error}: {reason}")));
    }

    /// Why the brokers refused this client, if they did.
    pub fn refused(&self) -> Option<String> {
        self.refusal.borrow().clone()
    }

    /// The error of a client the brokers refused, naming the settings to check.
    pub fn refusal_error(&self) -> crate::sink::SinkError {
        let refused = self.refused().unwrap_or_default();
        if is_fencing(&refused) {
            return super::transactions::fenced(
                "its transactional id, sink.transactional_id",
                &refused,
            );
        }
        if is_lost_state(&refused) {
            return crate::sink::SinkError::producer_lost(refused);
        }
        if refused.contains("gap-less guarantee") {
            return crate::sink::SinkError::definite(format!(
                "Kafka at {} refused a message for good ({refused}): the producer stopped, so that no later message of its partition is written after the gap; a restart stops on the same message: change what the refusal names",
                self.brokers
            ));
        }
        let check = if refused.contains("SSL") || refused.contains("ssl") {
            "check sink.ssl_ca_location (the CA that signed the brokers' certificates) and, where the brokers require a client certificate, sink.ssl_certificate_location and sink.ssl_key_location"
        } else if refused.contains("ClusterAuthorizationFailed") {
            "the login lacks a right on the cluster: grant it WRITE on the sink's topic (Kafka then allows the idempotent producer's IDEMPOTENT_WRITE), and check sink.sasl_username"
        } else {
            "check sink.sasl_mechanism, sink.sasl_username and sink.sasl_password, and the user's rights on the cluster"
        };
        crate::sink::SinkError::definite(format!(
            "Kafka at {} refused this client ({refused}): {check}",
            self.brokers,
        ))
    }

    /// The brokers as configured.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// Also counts sent and settled messages in `health` (readiness follows them).
    pub fn with_health(mut self, health: std::sync::Arc<crate::sink::SinkHealth>) -> Self {
        self.health = Some(health);
        self
    }

    /// Says once, while messages wait, that none has been acknowledged for
    /// [`ACKNOWLEDGEMENT_WAIT`] though the brokers are connected (a broker frozen or
    /// overloaded), and once when acknowledgements come again.
    pub fn watch_acknowledgements(&self, health: &crate::sink::SinkHealth) {
        let stalled = health
            .waiting()
            .filter(|(_, quiet)| *quiet >= crate::sink::ACKNOWLEDGEMENT_WAIT);
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        match (stalled, state.unacknowledged) {
            (Some((waiting, quiet)), false) => {
                state.unacknowledged = true;
                tracing::warn!(brokers = %self.brokers, waiting_messages = waiting, quiet_seconds = quiet.as_secs(), "Kafka acknowledges nothing though connected (a broker frozen or overloaded): not ready until deliveries are acknowledged again; each message fails after sink.delivery_timeout_ms");
            }
            (None, true) => {
                state.unacknowledged = false;
                tracing::info!(brokers = %self.brokers, "Kafka acknowledges deliveries again");
            }
            _ => {}
        }
    }

    /// A message was handed to the producer.
    pub fn sent(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        if let Some(health) = &self.health {
            health.sent();
        }
    }

    /// A message was settled (delivered, or failed for good).
    pub fn settled(&self) {
        if let Some(health) = &self.health {
            health.settled();
        }
        let _ = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Messages handed to the producer and not settled.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The error of a producer stopped by a fatal error: `fatal` is its cause as
    /// librdkafka gives it (`rd_kafka_fatal_error`), which the error callback may not
    /// have reported yet. A fatal error is a refusal, whatever its cause.
    pub fn fatal(&self, fatal: Option<(RDKafkaErrorCode, String)>) -> crate::sink::SinkError {
        if let Some((code, reason)) = fatal {
            self.refuse(&KafkaError::Global(code), &reason);
        }
        self.refusal_error()
    }

    /// librdkafka's error callback.
    pub fn error(&self, error: &KafkaError, reason: &str) {
        self.error_at(error, reason, Instant::now());
    }

    pub(super) fn error_at(&self, error: &KafkaError, reason: &str, now: Instant) {
        if is_refusal(error, reason) {
            self.refuse(error, reason);
            return;
        }
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if !is_unreachable(error) {
            let repeated = state.last_error.as_ref().is_some_and(|(last, at)| {
                last == reason && now.duration_since(*at) < REMINDER_EVERY
            });
            if repeated {
                tracing::debug!(error = %crate::error::Chain(&error), reason, "Kafka (repeated)");
            } else {
                state.last_error = Some((reason.to_owned(), now));
                tracing::warn!(brokers = %self.brokers, error = %crate::error::Chain(&error), reason, "Kafka");
            }
            return;
        }
        match (state.down_since, state.said_at) {
            (None, _) => {
                state.down_since = Some(now);
                state.said_at = Some(now);
                state.unsaid = 0;
                tracing::warn!(
                    brokers = %self.brokers,
                    waiting_messages = self.waiting(),
                    reason,
                    "Kafka unreachable: events wait in the producer's queue and are sent when a broker answers; each fails after sink.delivery_timeout_ms"
                );
            }
            (Some(since), Some(said)) if now.duration_since(said) >= REMINDER_EVERY => {
                state.said_at = Some(now);
                let repeats = std::mem::take(&mut state.unsaid);
                tracing::warn!(
                    brokers = %self.brokers,
                    waiting_messages = self.waiting(),
                    down_seconds = now.duration_since(since).as_secs(),
                    errors_since_last_line = repeats + 1,
                    reason,
                    "Kafka still unreachable"
                );
            }
            _ => {
                state.unsaid += 1;
                tracing::debug!(reason, "Kafka unreachable (repeated)");
            }
        }
    }

    /// A broker answered (a delivery succeeded, or the statistics show one up).
    pub fn reachable(&self) {
        self.reachable_at(Instant::now());
    }

    pub(super) fn reachable_at(&self, now: Instant) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if let Some(since) = state.down_since.take() {
            state.said_at = None;
            state.unsaid = 0;
            tracing::info!(
                brokers = %self.brokers,
                down_seconds = now.duration_since(since).as_secs(),
                waiting_messages = self.waiting(),
                "Kafka reachable again"
            );
        }
    }

    /// Whether an outage is going on.
    pub fn is_down(&self) -> bool {
        self.state.lock().is_ok_and(|s| s.down_since.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transport() -> KafkaError {
        KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure)
    }

    /// Hundreds of connection errors make one line when the outage starts, a
    /// reminder a minute later, and one when it ends, each naming the brokers and
    /// what waits.
    #[test]
    fn an_outage_is_logged_when_it_starts_and_ends_not_per_error() {
        let log = crate::test_log::capture();
        let brokers = BrokerLog::new("127.0.0.1:1");
        for _ in 0..7 {
            brokers.sent();
        }
        brokers.settled();
        let start = Instant::now();
        for i in 0..300 {
            brokers.error_at(
                &transport(),
                "Connection refused",
                start + Duration::from_millis(i * 100),
            );
        }
        assert!(brokers.is_down());
        let lines = log.lines();
        let warnings: Vec<_> = lines.iter().filter(|l| l["level"] == "WARN").collect();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0]["brokers"], "127.0.0.1:1");
        assert_eq!(warnings[0]["waiting_messages"], 6);
        assert!(
            warnings[0]["message"]
                .as_str()
                .unwrap()
                .contains("sink.delivery_timeout_ms")
        );

        brokers.error_at(
            &transport(),
            "Connection refused",
            start + REMINDER_EVERY + Duration::from_secs(1),
        );
        let reminders = log.with_message("Kafka still unreachable");
        assert_eq!(reminders.len(), 1);
        assert_eq!(reminders[0]["down_seconds"], 61);
        assert_eq!(reminders[0]["errors_since_last_line"], 300);

        brokers.reachable_at(start + Duration::from_secs(90));
        brokers.reachable_at(start + Duration::from_secs(91));
        let ended = log.with_message("Kafka reachable again");
        assert_eq!(ended.len(), 1, "once");
        assert_eq!(ended[0]["down_seconds"], 90);
        assert!(!brokers.is_down());
        // A new outage is a new first line.
        brokers.error_at(
            &transport(),
            "Connection refused",
            start + Duration::from_secs(100),
        );
        let warnings = log
            .lines()
            .into_iter()
            .filter(|l| l["level"] == "WARN")
            .count();
        assert_eq!(warnings, 3);
    }

    /// A TLS certificate the broker or the client refuses is a refusal; a
    /// connection refused, or a TLS error of another kind, is not.
    #[test]
    fn certificate_refusals_are_refusals_and_other_transport_errors_are_not() {
        let ssl = KafkaError::Global(RDKafkaErrorCode::SSL);
        let cases = [
            (
                &transport(),
                "ssl://127.0.0.1:1/bootstrap: Receive failed: error:0A000412:SSL routines::sslv3 alert bad certificate: SSL alert number 42",
                true,
            ),
            (
                &ssl,
                "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed",
                true,
            ),
            (
                &ssl,
                "SSL handshake failed: ssl/record/rec_layer_s3.c:303: unexpected eof while reading",
                false,
            ),
            (&transport(), "Connection refused", false),
            (
                &transport(),
                "Receive failed: certificate-named host, plain connection reset",
                false,
            ),
        ];
        for (error, reason, refused) in cases {
            assert_eq!(is_refusal(error, reason), refused, "{reason}");
        }
        let brokers = BrokerLog::new("b:9093");
        brokers.error_at(&transport(), cases[0].1, Instant::now());
        let message = brokers.refusal_error().to_string();
        assert!(
            message.contains("sink.ssl_certificate_location"),
            "{message}"
        );
    }

    /// The idempotent producer's lost state (librdkafka's fatal error, reported
    /// with its cause) stops the producer and is said as such, a new producer's
    /// to resume; a message refused for good under the gap-less guarantee is not.
    #[test]
    fn a_lost_producer_state_is_a_refusal_a_new_producer_resumes_from() {
        let lost = KafkaError::Global(RDKafkaErrorCode::OutOfOrderSequenceNumber);
        let reason = "ProduceRequest for ces [3] with 8 message(s) failed due to sequence desynchronization with broker 1";
        assert!(is_refusal(&lost, reason));
        let brokers = BrokerLog::new("b:9092");
        brokers.error_at(&lost, reason, Instant::now());
        assert!(
            matches!(
                brokers.refusal_error(),
                crate::sink::SinkError::ProducerLost { .. }
            ),
            "{:?}",
            brokers.refusal_error()
        );
        let gapless = KafkaError::Global(RDKafkaErrorCode::Fatal);
        let brokers = BrokerLog::new("b:9092");
        brokers.error_at(
            &gapless,
            "ProduceRequest for ces [0] with 1 message(s) failed: Broker: Message size too large (broker 1 PID{Id:1,Epoch:0}, base seq 0): unable to satisfy gap-less guarantee",
            Instant::now(),
        );
        let said = brokers.refusal_error();
        assert!(
            matches!(&said, crate::sink::SinkError::Definite { reason: text, .. }
                if text.contains("refused a message for good") && !text.contains("sasl")),
            "{said:?}"
        );
    }

    #[test]
    fn other_errors_are_logged_once_a_minute_each() {
        let log = crate::test_log::capture();
        let brokers = BrokerLog::new("b:9092");
        let refused = KafkaError::Global(RDKafkaErrorCode::TopicAuthorizationFailed);
        let start = Instant::now();
        for i in 0..10 {
            brokers.error_at(&refused, "not authorized", start + Duration::from_secs(i));
        }
        brokers.error_at(&refused, "another reason", start + Duration::from_secs(11));
        brokers.error_at(&refused, "not authorized", start + Duration::from_secs(75));
        let warned: Vec<String> = log
            .lines()
            .iter()
            .filter(|l| l["level"] == "WARN")
            .map(|l| l["reason"].as_str().unwrap_or("").to_owned())
            .collect();
        assert_eq!(
            warned,
            ["not authorized", "another reason", "not authorized"]
        );
        assert!(!brokers.is_down(), "refusals are no outage");
    }

    #[test]
    fn waiting_never_goes_below_zero() {
        let brokers = BrokerLog::new("b:9092");
        brokers.settled();
        brokers.sent();
        assert_eq!(brokers.waiting(), 1);
    }
}

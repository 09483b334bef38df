//! Destinations: Kafka (and Event Hubs through its Kafka endpoint), stdout and files.
//!
//! [`Router`] turns an encoded event into [`OutgoingMessage`]s: the topic from the
//! template, the key from the partition-key scheme, and the CloudEvents Kafka binding
//! (structured mode: the whole event is the value; binary mode: `ce_*` headers and
//! `data` as the value). Every segment of an event gets the same key (or, with no key,
//! the same partition hint), so all of them land in one partition, in order.
//!
//! [`Sink::send`] applies backpressure (it waits while the producer's queue is full)
//! and returns a [`Delivery`] that resolves when the destination has acknowledged the
//! message; the pipeline awaits deliveries in order before it moves the checkpoint.

pub mod event_hubs_amqp;
pub mod kafka;
mod records;
pub use records::DebeziumRouting;
pub mod registry;
pub mod settings;
pub mod stream;

use crate::error::{Cause, Chain};
use crate::event::schema_change::{SCHEMA_CHANGE_OPERATION, SCHEMA_CHANGE_TYPE, SchemaChange};
use crate::event::settings::EventSettings;
use crate::event::{Change, EncodedEvent, Encoding, TableDescription};
use crate::setting::ConfigError;
use crate::sink::settings::{
    CloudEventsMode, PartitionKeyScheme, RoutingSettings, SchemaChangePlacement,
};

/// Where events go: `[sink]`'s `kind`, with that sink's own settings. Each variant
/// lives beside its sink, with its validation and its `build`.
///
/// Read from `[sink]` by [`settings::SinkSettings`], which dispatches on `kind` itself
/// so that an error names the key.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkConfig {
    Kafka(kafka::KafkaSinkConfig),
    /// Event Hubs through its Kafka endpoint.
    EventHubsKafka(kafka::KafkaSinkConfig),
    EventHubsAmqp(event_hubs_amqp::config::EventHubsAmqpSinkConfig),
    Stdout(stream::StdoutSinkConfig),
    File(stream::FileSinkConfig),
}

/// The largest message a run writes, and the setting that sets it (named where a
/// topic's limit is too small for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargestMessage {
    pub bytes: usize,
    pub setting: &'static str,
}

/// How long messages may wait with none acknowledged before the run is not ready
/// (and the Kafka sink says so once).
pub const ACKNOWLEDGEMENT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a sink reports for the metrics and the readiness probe: whether it has a
/// working connection to the destination, how often it sent something again, and
/// whether messages wait without any being acknowledged (a destination that
/// accepts connections but does not answer, such as a frozen broker).
#[derive(Debug)]
pub struct SinkHealth {
    /// Whether anyone reads this (the metrics are served): a Kafka producer then
    /// reports its brokers' states every second.
    watched: bool,
    connected: std::sync::atomic::AtomicBool,
    retries: std::sync::atomic::AtomicU64,
    /// Messages handed to the destination and not settled yet.
    pending: std::sync::atomic::AtomicU64,
    /// When a message last settled, or the first of those pending was handed over.
    progress: std::sync::Mutex<Option<std::time::Instant>>,
}

impl SinkHealth {
    pub fn new(watched: bool) -> std::sync::Arc<Self> {
        std::sync::Arc::new(SinkHealth {
            watched,
            ..SinkHealth::default()
        })
    }

    /// Whether the metrics are served.
    pub fn watched(&self) -> bool {
        self.watched
    }

    pub fn set_connected(&self, connected: bool) {
        self.connected
            .store(connected, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn connected(&self) -> bool {
        self.connected.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts `count` more re-sends.
    pub fn add_retries(&self, count: u64) {
        self.retries
            .fetch_add(count, std::sync::atomic::Ordering::Relaxed);
    }

    /// Raises the re-send count to a total the client reports (never lowers it).
    pub fn raise_retries_to(&self, total: u64) {
        self.retries
            .fetch_max(total, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn retries(&self) -> u64 {
        self.retries.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A message was handed to the destination.
    pub fn sent(&self) {
        if self
            .pending
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            == 0
        {
            self.progressed();
        }
    }

    /// A message settled (acknowledged, or failed for good).
    pub fn settled(&self) {
        let _ = self.pending.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |n| n.checked_sub(1),
        );
        self.progressed();
    }

    fn progressed(&self) {
        if let Ok(mut at) = self.progress.lock() {
            *at = Some(std::time::Instant::now());
        }
    }

    /// Messages waiting, and for how long none has settled, when some wait.
    pub fn waiting(&self) -> Option<(u64, std::time::Duration)> {
        let pending = self.pending.load(std::sync::atomic::Ordering::Relaxed);
        if pending == 0 {
            return None;
        }
        let at = self.progress.lock().ok().and_then(|at| *at)?;
        Some((pending, at.elapsed()))
    }
}

impl Default for SinkHealth {
    fn default() -> Self {
        SinkHealth {
            watched: false,
            connected: std::sync::atomic::AtomicBool::new(false),
            retries: std::sync::atomic::AtomicU64::new(0),
            pending: std::sync::atomic::AtomicU64::new(0),
            progress: std::sync::Mutex::new(None),
        }
    }
}

/// A sink ready to send, and the topic (or template, or event hub) it sends to.
pub struct BuiltSink {
    pub sink: Sink,
    pub topic: String,
}

/// The message size the connection properties are derived with: they do not depend
/// on it, and every flavour accepts this one (Event Hubs' Kafka endpoint refuses
/// requests of about 1 MiB).
const CONNECTION_ONLY_MAX_BYTES: usize = 64 * 1024;

impl SinkConfig {
    /// The largest Debezium record this destination takes, and what sets it (a
    /// record has no segments, so CES's `event.max_message_size_kb` does not bound
    /// it).
    pub fn record_bound(&self) -> crate::event::debezium::RecordBound {
        use crate::event::debezium::RecordBound;
        match self {
            SinkConfig::Kafka(c) => RecordBound {
                bytes: c.debezium_message_max_bytes() - kafka::RECORD_OVERHEAD_BYTES,
                what: "the producer's message.max.bytes, less room for the key and headers",
                raised_by: Some(
                    "sink.kafka.\"message.max.bytes\" (with each topic's max.message.bytes)",
                ),
            },
            SinkConfig::EventHubsKafka(_) => RecordBound {
                bytes: kafka::EVENT_HUBS_MAX_MESSAGE_KB * 1024,
                what: "Event Hubs' largest request through its Kafka endpoint",
                raised_by: None,
            },
            SinkConfig::EventHubsAmqp(_) => RecordBound {
                bytes: event_hubs_amqp::LARGEST_EVENT_BYTES,
                what: "Event Hubs' largest event (Standard and Premium tiers)",
                raised_by: None,
            },
            SinkConfig::Stdout(_) | SinkConfig::File(_) => RecordBound::NONE,
        }
    }

    /// The largest message the encoder writes: a CES segment
    /// (`event.max_message_size_kb`), or a whole Debezium record
    /// ([`record_bound`](Self::record_bound)).
    pub fn largest_message(&self, event: &EventSettings) -> LargestMessage {
        match event.format {
            crate::event::settings::EventFormat::Ces => LargestMessage {
                bytes: event.max_message_size_kb.bytes(),
                setting: "event.max_message_size_kb",
            },
            crate::event::settings::EventFormat::Debezium => {
                let bound = self.record_bound();
                LargestMessage {
                    bytes: bound.bytes,
                    setting: bound.raised_by.unwrap_or(bound.what),
                }
            }
        }
    }

    /// The Kafka client properties that say where and how to connect (secrets read
    /// now: never log them), for a store that writes to the same brokers; `None`
    /// for a destination that is not reached over the Kafka protocol.
    pub fn kafka_connection(
        &self,
        routing: &settings::RoutingSettings,
    ) -> Option<Result<Vec<(String, String)>, SinkError>> {
        let (config, flavour) = match self {
            SinkConfig::Kafka(c) => (c, kafka::KafkaFlavour::Kafka),
            SinkConfig::EventHubsKafka(c) => (c, kafka::KafkaFlavour::EventHubs),
            SinkConfig::EventHubsAmqp(c) => {
                return c.kafka_endpoint().map(|e| {
                    e.and_then(|k| {
                        // The topic does not matter for a connection; a connection string
                        // without EntityPath needs one named.
                        let mut routing = routing.clone();
                        routing.topic.get_or_insert_with(|| "ces".into());
                        k.settings(
                            kafka::KafkaFlavour::EventHubs,
                            &routing,
                            CONNECTION_ONLY_MAX_BYTES,
                        )
                        .map(|(settings, _)| kafka::connection_properties(&settings))
                    })
                });
            }
            _ => return None,
        };
        Some(
            config
                .settings(flavour, routing, CONNECTION_ONLY_MAX_BYTES)
                .map(|(settings, _)| kafka::connection_properties(&settings)),
        )
    }

    /// Checks what can be checked before connecting; each error names the setting.
    pub fn validate(
        &self,
        routing: &RoutingSettings,
        event: &EventSettings,
    ) -> Result<(), ConfigError> {
        match self {
            SinkConfig::Kafka(c) => c.validate(kafka::KafkaFlavour::Kafka, event),
            SinkConfig::EventHubsKafka(c) => c.validate(kafka::KafkaFlavour::EventHubs, event),
            SinkConfig::EventHubsAmqp(c) => c.validate(routing),
            SinkConfig::Stdout(_) | SinkConfig::File(_) => Ok(()),
        }
    }

    /// Reads every secret the sink needs (without keeping it), so a missing one is
    /// reported before anything connects.
    pub fn check_secrets(&self) -> Result<(), ConfigError> {
        match self {
            SinkConfig::Kafka(c) => c.check_secrets(kafka::KafkaFlavour::Kafka),
            SinkConfig::EventHubsKafka(c) => c.check_secrets(kafka::KafkaFlavour::EventHubs),
            SinkConfig::EventHubsAmqp(c) => c.check_secrets(),
            SinkConfig::Stdout(_) | SinkConfig::File(_) => Ok(()),
        }
    }

    /// Opens the sink. `resume` says what the checkpoint knows of a file's length;
    /// the sink reports its connection and re-sends to `health`.
    /// How long a message may wait for the destination (`sink.delivery_timeout_ms`);
    /// `None` for the file and stdout, which settle each batch at once.
    pub fn delivery_timeout(&self) -> Option<std::time::Duration> {
        match self {
            SinkConfig::Kafka(c) | SinkConfig::EventHubsKafka(c) => Some(c.delivery_timeout),
            SinkConfig::EventHubsAmqp(c) => Some(c.delivery_timeout),
            SinkConfig::Stdout(_) | SinkConfig::File(_) => None,
        }
    }

    /// Where events go, for the log: brokers, hub, file or stdout, never a secret
    /// (an Event Hubs connection string gives only its namespace).
    pub fn describe(&self) -> String {
        let namespace = |secret: &crate::setting::SecretRef| {
            secret
                .resolve("sink.connection_string")
                .ok()
                .and_then(|cs| kafka::parse_event_hubs_connection_string(&cs).ok())
                .map_or_else(
                    || "(namespace from sink.connection_string)".to_owned(),
                    |(host, _)| host,
                )
        };
        match self {
            SinkConfig::Kafka(c) => format!(
                "Kafka at {}",
                c.bootstrap_servers
                    .as_deref()
                    .unwrap_or("(no sink.bootstrap_servers)")
            ),
            SinkConfig::EventHubsKafka(c) => {
                format!(
                    "Event Hubs {} (Kafka endpoint)",
                    namespace(&c.connection_string)
                )
            }
            SinkConfig::EventHubsAmqp(c) => {
                let at = c
                    .namespace
                    .clone()
                    .unwrap_or_else(|| namespace(&c.connection_string));
                match &c.custom_endpoint {
                    Some(endpoint) => format!("Event Hubs {at} (AMQP, through {endpoint})"),
                    None => format!("Event Hubs {at} (AMQP)"),
                }
            }
            SinkConfig::Stdout(_) => "stdout".to_owned(),
            SinkConfig::File(c) => format!("file {}", c.path.display()),
        }
    }

    pub async fn build(
        &self,
        routing: &RoutingSettings,
        event: &EventSettings,
        resume: stream::Resume,
        health: std::sync::Arc<SinkHealth>,
    ) -> Result<BuiltSink, SinkError> {
        let largest = self.largest_message(event);
        let default_topic = || routing.topic.clone().unwrap_or_else(|| "ces".into());
        let records = event.format == crate::event::settings::EventFormat::Debezium;
        if matches!(self, SinkConfig::Stdout(_) | SinkConfig::File(_)) {
            // Nothing to connect to: ready once open.
            health.set_connected(true);
        }
        match self {
            SinkConfig::Kafka(c) => {
                let mut built = c.build(kafka::KafkaFlavour::Kafka, routing, largest, health)?;
                if let Sink::Kafka(k) = &mut built.sink {
                    k.init_transactions().await?;
                }
                Ok(built)
            }
            SinkConfig::EventHubsKafka(c) => {
                c.build(kafka::KafkaFlavour::EventHubs, routing, largest, health)
            }
            SinkConfig::EventHubsAmqp(c) => c.build(routing, health).await,
            SinkConfig::Stdout(_) => Ok(BuiltSink {
                sink: Sink::Stream(
                    stream::StreamSink::stdout(event.encoding).with_records(records),
                ),
                topic: default_topic(),
            }),
            SinkConfig::File(c) => Ok(BuiltSink {
                sink: Sink::Stream(
                    stream::StreamSink::file(c.path.clone(), event.encoding, resume)?
                        .with_records(records),
                ),
                topic: default_topic(),
            }),
        }
    }
}

/// `content-type` of a structured-mode JSON message (CloudEvents Kafka binding).
pub const STRUCTURED_JSON_CONTENT_TYPE: &str = "application/cloudevents+json; charset=UTF-8";
/// `content-type` of a structured-mode Avro message: one Avro datum of CES's
/// `ChangeEvent` record (`schemas/ChangeEvent.avsc`). Not
/// `application/cloudevents+avro`, which the CloudEvents spec reserves for its own
/// Avro event format (the `CloudEvent` record): a CloudEvents SDK would decode our
/// record with that schema and get garbage.
pub const STRUCTURED_AVRO_CONTENT_TYPE: &str = "application/vnd.mssql-ces.changeevent+avro";

/// Message headers: name and value.
pub type Headers = Vec<(&'static str, Vec<u8>)>;

/// One message for the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    /// With no key: a hash of the `logicalid`, which picks the partition so that all
    /// segments of the event share one.
    pub partition_hint: Option<u64>,
    pub headers: Headers,
    pub payload: Vec<u8>,
    /// The message's CloudEvent `id` (each segment's own), for destinations that
    /// carry a message id of their own (AMQP's `message-id`); formatted only there.
    pub message_id: Option<uuid::Uuid>,
    /// A Kafka tombstone: the value is null (not empty), `payload` is empty. Only
    /// the Debezium format writes them (after a delete).
    pub tombstone: bool,
}

/// Why a message could not be delivered, by whether trying again can help. The
/// client's or the system's own error, when there is one, is the `source`.
/// `Clone` because one failure is the answer to every message of a failed batch
/// (the causes are shared, not copied).
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// Not delivered, but the same send may succeed later: a broker or the service
    /// did not answer in time, a connection failed, a batch was released. Sinks retry
    /// these until `sink.delivery_timeout_ms`; after that the run fails and a restart
    /// resumes from the checkpoint.
    #[error("delivery failed: {reason}")]
    Transient {
        reason: String,
        #[source]
        cause: Option<Cause>,
    },
    /// Cannot succeed as things stand: the destination refuses it (too large, not
    /// authorized, no such topic or event hub) or a setting cannot work. A restart
    /// repeats it; the message names what to change.
    #[error("delivery cannot succeed: {reason}")]
    Definite {
        reason: String,
        #[source]
        cause: Option<Cause>,
    },
    /// The output file or stream failed (disk full, closed pipe).
    #[error("writing {path}{}", advice.as_deref().map(|a| format!("; {a}")).unwrap_or_default())]
    Io {
        path: String,
        /// What to do about it, where the system's error does not say.
        advice: Option<String>,
        #[source]
        cause: Cause,
    },
    /// Dropped unsent because of another failure (a Kafka transaction aborted, a
    /// producer stopped by a fatal error): that failure is the one to report. Sent
    /// again from the checkpoint on the next start.
    #[error("not sent: {0}")]
    Abandoned(String),
    /// The Kafka producer lost its idempotence state (its sequence numbers and the
    /// broker's no longer agree, or the broker forgot its producer id): it cannot
    /// go on without risking a gap or a reordering, but a new producer, resuming
    /// from the checkpoint, can.
    #[error("the Kafka producer lost its state ({reason}); a new one resumes from the checkpoint")]
    ProducerLost {
        reason: String,
        #[source]
        cause: Option<Cause>,
    },
}

impl SinkError {
    /// A failure retrying may cure, with no lower error behind it.
    pub fn transient(reason: impl Into<String>) -> Self {
        SinkError::Transient {
            reason: reason.into(),
            cause: None,
        }
    }

    /// A failure retrying may cure, caused by `cause`.
    pub fn transient_because(
        reason: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        SinkError::Transient {
            reason: reason.into(),
            cause: Some(crate::error::cause(cause)),
        }
    }

    /// A failure retrying cannot cure, with no lower error behind it.
    pub fn definite(reason: impl Into<String>) -> Self {
        SinkError::Definite {
            reason: reason.into(),
            cause: None,
        }
    }

    /// A failure retrying cannot cure, caused by `cause`.
    pub fn definite_because(
        reason: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        SinkError::Definite {
            reason: reason.into(),
            cause: Some(crate::error::cause(cause)),
        }
    }

    /// The producer lost its state, as the client's refusal says.
    pub fn producer_lost(reason: impl Into<String>) -> Self {
        SinkError::ProducerLost {
            reason: reason.into(),
            cause: None,
        }
    }

    /// Writing `path`, which `setting` names (none for stdout), failed.
    pub fn io(path: &std::path::Path, setting: Option<&str>, cause: std::io::Error) -> Self {
        SinkError::Io {
            path: path.display().to_string(),
            advice: setting
                .and_then(|setting| crate::setting::file_error_advice(setting, path, &cause)),
            cause: crate::error::cause(cause),
        }
    }

    /// What happened with its causes, without the verdict's prefix (for a message
    /// that says the verdict itself).
    pub fn reason(&self) -> String {
        match self {
            SinkError::Transient { reason, cause } | SinkError::Definite { reason, cause } => {
                match cause {
                    Some(cause) => format!("{reason}: {}", Chain(&**cause)),
                    None => reason.clone(),
                }
            }
            other => Chain(other).to_string(),
        }
    }

    /// Whether sending again, unchanged, may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SinkError::Transient { .. } | SinkError::Abandoned(_) | SinkError::ProducerLost { .. }
        )
    }
}

/// A pending acknowledgement.
pub enum Delivery {
    /// Already settled (stdout, file: synced at the end of each batch).
    Settled(Result<(), SinkError>),
    /// Waiting for the Kafka broker.
    Kafka(rdkafka::producer::DeliveryFuture, kafka::KafkaTicket),
    /// Settled when the sink sends its buffered batch (Event Hubs over AMQP).
    Pending(tokio::sync::oneshot::Receiver<Result<(), SinkError>>),
}

impl Delivery {
    /// As [`wait`](Self::wait), failing once `deadline` passes (the delivery timeout
    /// counted from the batch's send): for Kafka, whose producer never times a
    /// message out on its own.
    pub async fn wait_until(self, deadline: Option<tokio::time::Instant>) -> Result<(), SinkError> {
        match self {
            Delivery::Kafka(future, ticket) => {
                let timeout = async {
                    match deadline {
                        Some(deadline) => tokio::time::sleep_until(deadline).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    // A report that is in wins over a deadline or a refusal that
                    // also is: a delivered message is never called failed.
                    biased;
                    report = future => ticket.outcome(report),
                    () = timeout => Err(ticket.timed_out_why().await),
                    // A refused login or a fatal producer error: at once, not after
                    // the delivery timeout.
                    refused = ticket.refused() => Err(refused),
                }
            }
            delivery => delivery.wait().await,
        }
    }

    pub async fn wait(self) -> Result<(), SinkError> {
        match self {
            Delivery::Settled(result) => result,
            Delivery::Kafka(future, ticket) => ticket.outcome(future.await),
            Delivery::Pending(rx) => rx
                .await
                .unwrap_or_else(|_| Err(SinkError::transient("the sink stopped before sending"))),
        }
    }
}

/// Builds the messages of an event for the destination.
#[derive(Debug, Clone)]
pub struct Router {
    topic_template: String,
    scheme: PartitionKeyScheme,
    key_column: Option<String>,
    mode: CloudEventsMode,
    encoding: Encoding,
    stream_key: String,
    schema_changes: SchemaChangePlacement,
    /// With [`SchemaChangePlacement::Topic`]: the schema-change events' topic
    /// (template).
    schema_topic: String,
    /// `sink.heartbeat_topic` (template over `{db}`).
    heartbeat_topic: String,
    /// `sink.heartbeat_interval_ms`; zero: no heartbeats.
    heartbeat_interval: std::time::Duration,
    /// `event.format = "debezium"`: what its encoder is made of.
    debezium: Option<records::DebeziumRouting>,
    /// `[sink.schema_registry]`, and how long to wait for it when it is down.
    registry: Option<(registry::SchemaRegistrySettings, std::time::Duration)>,
}

impl Router {
    pub fn new(
        topic_template: impl Into<String>,
        scheme: PartitionKeyScheme,
        key_column: Option<String>,
        mode: CloudEventsMode,
        encoding: Encoding,
        stream_key: impl Into<String>,
    ) -> Self {
        Router {
            topic_template: topic_template.into(),
            scheme,
            key_column,
            mode,
            encoding,
            stream_key: stream_key.into(),
            schema_changes: SchemaChangePlacement::Off,
            schema_topic: String::new(),
            heartbeat_topic: String::new(),
            heartbeat_interval: std::time::Duration::ZERO,
            debezium: None,
            registry: None,
        }
    }

    /// Where schema-change events go: `placement`, and with
    /// [`SchemaChangePlacement::Topic`] the topic (template) `schema_topic`.
    pub fn with_schema_changes(
        mut self,
        placement: SchemaChangePlacement,
        schema_topic: impl Into<String>,
    ) -> Self {
        self.schema_changes = placement;
        self.schema_topic = schema_topic.into();
        self
    }

    /// A heartbeat record every `interval` (zero: none) to `topic` (template over
    /// `{db}`).
    pub fn with_heartbeat(
        mut self,
        interval: std::time::Duration,
        topic: impl Into<String>,
    ) -> Self {
        self.heartbeat_interval = interval;
        self.heartbeat_topic = topic.into();
        self
    }

    /// How often heartbeat records go out; zero: never.
    pub fn heartbeat_interval(&self) -> std::time::Duration {
        self.heartbeat_interval
    }

    /// A heartbeat record: in the heartbeat topic, keyed by the stream, plain JSON
    /// (not a CloudEvent, in either binding).
    pub fn route_heartbeat(&self, beat: &crate::event::heartbeat::Heartbeat) -> OutgoingMessage {
        OutgoingMessage {
            topic: expand_topic(
                &self.heartbeat_topic,
                beat.database.as_deref().unwrap_or(""),
                "",
                "",
            ),
            key: Some(beat.stream.clone().into_bytes()),
            partition_hint: None,
            headers: vec![("content-type", b"application/json".to_vec())],
            payload: beat.to_json(),
            message_id: None,
            tombstone: false,
        }
    }

    /// The stream's key (`checkpoint.stream_name`).
    pub fn stream_key(&self) -> &str {
        &self.stream_key
    }

    /// Where schema-change events go.
    pub fn schema_changes(&self) -> SchemaChangePlacement {
        self.schema_changes
    }

    /// The topic for a table: the template with `{db}`, `{schema}`, `{tbl}` replaced.
    pub fn topic(&self, table: &TableDescription) -> String {
        expand_topic(
            &self.topic_template,
            table.database(),
            table.schema(),
            table.table(),
        )
    }

    /// Whether messages go out in CloudEvents binary mode (the encoder then hands
    /// over `data` alone where it can: [`crate::event::Encoder::data_only`]).
    pub fn binary(&self) -> bool {
        self.mode == CloudEventsMode::Binary
    }

    /// The message key of a change under the scheme.
    pub fn key(&self, change: &Change) -> Option<Vec<u8>> {
        let table = || format!("{}.{}", change.table.schema(), change.table.table());
        match self.scheme {
            PartitionKeyScheme::None => None,
            PartitionKeyScheme::StreamGroup => Some(self.stream_key.clone().into_bytes()),
            PartitionKeyScheme::Table => Some(table().into_bytes()),
            PartitionKeyScheme::Column => {
                let name = self.key_column.as_deref()?;
                let position = change.table.columns().iter().position(|c| c.name == name)?;
                change
                    .key_image()?
                    .get(position)?
                    .to_text()
                    .map(String::into_bytes)
            }
            PartitionKeyScheme::PrimaryKey => {
                let mut key = table();
                for (_, value) in change.key_values() {
                    // U+001F (unit separator) cannot appear in the table name text.
                    key.push('\u{1F}');
                    value.write_text(&mut key);
                }
                Some(key.into_bytes())
            }
        }
    }

    /// The partition a message goes to without the partitioner's help (reduced
    /// modulo the partition count by the sink): for no key, the event's `logicalid`
    /// (its segments stay together); for a key that is NULL (a `column` key whose
    /// value is NULL) or empty, one fixed partition per table, because partitioners
    /// send NULL or empty keys (`consistent_random`: both) to random partitions and
    /// one key's events must share one. `None`: the partitioner hashes the key.
    fn partition_hint(&self, change: &Change, key: Option<&[u8]>, logical_id: &str) -> Option<u64> {
        match key {
            Some(key) if !key.is_empty() => None,
            Some(_) => Some(fnv1a(
                format!("empty key of {}", change.table.qualified_name()).as_bytes(),
            )),
            None if self.scheme == PartitionKeyScheme::Column => Some(fnv1a(
                format!("NULL key of {}", change.table.qualified_name()).as_bytes(),
            )),
            None => Some(fnv1a(logical_id.as_bytes())),
        }
    }

    /// The messages of an encoded event, in segment order.
    pub fn route(
        &self,
        change: &Change,
        event: EncodedEvent,
    ) -> Result<Vec<OutgoingMessage>, SinkError> {
        let topic = self.topic(&change.table);
        let key = self.key(change);
        let partition_hint = self.partition_hint(change, key.as_deref(), &event.logical_id);
        if event.data_only != (self.mode == CloudEventsMode::Binary) {
            // A wiring defect: the pipeline builds the encoder from the router.
            return Err(SinkError::definite(format!(
                "an event encoded for {} mode reached a {} router",
                if event.data_only {
                    "binary"
                } else {
                    "structured"
                },
                if self.binary() {
                    "binary-mode"
                } else {
                    "structured-mode"
                },
            )));
        }
        let place = Place {
            topic,
            key,
            partition_hint,
            event_type: crate::event::EVENT_TYPE,
            time: crate::event::format_time(change.commit_time),
            operation: change.operation.as_str(),
        };
        Ok(self.messages(place, event))
    }

    /// The messages of an encoded schema-change event, in segment order: in the
    /// table's own topic and partition (`inline`: its key as the table's events
    /// have it), or in the schema topic keyed by `schema.table` (`topic`).
    pub fn route_schema_change(
        &self,
        change: &SchemaChange,
        event: EncodedEvent,
    ) -> Result<Vec<OutgoingMessage>, SinkError> {
        let table = change.qualified_name();
        let (template, key) = match self.schema_changes {
            SchemaChangePlacement::Inline => (
                &self.topic_template,
                match self.scheme {
                    PartitionKeyScheme::StreamGroup => self.stream_key.clone(),
                    // `table`: the validation refuses `inline` with the others.
                    _ => table,
                },
            ),
            SchemaChangePlacement::Topic | SchemaChangePlacement::Off => {
                (&self.schema_topic, table)
            }
        };
        let place = Place {
            topic: expand_topic(template, &change.database, &change.schema, &change.table),
            key: Some(key.into_bytes()),
            partition_hint: None,
            event_type: SCHEMA_CHANGE_TYPE,
            time: crate::event::format_time(change.time),
            operation: SCHEMA_CHANGE_OPERATION,
        };
        Ok(self.messages(place, event))
    }

    /// Each message of `event` with its topic, key and headers.
    fn messages(&self, place: Place, event: EncodedEvent) -> Vec<OutgoingMessage> {
        let Place {
            topic,
            key,
            partition_hint,
            event_type,
            time,
            operation,
        } = place;
        let mut out = Vec::with_capacity(event.messages.len());
        let logical_id = event.logical_id;
        for message in event.messages {
            let (headers, payload) = match self.mode {
                CloudEventsMode::Binary => (
                    binary_headers(&BinaryAttributes {
                        event_type,
                        id: &message.id,
                        logical_id: &logical_id,
                        time: &time,
                        operation,
                        segment_index: message.segment_index,
                        final_segment: message.final_segment,
                        content_type: self.encoding.content_type(),
                    }),
                    message.bytes,
                ),
                CloudEventsMode::Structured => {
                    let content_type = match self.encoding {
                        Encoding::Json => STRUCTURED_JSON_CONTENT_TYPE,
                        Encoding::Avro => STRUCTURED_AVRO_CONTENT_TYPE,
                    };
                    (
                        vec![("content-type", content_type.as_bytes().to_vec())],
                        message.bytes,
                    )
                }
            };
            out.push(OutgoingMessage {
                topic: topic.clone(),
                key: key.clone(),
                partition_hint,
                headers,
                payload,
                message_id: Some(message.id),
                tombstone: false,
            });
        }
        out
    }
}

/// Where an event's messages go and the attributes binary mode puts in headers.
struct Place {
    topic: String,
    key: Option<Vec<u8>>,
    partition_hint: Option<u64>,
    event_type: &'static str,
    time: String,
    operation: &'static str,
}

/// A topic template with `{db}`, `{schema}` and `{tbl}` replaced.
pub use crate::event::expand_names as expand_topic;

/// FNV-1a, 64-bit: a stable hash (unlike `DefaultHasher`), so a re-sent event picks
/// the same partition after an upgrade too.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The attributes a binary-mode message carries as headers.
struct BinaryAttributes<'a> {
    event_type: &'a str,
    id: &'a uuid::Uuid,
    logical_id: &'a str,
    time: &'a str,
    operation: &'a str,
    segment_index: u32,
    final_segment: bool,
    content_type: &'a str,
}

/// CloudEvents Kafka binding, binary mode: each attribute as a `ce_` header and
/// `datacontenttype` as `content-type` (the value is `data`).
fn binary_headers(a: &BinaryAttributes<'_>) -> Headers {
    let mut id = uuid::Uuid::encode_buffer();
    [
        ("ce_specversion", crate::event::SPEC_VERSION),
        ("ce_type", a.event_type),
        ("ce_source", crate::event::EVENT_SOURCE),
        ("ce_id", a.id.hyphenated().encode_lower(&mut id)),
        ("ce_time", a.time),
        ("ce_logicalid", a.logical_id),
        ("ce_operation", a.operation),
        (
            "ce_segmentindex",
            itoa::Buffer::new().format(a.segment_index),
        ),
        (
            "ce_finalsegment",
            if a.final_segment { "true" } else { "false" },
        ),
        ("content-type", a.content_type),
    ]
    .into_iter()
    .map(|(name, value)| (name, value.as_bytes().to_vec()))
    .collect()
}

/// A destination.
pub enum Sink {
    Kafka(kafka::KafkaSink),
    EventHubsAmqp(Box<event_hubs_amqp::EventHubsAmqpSink>),
    Stream(stream::StreamSink),
}

impl Sink {
    /// Queues one message; waits while the destination's queue is full.
    pub async fn send(&mut self, message: OutgoingMessage) -> Result<Delivery, SinkError> {
        match self {
            Sink::Kafka(s) => s.send(message).await,
            Sink::EventHubsAmqp(s) => Ok(s.send(message)),
            Sink::Stream(s) => s.send(message),
        }
    }

    /// Ends a pipeline batch at `position`: sends what the sink buffers (Event Hubs
    /// over AMQP), makes what was written durable (files), commits the batch's
    /// transaction with the position (Kafka with `sink.exactly_once`).
    pub async fn end_batch(
        &mut self,
        position: &crate::position::Position,
    ) -> Result<(), SinkError> {
        match self {
            Sink::Kafka(s) => s.end_batch(position).await,
            Sink::EventHubsAmqp(s) => s.end_batch().await,
            Sink::Stream(s) => s.sync().await,
        }
    }

    /// With Kafka transactions (`sink.exactly_once`): when the transaction that
    /// several batches share is committed. `None`: each batch ends on its own.
    pub fn transaction_bound(&self) -> Option<kafka::TransactionBound> {
        match self {
            Sink::Kafka(s) => s.transaction_bound(),
            Sink::EventHubsAmqp(_) | Sink::Stream(_) => None,
        }
    }

    /// What a file sink has made durable, for the checkpoint; `None` for the rest.
    pub fn durable_length(&self) -> Option<u64> {
        match self {
            Sink::Stream(s) => s.durable_length(),
            Sink::Kafka(_) | Sink::EventHubsAmqp(_) => None,
        }
    }

    /// Which file [`Sink::durable_length`] is of; `None` for the rest.
    pub fn durable_file(&self) -> Option<Box<crate::position::SinkFile>> {
        match self {
            Sink::Stream(s) => s.durable_file().map(Box::new),
            Sink::Kafka(_) | Sink::EventHubsAmqp(_) => None,
        }
    }

    /// Closes the connection to the destination (after [`flush`](Self::flush)).
    pub async fn close(self) -> Result<(), SinkError> {
        match self {
            Sink::EventHubsAmqp(s) => s.close().await,
            Sink::Kafka(mut s) => {
                s.close().await;
                Ok(())
            }
            Sink::Stream(_) => Ok(()),
        }
    }

    /// How long a message may stay undelivered, where the run (not the sink) counts
    /// it: Kafka's.
    pub fn delivery_timeout(&self) -> Option<std::time::Duration> {
        match self {
            Sink::Kafka(s) => Some(s.delivery_timeout()),
            Sink::EventHubsAmqp(_) | Sink::Stream(_) => None,
        }
    }

    /// Waits up to `timeout` for queued messages to be delivered.
    pub async fn flush(&mut self, timeout: std::time::Duration) -> Result<(), SinkError> {
        match self {
            Sink::Kafka(s) => s.flush(timeout).await,
            Sink::EventHubsAmqp(s) => tokio::time::timeout(timeout, s.end_batch())
                .await
                .unwrap_or_else(|_| {
                    Err(SinkError::transient(format!(
                        "Event Hubs did not acknowledge the last batch within {} ms",
                        timeout.as_millis()
                    )))
                }),
            Sink::Stream(s) => tokio::time::timeout(timeout, s.sync())
                .await
                .unwrap_or_else(|_| {
                    Err(SinkError::transient(format!(
                        "the output did not sync within {} ms",
                        timeout.as_millis()
                    )))
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_support::{employee_row, employees, insert, options};
    use crate::event::{Encoder, Value};

    fn routed(scheme: PartitionKeyScheme, last_name: Value, id: i32) -> OutgoingMessage {
        let mut row = employee_row(id, "Ada", "x");
        row[2] = last_name;
        let mut change = insert(employees(), row);
        change.sequence_number = u64::try_from(id).unwrap();
        let event = Encoder::new(options(Encoding::Json))
            .encode(&change)
            .unwrap();
        let router = Router::new(
            "t",
            scheme,
            Some("LastName".into()),
            CloudEventsMode::Structured,
            Encoding::Json,
            "s",
        );
        router.route(&change, event).unwrap().remove(0)
    }

    /// A heartbeat goes to the heartbeat topic, the database put in, keyed by the
    /// stream, as plain JSON in either binding.
    #[test]
    fn a_heartbeat_is_keyed_by_the_stream_in_its_own_topic() {
        let router = Router::new(
            "t",
            PartitionKeyScheme::Table,
            None,
            CloudEventsMode::Binary,
            Encoding::Avro,
            "orders-stream",
        )
        .with_heartbeat(std::time::Duration::from_secs(5), "beats.{db}");
        assert_eq!(
            router.heartbeat_interval(),
            std::time::Duration::from_secs(5)
        );
        let beat = crate::event::heartbeat::Heartbeat {
            stream: router.stream_key().to_owned(),
            database: Some("shop".into()),
            time: chrono::DateTime::UNIX_EPOCH,
            max_lsn: crate::lsn::Lsn::from_parts(1, 2, 3),
            last_event: None,
        };
        let message = router.route_heartbeat(&beat);
        assert_eq!(message.topic, "beats.shop");
        assert_eq!(message.key.as_deref(), Some(&b"orders-stream"[..]));
        assert_eq!(
            message.headers,
            vec![("content-type", b"application/json".to_vec())]
        );
        assert_eq!(message.payload, beat.to_json());
        assert!(!message.tombstone && message.partition_hint.is_none());
    }

    /// One key's events share a partition, whatever the partitioner does with NULL
    /// or empty keys: those get a fixed partition per table; a real key is left to
    /// the partitioner; no key at all follows the event's `logicalid`.
    #[test]
    fn null_and_empty_keys_get_a_partition_of_their_own() {
        let null = [1, 2].map(|id| routed(PartitionKeyScheme::Column, Value::Null, id));
        assert_eq!(null[0].key, None);
        assert!(null[0].partition_hint.is_some());
        assert_eq!(
            null[0].partition_hint, null[1].partition_hint,
            "one NULL key, one partition"
        );
        let empty =
            [1, 2].map(|id| routed(PartitionKeyScheme::Column, Value::Text(String::new()), id));
        assert_eq!(empty[0].key.as_deref(), Some(&b""[..]));
        assert!(empty[0].partition_hint.is_some());
        assert_eq!(empty[0].partition_hint, empty[1].partition_hint);
        assert_ne!(empty[0].partition_hint, null[0].partition_hint);
        let keyed = routed(
            PartitionKeyScheme::Column,
            Value::Text("Lovelace".into()),
            1,
        );
        assert_eq!(
            keyed.partition_hint, None,
            "the partitioner hashes a real key"
        );
        let keyless = [1, 2].map(|id| routed(PartitionKeyScheme::None, Value::Null, id));
        assert_ne!(
            keyless[0].partition_hint, keyless[1].partition_hint,
            "no key: by logicalid"
        );
    }
}

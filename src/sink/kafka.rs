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
use std::collections::BTreeMap;

use serde::Deserialize;

use crate::event::settings::EventSettings;
use crate::setting::{ConfigError, SecretRef, invalid};
use crate::sink::settings::RoutingSettings;

/// Room for the record, headers and protocol framing around a message of the
/// configured maximum size.
const MESSAGE_OVERHEAD_BYTES: usize = 64 * 1024;

/// Event Hubs' Kafka endpoint closes the connection on a request of this size or more
/// (Microsoft's "Apache Kafka client configurations" page: `message.max.bytes` must
/// stay below 1,046,528).
pub const EVENT_HUBS_REQUEST_LIMIT: usize = 1_046_528;

/// Room for the key, the headers and the record framing of one message, which a
/// segment of `max_message_size_kb` must leave below [`EVENT_HUBS_REQUEST_LIMIT`].
pub const EVENT_HUBS_RECORD_OVERHEAD: usize = 2 * 1024;

/// The largest `event.max_message_size_kb` Event Hubs' Kafka endpoint can carry.
pub const EVENT_HUBS_MAX_MESSAGE_KB: usize =
    (EVENT_HUBS_REQUEST_LIMIT - 1 - EVENT_HUBS_RECORD_OVERHEAD) / 1024;

/// `[sink]` with `kind = "kafka"` or `kind = "event_hubs_kafka"` (Event Hubs through
/// its Kafka endpoint): the settings of the Kafka producer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Kafka bootstrap servers (`host:port,…`); Event Hubs: from the connection string.
    #[serde(default)]
    pub bootstrap_servers: Option<String>,
    /// Event Hubs connection string (`Endpoint=sb://…;SharedAccessKeyName=…;…`).
    #[serde(default)]
    pub connection_string: SecretRef,
    /// `"lz4"` (default), `"zstd"`, `"gzip"`, `"snappy"` or `"none"`; Event Hubs: none
    /// (default) or gzip.
    #[serde(default)]
    pub compression: Option<Compression>,
    /// How keys map to partitions (librdkafka's `partitioner`); default
    /// `"murmur2_random"`, the placement of Java clients, so Kafka Streams and Flink
    /// can co-partition with these topics.
    #[serde(default)]
    pub partitioner: Partitioner,
    /// How long a message may wait for delivery before the run fails
    /// (`delivery_timeout_ms`, default 300000).
    #[serde(
        rename = "delivery_timeout_ms",
        with = "crate::setting::millis",
        default = "default_delivery_timeout"
    )]
    pub delivery_timeout: Duration,
    /// Pass-through librdkafka properties (`"linger.ms" = "5"`).
    #[serde(default)]
    pub kafka: BTreeMap<String, String>,
}

/// Which Kafka endpoint a [`KafkaSinkConfig`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaFlavour {
    /// A Kafka cluster (`kind = "kafka"`).
    Kafka,
    /// Event Hubs' Kafka endpoint (`kind = "event_hubs_kafka"`).
    EventHubs,
}

/// The default of `sink.delivery_timeout_ms`.
pub fn default_delivery_timeout() -> Duration {
    Duration::from_secs(300)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    Gzip,
    #[default]
    Lz4,
    Zstd,
    Snappy,
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
            Compression::Snappy => "snappy",
        }
    }
}

/// librdkafka's `partitioner` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partitioner {
    /// murmur2 of the key, as the Java client (keyless messages: random).
    #[default]
    Murmur2Random,
    /// murmur2 of the key (keyless messages: one partition).
    Murmur2,
    /// librdkafka's own default: CRC32 of the key (keyless: random).
    ConsistentRandom,
    /// CRC32 of the key (keyless: one partition).
    Consistent,
    /// FNV-1a of the key, as Sarama (keyless: random).
    Fnv1aRandom,
    /// FNV-1a of the key (keyless: one partition).
    Fnv1a,
    /// Random, whatever the key.
    Random,
}

impl Partitioner {
    pub fn as_str(self) -> &'static str {
        match self {
            Partitioner::Murmur2Random => "murmur2_random",
            Partitioner::Murmur2 => "murmur2",
            Partitioner::ConsistentRandom => "consistent_random",
            Partitioner::Consistent => "consistent",
            Partitioner::Fnv1aRandom => "fnv1a_random",
            Partitioner::Fnv1a => "fnv1a",
            Partitioner::Random => "random",
        }
    }
}

/// librdkafka properties that typed settings own; setting them in `sink.kafka` would
/// fight the typed setting or break a guarantee.
const OWNED_KAFKA_PROPERTIES: &[(&str, &str)] = &[
    ("bootstrap.servers", "sink.bootstrap_servers"),
    (
        "enable.idempotence",
        "always true: needed for ordered, duplicate-free retries",
    ),
    ("acks", "always all: needed for at-least-once delivery"),
    ("compression.type", "sink.compression"),
    ("compression.codec", "sink.compression"),
    ("message.max.bytes", "event.max_message_size_kb"),
    ("message.timeout.ms", "sink.delivery_timeout_ms"),
    ("delivery.timeout.ms", "sink.delivery_timeout_ms"),
    ("sasl.password", "sink.connection_string"),
    ("partitioner", "sink.partitioner"),
];

impl KafkaSinkConfig {
    /// A Kafka sink at `bootstrap_servers`, every other setting at its default.
    pub fn new(bootstrap_servers: &str) -> Self {
        KafkaSinkConfig {
            bootstrap_servers: Some(bootstrap_servers.to_owned()),
            connection_string: SecretRef::default(),
            compression: None,
            partitioner: Partitioner::default(),
            delivery_timeout: default_delivery_timeout(),
            kafka: BTreeMap::new(),
        }
    }

    /// Checks what can be checked before connecting; each error names the setting.
    pub fn validate(
        &self,
        flavour: KafkaFlavour,
        event: &EventSettings,
    ) -> Result<(), ConfigError> {
        match flavour {
            KafkaFlavour::Kafka => {
                if self.bootstrap_servers.is_none() {
                    return Err(invalid(
                        "sink.bootstrap_servers",
                        "required for sink.kind = \"kafka\"",
                    ));
                }
            }
            KafkaFlavour::EventHubs => {
                let max_kb = event.max_message_size_kb.kb() as usize;
                if max_kb > EVENT_HUBS_MAX_MESSAGE_KB {
                    return Err(invalid(
                        "event.max_message_size_kb",
                        format!(
                            "{max_kb} is more than Event Hubs' Kafka endpoint accepts (it closes the connection on requests of {EVENT_HUBS_REQUEST_LIMIT} bytes or more); use at most {EVENT_HUBS_MAX_MESSAGE_KB}"
                        ),
                    ));
                }
                if let Some(c) = self.compression
                    && !matches!(c, Compression::None | Compression::Gzip)
                {
                    return Err(invalid(
                        "sink.compression",
                        format!(
                            "Event Hubs accepts only \"none\" or \"gzip\", not \"{}\"",
                            c.as_str()
                        ),
                    ));
                }
                if !self.connection_string.is_set() {
                    return Err(ConfigError::MissingSecret {
                        setting: "sink.connection_string".into(),
                        reason: "set sink.connection_string.env or .file to the Event Hubs connection string".into(),
                    });
                }
            }
        }
        if self.delivery_timeout.is_zero() {
            return Err(invalid(
                "sink.delivery_timeout_ms",
                "must be more than 0 (librdkafka reads 0 as waiting forever)",
            ));
        }
        for key in self.kafka.keys() {
            if let Some((_, owner)) = OWNED_KAFKA_PROPERTIES.iter().find(|(p, _)| p == key) {
                return Err(invalid(
                    &format!("sink.kafka.\"{key}\""),
                    format!("conflicts with a typed setting ({owner}); remove it"),
                ));
            }
        }
        Ok(())
    }

    /// Reads the Event Hubs connection string (without keeping it) and checks its
    /// form, so a missing or malformed one is reported before anything connects.
    pub fn check_secrets(&self, flavour: KafkaFlavour) -> Result<(), ConfigError> {
        if flavour == KafkaFlavour::EventHubs {
            let secret = self.connection_string.resolve("sink.connection_string")?;
            parse_event_hubs_connection_string(&secret)
                .map_err(|e| invalid("sink.connection_string", e.to_string()))?;
        }
        Ok(())
    }

    /// The producer and the topic (template) it sends to.
    pub fn build(
        &self,
        flavour: KafkaFlavour,
        routing: &RoutingSettings,
        max_message_bytes: usize,
        health: Arc<SinkHealth>,
    ) -> Result<super::BuiltSink, SinkError> {
        let (settings, topic) = self.settings(flavour, routing, max_message_bytes)?;
        Ok(super::BuiltSink {
            sink: super::Sink::Kafka(KafkaSink::with_health(
                &settings,
                max_message_bytes,
                health,
            )?),
            topic,
        })
    }

    /// The client's properties (the secret read now) and the topic (template).
    pub fn settings(
        &self,
        flavour: KafkaFlavour,
        routing: &RoutingSettings,
        max_message_bytes: usize,
    ) -> Result<(KafkaSettings, String), SinkError> {
        let (secret, topic) = match flavour {
            KafkaFlavour::Kafka => (None, routing.topic.clone().unwrap_or_else(|| "ces".into())),
            KafkaFlavour::EventHubs => {
                let secret = self
                    .connection_string
                    .resolve("sink.connection_string")
                    .map_err(|e| SinkError::Definite(e.to_string()))?;
                let (_, entity) = parse_event_hubs_connection_string(&secret)?;
                let topic = routing.topic.clone().or(entity).ok_or_else(|| {
                    SinkError::Definite(
                        "sink.topic: name the event hub, or put EntityPath= in the connection string"
                            .into(),
                    )
                })?;
                (Some(secret), topic)
            }
        };
        let settings = KafkaSettings::new(self, flavour, max_message_bytes, secret.as_deref())?;
        Ok((settings, topic))
    }
}

/// What the Kafka producer is given (secrets included: never log this).
pub struct KafkaSettings {
    pub properties: Vec<(String, String)>,
    /// Whether each topic's `max.message.bytes` is read and checked (not for Event
    /// Hubs, whose limit the configuration enforces).
    pub check_topic_limits: bool,
}

/// `Endpoint=sb://<namespace>.servicebus.windows.net/;…;EntityPath=<hub>` →
/// (`<namespace>.servicebus.windows.net`, `Some(<hub>)`).
pub fn parse_event_hubs_connection_string(
    connection_string: &str,
) -> Result<(String, Option<String>), SinkError> {
    let mut host = None;
    let mut entity = None;
    for part in connection_string.split(';') {
        let Some((key, value)) = part.split_once('=') else {
            continue;
        };
        match key.trim().to_ascii_lowercase().as_str() {
            "endpoint" => {
                let value = value.trim();
                let without_scheme = value.split_once("://").map_or(value, |(_, rest)| rest);
                host = Some(without_scheme.trim_end_matches('/').to_owned());
            }
            "entitypath" => entity = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    let host = host.filter(|h| !h.is_empty()).ok_or_else(|| {
        SinkError::Definite(
            "sink.connection_string has no Endpoint=sb://<namespace>.servicebus.windows.net/"
                .into(),
        )
    })?;
    Ok((host, entity))
}

/// A Kafka error as a [`SinkError`]: definite where the broker refuses the message
/// itself or the client's rights (resending cannot help), else transient.
pub fn delivery_error(error: &KafkaError) -> SinkError {
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
    if definite {
        SinkError::Definite(error.to_string())
    } else {
        SinkError::Transient(error.to_string())
    }
}

impl KafkaSettings {
    /// The producer properties for a Kafka or Event Hubs sink. `event_hubs_secret` is
    /// the Event Hubs connection string (Event Hubs sinks only).
    pub fn new(
        sink: &KafkaSinkConfig,
        flavour: KafkaFlavour,
        max_message_bytes: usize,
        event_hubs_secret: Option<&str>,
    ) -> Result<Self, SinkError> {
        let request_limit = match flavour {
            KafkaFlavour::EventHubs => {
                if max_message_bytes + EVENT_HUBS_RECORD_OVERHEAD >= EVENT_HUBS_REQUEST_LIMIT {
                    return Err(SinkError::Definite(format!(
                        "event.max_message_size_kb = {}: Event Hubs' Kafka endpoint closes the connection on requests of {EVENT_HUBS_REQUEST_LIMIT} bytes or more; use at most {EVENT_HUBS_MAX_MESSAGE_KB}",
                        max_message_bytes / 1024
                    )));
                }
                (max_message_bytes + MESSAGE_OVERHEAD_BYTES).min(EVENT_HUBS_REQUEST_LIMIT - 1)
            }
            _ => max_message_bytes + MESSAGE_OVERHEAD_BYTES,
        };
        let mut properties = vec![
            ("client.id".to_owned(), "mssql-ces".to_owned()),
            ("enable.idempotence".to_owned(), "true".to_owned()),
            ("acks".to_owned(), "all".to_owned()),
            ("message.max.bytes".to_owned(), request_limit.to_string()),
            (
                "message.timeout.ms".to_owned(),
                sink.delivery_timeout.as_millis().to_string(),
            ),
            (
                "partitioner".to_owned(),
                sink.partitioner.as_str().to_owned(),
            ),
        ];
        match flavour {
            KafkaFlavour::EventHubs => {
                let secret = event_hubs_secret.ok_or_else(|| {
                    SinkError::Definite("sink.connection_string is required for Event Hubs".into())
                })?;
                let (host, _) = parse_event_hubs_connection_string(secret)?;
                let compression = sink.compression.unwrap_or(Compression::None);
                properties.extend([
                    ("bootstrap.servers".to_owned(), format!("{host}:9093")),
                    ("security.protocol".to_owned(), "SASL_SSL".to_owned()),
                    ("sasl.mechanism".to_owned(), "PLAIN".to_owned()),
                    ("sasl.username".to_owned(), "$ConnectionString".to_owned()),
                    ("sasl.password".to_owned(), secret.to_owned()),
                    ("request.timeout.ms".to_owned(), "60000".to_owned()),
                    // Required by the same page: idle connections are closed by the
                    // service, and metadata must be refreshed within its window.
                    ("socket.keepalive.enable".to_owned(), "true".to_owned()),
                    ("metadata.max.age.ms".to_owned(), "180000".to_owned()),
                    (
                        "compression.type".to_owned(),
                        compression.as_str().to_owned(),
                    ),
                ]);
            }
            KafkaFlavour::Kafka => {
                let servers = sink.bootstrap_servers.clone().ok_or_else(|| {
                    SinkError::Definite("sink.bootstrap_servers is required".into())
                })?;
                let compression = sink.compression.unwrap_or_default();
                properties.extend([
                    ("bootstrap.servers".to_owned(), servers),
                    (
                        "compression.type".to_owned(),
                        compression.as_str().to_owned(),
                    ),
                ]);
            }
        }
        properties.extend(sink.kafka.iter().map(|(k, v)| (k.clone(), v.clone())));
        Ok(KafkaSettings {
            properties,
            check_topic_limits: flavour == KafkaFlavour::Kafka,
        })
    }
}

/// Room for the key, headers and record framing of a message in a produce request,
/// which the topic's `max.message.bytes` must leave besides the largest segment.
pub const RECORD_OVERHEAD_BYTES: usize = 1024;

/// How a topic's `max.message.bytes` compares with the largest message: an error
/// naming both settings when a segment cannot fit.
pub fn check_topic_limit(
    topic: &str,
    topic_limit: usize,
    largest_message: usize,
) -> Result<(), SinkError> {
    if largest_message + RECORD_OVERHEAD_BYTES > topic_limit {
        return Err(SinkError::Definite(format!(
            "topic {topic} accepts messages up to {topic_limit} bytes (its max.message.bytes, or the broker's message.max.bytes), but event.max_message_size_kb = {} allows segments of {largest_message} bytes plus about {RECORD_OVERHEAD_BYTES} of headers: raise the topic's max.message.bytes or lower event.max_message_size_kb",
            largest_message / 1024
        )));
    }
    Ok(())
}

/// The producer's context: turns librdkafka's statistics (every second, when the
/// health is watched) into the sink's health: connected while a broker is up, and
/// the brokers' re-send count.
pub struct HealthContext {
    health: Arc<SinkHealth>,
}

impl rdkafka::ClientContext for HealthContext {
    fn stats(&self, statistics: rdkafka::Statistics) {
        self.health.set_connected(
            statistics
                .brokers
                .values()
                .any(|broker| broker.state == "UP"),
        );
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
        tracing::warn!(error = %error, reason, "librdkafka");
    }
}

/// How often librdkafka reports statistics when the health is watched.
const STATISTICS_INTERVAL_MS: &str = "1000";

/// An admin client's configuration: only where and how to connect.
fn admin_config(settings: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (key, value) in &settings.properties {
        let connection = key == "bootstrap.servers"
            || key.starts_with("security.")
            || key.starts_with("sasl.")
            || key.starts_with("ssl.")
            || key.starts_with("socket.");
        if connection {
            config.set(key, value);
        }
    }
    config
}

/// What `check` learns of a Kafka destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationFacts {
    /// Brokers in the cluster's metadata.
    pub brokers: usize,
    pub topics: Vec<TopicFacts>,
    /// The broker's `auto.create.topics.enable`, or why it could not be read.
    pub auto_create: Result<bool, String>,
}

/// One topic the stream writes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicFacts {
    pub name: String,
    /// `None`: no such topic.
    pub partitions: Option<usize>,
    /// Its `max.message.bytes` (or the broker's `message.max.bytes`), or why it could
    /// not be read.
    pub max_message_bytes: Result<usize, String>,
}

/// Reads the cluster's metadata (which does not create topics) and each existing
/// topic's limit, within `timeout` each.
pub async fn describe_destination(
    settings: &KafkaSettings,
    topics: &[String],
    timeout: Duration,
) -> Result<DestinationFacts, SinkError> {
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        admin_config(settings)
            .create()
            .map_err(|e| SinkError::Definite(format!("cannot create a Kafka admin client: {e}")))?;
    let admin = Arc::new(admin);
    let fetcher = Arc::clone(&admin);
    let metadata =
        tokio::task::spawn_blocking(move || fetcher.inner().fetch_metadata(None, timeout))
            .await
            .map_err(|e| SinkError::Transient(format!("metadata request: {e}")))?
            .map_err(|e| delivery_error(&e))?;
    let options = rdkafka::admin::AdminOptions::new().request_timeout(Some(timeout));
    let unreadable = |e: &dyn std::fmt::Display| {
        format!("not readable ({e}): the endpoint may not answer DescribeConfigs")
    };
    let mut out = Vec::new();
    let mut missing = false;
    for name in topics {
        let partitions = metadata
            .topics()
            .iter()
            .find(|t| t.name() == name && t.error().is_none())
            .map(|t| t.partitions().len());
        missing |= partitions.is_none();
        let max_message_bytes = if partitions.is_some() {
            let resource = rdkafka::admin::ResourceSpecifier::Topic(name);
            match admin.describe_configs([&resource], &options).await {
                Ok(results) => results
                    .into_iter()
                    .next()
                    .and_then(|r| r.ok())
                    .and_then(|c| c.get("max.message.bytes").and_then(|e| e.value.clone()))
                    .and_then(|v| v.parse::<usize>().ok())
                    .ok_or_else(|| unreadable(&"no max.message.bytes in the answer")),
                Err(e) => Err(unreadable(&e)),
            }
        } else {
            Err("no such topic".to_owned())
        };
        out.push(TopicFacts {
            name: name.clone(),
            partitions,
            max_message_bytes,
        });
    }
    let auto_create = match metadata.brokers().first() {
        Some(broker) if missing => {
            let resource = rdkafka::admin::ResourceSpecifier::Broker(broker.id());
            match admin.describe_configs([&resource], &options).await {
                Ok(results) => results
                    .into_iter()
                    .next()
                    .and_then(|r| r.ok())
                    .and_then(|c| {
                        c.get("auto.create.topics.enable")
                            .and_then(|e| e.value.clone())
                    })
                    .map(|v| v == "true")
                    .ok_or_else(|| unreadable(&"no auto.create.topics.enable in the answer")),
                Err(e) => Err(unreadable(&e)),
            }
        }
        _ => Err("not needed".to_owned()),
    };
    Ok(DestinationFacts {
        brokers: metadata.brokers().len(),
        topics: out,
        auto_create,
    })
}

pub struct KafkaSink {
    producer: FutureProducer<HealthContext>,
    partitions: HashMap<String, i32>,
    admin: Option<Arc<rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>>>,
    /// The largest message the encoder makes, checked against each topic's limit.
    largest_message: usize,
    checked_topics: std::collections::HashSet<String>,
    topic_error: Arc<Mutex<Option<SinkError>>>,
}

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
        // librdkafka's error text names the property, never its value.
        let producer: FutureProducer<HealthContext> = config
            .create_with_context(HealthContext { health })
            .map_err(|e| SinkError::Definite(format!("cannot create the Kafka producer: {e}")))?;
        // Event Hubs' endpoint limit is enforced by the configuration instead.
        let admin = (settings.check_topic_limits)
            .then(|| admin_config(settings).create().ok().map(Arc::new))
            .flatten();
        Ok(KafkaSink {
            producer,
            partitions: HashMap::new(),
            admin,
            largest_message,
            checked_topics: std::collections::HashSet::new(),
            topic_error: Arc::new(Mutex::new(None)),
        })
    }

    /// Reads `topic`'s `max.message.bytes` (the admin API's DescribeConfigs, which
    /// reports the broker's `message.max.bytes` where the topic does not override it)
    /// in the background, so that a broker slow to answer never holds deliveries; a
    /// limit below the largest segment fails the next send, naming both settings.
    /// Where the limit cannot be read (no such topic yet, an endpoint without the
    /// API), says so and goes on.
    fn check_topic(&mut self, topic: &str) {
        if !self.checked_topics.insert(topic.to_owned()) {
            return;
        }
        let Some(admin) = self.admin.clone() else {
            return;
        };
        let (topic, largest, verdict) = (
            topic.to_owned(),
            self.largest_message,
            Arc::clone(&self.topic_error),
        );
        tokio::spawn(async move {
            let options =
                rdkafka::admin::AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
            let resource = rdkafka::admin::ResourceSpecifier::Topic(&topic);
            let described = tokio::time::timeout(
                Duration::from_secs(35),
                admin.describe_configs([&resource], &options),
            )
            .await;
            let limit = match described {
                Ok(Ok(results)) => results
                    .into_iter()
                    .next()
                    .and_then(|r| r.ok())
                    .and_then(|c| c.get("max.message.bytes").and_then(|e| e.value.clone()))
                    .and_then(|v| v.parse::<usize>().ok()),
                Ok(Err(_)) | Err(_) => None,
            };
            match limit {
                Some(limit) => match check_topic_limit(&topic, limit, largest) {
                    Ok(()) => tracing::debug!(
                        topic,
                        max_message_bytes = limit,
                        "the topic's limit fits the largest segment"
                    ),
                    Err(e) => {
                        if let Ok(mut slot) = verdict.lock() {
                            *slot = Some(e);
                        }
                    }
                },
                None => tracing::warn!(
                    topic,
                    largest_message = largest,
                    "cannot read the topic's max.message.bytes (no such topic yet, or the endpoint does not answer DescribeConfigs): make sure it, or the broker's message.max.bytes, exceeds event.max_message_size_kb"
                ),
            }
        });
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
        let producer = self.producer.clone();
        let name = topic.to_owned();
        let count = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(Some(&name), Duration::from_secs(30))
                .map(|m| {
                    m.topics()
                        .first()
                        .map_or(0, |t| i32::try_from(t.partitions().len()).unwrap_or(0))
                })
        })
        .await
        .map_err(|e| SinkError::Transient(e.to_string()))?
        .map_err(|e| SinkError::Transient(format!("metadata of topic {topic}: {e}")))?;
        if count == 0 {
            return Err(SinkError::Definite(format!(
                "topic {topic} has no partitions"
            )));
        }
        self.partitions.insert(topic.to_owned(), count);
        Ok(count)
    }

    pub async fn send(&mut self, message: OutgoingMessage) -> Result<Delivery, SinkError> {
        if let Some(e) = self.topic_error() {
            return Err(e);
        }
        if !self.checked_topics.contains(&message.topic) {
            self.check_topic(&message.topic);
        }
        let partition = match message.partition_hint {
            Some(hint) => {
                let count = self.partition_count(&message.topic).await?;
                Some(i32::try_from(hint % u64::try_from(count).unwrap_or(1)).unwrap_or(0))
            }
            None => None,
        };
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&message.topic).payload(message.payload.as_slice());
        if let Some(headers) = librdkafka_headers(&message.headers) {
            record = record.headers(headers);
        }
        if let Some(key) = &message.key {
            record = record.key(key.as_slice());
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        loop {
            match self.producer.send_result(record) {
                Ok(future) => return Ok(Delivery::Kafka(future)),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // Backpressure: wait for the queue to drain a little, then offer
                    // the same record again.
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(delivery_error(&e)),
            }
        }
    }

    pub async fn flush(&mut self, timeout: Duration) -> Result<(), SinkError> {
        let producer = self.producer.clone();
        tokio::task::spawn_blocking(move || producer.flush(timeout))
            .await
            .map_err(|e| SinkError::Transient(e.to_string()))?
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
            kafka: [("linger.ms".to_string(), "5".to_string())].into(),
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

    #[test]
    fn a_topic_limit_below_the_largest_segment_names_both_settings() {
        assert!(check_topic_limit("ces", 1_048_588, 1_024 * 1_024).is_err());
        let err = check_topic_limit("ces", 1_048_588, 1_024 * 1_024)
            .unwrap_err()
            .to_string();
        assert!(err.contains("max.message.bytes"), "{err}");
        assert!(err.contains("event.max_message_size_kb"), "{err}");
        assert!(check_topic_limit("ces", 1_048_588, 1_000 * 1_024).is_ok());
        assert!(check_topic_limit("ces", 300_000, 256 * 1_024).is_ok());
        assert!(check_topic_limit("ces", 262_144, 256 * 1_024).is_err());
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
            assert!(matches!(e, SinkError::Definite(_)), "{code:?}: {e:?}");
        }
        for code in [
            C::MessageTimedOut,
            C::BrokerTransportFailure,
            C::NotEnoughReplicas,
            C::RequestTimedOut,
            C::AllBrokersDown,
        ] {
            let e = delivery_error(&KafkaError::MessageProduction(code));
            assert!(e.is_transient(), "{code:?}: {e:?}");
        }
    }
}

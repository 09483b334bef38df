//! `[sink]` for `kind = "kafka"` and `"event_hubs_kafka"`: the typed settings, their
//! checks, and the librdkafka properties they become (pass-through properties that
//! would fight a typed setting are refused).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use std::sync::Arc;

use super::{KafkaSink, SinkError, SinkHealth};
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

/// Apache Kafka (`kafka`), or Azure Event Hubs through its Kafka endpoint
/// (`event_hubs_kafka`, which derives the brokers and the login from its connection
/// string). Every message is sent by an idempotent producer with `acks=all`.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// `kafka`: the brokers, `host:port,…` (required). `event_hubs_kafka` takes them
    /// from the connection string.
    #[serde(default)]
    pub bootstrap_servers: Option<String>,
    /// `event_hubs_kafka`: the Event Hubs connection string; also
    /// `MSSQL_CES__SINK__CONNECTION_STRING`.
    #[serde(default)]
    pub connection_string: SecretRef,
    /// How record batches are compressed; unset: `"lz4"` for Kafka, `"none"` for Event
    /// Hubs, which takes only `"none"` or `"gzip"`.
    #[serde(default)]
    pub compression: Option<Compression>,
    /// How keys map to partitions. The default is the Java client's placement, so Kafka
    /// Streams and Flink joins co-partition with these topics; `"random"` is refused,
    /// since it ignores keys.
    #[serde(default)]
    pub partitioner: Partitioner,
    /// How long a message may wait for the brokers before the run fails, in
    /// milliseconds (more than 0). Counted by the run on the oldest outstanding
    /// message: librdkafka's own `message.timeout.ms` is infinite, so it never drops
    /// one message while it writes the ones after it.
    #[serde(
        rename = "delivery_timeout_ms",
        with = "crate::setting::millis",
        default = "default_delivery_timeout"
    )]
    #[schemars(with = "u64", range(min = 1))]
    pub delivery_timeout: Duration,
    /// `kafka`: how the brokers are reached. Event Hubs' comes from its connection
    /// string.
    #[serde(default)]
    pub security_protocol: SecurityProtocol,
    /// With a `sasl_*` protocol (required). `"OAUTHBEARER"` is refused: this build's
    /// librdkafka has no OIDC (it needs libcurl).
    #[serde(default)]
    pub sasl_mechanism: Option<SaslMechanism>,
    /// With a `sasl_*` protocol: the user (required).
    #[serde(default)]
    pub sasl_username: Option<String>,
    /// With a `sasl_*` protocol: the password (required; never logged); also
    /// `MSSQL_CES__SINK__SASL_PASSWORD`.
    #[serde(default)]
    pub sasl_password: SecretRef,
    /// With `ssl` or `sasl_ssl`: the CA certificates (PEM) that signed the brokers';
    /// unset: the system's.
    #[serde(default)]
    pub ssl_ca_location: Option<std::path::PathBuf>,
    /// With `ssl` or `sasl_ssl`, for mutual TLS: this client's certificate (PEM); needs
    /// `ssl_key_location`.
    #[serde(default)]
    pub ssl_certificate_location: Option<std::path::PathBuf>,
    /// With `ssl` or `sasl_ssl`, for mutual TLS: this client's private key (PEM); needs
    /// `ssl_certificate_location`.
    #[serde(default)]
    pub ssl_key_location: Option<std::path::PathBuf>,
    /// The private key's password, if it has one; also
    /// `MSSQL_CES__SINK__SSL_KEY_PASSWORD`.
    #[serde(default)]
    pub ssl_key_password: SecretRef,
    /// Whether a broker's certificate must name the host connected to; `false` only for
    /// brokers whose certificates do not.
    #[serde(default = "yes")]
    pub ssl_endpoint_identification: bool,
    /// Pass-through librdkafka properties, e.g. `"linger.ms" = "5"`. Properties a typed
    /// setting owns (`acks`, `enable.idempotence`, `compression.type`,
    /// `message.max.bytes`, `bootstrap.servers`, `security.protocol`, `sasl.mechanism`,
    /// `sasl.username`, `sasl.password`, `ssl.ca.location`, `ssl.key.*`, …) are refused
    /// by name. With `event.format = "debezium"`, `message.max.bytes` is taken here: it
    /// bounds a record. The values of secret properties (a password, a token, a JAAS
    /// line) never reach the log or an error.
    #[serde(default)]
    pub kafka: PassThrough,
    /// `kafka`: each batch and the stream's position committed in one Kafka transaction
    /// (needs `checkpoint.store = "kafka"`; see [Delivery guarantees](delivery.md)).
    /// Refused for `event_hubs_kafka`.
    #[serde(default)]
    pub exactly_once: bool,
    /// With `exactly_once`: the longest a transaction stays open, in milliseconds. A
    /// transaction holds the batches sent since it began and is committed at the
    /// end of the batch that reaches this or `transaction_max_bytes`, or as soon
    /// as nothing more is to be sent; a `read_committed` consumer sees an event at
    /// its transaction's commit, so this bounds how late. Less than
    /// `delivery_timeout_ms`; 0 commits each batch on its own.
    #[serde(
        rename = "transaction_max_ms",
        with = "crate::setting::millis",
        default = "default_transaction_max"
    )]
    #[schemars(with = "u64")]
    pub transaction_max: Duration,
    /// With `exactly_once`: the most payload bytes one transaction holds before it
    /// is committed at its batch's end (what an abort sends again).
    #[serde(default = "default_transaction_max_bytes")]
    pub transaction_max_bytes: u64,
    /// With `exactly_once`: the stream's transactional id; unset:
    /// `mssql-ces.<checkpoint.stream_name>`. A new process with the same id fences the
    /// old one. With `source.databases` it must contain `{db}` (the default does).
    #[serde(default)]
    pub transactional_id: Option<String>,
    /// Set by the run from `[checkpoint]` when `exactly_once` is on.
    #[serde(skip)]
    pub transaction: Option<super::TransactionSettings>,
}

fn yes() -> bool {
    true
}

/// `[sink.kafka]`: librdkafka properties passed through as written. Its `{:?}`
/// shows the values of secret properties (a password, a token, a JAAS line) as
/// `<redacted>`, as every property list does ([`crate::kafka_client::Redacted`]).
#[derive(Clone, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct PassThrough(pub BTreeMap<String, String>);

impl std::ops::Deref for PassThrough {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for PassThrough {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl std::fmt::Debug for PassThrough {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let listed: Vec<(String, String)> =
            self.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        crate::kafka_client::Redacted(&listed).fmt(f)
    }
}

/// Kafka's own default `message.max.bytes` (the largest record batch a broker
/// takes, and each topic's `max.message.bytes` unless set): what a Debezium record
/// is bounded by unless `sink.kafka."message.max.bytes"` says otherwise.
const KAFKA_MESSAGE_MAX_BYTES: usize = 1_048_588;

/// The range librdkafka takes for `message.max.bytes`.
const MESSAGE_MAX_BYTES_RANGE: std::ops::RangeInclusive<usize> = 1000..=1_000_000_000;

impl KafkaSinkConfig {
    /// With `event.format = "debezium"`: the producer's `message.max.bytes`, which
    /// bounds a record (`sink.kafka."message.max.bytes"`, default Kafka's own).
    pub fn debezium_message_max_bytes(&self) -> usize {
        self.kafka
            .get("message.max.bytes")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(KAFKA_MESSAGE_MAX_BYTES)
    }
}

/// A value of one of librdkafka's enumerations, in any case, as librdkafka takes it
/// (`SASL_SSL` as every Kafka guide writes it, or `sasl_ssl`).
fn any_case<'de, D, T>(
    deserializer: D,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Copy,
{
    let text = String::deserialize(deserializer)?;
    all.iter()
        .copied()
        .find(|value| name(*value).eq_ignore_ascii_case(&text))
        .ok_or_else(|| {
            let names: Vec<String> = all.iter().map(|v| format!("`{}`", name(*v))).collect();
            serde::de::Error::custom(format!(
                "unknown variant `{text}`, expected one of {} (in any case)",
                names.join(", ")
            ))
        })
}

/// Deserializes a librdkafka enumeration by [`any_case`] over its variants, and
/// describes it (its JSON Schema; its value as written, for defaults).
macro_rules! any_case_deserialize {
    ($type:ident: $($variant:ident),+) => {
        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                any_case(deserializer, &[$($type::$variant),+], $type::as_str)
            }
        }

        impl serde::Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl schemars::JsonSchema for $type {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($type).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                let values: Vec<&str> = [$($type::$variant),+].into_iter().map($type::as_str).collect();
                schemars::json_schema!({
                    "type": "string",
                    "enum": values,
                    "x-any-case": true
                })
            }
        }
    };
}

/// librdkafka's `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecurityProtocol {
    #[default]
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

any_case_deserialize!(SecurityProtocol: Plaintext, Ssl, SaslPlaintext, SaslSsl);

impl SecurityProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "plaintext",
            SecurityProtocol::Ssl => "ssl",
            SecurityProtocol::SaslPlaintext => "sasl_plaintext",
            SecurityProtocol::SaslSsl => "sasl_ssl",
        }
    }

    fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }
}

/// librdkafka's `sasl.mechanism`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    ScramSha256,
    ScramSha512,
    /// Refused: this build of librdkafka has no OIDC (it needs libcurl).
    OAuthBearer,
}

any_case_deserialize!(SaslMechanism: Plain, ScramSha256, ScramSha512, OAuthBearer);

impl SaslMechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
            SaslMechanism::OAuthBearer => "OAUTHBEARER",
        }
    }
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

/// The default of `sink.transaction_max_ms`: a commit a second costs a few per cent
/// of throughput (one round trip to the coordinator and the partitions' markers),
/// where a commit a batch cost most of it.
pub fn default_transaction_max() -> Duration {
    Duration::from_secs(1)
}

/// The default of `sink.transaction_max_bytes`: a bound above what a second takes
/// at the rates measured here (about 300 MiB/s), so that the time bound decides;
/// a smaller one made a commit (and its flush, which stalls sending) several times
/// a second.
pub const DEFAULT_TRANSACTION_MAX_BYTES: u64 = 256 * 1024 * 1024;

fn default_transaction_max_bytes() -> u64 {
    DEFAULT_TRANSACTION_MAX_BYTES
}

/// librdkafka's `compression.codec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    None,
    Gzip,
    #[default]
    Lz4,
    Zstd,
    Snappy,
}

any_case_deserialize!(Compression: None, Gzip, Lz4, Zstd, Snappy);

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

/// librdkafka's `partitioner`: which partition a key goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
    /// Random, whatever the key: refused.
    Random,
}

any_case_deserialize!(
    Partitioner: Murmur2Random,
    Murmur2,
    ConsistentRandom,
    Consistent,
    Fnv1aRandom,
    Fnv1a,
    Random
);

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
    (
        "enable.gapless.guarantee",
        "always true: a message refused for good is never followed by later ones",
    ),
    ("acks", "always all: needed for at-least-once delivery"),
    ("compression.type", "sink.compression"),
    ("compression.codec", "sink.compression"),
    (
        "message.max.bytes",
        "event.max_message_size_kb; with event.format = \"debezium\" it is taken here, as a record's bound",
    ),
    ("message.timeout.ms", "sink.delivery_timeout_ms"),
    ("delivery.timeout.ms", "sink.delivery_timeout_ms"),
    (
        "sasl.password",
        "sink.sasl_password (Event Hubs: sink.connection_string)",
    ),
    ("partitioner", "sink.partitioner"),
    (
        "transactional.id",
        "sink.transactional_id (with sink.exactly_once)",
    ),
    (
        "transaction.timeout.ms",
        "sink.delivery_timeout_ms (with sink.exactly_once)",
    ),
    ("security.protocol", "sink.security_protocol"),
    ("sasl.mechanism", "sink.sasl_mechanism"),
    ("sasl.mechanisms", "sink.sasl_mechanism"),
    ("sasl.username", "sink.sasl_username"),
    ("ssl.ca.location", "sink.ssl_ca_location"),
    ("ssl.certificate.location", "sink.ssl_certificate_location"),
    ("ssl.key.location", "sink.ssl_key_location"),
    ("ssl.key.password", "sink.ssl_key_password"),
    (
        "ssl.endpoint.identification.algorithm",
        "sink.ssl_endpoint_identification",
    ),
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
            security_protocol: SecurityProtocol::default(),
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: SecretRef::default(),
            ssl_ca_location: None,
            ssl_certificate_location: None,
            ssl_key_location: None,
            ssl_key_password: SecretRef::default(),
            ssl_endpoint_identification: true,
            kafka: PassThrough::default(),
            exactly_once: false,
            transaction_max: default_transaction_max(),
            transaction_max_bytes: default_transaction_max_bytes(),
            transactional_id: None,
            transaction: None,
        }
    }

    /// The login and TLS settings make sense together; each error names the setting.
    fn validate_security(&self, flavour: KafkaFlavour) -> Result<(), ConfigError> {
        let protocol = self.security_protocol;
        let sasl_given = self.sasl_mechanism.is_some()
            || self.sasl_username.is_some()
            || self.sasl_password.is_set();
        let tls_given = self.ssl_ca_location.is_some()
            || self.ssl_certificate_location.is_some()
            || self.ssl_key_location.is_some()
            || self.ssl_key_password.is_set()
            || !self.ssl_endpoint_identification;
        if flavour == KafkaFlavour::EventHubs {
            if protocol != SecurityProtocol::Plaintext || sasl_given || tls_given {
                return Err(invalid(
                    "sink.security_protocol",
                    "Event Hubs' Kafka endpoint always uses SASL_SSL with the connection string: remove sink.security_protocol, sink.sasl_* and sink.ssl_*",
                ));
            }
            return Ok(());
        }
        if sasl_given && !protocol.sasl() {
            return Err(invalid(
                "sink.security_protocol",
                format!(
                    "is \"{}\", but sink.sasl_* settings are given: use \"sasl_ssl\" (or \"sasl_plaintext\" on a network you trust)",
                    protocol.as_str()
                ),
            ));
        }
        if tls_given && !protocol.tls() {
            return Err(invalid(
                "sink.security_protocol",
                format!(
                    "is \"{}\", but sink.ssl_* settings are given: use \"ssl\" or \"sasl_ssl\"",
                    protocol.as_str()
                ),
            ));
        }
        if protocol.sasl() {
            match self.sasl_mechanism {
                None => {
                    return Err(invalid(
                        "sink.sasl_mechanism",
                        "required with a sasl_* security protocol: \"PLAIN\", \"SCRAM-SHA-256\" or \"SCRAM-SHA-512\"",
                    ));
                }
                Some(SaslMechanism::OAuthBearer) => {
                    return Err(invalid(
                        "sink.sasl_mechanism",
                        "\"OAUTHBEARER\" is not supported by this build (librdkafka without OIDC, which needs libcurl): use PLAIN or SCRAM-SHA-256/512",
                    ));
                }
                Some(_) => {}
            }
            if self.sasl_username.as_deref().is_none_or(str::is_empty) {
                return Err(invalid(
                    "sink.sasl_username",
                    "required with a sasl_* security protocol",
                ));
            }
            if !self.sasl_password.is_set() {
                return Err(ConfigError::MissingSecret {
                    setting: "sink.sasl_password".into(),
                    reason: "required with a sasl_* security protocol: { env = \"VARIABLE\" } or { file = \"/path\" }, or the secret itself in MSSQL_CES__SINK__SASL_PASSWORD".into(),
                });
            }
        }
        if self.ssl_certificate_location.is_some() != self.ssl_key_location.is_some() {
            return Err(invalid(
                "sink.ssl_certificate_location",
                "mutual TLS needs both sink.ssl_certificate_location and sink.ssl_key_location",
            ));
        }
        Ok(())
    }

    /// Checks what can be checked before connecting; each error names the setting.
    pub fn validate(
        &self,
        flavour: KafkaFlavour,
        event: &EventSettings,
    ) -> Result<(), ConfigError> {
        if self.partitioner == Partitioner::Random {
            return Err(invalid(
                "sink.partitioner",
                "\"random\" ignores keys: one key's events, and one event's segments, would land in different partitions and out of order; choose a partitioner that hashes the key (\"murmur2_random\", the default, or \"consistent_random\", \"fnv1a_random\", …)",
            ));
        }
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
        if self.exactly_once && self.transaction_max >= self.delivery_timeout {
            return Err(invalid(
                "sink.transaction_max_ms",
                format!(
                    "must be less than sink.delivery_timeout_ms ({} ms): a transaction open longer is aborted by the coordinator",
                    self.delivery_timeout.as_millis()
                ),
            ));
        }
        let debezium = event.format == crate::event::settings::EventFormat::Debezium;
        for (key, value) in self.kafka.iter() {
            // A Debezium record has no segments: its bound is the producer's.
            if debezium && key == "message.max.bytes" {
                if !value
                    .trim()
                    .parse()
                    .is_ok_and(|n: usize| MESSAGE_MAX_BYTES_RANGE.contains(&n))
                {
                    return Err(invalid(
                        "sink.kafka.\"message.max.bytes\"",
                        format!(
                            "{value:?} is not a number of bytes from {} to {}",
                            MESSAGE_MAX_BYTES_RANGE.start(),
                            MESSAGE_MAX_BYTES_RANGE.end()
                        ),
                    ));
                }
                continue;
            }
            if let Some((_, owner)) = OWNED_KAFKA_PROPERTIES.iter().find(|(p, _)| p == key) {
                return Err(invalid(
                    &format!("sink.kafka.\"{key}\""),
                    format!("conflicts with a typed setting ({owner}); remove it"),
                ));
            }
        }
        self.validate_security(flavour)
    }

    /// Reads the Event Hubs connection string (without keeping it) and checks its
    /// form, so a missing or malformed one is reported before anything connects.
    pub fn check_secrets(&self, flavour: KafkaFlavour) -> Result<(), ConfigError> {
        if flavour == KafkaFlavour::EventHubs {
            let secret = self.connection_string.resolve("sink.connection_string")?;
            // The messages name the setting and never quote the secret.
            let (host, _) = parse_event_hubs_connection_string(&secret)
                .map_err(|e| ConfigError::Parse(e.reason()))?;
            kafka_endpoint(&host).map_err(|e| ConfigError::Parse(e.reason()))?;
        }
        if self.sasl_password.is_set() {
            self.sasl_password.resolve("sink.sasl_password")?;
        }
        if self.ssl_key_password.is_set() {
            self.ssl_key_password.resolve("sink.ssl_key_password")?;
        }
        Ok(())
    }

    /// The login and TLS properties of a Kafka sink (the secrets read now).
    fn security_properties(&self) -> Result<Vec<(String, String)>, SinkError> {
        let secret = |s: &SecretRef, setting: &str| {
            s.resolve(setting)
                .map_err(|e| SinkError::definite_because("a secret cannot be read", e))
        };
        let protocol = self.security_protocol;
        let mut out = vec![("security.protocol".to_owned(), protocol.as_str().to_owned())];
        if protocol.sasl() {
            if let Some(mechanism) = self.sasl_mechanism {
                out.push(("sasl.mechanism".into(), mechanism.as_str().into()));
            }
            if let Some(user) = &self.sasl_username {
                out.push(("sasl.username".into(), user.clone()));
            }
            out.push((
                "sasl.password".into(),
                secret(&self.sasl_password, "sink.sasl_password")?,
            ));
        }
        if protocol.tls() {
            for (key, path) in [
                ("ssl.ca.location", &self.ssl_ca_location),
                ("ssl.certificate.location", &self.ssl_certificate_location),
                ("ssl.key.location", &self.ssl_key_location),
            ] {
                if let Some(path) = path {
                    out.push((key.into(), path.display().to_string()));
                }
            }
            if self.ssl_key_password.is_set() {
                out.push((
                    "ssl.key.password".into(),
                    secret(&self.ssl_key_password, "sink.ssl_key_password")?,
                ));
            }
            let identification = if self.ssl_endpoint_identification {
                "https"
            } else {
                "none"
            };
            out.push((
                "ssl.endpoint.identification.algorithm".into(),
                identification.into(),
            ));
        }
        Ok(out)
    }

    /// The producer and the topic (template) it sends to.
    pub fn build(
        &self,
        flavour: KafkaFlavour,
        routing: &RoutingSettings,
        largest: crate::sink::LargestMessage,
        health: Arc<SinkHealth>,
    ) -> Result<crate::sink::BuiltSink, SinkError> {
        let (mut settings, topic) = self.settings(flavour, routing, largest.bytes)?;
        settings.sized_by = largest.setting;
        Ok(crate::sink::BuiltSink {
            sink: crate::sink::Sink::Kafka(KafkaSink::with_health(
                &settings,
                largest.bytes,
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
                    .map_err(|e| SinkError::definite_because("a secret cannot be read", e))?;
                let (_, entity) = parse_event_hubs_connection_string(&secret)?;
                let topic = routing.topic.clone().or(entity).ok_or_else(|| {
                    SinkError::definite("sink.topic: name the event hub, or put EntityPath= in the connection string")
                })?;
                (Some(secret), topic)
            }
        };
        let settings = KafkaSettings::new(self, flavour, max_message_bytes, secret.as_deref())?;
        Ok((settings, topic))
    }
}

/// What the Kafka producer is given, secrets included: its `{:?}` redacts them.
pub struct KafkaSettings {
    pub properties: Vec<(String, String)>,
    /// How long a message may stay undelivered (`sink.delivery_timeout_ms`), counted
    /// by the run on the oldest outstanding message, not by librdkafka (whose
    /// `message.timeout.ms` is infinite: a per-message time-out lets later messages
    /// of a key be written after earlier ones failed).
    pub delivery_timeout: Duration,
    /// Whether each topic's `max.message.bytes` is read and checked (not for Event
    /// Hubs, whose limit the configuration enforces).
    pub check_topic_limits: bool,
    /// `sink.exactly_once`: what the transactions are tied to.
    pub transaction: Option<super::TransactionSettings>,
    /// The setting that sets the largest message, named where a topic's limit is
    /// too small for it (default `event.max_message_size_kb`).
    pub sized_by: &'static str,
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
        SinkError::definite(
            "sink.connection_string has no Endpoint=sb://<namespace>.servicebus.windows.net/",
        )
    })?;
    Ok((host, entity))
}

/// Event Hubs' Kafka endpoint for a namespace host: always port 9093. A host with a
/// port of its own is refused, naming it (`sb://host:9/` would become `host:9:9093`).
fn kafka_endpoint(host: &str) -> Result<String, SinkError> {
    if host.contains(':') || host.contains('/') {
        return Err(SinkError::definite(format!(
            "sink.connection_string: Endpoint=sb://{host}/ gives a port or a path; Event Hubs' Kafka endpoint is always port 9093 of the namespace: write Endpoint=sb://<namespace>.servicebus.windows.net/"
        )));
    }
    Ok(format!("{host}:9093"))
}

/// The producer's `message.max.bytes`: the largest segment and room for its record's
/// framing, below Event Hubs' request limit there.
fn request_limit(flavour: KafkaFlavour, max_message_bytes: usize) -> Result<usize, SinkError> {
    Ok(match flavour {
        KafkaFlavour::EventHubs => {
            if max_message_bytes + EVENT_HUBS_RECORD_OVERHEAD >= EVENT_HUBS_REQUEST_LIMIT {
                return Err(SinkError::definite(format!(
                    "event.max_message_size_kb = {}: Event Hubs' Kafka endpoint closes the connection on requests of {EVENT_HUBS_REQUEST_LIMIT} bytes or more; use at most {EVENT_HUBS_MAX_MESSAGE_KB}",
                    max_message_bytes / 1024
                )));
            }
            (max_message_bytes + MESSAGE_OVERHEAD_BYTES).min(EVENT_HUBS_REQUEST_LIMIT - 1)
        }
        _ => max_message_bytes + MESSAGE_OVERHEAD_BYTES,
    })
}

/// The producer queue's bound, in KiB (`queue.buffering.max.kbytes`).
const PRODUCER_QUEUE_KB: usize = 64 * 1024;

/// librdkafka's default `batch.size`.
const LIBRDKAFKA_BATCH_SIZE: usize = 1_000_000;

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSettings")
            .field(
                "properties",
                &crate::kafka_client::Redacted(&self.properties),
            )
            .field("delivery_timeout", &self.delivery_timeout)
            .field("check_topic_limits", &self.check_topic_limits)
            .field("transaction", &self.transaction)
            .field("sized_by", &self.sized_by)
            .finish()
    }
}

impl KafkaSettings {
    /// The largest record batch this producer sends, which each topic's
    /// `max.message.bytes` must take: a batch of messages up to
    /// `min(batch.size, message.max.bytes)`, or one message of the largest segment
    /// (`largest_message`) with its headers, whichever is more.
    pub fn largest_record_batch(&self, largest_message: usize) -> usize {
        let number = |key: &str| {
            self.properties
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.parse::<usize>().ok())
        };
        let batch = number("batch.size").unwrap_or(LIBRDKAFKA_BATCH_SIZE);
        let request = number("message.max.bytes").unwrap_or(usize::MAX);
        (largest_message + super::admin::RECORD_OVERHEAD_BYTES).max(batch.min(request))
    }

    /// The producer properties for a Kafka or Event Hubs sink. `event_hubs_secret` is
    /// the Event Hubs connection string (Event Hubs sinks only).
    pub fn new(
        sink: &KafkaSinkConfig,
        flavour: KafkaFlavour,
        max_message_bytes: usize,
        event_hubs_secret: Option<&str>,
    ) -> Result<Self, SinkError> {
        let request_limit = request_limit(flavour, max_message_bytes)?;
        let mut properties = vec![
            ("client.id".to_owned(), "mssql-ces".to_owned()),
            ("enable.idempotence".to_owned(), "true".to_owned()),
            // A message the broker refuses for good (too large, an invalid record)
            // stops the producer rather than letting the idempotent producer
            // renumber and send the messages after it: a topic holds a prefix of
            // what was sent, never a gap (librdkafka's CONFIGURATION.md). A
            // transactional producer aborts the transaction instead.
            ("enable.gapless.guarantee".to_owned(), "true".to_owned()),
            ("acks".to_owned(), "all".to_owned()),
            ("message.max.bytes".to_owned(), request_limit.to_string()),
            // Infinite: librdkafka never gives up on one message while it sends the
            // ones after it (librdkafka's INTRODUCTION.md, "Message timeout
            // considerations"); the run enforces the delivery timeout on the oldest
            // outstanding message and purges the rest when it stops.
            ("message.timeout.ms".to_owned(), "0".to_owned()),
            // The producer's memory: at most this much waits in its queue (a full
            // queue makes the pipeline wait). librdkafka's own default is 1 GiB;
            // [sink.kafka] may set another.
            (
                "queue.buffering.max.kbytes".to_owned(),
                PRODUCER_QUEUE_KB.to_string(),
            ),
            (
                "partitioner".to_owned(),
                sink.partitioner.as_str().to_owned(),
            ),
        ];
        match flavour {
            KafkaFlavour::EventHubs => {
                let secret = event_hubs_secret.ok_or_else(|| {
                    SinkError::definite("sink.connection_string is required for Event Hubs")
                })?;
                let (host, _) = parse_event_hubs_connection_string(secret)?;
                let compression = sink.compression.unwrap_or(Compression::None);
                properties.extend([
                    ("bootstrap.servers".to_owned(), kafka_endpoint(&host)?),
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
                let servers = sink
                    .bootstrap_servers
                    .clone()
                    .ok_or_else(|| SinkError::definite("sink.bootstrap_servers is required"))?;
                let compression = sink.compression.unwrap_or_default();
                properties.extend([
                    ("bootstrap.servers".to_owned(), servers),
                    (
                        "compression.type".to_owned(),
                        compression.as_str().to_owned(),
                    ),
                ]);
                properties.extend(sink.security_properties()?);
            }
        }
        properties.extend(sink.kafka.iter().map(|(k, v)| (k.clone(), v.clone())));
        properties.extend(transaction_properties(sink));
        Ok(KafkaSettings {
            properties,
            delivery_timeout: sink.delivery_timeout,
            check_topic_limits: flavour == KafkaFlavour::Kafka,
            transaction: sink.transaction.clone(),
            sized_by: "event.max_message_size_kb",
        })
    }
}

/// With `sink.exactly_once`: the transactional id, and the time-outs. A transaction
/// must end within `transaction.timeout.ms`, and librdkafka wants every message's
/// time-out within it: the delivery time-out bounds both (a batch not committed by
/// then is aborted and the run fails).
fn transaction_properties(sink: &KafkaSinkConfig) -> Vec<(String, String)> {
    let Some(t) = &sink.transaction else {
        return Vec::new();
    };
    vec![
        ("transactional.id".to_owned(), t.id.clone()),
        (
            "message.timeout.ms".to_owned(),
            super::transactions::message_timeout(sink.delivery_timeout)
                .as_millis()
                .to_string(),
        ),
        (
            "transaction.timeout.ms".to_owned(),
            super::transactions::coordinator_timeout(sink.delivery_timeout)
                .as_millis()
                .to_string(),
        ),
    ]
}

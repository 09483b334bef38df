//! The admin side: what `check` reads of a destination (brokers, topics, their
//! limits) and the background check of each topic's `max.message.bytes` against the
//! largest segment. Every DescribeConfigs answer is read by one function.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

use super::{KafkaSettings, SinkError, delivery_error};

/// Room for the key, headers and record framing of a message in a produce request,
/// which the topic's `max.message.bytes` must leave besides the largest segment.
pub const RECORD_OVERHEAD_BYTES: usize = 1024;

/// How a topic's `max.message.bytes` compares with the largest message: an error
/// naming both settings when a segment cannot fit.
///
/// `largest_batch` is the largest record batch the producer sends
/// ([`KafkaSettings::largest_record_batch`]): the topic's limit applies to batches,
/// and librdkafka fills them up to `min(batch.size, message.max.bytes)`, so a limit
/// that takes the largest segment alone may still refuse a batch of smaller ones.
/// `sized_by` is the setting that sets the largest message.
pub fn check_topic_limit(
    topic: &str,
    topic_limit: usize,
    largest_batch: usize,
    sized_by: &str,
) -> Result<(), SinkError> {
    if largest_batch > topic_limit {
        return Err(SinkError::definite(format!(
            "topic {topic} accepts record batches up to {topic_limit} bytes (its max.message.bytes, or the broker's message.max.bytes), but this producer sends batches of up to {largest_batch} bytes (the largest message, {sized_by}, with its headers, or librdkafka's batching, min(batch.size, message.max.bytes)): raise the topic's max.message.bytes to {largest_batch}, or lower {sized_by} (and \"batch.size\" in [sink.kafka])"
        )));
    }
    Ok(())
}

/// An admin client's configuration: only where and how to connect.
pub(super) fn admin_config(settings: &KafkaSettings) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (key, value) in connection_properties(settings) {
        config.set(key, value);
    }
    config
}

/// The properties that say where and how to connect (secrets included).
pub fn connection_properties(settings: &KafkaSettings) -> Vec<(String, String)> {
    settings
        .properties
        .iter()
        .filter(|(key, _)| {
            key == "bootstrap.servers"
                || key.starts_with("security.")
                || key.starts_with("sasl.")
                || key.starts_with("ssl.")
                || key.starts_with("socket.")
        })
        .cloned()
        .collect()
}

/// What `check` learns of a Kafka destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationFacts {
    /// Brokers in the cluster's metadata.
    pub brokers: usize,
    pub topics: Vec<TopicFacts>,
    /// The broker's `auto.create.topics.enable`, or why it could not be read.
    pub auto_create: Result<bool, String>,
    /// How the client proved who it is (`SASL SCRAM-SHA-512`, `a TLS client
    /// certificate`), or `None` when it gives no login (plaintext or server-only TLS).
    pub login: Option<String>,
}

/// One topic the stream writes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicFacts {
    pub name: String,
    /// `None`: no such topic, or one the login may not see (`refused`).
    pub partitions: Option<usize>,
    /// Kafka refused the login the topic's metadata (TOPIC_AUTHORIZATION_FAILED): it
    /// may exist, and the login lacks every right on it.
    pub refused: bool,
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
    let brokers = Arc::new(super::outage::BrokerLog::new(
        settings
            .properties
            .iter()
            .find(|(k, _)| k == "bootstrap.servers")
            .map_or("", |(_, v)| v.as_str()),
    ));
    let created = |e: rdkafka::error::KafkaError| {
        SinkError::definite(format!(
            "cannot create a Kafka client: {}",
            super::config_error(&e)
        ))
    };
    let admin: AdminClient<DefaultClientContext> =
        admin_config(settings).create().map_err(created)?;
    let admin = Arc::new(admin);
    // The first request goes through a client whose error callback is served (an
    // admin client's is not), so that a refusal is seen as one.
    let asker: rdkafka::producer::ThreadedProducer<RefusalContext> = admin_config(settings)
        .create_with_context(RefusalContext(Arc::clone(&brokers)))
        .map_err(created)?;
    let fetched = tokio::task::spawn_blocking(move || {
        rdkafka::producer::Producer::client(&asker).fetch_metadata(None, timeout)
    });
    // A refusal (a mechanism the brokers do not offer, a wrong password, a
    // certificate) is said as soon as it comes, not as a time-out.
    let mut refusals = brokers.refusals();
    let metadata = tokio::select! {
        fetched = fetched => fetched
            .map_err(|e| SinkError::transient_because("the metadata request's thread failed", e))?
            .map_err(|e| match brokers.refused() {
                Some(_) => brokers.refusal_error(),
                None => delivery_error(&e),
            })?,
        _ = refusals.wait_for(Option::is_some) => return Err(brokers.refusal_error()),
    };
    let options = AdminOptions::new().request_timeout(Some(timeout));
    let mut out = Vec::new();
    let mut missing = false;
    for name in topics {
        let partitions = metadata
            .topics()
            .iter()
            .find(|t| t.name() == name && t.error().is_none())
            .map(|t| t.partitions().len());
        // A listing of every topic leaves out those the login may not describe; asked
        // for by name, Kafka says so.
        let refused = partitions.is_none() && {
            let (fetcher, name) = (Arc::clone(&admin), name.clone());
            tokio::task::spawn_blocking(move || {
                fetcher.inner().fetch_metadata(Some(&name), timeout)
            })
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|m| m.topics().first().and_then(|t| t.error()))
            .is_some_and(|e| {
                rdkafka::types::RDKafkaErrorCode::from(e)
                    == rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed
            })
        };
        missing |= partitions.is_none() && !refused;
        let max_message_bytes = if partitions.is_some() {
            let resource = ResourceSpecifier::Topic(name);
            described_value(&admin, &resource, "max.message.bytes", &options)
                .await
                .and_then(|v| {
                    v.parse::<usize>()
                        .map_err(|_| unreadable(&"no max.message.bytes in the answer"))
                })
        } else {
            Err("no such topic".to_owned())
        };
        out.push(TopicFacts {
            name: name.clone(),
            partitions,
            refused,
            max_message_bytes,
        });
    }
    let auto_create = match metadata.brokers().first() {
        Some(broker) if missing => {
            let resource = ResourceSpecifier::Broker(broker.id());
            described_value(&admin, &resource, "auto.create.topics.enable", &options)
                .await
                .map(|v| v == "true")
        }
        _ => Err("not needed".to_owned()),
    };
    Ok(DestinationFacts {
        brokers: metadata.brokers().len(),
        topics: out,
        auto_create,
        login: login_of(&settings.properties),
    })
}

/// How a client with these properties proves who it is, if it does.
fn login_of(properties: &[(String, String)]) -> Option<String> {
    let get = |key: &str| {
        properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let protocol = get("security.protocol").unwrap_or("plaintext");
    if protocol.to_ascii_lowercase().starts_with("sasl") {
        Some(format!(
            "SASL {}",
            get("sasl.mechanism").unwrap_or("GSSAPI")
        ))
    } else if get("ssl.certificate.location").is_some() || get("ssl.certificate.pem").is_some() {
        Some("a TLS client certificate".to_owned())
    } else {
        None
    }
}

/// The admin client's context for `check`: a refusal goes to a [`BrokerLog`]; the
/// rest (an unreachable broker) is for the time-out to say.
///
/// [`BrokerLog`]: super::outage::BrokerLog
struct RefusalContext(Arc<super::outage::BrokerLog>);

impl rdkafka::ClientContext for RefusalContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if super::outage::is_refusal(&error, reason) {
            self.0.error(&error, reason);
        } else {
            tracing::debug!(%error, reason, "Kafka");
        }
    }

    fn log(&self, _: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        tracing::debug!(facility = fac, "librdkafka: {message}");
    }
}

impl rdkafka::producer::ProducerContext for RefusalContext {
    type DeliveryOpaque = ();

    /// It sends nothing.
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// Why a configuration value could not be read.
fn unreadable(e: &dyn std::fmt::Display) -> String {
    format!("not readable ({e}): the endpoint may not answer DescribeConfigs")
}

/// The configuration of `resource` from DescribeConfigs; `None` where the answer
/// has none for it.
async fn described<C: rdkafka::ClientContext + 'static>(
    admin: &AdminClient<C>,
    resource: &ResourceSpecifier<'_>,
    options: &AdminOptions,
) -> Result<Option<rdkafka::admin::ConfigResource>, rdkafka::error::KafkaError> {
    let results = admin.describe_configs([resource], options).await?;
    Ok(results.into_iter().next().and_then(Result::ok))
}

/// One configuration value of `resource` from DescribeConfigs, or why it could not
/// be read.
pub(super) async fn described_value<C: rdkafka::ClientContext + 'static>(
    admin: &AdminClient<C>,
    resource: &ResourceSpecifier<'_>,
    key: &str,
    options: &AdminOptions,
) -> Result<String, String> {
    match described(admin, resource, options).await {
        Ok(config) => config
            .and_then(|c| c.get(key).and_then(|e| e.value.clone()))
            .ok_or_else(|| unreadable(&format!("no {key} in the answer"))),
        Err(e) => Err(unreadable(&e)),
    }
}

/// Reads `topic`'s `max.message.bytes` (the admin API's DescribeConfigs, which
/// reports the broker's `message.max.bytes` where the topic does not override it);
/// a limit below the largest segment goes to `verdict`, which fails the next send.
/// Where the limit cannot be read (no such topic yet, an endpoint without the API),
/// says so and goes on. The same answer's `min.insync.replicas` goes to `probe`,
/// for a stall's diagnosis: asked now, while the cluster is well, rather than then
/// (Kafka answers DescribeConfigs from its controller, which may be the broker
/// that is down).
pub(super) async fn check_topic_in_background(
    admin: Arc<AdminClient<DefaultClientContext>>,
    probe: Arc<super::stall::TopicProbe>,
    largest: crate::sink::LargestMessage,
    verdict: Arc<Mutex<Option<SinkError>>>,
) {
    let crate::sink::LargestMessage {
        bytes: largest,
        setting: sized_by,
    } = largest;
    let topic = probe.topic();
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    let described = tokio::time::timeout(
        Duration::from_secs(35),
        described(&admin, &ResourceSpecifier::Topic(topic), &options),
    )
    .await;
    let config = match described {
        Ok(Ok(config)) => config,
        Ok(Err(_)) | Err(_) => None,
    };
    let value = |key: &str| {
        config
            .as_ref()
            .and_then(|c| c.get(key))
            .and_then(|e| e.value.as_deref())
            .and_then(|v| v.parse::<usize>().ok())
    };
    if let Some(min_in_sync) = value("min.insync.replicas") {
        probe.knows_min_in_sync(min_in_sync);
    }
    match value("max.message.bytes") {
        Some(limit) => match check_topic_limit(topic, limit, largest, sized_by) {
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
            "cannot read the topic's max.message.bytes (no such topic yet, or the endpoint does not answer DescribeConfigs): make sure it, or the broker's message.max.bytes, takes the largest message ({sized_by})"
        ),
    }
}

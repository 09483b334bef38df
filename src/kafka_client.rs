//! What every Kafka client of the crate shares (the sink, the Kafka checkpoint
//! store, `read`): an error text that never shows a secret.

use rdkafka::error::KafkaError;

/// A Kafka client's error without the value of the property it is about: rdkafka's
/// text quotes it, and it may be a secret (`sasl.password`,
/// `sasl.oauthbearer.client.secret`, `ssl.key.password`, …). The property's name and
/// librdkafka's reason, with any copy of the value blanked.
pub fn config_error(error: &KafkaError) -> String {
    match error {
        KafkaError::ClientConfig(_, description, key, value) => {
            let description = if value.is_empty() {
                description.clone()
            } else {
                description.replace(value.as_str(), "<value not shown>")
            };
            format!("[sink.kafka] \"{key}\": {description}")
        }
        other => other.to_string(),
    }
}

/// Why a topic's metadata could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The client could not be made: a property librdkafka refuses (trying again
    /// cannot help). The client's own error may quote the value, a secret perhaps,
    /// so only [`config_error`]'s text is kept.
    #[error("cannot create a Kafka client: {0}")]
    Client(String),
    /// The brokers did not answer, or refused the request.
    #[error("cannot read the topic's metadata")]
    Unreachable(#[source] crate::error::Cause),
}

/// A topic's partition ids, `None` when it does not exist.
pub async fn topic_partitions(
    config: rdkafka::ClientConfig,
    topic: &str,
    timeout: std::time::Duration,
) -> Result<Option<Vec<i32>>, LookupError> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config
            .create()
            .map_err(|e| LookupError::Client(config_error(&e)))?;
        let metadata = consumer
            .fetch_metadata(Some(&topic), timeout)
            .map_err(|e| LookupError::Unreachable(crate::error::cause(e)))?;
        Ok(metadata.topics().first().and_then(|t| {
            (t.error().is_none() && !t.partitions().is_empty())
                .then(|| t.partitions().iter().map(|p| p.id()).collect())
        }))
    })
    .await
    .map_err(|e| LookupError::Unreachable(crate::error::cause(e)))?
}

/// Why a topic could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateTopicError {
    /// The admin client could not be made (a property librdkafka refuses; only
    /// [`config_error`]'s text is kept, as for [`LookupError::Client`]).
    #[error("cannot create a Kafka admin client: {0}")]
    Client(String),
    /// The request failed on the way (brokers unreachable, timed out).
    #[error("cannot create the topic")]
    Transient(#[source] rdkafka::error::KafkaError),
    /// The broker refused it (no right to create topics, a bad setting).
    #[error("the broker refused to create the topic ({0})")]
    Refused(rdkafka::types::RDKafkaErrorCode),
}

/// Creates `topic` with `partitions` partitions, the broker's default replication
/// (KIP-464) and `settings`. `Ok(true)`: created; `Ok(false)`: it already existed.
pub async fn create_topic(
    config: &rdkafka::ClientConfig,
    topic: &str,
    partitions: i32,
    settings: &[(&str, &str)],
    timeout: std::time::Duration,
) -> Result<bool, CreateTopicError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = config
        .create()
        .map_err(|e| CreateTopicError::Client(config_error(&e)))?;
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    for (key, value) in settings {
        new = new.set(key, value);
    }
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    let created = admin
        .create_topics([&new], &options)
        .await
        .map_err(CreateTopicError::Transient)?;
    match created.into_iter().next() {
        Some(Ok(_)) => Ok(true),
        Some(Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists))) | None => Ok(false),
        Some(Err((_, code))) => Err(CreateTopicError::Refused(code)),
    }
}

/// The error code of a Kafka error, whichever kind reports it.
pub fn error_code(error: &rdkafka::error::KafkaError) -> Option<rdkafka::types::RDKafkaErrorCode> {
    use rdkafka::error::KafkaError as E;
    match error {
        E::MessageProduction(code) | E::MessageConsumption(code) | E::Global(code) => Some(*code),
        E::Transaction(e) => Some(e.code()),
        other => other.rdkafka_error_code(),
    }
}

/// Kafka's name of an authorization refusal (`TOPIC_AUTHORIZATION_FAILED`, …);
/// `None` for any other code.
pub fn authorization_failure(code: rdkafka::types::RDKafkaErrorCode) -> Option<&'static str> {
    use rdkafka::types::RDKafkaErrorCode as C;
    Some(match code {
        C::TopicAuthorizationFailed => "TOPIC_AUTHORIZATION_FAILED",
        C::GroupAuthorizationFailed => "GROUP_AUTHORIZATION_FAILED",
        C::TransactionalIdAuthorizationFailed => "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        C::ClusterAuthorizationFailed => "CLUSTER_AUTHORIZATION_FAILED",
        _ => return None,
    })
}

/// For an authorization refusal: what the login lacks, as the ACL to grant
/// (`grant`, e.g. "WRITE on topic ces"), with Kafka's name of the error; `None` for
/// any other error.
pub fn refused_right(error: &rdkafka::error::KafkaError, grant: &str) -> Option<String> {
    let name = authorization_failure(error_code(error)?)?;
    Some(format!(
        "Kafka refused the login a right ({name}): grant it {grant} (the book's ACL table lists what each mode needs)"
    ))
}

/// Whether a client property holds a secret (a password, a key, a token), whose
/// value never reaches a log, an error or a `{:?}`.
pub fn is_secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "jaas", "token", ".pem", "credentials"]
        .iter()
        .any(|part| key.contains(part))
}

/// A property list as `{:?}` shows it: every key, and the values of secrets as
/// `<redacted>`. The one way a type holding client properties formats them.
pub struct Redacted<'a>(pub &'a [(String, String)]);

impl std::fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(key, value)| {
                let shown = if is_secret_property(key) {
                    "<redacted>"
                } else {
                    value.as_str()
                };
                (key.as_str(), shown)
            }))
            .finish()
    }
}

#[cfg(test)]
mod redaction_tests {

    const PLANTED: &str = "Planted-Secret-4711";

    fn properties() -> Vec<(String, String)> {
        vec![
            ("bootstrap.servers".into(), "b:9092".into()),
            ("sasl.username".into(), "writer".into()),
            ("sasl.password".into(), PLANTED.into()),
            ("ssl.key.password".into(), PLANTED.into()),
            ("sasl.oauthbearer.client.secret".into(), PLANTED.into()),
            ("sasl.jaas.config".into(), format!("password=\"{PLANTED}\"")),
        ]
    }

    /// Every type that holds client properties formats with `{:?}` without the
    /// secret, and with the rest.
    #[test]
    fn no_type_holding_client_properties_shows_a_secret_in_debug() {
        let member = crate::databases::fleet::MemberSettings {
            connection: properties(),
            group_id: "g".into(),
            topic: "t".into(),
            slots: 4,
            session_timeout: std::time::Duration::from_secs(10),
            protocol: crate::config::GroupProtocol::Classic,
            release_timeout: std::time::Duration::from_secs(40),
            timeout: std::time::Duration::from_secs(10),
        };
        let input = crate::commands::read::KafkaInput {
            bootstrap_servers: "b:9092".into(),
            topic: "ces".into(),
            partitions: None,
            group: None,
            follow: false,
            idle: std::time::Duration::from_secs(1),
            properties: properties(),
            read_committed: false,
        };
        for shown in [format!("{member:?}"), format!("{input:?}")] {
            assert!(!shown.contains(PLANTED), "{shown}");
            assert!(
                shown.contains("writer") && shown.contains("<redacted>"),
                "{shown}"
            );
        }
    }

    /// The configuration (a secret in a pass-through property), the producer's
    /// settings and the schema registry's client (each with its secret read) format
    /// with `{:?}` without the secret.
    #[test]
    fn no_configuration_or_client_type_shows_a_secret_in_debug() {
        let dir = std::env::temp_dir().join(format!("mssql-ces-redact-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let secret = dir.join("secret");
        std::fs::write(&secret, PLANTED).expect("secret");
        let file = secret.display();
        let config = crate::config::Config::from_parts(
            &format!(
                "[source]\nkind = \"synthetic\"\n[event]\nencoding = \"avro\"\n\
                 [sink]\nkind = \"kafka\"\nbootstrap_servers = \"b:9092\"\n\
                 security_protocol = \"sasl_ssl\"\nsasl_mechanism = \"PLAIN\"\nsasl_username = \"writer\"\n\
                 sasl_password = {{ file = \"{file}\" }}\n\
                 kafka = {{ \"sasl.oauthbearer.client.secret\" = \"{PLANTED}\", \"linger.ms\" = \"5\" }}\n\
                 [sink.schema_registry]\nurl = \"http://r:8081\"\nusername = \"writer\"\n\
                 password = {{ file = \"{file}\" }}\n"
            ),
            &[],
            &[],
        )
        .expect("config");
        let crate::sink::SinkConfig::Kafka(kafka) = &config.sink.kind else {
            panic!("a Kafka sink");
        };
        let settings = crate::sink::kafka::KafkaSettings::new(
            kafka,
            crate::sink::kafka::KafkaFlavour::Kafka,
            256 * 1024,
            None,
        )
        .expect("settings");
        assert!(
            settings
                .properties
                .iter()
                .any(|(k, v)| k == "sasl.password" && v == PLANTED),
            "the secret was read"
        );
        let registry = crate::sink::registry::SchemaRegistry::new(
            config
                .sink
                .routing
                .schema_registry
                .as_ref()
                .expect("a registry"),
        )
        .expect("registry client");
        for shown in [
            format!("{config:?}"),
            format!("{settings:?}"),
            format!("{registry:?}"),
        ] {
            assert!(!shown.contains(PLANTED), "{shown}");
            assert!(shown.contains("writer"), "{shown}");
        }
        std::fs::remove_dir_all(dir).ok();
    }
}

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

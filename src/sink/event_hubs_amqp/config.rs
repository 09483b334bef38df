//! `[sink]` with `kind = "event_hubs_amqp"`: how the AMQP producer authenticates and
//! where it connects.

use std::time::Duration;

use serde::Deserialize;

use super::{EventHubsAmqpSink, EventHubsCredential};
use crate::setting::{ConfigError, SecretRef, invalid};
use crate::sink::kafka::{default_delivery_timeout, parse_event_hubs_connection_string};
use crate::sink::settings::RoutingSettings;
use crate::sink::{BuiltSink, Sink, SinkError};

/// Which Microsoft Entra ID credential an Event Hubs sink over AMQP uses.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum EntraCredentialKind {
    /// The managed identity of the Azure host (system-assigned).
    ManagedIdentity,
    /// Workload identity federation (AKS), from the standard environment variables.
    WorkloadIdentity,
    /// The signed-in Azure CLI or Azure Developer CLI user (development).
    DeveloperTools,
}

/// Azure Event Hubs over AMQP (`azure_messaging_eventhubs`). See [Event Hubs over
/// AMQP](configuration.md#event-hubs-over-amqp).
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventHubsAmqpSinkConfig {
    /// The Event Hubs connection string
    /// (`Endpoint=sb://…;SharedAccessKeyName=…;SharedAccessKey=…;EntityPath=…`); also
    /// `MSSQL_CES__SINK__CONNECTION_STRING`.
    #[serde(default)]
    pub connection_string: SecretRef,
    /// With Microsoft Entra ID: the namespace, `<name>.servicebus.windows.net`.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Microsoft Entra ID instead of a connection string.
    #[serde(default)]
    pub entra_credential: Option<EntraCredentialKind>,
    /// Connect here instead of the namespace (a proxy, or a local peer), e.g.
    /// `amqp://127.0.0.1:5672`.
    #[serde(default)]
    pub custom_endpoint: Option<String>,
    /// Resend a batch on a new connection when it is not acknowledged within this time,
    /// in milliseconds (up to `delivery_timeout_ms`).
    #[serde(
        rename = "amqp_resend_after_ms",
        with = "crate::setting::millis",
        default = "default_resend_after"
    )]
    #[schemars(with = "u64", range(min = 1))]
    pub resend_after: Duration,
    /// How long a batch may wait for the service before the run fails, in milliseconds;
    /// also how long an unreachable service is retried when the run starts.
    #[serde(
        rename = "delivery_timeout_ms",
        with = "crate::setting::millis",
        default = "default_delivery_timeout"
    )]
    #[schemars(with = "u64", range(min = 1))]
    pub delivery_timeout: Duration,
}

fn default_resend_after() -> Duration {
    Duration::from_secs(30)
}

impl EventHubsAmqpSinkConfig {
    /// The same namespace's Kafka endpoint, reached with the same connection string
    /// (SAS): what a fleet coordinates through while events go over AMQP. `None`
    /// with a Microsoft Entra credential, which the Kafka endpoint takes only over
    /// OAUTHBEARER, not supported here.
    pub fn kafka_endpoint(
        &self,
    ) -> Option<Result<crate::sink::kafka::KafkaSinkConfig, crate::sink::SinkError>> {
        if !self.connection_string.is_set() {
            return None;
        }
        Some(
            crate::setting::de::from_table::<crate::sink::kafka::KafkaSinkConfig>(
                toml::Table::new(),
            )
            .map(|mut kafka| {
                kafka.connection_string = self.connection_string.clone();
                kafka
            })
            .map_err(|e| {
                crate::sink::SinkError::definite_because("the Kafka client's settings", e)
            }),
        )
    }

    /// Checks what can be checked before connecting; each error names the setting.
    pub fn validate(&self, routing: &RoutingSettings) -> Result<(), ConfigError> {
        for (setting, value) in [
            ("sink.amqp_resend_after_ms", self.resend_after),
            ("sink.delivery_timeout_ms", self.delivery_timeout),
        ] {
            if value.is_zero() {
                return Err(invalid(setting, "must be more than 0"));
            }
        }
        if let Some(topic) = &routing.topic
            && topic.contains(['{', '}'])
        {
            return Err(invalid(
                "sink.topic",
                format!(
                    "\"{topic}\" is a template, but an Event Hubs AMQP sink sends to one event hub: name it (per-table hubs need one mssql-ces per hub, with source.include)"
                ),
            ));
        }
        match (
            self.connection_string.is_set(),
            self.entra_credential,
            &self.namespace,
        ) {
            (true, None, _) => Ok(()),
            (false, Some(_), Some(_)) if routing.topic.is_none() => {
                Err(invalid("sink.topic", "name the event hub"))
            }
            (false, Some(_), Some(_)) => Ok(()),
            (false, Some(_), None) => Err(invalid(
                "sink.namespace",
                "Microsoft Entra ID needs the namespace (<name>.servicebus.windows.net)",
            )),
            (true, Some(_), _) => Err(invalid(
                "sink.entra_credential",
                "give either sink.connection_string or sink.entra_credential, not both",
            )),
            (false, None, _) => Err(ConfigError::MissingSecret {
                setting: "sink.connection_string".into(),
                reason: "set sink.connection_string.env or .file, or use sink.entra_credential with sink.namespace".into(),
            }),
        }
    }

    /// Reads the connection string (without keeping it) and checks its form.
    pub fn check_secrets(&self) -> Result<(), ConfigError> {
        if self.entra_credential.is_none() {
            let secret = self.connection_string.resolve("sink.connection_string")?;
            parse_event_hubs_connection_string(&secret)
                .map_err(|e| invalid("sink.connection_string", e.to_string()))?;
        }
        Ok(())
    }

    /// Opens the producer on the event hub: `sink.topic`, else the connection
    /// string's `EntityPath`.
    pub async fn build(
        &self,
        routing: &RoutingSettings,
        health: std::sync::Arc<crate::sink::SinkHealth>,
    ) -> Result<BuiltSink, SinkError> {
        let definite = |e: &dyn std::fmt::Display| SinkError::definite(e.to_string());
        let (credential, entity) = match self.entra_credential {
            None => {
                let secret = self
                    .connection_string
                    .resolve("sink.connection_string")
                    .map_err(|e| definite(&e))?;
                let (_, entity) = parse_event_hubs_connection_string(&secret)?;
                (EventHubsCredential::ConnectionString(secret), entity)
            }
            Some(kind) => {
                let namespace = self.namespace.clone().ok_or_else(|| {
                    SinkError::definite("sink.namespace is required with sink.entra_credential")
                })?;
                let credential: std::sync::Arc<dyn azure_core::credentials::TokenCredential> =
                    match kind {
                        EntraCredentialKind::ManagedIdentity => {
                            azure_identity::ManagedIdentityCredential::new(None)
                                .map_err(|e| definite(&e))?
                        }
                        EntraCredentialKind::WorkloadIdentity => {
                            azure_identity::WorkloadIdentityCredential::new(None)
                                .map_err(|e| definite(&e))?
                        }
                        EntraCredentialKind::DeveloperTools => {
                            azure_identity::DeveloperToolsCredential::new(None)
                                .map_err(|e| definite(&e))?
                        }
                    };
                (
                    EventHubsCredential::Entra {
                        namespace,
                        credential,
                    },
                    None,
                )
            }
        };
        let topic = routing.topic.clone().or(entity).ok_or_else(|| {
            SinkError::definite(
                "sink.topic: name the event hub, or put EntityPath= in the connection string",
            )
        })?;
        let sink = EventHubsAmqpSink::connect(
            credential,
            &topic,
            self.custom_endpoint.clone(),
            self.resend_after,
            self.delivery_timeout,
        )
        .await?
        .with_health(health);
        Ok(BuiltSink {
            sink: Sink::EventHubsAmqp(Box::new(sink)),
            topic,
        })
    }
}

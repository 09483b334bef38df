//! `[sink.schema_registry]`: Avro messages in the Confluent wire format (a zero
//! byte, the schema's id as 4 bytes big-endian, the Avro datum), their schemas
//! registered with a registry that speaks Confluent's REST API.
//!
//! Subjects follow `TopicNameStrategy` (`<topic>-key`, `<topic>-value`, the
//! default) or `RecordNameStrategy` (the record's full name). A schema is
//! registered once per subject (`POST /subjects/{subject}/versions`, which returns
//! the existing id when the registry has the schema already) and its id kept.
//!
//! Failures are classed as everywhere else: a registry that cannot be reached or
//! answers 5xx is transient (retried with backoff, up to `sink.delivery_timeout_ms`);
//! a refusal (409 incompatible: the body's `error_code` is 409 or 40901 by version;
//! 422 invalid; 401/403) is definite and named, with the subject.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

use crate::setting::{ConfigError, SecretRef, invalid};

/// A Confluent-compatible schema registry: Avro messages in Confluent's wire format (a
/// magic byte and the schema's id before the datum).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistrySettings {
    /// `http://host:8081` or `https://…`.
    pub url: String,
    /// Basic authentication: the user (Confluent Cloud: the API key).
    #[serde(default)]
    pub username: Option<String>,
    /// Basic authentication: the password (Confluent Cloud: the API secret).
    #[serde(default)]
    pub password: SecretRef,
    /// A PEM file of certificate authorities to trust beside the system's.
    #[serde(default)]
    pub ca_location: Option<std::path::PathBuf>,
    /// How subjects are named.
    #[serde(default)]
    pub subject_name_strategy: SubjectNameStrategy,
    /// How long one request may take, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    #[schemars(range(min = 1))]
    pub request_timeout_ms: u64,
}

fn default_timeout_ms() -> u64 {
    10_000
}

/// How a subject is named.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SubjectNameStrategy {
    /// `<topic>-key` and `<topic>-value` (Confluent's `TopicNameStrategy`).
    #[default]
    Topic,
    /// The record's full name (Confluent's `RecordNameStrategy`).
    Record,
}

impl SchemaRegistrySettings {
    /// Checks what can be checked before connecting; errors name the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.trim();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid(
                "sink.schema_registry.url",
                "must start with http:// or https:// (for example http://localhost:8081)",
            ));
        }
        if self.password.is_set() && self.username.is_none() {
            return Err(invalid(
                "sink.schema_registry.username",
                "a password is set without a username: set both for basic authentication",
            ));
        }
        if self.request_timeout_ms == 0 {
            return Err(invalid(
                "sink.schema_registry.request_timeout_ms",
                "must be more than 0",
            ));
        }
        Ok(())
    }

    /// The subject of a schema: the topic's (`key` or `value`), or the record's name.
    pub fn subject(&self, topic: &str, part: Part, record_name: &str) -> String {
        match self.subject_name_strategy {
            SubjectNameStrategy::Topic => format!("{topic}-{}", part.as_str()),
            SubjectNameStrategy::Record => record_name.to_owned(),
        }
    }
}

/// The part of a record a schema describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Key,
    Value,
}

impl Part {
    fn as_str(self) -> &'static str {
        match self {
            Part::Key => "key",
            Part::Value => "value",
        }
    }
}

/// Why a schema has no id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Worth trying again: no answer, a connection refused, a 5xx.
    #[error("schema registry {url}: {reason}")]
    Transient { url: String, reason: String },
    /// A refusal that repeats: incompatible, invalid, not authorized.
    #[error("schema registry {url} refused the schema of subject {subject}: {reason}")]
    Refused {
        url: String,
        subject: String,
        reason: String,
    },
    #[error("sink.schema_registry: {0}")]
    Setting(String),
}

impl RegistryError {
    pub fn is_transient(&self) -> bool {
        matches!(self, RegistryError::Transient { .. })
    }
}

/// A registry client with the ids it has learnt.
#[derive(Debug)]
pub struct SchemaRegistry {
    client: reqwest::Client,
    url: String,
    username: Option<String>,
    password: Option<crate::setting::Sensitive>,
    pub settings: SchemaRegistrySettings,
    /// `(subject, schema)` → id.
    ids: HashMap<(String, String), u32>,
    /// Requests made (for tests: ids are cached).
    pub requests: u64,
}

impl SchemaRegistry {
    /// A client for `settings`, the password read.
    pub fn new(settings: &SchemaRegistrySettings) -> Result<Self, RegistryError> {
        settings
            .validate()
            .map_err(|e| RegistryError::Setting(e.to_string()))?;
        let password = if settings.password.is_set() {
            Some(
                settings
                    .password
                    .resolve("sink.schema_registry.password")
                    .map(crate::setting::Sensitive::new)
                    .map_err(|e| RegistryError::Setting(e.to_string()))?,
            )
        } else {
            None
        };
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_millis(settings.request_timeout_ms))
            .connect_timeout(Duration::from_millis(
                settings.request_timeout_ms.min(5_000),
            ));
        if let Some(path) = &settings.ca_location {
            let pem = std::fs::read(path).map_err(|e| {
                RegistryError::Setting(format!("ca_location {}: {e}", path.display()))
            })?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                RegistryError::Setting(format!(
                    "ca_location {}: not PEM certificates: {e}",
                    path.display()
                ))
            })?;
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let client = builder
            .build()
            .map_err(|e| RegistryError::Setting(format!("cannot build the HTTP client: {e}")))?;
        Ok(SchemaRegistry {
            client,
            url: settings.url.trim().trim_end_matches('/').to_owned(),
            username: settings.username.clone(),
            password,
            settings: settings.clone(),
            ids: HashMap::new(),
            requests: 0,
        })
    }

    /// The id of `schema` (Avro schema JSON) under `subject`: from the cache, or
    /// registered (the registry answers an existing schema's id).
    pub async fn id(&mut self, subject: &str, schema: &str) -> Result<u32, RegistryError> {
        let cache_key = (subject.to_owned(), schema.to_owned());
        if let Some(id) = self.ids.get(&cache_key) {
            return Ok(*id);
        }
        let id = self.register(subject, schema).await?;
        self.ids.insert(cache_key, id);
        Ok(id)
    }

    /// Whether the registry answers and takes the login: `GET /subjects`, the
    /// number of subjects.
    pub async fn probe(&mut self) -> Result<usize, RegistryError> {
        let request = self.client.get(format!("{}/subjects", self.url));
        let (status, text) = self.send(request).await?;
        let transient = |reason: String| RegistryError::Transient {
            url: self.url.clone(),
            reason,
        };
        if status.is_success() {
            let subjects: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
            return Ok(subjects.len());
        }
        let refused = |reason: String| RegistryError::Refused {
            url: self.url.clone(),
            subject: "(any)".into(),
            reason,
        };
        Err(match status.as_u16() {
            401 | 403 => refused(format!("not authorized ({status})")),
            s if s >= 500 => transient(format!("{status}: {}", short(&text))),
            _ => refused(format!("{status}: {}", short(&text))),
        })
    }

    async fn register(&mut self, subject: &str, schema: &str) -> Result<u32, RegistryError> {
        self.requests += 1;
        let endpoint = format!("{}/subjects/{}/versions", self.url, encode_path(subject));
        let body = serde_json::json!({ "schema": schema }).to_string();
        let request = self
            .client
            .post(&endpoint)
            .header("Content-Type", "application/vnd.schemaregistry.v1+json")
            .body(body);
        let (status, text) = self.send(request).await?;
        let transient = |reason: String| RegistryError::Transient {
            url: self.url.clone(),
            reason,
        };
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if status.is_success() {
            return answer
                .get("id")
                .and_then(serde_json::Value::as_u64)
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| transient(format!("an answer without an id: {}", short(&text))));
        }
        let message = answer
            .get("message")
            .and_then(serde_json::Value::as_str)
            .map_or_else(|| short(&text), str::to_owned);
        let code = answer.get("error_code").and_then(serde_json::Value::as_i64);
        let refused = |reason: String| RegistryError::Refused {
            url: self.url.clone(),
            subject: subject.to_owned(),
            reason,
        };
        Err(match status.as_u16() {
            409 => refused(format!(
                "incompatible with the subject's earlier versions under its compatibility setting (error {}): {message}; change the subject's compatibility or use a new subject",
                code.unwrap_or(409)
            )),
            422 => refused(format!(
                "an invalid schema (error {}): {message}",
                code.unwrap_or(422)
            )),
            401 | 403 => refused(format!(
                "not authorized ({status}): check sink.schema_registry.username and password"
            )),
            404 => refused(format!(
                "not found ({status}): check sink.schema_registry.url: {message}"
            )),
            s if s >= 500 || s == 408 || s == 429 => transient(format!("{status}: {message}")),
            _ => refused(format!("{status}: {message}")),
        })
    }
}

impl SchemaRegistry {
    /// Sends `request` with the registry's `Accept` and the login: the status and
    /// the body's text, or a transient error when nothing answered. The error's
    /// text leaves the URL out (the error's own prefix says it once), and
    /// reqwest's never carries the password.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(reqwest::StatusCode, String), RegistryError> {
        let mut request = request.header(
            "Accept",
            "application/vnd.schemaregistry.v1+json, application/json",
        );
        if let Some(user) = &self.username {
            request = request.basic_auth(user, self.password.as_ref().map(|p| p.expose()));
        }
        let transient = |what: &str, e: reqwest::Error| RegistryError::Transient {
            url: self.url.clone(),
            reason: format!("{what}: {}", without_url(&e)),
        };
        let response = request
            .send()
            .await
            .map_err(|e| transient("no answer", e))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| transient("reading the answer", e))?;
        Ok((status, text))
    }
}

/// The Confluent wire format: magic byte 0, the id big-endian, the datum.
pub fn wire_format(id: u32, datum: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + datum.len());
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(datum);
    out
}

/// A subject in a URL path: everything but unreserved characters escaped.
fn encode_path(subject: &str) -> String {
    let mut out = String::with_capacity(subject.len());
    for b in subject.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text
            .replace(&format!(" for url ({})", url.as_str()), "")
            .replace(url.as_str(), "");
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn short(text: &str) -> String {
    text.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_format_is_magic_byte_id_datum() {
        assert_eq!(wire_format(258, b"xy"), vec![0, 0, 0, 1, 2, b'x', b'y']);
        assert_eq!(encode_path("ces-value"), "ces-value");
        assert_eq!(encode_path("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn settings_are_checked_by_name() {
        let good = SchemaRegistrySettings {
            url: "http://localhost:8081".into(),
            username: None,
            password: SecretRef::default(),
            ca_location: None,
            subject_name_strategy: SubjectNameStrategy::Topic,
            request_timeout_ms: 10_000,
        };
        assert_eq!(good.validate(), Ok(()));
        assert_eq!(good.subject("ces", Part::Value, "ChangeEvent"), "ces-value");
        let record = SchemaRegistrySettings {
            subject_name_strategy: SubjectNameStrategy::Record,
            ..good.clone()
        };
        assert_eq!(record.subject("ces", Part::Key, "a.b.Key"), "a.b.Key");
        let bad = SchemaRegistrySettings {
            url: "localhost:8081".into(),
            ..good.clone()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .starts_with("sink.schema_registry.url")
        );
        let no_user = SchemaRegistrySettings {
            password: SecretRef {
                env: Some("X".into()),
                file: None,
            },
            ..good
        };
        assert!(
            no_user
                .validate()
                .unwrap_err()
                .to_string()
                .contains("username")
        );
    }
}

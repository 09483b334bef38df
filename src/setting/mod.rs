//! The primitives every stage's settings are made of: the error that names a
//! setting, secrets that are read from the environment or a file and never echoed,
//! and durations written in milliseconds.
//!
//! This module depends on nothing of the crate: each stage keeps its own section of
//! the configuration beside its code (`sink::settings`, `event::settings`, …) and
//! builds it from these, and the `config` module composes the sections into the
//! file a user writes.

use std::path::PathBuf;

use serde::Deserialize;

/// A configuration that cannot be used, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration file {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("configuration: {0}")]
    Parse(String),
    #[error("{setting}: {reason}")]
    Invalid { setting: String, reason: String },
    #[error("{setting}: the secret is missing: {reason}")]
    MissingSecret { setting: String, reason: String },
}

/// What to do about a failed file operation on the path `setting` names, and
/// whether a restart helps: a missing directory or a refused write needs a change,
/// a full disk needs space and then resumes. `None` when the error says enough.
pub fn file_error_advice(
    setting: &str,
    path: &std::path::Path,
    error: &std::io::Error,
) -> Option<String> {
    use std::io::ErrorKind as K;
    let directory = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| ".".to_owned(), |p| p.display().to_string());
    Some(match error.kind() {
        K::NotFound if !std::path::Path::new(&directory).is_dir() => format!(
            "the directory {directory} does not exist: create it, or set {setting} to a path in one that does (a restart repeats this)"
        ),
        K::PermissionDenied | K::ReadOnlyFilesystem => format!(
            "this user may not write in {directory}: make it writable, or set {setting} elsewhere (a restart repeats this)"
        ),
        K::StorageFull | K::QuotaExceeded => format!(
            "the disk holding {directory} is full: free space, and a restart resumes from the last checkpoint"
        ),
        _ => return None,
    })
}

/// Prefix of the environment variables that set settings.
pub const ENV_PREFIX: &str = "MSSQL_CES__";

/// The environment variable that sets `setting` (`source.connection_string` →
/// `MSSQL_CES__SOURCE__CONNECTION_STRING`); for a secret, it holds the secret.
pub fn setting_variable(setting: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        setting.to_ascii_uppercase().replace('.', "__")
    )
}

pub(crate) fn invalid(setting: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        setting: setting.to_owned(),
        reason: reason.into(),
    }
}

/// A secret's value once read: its `{:?}` never shows it, and it is had only by
/// asking for it ([`expose`](Self::expose)).
#[derive(Clone, PartialEq, Eq)]
pub struct Sensitive(String);

impl Sensitive {
    pub fn new(value: impl Into<String>) -> Self {
        Sensitive(value.into())
    }

    /// The secret itself: for the client that sends it, never for a message.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where a secret comes from: an environment variable or a file, never the config.
///
/// Its deserializer never echoes what it was given: a secret written where
/// `{ env = … }` was expected is refused with a message that names the setting's
/// form, not the value (serde's own message would quote it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretRef {
    /// Name of the environment variable that holds the secret.
    pub env: Option<String>,
    /// Path of a file whose content (trimmed) is the secret.
    pub file: Option<PathBuf>,
}

impl schemars::JsonSchema for SecretRef {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SecretRef".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A secret, never written in the configuration itself: `{ env = \"VARIABLE\" }` names an environment variable that holds it, `{ file = \"/path\" }` a file whose content (trimmed) is it.",
            "type": "object",
            "properties": {
                "env": { "type": "string" },
                "file": { "type": "string" }
            },
            "additionalProperties": false,
            "x-secret": true
        })
    }
}

impl<'de> Deserialize<'de> for SecretRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        const EXPECTED: &str = "{ env = \"VARIABLE\" } or { file = \"/path\" }; a secret is never written in the configuration itself";
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = SecretRef;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SecretRef, A::Error> {
                let mut secret = SecretRef::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "env" => {
                            let name: String = map.next_value()?;
                            if !plausible_reference(&name) {
                                return Err(serde::de::Error::custom(NOT_A_NAME));
                            }
                            secret.env = Some(name);
                        }
                        "file" => {
                            let path: String = map.next_value()?;
                            if !plausible_reference(&path) {
                                return Err(serde::de::Error::custom(NOT_A_PATH));
                            }
                            secret.file = Some(PathBuf::from(path));
                        }
                        other => {
                            return Err(serde::de::Error::custom(format!(
                                "unknown field `{other}`, expected `env` or `file`"
                            )));
                        }
                    }
                }
                Ok(secret)
            }
        }
        // Anything but a table (a string, a number…) is refused without its value,
        // and so is a name or path that may be a secret pasted in the wrong place.
        deserializer
            .deserialize_any(Visitor)
            .map_err(|e: D::Error| {
                let text = e.to_string();
                let ours = [NOT_A_NAME, NOT_A_PATH].iter().find(|m| text.contains(**m));
                serde::de::Error::custom(match ours {
                    Some(message) => (*message).to_owned(),
                    None => format!("expected {EXPECTED}"),
                })
            })
    }
}

/// What an `env` that is no variable name is told (without its value).
const NOT_A_NAME: &str = "`env` is not an environment variable's name (letters, digits, `_`, `.`, `-`, `/`, `@`, `+`, `:`; at most 255 characters), so what was given is not shown: if it is the secret itself, put it in a variable and name that variable here";
/// What a `file` that is no plausible path is told (without its value).
const NOT_A_PATH: &str = "`file` is not a plausible path (letters, digits, `_`, `.`, `-`, `/`, `@`, `+`, `:`, `~`; at most 255 characters), so what was given is not shown: if it is the secret itself, put it in a file and name that file here";

/// Whether `text` can be a variable name or a path rather than a secret or a
/// connection string pasted in its place: short, and only `[A-Za-z0-9_./-]` and the
/// `@+:~` of paths such as systemd's credentials (`/run/credentials/unit@x.service/`).
/// Anything else — `;` and `=` of a connection string, spaces, quotes — is refused
/// without being echoed.
fn plausible_reference(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 255
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./-@+:~".contains(&b))
}

impl SecretRef {
    /// Whether it names a place to read the secret from.
    pub fn is_set(&self) -> bool {
        self.env.is_some() || self.file.is_some()
    }

    /// Reads the secret. The error names `setting` and where it looked, never a value.
    pub fn resolve(&self, setting: &str) -> Result<String, ConfigError> {
        let missing = |reason: String| ConfigError::MissingSecret {
            setting: setting.to_owned(),
            reason,
        };
        match (&self.env, &self.file) {
            (Some(var), None) => std::env::var(var)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| missing(format!("environment variable {var} is not set"))),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .map_err(|e| missing(format!("cannot read {}: {e}", path.display()))),
            (Some(_), Some(_)) => Err(invalid(setting, "give either `env` or `file`, not both")),
            (None, None) => Err(missing(format!(
                "set the environment variable {} to it, or in the file {setting} = {{ env = \"NAME\" }} or {{ file = \"/path\" }}",
                setting_variable(setting)
            ))),
        }
    }
}

pub mod de;

/// Milliseconds in the file (`…_ms = 30000`), a [`Duration`] in the program.
pub mod millis {
    use serde::Deserialize as _;
    use std::time::Duration;

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }

    /// The same form back (the settings' JSON Schema shows defaults with it).
    pub fn serialize<S: serde::Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Holder {
        #[allow(dead_code)]
        secret: SecretRef,
    }

    fn parse(text: &str) -> Result<SecretRef, String> {
        toml::from_str::<toml::Table>(text)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                toml::Value::Table(t)
                    .try_into::<Holder>()
                    .map(|h| h.secret)
                    .map_err(|e| e.to_string())
            })
    }

    /// A secret pasted where a variable name or a path belongs is refused, and the
    /// message never holds it; names and paths as people write them pass.
    #[test]
    fn a_secret_in_place_of_a_name_or_path_is_refused_without_echo() {
        for pasted in [
            "Server=tcp:db,1433;User Id=sa;Password=HUNTER2secret",
            "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKey=HUNTER2secret",
            "HUNTER2 secret with spaces",
            "",
        ] {
            for key in ["env", "file"] {
                let error = parse(&format!("secret = {{ {key} = {pasted:?} }}")).unwrap_err();
                assert!(error.contains(&format!("`{key}` is not")), "{error}");
                if !pasted.is_empty() {
                    assert!(!error.contains("HUNTER2"), "{error}");
                }
            }
        }
        let long = "A".repeat(256);
        assert!(parse(&format!("secret = {{ env = {long:?} }}")).is_err());
        let ok =
            parse(r#"secret = { file = "/run/credentials/mssql-ces@prod.service/cs" }"#).unwrap();
        assert!(ok.is_set(), "systemd credentials of a template unit");
        let ok = parse(r#"secret = { env = "MSSQL_CES__SOURCE__CONNECTION_STRING" }"#).unwrap();
        assert_eq!(
            ok.env.as_deref(),
            Some("MSSQL_CES__SOURCE__CONNECTION_STRING")
        );
        let ok =
            parse(r#"secret = { file = "/run/secrets/mssql-ces.connection_string" }"#).unwrap();
        assert_eq!(
            ok.file,
            Some(PathBuf::from("/run/secrets/mssql-ces.connection_string"))
        );
        let ok = parse(&format!("secret = {{ env = {:?} }}", "A".repeat(255))).unwrap();
        assert!(ok.is_set());
    }
}

//! `[event]`: how changes are encoded.

use serde::Deserialize;
use uuid::Uuid;

use super::columns::{ColumnRuleSetting, ColumnRules};
use super::debezium::DebeziumSettings;
use super::{Encoding, FinalEventMode, MessageSizeLimit};
use crate::setting::{ConfigError, SecretRef};

/// `[event]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    /// `"json"` (default) or `"avro"`.
    #[serde(default = "default_encoding")]
    pub encoding: Encoding,
    /// `"last_in_transaction"` (default) or `"always_false"` (CES's behaviour).
    #[serde(default)]
    pub final_event: FinalEventMode,
    /// Largest message in KiB, 128–1024 (default 256, as CES).
    #[serde(default)]
    pub max_message_size_kb: MessageSizeLimit,
    /// Stream GUID in `logicalid` and ids; default: the database GUID.
    #[serde(default)]
    pub stream_guid: Option<Uuid>,
    /// `"ces"` (default) or `"debezium"`.
    #[serde(default)]
    pub format: EventFormat,
    /// `[event.debezium]`: the Debezium envelope's settings.
    #[serde(default)]
    pub debezium: DebeziumSettings,
    /// `[[event.columns]]`: which columns leave the database, and how.
    #[serde(default)]
    pub columns: Vec<ColumnRuleSetting>,
    /// The secret key of `mask = "hash"` rules.
    #[serde(default)]
    pub hash_key: SecretRef,
    /// Whether a run may start with `[[event.columns]]` rules that match no column
    /// of an included table (default false: it refuses, naming them, since a
    /// misspelt rule would let a column out as it is). With `source.databases`,
    /// a rule may belong to another database's tables: it is then said, not refused.
    #[serde(default)]
    pub allow_unmatched_column_rules: bool,
}

/// `event.format`: which envelope events have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventFormat {
    /// CES's CloudEvents (the default, byte-exact).
    #[default]
    Ces,
    /// Debezium's SQL Server connector's envelope ([`crate::event::debezium`]).
    Debezium,
}

impl EventSettings {
    /// The column rules, with the hash key read when a rule needs it.
    pub fn column_rules(&self) -> Result<ColumnRules, ConfigError> {
        ColumnRules::new(&self.columns, &self.hash_key)
    }
}

impl Default for EventSettings {
    fn default() -> Self {
        EventSettings {
            encoding: default_encoding(),
            final_event: FinalEventMode::default(),
            max_message_size_kb: MessageSizeLimit::default(),
            stream_guid: None,
            format: EventFormat::default(),
            debezium: DebeziumSettings::default(),
            columns: Vec::new(),
            hash_key: SecretRef::default(),
            allow_unmatched_column_rules: false,
        }
    }
}

fn default_encoding() -> Encoding {
    Encoding::Json
}

//! `[event]`: how changes are encoded.

use serde::Deserialize;
use uuid::Uuid;

use super::columns::{ColumnRuleSetting, ColumnRules};
use super::debezium::DebeziumSettings;
use super::{Encoding, FinalEventMode, MessageSizeLimit};
use crate::setting::{ConfigError, SecretRef};

/// How changes are encoded: the envelope, its encoding, and which column values leave
/// the database.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    /// How events are serialized.
    #[serde(default = "default_encoding")]
    pub encoding: Encoding,
    /// What `finalevent` says.
    #[serde(default)]
    pub final_event: FinalEventMode,
    /// The largest message in KiB, the whole message, envelope included: a larger event
    /// is split into segments, as CES splits it. CES only: a Debezium record is bounded
    /// by the destination ([Formats](formats.md#debeziums-envelope)).
    #[serde(default)]
    pub max_message_size_kb: MessageSizeLimit,
    /// The GUID in `logicalid` and in message ids; unset: the database's GUID.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub stream_guid: Option<Uuid>,
    /// Which envelope events have.
    #[serde(default)]
    pub format: EventFormat,
    /// Debezium's envelope.
    #[serde(default)]
    pub debezium: DebeziumSettings,
    /// [Column rules](formats.md#which-columns-leave-the-database): which columns leave
    /// the database, and in what form. The first rule that matches a column decides.
    #[serde(default)]
    pub columns: Vec<ColumnRuleSetting>,
    /// The secret key of `mask = "hash"` column rules, at least 16 bytes. Keep it:
    /// another key gives other hashes.
    #[serde(default)]
    pub hash_key: SecretRef,
    /// Whether a run may start with a column rule that matches no column of an included
    /// table. By default it refuses, naming the rule (exit 2): a misspelt rule would
    /// let the column out as it is. With `source.databases` such a rule is only warned
    /// of, since it may belong to another database's tables.
    #[serde(default)]
    pub allow_unmatched_column_rules: bool,
}

/// `event.format`: which envelope events have.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum EventFormat {
    /// CES's CloudEvents, byte-exact.
    #[default]
    Ces,
    /// [Debezium's envelope](formats.md#debeziums-envelope) of its SQL Server
    /// connector.
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

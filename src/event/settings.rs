//! `[event]`: how changes are encoded.

use serde::Deserialize;
use uuid::Uuid;

use super::{Encoding, FinalEventMode, MessageSizeLimit};

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
}

impl Default for EventSettings {
    fn default() -> Self {
        EventSettings {
            encoding: default_encoding(),
            final_event: FinalEventMode::default(),
            max_message_size_kb: MessageSizeLimit::default(),
            stream_guid: None,
        }
    }
}

fn default_encoding() -> Encoding {
    Encoding::Json
}

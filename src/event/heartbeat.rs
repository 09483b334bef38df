//! The heartbeat record (`sink.heartbeat_interval_ms`): a small JSON object on a
//! topic of its own, sent every interval whether or not anything changed, so a
//! consumer or a monitor can tell a quiet stream from a dead one and see where it
//! stands. It is not a CES event and carries no row.
//!
//! `{"type":"mssql-ces.heartbeat","stream":"…","database":"…","time":"…",`
//! `"max_lsn":"…","last_event":{"commit_lsn":"…","sequence_number":n}}`: the stream
//! (`checkpoint.stream_name`, also the record's key), the database (null before the
//! first batch says), when it was sent (UTC), the database's `max_lsn` the stream has
//! read through, and the last event sent before it (null when none yet).

use chrono::{DateTime, Utc};

use crate::lsn::Lsn;
use crate::position::EventPosition;

/// The `type` a heartbeat record carries.
pub const HEARTBEAT_TYPE: &str = "mssql-ces.heartbeat";

/// One heartbeat record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub stream: String,
    pub database: Option<String>,
    pub time: DateTime<Utc>,
    pub max_lsn: Lsn,
    pub last_event: Option<EventPosition>,
}

impl Heartbeat {
    /// The record's JSON.
    pub fn to_json(&self) -> Vec<u8> {
        let last_event = self.last_event.map(|e| {
            serde_json::json!({
                "commit_lsn": e.commit_lsn.to_string(),
                "sequence_number": e.sequence_number,
            })
        });
        serde_json::json!({
            "type": HEARTBEAT_TYPE,
            "stream": self.stream,
            "database": self.database,
            "time": crate::event::format_time(self.time),
            "max_lsn": self.max_lsn.to_string(),
            "last_event": last_event,
        })
        .to_string()
        .into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_record_says_the_stream_where_it_stands_and_when() {
        let beat = Heartbeat {
            stream: "orders".into(),
            database: Some("shop".into()),
            time: Utc.timestamp_millis_opt(1_790_000_000_123).unwrap(),
            max_lsn: Lsn::from_parts(0xB1, 0x8A8, 7),
            last_event: Some(EventPosition {
                commit_lsn: Lsn::from_parts(0xB1, 0x8A0, 2),
                sequence_number: 4,
            }),
        };
        let v: serde_json::Value = serde_json::from_slice(&beat.to_json()).unwrap();
        assert_eq!(v["type"], "mssql-ces.heartbeat");
        assert_eq!(v["stream"], "orders");
        assert_eq!(v["database"], "shop");
        assert_eq!(v["time"], "2026-09-21T14:13:20.123Z");
        assert_eq!(v["max_lsn"], "000000B1:000008A8:0007");
        assert_eq!(v["last_event"]["commit_lsn"], "000000B1:000008A0:0002");
        assert_eq!(v["last_event"]["sequence_number"], 4);
        let none = Heartbeat {
            database: None,
            last_event: None,
            ..beat
        };
        let v: serde_json::Value = serde_json::from_slice(&none.to_json()).unwrap();
        assert!(v["database"].is_null() && v["last_event"].is_null());
    }
}

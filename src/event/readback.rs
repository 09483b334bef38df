//! Reading CES messages back: decoding one message and reassembling segments.
//!
//! Feed [`Reassembler`] the messages of one ordered stream (one Kafka partition, one
//! file) in arrival order; it yields each logical event once its final segment has
//! arrived. Segments of one event are contiguous in such a stream (the sink sends them
//! to one partition, in order), so another event's segment arriving in the middle, a
//! gap in the indexes or a stream that ends mid-event are errors. What an at-least-once
//! producer does after a crash is not an error: it re-sends from its last checkpoint,
//! so a partial event is followed by segment 0 of the same event, or of an earlier one
//! (a position — commit LSN, then sequence number, from the `logicalid` — at or before
//! the partial one). The partial event is dropped ([`Reassembler::abandoned`] counts
//! it) and assembly starts again.

use apache_avro::types::Value as AvroValue;
use serde::Deserialize;

use super::{Encoding, avro};

/// One decoded message: the 11 CloudEvent attributes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudEvent {
    pub specversion: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub source: String,
    pub id: String,
    pub logicalid: String,
    pub time: String,
    pub datacontenttype: String,
    pub operation: String,
    pub segmentindex: u32,
    pub finalsegment: bool,
    /// JSON: the UTF-8 bytes of the `data` string; Avro: the `data` bytes.
    #[serde(deserialize_with = "string_as_bytes")]
    pub data: Vec<u8>,
}

fn string_as_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    String::deserialize(d).map(String::into_bytes)
}

/// A whole event rebuilt from its segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalEvent {
    /// The attributes of the first segment, with `data` replaced by the whole data.
    pub event: CloudEvent,
    /// Ids of the segments, in order.
    pub segment_ids: Vec<String>,
}

impl LogicalEvent {
    /// The Data record as JSON, whichever the encoding.
    pub fn data_json(&self, encoding: Encoding) -> Result<serde_json::Value, ReadError> {
        decode_data(&self.event.data, encoding)
    }
}

/// Why messages could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    #[error("message is not a CES JSON event: {reason}")]
    Json { reason: String },
    #[error("message is not a CES Avro event: {reason}")]
    Avro { reason: String },
    #[error("{logicalid}: expected segment {expected}, got segment {found} (a segment is missing)")]
    SegmentGap {
        logicalid: String,
        expected: u32,
        found: u32,
    },
    #[error(
        "{open}: segment {found_index} of another event ({found}) arrived before its final segment"
    )]
    Interleaved {
        open: String,
        found: String,
        found_index: u32,
    },
    #[error("{logicalid}: segment {index} has a different `{attribute}` than segment 0")]
    Inconsistent {
        logicalid: String,
        index: u32,
        attribute: &'static str,
    },
    #[error("{logicalid}: the stream ended after {received} segment(s), before the final one")]
    Incomplete { logicalid: String, received: u32 },
}

/// Decodes one message in the given encoding.
pub fn decode_message(bytes: &[u8], encoding: Encoding) -> Result<CloudEvent, ReadError> {
    match encoding {
        Encoding::Json => decode_json_message(bytes),
        Encoding::Avro => decode_avro_message(bytes),
    }
}

/// Decodes one JSON (structured-mode) message.
pub fn decode_json_message(bytes: &[u8]) -> Result<CloudEvent, ReadError> {
    if bytes.starts_with(br#"{"topic":"#) || bytes.starts_with(br#"{"schema":"#) {
        return Err(ReadError::Json {
            reason: "it is a Debezium record (event.format = \"debezium\"); `read` decodes CES events: read Debezium records with a Kafka Connect JSON reader, or jq".into(),
        });
    }
    serde_json::from_slice(bytes).map_err(|e| ReadError::Json {
        reason: e.to_string(),
    })
}

/// Decodes one Avro message (a raw `ChangeEvent` datum).
pub fn decode_avro_message(bytes: &[u8]) -> Result<CloudEvent, ReadError> {
    let avro_err = |reason: String| ReadError::Avro { reason };
    let schema = avro::change_event_schema().map_err(|e| avro_err(e.to_string()))?;
    // Written with [sink.schema_registry]: the Confluent wire format's magic byte
    // and schema id come first (a CES datum starts with `specversion`'s length,
    // never 0).
    let bytes = match bytes {
        [0, _, _, _, _, datum @ ..] => datum,
        other => other,
    };
    let mut reader = bytes;
    let value = avro::read_datum(schema, &mut reader).map_err(|e| avro_err(e.to_string()))?;
    if !reader.is_empty() {
        return Err(avro_err(format!("{} bytes after the datum", reader.len())));
    }
    let AvroValue::Record(fields) = value else {
        return Err(avro_err("not a record".into()));
    };
    let mut event = CloudEvent {
        specversion: String::new(),
        event_type: String::new(),
        source: String::new(),
        id: String::new(),
        logicalid: String::new(),
        time: String::new(),
        datacontenttype: String::new(),
        operation: String::new(),
        segmentindex: 0,
        finalsegment: false,
        data: Vec::new(),
    };
    for (name, value) in fields {
        let target = match name.as_str() {
            "specversion" => &mut event.specversion,
            "type" => &mut event.event_type,
            "source" => &mut event.source,
            "id" => &mut event.id,
            "logicalid" => &mut event.logicalid,
            "time" => &mut event.time,
            "datacontenttype" => &mut event.datacontenttype,
            "operation" => &mut event.operation,
            _ => {
                match (name.as_str(), value) {
                    ("segmentindex", AvroValue::Int(i)) => {
                        event.segmentindex = u32::try_from(i)
                            .map_err(|_| avro_err(format!("segmentindex {i} is negative")))?;
                    }
                    ("finalsegment", AvroValue::Boolean(b)) => event.finalsegment = b,
                    ("data", AvroValue::Bytes(b)) => event.data = b,
                    (other, _) => return Err(avro_err(format!("unexpected field `{other}`"))),
                }
                continue;
            }
        };
        match value {
            AvroValue::String(s) => *target = s,
            _ => return Err(avro_err(format!("`{name}` is not a string"))),
        }
    }
    Ok(event)
}

/// Decodes a whole `data` payload of a CES change event into JSON.
pub fn decode_data(data: &[u8], encoding: Encoding) -> Result<serde_json::Value, ReadError> {
    decode_data_of(super::EVENT_TYPE, data, encoding)
}

/// Decodes a whole `data` payload of an event of `event_type` into JSON: a
/// schema-change event's Avro datum is of its own schema, any other of CES's `Data`.
pub fn decode_data_of(
    event_type: &str,
    data: &[u8],
    encoding: Encoding,
) -> Result<serde_json::Value, ReadError> {
    match encoding {
        Encoding::Json => serde_json::from_slice(data).map_err(|e| ReadError::Json {
            reason: format!("data: {e}"),
        }),
        Encoding::Avro => {
            let avro_err = |reason: String| ReadError::Avro { reason };
            let schema = if event_type == super::schema_change::SCHEMA_CHANGE_TYPE {
                super::schema_change::schema_change_schema()
            } else {
                avro::data_schema()
            }
            .map_err(|e| avro_err(e.to_string()))?;
            let mut reader = data;
            let value = avro::read_datum(schema, &mut reader)
                .map_err(|e| avro_err(format!("data: {e}")))?;
            if !reader.is_empty() {
                return Err(avro_err(format!(
                    "data: {} bytes after the datum",
                    reader.len()
                )));
            }
            serde_json::Value::try_from(value).map_err(|e| avro_err(format!("data: {e}")))
        }
    }
}

/// Rebuilds logical events from the messages of one ordered stream.
#[derive(Debug, Default)]
pub struct Reassembler {
    open: Option<LogicalEvent>,
    abandoned: usize,
}

/// `(commit LSN, sequence number)` of a `logicalid`, comparable in commit order.
pub(crate) fn position(logicalid: &str) -> Option<(&str, &str)> {
    let mut parts = logicalid.rsplitn(3, ':');
    let sequence = parts.next()?;
    let lsn = parts.next()?;
    // Both are fixed-width (20 hex digits, 20 decimal digits): text order is order.
    Some((lsn, sequence))
}

impl Reassembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next message; returns the logical event it completes, if any.
    pub fn push(&mut self, message: CloudEvent) -> Result<Option<LogicalEvent>, ReadError> {
        let open = match self.open.take() {
            None => {
                if message.segmentindex != 0 {
                    return Err(ReadError::SegmentGap {
                        logicalid: message.logicalid,
                        expected: 0,
                        found: message.segmentindex,
                    });
                }
                return Ok(self.start(message));
            }
            Some(open) => open,
        };
        if message.logicalid != open.event.logicalid {
            let resent = message.segmentindex == 0
                && matches!(
                    (position(&message.logicalid), position(&open.event.logicalid)),
                    (Some(new), Some(partial)) if new <= partial
                );
            if resent {
                // A producer restarted from a checkpoint before the partial event.
                self.abandoned += 1;
                return Ok(self.start(message));
            }
            return Err(ReadError::Interleaved {
                open: open.event.logicalid,
                found: message.logicalid,
                found_index: message.segmentindex,
            });
        }
        if message.segmentindex == 0 {
            // The producer re-sent the event from its start (at-least-once delivery).
            self.abandoned += 1;
            return Ok(self.start(message));
        }
        let mut open = open;
        let expected = u32::try_from(open.segment_ids.len()).unwrap_or(u32::MAX);
        if message.segmentindex != expected {
            return Err(ReadError::SegmentGap {
                logicalid: message.logicalid,
                expected,
                found: message.segmentindex,
            });
        }
        let inconsistent = |attribute| ReadError::Inconsistent {
            logicalid: message.logicalid.clone(),
            index: message.segmentindex,
            attribute,
        };
        let first = &open.event;
        for (attribute, same) in [
            ("specversion", first.specversion == message.specversion),
            ("type", first.event_type == message.event_type),
            ("source", first.source == message.source),
            ("time", first.time == message.time),
            (
                "datacontenttype",
                first.datacontenttype == message.datacontenttype,
            ),
            ("operation", first.operation == message.operation),
        ] {
            if !same {
                return Err(inconsistent(attribute));
            }
        }
        open.event.data.extend_from_slice(&message.data);
        open.segment_ids.push(message.id);
        if message.finalsegment {
            open.event.finalsegment = true;
            Ok(Some(open))
        } else {
            self.open = Some(open);
            Ok(None)
        }
    }

    fn start(&mut self, message: CloudEvent) -> Option<LogicalEvent> {
        let complete = message.finalsegment;
        let event = LogicalEvent {
            segment_ids: vec![message.id.clone()],
            event: message,
        };
        if complete {
            Some(event)
        } else {
            self.open = Some(event);
            None
        }
    }

    /// Whether an event is waiting for more segments.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Partial events dropped because the producer re-sent from an earlier point.
    pub fn abandoned(&self) -> usize {
        self.abandoned
    }

    /// Ends the stream: an event still waiting for segments is an error.
    pub fn finish(self) -> Result<(), ReadError> {
        match self.open {
            None => Ok(()),
            Some(open) => Err(ReadError::Incomplete {
                received: u32::try_from(open.segment_ids.len()).unwrap_or(u32::MAX),
                logicalid: open.event.logicalid,
            }),
        }
    }
}

/// Decodes and reassembles a whole ordered stream of messages.
pub fn reassemble<'a>(
    messages: impl IntoIterator<Item = &'a [u8]>,
    encoding: Encoding,
) -> Result<Vec<LogicalEvent>, ReadError> {
    let mut reassembler = Reassembler::new();
    let mut events = Vec::new();
    for bytes in messages {
        if let Some(event) = reassembler.push(decode_message(bytes, encoding)?)? {
            events.push(event);
        }
    }
    reassembler.finish()?;
    Ok(events)
}

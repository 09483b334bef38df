//! Schema-change events: a CloudEvent of our own `type` that tells a consumer the
//! shape of a table's events — the capture instance they come from, the columns they
//! carry (CES's `cols`, with nullability and key place) — and, when it changed, the
//! shape before and the DDL that `cdc.ddl_history` recorded since the last one.
//!
//! CES has no such event; its consumers never see one unless they ask
//! (`sink.schema_changes`), and its `type`
//! ([`SCHEMA_CHANGE_TYPE`]) is not CES's, so a consumer that reads only CES's type
//! can skip it. The envelope is CES's (the same eleven attributes, `operation`
//! [`SCHEMA_CHANGE_OPERATION`]), segmented by the same rules; `data` is JSON text or
//! an Avro datum of `schemas/SchemaChange.avsc`.
//!
//! Ids are deterministic: a function of the stream GUID, the table and its version
//! (and the segment), so a re-sent schema-change event has the id it had, and the
//! same bytes: everything in it comes from the checkpoint or from the change it
//! precedes.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{
    EncodedEvent, Encoder, Encoding, EnvelopeFields, EventError, MESSAGE_ID_NAMESPACE, Message,
    avro, format_time, json, segment,
};
use crate::lsn::Lsn;
use crate::position::TableShape;

/// `type` of a schema-change event.
pub const SCHEMA_CHANGE_TYPE: &str = "io.github.mssql-ces.SchemaChange.V1";
/// `operation` of a schema-change event (CES's are `INS`, `UPD`, `DEL`).
pub const SCHEMA_CHANGE_OPERATION: &str = "SCHEMA";
/// The `SchemaChange` Avro schema of `data`, as shipped.
pub const SCHEMA_CHANGE_SCHEMA: &str = include_str!("../../schemas/SchemaChange.avsc");

/// The parsed `SchemaChange` schema.
pub fn schema_change_schema() -> Result<&'static apache_avro::Schema, avro::SchemaError> {
    static CELL: std::sync::OnceLock<Result<apache_avro::Schema, String>> =
        std::sync::OnceLock::new();
    avro::parsed(&CELL, "SchemaChange.avsc", SCHEMA_CHANGE_SCHEMA)
}

/// Why a schema-change event was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaChangeReason {
    /// The table's current shape, before its first event this stream sends with
    /// schema-change events on: a consumer starting from an empty topic learns it.
    Initial,
    /// The shape changed: events from here carry the shape `after`.
    Changed,
}

impl SchemaChangeReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SchemaChangeReason::Initial => "initial",
            SchemaChangeReason::Changed => "changed",
        }
    }
}

/// A row of `cdc.ddl_history` a schema-change event carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdlRecord {
    pub command: String,
    pub lsn: Lsn,
    /// `ddl_time` in UTC.
    pub time: DateTime<Utc>,
}

/// One schema-change event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    pub database: String,
    pub schema: String,
    pub table: String,
    /// The table's version from this event on (1 for its first shape).
    pub version: u64,
    pub reason: SchemaChangeReason,
    /// The commit LSN of the first event of this shape (the event this one precedes).
    pub lsn: Lsn,
    /// Its commit time: the event's `time`.
    pub time: DateTime<Utc>,
    /// The shape before, as the previous schema-change event of the table described
    /// it; `None` for [`SchemaChangeReason::Initial`], or when that event was not
    /// sent (schema-change events were off, or a checkpoint from before them).
    pub before: Option<Arc<TableShape>>,
    pub after: Arc<TableShape>,
    /// DDL recorded for the table after the previous version's first event, up to
    /// this one's, in LSN order.
    pub ddl: Vec<DdlRecord>,
}

impl SchemaChange {
    /// `schema.table`.
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }

    /// The `data` object as JSON text: `eventsource` (db, schema, tbl),
    /// `tableversion`, `reason`, `lsn`, `time`, `before`, `after`, `ddl`.
    pub fn data_text(&self) -> String {
        #[derive(Serialize)]
        struct Source<'a> {
            db: &'a str,
            schema: &'a str,
            tbl: &'a str,
        }
        #[derive(Serialize)]
        struct Ddl<'a> {
            command: &'a str,
            lsn: String,
            time: String,
        }
        #[derive(Serialize)]
        struct Data<'a> {
            eventsource: Source<'a>,
            tableversion: u64,
            reason: &'static str,
            lsn: String,
            time: String,
            before: Option<&'a TableShape>,
            after: &'a TableShape,
            ddl: Vec<Ddl<'a>>,
        }
        let data = Data {
            eventsource: Source {
                db: &self.database,
                schema: &self.schema,
                tbl: &self.table,
            },
            tableversion: self.version,
            reason: self.reason.as_str(),
            lsn: self.lsn.to_colon_string(),
            time: format_time(self.time),
            before: self.before.as_deref(),
            after: &self.after,
            ddl: self
                .ddl
                .iter()
                .map(|d| Ddl {
                    command: &d.command,
                    lsn: d.lsn.to_colon_string(),
                    time: format_time(d.time),
                })
                .collect(),
        };
        // Strings, numbers, booleans and nulls only: serializing cannot fail.
        serde_json::to_string(&data).unwrap_or_default()
    }

    /// The `data` datum of `schemas/SchemaChange.avsc`.
    pub fn data_datum(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        avro::write_string(&mut out, &self.database);
        avro::write_string(&mut out, &self.schema);
        avro::write_string(&mut out, &self.table);
        avro::write_long(&mut out, i64::try_from(self.version).unwrap_or(i64::MAX));
        avro::write_string(&mut out, self.reason.as_str());
        avro::write_string(&mut out, &self.lsn.to_colon_string());
        avro::write_string(&mut out, &format_time(self.time));
        match &self.before {
            None => avro::write_long(&mut out, 0),
            Some(shape) => {
                avro::write_long(&mut out, 1);
                write_shape(&mut out, shape);
            }
        }
        write_shape(&mut out, &self.after);
        if !self.ddl.is_empty() {
            avro::write_long(&mut out, self.ddl.len() as i64);
            for d in &self.ddl {
                avro::write_string(&mut out, &d.command);
                avro::write_string(&mut out, &d.lsn.to_colon_string());
                avro::write_string(&mut out, &format_time(d.time));
            }
        }
        avro::write_long(&mut out, 0);
        out
    }

    /// `<stream GUID>:schema:<schema>.<table>:<version>:<LSN, 20 hex>:<20 zeros>`:
    /// distinct from every change event's, and ending like one (an LSN, then a
    /// sequence number no event has), so that a reader that orders events by the
    /// last two parts puts it before every event of its transaction.
    pub fn logical_id(&self, stream_guid: Uuid) -> String {
        let mut out = String::with_capacity(128);
        let mut buf = Uuid::encode_buffer();
        out.push_str(stream_guid.hyphenated().encode_lower(&mut buf));
        out.push_str(":schema:");
        out.push_str(&self.qualified_name());
        out.push(':');
        out.push_str(itoa::Buffer::new().format(self.version));
        out.push(':');
        crate::lsn::push_hex(&mut out, self.lsn.as_bytes());
        out.push_str(":00000000000000000000");
        out
    }
}

/// A [`TableShape`] as the `TableShape` record: captureinstance, then cols.
fn write_shape(out: &mut Vec<u8>, shape: &TableShape) {
    avro::write_string(out, &shape.capture_instance);
    if !shape.cols.is_empty() {
        avro::write_long(out, shape.cols.len() as i64);
        for c in &shape.cols {
            avro::write_string(out, &c.name);
            avro::write_string(out, &c.sql_type);
            avro::write_long(out, i64::from(c.index));
            match c.nullable {
                None => avro::write_long(out, 0),
                Some(nullable) => {
                    avro::write_long(out, 1);
                    out.push(u8::from(nullable));
                }
            }
            match c.key_position {
                None => avro::write_long(out, 0),
                Some(at) => {
                    avro::write_long(out, 1);
                    avro::write_long(out, i64::from(at));
                }
            }
        }
    }
    avro::write_long(out, 0);
}

/// The message id of segment `segment` of a schema-change event: UUID v5, under
/// [`MESSAGE_ID_NAMESPACE`], of the stream GUID, the table's version, the segment
/// index and `schema.table` (a name of another length than a change's or a loaded
/// row's for every table name but one of 4 bytes, and other bytes in any case).
pub fn schema_message_id(stream_guid: Uuid, table: &str, version: u64, segment: u32) -> Uuid {
    let mut name = Vec::with_capacity(16 + 6 + 8 + 4 + table.len());
    name.extend_from_slice(stream_guid.as_bytes());
    name.extend_from_slice(b"schema");
    name.extend_from_slice(&version.to_be_bytes());
    name.extend_from_slice(&segment.to_be_bytes());
    name.extend_from_slice(table.as_bytes());
    Uuid::new_v5(&MESSAGE_ID_NAMESPACE, &name)
}

impl Encoder {
    /// Encodes a schema-change event: `data` serialized, wrapped in the envelope
    /// with [`SCHEMA_CHANGE_TYPE`], segmented as a change event is.
    pub fn encode_schema_change(&self, event: &SchemaChange) -> Result<EncodedEvent, EventError> {
        let options = self.options();
        let logical_id = event.logical_id(options.stream_guid);
        let time = format_time(event.time);
        let fields = EnvelopeFields {
            event_type: SCHEMA_CHANGE_TYPE,
            logical_id: &logical_id,
            time: &time,
            content_type: options.encoding.content_type(),
            operation: SCHEMA_CHANGE_OPERATION,
        };
        let table = event.qualified_name();
        let id_for =
            |segment| schema_message_id(options.stream_guid, &table, event.version, segment);
        let limit = options.max_message_size.bytes();
        let data_only = self.is_data_only();
        let first_id = id_for(0);
        let (whole, data) = match options.encoding {
            Encoding::Json => {
                let data = event.data_text();
                let whole = json::envelope(&fields, &first_id, 0, true, &data);
                (whole, data.into_bytes())
            }
            Encoding::Avro => {
                let data = event.data_datum();
                let whole = avro::envelope(&fields, &first_id, 0, true, &data)?;
                (whole, data)
            }
        };
        let messages = if whole.len() <= limit {
            vec![Message {
                id: first_id,
                segment_index: 0,
                final_segment: true,
                bytes: if data_only { data } else { whole },
            }]
        } else {
            match options.encoding {
                Encoding::Json => {
                    // The text was built from a String: it is UTF-8.
                    let text = String::from_utf8_lossy(&data);
                    segment::split_json(&fields, &text, limit, id_for, data_only)?
                }
                Encoding::Avro => segment::split_avro(&fields, &data, limit, id_for, data_only)?,
            }
        };
        Ok(EncodedEvent {
            logical_id,
            messages,
            truncated_values: 0,
            data_only,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::test_support::options;
    use super::*;
    use crate::position::ShapeColumn;
    use chrono::TimeZone;

    fn shape(instance: &str, columns: &[(&str, &str, Option<bool>, Option<u32>)]) -> TableShape {
        TableShape {
            capture_instance: instance.into(),
            cols: columns
                .iter()
                .enumerate()
                .map(|(i, (name, t, nullable, key))| ShapeColumn {
                    name: (*name).into(),
                    sql_type: (*t).into(),
                    index: u32::try_from(i).unwrap(),
                    nullable: *nullable,
                    key_position: *key,
                })
                .collect(),
        }
    }

    pub(crate) fn added_email() -> SchemaChange {
        SchemaChange {
            database: "Shop".into(),
            schema: "dbo".into(),
            table: "Customers".into(),
            version: 2,
            reason: SchemaChangeReason::Changed,
            lsn: Lsn::from_parts(0x2A, 0x10, 3),
            time: Utc.with_ymd_and_hms(2026, 12, 2, 3, 4, 5).unwrap(),
            before: Some(Arc::new(shape(
                "dbo_Customers",
                &[
                    ("Id", "int", Some(false), Some(1)),
                    ("Name", "nvarchar(50)", Some(true), None),
                ],
            ))),
            after: Arc::new(shape(
                "dbo_Customers_v2",
                &[
                    ("Id", "int", Some(false), Some(1)),
                    ("Name", "nvarchar(50)", Some(true), None),
                    ("Email", "nvarchar(\"max\")", None, None),
                ],
            )),
            ddl: vec![DdlRecord {
                command: "ALTER TABLE dbo.Customers ADD Email nvarchar(max) NULL".into(),
                lsn: Lsn::from_parts(0x2A, 0x08, 1),
                time: Utc.with_ymd_and_hms(2026, 12, 2, 3, 4, 0).unwrap(),
            }],
        }
    }

    #[test]
    fn json_data_has_the_documented_fields_in_order() {
        let data: serde_json::Value = serde_json::from_str(&added_email().data_text()).unwrap();
        let keys: Vec<&str> = data
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "eventsource",
                "tableversion",
                "reason",
                "lsn",
                "time",
                "before",
                "after",
                "ddl"
            ]
        );
        assert_eq!(data["eventsource"]["tbl"], "Customers");
        assert_eq!(data["tableversion"], 2);
        assert_eq!(data["reason"], "changed");
        assert_eq!(data["lsn"], "0000002A:00000010:0003");
        assert_eq!(data["time"], "2026-12-02T03:04:05.000Z");
        assert_eq!(data["before"]["captureinstance"], "dbo_Customers");
        let email = &data["after"]["cols"][2];
        assert_eq!(email["type"], "nvarchar(\"max\")");
        assert_eq!(email["nullable"], serde_json::Value::Null);
        assert_eq!(data["after"]["cols"][0]["keyposition"], 1);
        assert_eq!(data["after"]["cols"][0]["nullable"], false);
        assert_eq!(data["ddl"][0]["lsn"], "0000002A:00000008:0001");
        let initial = SchemaChange {
            before: None,
            reason: SchemaChangeReason::Initial,
            ddl: Vec::new(),
            ..added_email()
        };
        let data: serde_json::Value = serde_json::from_str(&initial.data_text()).unwrap();
        assert_eq!(data["before"], serde_json::Value::Null);
        assert_eq!(data["reason"], "initial");
        assert_eq!(data["ddl"], serde_json::json!([]));
    }

    #[test]
    fn avro_data_decodes_with_the_shipped_schema_to_the_json_data() {
        let schema = schema_change_schema().expect("the shipped schema parses");
        for event in [
            added_email(),
            SchemaChange {
                before: None,
                ddl: Vec::new(),
                reason: SchemaChangeReason::Initial,
                ..added_email()
            },
        ] {
            let bytes = event.data_datum();
            let mut rest = bytes.as_slice();
            let value = avro::read_datum(schema, &mut rest).expect("decodes");
            assert!(rest.is_empty(), "the datum is read to its end");
            let decoded = serde_json::Value::try_from(value).expect("converts");
            let expected: serde_json::Value = serde_json::from_str(&event.data_text()).unwrap();
            assert_eq!(decoded, expected);
        }
    }

    #[test]
    fn ids_are_deterministic_per_table_and_version_and_logical_ids_name_them() {
        let guid = Uuid::parse_str("1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0").unwrap();
        let a = schema_message_id(guid, "dbo.Customers", 2, 0);
        assert_eq!(a, schema_message_id(guid, "dbo.Customers", 2, 0));
        for other in [
            schema_message_id(guid, "dbo.Customers", 3, 0),
            schema_message_id(guid, "dbo.Customers", 2, 1),
            schema_message_id(guid, "dbo.Orders", 2, 0),
            schema_message_id(Uuid::nil(), "dbo.Customers", 2, 0),
        ] {
            assert_ne!(a, other);
        }
        assert_eq!(
            added_email().logical_id(guid),
            "1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0:schema:dbo.Customers:2:0000002A000000100003:00000000000000000000"
        );
        assert_eq!(
            crate::event::readback::position(&added_email().logical_id(guid)),
            Some(("0000002A000000100003", "00000000000000000000"))
        );
    }

    #[test]
    fn encoded_events_have_our_type_and_a_large_one_is_segmented() {
        for encoding in [Encoding::Json, Encoding::Avro] {
            let encoder = Encoder::new(options(encoding));
            let event = encoder.encode_schema_change(&added_email()).unwrap();
            assert_eq!(event.messages.len(), 1);
            let message =
                crate::event::readback::decode_message(&event.messages[0].bytes, encoding)
                    .expect("decodes");
            assert_eq!(message.event_type, SCHEMA_CHANGE_TYPE);
            assert_eq!(message.operation, SCHEMA_CHANGE_OPERATION);
            assert_eq!(message.id, event.messages[0].id.to_string());
            assert_eq!(message.time, "2026-12-02T03:04:05.000Z");
            // 3,000 columns of long names: more than 256 KiB.
            let wide: Vec<ShapeColumn> = (0..3000)
                .map(|i| ShapeColumn {
                    name: format!("{i:0>100}"),
                    sql_type: "int".into(),
                    index: i,
                    nullable: Some(true),
                    key_position: None,
                })
                .collect();
            let mut big = added_email();
            big.after = Arc::new(TableShape {
                capture_instance: "dbo_wide".into(),
                cols: wide,
            });
            let event = encoder.encode_schema_change(&big).unwrap();
            assert!(event.messages.len() > 1, "{encoding}");
            for (i, m) in event.messages.iter().enumerate() {
                assert!(m.bytes.len() <= options(encoding).max_message_size.bytes());
                assert_eq!(m.segment_index as usize, i);
                assert_eq!(m.final_segment, i + 1 == event.messages.len());
                assert_eq!(
                    m.id,
                    schema_message_id(
                        options(encoding).stream_guid,
                        "dbo.Customers",
                        2,
                        m.segment_index
                    )
                );
            }
            // Encoded again: the same bytes.
            assert_eq!(encoder.encode_schema_change(&big).unwrap(), event);
            // Data only (binary mode): the data alone, cut at the same places.
            let data_only = Encoder::new(options(encoding))
                .data_only(true)
                .encode_schema_change(&big)
                .unwrap();
            assert_eq!(data_only.messages.len(), event.messages.len());
            let joined: Vec<u8> = data_only
                .messages
                .iter()
                .flat_map(|m| m.bytes.clone())
                .collect();
            let expected = match encoding {
                Encoding::Json => big.data_text().into_bytes(),
                Encoding::Avro => big.data_datum(),
            };
            assert_eq!(joined, expected);
        }
    }

    /// The CloudEvents 1.0 checks (the spec's "REQUIRED attributes" and naming
    /// rules) a CloudEvents validator makes, on a structured JSON schema-change event.
    #[test]
    fn a_schema_change_event_is_a_valid_cloudevent() {
        let encoder = Encoder::new(options(Encoding::Json));
        let event = encoder.encode_schema_change(&added_email()).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&event.messages[0].bytes).unwrap();
        let attributes = json.as_object().unwrap();
        assert_eq!(json["specversion"], "1.0");
        for required in ["id", "source", "type"] {
            let value = json[required].as_str().unwrap_or_default();
            assert!(!value.is_empty(), "{required} is a non-empty string");
        }
        assert!(
            chrono::DateTime::parse_from_rfc3339(json["time"].as_str().unwrap()).is_ok(),
            "time is RFC 3339"
        );
        assert_eq!(json["datacontenttype"], "application/json");
        for name in attributes.keys() {
            assert!(
                name.len() <= 20
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
                "attribute names are lower-case letters and digits, at most 20: {name}"
            );
        }
        // `data` is a JSON string holding the data object, as CES's.
        let data: serde_json::Value = serde_json::from_str(json["data"].as_str().unwrap()).unwrap();
        assert_eq!(data["tableversion"], 2);
    }
}

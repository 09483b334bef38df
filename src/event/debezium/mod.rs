//! `event.format = "debezium"`: the change-event envelope of Debezium's SQL Server
//! connector (Debezium 3.x), so that Kafka Connect sinks, Flink's and Spark's
//! `debezium-json`, and the other readers of that envelope take our stream as
//! Debezium's. The facts, from Debezium's source at 3.6 (`Envelope`,
//! `SchemaFactory`, `SqlServerSourceInfoStructMaker`, `SqlServerOffsetContext`,
//! `RelationalChangeRecordEmitter`, `EventDispatcher`) and its SQL Server
//! documentation; where the two differ, the code is followed:
//!
//! - Topic `<topic_prefix>.<db>.<schema>.<table>` (unless `sink.topic` is set); key
//!   schema `….Key` (the key columns; no key for a table without one), value
//!   `….Envelope` (version 2) with `before`, `after` (`….Value`), `source`
//!   (`io.debezium.connector.sqlserver.Source`, version 1), `transaction`
//!   (`event.block`), `op`, `ts_ms`, `ts_us`, `ts_ns`, in that order.
//! - `op`: `c`, `u`, `d`, and `r` for loaded rows. `source.snapshot` is `"false"`
//!   for changes (the schema's default, which JsonConverter writes for the unset
//!   field) and `"true"` for loaded rows (Debezium marks the first and last rows
//!   `first`/`last`; a load here is read in chunks and resumable, so every row is
//!   `true`), `"incremental"` for a re-snapshot's rows. `sequence` is always null, as Debezium's SQL Server connector leaves
//!   it. `change_lsn` is `__$seqval`, `commit_lsn` `__$start_lsn`, both lower-case
//!   `xxxxxxxx:xxxxxxxx:xxxx`; for a loaded row `change_lsn` and `event_serial_no`
//!   are null and `commit_lsn` is the load's LSN. `event_serial_no` is 1 for an
//!   insert or delete, 2 for an update, added up over events at one
//!   (`commit_lsn`, `change_lsn`).
//! - `source.ts_*` are the commit time; the envelope's `ts_*` the time the event
//!   was written (Debezium's processing time).
//! - After a delete, a tombstone (same key, null value) unless
//!   `tombstones_on_delete = false`. SQL Server's CDC records a key change as a
//!   delete and an insert, which become `d`, tombstone, `c` by themselves; an
//!   update pair whose images have different keys is written as Debezium's
//!   `RelationalChangeRecordEmitter` writes it: `d` with header
//!   `__debezium.newkey`, a tombstone, `c` with `__debezium.oldkey`.
//! - Every message carries the header `id`: the CES message id of the change
//!   (segment 0, 1, 2 for the `d`, tombstone and `c` of one change), deterministic,
//!   so a message written again after a crash is recognisable.
//! - With `provide_transaction_metadata`, `BEGIN` and `END` events on
//!   `<topic_prefix>.transaction`, keyed by the transaction id (the commit LSN),
//!   and each event's `transaction` block. Transactions here are complete when
//!   read, so `END` follows the transaction's last event at once.
//!
//! There is no segmentation (Debezium has none): values are truncated to 1 MiB as
//! for CES, and a record is bounded by what the destination takes
//! ([`RecordBound`]), not by CES's segment size. A record over it is a definite
//! error naming the table, the key and the size, and the column rules
//! (`truncate = N`, `exclude = true`) that would make it fit, found by encoding the
//! record again with them.

pub mod connect;
pub mod defaults;
mod encoder;
mod payload;
mod record_schemas;
pub mod schema_change;
mod transaction;
pub mod types;

pub use encoder::DebeziumEncoder;

use std::sync::Arc;

use serde::Deserialize;
use uuid::Uuid;

use crate::lsn::Lsn;
pub use types::{BinaryMode, DecimalMode, TimePrecisionMode};

/// Debezium's envelope, with `event.format = "debezium"`: Debezium's own setting names,
/// with `_` for `.`.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DebeziumSettings {
    /// Debezium's `topic.prefix`: topics are `<prefix>.<db>.<schema>.<table>` (unless
    /// `sink.topic` is set), and it is `source.name`.
    #[serde(default = "default_prefix")]
    pub topic_prefix: String,
    /// JSON as Kafka Connect's `JsonConverter` writes it with `schemas.enable`:
    /// `{"schema":…,"payload":…}`; `false`: the payload alone.
    #[serde(default = "yes")]
    pub schemas_enable: bool,
    /// A tombstone (the same key, a null value) after each delete; refused for
    /// `event_hubs_amqp`, whose messages cannot be null.
    #[serde(default = "yes")]
    pub tombstones_on_delete: bool,
    /// Debezium's `decimal.handling.mode`.
    #[serde(default)]
    pub decimal_handling_mode: DecimalMode,
    /// Debezium's `time.precision.mode`.
    #[serde(default)]
    pub time_precision_mode: TimePrecisionMode,
    /// Debezium's `binary.handling.mode`.
    #[serde(default)]
    pub binary_handling_mode: BinaryMode,
    /// `BEGIN` and `END` events on the transaction topic, and a `transaction` block in
    /// each event.
    #[serde(default)]
    pub provide_transaction_metadata: bool,
    /// The transaction topic; unset: `<topic_prefix>.transaction`.
    #[serde(default)]
    pub transaction_topic: Option<String>,
}

fn default_prefix() -> String {
    "mssql-ces".into()
}

fn yes() -> bool {
    true
}

impl Default for DebeziumSettings {
    fn default() -> Self {
        DebeziumSettings {
            topic_prefix: default_prefix(),
            schemas_enable: true,
            tombstones_on_delete: true,
            decimal_handling_mode: DecimalMode::default(),
            time_precision_mode: TimePrecisionMode::default(),
            binary_handling_mode: BinaryMode::default(),
            provide_transaction_metadata: false,
            transaction_topic: None,
        }
    }
}

impl DebeziumSettings {
    /// The data topics' template when `sink.topic` is not set.
    pub fn topic_template(&self) -> String {
        format!("{}.{{db}}.{{schema}}.{{tbl}}", self.topic_prefix)
    }

    pub fn transaction_topic(&self) -> String {
        self.transaction_topic
            .clone()
            .unwrap_or_else(|| format!("{}.transaction", self.topic_prefix))
    }
}

/// Why an event cannot be written in Debezium's form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DebeziumError {
    #[error(
        "column {column}: {value} is outside what Debezium's type for it holds (io.debezium.time.NanoTimestamp ends in 2262): set event.debezium.time_precision_mode = \"connect\""
    )]
    OutOfRange { column: String, value: String },
    #[error(
        "a Debezium record of {table} with key {key} is {size} bytes, over the {limit} bytes the destination takes ({bound}); Debezium's envelope has no segments: {fix}"
    )]
    TooLarge {
        table: String,
        key: String,
        size: usize,
        limit: usize,
        /// What sets the limit.
        bound: String,
        /// The column rules that make the record fit, and the setting that raises
        /// the limit where it can be raised.
        fix: String,
    },
    /// A defect: our own JSON did not fit our own schema.
    #[error("writing a Debezium record as Avro: {0}")]
    Avro(String),
}

/// The largest Debezium record (its value, in bytes) a destination takes, and
/// what sets it. Debezium's envelope has no segments, so a record is bounded by
/// the destination, not by CES's `event.max_message_size_kb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordBound {
    pub bytes: usize,
    /// What the bound is, as the operator knows it (`"the producer's
    /// message.max.bytes"`).
    pub what: &'static str,
    /// The setting that raises the bound; `None` where it is the destination's
    /// own maximum.
    pub raised_by: Option<&'static str>,
}

impl RecordBound {
    /// No bound: a file or stdout takes a record of any size.
    pub const NONE: RecordBound = RecordBound {
        bytes: usize::MAX,
        what: "no limit",
        raised_by: None,
    };
}

/// One Kafka record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `None`: the change's table's topic (the router's); `Some`: the
    /// transaction or schema-change topic, final (as Debezium sanitizes names).
    pub topic: Option<String>,
    /// The key's JSON; `None` for a table without a key.
    pub key: Option<Vec<u8>>,
    /// The value's JSON; `None` for a tombstone.
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(&'static str, Vec<u8>)>,
    /// The CES id in the `id` header.
    pub id: Uuid,
    /// With Avro: the schemas of `key` and `value` (which are then bare Avro
    /// datums, to be given the registry's wire format).
    pub avro: Option<AvroSchemas>,
}

pub use crate::position::OpenTransaction;

/// An Avro record's schemas, for the registry that gives their ids: the Avro
/// schema JSON and the record's full name, of the key and of the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AvroSchemas {
    pub key: Option<(Arc<str>, String)>,
    pub value: Option<(Arc<str>, String)>,
}

/// The source's version in `source.version`.
pub const SOURCE_VERSION: &str = concat!("mssql-ces-", env!("CARGO_PKG_VERSION"));

/// Debezium's LSN text: lower-case hex, `xxxxxxxx:xxxxxxxx:xxxx`.
pub fn lsn_text(lsn: Lsn) -> String {
    lsn.to_colon_string().to_ascii_lowercase()
}

/// A bound of `bytes` that a setting raises, for tests.
#[cfg(test)]
pub(crate) fn bound(bytes: usize) -> RecordBound {
    RecordBound {
        bytes,
        what: "the test's limit",
        raised_by: Some("the test's setting"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_support::{column, insert};
    use crate::event::{Change, Operation, TableDescription};
    use crate::event::{ColumnDescription, Length, SqlType, Value};
    use chrono::{NaiveDate, TimeZone};

    fn required(c: ColumnDescription) -> ColumnDescription {
        ColumnDescription {
            nullable: false,
            ..c
        }
    }

    /// `testDB.dbo.customers` of Debezium's SQL Server documentation.
    fn customers() -> Arc<TableDescription> {
        let text = SqlType::NVarChar(Length::Bounded(255));
        Arc::new(
            TableDescription::new(
                "testDB",
                "dbo",
                "customers",
                vec![
                    required(column("id", SqlType::Int, 0)),
                    required(column("first_name", text, 1)),
                    required(column("last_name", text, 2)),
                    required(column("email", text, 3)),
                ],
                vec![0],
            )
            .unwrap(),
        )
    }

    fn encoder(settings: DebeziumSettings) -> DebeziumEncoder {
        DebeziumEncoder::new(Arc::new(settings), Uuid::nil(), bound(1 << 20), None).with_clock(
            chrono::Utc
                .timestamp_opt(1_559_729_471, 739_876_149)
                .unwrap(),
        )
    }

    fn server1() -> DebeziumSettings {
        DebeziumSettings {
            topic_prefix: "server1".into(),
            ..DebeziumSettings::default()
        }
    }

    fn john() -> Change {
        let mut change = insert(
            customers(),
            vec![
                Value::Int(1005),
                Value::Text("john".into()),
                Value::Text("doe".into()),
                Value::Text("john.doe@example.org".into()),
            ],
        );
        change.commit_lsn = Lsn::from_parts(0x27, 0x758, 5);
        change.change_lsn = Lsn::from_parts(0x27, 0x758, 3);
        change.commit_time = chrono::Utc.timestamp_millis_opt(1_559_729_468_470).unwrap();
        change
    }

    /// A loaded row reads as `op` `r`, with `snapshot` `true` from the initial load
    /// and `incremental` from a re-snapshot (as Debezium's incremental snapshots mark
    /// theirs); a change is `false`.
    #[test]
    fn loaded_rows_say_which_snapshot_read_them() {
        let snapshot_of = |origin| {
            let mut change = john();
            change.origin = origin;
            let records = encoder(server1()).encode(&change).unwrap();
            let v: serde_json::Value =
                serde_json::from_slice(records[0].value.as_ref().unwrap()).unwrap();
            (
                v["payload"]["op"].clone(),
                v["payload"]["source"]["snapshot"].clone(),
            )
        };
        let load = |incremental| crate::event::Origin::Load {
            id_seed: Uuid::nil(),
            logical_sequence: 1,
            incremental,
        };
        assert_eq!(snapshot_of(load(false)), ("r".into(), "true".into()));
        assert_eq!(snapshot_of(load(true)), ("r".into(), "incremental".into()));
        assert_eq!(
            snapshot_of(crate::event::Origin::Cdc),
            ("c".into(), "false".into())
        );
    }

    /// The insert of Debezium's documentation, as its code and Kafka's JsonConverter
    /// write it (the documentation's own example swaps the database and schema in
    /// the value's schema names; the code, `TableSchemaBuilder`, does not). Typed
    /// from that rendering, not produced by this code.
    #[test]
    fn an_insert_is_the_documented_key_and_value() {
        let records = encoder(server1()).encode(&john()).unwrap();
        assert_eq!(records.len(), 1);
        let key = String::from_utf8(records[0].key.clone().unwrap()).unwrap();
        assert_eq!(
            key,
            r#"{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"id"}],"optional":false,"name":"server1.testDB.dbo.customers.Key"},"payload":{"id":1005}}"#
        );
        let row = r#"{"type":"struct","fields":[{"type":"int32","optional":false,"field":"id"},{"type":"string","optional":false,"field":"first_name"},{"type":"string","optional":false,"field":"last_name"},{"type":"string","optional":false,"field":"email"}],"optional":true,"name":"server1.testDB.dbo.customers.Value","field":"#;
        let expected = [
            r#"{"schema":{"type":"struct","fields":["#,
            row,
            r#""before"},"#,
            row,
            r#""after"},{"type":"struct","fields":[{"type":"string","optional":false,"field":"version"},{"type":"string","optional":false,"field":"connector"},{"type":"string","optional":false,"field":"name"},{"type":"int64","optional":false,"field":"ts_ms"},{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},"default":"false","field":"snapshot"},{"type":"string","optional":false,"field":"db"},{"type":"string","optional":true,"field":"sequence"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"},{"type":"string","optional":false,"field":"schema"},{"type":"string","optional":false,"field":"table"},{"type":"string","optional":true,"field":"change_lsn"},{"type":"string","optional":true,"field":"commit_lsn"},{"type":"int64","optional":true,"field":"event_serial_no"}],"optional":false,"name":"io.debezium.connector.sqlserver.Source","version":1,"field":"source"},{"type":"struct","fields":[{"type":"string","optional":false,"field":"id"},{"type":"int64","optional":false,"field":"total_order"},{"type":"int64","optional":false,"field":"data_collection_order"}],"optional":true,"name":"event.block","version":1,"field":"transaction"},{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"}],"optional":false,"name":"server1.testDB.dbo.customers.Envelope","version":2},"payload":{"before":null,"after":{"id":1005,"first_name":"john","last_name":"doe","email":"john.doe@example.org"},"source":{"version":"VERSION","connector":"sqlserver","name":"server1","ts_ms":1559729468470,"snapshot":"false","db":"testDB","sequence":null,"ts_us":1559729468470000,"ts_ns":1559729468470000000,"schema":"dbo","table":"customers","change_lsn":"00000027:00000758:0003","commit_lsn":"00000027:00000758:0005","event_serial_no":1},"transaction":null,"op":"c","ts_ms":1559729471739,"ts_us":1559729471739876,"ts_ns":1559729471739876149}}"#,
        ]
        .concat()
        .replace("VERSION", SOURCE_VERSION);
        let value = String::from_utf8(records[0].value.clone().unwrap()).unwrap();
        assert_eq!(value, expected);
        // Without schemas: the payload alone.
        let plain = encoder(DebeziumSettings {
            schemas_enable: false,
            ..server1()
        })
        .encode(&john())
        .unwrap();
        assert_eq!(plain[0].key.as_deref(), Some(&br#"{"id":1005}"#[..]));
        let payload: serde_json::Value =
            serde_json::from_slice(plain[0].value.as_ref().unwrap()).unwrap();
        let full: serde_json::Value = serde_json::from_str(&value).unwrap();
        assert_eq!(payload, full["payload"]);
    }

    /// A delete, its tombstone; an update pair whose key changed as Debezium's
    /// `RelationalChangeRecordEmitter` writes it; transaction events and counts.
    #[test]
    fn deletes_key_changes_and_transactions() {
        let mut encoder = encoder(DebeziumSettings {
            provide_transaction_metadata: true,
            ..server1()
        });
        let mut delete = john();
        delete.operation = Operation::Delete;
        delete.old = delete.current.take();
        delete.last_in_transaction = false;
        let records = encoder.encode(&delete).unwrap();
        let kinds: Vec<_> = records
            .iter()
            .map(|r| (r.topic.clone(), r.value.is_some()))
            .collect();
        assert_eq!(
            kinds,
            [
                (Some("server1.transaction".to_owned()), true),
                (None, true),
                (None, false)
            ]
        );
        assert_eq!(
            records[1].key, records[2].key,
            "the tombstone has the delete's key"
        );
        assert_ne!(records[1].id, records[2].id);
        assert_ne!(
            records[1].headers[0], records[2].headers[0],
            "an id header of its own"
        );
        assert_eq!(
            records[2].headers[0].1,
            records[2].id.to_string().into_bytes()
        );
        let mut update = john();
        update.operation = Operation::Update;
        update.sequence_number = 2;
        update.change_lsn = Lsn::from_parts(0x27, 0x758, 4);
        update.old = john().current;
        if let Some(row) = update.current.as_mut() {
            row[0] = Value::Int(1006);
        }
        let records = encoder.encode(&update).unwrap();
        let ops: Vec<String> = records
            .iter()
            .map(|r| match &r.value {
                None => "tombstone".into(),
                Some(v) => {
                    let v: serde_json::Value = serde_json::from_slice(v).unwrap();
                    let p = &v["payload"];
                    p["op"]
                        .as_str()
                        .or(p["status"].as_str())
                        .unwrap()
                        .to_owned()
                }
            })
            .collect();
        assert_eq!(ops, ["d", "tombstone", "c", "END"]);
        assert_eq!(records[0].headers[1].0, "__debezium.newkey");
        assert_eq!(records[0].headers[1].1, br#"{"id":1006}"#);
        assert_eq!(
            records[2].headers[1],
            ("__debezium.oldkey", br#"{"id":1005}"#.to_vec())
        );
        let end: serde_json::Value =
            serde_json::from_slice(records[3].value.as_ref().unwrap()).unwrap();
        assert_eq!(end["payload"]["event_count"], 3);
        assert_eq!(
            end["payload"]["data_collections"],
            serde_json::json!([{"data_collection": "testDB.dbo.customers", "event_count": 3}])
        );
        let c: serde_json::Value =
            serde_json::from_slice(records[2].value.as_ref().unwrap()).unwrap();
        assert_eq!(
            c["payload"]["transaction"],
            serde_json::json!({"id": "00000027:00000758:0005", "total_order": 3, "data_collection_order": 3})
        );
        assert_eq!(encoder.open_transaction(), None);
    }

    /// A restart inside a large transaction: the checkpoint's counts go on, no
    /// second `BEGIN`, and `END` counts the events before the restart too.
    #[test]
    fn a_transaction_resumed_from_the_checkpoint_numbers_on() {
        let mut change = john();
        change.sequence_number = 6;
        let open = OpenTransaction {
            commit_lsn: change.commit_lsn,
            total: 5,
            tables: vec![("testDB.dbo.customers".into(), 5)],
        };
        let mut encoder = DebeziumEncoder::new(
            Arc::new(DebeziumSettings {
                provide_transaction_metadata: true,
                ..server1()
            }),
            Uuid::nil(),
            bound(1 << 20),
            Some(open),
        );
        let records = encoder.encode(&change).unwrap();
        assert_eq!(records.len(), 2, "the event and END, no BEGIN");
        let event: serde_json::Value =
            serde_json::from_slice(records[0].value.as_ref().unwrap()).unwrap();
        assert_eq!(event["payload"]["transaction"]["total_order"], 6);
        assert_eq!(event["payload"]["transaction"]["data_collection_order"], 6);
        let end: serde_json::Value =
            serde_json::from_slice(records[1].value.as_ref().unwrap()).unwrap();
        assert_eq!(end["payload"]["event_count"], 6);
        assert_eq!(end["payload"]["data_collections"][0]["event_count"], 6);
        // Mid-transaction the state is what a checkpoint keeps.
        let mut middle = john();
        middle.last_in_transaction = false;
        let mut fresh = DebeziumEncoder::new(
            Arc::new(DebeziumSettings {
                provide_transaction_metadata: true,
                ..server1()
            }),
            Uuid::nil(),
            bound(1 << 20),
            None,
        );
        fresh.encode(&middle).unwrap();
        assert_eq!(
            fresh.open_transaction(),
            Some(OpenTransaction {
                commit_lsn: middle.commit_lsn,
                total: 1,
                tables: vec![("testDB.dbo.customers".into(), 1)],
            })
        );
    }

    fn value_of(sql_type: SqlType, value: Value, settings: &DebeziumSettings) -> (String, String) {
        let column = column("v", sql_type, 0);
        let mut schema = String::new();
        types::column_schema(&column, settings).write(&mut schema, Some("v"));
        let mut out = String::new();
        types::write_value(&mut out, &column, &value, settings).unwrap();
        (schema, out)
    }

    /// The values of Debezium's own datatype test (`AbstractSqlServerDatatypesTest`)
    /// for the same inputs.
    #[test]
    fn each_type_as_debeziums_datatype_test_has_it() {
        let adaptive = DebeziumSettings::default();
        let day = NaiveDate::from_ymd_opt(2018, 7, 13).unwrap();
        let at = |h, m, s, nanos| day.and_hms_nano_opt(h, m, s, nanos).unwrap();
        let cases = [
            (
                SqlType::Date,
                Value::Date(day),
                "io.debezium.time.Date",
                "17725",
            ),
            (
                SqlType::Time { scale: 2 },
                Value::Time {
                    value: at(10, 23, 45, 680_000_000).time(),
                    scale: 2,
                },
                "io.debezium.time.Time",
                "37425680",
            ),
            (
                SqlType::Time { scale: 4 },
                Value::Time {
                    value: at(10, 23, 45, 678_900_000).time(),
                    scale: 4,
                },
                "io.debezium.time.MicroTime",
                "37425678900",
            ),
            (
                SqlType::Time { scale: 7 },
                Value::Time {
                    value: at(10, 23, 45, 678_901_200).time(),
                    scale: 7,
                },
                "io.debezium.time.NanoTime",
                "37425678901200",
            ),
            (
                SqlType::DateTime2 { scale: 7 },
                Value::DateTime2 {
                    value: at(11, 23, 45, 340_000_000),
                    scale: 7,
                },
                "io.debezium.time.NanoTimestamp",
                "1531481025340000000",
            ),
            (
                SqlType::DateTime,
                Value::DateTime(at(13, 23, 45, 780_000_000)),
                "io.debezium.time.Timestamp",
                "1531488225780",
            ),
            (
                SqlType::SmallDateTime,
                Value::SmallDateTime(at(14, 24, 0, 0)),
                "io.debezium.time.Timestamp",
                "1531491840000",
            ),
            (
                SqlType::DateTimeOffset { scale: 7 },
                Value::DateTimeOffset {
                    value: chrono::FixedOffset::east_opt(11 * 3600)
                        .unwrap()
                        .from_local_datetime(&at(12, 23, 45, 456_000_000))
                        .unwrap(),
                    scale: 7,
                },
                "io.debezium.time.ZonedTimestamp",
                "\"2018-07-13T12:23:45.456+11:00\"",
            ),
            (
                SqlType::Decimal {
                    precision: 6,
                    scale: 3,
                },
                Value::Decimal {
                    unscaled: 1123,
                    scale: 3,
                },
                "org.apache.kafka.connect.data.Decimal",
                "\"BGM=\"",
            ),
            (
                SqlType::Numeric {
                    precision: 18,
                    scale: 0,
                },
                Value::Decimal {
                    unscaled: 2,
                    scale: 0,
                },
                "org.apache.kafka.connect.data.Decimal",
                "\"Ag==\"",
            ),
            (
                SqlType::SmallMoney,
                Value::Decimal {
                    unscaled: 53230,
                    scale: 4,
                },
                "\"connect.decimal.precision\":\"10\"",
                "\"AM/u\"",
            ),
            (
                SqlType::Money,
                Value::Decimal {
                    unscaled: 63230,
                    scale: 4,
                },
                "\"connect.decimal.precision\":\"19\"",
                "\"APb+\"",
            ),
            (SqlType::TinyInt, Value::TinyInt(22), "\"int16\"", "22"),
            (SqlType::Real, Value::Real(4.323), "\"float\"", "4.323"),
            (SqlType::Float, Value::Float(3.323), "\"double\"", "3.323"),
            (SqlType::Bit, Value::Bit(true), "\"boolean\"", "true"),
            (
                SqlType::UniqueIdentifier,
                Value::Guid(Uuid::parse_str("6f9619ff-8b86-d011-b42d-00c04fc964ff").unwrap()),
                "\"string\"",
                "\"6F9619FF-8B86-D011-B42D-00C04FC964FF\"",
            ),
            (
                SqlType::VarBinary(Length::Bounded(4)),
                Value::Binary(vec![0xFB, 0xFF]),
                "\"bytes\"",
                "\"+/8=\"",
            ),
        ];
        for (sql_type, value, schema_has, expected) in cases {
            let (schema, text) = value_of(sql_type, value, &adaptive);
            assert!(schema.contains(schema_has), "{sql_type}: {schema}");
            assert_eq!(text, expected, "{sql_type}");
        }
        // The other modes.
        let connect = DebeziumSettings {
            time_precision_mode: TimePrecisionMode::Connect,
            decimal_handling_mode: DecimalMode::String,
            binary_handling_mode: BinaryMode::Hex,
            ..DebeziumSettings::default()
        };
        let (schema, text) = value_of(
            SqlType::Time { scale: 7 },
            Value::Time {
                value: at(10, 23, 45, 678_901_200).time(),
                scale: 7,
            },
            &connect,
        );
        assert!(
            schema.contains("\"int32\"") && schema.contains("org.apache.kafka.connect.data.Time")
        );
        assert_eq!(text, "37425678");
        let (_, text) = value_of(
            SqlType::Money,
            Value::Decimal {
                unscaled: 53230,
                scale: 4,
            },
            &connect,
        );
        assert_eq!(text, "\"5.3230\"");
        let (_, text) = value_of(
            SqlType::Binary(Length::Bounded(2)),
            Value::Binary(vec![0xFB, 0xFF]),
            &connect,
        );
        assert_eq!(text, "\"fbff\"");
        let url = DebeziumSettings {
            binary_handling_mode: BinaryMode::Base64UrlSafe,
            decimal_handling_mode: DecimalMode::Double,
            ..DebeziumSettings::default()
        };
        let (schema, text) = value_of(
            SqlType::Binary(Length::Bounded(2)),
            Value::Binary(vec![0xFB, 0xFF]),
            &url,
        );
        assert!(schema.contains("\"string\""));
        assert_eq!(text, "\"-_8=\"");
        let (_, text) = value_of(
            SqlType::Money,
            Value::Decimal {
                unscaled: 63230,
                scale: 4,
            },
            &url,
        );
        assert_eq!(text, "6.323");
    }
}

#[cfg(test)]
mod more_tests {
    use super::record_schemas::build_schemas;
    use super::*;
    use crate::event::TableDescription;
    use crate::event::columns::ColumnMask;
    use crate::event::test_support::{column, employee_row, employees, insert};
    use crate::event::{Change, ColumnDescription, Operation, SqlType, Value};

    fn encoder(max: usize) -> DebeziumEncoder {
        DebeziumEncoder::new(
            Arc::new(DebeziumSettings::default()),
            Uuid::nil(),
            bound(max),
            None,
        )
    }

    /// The `truncate = N` the error of `change` suggests for `column`, if any.
    fn suggested_truncate(err: &DebeziumError, column: &str) -> Option<usize> {
        let text = err.to_string();
        let rule = format!("{{ column = \"dbo.Employees.{column}\", truncate = ");
        let at = text.find(&rule)? + rule.len();
        text[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    }

    /// `change` with `column`'s values (both images) cut to `n` characters.
    fn cut(change: &Change, column: usize, n: Option<usize>) -> Change {
        let mut copy = change.clone();
        for row in [copy.old.as_mut(), copy.current.as_mut()]
            .into_iter()
            .flatten()
        {
            row[column] = match (&row[column], n) {
                (Value::Text(t), Some(n)) => Value::Text(t.chars().take(n).collect()),
                (_, None) => Value::Null,
                (other, _) => other.clone(),
            };
        }
        copy
    }

    #[test]
    fn a_message_over_the_limit_is_a_definite_error_naming_table_key_size_and_the_rule_that_fits() {
        let mut change = insert(employees(), employee_row(7, "Ada", "Lovelace"));
        if let Some(row) = change.current.as_mut() {
            row[1] = Value::Text("x".repeat(200 * 1024));
        }
        let err = encoder(128 * 1024).encode(&change).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("dbo.Employees")
                && text.contains(r#"{"Id":7}"#)
                && text.contains("131072")
                && text.contains("raise the test's setting"),
            "{text}"
        );
        // The suggested rule makes the record fit, and it is the largest that does
        // but for the margin the rule's own changes may take.
        let n = suggested_truncate(&err, "FirstName").expect("a truncate rule");
        assert!(n > 120 * 1024 && n < 128 * 1024, "{n}");
        assert!(
            encoder(128 * 1024)
                .encode(&cut(&change, 1, Some(n)))
                .is_ok()
        );
        assert!(
            encoder(128 * 1024)
                .encode(&cut(&change, 1, Some(n + 300)))
                .is_err()
        );
        // Under a larger limit it goes; a value over 1 MiB is cut to 1 MiB as in CES.
        assert!(encoder(1024 * 1024).encode(&change).is_ok());
    }

    #[test]
    fn an_update_too_large_in_both_images_leaves_out_the_largest_column_then_truncates_the_next() {
        let mut row = employee_row(7, "Ada", "Lovelace");
        row[1] = Value::Text("f".repeat(100 * 1024));
        row[2] = Value::Text("l".repeat(70 * 1024));
        let mut change = insert(employees(), row.clone());
        change.operation = Operation::Update;
        change.old = Some(row);
        let limit = 128 * 1024;
        let err = encoder(limit).encode(&change).unwrap_err();
        let text = err.to_string();
        // FirstName alone, in two images, is over the limit: leaving it out is the
        // least rule, and LastName is then cut.
        assert!(
            text.contains(r#"{ column = "dbo.Employees.FirstName", exclude = true }"#),
            "{text}"
        );
        let n = suggested_truncate(&err, "LastName").expect("a truncate rule");
        assert!(n < 64 * 1024, "{n}");
        let fitted = cut(&cut(&change, 1, None), 2, Some(n));
        assert!(encoder(limit).encode(&fitted).is_ok());
    }

    #[test]
    fn a_record_whose_key_alone_is_too_large_says_no_rule_fits_and_a_fixed_limit_is_not_raised() {
        let table = Arc::new(
            TableDescription::new(
                "Db",
                "dbo",
                "Keys",
                vec![column("K", SqlType::NVarChar(crate::event::Length::Max), 0)],
                vec![0],
            )
            .unwrap(),
        );
        let change = insert(table, vec![Value::Text("k".repeat(4096))]);
        let fixed = RecordBound {
            bytes: 2048,
            what: "Event Hubs' largest event",
            raised_by: None,
        };
        let err = DebeziumEncoder::new(
            Arc::new(DebeziumSettings::default()),
            Uuid::nil(),
            fixed,
            None,
        )
        .encode(&change)
        .unwrap_err()
        .to_string();
        assert!(err.contains("no column rule makes it fit"), "{err}");
        assert!(
            err.contains("destination's largest") && !err.contains("raise"),
            "{err}"
        );
    }

    #[test]
    fn a_hashed_or_redacted_column_is_a_string_whatever_its_type() {
        let hashed = ColumnDescription {
            mask: Some(ColumnMask::Hashed),
            ..column("Id", SqlType::Int, 0)
        };
        let mut schema = String::new();
        types::column_schema(&hashed, &DebeziumSettings::default()).write(&mut schema, None);
        assert_eq!(schema, r#"{"type":"string","optional":true}"#);
        let mut out = String::new();
        types::write_value(
            &mut out,
            &hashed,
            &Value::Text("ab".into()),
            &DebeziumSettings::default(),
        )
        .unwrap();
        assert_eq!(out, r#""ab""#);
    }

    #[test]
    fn a_constant_default_is_the_fields_default_in_both_schemas() {
        let field = |c: &ColumnDescription, settings: &DebeziumSettings| {
            let schema = types::column_schema(c, settings);
            let mut json = String::new();
            schema.write(&mut json, Some(&c.name));
            let record =
                connect::Schema::of(connect::Type::Struct(vec![(c.name.clone(), schema)]), false)
                    .named("srv.db.dbo.t.Value", None);
            (json, record.avro_json())
        };
        let qty = ColumnDescription {
            default: Some("((0))".into()),
            nullable: false,
            ..column("Qty", SqlType::Int, 1)
        };
        let (json, avro) = field(&qty, &DebeziumSettings::default());
        assert_eq!(
            json,
            r#"{"type":"int32","optional":false,"default":0,"field":"Qty"}"#
        );
        assert!(
            avro.contains(
                r#"{"name":"Qty","type":{"type":"int","connect.default":0},"default":0}"#
            ),
            "{avro}"
        );
        // A decimal's default is written as its values are: the unscaled bytes at
        // the column's scale, base64 (AvroData writes the same text).
        let price = ColumnDescription {
            default: Some("((1.5))".into()),
            ..column(
                "Price",
                SqlType::Decimal {
                    precision: 10,
                    scale: 2,
                },
                2,
            )
        };
        let (json, avro) = field(&price, &DebeziumSettings::default());
        assert!(
            json.contains(r#""default":"AJY=""#),
            "150 is 0x0096: {json}"
        );
        assert!(avro.contains(r#""default":"AJY=""#), "{avro}");
        assert!(avro.contains(r#""type":[{"type":"bytes""#), "{avro}");
        apache_avro::Schema::parse_str(&avro).expect("a valid Avro schema");
        // No default for an expression, or where a column rule changes the values.
        let stamped = ColumnDescription {
            default: Some("(getdate())".into()),
            nullable: false,
            ..column("At", SqlType::DateTime, 3)
        };
        assert!(
            !field(&stamped, &DebeziumSettings::default())
                .0
                .contains("default")
        );
        let hashed = ColumnDescription {
            mask: Some(ColumnMask::Hashed),
            ..qty.clone()
        };
        assert!(
            !field(&hashed, &DebeziumSettings::default())
                .0
                .contains("default")
        );
    }
    #[test]
    fn names_kafka_does_not_allow_become_underscores_as_debezium_writes_them() {
        let table = Arc::new(
            TableDescription::new(
                "Shop",
                "sales",
                "order details",
                vec![column("Id", SqlType::Int, 0)],
                vec![0],
            )
            .unwrap(),
        );
        let schemas = build_schemas(&table, &DebeziumSettings::default());
        assert_eq!(
            schemas.value.schema.name.as_deref(),
            Some("mssql-ces.Shop.sales.order_details.Envelope")
        );
        assert_eq!(schemas.data_collection, "Shop.sales.order details");
    }

    /// Avro allows fewer names than Kafka and Connect: in the Avro schemas, record
    /// and field names are adjusted as Debezium's name adjustment mode `avro` does
    /// (the default prefix's `-`, a column's space), so that a registry takes them;
    /// JsonConverter's schema keeps the Connect names.
    #[test]
    fn avro_schemas_have_names_avro_allows() {
        let table = Arc::new(
            TableDescription::new(
                "Shop-1",
                "dbo",
                "2024 orders",
                vec![
                    column("Id", SqlType::Int, 0),
                    column("order id", SqlType::Int, 1),
                ],
                vec![0],
            )
            .unwrap(),
        );
        let schemas = build_schemas(&table, &DebeziumSettings::default());
        let avro = &schemas.value.avro;
        apache_avro::Schema::parse_str(avro).expect("a registry parses it");
        assert!(
            avro.contains(r#""name":"Envelope","namespace":"mssql_ces.Shop_1.dbo._024_orders""#),
            "{avro}"
        );
        assert!(avro.contains(r#"{"name":"order_id","type""#), "{avro}");
        assert!(
            avro.contains(r#""connect.name":"mssql_ces.Shop_1.dbo._024_orders.Envelope""#),
            "{avro}"
        );
        assert_eq!(
            schemas.value.schema.record_name().as_deref(),
            Some("mssql_ces.Shop_1.dbo._024_orders.Envelope")
        );
        assert!(schemas.value.json.contains(r#""field":"order id""#));
        assert!(
            schemas
                .value
                .json
                .contains(r#""name":"mssql-ces.Shop-1.dbo.2024_orders.Envelope""#),
            "{}",
            schemas.value.json
        );
        for valid in ["Envelope", "_a1", "order_details"] {
            assert_eq!(connect::avro_name(valid), valid);
        }
    }

    #[test]
    fn read_names_a_debezium_record_for_what_it_is() {
        let records = encoder(1 << 20)
            .encode(&insert(employees(), employee_row(1, "a", "b")))
            .unwrap();
        let err = crate::event::readback::decode_json_message(records[0].value.as_ref().unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("Debezium record"), "{err}");
    }
}

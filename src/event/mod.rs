//! The CES CloudEvent: the model of one change and the messages built from it.
//!
//! A [`Change`] is one paired row change (an insert, a delete, or an update made of
//! CDC's op 3 and op 4) with everything the event needs. [`Encoder::encode`] turns it
//! into the exact messages that go on the wire, in this order (`docs/src/event-format.md` says it for a reader):
//!
//! 1. truncate every value whose text form exceeds 1 MiB ([`segment::truncate_row`]);
//! 2. serialize `data` as JSON text or an Avro datum ([`json`], [`avro`]);
//! 3. wrap it in the 11-attribute envelope, splitting it into segments when the whole
//!    message would exceed `max_message_size_kb` ([`segment`]).
//!
//! Invariants: every message of an event shares its `logicalid`, has its own
//! deterministic `id`, and is at most the configured size in bytes.

pub mod avro;
pub mod columns;
pub mod debezium;
pub mod heartbeat;
pub mod json;
mod per_table;
pub mod readback;
pub mod schema_change;
pub mod segment;
pub mod settings;
mod topic_name;
pub mod value;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::lsn::Lsn;
pub use per_table::PerTable;
pub use segment::MessageSizeLimit;
pub use topic_name::{
    MAX_TOPIC_LENGTH, collisions as topic_collisions, expand_names, legal_topic_char,
    sanitize_topic, template_problem as topic_template_problem,
};
pub use value::{Length, SqlType, Value};

/// `specversion`.
pub const SPEC_VERSION: &str = "1.0";
/// `type` for DML events, version 1 of the CES schema.
pub const EVENT_TYPE: &str = "com.microsoft.SQL.CES.DML.V1";
/// `source`: CES always writes `/`.
pub const EVENT_SOURCE: &str = "/";
/// `datacontenttype` of JSON-encoded events.
pub const JSON_CONTENT_TYPE: &str = "application/json";
/// `datacontenttype` of Avro-encoded events (our choice; CES does not document it).
pub const AVRO_CONTENT_TYPE: &str = "application/avro";

/// Namespace under which message ids are UUID v5 names. Fixed forever: changing it
/// changes every id, and consumers use ids to drop re-sent duplicates.
pub const MESSAGE_ID_NAMESPACE: Uuid = Uuid::from_bytes([
    0x6d, 0x73, 0x73, 0x71, 0x2d, 0x63, 0x65, 0x73, 0x8a, 0x1e, 0x4b, 0x3c, 0x9d, 0x2f, 0x51, 0x07,
]);

/// The SQL operation of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// CDC `__$operation` 2.
    Insert,
    /// CDC `__$operation` 3 (before image) paired with 4 (after image).
    Update,
    /// CDC `__$operation` 1.
    Delete,
}

impl Operation {
    /// The CES `operation` attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Insert => "INS",
            Operation::Update => "UPD",
            Operation::Delete => "DEL",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "INS" => Some(Operation::Insert),
            "UPD" => Some(Operation::Update),
            "DEL" => Some(Operation::Delete),
            _ => None,
        }
    }
}

/// One emitted column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnDescription {
    pub name: String,
    pub sql_type: SqlType,
    /// 0-based position of the column in the source table (`cols[].index`).
    pub index: u32,
    /// What an `[[event.columns]]` rule does to its values; `None` for data as read.
    pub mask: Option<columns::ColumnMask>,
    /// Whether the column allows NULL (true where the catalog does not say):
    /// Debezium's `optional`. Not part of the CES event.
    pub nullable: bool,
    /// The column's default as the catalog keeps its text (`((0))`): Debezium's
    /// schemas carry it. Not part of the CES event.
    pub default: Option<String>,
}

impl ColumnDescription {
    /// The `cols[].type` string: the SQL type, wrapped in what a column rule does
    /// to the values (`hashed(…)`, `redacted(…)`, `truncated(…,N)`), so that a
    /// consumer can tell a masked value from data.
    pub fn type_label(&self) -> String {
        match self.mask {
            None => self.sql_type.to_string(),
            Some(columns::ColumnMask::Hashed) => format!("hashed({})", self.sql_type),
            Some(columns::ColumnMask::Redacted) => format!("redacted({})", self.sql_type),
            Some(columns::ColumnMask::Truncated(n)) => {
                format!("truncated({},{n})", self.sql_type)
            }
        }
    }
}

/// What an event says about its table: names, emitted columns and key columns.
///
/// Built once per capture instance and shared by its events; the parts of `data` that
/// depend only on the table are serialized here, once.
#[derive(Debug, Clone, PartialEq)]
pub struct TableDescription {
    database: String,
    schema: String,
    table: String,
    columns: Vec<ColumnDescription>,
    key: Vec<usize>,
    /// The start of `data` at depth 0 and 1 (see [`json::push_string_at`]).
    json_prefix: [String; 2],
    /// `"Name":` of each column, written 0, 1 and 2 strings deep (row objects sit one
    /// level deeper than the `data` that holds them).
    row_keys: [Vec<String>; 3],
    avro_prefix: Vec<u8>,
}

/// Why a table description or change is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("key column position {position} is outside the {columns} emitted columns of {table}")]
    KeyOutOfRange {
        table: String,
        position: usize,
        columns: usize,
    },
    #[error("{table}: a {operation} row has {found} values, the table has {expected} columns")]
    RowShape {
        table: String,
        operation: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("{table}: a {operation} change is missing its {image} image")]
    MissingImage {
        table: String,
        operation: &'static str,
        image: &'static str,
    },
    #[error("{field} = {value} does not fit the Avro `int` of the CES schema")]
    AvroIntOverflow { field: &'static str, value: u64 },
    #[error(
        "max_message_size_kb leaves {available} bytes for data after the {overhead}-byte envelope"
    )]
    EnvelopeTooLarge { overhead: usize, available: usize },
}

impl TableDescription {
    /// `key` lists positions in `columns`, in key order (empty when the table has
    /// neither a primary key nor a unique index named by the capture instance).
    pub fn new(
        database: impl Into<String>,
        schema: impl Into<String>,
        table: impl Into<String>,
        columns: Vec<ColumnDescription>,
        key: Vec<usize>,
    ) -> Result<Self, EventError> {
        let (database, schema, table) = (database.into(), schema.into(), table.into());
        if let Some(&position) = key.iter().find(|&&p| p >= columns.len()) {
            return Err(EventError::KeyOutOfRange {
                table: format!("{schema}.{table}"),
                position,
                columns: columns.len(),
            });
        }
        let json_prefix = [0, 1]
            .map(|depth| json::eventsource_prefix(&database, &schema, &table, &columns, depth));
        let avro_prefix = avro::eventsource_prefix(&database, &schema, &table, &columns);
        let row_keys = [0, 1, 2].map(|depth| {
            columns
                .iter()
                .map(|c| json::object_key(&c.name, depth))
                .collect()
        });
        Ok(TableDescription {
            database,
            schema,
            table,
            columns,
            key,
            json_prefix,
            row_keys,
            avro_prefix,
        })
    }

    pub fn database(&self) -> &str {
        &self.database
    }
    pub fn schema(&self) -> &str {
        &self.schema
    }
    pub fn table(&self) -> &str {
        &self.table
    }
    pub fn columns(&self) -> &[ColumnDescription] {
        &self.columns
    }
    /// Positions in [`columns`](Self::columns) of the key columns, in key order.
    pub fn key(&self) -> &[usize] {
        &self.key
    }
    /// `schema.table`, for logs and the `Table` partition key.
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }
    /// Depth 0 or 1; the depth is always one of the two (a constant at each call).
    pub(crate) fn json_prefix(&self, depth: usize) -> &str {
        &self.json_prefix[depth.min(1)]
    }
    /// The row-object keys written `depth` (0 to 2) strings deep.
    pub(crate) fn row_keys(&self, depth: usize) -> &[String] {
        &self.row_keys[depth.min(2)]
    }
    pub(crate) fn avro_prefix(&self) -> &[u8] {
        &self.avro_prefix
    }
}

/// A row image: one value per emitted column, in column order.
pub type Row = Vec<Value>;

/// One paired row change, ready to become an event.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub table: Arc<TableDescription>,
    pub operation: Operation,
    /// `__$start_lsn`: the commit LSN of the transaction.
    pub commit_lsn: Lsn,
    /// `tran_begin_lsn` from `cdc.lsn_time_mapping`.
    pub begin_lsn: Lsn,
    /// `__$seqval`: the change's own LSN within its transaction ([`Lsn::ZERO`] for a
    /// loaded row). Debezium's `change_lsn`.
    pub change_lsn: Lsn,
    /// 1-based position of the event within its transaction, across all tables.
    pub sequence_number: u64,
    /// True when no later event of the same transaction exists.
    pub last_in_transaction: bool,
    /// Commit time as it is to be printed with a `Z` suffix.
    pub commit_time: DateTime<Utc>,
    /// Before image: `None` for inserts.
    pub old: Option<Row>,
    /// After image: `None` for deletes.
    pub current: Option<Row>,
    /// A change CDC recorded, or a row of an initial load.
    pub origin: Origin,
}

/// Where an event comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    /// A change row of a capture instance.
    #[default]
    Cdc,
    /// A row an initial load read from the table itself. Its message ids derive from
    /// `id_seed` (a function of the stream, the load's LSN, the table and the row's
    /// key), never from the sequence number, so they are distinct from every CDC
    /// event's and the same whenever the same row is sent again. Its `logicalid`
    /// carries `logical_sequence`, unique across the tables loaded at one LSN (the
    /// `sequencenumber` in `data` counts the table's own rows).
    Load {
        id_seed: Uuid,
        logical_sequence: u64,
        /// Read by a re-snapshot while changes streamed (`mssql-ces snapshot`), not
        /// by the initial load: the same CES event, and Debezium's
        /// `snapshot = "incremental"`.
        incremental: bool,
    },
}

impl Change {
    /// Checks that the images present match the operation and the table's columns.
    pub fn validate(&self) -> Result<(), EventError> {
        let table = || self.table.qualified_name();
        let operation = self.operation.as_str();
        let needs_old = matches!(self.operation, Operation::Update | Operation::Delete);
        let needs_current = matches!(self.operation, Operation::Update | Operation::Insert);
        for (image, row, needed) in [
            ("old", &self.old, needs_old),
            ("current", &self.current, needs_current),
        ] {
            match row {
                None if needed => {
                    return Err(EventError::MissingImage {
                        table: table(),
                        operation,
                        image,
                    });
                }
                Some(values) if values.len() != self.table.columns().len() => {
                    return Err(EventError::RowShape {
                        table: table(),
                        operation,
                        expected: self.table.columns().len(),
                        found: values.len(),
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The image whose values identify the row: the after image, or the before image
    /// of a delete.
    pub fn key_image(&self) -> Option<&Row> {
        self.current.as_ref().or(self.old.as_ref())
    }

    /// `(column name, value)` of each key column, in key order.
    pub fn key_values(&self) -> impl Iterator<Item = (&str, &Value)> {
        let image = self.key_image();
        self.table.key().iter().filter_map(move |&position| {
            let column = self.table.columns().get(position)?;
            let value = image?.get(position)?;
            Some((column.name.as_str(), value))
        })
    }
}

/// How events are serialized.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// JSON.
    Json,
    /// Avro: CES's schemas (`schemas/`), or Confluent's wire format with
    /// `[sink.schema_registry]`.
    Avro,
}

impl std::fmt::Display for Encoding {
    /// As the configuration writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Encoding::Json => "json",
            Encoding::Avro => "avro",
        })
    }
}

impl Encoding {
    pub fn content_type(self) -> &'static str {
        match self {
            Encoding::Json => JSON_CONTENT_TYPE,
            Encoding::Avro => AVRO_CONTENT_TYPE,
        }
    }
}

/// What `finalevent` says.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum FinalEventMode {
    /// True on the last event of each transaction.
    #[default]
    LastInTransaction,
    /// Always false, as CES writes it.
    AlwaysFalse,
}

/// The settings that shape every message.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderOptions {
    /// The stream GUID in `logicalid` and in message ids (default: the database GUID).
    pub stream_guid: Uuid,
    pub encoding: Encoding,
    pub final_event: FinalEventMode,
    pub max_message_size: MessageSizeLimit,
}

/// One message on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: Uuid,
    pub segment_index: u32,
    pub final_segment: bool,
    /// The serialized CloudEvent (structured mode), or from a data-only encoder
    /// ([`Encoder::data_only`]) this message's `data` alone: for a segment, its part
    /// of the whole `data` (JSON: the text, unescaped; Avro: the bytes).
    pub bytes: Vec<u8>,
}

/// The messages of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedEvent {
    pub logical_id: String,
    pub messages: Vec<Message>,
    /// How many column values were truncated to 1 MiB.
    pub truncated_values: usize,
    /// Each message's `bytes` are its `data` alone (an [`Encoder::data_only`]
    /// encoder): for CloudEvents binary mode, which puts the attributes in headers
    /// and so needs no envelope written and parsed again. Otherwise whole structured
    /// messages. Segmentation is the same either way: it is decided on the
    /// structured messages' sizes.
    pub data_only: bool,
}

/// The attributes of an event that every one of its segments repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EnvelopeFields<'a> {
    /// `type`: [`EVENT_TYPE`] for CES's change events,
    /// [`schema_change::SCHEMA_CHANGE_TYPE`] for ours.
    pub event_type: &'static str,
    pub logical_id: &'a str,
    pub time: &'a str,
    pub content_type: &'static str,
    pub operation: &'static str,
}

/// Turns changes into messages.
#[derive(Debug, Clone)]
pub struct Encoder {
    options: EncoderOptions,
    data_only: bool,
}

impl Encoder {
    pub fn new(options: EncoderOptions) -> Self {
        Encoder {
            options,
            data_only: false,
        }
    }

    /// With `true`, every message of an event is encoded as its `data` alone
    /// ([`EncodedEvent::data_only`]), for binary mode, whose headers the router builds
    /// from the change: no envelope is written and parsed again. Whether an event fits
    /// one message, and where its segments are cut, is decided on the structured
    /// messages' sizes, so segmentation is the same in both modes.
    pub fn data_only(mut self, data_only: bool) -> Self {
        self.data_only = data_only;
        self
    }

    pub fn options(&self) -> &EncoderOptions {
        &self.options
    }

    /// Whether messages are `data` alone ([`data_only`](Self::data_only)).
    pub fn is_data_only(&self) -> bool {
        self.data_only
    }

    /// The change's `logicalid`: a CDC event's sequence number, a loaded row's number
    /// in its load's own range.
    fn logical_id(&self, change: &Change) -> String {
        let sequence = match change.origin {
            Origin::Cdc => change.sequence_number,
            Origin::Load {
                logical_sequence, ..
            } => logical_sequence,
        };
        logical_id(self.options.stream_guid, change.commit_lsn, sequence)
    }

    /// Encodes one change: truncate, serialize `data`, then segment. The change is
    /// copied only when one of its values has to be truncated.
    pub fn encode(&self, change: &Change) -> Result<EncodedEvent, EventError> {
        change.validate()?;
        let mut truncated_values = 0;
        let needs_cut = [change.old.as_ref(), change.current.as_ref()]
            .into_iter()
            .flatten()
            .flatten()
            .any(segment::exceeds_value_limit);
        let owned;
        let change = if needs_cut {
            let mut copy = change.clone();
            for row in [copy.old.as_mut(), copy.current.as_mut()]
                .into_iter()
                .flatten()
            {
                truncated_values += segment::truncate_row(row);
            }
            owned = copy;
            &owned
        } else {
            change
        };
        let final_event = match self.options.final_event {
            FinalEventMode::LastInTransaction => change.last_in_transaction,
            FinalEventMode::AlwaysFalse => false,
        };
        let logical_id = self.logical_id(change);
        let time = format_time(change.commit_time);
        let fields = EnvelopeFields {
            event_type: EVENT_TYPE,
            logical_id: &logical_id,
            time: &time,
            content_type: self.options.encoding.content_type(),
            operation: change.operation.as_str(),
        };
        let id_for = |segment| match change.origin {
            Origin::Cdc => message_id(
                self.options.stream_guid,
                change.commit_lsn,
                change.sequence_number,
                segment,
            ),
            Origin::Load { id_seed, .. } => load_message_id(id_seed, segment),
        };
        let limit = self.options.max_message_size.bytes();
        let first_id = id_for(0);
        let whole = match self.options.encoding {
            Encoding::Json => {
                // When the text and binary values alone exceed the limit, the message
                // cannot fit: go straight to splitting instead of writing it whole
                // first. (Only these kinds can be large; summing them is a cheap lower
                // bound that allocates nothing.)
                let value_bytes: usize = [change.old.as_ref(), change.current.as_ref()]
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|v| matches!(v, Value::Text(_) | Value::Binary(_)))
                    .map(Value::text_len)
                    .sum();
                if value_bytes > limit {
                    let data = json::data_text(change, &time, final_event);
                    let messages =
                        segment::split_json(&fields, &data, limit, id_for, self.data_only)?;
                    return Ok(self.segmented(logical_id, messages, truncated_values));
                }
                if self.data_only {
                    let data = json::data_text(change, &time, final_event);
                    let whole =
                        json::envelope_overhead(&fields, 0, true) + json::escaped_size(&data);
                    if whole <= limit {
                        return Ok(Self::only_data(
                            logical_id,
                            first_id,
                            data.into_bytes(),
                            truncated_values,
                        ));
                    }
                    let messages =
                        segment::split_json(&fields, &data, limit, id_for, self.data_only)?;
                    return Ok(self.segmented(logical_id, messages, truncated_values));
                }
                json::single_message(&fields, &first_id, change, final_event)
            }
            Encoding::Avro => {
                let data = avro::data_datum(change, &time, final_event)?;
                let whole = avro::envelope(&fields, &first_id, 0, true, &data)?;
                if whole.len() > limit {
                    let messages =
                        segment::split_avro(&fields, &data, limit, id_for, self.data_only)?;
                    return Ok(self.segmented(logical_id, messages, truncated_values));
                }
                if self.data_only {
                    return Ok(Self::only_data(
                        logical_id,
                        first_id,
                        data,
                        truncated_values,
                    ));
                }
                whole
            }
        };
        let messages = if whole.len() <= limit {
            vec![Message {
                id: first_id,
                segment_index: 0,
                final_segment: true,
                bytes: whole,
            }]
        } else {
            // Only JSON reaches here: the data text is needed to cut it.
            drop(whole);
            let data = json::data_text(change, &time, final_event);
            segment::split_json(&fields, &data, limit, id_for, self.data_only)?
        };
        Ok(self.segmented(logical_id, messages, truncated_values))
    }

    /// The messages of an event (one, or the segments): whole structured messages,
    /// or from a data-only encoder each message's `data` alone.
    fn segmented(
        &self,
        logical_id: String,
        messages: Vec<Message>,
        truncated_values: usize,
    ) -> EncodedEvent {
        EncodedEvent {
            logical_id,
            messages,
            truncated_values,
            data_only: self.data_only,
        }
    }

    fn only_data(
        logical_id: String,
        id: Uuid,
        data: Vec<u8>,
        truncated_values: usize,
    ) -> EncodedEvent {
        EncodedEvent {
            logical_id,
            messages: vec![Message {
                id,
                segment_index: 0,
                final_segment: true,
                bytes: data,
            }],
            truncated_values,
            data_only: true,
        }
    }
}

/// The message id of segment `segment` of a loaded row: UUID v5 of the row's id seed
/// and the segment index under [`MESSAGE_ID_NAMESPACE`]. The name is 20 bytes where a
/// CDC event's is 38, so no loaded row's id can equal a CDC event's.
fn load_message_id(id_seed: Uuid, segment: u32) -> Uuid {
    let mut name = [0u8; 16 + 4];
    name[..16].copy_from_slice(id_seed.as_bytes());
    name[16..].copy_from_slice(&segment.to_be_bytes());
    Uuid::new_v5(&MESSAGE_ID_NAMESPACE, &name)
}

/// The message id of segment `segment` of a change: a CDC event's from its
/// position, a loaded row's from its seed (as [`Encoder::encode`] gives them).
pub fn event_message_id(stream_guid: Uuid, change: &Change, segment: u32) -> Uuid {
    match change.origin {
        Origin::Cdc => message_id(
            stream_guid,
            change.commit_lsn,
            change.sequence_number,
            segment,
        ),
        Origin::Load { id_seed, .. } => load_message_id(id_seed, segment),
    }
}

/// `<stream GUID>:<commit LSN, 20 hex>:<sequence number, 20 digits>`.
pub fn logical_id(stream_guid: Uuid, commit_lsn: Lsn, sequence_number: u64) -> String {
    let mut out = String::with_capacity(36 + 1 + 20 + 1 + 20);
    let mut buf = Uuid::encode_buffer();
    out.push_str(stream_guid.hyphenated().encode_lower(&mut buf));
    out.push(':');
    crate::lsn::push_hex(&mut out, commit_lsn.as_bytes());
    out.push(':');
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(sequence_number);
    out.extend(std::iter::repeat_n('0', 20 - digits.len()));
    out.push_str(digits);
    out
}

/// The deterministic message id: UUID v5 of (stream GUID, commit LSN, sequence number,
/// segment index) under [`MESSAGE_ID_NAMESPACE`]. A message re-sent after a crash has
/// the same id, so consumers can drop duplicates.
pub fn message_id(stream_guid: Uuid, commit_lsn: Lsn, sequence_number: u64, segment: u32) -> Uuid {
    let mut name = [0u8; 16 + 10 + 8 + 4];
    name[..16].copy_from_slice(stream_guid.as_bytes());
    name[16..26].copy_from_slice(commit_lsn.as_bytes());
    name[26..34].copy_from_slice(&sequence_number.to_be_bytes());
    name[34..].copy_from_slice(&segment.to_be_bytes());
    Uuid::new_v5(&MESSAGE_ID_NAMESPACE, &name)
}

/// `yyyy-MM-ddTHH:mm:ss.fffZ`, rounded to the millisecond like SQL Server's `datetime`.
pub fn format_time(time: DateTime<Utc>) -> String {
    let mut out = String::with_capacity(24);
    value::write_datetime_millis(&mut out, time.naive_utc(), 'T');
    out.push('Z');
    out
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Builders for tests: a small table and changes on it.
    use super::*;
    use chrono::{NaiveDate, TimeZone};

    pub(crate) fn column(name: &str, sql_type: SqlType, index: u32) -> ColumnDescription {
        ColumnDescription {
            name: name.into(),
            sql_type,
            index,
            mask: None,
            nullable: true,
            default: None,
        }
    }

    /// `EmployeesDb.dbo.Employees` as in the CES documentation's examples.
    pub(crate) fn employees() -> Arc<TableDescription> {
        Arc::new(
            TableDescription::new(
                "EmployeesDb",
                "dbo",
                "Employees",
                vec![
                    column("Id", SqlType::Int, 0),
                    column("FirstName", SqlType::NVarChar(Length::Bounded(50)), 1),
                    column("LastName", SqlType::NVarChar(Length::Bounded(50)), 2),
                    column("SignupDate", SqlType::DateTime2 { scale: 7 }, 3),
                ],
                vec![0],
            )
            .unwrap(),
        )
    }

    pub(crate) fn employee_row(id: i32, first: &str, last: &str) -> Row {
        let signup = NaiveDate::from_ymd_opt(2026, 8, 7)
            .unwrap()
            .and_hms_nano_opt(16, 25, 0, 883_333_300)
            .unwrap();
        vec![
            Value::Int(id),
            Value::Text(first.into()),
            Value::Text(last.into()),
            Value::DateTime2 {
                value: signup,
                scale: 7,
            },
        ]
    }

    pub(crate) fn insert(table: Arc<TableDescription>, row: Row) -> Change {
        Change {
            table,
            operation: Operation::Insert,
            commit_lsn: Lsn::from_parts(0xB1, 0x8A8, 7),
            begin_lsn: Lsn::from_parts(0xB1, 0x8A8, 3),
            change_lsn: Lsn::from_parts(0xB1, 0x8A8, 5),
            sequence_number: 1,
            last_in_transaction: true,
            commit_time: Utc.with_ymd_and_hms(2026, 8, 7, 16, 25, 0).unwrap()
                + chrono::Duration::milliseconds(890),
            old: None,
            current: Some(row),
            origin: Origin::Cdc,
        }
    }

    #[allow(dead_code)]
    pub(crate) fn options(encoding: Encoding) -> EncoderOptions {
        EncoderOptions {
            stream_guid: Uuid::parse_str("1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0").unwrap(),
            encoding,
            final_event: FinalEventMode::LastInTransaction,
            max_message_size: MessageSizeLimit::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn logical_id_has_the_ces_shape() {
        let guid = Uuid::parse_str("1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0").unwrap();
        assert_eq!(
            logical_id(guid, Lsn::from_parts(0xB1, 0x8A8, 7), 1),
            "1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0:000000B1000008A80007:00000000000000000001"
        );
        assert_eq!(
            logical_id(guid, Lsn::MAX, u64::MAX).rsplit(':').next(),
            Some("18446744073709551615")
        );
    }

    #[test]
    fn message_id_matches_the_documented_derivation() {
        // Computed outside this code base (Python's hashlib) from the recipe in `docs/src/event-format.md`:
        // SHA-1 over namespace ‖ GUID ‖ LSN ‖ u64 BE sequence ‖ u32 BE segment.
        let guid = Uuid::parse_str("1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0").unwrap();
        assert_eq!(
            message_id(guid, Lsn::from_parts(0xB1, 0x8A8, 7), 1, 0).to_string(),
            "d7a586db-c0ad-5681-900d-c7440c7ad456"
        );
    }

    #[test]
    fn message_ids_are_deterministic_and_distinct() {
        let guid = Uuid::parse_str("1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0").unwrap();
        let lsn = Lsn::from_parts(0xB1, 0x8A8, 7);
        let a = message_id(guid, lsn, 1, 0);
        assert_eq!(a, message_id(guid, lsn, 1, 0));
        assert_eq!(a.get_version_num(), 5);
        let others = [
            message_id(guid, lsn, 1, 1),
            message_id(guid, lsn, 2, 0),
            message_id(guid, Lsn::from_parts(0xB1, 0x8A8, 8), 1, 0),
            message_id(Uuid::nil(), lsn, 1, 0),
        ];
        for other in others {
            assert_ne!(a, other);
        }
    }

    #[test]
    fn time_is_utc_with_milliseconds() {
        use chrono::TimeZone;
        let t = Utc.with_ymd_and_hms(2026, 8, 7, 16, 25, 0).unwrap()
            + chrono::Duration::nanoseconds(889_999_999);
        assert_eq!(format_time(t), "2026-08-07T16:25:00.890Z");
    }

    #[test]
    fn malformed_changes_are_rejected() {
        let table = employees();
        let mut change = insert(table.clone(), employee_row(1, "a", "b"));
        assert_eq!(change.validate(), Ok(()));
        change.current = Some(vec![Value::Int(1)]);
        assert!(matches!(
            change.validate(),
            Err(EventError::RowShape {
                expected: 4,
                found: 1,
                ..
            })
        ));
        change.operation = Operation::Update;
        change.current = Some(employee_row(1, "a", "b"));
        assert!(matches!(
            change.validate(),
            Err(EventError::MissingImage { image: "old", .. })
        ));
        let err = TableDescription::new("d", "s", "t", vec![], vec![0]).unwrap_err();
        assert!(matches!(err, EventError::KeyOutOfRange { position: 0, .. }));
    }

    #[test]
    fn key_values_come_from_the_after_image_or_the_deleted_row() {
        let table = employees();
        let mut change = insert(table, employee_row(8, "a", "b"));
        let keys: Vec<_> = change.key_values().collect();
        assert_eq!(keys, vec![("Id", &Value::Int(8))]);
        change.operation = Operation::Delete;
        change.old = change.current.take();
        let keys: Vec<_> = change.key_values().collect();
        assert_eq!(keys, vec![("Id", &Value::Int(8))]);
    }
}

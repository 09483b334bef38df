//! The encoder: one change to its Debezium records, with the state numbering
//! needs across events.

use std::sync::Arc;

use uuid::Uuid;

use super::connect::write_string;
use super::payload::{TimeField, key_payload, push_times, row_payload};
use super::record_schemas::{
    Shape, TableSchemas, build_schemas, source_schema, transaction_shapes,
};
use super::{
    AvroSchemas, DebeziumError, DebeziumSettings, OpenTransaction, Record, RecordBound,
    SOURCE_VERSION, lsn_text, schema_change,
};
use crate::event::{Change, Operation, Origin, Row, TableDescription, Value, segment};
use crate::lsn::Lsn;

/// Turns changes into Debezium records. Holds the state that numbering needs
/// across events: `event_serial_no` and the open transaction.
#[derive(Debug)]
pub struct DebeziumEncoder {
    pub(super) settings: Arc<DebeziumSettings>,
    pub(super) stream_guid: Uuid,
    /// The largest record the destination takes.
    pub(super) bound: RecordBound,
    pub(super) tables: crate::event::PerTable<Arc<TableSchemas>>,
    pub(super) last_change: Option<(Lsn, Lsn)>,
    pub(super) serial: i64,
    pub(super) transaction: Option<OpenTransaction>,
    /// The processing time, for tests (`None`: the clock).
    pub(super) now: Option<chrono::DateTime<chrono::Utc>>,
    /// Avro datums rather than JsonConverter's JSON.
    pub(super) avro: bool,
    /// The transaction topic's key and value schemas.
    pub(super) transaction_shapes: Arc<(Shape, Shape)>,
    /// The schema-change topic's key and value schemas.
    pub(super) schema_change_shapes: Arc<(Shape, Shape)>,
    /// Where schema-change events go (a template like `sink.topic`'s).
    pub(super) schema_topic: String,
}

impl DebeziumEncoder {
    pub fn new(
        settings: Arc<DebeziumSettings>,
        stream_guid: Uuid,
        bound: RecordBound,
        open: Option<OpenTransaction>,
    ) -> Self {
        DebeziumEncoder {
            settings,
            stream_guid,
            bound,
            tables: Default::default(),
            last_change: None,
            serial: 0,
            transaction: open,
            now: None,
            avro: false,
            transaction_shapes: Arc::new(transaction_shapes()),
            schema_change_shapes: Arc::new({
                let (key, value) = schema_change::schemas(source_schema());
                (Shape::of(key), Shape::of(value))
            }),
            schema_topic: String::new(),
        }
    }

    /// Schema-change events go to `topic` (a template over `{db}`, `{schema}`,
    /// `{tbl}`; Debezium's is the topic prefix alone).
    pub fn with_schema_topic(mut self, topic: String) -> Self {
        self.schema_topic = topic;
        self
    }

    /// Avro datums (for a schema registry) instead of JSON.
    pub fn with_avro(mut self, avro: bool) -> Self {
        self.avro = avro;
        self
    }

    /// Fixes the envelope's `ts_*` (tests compare whole messages).
    pub fn with_clock(mut self, now: chrono::DateTime<chrono::Utc>) -> Self {
        self.now = Some(now);
        self
    }

    /// The transaction still open after the last event encoded, if any.
    pub fn open_transaction(&self) -> Option<OpenTransaction> {
        self.transaction.clone()
    }

    fn schemas(&mut self, table: &Arc<TableDescription>) -> Arc<TableSchemas> {
        let settings = &self.settings;
        self.tables
            .get_or_insert(table, || Arc::new(build_schemas(table, settings)))
    }

    /// The records of one change, in order (transaction events included).
    pub fn encode(&mut self, change: &Change) -> Result<Vec<Record>, DebeziumError> {
        let owned;
        let change = match truncated(change) {
            Some(copy) => {
                owned = copy;
                &owned
            }
            None => change,
        };
        let loaded = matches!(change.origin, Origin::Load { .. });
        let transactional = self.settings.provide_transaction_metadata && !loaded;
        let mut out = Vec::new();
        if transactional {
            self.begin_transaction(change, &mut out);
        }
        let schemas = self.schemas(&change.table);
        let key_of = |row: Option<&Row>| {
            schemas.key.as_ref()?;
            Some(key_payload(&change.table, row?, &self.settings))
        };
        let (old_key, new_key) = (key_of(change.old.as_ref()), key_of(change.current.as_ref()));
        let one = ChangeRecords {
            serial: (!loaded).then(|| self.next_serial(change)),
            change,
            schemas,
            transactional,
        };
        let (old, current) = (change.old.as_ref(), change.current.as_ref());
        let plain = |op, before, after, key| Emit {
            op,
            images: (before, after),
            key,
            segment: 0,
            header: None,
        };
        match change.operation {
            _ if loaded => self.emit(&one, plain("r", None, current, &new_key), &mut out)?,
            Operation::Insert => self.emit(&one, plain("c", None, current, &new_key), &mut out)?,
            Operation::Delete => self.emit(&one, plain("d", old, None, &old_key), &mut out)?,
            // A key change as `RelationalChangeRecordEmitter` writes it.
            Operation::Update if old_key != new_key => {
                let text = |key: &Option<String>| key.clone().unwrap_or_default().into_bytes();
                let delete = Emit {
                    header: Some(("__debezium.newkey", text(&new_key))),
                    ..plain("d", old, None, &old_key)
                };
                self.emit(&one, delete, &mut out)?;
                let create = Emit {
                    segment: 2,
                    header: Some(("__debezium.oldkey", text(&old_key))),
                    ..plain("c", None, current, &new_key)
                };
                self.emit(&one, create, &mut out)?;
            }
            Operation::Update => self.emit(&one, plain("u", old, current, &new_key), &mut out)?,
        }
        if transactional && change.last_in_transaction {
            self.end_transaction(change, &mut out);
        }
        Ok(out)
    }

    /// `event_serial_no`: 1 for an insert or delete, 2 for an update, added up
    /// over events at one (`commit_lsn`, `change_lsn`).
    fn next_serial(&mut self, change: &Change) -> i64 {
        let count = if change.operation == Operation::Update {
            2
        } else {
            1
        };
        let at = (change.commit_lsn, change.change_lsn);
        if self.last_change == Some(at) {
            self.serial += count;
        } else {
            self.serial = count;
        }
        self.last_change = Some(at);
        self.serial
    }

    /// One record (and the tombstone after a delete) of a change.
    fn emit(
        &mut self,
        one: &ChangeRecords<'_>,
        emit: Emit<'_>,
        out: &mut Vec<Record>,
    ) -> Result<(), DebeziumError> {
        let change = one.change;
        let transaction = if one.transactional {
            self.count_event(&one.schemas.data_collection)
        } else {
            None
        };
        let value = self.envelope(
            change,
            &one.schemas,
            emit.op,
            emit.images,
            one.serial,
            transaction,
        )?;
        if value.len() > self.bound.bytes {
            let fits = |images: (Option<&Row>, Option<&Row>)| {
                self.envelope(
                    change,
                    &one.schemas,
                    emit.op,
                    images,
                    one.serial,
                    transaction,
                )
                .is_ok_and(|v| v.len() + FIT_MARGIN <= self.bound.bytes)
            };
            let rules = fitting_rules(&change.table, emit.images, fits);
            return Err(DebeziumError::TooLarge {
                table: change.table.qualified_name(),
                key: emit.key.clone().unwrap_or_else(|| "(none)".into()),
                size: value.len(),
                limit: self.bound.bytes,
                bound: self.bound.what.to_owned(),
                fix: fix_text(&change.table, &rules, self.bound.raised_by),
            });
        }
        let key = match (emit.key, &one.schemas.key) {
            (Some(k), Some(shape)) => Some(self.serialize(shape, k)?),
            _ => None,
        };
        let id = |segment| crate::event::event_message_id(self.stream_guid, change, segment);
        let id_header = |id: uuid::Uuid| ("id", id.hyphenated().to_string().into_bytes());
        let message_id = id(emit.segment);
        let mut headers = vec![id_header(message_id)];
        headers.extend(emit.header);
        let avro = self.avro.then(|| AvroSchemas {
            key: one.schemas.key.as_ref().map(Shape::avro_schema),
            value: Some(one.schemas.value.avro_schema()),
        });
        let tombstone = (emit.op == "d" && self.settings.tombstones_on_delete).then(|| {
            // Debezium gives the tombstone the delete's headers; ours says the
            // tombstone's own id, so that each message has one of its own.
            let tombstone_id = id(emit.segment + 1);
            let mut headers = headers.clone();
            headers[0] = id_header(tombstone_id);
            Record {
                topic: None,
                key: key.clone(),
                value: None,
                headers,
                id: tombstone_id,
                avro: avro.clone(),
            }
        });
        out.push(Record {
            topic: None,
            key,
            value: Some(value),
            headers,
            id: message_id,
            avro,
        });
        out.extend(tombstone);
        Ok(())
    }

    /// The payload as the message's bytes: an Avro datum, or JSON.
    pub(super) fn serialize(&self, shape: &Shape, payload: &str) -> Result<Vec<u8>, DebeziumError> {
        if !self.avro {
            return Ok(self.wrap(&shape.json, payload));
        }
        let value: serde_json::Value =
            serde_json::from_str(payload).map_err(|e| DebeziumError::Avro(e.to_string()))?;
        let mut out = Vec::with_capacity(payload.len());
        shape
            .schema
            .write_avro_datum(&mut out, &value)
            .map_err(DebeziumError::Avro)?;
        Ok(out)
    }

    /// `{"schema":…,"payload":…}` or the payload alone.
    pub(super) fn wrap(&self, schema: &str, payload: &str) -> Vec<u8> {
        if !self.settings.schemas_enable {
            return payload.as_bytes().to_vec();
        }
        let mut out = String::with_capacity(schema.len() + payload.len() + 24);
        out.push_str("{\"schema\":");
        out.push_str(schema);
        out.push_str(",\"payload\":");
        out.push_str(payload);
        out.push('}');
        out.into_bytes()
    }

    fn envelope(
        &self,
        change: &Change,
        schemas: &TableSchemas,
        op: &str,
        (before, after): (Option<&Row>, Option<&Row>),
        serial: Option<i64>,
        transaction: Option<(u64, u64)>,
    ) -> Result<Vec<u8>, DebeziumError> {
        let settings = &self.settings;
        let mut p = String::with_capacity(512);
        p.push_str("{\"before\":");
        row_payload(&mut p, &change.table, before, settings)?;
        p.push_str(",\"after\":");
        row_payload(&mut p, &change.table, after, settings)?;
        p.push_str(",\"source\":{\"version\":");
        write_string(&mut p, SOURCE_VERSION);
        p.push_str(",\"connector\":\"sqlserver\",\"name\":");
        write_string(&mut p, &settings.topic_prefix);
        let commit = change.commit_time;
        push_times(&mut p, "ts_ms", commit, TimeField::Millis);
        p.push_str(",\"snapshot\":");
        p.push_str(match change.origin {
            Origin::Load {
                incremental: true, ..
            } => "\"incremental\"",
            Origin::Load { .. } => "\"true\"",
            Origin::Cdc => "\"false\"",
        });
        p.push_str(",\"db\":");
        write_string(&mut p, change.table.database());
        p.push_str(",\"sequence\":null");
        push_times(&mut p, "ts_us", commit, TimeField::Micros);
        push_times(&mut p, "ts_ns", commit, TimeField::Nanos);
        p.push_str(",\"schema\":");
        write_string(&mut p, change.table.schema());
        p.push_str(",\"table\":");
        write_string(&mut p, change.table.table());
        p.push_str(",\"change_lsn\":");
        if serial.is_some() {
            write_string(&mut p, &lsn_text(change.change_lsn));
        } else {
            p.push_str("null");
        }
        p.push_str(",\"commit_lsn\":");
        write_string(&mut p, &lsn_text(change.commit_lsn));
        p.push_str(",\"event_serial_no\":");
        match serial {
            Some(n) => p.push_str(itoa::Buffer::new().format(n)),
            None => p.push_str("null"),
        }
        p.push_str("},\"transaction\":");
        match transaction {
            Some((total, per_table)) => {
                p.push_str("{\"id\":");
                write_string(&mut p, &lsn_text(change.commit_lsn));
                p.push_str(",\"total_order\":");
                p.push_str(itoa::Buffer::new().format(total));
                p.push_str(",\"data_collection_order\":");
                p.push_str(itoa::Buffer::new().format(per_table));
                p.push('}');
            }
            None => p.push_str("null"),
        }
        p.push_str(",\"op\":");
        write_string(&mut p, op);
        let now = self.now.unwrap_or_else(chrono::Utc::now);
        push_times(&mut p, "ts_ms", now, TimeField::Millis);
        push_times(&mut p, "ts_us", now, TimeField::Micros);
        push_times(&mut p, "ts_ns", now, TimeField::Nanos);
        p.push('}');
        self.serialize(&schemas.value, &p)
    }
}

/// What the records of one change share.
struct ChangeRecords<'a> {
    change: &'a Change,
    schemas: Arc<TableSchemas>,
    /// `event_serial_no`; `None` for a loaded row.
    serial: Option<i64>,
    transactional: bool,
}

/// One record to write: its `op`, images, key, segment (for its id) and an extra
/// header.
struct Emit<'a> {
    op: &'static str,
    images: (Option<&'a Row>, Option<&'a Row>),
    key: &'a Option<String>,
    segment: u32,
    header: Option<(&'static str, Vec<u8>)>,
}

/// Room left below the bound when column rules are suggested, for what a rule
/// changes besides the value (a column's type parameters in the schema).
const FIT_MARGIN: usize = 256;

/// A column rule that makes an oversized record smaller.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FittingRule {
    /// `truncate = N`.
    Truncate { column: usize, to: usize },
    /// `exclude = true`.
    Exclude { column: usize },
}

/// The column rules that make a record fit, largest columns first: the largest
/// character or binary column truncated as little as needed, or, where even an
/// empty value would not do, left out and the next one tried. Whether a record
/// fits is `fits`' answer for the images with the rules applied. Key columns take
/// no rule. Empty when no rule is enough (the key and the other columns alone are
/// too large).
fn fitting_rules(
    table: &TableDescription,
    (before, after): (Option<&Row>, Option<&Row>),
    fits: impl Fn((Option<&Row>, Option<&Row>)) -> bool,
) -> Vec<FittingRule> {
    // A value's length as a rule counts it (characters, bytes), and roughly what
    // it takes in the record (UTF-8; base64 for bytes), which orders the columns.
    let measure = |value: &Value| match value {
        Value::Text(text) => Some((text.chars().count(), text.len())),
        Value::Binary(bytes) => Some((bytes.len(), bytes.len() / 3 * 4)),
        _ => None,
    };
    let largest = |column: usize| {
        [before, after]
            .into_iter()
            .flatten()
            .filter_map(|row| row.get(column).and_then(measure))
            .max()
    };
    let mut columns: Vec<(usize, (usize, usize))> = (0..table.columns().len())
        .filter(|c| !table.key().contains(c))
        .filter_map(|c| largest(c).map(|size| (c, size)))
        .filter(|(_, (len, _))| *len > 0)
        .collect();
    columns.sort_by(|a, b| b.1.1.cmp(&a.1.1).then(a.0.cmp(&b.0)));
    let (mut before, mut after) = (before.cloned(), after.cloned());
    let mut rules = Vec::new();
    for (column, (len, _)) in columns {
        let cut = |to: Option<usize>, before: &Option<Row>, after: &Option<Row>| {
            let apply = |row: &Option<Row>| {
                row.clone().map(|mut row| {
                    if let Some(value) = row.get_mut(column) {
                        *value = match (to, std::mem::replace(value, Value::Null)) {
                            (None, _) => Value::Null,
                            (Some(n), Value::Text(text)) => {
                                Value::Text(text.chars().take(n).collect())
                            }
                            (Some(n), Value::Binary(mut bytes)) => {
                                bytes.truncate(n);
                                Value::Binary(bytes)
                            }
                            (Some(_), other) => other,
                        };
                    }
                    row
                })
            };
            (apply(before), apply(after))
        };
        let fits_cut = |to: usize| {
            let (b, a) = cut(Some(to), &before, &after);
            fits((b.as_ref(), a.as_ref()))
        };
        if fits_cut(0) {
            // The longest prefix that fits: fits_cut(low) holds, fits_cut(high) not.
            let (mut low, mut high) = (0, len);
            while high - low > 1 {
                let middle = low + (high - low) / 2;
                if fits_cut(middle) {
                    low = middle;
                } else {
                    high = middle;
                }
            }
            rules.push(FittingRule::Truncate { column, to: low });
            return rules;
        }
        (before, after) = cut(None, &before, &after);
        rules.push(FittingRule::Exclude { column });
        if fits((before.as_ref(), after.as_ref())) {
            return rules;
        }
    }
    Vec::new()
}

/// What to do about an oversized record: the column rules that make it fit, and
/// the setting that raises the limit where there is one.
fn fix_text(table: &TableDescription, rules: &[FittingRule], raised_by: Option<&str>) -> String {
    let name = |column: usize| {
        format!(
            "{}.{}.{}",
            table.schema(),
            table.table(),
            table.columns()[column].name
        )
    };
    let rules: Vec<String> = rules
        .iter()
        .map(|rule| match rule {
            FittingRule::Truncate { column, to } => {
                format!("{{ column = \"{}\", truncate = {to} }}", name(*column))
            }
            FittingRule::Exclude { column } => {
                format!("{{ column = \"{}\", exclude = true }}", name(*column))
            }
        })
        .collect();
    let rules = if rules.is_empty() {
        "no column rule makes it fit (its key and other columns alone are too large)".to_owned()
    } else {
        format!(
            "these column rules make it fit, as [[event.columns]] tables: {}",
            rules.join(", ")
        )
    };
    match raised_by {
        Some(setting) => format!("{rules}; or raise {setting}"),
        None => format!("{rules} (the limit is the destination's largest)"),
    }
}

/// The change with values over 1 MiB truncated as CES truncates them; `None` when
/// none is.
fn truncated(change: &Change) -> Option<Change> {
    let needs_cut = [change.old.as_ref(), change.current.as_ref()]
        .into_iter()
        .flatten()
        .flatten()
        .any(segment::exceeds_value_limit);
    if !needs_cut {
        return None;
    }
    let mut copy = change.clone();
    for row in [copy.old.as_mut(), copy.current.as_mut()]
        .into_iter()
        .flatten()
    {
        segment::truncate_row(row);
    }
    Some(copy)
}

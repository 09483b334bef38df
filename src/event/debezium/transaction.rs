//! Transaction metadata (`provide_transaction_metadata`): `BEGIN` and `END` on the
//! transaction topic, and the counts each event's `transaction` block carries.

use std::sync::Arc;

use super::connect::write_string;
use super::encoder::DebeziumEncoder;
use super::payload::{TimeField, push_times};
use super::record_schemas::Shape;
use super::{AvroSchemas, OpenTransaction, Record, lsn_text};
use crate::event::Change;
use crate::event::sanitize_topic;

impl DebeziumEncoder {
    /// Opens the change's transaction when it is a new one; `BEGIN` when the
    /// change is its first event.
    pub(super) fn begin_transaction(&mut self, change: &Change, out: &mut Vec<Record>) {
        if self
            .transaction
            .as_ref()
            .is_some_and(|t| t.commit_lsn == change.commit_lsn)
        {
            return;
        }
        self.transaction = Some(OpenTransaction {
            commit_lsn: change.commit_lsn,
            // Resumed inside a transaction without its counts: number on from the
            // sequence number (per-table orders start over; said in `docs/src/formats.md`).
            total: change.sequence_number.saturating_sub(1),
            tables: Vec::new(),
        });
        if change.sequence_number <= 1 {
            out.push(self.transaction_record(change, "BEGIN"));
        }
    }

    /// Counts one event of the open transaction: `(total_order,
    /// data_collection_order)`.
    pub(super) fn count_event(&mut self, collection: &str) -> Option<(u64, u64)> {
        let t = self.transaction.as_mut()?;
        t.total += 1;
        let per_table = match t.tables.iter_mut().find(|(c, _)| c == collection) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                t.tables.push((collection.to_owned(), 1));
                1
            }
        };
        Some((t.total, per_table))
    }

    pub(super) fn end_transaction(&mut self, change: &Change, out: &mut Vec<Record>) {
        out.push(self.transaction_record(change, "END"));
        self.transaction = None;
    }

    /// A `BEGIN` or `END` record of the change's transaction.
    pub(super) fn transaction_record(&self, change: &Change, status: &str) -> Record {
        let id = lsn_text(change.commit_lsn);
        let mut key = String::from("{\"id\":");
        write_string(&mut key, &id);
        key.push('}');
        let mut value = String::from("{\"status\":");
        write_string(&mut value, status);
        value.push_str(",\"id\":");
        write_string(&mut value, &id);
        match (&self.transaction, status) {
            (Some(t), "END") => {
                value.push_str(",\"event_count\":");
                value.push_str(itoa::Buffer::new().format(t.total));
                value.push_str(",\"data_collections\":[");
                for (i, (collection, count)) in t.tables.iter().enumerate() {
                    if i > 0 {
                        value.push(',');
                    }
                    value.push_str("{\"data_collection\":");
                    write_string(&mut value, collection);
                    value.push_str(",\"event_count\":");
                    value.push_str(itoa::Buffer::new().format(*count));
                    value.push('}');
                }
                value.push(']');
            }
            _ => value.push_str(",\"event_count\":null,\"data_collections\":null"),
        }
        push_times(&mut value, "ts_ms", change.commit_time, TimeField::Millis);
        value.push('}');
        let shapes = Arc::clone(&self.transaction_shapes);
        let (key_shape, value_shape) = (&shapes.0, &shapes.1);
        // BEGIN and END of one transaction: ids of their own, apart from the
        // events' (segment indexes past any an event uses).
        let segment = if status == "BEGIN" {
            0xFFFF_FFF0
        } else {
            0xFFFF_FFF1
        };
        let message_id = crate::event::message_id(self.stream_guid, change.commit_lsn, 0, segment);
        // Our own JSON of our own schemas: it always fits them.
        let bytes = |shape: &Shape, payload: &str| {
            self.serialize(shape, payload)
                .unwrap_or_else(|_| payload.as_bytes().to_vec())
        };
        Record {
            topic: Some(sanitize_topic(&self.settings.transaction_topic())),
            key: Some(bytes(key_shape, &key)),
            value: Some(bytes(value_shape, &value)),
            headers: vec![("id", message_id.hyphenated().to_string().into_bytes())],
            id: message_id,
            avro: self.avro.then(|| AvroSchemas {
                key: Some(key_shape.avro_schema()),
                value: Some(value_shape.avro_schema()),
            }),
        }
    }
}

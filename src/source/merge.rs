//! From ordered change rows to events: pairing, sequence numbers, `finalevent`.
//!
//! Pure and source-agnostic. The poller merges the rows of all capture instances into
//! one stream in (`__$start_lsn`, `__$command_id`, `__$seqval`, `__$operation`) order
//! ([`smallest_head`]) and feeds it, row by row, to a [`Sequencer`], which:
//!
//! - pairs each op 3 (update before-image) with the op 4 that must follow it at once
//!   (same table, LSN, command and seqval) into one `UPD`; anything else is an error
//!   naming the row, never a silent drop;
//! - fills the before-image's LOB columns that CDC leaves NULL when they did not
//!   change (`__$update_mask` bit clear) from the after-image, where the value is the
//!   same;
//! - numbers events 1, 2, 3… within each transaction (all rows of a transaction share
//!   `__$start_lsn`), across tables, an update pair counting once;
//! - holds the last event back until the next one (or the end of the range) shows
//!   whether it ends its transaction, so a page boundary never marks a false end.

use std::collections::VecDeque;
use std::sync::Arc;

use chrono::NaiveDateTime;

use crate::event::{Change, ColumnDescription, Operation, Row, TableDescription, Value};
use crate::lsn::Lsn;
use crate::source::timezone::{CommitClock, CommitTimeZone};
use crate::source::{
    CaptureInstance, ChangeRow, DroppedColumn, EmittedColumn, RowKey, ServerOffsets, SourceError,
    is_bit_set, op,
};

/// What the merge needs to know about a capture instance to build its events.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceContext {
    pub name: String,
    /// The table as it is now (its emitted columns): what loads read, and the shape
    /// of change rows committed after every drop the history records.
    pub table: Arc<TableDescription>,
    /// How many values a change row has ([`CaptureInstance::change_columns`]).
    row_width: usize,
    /// The shapes of rows committed before a `DROP COLUMN` (each holds the dropped
    /// columns' values): `(bound, shape)` for rows below `bound`, bounds ascending.
    earlier: Vec<(Lsn, RowShape)>,
    /// The shape of rows at or above every bound.
    latest: RowShape,
}

/// The events of some change rows of an instance: their table description, and
/// which of a change row's values it takes.
#[derive(Debug, Clone, PartialEq)]
struct RowShape {
    table: Arc<TableDescription>,
    /// The positions in a change row of the shape's columns; `None`: all, in order.
    pick: Option<Vec<usize>>,
    /// `(position in the shape's row, CDC column ordinal)` of each LOB column.
    lob_columns: Vec<(usize, u32)>,
}

impl InstanceContext {
    /// Builds the table descriptions from the catalog: columns in column order, key
    /// columns by name (a key column of a type CES leaves out is skipped). A
    /// captured column dropped from the source table is in the events of the rows
    /// committed before its `DROP COLUMN`, at the position it had then.
    pub fn new(instance: &CaptureInstance, database: &str) -> Result<Self, SourceError> {
        let read: Vec<EmittedColumn<'_>> = instance.change_columns().collect();
        let dropped: Vec<(usize, DroppedColumn)> = read
            .iter()
            .enumerate()
            .filter_map(|(at, e)| e.column.dropped.map(|d| (at, d)))
            .collect();
        let shape =
            |shown: &[(usize, DroppedColumn)]| RowShape::new(instance, database, &read, shown);
        let table = shape(&[])?;
        let mut bounds: Vec<Lsn> = dropped.iter().filter_map(|(_, d)| d.at).collect();
        bounds.sort();
        bounds.dedup();
        // Rows below a bound hold every column dropped at or after it (or not yet
        // recorded as dropped).
        let shown_below = |bound: Option<Lsn>| -> Vec<(usize, DroppedColumn)> {
            dropped
                .iter()
                .copied()
                .filter(|(_, d)| match (d.at, bound) {
                    (None, _) => true,
                    (Some(at), Some(bound)) => at >= bound,
                    (Some(_), None) => false,
                })
                .collect()
        };
        let earlier = bounds
            .iter()
            .map(|&bound| Ok((bound, shape(&shown_below(Some(bound)))?)))
            .collect::<Result<Vec<_>, SourceError>>()?;
        let last = shown_below(None);
        let latest = if last.is_empty() {
            table.clone()
        } else {
            shape(&last)?
        };
        Ok(InstanceContext {
            name: instance.name.clone(),
            table: table.table,
            row_width: read.len(),
            earlier,
            latest,
        })
    }

    /// Every table description this instance's events can have.
    pub fn tables(&self) -> impl Iterator<Item = &Arc<TableDescription>> {
        std::iter::once(&self.table)
            .chain(self.earlier.iter().map(|(_, shape)| &shape.table))
            .chain(std::iter::once(&self.latest.table))
    }

    /// The shape of a row committed at `lsn`.
    fn shape_at(&self, lsn: Lsn) -> &RowShape {
        self.earlier
            .iter()
            .find(|(bound, _)| lsn < *bound)
            .map_or(&self.latest, |(_, shape)| shape)
    }
}

impl RowShape {
    /// The shape with the present columns of `read` and the dropped ones in
    /// `shown` (by position in `read`), each at the position it has among them.
    fn new(
        instance: &CaptureInstance,
        database: &str,
        read: &[EmittedColumn<'_>],
        shown: &[(usize, DroppedColumn)],
    ) -> Result<Self, SourceError> {
        // A dropped column stood after the columns before it that are still there
        // and after the shown dropped ones before it (by captured order).
        let position = |at: usize, e: &EmittedColumn<'_>| -> u32 {
            let dropped_before = |index: u32| {
                shown
                    .iter()
                    .filter(|&&(other, d)| {
                        d.columns_before < index || (d.columns_before == index && other < at)
                    })
                    .count()
            };
            match e.column.table_index {
                // A present column: after every shown dropped one that stood before it.
                Some(index) => {
                    index
                        + shown
                            .iter()
                            .filter(|(_, d)| d.columns_before <= index)
                            .count() as u32
                }
                None => e.table_index + dropped_before(e.table_index) as u32,
            }
        };
        let picked: Vec<usize> = (0..read.len())
            .filter(|&at| {
                read[at].column.table_index.is_some() || shown.iter().any(|&(s, _)| s == at)
            })
            .collect();
        let columns: Vec<ColumnDescription> = picked
            .iter()
            .map(|&at| {
                let e = &read[at];
                ColumnDescription {
                    name: e.column.name.clone(),
                    sql_type: e.sql_type,
                    index: position(at, e),
                    mask: None,
                    nullable: e.column.nullable.unwrap_or(true),
                    default: e.column.default.clone(),
                }
            })
            .collect();
        let key = instance
            .key_columns
            .iter()
            .filter_map(|name| columns.iter().position(|c| &c.name == name))
            .collect();
        let lob_columns = picked
            .iter()
            .enumerate()
            .filter(|&(_, &at)| read[at].sql_type.is_lob())
            .map(|(position, &at)| (position, read[at].column.ordinal))
            .collect();
        let table = TableDescription::new(
            database,
            instance.schema.clone(),
            instance.table.clone(),
            columns,
            key,
        )
        .map_err(|e| SourceError::Malformed {
            capture_instance: instance.name.clone(),
            message: e.to_string(),
        })?;
        Ok(RowShape {
            table: Arc::new(table),
            pick: (picked.len() != read.len()).then_some(picked),
            lob_columns,
        })
    }

    /// The shape's values of a change row.
    fn take(&self, values: Vec<Value>) -> Vec<Value> {
        match &self.pick {
            None => values,
            Some(pick) => pick.iter().map(|&at| values[at].clone()).collect(),
        }
    }
}

/// The index of the buffer whose first row comes first in CDC order (ties, which
/// cannot occur between distinct rows, go to the lower index). `None` when all are
/// empty.
pub fn smallest_head(buffers: &[&VecDeque<ChangeRow>]) -> Option<usize> {
    buffers
        .iter()
        .enumerate()
        .filter_map(|(i, b)| b.front().map(|row| (row.key, i)))
        .min()
        .map(|(_, i)| i)
}

/// Pairs, numbers and flags the events of an ordered row stream.
#[derive(Debug)]
pub struct Sequencer {
    zone: CommitTimeZone,
    /// Commit instants in LSN order, which decide a repeated hour's readings.
    clock: CommitClock,
    before: Option<(Arc<InstanceContext>, ChangeRow)>,
    held: Option<Change>,
}

impl Sequencer {
    /// A sequencer converting commit times with `zone`, whose clock starts where
    /// the position's stands (`clock`).
    pub fn new(zone: CommitTimeZone, clock: CommitClock) -> Self {
        Sequencer {
            zone,
            clock,
            before: None,
            held: None,
        }
    }

    /// Takes the next row in CDC order; appends to `out` every event it completes.
    pub fn push(
        &mut self,
        instance: &Arc<InstanceContext>,
        row: ChangeRow,
        out: &mut Vec<Change>,
    ) -> Result<(), SourceError> {
        let malformed = |message: String| SourceError::Malformed {
            capture_instance: instance.name.clone(),
            message,
        };
        let expected = instance.row_width;
        if row.values.len() != expected {
            return Err(malformed(format!(
                "a change row has {} values for {expected} columns",
                row.values.len()
            )));
        }
        let shape = instance.shape_at(row.key.start_lsn);
        let row = ChangeRow {
            values: shape.take(row.values),
            ..row
        };
        match row.operation() {
            op::UPDATE_BEFORE => {
                if let Some((ctx, before)) = self.before.take() {
                    return Err(SourceError::UnpairedUpdate {
                        capture_instance: ctx.name.clone(),
                        key: before.key,
                    });
                }
                self.before = Some((Arc::clone(instance), row));
                Ok(())
            }
            op::UPDATE_AFTER => {
                let Some((ctx, before)) = self.before.take() else {
                    return Err(malformed(format!(
                        "an update after-image (op 4) at {:?} has no before-image (op 3)",
                        row.key
                    )));
                };
                let same_row = Arc::ptr_eq(&ctx, instance)
                    && before.key.start_lsn == row.key.start_lsn
                    && before.key.command_id == row.key.command_id
                    && before.key.seqval == row.key.seqval;
                if !same_row {
                    return Err(SourceError::UnpairedUpdate {
                        capture_instance: ctx.name.clone(),
                        key: before.key,
                    });
                }
                let ChangeRow {
                    key,
                    update_mask,
                    begin_lsn,
                    end_time,
                    end_time_offsets,
                    values,
                } = row;
                let mut old = before.values;
                for &(position, ordinal) in &shape.lob_columns {
                    if old[position].is_null() && !is_bit_set(&update_mask, ordinal) {
                        old[position] = values[position].clone();
                    }
                }
                let times = (key, begin_lsn, end_time, end_time_offsets);
                let change = self.change(
                    &shape.table,
                    Operation::Update,
                    times,
                    Some(old),
                    Some(values),
                );
                self.emit(change, out);
                Ok(())
            }
            operation @ (op::INSERT | op::DELETE) => {
                if let Some((ctx, before)) = self.before.take() {
                    return Err(SourceError::UnpairedUpdate {
                        capture_instance: ctx.name.clone(),
                        key: before.key,
                    });
                }
                let ChangeRow {
                    key,
                    begin_lsn,
                    end_time,
                    end_time_offsets,
                    values,
                    ..
                } = row;
                let (operation, old, current) = if operation == op::INSERT {
                    (Operation::Insert, None, Some(values))
                } else {
                    (Operation::Delete, Some(values), None)
                };
                let change = self.change(
                    &shape.table,
                    operation,
                    (key, begin_lsn, end_time, end_time_offsets),
                    old,
                    current,
                );
                self.emit(change, out);
                Ok(())
            }
            other => Err(malformed(format!(
                "unknown __$operation {other} at {:?}",
                row.key
            ))),
        }
    }

    /// A change of `table` at `(key, begin LSN, local end time, the server's
    /// offset at that time)`, numbered later.
    fn change(
        &mut self,
        table: &Arc<TableDescription>,
        operation: Operation,
        (key, begin_lsn, end_time, offsets): (RowKey, Lsn, NaiveDateTime, Option<ServerOffsets>),
        old: Option<Row>,
        current: Option<Row>,
    ) -> Change {
        Change {
            table: Arc::clone(table),
            operation,
            commit_lsn: key.start_lsn,
            begin_lsn,
            change_lsn: key.seqval,
            sequence_number: 1,
            last_in_transaction: false,
            commit_time: self.clock.read(self.zone.readings(end_time, offsets)),
            old,
            current,
            origin: crate::event::Origin::Cdc,
        }
    }

    /// Numbers `change`, releases the held event (whose end-of-transaction flag is
    /// now known) and holds `change`.
    fn emit(&mut self, mut change: Change, out: &mut Vec<Change>) {
        if let Some(mut held) = self.held.take() {
            if held.commit_lsn == change.commit_lsn {
                change.sequence_number = held.sequence_number + 1;
            } else {
                held.last_in_transaction = true;
            }
            out.push(held);
        }
        self.held = Some(change);
    }

    /// Ends the range: every transaction in it is complete, so the held event ends
    /// its transaction. An op 3 still waiting for its op 4 is an error.
    pub fn finish(&mut self, out: &mut Vec<Change>) -> Result<(), SourceError> {
        if let Some((ctx, before)) = self.before.take() {
            return Err(SourceError::UnpairedUpdate {
                capture_instance: ctx.name.clone(),
                key: before.key,
            });
        }
        if let Some(mut held) = self.held.take() {
            held.last_in_transaction = true;
            out.push(held);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Value;
    use crate::event::value::{Length, SqlType};
    use crate::source::CapturedColumn;
    use chrono::NaiveDate;

    fn instance(name: &str) -> Arc<InstanceContext> {
        let column = |name: &str, ordinal, sql_type| CapturedColumn {
            name: name.into(),
            ordinal,
            table_index: Some(ordinal - 1),
            dropped: None,
            sql_type: Ok(sql_type),
            computed: false,
            nullable: Some(true),
            default: None,
        };
        let ci = CaptureInstance {
            name: name.into(),
            schema: "dbo".into(),
            table: name.into(),
            object_id: 1,
            start_lsn: Some(Lsn::ZERO),
            has_command_id: true,
            options: Default::default(),
            create_date: NaiveDate::from_ymd_opt(2026, 1, 1)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap(),
            columns: vec![
                column("Id", 1, SqlType::Int),
                column("Doc", 2, SqlType::NVarChar(Length::Max)),
                column("Note", 3, SqlType::NVarChar(Length::Bounded(10))),
            ],
            key_columns: vec!["Id".into()],
            descending_keys: Vec::new(),
        };
        Arc::new(InstanceContext::new(&ci, "db").unwrap())
    }

    fn row(lsn: u32, cmd: i32, seq: u32, operation: u8, values: Vec<Value>) -> ChangeRow {
        ChangeRow {
            key: RowKey {
                start_lsn: Lsn::from_parts(0, lsn, 0),
                command_id: cmd,
                seqval: Lsn::from_parts(0, lsn, seq as u16),
                operation,
            },
            update_mask: vec![0x07],
            begin_lsn: Lsn::from_parts(0, lsn - 1, 0),
            end_time: NaiveDate::from_ymd_opt(2026, 1, 1)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap(),
            end_time_offsets: None,
            values,
        }
    }

    fn values(id: i32, doc: Option<&str>, note: &str) -> Vec<Value> {
        vec![
            Value::Int(id),
            doc.map_or(Value::Null, |d| Value::Text(d.into())),
            Value::Text(note.into()),
        ]
    }

    fn sequencer() -> Sequencer {
        Sequencer::new(CommitTimeZone::LocalAsUtc, CommitClock::default())
    }

    #[test]
    fn sequence_numbers_and_final_flags_span_tables_in_a_transaction() {
        let (a, b) = (instance("a"), instance("b"));
        let mut s = sequencer();
        let mut out = Vec::new();
        s.push(
            &a,
            row(10, 1, 1, op::INSERT, values(1, None, "x")),
            &mut out,
        )
        .unwrap();
        s.push(
            &b,
            row(10, 2, 2, op::INSERT, values(2, None, "y")),
            &mut out,
        )
        .unwrap();
        s.push(
            &a,
            row(10, 3, 3, op::UPDATE_BEFORE, values(1, None, "x")),
            &mut out,
        )
        .unwrap();
        s.push(
            &a,
            row(10, 3, 3, op::UPDATE_AFTER, values(1, None, "z")),
            &mut out,
        )
        .unwrap();
        s.push(
            &b,
            row(20, 1, 1, op::DELETE, values(2, None, "y")),
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len(), 3, "the last event is held back");
        s.finish(&mut out).unwrap();
        let summary: Vec<_> = out
            .iter()
            .map(|c| {
                (
                    c.operation,
                    c.sequence_number,
                    c.last_in_transaction,
                    c.table.table().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (Operation::Insert, 1, false, "a".into()),
                (Operation::Insert, 2, false, "b".into()),
                (Operation::Update, 3, true, "a".into()),
                (Operation::Delete, 1, true, "b".into()),
            ]
        );
        assert_eq!(out[2].old.as_ref().unwrap()[2], Value::Text("x".into()));
        assert_eq!(out[2].current.as_ref().unwrap()[2], Value::Text("z".into()));
        assert!(out[0].current.is_some() && out[0].old.is_none());
        assert!(out[3].old.is_some() && out[3].current.is_none());
    }

    #[test]
    fn unchanged_lob_in_the_before_image_comes_from_the_after_image() {
        let a = instance("a");
        let mut s = sequencer();
        let mut out = Vec::new();
        // Doc (ordinal 2) unchanged: CDC writes NULL in op 3; mask has only Note (3).
        let mut before = row(10, 1, 1, op::UPDATE_BEFORE, values(1, None, "x"));
        let mut after = row(10, 1, 1, op::UPDATE_AFTER, values(1, Some("big"), "z"));
        before.update_mask = vec![0b100];
        after.update_mask = vec![0b100];
        s.push(&a, before, &mut out).unwrap();
        s.push(&a, after, &mut out).unwrap();
        s.finish(&mut out).unwrap();
        assert_eq!(out[0].old.as_ref().unwrap()[1], Value::Text("big".into()));

        // Doc changed from NULL to a value: the NULL is real and stays.
        let mut out = Vec::new();
        let mut before = row(11, 1, 1, op::UPDATE_BEFORE, values(1, None, "x"));
        let mut after = row(11, 1, 1, op::UPDATE_AFTER, values(1, Some("new"), "x"));
        before.update_mask = vec![0b010];
        after.update_mask = vec![0b010];
        s.push(&a, before, &mut out).unwrap();
        s.push(&a, after, &mut out).unwrap();
        s.finish(&mut out).unwrap();
        assert_eq!(out[0].old.as_ref().unwrap()[1], Value::Null);
    }

    #[test]
    fn an_update_before_image_without_its_after_image_is_an_error() {
        let a = instance("a");
        let mut out = Vec::new();
        let mut s = sequencer();
        s.push(
            &a,
            row(10, 1, 1, op::UPDATE_BEFORE, values(1, None, "x")),
            &mut out,
        )
        .unwrap();
        let err = s
            .push(
                &a,
                row(10, 2, 2, op::INSERT, values(2, None, "y")),
                &mut out,
            )
            .unwrap_err();
        assert!(matches!(err, SourceError::UnpairedUpdate { .. }), "{err}");
        assert!(err.to_string().contains("00000000:0000000A:0000"), "{err}");
        // The row as an operator finds it in the change table, not a Rust value.
        assert!(
            err.to_string()
                .contains("__$start_lsn 00000000:0000000A:0000, __$command_id")
                && !err.to_string().contains("RowKey"),
            "{err}"
        );

        let mut s = sequencer();
        s.push(
            &a,
            row(10, 1, 1, op::UPDATE_BEFORE, values(1, None, "x")),
            &mut out,
        )
        .unwrap();
        assert!(matches!(
            s.finish(&mut out),
            Err(SourceError::UnpairedUpdate { .. })
        ));

        let mut s = sequencer();
        let err = s
            .push(
                &a,
                row(10, 1, 1, op::UPDATE_AFTER, values(1, None, "x")),
                &mut out,
            )
            .unwrap_err();
        assert!(err.to_string().contains("no before-image"), "{err}");

        let mut s = sequencer();
        s.push(
            &a,
            row(10, 1, 1, op::UPDATE_BEFORE, values(1, None, "x")),
            &mut out,
        )
        .unwrap();
        let err = s
            .push(
                &a,
                row(10, 1, 2, op::UPDATE_AFTER, values(1, None, "x")),
                &mut out,
            )
            .unwrap_err();
        assert!(matches!(err, SourceError::UnpairedUpdate { .. }));
    }

    #[test]
    fn rows_of_the_wrong_shape_or_operation_are_errors() {
        let a = instance("a");
        let mut out = Vec::new();
        let mut s = sequencer();
        assert!(
            s.push(&a, row(10, 1, 1, op::INSERT, vec![Value::Int(1)]), &mut out)
                .is_err()
        );
        assert!(
            s.push(&a, row(10, 1, 1, 9, values(1, None, "x")), &mut out)
                .is_err()
        );
    }

    #[test]
    fn smallest_head_follows_cdc_order() {
        let mut a = VecDeque::new();
        let mut b = VecDeque::new();
        let c = VecDeque::new();
        a.push_back(row(10, 2, 1, op::INSERT, values(1, None, "x")));
        b.push_back(row(10, 1, 9, op::INSERT, values(1, None, "x")));
        assert_eq!(smallest_head(&[&a, &b, &c]), Some(1));
        b.clear();
        assert_eq!(smallest_head(&[&a, &b, &c]), Some(0));
        a.clear();
        assert_eq!(smallest_head(&[&a, &b, &c]), None);
    }
}

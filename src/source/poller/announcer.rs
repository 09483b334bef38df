//! The shape announcer: each table's shape followed through the events in stream
//! order ([`crate::source::shape`]), and the schema-change event that announces a
//! shape to the stream's consumers placed before the first event that has it, with
//! the DDL `cdc.ddl_history` recorded for the table since the shape before.

use super::*;
use crate::event::TableDescription;
use crate::event::schema::{DdlRecord, SchemaChangeReason};
use crate::position::{ShapeColumn, TableShape, TableVersion};
use crate::source::shape::ShapeTracker;

/// Follows table shapes through the stream and holds the schema-change events of
/// the batch being built.
pub(super) struct ShapeAnnouncer {
    shapes: ShapeTracker,
    /// Schema-change events of the batch being built.
    pending: Vec<PlacedSchemaChange>,
    /// Whether batches carry schema-change events (`sink.schema_changes` is not
    /// `off`); shapes are followed (and versions counted) either way.
    announce: bool,
}

impl ShapeAnnouncer {
    pub(super) fn new(announce: bool) -> Self {
        ShapeAnnouncer {
            shapes: ShapeTracker::default(),
            pending: Vec::new(),
            announce,
        }
    }

    /// Drops the events of a batch that will not be returned (the poll failed and
    /// starts over; the events are placed again as the changes are read again).
    pub(super) fn discard_pending(&mut self) {
        self.pending.clear();
    }

    /// Follows the shape of `change`'s table (in stream order), saying when it
    /// changed: a table's version (in `versions`, the position's) grows by one at
    /// the first event of a new shape. When announcing, places a schema-change event
    /// before the batch's change at `before` when the shape is new to the stream's
    /// consumers; `tracked` describes the instance the change came from.
    pub(super) fn note(
        &mut self,
        change: &Change,
        before: usize,
        tracked: &[Tracked],
        versions: &mut BTreeMap<String, TableVersion>,
    ) {
        // Only a description not seen before, or a shape to announce, is looked
        // up: every event of the stream passes here.
        let describe = || {
            let instance = tracked
                .iter()
                .find(|t| {
                    t.context
                        .tables()
                        .any(|table| Arc::ptr_eq(table, &change.table))
                })
                .map(|t| &t.instance);
            table_shape(&change.table, instance)
        };
        let Some(changed) = self.shapes.note(
            &change.table,
            versions,
            change.commit_lsn,
            self.announce
                .then_some(&describe as &dyn Fn() -> TableShape),
        ) else {
            return;
        };
        if let Some(after) = &changed.after {
            let mut ddl_from: Vec<String> = changed
                .before
                .iter()
                .map(|b| b.capture_instance.clone())
                .collect();
            if !ddl_from.contains(&after.capture_instance) {
                ddl_from.push(after.capture_instance.clone());
            }
            self.pending.push(PlacedSchemaChange {
                before,
                event: SchemaChange {
                    database: change.table.database().to_owned(),
                    schema: change.table.schema().to_owned(),
                    table: change.table.table().to_owned(),
                    version: changed.version,
                    reason: changed.reason,
                    lsn: change.commit_lsn,
                    time: change.commit_time,
                    before: changed.before.clone(),
                    after: Arc::clone(after),
                    ddl: Vec::new(),
                },
                ddl_from: if changed.reason == SchemaChangeReason::Changed {
                    ddl_from
                } else {
                    Vec::new()
                },
                since: changed.since_before,
            });
        }
        if changed.reason == SchemaChangeReason::Initial {
            return;
        }
        match &changed.diff {
            Some(diff) => tracing::info!(
                table = %changed.table,
                version = changed.version,
                at_lsn = %change.commit_lsn,
                added = ?diff.added,
                dropped = ?diff.dropped,
                retyped = ?diff.retyped,
                key_changed = diff.key_changed,
                "table shape changed: events from here carry the new columns"
            ),
            None => tracing::info!(
                table = %changed.table,
                version = changed.version,
                at_lsn = %change.commit_lsn,
                "table shape changed since the last run: events from here carry the new columns"
            ),
        }
    }

    /// The batch's schema-change events, each with the DDL of its table recorded
    /// after the previous version's first event and up to its own (one
    /// `cdc.ddl_history` read per capture instance named, only for a changed shape),
    /// its times in UTC by `zone` (the one commit times are read in).
    pub(super) async fn take(
        &mut self,
        source: &mut impl ChangeSource,
        zone: Option<&CommitTimeZone>,
    ) -> Result<Vec<PlacedSchemaChange>, SourceError> {
        let mut placed = std::mem::take(&mut self.pending);
        for p in &mut placed {
            let mut ddl = Vec::new();
            for instance in &p.ddl_from {
                for d in source.ddl_history(instance).await? {
                    let after_since = p.since.is_none_or(|since| d.ddl_lsn > since);
                    if after_since && d.ddl_lsn <= p.event.lsn {
                        ddl.push(d);
                    }
                }
            }
            ddl.sort_by(|a, b| (a.ddl_lsn, &a.ddl_command).cmp(&(b.ddl_lsn, &b.ddl_command)));
            // The same DDL recorded for both instances of the table is one DDL.
            ddl.dedup_by(|a, b| a.ddl_lsn == b.ddl_lsn && a.ddl_command == b.ddl_command);
            p.event.ddl = ddl
                .into_iter()
                .map(|d| DdlRecord {
                    time: server_time_in_utc(zone, d.ddl_time, d.offsets),
                    command: d.ddl_command,
                    lsn: d.ddl_lsn,
                })
                .collect();
        }
        Ok(placed)
    }
}

/// A server-local time (`cdc.ddl_history.ddl_time`) in UTC, by the zone commit times
/// are read in, with the offsets the server gave it where it names its zone (its
/// first reading, where the clocks repeat an hour).
fn server_time_in_utc(
    zone: Option<&CommitTimeZone>,
    local: chrono::NaiveDateTime,
    offsets: Option<crate::source::timezone::ServerOffsets>,
) -> chrono::DateTime<chrono::Utc> {
    match zone {
        Some(zone) => zone.readings(local, offsets).first,
        None => local.and_utc(),
    }
}

/// The shape a schema-change event describes: the events' columns (CES's `cols`)
/// with the source table's nullability and each key column's place in the key, from
/// `instance` (the capture instance the events come from, when it is known).
pub(super) fn table_shape(
    table: &TableDescription,
    instance: Option<&CaptureInstance>,
) -> TableShape {
    TableShape {
        capture_instance: instance.map(|i| i.name.clone()).unwrap_or_default(),
        cols: table
            .columns()
            .iter()
            .enumerate()
            .map(|(at, c)| ShapeColumn {
                name: c.name.clone(),
                sql_type: c.sql_type.to_string(),
                index: c.index,
                nullable: instance
                    .and_then(|i| i.columns.iter().find(|cc| cc.name == c.name))
                    .and_then(|cc| cc.nullable),
                key_position: table
                    .key()
                    .iter()
                    .position(|&k| k == at)
                    .and_then(|p| u32::try_from(p + 1).ok()),
            })
            .collect(),
    }
}

//! The shape announcer: each table's shape followed through the events in stream
//! order ([`crate::source::shape`]), and the schema-change event that announces a
//! shape to the stream's consumers placed before the first event that has it, with
//! the DDL `cdc.ddl_history` recorded for the table since the shape before.

use super::*;
use crate::event::TableDescription;
use crate::event::schema_change::{DdlRecord, SchemaChangeReason};
use crate::position::{ShapeColumn, TableShape, TableVersion};
use crate::source::CdcReads;
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
        source: &mut impl CdcReads,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdc_sim::{CdcSimulator, SimColumn};
    use crate::event::Value;
    use crate::event::value::SqlType;

    /// `dbo.Orders` with one change through `dbo_Orders_v1`, then a column added,
    /// `dbo_Orders_v2` capturing it and one change through it; every change the
    /// poller reads, and the instances it tracked.
    async fn a_table_that_changed_shape() -> (CdcSimulator, Vec<Change>, Vec<Tracked>) {
        let sim = CdcSimulator::new("Shop", uuid::Uuid::from_u128(7), 0);
        sim.create_table(
            "dbo",
            "Orders",
            vec![SimColumn::new("Id", SqlType::Int)],
            &["Id"],
        );
        sim.enable_table("dbo.Orders", Some("dbo_Orders_v1"))
            .unwrap();
        sim.transaction()
            .insert("dbo.Orders", vec![Value::Int(1)])
            .commit()
            .unwrap();
        sim.add_column(
            "dbo.Orders",
            SimColumn::new("Note", SqlType::Int),
            Value::Null,
        )
        .unwrap();
        sim.enable_table("dbo.Orders", Some("dbo_Orders_v2"))
            .unwrap();
        sim.run_capture_job();
        sim.transaction()
            .insert("dbo.Orders", vec![Value::Int(2), Value::Int(20)])
            .commit()
            .unwrap();
        sim.run_capture_job();
        let mut poller = Poller::new(sim.clone(), PollerConfig::default(), None);
        let mut changes = Vec::new();
        while let PollOutcome::Batch(batch) = poller.poll().await.unwrap() {
            changes.extend(batch.changes);
        }
        let tracked = poller.tracker.tracked().to_vec();
        (sim, changes, tracked)
    }

    #[tokio::test]
    async fn the_announcer_places_a_shape_before_its_first_event_with_the_ddl_since_the_last() {
        let (mut sim, changes, tracked) = a_table_that_changed_shape().await;
        assert_eq!(changes.len(), 2);
        let mut versions = BTreeMap::new();
        let mut announcer = ShapeAnnouncer::new(true);
        for (at, change) in changes.iter().enumerate() {
            announcer.note(change, at, &tracked, &mut versions);
        }
        let placed = announcer.take(&mut sim, None).await.unwrap();
        assert_eq!(placed.len(), 2, "{placed:?}");
        let (first, second) = (&placed[0], &placed[1]);
        assert_eq!(
            (first.before, first.event.reason),
            (0, SchemaChangeReason::Initial)
        );
        assert!(first.ddl_from.is_empty() && first.event.ddl.is_empty());
        assert_eq!(first.event.after.capture_instance, "dbo_Orders_v1");
        assert_eq!(
            (second.before, second.event.reason),
            (1, SchemaChangeReason::Changed)
        );
        assert_eq!(second.ddl_from, ["dbo_Orders_v1", "dbo_Orders_v2"]);
        assert_eq!(second.event.after.capture_instance, "dbo_Orders_v2");
        assert_eq!(second.event.after.cols.len(), 2);
        // The ADD recorded by both instances is one DDL of the event.
        let commands: Vec<&str> = second
            .event
            .ddl
            .iter()
            .map(|d| d.command.as_str())
            .collect();
        assert_eq!(commands, ["ALTER TABLE dbo.Orders ADD [Note]"]);
        assert_eq!(versions["dbo.Orders"].version, 2);
        assert!(
            announcer.take(&mut sim, None).await.unwrap().is_empty(),
            "taken once"
        );

        // A batch that is not returned leaves nothing behind.
        let mut again = ShapeAnnouncer::new(true);
        again.note(&changes[0], 0, &tracked, &mut BTreeMap::new());
        again.discard_pending();
        assert!(again.take(&mut sim, None).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn without_schema_change_events_shapes_are_still_counted() {
        let (mut sim, changes, tracked) = a_table_that_changed_shape().await;
        let mut versions = BTreeMap::new();
        let mut announcer = ShapeAnnouncer::new(false);
        for (at, change) in changes.iter().enumerate() {
            announcer.note(change, at, &tracked, &mut versions);
        }
        assert!(announcer.take(&mut sim, None).await.unwrap().is_empty());
        assert_eq!(versions["dbo.Orders"].version, 2);
    }
}

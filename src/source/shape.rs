//! Table shapes and their versions: what a consumer needs to know to read a table's
//! events (its emitted columns with their types and source positions, and its key),
//! and a version per table that grows by one each time that shape changes.
//!
//! Where a shape changes is where the events say so: the first event (in stream
//! order) whose table description differs from the last one recorded for that table.
//! That covers every way CDC changes what a table's events carry — a switch to a newer
//! capture instance with another column list, a captured column dropped from the
//! source table (left out from then on), a type change reached by the capture job —
//! and places the change exactly between the last event of the old
//! shape and the first of the new one, in LSN order.
//!
//! The versions are kept in the position ([`TableVersion`], by `schema.table`), with
//! a fingerprint of the shape, so a restart numbers the same events the same way. A
//! table first seen gets version 1; a renamed table is a table first seen.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use uuid::Uuid;

use crate::event::TableDescription;
use crate::event::schema_change::SchemaChangeReason;
use crate::lsn::Lsn;
use crate::position::{TableShape, TableVersion};

/// The UUIDv5 namespace of shape fingerprints.
const SHAPE_NAMESPACE: Uuid = Uuid::from_u128(0x6d73_7371_6c2d_6365_732d_7368_6170_6531);

/// A stable fingerprint of what a table's events carry: schema, table, each emitted
/// column's name, type and source position, and the key. Equal shapes have equal
/// fingerprints in every run and release that keeps this text.
pub fn fingerprint(table: &TableDescription) -> Uuid {
    let mut text = format!("{}\n{}\n", table.schema(), table.table());
    for column in table.columns() {
        text.push_str(&format!(
            "{}\t{}\t{}\n",
            column.name, column.sql_type, column.index
        ));
    }
    let key: Vec<String> = table.key().iter().map(usize::to_string).collect();
    text.push_str(&key.join(","));
    Uuid::new_v5(&SHAPE_NAMESPACE, text.as_bytes())
}

/// How a table's shape changed, column by column.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShapeDiff {
    pub added: Vec<String>,
    pub dropped: Vec<String>,
    /// `(column, type before, type after)`.
    pub retyped: Vec<(String, String, String)>,
    pub key_changed: bool,
}

impl ShapeDiff {
    pub fn between(before: &TableDescription, after: &TableDescription) -> Self {
        let find = |table: &TableDescription, name: &str| {
            table.columns().iter().find(|c| c.name == name).cloned()
        };
        let added = after
            .columns()
            .iter()
            .filter(|c| find(before, &c.name).is_none())
            .map(|c| c.name.clone())
            .collect();
        let dropped = before
            .columns()
            .iter()
            .filter(|c| find(after, &c.name).is_none())
            .map(|c| c.name.clone())
            .collect();
        let retyped = after
            .columns()
            .iter()
            .filter_map(|c| {
                let old = find(before, &c.name)?;
                (old.sql_type != c.sql_type).then(|| {
                    (
                        c.name.clone(),
                        old.sql_type.to_string(),
                        c.sql_type.to_string(),
                    )
                })
            })
            .collect();
        let key_names = |t: &TableDescription| -> Vec<String> {
            t.key()
                .iter()
                .filter_map(|&at| t.columns().get(at).map(|c| c.name.clone()))
                .collect()
        };
        ShapeDiff {
            added,
            dropped,
            retyped,
            key_changed: key_names(before) != key_names(after),
        }
    }
}

/// A table whose shape changed at an event, or whose shape is to be announced: its
/// version and, when the shape before is known in this run, how it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeChanged {
    pub table: String,
    pub version: u64,
    pub diff: Option<ShapeDiff>,
    pub reason: SchemaChangeReason,
    /// The shape the table's previous schema-change event described, if one was
    /// sent.
    pub before: Option<Arc<TableShape>>,
    /// The shape announced now: `Some` when schema-change events are on.
    pub after: Option<Arc<TableShape>>,
    /// The commit LSN of the previous version's first event (DDL after it is this
    /// version's); `None` for a table first seen, or when not known.
    pub since_before: Option<Lsn>,
}

/// Follows table shapes through the events of a stream, keeping versions in the
/// position's map.
#[derive(Debug, Default)]
pub struct ShapeTracker {
    /// Per table: the description of its last event (kept alive here, so its
    /// address is not reused for another while it is the key below) and its
    /// fingerprint. One entry per table, whatever the catalog re-reads.
    last: HashMap<String, Last>,
    /// The table of each description in `last`, by address: the common case (an
    /// event of the same description as the table's last one) costs two lookups.
    names: HashMap<usize, String>,
}

/// A table's last description, its shape and (when schema-change events are on)
/// the capture instance its events come from.
#[derive(Debug)]
struct Last {
    table: Arc<TableDescription>,
    shape: Uuid,
    instance: Option<Arc<str>>,
}

/// What [`ShapeTracker::remember`] knows of an event's table.
struct Remembered {
    name: String,
    shape: Uuid,
    /// The description of the table's last event, when it was another one.
    previous: Option<Arc<TableDescription>>,
    /// The capture instance of this description (while announcing).
    instance: Option<Arc<str>>,
}

impl ShapeTracker {
    /// The table's name, shape fingerprint and capture instance, and the
    /// description of its last event when it was another one (whose shape may
    /// differ). Only a description not seen before costs more than two lookups:
    /// its fingerprint, and its instance from `describe`.
    fn remember(
        &mut self,
        table: &Arc<TableDescription>,
        describe: Option<&dyn Fn() -> TableShape>,
    ) -> Remembered {
        let address = Arc::as_ptr(table) as usize;
        let known = self.names.get(&address).and_then(|name| {
            let last = self.last.get(name)?;
            Some(Remembered {
                name: name.clone(),
                shape: last.shape,
                previous: None,
                instance: last.instance.clone(),
            })
        });
        if let Some(known) = known {
            // The same description as the table's last event: only the version
            // map can have moved (a restart's, or another description's).
            return known;
        }
        let name = table.qualified_name();
        let shape = fingerprint(table);
        let instance: Option<Arc<str>> = describe.map(|d| d().capture_instance.into());
        let last = Last {
            table: Arc::clone(table),
            shape,
            instance: instance.clone(),
        };
        let previous = self.last.insert(name.clone(), last).map(|l| l.table);
        if let Some(before) = &previous {
            self.names.remove(&(Arc::as_ptr(before) as usize));
        }
        self.names.insert(address, name.clone());
        Remembered {
            name,
            shape,
            previous,
            instance,
        }
    }

    /// Notes the description of an event's table (the event at commit LSN `at`), in
    /// stream order; the change when its shape differs from the one `versions` has
    /// for it (a table first seen gets version 1 and is not a change).
    ///
    /// With `announce` (schema-change events are on: how to describe the shape,
    /// capture instance included), a version whose shape no
    /// schema-change event described yet — a table first seen, a shape changed, a
    /// version from a run with them off — is announced: the result carries the
    /// shape `announce` gives, recorded in `versions` as this version's. A switch
    /// to another capture instance with the same columns is then a new version
    /// too: the event names the instance.
    pub fn note(
        &mut self,
        table: &Arc<TableDescription>,
        versions: &mut BTreeMap<String, TableVersion>,
        at: Lsn,
        announce: Option<&dyn Fn() -> TableShape>,
    ) -> Option<ShapeChanged> {
        let Remembered {
            name,
            shape,
            previous,
            instance,
        } = self.remember(table, announce);
        let described = || announce.map(|describe| Arc::new(describe()));
        let moved = |known: &TableVersion| match (&instance, &known.columns) {
            (Some(instance), Some(announced)) => *announced.capture_instance != **instance,
            _ => false,
        };
        match versions.get_mut(&name) {
            Some(known) if known.shape == shape && !moved(known) => {
                if known.columns.is_some() {
                    return None;
                }
                let after = described()?;
                known.columns = Some(Arc::clone(&after));
                Some(ShapeChanged {
                    table: name,
                    version: known.version,
                    diff: None,
                    reason: SchemaChangeReason::Initial,
                    before: None,
                    after: Some(after),
                    since_before: None,
                })
            }
            Some(known) => {
                known.version += 1;
                known.shape = shape;
                let since_before = known.since.replace(at);
                let after = described();
                let before = std::mem::replace(&mut known.columns, after.clone());
                Some(ShapeChanged {
                    table: name,
                    version: known.version,
                    diff: previous.map(|before| ShapeDiff::between(&before, table)),
                    reason: SchemaChangeReason::Changed,
                    before,
                    after,
                    since_before,
                })
            }
            None => {
                let after = described();
                versions.insert(
                    name.clone(),
                    TableVersion {
                        version: 1,
                        shape,
                        since: Some(at),
                        columns: after.clone(),
                    },
                );
                after.map(|after| ShapeChanged {
                    table: name,
                    version: 1,
                    diff: None,
                    reason: SchemaChangeReason::Initial,
                    before: None,
                    after: Some(after),
                    since_before: None,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ColumnDescription;
    use crate::event::value::{Length, SqlType};

    fn table(name: &str, columns: &[(&str, SqlType)], key: Vec<usize>) -> Arc<TableDescription> {
        let columns = columns
            .iter()
            .enumerate()
            .map(|(i, (n, t))| ColumnDescription {
                name: (*n).to_owned(),
                sql_type: *t,
                index: u32::try_from(i).unwrap(),
                mask: None,
                nullable: true,
                default: None,
            })
            .collect();
        Arc::new(
            TableDescription::new("Shop", "dbo".to_owned(), name.to_owned(), columns, key).unwrap(),
        )
    }

    const TEXT: SqlType = SqlType::NVarChar(Length::Bounded(50));
    const LSN: Lsn = Lsn::ZERO;

    fn described(instance: &str) -> TableShape {
        TableShape {
            capture_instance: instance.into(),
            cols: Vec::new(),
        }
    }

    #[test]
    fn with_announcing_every_version_is_described_once_and_the_one_before_named() {
        let v1 = table("T", &[("Id", SqlType::Int)], vec![0]);
        let v2 = table("T", &[("Id", SqlType::Int), ("Name", TEXT)], vec![0]);
        let at = |n| Lsn::from_parts(0, n, 0);
        let first = || described("dbo_T");
        let second = || described("dbo_T_v2");
        let mut versions = BTreeMap::new();
        let mut tracker = ShapeTracker::default();
        let announced = tracker
            .note(&v1, &mut versions, at(5), Some(&first))
            .expect("a table first seen is announced");
        assert_eq!(
            (announced.version, announced.reason, announced.before),
            (1, SchemaChangeReason::Initial, None)
        );
        assert_eq!(announced.after.as_deref(), Some(&first()));
        assert_eq!(versions["dbo.T"].since, Some(at(5)));
        assert_eq!(tracker.note(&v1, &mut versions, at(6), Some(&first)), None);
        let changed = tracker
            .note(&v2, &mut versions, at(9), Some(&second))
            .expect("changed");
        assert_eq!(changed.reason, SchemaChangeReason::Changed);
        assert_eq!(changed.before.as_deref(), Some(&first()));
        assert_eq!(changed.after.as_deref(), Some(&second()));
        assert_eq!(versions["dbo.T"].since, Some(at(9)));
        assert_eq!(versions["dbo.T"].columns.as_deref(), Some(&second()));
        // Off: a change is still numbered, but nothing is described, so turning
        // them on announces the version then (without a shape before).
        let v3 = table("T", &[("Id", SqlType::BigInt), ("Name", TEXT)], vec![0]);
        let off = tracker
            .note(&v3, &mut versions, at(12), None)
            .expect("numbered");
        assert_eq!((off.version, off.after), (3, None));
        assert_eq!(versions["dbo.T"].columns, None);
        let third = || described("dbo_T_v3");
        let mut restarted = ShapeTracker::default();
        let late = restarted
            .note(&v3, &mut versions, at(14), Some(&third))
            .expect("announced once on");
        assert_eq!(
            (late.version, late.reason, late.before),
            (3, SchemaChangeReason::Initial, None)
        );
        assert_eq!(
            versions["dbo.T"].since,
            Some(at(12)),
            "the version began at 12"
        );
        assert_eq!(
            restarted.note(&v3, &mut versions, at(15), Some(&third)),
            None
        );
        // Another capture instance with the same columns: a version of its own
        // while announcing (the event names the instance), none while not.
        let fourth = || described("dbo_T_v4");
        let v4 = table("T", &[("Id", SqlType::BigInt), ("Name", TEXT)], vec![0]);
        let switched = restarted
            .note(&v4, &mut versions, at(20), Some(&fourth))
            .expect("the instance moved");
        assert_eq!(
            (switched.version, switched.reason),
            (4, SchemaChangeReason::Changed)
        );
        assert_eq!(switched.before.as_deref(), Some(&third()));
        assert_eq!(switched.since_before, Some(at(12)));
        assert_eq!(
            restarted.note(&v4, &mut versions, at(21), Some(&fourth)),
            None
        );
        // The same description again after the version map went back (a poll that
        // failed restores the position): its instance is remembered, so the switch
        // is found again.
        versions.get_mut("dbo.T").unwrap().columns = Some(Arc::new(third()));
        versions.get_mut("dbo.T").unwrap().version = 3;
        let again = restarted
            .note(&v4, &mut versions, at(20), Some(&fourth))
            .expect("found again");
        assert_eq!(again.version, 4);
    }

    #[test]
    fn fingerprints_are_stable_and_tell_shapes_apart() {
        let a = table("T", &[("Id", SqlType::Int), ("Name", TEXT)], vec![0]);
        // The same shape built again: the same fingerprint (a fixed value, so a
        // change of the text is noticed as a change of every stream's versions).
        let again = table("T", &[("Id", SqlType::Int), ("Name", TEXT)], vec![0]);
        assert_eq!(fingerprint(&a), fingerprint(&again));
        assert_eq!(
            fingerprint(&a).to_string(),
            Uuid::new_v5(
                &SHAPE_NAMESPACE,
                b"dbo\nT\nId\tint\t0\nName\tnvarchar(50)\t1\n0"
            )
            .to_string()
        );
        for other in [
            table("T", &[("Id", SqlType::BigInt), ("Name", TEXT)], vec![0]),
            table("T", &[("Id", SqlType::Int)], vec![0]),
            table("T", &[("Id", SqlType::Int), ("Name", TEXT)], vec![]),
            table("U", &[("Id", SqlType::Int), ("Name", TEXT)], vec![0]),
        ] {
            assert_ne!(fingerprint(&a), fingerprint(&other));
        }
    }

    #[test]
    fn versions_grow_once_per_change_and_a_restart_keeps_them() {
        let v1 = table("T", &[("Id", SqlType::Int), ("Name", TEXT)], vec![0]);
        let same = table("T", &[("Id", SqlType::Int), ("Name", TEXT)], vec![0]);
        let v2 = table(
            "T",
            &[("Id", SqlType::Int), ("Name", TEXT), ("Email", TEXT)],
            vec![0],
        );
        let mut versions = BTreeMap::new();
        let mut tracker = ShapeTracker::default();
        assert_eq!(tracker.note(&v1, &mut versions, LSN, None), None);
        assert_eq!(versions["dbo.T"].version, 1);
        // Another description with the same shape (a re-read catalog) is no change.
        assert_eq!(tracker.note(&same, &mut versions, LSN, None), None);
        let changed = tracker
            .note(&v2, &mut versions, LSN, None)
            .expect("a change");
        assert_eq!(changed.version, 2);
        let diff = changed.diff.expect("the shape before is known");
        assert_eq!(diff.added, ["Email"]);
        assert!(diff.dropped.is_empty() && diff.retyped.is_empty() && !diff.key_changed);
        assert_eq!(tracker.note(&v2, &mut versions, LSN, None), None, "once");
        // A restart from these versions sees nothing new in the same shape, and the
        // next change without the shape before in memory.
        let mut restarted = ShapeTracker::default();
        assert_eq!(restarted.note(&v2, &mut versions, LSN, None), None);
        let v3 = table("T", &[("Id", SqlType::BigInt), ("Name", TEXT)], vec![0]);
        let mut fresh = ShapeTracker::default();
        let changed = fresh.note(&v3, &mut versions, LSN, None).expect("a change");
        assert_eq!((changed.version, changed.diff), (3, None));
    }

    #[test]
    fn a_description_seen_before_is_compared_again_when_another_came_between() {
        // A load from the newer instance (b), the older instance's changes up to the
        // switch (a), then the newer instance's again (b, the same description).
        let b = table("T", &[("Id", SqlType::Int), ("Email", TEXT)], vec![0]);
        let a = table("T", &[("Id", SqlType::Int)], vec![0]);
        let mut versions = BTreeMap::new();
        let mut tracker = ShapeTracker::default();
        assert_eq!(tracker.note(&b, &mut versions, LSN, None), None);
        assert_eq!(
            tracker
                .note(&a, &mut versions, LSN, None)
                .map(|c| c.version),
            Some(2)
        );
        let back = tracker
            .note(&b, &mut versions, LSN, None)
            .expect("back to b's shape");
        assert_eq!(back.version, 3);
        assert_eq!(versions["dbo.T"].shape, fingerprint(&b));
        // Many descriptions of the same table (catalog re-reads) keep one entry.
        for _ in 0..100 {
            let again = table("T", &[("Id", SqlType::Int), ("Email", TEXT)], vec![0]);
            assert_eq!(tracker.note(&again, &mut versions, LSN, None), None);
        }
        assert_eq!((tracker.last.len(), tracker.names.len()), (1, 1));
    }

    #[test]
    fn a_diff_names_dropped_retyped_and_the_key() {
        let before = table("T", &[("Id", SqlType::Int), ("Name", TEXT)], vec![0]);
        let after = table("T", &[("Id", SqlType::BigInt)], vec![]);
        let diff = ShapeDiff::between(&before, &after);
        assert_eq!(diff.dropped, ["Name"]);
        assert_eq!(
            diff.retyped,
            [("Id".to_owned(), "int".to_owned(), "bigint".to_owned())]
        );
        assert!(diff.key_changed);
        assert!(diff.added.is_empty());
    }
}

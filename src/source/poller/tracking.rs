//! Capture-instance tracking: which capture instances are read, from where, and
//! when a table hands over from an older instance to a newer one; the stream's
//! identity and time zone, checked each time the catalog is read.

use super::ddl_text::drops_column;
use super::*;
use crate::source::CdcReads;
use crate::source::diagnostics::{self, Invisible, LeftOut};
use std::collections::BTreeSet;

/// The catalog tracker: the catalog last read, the capture instances read from it
/// (with where each hands over to a newer one), the stream's identity and time zone,
/// and what `[[event.columns]]` does to each table.
pub(super) struct CatalogTracker {
    tracked: Vec<Tracked>,
    catalog: Option<Catalog>,
    read_at: Option<Instant>,
    /// The catalog must be re-read before the next iteration.
    stale: bool,
    /// Instances not read because a newer instance of their table has no
    /// `start_lsn` yet: the whole stream waits for it.
    waiting_for: Vec<String>,
    zone: Option<CommitTimeZone>,
    stream_guid: Option<Uuid>,
    /// What `[[event.columns]]` does to each table seen.
    column_plans: PlanCache,
    /// What was said once.
    warned: BTreeSet<String>,
}

impl<S: ChangeSource> Poller<S> {
    /// Re-reads the catalog when it is stale or due; with `source.enable_cdc`, once
    /// more after enabling an included table; in managed mode, marked stale again
    /// after a change to the CDC configuration.
    pub(super) async fn load_catalog(&mut self) -> Result<(), SourceError> {
        if !self.tracker.due(self.config.catalog_refresh) {
            return Ok(());
        }
        let mut catalog = self.source.catalog().await?;
        if self
            .capture
            .enable_missing_tables(&mut self.source, &self.config.filter)
            .await?
        {
            catalog = self.source.catalog().await?;
        }
        self.tracker
            .adopt(catalog, &mut self.source, &self.config, &mut self.position)
            .await?;
        let Some(catalog) = self.tracker.catalog() else {
            return Ok(());
        };
        let loading = self.loads.needs_plan() || !self.position.loads.is_empty();
        if self
            .capture
            .manage(
                &mut self.source,
                catalog,
                &self.config.filter,
                &self.position.switches,
                loading,
            )
            .await?
        {
            self.tracker.mark_stale();
        }
        Ok(())
    }

    /// `max_lsn`, with a catalog as new as it: re-read when the fingerprint that comes
    /// with `max_lsn` differs (a capture instance enabled, disabled, re-created or
    /// altered, a `start_lsn` set or moved), so that nothing is read with the old one.
    pub(super) async fn max_lsn_with_catalog(
        &mut self,
    ) -> Result<crate::source::MaxLsn, SourceError> {
        self.load_catalog().await?;
        let max = self.source.max_lsn().await?;
        if self
            .tracker
            .catalog()
            .is_some_and(|c| c.version != max.catalog_version)
        {
            self.tracker.mark_stale();
            self.load_catalog().await?;
        }
        Ok(max)
    }
}

impl CatalogTracker {
    pub(super) fn new() -> Self {
        CatalogTracker {
            tracked: Vec::new(),
            catalog: None,
            read_at: None,
            stale: true,
            waiting_for: Vec::new(),
            zone: None,
            stream_guid: None,
            column_plans: PlanCache::default(),
            warned: BTreeSet::new(),
        }
    }

    /// The capture instances read, in tracking order.
    pub(super) fn tracked(&self) -> &[Tracked] {
        &self.tracked
    }

    /// The capture instance `name`, when it is read.
    pub(super) fn instance(&self, name: &str) -> Option<&Tracked> {
        self.tracked.iter().find(|t| t.instance.name == name)
    }

    /// The catalog last read.
    pub(super) fn catalog(&self) -> Option<&Catalog> {
        self.catalog.as_ref()
    }

    /// The zone commit times are read in (known once the catalog has been read).
    pub(super) fn zone(&self) -> Option<&CommitTimeZone> {
        self.zone.as_ref()
    }

    /// The stream GUID (known once the catalog has been read).
    pub(super) fn stream_guid(&self) -> Option<Uuid> {
        self.stream_guid
    }

    /// The catalog is to be read again before anything more is read.
    pub(super) fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// Whether the catalog is to be read: stale, or last read `refresh` ago.
    fn due(&self, refresh: Duration) -> bool {
        self.stale || self.read_at.is_none_or(|at| at.elapsed() >= refresh)
    }

    /// Whether the stream waits for a newer capture instance's `start_lsn` (said
    /// once per instance).
    pub(super) fn waits_for_a_switch_point(&mut self) -> bool {
        let Some(pending) = self.waiting_for.first() else {
            return false;
        };
        if self.warned.insert(format!("waiting {pending}")) {
            tracing::info!(
                capture_instance = %pending,
                "waiting for the capture job to set the start_lsn of a table's newer capture instance before reading on (the switch point between the two instances)"
            );
        }
        true
    }

    /// Applies `[[event.columns]]` (`rules`) to a batch's changes.
    pub(super) fn apply_column_rules(
        &mut self,
        rules: &ColumnRules,
        changes: &mut [Change],
    ) -> Result<(), crate::event::columns::ColumnRuleError> {
        self.column_plans.apply(rules, changes)
    }

    /// Takes a catalog just read: the identity and zone checked against `position`
    /// and `config`, the included instances tracked (`config.filter`), the switches
    /// between two instances of a table recorded in `position`, and instances gone
    /// or re-created ended there.
    async fn adopt(
        &mut self,
        mut catalog: Catalog,
        source: &mut impl CdcReads,
        config: &PollerConfig,
        position: &mut Position,
    ) -> Result<(), SourceError> {
        date_drops(source, &config.filter, &mut catalog).await?;
        self.read_at = Some(Instant::now());
        self.stale = false;
        self.adopt_identity(&catalog, config.stream_guid, position)?;
        if self.zone.is_none() {
            self.zone = Some(resolve_time_zone(&catalog, &config.time_zone)?);
        }
        self.check_invisible(&catalog, &config.filter)?;
        let included: Vec<&CaptureInstance> = catalog
            .instances
            .iter()
            .filter(|i| config.filter.allows(&i.schema, &i.table))
            .collect();
        let mut tracked = Vec::new();
        let mut waiting_for = Vec::new();
        for instance in &included {
            if !instance.has_command_id {
                return Err(SourceError::NoCommandId {
                    capture_instance: instance.name.clone(),
                });
            }
            let Some(start_lsn) = instance.start_lsn else {
                self.note_pending(instance);
                continue;
            };
            self.warn_left_out_columns(instance);
            let superseded_at =
                superseded_at(position, instance, start_lsn, &included, &mut waiting_for);
            let context = Arc::new(InstanceContext::new(instance, &catalog.database)?);
            // A rule the table cannot take stops the run here, before anything is read.
            for table in context.tables() {
                self.column_plans.plan(&config.columns, table)?;
            }
            tracked.push(Tracked {
                instance: (*instance).clone(),
                context,
                superseded_at,
            });
        }
        if self.catalog.is_none() {
            self.say_column_rules(&tracked, config)?;
        }
        self.retire_vanished(&catalog, position);
        self.note_new_instances(&tracked, source, position).await?;
        if tracked.is_empty() && included.is_empty() {
            // At startup that is a configuration error; later, the last table was
            // disabled: wait for one to be enabled again.
            if self.catalog.is_none() {
                return Err(SourceError::NoCapturedTables {
                    database: catalog.database.clone(),
                });
            }
            if self.warned.insert("no captured tables".into()) {
                tracing::warn!(
                    "no captured table is left to stream; waiting for CDC to be enabled on one"
                );
            }
        } else {
            self.warned.remove("no captured tables");
        }
        self.tracked = tracked;
        self.waiting_for = waiting_for;
        self.catalog = Some(catalog);
        Ok(())
    }

    /// At start: what `[[event.columns]]` does to each table, and the rules that
    /// match no column of any included table, refused unless allowed (a misspelt
    /// pattern leaks data).
    fn say_column_rules(
        &self,
        tracked: &[Tracked],
        config: &PollerConfig,
    ) -> Result<(), SourceError> {
        let rules = &config.columns;
        if rules.is_empty() {
            return Ok(());
        }
        for t in tracked {
            if let Some(columns) = rules.summary(&t.context.table) {
                tracing::info!(table = %t.context.table.qualified_name(), %columns, "column rules");
            }
        }
        let unmatched = rules.unmatched(&self.column_plans.matched);
        if unmatched.is_empty() {
            return Ok(());
        }
        if !config.allow_unmatched_column_rules {
            return Err(SourceError::UnmatchedColumnRules {
                rules: unmatched.join(", "),
            });
        }
        for rule in unmatched {
            tracing::warn!(%rule, "event.columns: this rule matches no column of any included table (patterns are schema.table.column, case-insensitive)");
        }
        Ok(())
    }

    /// The stream GUID (`event.stream_guid`, else the database's), and the identity
    /// the position belongs to, checked against the one it recorded.
    fn adopt_identity(
        &mut self,
        catalog: &Catalog,
        configured: Option<Uuid>,
        position: &mut Position,
    ) -> Result<(), SourceError> {
        let stream_guid = SourceIdentity::stream_guid_for(
            position.source.as_deref(),
            configured,
            catalog.database_guid,
        )
        .ok_or(SourceError::DatabaseGuidUnreadable)?;
        self.stream_guid = Some(stream_guid);
        check_identity(
            position,
            SourceIdentity {
                server: catalog.server.clone(),
                database: catalog.database.clone(),
                database_guid: catalog.database_guid,
                local_database_guid: catalog.local_database_guid,
                stream_guid,
            },
        )
    }

    /// Says once that an instance is not read until the capture job sets its
    /// `start_lsn`.
    fn note_pending(&mut self, instance: &CaptureInstance) {
        if self
            .warned
            .insert(format!("pending {}", instance.object_id))
        {
            tracing::info!(
                capture_instance = %instance.name,
                table = %instance.qualified_table(),
                "capture instance has no start_lsn yet: the capture job has not scanned since it was enabled; it is read once it has (if this lasts, check that SQL Server Agent runs the cdc.<db>_capture job)"
            );
        }
    }

    /// Ends the position of every tracked instance whose change table is gone from
    /// `cdc.change_tables` (one filtered out or briefly invisible keeps it); an older
    /// instance of the same table that had handed over to it goes on where it got to.
    fn retire_vanished(&mut self, catalog: &Catalog, position: &mut Position) {
        for old in &self.tracked {
            let still = catalog
                .instances
                .iter()
                .any(|i| i.object_id == old.instance.object_id)
                || catalog.invisible.contains(&old.instance.name);
            if still {
                continue;
            }
            tracing::warn!(
                capture_instance = %old.instance.name,
                table = %old.instance.qualified_table(),
                "capture instance disabled (or re-created); its change table is gone and it is no longer read"
            );
            let reached = position.instances.remove(&old.instance.name);
            position.change_tables.remove(&old.instance.name);
            position.switches.remove(&old.instance.name);
            let handed_back: Vec<String> = position
                .switches
                .iter()
                .filter(|(_, s)| s.to == old.instance.name)
                .map(|(from, _)| from.clone())
                .collect();
            for from in handed_back {
                position.switches.remove(&from);
                if let Some(reached) = reached {
                    position.advance(&from, reached);
                }
                tracing::warn!(capture_instance = %from, "the newer capture instance of its table is gone: reading this one again from where that one got to");
            }
        }
    }

    /// For each instance now tracked: forgets the position of one disabled and
    /// enabled again under the same name (another change table), and logs the switch
    /// (with the table's DDL history) of one first found with a newer instance.
    async fn note_new_instances(
        &self,
        tracked: &[Tracked],
        source: &mut impl CdcReads,
        position: &mut Position,
    ) -> Result<(), SourceError> {
        for t in tracked {
            let name = &t.instance.name;
            match position.change_tables.get(name) {
                Some(&id) if id != t.instance.object_id => {
                    tracing::warn!(
                        capture_instance = %name,
                        table = %t.instance.qualified_table(),
                        start_lsn = %t.instance.start_lsn.map_or_else(|| "NULL".to_owned(), |l| l.to_string()),
                        "capture instance was disabled and enabled again: reading the new one from its start LSN; changes the old one held and that were not delivered are gone with it"
                    );
                    position.instances.remove(name);
                    position.change_tables.remove(name);
                }
                // Otherwise (also a checkpoint written before change tables were
                // recorded) the entry is this instance's: the first iteration
                // records its change table.
                _ => {}
            }
            // Said once: on the read that first finds this instance superseded,
            // whether the instance is new to the stream or read for a while.
            let known = self
                .tracked
                .iter()
                .any(|o| o.instance.object_id == t.instance.object_id && o.superseded_at.is_some());
            let Some(switch) = t.superseded_at.filter(|_| !known) else {
                continue;
            };
            let ddl = source.ddl_history(name).await?;
            tracing::info!(
                table = %t.instance.qualified_table(),
                from = %name,
                at_lsn = %switch,
                "table has a newer capture instance; switching to it at its start LSN"
            );
            for d in ddl {
                tracing::info!(capture_instance = %d.capture_instance, ddl_lsn = %d.ddl_lsn, ddl_time = %d.ddl_time, command = %d.ddl_command, "DDL");
            }
        }
        Ok(())
    }

    /// Capture instances whose source table the login cannot see: an error when the
    /// table may be one to stream, a warning when the filter cannot tell.
    fn check_invisible(
        &mut self,
        catalog: &Catalog,
        filter: &TableFilter,
    ) -> Result<(), SourceError> {
        match diagnostics::invisible(catalog, filter) {
            Invisible::None => Ok(()),
            Invisible::Stops(names) => Err(SourceError::TableInvisible {
                // With no pattern every table is streamed: the first one named is
                // enough to fix first; otherwise any of them may be the one named.
                capture_instance: names
                    .iter()
                    .take(if filter.has_patterns() {
                        names.len()
                    } else {
                        1
                    })
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
            Invisible::NotStreamed(names) => {
                for name in names {
                    if self.warned.insert(format!("invisible {name}")) {
                        tracing::warn!(
                            capture_instance = %name,
                            "the source table of this capture instance is not visible to this login; it is not streamed (grant SELECT on it if it should be)"
                        );
                    }
                }
                Ok(())
            }
        }
    }

    /// Warns once per column that events leave out, saying why.
    fn warn_left_out_columns(&mut self, instance: &CaptureInstance) {
        for (column, why) in diagnostics::left_out_columns(instance) {
            let reason = match why {
                LeftOut::Dropped => "dropped from the source table: events of rows committed before the drop carry its values, later ones leave it out".to_owned(),
                other => other.to_string(),
            };
            let key = format!("{} {}", instance.object_id, column.name);
            if self.warned.insert(key) {
                tracing::warn!(
                    capture_instance = %instance.name,
                    column = %column.name,
                    %reason,
                    "column left out of events"
                );
            }
        }
    }
}

/// For each captured column dropped from an included table, the LSN of its
/// `DROP COLUMN` in the instance's `cdc.ddl_history` (one read per such
/// instance): rows below it still hold the column's values. Not recorded yet,
/// the capture job has written no row after the drop — it records DDL as it
/// scans the log, in the same pass as the rows around it — so every row read
/// holds the column until the record appears (which changes the catalog's
/// fingerprint and brings the catalog back here).
async fn date_drops(
    source: &mut impl CdcReads,
    filter: &TableFilter,
    catalog: &mut Catalog,
) -> Result<(), SourceError> {
    for instance in catalog.instances.iter_mut().filter(|i| {
        filter.allows(&i.schema, &i.table) && i.columns.iter().any(|c| c.dropped.is_some())
    }) {
        let history = source.ddl_history(&instance.name).await?;
        for column in &mut instance.columns {
            let Some(dropped) = column.dropped.as_mut() else {
                continue;
            };
            // The first drop of the name the instance recorded: the captured
            // column was there from the instance's start, so that is its drop
            // (a later one is of a column added again under the name).
            dropped.at = history
                .iter()
                .find(|d| drops_column(&d.ddl_command, &column.name))
                .map(|d| d.ddl_lsn);
        }
    }
    Ok(())
}

/// The zone commit times are converted with (`source.time_zone`), said once.
/// `"server"` on a server that cannot name its zone is refused, naming the
/// setting.
fn resolve_time_zone(
    catalog: &Catalog,
    setting: &TimeZoneSetting,
) -> Result<CommitTimeZone, SourceError> {
    let zone = catalog.commit_time_zone(setting)?;
    match (setting, &catalog.server_time_zone) {
        (TimeZoneSetting::Server, Some(id)) => tracing::info!(
            server_time_zone = %id,
            "commit times converted to UTC with the server's own time zone, the offset in force at each commit"
        ),
        _ => tracing::info!(
            zone = %zone.describe(),
            "commit times converted to UTC with this zone (setting source.time_zone)"
        ),
    }
    Ok(zone)
}

/// Where `instance` hands its table over to a newer capture instance, if it has
/// one: as recorded in the position when first seen, else the smallest
/// `start_lsn` among the newer ones (recorded now). A newer instance without a
/// `start_lsn` yet goes to `waiting_for`: the switch point is unknown until it has
/// one.
fn superseded_at(
    position: &mut Position,
    instance: &CaptureInstance,
    start_lsn: Lsn,
    included: &[&CaptureInstance],
    waiting_for: &mut Vec<String>,
) -> Option<Lsn> {
    let recorded = position
        .switches
        .get(&instance.name)
        .filter(|s| included.iter().any(|o| o.name == s.to))
        .map(|s| s.at);
    if recorded.is_some() {
        return recorded;
    }
    // Newer: created later (the object id breaks a tie), never judged by
    // start_lsn, which the cleanup job raises on both alike.
    let newer = |other: &&&CaptureInstance| {
        other.schema == instance.schema
            && other.table == instance.table
            && (other.create_date, other.object_id) > (instance.create_date, instance.object_id)
    };
    if let Some(pending) = included
        .iter()
        .filter(newer)
        .find(|o| o.start_lsn.is_none())
    {
        waiting_for.push(pending.name.clone());
    }
    let (at, to) = included
        .iter()
        .filter(newer)
        .filter_map(|o| o.start_lsn.map(|at| (at, o.name.clone())))
        .min()?;
    let at = at.max(start_lsn);
    position
        .switches
        .insert(instance.name.clone(), Switch { to, at });
    Some(at)
}

/// Refuses a position that belongs to another database or stream; records the
/// identity in one that has none yet. Another server name alone (a failover, a
/// listener) is only logged.
pub(super) fn check_identity(
    position: &mut Position,
    now: SourceIdentity,
) -> Result<(), SourceError> {
    match &position.source {
        None => {
            position.source = Some(Box::new(now));
            Ok(())
        }
        Some(recorded) => {
            if !recorded.same_stream(&now) {
                return Err(SourceError::OtherDatabase {
                    checkpoint: recorded.to_string(),
                    now: now.to_string(),
                });
            }
            if recorded.server != now.server {
                tracing::warn!(checkpoint = %recorded.server, now = %now.server, "the server name changed since the checkpoint (a failover?); the database and stream are the same, so the stream goes on");
            }
            let guids = |i: &SourceIdentity| (i.database_guid, i.local_database_guid);
            if guids(recorded) != guids(&now) && now.database_guid.is_some() {
                tracing::info!(
                    checkpoint = %recorded,
                    now = %now,
                    "the database is known by other GUIDs than at the checkpoint (it joined or left an availability group, or another replica is primary); the stream GUID, and every event id, stay as they were"
                );
            }
            if **recorded != now {
                position.source = Some(Box::new(now));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdc_sim::{CdcSimulator, SimColumn};
    use crate::event::Value;
    use crate::event::value::SqlType;

    /// `dbo.Orders` with the capture instance `dbo_Orders_v1` and one change.
    fn orders() -> CdcSimulator {
        let sim = CdcSimulator::new("Shop", Uuid::from_u128(7), 0);
        sim.create_table(
            "dbo",
            "Orders",
            vec![SimColumn::new("Id", SqlType::Int)],
            &["Id"],
        );
        sim.enable_table("dbo.Orders", Some("dbo_Orders_v1"))
            .unwrap();
        insert(&sim, 1);
        sim
    }

    fn insert(sim: &CdcSimulator, id: i32) {
        sim.transaction()
            .insert("dbo.Orders", vec![Value::Int(id)])
            .commit()
            .unwrap();
    }

    fn tracked<'a, S>(poller: &'a Poller<S>, name: &str) -> &'a Tracked {
        poller
            .tracker
            .instance(name)
            .unwrap_or_else(|| panic!("{name} is not tracked"))
    }

    #[test]
    fn the_tracker_is_due_when_stale_or_old_and_says_a_switch_wait_once() {
        let mut tracker = CatalogTracker::new();
        let hour = Duration::from_secs(3600);
        assert!(tracker.due(hour), "never read");
        tracker.read_at = Some(Instant::now());
        tracker.stale = false;
        assert!(!tracker.due(hour));
        assert!(
            tracker.due(Duration::ZERO),
            "read longer ago than the refresh"
        );
        tracker.mark_stale();
        assert!(tracker.due(hour));

        assert!(!tracker.waits_for_a_switch_point());
        tracker.waiting_for = vec!["dbo_Orders_v2".into()];
        assert!(tracker.waits_for_a_switch_point());
        assert!(tracker.waits_for_a_switch_point());
        assert_eq!(tracker.warned.len(), 1, "said once");
    }

    /// The switch from a table's older capture instance is said once, with the
    /// table's DDL: for a table first seen with two instances while others are read
    /// already, and for a table read for a while that gains a newer one.
    #[tokio::test]
    async fn a_switch_to_a_newer_instance_is_said_once() {
        let sim = orders();
        let mut poller = Poller::new(sim.clone(), PollerConfig::default(), None);
        poller.load_catalog().await.unwrap();
        sim.create_table(
            "dbo",
            "Items",
            vec![SimColumn::new("Id", SqlType::Int)],
            &["Id"],
        );
        sim.enable_table("dbo.Items", Some("dbo_Items_v1")).unwrap();
        sim.enable_table("dbo.Items", Some("dbo_Items_v2")).unwrap();
        sim.run_capture_job();
        let log = crate::test_log::capture();
        // Each read of the catalog: the switch lines said so far.
        let mut read_again = async || {
            poller.tracker.mark_stale();
            poller.load_catalog().await.unwrap();
            log.with_message("table has a newer capture instance; switching to it at its start LSN")
        };
        let said = read_again().await;
        assert_eq!(said.len(), 1, "{said:?}");
        assert_eq!(said[0]["from"], "dbo_Items_v1");
        assert_eq!(read_again().await.len(), 1, "said once");
        // A newer instance of a table read already: its switch is said too.
        sim.enable_table("dbo.Orders", Some("dbo_Orders_v2"))
            .unwrap();
        sim.run_capture_job();
        let said = read_again().await;
        assert_eq!(said.len(), 2, "{said:?}");
        assert_eq!(said[1]["from"], "dbo_Orders_v1");
        assert_eq!(read_again().await.len(), 2, "each said once");
    }

    #[tokio::test]
    async fn an_older_instance_hands_over_at_the_newer_ones_start_lsn_and_takes_back_when_it_goes()
    {
        let sim = orders();
        sim.enable_table("dbo.Orders", Some("dbo_Orders_v2"))
            .unwrap();
        sim.run_capture_job();
        let v2_start = sim.start_lsn("dbo_Orders_v2").unwrap();
        let mut poller = Poller::new(sim.clone(), PollerConfig::default(), None);
        poller.load_catalog().await.unwrap();
        assert_eq!(
            tracked(&poller, "dbo_Orders_v1").superseded_at,
            Some(v2_start)
        );
        assert_eq!(tracked(&poller, "dbo_Orders_v2").superseded_at, None);
        assert_eq!(
            poller.position.switches.get("dbo_Orders_v1"),
            Some(&Switch {
                to: "dbo_Orders_v2".into(),
                at: v2_start,
            }),
            "recorded, so that a cleanup moving both start_lsns cannot move it"
        );
        assert!(poller.tracker.waiting_for.is_empty());

        // The newer instance is disabled: the older one reads on from where the
        // newer one got to.
        let reached = Lsn::from_parts(0xB1, 0x700, 1);
        poller.position.advance("dbo_Orders_v2", reached);
        sim.disable_instance("dbo_Orders_v2");
        poller.tracker.mark_stale();
        poller.load_catalog().await.unwrap();
        assert!(poller.position.switches.is_empty());
        assert!(!poller.position.instances.contains_key("dbo_Orders_v2"));
        assert!(poller.position.instances["dbo_Orders_v1"] >= reached);
        assert_eq!(tracked(&poller, "dbo_Orders_v1").superseded_at, None);
    }

    #[tokio::test]
    async fn a_newer_instance_without_a_start_lsn_makes_the_stream_wait_for_it() {
        let sim = orders();
        sim.set_capture_job_manual(true);
        sim.enable_table("dbo.Orders", Some("dbo_Orders_v2"))
            .unwrap();
        let mut poller = Poller::new(sim.clone(), PollerConfig::default(), None);
        poller.load_catalog().await.unwrap();
        assert_eq!(poller.tracker.waiting_for, ["dbo_Orders_v2"]);
        assert_eq!(tracked(&poller, "dbo_Orders_v1").superseded_at, None);
        assert!(
            poller
                .tracker
                .tracked
                .iter()
                .all(|t| t.instance.name != "dbo_Orders_v2"),
            "not read before its start_lsn is set"
        );
        assert!(poller.position.switches.is_empty(), "no switch point yet");
    }

    #[tokio::test]
    async fn an_instance_enabled_again_under_its_name_starts_afresh() {
        let sim = orders();
        let mut poller = Poller::new(sim.clone(), PollerConfig::default(), None);
        poller.load_catalog().await.unwrap();
        let old_table = tracked(&poller, "dbo_Orders_v1").instance.object_id;
        poller
            .position
            .change_tables
            .insert("dbo_Orders_v1".into(), old_table);
        poller
            .position
            .advance("dbo_Orders_v1", Lsn::from_parts(0xB1, 0x10, 1));
        sim.disable_instance("dbo_Orders_v1");
        sim.enable_table("dbo.Orders", Some("dbo_Orders_v1"))
            .unwrap();
        sim.run_capture_job();
        poller.tracker.mark_stale();
        poller.load_catalog().await.unwrap();
        assert_ne!(
            tracked(&poller, "dbo_Orders_v1").instance.object_id,
            old_table
        );
        assert!(
            !poller.position.instances.contains_key("dbo_Orders_v1"),
            "read from the new change table's start, not the old position"
        );
    }
}

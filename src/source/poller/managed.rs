//! Capture instances that manage themselves (`source.capture_instances =
//! "managed"`), and CDC enabled on included tables that lack it
//! (`source.enable_cdc`).
//!
//! SQL Server's own capture instance never follows a table's columns: a column added
//! is not captured, a column dropped stays in the change table as NULL (*What is
//! change data capture*, Handling changes to source tables). The documented remedy is
//! a second capture instance with the new column list, and the first disabled once
//! its consumers have moved over. Managed mode does exactly that, per table:
//!
//! 1. one instance whose table gained columns since it was created (an `ALTER TABLE
//!    … ADD` naming them in its `cdc.ddl_history`) or lost captured ones: a new
//!    instance (`<name>_v2`, `_v3`, …) with the same options (gating role, index,
//!    filegroup, net changes) capturing the columns the old one still has plus the
//!    added ones. The stream switches to it at its `start_lsn` as it does for any
//!    second instance, without duplicates;
//! 2. two instances: the older is disabled once the checkpoint holds every change of
//!    it below the switch point (the pipeline tells the poller each position it
//!    writes). Until then nothing else is done for the table: never a third.
//!
//! Each step is decided from the catalog and the checkpoint alone, and is harmless to
//! repeat, so a crash at any point resumes: before the create, the difference is
//! still there; after it, the table has two instances and the stream switches; after
//! the disable, one again. Nothing is attempted without `db_owner` (the run stops
//! first, naming the grant).
//!
//! Both procedures wait for a lock on the table behind any open transaction that
//! wrote it, and application writers queue behind that wait; so they run with a
//! short lock timeout ([`queries::CAPTURE_DDL_LOCK_TIMEOUT_MS`]). One that gives up
//! changed nothing: no procedure runs again until a backoff has passed
//! ([`LockRetry`]), the stream goes on meanwhile, and the step is decided afresh
//! from the catalog then (a call whose answer was lost but that completed on the
//! server is seen there as done).
//!
//! [`queries::CAPTURE_DDL_LOCK_TIMEOUT_MS`]: crate::source::queries::CAPTURE_DDL_LOCK_TIMEOUT_MS

use super::ddl_text::adds_column;
use super::*;
use crate::mssql::SqlErrorKind;
use crate::source::{CaptureDdl, CdcReads, EnableCapture, SourceError, UncapturedColumns};
use std::collections::BTreeSet;

/// The longest wait between attempts after CDC's procedures gave up on a lock.
const LOCK_RETRY_MOST: Duration = Duration::from_secs(300);

/// When CDC's procedures may run again after one gave up waiting for a lock.
#[derive(Debug)]
pub(super) struct LockRetry {
    backoff: crate::backoff::Backoff,
    not_before: Option<Instant>,
}

impl LockRetry {
    /// Waits from `first` (`PollerConfig::capture_ddl_retry`), doubling.
    pub(super) fn new(first: Duration) -> Self {
        LockRetry {
            backoff: crate::backoff::Backoff::new(first, LOCK_RETRY_MOST),
            not_before: None,
        }
    }

    /// Whether a procedure gave up recently enough that none runs yet.
    fn waiting(&self) -> bool {
        self.not_before.is_some_and(|at| Instant::now() < at)
    }

    /// A procedure gave up: how long until the next may run.
    fn gave_up(&mut self) -> Duration {
        let wait = self.backoff.next_wait();
        self.not_before = Some(Instant::now() + wait);
        wait
    }

    /// Whether a procedure gave up and none has succeeded since.
    fn owed(&self) -> bool {
        self.not_before.is_some()
    }

    fn succeeded(&mut self) {
        self.backoff.reset();
        self.not_before = None;
    }
}

/// Columns a capture instance does not capture that no `ADD` in its
/// `cdc.ddl_history` names: left out on purpose (`@captured_column_list`), or added
/// by DDL the capture job has not reached yet — it writes `cdc.ddl_history` as it
/// scans the log, so a catalog read between its records of `DROP COLUMN x` and
/// `ADD x` sees the new `x` unexplained. A new instance for such a table waits until
/// the job has scanned past the read that first showed those columns: every DDL
/// that read saw is recorded by then, and what is still unexplained is left out on
/// purpose.
#[derive(Debug, Default)]
pub(super) struct DdlRecordWait {
    /// Per capture instance: the unexplained columns and the server's time of the
    /// read that first showed them.
    since: BTreeMap<String, (Vec<String>, chrono::NaiveDateTime)>,
}

impl DdlRecordWait {
    /// Whether the capture job has scanned past the read that first showed
    /// `unexplained` for `instance` (that read is `found` when none before did).
    /// `true` ends the wait; `false` starts or continues it.
    fn recorded(
        &mut self,
        instance: &str,
        unexplained: Vec<String>,
        found: &UncapturedColumns,
    ) -> bool {
        let Some(read_at) = found.read_at else {
            return true;
        };
        let since = match self.since.get(instance) {
            Some((columns, since)) if *columns == unexplained => *since,
            _ => {
                self.since
                    .insert(instance.to_owned(), (unexplained, read_at));
                read_at
            }
        };
        // `tran_end_time` is a `datetime`, rounded to 1/300 s (up to 2 ms late).
        let past = found
            .scanned_through
            .is_some_and(|scanned| scanned > since + chrono::Duration::milliseconds(2));
        if past {
            self.since.remove(instance);
        }
        past
    }

    /// Forgets the instances not in `current` (their tables were decided otherwise).
    fn keep_only(&mut self, current: &BTreeSet<String>) {
        self.since.retain(|instance, _| current.contains(instance));
    }

    /// Nothing is to be created for `instance`'s table: no wait.
    fn forget(&mut self, instance: &str) {
        self.since.remove(instance);
    }

    fn is_empty(&self) -> bool {
        self.since.is_empty()
    }
}

/// `source.capture_instances`: who creates capture instances when a table's
/// columns change.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum CaptureInstanceMode {
    /// Capture instances are a DBA's; the stream follows what they create.
    #[default]
    Manual,
    /// A table whose columns change gets a new capture instance, and the old one is
    /// disabled once drained (needs `db_owner`).
    Managed,
}

/// What `source.capture_instances = "managed"` and `source.enable_cdc` need before
/// anything connects: a SQL Server source and, to enable CDC, tables named in
/// `source.include`. The setting and why, when not.
pub fn check_capture_settings(
    sqlserver: bool,
    mode: CaptureInstanceMode,
    enable_cdc: bool,
    include: &[String],
) -> Result<(), (&'static str, &'static str)> {
    if !sqlserver && mode == CaptureInstanceMode::Managed {
        return Err((
            "source.capture_instances",
            "\"managed\" creates capture instances on SQL Server; the synthetic source has none: use kind = \"sqlserver\", or \"manual\"",
        ));
    }
    if !sqlserver && enable_cdc {
        return Err((
            "source.enable_cdc",
            "enables CDC on SQL Server tables; the synthetic source has none: use kind = \"sqlserver\", or false",
        ));
    }
    let everything = |p: &String| matches!(p.trim(), "*" | "*.*");
    if enable_cdc && (include.is_empty() || include.iter().any(everything)) {
        return Err((
            "source.enable_cdc",
            "with source.include empty or \"*.*\" every table of the database would be enabled for CDC: name the tables (or schemas, \"dbo.*\") to enable in source.include",
        ));
    }
    Ok(())
}

/// What this process has done to the CDC configuration (for the metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaptureActions {
    /// Capture instances created for a table whose columns changed.
    pub created: u64,
    /// Older capture instances disabled once drained.
    pub disabled: u64,
    /// Tables CDC was enabled on (`source.enable_cdc`).
    pub tables_enabled: u64,
}

/// The longest capture-instance name `sys.sp_cdc_enable_table` takes.
pub(super) const MAX_INSTANCE_NAME: usize = 100;

/// The name of the instance that follows `old`: `old_v2`, or with `old` already
/// `base_vN`, `base_v(N+1)`; the first such name not in `taken`, cut to
/// [`MAX_INSTANCE_NAME`] characters.
pub fn next_instance_name(old: &str, taken: &[&str]) -> String {
    let (base, number) = match old.rsplit_once("_v") {
        Some((base, digits))
            if !base.is_empty()
                && !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit()) =>
        {
            (base, digits.parse::<u64>().unwrap_or(1))
        }
        _ => (old, 1),
    };
    let mut number = number.saturating_add(1);
    loop {
        let suffix = format!("_v{number}");
        let room = MAX_INSTANCE_NAME.saturating_sub(suffix.chars().count());
        let name: String = base.chars().take(room).chain(suffix.chars()).collect();
        if !taken.contains(&name.as_str()) {
            return name;
        }
        number = number.saturating_add(1);
    }
}

/// The capture manager: what managed mode and `source.enable_cdc` decide, and the
/// state those decisions keep between catalog reads.
pub(super) struct CaptureManager {
    /// `source.capture_instances`.
    mode: CaptureInstanceMode,
    /// `source.enable_cdc`.
    enable_cdc: bool,
    /// Whether batches carry schema-change events: an older instance is then kept
    /// until the event naming the newer one is checkpointed too.
    announcing: bool,
    /// What this process did to the CDC configuration.
    actions: CaptureActions,
    /// The login was found to be `db_owner` (asked once, when needed).
    may_manage: bool,
    /// The catalog version whose columns were last compared.
    compared_version: Option<crate::source::CatalogVersion>,
    /// When CDC's procedures may run again after one gave up on a lock.
    lock_retry: LockRetry,
    /// New capture instances that wait for the capture job to record DDL.
    ddl_wait: DdlRecordWait,
    /// The positions the checkpoint holds, as the pipeline writes them.
    checkpoints: Option<tokio::sync::watch::Receiver<Option<Position>>>,
    /// The position the poller started from: the checkpoint's, until the pipeline
    /// writes another.
    started_from: Option<Position>,
    /// What was said once.
    warned: BTreeSet<String>,
}

impl CaptureManager {
    /// A manager for `config`'s settings, for a poller starting at `started_from`.
    pub(super) fn new(config: &PollerConfig, started_from: Option<Position>) -> Self {
        CaptureManager {
            mode: config.capture_instances,
            enable_cdc: config.enable_cdc,
            announcing: config.schema_changes,
            actions: CaptureActions::default(),
            may_manage: false,
            compared_version: None,
            lock_retry: LockRetry::new(config.capture_ddl_retry),
            ddl_wait: DdlRecordWait::default(),
            checkpoints: None,
            started_from,
            warned: BTreeSet::new(),
        }
    }

    /// Hands the manager the positions the checkpoint holds, as each is written: a
    /// managed instance is disabled only once its changes are among them (or among
    /// those of the position the poller started from, the checkpoint's).
    pub(super) fn watch_checkpoints(
        &mut self,
        checkpoints: tokio::sync::watch::Receiver<Option<Position>>,
    ) {
        self.checkpoints = Some(checkpoints);
    }

    /// What this process has done to the CDC configuration.
    pub(super) fn actions(&self) -> CaptureActions {
        self.actions
    }

    /// Refuses managed mode or `enable_cdc` without `db_owner` (asked once).
    async fn may_manage(&mut self, source: &mut impl CaptureDdl) -> Result<(), SourceError> {
        if self.may_manage {
            return Ok(());
        }
        if !source.may_manage_capture().await? {
            return Err(if self.mode == CaptureInstanceMode::Managed {
                SourceError::ManageDenied {
                    procedures: "sys.sp_cdc_enable_table and sys.sp_cdc_disable_table",
                    setting: "source.capture_instances = \"managed\"",
                    instead: "set source.capture_instances = \"manual\"",
                }
            } else {
                SourceError::ManageDenied {
                    procedures: "sys.sp_cdc_enable_table and sys.sp_cdc_disable_table",
                    setting: "source.enable_cdc = true",
                    instead: "set source.enable_cdc = false and enable CDC on the tables yourself",
                }
            });
        }
        self.may_manage = true;
        Ok(())
    }

    /// `source.enable_cdc`: enables CDC on every included table that lacks it
    /// (`@role_name = NULL`, every column, SQL Server's default instance name
    /// `schema_table`); true when it enabled one.
    pub(super) async fn enable_missing_tables(
        &mut self,
        source: &mut (impl CdcReads + CaptureDdl),
        filter: &TableFilter,
    ) -> Result<bool, SourceError> {
        if !self.enable_cdc || self.lock_retry.waiting() {
            return Ok(false);
        }
        self.may_manage(source).await?;
        let tables = source.uncaptured_tables().await?;
        let mut enabled = false;
        for t in tables {
            if !filter.allows(&t.schema, &t.table) {
                continue;
            }
            let request = EnableCapture {
                capture_instance: format!("{}_{}", t.schema, t.table)
                    .chars()
                    .take(MAX_INSTANCE_NAME)
                    .collect(),
                schema: t.schema,
                table: t.table,
                options: Default::default(),
                columns: None,
            };
            let table = format!("{}.{}", request.schema, request.table);
            let result = source.enable_capture(&request).await;
            if self.settle(result, format!("enable {table}"), |e| {
                tracing::warn!(%table, error = %crate::error::Chain(&e), "CDC could not be enabled on an included table (source.enable_cdc); it is not streamed");
            })? {
                tracing::info!(
                    %table,
                    capture_instance = %request.capture_instance,
                    "CDC enabled on an included table that lacked it (source.enable_cdc): its changes stream from the capture job's next scan"
                );
                self.actions.tables_enabled += 1;
                enabled = true;
            }
        }
        Ok(enabled)
    }

    /// Managed mode, after each catalog read: per included table (by `filter`), a
    /// new capture instance when its columns changed, or the older of two disabled
    /// once drained (`switches` are the position's). `loading` while an initial load
    /// runs: it reads through the instances as they are, so nothing is done. True
    /// when the CDC configuration changed (the catalog is to be read again).
    pub(super) async fn manage(
        &mut self,
        source: &mut (impl CdcReads + CaptureDdl),
        catalog: &Catalog,
        filter: &TableFilter,
        switches: &BTreeMap<String, Switch>,
        loading: bool,
    ) -> Result<bool, SourceError> {
        if self.mode != CaptureInstanceMode::Managed || self.lock_retry.waiting() {
            return Ok(false);
        }
        self.may_manage(source).await?;
        if loading {
            return Ok(false);
        }
        let mut tables: BTreeMap<String, Vec<CaptureInstance>> = BTreeMap::new();
        for instance in catalog
            .instances
            .iter()
            .filter(|i| filter.allows(&i.schema, &i.table))
        {
            tables
                .entry(instance.qualified_table())
                .or_default()
                .push(instance.clone());
        }
        let taken: Vec<String> = catalog.instances.iter().map(|i| i.name.clone()).collect();
        let version = catalog.version;
        let columns_changed_somewhere = self.compared_version != Some(version);
        let mut uncaptured: Option<UncapturedColumns> = None;
        let mut compared = BTreeSet::new();
        let mut changed = false;
        for (table, mut instances) in tables {
            // Older first, as the switch itself orders them.
            instances.sort_by_key(|i| (i.create_date, i.object_id));
            changed |= match instances.as_slice() {
                [older, newer] => {
                    let switch_at = switches.get(&older.name).map(|s| s.at);
                    self.retire_when_delivered(source, &table, older, newer, switch_at)
                        .await?
                }
                [only] if columns_changed_somewhere => {
                    let found = match uncaptured.take() {
                        Some(found) => found,
                        None => source.uncaptured_columns().await?,
                    };
                    compared.insert(only.name.clone());
                    let created = self
                        .replace_if_changed(source, &table, only, &found, &taken)
                        .await?;
                    uncaptured = Some(found);
                    created
                }
                _ => false,
            };
        }
        if columns_changed_somewhere {
            self.ddl_wait.keep_only(&compared);
        }
        // A step that gave up on a lock, or that waits for the capture job, is
        // decided afresh from the catalog at the next read, changed or not.
        self.compared_version =
            (!self.lock_retry.owed() && self.ddl_wait.is_empty()).then_some(version);
        Ok(changed)
    }

    /// A new capture instance for `instance`'s table when columns were added to the
    /// table after the instance was created (of those it does not capture, the ones
    /// an `ADD` in its DDL history names) or captured ones were dropped; once the
    /// capture job has recorded every DDL the catalog read showed
    /// ([`DdlRecordWait`]). True when it created one.
    async fn replace_if_changed(
        &mut self,
        source: &mut (impl CdcReads + CaptureDdl),
        table: &str,
        instance: &CaptureInstance,
        found: &UncapturedColumns,
        taken: &[String],
    ) -> Result<bool, SourceError> {
        let dropped: Vec<String> = instance
            .columns
            .iter()
            .filter(|c| c.table_index.is_none())
            .map(|c| c.name.clone())
            .collect();
        let (added, unexplained): (Vec<String>, Vec<String>) = {
            let not_captured: Vec<&String> = found
                .columns
                .iter()
                .filter(|(name, _)| *name == instance.name)
                .map(|(_, column)| column)
                .collect();
            if not_captured.is_empty() {
                Default::default()
            } else {
                let ddl = source.ddl_history(&instance.name).await?;
                not_captured
                    .into_iter()
                    .cloned()
                    .partition(|column| ddl.iter().any(|d| adds_column(&d.ddl_command, column)))
            }
        };
        if added.is_empty() && dropped.is_empty() {
            self.ddl_wait.forget(&instance.name);
            return Ok(false);
        }
        if !unexplained.is_empty()
            && !self
                .ddl_wait
                .recorded(&instance.name, unexplained.clone(), found)
        {
            if self
                .warned
                .insert(format!("ddl wait {} {unexplained:?}", instance.name))
            {
                tracing::info!(
                    %table,
                    capture_instance = %instance.name,
                    ?added,
                    ?dropped,
                    not_captured = ?unexplained,
                    "the new capture instance waits until the capture job has recorded the table's DDL: columns the instance does not capture may have been added by DDL it has not scanned yet"
                );
            }
            return Ok(false);
        }
        let taken: Vec<&str> = taken.iter().map(String::as_str).collect();
        let name = next_instance_name(&instance.name, &taken);
        let mut columns: Vec<String> = instance
            .columns
            .iter()
            .filter(|c| c.table_index.is_some())
            .map(|c| c.name.clone())
            .collect();
        columns.extend(added.iter().cloned());
        let request = EnableCapture {
            schema: instance.schema.clone(),
            table: instance.table.clone(),
            capture_instance: name.clone(),
            options: instance.options.clone(),
            columns: Some(columns),
        };
        let result = source.enable_capture(&request).await;
        // On a refusal, decided again at the next catalog change, not every read.
        if self.settle(result, format!("create {name}"), |e| {
            tracing::warn!(%table, capture_instance = %name, error = %crate::error::Chain(&e), "could not create a capture instance for the table's new columns; the stream goes on with the old one and tries again when the catalog changes");
        })? {
            tracing::info!(
                %table,
                from = %instance.name,
                to = %name,
                ?added,
                ?dropped,
                "capture instance created for the table's new columns (source.capture_instances = \"managed\"); the stream switches to it at its start LSN, and the old one is disabled once its changes are checkpointed"
            );
            self.actions.created += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Disables `older` once the checkpoint holds every change of it below the
    /// point where `newer` takes over (`recorded_switch`, the position's, else
    /// `newer`'s `start_lsn`). True when it disabled it.
    async fn retire_when_delivered(
        &mut self,
        source: &mut (impl CdcReads + CaptureDdl),
        table: &str,
        older: &CaptureInstance,
        newer: &CaptureInstance,
        recorded_switch: Option<Lsn>,
    ) -> Result<bool, SourceError> {
        let Some(start) = newer.start_lsn else {
            return Ok(false); // the switch point is not known yet
        };
        let switch_at = recorded_switch.unwrap_or(start);
        let written = self.checkpoints.as_ref().and_then(|rx| rx.borrow().clone());
        let announcing = self.announcing;
        let drained = written
            .as_ref()
            .or(self.started_from.as_ref())
            .is_some_and(|checkpoint| {
                checkpoint.change_tables.get(&older.name) == Some(&older.object_id)
                    && checkpoint
                        .instances
                        .get(&older.name)
                        .is_some_and(|&through| through >= last_before(switch_at))
                    // The schema-change event that names the newer instance (and
                    // carries the DDL in the older one's history) is checkpointed.
                    && (!announcing
                        || checkpoint
                            .table_versions
                            .get(table)
                            .and_then(|v| v.columns.as_ref())
                            .is_some_and(|shape| shape.capture_instance == newer.name))
            });
        if !drained {
            if self.warned.insert(format!("retire {}", older.name)) {
                tracing::info!(
                    %table,
                    capture_instance = %older.name,
                    newer = %newer.name,
                    "older capture instance kept until the checkpoint holds its changes below the switch{}",
                    if announcing { " and the schema-change event of the newer one (its first row)" } else { "" }
                );
            }
            return Ok(false);
        }
        let result = source.disable_capture(older).await;
        if self.settle(result, format!("disable {}", older.name), |e| {
            tracing::warn!(%table, capture_instance = %older.name, error = %crate::error::Chain(&e), "could not disable the drained capture instance; it is tried again at the next catalog read");
        })? {
            tracing::info!(
                %table,
                disabled = %older.name,
                streaming_from = %newer.name,
                switch_lsn = %switch_at,
                "older capture instance disabled: every change it held below the switch is delivered and checkpointed (source.capture_instances = \"managed\")"
            );
            self.actions.disabled += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// The outcome of a DDL step: done (`Ok(true)`); refused for want of a
    /// permission, or a fault that passes, stops the poll (`Err`); anything else is
    /// warned about once (per `step` and error) and left for later (`Ok(false)`).
    fn settle(
        &mut self,
        result: Result<(), SourceError>,
        step: String,
        warn: impl FnOnce(&SourceError),
    ) -> Result<bool, SourceError> {
        match result {
            Ok(()) => {
                self.lock_retry.succeeded();
                Ok(true)
            }
            Err(e @ SourceError::LockTimeout { .. }) => {
                let wait = self.lock_retry.gave_up();
                tracing::warn!(
                    %step,
                    error = %crate::error::Chain(&e),
                    retry_in_ms = wait.as_millis() as u64,
                    "a CDC procedure gave up waiting for a lock on its table; it is tried again later, and the stream goes on meanwhile"
                );
                Ok(false)
            }
            Err(e @ SourceError::Sql(SqlErrorKind::PermissionDenied { .. })) => Err(e),
            Err(e) if e.is_transient() => Err(e),
            Err(e) => {
                if self.warned.insert(format!("{step}: {e}")) {
                    warn(&e);
                }
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdc_sim::{CdcSimulator, SimColumn};
    use crate::event::value::SqlType;

    /// A procedure that gave up is owed and waited for; once one succeeds nothing is
    /// owed, none waits, and the backoff starts again from its first step.
    #[test]
    fn a_success_clears_what_a_lock_left_owed() {
        let first = Duration::from_secs(60);
        let mut retry = LockRetry::new(first);
        assert!(!retry.owed() && !retry.waiting());
        let wait = retry.gave_up();
        assert!(retry.owed() && retry.waiting());
        retry.gave_up();
        retry.succeeded();
        assert!(!retry.owed() && !retry.waiting());
        // The first step again, not the doubled one (with its jitter, at most the
        // first wait's own bound).
        let again = retry.gave_up();
        assert!(again <= first && wait <= first, "{wait:?} then {again:?}");
    }

    fn orders() -> CdcSimulator {
        let sim = CdcSimulator::new("Shop", uuid::Uuid::from_u128(7), 0);
        sim.create_table(
            "dbo",
            "Orders",
            vec![SimColumn::new("Id", SqlType::Int)],
            &["Id"],
        );
        sim.enable_table("dbo.Orders", Some("dbo_Orders")).unwrap();
        sim.run_capture_job();
        sim
    }

    fn config(mode: CaptureInstanceMode) -> PollerConfig {
        PollerConfig {
            capture_instances: mode,
            ..PollerConfig::default()
        }
    }

    #[tokio::test]
    async fn the_manager_asks_nothing_in_manual_mode_and_refuses_managed_mode_without_db_owner() {
        let mut sim = orders();
        let catalog = sim.catalog().await.unwrap();
        let filter = TableFilter::default();
        let switches = BTreeMap::new();
        let mut manual = CaptureManager::new(&config(CaptureInstanceMode::Manual), None);
        let before = sim.round_trips();
        let changed = manual
            .manage(&mut sim, &catalog, &filter, &switches, false)
            .await
            .unwrap();
        assert!(!changed);
        assert!(
            !manual
                .enable_missing_tables(&mut sim, &filter)
                .await
                .unwrap()
        );
        assert_eq!(
            sim.round_trips(),
            before,
            "manual mode asks the server nothing"
        );

        sim.set_db_owner(false);
        let mut managed = CaptureManager::new(&config(CaptureInstanceMode::Managed), None);
        let refused = managed
            .manage(&mut sim, &catalog, &filter, &switches, false)
            .await
            .unwrap_err();
        assert!(
            matches!(refused, SourceError::ManageDenied { setting, .. } if setting.contains("managed")),
            "{refused}"
        );
        sim.set_db_owner(true);
        // While a load runs nothing is decided, and an unchanged table is left alone.
        assert!(
            !managed
                .manage(&mut sim, &catalog, &filter, &switches, true)
                .await
                .unwrap()
        );
        assert!(
            !managed
                .manage(&mut sim, &catalog, &filter, &switches, false)
                .await
                .unwrap()
        );
        assert_eq!(managed.actions(), CaptureActions::default());
    }

    #[test]
    fn next_names_count_up_and_fit_sql_servers_limit() {
        assert_eq!(next_instance_name("dbo_T", &[]), "dbo_T_v2");
        assert_eq!(next_instance_name("dbo_T_v2", &[]), "dbo_T_v3");
        assert_eq!(next_instance_name("dbo_T_v9", &["dbo_T_v10"]), "dbo_T_v11");
        assert_eq!(next_instance_name("dbo_T_vx", &[]), "dbo_T_vx_v2");
        assert_eq!(next_instance_name("_v3", &[]), "_v3_v2");
        let long = "x".repeat(100);
        let next = next_instance_name(&long, &[]);
        assert_eq!(next.chars().count(), MAX_INSTANCE_NAME);
        assert!(next.ends_with("_v2"));
    }
}

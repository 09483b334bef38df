//! The initial load's runner: plans the load of every included table, reads each
//! table in key order in chunks, and turns its rows into the `INS` events the
//! checkpoint's [`TableLoad`]s account for (the model is in [`crate::source::initial_load`]).

use super::load_readers::{LoadReaders, PlannedTable};
use super::*;
use crate::event::Value;
use crate::position::LOAD_ROWS_PER_RANGE;
use crate::source::{SourceClock, TableReads};

/// A table's load as this process runs it (the checkpoint has the rest).
pub(super) struct LoadRun {
    pub(super) started: Instant,
    pub(super) rows_at_start: u64,
    pub(super) estimated: Option<u64>,
    pub(super) last_log: Instant,
    /// A table without a key: the pass is open in the source.
    pub(super) pass_open: bool,
    /// A table without a key: the last row read, held until the next chunk shows
    /// whether it is the table's last.
    pub(super) held: Option<Vec<crate::event::Value>>,
    /// Hashes of the keys chunks resumed after: one coming back means the server's
    /// seek did not move past it (a key value that does not survive the round trip
    /// as text), which would otherwise loop for ever.
    pub(super) resumed_after: std::collections::HashSet<u64>,
}

/// How often a load's progress is logged.
const LOAD_LOG_EVERY: Duration = Duration::from_secs(5);

/// The load runner: what this process knows of the loads it runs beyond the
/// checkpoint's [`TableLoad`]s (which the poller's position holds and passes in).
pub(super) struct LoadRunner {
    /// Per capture instance: the load of its table running in this process.
    runs: BTreeMap<String, LoadRun>,
    /// The initial load is still to be planned (no checkpoint, `[snapshot]` on).
    needs_plan: bool,
    /// The cleanup job's retention, read when a load is planned.
    retention: Option<Duration>,
    /// Per capture instance: its table's rows as `sys.partitions` estimated them,
    /// asked once (for the retention projection).
    estimates: BTreeMap<String, Option<u64>>,
    /// An `initial_only` run has said why it streams nothing more.
    said_loaded: bool,
    /// The projection past the retention was warned about.
    warned_retention: bool,
    /// Rows per chunk (`snapshot.chunk_size`, at least one).
    chunk: usize,
    /// Connections of their own that read loads ahead (`snapshot.max_connections`).
    pub(super) readers: LoadReaders,
}

impl LoadRunner {
    /// A runner for `config`; the initial load is to be planned when `[snapshot]`
    /// loads and the run starts without a checkpoint (or at a start position).
    pub(super) fn new(config: &PollerConfig, position: Option<&Position>) -> Self {
        LoadRunner {
            runs: BTreeMap::new(),
            needs_plan: config.snapshot.loads() && position.is_none_or(Position::is_start),
            retention: None,
            estimates: BTreeMap::new(),
            said_loaded: false,
            warned_retention: false,
            chunk: config.load_chunk.max(1),
            readers: LoadReaders::new(config.load_connections, config.load_chunk),
        }
    }

    pub(super) fn needs_plan(&self) -> bool {
        self.needs_plan
    }

    /// Says once that an `initial_only` run already loaded; true the first time.
    pub(super) fn say_loaded_once(&mut self) -> bool {
        !std::mem::replace(&mut self.said_loaded, true)
    }

    /// The load at `at` is planned; the cleanup job's retention (from the server's
    /// facts) is what its projection is measured against.
    pub(super) fn planned(&mut self, retention: Option<Duration>) {
        self.retention = retention;
        self.needs_plan = false;
    }

    /// Forgets this process's run of `name`'s load (it is queued again, or gone).
    pub(super) fn forget(&mut self, name: &str) {
        self.runs.remove(name);
    }

    /// A poll failed: a pass over a table without a key may have broken with it,
    /// so each such load starts over.
    pub(super) fn break_passes(&mut self) {
        for run in self.runs.values_mut() {
            run.pass_open = false;
            run.held = None;
        }
    }

    /// The loads running or queued (`loads`, the position's), for the metrics.
    pub(super) fn status(&self, loads: &BTreeMap<String, TableLoad>) -> Vec<LoadStatus> {
        loads
            .iter()
            .map(|(name, load)| {
                let run = self.runs.get(name);
                LoadStatus {
                    table: load.table.clone(),
                    rows: load.rows,
                    estimated: run.and_then(|r| r.estimated),
                    rows_per_second: run.map_or(0.0, |r| {
                        let seconds = r.started.elapsed().as_secs_f64();
                        if seconds > 0.0 {
                            load.rows.saturating_sub(r.rows_at_start) as f64 / seconds
                        } else {
                            0.0
                        }
                    }),
                }
            })
            .collect()
    }
}

impl<S: ChangeSource> Poller<S> {
    /// Whether the initial load is still to be planned: the caller may plan it (and
    /// write the checkpoint) before the first poll, so that the load's LSN is durable
    /// before any row is sent.
    pub fn needs_plan(&self) -> bool {
        self.loads.needs_plan()
    }

    /// Plans the initial load: records L0 (`max_lsn`), marks every tracked capture
    /// instance complete through it, and queues a load of each table (the newest
    /// capture instance of each). Returns false, planning nothing, while an included
    /// instance has no `start_lsn` yet (the capture job has not scanned since it was
    /// enabled): where its changes begin is not known.
    pub async fn plan_load(&mut self) -> Result<bool, SourceError> {
        if !self.loads.needs_plan() {
            return Ok(true);
        }
        let max = self.max_lsn_with_catalog().await?;
        if let Some(catalog) = self.tracker.catalog() {
            let filter = &self.config.filter;
            if let Some(pending) = catalog
                .instances
                .iter()
                .find(|i| i.start_lsn.is_none() && filter.allows(&i.schema, &i.table))
            {
                tracing::info!(capture_instance = %pending.name, "the initial load waits for the capture job to set this capture instance's start_lsn");
                return Ok(false);
            }
        }
        let at = max.lsn.filter(|l| !l.is_zero()).unwrap_or(Lsn::ZERO);
        let commit_time_ns = self.commit_time_ns(at).await?;
        // Every instance is complete through `at` from here, so the stream's clock
        // has read that commit (changes after it are read after it).
        if !at.is_zero() {
            let read = chrono::DateTime::from_timestamp_nanos(commit_time_ns);
            CommitClock::advance_saved(&mut self.position.commit_clock_ns, read);
        }
        let retention = match self.source.server_facts().await {
            Ok(facts) => cleanup_retention(&facts),
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "cannot read the server's facts, so the cleanup job's retention is not known: no warning comes if the initial load outlasts it");
                None
            }
        };
        let mut tables = Vec::new();
        for t in self.tracker.tracked() {
            // Complete through L0 — or, for an instance that begins after it (enabled
            // since the last change CDC recorded, or nothing recorded yet), through
            // just below its start_lsn: it holds nothing at or below L0.
            let through = match t.instance.start_lsn {
                Some(start) if start > at => last_before(start),
                _ => at,
            };
            self.position.advance(&t.instance.name, through);
            self.position
                .change_tables
                .insert(t.instance.name.clone(), t.instance.object_id);
            if t.superseded_at.is_some() {
                // The newer capture instance of the same table is the one loaded.
                continue;
            }
            tables.push(t.instance.qualified_table());
            queue_table_load(
                &mut self.position,
                t.instance.name.clone(),
                t.instance.qualified_table(),
                at,
                commit_time_ns,
            );
        }
        self.merge.finished_through(at);
        self.loads.planned(retention);
        tracing::info!(
            mode = %self.config.snapshot,
            at_lsn = %at,
            tables = %tables.join(", "),
            retention_minutes = retention.map(|r| r.as_secs() / 60),
            "initial load planned: each table's rows are read in key order, then its changes after this LSN follow"
        );
        Ok(true)
    }

    /// The UTC commit time of the transaction at `at` (what loaded rows carry), or
    /// the present when CDC has recorded nothing yet.
    pub(super) async fn commit_time_ns(&mut self, at: Lsn) -> Result<i64, SourceError> {
        let commit = if at.is_zero() {
            None
        } else {
            self.source.lsn_time(at).await?
        };
        let zone = self
            .tracker
            .zone()
            .copied()
            .unwrap_or(CommitTimeZone::LocalAsUtc);
        // Read like a change committed there: with the offsets the server gives that
        // time and after the commits read so far. The stream's clock is not moved:
        // a re-load happens while other instances still have older changes to read.
        let mut clock = CommitClock::from_nanos(self.position.commit_clock_ns);
        let time = commit.map_or_else(chrono::Utc::now, |c| {
            clock.read(zone.readings(c.local, c.offsets))
        });
        Ok(time
            .timestamp_nanos_opt()
            .unwrap_or_else(|| time.timestamp().saturating_mul(1_000_000_000)))
    }

    /// A batch of `changes` ending at the current position.
    pub(super) async fn position_batch(
        &mut self,
        changes: Vec<Change>,
    ) -> Result<Batch, SourceError> {
        Ok(Batch {
            changes,
            schema_changes: self
                .announcer
                .take(&mut self.source, self.tracker.zone())
                .await?,
            position: self.position.clone(),
            max_lsn: self.merge.done_through().unwrap_or(Lsn::ZERO),
            heartbeat: false,
        })
    }

    /// The loads running or queued, for the metrics.
    pub fn load_status(&self) -> Vec<LoadStatus> {
        self.loads.status(&self.position.loads)
    }

    /// One chunk of the first queued load: a batch of its rows, with the position
    /// after them.
    pub(super) async fn load_step(&mut self) -> Result<PollOutcome, SourceError> {
        self.load_catalog().await?;
        let Some((name, mut load)) = self
            .position
            .loads
            .iter()
            .next()
            .map(|(name, load)| (name.clone(), load.clone()))
        else {
            return Ok(PollOutcome::Idle);
        };
        let Some(tracked) = self.tracker.instance(&name) else {
            self.replace_vanished_load(&name, load).await?;
            return Ok(PollOutcome::Batch(self.position_batch(Vec::new()).await?));
        };
        let instance = tracked.instance.clone();
        let table = Arc::clone(&tracked.context.table);
        let key_positions = key_positions(&instance)?;
        self.loads
            .start_run(&mut self.source, &name, &instance, &load)
            .await?;
        let (rows, done) = if key_positions.is_empty() {
            match self
                .loads
                .read_keyless_chunk(&mut self.source, &name, &instance, &mut load)
                .await?
            {
                Some(read) => read,
                None => return Ok(PollOutcome::Idle),
            }
        } else if self.loads.readers.enabled() {
            if !self.loads.readers.continues(&instance, load.after.as_ref()) {
                let tables = self.tables_to_read().await?;
                self.loads.readers.plan(&mut self.source, tables).await?;
                if !self.loads.readers.continues(&instance, load.after.as_ref()) {
                    return Err(SourceError::definite(format!(
                        "the load's readers were not planned from {} (a defect)",
                        load.table
                    )));
                }
            }
            self.loads
                .readers
                .next_chunk(&instance, &key_positions)
                .await?
        } else {
            self.loads
                .read_keyed_chunk(&mut self.source, &name, &instance, &load, &key_positions)
                .await?
        };
        // Set by the catalog read that every load step begins with.
        let guid = self
            .tracker
            .stream_guid()
            .ok_or(SourceError::DatabaseGuidUnreadable)?;
        let changes = loaded_changes(guid, &name, &table, &mut load, rows, done, &key_positions)?;
        if let Some(first) = changes.first() {
            self.announcer.note(
                first,
                0,
                self.tracker.tracked(),
                &mut self.position.table_versions,
            );
        }
        if done {
            self.position.loads.remove(&name);
            if self.position.loads.is_empty() {
                self.loads.readers.close();
            }
            let initial_only = self.config.snapshot == SnapshotMode::InitialOnly;
            self.loads
                .finish(&name, &load, self.position.loads.is_empty(), initial_only);
        } else {
            self.position.loads.insert(name.clone(), load);
            self.loads
                .log_progress(
                    &mut self.source,
                    &name,
                    &self.position.loads,
                    self.tracker.tracked(),
                    self.config.on_gap,
                )
                .await?;
        }
        Ok(PollOutcome::Batch(self.position_batch(changes).await?))
    }

    /// The next keyed tables whose loads are queued, in the order they go out, for
    /// the readers' plan (with their estimates, asked once per table): as many as
    /// the readers plan at once, so a plan costs a few statements however many
    /// tables are queued (the next plan takes the tables after).
    async fn tables_to_read(&mut self) -> Result<Vec<PlannedTable>, SourceError> {
        let most = self.loads.readers.tables_at_once();
        let mut tables = Vec::new();
        for (name, load) in &self.position.loads {
            if tables.len() == most {
                break;
            }
            let Some(tracked) = self.tracker.instance(name) else {
                continue;
            };
            let Ok(key_positions) = key_positions(&tracked.instance) else {
                continue;
            };
            if key_positions.is_empty() {
                continue;
            }
            let estimated = (self.loads)
                .estimate(&mut self.source, name, &tracked.instance)
                .await?;
            tables.push(PlannedTable {
                instance: Arc::new(tracked.instance.clone()),
                key_positions,
                estimated,
                after: load.after.clone(),
            });
        }
        Ok(tables)
    }

    /// The capture instance being loaded is gone. A schema change done the
    /// documented way (a second capture instance, then the first disabled) leaves the
    /// table streamed by the other one: it is loaded again through that one, at a new
    /// LSN. Otherwise the table is no longer streamed and its load ends.
    async fn replace_vanished_load(
        &mut self,
        name: &str,
        load: TableLoad,
    ) -> Result<(), SourceError> {
        self.position.loads.remove(name);
        self.loads.forget(name);
        let successor = self
            .tracker
            .tracked()
            .iter()
            .find(|t| {
                t.instance.qualified_table() == load.table
                    && t.superseded_at.is_none()
                    && !self.position.loads.contains_key(&t.instance.name)
            })
            .map(|t| t.instance.name.clone());
        let Some(next) = successor else {
            tracing::warn!(capture_instance = %name, table = %load.table, "the table's capture instance is gone (CDC disabled on it, or it is no longer included): it is no longer streamed, and its load ends here");
            return Ok(());
        };
        let max = self.source.max_lsn().await?;
        let at = max
            .lsn
            .filter(|l| !l.is_zero())
            .unwrap_or(load.at)
            .max(load.at);
        let commit_time_ns = self.commit_time_ns(at).await?;
        tracing::warn!(capture_instance = %name, table = %load.table, now_through = %next, at_lsn = %at, "the capture instance being loaded is gone; the table is loaded again, from its first row, through its other capture instance");
        self.position.advance(&next, at);
        queue_table_load(&mut self.position, next, load.table, at, commit_time_ns);
        Ok(())
    }
}

impl LoadRunner {
    /// `name`'s table's rows as `sys.partitions` estimates them, asked once.
    async fn estimate(
        &mut self,
        source: &mut impl TableReads,
        name: &str,
        instance: &CaptureInstance,
    ) -> Result<Option<u64>, SourceError> {
        if let Some(known) = self.estimates.get(name) {
            return Ok(*known);
        }
        let estimated = source.table_rows(instance).await?;
        self.estimates.insert(name.to_owned(), estimated);
        Ok(estimated)
    }

    /// Starts this process's run of a table's load (its rate and estimate) unless
    /// it runs already.
    pub(super) async fn start_run(
        &mut self,
        source: &mut impl TableReads,
        name: &str,
        instance: &CaptureInstance,
        load: &TableLoad,
    ) -> Result<(), SourceError> {
        if self.runs.contains_key(name) {
            return Ok(());
        }
        let estimated = self.estimate(source, name, instance).await?;
        tracing::info!(table = %load.table, rows_estimated = estimated, at_lsn = %load.at, resumed_after_rows = load.rows, "loading table");
        let now = Instant::now();
        self.runs.insert(
            name.to_owned(),
            LoadRun {
                started: now,
                rows_at_start: load.rows,
                estimated,
                last_log: now,
                pass_open: false,
                held: None,
                resumed_after: Default::default(),
            },
        );
        Ok(())
    }

    /// The next chunk of a keyed table, after the last key sent, and whether it ends
    /// the table. A seek that does not move past its key is an error, not a loop.
    pub(super) async fn read_keyed_chunk(
        &mut self,
        source: &mut impl TableReads,
        name: &str,
        instance: &CaptureInstance,
        load: &TableLoad,
        key_positions: &[usize],
    ) -> Result<(Vec<Vec<Value>>, bool), SourceError> {
        let chunk = self.chunk;
        let cursor = match &load.after {
            None => TableCursor::Start,
            Some(key) => TableCursor::AfterKey(key),
        };
        // One row more than a chunk: whether it comes tells if this chunk ends the
        // table (its last row then carries finalevent).
        let mut rows = source.read_table(instance, cursor, chunk + 1).await?;
        let done = rows.len() <= chunk;
        rows.truncate(chunk);
        let (false, Some(last)) = (done, rows.last()) else {
            return Ok((rows, done));
        };
        let key = key_text(last, key_positions);
        let hash = {
            use std::hash::{Hash as _, Hasher as _};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            key.hash(&mut hasher);
            hasher.finish()
        };
        let repeated = self
            .runs
            .get_mut(name)
            .is_some_and(|run| !run.resumed_after.insert(hash));
        if repeated || load.after.as_ref() == Some(&key) {
            return Err(SourceError::Malformed {
                capture_instance: name.to_owned(),
                message: format!(
                    "the load of {} does not move past the key ({}): the server's seek after this value returns rows already sent (a text key with characters the database's default code page lacks?); load this table with snapshot.mode = \"never\" and exclude it, or change its key's collation",
                    load.table,
                    key.iter()
                        .map(|v| v.as_deref().unwrap_or("NULL"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        Ok((rows, done))
    }

    /// The next chunk of a table without a key, read in one pass that starts over
    /// (from row 1) when it was broken; the last row read is held back until the
    /// next chunk shows whether it is the table's last. `None` when the run is gone.
    pub(super) async fn read_keyless_chunk(
        &mut self,
        source: &mut impl TableReads,
        name: &str,
        instance: &CaptureInstance,
        load: &mut TableLoad,
    ) -> Result<Option<(Vec<Vec<Value>>, bool)>, SourceError> {
        let chunk = self.chunk;
        let open = self.runs.get(name).is_some_and(|r| r.pass_open);
        let cursor = if open {
            TableCursor::Continue
        } else {
            // A new pass: from the first row again.
            load.rows = 0;
            load.after = None;
            if let Some(run) = self.runs.get_mut(name) {
                run.rows_at_start = 0;
                run.started = Instant::now();
            }
            TableCursor::Start
        };
        let read = source.read_table(instance, cursor, chunk).await?;
        let Some(run) = self.runs.get_mut(name) else {
            return Ok(None);
        };
        run.pass_open = true;
        let done = read.is_empty();
        let mut rows: Vec<_> = run.held.take().into_iter().collect();
        rows.extend(read);
        if !done {
            run.held = rows.pop();
        }
        Ok(Some((rows, done)))
    }

    /// A table's load has sent its last row (and left the checkpoint): says so, and
    /// when it was the last (`none_left`) that the initial load finished.
    pub(super) fn finish(
        &mut self,
        name: &str,
        load: &TableLoad,
        none_left: bool,
        initial_only: bool,
    ) {
        let run = self.runs.remove(name);
        let (seconds, rows_this_run) = run.map_or((0.0, load.rows), |r| {
            (
                r.started.elapsed().as_secs_f64(),
                load.rows.saturating_sub(r.rows_at_start),
            )
        });
        tracing::info!(
            table = %load.table,
            rows = load.rows,
            // A resumed load: the rate is this process's rows over its time.
            rows_this_run,
            seconds = (seconds * 10.0).round() / 10.0,
            rows_per_second = (seconds > 0.0).then(|| (rows_this_run as f64 / seconds).round()),
            "table loaded"
        );
        if none_left {
            if initial_only {
                self.said_loaded = true;
                tracing::info!(at_lsn = %load.at, "initial load finished; snapshot.mode is \"initial_only\", so this run streams no changes and ends");
            } else {
                tracing::info!(at_lsn = %load.at, "initial load finished; changes after its LSN follow");
            }
        }
    }

    /// Seconds since a commit at `commit_time_ns`, on the source's clock (a
    /// simulator's commit times are simulated; a server's are compared with this
    /// machine's clock).
    fn since_commit(source: &impl SourceClock, commit_time_ns: i64) -> f64 {
        let now = source.clock().unwrap_or_else(chrono::Utc::now);
        let then = chrono::DateTime::from_timestamp_nanos(commit_time_ns);
        (now - then).num_milliseconds().max(0) as f64 / 1000.0
    }

    /// Logs a load's progress every [`LOAD_LOG_EVERY`], and warns once when the loads
    /// will outlast the cleanup retention: no change is read until every load ends,
    /// so the changes after L0 wait from L0's commit until then. The projection is the
    /// time since L0's commit plus what is left of this table and of the tables still
    /// queued, at this table's rate. `loads` are the position's, `tracked` the
    /// instances read (to ask a queued table's size).
    pub(super) async fn log_progress(
        &mut self,
        source: &mut (impl TableReads + SourceClock),
        name: &str,
        loads: &BTreeMap<String, TableLoad>,
        tracked: &[Tracked],
        on_gap: GapPolicy,
    ) -> Result<(), SourceError> {
        let due = self
            .runs
            .get(name)
            .is_some_and(|r| r.last_log.elapsed() >= LOAD_LOG_EVERY);
        if !due {
            return Ok(());
        }
        if let Some(run) = self.runs.get_mut(name) {
            run.last_log = Instant::now();
        }
        let statuses = self.status(loads);
        let Some(status) = loads
            .get(name)
            .and_then(|l| statuses.iter().find(|s| s.table == l.table))
        else {
            return Ok(());
        };
        let left = status.seconds_left();
        tracing::info!(
            table = %status.table,
            rows = status.rows,
            rows_estimated = status.estimated,
            rows_per_second = status.rows_per_second.round(),
            seconds_left = left.map(f64::round),
            "loading"
        );
        let (Some(retention), Some(left)) = (self.retention, left) else {
            return Ok(());
        };
        // The queued tables' sizes, asked once each.
        let queued: Vec<String> = loads
            .keys()
            .filter(|n| n.as_str() != name && !self.estimates.contains_key(n.as_str()))
            .cloned()
            .collect();
        for queued_name in queued {
            let estimate = match tracked.iter().find(|t| t.instance.name == queued_name) {
                Some(t) => source.table_rows(&t.instance).await?,
                None => None,
            };
            self.estimates.insert(queued_name, estimate);
        }
        let queued_rows: u64 = loads
            .keys()
            .filter(|n| n.as_str() != name)
            .filter_map(|n| self.estimates.get(n).copied().flatten())
            .sum();
        let rate = status.rows_per_second.max(1e-9);
        let since_l0 = loads
            .get(name)
            .map_or(0.0, |l| Self::since_commit(source, l.commit_time_ns));
        let projected = since_l0 + left + queued_rows as f64 / rate;
        let Ok(projected) = Duration::try_from_secs_f64(projected) else {
            return Ok(());
        };
        if projected >= retention && !std::mem::replace(&mut self.warned_retention, true) {
            tracing::warn!(
                table = %status.table,
                tables_queued = loads.len().saturating_sub(1),
                projected_minutes = projected.as_secs() / 60,
                retention_minutes = retention.as_secs() / 60,
                %on_gap,
                "at this rate the initial load ends after the CDC cleanup retention, counted from its LSN: changes made since then may be purged before they are read, which source.on_gap (or snapshot.mode = \"when_needed\") then decides; raise the retention (EXEC sys.sp_cdc_change_job @job_type = N'cleanup', @retention = <minutes>)"
            );
        }
        Ok(())
    }
}

/// A chunk's rows as `INS` events of the load, numbered after the rows already
/// sent; the load's resume key moves to the last of them. `guid` is the stream's.
pub(super) fn loaded_changes(
    guid: Uuid,
    name: &str,
    table: &Arc<crate::event::TableDescription>,
    load: &mut TableLoad,
    rows: Vec<Vec<Value>>,
    done: bool,
    key_positions: &[usize],
) -> Result<Vec<Change>, SourceError> {
    let commit_time = chrono::DateTime::from_timestamp_nanos(load.commit_time_ns);
    let count = rows.len();
    let mut changes = Vec::with_capacity(count);
    for (i, values) in rows.into_iter().enumerate() {
        if values.len() != table.columns().len() {
            return Err(SourceError::Malformed {
                capture_instance: name.to_owned(),
                message: format!(
                    "a table row has {} values for {} columns",
                    values.len(),
                    table.columns().len()
                ),
            });
        }
        let sequence_number = load.rows + i as u64 + 1;
        let id_seed = if key_positions.is_empty() {
            id_seed(
                guid,
                load.at,
                &load.table,
                RowIdentity::Ordinal(sequence_number),
            )
        } else {
            let key = key_text(&values, key_positions);
            let seed = id_seed(guid, load.at, &load.table, RowIdentity::Key(&key));
            if i + 1 == count {
                load.after = Some(key);
            }
            seed
        };
        if sequence_number >= LOAD_ROWS_PER_RANGE {
            return Err(SourceError::Malformed {
                capture_instance: name.to_owned(),
                message: format!(
                    "the load of {} passed {LOAD_ROWS_PER_RANGE} rows, the most one table load numbers in its own logicalid range",
                    load.table
                ),
            });
        }
        let logical_sequence = load.logical_base + sequence_number;
        changes.push(Change {
            table: Arc::clone(table),
            operation: crate::event::Operation::Insert,
            commit_lsn: load.at,
            begin_lsn: Lsn::ZERO,
            change_lsn: Lsn::ZERO,
            sequence_number,
            last_in_transaction: done && i + 1 == count,
            commit_time,
            old: None,
            current: Some(values),
            origin: Origin::Load {
                id_seed,
                logical_sequence,
                incremental: false,
            },
        });
    }
    load.rows += count as u64;
    Ok(changes)
}

/// A row's key as the checkpoint keeps it: each key column's text, in key order
/// (`key_positions`: their places among the emitted values).
pub(super) fn key_text(row: &[Value], key_positions: &[usize]) -> Vec<Option<String>> {
    key_positions.iter().map(|&at| row[at].to_text()).collect()
}

/// Where each key column of `instance` is among its emitted columns: the values a
/// load's keyset resumes after. Empty for a table without a key; an error when a key
/// column is not emitted (a type CES leaves out), as its values could not be passed
/// back.
pub(super) fn key_positions(instance: &CaptureInstance) -> Result<Vec<usize>, SourceError> {
    let emitted: Vec<&str> = instance
        .emitted_columns()
        .map(|e| e.column.name.as_str())
        .collect();
    instance
        .key_columns
        .iter()
        .map(|k| {
            emitted.iter().position(|e| e == k).ok_or_else(|| SourceError::Malformed {
                capture_instance: instance.name.clone(),
                message: format!(
                    "key column `{k}` is not among the streamed columns (a type CES leaves out, or not captured), so the table cannot be loaded in key order; exclude it from the load with source.exclude or set snapshot.mode = \"never\""
                ),
            })
        })
        .collect()
}

/// A table load from its first row at `at`, with a `logicalid` range of its own,
/// recorded in the position: it queues the load of `instance`.
pub(super) fn queue_table_load(
    position: &mut Position,
    instance: String,
    table: String,
    at: Lsn,
    commit_time_ns: i64,
) {
    let logical_base = position.next_load_base;
    position.next_load_base = logical_base.saturating_add(LOAD_ROWS_PER_RANGE);
    position.loads.insert(
        instance,
        TableLoad {
            table,
            at,
            commit_time_ns,
            after: None,
            rows: 0,
            logical_base,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_plans_once_says_loaded_once_and_breaks_keyless_passes() {
        let loading = PollerConfig {
            snapshot: SnapshotMode::Initial,
            load_chunk: 0,
            ..PollerConfig::default()
        };
        let mut runner = LoadRunner::new(&loading, None);
        assert!(runner.needs_plan());
        assert_eq!(runner.chunk, 1, "a chunk is at least one row");
        assert!(!LoadRunner::new(&PollerConfig::default(), None).needs_plan());
        let resumed = Position {
            last_event: Some(EventPosition {
                commit_lsn: Lsn::from_parts(0, 1, 1),
                sequence_number: 1,
            }),
            ..Position::default()
        };
        assert!(!LoadRunner::new(&loading, Some(&resumed)).needs_plan());
        runner.planned(Some(Duration::from_secs(60)));
        assert!(!runner.needs_plan());
        assert_eq!(runner.retention, Some(Duration::from_secs(60)));
        assert!(runner.say_loaded_once());
        assert!(!runner.say_loaded_once());

        let now = Instant::now();
        runner.runs.insert(
            "dbo_Heap".into(),
            LoadRun {
                started: now,
                rows_at_start: 0,
                estimated: Some(10),
                last_log: now,
                pass_open: true,
                held: Some(vec![Value::Int(1)]),
                resumed_after: Default::default(),
            },
        );
        runner.break_passes();
        let run = &runner.runs["dbo_Heap"];
        assert!(!run.pass_open && run.held.is_none());
        let mut loads = BTreeMap::new();
        loads.insert(
            "dbo_Heap".to_owned(),
            TableLoad {
                table: "dbo.Heap".into(),
                at: Lsn::ZERO,
                commit_time_ns: 0,
                after: None,
                rows: 4,
                logical_base: 0,
            },
        );
        let status = runner.status(&loads);
        assert_eq!(status.len(), 1);
        assert_eq!((status[0].rows, status[0].estimated), (4, Some(10)));
        runner.forget("dbo_Heap");
        assert_eq!(runner.status(&loads)[0].estimated, None);
    }
    use crate::cdc_sim::{CdcSimulator, SimColumn};
    use crate::event::value::SqlType;

    fn table(sim: &CdcSimulator, name: &str) {
        sim.create_table(
            "dbo",
            name,
            vec![SimColumn::new("Id", SqlType::Int)],
            &["Id"],
        );
        sim.enable_table(&format!("dbo.{name}"), Some(&format!("dbo_{name}")))
            .unwrap();
        sim.transaction()
            .insert(&format!("dbo.{name}"), vec![Value::Int(1)])
            .commit()
            .unwrap();
    }

    #[tokio::test]
    async fn the_load_waits_for_every_start_lsn_then_loads_the_newest_instance_of_each_table() {
        let sim = CdcSimulator::new("Shop", Uuid::from_u128(7), 0);
        table(&sim, "Orders");
        table(&sim, "Items");
        sim.enable_table("dbo.Orders", Some("dbo_Orders_v2"))
            .unwrap();
        sim.set_capture_job_manual(true);
        sim.create_table(
            "dbo",
            "Late",
            vec![SimColumn::new("Id", SqlType::Int)],
            &["Id"],
        );
        sim.enable_table("dbo.Late", None).unwrap();
        let config = PollerConfig {
            snapshot: SnapshotMode::Initial,
            ..PollerConfig::default()
        };
        let mut poller = Poller::new(sim.clone(), config, None);
        assert!(poller.needs_plan());
        assert!(
            !poller.plan_load().await.unwrap(),
            "dbo.Late has no start_lsn yet: where its changes begin is unknown"
        );
        assert!(poller.position.loads.is_empty() && poller.needs_plan());

        sim.run_capture_job();
        assert!(poller.plan_load().await.unwrap());
        assert!(!poller.needs_plan());
        let at = sim.current_max_lsn().unwrap();
        let loads: Vec<&str> = poller.position.loads.keys().map(String::as_str).collect();
        assert_eq!(
            loads,
            ["dbo_Items", "dbo_Late", "dbo_Orders_v2"],
            "the newest of Orders"
        );
        for load in poller.position.loads.values() {
            assert_eq!((load.at, load.rows, &load.after), (at, 0, &None));
        }
        // Complete through L0, both instances of Orders too: changes after it follow.
        for name in ["dbo_Items", "dbo_Orders"] {
            assert_eq!(poller.position.instances[name], at, "{name}");
        }
        assert!(poller.plan_load().await.unwrap(), "planned once");
    }

    /// A load resumed from a checkpoint reports its rate over this process's rows,
    /// not the table's; an `initial_only` run says it ends with the load.
    #[tokio::test]
    async fn a_resumed_load_reports_the_rate_of_its_own_rows() {
        use crate::source::synthetic::{SyntheticConfig, SyntheticSource};
        let workload = SyntheticConfig {
            transactions: Some(1),
            existing_rows: 5_000,
            oversized_value_every: 0,
            ..SyntheticConfig::default()
        };
        let config = PollerConfig {
            snapshot: SnapshotMode::InitialOnly,
            load_chunk: 1_000,
            ..PollerConfig::default()
        };
        let mut first = Poller::new(SyntheticSource::new(workload.clone()), config.clone(), None);
        let products_rows = |p: &Position| {
            p.loads
                .values()
                .find(|l| l.table == "dbo.products")
                .map(|l| l.rows)
        };
        while products_rows(first.position()).is_none_or(|rows| rows < 2_000) {
            assert!(matches!(first.poll().await.unwrap(), PollOutcome::Batch(_)));
        }
        let checkpoint = first.position().clone();
        let resumed_at = products_rows(&checkpoint).unwrap();
        let mut source = SyntheticSource::new(workload);
        source.resume_from(&checkpoint);
        let mut second = Poller::new(source, config, Some(checkpoint));
        let log = crate::test_log::capture();
        while let PollOutcome::Batch(_) = second.poll().await.unwrap() {}
        assert!(
            log.lines().iter().all(|l| !l["message"]
                .as_str()
                .unwrap_or("")
                .contains("already finished")),
            "this run finished the load itself"
        );
        let loaded = log.with_message("table loaded");
        let products = loaded
            .iter()
            .find(|l| l["table"] == "dbo.products")
            .unwrap_or_else(|| panic!("{loaded:?}"));
        assert_eq!(products["rows"], 5_000);
        assert_eq!(products["rows_this_run"], 5_000 - resumed_at);
        assert!(
            products["seconds"].is_number(),
            "a number, not text: {products}"
        );
        let finished = log.lines();
        assert!(
            finished.iter().any(|l| l["message"]
                .as_str()
                .is_some_and(|m| m.contains("initial_only") && m.contains("ends"))),
            "{finished:?}"
        );
        // Run again once loaded: it says why there is nothing to do.
        let mut third = Poller::new(
            SyntheticSource::new(SyntheticConfig::default()),
            PollerConfig {
                snapshot: SnapshotMode::InitialOnly,
                ..PollerConfig::default()
            },
            Some(second.position().clone()),
        );
        assert_eq!(third.poll().await.unwrap(), PollOutcome::Idle);
        assert!(
            log.lines().iter().any(|l| l["message"]
                .as_str()
                .unwrap_or("")
                .contains("already finished")),
            "a run with nothing to do says why"
        );
    }

    /// The seconds since a commit, to the millisecond, and never negative (a commit
    /// the source's clock has not reached yet is no age).
    #[test]
    fn the_time_since_a_commit_is_in_seconds() {
        struct Fixed(chrono::DateTime<chrono::Utc>);
        impl crate::source::SourceClock for Fixed {
            fn clock(&self) -> Option<chrono::DateTime<chrono::Utc>> {
                Some(self.0)
            }
        }
        let now = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let commit = |ago_ms: i64| {
            (now - chrono::Duration::milliseconds(ago_ms))
                .timestamp_nanos_opt()
                .unwrap()
        };
        assert_eq!(LoadRunner::since_commit(&Fixed(now), commit(90_500)), 90.5);
        assert_eq!(LoadRunner::since_commit(&Fixed(now), commit(250)), 0.25);
        assert_eq!(LoadRunner::since_commit(&Fixed(now), commit(-5_000)), 0.0);
    }

    /// The age of a load's LSN is measured on the source's clock: a simulator's
    /// commit times are simulated (months from the wall clock), and a projection on
    /// the wall clock warned of the retention on every synthetic load.
    #[tokio::test]
    async fn the_age_of_the_loads_lsn_is_measured_on_the_sources_clock() {
        use crate::source::synthetic::{SyntheticConfig, SyntheticSource};
        let workload = SyntheticConfig {
            transactions: Some(50),
            existing_rows: 10,
            oversized_value_every: 0,
            ..SyntheticConfig::default()
        };
        let config = PollerConfig {
            snapshot: SnapshotMode::Initial,
            ..PollerConfig::default()
        };
        let mut poller = Poller::new(SyntheticSource::new(workload), config, None);
        poller.poll().await.unwrap();
        let load = poller.position().loads.values().next().unwrap().clone();
        let age = LoadRunner::since_commit(&poller.source, load.commit_time_ns);
        assert!(age < 60.0, "seconds since L0 on the simulated clock: {age}");
        let wall = (chrono::Utc::now()
            - chrono::DateTime::from_timestamp_nanos(load.commit_time_ns))
        .num_seconds();
        assert!(
            wall.abs() > 86_400,
            "the simulated commit is far from the wall clock: {wall} s"
        );
    }
}

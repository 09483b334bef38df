//! The poll loop: from a [`ChangeSource`] to ordered, numbered [`Change`]s and the
//! [`Position`] each batch reaches.
//!
//! One iteration: read `max_lsn`; probe every tracked capture instance at once for its
//! `min_lsn` and whether it has changes after its position; read those that do in
//! bounded pages, merged into one stream in CDC order; pair, number and flag the
//! events ([`Sequencer`]). Batches of at most `batch_size` events come out as they are
//! ready, so memory stays bounded whatever the backlog.
//!
//! Invariants:
//! - A capture instance with no change up to `max_lsn` still advances to `max_lsn`: a
//!   quiet table never falls behind the cleanup job.
//! - An instance whose next LSN to read is below its `min_lsn` lost changes to cleanup:
//!   by default that is an error naming the instance and the lost range.
//! - A table with two capture instances switches to the newer one at its `start_lsn`;
//!   the older one is read only below it. While the newer one's `start_lsn` is not
//!   established yet, nothing is read: the switch point is unknown.
//! - An instance is *new* — read from its `start_lsn`, never a gap — when the position
//!   does not know it, or knows another change table under its name (disabled and
//!   enabled again). An instance whose `start_lsn` is NULL is not read until the
//!   capture job sets it.
//! - The catalog is re-read when the fingerprint that comes with every `max_lsn`
//!   changes, and after any error: a disabled, re-created or altered instance never
//!   stops the run.
//! - After each page the instance's `min_lsn` is checked again: a cleanup that raced
//!   the read (and may have deleted part of a transaction) is the gap it is.
//! - A [`Position`] is a place where every earlier event has been emitted: per
//!   instance the LSN through which it is complete (always a transaction boundary), and
//!   the last event emitted. Resuming from it re-reads at most one partial transaction
//!   and skips the events already emitted, with identical sequence numbers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::event::{Change, Origin};
use crate::lsn::Lsn;
use crate::source::filter::TableFilter;
use crate::source::load::{
    LoadStatus, RowIdentity, SnapshotMode, TableLoad, cleanup_retention, id_seed,
};
use crate::source::merge::{InstanceContext, Sequencer, smallest_head};
use crate::source::timezone::{CommitTimeZone, TimeZoneSetting};
use crate::source::{
    CaptureInstance, Catalog, ChangeRow, ChangeSource, Probe, RowKey, SourceError, TableCursor,
};
use uuid::Uuid;

/// What to do when changes were purged before they were delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GapPolicy {
    /// Stop with an error naming the capture instance and the lost LSN range.
    #[default]
    Fail,
    /// Log the loss loudly and continue from the oldest change still held.
    Skip,
}

/// Where to start when there is no checkpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartPosition {
    /// The oldest change CDC still holds.
    #[default]
    Earliest,
    /// Only changes committed after the first poll.
    Latest,
}

impl std::fmt::Display for StartPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StartPosition::Earliest => "earliest",
            StartPosition::Latest => "latest",
        })
    }
}

/// Settings of the poll loop.
#[derive(Debug, Clone)]
pub struct PollerConfig {
    /// Rows per `read_changes` page.
    pub page_size: usize,
    /// Most events per batch.
    pub batch_size: usize,
    pub on_gap: GapPolicy,
    pub time_zone: TimeZoneSetting,
    pub filter: TableFilter,
    pub start_position: StartPosition,
    /// How often the catalog is re-read even when its fingerprint did not change.
    pub catalog_refresh: Duration,
    /// `event.stream_guid`: when set, the database GUID is not needed.
    pub stream_guid: Option<Uuid>,
    /// How long an included capture instance may answer `min_lsn` 0x00 (no
    /// permission, or just enabled) before that is an error; nothing is read meanwhile.
    pub unreadable_grace: Duration,
    /// `[snapshot] mode`: whether the rows tables already hold are loaded first.
    pub snapshot: SnapshotMode,
    /// Rows per load chunk (one statement, one batch).
    pub load_chunk: usize,
}

impl Default for PollerConfig {
    fn default() -> Self {
        PollerConfig {
            page_size: 1000,
            batch_size: 1000,
            on_gap: GapPolicy::Fail,
            time_zone: TimeZoneSetting::Server,
            filter: TableFilter::default(),
            start_position: StartPosition::Earliest,
            catalog_refresh: Duration::from_secs(30),
            stream_guid: None,
            unreadable_grace: Duration::from_secs(60),
            snapshot: SnapshotMode::Never,
            load_chunk: 1000,
        }
    }
}

/// The last event emitted: its commit LSN and sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EventPosition {
    pub commit_lsn: Lsn,
    pub sequence_number: u64,
}

/// `<commit LSN> #<sequence number>`, as an operator reads it in logs.
impl std::fmt::Display for EventPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} #{}", self.commit_lsn, self.sequence_number)
    }
}

/// Where a stream stands; what a checkpoint stores.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// The last event emitted, if any.
    pub last_event: Option<EventPosition>,
    /// Per capture instance: every change with `__$start_lsn` at or below this LSN
    /// has been emitted.
    pub instances: BTreeMap<String, Lsn>,
    /// Per capture instance: the `object_id` of the change table the entry in
    /// `instances` belongs to, so that an instance disabled and enabled again under
    /// the same name is known to be new. Absent in checkpoints written before it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub change_tables: BTreeMap<String, i32>,
    /// File sink: the output file's length once every event up to here was written
    /// and fsynced. A start truncates the file to it, so the file holds each event
    /// exactly once whatever a crash left behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_length: Option<u64>,
    /// What the position belongs to; a start against another database (or a restored
    /// copy, which has a new GUID) is refused. Absent in checkpoints written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Box<SourceIdentity>>,
    /// Per older capture instance of a table with two: the newer instance and the
    /// LSN where reading switches to it, as first seen. Kept because the cleanup job
    /// later raises both instances' `start_lsn` alike, after which the catalog no
    /// longer tells where the switch was.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub switches: BTreeMap<String, Switch>,
    /// Per capture instance: its table's load that has not finished (`[snapshot]`).
    /// While any is here, no change is read.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub loads: BTreeMap<String, TableLoad>,
}

/// Where an older capture instance hands over to a newer one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Switch {
    pub to: String,
    pub at: Lsn,
}

/// The server, database and stream a position belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceIdentity {
    pub server: String,
    pub database: String,
    pub database_guid: Option<Uuid>,
    pub stream_guid: Uuid,
}

impl SourceIdentity {
    /// Whether a position recorded as `self` may be resumed on `now`: the same
    /// database and stream GUID (the server's name may change in a failover).
    pub fn same_stream(&self, now: &SourceIdentity) -> bool {
        self.database == now.database
            && self.stream_guid == now.stream_guid
            && (self.database_guid == now.database_guid
                || self.database_guid.is_none()
                || now.database_guid.is_none())
    }
}

impl std::fmt::Display for SourceIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "database `{}` on `{}` (", self.database, self.server)?;
        if let Some(guid) = self.database_guid {
            write!(f, "database GUID {guid}, ")?;
        }
        write!(f, "stream GUID {})", self.stream_guid)
    }
}

impl Position {
    /// Whether nothing has been read or planned yet: a stream's very start.
    pub fn is_start(&self) -> bool {
        self.last_event.is_none() && self.instances.is_empty() && self.loads.is_empty()
    }

    /// Raises `instance`'s complete-through LSN to `through` (never lowers it).
    pub fn advance(&mut self, instance: &str, through: Lsn) {
        let current = self
            .instances
            .entry(instance.to_owned())
            .or_insert(Lsn::ZERO);
        *current = (*current).max(through);
    }
}

/// Events and the position reached once they (and every earlier batch) are delivered.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub changes: Vec<Change>,
    pub position: Position,
    /// The `max_lsn` of the iteration this batch belongs to (for lag).
    pub max_lsn: Lsn,
}

/// The result of one call to [`Poller::poll`].
#[derive(Debug, Clone, PartialEq)]
pub enum PollOutcome {
    /// Nothing new; poll again after the interval.
    Idle,
    /// Events, or only an advanced position (quiet instances catching up).
    Batch(Batch),
}

struct Tracked {
    instance: CaptureInstance,
    context: Arc<InstanceContext>,
    /// `start_lsn` of a newer capture instance of the same table, if any.
    superseded_at: Option<Lsn>,
}

struct Cursor {
    tracked: usize,
    after: RowKey,
    upper: Lsn,
    buffer: VecDeque<ChangeRow>,
    exhausted: bool,
}

struct Iteration {
    to: Lsn,
    cursors: Vec<Cursor>,
    sequencer: Sequencer,
}

/// Reads a [`ChangeSource`] into ordered batches of changes.
pub struct Poller<S> {
    source: S,
    config: PollerConfig,
    tracked: Vec<Tracked>,
    catalog: Option<Catalog>,
    catalog_read_at: Option<Instant>,
    zone: Option<CommitTimeZone>,
    position: Position,
    /// The end of the last finished iteration.
    done_through: Option<Lsn>,
    resume_after: Option<EventPosition>,
    iteration: Option<Iteration>,
    warned: std::collections::BTreeSet<String>,
    /// The catalog must be re-read before the next iteration.
    catalog_stale: bool,
    /// Instances not read because a newer instance of their table has no
    /// `start_lsn` yet: the whole stream waits for it.
    waiting_for: Vec<String>,
    /// Since when an instance's `min_lsn` has been 0x00.
    unreadable_since: BTreeMap<String, Instant>,
    stream_guid: Option<Uuid>,
    /// `CatalogChanged` errors in a row, each after the catalog was read again.
    catalog_changes_in_a_row: u32,
    /// The initial load is still to be planned (no checkpoint, `[snapshot]` on).
    needs_plan: bool,
    /// Per capture instance: the load of its table running in this process.
    load_runs: BTreeMap<String, LoadRun>,
    /// The cleanup job's retention, read when a load is planned.
    retention: Option<Duration>,
    /// Per capture instance: its table's rows as `sys.partitions` estimated them,
    /// asked once (for the retention projection).
    estimates: BTreeMap<String, Option<u64>>,
}

/// A table's load as this process runs it (the checkpoint has the rest).
struct LoadRun {
    started: Instant,
    rows_at_start: u64,
    estimated: Option<u64>,
    last_log: Instant,
    /// A table without a key: the pass is open in the source.
    pass_open: bool,
    /// A table without a key: the last row read, held until the next chunk shows
    /// whether it is the table's last.
    held: Option<Vec<crate::event::Value>>,
    /// Hashes of the keys chunks resumed after: one coming back means the server's
    /// seek did not move past it (a key value that does not survive the round trip
    /// as text), which would otherwise loop for ever.
    resumed_after: std::collections::HashSet<u64>,
}

/// How often a load's progress is logged.
const LOAD_LOG_EVERY: Duration = Duration::from_secs(5);

/// What the stream has read, summarized without allocating: instance LSNs only rise,
/// and an instance added, removed or re-created changes the count or the sums.
fn progress(p: &Position) -> (Option<EventPosition>, usize, u128, i64) {
    (
        p.last_event,
        p.instances.len(),
        p.instances
            .values()
            .fold(0u128, |sum, lsn| sum.wrapping_add(lsn.to_u128())),
        p.change_tables
            .values()
            .fold(0i64, |sum, &id| sum.wrapping_add(i64::from(id))),
    )
}

/// After this many `CatalogChanged` errors in a row, each after a fresh catalog, the
/// error is not the catalog moving but a defect: it stops the run instead.
const CATALOG_CHANGED_LIMIT: u32 = 5;

impl<S: ChangeSource> Poller<S> {
    /// A poller starting at `position` (from a checkpoint), or at
    /// `config.start_position` when there is none.
    pub fn new(source: S, config: PollerConfig, position: Option<Position>) -> Self {
        let resume_after = position.as_ref().and_then(|p| p.last_event);
        let needs_plan =
            config.snapshot.loads() && position.as_ref().is_none_or(Position::is_start);
        Poller {
            source,
            config,
            tracked: Vec::new(),
            catalog: None,
            catalog_read_at: None,
            zone: None,
            done_through: None,
            resume_after,
            position: position.unwrap_or_default(),
            iteration: None,
            warned: Default::default(),
            catalog_stale: true,
            waiting_for: Vec::new(),
            unreadable_since: BTreeMap::new(),
            stream_guid: None,
            catalog_changes_in_a_row: 0,
            needs_plan,
            load_runs: BTreeMap::new(),
            retention: None,
            estimates: BTreeMap::new(),
        }
    }

    /// The stream GUID: `event.stream_guid`, else the database GUID (known once the
    /// catalog has been read).
    pub fn stream_guid(&self) -> Option<Uuid> {
        self.stream_guid
    }

    /// The position reached by the batches returned so far.
    pub fn position(&self) -> &Position {
        &self.position
    }

    /// How many capture instances the poller reads.
    pub fn tracked_instances(&self) -> usize {
        self.tracked.len()
    }

    /// Mutable access to the source (tests, and the binary's metrics).
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// Produces the next batch, or [`PollOutcome::Idle`] when there is nothing new.
    /// On error the poller can be polled again: it restarts the interrupted iteration
    /// from the last position it returned.
    pub async fn poll(&mut self) -> Result<PollOutcome, SourceError> {
        let saved = (self.position.clone(), self.resume_after, self.done_through);
        let result = self.poll_inner().await;
        if result.is_err() {
            // Start over from the last returned position: nothing is lost or repeated,
            // because re-read events up to `resume_after` are skipped.
            self.iteration = None;
            (self.position, self.resume_after, self.done_through) = saved;
            self.resume_after = self.resume_after.max(self.position.last_event);
            // Whatever failed, the catalog may be why: read it again first.
            self.catalog_stale = true;
            // A pass over a table without a key may have broken with it: start over.
            for run in self.load_runs.values_mut() {
                run.pass_open = false;
                run.held = None;
            }
        }
        match result {
            Err(SourceError::CatalogChanged { message }) => {
                self.catalog_changes_in_a_row += 1;
                if self.catalog_changes_in_a_row >= CATALOG_CHANGED_LIMIT {
                    return Err(SourceError::Definite {
                        message: format!(
                            "{message} (still so after reading the CDC catalog again {} times)",
                            self.catalog_changes_in_a_row
                        ),
                    });
                }
                Err(SourceError::CatalogChanged { message })
            }
            other => {
                if other.is_ok() {
                    self.catalog_changes_in_a_row = 0;
                }
                other
            }
        }
    }

    async fn poll_inner(&mut self) -> Result<PollOutcome, SourceError> {
        if self.iteration.is_none() {
            if self.needs_plan {
                if !self.plan_load().await? {
                    return Err(SourceError::Transient {
                        message: "the initial load waits for the capture job to set the start_lsn of every included capture instance".into(),
                    });
                }
                return Ok(PollOutcome::Batch(self.position_batch(Vec::new())));
            }
            if !self.position.loads.is_empty() {
                return self.load_step().await;
            }
            if self.config.snapshot == SnapshotMode::InitialOnly {
                // Loaded: this run streams no changes.
                return Ok(PollOutcome::Idle);
            }
            // Progress is what the stream has read; recording the identity is not.
            // Compared by a summary, not a copy: an idle poll with a thousand capture
            // instances would otherwise copy the map twice.
            let before = progress(&self.position);
            if !self.start_iteration().await? {
                return Ok(if progress(&self.position) != before {
                    PollOutcome::Batch(Batch {
                        changes: Vec::new(),
                        position: self.position.clone(),
                        max_lsn: self.done_through.unwrap_or(Lsn::ZERO),
                    })
                } else {
                    PollOutcome::Idle
                });
            }
        }
        let mut changes = Vec::new();
        let to = self.iteration.as_ref().map_or(Lsn::ZERO, |it| it.to);
        self.fill(&mut changes).await?;
        Ok(PollOutcome::Batch(Batch {
            changes,
            position: self.position.clone(),
            max_lsn: to,
        }))
    }

    /// Whether the initial load is still to be planned: the caller may plan it (and
    /// write the checkpoint) before the first poll, so that the load's LSN is durable
    /// before any row is sent.
    pub fn needs_plan(&self) -> bool {
        self.needs_plan
    }

    /// Plans the initial load: records L0 (`max_lsn`), marks every tracked capture
    /// instance complete through it, and queues a load of each table (the newest
    /// capture instance of each). Returns false, planning nothing, while an included
    /// instance has no `start_lsn` yet (the capture job has not scanned since it was
    /// enabled): where its changes begin is not known.
    pub async fn plan_load(&mut self) -> Result<bool, SourceError> {
        if !self.needs_plan {
            return Ok(true);
        }
        let max = self.max_lsn_with_catalog().await?;
        if let Some(catalog) = &self.catalog {
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
        self.retention = match self.source.server_facts().await {
            Ok(facts) => cleanup_retention(&facts),
            Err(_) => None,
        };
        let mut tables = Vec::new();
        for t in &self.tracked {
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
            self.position.loads.insert(
                t.instance.name.clone(),
                TableLoad {
                    table: t.instance.qualified_table(),
                    at,
                    commit_time_ns,
                    after: None,
                    rows: 0,
                },
            );
        }
        self.done_through = Some(at);
        self.needs_plan = false;
        tracing::info!(
            mode = %self.config.snapshot,
            at_lsn = %at,
            tables = %tables.join(", "),
            retention_minutes = self.retention.map(|r| r.as_secs() / 60),
            "initial load planned: each table's rows are read in key order, then its changes after this LSN follow"
        );
        Ok(true)
    }

    /// The UTC commit time of the transaction at `at` (what loaded rows carry), or
    /// the present when CDC has recorded nothing yet.
    async fn commit_time_ns(&mut self, at: Lsn) -> Result<i64, SourceError> {
        let local = if at.is_zero() {
            None
        } else {
            self.source.lsn_time(at).await?
        };
        let zone = self.zone.unwrap_or(CommitTimeZone::LocalAsUtc);
        let time = local.map_or_else(chrono::Utc::now, |local| zone.to_utc(local, None));
        Ok(time
            .timestamp_nanos_opt()
            .unwrap_or_else(|| time.timestamp().saturating_mul(1_000_000_000)))
    }

    /// A batch of `changes` ending at the current position.
    fn position_batch(&self, changes: Vec<Change>) -> Batch {
        Batch {
            changes,
            position: self.position.clone(),
            max_lsn: self.done_through.unwrap_or(Lsn::ZERO),
        }
    }

    /// The loads running or queued, for the metrics.
    pub fn load_status(&self) -> Vec<LoadStatus> {
        self.position
            .loads
            .iter()
            .map(|(name, load)| {
                let run = self.load_runs.get(name);
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

    /// One chunk of the first queued load: a batch of its rows, with the position
    /// after them.
    async fn load_step(&mut self) -> Result<PollOutcome, SourceError> {
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
        let Some(tracked) = self.tracked.iter().find(|t| t.instance.name == name) else {
            self.position.loads.remove(&name);
            self.load_runs.remove(&name);
            // A schema change done the documented way (a second capture instance,
            // then the first disabled) leaves the table streamed by the other one:
            // load it again through that one, at a new LSN.
            let successor = self
                .tracked
                .iter()
                .find(|t| {
                    t.instance.qualified_table() == load.table
                        && t.superseded_at.is_none()
                        && !self.position.loads.contains_key(&t.instance.name)
                })
                .map(|t| t.instance.name.clone());
            match successor {
                Some(next) => {
                    let max = self.source.max_lsn().await?;
                    let at = max
                        .lsn
                        .filter(|l| !l.is_zero())
                        .unwrap_or(load.at)
                        .max(load.at);
                    let commit_time_ns = self.commit_time_ns(at).await?;
                    tracing::warn!(capture_instance = %name, table = %load.table, now_through = %next, at_lsn = %at, "the capture instance being loaded is gone; the table is loaded again, from its first row, through its other capture instance");
                    self.position.advance(&next, at);
                    self.position.loads.insert(
                        next,
                        TableLoad {
                            table: load.table,
                            at,
                            commit_time_ns,
                            after: None,
                            rows: 0,
                        },
                    );
                }
                None => {
                    tracing::warn!(capture_instance = %name, table = %load.table, "the table's capture instance is gone (CDC disabled on it, or it is no longer included): it is no longer streamed, and its load ends here")
                }
            }
            return Ok(PollOutcome::Batch(self.position_batch(Vec::new())));
        };
        let instance = tracked.instance.clone();
        let table = Arc::clone(&tracked.context.table);
        let key_positions = key_positions(&instance)?;
        let keyed = !key_positions.is_empty();
        if !self.load_runs.contains_key(&name) {
            let estimated = match self.estimates.get(&name) {
                Some(known) => *known,
                None => self.source.table_rows(&instance).await?,
            };
            self.estimates.insert(name.clone(), estimated);
            tracing::info!(table = %load.table, rows_estimated = estimated, at_lsn = %load.at, resumed_after_rows = load.rows, "loading table");
            let now = Instant::now();
            self.load_runs.insert(
                name.clone(),
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
        }
        let chunk = self.config.load_chunk.max(1);
        let (rows, done) = if keyed {
            let cursor = match &load.after {
                None => TableCursor::Start,
                Some(key) => TableCursor::AfterKey(key),
            };
            // One row more than a chunk: whether it comes tells if this chunk ends
            // the table (its last row then carries finalevent).
            let mut rows = self.source.read_table(&instance, cursor, chunk + 1).await?;
            let done = rows.len() <= chunk;
            rows.truncate(chunk);
            if let (false, Some(last)) = (done, rows.last()) {
                let key: Vec<Option<String>> =
                    key_positions.iter().map(|&at| last[at].to_text()).collect();
                let hash = {
                    use std::hash::{Hash as _, Hasher as _};
                    let mut hasher = std::collections::hash_map::DefaultHasher::new();
                    key.hash(&mut hasher);
                    hasher.finish()
                };
                let repeated = self
                    .load_runs
                    .get_mut(&name)
                    .is_some_and(|run| !run.resumed_after.insert(hash));
                if repeated || load.after.as_ref() == Some(&key) {
                    return Err(SourceError::Malformed {
                        capture_instance: name.clone(),
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
            }
            (rows, done)
        } else {
            let open = self.load_runs.get(&name).is_some_and(|r| r.pass_open);
            let cursor = if open {
                TableCursor::Continue
            } else {
                // A new pass: from the first row again.
                load.rows = 0;
                load.after = None;
                if let Some(run) = self.load_runs.get_mut(&name) {
                    run.rows_at_start = 0;
                    run.started = Instant::now();
                }
                TableCursor::Start
            };
            let read = self.source.read_table(&instance, cursor, chunk).await?;
            let Some(run) = self.load_runs.get_mut(&name) else {
                return Ok(PollOutcome::Idle);
            };
            run.pass_open = true;
            let done = read.is_empty();
            let mut rows: Vec<_> = run.held.take().into_iter().collect();
            rows.extend(read);
            if !done {
                run.held = rows.pop();
            }
            (rows, done)
        };
        let commit_time = chrono::DateTime::from_timestamp_nanos(load.commit_time_ns);
        let guid = self.stream_guid.unwrap_or_default();
        let count = rows.len();
        let mut changes = Vec::with_capacity(count);
        for (i, values) in rows.into_iter().enumerate() {
            if values.len() != table.columns().len() {
                return Err(SourceError::Malformed {
                    capture_instance: name.clone(),
                    message: format!(
                        "a table row has {} values for {} columns",
                        values.len(),
                        table.columns().len()
                    ),
                });
            }
            let sequence_number = load.rows + i as u64 + 1;
            let id_seed = if keyed {
                let key: Vec<Option<String>> = key_positions
                    .iter()
                    .map(|&at| values[at].to_text())
                    .collect();
                let seed = id_seed(guid, load.at, &load.table, RowIdentity::Key(&key));
                if i + 1 == count {
                    load.after = Some(key);
                }
                seed
            } else {
                id_seed(
                    guid,
                    load.at,
                    &load.table,
                    RowIdentity::Ordinal(sequence_number),
                )
            };
            changes.push(Change {
                table: Arc::clone(&table),
                operation: crate::event::Operation::Insert,
                commit_lsn: load.at,
                begin_lsn: Lsn::ZERO,
                sequence_number,
                last_in_transaction: done && i + 1 == count,
                commit_time,
                old: None,
                current: Some(values),
                origin: Origin::Load { id_seed },
            });
        }
        load.rows += count as u64;
        if done {
            self.position.loads.remove(&name);
            let run = self.load_runs.remove(&name);
            let seconds = run.map_or(0.0, |r| r.started.elapsed().as_secs_f64());
            tracing::info!(
                table = %load.table,
                rows = load.rows,
                seconds = format!("{seconds:.1}"),
                rows_per_second = (seconds > 0.0).then(|| (load.rows as f64 / seconds).round()),
                "table loaded"
            );
            if self.position.loads.is_empty() {
                tracing::info!(at_lsn = %load.at, "initial load finished; changes after its LSN follow");
            }
        } else {
            self.position.loads.insert(name.clone(), load);
            self.log_load_progress(&name).await?;
        }
        Ok(PollOutcome::Batch(self.position_batch(changes)))
    }

    /// Logs a load's progress every [`LOAD_LOG_EVERY`], and warns once when the loads
    /// will outlast the cleanup retention: no change is read until every load ends,
    /// so the changes after L0 wait from L0's commit until then. The projection is the
    /// time since L0's commit plus what is left of this table and of the tables still
    /// queued, at this table's rate.
    async fn log_load_progress(&mut self, name: &str) -> Result<(), SourceError> {
        let due = self
            .load_runs
            .get(name)
            .is_some_and(|r| r.last_log.elapsed() >= LOAD_LOG_EVERY);
        if !due {
            return Ok(());
        }
        if let Some(run) = self.load_runs.get_mut(name) {
            run.last_log = Instant::now();
        }
        let statuses = self.load_status();
        let Some(status) = self
            .position
            .loads
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
        let queued: Vec<String> = self
            .position
            .loads
            .keys()
            .filter(|n| n.as_str() != name && !self.estimates.contains_key(n.as_str()))
            .cloned()
            .collect();
        for queued_name in queued {
            let estimate = match self.tracked.iter().find(|t| t.instance.name == queued_name) {
                Some(t) => self.source.table_rows(&t.instance).await?,
                None => None,
            };
            self.estimates.insert(queued_name, estimate);
        }
        let queued_rows: u64 = self
            .position
            .loads
            .keys()
            .filter(|n| n.as_str() != name)
            .filter_map(|n| self.estimates.get(n).copied().flatten())
            .sum();
        let rate = status.rows_per_second.max(1e-9);
        let since_l0 = self.position.loads.get(name).map_or(0.0, |l| {
            let l0 = chrono::DateTime::from_timestamp_nanos(l.commit_time_ns);
            (chrono::Utc::now() - l0).num_milliseconds().max(0) as f64 / 1000.0
        });
        let projected = since_l0 + left + queued_rows as f64 / rate;
        let Ok(projected) = Duration::try_from_secs_f64(projected) else {
            return Ok(());
        };
        if projected >= retention && self.warned.insert("retention".to_owned()) {
            tracing::warn!(
                table = %status.table,
                tables_queued = self.position.loads.len().saturating_sub(1),
                projected_minutes = projected.as_secs() / 60,
                retention_minutes = retention.as_secs() / 60,
                on_gap = ?self.config.on_gap,
                "at this rate the initial load ends after the CDC cleanup retention, counted from its LSN: changes made since then may be purged before they are read, which source.on_gap (or snapshot.mode = \"when_needed\") then decides; raise the retention (EXEC sys.sp_cdc_change_job @job_type = N'cleanup', @retention = <minutes>)"
            );
        }
        Ok(())
    }

    /// Re-reads the catalog when it is stale or due.
    async fn load_catalog(&mut self) -> Result<(), SourceError> {
        let due = self.catalog_stale
            || self
                .catalog_read_at
                .is_none_or(|at| at.elapsed() >= self.config.catalog_refresh);
        if !due {
            return Ok(());
        }
        let catalog = self.source.catalog().await?;
        self.catalog_read_at = Some(Instant::now());
        self.catalog_stale = false;
        let stream_guid = match (self.config.stream_guid, catalog.database_guid) {
            (Some(configured), _) => configured,
            (None, Some(database)) => database,
            (None, None) => return Err(SourceError::DatabaseGuidUnreadable),
        };
        self.stream_guid = Some(stream_guid);
        self.check_identity(SourceIdentity {
            server: catalog.server.clone(),
            database: catalog.database.clone(),
            database_guid: catalog.database_guid,
            stream_guid,
        })?;
        if self.zone.is_none() {
            let per_row = catalog.server_time_zone.is_some();
            let zone = self
                .config
                .time_zone
                .resolve(catalog.server_utc_offset_minutes, per_row);
            match (&self.config.time_zone, &catalog.server_time_zone) {
                (TimeZoneSetting::Server, Some(id)) => tracing::info!(
                    server_time_zone = %id,
                    "commit times converted to UTC with the server's own time zone (CURRENT_TIMEZONE_ID), the offset in force at each commit"
                ),
                (TimeZoneSetting::Server, None) => tracing::warn!(
                    server_utc_offset_minutes = catalog.server_utc_offset_minutes,
                    "the server cannot name its time zone (CURRENT_TIMEZONE_ID needs SQL Server 2022 or Azure SQL): commit times are converted with the offset it reports now, which is wrong for commits on the other side of a daylight-saving change; set source.time_zone to the server's IANA zone (e.g. \"Europe/Berlin\")"
                ),
                _ => tracing::info!(
                    zone = %zone.describe(),
                    "commit times converted to UTC with this zone (setting source.time_zone)"
                ),
            }
            self.zone = Some(zone);
        }
        self.check_invisible(&catalog)?;
        let included: Vec<&CaptureInstance> = catalog
            .instances
            .iter()
            .filter(|i| self.config.filter.allows(&i.schema, &i.table))
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
                continue;
            };
            self.warn_left_out_columns(instance);
            // Newer: created later (the object id breaks a tie), never judged by
            // start_lsn, which the cleanup job raises on both alike.
            let newer = |other: &&&CaptureInstance| {
                other.schema == instance.schema
                    && other.table == instance.table
                    && (other.create_date, other.object_id)
                        > (instance.create_date, instance.object_id)
            };
            let recorded = self
                .position
                .switches
                .get(&instance.name)
                .filter(|s| included.iter().any(|o| o.name == s.to))
                .map(|s| s.at);
            let superseded_at = match recorded {
                Some(at) => Some(at),
                None => {
                    // A newer instance whose start_lsn is not set yet: where this one
                    // ends is unknown until it is.
                    if let Some(pending) = included
                        .iter()
                        .filter(newer)
                        .find(|o| o.start_lsn.is_none())
                    {
                        waiting_for.push(pending.name.clone());
                    }
                    let switch = included
                        .iter()
                        .filter(newer)
                        .filter_map(|o| o.start_lsn.map(|at| (at, o.name.clone())))
                        .min();
                    if let Some((at, to)) = &switch {
                        self.position.switches.insert(
                            instance.name.clone(),
                            Switch {
                                to: to.clone(),
                                at: (*at).max(start_lsn),
                            },
                        );
                    }
                    switch.map(|(at, _)| at.max(start_lsn))
                }
            };
            let context = Arc::new(InstanceContext::new(instance, &catalog.database)?);
            tracked.push(Tracked {
                instance: (*instance).clone(),
                context,
                superseded_at,
            });
        }
        for old in &self.tracked {
            // Only a change table gone from cdc.change_tables ends an instance's
            // position; one filtered out or briefly invisible keeps it.
            let still = catalog
                .instances
                .iter()
                .any(|i| i.object_id == old.instance.object_id)
                || catalog.invisible.contains(&old.instance.name);
            if !still {
                tracing::warn!(
                    capture_instance = %old.instance.name,
                    table = %old.instance.qualified_table(),
                    "capture instance disabled (or re-created); its change table is gone and it is no longer read"
                );
                let reached = self.position.instances.remove(&old.instance.name);
                self.position.change_tables.remove(&old.instance.name);
                self.position.switches.remove(&old.instance.name);
                // The older instance of the same table goes on where this one got to.
                let handed_back: Vec<String> = self
                    .position
                    .switches
                    .iter()
                    .filter(|(_, s)| s.to == old.instance.name)
                    .map(|(from, _)| from.clone())
                    .collect();
                for from in handed_back {
                    self.position.switches.remove(&from);
                    if let Some(reached) = reached {
                        self.position.advance(&from, reached);
                    }
                    tracing::warn!(capture_instance = %from, "the newer capture instance of its table is gone: reading this one again from where that one got to");
                }
            }
        }
        for t in &tracked {
            let name = &t.instance.name;
            match self.position.change_tables.get(name) {
                Some(&id) if id != t.instance.object_id => {
                    tracing::warn!(
                        capture_instance = %name,
                        table = %t.instance.qualified_table(),
                        start_lsn = %t.instance.start_lsn.map_or_else(|| "NULL".to_owned(), |l| l.to_string()),
                        "capture instance was disabled and enabled again: reading the new one from its start LSN; changes the old one held and that were not delivered are gone with it"
                    );
                    self.position.instances.remove(name);
                    self.position.change_tables.remove(name);
                }
                // Otherwise (also a checkpoint written before change tables were
                // recorded) the entry is this instance's: the first iteration
                // records its change table.
                _ => {}
            }
            let known = self
                .tracked
                .iter()
                .any(|o| o.instance.object_id == t.instance.object_id);
            if known {
                continue;
            }
            if let Some(switch) = t.superseded_at {
                let ddl = self.source.ddl_history(name).await?;
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
        }
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

    /// Refuses a position that belongs to another database or stream; records the
    /// identity in one that has none yet. Another server name alone (a failover, a
    /// listener) is only logged.
    fn check_identity(&mut self, now: SourceIdentity) -> Result<(), SourceError> {
        match &self.position.source {
            None => {
                self.position.source = Some(Box::new(now));
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
                    self.position.source = Some(Box::new(now));
                }
                Ok(())
            }
        }
    }

    /// Capture instances whose source table the login cannot see: an error when the
    /// table may be one to stream, a warning when the filter cannot tell.
    fn check_invisible(&mut self, catalog: &Catalog) -> Result<(), SourceError> {
        let Some(first) = catalog.invisible.first() else {
            return Ok(());
        };
        let filter = &self.config.filter;
        if !filter.has_patterns() {
            // Every table is to be streamed, so this one too.
            return Err(SourceError::TableInvisible {
                capture_instance: first.clone(),
            });
        }
        // A table named exactly in source.include that no visible instance matches
        // may well be the invisible one.
        for name in filter.literal_includes() {
            let found = catalog
                .instances
                .iter()
                .any(|i| i.qualified_table().eq_ignore_ascii_case(name));
            if !found {
                return Err(SourceError::TableInvisible {
                    capture_instance: catalog.invisible.join(", "),
                });
            }
        }
        for name in &catalog.invisible {
            if self.warned.insert(format!("invisible {name}")) {
                tracing::warn!(
                    capture_instance = %name,
                    "the source table of this capture instance is not visible to this login; it is not streamed (grant SELECT on it if it should be)"
                );
            }
        }
        Ok(())
    }

    /// Warns once per column that events leave out, saying why.
    fn warn_left_out_columns(&mut self, instance: &CaptureInstance) {
        for column in &instance.columns {
            let reason = match (&column.sql_type, column.table_index) {
                (Err(reason), _) => reason.to_string(),
                (Ok(_), None) => {
                    "dropped from the source table (the change table keeps it, NULL from then on)"
                        .to_owned()
                }
                (Ok(_), Some(_)) => continue,
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

    /// `max_lsn`, with a catalog as new as it: re-read when the fingerprint that comes
    /// with `max_lsn` differs (a capture instance enabled, disabled, re-created or
    /// altered, a `start_lsn` set or moved), so that nothing is read with the old one.
    async fn max_lsn_with_catalog(&mut self) -> Result<crate::source::MaxLsn, SourceError> {
        self.load_catalog().await?;
        let max = self.source.max_lsn().await?;
        if self
            .catalog
            .as_ref()
            .is_some_and(|c| c.version != max.catalog_version)
        {
            self.catalog_stale = true;
            self.load_catalog().await?;
        }
        Ok(max)
    }

    /// Starts an iteration up to `max_lsn`. Returns false when there is nothing to
    /// read (the position may still have advanced).
    async fn start_iteration(&mut self) -> Result<bool, SourceError> {
        let max = self.max_lsn_with_catalog().await?;
        let Some(max_lsn) = max.lsn.filter(|l| !l.is_zero()) else {
            tracing::debug!("sys.fn_cdc_get_max_lsn() is NULL: CDC has recorded nothing yet");
            return Ok(false);
        };
        if let Some(pending) = self.waiting_for.first() {
            if self.warned.insert(format!("waiting {pending}")) {
                tracing::info!(
                    capture_instance = %pending,
                    "waiting for the capture job to set the start_lsn of a table's newer capture instance before reading on (the switch point between the two instances)"
                );
            }
            return Ok(false);
        }
        let new_instance = || {
            self.tracked
                .iter()
                .any(|t| !self.position.instances.contains_key(&t.instance.name))
        };
        // The idle poll's test first, and one pass over the instances only.
        if self.done_through.is_some_and(|done| max_lsn <= done) && !new_instance() {
            return Ok(false);
        }
        let known_instances = self
            .tracked
            .iter()
            .any(|t| self.position.instances.contains_key(&t.instance.name));
        let first_run = !known_instances && self.position.last_event.is_none();
        if first_run
            && self.config.start_position == StartPosition::Latest
            && !self.tracked.is_empty()
        {
            for t in &self.tracked {
                self.position
                    .instances
                    .insert(t.instance.name.clone(), max_lsn);
                self.position
                    .change_tables
                    .insert(t.instance.name.clone(), t.instance.object_id);
            }
            self.done_through = Some(max_lsn);
            tracing::info!(%max_lsn, "no checkpoint: starting after the latest change (start_position = \"latest\")");
            return Ok(false);
        }
        let probes: Vec<Probe> = self
            .tracked
            .iter()
            .map(|t| Probe {
                capture_instance: t.instance.name.clone(),
                after: self.complete_through(t),
            })
            .collect();
        if probes.is_empty() {
            return Ok(false);
        }
        let results = self.source.probe(&probes, max_lsn).await?;
        let mut readable = Vec::new();
        for t in &self.tracked {
            let name = &t.instance.name;
            let min_lsn = results
                .iter()
                .find(|r| &r.capture_instance == name)
                .and_then(|r| r.min_lsn)
                .filter(|l| !l.is_zero());
            match min_lsn {
                Some(_) => {
                    self.unreadable_since.remove(name);
                }
                None => {
                    let since = *self
                        .unreadable_since
                        .entry(name.clone())
                        .or_insert_with(Instant::now);
                    if since.elapsed() >= self.config.unreadable_grace {
                        return Err(SourceError::TableUnreadable {
                            capture_instance: name.clone(),
                            table: t.instance.qualified_table(),
                        });
                    }
                    tracing::warn!(
                        capture_instance = %name,
                        table = %t.instance.qualified_table(),
                        "sys.fn_cdc_get_min_lsn returns 0x00: the login cannot SELECT every captured column of the table (see sql/03_least_privilege_login.sql), or the instance was just enabled; nothing is read until it can be (an error after source.unreadable_grace_ms)"
                    );
                }
            }
            readable.push(min_lsn);
        }
        if readable.iter().any(Option::is_none) {
            return Ok(false);
        }
        let mut cursors = Vec::new();
        let mut reloads = Vec::new();
        for (index, t) in self.tracked.iter().enumerate() {
            let name = &t.instance.name;
            let Some(result) = results.iter().find(|r| &r.capture_instance == name) else {
                continue;
            };
            let Some(min_lsn) = readable[index] else {
                continue;
            };
            let mut through = self.complete_through(t);
            let new_instance = !self.position.instances.contains_key(name);
            let first_unread = through.increment().unwrap_or(Lsn::MAX);
            let upper = match t.superseded_at {
                Some(switch) => max_lsn.min(last_before(switch)),
                None => max_lsn,
            };
            self.position
                .change_tables
                .insert(name.clone(), t.instance.object_id);
            if t.superseded_at.is_some() && through >= upper {
                // Read to its switch point: the newer instance carries the table on.
                continue;
            }
            // Only what this instance still had to deliver can be lost from it.
            if first_unread < min_lsn && first_unread <= upper && !new_instance {
                let last_lost = last_before(min_lsn).min(upper);
                if self.config.snapshot == SnapshotMode::WhenNeeded && t.superseded_at.is_none() {
                    // Re-load the table at `upper` instead: its rows now, then its
                    // changes after `upper` (this iteration reads none of them).
                    tracing::error!(
                        capture_instance = %name,
                        table = %t.instance.qualified_table(),
                        first_lost = %first_unread,
                        %last_lost,
                        at_lsn = %upper,
                        "changes were purged by the CDC cleanup job before delivery: re-loading the table (snapshot.mode = \"when_needed\"); rows deleted in the lost range are not in the re-load"
                    );
                    reloads.push((name.clone(), t.instance.qualified_table(), upper));
                    continue;
                }
                match self.config.on_gap {
                    GapPolicy::Fail => {
                        return Err(SourceError::Gap {
                            capture_instance: name.clone(),
                            first_lost: first_unread,
                            last_lost,
                        });
                    }
                    GapPolicy::Skip => {
                        tracing::error!(
                            capture_instance = %name,
                            first_lost = %first_unread,
                            %last_lost,
                            "CHANGES LOST: purged by the CDC cleanup job before delivery; skipping (source.on_gap = \"skip\")"
                        );
                    }
                }
            }
            let skipped = first_unread < min_lsn;
            if skipped {
                through = last_before(min_lsn).min(upper.max(through));
            }
            // The probe looked for changes after the old position; after a skip,
            // what it found may lie below the new one while later changes exist.
            let has_changes = result
                .next_change
                .is_some_and(|lsn| (skipped || lsn > through) && lsn <= upper);
            if has_changes {
                self.position.instances.insert(name.clone(), through);
                cursors.push(Cursor {
                    tracked: index,
                    after: RowKey::after_lsn(through),
                    upper,
                    buffer: VecDeque::new(),
                    exhausted: false,
                });
            } else {
                // Nothing to read up to `upper`: complete through it (idle advance).
                self.position
                    .instances
                    .insert(name.clone(), through.max(upper));
            }
        }
        for (name, table, at) in reloads {
            let commit_time_ns = self.commit_time_ns(at).await?;
            self.position.advance(&name, at);
            self.load_runs.remove(&name);
            self.position.loads.insert(
                name,
                TableLoad {
                    table,
                    at,
                    commit_time_ns,
                    after: None,
                    rows: 0,
                },
            );
        }
        if cursors.is_empty() {
            self.done_through = Some(max_lsn);
            return Ok(false);
        }
        let zone = self.zone.unwrap_or(CommitTimeZone::LocalAsUtc);
        self.iteration = Some(Iteration {
            to: max_lsn,
            cursors,
            sequencer: Sequencer::new(zone),
        });
        Ok(true)
    }

    /// The LSN through which `t` is complete: its checkpoint, or for an instance not
    /// seen before, just below its `start_lsn`.
    fn complete_through(&self, t: &Tracked) -> Lsn {
        self.position
            .instances
            .get(&t.instance.name)
            .copied()
            .unwrap_or_else(|| last_before(t.instance.start_lsn.unwrap_or(Lsn::ZERO)))
    }

    /// Reads and merges rows until the batch is full or the iteration ends.
    async fn fill(&mut self, changes: &mut Vec<Change>) -> Result<(), SourceError> {
        let Some(mut iteration) = self.iteration.take() else {
            return Ok(());
        };
        let mut emitted = Vec::new();
        loop {
            if changes.len() >= self.config.batch_size {
                self.iteration = Some(iteration);
                return Ok(());
            }
            for cursor in &mut iteration.cursors {
                if cursor.buffer.is_empty() && !cursor.exhausted {
                    let t = &self.tracked[cursor.tracked];
                    let rows = self
                        .source
                        .read_changes(
                            &t.instance,
                            cursor.after,
                            cursor.upper,
                            self.config.page_size,
                        )
                        .await?;
                    check_page(&t.instance.name, cursor.after, cursor.upper, &rows)?;
                    // The cleanup job raises the low end first and then deletes in
                    // batches: if it moved past what this page needed, rows of it
                    // may be missing. That is a gap, never a partial transaction.
                    let min_lsn = self.source.min_lsn(&t.instance.name).await?;
                    let first_needed = first_needed_after(cursor.after);
                    if let Some(min_lsn) = min_lsn.filter(|m| *m > first_needed) {
                        let reload = self.config.snapshot == SnapshotMode::WhenNeeded
                            && t.superseded_at.is_none();
                        return Err(match self.config.on_gap {
                            GapPolicy::Fail if !reload => SourceError::Gap {
                                capture_instance: t.instance.name.clone(),
                                first_lost: first_needed,
                                last_lost: last_before(min_lsn),
                            },
                            // Start the iteration again: its probe finds the gap and
                            // re-loads the table, or skips the gap, as configured.
                            _ => SourceError::CatalogChanged {
                                message: format!(
                                    "the cleanup job moved the low end of {} to {min_lsn} during a read",
                                    t.instance.name
                                ),
                            },
                        });
                    }
                    cursor.exhausted = rows.len() < self.config.page_size;
                    if let Some(last) = rows.last() {
                        cursor.after = last.key;
                    }
                    cursor.buffer.extend(rows);
                }
            }
            let heads: Vec<&VecDeque<ChangeRow>> =
                iteration.cursors.iter().map(|c| &c.buffer).collect();
            let Some(next) = smallest_head(&heads) else {
                iteration.sequencer.finish(&mut emitted)?;
                self.take_emitted(&mut emitted, changes, &iteration);
                for cursor in &iteration.cursors {
                    let name = &self.tracked[cursor.tracked].instance.name;
                    self.position.advance(name, cursor.upper);
                }
                self.done_through = Some(iteration.to);
                return Ok(());
            };
            let cursor = &mut iteration.cursors[next];
            let Some(row) = cursor.buffer.pop_front() else {
                continue;
            };
            let context = Arc::clone(&self.tracked[cursor.tracked].context);
            iteration.sequencer.push(&context, row, &mut emitted)?;
            self.take_emitted(&mut emitted, changes, &iteration);
        }
    }

    /// Moves sequenced events into the batch, skipping those already emitted before a
    /// restart, and advances the position.
    fn take_emitted(
        &mut self,
        emitted: &mut Vec<Change>,
        changes: &mut Vec<Change>,
        iteration: &Iteration,
    ) {
        for change in emitted.drain(..) {
            let at = EventPosition {
                commit_lsn: change.commit_lsn,
                sequence_number: change.sequence_number,
            };
            if change.last_in_transaction {
                // Every instance read in this iteration is complete through this
                // transaction: the merge has passed its LSN in all of them.
                for cursor in &iteration.cursors {
                    let name = &self.tracked[cursor.tracked].instance.name;
                    self.position
                        .advance(name, change.commit_lsn.min(cursor.upper));
                }
            }
            if self.resume_after.is_some_and(|resume| at <= resume) {
                continue;
            }
            self.resume_after = None;
            self.position.last_event = Some(at);
            changes.push(change);
        }
    }
}

/// Where each key column of `instance` is among its emitted columns: the values a
/// load's keyset resumes after. Empty for a table without a key; an error when a key
/// column is not emitted (a type CES leaves out), as its values could not be passed
/// back.
fn key_positions(instance: &CaptureInstance) -> Result<Vec<usize>, SourceError> {
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

/// The lowest commit LSN whose rows a read after `after` still needs: the
/// transaction `after` stops inside, or the one after it.
fn first_needed_after(after: RowKey) -> Lsn {
    if after == RowKey::after_lsn(after.start_lsn) {
        after.start_lsn.increment().unwrap_or(Lsn::MAX)
    } else {
        after.start_lsn
    }
}

/// The LSN just below `lsn` (zero stays zero).
fn last_before(lsn: Lsn) -> Lsn {
    Lsn::from_u128(lsn.to_u128().saturating_sub(1)).unwrap_or(Lsn::ZERO)
}

/// Rejects a page that is out of order or outside the requested range: a defect in a
/// query must not turn into silently reordered or repeated events.
fn check_page(
    name: &str,
    after: RowKey,
    upper: Lsn,
    rows: &[ChangeRow],
) -> Result<(), SourceError> {
    let mut previous = after;
    for row in rows {
        if row.key <= previous || row.key.start_lsn > upper {
            return Err(SourceError::Malformed {
                capture_instance: name.to_owned(),
                message: format!(
                    "row {:?} is out of order or outside (after {:?}, up to {upper})",
                    row.key, previous
                ),
            });
        }
        previous = row.key;
    }
    Ok(())
}

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

use crate::event::columns::{ColumnRules, PlanCache};
use crate::event::schema_change::SchemaChange;
use crate::event::{Change, Origin};
use crate::lsn::Lsn;
use crate::position::{EventPosition, Position, SourceIdentity, Switch, TableLoad};
use crate::source::filter::TableFilter;
use crate::source::initial_load::{
    LoadStatus, RowIdentity, SnapshotMode, cleanup_retention, id_seed,
};
use crate::source::merge::{InstanceContext, Sequencer, smallest_head};
use crate::source::timezone::{CommitClock, CommitTimeZone, TimeZoneSetting};
use crate::source::{
    CaptureInstance, Catalog, ChangeRow, ChangeSource, Probe, RowKey, SourceError, TableCursor,
};
use uuid::Uuid;

mod announcer;
mod cdc_jobs;
mod cleanup;
mod ddl_text;
mod iteration;
mod load_readers;
mod load_runner;
mod managed;
mod resnapshot;
mod tracking;

pub use managed::{
    CaptureActions, CaptureInstanceMode, check_capture_settings, next_instance_name,
};

use announcer::ShapeAnnouncer;
use cdc_jobs::CdcJobsWatch;
pub use cdc_jobs::Retention;
use cleanup::DeliveryCleanup;
pub use cleanup::{CleanupBound, CleanupMode, cleanup_bounds};
use iteration::{Merge, last_before};
pub use load_readers::{ChunkReader, OpenReader, RANGE_CHUNKS};
use load_runner::LoadRunner;
use managed::CaptureManager;
use resnapshot::Resnapshots;
pub use resnapshot::{
    ResnapshotStatus, SnapshotAccepted, SnapshotHandle, SnapshotRefused, SnapshotRequest,
};
use tracking::CatalogTracker;

/// What to do when changes were purged before they were delivered.
///
/// Shown as the configuration spells it (`fail`, `skip`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum GapPolicy {
    /// Stop with an error naming the capture instance and the lost LSN range.
    #[default]
    Fail,
    /// Say the loss loudly in the log and go on from the oldest change still held.
    Skip,
}

impl std::fmt::Display for GapPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GapPolicy::Fail => "fail",
            GapPolicy::Skip => "skip",
        })
    }
}

/// Where to start when there is no checkpoint.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum StartPosition {
    /// The oldest change CDC holds.
    #[default]
    Earliest,
    /// After the newest change when the run starts (before everything when CDC has
    /// recorded nothing yet).
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
    /// The first wait before CDC's procedures run again after one gave up waiting
    /// for a lock on its table (doubling to 5 minutes).
    pub capture_ddl_retry: Duration,
    /// `[snapshot] mode`: whether the rows tables already hold are loaded first.
    pub snapshot: SnapshotMode,
    /// Rows per load chunk (one statement, one batch).
    pub load_chunk: usize,
    /// `snapshot.max_connections`: connections that read loads at once (1: the
    /// stream's own).
    pub load_connections: usize,
    /// Whether batches carry schema-change events (`sink.schema_changes` is not
    /// `off`): a table's shape is then announced before its first event, and each
    /// change of it before the first event of the new shape.
    pub schema_changes: bool,
    /// `source.capture_instances`: whether the poller creates and retires capture
    /// instances as tables' columns change.
    pub capture_instances: CaptureInstanceMode,
    /// `source.enable_cdc`: enable CDC on included tables that lack it.
    pub enable_cdc: bool,
    /// `[[event.columns]]`: applied to every change and loaded row of a batch.
    pub columns: Arc<ColumnRules>,
    /// Whether rules that match no column of an included table are only said
    /// (`event.allow_unmatched_column_rules`, or one of many databases), rather
    /// than refused at start.
    pub allow_unmatched_column_rules: bool,
    /// How often CDC's jobs (the capture job's latest log scan session, and the
    /// cleanup job's retention every tenth time) are read for the metrics; `None`
    /// (no metrics served): never.
    pub cdc_jobs_every: Option<Duration>,
    /// `source.cleanup`: who removes change rows.
    pub cleanup: CleanupMode,
    /// `source.cleanup_interval_ms`: how often change tables are cleaned after
    /// delivery.
    pub cleanup_interval: Duration,
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
            capture_ddl_retry: Duration::from_secs(5),
            snapshot: SnapshotMode::Never,
            load_chunk: 1000,
            load_connections: 1,
            schema_changes: false,
            capture_instances: CaptureInstanceMode::Manual,
            enable_cdc: false,
            columns: Arc::default(),
            allow_unmatched_column_rules: false,
            cdc_jobs_every: None,
            cleanup: CleanupMode::Agent,
            cleanup_interval: Duration::from_secs(300),
        }
    }
}

/// Events and the position reached once they (and every earlier batch) are delivered.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub changes: Vec<Change>,
    /// Schema-change events, each to go out just before `changes[before]`, in
    /// order (only with [`PollerConfig::schema_changes`]).
    pub schema_changes: Vec<PlacedSchemaChange>,
    pub position: Position,
    /// The `max_lsn` of the iteration this batch belongs to (for lag).
    pub max_lsn: Lsn,
    /// A heartbeat record goes out after the batch's events
    /// (`sink.heartbeat_interval_ms`); set by the pipeline, never by the poller.
    pub heartbeat: bool,
}

/// One event of a batch, in stream order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BatchEvent<'a> {
    Schema(&'a SchemaChange),
    Change(&'a Change),
}

impl Batch {
    /// The batch's events in stream order: each schema-change event just before the
    /// change it precedes.
    pub fn events(&self) -> Vec<BatchEvent<'_>> {
        let mut out = Vec::with_capacity(self.changes.len() + self.schema_changes.len());
        let mut schema = self.schema_changes.iter().peekable();
        for (at, change) in self.changes.iter().enumerate() {
            while let Some(placed) = schema.next_if(|p| p.before <= at) {
                out.push(BatchEvent::Schema(&placed.event));
            }
            out.push(BatchEvent::Change(change));
        }
        out.extend(schema.map(|placed| BatchEvent::Schema(&placed.event)));
        out
    }
}

/// A schema-change event and where it goes in its batch.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedSchemaChange {
    /// The index in [`Batch::changes`] of the event it precedes.
    pub before: usize,
    pub event: SchemaChange,
    /// The capture instances whose `cdc.ddl_history` may hold its DDL.
    ddl_from: Vec<String>,
    /// The commit LSN of the previous version's first event: DDL after it is this
    /// version's.
    since: Option<Lsn>,
}

/// The result of one call to [`Poller::poll`].
#[derive(Debug, Clone, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one value a poll, moved once into the pipeline; never stored in bulk"
)]
pub enum PollOutcome {
    /// Nothing new; poll again after the interval.
    Idle,
    /// Events, or only an advanced position (quiet instances catching up).
    Batch(Batch),
}

#[derive(Clone)]
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
    /// The probe's first change LSN of the instance, until its first page is read:
    /// no row of it comes before that, so it is not read until the merge gets there.
    next_change: Option<Lsn>,
    /// The keyset of its first page read since the cleanup job's low end was last
    /// checked (once per poll, for every cursor read, in one statement).
    unchecked_from: Option<RowKey>,
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
    /// What the stream has read and emitted: what each batch carries and the
    /// checkpoint holds.
    position: Position,
    /// The catalog, the capture instances read and the stream's identity.
    tracker: CatalogTracker,
    /// The iteration under way and what the merge keeps between polls.
    merge: Merge,
    /// Table shapes followed through the events, and the batch's schema-change
    /// events.
    announcer: ShapeAnnouncer,
    /// The initial load's (and re-loads') runs in this process.
    loads: LoadRunner,
    /// Re-snapshots asked for while streaming: the requests and the chunk held.
    resnapshots: Resnapshots,
    /// Managed capture instances and `source.enable_cdc`.
    capture: CaptureManager,
    /// CDC's jobs as last read, for the metrics.
    cdc_jobs: CdcJobsWatch,
    /// Change tables cleaned after delivery (`source.cleanup`).
    cleanup: DeliveryCleanup,
    /// `CatalogChanged` errors in a row, each after the catalog was read again.
    catalog_changes_in_a_row: u32,
}

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
        let announcer = ShapeAnnouncer::new(config.schema_changes);
        let capture = CaptureManager::new(&config, position.clone());
        let resume_after = position.as_ref().and_then(|p| p.last_event);
        let loads = LoadRunner::new(&config, position.as_ref());
        let cleanup = DeliveryCleanup::new(config.cleanup, config.cleanup_interval);
        Poller {
            source,
            config,
            merge: Merge::new(resume_after),
            position: position.unwrap_or_default(),
            tracker: CatalogTracker::new(),
            announcer,
            loads,
            resnapshots: Resnapshots::default(),
            capture,
            cdc_jobs: CdcJobsWatch::default(),
            cleanup,
            catalog_changes_in_a_row: 0,
        }
    }

    /// The most change rows the merge has held in its buffers at once (all capture
    /// instances together): its memory bound, for tests and benchmarks.
    #[cfg(any(test, feature = "testing"))]
    pub fn peak_rows_held(&self) -> usize {
        self.merge.peak_rows_held()
    }

    /// The source it reads (for tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The stream GUID: `event.stream_guid`, else the database GUID (known once the
    /// catalog has been read).
    pub fn stream_guid(&self) -> Option<Uuid> {
        self.tracker.stream_guid()
    }

    /// The position reached by the batches returned so far.
    pub fn position(&self) -> &Position {
        &self.position
    }

    /// Hands the poller the positions the checkpoint holds, as each is written: a
    /// managed instance is disabled only once its changes are among them (or among
    /// those of the position the poller started from, the checkpoint's).
    pub fn watch_checkpoints(
        &mut self,
        checkpoints: tokio::sync::watch::Receiver<Option<Position>>,
    ) {
        self.cleanup.watch_checkpoints(checkpoints.clone());
        self.capture.watch_checkpoints(checkpoints);
    }

    /// Where `source.cleanup = "after_delivery"` reads the other streams'
    /// checkpoints: a reader of the stream's own store (never leased or written).
    pub fn read_peers_from(&mut self, store: crate::checkpoint::CheckpointStore) {
        self.cleanup.read_peers_from(store);
    }

    /// Where loads read ahead over `snapshot.max_connections` connections get them:
    /// each call opens one to the source (none: loads read on the stream's own).
    pub fn read_loads_with(&mut self, open: OpenReader) {
        self.loads.readers.open_with(open);
    }

    /// Connections the load's readers hold open, for tests.
    pub fn load_readers_open(&self) -> usize {
        self.loads.readers.open_connections()
    }

    /// Key ranges and tables the load's readers have read, for tests.
    pub fn load_segments_read(&self) -> u64 {
        self.loads.readers.segments_started()
    }

    /// Rounds of `source.cleanup = "after_delivery"` that cleaned a change table.
    pub fn cleanup_rounds(&self) -> u64 {
        self.cleanup.rounds()
    }

    /// What this process has done to the CDC configuration.
    pub fn capture_actions(&self) -> CaptureActions {
        self.capture.actions()
    }

    /// The capture job's latest log scan session, as last read (with
    /// `cdc_jobs_every`).
    pub fn capture_job_scan(&self) -> Option<&crate::source::LogScan> {
        self.cdc_jobs.scan()
    }

    /// The cleanup job's retention, as last read (with `cdc_jobs_every`).
    pub fn cleanup_retention(&self) -> Retention {
        self.cdc_jobs.retention()
    }

    /// How many capture instances the poller reads.
    pub fn tracked_instances(&self) -> usize {
        self.tracker.tracked().len()
    }

    /// Whether an idle poll is only "nothing yet": the source knows more changes are
    /// coming and this run streams them (not an `initial_only` run, which ends with
    /// its load).
    pub fn more_expected(&self) -> bool {
        self.config.snapshot != SnapshotMode::InitialOnly && self.source.more_expected()
    }

    /// Produces the next batch, or [`PollOutcome::Idle`] when there is nothing new.
    /// On error the poller can be polled again: it restarts the interrupted iteration
    /// from the last position it returned.
    pub async fn poll(&mut self) -> Result<PollOutcome, SourceError> {
        if let Some(every) = self.config.cdc_jobs_every {
            self.cdc_jobs.refresh(&mut self.source, every).await;
        }
        (self.cleanup)
            .run_if_due(&mut self.source, self.tracker.tracked())
            .await?;
        let saved = (self.position.clone(), self.merge.restart_point());
        let result = match self.poll_inner().await {
            Ok(PollOutcome::Batch(mut batch)) => self
                .tracker
                .apply_column_rules(&self.config.columns, &mut batch.changes)
                .map(|()| PollOutcome::Batch(batch))
                .map_err(SourceError::ColumnRule),
            other => other,
        };
        if result.is_err() {
            // Start over from the last returned position: nothing is lost or repeated,
            // because re-read events up to `resume_after` are skipped.
            let (position, restart) = saved;
            self.position = position;
            self.merge.restart(restart, self.position.last_event);
            self.announcer.discard_pending();
            // Whatever failed, the catalog may be why: read it again first.
            self.tracker.mark_stale();
            self.loads.break_passes();
            self.loads.readers.discard();
            self.resnapshots.discard_held();
        }
        match result {
            Err(SourceError::CatalogChanged { message }) => {
                self.catalog_changes_in_a_row += 1;
                if self.catalog_changes_in_a_row >= CATALOG_CHANGED_LIMIT {
                    return Err(SourceError::definite(format!(
                        "{message} (still so after reading the CDC catalog again {} times)",
                        self.catalog_changes_in_a_row
                    )));
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
        if !self.merge.in_iteration() {
            // Boxed, as the re-snapshot's steps: rare, and the poll's future stays
            // as small as it was without them.
            if Box::pin(self.answer_snapshot_requests()).await? {
                // Out in a batch of its own: the re-snapshot is in the checkpoint
                // once that is delivered.
                return Ok(PollOutcome::Batch(self.position_batch(Vec::new()).await?));
            }
            if self.loads.needs_plan() {
                if !self.plan_load().await? {
                    return Err(SourceError::transient(
                        "the initial load waits for the capture job to set the start_lsn of every included capture instance",
                    ));
                }
                return Ok(PollOutcome::Batch(self.position_batch(Vec::new()).await?));
            }
            if !self.position.loads.is_empty() {
                return self.load_step().await;
            }
            if self.config.snapshot == SnapshotMode::InitialOnly {
                // Loaded: this run streams no changes.
                if self.loads.say_loaded_once() {
                    tracing::info!(
                        "snapshot.mode is \"initial_only\" and the checkpoint says the initial load already finished: nothing to do (to load again, start without the checkpoint, or set snapshot.mode = \"initial\" to stream the changes since)"
                    );
                }
                return Ok(PollOutcome::Idle);
            }
            if let Some(batch) = Box::pin(self.resnapshot_step()).await? {
                return Ok(PollOutcome::Batch(batch));
            }
            // Progress is what the stream has read; recording the identity is not.
            // Compared by a summary, not a copy: an idle poll with a thousand capture
            // instances would otherwise copy the map twice.
            let before = progress(&self.position);
            if !self.start_iteration().await? {
                return Ok(if progress(&self.position) != before {
                    PollOutcome::Batch(Batch {
                        changes: Vec::new(),
                        schema_changes: Vec::new(),
                        position: self.position.clone(),
                        max_lsn: self.merge.done_through().unwrap_or(Lsn::ZERO),
                        heartbeat: false,
                    })
                } else {
                    PollOutcome::Idle
                });
            }
        }
        let mut changes = Vec::new();
        let to = self.merge.reading_to().unwrap_or(Lsn::ZERO);
        self.fill(&mut changes).await?;
        self.resnapshots.supersede(&changes);
        Ok(PollOutcome::Batch(Batch {
            changes,
            schema_changes: self
                .announcer
                .take(&mut self.source, self.tracker.zone())
                .await?,
            position: self.position.clone(),
            max_lsn: to,
            heartbeat: false,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_print_as_the_configuration_spells_them() {
        assert_eq!(GapPolicy::Fail.to_string(), "fail");
        assert_eq!(GapPolicy::Skip.to_string(), "skip");
        assert_eq!(StartPosition::Latest.to_string(), "latest");
    }
}

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
//!   the older one is read only below it.
//! - A [`Position`] is a place where every earlier event has been emitted: per
//!   instance the LSN through which it is complete (always a transaction boundary), and
//!   the last event emitted. Resuming from it re-reads at most one partial transaction
//!   and skips the events already emitted, with identical sequence numbers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::event::Change;
use crate::lsn::Lsn;
use crate::source::filter::TableFilter;
use crate::source::merge::{InstanceContext, Sequencer, smallest_head};
use crate::source::timezone::{CommitTimeZone, TimeZoneSetting};
use crate::source::{
    CaptureInstance, Catalog, ChangeRow, ChangeSource, Probe, RowKey, SourceError,
};

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
    /// How often the catalog is re-read to find new or dropped capture instances.
    pub catalog_refresh: Duration,
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
        }
    }
}

/// The last event emitted: its commit LSN and sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EventPosition {
    pub commit_lsn: Lsn,
    pub sequence_number: u64,
}

/// Where a stream stands; what a checkpoint stores.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// The last event emitted, if any.
    pub last_event: Option<EventPosition>,
    /// Per capture instance: every change with `__$start_lsn` at or below this LSN
    /// has been emitted.
    pub instances: BTreeMap<String, Lsn>,
}

impl Position {
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
}

impl<S: ChangeSource> Poller<S> {
    /// A poller starting at `position` (from a checkpoint), or at
    /// `config.start_position` when there is none.
    pub fn new(source: S, config: PollerConfig, position: Option<Position>) -> Self {
        let resume_after = position.as_ref().and_then(|p| p.last_event);
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
        }
    }

    /// The position reached by the batches returned so far.
    pub fn position(&self) -> &Position {
        &self.position
    }

    /// The catalog as last read.
    pub fn catalog(&self) -> Option<&Catalog> {
        self.catalog.as_ref()
    }

    /// The commit-time zone in use, once the catalog has been read.
    pub fn commit_time_zone(&self) -> Option<CommitTimeZone> {
        self.zone
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
        }
        result
    }

    async fn poll_inner(&mut self) -> Result<PollOutcome, SourceError> {
        if self.iteration.is_none() {
            let before = self.position.clone();
            if !self.start_iteration().await? {
                return Ok(if self.position != before {
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

    async fn load_catalog(&mut self) -> Result<(), SourceError> {
        let due = self
            .catalog_read_at
            .is_none_or(|at| at.elapsed() >= self.config.catalog_refresh);
        if !due {
            return Ok(());
        }
        let catalog = self.source.catalog().await?;
        self.catalog_read_at = Some(Instant::now());
        if self.zone.is_none() {
            let zone = self
                .config
                .time_zone
                .resolve(catalog.server_utc_offset_minutes);
            tracing::info!(
                zone = %zone.describe(),
                server_utc_offset_minutes = catalog.server_utc_offset_minutes,
                "commit times converted to UTC with this zone (setting source.time_zone)"
            );
            self.zone = Some(zone);
        }
        let mut tracked = Vec::new();
        for instance in &catalog.instances {
            if !self.config.filter.allows(&instance.schema, &instance.table) {
                continue;
            }
            for column in &instance.columns {
                if let Err(reason) = &column.sql_type {
                    let key = format!("{}.{}", instance.name, column.name);
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
            let context = Arc::new(InstanceContext::new(instance, &catalog.database)?);
            let superseded_at = catalog
                .instances
                .iter()
                .filter(|other| {
                    other.schema == instance.schema
                        && other.table == instance.table
                        && other.start_lsn > instance.start_lsn
                })
                .map(|other| other.start_lsn)
                .min();
            tracked.push(Tracked {
                instance: instance.clone(),
                context,
                superseded_at,
            });
        }
        for old in &self.tracked {
            if !tracked.iter().any(|t| t.instance.name == old.instance.name) {
                tracing::warn!(capture_instance = %old.instance.name, "capture instance disabled; no longer read");
                self.position.instances.remove(&old.instance.name);
            }
        }
        for t in &tracked {
            let known = self
                .tracked
                .iter()
                .any(|o| o.instance.name == t.instance.name);
            if known {
                continue;
            }
            if let Some(switch) = t.superseded_at {
                let ddl = self.source.ddl_history(&t.instance.name).await?;
                tracing::info!(
                    table = %t.instance.qualified_table(),
                    from = %t.instance.name,
                    at_lsn = %switch,
                    "table has a newer capture instance; switching to it at its start LSN"
                );
                for d in ddl {
                    tracing::info!(capture_instance = %d.capture_instance, ddl_lsn = %d.ddl_lsn, ddl_time = %d.ddl_time, command = %d.ddl_command, "DDL");
                }
            }
        }
        if tracked.is_empty() {
            return Err(SourceError::NoCapturedTables {
                database: catalog.database.clone(),
            });
        }
        self.tracked = tracked;
        self.catalog = Some(catalog);
        Ok(())
    }

    /// Starts an iteration up to `max_lsn`. Returns false when there is nothing to
    /// read (the position may still have advanced).
    async fn start_iteration(&mut self) -> Result<bool, SourceError> {
        self.load_catalog().await?;
        let Some(max_lsn) = self.source.max_lsn().await?.filter(|l| !l.is_zero()) else {
            tracing::debug!("sys.fn_cdc_get_max_lsn() is NULL: CDC has recorded nothing yet");
            return Ok(false);
        };
        if self.done_through.is_some_and(|done| max_lsn <= done) {
            return Ok(false);
        }
        let first_run = self.position.instances.is_empty() && self.position.last_event.is_none();
        if first_run && self.config.start_position == StartPosition::Latest {
            for t in &self.tracked {
                self.position
                    .instances
                    .insert(t.instance.name.clone(), max_lsn);
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
        let results = self.source.probe(&probes, max_lsn).await?;
        let mut cursors = Vec::new();
        for (index, t) in self.tracked.iter().enumerate() {
            let name = &t.instance.name;
            let Some(result) = results.iter().find(|r| &r.capture_instance == name) else {
                continue;
            };
            let Some(min_lsn) = result.min_lsn.filter(|l| !l.is_zero()) else {
                tracing::warn!(
                    capture_instance = %name,
                    "sys.fn_cdc_get_min_lsn returned NULL or 0x00: CDC was just enabled (the capture job has not run yet), or the login cannot SELECT every captured column of the source table (see sql/03_least_privilege_login.sql); retrying"
                );
                return Ok(false);
            };
            let mut through = self.complete_through(t);
            let new_instance = !self.position.instances.contains_key(name);
            let first_unread = through.increment().unwrap_or(Lsn::MAX);
            if first_unread < min_lsn && !new_instance {
                let last_lost =
                    Lsn::from_u128(min_lsn.to_u128().saturating_sub(1)).unwrap_or(Lsn::ZERO);
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
            if first_unread < min_lsn {
                through = last_before(min_lsn);
            }
            let upper = match t.superseded_at {
                Some(switch) => max_lsn.min(last_before(switch)),
                None => max_lsn,
            };
            let has_changes = result
                .next_change
                .is_some_and(|lsn| lsn > through && lsn <= upper);
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
            .unwrap_or_else(|| last_before(t.instance.start_lsn))
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

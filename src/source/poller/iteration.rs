//! One iteration: probe every tracked capture instance, open a cursor on each that
//! has changes, and merge their pages into ordered, numbered events.

use super::*;
use crate::source::ProbeResult;

/// A table to load again: its capture instance, `schema.table`, and the LSN the load
/// stands at.
type Reload = (String, String, Lsn);

/// What one iteration does with a tracked capture instance.
enum Planned {
    Read(Cursor),
    Reload(Reload),
    Nothing,
}

/// What the merge keeps between polls: the iteration under way, where the last
/// one ended, where a restarted stream resumes emitting, and its memory high mark.
pub(super) struct Merge {
    iteration: Option<Iteration>,
    /// The end of the last finished iteration.
    done_through: Option<Lsn>,
    /// Events up to here were emitted before (a restart re-reads them): skipped.
    resume_after: Option<EventPosition>,
    /// The most change rows held in the cursors' buffers at once (tests and
    /// benchmarks measure the merge's memory bound by it).
    #[cfg(any(test, feature = "testing"))]
    peak_rows_held: usize,
    /// Since when each instance's `min_lsn` has been 0x00.
    unreadable_since: BTreeMap<String, Instant>,
}

/// Where a poll started: what [`Merge::restart`] goes back to when it fails.
pub(super) struct Restart {
    resume_after: Option<EventPosition>,
    done_through: Option<Lsn>,
}

impl Merge {
    /// A merge resuming after `resume_after` (the checkpoint's last event).
    pub(super) fn new(resume_after: Option<EventPosition>) -> Self {
        Merge {
            iteration: None,
            done_through: None,
            resume_after,
            #[cfg(any(test, feature = "testing"))]
            peak_rows_held: 0,
            unreadable_since: BTreeMap::new(),
        }
    }

    /// What a failed poll goes back to.
    pub(super) fn restart_point(&self) -> Restart {
        Restart {
            resume_after: self.resume_after,
            done_through: self.done_through,
        }
    }

    /// A poll failed: the iteration is dropped and the merge goes back to `to`,
    /// skipping again the events up to `last_event` (the position's) when re-read.
    pub(super) fn restart(&mut self, to: Restart, last_event: Option<EventPosition>) {
        self.iteration = None;
        self.done_through = to.done_through;
        self.resume_after = to.resume_after.max(last_event);
    }

    /// Whether an iteration is under way.
    pub(super) fn in_iteration(&self) -> bool {
        self.iteration.is_some()
    }

    /// The `max_lsn` the iteration under way reads to.
    pub(super) fn reading_to(&self) -> Option<Lsn> {
        self.iteration.as_ref().map(|it| it.to)
    }

    /// The end of the last finished iteration (or planned load).
    pub(super) fn done_through(&self) -> Option<Lsn> {
        self.done_through
    }

    /// Everything up to `lsn` is read (an iteration, a load's planning, a start).
    pub(super) fn finished_through(&mut self, lsn: Lsn) {
        self.done_through = Some(lsn);
    }

    #[cfg(any(test, feature = "testing"))]
    pub(super) fn peak_rows_held(&self) -> usize {
        self.peak_rows_held
    }

    /// Whether the event at `at` was emitted before the restart (and is skipped);
    /// the first one that was not ends the skipping.
    fn emitted_before(&mut self, at: EventPosition) -> bool {
        if self.resume_after.is_some_and(|resume| at <= resume) {
            return true;
        }
        self.resume_after = None;
        false
    }

    /// `t` answered `min_lsn` (`readable`: not 0x00). Unreadable is tolerated for
    /// `grace` from the first such answer, then an error naming the table.
    fn note_readable(
        &mut self,
        t: &Tracked,
        readable: bool,
        grace: Duration,
    ) -> Result<(), SourceError> {
        let name = &t.instance.name;
        if readable {
            self.unreadable_since.remove(name);
            return Ok(());
        }
        let since = *self
            .unreadable_since
            .entry(name.clone())
            .or_insert_with(Instant::now);
        if since.elapsed() >= grace {
            return Err(SourceError::TableUnreadable {
                capture_instance: name.clone(),
                table: t.instance.qualified_table(),
                gating_role: t.instance.options.role_name.clone(),
            });
        }
        tracing::warn!(
            capture_instance = %name,
            table = %t.instance.qualified_table(),
            "sys.fn_cdc_get_min_lsn returns 0x00: the login cannot SELECT every captured column of the table (see sql/03_least_privilege_login.sql) or is not in the capture instance's gating role, or the instance was just enabled; nothing is read until it can be (an error after source.unreadable_grace_ms)"
        );
        Ok(())
    }
}

impl<S: ChangeSource> Poller<S> {
    /// Starts an iteration up to `max_lsn`. Returns false when there is nothing to
    /// read (the position may still have advanced).
    pub(super) async fn start_iteration(&mut self) -> Result<bool, SourceError> {
        let max = self.max_lsn_with_catalog().await?;
        let Some(max_lsn) = max.lsn.filter(|l| !l.is_zero()) else {
            tracing::debug!("sys.fn_cdc_get_max_lsn() is NULL: CDC has recorded nothing yet");
            return Ok(false);
        };
        if self.tracker.waits_for_a_switch_point() {
            return Ok(false);
        }
        let new_instance = || {
            self.tracker
                .tracked()
                .iter()
                .any(|t| !self.position.instances.contains_key(&t.instance.name))
        };
        // The idle poll's test first, and one pass over the instances only.
        if self
            .merge
            .done_through()
            .is_some_and(|done| max_lsn <= done)
            && !new_instance()
        {
            return Ok(false);
        }
        if self.start_at_latest(max_lsn) {
            return Ok(false);
        }
        let probes: Vec<Probe> = self
            .tracker
            .tracked()
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
        let Some(min_lsns) = self.readable_min_lsns(&results)? else {
            return Ok(false);
        };
        let mut cursors = Vec::new();
        let mut reloads = Vec::new();
        for (index, min_lsn) in min_lsns.into_iter().enumerate() {
            let name = &self.tracker.tracked()[index].instance.name;
            let Some(result) = results.iter().find(|r| &r.capture_instance == name) else {
                continue;
            };
            let next_change = result.next_change;
            match self.plan_instance(index, min_lsn, next_change, max_lsn)? {
                Planned::Read(cursor) => cursors.push(cursor),
                Planned::Reload(reload) => reloads.push(reload),
                Planned::Nothing => {}
            }
        }
        self.queue_reloads(reloads).await?;
        if cursors.is_empty() {
            self.merge.finished_through(max_lsn);
            return Ok(false);
        }
        let zone = self
            .tracker
            .zone()
            .copied()
            .unwrap_or(CommitTimeZone::LocalAsUtc);
        self.merge.iteration = Some(Iteration {
            to: max_lsn,
            cursors,
            sequencer: Sequencer::new(zone, CommitClock::from_nanos(self.position.commit_clock_ns)),
        });
        Ok(true)
    }

    /// Settles where a run without a checkpoint starts, so that it can be saved
    /// before the first poll: with `start_position = "latest"`, every tracked instance
    /// complete through today's `max_lsn`. A restart before anything was delivered
    /// then starts there too, instead of at a later "latest" that would skip the
    /// changes in between. True when the position was settled (and is to be saved);
    /// false with a checkpoint, a load to plan, `"earliest"` (which reads from each
    /// instance's `min_lsn`, nothing to settle), or while CDC has recorded nothing.
    pub async fn resolve_start(&mut self) -> Result<bool, SourceError> {
        if self.loads.needs_plan() || self.config.start_position != StartPosition::Latest {
            return Ok(false);
        }
        let max = self.max_lsn_with_catalog().await?;
        match max.lsn.filter(|l| !l.is_zero()) {
            Some(max_lsn) => Ok(self.start_at_latest(max_lsn)),
            None => Ok(self.start_before_everything()),
        }
    }

    /// CDC has recorded nothing yet, so "latest" is before everything: each tracked
    /// instance complete through the LSN before its `start_lsn` (what it records is
    /// all to be read, and a cleanup that purges some of it before it is read is a
    /// gap, as it should be). False while an instance has no `start_lsn` yet.
    fn start_before_everything(&mut self) -> bool {
        let known = self
            .tracker
            .tracked()
            .iter()
            .any(|t| self.position.instances.contains_key(&t.instance.name));
        let starts: Option<Vec<(String, Lsn, i32)>> = self
            .tracker
            .tracked()
            .iter()
            .map(|t| {
                t.instance.start_lsn.map(|start| {
                    (
                        t.instance.name.clone(),
                        last_before(start),
                        t.instance.object_id,
                    )
                })
            })
            .collect();
        let Some(starts) = starts.filter(|s| !s.is_empty() && !known) else {
            return false;
        };
        for (name, through, object_id) in starts {
            self.position.instances.insert(name.clone(), through);
            self.position.change_tables.insert(name, object_id);
        }
        tracing::info!(
            "no checkpoint and nothing recorded by CDC yet: starting with the first change each capture instance records (start_position = \"latest\")"
        );
        true
    }

    /// With no checkpoint and `start_position = "latest"`, every tracked instance
    /// starts complete through `max_lsn`. Whether it did.
    fn start_at_latest(&mut self, max_lsn: Lsn) -> bool {
        let known_instances = self
            .tracker
            .tracked()
            .iter()
            .any(|t| self.position.instances.contains_key(&t.instance.name));
        let first_run = !known_instances && self.position.last_event.is_none();
        if !first_run
            || self.config.start_position != StartPosition::Latest
            || self.tracker.tracked().is_empty()
        {
            return false;
        }
        for t in self.tracker.tracked() {
            self.position
                .instances
                .insert(t.instance.name.clone(), max_lsn);
            self.position
                .change_tables
                .insert(t.instance.name.clone(), t.instance.object_id);
        }
        self.merge.finished_through(max_lsn);
        tracing::info!(%max_lsn, "no checkpoint: starting after the latest change (start_position = \"latest\")");
        true
    }

    /// Each tracked instance's `min_lsn`, in tracking order; `None` while one of them
    /// answers 0x00 (no permission, or just enabled), which is an error once it has
    /// lasted `source.unreadable_grace_ms`.
    fn readable_min_lsns(
        &mut self,
        results: &[ProbeResult],
    ) -> Result<Option<Vec<Lsn>>, SourceError> {
        let mut readable = Vec::with_capacity(self.tracker.tracked().len());
        for t in self.tracker.tracked() {
            let name = &t.instance.name;
            let min_lsn = results
                .iter()
                .find(|r| &r.capture_instance == name)
                .and_then(|r| r.min_lsn)
                .filter(|l| !l.is_zero());
            self.merge
                .note_readable(t, min_lsn.is_some(), self.config.unreadable_grace)?;
            readable.push(min_lsn);
        }
        Ok(readable.into_iter().collect())
    }

    /// What this iteration does with tracked instance `index`: read it up to its
    /// upper bound, re-load its table after a gap (`when_needed`), or nothing (it has
    /// no change to read; it is then complete through its upper bound). A gap stops
    /// the run under `on_gap = "fail"`, and is logged and passed under `"skip"`.
    fn plan_instance(
        &mut self,
        index: usize,
        min_lsn: Lsn,
        next_change: Option<Lsn>,
        max_lsn: Lsn,
    ) -> Result<Planned, SourceError> {
        let t = &self.tracker.tracked()[index];
        let name = &t.instance.name;
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
            return Ok(Planned::Nothing);
        }
        // Only what this instance still had to deliver can be lost from it.
        if first_unread < min_lsn && first_unread <= upper && !new_instance {
            let lost = first_unread..=last_before(min_lsn).min(upper);
            if let Some(reload) = self.on_gap(index, lost, upper)? {
                return Ok(Planned::Reload(reload));
            }
        }
        let skipped = first_unread < min_lsn;
        if skipped {
            through = last_before(min_lsn).min(upper.max(through));
        }
        // The probe looked for changes after the old position; after a skip, what it
        // found may lie below the new one while later changes exist.
        let has_changes = next_change.is_some_and(|lsn| (skipped || lsn > through) && lsn <= upper);
        let name = name.clone();
        if !has_changes {
            // Nothing to read up to `upper`: complete through it (idle advance).
            self.position.instances.insert(name, through.max(upper));
            return Ok(Planned::Nothing);
        }
        self.position.instances.insert(name, through);
        Ok(Planned::Read(Cursor {
            tracked: index,
            after: RowKey::after_lsn(through),
            upper,
            buffer: VecDeque::new(),
            exhausted: false,
            next_change: next_change.filter(|lsn| *lsn > through),
            unchecked_from: None,
        }))
    }

    /// Changes of tracked instance `index` in `lost` were purged before delivery: the
    /// table is re-loaded at `upper` (`snapshot.mode = "when_needed"`), the run stops
    /// (`on_gap = "fail"`), or the loss is logged and passed (`"skip"`).
    fn on_gap(
        &self,
        index: usize,
        lost: std::ops::RangeInclusive<Lsn>,
        upper: Lsn,
    ) -> Result<Option<Reload>, SourceError> {
        let t = &self.tracker.tracked()[index];
        let name = &t.instance.name;
        let (first_lost, last_lost) = lost.into_inner();
        if self.config.snapshot == SnapshotMode::WhenNeeded && t.superseded_at.is_none() {
            // Re-load the table at `upper` instead: its rows now, then its changes
            // after `upper` (this iteration reads none of them).
            tracing::error!(
                capture_instance = %name,
                table = %t.instance.qualified_table(),
                %first_lost,
                %last_lost,
                at_lsn = %upper,
                "changes were purged by the CDC cleanup job before delivery: re-loading the table (snapshot.mode = \"when_needed\"); rows deleted in the lost range are not in the re-load"
            );
            return Ok(Some((name.clone(), t.instance.qualified_table(), upper)));
        }
        match self.config.on_gap {
            GapPolicy::Fail => Err(SourceError::Gap {
                capture_instance: name.clone(),
                first_lost,
                last_lost,
            }),
            GapPolicy::Skip => {
                tracing::error!(
                    capture_instance = %name,
                    %first_lost,
                    %last_lost,
                    "CHANGES LOST: purged by the CDC cleanup job before delivery; skipping (source.on_gap = \"skip\")"
                );
                Ok(None)
            }
        }
    }

    /// Queues the re-load of each table whose changes were purged (`when_needed`),
    /// at the LSN its changes resume after.
    async fn queue_reloads(&mut self, reloads: Vec<Reload>) -> Result<(), SourceError> {
        for (name, table, at) in reloads {
            let commit_time_ns = self.commit_time_ns(at).await?;
            self.position.advance(&name, at);
            self.loads.forget(&name);
            super::load_runner::queue_table_load(
                &mut self.position,
                name,
                table,
                at,
                commit_time_ns,
            );
        }
        Ok(())
    }

    /// The LSN through which `t` is complete: its checkpoint, or for an instance not
    /// seen before, just below its `start_lsn`.
    pub(super) fn complete_through(&self, t: &Tracked) -> Lsn {
        self.position
            .instances
            .get(&t.instance.name)
            .copied()
            .unwrap_or_else(|| last_before(t.instance.start_lsn.unwrap_or(Lsn::ZERO)))
    }

    /// Reads and merges rows until the batch is full or the iteration ends.
    ///
    /// Lazily: a capture instance's page is read only when the merge could need its
    /// next row — when what it can hold next (after its keyset, and no earlier than
    /// the probe's first change LSN for it) comes before the smallest row buffered.
    /// With many busy tables, the rows held stay near one shared budget
    /// (`page_size`) instead of a page per table, and a table is read when the
    /// merge reaches its changes, not all before the first event. The cleanup job's
    /// low end is checked once per call, for every instance read, in one statement.
    pub(super) async fn fill(&mut self, changes: &mut Vec<Change>) -> Result<(), SourceError> {
        let Some(mut iteration) = self.merge.iteration.take() else {
            return Ok(());
        };
        let mut emitted = Vec::new();
        loop {
            if changes.len() >= self.config.batch_size {
                self.check_low_ends(&mut iteration).await?;
                self.merge.iteration = Some(iteration);
                return Ok(());
            }
            let frontier = iteration
                .cursors
                .iter()
                .filter_map(|c| c.buffer.front().map(|row| row.key))
                .min();
            // The unread cursor whose rows could come first: each comes after this.
            let unread = iteration
                .cursors
                .iter()
                .enumerate()
                .filter(|(_, c)| c.buffer.is_empty() && !c.exhausted)
                .map(|(i, c)| (lower_bound(c), i))
                .min();
            if let Some((bound, index)) = unread
                && frontier.is_none_or(|f| bound < f)
            {
                let held: usize = iteration.cursors.iter().map(|c| c.buffer.len()).sum();
                let limit = self
                    .config
                    .page_size
                    .saturating_sub(held)
                    .max(MIN_SHARED_PAGE.min(self.config.page_size));
                let cursor = &mut iteration.cursors[index];
                let t = &self.tracker.tracked()[cursor.tracked];
                let rows = self
                    .source
                    .read_changes(&t.instance, cursor.after, cursor.upper, limit)
                    .await?;
                check_page(&t.instance.name, cursor.after, cursor.upper, &rows)?;
                cursor.unchecked_from.get_or_insert(cursor.after);
                cursor.next_change = None;
                cursor.exhausted = rows.len() < limit;
                if let Some(last) = rows.last() {
                    cursor.after = last.key;
                }
                cursor.buffer.extend(rows);
                #[cfg(any(test, feature = "testing"))]
                {
                    let held = held + cursor.buffer.len();
                    self.merge.peak_rows_held = self.merge.peak_rows_held.max(held);
                }
                continue;
            }
            let heads: Vec<&VecDeque<ChangeRow>> =
                iteration.cursors.iter().map(|c| &c.buffer).collect();
            let Some(next) = smallest_head(&heads) else {
                self.check_low_ends(&mut iteration).await?;
                iteration.sequencer.finish(&mut emitted)?;
                self.take_emitted(&mut emitted, changes, &iteration);
                for cursor in &iteration.cursors {
                    let name = &self.tracker.tracked()[cursor.tracked].instance.name;
                    self.position.advance(name, cursor.upper);
                }
                self.merge.finished_through(iteration.to);
                return Ok(());
            };
            let cursor = &mut iteration.cursors[next];
            let Some(row) = cursor.buffer.pop_front() else {
                continue;
            };
            let context = Arc::clone(&self.tracker.tracked()[cursor.tracked].context);
            iteration.sequencer.push(&context, row, &mut emitted)?;
            self.take_emitted(&mut emitted, changes, &iteration);
        }
    }

    /// The cleanup job raises the low end first and then deletes in batches: if it
    /// moved past what a page read since the last check needed, rows of it may be
    /// missing. That is a gap, never a partial transaction: the poll fails, and what
    /// it merged is dropped with it (the poller goes back to its last position).
    /// One statement for every instance read.
    async fn check_low_ends(&mut self, iteration: &mut Iteration) -> Result<(), SourceError> {
        let read: Vec<(usize, RowKey)> = iteration
            .cursors
            .iter_mut()
            .filter_map(|c| c.unchecked_from.take().map(|from| (c.tracked, from)))
            .collect();
        if read.is_empty() {
            return Ok(());
        }
        let probes: Vec<Probe> = read
            .iter()
            .map(|&(tracked, from)| Probe {
                capture_instance: self.tracker.tracked()[tracked].instance.name.clone(),
                after: from.start_lsn,
            })
            .collect();
        let results = self.source.probe(&probes, iteration.to).await?;
        for (tracked, from) in read {
            let t = &self.tracker.tracked()[tracked];
            let min_lsn = results
                .iter()
                .find(|r| r.capture_instance == t.instance.name)
                .and_then(|r| r.min_lsn);
            let first_needed = first_needed_after(from);
            if let Some(min_lsn) = min_lsn.filter(|m| *m > first_needed) {
                let reload =
                    self.config.snapshot == SnapshotMode::WhenNeeded && t.superseded_at.is_none();
                return Err(match self.config.on_gap {
                    GapPolicy::Fail if !reload => SourceError::Gap {
                        capture_instance: t.instance.name.clone(),
                        first_lost: first_needed,
                        last_lost: last_before(min_lsn),
                    },
                    // Start the iteration again: its probe finds the gap and
                    // re-loads the table, or skips the gap, as configured.
                    _ => SourceError::CleanupRaced {
                        capture_instance: t.instance.name.clone(),
                        min_lsn,
                    },
                });
            }
        }
        Ok(())
    }

    /// Moves sequenced events into the batch, skipping those already emitted before a
    /// restart, and advances the position.
    pub(super) fn take_emitted(
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
                    let name = &self.tracker.tracked()[cursor.tracked].instance.name;
                    self.position
                        .advance(name, change.commit_lsn.min(cursor.upper));
                }
            }
            // Skipped or not, the event's commit has been read: a restart from here
            // reads later commits after it.
            CommitClock::advance_saved(&mut self.position.commit_clock_ns, change.commit_time);
            self.announcer.note(
                &change,
                changes.len(),
                self.tracker.tracked(),
                &mut self.position.table_versions,
            );
            if self.merge.emitted_before(at) {
                continue;
            }
            self.position.last_event = Some(at);
            changes.push(change);
        }
    }
}

/// The smallest page a read asks for while other instances' rows are held: the
/// shared budget (`page_size` rows held in all) shrinks pages, not below this.
const MIN_SHARED_PAGE: usize = 64;

/// What an unread cursor's rows all come after: its keyset, or, before its first
/// page, the end of the LSN before the probe's first change.
fn lower_bound(cursor: &Cursor) -> RowKey {
    match cursor.next_change {
        Some(lsn) if lsn > cursor.after.start_lsn => RowKey::after_lsn(last_before(lsn)),
        _ => cursor.after,
    }
}

/// The lowest commit LSN whose rows a read after `after` still needs: the
/// transaction `after` stops inside, or the one after it.
pub(super) fn first_needed_after(after: RowKey) -> Lsn {
    if after == RowKey::after_lsn(after.start_lsn) {
        after.start_lsn.increment().unwrap_or(Lsn::MAX)
    } else {
        after.start_lsn
    }
}

/// The LSN just below `lsn` (zero stays zero).
pub(super) fn last_before(lsn: Lsn) -> Lsn {
    Lsn::from_u128(lsn.to_u128().saturating_sub(1)).unwrap_or(Lsn::ZERO)
}

/// Rejects a page that is out of order or outside the requested range: a defect in a
/// query must not turn into silently reordered or repeated events.
pub(super) fn check_page(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::CdcReads;

    fn at(lsn: u32, sequence_number: u64) -> EventPosition {
        EventPosition {
            commit_lsn: Lsn::from_parts(0, lsn, 1),
            sequence_number,
        }
    }

    #[test]
    fn the_merge_skips_what_was_emitted_before_a_restart_and_goes_back_to_its_restart_point() {
        let mut merge = Merge::new(Some(at(5, 2)));
        assert!(merge.emitted_before(at(5, 1)));
        assert!(merge.emitted_before(at(5, 2)));
        assert!(!merge.emitted_before(at(5, 3)));
        // Past the resume point, nothing more is skipped (even an older event).
        assert!(!merge.emitted_before(at(5, 1)));

        merge.finished_through(Lsn::from_parts(0, 9, 0));
        let restart = merge.restart_point();
        merge.finished_through(Lsn::from_parts(0, 12, 0));
        merge.restart(restart, Some(at(11, 4)));
        assert_eq!(merge.done_through(), Some(Lsn::from_parts(0, 9, 0)));
        assert!(!merge.in_iteration());
        assert!(
            merge.emitted_before(at(11, 4)),
            "the events emitted since are skipped when re-read"
        );
        assert!(!merge.emitted_before(at(11, 5)));
    }

    #[tokio::test]
    async fn an_unreadable_instance_is_an_error_once_its_grace_has_passed() {
        use crate::cdc_sim::{CdcSimulator, SimColumn};
        let sim = CdcSimulator::new("Shop", uuid::Uuid::from_u128(7), 0);
        sim.create_table(
            "dbo",
            "Orders",
            vec![SimColumn::new("Id", crate::event::value::SqlType::Int)],
            &["Id"],
        );
        sim.enable_table("dbo.Orders", Some("dbo_Orders")).unwrap();
        sim.run_capture_job();
        let catalog = sim.clone().catalog().await.unwrap();
        let instance = catalog.instances[0].clone();
        let t = Tracked {
            context: Arc::new(InstanceContext::new(&instance, &catalog.database).unwrap()),
            instance,
            superseded_at: None,
        };
        let mut merge = Merge::new(None);
        let hour = Duration::from_secs(3600);
        merge.note_readable(&t, false, hour).unwrap();
        merge.note_readable(&t, true, Duration::ZERO).unwrap();
        // Readable again: the grace starts over.
        merge.note_readable(&t, false, hour).unwrap();
        let err = merge.note_readable(&t, false, Duration::ZERO).unwrap_err();
        assert!(
            matches!(&err, SourceError::TableUnreadable { capture_instance, .. } if capture_instance == "dbo_Orders"),
            "{err}"
        );
    }
}

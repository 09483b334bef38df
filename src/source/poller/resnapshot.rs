//! Re-snapshots: a table read again from its first row while its changes stream on
//! (`mssql-ces snapshot`), with nothing written to the database.
//!
//! The watermarks are CDC's own LSNs (DBLog's method without a signal table):
//! 1. Once the poll loop has read every change through L, the next chunk of the
//!    table is read in key order, and then `max_lsn`: H, the chunk's high mark.
//! 2. The chunk's rows are held while the poll loop reads on, until it has read
//!    every change through H. Every change of the table emitted meanwhile removes
//!    the held row of its key (the key before and after it).
//! 3. Then what is left goes out as loaded rows, and the checkpoint records the
//!    chunk's last key read.
//!
//! With `snapshot.max_connections` above 1 and several tables asked for, one chunk
//! of each of up to that many tables is read at once, each on a connection of its
//! own, between the same two marks: H is read after all of them, and they are held
//! and go out together.
//!
//! The rule a consumer gets, as for the initial load: applying a table's events in
//! order, per key, gives its current state. A held row whose key had no change in
//! the window holds the values of the key's last change at or below L (or its
//! values before CDC saw it), which is also what the server has through H; a
//! change committed after the read and recorded after H comes after the row. A
//! row whose key changed in the window is dropped: the change carries the whole
//! row, or its removal, and comes after any older one.

use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot};

use super::load_readers::ChunkJob;
use super::load_runner::{key_positions, key_text, loaded_changes};
use super::*;
use crate::event::Value;
use crate::position::LOAD_ROWS_PER_RANGE;

/// A request to re-snapshot a table, and where its answer goes.
#[derive(Debug)]
pub struct SnapshotRequest {
    /// `schema.table`.
    pub table: String,
    pub reply: oneshot::Sender<Result<SnapshotAccepted, SnapshotRefused>>,
}

/// Hands re-snapshot requests to a running poller ([`Poller::snapshot_handle`]).
#[derive(Debug, Clone)]
pub struct SnapshotHandle(mpsc::UnboundedSender<SnapshotRequest>);

impl SnapshotHandle {
    /// A handle and the requests sent through it, with no poller behind it.
    #[cfg(any(test, feature = "testing"))]
    pub fn channel_for_tests() -> (Self, mpsc::UnboundedReceiver<SnapshotRequest>) {
        let (sender, requests) = mpsc::unbounded_channel();
        (SnapshotHandle(sender), requests)
    }

    /// Asks for `table` (`schema.table`) to be read again; answered once the poller
    /// has looked at it (between two of its polls).
    pub async fn request(&self, table: &str) -> Result<SnapshotAccepted, SnapshotRefused> {
        let (reply, answer) = oneshot::channel();
        self.0
            .send(SnapshotRequest {
                table: table.to_owned(),
                reply,
            })
            .map_err(|_| SnapshotRefused::Stopped)?;
        answer.await.map_err(|_| SnapshotRefused::Stopped)?
    }
}

/// A re-snapshot the poller took on (or found under way).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotAccepted {
    /// `schema.table` as the catalog spells it.
    pub table: String,
    pub capture_instance: String,
    /// The LSN it was asked at: its rows' `commitlsn`.
    #[serde(rename = "at_lsn")]
    pub at: Lsn,
    /// False when the table's re-snapshot was under way already.
    pub new: bool,
    /// Rows sent so far (0 for a new one).
    pub rows: u64,
}

/// Why a re-snapshot was not taken on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotRefused {
    #[error(
        "{table} is not a table this stream reads; name it as schema.table, one of: {streamed}"
    )]
    NotStreamed { table: String, streamed: String },
    #[error(
        "{table} has no key (no primary key, no @index_name), and a re-snapshot reads in key order and matches its rows to the changes by key"
    )]
    NoKey { table: String },
    #[error(
        "{table}: a key column is not among the streamed columns (a type CES leaves out, or not captured), so the table cannot be read in key order"
    )]
    KeyNotStreamed { table: String },
    #[error(
        "snapshot.mode is \"initial_only\": this run streams no changes, so there is no stream to re-snapshot into"
    )]
    InitialOnly,
    #[error("the stream stopped before it answered")]
    Stopped,
}

/// How a re-snapshot is going, or how the last one of its table went, for the
/// metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct ResnapshotStatus {
    /// `schema.table`.
    pub table: String,
    pub rows: u64,
    pub chunks: u64,
    pub superseded: u64,
    /// False once it has sent its last chunk.
    pub running: bool,
}

impl ResnapshotStatus {
    fn of(r: &crate::position::Resnapshot, running: bool) -> Self {
        ResnapshotStatus {
            table: r.load.table.clone(),
            rows: r.load.rows,
            chunks: r.chunks,
            superseded: r.superseded,
            running,
        }
    }
}

/// A chunk read and held until the poll loop has read through its high mark.
struct HeldChunk {
    instance: String,
    /// The table's schema and name: changes of the table through any of its
    /// capture instances supersede held rows.
    schema: String,
    table: String,
    /// The rows in key order; `None` where a change superseded one.
    rows: Vec<Option<Vec<Value>>>,
    /// Each held row's key (text forms in key order) and place in `rows`.
    by_key: HashMap<Vec<Option<String>>, usize>,
    /// The last key read: where the next chunk starts, whether or not its row goes.
    last_key: Option<Vec<Option<String>>>,
    /// The chunk ends the table.
    done: bool,
    superseded: u64,
}

/// The chunks read at once, one per table, and their high mark: `max_lsn` read
/// after all of them, which the merge reads through before any goes out.
struct Held {
    high: Lsn,
    chunks: Vec<HeldChunk>,
}

/// This process's run of a re-snapshot, for its log lines.
struct Run {
    started: Instant,
    rows_at_start: u64,
    last_log: Instant,
}

/// The re-snapshots' part of the poller: the requests, the chunk held, the runs.
pub(super) struct Resnapshots {
    sender: mpsc::UnboundedSender<SnapshotRequest>,
    requests: mpsc::UnboundedReceiver<SnapshotRequest>,
    /// Requests received but not answered because the source failed: first next
    /// time.
    waiting: Vec<SnapshotRequest>,
    /// The chunks read at once and not sent yet.
    held: Option<Held>,
    runs: BTreeMap<String, Run>,
    /// Per table, how its last re-snapshot in this process ended.
    finished: BTreeMap<String, ResnapshotStatus>,
}

impl Default for Resnapshots {
    fn default() -> Self {
        let (sender, requests) = mpsc::unbounded_channel();
        Resnapshots {
            sender,
            requests,
            waiting: Vec::new(),
            held: None,
            runs: BTreeMap::new(),
            finished: BTreeMap::new(),
        }
    }
}

impl Resnapshots {
    pub(super) fn handle(&self) -> SnapshotHandle {
        SnapshotHandle(self.sender.clone())
    }

    /// The requests not answered yet.
    fn take_requests(&mut self) -> Vec<SnapshotRequest> {
        let mut out = std::mem::take(&mut self.waiting);
        while let Ok(request) = self.requests.try_recv() {
            out.push(request);
        }
        out
    }

    /// A chunk of `name`'s re-snapshot went out (`snapshot` its state after it):
    /// its progress is logged every [`RESNAPSHOT_LOG_EVERY`], its end always.
    fn chunk_sent(&mut self, name: &str, snapshot: &crate::position::Resnapshot, done: bool) {
        if done {
            let run = self.runs.remove(name);
            let seconds = run.map_or(0.0, |r| r.started.elapsed().as_secs_f64());
            tracing::info!(
                table = %snapshot.load.table,
                rows = snapshot.load.rows,
                chunks = snapshot.chunks,
                superseded_rows = snapshot.superseded,
                seconds = (seconds * 10.0).round() / 10.0,
                "table re-snapshot finished"
            );
            self.finished.insert(
                snapshot.load.table.clone(),
                ResnapshotStatus::of(snapshot, false),
            );
            return;
        }
        let Some(run) = self
            .runs
            .get_mut(name)
            .filter(|r| r.last_log.elapsed() >= RESNAPSHOT_LOG_EVERY)
        else {
            return;
        };
        run.last_log = Instant::now();
        let seconds = run.started.elapsed().as_secs_f64();
        tracing::info!(
            table = %snapshot.load.table,
            rows = snapshot.load.rows,
            chunks = snapshot.chunks,
            superseded_rows = snapshot.superseded,
            rows_per_second = (seconds > 0.0).then(|| {
                (snapshot.load.rows.saturating_sub(run.rows_at_start) as f64 / seconds).round()
            }),
            "re-snapshotting"
        );
    }

    /// A poll failed: the chunks held are read again (the position went back).
    pub(super) fn discard_held(&mut self) {
        self.held = None;
    }

    /// Every change of a held chunk's table in `changes` (what the merge emitted:
    /// CDC's changes only) removes the held row of its keys, before and after.
    pub(super) fn supersede(&mut self, changes: &[Change]) {
        let Some(held) = self.held.as_mut() else {
            return;
        };
        for change in changes {
            let Some(held) = (held.chunks.iter_mut())
                .find(|h| change.table.table() == h.table && change.table.schema() == h.schema)
            else {
                continue;
            };
            for image in [change.old.as_ref(), change.current.as_ref()]
                .into_iter()
                .flatten()
            {
                let key: Vec<Option<String>> = change
                    .table
                    .key()
                    .iter()
                    .map(|&at| image.get(at).and_then(Value::to_text))
                    .collect();
                if let Some(at) = held.by_key.remove(&key) {
                    held.rows[at] = None;
                    held.superseded += 1;
                }
            }
        }
    }
}

impl<S: ChangeSource> Poller<S> {
    /// Where requests to re-snapshot a table go while this poller runs.
    pub fn snapshot_handle(&self) -> SnapshotHandle {
        self.resnapshots.handle()
    }

    /// The re-snapshots under way, and how the last finished one of each other
    /// table ended, for the metrics.
    pub fn resnapshot_status(&self) -> Vec<ResnapshotStatus> {
        let running = self
            .position
            .resnapshots
            .values()
            .map(|r| ResnapshotStatus::of(r, true));
        let finished = self
            .resnapshots
            .finished
            .values()
            .filter(|f| {
                !self
                    .position
                    .resnapshots
                    .values()
                    .any(|r| r.load.table == f.table)
            })
            .cloned();
        running.chain(finished).collect()
    }

    /// Answers the requests received; true when one was taken on (the position
    /// then records it, and goes out in a batch of its own so it is durable).
    pub(super) async fn answer_snapshot_requests(&mut self) -> Result<bool, SourceError> {
        let requests = self.resnapshots.take_requests();
        if requests.is_empty() {
            return Ok(false);
        }
        if self.config.snapshot == SnapshotMode::InitialOnly {
            for request in requests {
                let _ = request.reply.send(Err(SnapshotRefused::InitialOnly));
            }
            return Ok(false);
        }
        let mut answers = Vec::new();
        let mut taken = false;
        let result = self.take_on(&requests, &mut answers, &mut taken).await;
        let mut requests = requests.into_iter();
        for (request, answer) in requests.by_ref().zip(answers) {
            let _ = request.reply.send(answer);
        }
        // The source failed before these were answered: they wait for the next poll.
        self.resnapshots.waiting.extend(requests);
        result.map(|()| taken)
    }

    /// The answer to each request in turn, into `answers`; stops at a source error.
    async fn take_on(
        &mut self,
        requests: &[SnapshotRequest],
        answers: &mut Vec<Result<SnapshotAccepted, SnapshotRefused>>,
        taken: &mut bool,
    ) -> Result<(), SourceError> {
        self.load_catalog().await?;
        for request in requests {
            let answer = self.take_on_one(request.table.trim()).await?;
            *taken |= answer.as_ref().is_ok_and(|a| a.new);
            answers.push(answer);
        }
        Ok(())
    }

    /// Whether the table named `wanted` can be re-snapshotted; if so its
    /// re-snapshot is recorded in the position (or found there already).
    async fn take_on_one(
        &mut self,
        wanted: &str,
    ) -> Result<Result<SnapshotAccepted, SnapshotRefused>, SourceError> {
        let Some(tracked) = self
            .tracker
            .tracked()
            .iter()
            .filter(|t| t.superseded_at.is_none())
            .find(|t| t.instance.qualified_table().eq_ignore_ascii_case(wanted))
        else {
            let mut streamed: Vec<String> = self
                .tracker
                .tracked()
                .iter()
                .map(|t| t.instance.qualified_table())
                .collect();
            streamed.dedup();
            return Ok(Err(SnapshotRefused::NotStreamed {
                table: wanted.to_owned(),
                streamed: streamed.join(", "),
            }));
        };
        let instance = tracked.instance.clone();
        let table = instance.qualified_table();
        if instance.key_columns.is_empty() {
            return Ok(Err(SnapshotRefused::NoKey { table }));
        }
        if key_positions(&instance).is_err() {
            return Ok(Err(SnapshotRefused::KeyNotStreamed { table }));
        }
        if let Some(running) = self.position.resnapshots.get(&instance.name) {
            return Ok(Ok(SnapshotAccepted {
                table,
                capture_instance: instance.name.clone(),
                at: running.load.at,
                new: false,
                rows: running.load.rows,
            }));
        }
        let max = self.source.max_lsn().await?;
        let at = max.lsn.unwrap_or(Lsn::ZERO);
        let commit_time_ns = self.commit_time_ns(at).await?;
        // Never the first range: the changes committed at `at` were streamed
        // already, and their `logicalid`s are `at` and their sequence numbers.
        let logical_base = self.position.next_load_base.max(LOAD_ROWS_PER_RANGE);
        self.position.next_load_base = logical_base.saturating_add(LOAD_ROWS_PER_RANGE);
        self.position.resnapshots.insert(
            instance.name.clone(),
            crate::position::Resnapshot {
                load: TableLoad {
                    table: table.clone(),
                    at,
                    commit_time_ns,
                    after: None,
                    rows: 0,
                    logical_base,
                },
                chunks: 0,
                superseded: 0,
            },
        );
        tracing::info!(%table, capture_instance = %instance.name, at_lsn = %at, "re-snapshot requested: the table is read again in key order while its changes stream on");
        Ok(Ok(SnapshotAccepted {
            table,
            capture_instance: instance.name,
            at,
            new: true,
            rows: 0,
        }))
    }

    /// The re-snapshots' turn between two iterations: the held chunk goes out once
    /// the merge has read through its high mark, and otherwise the next chunk is
    /// read and held. `Some` is a batch to return now.
    pub(super) async fn resnapshot_step(&mut self) -> Result<Option<Batch>, SourceError> {
        if self.resnapshots.held.is_none() {
            let at_once = self.loads.readers.resnapshot_tables_at_once();
            let names: Vec<String> = (self.position.resnapshots.keys())
                .take(at_once)
                .cloned()
                .collect();
            if names.is_empty() {
                return Ok(None);
            }
            if !self.hold_next_chunks(&names).await? {
                return Ok(Some(self.position_batch(Vec::new()).await?));
            }
        }
        let closed = self.resnapshots.held.as_ref().is_some_and(|held| {
            held.high.is_zero() || self.merge.done_through().is_some_and(|d| d >= held.high)
        });
        if !closed {
            return Ok(None);
        }
        self.emit_held().await.map(Some)
    }

    /// Reads the next chunk of each of `names`' re-snapshots (at once, on the load's
    /// readers, when there are several) and holds them; false when one of the
    /// tables is no longer read (its re-snapshot is dropped, said in the log) and
    /// nothing is held.
    async fn hold_next_chunks(&mut self, names: &[String]) -> Result<bool, SourceError> {
        self.load_catalog().await?;
        let mut reads = Vec::with_capacity(names.len());
        for name in names {
            let Some(snapshot) = self.position.resnapshots.get(name).cloned() else {
                return Ok(false);
            };
            let Some(tracked) = self.tracker.instance(name) else {
                tracing::warn!(capture_instance = %name, table = %snapshot.load.table, rows = snapshot.load.rows, "the capture instance being re-snapshotted is gone (disabled, or no longer included): its re-snapshot ends here; ask again for the table's other capture instance");
                self.position.resnapshots.remove(name);
                self.resnapshots.runs.remove(name);
                return Ok(false);
            };
            let instance = tracked.instance.clone();
            let key_positions = key_positions(&instance)?;
            self.resnapshots.runs.entry(name.clone()).or_insert_with(|| {
                let now = Instant::now();
                tracing::info!(table = %snapshot.load.table, at_lsn = %snapshot.load.at, resumed_after_rows = snapshot.load.rows, "re-snapshotting table");
                Run {
                    started: now,
                    rows_at_start: snapshot.load.rows,
                    last_log: now,
                }
            });
            reads.push((name.clone(), instance, key_positions, snapshot.load));
        }
        let chunks = if let [(name, instance, key_positions, load)] = reads.as_slice() {
            vec![
                self.loads
                    .read_keyed_chunk(&mut self.source, name, instance, load, key_positions)
                    .await?,
            ]
        } else {
            let jobs: Vec<ChunkJob<'_>> = (reads.iter())
                .map(|(_, instance, key_positions, load)| ChunkJob {
                    instance,
                    after: load.after.as_deref(),
                    key_positions,
                })
                .collect();
            self.loads.readers.read_chunks_at_once(&jobs).await?
        };
        // After the reads: every change a chunk may not show has a higher LSN, or
        // is read through this mark before the chunks go out.
        let high = self.source.max_lsn().await?.lsn.unwrap_or(Lsn::ZERO);
        let mut held = Held {
            high,
            chunks: Vec::with_capacity(reads.len()),
        };
        for ((name, instance, key_positions, _), (rows, done)) in reads.into_iter().zip(chunks) {
            let last_key = rows.last().map(|row| key_text(row, &key_positions));
            let by_key = rows
                .iter()
                .enumerate()
                .map(|(at, row)| (key_text(row, &key_positions), at))
                .collect();
            held.chunks.push(HeldChunk {
                instance: name,
                schema: instance.schema.clone(),
                table: instance.table.clone(),
                rows: rows.into_iter().map(Some).collect(),
                by_key,
                last_key,
                done,
                superseded: 0,
            });
        }
        self.resnapshots.held = Some(held);
        Ok(true)
    }

    /// The held chunks' rows that no change superseded, as loaded rows, table
    /// after table; each checkpoint's re-snapshot moves past its chunk's last key
    /// read.
    async fn emit_held(&mut self) -> Result<Batch, SourceError> {
        let mut changes = Vec::new();
        let chunks = self.resnapshots.held.take().map(|held| held.chunks);
        for chunk in chunks.into_iter().flatten() {
            self.emit_chunk(chunk, &mut changes)?;
        }
        if self.position.resnapshots.is_empty() && self.position.loads.is_empty() {
            self.loads.readers.close();
        }
        self.position_batch(changes).await
    }

    /// One held chunk's rows that no change superseded, onto `changes`.
    fn emit_chunk(&mut self, held: HeldChunk, out: &mut Vec<Change>) -> Result<(), SourceError> {
        let name = held.instance;
        let (Some(mut snapshot), Some(tracked)) = (
            self.position.resnapshots.get(&name).cloned(),
            self.tracker.instance(&name),
        ) else {
            return Ok(());
        };
        let table = Arc::clone(&tracked.context.table);
        let key_positions = key_positions(&tracked.instance)?;
        let guid = self
            .tracker
            .stream_guid()
            .ok_or(SourceError::DatabaseGuidUnreadable)?;
        let rows: Vec<Vec<Value>> = held.rows.into_iter().flatten().collect();
        let mut changes = loaded_changes(
            guid,
            &name,
            &table,
            &mut snapshot.load,
            rows,
            held.done,
            &key_positions,
        )?;
        for change in &mut changes {
            if let Origin::Load { incremental, .. } = &mut change.origin {
                *incremental = true;
            }
        }
        snapshot.load.after = held.last_key.or(snapshot.load.after);
        snapshot.chunks += 1;
        snapshot.superseded += held.superseded;
        if let Some(first) = changes.first() {
            self.announcer.note(
                first,
                out.len(),
                self.tracker.tracked(),
                &mut self.position.table_versions,
            );
        }
        self.resnapshots.chunk_sent(&name, &snapshot, held.done);
        if held.done {
            self.position.resnapshots.remove(&name);
        } else {
            self.position.resnapshots.insert(name, snapshot);
        }
        out.extend(changes);
        Ok(())
    }
}

/// How often a re-snapshot's progress is logged.
const RESNAPSHOT_LOG_EVERY: Duration = Duration::from_secs(5);

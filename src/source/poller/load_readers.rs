//! The initial load over several connections (`snapshot.max_connections`).
//!
//! Rows are read ahead on connections of their own while the stream sends what was
//! read before, and handed out in exactly the order, chunk sizes aside, that one
//! connection reads them: table after table, each in key order. So the events, their
//! ids and `logicalid`s, the checkpoint and a resume are those of a load over one
//! connection; only the reading overlaps.
//!
//! - The loads queued are cut into **segments**, in the order they go out (the next
//!   `2 × max_connections` tables at a time, planned again when they are sent): a table
//!   whose key is integer columns (the usual identity key) and which holds more than
//!   a few chunks is cut into key ranges of about [`RANGE_CHUNKS`] chunks at keys
//!   sampled from it ([`TableReads::sample_rows`]: `TABLESAMPLE`, a few pages); any
//!   other table is one segment. A segment reads chunks after its first key and
//!   stops after its last (compared as integers, so the cut needs no collation).
//! - Of the first `2 × max_connections` segments in order, up to `max_connections`
//!   are read at once, each on a connection of its own, and each holds at most
//!   [`RANGE_CHUNKS`] chunks read: a range is read whole while the ones before it are
//!   sent, so one large table is read over every connection, in order. Memory is
//!   bounded by `2 × max_connections × RANGE_CHUNKS + 2` chunks.
//! - The table being sent takes its chunks from its segments in order; the chunk
//!   after the one handed out is read first, which tells whether that one ends the
//!   table.
//!
//! Rows a segment reads later than one connection would have (or earlier) are of the
//! same kind as a load's rows always are: committed rows as of some moment after the
//! load's LSN, whose changes after it follow the load. A key that moves between
//! ranges while they are read is handled as a key moved between chunks is.

use std::collections::VecDeque;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::event::Value;
use crate::event::value::SqlType;
use crate::source::{CaptureInstance, SourceError, TableCursor, TableReads};

use super::load_runner::key_text;

/// A connection of its own that reads a table's rows for the load.
pub trait ChunkReader: Send {
    /// Up to `limit` rows of `instance`'s table after the key `after` (from its
    /// first row without), in key order: [`TableReads::read_table`].
    fn read<'a>(
        &'a mut self,
        instance: &'a CaptureInstance,
        after: Option<&'a [Option<String>]>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Vec<Value>>, SourceError>>;
}

impl<T: TableReads + Send> ChunkReader for T {
    fn read<'a>(
        &'a mut self,
        instance: &'a CaptureInstance,
        after: Option<&'a [Option<String>]>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Vec<Value>>, SourceError>> {
        let cursor = after.map_or(TableCursor::Start, TableCursor::AfterKey);
        Box::pin(self.read_table(instance, cursor, limit))
    }
}

/// Chunks a key range is about, and the most one segment holds read ahead.
pub const RANGE_CHUNKS: usize = 4;

/// Opens a reader: a new connection to the source, with the stream's settings.
pub type OpenReader = Arc<dyn Fn() -> Box<dyn ChunkReader> + Send + Sync>;

/// A key's text as the checkpoint keeps it (what a chunk resumes after).
pub(super) type KeyText = Vec<Option<String>>;

/// A key of integer columns, in a row's emitted values, compared in the index's
/// order (a descending column reversed). Only keys whose columns are all integers
/// and never NULL are cut into ranges: their order is the numbers', whatever the
/// collation.
#[derive(Debug, Clone)]
pub(super) struct IntegerKey {
    positions: Vec<usize>,
    descending: Vec<bool>,
}

impl IntegerKey {
    /// The key of `instance` when it can be cut; `positions` are the key columns'
    /// places among the emitted values.
    pub(super) fn of(instance: &CaptureInstance, positions: &[usize]) -> Option<Self> {
        let mut descending = Vec::with_capacity(positions.len());
        for name in &instance.key_columns {
            let column = instance.columns.iter().find(|c| &c.name == name)?;
            let integer = matches!(
                column.sql_type,
                Ok(SqlType::TinyInt | SqlType::SmallInt | SqlType::Int | SqlType::BigInt)
            );
            if !integer || column.nullable != Some(false) {
                return None;
            }
            descending.push(instance.descending_keys.contains(name));
        }
        (!positions.is_empty()).then(|| IntegerKey {
            positions: positions.to_vec(),
            descending,
        })
    }

    /// The key of `row`, or `None` where a value is not an integer.
    fn values(&self, row: &[Value]) -> Option<Vec<i64>> {
        self.positions
            .iter()
            .map(|&at| match row.get(at)? {
                Value::TinyInt(v) => Some(i64::from(*v)),
                Value::SmallInt(v) => Some(i64::from(*v)),
                Value::Int(v) => Some(i64::from(*v)),
                Value::BigInt(v) => Some(*v),
                _ => None,
            })
            .collect()
    }

    /// The key of a checkpoint's text, or `None` where it is not integers.
    fn parse(&self, text: &[Option<String>]) -> Option<Vec<i64>> {
        text.iter().map(|v| v.as_deref()?.parse().ok()).collect()
    }

    fn cmp(&self, a: &[i64], b: &[i64]) -> std::cmp::Ordering {
        for ((x, y), &down) in a.iter().zip(b).zip(&self.descending) {
            let ordering = if down { y.cmp(x) } else { x.cmp(y) };
            if ordering.is_ne() {
                return ordering;
            }
        }
        std::cmp::Ordering::Equal
    }

    fn text(&self, key: &[i64]) -> KeyText {
        key.iter().map(|v| Some(v.to_string())).collect()
    }

    /// Where to cut a table into at most `parts` ranges of about equal size, from
    /// rows sampled over it, after `after` (a resumed load's last key): the last
    /// keys of every range but the last, ascending in the index's order.
    pub(super) fn cuts(
        &self,
        sample: &[Vec<Value>],
        after: Option<&[Option<String>]>,
        parts: usize,
    ) -> Vec<Vec<i64>> {
        let after = match after {
            Some(text) => match self.parse(text) {
                Some(key) => Some(key),
                None => return Vec::new(),
            },
            None => None,
        };
        let mut keys: Vec<Vec<i64>> = sample
            .iter()
            .filter_map(|row| self.values(row))
            .filter(|k| after.as_ref().is_none_or(|a| self.cmp(k, a).is_gt()))
            .collect();
        keys.sort_by(|a, b| self.cmp(a, b));
        keys.dedup();
        let parts = parts.min(keys.len());
        if parts < 2 {
            return Vec::new();
        }
        (1..parts)
            .map(|i| keys[i * keys.len() / parts].clone())
            .collect()
    }
}

/// One key range of a table's load, or the whole of it.
struct Segment {
    instance: Arc<CaptureInstance>,
    /// The key it reads after (its table's first row without).
    after: Option<KeyText>,
    /// The key it ends with, inclusive (the end of the table without).
    through: Option<(IntegerKey, Vec<i64>)>,
    key_positions: Vec<usize>,
    reading: Option<Reading>,
}

/// A segment being read: its chunks as they come, and the task reading them, which
/// gives its connection back when it ends (taken back at once then: `None`).
struct Reading {
    chunks: mpsc::Receiver<Result<Vec<Vec<Value>>, SourceError>>,
    task: Option<JoinHandle<Box<dyn ChunkReader>>>,
}

/// One chunk to read of a table: after which key, and its key's places among the
/// emitted values (to tell the chunk's last key).
pub(super) struct ChunkJob<'a> {
    pub(super) instance: &'a CaptureInstance,
    pub(super) after: Option<&'a [Option<String>]>,
    pub(super) key_positions: &'a [usize],
}

/// A table the load is to read, as the runner plans it: the capture instance, its
/// key's places among the emitted values, its rows' estimate, and where its load
/// stands.
pub(super) struct PlannedTable {
    pub(super) instance: Arc<CaptureInstance>,
    pub(super) key_positions: Vec<usize>,
    pub(super) estimated: Option<u64>,
    pub(super) after: Option<KeyText>,
}

/// The load's readers: the plan of segments and the connections reading them.
pub(super) struct LoadReaders {
    /// `snapshot.max_connections`.
    connections: usize,
    /// Rows per chunk.
    chunk: usize,
    open: Option<OpenReader>,
    /// Connections open and not reading.
    idle: Vec<Box<dyn ChunkReader>>,
    /// Connections open in all (idle or reading).
    opened: usize,
    /// The segments not yet handed out, in the order they go out.
    segments: VecDeque<Segment>,
    /// The chunk after the last handed out, when it is of the same table.
    ahead: Option<Vec<Vec<Value>>>,
    /// The capture instance (as the plan read it) and key of the last row handed
    /// out: the next call is expected to continue from it, or the plan is made
    /// again.
    handed: Option<(Arc<CaptureInstance>, Option<KeyText>)>,
    /// Segments read so far (for tests and the log).
    started: u64,
}

impl LoadReaders {
    pub(super) fn new(connections: usize, chunk: usize) -> Self {
        LoadReaders {
            connections: connections.max(1),
            chunk: chunk.max(1),
            open: None,
            idle: Vec::new(),
            opened: 0,
            segments: VecDeque::new(),
            ahead: None,
            handed: None,
            started: 0,
        }
    }

    /// Where readers come from; without it (or with one connection) the load reads
    /// on the stream's own connection.
    pub(super) fn open_with(&mut self, open: OpenReader) {
        self.open = Some(open);
    }

    /// Whether loads are read ahead on connections of their own.
    pub(super) fn enabled(&self) -> bool {
        self.connections > 1 && self.open.is_some()
    }

    /// Tables a plan takes at once: each is one segment at least, and the first
    /// `2 × max_connections` segments are the ones read ahead.
    pub(super) fn tables_at_once(&self) -> usize {
        2 * self.connections
    }

    /// Tables whose re-snapshot chunks are read at once: one per connection, or one
    /// on the stream's own.
    pub(super) fn resnapshot_tables_at_once(&self) -> usize {
        if self.enabled() { self.connections } else { 1 }
    }

    /// The next chunk of each job, read at once, each on a connection of its own,
    /// and whether it ends its table. A seek that does not move past its key is an
    /// error, not a loop.
    pub(super) async fn read_chunks_at_once(
        &mut self,
        jobs: &[ChunkJob<'_>],
    ) -> Result<Vec<(Vec<Vec<Value>>, bool)>, SourceError> {
        let Some(open) = self.open.clone() else {
            return Err(SourceError::definite(
                "the re-snapshot's readers have no connections (a defect)",
            ));
        };
        let mut readers = Vec::with_capacity(jobs.len());
        for _ in jobs {
            readers.push(match self.idle.pop() {
                Some(reader) => reader,
                None => {
                    self.opened += 1;
                    open()
                }
            });
        }
        let chunk = self.chunk;
        let reads = readers
            .iter_mut()
            .zip(jobs)
            .map(|(reader, job)| reader.read(job.instance, job.after, chunk + 1));
        let read = futures_util::future::join_all(reads).await;
        self.idle.extend(readers);
        let mut chunks = Vec::with_capacity(jobs.len());
        for (
            rows,
            ChunkJob {
                instance,
                after,
                key_positions,
            },
        ) in read.into_iter().zip(jobs)
        {
            let mut rows = rows?;
            // One row more than a chunk: whether it comes tells if this one ends.
            let done = rows.len() <= chunk;
            rows.truncate(chunk);
            let last: Option<KeyText> = rows.last().map(|row| key_text(row, key_positions));
            if !done && last.as_deref() == *after {
                return Err(SourceError::Malformed {
                    capture_instance: instance.name.clone(),
                    message: format!(
                        "the re-snapshot of {} does not move past a key: the server's seek after it returns rows already read",
                        instance.qualified_table()
                    ),
                });
            }
            chunks.push((rows, done));
        }
        Ok(chunks)
    }

    /// Connections open (reading or idle).
    pub(super) fn open_connections(&self) -> usize {
        self.opened
    }

    /// Segments whose reading started, since the runner began.
    pub(super) fn segments_started(&self) -> u64 {
        self.started
    }

    /// Whether the next chunk of `instance`'s load, which stands after `after`,
    /// comes from the plan as it is: the last handed out was of that load, read
    /// with the instance as it is now (a catalog change since, such as a column
    /// added, is read again with the new columns), and ended there.
    pub(super) fn continues(&self, instance: &CaptureInstance, after: Option<&KeyText>) -> bool {
        match &self.handed {
            Some((handed, last)) => **handed == *instance && last.as_ref() == after,
            None => self.segments.front().is_some_and(|s| {
                *s.instance == *instance && s.after.as_ref() == after && self.ahead.is_none()
            }),
        }
    }

    /// Stops every reader and forgets the plan (a poll failed, or the loads are not
    /// where the plan expects them).
    pub(super) fn discard(&mut self) {
        for segment in self.segments.drain(..) {
            if let Some(task) = segment.reading.and_then(|r| r.task) {
                task.abort();
                self.opened -= 1;
            }
        }
        self.ahead = None;
        self.handed = None;
    }

    /// Every load is done: the plan is forgotten and the connections closed.
    pub(super) fn close(&mut self) {
        self.discard();
        self.opened -= self.idle.len();
        self.idle.clear();
    }

    /// Plans the segments of `tables`, in the order they go out, sampling the keys
    /// of those worth cutting on `source` (the stream's own connection).
    pub(super) async fn plan(
        &mut self,
        source: &mut impl TableReads,
        tables: Vec<PlannedTable>,
    ) -> Result<(), SourceError> {
        self.discard();
        let table_count = tables.len();
        for table in tables {
            let whole = Segment {
                instance: Arc::clone(&table.instance),
                after: table.after.clone(),
                through: None,
                key_positions: table.key_positions.clone(),
                reading: None,
            };
            // Ranges of about RANGE_CHUNKS chunks (as many as the sample allows); a
            // table of unknown size in one range per connection.
            let range = (RANGE_CHUNKS * self.chunk) as u64;
            let parts = table.estimated.map_or(self.connections, |rows| {
                usize::try_from(rows / range).unwrap_or(usize::MAX)
            });
            let key = IntegerKey::of(&table.instance, &table.key_positions);
            let cuts = match key {
                Some(key) if parts >= 2 => {
                    let sample = source.sample_rows(&table.instance).await?;
                    let cuts = key.cuts(&sample, table.after.as_deref(), parts);
                    cuts.into_iter().map(|c| (key.clone(), c)).collect()
                }
                _ => Vec::new(),
            };
            if cuts.is_empty() {
                self.segments.push_back(whole);
                continue;
            }
            let mut after = table.after.clone();
            for cut in cuts.into_iter().map(Some).chain([None]) {
                let next_after = cut.as_ref().map(|(key, c)| key.text(c));
                self.segments.push_back(Segment {
                    instance: Arc::clone(&table.instance),
                    after: after.take(),
                    through: cut,
                    key_positions: table.key_positions.clone(),
                    reading: None,
                });
                after = next_after;
            }
        }
        tracing::info!(
            tables = table_count,
            ranges = self.segments.len(),
            connections = self.connections,
            "the load reads ahead on connections of its own (snapshot.max_connections): tables and key ranges in the order they are sent"
        );
        Ok(())
    }

    /// Takes back the connections of segments read to their end, and starts reading
    /// the next of the first `2 × max_connections` segments, up to
    /// `max_connections` at once.
    fn start(&mut self) {
        let Some(open) = self.open.clone() else {
            return;
        };
        let connections = self.connections;
        let chunk = self.chunk;
        let mut running = 0;
        for segment in self.segments.iter_mut().take(2 * connections) {
            let Some(reading) = segment.reading.as_mut() else {
                continue;
            };
            if let Some(task) = reading.task.as_mut() {
                if !task.is_finished() {
                    running += 1;
                    continue;
                }
                match futures_util::FutureExt::now_or_never(task) {
                    Some(Ok(reader)) => self.idle.push(reader),
                    // A reader that panicked: its chunks end short, and the
                    // segment's error (a closed channel before its end) is its.
                    _ => self.opened -= 1,
                }
                reading.task = None;
            }
        }
        for segment in self.segments.iter_mut().take(2 * connections) {
            if running == connections {
                break;
            }
            if segment.reading.is_some() {
                continue;
            }
            running += 1;
            let reader = match self.idle.pop() {
                Some(reader) => reader,
                None => {
                    self.opened += 1;
                    open()
                }
            };
            let (tx, chunks) = mpsc::channel(RANGE_CHUNKS);
            let task = tokio::spawn(read_segment(
                reader,
                Arc::clone(&segment.instance),
                segment.after.clone(),
                segment.through.clone(),
                segment.key_positions.clone(),
                chunk,
                tx,
            ));
            self.started += 1;
            segment.reading = Some(Reading {
                chunks,
                task: Some(task),
            });
        }
    }

    /// The next chunk of `name`'s table from its segments, in order; `None` once
    /// they are all read.
    async fn next_of(&mut self, name: &str) -> Result<Option<Vec<Vec<Value>>>, SourceError> {
        loop {
            self.start();
            let Some(front) = self.segments.front_mut() else {
                return Ok(None);
            };
            if front.instance.name != name {
                return Ok(None);
            }
            let Some(reading) = front.reading.as_mut() else {
                // `start` reads the first segment whenever there is one.
                return Ok(None);
            };
            match reading.chunks.recv().await {
                Some(Ok(rows)) => return Ok(Some(rows)),
                Some(Err(e)) => {
                    self.discard();
                    return Err(e);
                }
                None => {
                    let Some(Segment {
                        reading: Some(done),
                        ..
                    }) = self.segments.pop_front()
                    else {
                        continue;
                    };
                    let Some(task) = done.task else {
                        // Its connection was taken back when it ended.
                        continue;
                    };
                    match task.await {
                        Ok(reader) => self.idle.push(reader),
                        Err(e) => {
                            self.opened -= 1;
                            self.discard();
                            return Err(SourceError::transient(format!(
                                "a load reader's task ended: {e}"
                            )));
                        }
                    }
                }
            }
        }
    }

    /// The next chunk of `instance`'s load, and whether it ends the table;
    /// `key_positions` are its key's places among the emitted values.
    pub(super) async fn next_chunk(
        &mut self,
        instance: &CaptureInstance,
        key_positions: &[usize],
    ) -> Result<(Vec<Vec<Value>>, bool), SourceError> {
        let name = instance.name.as_str();
        let planned = match (&self.handed, self.segments.front()) {
            (Some((handed, _)), _) => Arc::clone(handed),
            (None, Some(front)) => Arc::clone(&front.instance),
            (None, None) => Arc::new(instance.clone()),
        };
        let current = match self.ahead.take() {
            Some(rows) => rows,
            None => self.next_of(name).await?.unwrap_or_default(),
        };
        let following = if current.is_empty() {
            None
        } else {
            self.next_of(name).await?
        };
        let done = following.is_none();
        self.ahead = following;
        let last: Option<KeyText> = current.last().map(|row| key_text(row, key_positions));
        self.handed = (!done).then_some((planned, last));
        Ok((current, done))
    }
}

/// Reads one segment: chunks after its first key, each sent as soon as read (one
/// waits in the channel at most), until the end of the table or past its last key.
/// Gives the connection back.
async fn read_segment(
    mut reader: Box<dyn ChunkReader>,
    instance: Arc<CaptureInstance>,
    mut after: Option<KeyText>,
    through: Option<(IntegerKey, Vec<i64>)>,
    key_positions: Vec<usize>,
    chunk: usize,
    tx: mpsc::Sender<Result<Vec<Vec<Value>>, SourceError>>,
) -> Box<dyn ChunkReader> {
    loop {
        let read = reader.read(&instance, after.as_deref(), chunk).await;
        let mut rows = match read {
            Ok(rows) => rows,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return reader;
            }
        };
        let mut last = rows.len() < chunk;
        if let Some((key, end)) = &through
            && let Some(past) = rows
                .iter()
                .position(|row| key.values(row).is_some_and(|k| key.cmp(&k, end).is_gt()))
        {
            rows.truncate(past);
            last = true;
        }
        let next: Option<KeyText> = rows.last().map(|row| key_text(row, &key_positions));
        if !last && next == after {
            let _ = tx
                .send(Err(SourceError::Malformed {
                    capture_instance: instance.name.clone(),
                    message: format!(
                        "the load of {} does not move past a key: the server's seek after it returns rows already read",
                        instance.qualified_table()
                    ),
                }))
                .await;
            return reader;
        }
        if !rows.is_empty() && tx.send(Ok(rows)).await.is_err() {
            return reader;
        }
        if last {
            return reader;
        }
        after = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(descending: &[bool]) -> IntegerKey {
        IntegerKey {
            positions: (0..descending.len()).collect(),
            descending: descending.to_vec(),
        }
    }

    fn rows(keys: impl IntoIterator<Item = i32>) -> Vec<Vec<Value>> {
        keys.into_iter().map(|k| vec![Value::Int(k)]).collect()
    }

    fn text(k: i64) -> KeyText {
        vec![Some(k.to_string())]
    }

    #[test]
    fn a_sample_cuts_the_table_into_ranges_of_equal_size_in_index_order() {
        // Sampled out of order, with a repeat: sorted and counted once.
        let mut sample = rows((1..=100).rev());
        sample.push(vec![Value::Int(50)]);
        let ascending = key(&[false]);
        assert_eq!(
            ascending.cuts(&sample, None, 4),
            [vec![26], vec![51], vec![76]]
        );
        let descending = key(&[true]);
        assert_eq!(
            descending.cuts(&sample, None, 4),
            [vec![75], vec![50], vec![25]]
        );
        // Never more ranges than keys sampled; one range is no cut.
        assert_eq!(ascending.cuts(&rows([5, 9]), None, 10), [vec![9]]);
        assert!(ascending.cuts(&sample, None, 1).is_empty());
        assert!(ascending.cuts(&rows([5]), None, 4).is_empty());
    }

    #[test]
    fn a_resumed_load_is_cut_after_its_last_key_only() {
        let sample = rows(1..=100);
        let ascending = key(&[false]);
        assert_eq!(ascending.cuts(&sample, Some(&text(50)), 2), [vec![76]]);
        assert_eq!(key(&[true]).cuts(&sample, Some(&text(50)), 2), [vec![25]]);
        // A last key that is not integers (cannot be): no cut.
        assert!(
            ascending
                .cuts(&sample, Some(&[Some("x".into())]), 2)
                .is_empty()
        );
    }

    #[test]
    fn every_integer_type_is_a_key_value_and_nothing_else_is() {
        let four = key(&[false, false, false, false]);
        let row = |t: u8| {
            vec![
                Value::TinyInt(t),
                Value::SmallInt(-2),
                Value::Int(3),
                Value::BigInt(i64::MAX),
            ]
        };
        assert_eq!(four.values(&row(1)), Some(vec![1, -2, 3, i64::MAX]));
        assert_eq!(
            four.cuts(&[row(1), row(2), row(3)], None, 3),
            [vec![2, -2, 3, i64::MAX], vec![3, -2, 3, i64::MAX]]
        );
        let one = key(&[false]);
        for other in [
            Value::Null,
            Value::Text("1".into()),
            Value::Bit(true),
            Value::Decimal {
                unscaled: 1,
                scale: 0,
            },
        ] {
            assert_eq!(one.values(&[other]), None);
        }
    }

    #[test]
    fn a_key_of_several_columns_compares_column_by_column() {
        let tenant_id = key(&[false, true]);
        let sample: Vec<Vec<Value>> = [(1, 9), (1, 3), (2, 7), (2, 1), (3, 5), (1, 5)]
            .iter()
            .map(|&(t, i)| vec![Value::SmallInt(t), Value::BigInt(i)])
            .collect();
        // In index order: (1,9) (1,5) (1,3) (2,7) (2,1) (3,5).
        assert_eq!(tenant_id.cuts(&sample, None, 3), [vec![1, 3], vec![2, 1]]);
        // A sampled row whose key is not integers (a NULL) is passed over.
        let mut with_null = sample.clone();
        with_null.push(vec![Value::Null, Value::BigInt(1)]);
        assert_eq!(
            tenant_id.cuts(&with_null, None, 3),
            tenant_id.cuts(&sample, None, 3)
        );
    }
}

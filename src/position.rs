//! Where a stream stands: the content of a checkpoint.
//!
//! A [`Position`] is a place where every earlier event has been emitted: per capture
//! instance the LSN through which it is complete (always a transaction boundary), the
//! last event emitted, the switches between capture instances of one table, the
//! initial loads not yet finished and the file sink's durable length. The poller
//! produces positions and the checkpoint stores keep them; neither owns the format,
//! so both depend on this module and it depends on nothing but [`crate::lsn`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::lsn::Lsn;

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

/// Debezium format with transaction metadata: the counts of a transaction still
/// open at a batch's end, kept in the checkpoint so that a restart inside a large
/// transaction numbers its events on and writes its `END` whole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenTransaction {
    pub commit_lsn: Lsn,
    pub total: u64,
    /// `db.schema.table` and its events so far, in first-seen order.
    pub tables: Vec<(String, u64)>,
}

/// Where a stream stands; what a checkpoint stores.
///
/// Unknown fields are refused: a field this release does not know belongs to a newer
/// format, whose version number says so first (see `checkpoint::CHECKPOINT_VERSION`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// File sink: which file `sink_length` is the length of. A start checks that
    /// `sink.path` is that file before it cuts anything. Absent in checkpoints
    /// written before it (format 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_file: Option<Box<SinkFile>>,
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
    /// Per capture instance: its table's re-snapshot (`mssql-ces snapshot`) that has
    /// not finished. Changes are read meanwhile. Absent in checkpoints written
    /// before it (format 6).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resnapshots: BTreeMap<String, Resnapshot>,
    /// The [`TableLoad::logical_base`] the next table load takes: every load of the
    /// stream's life gets a range of its own, so loaded rows of different tables at
    /// one LSN never share a `logicalid`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_load_base: u64,
    /// The latest commit instant read (UTC nanoseconds since 1970), in LSN order: it
    /// decides whether a local commit time in an hour the clocks repeat is its first
    /// or its second occurrence (`source::timezone::CommitClock`), so a restart reads
    /// the commits after here as the run before it did. Absent in checkpoints
    /// written before it (format 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_clock_ns: Option<i64>,
    /// Per table (`schema.table`): the version of the shape its events carry and a
    /// fingerprint of that shape (`source::shape`), so a restart numbers shape
    /// changes as the run before it did. Absent in checkpoints written before it
    /// (format 4).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub table_versions: BTreeMap<String, TableVersion>,
    /// Debezium format: the transaction open at this position, if any (written by
    /// the encoder, not the source). Absent in checkpoints written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_transaction: Option<OpenTransaction>,
}

/// A table's shape version: 1 for the first shape its events carried, one more for
/// each change since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableVersion {
    pub version: u64,
    pub shape: Uuid,
    /// The commit LSN of the first event of this version: DDL recorded after it
    /// belongs to the next version. Absent in checkpoints written before it
    /// (format 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Lsn>,
    /// The shape itself, as the schema-change event of this version described it:
    /// the next version's event names it as the shape before, the same after a
    /// restart as in the run that saw it. Absent in checkpoints written before it
    /// (format 5). Shared, so a position copied for every batch does not copy it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<std::sync::Arc<TableShape>>,
}

/// What a consumer needs to read a table's events: the capture instance they come
/// from and the columns they carry (CES's `cols`, with nullability and key place).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableShape {
    #[serde(rename = "captureinstance")]
    pub capture_instance: String,
    pub cols: Vec<ShapeColumn>,
}

/// One column of a [`TableShape`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapeColumn {
    pub name: String,
    /// As CES's `cols[].type` writes it (`nvarchar(50)`).
    #[serde(rename = "type")]
    pub sql_type: String,
    /// 0-based position in the source table (`cols[].index`).
    pub index: u32,
    /// Whether the source table's column allows NULL (`sys.columns.is_nullable`);
    /// `None` where the catalog cannot tell.
    pub nullable: Option<bool>,
    /// 1-based place in the key CDC identifies rows by; `None` outside it.
    #[serde(rename = "keyposition")]
    pub key_position: Option<u32>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The output file a checkpoint's `sink_length` belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkFile {
    /// `sink.path` as the writing process resolved it (absolute).
    pub path: String,
    /// The CloudEvent `id` of the line that ends at `sink_length` (`None` for an
    /// empty file): a standby that shares the file sees that line there; another
    /// file does not hold it there.
    pub last_id: Option<Uuid>,
}

/// Rows one table load may number in its own `logicalid` range.
pub const LOAD_ROWS_PER_RANGE: u64 = 1 << 40;

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
    /// The database's GUID: its availability group's `group_database_id` where it
    /// is in one, else its own.
    pub database_guid: Option<Uuid>,
    /// The replica's own `database_guid` (the same as `database_guid` outside an
    /// availability group). Absent in checkpoints written before it (format 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_database_guid: Option<Uuid>,
    pub stream_guid: Uuid,
}

impl SourceIdentity {
    /// Whether a position recorded as `self` may be resumed on `now`: the same
    /// database and stream GUID (the server's name may change in a failover). The
    /// database is the same when one GUID it was known by is one it is known by
    /// now: joining an availability group adds the group's GUID, a failover keeps
    /// the group's and brings another replica's own, leaving the group keeps the
    /// replica's own; a restored copy shares none.
    pub fn same_stream(&self, now: &SourceIdentity) -> bool {
        let known: Vec<Uuid> = [self.database_guid, self.local_database_guid]
            .into_iter()
            .flatten()
            .collect();
        let seen: Vec<Uuid> = [now.database_guid, now.local_database_guid]
            .into_iter()
            .flatten()
            .collect();
        self.database == now.database
            && self.stream_guid == now.stream_guid
            && (known.is_empty() || seen.is_empty() || known.iter().any(|g| seen.contains(g)))
    }

    /// The stream GUID a run uses: `event.stream_guid` when set; else the one the
    /// checkpoint recorded, so that a database joining or leaving an availability
    /// group (whose default GUID then changes) keeps every event id; else the
    /// database's GUID.
    pub fn stream_guid_for(
        recorded: Option<&SourceIdentity>,
        configured: Option<Uuid>,
        database: Option<Uuid>,
    ) -> Option<Uuid> {
        configured.or(recorded.map(|r| r.stream_guid)).or(database)
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

/// A table read again while its changes stream on, as the checkpoint records it:
/// a [`TableLoad`] at the LSN it was asked at, and its progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resnapshot {
    #[serde(flatten)]
    pub load: TableLoad,
    /// Chunks sent so far.
    pub chunks: u64,
    /// Rows read but not sent, because a change of the same key streamed while
    /// their chunk waited for its window to close.
    pub superseded: u64,
}

/// A table's load that has not finished, as the checkpoint records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableLoad {
    /// `schema.table`, for logs.
    pub table: String,
    /// L0: the LSN the load stands at; the table's changes stream from after it.
    pub at: Lsn,
    /// `committime` of every loaded row: the commit time of `at` in UTC, in
    /// nanoseconds since 1970 (recorded once, so a resumed load prints the same).
    pub commit_time_ns: i64,
    /// The key of the last row sent, as text forms in key order; `None` before the
    /// first chunk (and always for a table without a key, which restarts its pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Vec<Option<String>>>,
    /// Rows sent so far: the last one's `sequencenumber`.
    pub rows: u64,
    /// Where this load's rows number their `logicalid`s: row n (its `sequencenumber`,
    /// counting the table's rows) has `logical_base + n`. Distinct for every load of
    /// the stream ([`Position::next_load_base`]); 0 in checkpoints written before it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub logical_base: u64,
}

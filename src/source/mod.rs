//! The SQL Server side: what the poll loop needs from a CDC database.
//!
//! [`ChangeSource`] is the seam between the poll loop ([`poller`]) and a database,
//! made of one trait per kind of caller ([`seam`]). [`sqlserver::SqlServerSource`]
//! talks to a real SQL Server over TDS (tiberius); [`synthetic`] is the deterministic
//! workload a user runs without one; the tests put an in-memory simulator of SQL
//! Server's documented CDC behaviour behind it (the `cdc-sim` crate). Neither the
//! poll loop nor the merge knows which is behind the seam.
//!
//! CDC facts honoured here (`docs/src/sql-server.md` states them): rows of a capture instance are read from its
//! change table `cdc.<ci>_CT` in (`__$start_lsn`, `__$command_id`, `__$seqval`,
//! `__$operation`) order ([`RowKey`]); `__$start_lsn` is the commit LSN, shared by every
//! row of a transaction; op 3 (before image) is immediately followed by its op 4.

pub mod capture_ddl;
pub mod catalog;
pub mod decode;
pub mod diagnostics;
pub mod facts;
pub mod filter;
pub mod initial_load;
pub mod merge;
pub mod poller;
pub mod queries;
pub mod seam;
pub mod server;
pub mod shape;
pub mod sqlserver;
pub mod synthetic;
pub mod timezone;

use chrono::NaiveDateTime;
use uuid::Uuid;

use crate::event::Value;
use crate::event::value::{SqlType, TypeError};
use crate::lsn::Lsn;
use crate::mssql::SqlErrorKind;
pub use crate::source::facts::{
    AZURE_SQL_DATABASE_EDITION, AZURE_SQL_MANAGED_INSTANCE_EDITION, CaptureSettings, CdcJob, Fact,
    LogScan, ServerFacts,
};
pub use crate::source::seam::{
    CaptureDdl, CdcReads, ChangeSource, FactReads, SourceClock, TableCursor, TableReads,
};
pub use crate::source::timezone::ServerOffsets;

/// CDC's `__$operation` codes.
pub mod op {
    pub const DELETE: u8 = 1;
    pub const INSERT: u8 = 2;
    pub const UPDATE_BEFORE: u8 = 3;
    pub const UPDATE_AFTER: u8 = 4;
}

/// The position of a change row: its sort key within a capture instance, and the
/// keyset that pages resume after. The derived `Ord` is the CDC order because the
/// fields are declared in (`__$start_lsn`, `__$command_id`, `__$seqval`,
/// `__$operation`) order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowKey {
    pub start_lsn: Lsn,
    pub command_id: i32,
    pub seqval: Lsn,
    pub operation: u8,
}

/// `__$start_lsn …, __$command_id …, __$seqval …, __$operation …`, as an operator
/// finds the row in the change table.
impl std::fmt::Display for RowKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "__$start_lsn {}, __$command_id {}, __$seqval {}, __$operation {}",
            self.start_lsn, self.command_id, self.seqval, self.operation
        )
    }
}

impl RowKey {
    /// A key after every row whose `__$start_lsn` is at most `lsn`: reading after it
    /// yields the rows of later transactions only.
    pub fn after_lsn(lsn: Lsn) -> Self {
        RowKey {
            start_lsn: lsn,
            command_id: i32::MAX,
            seqval: Lsn::MAX,
            operation: u8::MAX,
        }
    }
}

/// A server-local commit time and, where the server names its zone, the offsets it
/// gives that time (see [`ServerOffsets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitTime {
    pub local: NaiveDateTime,
    pub offsets: Option<ServerOffsets>,
}

/// One row of a change table, with the columns the events carry.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeRow {
    pub key: RowKey,
    /// `__$update_mask`: bit `n - 1` (counting from the least significant bit of the
    /// last byte) is set when the column with `column_ordinal` `n` changed.
    pub update_mask: Vec<u8>,
    /// `tran_begin_lsn` from `cdc.lsn_time_mapping`.
    pub begin_lsn: Lsn,
    /// `tran_end_time` from `cdc.lsn_time_mapping`: server-local commit time.
    pub end_time: NaiveDateTime,
    /// The server's UTC offsets at `end_time` and an hour later, from its own time
    /// zone (`AT TIME ZONE CURRENT_TIMEZONE_ID()`), when the server can tell.
    pub end_time_offsets: Option<ServerOffsets>,
    /// One value per emitted column of the capture instance, in column order.
    pub values: Vec<Value>,
}

impl ChangeRow {
    pub fn operation(&self) -> u8 {
        self.key.operation
    }
}

/// Whether `__$update_mask` marks the column with CDC ordinal `ordinal` (1-based) as
/// changed, as `sys.fn_cdc_is_bit_set` reads it.
pub fn is_bit_set(update_mask: &[u8], ordinal: u32) -> bool {
    if ordinal == 0 {
        return false;
    }
    let bit = (ordinal - 1) as usize;
    let from_end = bit / 8;
    if from_end >= update_mask.len() {
        return false;
    }
    let byte = update_mask[update_mask.len() - 1 - from_end];
    byte & (1 << (bit % 8)) != 0
}

/// `__$update_mask` of a table of `columns` captured columns with the columns of
/// ordinals `set` (1-based) marked: bit `ordinal - 1`, counted from the least
/// significant bit of the last byte, in as many bytes as the columns need.
pub fn update_mask(columns: usize, set: impl IntoIterator<Item = usize>) -> Vec<u8> {
    let bytes = columns.div_ceil(8).max(1);
    let mut mask = vec![0u8; bytes];
    for ordinal in set {
        if let Some(bit) = ordinal.checked_sub(1)
            && bit / 8 < bytes
        {
            mask[bytes - 1 - bit / 8] |= 1 << (bit % 8);
        }
    }
    mask
}

/// A captured column of a capture instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedColumn {
    pub name: String,
    /// `cdc.captured_columns.column_ordinal`: 1-based, the bit in `__$update_mask`.
    pub ordinal: u32,
    /// 0-based position of the column in the source table (`cols[].index`); `None`
    /// when the column was dropped from the source table (`ALTER TABLE … DROP
    /// COLUMN`): the change table keeps it, NULL from then on ([`Self::dropped`]).
    pub table_index: Option<u32>,
    /// A column dropped from the source table whose values the change table keeps
    /// for the rows committed before the drop: events of those rows carry it.
    pub dropped: Option<DroppedColumn>,
    /// The type of the change table's column — the type its values have — or why
    /// CES does not stream it.
    pub sql_type: Result<SqlType, TypeError>,
    /// A computed column of the source table (`cdc.captured_columns.is_computed`):
    /// CDC records it as NULL in every change row, whatever its value ("Computed
    /// columns that are included in a capture instance always have a value of
    /// NULL", Learn: What is change data capture), so events leave it out — of the
    /// load too, which would otherwise send a value the first change takes back.
    pub computed: bool,
    /// Whether the source table's column allows NULL (`sys.columns.is_nullable`);
    /// `None` once the column was dropped from the table, or where the catalog
    /// cannot tell. Only schema-change events say it.
    pub nullable: Option<bool>,
    /// The source column's default as the catalog keeps its text
    /// (`sys.default_constraints.definition`: `((0))`, `(N'new')`, `(getdate())`);
    /// `None` without one, once the column was dropped, or where the login may not
    /// see definitions. Only Debezium's schemas say it.
    pub default: Option<String>,
}

/// Where a captured column dropped from the source table stood, and when it went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DroppedColumn {
    /// How many of the source table's columns now come before it (by
    /// `column_id`): its position before the drop, less the other captured columns
    /// before it that were dropped since.
    pub columns_before: u32,
    /// The LSN of its `DROP COLUMN` in `cdc.ddl_history`: rows committed before it
    /// hold its values. `None` until the capture job has recorded the drop (it has
    /// then scanned no row after it: every row it wrote holds the column).
    pub at: Option<Lsn>,
}

/// A CDC capture instance and its source table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureInstance {
    pub name: String,
    pub schema: String,
    pub table: String,
    /// `cdc.change_tables.object_id`: the change table. A capture instance disabled
    /// and enabled again under the same name has a new one.
    pub object_id: i32,
    /// `cdc.change_tables.start_lsn`: changes at or after it are in this instance.
    /// `None` until the capture job's first scan after `sp_cdc_enable_table` sets it
    /// ("the low endpoint has not been established"): such an instance is *pending*.
    pub start_lsn: Option<Lsn>,
    /// `cdc.change_tables.create_date`.
    pub create_date: NaiveDateTime,
    /// Every captured column, in `column_ordinal` order.
    pub columns: Vec<CapturedColumn>,
    /// Whether the change table has `__$command_id` (SQL Server builds before it
    /// cannot order the statements of a transaction correctly).
    pub has_command_id: bool,
    /// Names of the key columns in key order, as CDC chose them
    /// (`cdc.index_columns`: the `@index_name` the table was enabled with, else the
    /// primary key); empty when neither exists.
    pub key_columns: Vec<String>,
    /// The key columns the index sorts descending (`sys.index_columns.
    /// is_descending_key`): a load reads in the index's order, or the server would
    /// sort what is left of the table for every chunk.
    pub descending_keys: Vec<String>,
    /// What `sys.sp_cdc_enable_table` was given (`cdc.change_tables`).
    pub options: CaptureOptions,
}

/// The options a capture instance was enabled with, from `cdc.change_tables`: what
/// an error names (the gating role) and what a new instance of the table would be
/// enabled with again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureOptions {
    /// `@role_name`: the gating role whose members may read the changes; `None`
    /// when the instance has none.
    pub role_name: Option<String>,
    /// `@index_name`: the unique index that identifies rows; `None` for the primary
    /// key.
    pub index_name: Option<String>,
    /// `@filegroup_name`: where the change table lives; `None` for the default.
    pub filegroup_name: Option<String>,
    /// `@supports_net_changes`.
    pub supports_net_changes: bool,
    /// `@allow_partition_switch` (`cdc.change_tables.partition_switch`); `None`
    /// where not known, for SQL Server's default (allowed).
    pub allow_partition_switch: Option<bool>,
}

impl CaptureInstance {
    /// `schema.table`.
    pub fn qualified_table(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }

    /// The columns CES streams, in column order, with their type and position in the
    /// source table: those of a streamed type that the source table still has.
    pub fn emitted_columns(&self) -> impl Iterator<Item = EmittedColumn<'_>> {
        self.columns.iter().filter(|c| !c.computed).filter_map(|c| {
            match (&c.sql_type, c.table_index) {
                (Ok(sql_type), Some(table_index)) => Some(EmittedColumn {
                    column: c,
                    sql_type: *sql_type,
                    table_index,
                }),
                _ => None,
            }
        })
    }
}

impl CaptureInstance {
    /// The columns the change query reads, in column order: the emitted ones and
    /// the captured columns of a streamed type dropped from the source table since,
    /// whose values the change table keeps for the rows committed before the drop
    /// (a dropped column's `table_index` here is where it stood). Change rows'
    /// values follow this order.
    pub fn change_columns(&self) -> impl Iterator<Item = EmittedColumn<'_>> {
        self.columns.iter().filter(|c| !c.computed).filter_map(|c| {
            let table_index = c
                .table_index
                .or_else(|| c.dropped.map(|d| d.columns_before))?;
            let sql_type = *c.sql_type.as_ref().ok()?;
            Some(EmittedColumn {
                column: c,
                sql_type,
                table_index,
            })
        })
    }
}

/// A column that events carry.
#[derive(Debug, Clone, Copy)]
pub struct EmittedColumn<'a> {
    pub column: &'a CapturedColumn,
    pub sql_type: SqlType,
    /// 0-based position in the source table.
    pub table_index: u32,
}

impl EmittedColumn<'_> {
    pub fn name(&self) -> &str {
        &self.column.name
    }
}

/// Everything the poll loop knows about the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    /// `@@SERVERNAME`.
    pub server: String,
    pub database: String,
    /// The database's GUID (the default stream GUID): in an availability group the
    /// group's, which every replica shares; `None` when this login cannot read it.
    pub database_guid: Option<Uuid>,
    /// The replica's own database GUID (`sys.database_recovery_status`), which
    /// differs from `database_guid` in an availability group.
    pub local_database_guid: Option<Uuid>,
    /// The server's UTC offset in minutes, as it reports it now.
    pub server_utc_offset_minutes: i32,
    /// The server's time zone (`CURRENT_TIMEZONE_ID()`), when it can tell; change
    /// rows then carry the offset in force at their own commit time.
    pub server_time_zone: Option<String>,
    /// What [`CdcReads::max_lsn`] reports for this state of the CDC catalog.
    pub version: CatalogVersion,
    /// Capture instances whose source table this login cannot see
    /// (`OBJECT_NAME(source_object_id)` is NULL).
    pub invisible: Vec<String>,
    pub instances: Vec<CaptureInstance>,
}

impl Catalog {
    /// How commit times are read on this server under `setting`: per row where the
    /// server names its zone; `"server"` refused where it cannot.
    pub fn commit_time_zone(
        &self,
        setting: &timezone::TimeZoneSetting,
    ) -> Result<timezone::CommitTimeZone, timezone::UnknownServerZone> {
        setting.resolve(
            self.server_utc_offset_minutes,
            self.server_time_zone.is_some(),
        )
    }
}

/// A fingerprint of the CDC catalog (`cdc.change_tables` and `cdc.ddl_history`):
/// it changes when a capture instance is enabled, disabled or re-created, when a
/// `start_lsn` is set or moved, and when the capture job records DDL.
pub type CatalogVersion = i64;

/// What [`CdcReads::max_lsn`] answers, in one round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxLsn {
    /// `sys.fn_cdc_get_max_lsn()`; `None` when it is NULL or zero (CDC has not
    /// recorded anything yet).
    pub lsn: Option<Lsn>,
    /// The catalog's fingerprint now: the catalog is re-read when it differs.
    pub catalog_version: CatalogVersion,
}

/// What one probe asks about a capture instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub capture_instance: String,
    /// Changes strictly after this LSN are of interest.
    pub after: Lsn,
}

/// What a probe answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    pub capture_instance: String,
    /// `sys.fn_cdc_get_min_lsn`: `None` when it is NULL or zero (not available yet).
    pub min_lsn: Option<Lsn>,
    /// The first `__$start_lsn` in (`after`, `to`], if any.
    pub next_change: Option<Lsn>,
}

/// What [`cleanup_change_table`](CaptureDdl::cleanup_change_table) did: the
/// low-water mark it took (`None`: no commit at or below the one asked for), and the
/// instance's low end (`min_lsn`) after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cleaned {
    pub low_water_mark: Option<Lsn>,
    pub min_lsn: Option<Lsn>,
}

/// What `sys.sp_cdc_enable_table` is asked to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnableCapture {
    pub schema: String,
    pub table: String,
    /// `@capture_instance`.
    pub capture_instance: String,
    /// `@role_name`, `@index_name`, `@filegroup_name`, `@supports_net_changes`,
    /// `@allow_partition_switch`.
    pub options: CaptureOptions,
    /// `@captured_column_list`: the columns to capture; `None` for every column.
    pub columns: Option<Vec<String>>,
}

/// The columns of source tables their capture instances do not capture, as one
/// read of the catalog found them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UncapturedColumns {
    /// `(capture instance, column)`, in column order.
    pub columns: Vec<(String, String)>,
    /// The server's local time at the read (`None` when no column was found).
    pub read_at: Option<chrono::NaiveDateTime>,
    /// The commit time of the last transaction the capture job had scanned then
    /// (`sys.fn_cdc_get_max_lsn()`'s): `cdc.ddl_history` holds every DDL committed
    /// before it. `None` when no column was found or nothing is scanned yet.
    pub scanned_through: Option<chrono::NaiveDateTime>,
}

/// A table CDC does not capture yet (`sys.tables.is_tracked_by_cdc = 0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UncapturedTable {
    pub schema: String,
    pub table: String,
}

/// A schema change recorded in `cdc.ddl_history`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdlEvent {
    pub capture_instance: String,
    pub ddl_lsn: Lsn,
    /// Server-local, as `cdc.ddl_history` keeps it.
    pub ddl_time: NaiveDateTime,
    /// The offsets the server's zone gives `ddl_time`, where the server names its
    /// zone (computed on the server, as a commit time's are): a DDL's time is then
    /// read in the offset in force when it ran, not the one at startup.
    pub offsets: Option<ServerOffsets>,
    pub ddl_command: String,
}

/// Why the source failed, and whether trying again can help.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// What the connection or the server said, or a read that failed as one does
    /// (time-outs, unexpected answers): retry when transient.
    #[error(transparent)]
    Sql(#[from] SqlErrorKind),
    /// `sys.sp_cdc_enable_table` or `sys.sp_cdc_disable_table` gave up waiting
    /// for a lock on the table (1222 after `SET LOCK_TIMEOUT`): a transaction that
    /// wrote it is open. Nothing changed; the step is tried again later.
    #[error(
        "waited {waited_ms} ms for a lock on {table} (an open transaction holds it) and gave up, so application writers do not queue behind CDC's DDL: {message}"
    )]
    LockTimeout {
        table: String,
        waited_ms: u64,
        message: String,
    },
    #[error("CDC is not enabled on database `{database}`: run `EXEC sys.sp_cdc_enable_db` in it")]
    CdcNotEnabled { database: String },
    #[error(
        "no captured table matches source.include/source.exclude in `{database}`: enable CDC on a table with `EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'<table>', @role_name = NULL`"
    )]
    NoCapturedTables { database: String },
    /// `[[event.columns]]` rules that match no column of an included table: a
    /// misspelt pattern would let the column out as it is.
    #[error(
        "event.columns: {rules} match no column of any included table (patterns are schema.table.column, case-insensitive; * and ?): correct or remove them, or set event.allow_unmatched_column_rules = true"
    )]
    UnmatchedColumnRules { rules: String },
    #[error(
        "changes of capture instance `{capture_instance}` from LSN {first_lost} to {last_lost} were purged by the CDC cleanup job before they were delivered; set source.on_gap = \"skip\" to continue past the loss"
    )]
    Gap {
        capture_instance: String,
        first_lost: Lsn,
        last_lost: Lsn,
    },
    #[error(
        "capture instance `{capture_instance}`: an update before-image (op 3) at {key} is not followed by its after-image (op 4)"
    )]
    UnpairedUpdate {
        capture_instance: String,
        key: RowKey,
    },
    #[error("capture instance `{capture_instance}`: {message}")]
    Malformed {
        capture_instance: String,
        message: String,
    },
    /// A change table or column the catalog named is gone (error 208/207), or a value
    /// did not have the type the catalog gave its column: a capture instance was
    /// disabled, re-created or altered since the catalog was read. Re-reading the
    /// catalog and retrying resolves it.
    #[error("the CDC catalog changed while reading: {message}")]
    CatalogChanged { message: String },
    /// The cleanup job raised a capture instance's low end past what a page needed
    /// while the iteration read it. The iteration starts over, and its probe finds
    /// the gap, which `source.on_gap` (or `snapshot.mode = "when_needed"`) decides.
    /// Not a catalog change: it does not count toward the limit of those in a row.
    #[error(
        "the CDC cleanup job moved the low end of capture instance `{capture_instance}` to {min_lsn} during a read; reading again from the last position"
    )]
    CleanupRaced {
        capture_instance: String,
        min_lsn: Lsn,
    },
    #[error(
        "the database GUID (the default stream GUID) cannot be read by this login: on SQL Server grant VIEW ANY DATABASE to the login (`GRANT VIEW ANY DATABASE TO <login>`; the public role has it unless revoked), on Azure SQL Database VIEW DATABASE STATE (`GRANT VIEW DATABASE STATE TO <user>`); or set event.stream_guid to a fixed GUID"
    )]
    DatabaseGuidUnreadable,
    #[error(
        "capture instance `{capture_instance}` (table {table}): sys.fn_cdc_get_min_lsn returns 0x00, so this login cannot read its changes; grant SELECT on every captured column of the table (`GRANT SELECT ON {table} TO <user>`){role}; or exclude the table with source.exclude",
        role = gating_role_advice(gating_role.as_deref())
    )]
    TableUnreadable {
        capture_instance: String,
        table: String,
        /// `cdc.change_tables.role_name`.
        gating_role: Option<String>,
    },
    #[error(
        "capture instance `{capture_instance}`: the source table is not visible to this login (OBJECT_NAME is NULL); grant SELECT on it (`GRANT SELECT ON <schema>.<table> TO <user>`), or name only the tables to stream in source.include"
    )]
    TableInvisible { capture_instance: String },
    #[error(
        "capture instance `{capture_instance}`: its change table has no __$command_id column, which orders the statements of a transaction; it needs SQL Server 2016 SP2 CU or later (2017 CU or 2019+): update the server, then disable and enable CDC on the table"
    )]
    NoCommandId { capture_instance: String },
    #[error(
        "the checkpoint belongs to {checkpoint}, but this is {now}: to start a new stream here, give it its own checkpoint (checkpoint.path or checkpoint.stream_name); to continue the old one, point source.connection_string back at its database"
    )]
    OtherDatabase { checkpoint: String, now: String },
    /// `source.databases` on a server without cross-database queries.
    #[error(
        "source.databases needs cross-database queries (three-part names), which Azure SQL Database does not have: stream each database with a configuration of its own (source.connection_string with Database=<name>, and its own checkpoint.stream_name), or use a SQL Server or an Azure SQL Managed Instance"
    )]
    NoCrossDatabaseQueries,
    /// A database this server's replica cannot read (an availability group
    /// secondary), found by the probe of many databases.
    #[error(
        "{message} (this replica cannot read it; it is asked again with backoff, and streamed once it can be read: connect to the primary through the listener, or allow reads on the secondary)"
    )]
    NotReadableHere { message: String },
    /// A `[[event.columns]]` rule a table cannot take (a key column left out).
    #[error(transparent)]
    ColumnRule(#[from] crate::event::columns::ColumnRuleError),
    #[error(transparent)]
    UnknownServerZone(#[from] crate::source::timezone::UnknownServerZone),
    #[error(
        "{setting} needs the login to be a member of db_owner in the source database (required by {procedures}): `ALTER ROLE db_owner ADD MEMBER <user>`, or {instead}"
    )]
    ManageDenied {
        /// The setting that asks for it.
        setting: &'static str,
        /// The procedures it runs.
        procedures: &'static str,
        /// What to set instead.
        instead: &'static str,
    },
}

/// What an unreadable capture instance's gating role asks of the login: membership,
/// or nothing (`sys.fn_cdc_get_min_lsn` returns 0x00 to a login outside the role).
pub fn gating_role_advice(role: Option<&str>) -> String {
    match role {
        Some(role) => format!(
            " and make the login a member of the capture instance's gating role `{role}` (`ALTER ROLE [{role}] ADD MEMBER <user>`)"
        ),
        None => " (the capture instance has no gating role)".to_owned(),
    }
}

impl From<crate::mssql::SqlError> for SourceError {
    fn from(e: crate::mssql::SqlError) -> Self {
        SourceError::Sql(e.error)
    }
}

impl SourceError {
    /// A read that failed in a way retrying can cure (a time-out, a wait).
    pub fn transient(message: impl Into<String>) -> Self {
        SourceError::Sql(SqlErrorKind::transient(message))
    }

    /// A read that failed in a way retrying cannot cure (an unexpected answer).
    pub fn definite(message: impl Into<String>) -> Self {
        SourceError::Sql(SqlErrorKind::definite(message))
    }

    /// True when the configuration is at fault: a restart repeats the error until
    /// the setting it names is changed.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            SourceError::UnmatchedColumnRules { .. }
                | SourceError::ColumnRule(_)
                | SourceError::NoCrossDatabaseQueries
        )
    }

    /// True when retrying the same request can succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SourceError::Sql(SqlErrorKind::Transient { .. })
                | SourceError::LockTimeout { .. }
                | SourceError::CatalogChanged { .. }
                | SourceError::CleanupRaced { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_mask_bits_count_from_the_last_byte() {
        // One byte: ordinal 3 is 0x04.
        assert!(is_bit_set(&[0x04], 3));
        assert!(!is_bit_set(&[0x04], 1));
        // Two bytes: ordinal 9 is the lowest bit of the first byte.
        assert!(is_bit_set(&[0x01, 0x00], 9));
        assert!(!is_bit_set(&[0x01, 0x00], 1));
        assert!(is_bit_set(&[0x00, 0x80], 8));
        assert!(!is_bit_set(&[0xFF], 9));
        assert!(!is_bit_set(&[], 1));
        assert!(!is_bit_set(&[0xFF], 0));
    }

    #[test]
    fn row_keys_order_by_lsn_then_command_then_seqval_then_operation() {
        let key = |lsn, cmd, seq, op| RowKey {
            start_lsn: Lsn::from_parts(0, lsn, 0),
            command_id: cmd,
            seqval: Lsn::from_parts(0, seq, 0),
            operation: op,
        };
        // A later command sorts after an earlier one even with a lower seqval.
        assert!(key(1, 1, 9, 2) < key(1, 2, 5, 2));
        assert!(key(1, 2, 5, 3) < key(1, 2, 5, 4));
        assert!(key(1, 9, 9, 4) < key(2, 1, 1, 1));
        assert!(key(1, 9, 9, 4) < RowKey::after_lsn(Lsn::from_parts(0, 1, 0)));
        assert!(RowKey::after_lsn(Lsn::from_parts(0, 1, 0)) < key(2, 0, 0, 1));
    }
}

//! An in-memory **simulator** of a CDC-enabled SQL Server database.
//!
//! It models the behaviour that SQL Server documents for CDC (the book's *SQL Server* chapter, `docs/src/sql-server.md`, says what the poller relies on), so that the
//! poll loop can be tested without a server. It is a model, not SQL Server: where the
//! real server could differ, the integration tests in `tests/sqlserver/`
//! decide. What it models, with the page each behaviour comes from:
//!
//! - **The capture job.** Commits go to the log; only a scan of the capture job
//!   ([`CdcSimulator::run_capture_job`]) writes them to the change tables and to
//!   `cdc.lsn_time_mapping`, so `max_lsn` moves only then. By default a scan runs
//!   after every commit (a job with no latency); [`CdcSimulator::set_capture_job_manual`]
//!   makes the latency visible. ("The capture process … reads the log and adds
//!   information about changes to the change tables", *About change data capture*.)
//! - **Enabling a table.** `sp_cdc_enable_table` creates the capture instance and its
//!   empty change table at once, with `cdc.change_tables.start_lsn` NULL ("the low
//!   endpoint has not been established", *cdc.change_tables*) and
//!   `sys.fn_cdc_get_min_lsn` 0x00 until the job's next scan sets it.
//! - **Disabling a table.** `sp_cdc_disable_table` drops the change table at once: a
//!   query on it then fails with error 208 (*sys.sp_cdc_disable_table*). Enabling again
//!   can reuse the default name `schema_table`; the change table is a new object.
//! - **DDL.** `DROP COLUMN`: the change table and `cdc.captured_columns` keep the
//!   column, NULL from then on ("null values will be supplied for the column in the
//!   subsequent change entries", *About change data capture*, Handling changes to the
//!   source table). `ALTER COLUMN` to another type changes the source table at once and
//!   the change table's column only "when the capture process encounters the log record
//!   for the DDL change" (*cdc.<capture_instance>_CT*). Both are recorded in
//!   `cdc.ddl_history` by the scan.
//! - **Cleanup.** The job raises the low end (`start_lsn`, hence `min_lsn`) and deletes
//!   the rows below it in batches, so a reader can see part of a transaction
//!   ([`CdcSimulator::begin_cleanup`]).
//! - **Permissions.** `sys.fn_cdc_get_min_lsn` returns 0x00 when the caller may not
//!   SELECT every captured column (*sys.fn_cdc_get_min_lsn*); `OBJECT_NAME` is NULL for
//!   a table the login cannot see; the database GUID may be unreadable
//!   (`sys.database_recovery_status` has no row without `VIEW ANY DATABASE`).
//! - **Time.** Commit times are server-local; with a time zone set, each row carries
//!   the offset SQL Server's `AT TIME ZONE` gives that local time (a time in the
//!   skipped hour takes the offset after the change, one in the repeated hour the
//!   offset before it, *AT TIME ZONE*).
//! - Op-3 rows whose unchanged LOB columns are NULL, multi-statement multi-table
//!   transactions, idle markers, two capture instances per table, injected faults.
//!
//! Errors that the real source reports as [`SourceError::CatalogChanged`] (a change
//! table or column gone, a value of another type than the catalog said) are reported
//! the same way here, so the poller meets the same answers on both.
//!
//! [`CdcSimulator`] is a cheap handle (`Clone`) to shared state, so a test can change
//! the database while a poller reads it.

mod cost;
pub use cost::SeekCost;
mod clock;
use clock::zone_at_offset;
mod controls;
mod ddl;
pub use cost::ReadLatency;
pub use ddl::SimDdlError;
pub mod order;
pub mod server;
mod source;
mod transaction;
mod values;
use values::{convert, fits};

use transaction::update_mask;

/// A time as a `datetime` column holds it.
use mssql_ces::source::decode::as_datetime_column as datetime;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{Duration, NaiveDate, NaiveDateTime};
use chrono_tz::Tz;
use uuid::Uuid;

use mssql_ces::event::Value;
use mssql_ces::event::value::{SqlType, TypeError};
use mssql_ces::lsn::Lsn;
use mssql_ces::source::{
    CaptureDdl, CaptureInstance, CaptureOptions, CaptureSettings, CapturedColumn, Catalog, CdcJob,
    CdcReads, ChangeRow, CommitTime, DdlEvent, DroppedColumn, EnableCapture, Fact, FactReads,
    LogScan, MaxLsn, Probe, ProbeResult, RowKey, ServerFacts, SourceClock, SourceError,
    TableCursor, TableReads, UncapturedColumns, UncapturedTable, op,
};
use order::SortKey;

/// A column of a simulated table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimColumn {
    pub name: String,
    /// The type, or why CES leaves it out (e.g. a `geometry` column).
    pub sql_type: Result<SqlType, TypeError>,
    /// A computed column: the table holds its value, change rows hold NULL.
    pub computed: bool,
    /// Whether the column allows NULL (`sys.columns.is_nullable`); a key column
    /// never does, whatever this says.
    pub nullable: bool,
    /// The default constraint's text as `sys.default_constraints.definition`
    /// keeps it (SQL Server wraps the expression in parentheses: `DEFAULT 0` is
    /// `((0))`, `DEFAULT N'x'` is `(N'x')`).
    pub default: Option<String>,
    /// `sys.columns.column_id`, given when the column joins a table: one more than
    /// any the table has had, so a column dropped and added again under its old name
    /// is another column (a capture instance of the old one does not capture it).
    id: u32,
}

impl SimColumn {
    pub fn new(name: &str, sql_type: SqlType) -> Self {
        SimColumn {
            name: name.into(),
            sql_type: Ok(sql_type),
            computed: false,
            nullable: true,
            default: None,
            id: 0,
        }
    }

    /// The column with a default constraint, its text as the catalog keeps it.
    pub fn with_default(mut self, definition: &str) -> Self {
        self.default = Some(definition.into());
        self
    }

    /// A column declared `NOT NULL`.
    pub fn not_null(name: &str, sql_type: SqlType) -> Self {
        SimColumn {
            nullable: false,
            ..SimColumn::new(name, sql_type)
        }
    }

    /// A computed column (its values are given with each row, as the table would
    /// compute them): CDC records it as NULL in every change row ("Computed columns
    /// that are included in a capture instance always have a value of NULL", Learn:
    /// What is change data capture) and `cdc.captured_columns.is_computed` is 1.
    pub fn computed(name: &str, sql_type: SqlType) -> Self {
        SimColumn {
            computed: true,
            ..SimColumn::new(name, sql_type)
        }
    }

    /// A column of a type CES does not stream.
    pub fn excluded(name: &str, type_name: &str) -> Self {
        SimColumn {
            name: name.into(),
            sql_type: Err(TypeError::Excluded {
                type_name: type_name.into(),
            }),
            computed: false,
            nullable: true,
            default: None,
            id: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct SimTable {
    schema: String,
    name: String,
    columns: Vec<SimColumn>,
    /// The columns' ids, shared by every row image taken while they hold.
    ids: Arc<[u32]>,
    /// The highest `column_id` the table has given (never given again).
    last_column_id: u32,
    key: Vec<String>,
    /// Current rows in key order (SQL Server's, [`order`]); a table without a key is
    /// a heap: its rows in insertion order, under a hidden row number.
    rows: BTreeMap<SortKey, Vec<Value>>,
    /// The next hidden row number of a table without a key.
    next_row: i128,
}

/// The sort key of key values.
fn sort_key(values: &[Value]) -> SortKey {
    values.iter().map(order::part).collect()
}

impl SimTable {
    fn key_of(&self, row: &[Value]) -> SortKey {
        let values: Vec<Value> = self
            .key
            .iter()
            .filter_map(|k| self.columns.iter().position(|c| &c.name == k))
            .filter_map(|i| row.get(i).cloned())
            .collect();
        sort_key(&values)
    }

    /// The key a new row is stored under.
    fn new_key(&mut self, row: &[Value]) -> SortKey {
        if self.key.is_empty() {
            self.next_row += 1;
            return vec![order::KeyPart::Number(self.next_row)];
        }
        self.key_of(row)
    }

    fn column_ids(&self) -> Arc<[u32]> {
        Arc::clone(&self.ids)
    }

    /// Gives `column` the table's next `column_id` and adds it at the end.
    fn push_column(&mut self, mut column: SimColumn) {
        self.last_column_id += 1;
        column.id = self.last_column_id;
        self.columns.push(column);
    }

    /// Re-derives `ids` after a change to `columns`.
    fn columns_changed(&mut self) {
        self.ids = self.columns.iter().map(|c| c.id).collect();
    }
}

#[derive(Debug, Clone)]
struct SimInstance {
    /// `start_lsn` here is what `cdc.change_tables` holds: `None` until a scan.
    info: CaptureInstance,
    table: String,
    /// The LSN of the `sp_cdc_enable_table` log record: the scan sets `start_lsn` to it.
    enabled_at: Lsn,
    /// The source `column_id` of each of `info.columns`
    /// (`cdc.captured_columns.column_id`).
    column_ids: Vec<u32>,
    /// Rows in CDC order; values follow `info.columns` (all captured columns).
    rows: Vec<ChangeRow>,
    ddl: Vec<DdlEvent>,
}

/// One row image of a committed statement, with the table's column ids then.
#[derive(Debug, Clone)]
struct Image {
    table: String,
    operation: u8,
    command_id: i32,
    seqval: Lsn,
    columns: Arc<[u32]>,
    old: Option<Vec<Value>>,
    new: Option<Vec<Value>>,
    /// The ids of the columns an update set.
    changed: Option<Vec<u32>>,
}

/// What the log holds for the capture job to scan.
#[derive(Debug, Clone)]
enum LogRecord {
    Enable {
        instance: String,
        lsn: Lsn,
    },
    Commit {
        commit_lsn: Lsn,
        begin_lsn: Lsn,
        end_time: NaiveDateTime,
        images: Vec<Image>,
    },
    Ddl {
        table: String,
        lsn: Lsn,
        time: NaiveDateTime,
        command: String,
        /// For `ALTER COLUMN`: the column and its new type.
        /// `ALTER COLUMN`: the column's id and its new type.
        retype: Option<(u32, SqlType)>,
    },
    Idle {
        lsn: Lsn,
    },
}

#[derive(Debug)]
struct SimState {
    database: String,
    guid: Uuid,
    guid_readable: bool,
    /// `sys.databases.group_database_id`: set while the database is in an
    /// availability group.
    group_guid: Option<Uuid>,
    /// Read on a readable secondary: the primary's log redone up to here.
    redone_through: Option<Lsn>,
    utc_offset_minutes: i32,
    time_zone: Option<Tz>,
    clock: u128,
    now: NaiveDateTime,
    /// `now` is in the second occurrence of an hour the clocks repeat (set by
    /// `set_utc_time`; a local time alone cannot say).
    second_occurrence: bool,
    tables: BTreeMap<String, SimTable>,
    instances: Vec<SimInstance>,
    next_object_id: i32,
    /// `cdc.lsn_time_mapping`'s `start_lsn` and `tran_end_time`, as far as the
    /// capture job has scanned.
    mapping: Vec<(Lsn, NaiveDateTime)>,
    /// What `check` sees of the server; `local_time`, `database` and the log scan
    /// come from the simulation itself.
    server: ServerFacts,
    /// When the capture job's last scan ran (server-local).
    last_scan: NaiveDateTime,
    /// Transactions the last scan took from the log, and all scans since the start.
    last_scan_transactions: i64,
    scanned_transactions: i64,
    log: Vec<LogRecord>,
    manual_capture: bool,
    /// Bumped by every change to `cdc.change_tables` or `cdc.ddl_history`.
    version: i64,
    min_lsn_available: bool,
    /// Tables whose captured columns the login may not SELECT.
    denied: BTreeSet<String>,
    /// Whether the login is in `db_owner` (or sysadmin): what `sys.sp_cdc_enable_table`
    /// and `sys.sp_cdc_disable_table` require.
    db_owner: bool,
    /// Database roles the login is a member of (gating roles).
    roles: BTreeSet<String>,
    /// Tables (`schema.table`) an open transaction has written: CDC's procedures
    /// on them wait for its locks.
    write_locked: BTreeSet<String>,
    /// `sys.sp_cdc_enable_table` / `sp_cdc_disable_table` calls, answered or not.
    capture_ddl_calls: u64,
    /// How long a keyed table read takes (`set_read_latency`); none: no time.
    read_latency: Option<ReadLatency>,
    /// `sys.sp_cdc_cleanup_change_table` calls that moved a low end, and the change
    /// rows they deleted.
    change_table_cleanups: u64,
    cleaned_rows: u64,
    /// Tables the login cannot see at all.
    invisible: BTreeSet<String>,
    /// A cleanup that has raised the low end but not yet deleted every row below it.
    cleanup_pending: Option<Lsn>,
    /// What happens on the server just before the next `read_changes` answers.
    on_next_read: Vec<SimAction>,
    faults: VecDeque<SourceError>,
    round_trips: usize,
    rows_read: usize,
    /// Per capture instance: where the open pass over a table without a key is.
    passes: BTreeMap<String, SortKey>,
    /// What a change page costs on the server ([`CdcSimulator::set_change_seek`]).
    change_seek: Option<SeekCost>,
    /// Change-table rows the server's seeks examined, by that model.
    rows_examined: usize,
}

impl SimState {
    fn next_lsn(&mut self) -> Lsn {
        self.clock += 1;
        Lsn::from_u128(self.clock).unwrap_or(Lsn::MAX)
    }

    fn max_lsn(&self) -> Option<Lsn> {
        match self.redone_through {
            // A readable secondary: what redo has applied so far.
            Some(cap) => self
                .mapping
                .iter()
                .rev()
                .map(|(lsn, _)| *lsn)
                .find(|lsn| *lsn <= cap),
            None => self.mapping.last().map(|(lsn, _)| *lsn),
        }
    }

    /// The capture job's scan: everything in the log, in log order.
    fn scan(&mut self) {
        self.scan_records(usize::MAX);
    }

    /// A scan that stops after the log's first `records` records (as the job does
    /// after `maxtrans` transactions): the rest waits for the next.
    fn scan_records(&mut self, records: usize) {
        self.last_scan = self.now;
        self.last_scan_transactions = 0;
        let rest = self.log.split_off(records.min(self.log.len()));
        for record in std::mem::replace(&mut self.log, rest) {
            match record {
                LogRecord::Enable { instance, lsn } => {
                    if let Some(i) = self.instances.iter_mut().find(|i| i.info.name == instance) {
                        i.info.start_lsn = Some(lsn);
                        self.version += 1;
                    }
                }
                LogRecord::Commit {
                    commit_lsn,
                    begin_lsn,
                    end_time,
                    images,
                } => {
                    self.capture(commit_lsn, begin_lsn, end_time, &images);
                    self.mapping.push((commit_lsn, end_time));
                    self.last_scan_transactions += 1;
                    self.scanned_transactions += 1;
                }
                LogRecord::Ddl {
                    table,
                    lsn,
                    time,
                    command,
                    retype,
                } => {
                    for instance in self.instances.iter_mut().filter(|i| i.table == table) {
                        if instance.enabled_at > lsn {
                            continue;
                        }
                        if let Some((column, sql_type)) = &retype
                            && let Some(at) = instance.column_ids.iter().position(|id| id == column)
                        {
                            instance.info.columns[at].sql_type = Ok(*sql_type);
                            for row in &mut instance.rows {
                                row.values[at] = convert(&row.values[at], *sql_type);
                            }
                        }
                        instance.ddl.push(DdlEvent {
                            capture_instance: instance.info.name.clone(),
                            ddl_lsn: lsn,
                            ddl_time: time,
                            offsets: None,
                            ddl_command: command.clone(),
                        });
                    }
                    self.version += 1;
                }
                LogRecord::Idle { lsn } => {
                    let now = datetime(self.now);
                    self.mapping.push((lsn, now));
                }
            }
        }
    }

    /// Writes a commit's images to the change tables of the instances that were
    /// enabled before it.
    fn capture(
        &mut self,
        commit_lsn: Lsn,
        begin_lsn: Lsn,
        end_time: NaiveDateTime,
        images: &[Image],
    ) {
        let tails: Vec<usize> = self.instances.iter().map(|i| i.rows.len()).collect();
        for image in images {
            for instance in self.instances.iter_mut().filter(|i| i.table == image.table) {
                if instance.enabled_at > commit_lsn {
                    continue;
                }
                // By column id: a column dropped from the table since (even one
                // added again under its name) is NULL.
                let project = |row: &Vec<Value>| -> Vec<Value> {
                    instance
                        .info
                        .columns
                        .iter()
                        .zip(&instance.column_ids)
                        .map(|(c, id)| {
                            if c.computed {
                                return Value::Null;
                            }
                            image
                                .columns
                                .iter()
                                .position(|column| column == id)
                                .and_then(|i| row.get(i).cloned())
                                .unwrap_or(Value::Null)
                        })
                        .collect()
                };
                let mask = update_mask(
                    &instance.info.columns,
                    &instance.column_ids,
                    image.changed.as_deref(),
                );
                let row = |operation, values| ChangeRow {
                    key: RowKey {
                        start_lsn: commit_lsn,
                        command_id: image.command_id,
                        seqval: image.seqval,
                        operation,
                    },
                    update_mask: mask.clone(),
                    begin_lsn,
                    end_time,
                    end_time_offsets: None,
                    values,
                };
                match (image.operation, &image.old, &image.new) {
                    (op::INSERT, _, Some(new)) => instance.rows.push(row(op::INSERT, project(new))),
                    (op::DELETE, Some(old), _) => instance.rows.push(row(op::DELETE, project(old))),
                    (_, Some(old), Some(new)) => {
                        // Op 3 leaves unchanged LOB columns NULL.
                        let mut before = project(old);
                        for (i, (c, id)) in instance
                            .info
                            .columns
                            .iter()
                            .zip(&instance.column_ids)
                            .enumerate()
                        {
                            let lob = c.sql_type.as_ref().is_ok_and(SqlType::is_lob);
                            let changed_here =
                                image.changed.as_ref().is_some_and(|ch| ch.contains(id));
                            if lob && !changed_here {
                                before[i] = Value::Null;
                            }
                        }
                        instance.rows.push(row(op::UPDATE_BEFORE, before));
                        instance.rows.push(row(op::UPDATE_AFTER, project(new)));
                    }
                    _ => {}
                }
            }
        }
        // This commit's rows all sort after every earlier row (its LSN is the highest
        // scanned), so only the new tail needs ordering.
        for (instance, start) in self.instances.iter_mut().zip(tails) {
            instance.rows[start..].sort_by_key(|r| r.key);
        }
    }

    /// What `sys.fn_cdc_get_min_lsn` answers: 0x00 (`None`) for an instance that
    /// does not exist, has no low end yet, or whose table the login may not read.
    fn min_lsn(&self, capture_instance: &str) -> Option<Lsn> {
        let instance = self
            .instances
            .iter()
            .find(|i| i.info.name == capture_instance)?;
        // sys.fn_cdc_get_min_lsn: 0x00 without SELECT on every captured column, or
        // outside the instance's gating role.
        let outside_role = instance
            .info
            .options
            .role_name
            .as_ref()
            .is_some_and(|role| !self.roles.contains(role));
        if !self.min_lsn_available || self.denied.contains(&instance.table) || outside_role {
            return None;
        }
        instance.info.start_lsn
    }

    fn apply(&mut self, action: SimAction) {
        match action {
            SimAction::RunCaptureJob => self.scan(),
            SimAction::BeginCleanup { low_water, rows } => self.begin_cleanup(low_water, rows),
            SimAction::Disable(name) => self.disable(&name),
        }
    }

    fn disable(&mut self, name: &str) {
        self.instances.retain(|i| i.info.name != name);
        self.version += 1;
    }

    fn begin_cleanup(&mut self, low_water: Lsn, rows: usize) {
        let mut budget = rows;
        for instance in &mut self.instances {
            if let Some(start) = instance.info.start_lsn {
                instance.info.start_lsn = Some(start.max(low_water));
            }
            let below = instance
                .rows
                .iter()
                .take_while(|r| r.key.start_lsn < low_water)
                .count();
            let delete = below.min(budget);
            budget -= delete;
            instance.rows.drain(..delete);
        }
        // The job deletes cdc.lsn_time_mapping rows below the low end too (the
        // newest row stays: it is max_lsn).
        let keep_from = self
            .mapping
            .partition_point(|(lsn, _)| *lsn < low_water)
            .min(self.mapping.len().saturating_sub(1));
        self.mapping.drain(..keep_from);
        self.version += 1;
        self.cleanup_pending = Some(low_water);
    }

    fn catalog_changed(message: String) -> SourceError {
        SourceError::CatalogChanged { message }
    }
}

/// Something the server does while a poller is between two of its queries.
#[derive(Debug, Clone)]
pub enum SimAction {
    /// One scan of the capture job.
    RunCaptureJob,
    /// The cleanup job's first batch ([`CdcSimulator::begin_cleanup`]).
    BeginCleanup { low_water: Lsn, rows: usize },
    /// `sp_cdc_disable_table` of this capture instance.
    Disable(String),
}

/// A handle to a simulated CDC database.
#[derive(Debug, Clone)]
pub struct CdcSimulator {
    state: Arc<Mutex<SimState>>,
}

/// One statement of a transaction.
#[derive(Debug, Clone)]
enum Statement {
    Insert(String, Vec<Value>),
    Update(String, Vec<Value>, Vec<(String, Value)>),
    Delete(String, Vec<Value>),
}

/// A transaction being built; [`commit`](Transaction::commit) applies it.
#[derive(Debug)]
pub struct Transaction {
    sim: CdcSimulator,
    statements: Vec<Vec<Statement>>,
    reverse_seqvals: bool,
}

impl CdcSimulator {
    /// An empty CDC-enabled database whose server runs at `utc_offset_minutes`.
    ///
    /// The server is SQL Server 2022 (ProductVersion 16): it names its time zone
    /// (`CURRENT_TIMEZONE_ID()`), here a zone without daylight saving at that offset
    /// (`UTC`, `Etc/GMT-2`, …) where there is one, so every row carries that offset.
    /// [`set_time_zone`](Self::set_time_zone) gives it another zone,
    /// [`forget_time_zone`](Self::forget_time_zone) makes it a 2016–2019 server that
    /// cannot name one.
    pub fn new(database: &str, guid: Uuid, utc_offset_minutes: i32) -> Self {
        let now = NaiveDate::from_ymd_opt(2026, 8, 7)
            .and_then(|d| d.and_hms_opt(16, 25, 0))
            .unwrap_or_default();
        CdcSimulator {
            state: Arc::new(Mutex::new(SimState {
                database: database.into(),
                guid,
                guid_readable: true,
                group_guid: None,
                redone_through: None,
                utc_offset_minutes,
                time_zone: zone_at_offset(utc_offset_minutes),
                clock: 0x0000_00B1_0000_0000_0000,
                now,
                second_occurrence: false,
                tables: BTreeMap::new(),
                instances: Vec::new(),
                next_object_id: 1_000,
                mapping: Vec::new(),
                server: ServerFacts {
                    product_version: "16.0.4135.4".into(),
                    edition: "Developer Edition (64-bit)".into(),
                    engine_edition: 3,
                    database: database.into(),
                    cdc_enabled: true,
                    // No connection: nothing to encrypt.
                    encrypted: None,
                    local_time: now,
                    agent: Fact::Known("Running".into()),
                    // sys.sp_cdc_add_job's defaults: three days' retention.
                    jobs: Fact::Known(vec![
                        CdcJob::capture(CaptureSettings::DEFAULT),
                        CdcJob::cleanup(4320),
                    ]),
                    capture_running: Fact::Known(true),
                    log_scan: Fact::Known(None),
                    // SQL Server's default.
                    max_text_repl_size: Fact::Known(65_536),
                },
                last_scan: now,
                last_scan_transactions: 0,
                scanned_transactions: 0,
                log: Vec::new(),
                manual_capture: false,
                version: 0,
                min_lsn_available: true,
                denied: BTreeSet::new(),
                db_owner: true,
                roles: BTreeSet::new(),
                write_locked: BTreeSet::new(),
                capture_ddl_calls: 0,
                read_latency: None,
                change_table_cleanups: 0,
                cleaned_rows: 0,
                invisible: BTreeSet::new(),
                cleanup_pending: None,
                on_next_read: Vec::new(),
                faults: VecDeque::new(),
                round_trips: 0,
                rows_read: 0,
                passes: BTreeMap::new(),
                change_seek: None,
                rows_examined: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // A panic while holding the lock only happens in a failing test.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `CREATE TABLE schema.name (…)` with a primary key (empty: none).
    pub fn create_table(&self, schema: &str, name: &str, columns: Vec<SimColumn>, key: &[&str]) {
        let mut state = self.lock();
        let mut table = SimTable {
            schema: schema.into(),
            name: name.into(),
            columns: Vec::new(),
            ids: Arc::from([]),
            last_column_id: 0,
            key: key.iter().map(|k| k.to_string()).collect(),
            rows: BTreeMap::new(),
            next_row: 0,
        };
        for column in columns {
            table.push_column(column);
        }
        table.columns_changed();
        state.tables.insert(format!("{schema}.{name}"), table);
    }
}

//! An in-memory **simulator** of a CDC-enabled SQL Server database.
//!
//! It models the behaviour that SQL Server documents for CDC (SPEC §2), so that the
//! poll loop can be tested without a server. It is a model, not SQL Server: where the
//! real server could differ, the integration tests in `tests/sqlserver_integration.rs`
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

pub mod bulk;
pub mod order;
pub mod synthetic;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{Duration, NaiveDate, NaiveDateTime, Offset as _, TimeZone as _};
use chrono_tz::Tz;
use uuid::Uuid;

use crate::event::Value;
use crate::event::value::{SqlType, TypeError};
use crate::lsn::Lsn;
use crate::source::sim::order::SortKey;
use crate::source::{
    CaptureInstance, CapturedColumn, Catalog, CdcJob, ChangeRow, ChangeSource, DdlEvent, Fact,
    LogScan, MaxLsn, Probe, ProbeResult, RowKey, ServerFacts, SourceError, TableCursor, op,
};

/// A column of a simulated table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimColumn {
    pub name: String,
    /// The type, or why CES leaves it out (e.g. a `geometry` column).
    pub sql_type: Result<SqlType, TypeError>,
}

impl SimColumn {
    pub fn new(name: &str, sql_type: SqlType) -> Self {
        SimColumn {
            name: name.into(),
            sql_type: Ok(sql_type),
        }
    }

    /// A column of a type CES does not stream.
    pub fn excluded(name: &str, type_name: &str) -> Self {
        SimColumn {
            name: name.into(),
            sql_type: Err(TypeError::Excluded {
                type_name: type_name.into(),
            }),
        }
    }
}

#[derive(Debug, Clone)]
struct SimTable {
    schema: String,
    name: String,
    columns: Vec<SimColumn>,
    /// The column names, shared by every row image taken while they hold.
    names: Arc<[String]>,
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

    fn column_names(&self) -> Arc<[String]> {
        Arc::clone(&self.names)
    }

    /// Re-derives `names` after a change to `columns`.
    fn columns_changed(&mut self) {
        self.names = self.columns.iter().map(|c| c.name.clone()).collect();
    }
}

#[derive(Debug, Clone)]
struct SimInstance {
    /// `start_lsn` here is what `cdc.change_tables` holds: `None` until a scan.
    info: CaptureInstance,
    table: String,
    /// The LSN of the `sp_cdc_enable_table` log record: the scan sets `start_lsn` to it.
    enabled_at: Lsn,
    /// Rows in CDC order; values follow `info.columns` (all captured columns).
    rows: Vec<ChangeRow>,
    ddl: Vec<DdlEvent>,
}

/// One row image of a committed statement, with the table's column names then.
#[derive(Debug, Clone)]
struct Image {
    table: String,
    operation: u8,
    command_id: i32,
    seqval: Lsn,
    columns: Arc<[String]>,
    old: Option<Vec<Value>>,
    new: Option<Vec<Value>>,
    changed: Option<Vec<String>>,
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
        retype: Option<(String, SqlType)>,
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
    utc_offset_minutes: i32,
    time_zone: Option<Tz>,
    clock: u128,
    now: NaiveDateTime,
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
    log: Vec<LogRecord>,
    manual_capture: bool,
    /// Bumped by every change to `cdc.change_tables` or `cdc.ddl_history`.
    version: i64,
    min_lsn_available: bool,
    /// Tables whose captured columns the login may not SELECT.
    denied: BTreeSet<String>,
    /// Tables the login cannot see at all.
    invisible: BTreeSet<String>,
    /// A cleanup that has raised the low end but not yet deleted every row below it.
    cleanup_pending: Option<Lsn>,
    /// What happens on the server just before the next `read_changes` answers.
    on_next_read: Vec<SimAction>,
    faults: VecDeque<SourceError>,
    round_trips: usize,
    rows_read: usize,
    /// Source-table rows returned by `read_table`.
    table_rows_read: usize,
    /// Per capture instance: where the open pass over a table without a key is.
    passes: BTreeMap<String, SortKey>,
}

impl SimState {
    fn next_lsn(&mut self) -> Lsn {
        self.clock += 1;
        Lsn::from_u128(self.clock).unwrap_or(Lsn::MAX)
    }

    fn max_lsn(&self) -> Option<Lsn> {
        self.mapping.last().map(|(lsn, _)| *lsn)
    }

    /// The capture job's scan: everything in the log, in log order.
    fn scan(&mut self) {
        self.last_scan = self.now;
        for record in std::mem::take(&mut self.log) {
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
                            && let Some(at) =
                                instance.info.columns.iter().position(|c| &c.name == column)
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
                // By name: a column dropped from the table since is NULL.
                let project = |row: &Vec<Value>| -> Vec<Value> {
                    instance
                        .info
                        .columns
                        .iter()
                        .map(|c| {
                            image
                                .columns
                                .iter()
                                .position(|name| name == &c.name)
                                .and_then(|i| row.get(i).cloned())
                                .unwrap_or(Value::Null)
                        })
                        .collect()
                };
                let mask = update_mask(&instance.info.columns, image.changed.as_deref());
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
                    end_time_offset_minutes: None,
                    values,
                };
                match (image.operation, &image.old, &image.new) {
                    (op::INSERT, _, Some(new)) => instance.rows.push(row(op::INSERT, project(new))),
                    (op::DELETE, Some(old), _) => instance.rows.push(row(op::DELETE, project(old))),
                    (_, Some(old), Some(new)) => {
                        // Op 3 leaves unchanged LOB columns NULL.
                        let mut before = project(old);
                        for (i, c) in instance.info.columns.iter().enumerate() {
                            let lob = c.sql_type.as_ref().is_ok_and(SqlType::is_lob);
                            let changed_here = image
                                .changed
                                .as_ref()
                                .is_some_and(|ch| ch.contains(&c.name));
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
        if !self.min_lsn_available || self.denied.contains(&instance.table) {
            return None;
        }
        instance.info.start_lsn
    }

    /// The offset SQL Server's `AT TIME ZONE` gives a local time in the server's zone.
    fn offset_at(&self, local: NaiveDateTime) -> Option<i16> {
        let tz = self.time_zone?;
        let offset = match tz.offset_from_local_datetime(&local) {
            chrono::LocalResult::Single(o) => o.fix(),
            // The repeated hour: the offset before the change.
            chrono::LocalResult::Ambiguous(first, _) => first.fix(),
            // The skipped hour: the offset after the change.
            chrono::LocalResult::None => tz
                .offset_from_local_datetime(&(local + Duration::hours(3)))
                .earliest()?
                .fix(),
        };
        i16::try_from(offset.local_minus_utc() / 60).ok()
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

/// A time as a `datetime` column holds it (`cdc.lsn_time_mapping.tran_end_time`,
/// `cdc.change_tables.create_date`, `cdc.ddl_history.ddl_time`): in 1/300-second
/// ticks, rounded to the nearest (*datetime (Transact-SQL)*: "rounded to increments
/// of .000, .003, or .007 seconds"), and read back as the SQL Server source decodes
/// a tick count ([`crate::source::decode::datetime_from_ticks`]).
fn datetime(t: NaiveDateTime) -> NaiveDateTime {
    let midnight = t.date().and_time(chrono::NaiveTime::MIN);
    let nanos = (t - midnight).num_nanoseconds().unwrap_or(0);
    let ticks = (nanos * 300 + 500_000_000) / 1_000_000_000;
    midnight + Duration::milliseconds((ticks * 10 + 1) / 3)
}

/// A value converted to a column's new type, as `ALTER COLUMN` converts stored rows.
fn convert(value: &Value, to: SqlType) -> Value {
    match (value, to) {
        (Value::TinyInt(v), SqlType::SmallInt) => Value::SmallInt(i16::from(*v)),
        (Value::TinyInt(v), SqlType::Int) => Value::Int(i32::from(*v)),
        (Value::SmallInt(v), SqlType::Int) => Value::Int(i32::from(*v)),
        (Value::Int(v), SqlType::BigInt) => Value::BigInt(i64::from(*v)),
        (Value::SmallInt(v), SqlType::BigInt) => Value::BigInt(i64::from(*v)),
        (other, _) => other.clone(),
    }
}

/// Whether a value can be a value of `sql_type` (what the real decoder checks): the
/// simulator models integer type changes, so only integers are checked.
fn fits(value: &Value, sql_type: SqlType) -> bool {
    match value {
        Value::TinyInt(_) => sql_type == SqlType::TinyInt,
        Value::SmallInt(_) => sql_type == SqlType::SmallInt,
        Value::Int(_) => sql_type == SqlType::Int,
        Value::BigInt(_) => sql_type == SqlType::BigInt,
        _ => true,
    }
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

impl Transaction {
    /// `INSERT` of one row (values in table column order).
    pub fn insert(mut self, table: &str, row: Vec<Value>) -> Self {
        self.statements
            .push(vec![Statement::Insert(table.into(), row)]);
        self
    }

    /// `UPDATE … SET` the given columns of the row with key values `key`.
    pub fn update(mut self, table: &str, key: Vec<Value>, set: Vec<(&str, Value)>) -> Self {
        let set = set.into_iter().map(|(c, v)| (c.to_owned(), v)).collect();
        self.statements
            .push(vec![Statement::Update(table.into(), key, set)]);
        self
    }

    /// One `UPDATE` statement touching several rows: one command id, a seqval each.
    pub fn update_many(
        mut self,
        table: &str,
        keys: Vec<Vec<Value>>,
        set: Vec<(&str, Value)>,
    ) -> Self {
        let set: Vec<(String, Value)> = set.into_iter().map(|(c, v)| (c.to_owned(), v)).collect();
        self.statements.push(
            keys.into_iter()
                .map(|key| Statement::Update(table.into(), key, set.clone()))
                .collect(),
        );
        self
    }

    /// `DELETE` of the row with key values `key`.
    pub fn delete(mut self, table: &str, key: Vec<Value>) -> Self {
        self.statements
            .push(vec![Statement::Delete(table.into(), key)]);
        self
    }

    /// Gives later statements lower `__$seqval`s than earlier ones, as SQL Server can
    /// for some statements: only `__$command_id` then orders them correctly.
    pub fn with_reversed_seqvals(mut self) -> Self {
        self.reverse_seqvals = true;
        self
    }

    /// Commits to the tables and the log: returns the commit LSN (`__$start_lsn` of
    /// every row). The change rows appear when the capture job scans.
    pub fn commit(self) -> Result<Lsn, String> {
        let mut state = self.sim.lock();
        state.now += Duration::milliseconds(7);
        let begin_lsn = state.next_lsn();
        let row_count: usize = self.statements.iter().map(Vec::len).sum();
        let mut seqvals: Vec<Lsn> = (0..row_count).map(|_| state.next_lsn()).collect();
        if self.reverse_seqvals {
            seqvals.reverse();
        }
        let commit_lsn = state.next_lsn();
        let end_time = datetime(state.now);
        let mut seqvals = seqvals.into_iter();
        let mut images = Vec::new();
        for (command, statement) in self.statements.into_iter().enumerate() {
            let command_id = i32::try_from(command + 1).unwrap_or(i32::MAX);
            for row_statement in statement {
                let seqval = seqvals.next().unwrap_or(commit_lsn);
                let image = |table: String, operation, columns, old, new, changed| Image {
                    table,
                    operation,
                    command_id,
                    seqval,
                    columns,
                    old,
                    new,
                    changed,
                };
                match row_statement {
                    Statement::Insert(table, row) => {
                        let t = state
                            .tables
                            .get_mut(&table)
                            .ok_or(format!("no table {table}"))?;
                        if row.len() != t.columns.len() {
                            return Err(format!(
                                "{table}: {} values for {} columns",
                                row.len(),
                                t.columns.len()
                            ));
                        }
                        let key = t.new_key(&row);
                        if t.rows.contains_key(&key) {
                            return Err(format!("{table}: duplicate key {key:?}"));
                        }
                        t.rows.insert(key, row.clone());
                        let columns = t.column_names();
                        images.push(image(table, op::INSERT, columns, None, Some(row), None));
                    }
                    Statement::Update(table, key_values, set) => {
                        let t = state
                            .tables
                            .get_mut(&table)
                            .ok_or(format!("no table {table}"))?;
                        if t.key.is_empty() {
                            return Err(format!(
                                "{table}: a table without a key (rows cannot be addressed here)"
                            ));
                        }
                        let key = sort_key(&key_values);
                        let old = t
                            .rows
                            .get(&key)
                            .cloned()
                            .ok_or(format!("{table}: no row {key:?}"))?;
                        let mut new = old.clone();
                        let mut changed = Vec::new();
                        for (column, value) in set {
                            let i = t
                                .columns
                                .iter()
                                .position(|c| c.name == column)
                                .ok_or(format!("{table}: no column {column}"))?;
                            new[i] = value;
                            changed.push(column);
                        }
                        let new_key = t.key_of(&new);
                        if new_key != key && t.rows.contains_key(&new_key) {
                            return Err(format!("{table}: duplicate key {new_key:?}"));
                        }
                        t.rows.remove(&key);
                        t.rows.insert(new_key, new.clone());
                        let columns = t.column_names();
                        images.push(image(
                            table,
                            op::UPDATE_AFTER,
                            columns,
                            Some(old),
                            Some(new),
                            Some(changed),
                        ));
                    }
                    Statement::Delete(table, key_values) => {
                        let t = state
                            .tables
                            .get_mut(&table)
                            .ok_or(format!("no table {table}"))?;
                        let key = sort_key(&key_values);
                        let old = t
                            .rows
                            .remove(&key)
                            .ok_or(format!("{table}: no row {key:?}"))?;
                        let columns = t.column_names();
                        images.push(image(table, op::DELETE, columns, Some(old), None, None));
                    }
                }
            }
        }
        state.log.push(LogRecord::Commit {
            commit_lsn,
            begin_lsn,
            end_time,
            images,
        });
        if !state.manual_capture {
            state.scan();
        }
        Ok(commit_lsn)
    }
}

/// `__$update_mask`: all captured columns for inserts and deletes, the changed ones
/// for updates; bit `ordinal - 1` counted from the end.
fn update_mask(columns: &[CapturedColumn], changed: Option<&[String]>) -> Vec<u8> {
    let bytes = columns.len().div_ceil(8).max(1);
    let mut mask = vec![0u8; bytes];
    for c in columns {
        let set = changed.is_none_or(|ch| ch.contains(&c.name));
        if set && c.ordinal > 0 {
            let bit = (c.ordinal - 1) as usize;
            mask[bytes - 1 - bit / 8] |= 1 << (bit % 8);
        }
    }
    mask
}

impl CdcSimulator {
    /// An empty CDC-enabled database whose server runs at `utc_offset_minutes`.
    pub fn new(database: &str, guid: Uuid, utc_offset_minutes: i32) -> Self {
        let now = NaiveDate::from_ymd_opt(2026, 8, 7)
            .and_then(|d| d.and_hms_opt(16, 25, 0))
            .unwrap_or_default();
        CdcSimulator {
            state: Arc::new(Mutex::new(SimState {
                database: database.into(),
                guid,
                guid_readable: true,
                utc_offset_minutes,
                time_zone: None,
                clock: 0x0000_00B1_0000_0000_0000,
                now,
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
                    encrypted: true,
                    local_time: now,
                    agent: Fact::Known("Running".into()),
                    jobs: Fact::Known(vec![
                        CdcJob {
                            job_type: "capture".into(),
                            retention_minutes: None,
                        },
                        CdcJob {
                            job_type: "cleanup".into(),
                            // sys.sp_cdc_add_job's default: three days.
                            retention_minutes: Some(4320),
                        },
                    ]),
                    capture_running: Fact::Known(true),
                    log_scan: Fact::Known(None),
                },
                last_scan: now,
                log: Vec::new(),
                manual_capture: false,
                version: 0,
                min_lsn_available: true,
                denied: BTreeSet::new(),
                invisible: BTreeSet::new(),
                cleanup_pending: None,
                on_next_read: Vec::new(),
                faults: VecDeque::new(),
                round_trips: 0,
                rows_read: 0,
                table_rows_read: 0,
                passes: BTreeMap::new(),
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
        state.tables.insert(
            format!("{schema}.{name}"),
            SimTable {
                schema: schema.into(),
                name: name.into(),
                names: columns.iter().map(|c| c.name.clone()).collect(),
                columns,
                key: key.iter().map(|k| k.to_string()).collect(),
                rows: BTreeMap::new(),
                next_row: 0,
            },
        );
    }

    /// `sys.sp_cdc_enable_table`: a capture instance named `name` (default
    /// `schema_table`) capturing the table's current columns. Its `start_lsn` is NULL
    /// until the capture job scans the enable.
    pub fn enable_table(&self, table: &str, name: Option<&str>) -> Result<String, String> {
        let mut state = self.lock();
        let t = state
            .tables
            .get(table)
            .cloned()
            .ok_or(format!("no table {table}"))?;
        let name = name.map_or_else(|| format!("{}_{}", t.schema, t.name), str::to_owned);
        if state.instances.iter().filter(|i| i.table == table).count() >= 2 {
            return Err(format!("{table} already has two capture instances"));
        }
        if state.instances.iter().any(|i| i.info.name == name) {
            return Err(format!("capture instance {name} already exists"));
        }
        let enabled_at = state.next_lsn();
        let columns = t
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| CapturedColumn {
                name: c.name.clone(),
                ordinal: u32::try_from(i + 1).unwrap_or(u32::MAX),
                table_index: u32::try_from(i).ok(),
                sql_type: c.sql_type.clone(),
            })
            .collect();
        let create_date = datetime(state.now);
        state.next_object_id += 1;
        let object_id = state.next_object_id;
        state.instances.push(SimInstance {
            info: CaptureInstance {
                name: name.clone(),
                schema: t.schema.clone(),
                table: t.name.clone(),
                object_id,
                start_lsn: None,
                create_date,
                columns,
                key_columns: t.key.clone(),
                has_command_id: true,
            },
            table: table.into(),
            enabled_at,
            rows: Vec::new(),
            ddl: Vec::new(),
        });
        state.version += 1;
        state.log.push(LogRecord::Enable {
            instance: name.clone(),
            lsn: enabled_at,
        });
        if !state.manual_capture {
            state.scan();
        }
        Ok(name)
    }

    /// `ALTER TABLE … ADD column`: recorded in `cdc.ddl_history` of the table's
    /// capture instances, which keep capturing their old column list.
    pub fn add_column(&self, table: &str, column: SimColumn, fill: Value) -> Result<(), String> {
        let command = format!("ALTER TABLE {table} ADD [{}]", column.name);
        self.alter(table, command, None, |t| {
            t.columns.push(column);
            for row in t.rows.values_mut() {
                row.push(fill.clone());
            }
            Ok(())
        })
    }

    /// `ALTER TABLE … DROP COLUMN`: the source table loses the column at once; the
    /// change tables keep it, NULL in later rows.
    pub fn drop_column(&self, table: &str, column: &str) -> Result<(), String> {
        let command = format!("ALTER TABLE {table} DROP COLUMN [{column}]");
        self.alter(table, command, None, |t| {
            let at = t
                .columns
                .iter()
                .position(|c| c.name == column)
                .ok_or(format!("{table}: no column {column}"))?;
            t.columns.remove(at);
            for row in t.rows.values_mut() {
                row.remove(at);
            }
            Ok(())
        })
    }

    /// `ALTER TABLE … ALTER COLUMN` to another type: the source table's type changes
    /// at once, a change table's when the capture job scans the DDL.
    pub fn alter_column_type(&self, table: &str, column: &str, to: SqlType) -> Result<(), String> {
        let command = format!("ALTER TABLE {table} ALTER COLUMN [{column}] {to}");
        self.alter(table, command, Some((column.to_owned(), to)), |t| {
            let at = t
                .columns
                .iter()
                .position(|c| c.name == column)
                .ok_or(format!("{table}: no column {column}"))?;
            t.columns[at].sql_type = Ok(to);
            for row in t.rows.values_mut() {
                row[at] = convert(&row[at], to);
            }
            Ok(())
        })
    }

    fn alter(
        &self,
        table: &str,
        command: String,
        retype: Option<(String, SqlType)>,
        change: impl FnOnce(&mut SimTable) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut state = self.lock();
        let lsn = state.next_lsn();
        let time = datetime(state.now);
        let t = state
            .tables
            .get_mut(table)
            .ok_or(format!("no table {table}"))?;
        change(t)?;
        t.columns_changed();
        state.log.push(LogRecord::Ddl {
            table: table.into(),
            lsn,
            time,
            command,
            retype,
        });
        if !state.manual_capture {
            state.scan();
        }
        Ok(())
    }

    /// `sys.sp_cdc_disable_table` for one capture instance: the change table is
    /// dropped at once.
    pub fn disable_instance(&self, name: &str) {
        self.lock().disable(name);
    }

    /// Makes `action` happen just before the next `read_changes` answers.
    pub fn on_next_read(&self, action: SimAction) {
        self.lock().on_next_read.push(action);
    }

    /// Uses the columns of a unique index as the instance's key (`@index_name` of
    /// `sp_cdc_enable_table`), as `cdc.index_columns` then lists them.
    pub fn set_index_columns(&self, capture_instance: &str, columns: &[&str]) {
        if let Some(i) = self
            .lock()
            .instances
            .iter_mut()
            .find(|i| i.info.name == capture_instance)
        {
            i.info.key_columns = columns.iter().map(|c| c.to_string()).collect();
        }
    }

    /// Models a change table created before `__$command_id` existed.
    pub fn remove_command_id(&self, capture_instance: &str) {
        if let Some(i) = self
            .lock()
            .instances
            .iter_mut()
            .find(|i| i.info.name == capture_instance)
        {
            i.info.has_command_id = false;
        }
    }

    /// Starts a transaction.
    pub fn transaction(&self) -> Transaction {
        Transaction {
            sim: self.clone(),
            statements: Vec::new(),
            reverse_seqvals: false,
        }
    }

    /// The capture job's idle marker: a `cdc.lsn_time_mapping` row with
    /// `tran_id = 0x00`, which raises `max_lsn` with no change rows.
    pub fn idle_marker(&self) -> Lsn {
        let mut state = self.lock();
        state.now += Duration::seconds(5);
        let lsn = state.next_lsn();
        state.log.push(LogRecord::Idle { lsn });
        if !state.manual_capture {
            state.scan();
        }
        lsn
    }

    /// Whether the capture job waits for [`run_capture_job`](Self::run_capture_job)
    /// (`true`) or scans after every commit (`false`, the default).
    pub fn set_capture_job_manual(&self, manual: bool) {
        self.lock().manual_capture = manual;
    }

    /// One scan of the capture job.
    pub fn run_capture_job(&self) {
        self.lock().scan();
    }

    /// The cleanup job, whole: raises each instance's low end to `low_water` and
    /// removes the change rows below it.
    pub fn cleanup(&self, low_water: Lsn) {
        self.begin_cleanup(low_water, usize::MAX);
        self.finish_cleanup();
    }

    /// The cleanup job's first steps: the low end (`start_lsn`, so `min_lsn`) rises to
    /// `low_water` at once, and only the first `rows` change rows below it are deleted
    /// ([`finish_cleanup`](Self::finish_cleanup) deletes the rest).
    pub fn begin_cleanup(&self, low_water: Lsn, rows: usize) {
        self.lock().begin_cleanup(low_water, rows);
    }

    /// The cleanup job's remaining batches.
    pub fn finish_cleanup(&self) {
        let mut state = self.lock();
        if let Some(low_water) = state.cleanup_pending.take() {
            for instance in &mut state.instances {
                instance.rows.retain(|r| r.key.start_lsn >= low_water);
            }
        }
    }

    /// Drops change rows (and `cdc.lsn_time_mapping` rows but the newest) below `lsn`
    /// from memory without moving any low end: not a SQL Server behaviour, only a
    /// bound on the synthetic workload's memory.
    pub fn forget_below(&self, lsn: Lsn) {
        let mut state = self.lock();
        for instance in &mut state.instances {
            let below = instance.rows.partition_point(|r| r.key.start_lsn < lsn);
            instance.rows.drain(..below);
        }
        let below = state
            .mapping
            .partition_point(|(l, _)| *l < lsn)
            .min(state.mapping.len().saturating_sub(1));
        state.mapping.drain(..below);
    }

    /// Changes what `check` sees of the server (its version, CDC on the database,
    /// the Agent and the CDC jobs, the log scan's visibility). With CDC disabled the
    /// catalog fails as SQL Server's does.
    pub fn configure_server(&self, change: impl FnOnce(&mut ServerFacts)) {
        change(&mut self.lock().server);
    }

    /// Whether `sys.fn_cdc_get_min_lsn` answers (it is NULL right after CDC is
    /// enabled, until the capture job has run).
    pub fn set_min_lsn_available(&self, available: bool) {
        self.lock().min_lsn_available = available;
    }

    /// Takes SELECT on `table` away from the login (`true`) or grants it back.
    pub fn deny_select(&self, table: &str, denied: bool) {
        let mut state = self.lock();
        if denied {
            state.denied.insert(table.into());
        } else {
            state.denied.remove(table);
        }
    }

    /// Hides `table` from the login: `OBJECT_NAME` of it is NULL.
    pub fn hide_table(&self, table: &str) {
        self.lock().invisible.insert(table.into());
    }

    /// Shows a hidden table again (the grant is back).
    pub fn show_table(&self, table: &str) {
        self.lock().invisible.remove(table);
    }

    /// Gives the database another GUID, as a restored copy has.
    pub fn set_guid(&self, guid: Uuid) {
        self.lock().guid = guid;
    }

    /// Whether the login can read the database GUID.
    pub fn set_guid_readable(&self, readable: bool) {
        self.lock().guid_readable = readable;
    }

    /// Gives the server a time zone it can name (`CURRENT_TIMEZONE_ID()`): rows then
    /// carry the offset in force at their commit time.
    pub fn set_time_zone(&self, zone: Tz) {
        self.lock().time_zone = Some(zone);
    }

    /// Sets the server's local clock (commit times follow it).
    pub fn set_local_time(&self, now: NaiveDateTime) {
        self.lock().now = now;
    }

    /// Advances the server's local clock.
    pub fn advance_local_time(&self, by: Duration) {
        self.lock().now += by;
    }

    /// Makes the next call fail with `error`.
    pub fn inject_fault(&self, error: SourceError) {
        self.lock().faults.push_back(error);
    }

    /// Calls made through [`ChangeSource`] so far (each is one round trip).
    pub fn round_trips(&self) -> usize {
        self.lock().round_trips
    }

    /// Change rows returned by `read_changes` so far.
    pub fn rows_read(&self) -> usize {
        self.lock().rows_read
    }

    /// Source-table rows returned by `read_table` so far.
    pub fn table_rows_read(&self) -> usize {
        self.lock().table_rows_read
    }

    /// The current rows of `table` (`schema.name`) in key order, each as its
    /// columns' names and values: what a consumer's copy must equal.
    pub fn table_contents(&self, table: &str) -> Vec<Vec<(String, Value)>> {
        let state = self.lock();
        state.tables.get(table).map_or_else(Vec::new, |t| {
            t.rows
                .values()
                .map(|row| {
                    t.columns
                        .iter()
                        .zip(row)
                        .map(|(c, v)| (c.name.clone(), v.clone()))
                        .collect()
                })
                .collect()
        })
    }

    /// The current `sys.fn_cdc_get_max_lsn()`.
    pub fn current_max_lsn(&self) -> Option<Lsn> {
        self.lock().max_lsn()
    }

    /// The number of change rows held for `capture_instance`.
    pub fn change_rows(&self, capture_instance: &str) -> usize {
        self.lock()
            .instances
            .iter()
            .find(|i| i.info.name == capture_instance)
            .map_or(0, |i| i.rows.len())
    }

    /// `cdc.change_tables.start_lsn` of `capture_instance`.
    pub fn start_lsn(&self, capture_instance: &str) -> Option<Lsn> {
        self.lock()
            .instances
            .iter()
            .find(|i| i.info.name == capture_instance)
            .and_then(|i| i.info.start_lsn)
    }

    fn call(&self) -> Result<MutexGuard<'_, SimState>, SourceError> {
        let mut state = self.lock();
        state.round_trips += 1;
        match state.faults.pop_front() {
            Some(error) => Err(error),
            None => Ok(state),
        }
    }
}

impl ChangeSource for CdcSimulator {
    async fn catalog(&mut self) -> Result<Catalog, SourceError> {
        let state = self.call()?;
        if !state.server.cdc_enabled {
            return Err(SourceError::CdcNotEnabled {
                database: state.database.clone(),
            });
        }
        let mut instances = Vec::new();
        let mut invisible = Vec::new();
        for i in &state.instances {
            if state.invisible.contains(&i.table) {
                invisible.push(i.info.name.clone());
                continue;
            }
            let mut info = i.info.clone();
            // The source table as it is now: a dropped column has no position.
            let table_columns = state.tables.get(&i.table).map(SimTable::column_names);
            for c in &mut info.columns {
                c.table_index = table_columns
                    .as_ref()
                    .and_then(|names| names.iter().position(|n| n == &c.name))
                    .and_then(|p| u32::try_from(p).ok());
            }
            instances.push(info);
        }
        Ok(Catalog {
            server: "simulator".into(),
            database: state.database.clone(),
            database_guid: state.guid_readable.then_some(state.guid),
            server_utc_offset_minutes: state.utc_offset_minutes,
            server_time_zone: state.time_zone.map(|tz| tz.name().to_owned()),
            version: state.version,
            invisible,
            instances,
        })
    }

    async fn server_facts(&mut self) -> Result<ServerFacts, SourceError> {
        let state = self.call()?;
        let mut facts = state.server.clone();
        facts.local_time = state.now;
        facts.database = state.database.clone();
        if facts.log_scan == Fact::Known(None) && !state.mapping.is_empty() {
            // The capture job's last session: scans are instant here.
            facts.log_scan = Fact::Known(Some(LogScan {
                start_time: state.last_scan,
                end_time: Some(state.last_scan),
                latency_seconds: 0,
                error_count: 0,
            }));
        }
        Ok(facts)
    }

    async fn lsn_time(&mut self, lsn: Lsn) -> Result<Option<NaiveDateTime>, SourceError> {
        let state = self.call()?;
        // sys.fn_cdc_map_lsn_to_time: the mapping row at or before the LSN.
        let at = state.mapping.partition_point(|(l, _)| *l <= lsn);
        Ok(at.checked_sub(1).map(|i| state.mapping[i].1))
    }

    async fn max_lsn(&mut self) -> Result<MaxLsn, SourceError> {
        let state = self.call()?;
        Ok(MaxLsn {
            lsn: state.max_lsn(),
            catalog_version: state.version,
        })
    }

    async fn min_lsn(&mut self, capture_instance: &str) -> Result<Option<Lsn>, SourceError> {
        let state = self.call()?;
        Ok(state.min_lsn(capture_instance))
    }

    async fn probe(&mut self, probes: &[Probe], to: Lsn) -> Result<Vec<ProbeResult>, SourceError> {
        let state = self.call()?;
        let mut results = Vec::with_capacity(probes.len());
        for p in probes {
            // The probe names every change table in one statement: one that was
            // dropped fails all of it (error 208).
            let Some(instance) = state
                .instances
                .iter()
                .find(|i| i.info.name == p.capture_instance)
            else {
                return Err(SimState::catalog_changed(format!(
                    "Invalid object name 'cdc.{}_CT' (error 208)",
                    p.capture_instance
                )));
            };
            let first = instance
                .rows
                .partition_point(|r| r.key.start_lsn <= p.after);
            let next_change = instance
                .rows
                .get(first)
                .map(|r| r.key.start_lsn)
                .filter(|lsn| *lsn <= to);
            results.push(ProbeResult {
                capture_instance: p.capture_instance.clone(),
                min_lsn: state.min_lsn(&p.capture_instance),
                next_change,
            });
        }
        Ok(results)
    }

    async fn read_changes(
        &mut self,
        instance: &CaptureInstance,
        after: RowKey,
        to: Lsn,
        limit: usize,
    ) -> Result<Vec<ChangeRow>, SourceError> {
        let mut state = self.call()?;
        for action in std::mem::take(&mut state.on_next_read) {
            state.apply(action);
        }
        let Some(sim) = state
            .instances
            .iter()
            .find(|i| i.info.name == instance.name)
        else {
            return Err(SimState::catalog_changed(format!(
                "Invalid object name 'cdc.{}_CT' (error 208)",
                instance.name
            )));
        };
        // The query names the columns the caller's catalog lists; they are found in
        // the change table by name.
        let mut wanted = Vec::new();
        for e in instance.emitted_columns() {
            let Some(at) = sim.info.columns.iter().position(|c| c.name == e.name()) else {
                return Err(SimState::catalog_changed(format!(
                    "Invalid column name '{}' (error 207)",
                    e.name()
                )));
            };
            wanted.push((at, e.sql_type));
        }
        let first = sim.rows.partition_point(|r| r.key <= after);
        let mut rows = Vec::new();
        for r in sim.rows[first..]
            .iter()
            .take_while(|r| r.key.start_lsn <= to)
            .take(limit)
        {
            let mut values = Vec::with_capacity(wanted.len());
            for &(at, sql_type) in &wanted {
                let value = &r.values[at];
                if !fits(value, sql_type) {
                    return Err(SimState::catalog_changed(format!(
                        "capture instance {}: column `{}` holds a value that is not {sql_type}",
                        instance.name, sim.info.columns[at].name
                    )));
                }
                values.push(value.clone());
            }
            rows.push(ChangeRow {
                values,
                end_time_offset_minutes: state.offset_at(r.end_time),
                ..r.clone()
            });
        }
        state.rows_read += rows.len();
        Ok(rows)
    }

    async fn table_rows(&mut self, instance: &CaptureInstance) -> Result<Option<u64>, SourceError> {
        let state = self.call()?;
        // sys.partitions' row count: exact here, an estimate on a server.
        Ok(state
            .tables
            .get(&instance.qualified_table())
            .map(|t| t.rows.len() as u64))
    }

    async fn read_table(
        &mut self,
        instance: &CaptureInstance,
        cursor: TableCursor<'_>,
        limit: usize,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        let mut state = self.call()?;
        let name = instance.qualified_table();
        if state.denied.contains(&name) {
            return Err(SourceError::PermissionDenied {
                message: format!(
                    "The SELECT permission was denied on the object '{}' (error 229)",
                    instance.table
                ),
            });
        }
        let Some(table) = state.tables.get(&name) else {
            return Err(SimState::catalog_changed(format!(
                "Invalid object name '{name}' (error 208)"
            )));
        };
        // The statement names the columns of the caller's catalog.
        let position = |column: &str| {
            table
                .columns
                .iter()
                .position(|c| c.name == column)
                .ok_or_else(|| {
                    SimState::catalog_changed(format!("Invalid column name '{column}' (error 207)"))
                })
        };
        let mut wanted = Vec::new();
        for e in instance.emitted_columns() {
            wanted.push((position(e.name())?, e.sql_type));
        }
        let mut key = Vec::new();
        for k in &instance.key_columns {
            let at = position(k)?;
            let sql_type = table.columns[at]
                .sql_type
                .clone()
                .map_err(|e| SimState::catalog_changed(format!("key column {k}: {e}")))?;
            key.push((at, sql_type));
        }
        let project = |row: &Vec<Value>| -> Result<Vec<Value>, SourceError> {
            wanted
                .iter()
                .map(|&(at, sql_type)| {
                    let value = &row[at];
                    if fits(value, sql_type) {
                        Ok(value.clone())
                    } else {
                        Err(SimState::catalog_changed(format!(
                            "table {name}: column `{}` holds a value that is not {sql_type}",
                            table.columns[at].name
                        )))
                    }
                })
                .collect()
        };
        let misuse = |what: &str| SourceError::Malformed {
            capture_instance: instance.name.clone(),
            message: format!("read_table: {what}"),
        };
        let mut rows = Vec::new();
        let mut pass_end = None;
        if key.is_empty() {
            // A heap, read by one statement ordered by every column (then, for
            // identical rows, storage order), resumed where the last call stopped.
            let from = match cursor {
                TableCursor::Start => None,
                TableCursor::Continue => Some(
                    state
                        .passes
                        .get(&instance.name)
                        .cloned()
                        .ok_or_else(|| misuse("no pass over the table was started"))?,
                ),
                TableCursor::AfterKey(_) => return Err(misuse("the table has no key")),
            };
            let mut ordered: Vec<(SortKey, &Vec<Value>)> = table
                .rows
                .iter()
                .map(|(stored, row)| {
                    let mut k: SortKey = wanted
                        .iter()
                        .map(|&(at, _)| order::part(&row[at]))
                        .collect();
                    k.extend(stored.iter().cloned());
                    (k, row)
                })
                .filter(|(k, _)| from.as_ref().is_none_or(|f| k > f))
                .collect();
            ordered.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, row) in ordered.into_iter().take(limit) {
                rows.push(project(row)?);
                pass_end = Some(k);
            }
            pass_end = pass_end.or(from);
        } else {
            let after = match cursor {
                TableCursor::Start => None,
                TableCursor::AfterKey(texts) if texts.len() == key.len() => Some(
                    key.iter()
                        .zip(texts)
                        .map(|(&(_, sql_type), text)| {
                            order::part_of_text(sql_type, text.as_deref())
                        })
                        .collect::<Option<SortKey>>()
                        .ok_or_else(|| misuse("a key value is not of its column's type"))?,
                ),
                _ => return Err(misuse("the cursor does not match the key")),
            };
            // ORDER BY the capture instance's key: the table's own key uses its index
            // (the map's order), another unique index sorts.
            if instance.key_columns == table.key {
                let range = match &after {
                    None => table.rows.range::<SortKey, _>(..),
                    Some(after) => table.rows.range::<SortKey, _>((
                        std::ops::Bound::Excluded(after),
                        std::ops::Bound::Unbounded,
                    )),
                };
                for (_, row) in range.take(limit) {
                    rows.push(project(row)?);
                }
                state.table_rows_read += rows.len();
                return Ok(rows);
            }
            let mut ordered: Vec<(SortKey, &Vec<Value>)> = table
                .rows
                .values()
                .map(|row| {
                    (
                        key.iter().map(|&(at, _)| order::part(&row[at])).collect(),
                        row,
                    )
                })
                .filter(|(k, _)| after.as_ref().is_none_or(|a| k > a))
                .collect();
            ordered.sort_by(|a, b| a.0.cmp(&b.0));
            for (_, row) in ordered.into_iter().take(limit) {
                rows.push(project(row)?);
            }
        }
        if let Some(end) = pass_end {
            state.passes.insert(instance.name.clone(), end);
        }
        state.table_rows_read += rows.len();
        Ok(rows)
    }

    async fn ddl_history(&mut self, capture_instance: &str) -> Result<Vec<DdlEvent>, SourceError> {
        let state = self.call()?;
        Ok(state
            .instances
            .iter()
            .filter(|i| i.info.name == capture_instance)
            .flat_map(|i| i.ddl.clone())
            .collect())
    }
}

//! An in-memory **simulator** of a CDC-enabled SQL Server database.
//!
//! It models the behaviour that SQL Server documents for CDC (SPEC §2), so that the
//! poll loop can be tested without a server: tables with data, capture instances with
//! change tables, an LSN clock, multi-statement multi-table transactions, idle
//! markers in `cdc.lsn_time_mapping`, a cleanup job that raises `min_lsn`, a schema
//! change that adds a second capture instance, op-3 rows whose unchanged LOB columns
//! are NULL, `min_lsn`/`max_lsn` not yet available right after CDC is enabled, and
//! injected transient faults. It is a model, not SQL Server: where the real server
//! could differ, the integration tests in `tests/sqlserver_integration.rs` decide.
//!
//! [`CdcSimulator`] is a cheap handle (`Clone`) to shared state, so a test can change
//! the database while a poller reads it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{Duration, NaiveDate, NaiveDateTime};
use uuid::Uuid;

use crate::event::Value;
use crate::event::value::{SqlType, TypeError};
use crate::lsn::Lsn;
use crate::source::{
    CaptureInstance, CapturedColumn, Catalog, ChangeRow, ChangeSource, DdlEvent, Probe,
    ProbeResult, RowKey, SourceError, op,
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
    key: Vec<String>,
    /// Current rows by the text of their key values.
    rows: BTreeMap<Vec<String>, Vec<Value>>,
}

/// The text of key values, as rows are indexed by it.
fn key_text(values: &[Value]) -> Vec<String> {
    values
        .iter()
        .map(|v| v.to_text().unwrap_or_default())
        .collect()
}

impl SimTable {
    fn key_of(&self, row: &[Value]) -> Vec<String> {
        let values: Vec<Value> = self
            .key
            .iter()
            .filter_map(|k| self.columns.iter().position(|c| &c.name == k))
            .filter_map(|i| row.get(i).cloned())
            .collect();
        key_text(&values)
    }
}

#[derive(Debug, Clone)]
struct SimInstance {
    info: CaptureInstance,
    table: String,
    min_lsn: Lsn,
    /// Rows in CDC order; values follow `info.columns` (all captured columns).
    rows: Vec<ChangeRow>,
    ddl: Vec<DdlEvent>,
}

#[derive(Debug, Clone)]
struct MappingRow {
    start_lsn: Lsn,
}

#[derive(Debug)]
struct SimState {
    database: String,
    guid: Uuid,
    utc_offset_minutes: i32,
    clock: u128,
    now: NaiveDateTime,
    tables: BTreeMap<String, SimTable>,
    instances: Vec<SimInstance>,
    mapping: Vec<MappingRow>,
    min_lsn_available: bool,
    faults: VecDeque<SourceError>,
    round_trips: usize,
    rows_read: usize,
}

impl SimState {
    fn next_lsn(&mut self) -> Lsn {
        self.clock += 1;
        Lsn::from_u128(self.clock).unwrap_or(Lsn::MAX)
    }

    fn max_lsn(&self) -> Option<Lsn> {
        self.mapping.iter().map(|m| m.start_lsn).max()
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

    /// Commits: returns the commit LSN (`__$start_lsn` of every row).
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
        let end_time = state.now;
        let mut seqvals = seqvals.into_iter();
        // (table, operation, command, seqval, old row, new row, changed columns)
        let mut images = Vec::new();
        for (command, statement) in self.statements.into_iter().enumerate() {
            let command_id = i32::try_from(command + 1).unwrap_or(i32::MAX);
            for row_statement in statement {
                let seqval = seqvals.next().unwrap_or(commit_lsn);
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
                        let key = t.key_of(&row);
                        if t.rows.contains_key(&key) {
                            return Err(format!("{table}: duplicate key {key:?}"));
                        }
                        t.rows.insert(key, row.clone());
                        images.push((table, op::INSERT, command_id, seqval, None, Some(row), None));
                    }
                    Statement::Update(table, key_values, set) => {
                        let t = state
                            .tables
                            .get_mut(&table)
                            .ok_or(format!("no table {table}"))?;
                        let key = key_text(&key_values);
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
                        t.rows.remove(&key);
                        t.rows.insert(new_key, new.clone());
                        images.push((
                            table,
                            op::UPDATE_AFTER,
                            command_id,
                            seqval,
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
                        let key = key_text(&key_values);
                        let old = t
                            .rows
                            .remove(&key)
                            .ok_or(format!("{table}: no row {key:?}"))?;
                        images.push((table, op::DELETE, command_id, seqval, Some(old), None, None));
                    }
                }
            }
        }
        let tails: Vec<usize> = state.instances.iter().map(|i| i.rows.len()).collect();
        for (table, operation, command_id, seqval, old, new, changed) in images {
            let columns = state
                .tables
                .get(&table)
                .map(|t| t.columns.clone())
                .unwrap_or_default();
            for instance in state.instances.iter_mut().filter(|i| i.table == table) {
                if instance.info.start_lsn > commit_lsn {
                    continue;
                }
                let project = |row: &Vec<Value>| -> Vec<Value> {
                    instance
                        .info
                        .columns
                        .iter()
                        .map(|c| {
                            columns
                                .iter()
                                .position(|tc| tc.name == c.name)
                                .and_then(|i| row.get(i).cloned())
                                .unwrap_or(Value::Null)
                        })
                        .collect()
                };
                let mask = update_mask(&instance.info.columns, changed.as_deref());
                let key = |operation| RowKey {
                    start_lsn: commit_lsn,
                    command_id,
                    seqval,
                    operation,
                };
                let row = |operation, values| ChangeRow {
                    key: key(operation),
                    update_mask: mask.clone(),
                    begin_lsn,
                    end_time,
                    values,
                };
                match operation {
                    op::INSERT => {
                        if let Some(new) = &new {
                            instance.rows.push(row(op::INSERT, project(new)));
                        }
                    }
                    op::DELETE => {
                        if let Some(old) = &old {
                            instance.rows.push(row(op::DELETE, project(old)));
                        }
                    }
                    _ => {
                        if let (Some(old), Some(new)) = (&old, &new) {
                            // Op 3 leaves unchanged LOB columns NULL.
                            let mut before = project(old);
                            for (i, c) in instance.info.columns.iter().enumerate() {
                                let lob = c.sql_type.as_ref().is_ok_and(SqlType::is_lob);
                                let changed_here =
                                    changed.as_ref().is_some_and(|ch| ch.contains(&c.name));
                                if lob && !changed_here {
                                    before[i] = Value::Null;
                                }
                            }
                            instance.rows.push(row(op::UPDATE_BEFORE, before));
                            instance.rows.push(row(op::UPDATE_AFTER, project(new)));
                        }
                    }
                }
            }
        }
        // This commit's rows all sort after every earlier row (its LSN is the highest),
        // so only the new tail needs ordering.
        for (instance, start) in state.instances.iter_mut().zip(tails) {
            instance.rows[start..].sort_by_key(|r| r.key);
        }
        state.mapping.push(MappingRow {
            start_lsn: commit_lsn,
        });
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
                utc_offset_minutes,
                clock: 0x0000_00B1_0000_0000_0000,
                now,
                tables: BTreeMap::new(),
                instances: Vec::new(),
                mapping: Vec::new(),
                min_lsn_available: true,
                faults: VecDeque::new(),
                round_trips: 0,
                rows_read: 0,
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
                columns,
                key: key.iter().map(|k| k.to_string()).collect(),
                rows: BTreeMap::new(),
            },
        );
    }

    /// `sys.sp_cdc_enable_table`: a capture instance named `name` (default
    /// `schema_table`) capturing the table's current columns from the next LSN on.
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
        let start_lsn = Lsn::from_u128(state.clock + 1).unwrap_or(Lsn::MAX);
        let columns = t
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| CapturedColumn {
                name: c.name.clone(),
                ordinal: u32::try_from(i + 1).unwrap_or(u32::MAX),
                table_index: u32::try_from(i).unwrap_or(u32::MAX),
                sql_type: c.sql_type.clone(),
            })
            .collect();
        let create_date = state.now;
        state.instances.push(SimInstance {
            info: CaptureInstance {
                name: name.clone(),
                schema: t.schema.clone(),
                table: t.name.clone(),
                start_lsn,
                create_date,
                columns,
                key_columns: t.key.clone(),
            },
            table: table.into(),
            min_lsn: start_lsn,
            rows: Vec::new(),
            ddl: Vec::new(),
        });
        Ok(name)
    }

    /// `ALTER TABLE … ADD column`: recorded in `cdc.ddl_history` of the table's
    /// capture instances, which keep capturing their old column list.
    pub fn add_column(&self, table: &str, column: SimColumn, fill: Value) -> Result<(), String> {
        let mut state = self.lock();
        let ddl_lsn = state.next_lsn();
        let ddl_time = state.now;
        let command = format!("ALTER TABLE {table} ADD [{}]", column.name);
        let t = state
            .tables
            .get_mut(table)
            .ok_or(format!("no table {table}"))?;
        t.columns.push(column);
        for row in t.rows.values_mut() {
            row.push(fill.clone());
        }
        for instance in state.instances.iter_mut().filter(|i| i.table == table) {
            instance.ddl.push(DdlEvent {
                capture_instance: instance.info.name.clone(),
                ddl_lsn,
                ddl_time,
                ddl_command: command.clone(),
            });
        }
        Ok(())
    }

    /// `sys.sp_cdc_disable_table` for one capture instance.
    pub fn disable_instance(&self, name: &str) {
        self.lock().instances.retain(|i| i.info.name != name);
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
        state.mapping.push(MappingRow { start_lsn: lsn });
        lsn
    }

    /// The cleanup job: removes change rows below `low_water` and raises each
    /// instance's `min_lsn` to it.
    pub fn cleanup(&self, low_water: Lsn) {
        let mut state = self.lock();
        for instance in &mut state.instances {
            instance.rows.retain(|r| r.key.start_lsn >= low_water);
            instance.min_lsn = instance.min_lsn.max(low_water);
        }
    }

    /// Whether `sys.fn_cdc_get_min_lsn` answers (it is NULL right after CDC is
    /// enabled, until the capture job has run).
    pub fn set_min_lsn_available(&self, available: bool) {
        self.lock().min_lsn_available = available;
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
        Ok(Catalog {
            database: state.database.clone(),
            database_guid: state.guid,
            server_utc_offset_minutes: state.utc_offset_minutes,
            instances: state.instances.iter().map(|i| i.info.clone()).collect(),
        })
    }

    async fn max_lsn(&mut self) -> Result<Option<Lsn>, SourceError> {
        let state = self.call()?;
        Ok(state.max_lsn())
    }

    async fn probe(&mut self, probes: &[Probe], to: Lsn) -> Result<Vec<ProbeResult>, SourceError> {
        let state = self.call()?;
        Ok(probes
            .iter()
            .filter_map(|p| {
                let instance = state
                    .instances
                    .iter()
                    .find(|i| i.info.name == p.capture_instance)?;
                let first = instance
                    .rows
                    .partition_point(|r| r.key.start_lsn <= p.after);
                let next_change = instance
                    .rows
                    .get(first)
                    .map(|r| r.key.start_lsn)
                    .filter(|lsn| *lsn <= to);
                Some(ProbeResult {
                    capture_instance: p.capture_instance.clone(),
                    min_lsn: state.min_lsn_available.then_some(instance.min_lsn),
                    next_change,
                })
            })
            .collect())
    }

    async fn read_changes(
        &mut self,
        instance: &CaptureInstance,
        after: RowKey,
        to: Lsn,
        limit: usize,
    ) -> Result<Vec<ChangeRow>, SourceError> {
        let mut state = self.call()?;
        let Some(sim) = state
            .instances
            .iter()
            .find(|i| i.info.name == instance.name)
        else {
            return Err(SourceError::Definite {
                message: format!("Invalid object name 'cdc.{}_CT'", instance.name),
            });
        };
        let emitted: Vec<usize> = sim
            .info
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.sql_type.is_ok())
            .map(|(i, _)| i)
            .collect();
        let first = sim.rows.partition_point(|r| r.key <= after);
        let rows: Vec<ChangeRow> = sim.rows[first..]
            .iter()
            .take_while(|r| r.key.start_lsn <= to)
            .take(limit)
            .map(|r| ChangeRow {
                values: emitted.iter().map(|&i| r.values[i].clone()).collect(),
                ..r.clone()
            })
            .collect();
        state.rows_read += rows.len();
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

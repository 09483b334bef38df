//! The synthetic workload's database: the few tables it writes, each captured by
//! one capture instance, and their change tables, answering the poller's queries
//! as a CDC-enabled database does.
//!
//! It is not a model of SQL Server (the test simulator, a crate of its own, is):
//! its tables never change shape, its capture job has no latency (a commit's change
//! rows and `cdc.lsn_time_mapping` row exist as soon as it commits), and nothing
//! fails. What it keeps of CDC is what the events carry:
//!
//! - each transaction takes one LSN to begin, one per row statement (`__$seqval`)
//!   and one to commit (`__$start_lsn` of all its rows); statements are numbered
//!   from 1 (`__$command_id`);
//! - an insert is one row (operation 2), a delete one (1), an update two: the row
//!   before (3), with unchanged large-value columns NULL as SQL Server records
//!   them, and after (4); `__$update_mask` marks every column of an insert or
//!   delete and the columns an update set;
//! - commit times are the server's local time on a clock that advances 7 ms a
//!   transaction, kept as a `datetime` column keeps them (1/300 s), on a server
//!   whose zone is UTC;
//! - a table read walks the rows in key order after a cursor's key.

use std::collections::{BTreeMap, VecDeque};

use chrono::{Duration, NaiveDate, NaiveDateTime};
use uuid::Uuid;

use crate::event::Value;
use crate::event::value::SqlType;
use crate::lsn::Lsn;
use crate::source::decode::as_datetime_column;
use crate::source::timezone::ServerOffsets;
use crate::source::{
    CaptureInstance, CaptureOptions, CaptureSettings, CapturedColumn, Catalog, CdcJob, ChangeRow,
    CommitTime, Fact, LogScan, MaxLsn, Probe, ProbeResult, RowKey, ServerFacts, SourceError,
    TableCursor, op, update_mask,
};

/// `@@SERVERNAME` of the synthetic server. Checkpoints record it: another name
/// would make every resumed synthetic stream warn of a failover.
const SERVER_NAME: &str = "simulator";

/// The first LSN the database gives is one past this.
const FIRST_LSN: u128 = 0x0000_00B1_0000_0000_0000;

/// A row's key: the values of its table's key columns (one or two whole numbers;
/// the second is 0 for a one-column key), in the tables' key order.
type Key = [i64; 2];

/// One table and its capture instance.
struct Table {
    /// `schema.name`, as statements name it.
    name: String,
    /// The columns' types, in column order; the first `key_columns` are the key.
    types: Vec<SqlType>,
    key_columns: usize,
    rows: BTreeMap<Key, Vec<Value>>,
    /// The capture instance, as the catalog describes it.
    instance: CaptureInstance,
    /// The change table, in CDC order.
    changes: VecDeque<ChangeRow>,
}

impl Table {
    fn key_of(&self, values: &[Value]) -> Result<Key, String> {
        let mut key = [0; 2];
        for (at, value) in values.iter().take(self.key_columns).enumerate() {
            key[at] = match value {
                Value::Int(n) => i64::from(*n),
                Value::BigInt(n) => *n,
                other => return Err(format!("{}: key value {other:?}", self.name)),
            };
        }
        Ok(key)
    }

    fn column(&self, name: &str) -> Result<usize, String> {
        self.instance
            .columns
            .iter()
            .position(|c| c.name == name)
            .ok_or(format!("{}: no column {name}", self.name))
    }
}

/// One statement of a transaction: an `INSERT` of a row (values in column order),
/// an `UPDATE … SET` of the row with the key values given, or a `DELETE` of it.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    Insert(Vec<Value>),
    Update(Vec<Value>, Vec<(&'static str, Value)>),
    Delete(Vec<Value>),
}

/// A transaction: statements on tables named `schema.name`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transaction {
    statements: Vec<(&'static str, Statement)>,
}

impl Transaction {
    /// Its statements, each with its table, in order.
    pub fn statements(&self) -> &[(&'static str, Statement)] {
        &self.statements
    }
}

impl Transaction {
    /// `INSERT` of one row (values in column order).
    pub(super) fn insert(mut self, table: &'static str, row: Vec<Value>) -> Self {
        self.statements.push((table, Statement::Insert(row)));
        self
    }

    /// `UPDATE … SET` the given columns of the row with key values `key`.
    pub(super) fn update(
        mut self,
        table: &'static str,
        key: Vec<Value>,
        set: Vec<(&'static str, Value)>,
    ) -> Self {
        self.statements.push((table, Statement::Update(key, set)));
        self
    }

    /// `DELETE` of the row with key values `key`.
    pub(super) fn delete(mut self, table: &'static str, key: Vec<Value>) -> Self {
        self.statements.push((table, Statement::Delete(key)));
        self
    }
}

/// The database.
pub(super) struct Database {
    name: String,
    guid: Uuid,
    /// The last LSN given.
    clock: u128,
    /// The server's local time (UTC).
    now: NaiveDateTime,
    tables: Vec<Table>,
    next_object_id: i32,
    /// Bumped by every change to `cdc.change_tables`.
    version: i64,
    /// `cdc.lsn_time_mapping`: commit LSNs and times.
    mapping: VecDeque<(Lsn, NaiveDateTime)>,
    /// Change rows read so far.
    rows_read: usize,
    /// Transactions committed (each scanned by the capture job at once).
    commits: i64,
}

impl Database {
    pub(super) fn new(name: &str, guid: Uuid) -> Self {
        Database {
            name: name.into(),
            guid,
            clock: FIRST_LSN,
            now: NaiveDate::from_ymd_opt(2026, 8, 7)
                .and_then(|d| d.and_hms_opt(16, 25, 0))
                .unwrap_or_default(),
            tables: Vec::new(),
            next_object_id: 1_000,
            version: 0,
            mapping: VecDeque::new(),
            rows_read: 0,
            commits: 0,
        }
    }

    pub(super) fn rename(&mut self, name: &str) {
        name.clone_into(&mut self.name);
    }

    fn next_lsn(&mut self) -> Lsn {
        self.clock += 1;
        Lsn::from_u128(self.clock).unwrap_or(Lsn::MAX)
    }

    /// `CREATE TABLE schema.name` whose first `key_columns` columns are its key,
    /// enabled for CDC at once (`sys.sp_cdc_enable_table` with its defaults; the
    /// capture instance is `schema_name`, its `start_lsn` the enable's LSN).
    pub(super) fn create_captured_table(
        &mut self,
        schema: &str,
        name: &str,
        columns: &[(&str, SqlType)],
        key_columns: usize,
    ) {
        let start_lsn = self.next_lsn();
        self.next_object_id += 1;
        let instance = CaptureInstance {
            name: format!("{schema}_{name}"),
            schema: schema.into(),
            table: name.into(),
            object_id: self.next_object_id,
            start_lsn: Some(start_lsn),
            create_date: as_datetime_column(self.now),
            columns: columns
                .iter()
                .enumerate()
                .map(|(at, (column, sql_type))| CapturedColumn {
                    name: (*column).into(),
                    ordinal: u32::try_from(at + 1).unwrap_or(u32::MAX),
                    table_index: u32::try_from(at).ok(),
                    dropped: None,
                    sql_type: Ok(*sql_type),
                    computed: false,
                    nullable: Some(at >= key_columns),
                    default: None,
                })
                .collect(),
            key_columns: columns
                .iter()
                .take(key_columns)
                .map(|(column, _)| (*column).into())
                .collect(),
            descending_keys: Vec::new(),
            has_command_id: true,
            options: CaptureOptions::default(),
        };
        // The capture instance appears, then its start_lsn is set.
        self.version += 2;
        self.tables.push(Table {
            name: format!("{schema}.{name}"),
            types: columns.iter().map(|(_, t)| *t).collect(),
            key_columns,
            rows: BTreeMap::new(),
            instance,
            changes: VecDeque::new(),
        });
    }

    /// Applies `transaction` to the tables and writes its change rows; the commit
    /// LSN. An error (a statement on a missing table, column or row, or a duplicate
    /// key) is the workload's own fault and leaves the database as it may be.
    pub(super) fn commit(&mut self, transaction: Transaction) -> Result<Lsn, String> {
        self.now += Duration::milliseconds(7);
        let begin_lsn = self.next_lsn();
        let seqvals: Vec<Lsn> = transaction
            .statements
            .iter()
            .map(|_| self.next_lsn())
            .collect();
        let commit_lsn = self.next_lsn();
        let end_time = as_datetime_column(self.now);
        for (command, ((table, statement), seqval)) in
            transaction.statements.into_iter().zip(seqvals).enumerate()
        {
            let t = self
                .tables
                .iter_mut()
                .find(|t| t.name == table)
                .ok_or(format!("no table {table}"))?;
            let row_key = |operation| RowKey {
                start_lsn: commit_lsn,
                command_id: i32::try_from(command + 1).unwrap_or(i32::MAX),
                seqval,
                operation,
            };
            let all = t.instance.columns.len();
            let change = |operation, update_mask: Vec<u8>, values| ChangeRow {
                key: row_key(operation),
                update_mask,
                begin_lsn,
                end_time,
                end_time_offsets: None,
                values,
            };
            match statement {
                Statement::Insert(row) => {
                    if row.len() != all {
                        return Err(format!("{table}: {} values for {all} columns", row.len()));
                    }
                    let key = t.key_of(&row)?;
                    if t.rows.contains_key(&key) {
                        return Err(format!("{table}: duplicate key {key:?}"));
                    }
                    t.rows.insert(key, row.clone());
                    t.changes
                        .push_back(change(op::INSERT, update_mask(all, 1..=all), row));
                }
                Statement::Delete(key_values) => {
                    let key = t.key_of(&key_values)?;
                    let old = t
                        .rows
                        .remove(&key)
                        .ok_or(format!("{table}: no row {key:?}"))?;
                    t.changes
                        .push_back(change(op::DELETE, update_mask(all, 1..=all), old));
                }
                Statement::Update(key_values, set) => {
                    let key = t.key_of(&key_values)?;
                    let mut set_at = Vec::with_capacity(set.len());
                    for (column, _) in &set {
                        set_at.push(t.column(column)?);
                    }
                    let row = t
                        .rows
                        .get_mut(&key)
                        .ok_or(format!("{table}: no row {key:?}"))?;
                    let mut before = row.clone();
                    for ((_, value), &at) in set.into_iter().zip(&set_at) {
                        row[at] = value;
                    }
                    let after = row.clone();
                    // Operation 3 leaves unchanged large-value columns NULL.
                    for (at, value) in before.iter_mut().enumerate() {
                        if t.types[at].is_lob() && !set_at.contains(&at) {
                            *value = Value::Null;
                        }
                    }
                    let mask = update_mask(all, set_at.iter().map(|at| at + 1));
                    t.changes
                        .push_back(change(op::UPDATE_BEFORE, mask.clone(), before));
                    t.changes.push_back(change(op::UPDATE_AFTER, mask, after));
                }
            }
        }
        self.mapping.push_back((commit_lsn, end_time));
        self.commits += 1;
        Ok(commit_lsn)
    }

    /// `sys.fn_cdc_get_max_lsn()`.
    pub(super) fn current_max_lsn(&self) -> Option<Lsn> {
        self.mapping.back().map(|(lsn, _)| *lsn)
    }

    /// Drops the change rows below `lsn`, and the mapping rows below it but the
    /// newest (which is `max_lsn`): nothing there will be asked for again.
    pub(super) fn forget_below(&mut self, lsn: Lsn) {
        for t in &mut self.tables {
            let below = t.changes.partition_point(|r| r.key.start_lsn < lsn);
            t.changes.drain(..below);
        }
        let below = self
            .mapping
            .partition_point(|(l, _)| *l < lsn)
            .min(self.mapping.len().saturating_sub(1));
        self.mapping.drain(..below);
    }

    /// Change rows held, in every change table.
    #[cfg(test)]
    pub(super) fn change_rows(&self) -> usize {
        self.tables.iter().map(|t| t.changes.len()).sum()
    }

    /// Change rows read so far.
    #[cfg(test)]
    pub(super) fn rows_read(&self) -> usize {
        self.rows_read
    }

    /// The offsets of a UTC server.
    fn offsets() -> Option<ServerOffsets> {
        Some(ServerOffsets {
            at: 0,
            hour_later: 0,
        })
    }

    pub(super) fn catalog(&self) -> Catalog {
        Catalog {
            server: SERVER_NAME.into(),
            database: self.name.clone(),
            database_guid: Some(self.guid),
            local_database_guid: Some(self.guid),
            server_utc_offset_minutes: 0,
            server_time_zone: Some("UTC".into()),
            version: self.version,
            invisible: Vec::new(),
            instances: self.tables.iter().map(|t| t.instance.clone()).collect(),
        }
    }

    pub(super) fn max_lsn(&self) -> MaxLsn {
        MaxLsn {
            lsn: self.current_max_lsn(),
            catalog_version: self.version,
        }
    }

    /// `sys.fn_cdc_get_min_lsn`: the instance's `start_lsn`, `None` for no such
    /// instance.
    pub(super) fn min_lsn(&self, capture_instance: &str) -> Option<Lsn> {
        self.table_of(capture_instance)
            .ok()
            .and_then(|t| t.instance.start_lsn)
    }

    /// `sys.fn_cdc_map_lsn_to_time`: the mapping row at or before `lsn`.
    pub(super) fn lsn_time(&self, lsn: Lsn) -> Option<CommitTime> {
        let at = self.mapping.partition_point(|(l, _)| *l <= lsn);
        at.checked_sub(1).map(|i| CommitTime {
            local: self.mapping[i].1,
            offsets: Self::offsets(),
        })
    }

    fn table_of(&self, capture_instance: &str) -> Result<&Table, SourceError> {
        self.tables
            .iter()
            .find(|t| t.instance.name == capture_instance)
            .ok_or_else(|| SourceError::CatalogChanged {
                message: format!("Invalid object name 'cdc.{capture_instance}_CT' (error 208)"),
            })
    }

    pub(super) fn probe(&self, probes: &[Probe], to: Lsn) -> Result<Vec<ProbeResult>, SourceError> {
        probes
            .iter()
            .map(|p| {
                let t = self.table_of(&p.capture_instance)?;
                let first = t.changes.partition_point(|r| r.key.start_lsn <= p.after);
                Ok(ProbeResult {
                    capture_instance: p.capture_instance.clone(),
                    min_lsn: t.instance.start_lsn,
                    next_change: t
                        .changes
                        .get(first)
                        .map(|r| r.key.start_lsn)
                        .filter(|lsn| *lsn <= to),
                })
            })
            .collect()
    }

    /// The change rows after `after` up to `to`, at most `limit`, with the columns
    /// `instance` names.
    pub(super) fn read_changes(
        &mut self,
        instance: &CaptureInstance,
        after: RowKey,
        to: Lsn,
        limit: usize,
    ) -> Result<Vec<ChangeRow>, SourceError> {
        let t = self.table_of(&instance.name)?;
        let wanted = wanted_columns(t, instance.change_columns().map(|c| c.column))?;
        let first = t.changes.partition_point(|r| r.key <= after);
        let rows: Vec<ChangeRow> = t
            .changes
            .range(first..)
            .take_while(|r| r.key.start_lsn <= to)
            .take(limit)
            .map(|r| ChangeRow {
                key: r.key,
                update_mask: r.update_mask.clone(),
                begin_lsn: r.begin_lsn,
                end_time: r.end_time,
                end_time_offsets: Self::offsets(),
                values: wanted.iter().map(|&at| r.values[at].clone()).collect(),
            })
            .collect();
        self.rows_read += rows.len();
        Ok(rows)
    }

    /// The table `schema.name`.
    fn table_named(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// The table's rows now (exact).
    pub(super) fn table_rows(&self, instance: &CaptureInstance) -> Option<u64> {
        self.table_named(&instance.qualified_table())
            .map(|t| t.rows.len() as u64)
    }

    /// The table's rows in key order after the cursor's key, at most `limit`, with
    /// the columns `instance` names.
    pub(super) fn read_table(
        &self,
        instance: &CaptureInstance,
        cursor: TableCursor<'_>,
        limit: usize,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        let misuse = |what: &str| SourceError::Malformed {
            capture_instance: instance.name.clone(),
            message: format!("read_table: {what}"),
        };
        let name = instance.qualified_table();
        let t = self
            .table_named(&name)
            .ok_or_else(|| SourceError::CatalogChanged {
                message: format!("Invalid object name '{name}' (error 208)"),
            })?;
        let wanted = wanted_columns(t, instance.emitted_columns().map(|c| c.column))?;
        let after = match cursor {
            TableCursor::Start => None,
            TableCursor::AfterKey(texts) if texts.len() == t.key_columns => {
                let mut key = [0; 2];
                for (at, text) in texts.iter().enumerate() {
                    key[at] = text
                        .as_deref()
                        .and_then(|text| text.parse().ok())
                        .ok_or_else(|| misuse("a key value is not of its column's type"))?;
                }
                Some(key)
            }
            _ => return Err(misuse("the cursor does not match the key")),
        };
        let range = match after {
            None => t.rows.range::<Key, _>(..),
            Some(after) => t
                .rows
                .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded)),
        };
        Ok(range
            .take(limit)
            .map(|(_, row)| wanted.iter().map(|&at| row[at].clone()).collect())
            .collect())
    }

    /// What `check` reads of the server: SQL Server 2022 Developer Edition with the
    /// Agent and both CDC jobs running at their defaults, the capture job's last
    /// session at the last commit.
    pub(super) fn server_facts(&self) -> ServerFacts {
        let last_scan = self.now;
        ServerFacts {
            product_version: "16.0.4135.4".into(),
            edition: "Developer Edition (64-bit)".into(),
            engine_edition: 3,
            database: self.name.clone(),
            cdc_enabled: true,
            // No connection: nothing to encrypt.
            encrypted: None,
            local_time: self.now,
            agent: Fact::Known("Running".into()),
            // sys.sp_cdc_add_job's defaults: three days' retention.
            jobs: Fact::Known(vec![
                CdcJob::capture(CaptureSettings::DEFAULT),
                CdcJob::cleanup(4320),
            ]),
            capture_running: Fact::Known(true),
            log_scan: Fact::Known((!self.mapping.is_empty()).then_some(LogScan {
                start_time: last_scan,
                end_time: Some(last_scan),
                latency_seconds: 0,
                error_count: 0,
                // Each commit is scanned on its own.
                tran_count: 1,
                total_tran_count: Some(self.commits),
            })),
            max_text_repl_size: Fact::Known(65_536),
        }
    }

    /// The server's clock in UTC.
    pub(super) fn clock(&self) -> chrono::DateTime<chrono::Utc> {
        self.now.and_utc()
    }
}

/// Where each of `columns` (by name) is in the table's rows: the columns a query
/// names are found by name, and one the table does not have fails it (error 207).
fn wanted_columns<'a>(
    t: &Table,
    columns: impl Iterator<Item = &'a CapturedColumn>,
) -> Result<Vec<usize>, SourceError> {
    columns
        .map(|c| {
            t.column(&c.name).map_err(|_| SourceError::CatalogChanged {
                message: format!("Invalid column name '{}' (error 207)", c.name),
            })
        })
        .collect()
}

//! DDL on the simulated database, as SQL Server answers it: `sys.sp_cdc_enable_table`
//! and `sys.sp_cdc_disable_table` with their errors (numbers and texts from *Database
//! Engine events and errors 22000–22999*; both need `db_owner`, *sys.sp_cdc_enable_table*,
//! Permissions), `ALTER TABLE` on captured tables (*About change data capture*,
//! Handling changes to source tables), and `sp_rename`.

use super::*;
use mssql_ces::mssql::SqlErrorKind;

/// An error SQL Server raises for a DDL statement: its number and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Msg {number}: {message}")]
pub struct SimDdlError {
    pub number: u32,
    pub message: String,
}

impl SimDdlError {
    /// As the driver reports it: 22904 (not `db_owner`) is a permission error.
    pub(super) fn into_source_error(self) -> SourceError {
        let message = self.to_string();
        if self.number == 22904 {
            SourceError::Sql(SqlErrorKind::PermissionDenied { message })
        } else {
            SourceError::definite(message)
        }
    }

    fn not_owner() -> Self {
        SimDdlError {
            number: 22904,
            message: "Caller is not authorized to initiate the requested action. DBO privileges are required.".into(),
        }
    }

    fn no_table(table: &str) -> Self {
        SimDdlError {
            number: 4902,
            message: format!(
                "Cannot find the object \"{table}\" because it does not exist or you do not have permissions."
            ),
        }
    }

    /// 4924, for `verb` (`ALTER COLUMN`, `DROP COLUMN`).
    fn no_column(verb: &str, table: &str, column: &str) -> Self {
        SimDdlError {
            number: 4924,
            message: format!(
                "ALTER TABLE {verb} failed because column '{column}' does not exist in table '{table}'."
            ),
        }
    }
}

/// A table has at most two capture instances, and an instance name is unique in
/// the database.
fn check_new_instance(
    state: &SimState,
    t: &SimTable,
    table: &str,
    name: &str,
) -> Result<(), SimDdlError> {
    if state.instances.iter().filter(|i| i.table == table).count() >= 2 {
        return Err(SimDdlError {
            number: 22962,
            message: format!(
                "Two capture instances already exist for source table '{}.{}'. A table can have at most two capture instances. If the current tracking options are not appropriate, disable change tracking for the obsolete instance by using sys.sp_cdc_disable_table and retry the operation.",
                t.schema, t.name
            ),
        });
    }
    if state.instances.iter().any(|i| i.info.name == name) {
        return Err(SimDdlError {
            number: 22926,
            message: format!(
                "Could not create a capture instance because the capture instance name '{name}' already exists in the current database. Specify an explicit unique name for the parameter @capture_instance."
            ),
        });
    }
    Ok(())
}

/// `@captured_column_list` names columns of the table, the key among them.
fn check_captured_list(t: &SimTable, list: &[String]) -> Result<(), SimDdlError> {
    if let Some(missing) = list
        .iter()
        .find(|n| !t.columns.iter().any(|c| &c.name == *n))
    {
        return Err(SimDdlError {
            number: 22918,
            message: format!(
                "One or more columns in the list of included columns was not a captured column of the change table {missing}."
            ),
        });
    }
    if let Some(key) = t.key.iter().find(|k| !list.contains(k)) {
        return Err(SimDdlError {
            number: 22945,
            message: format!(
                "Could not add column information to the cdc.captured_columns system table for source table '{}.{}'. The index column '{key}' must be in the captured column list.",
                t.schema, t.name
            ),
        });
    }
    Ok(())
}

impl CdcSimulator {
    /// `sys.sp_cdc_enable_table`: a capture instance named `name` (default
    /// `schema_table`) capturing the table's current columns. Its `start_lsn` is NULL
    /// until the capture job scans the enable. Refused as SQL Server refuses it: 22904
    /// without `db_owner`, 22931 for a table that does not exist, 22962 when the table
    /// has two instances already, 22926 for a name in use.
    pub fn enable_table(&self, table: &str, name: Option<&str>) -> Result<String, SimDdlError> {
        self.enable_table_with(table, name, &CaptureOptions::default(), None)
    }

    /// `sys.sp_cdc_enable_table` with its options and `@captured_column_list`
    /// (`None`: every column). Every name must be a column of the table, and the key
    /// columns must be in it ("Columns defined in a primary key index … must be
    /// included", the procedure's page); the numbers of those two errors are not
    /// documented — 22918 and 22945 here, unverified.
    pub fn enable_table_with(
        &self,
        table: &str,
        name: Option<&str>,
        options: &CaptureOptions,
        captured: Option<&[String]>,
    ) -> Result<String, SimDdlError> {
        let mut state = self.lock();
        if !state.db_owner {
            return Err(SimDdlError::not_owner());
        }
        let t = state.tables.get(table).cloned().ok_or(SimDdlError {
            number: 22931,
            message: format!(
                "Source table '{table}' does not exist in the current database. Ensure that the correct database context is set. Specify a valid schema and table name for the database."
            ),
        })?;
        let name = name.map_or_else(|| format!("{}_{}", t.schema, t.name), str::to_owned);
        check_new_instance(&state, &t, table, &name)?;
        if let Some(list) = captured {
            check_captured_list(&t, list)?;
        }
        let enabled_at = state.next_lsn();
        let captured_columns = || {
            t.columns
                .iter()
                .enumerate()
                .filter(|(_, c)| captured.is_none_or(|list| list.contains(&c.name)))
        };
        let column_ids = captured_columns().map(|(_, c)| c.id).collect();
        let columns = captured_columns()
            .enumerate()
            .map(|(ordinal, (i, c))| CapturedColumn {
                name: c.name.clone(),
                ordinal: u32::try_from(ordinal + 1).unwrap_or(u32::MAX),
                table_index: u32::try_from(i).ok(),
                dropped: None,
                sql_type: c.sql_type.clone(),
                computed: c.computed,
                nullable: Some(c.nullable && !t.key.contains(&c.name)),
                default: c.default.clone(),
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
                descending_keys: Vec::new(),
                has_command_id: true,
                options: options.clone(),
            },
            table: table.into(),
            enabled_at,
            column_ids,
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
    pub fn add_column(
        &self,
        table: &str,
        column: SimColumn,
        fill: Value,
    ) -> Result<(), SimDdlError> {
        let command = format!("ALTER TABLE {table} ADD [{}]", column.name);
        self.alter(table, command, |t| {
            t.push_column(column);
            for row in t.rows.values_mut() {
                row.push(fill.clone());
            }
            Ok(None)
        })
    }

    /// `ALTER TABLE … DROP COLUMN`: the source table loses the column at once; the
    /// change tables keep it, NULL in later rows.
    pub fn drop_column(&self, table: &str, column: &str) -> Result<(), SimDdlError> {
        let command = format!("ALTER TABLE {table} DROP COLUMN [{column}]");
        self.alter(table, command, |t| {
            // A key column: its primary key depends on it.
            if t.key.iter().any(|k| k == column) {
                return Err(SimDdlError {
                    number: 5074,
                    message: format!(
                        "The object 'PK_{}' is dependent on column '{column}'.",
                        t.name
                    ),
                });
            }
            let at = t
                .columns
                .iter()
                .position(|c| c.name == column)
                .ok_or(SimDdlError::no_column("DROP COLUMN", table, column))?;
            t.columns.remove(at);
            for row in t.rows.values_mut() {
                row.remove(at);
            }
            Ok(None)
        })
    }

    /// `ALTER TABLE … ALTER COLUMN` to another type: the source table's type changes
    /// at once, a change table's when the capture job scans the DDL.
    pub fn alter_column_type(
        &self,
        table: &str,
        column: &str,
        to: SqlType,
    ) -> Result<(), SimDdlError> {
        let command = format!("ALTER TABLE {table} ALTER COLUMN [{column}] {to}");
        self.alter(table, command, |t| {
            let at = t
                .columns
                .iter()
                .position(|c| c.name == column)
                .ok_or(SimDdlError::no_column("ALTER COLUMN", table, column))?;
            t.columns[at].sql_type = Ok(to);
            for row in t.rows.values_mut() {
                row[at] = convert(&row[at], to);
            }
            Ok(Some((t.columns[at].id, to)))
        })
    }

    /// Runs `change` on the table and logs the DDL for the capture job; `change`
    /// names the column whose type it changed, if it did.
    fn alter(
        &self,
        table: &str,
        command: String,
        change: impl FnOnce(&mut SimTable) -> Result<Option<(u32, SqlType)>, SimDdlError>,
    ) -> Result<(), SimDdlError> {
        let mut state = self.lock();
        let lsn = state.next_lsn();
        let time = datetime(state.now);
        let t = state
            .tables
            .get_mut(table)
            .ok_or(SimDdlError::no_table(table))?;
        let retype = change(t)?;
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

    /// `sys.sp_cdc_disable_table` as the login may run it: 22904 without `db_owner`.
    pub fn try_disable_instance(&self, name: &str) -> Result<(), SimDdlError> {
        let mut state = self.lock();
        if !state.db_owner {
            return Err(SimDdlError::not_owner());
        }
        state.disable(name);
        Ok(())
    }

    /// `sys.sp_cdc_cleanup_change_table` for `capture_instance` as the daemon's
    /// batch runs it (`CLEANUP_CHANGE_TABLE`): the mark is the latest
    /// `cdc.lsn_time_mapping` entry at or below `through`, lowered to the smallest
    /// entry that shares its commit time (the procedure's page, @low_water_mark);
    /// only a mark above the instance's `start_lsn` is applied (a lower one is error
    /// 22957, which the batch avoids): `start_lsn` becomes it and the change rows
    /// below it are deleted. It does not touch `cdc.lsn_time_mapping`. 22904
    /// without `db_owner` (the page's Permissions). An unknown capture instance is
    /// refused (its number and text here are not SQL Server's: the daemon names only
    /// instances the catalog listed).
    pub fn try_cleanup_change_table(
        &self,
        capture_instance: &str,
        through: Lsn,
    ) -> Result<(Option<Lsn>, Option<Lsn>), SimDdlError> {
        let mut state = self.lock();
        if !state.db_owner {
            return Err(SimDdlError::not_owner());
        }
        let Some(index) = state
            .instances
            .iter()
            .position(|i| i.info.name == capture_instance)
        else {
            return Err(SimDdlError {
                number: 0,
                message: format!("no capture instance {capture_instance}"),
            });
        };
        let entry = state.mapping.partition_point(|(lsn, _)| *lsn <= through);
        let mark = entry.checked_sub(1).map(|last| {
            let time = state.mapping[last].1;
            let first = state.mapping[..=last]
                .iter()
                .rposition(|(_, t)| *t != time)
                .map_or(0, |before| before + 1);
            state.mapping[first].0
        });
        let min_lsn = state.min_lsn(capture_instance);
        if let (Some(mark), Some(low)) = (mark, min_lsn)
            && mark > low
        {
            let instance = &mut state.instances[index];
            instance.info.start_lsn = Some(mark);
            let before = instance.rows.len();
            instance.rows.retain(|r| r.key.start_lsn >= mark);
            let deleted = (before - instance.rows.len()) as u64;
            state.version += 1;
            state.change_table_cleanups += 1;
            state.cleaned_rows += deleted;
        }
        Ok((mark, state.min_lsn(capture_instance)))
    }

    /// How many `sys.sp_cdc_cleanup_change_table` calls moved a low end, and the
    /// change rows they deleted.
    pub fn change_table_cleanups(&self) -> (u64, u64) {
        let state = self.lock();
        (state.change_table_cleanups, state.cleaned_rows)
    }

    /// Whether the login is in `db_owner` (default: yes).
    pub fn set_db_owner(&self, owner: bool) {
        self.lock().db_owner = owner;
    }

    /// `sp_rename 'schema.table', 'new'`: allowed with CDC on. Capture instances are
    /// tied to the table's `object_id`, not its name (`cdc.change_tables.
    /// source_object_id`), so they keep their names and go on capturing, and the
    /// catalog names the table by its new name (`OBJECT_NAME(source_object_id)`).
    /// Debezium's `SqlServerConnectorIT` renames a captured table and keeps
    /// streaming it. No `cdc.ddl_history` row: that table records column changes.
    pub fn rename_table(&self, table: &str, new_name: &str) -> Result<(), SimDdlError> {
        let mut state = self.lock();
        let schema = table.split_once('.').map_or("dbo", |(schema, _)| schema);
        if state.tables.contains_key(&format!("{schema}.{new_name}")) {
            return Err(SimDdlError {
                number: 15335,
                message: format!(
                    "Error: The new name '{new_name}' is already in use as a object name and would cause a duplicate that is not permitted."
                ),
            });
        }
        let mut t = state.tables.remove(table).ok_or(SimDdlError {
            number: 15248,
            message: format!("Either the parameter @objname is ambiguous or the claimed @objtype (OBJECT) is wrong: '{table}'"),
        })?;
        t.name = new_name.to_owned();
        let key = format!("{}.{new_name}", t.schema);
        state.tables.insert(key.clone(), t);
        for instance in state.instances.iter_mut().filter(|i| i.table == table) {
            instance.table = key.clone();
            instance.info.table = new_name.to_owned();
        }
        state.version += 1;
        Ok(())
    }

    /// `sp_rename 'schema.table.column', 'new', 'COLUMN'`: refused while a capture
    /// instance captures the column (Debezium's `SqlServerChangeTableSetIT` disables
    /// CDC first, "otherwise rename fails"; the engine's own check, so the error's
    /// number is not documented — 4928 here, unverified); allowed for a column no
    /// instance captures.
    pub fn rename_column(
        &self,
        table: &str,
        column: &str,
        new_name: &str,
    ) -> Result<(), SimDdlError> {
        let mut state = self.lock();
        let captured = state
            .instances
            .iter()
            .any(|i| i.table == table && i.info.columns.iter().any(|c| c.name == column));
        if captured {
            return Err(SimDdlError {
                number: 4928,
                message: format!(
                    "Cannot alter column '{column}' because it is 'enabled for Change Data Capture'."
                ),
            });
        }
        let t = state.tables.get_mut(table).ok_or(SimDdlError {
            number: 15248,
            message: format!("Either the parameter @objname is ambiguous or the claimed @objtype (COLUMN) is wrong: '{table}.{column}'"),
        })?;
        let c = t.columns.iter_mut().find(|c| c.name == column).ok_or(SimDdlError {
            number: 15248,
            message: format!("Either the parameter @objname is ambiguous or the claimed @objtype (COLUMN) is wrong: '{table}.{column}'"),
        })?;
        c.name = new_name.to_owned();
        t.columns_changed();
        Ok(())
    }
}

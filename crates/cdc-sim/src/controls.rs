//! Driving the simulated database: what SQL Server's jobs and clock do (the capture
//! and cleanup jobs, the server's time zone), and what a test makes the database do
//! or reads of it: faults, permissions, visibility and counters.

use super::*;

/// What SQL Server's own jobs and clock do.
impl CdcSimulator {
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

    /// A scan that stops after the log's first `records` records (commits, DDL,
    /// enables), as the job's scan stops after `maxtrans` transactions; the rest
    /// waits for the next.
    pub fn run_capture_job_for(&self, records: usize) {
        self.lock().scan_records(records);
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

    /// Gives the server a time zone it can name (`CURRENT_TIMEZONE_ID()`): rows then
    /// carry the offset in force at their commit time.
    pub fn set_time_zone(&self, zone: Tz) {
        self.lock().time_zone = Some(zone);
    }

    /// Makes the server one that cannot name its time zone (SQL Server 2016–2019,
    /// before `CURRENT_TIMEZONE_ID()`): rows carry no offsets, the catalog names no
    /// zone.
    pub fn forget_time_zone(&self) {
        self.lock().time_zone = None;
    }

    /// The current `sys.fn_cdc_get_max_lsn()`.
    pub fn current_max_lsn(&self) -> Option<Lsn> {
        self.lock().max_lsn()
    }
    /// Renames the database (`DB_NAME()`, the name events carry).
    pub fn set_database(&self, name: &str) {
        self.lock().database = name.to_owned();
    }
}

/// Test controls: what a test makes the database do or tells about it.
impl CdcSimulator {
    /// Changes what the catalog says of a capture instance (none: nothing).
    fn change_instance(&self, capture_instance: &str, change: impl FnOnce(&mut CaptureInstance)) {
        if let Some(i) = self
            .lock()
            .instances
            .iter_mut()
            .find(|i| i.info.name == capture_instance)
        {
            change(&mut i.info);
        }
    }

    /// Gives keyed table reads a time ([`ReadLatency`]); `None`: instant.
    pub fn set_read_latency(&self, latency: Option<ReadLatency>) {
        self.lock().read_latency = latency;
    }

    /// Makes `action` happen just before the next `read_changes` answers.
    pub fn on_next_read(&self, action: SimAction) {
        self.lock().on_next_read.push(action);
    }

    /// Uses the columns of a unique index as the instance's key (`@index_name` of
    /// `sp_cdc_enable_table`), as `cdc.index_columns` then lists them.
    pub fn set_index_columns(&self, capture_instance: &str, columns: &[&str]) {
        self.change_instance(capture_instance, |info| {
            info.key_columns = columns.iter().map(|c| c.to_string()).collect()
        });
    }

    /// Makes the instance's key index sort `columns` descending (`PRIMARY KEY (a,
    /// b DESC)`), as `sys.index_columns.is_descending_key` then says.
    pub fn set_descending_key_columns(&self, capture_instance: &str, columns: &[&str]) {
        self.change_instance(capture_instance, |info| {
            info.descending_keys = columns.iter().map(|c| c.to_string()).collect()
        });
    }

    /// Gives the instance a gating role (`@role_name` of `sp_cdc_enable_table`, as
    /// `cdc.change_tables.role_name` then says): a login outside it gets 0x00 from
    /// `sys.fn_cdc_get_min_lsn` (*sys.fn_cdc_get_min_lsn*; *sys.sp_cdc_enable_table*,
    /// `@role_name`).
    pub fn set_gating_role(&self, capture_instance: &str, role: Option<&str>) {
        self.change_instance(capture_instance, |info| {
            info.options.role_name = role.map(str::to_owned)
        });
    }

    /// An application transaction that wrote `table` (`schema.table`) is open
    /// (`true`) or ended. While it is, `sys.sp_cdc_enable_table` and
    /// `sys.sp_cdc_disable_table` on the table wait for a schema-modification lock
    /// behind it (both take one on the source table); the source runs them with
    /// `SET LOCK_TIMEOUT`, so each gives up with 1222 after that time, changing
    /// nothing (Learn: SET LOCK_TIMEOUT).
    pub fn hold_write_lock(&self, table: &str, held: bool) {
        let mut state = self.lock();
        if held {
            state.write_locked.insert(table.to_owned());
        } else {
            state.write_locked.remove(table);
        }
    }

    /// How many times CDC's enable or disable procedure was called.
    pub fn capture_ddl_calls(&self) -> u64 {
        self.lock().capture_ddl_calls
    }

    /// Makes the login a member of `role`, or not.
    pub fn set_role_member(&self, role: &str, member: bool) {
        let mut state = self.lock();
        if member {
            state.roles.insert(role.to_owned());
        } else {
            state.roles.remove(role);
        }
    }

    /// Models a change table created before `__$command_id` existed.
    pub fn remove_command_id(&self, capture_instance: &str) {
        self.change_instance(capture_instance, |info| info.has_command_id = false);
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
    /// The database joins an availability group (`Some`, its `group_database_id`,
    /// which every replica shares and which becomes the database's GUID) or leaves
    /// it (`None`). A failover to another replica is [`CdcSimulator::set_guid`]
    /// with the group kept: each replica has its own `database_guid`.
    pub fn set_availability_group(&self, group: Option<Uuid>) {
        self.lock().group_guid = group;
    }

    /// Reads as a readable secondary of an availability group does: the change
    /// tables and `cdc.lsn_time_mapping` as the primary's log redone up to `lsn`
    /// (redo lags the primary), so `sys.fn_cdc_get_max_lsn()` is the last commit at
    /// or below it ("change data can also be gathered from secondary nodes", Learn:
    /// Replication, change tracking and CDC in availability groups). A failover to
    /// a replica further behind moves it back. `None`: the primary.
    pub fn set_redone_through(&self, lsn: Option<Lsn>) {
        self.lock().redone_through = lsn;
    }

    pub fn set_guid_readable(&self, readable: bool) {
        self.lock().guid_readable = readable;
    }

    /// Sets the server's local clock (commit times follow it).
    pub fn set_local_time(&self, now: NaiveDateTime) {
        let mut state = self.lock();
        state.now = now;
        state.second_occurrence = false;
    }

    /// Sets the server's clock to an instant: its local time is that instant in the
    /// server's zone (UTC without one). Unlike [`set_local_time`](Self::set_local_time)
    /// this can reach the second occurrence of an hour the clocks repeat.
    pub fn set_utc_time(&self, now: chrono::DateTime<chrono::Utc>) {
        let mut state = self.lock();
        state.now = match state.time_zone {
            Some(tz) => now.with_timezone(&tz).naive_local(),
            None => now.naive_utc(),
        };
        // The first reading of that local time is not the instant: the second.
        state.second_occurrence = false;
        state.second_occurrence = state.utc_now() != now;
    }

    /// Advances the server's local clock.
    pub fn advance_local_time(&self, by: Duration) {
        self.lock().now += by;
    }

    /// Makes the next call fail with `error`.
    pub fn inject_fault(&self, error: SourceError) {
        self.lock().faults.push_back(error);
    }

    /// The max LSN and catalog fingerprint, as a server-level probe reads them
    /// (not a round trip of this database's own).
    pub fn peek_max_lsn(&self) -> mssql_ces::source::MaxLsn {
        let state = self.lock();
        mssql_ces::source::MaxLsn {
            lsn: state.max_lsn(),
            catalog_version: state.version,
        }
    }

    /// Whether CDC is enabled on the database (`sys.databases.is_cdc_enabled`).
    pub fn cdc_enabled(&self) -> bool {
        self.lock().server.cdc_enabled
    }

    /// Calls made through [`ChangeSource`] so far (each is one round trip).
    pub fn round_trips(&self) -> usize {
        self.lock().round_trips
    }

    /// Change rows returned by `read_changes` so far.
    /// Charges every change page what `cost` says the server's seeks examine.
    pub fn set_change_seek(&self, cost: SeekCost) {
        self.lock().change_seek = Some(cost);
    }

    /// Change-table rows examined so far, by the model set with
    /// [`CdcSimulator::set_change_seek`].
    pub fn rows_examined(&self) -> usize {
        self.lock().rows_examined
    }

    pub fn rows_read(&self) -> usize {
        self.lock().rows_read
    }

    /// The current rows of `table` (`schema.name`) in key order, each as its
    /// columns' names and values: what a consumer's copy must equal.
    /// The names of `table`'s columns now, in column order.
    pub fn table_columns(&self, table: &str) -> Vec<String> {
        let state = self.lock();
        state.tables.get(table).map_or_else(Vec::new, |t| {
            t.columns.iter().map(|c| c.name.clone()).collect()
        })
    }

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
}

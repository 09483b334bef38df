//! The simulator answers the [`ChangeSource`] calls as SQL Server answers the
//! poller's queries: one call, one round trip (counted, and where a queued fault
//! is returned).

use super::*;
use mssql_ces::mssql::SqlErrorKind;

impl CdcSimulator {
    /// One call of CDC's enable or disable procedure on `schema.table`: counted,
    /// and given up with 1222 while a transaction holds the table's locks.
    fn capture_ddl_call(&self, schema: &str, table: &str) -> Result<(), SourceError> {
        let mut state = self.call()?;
        state.capture_ddl_calls += 1;
        let name = format!("{schema}.{table}");
        if state.write_locked.contains(&name) {
            return Err(SourceError::LockTimeout {
                table: name,
                waited_ms: mssql_ces::source::queries::CAPTURE_DDL_LOCK_TIMEOUT_MS,
                message: "Lock request time out period exceeded.".into(),
            });
        }
        Ok(())
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

impl CdcReads for CdcSimulator {
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
            // The source table as it is now: a dropped column has no position, no
            // nullability and no default (`sys.columns` has no row for it).
            let table = state.tables.get(&i.table);
            for (c, id) in info.columns.iter_mut().zip(&i.column_ids) {
                let source = table.and_then(|t| {
                    let at = t.columns.iter().position(|n| n.id == *id)?;
                    Some((t, at, &t.columns[at]))
                });
                c.table_index = source.and_then(|(_, at, _)| u32::try_from(at).ok());
                // Dropped: where it stood among the columns left (`column_id` order).
                c.dropped = match (source, table) {
                    (None, Some(t)) => Some(DroppedColumn {
                        columns_before: u32::try_from(
                            t.columns.iter().filter(|n| n.id < *id).count(),
                        )
                        .unwrap_or(u32::MAX),
                        at: None,
                    }),
                    _ => None,
                };
                c.nullable = source
                    .map(|(t, _, column)| column.nullable && !t.key.iter().any(|k| k == &c.name));
                c.default = source.and_then(|(_, _, column)| column.default.clone());
            }
            instances.push(info);
        }
        Ok(Catalog {
            server: "simulator".into(),
            database: state.database.clone(),
            database_guid: state
                .guid_readable
                .then_some(state.group_guid.unwrap_or(state.guid)),
            local_database_guid: state.guid_readable.then_some(state.guid),
            server_utc_offset_minutes: state.utc_offset_minutes,
            server_time_zone: state.time_zone.map(|tz| tz.name().to_owned()),
            version: state.version,
            invisible,
            instances,
        })
    }

    async fn lsn_time(&mut self, lsn: Lsn) -> Result<Option<CommitTime>, SourceError> {
        let state = self.call()?;
        // sys.fn_cdc_map_lsn_to_time: the mapping row at or before the LSN.
        let at = state.mapping.partition_point(|(l, _)| *l <= lsn);
        Ok(at.checked_sub(1).map(|i| {
            let local = state.mapping[i].1;
            CommitTime {
                local,
                offsets: state.offsets_at(local),
            }
        }))
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
        for e in instance.change_columns() {
            let Some(at) = sim.info.columns.iter().position(|c| c.name == e.name()) else {
                return Err(SimState::catalog_changed(format!(
                    "Invalid column name '{}' (error 207)",
                    e.name()
                )));
            };
            wanted.push((at, e.sql_type));
        }
        let examined = state.change_seek.as_ref().map_or(0, |cost| {
            let key = |i: usize| sim.rows[i].key;
            cost.examined(&key, sim.rows.len(), &after, to, limit)
        });
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
                end_time_offsets: state.offsets_at(r.end_time),
                ..r.clone()
            });
        }
        state.rows_read += rows.len();
        state.rows_examined += examined;
        Ok(rows)
    }

    async fn ddl_history(&mut self, capture_instance: &str) -> Result<Vec<DdlEvent>, SourceError> {
        let state = self.call()?;
        // The offsets as the zoned query computes them on the server.
        Ok(state
            .instances
            .iter()
            .filter(|i| i.info.name == capture_instance)
            .flat_map(|i| i.ddl.clone())
            .map(|d| DdlEvent {
                offsets: state.offsets_at(d.ddl_time),
                ..d
            })
            .collect())
    }
}

impl TableReads for CdcSimulator {
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
        let (rows, latency) = self.read_table_now(instance, cursor, limit)?;
        if let Some(latency) = latency {
            tokio::time::sleep(latency.of(rows.len())).await;
        }
        Ok(rows)
    }

    async fn sample_rows(
        &mut self,
        instance: &CaptureInstance,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        self.sample_table_rows(instance)
    }
}

impl CdcSimulator {
    /// A table read as it answers, and how long a keyed one takes
    /// ([`set_read_latency`](Self::set_read_latency)).
    fn read_table_now(
        &self,
        instance: &CaptureInstance,
        cursor: TableCursor<'_>,
        limit: usize,
    ) -> Result<(Vec<Vec<Value>>, Option<super::ReadLatency>), SourceError> {
        let mut state = self.call()?;
        let read = TableRead::new(state.readable_table(instance)?, instance)?;
        if !read.key.is_empty() {
            return Ok((read.keyed(cursor, limit)?, state.read_latency));
        }
        let from = match cursor {
            TableCursor::Start => None,
            TableCursor::Continue => Some(
                state
                    .passes
                    .get(&instance.name)
                    .cloned()
                    .ok_or_else(|| read.misuse("no pass over the table was started"))?,
            ),
            TableCursor::AfterKey(_) => return Err(read.misuse("the table has no key")),
        };
        let (rows, pass_end) = read.heap(from, limit)?;
        if let Some(end) = pass_end {
            state.passes.insert(instance.name.clone(), end);
        }
        Ok((rows, None))
    }
}

impl CdcSimulator {
    /// `TableReads::sample_rows`, answered at once (for the stand-in).
    pub fn sample_table_rows(
        &self,
        instance: &CaptureInstance,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        let state = self.call()?;
        let read = TableRead::new(state.readable_table(instance)?, instance)?;
        if read.key.is_empty() {
            return Ok(Vec::new());
        }
        read.sample(mssql_ces::source::queries::SAMPLE_ROWS)
    }
}

impl SimState {
    /// `instance`'s source table as a `SELECT` on it finds it: 229 where the login
    /// may not read it, 208 where it is gone.
    fn readable_table(&self, instance: &CaptureInstance) -> Result<&SimTable, SourceError> {
        let name = instance.qualified_table();
        if self.denied.contains(&name) {
            return Err(SqlErrorKind::PermissionDenied {
                message: format!(
                    "The SELECT permission was denied on the object '{}' (error 229)",
                    instance.table
                ),
            }
            .into());
        }
        self.tables.get(&name).ok_or_else(|| {
            SimState::catalog_changed(format!("Invalid object name '{name}' (error 208)"))
        })
    }
}

impl FactReads for CdcSimulator {
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
                tran_count: state.last_scan_transactions,
                total_tran_count: Some(state.scanned_transactions),
            }));
        }
        Ok(facts)
    }
}

impl CaptureDdl for CdcSimulator {
    async fn may_manage_capture(&mut self) -> Result<bool, SourceError> {
        Ok(self.call()?.db_owner)
    }

    async fn enable_capture(&mut self, request: &EnableCapture) -> Result<(), SourceError> {
        self.capture_ddl_call(&request.schema, &request.table)?;
        self.enable_table_with(
            &format!("{}.{}", request.schema, request.table),
            Some(&request.capture_instance),
            &request.options,
            request.columns.as_deref(),
        )
        .map(drop)
        .map_err(SimDdlError::into_source_error)
    }

    async fn cleanup_change_table(
        &mut self,
        capture_instance: &str,
        through: Lsn,
    ) -> Result<mssql_ces::source::Cleaned, SourceError> {
        drop(self.call()?);
        let (low_water_mark, min_lsn) = self
            .try_cleanup_change_table(capture_instance, through)
            .map_err(SimDdlError::into_source_error)?;
        Ok(mssql_ces::source::Cleaned {
            low_water_mark,
            min_lsn,
        })
    }

    async fn disable_capture(&mut self, instance: &CaptureInstance) -> Result<(), SourceError> {
        self.capture_ddl_call(&instance.schema, &instance.table)?;
        self.try_disable_instance(&instance.name)
            .map_err(SimDdlError::into_source_error)
    }

    async fn uncaptured_columns(&mut self) -> Result<UncapturedColumns, SourceError> {
        let state = self.call()?;
        let mut out = Vec::new();
        for i in &state.instances {
            let Some(t) = state.tables.get(&i.table) else {
                continue;
            };
            for c in &t.columns {
                if !i.column_ids.contains(&c.id) {
                    out.push((i.info.name.clone(), c.name.clone()));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let found = !out.is_empty();
        Ok(UncapturedColumns {
            columns: out,
            read_at: found.then(|| datetime(state.now)),
            // sys.fn_cdc_map_lsn_to_time(sys.fn_cdc_get_max_lsn()).
            scanned_through: found
                .then(|| state.max_lsn())
                .flatten()
                .and_then(|max| state.mapping.iter().find(|(lsn, _)| *lsn == max))
                .map(|(_, time)| *time),
        })
    }

    async fn uncaptured_tables(&mut self) -> Result<Vec<UncapturedTable>, SourceError> {
        let state = self.call()?;
        Ok(state
            .tables
            .iter()
            .filter(|(name, _)| !state.instances.iter().any(|i| &i.table == *name))
            .map(|(_, t)| UncapturedTable {
                schema: t.schema.clone(),
                table: t.name.clone(),
            })
            .collect())
    }
}

impl SourceClock for CdcSimulator {
    /// The simulated clock: commit times are simulated, so ages are measured on it
    /// (not a round trip).
    fn clock(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        Some(self.lock().utc_now())
    }
}

/// One `read_table` statement over a simulated table: the columns it names (those
/// of the caller's catalog, which may be older than the table) and the key it
/// orders by.
struct TableRead<'a> {
    table: &'a SimTable,
    instance: &'a CaptureInstance,
    /// Per emitted column: its place in the table's rows and its type.
    wanted: Vec<(usize, SqlType)>,
    /// Per key column of the capture instance: its place and type.
    key: Vec<(usize, SqlType)>,
}

impl<'a> TableRead<'a> {
    /// A column the catalog names that the table no longer has is error 207, as
    /// the statement would fail with on SQL Server.
    fn new(table: &'a SimTable, instance: &'a CaptureInstance) -> Result<Self, SourceError> {
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
        Ok(TableRead {
            table,
            instance,
            wanted,
            key,
        })
    }

    fn misuse(&self, what: &str) -> SourceError {
        SourceError::Malformed {
            capture_instance: self.instance.name.clone(),
            message: format!("read_table: {what}"),
        }
    }

    /// The emitted values of a row; a value of another type than the catalog says
    /// is a catalog change, as the driver's decode would report it.
    fn project(&self, row: &[Value]) -> Result<Vec<Value>, SourceError> {
        self.wanted
            .iter()
            .map(|&(at, sql_type)| {
                let value = &row[at];
                if fits(value, sql_type) {
                    Ok(value.clone())
                } else {
                    Err(SimState::catalog_changed(format!(
                        "table {}: column `{}` holds a value that is not {sql_type}",
                        self.instance.qualified_table(),
                        self.table.columns[at].name
                    )))
                }
            })
            .collect()
    }

    /// A heap, read by one statement ordered by every column (then, for identical
    /// rows, storage order), resumed after `from`; the rows and where the pass got to.
    fn heap(
        &self,
        from: Option<SortKey>,
        limit: usize,
    ) -> Result<(Vec<Vec<Value>>, Option<SortKey>), SourceError> {
        let mut ordered: Vec<(SortKey, &Vec<Value>)> = self
            .table
            .rows
            .iter()
            .map(|(stored, row)| {
                let mut k: SortKey = self
                    .wanted
                    .iter()
                    .map(|&(at, _)| order::part(&row[at]))
                    .collect();
                k.extend(stored.iter().cloned());
                (k, row)
            })
            .filter(|(k, _)| from.as_ref().is_none_or(|f| k > f))
            .collect();
        ordered.sort_by(|a, b| a.0.cmp(&b.0));
        let mut rows = Vec::new();
        let mut pass_end = None;
        for (k, row) in ordered.into_iter().take(limit) {
            rows.push(self.project(row)?);
            pass_end = Some(k);
        }
        Ok((rows, pass_end.or(from)))
    }

    /// A keyed table in the capture instance's key order, after the cursor's key.
    /// The table's own key uses its index (the map's order); another unique index
    /// sorts.
    fn keyed(&self, cursor: TableCursor<'_>, limit: usize) -> Result<Vec<Vec<Value>>, SourceError> {
        let after = match cursor {
            TableCursor::Start => None,
            TableCursor::AfterKey(texts) if texts.len() == self.key.len() => Some(
                self.key
                    .iter()
                    .zip(texts)
                    .map(|(&(_, sql_type), text)| order::part_of_text(sql_type, text.as_deref()))
                    .collect::<Option<SortKey>>()
                    .ok_or_else(|| self.misuse("a key value is not of its column's type"))?,
            ),
            _ => return Err(self.misuse("the cursor does not match the key")),
        };
        // Per key column, whether its index sorts it descending (NULL, first
        // ascending, is then last).
        let descending: Vec<bool> = self
            .instance
            .key_columns
            .iter()
            .map(|k| self.instance.descending_keys.contains(k))
            .collect();
        let in_index_order = |a: &SortKey, b: &SortKey| {
            for ((x, y), &down) in a.iter().zip(b).zip(&descending) {
                let ordering = if down { y.cmp(x) } else { x.cmp(y) };
                if ordering != std::cmp::Ordering::Equal {
                    return ordering;
                }
            }
            std::cmp::Ordering::Equal
        };
        if self.instance.key_columns == self.table.key && !descending.contains(&true) {
            let range = match &after {
                None => self.table.rows.range::<SortKey, _>(..),
                Some(after) => self.table.rows.range::<SortKey, _>((
                    std::ops::Bound::Excluded(after),
                    std::ops::Bound::Unbounded,
                )),
            };
            return range
                .take(limit)
                .map(|(_, row)| self.project(row))
                .collect();
        }
        let mut ordered: Vec<(SortKey, &Vec<Value>)> = self
            .table
            .rows
            .values()
            .map(|row| {
                (
                    self.key
                        .iter()
                        .map(|&(at, _)| order::part(&row[at]))
                        .collect(),
                    row,
                )
            })
            .filter(|(k, _)| {
                after
                    .as_ref()
                    .is_none_or(|a| in_index_order(k, a) == std::cmp::Ordering::Greater)
            })
            .collect();
        ordered.sort_by(|a, b| in_index_order(&a.0, &b.0));
        ordered
            .into_iter()
            .take(limit)
            .map(|(_, row)| self.project(row))
            .collect()
    }

    /// About `about` rows spread evenly over the table, in index order: every
    /// n-th row. (`TABLESAMPLE` picks random pages; an even spread is its best case,
    /// which is what a test of the cut wants to know the ranges of.)
    fn sample(&self, about: usize) -> Result<Vec<Vec<Value>>, SourceError> {
        let step = (self.table.rows.len() / about.max(1)).max(1);
        if self.instance.key_columns == self.table.key && self.instance.descending_keys.is_empty() {
            return (self.table.rows.values().step_by(step))
                .map(|row| self.project(row))
                .collect();
        }
        let all = self.keyed(TableCursor::Start, usize::MAX)?;
        Ok(all.into_iter().step_by(step).collect())
    }
}

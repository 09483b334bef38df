//! [`ChangeSource`](crate::source::ChangeSource) on a real SQL Server, over TDS with tiberius.
//!
//! The connection, its time-outs and error classification are [`SqlConnection`]'s;
//! the catalog is read by [`catalog::read_catalog`]. This file runs the per-poll
//! queries and turns their rows into [`ChangeRow`]s, reading every column by name.
//!
//! The change query is built from the catalog's columns of the instance and rebuilt
//! whenever they change (a dropped column, a type change, a re-created instance): a
//! query cached past such a change would put values under the wrong names. A change
//! table or column that is gone (errors 208, 207) and a value of another type than the
//! catalog said are [`SourceError::CatalogChanged`]: the poller re-reads the catalog
//! and tries again, so a disabled or altered capture instance never stops the run.

use std::collections::HashMap;

use tiberius::ToSql;

use crate::event::Value;
use crate::event::value::SqlType;
use crate::lsn::Lsn;
pub use crate::mssql::{ConnectionString, SqlServerConfig, TdsClient};
use crate::mssql::{SqlConnection, SqlError};
use crate::source::catalog::{self, NamedRow, catalog_error, null};
use crate::source::decode::{DecodeError, decode_bytes, decode_change_value};
use crate::source::queries::{self, fixed};
use crate::source::{
    CaptureDdl, CaptureInstance, Catalog, CdcReads, ChangeRow, DdlEvent, FactReads, MaxLsn, Probe,
    ProbeResult, RowKey, SourceClock, SourceError, TableCursor, TableReads,
};
use crate::source::{EnableCapture, UncapturedColumns, UncapturedTable, capture_ddl};

/// The change query of one capture instance and what it was built from.
struct ChangeQuery {
    object_id: i32,
    columns: Vec<(String, SqlType)>,
    sql: String,
}

/// A CDC source on SQL Server.
pub struct SqlServerSource {
    conn: SqlConnection,
    /// `CURRENT_TIMEZONE_ID()`, once the catalog has been read, where the server has it.
    server_zone: Option<String>,
    change_queries: HashMap<String, ChangeQuery>,
    /// Open passes over tables without a key, per capture instance.
    passes: HashMap<String, Pass>,
    /// The transaction the last `cdc.lsn_time_mapping` fallback warning was for.
    time_mapping_warned: Option<Lsn>,
    /// How long a pass over a table without a key may wait for its first row: the
    /// server sorts the whole table before it (see [`DEFAULT_FIRST_ROW_TIMEOUT`]).
    first_row_timeout: std::time::Duration,
}

/// The default bound on a keyless table's first row (`snapshot.first_row_timeout_ms`):
/// the pass orders by every column, so SQL Server sorts the whole table (in tempdb)
/// before it sends one row — far longer than any query time-out for a big heap.
pub const DEFAULT_FIRST_ROW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// How long cancelling an abandoned pass on the server (TDS Attention) may take.
const CANCEL_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);

/// Errors that mean the catalog changed under a query: 208 invalid object name (a
/// change table dropped by `sp_cdc_disable_table`), 207 invalid column name.
fn catalog_changed(e: SqlError) -> SourceError {
    match e.code {
        Some(208 | 207) => SourceError::CatalogChanged {
            message: e.error.to_string(),
        },
        _ => e.into(),
    }
}

fn malformed(capture_instance: &str, error: DecodeError) -> SourceError {
    SourceError::Malformed {
        capture_instance: capture_instance.to_owned(),
        message: error.to_string(),
    }
}

/// The emitted columns of an instance: name and change-table type, in order.
fn emitted(instance: &CaptureInstance) -> Vec<(String, SqlType)> {
    instance
        .emitted_columns()
        .map(|e| (e.name().to_owned(), e.sql_type))
        .collect()
}

/// The transaction's begin LSN and commit time from its `cdc.lsn_time_mapping` row.
/// No row: the cleanup job, which deletes those too, raced the read (retrying lets
/// the next probe see the gap for what it is). A row with NULL columns (Learn does
/// not promise them: the table's page lists no nullability): each has a fallback,
/// said in a warning once per transaction (`warned`).
fn transaction_times(
    capture_instance: &str,
    row: &mut NamedRow,
    start_lsn: Lsn,
    warned: &mut Option<Lsn>,
) -> Result<(Lsn, chrono::NaiveDateTime), SourceError> {
    let bad = |e| malformed(capture_instance, e);
    if row.opt_lsn(fixed::MAPPED).map_err(bad)?.is_none() {
        return Err(SourceError::CatalogChanged {
            message: format!(
                "capture instance {capture_instance}: no cdc.lsn_time_mapping row for the transaction committed at {start_lsn} (cleanup racing the read?)"
            ),
        });
    }
    let begin_lsn = row.opt_lsn(fixed::BEGIN_LSN).map_err(bad)?;
    let end_time = row.opt_datetime(fixed::END_TIME).map_err(bad)?;
    let end_time_null = end_time.is_none();
    let end_time = match end_time {
        Some(time) => time,
        None => row.opt_datetime(fixed::BEGIN_TIME).map_err(bad)?.ok_or_else(|| {
            bad(DecodeError {
                column: fixed::END_TIME.to_owned(),
                message: format!(
                    "is NULL, and so is tran_begin_time, in cdc.lsn_time_mapping for the transaction committed at {start_lsn}: no commit time to give its events"
                ),
            })
        })?,
    };
    let fallbacks: Vec<&str> = [
        begin_lsn.is_none().then_some(
            "a NULL tran_begin_lsn: the events' transaction begin LSN is their commit LSN",
        ),
        end_time_null
            .then_some("a NULL tran_end_time: the events carry tran_begin_time as their time"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !fallbacks.is_empty() && warned.replace(start_lsn) != Some(start_lsn) {
        tracing::warn!(capture_instance, commit_lsn = %start_lsn, "cdc.lsn_time_mapping has {} for this transaction", fallbacks.join(" and "));
    }
    Ok((begin_lsn.unwrap_or(start_lsn), end_time))
}

/// [`decode_change_row`] for the benches: our side of decoding a change row, apart
/// from the driver's.
#[cfg(feature = "testing")]
pub fn decode_change_row_for_bench(
    row: NamedRow,
    columns: &[(String, SqlType)],
) -> Result<ChangeRow, SourceError> {
    decode_change_row("bench", row, columns, &mut None).map(|(row, _)| row)
}

/// One change row, every column taken by name. Besides the row: the names of the
/// columns whose text held invalid UTF-16 (replaced with U+FFFD). A value that does
/// not have its column's type is [`SourceError::CatalogChanged`] (the change table's
/// type changed since the catalog was read); anything else wrong is malformed.
///
/// `warned`: the transaction the last fallback warning was for, so that a big
/// transaction with NULL `cdc.lsn_time_mapping` columns warns once, not per row.
fn decode_change_row(
    capture_instance: &str,
    mut row: NamedRow,
    columns: &[(String, SqlType)],
    warned: &mut Option<Lsn>,
) -> Result<(ChangeRow, Vec<String>), SourceError> {
    let bad = |e| malformed(capture_instance, e);
    let start_lsn = row
        .opt_lsn(fixed::START_LSN)
        .map_err(bad)?
        .ok_or_else(|| bad(null(fixed::START_LSN)))?;
    let command_id = row.int(fixed::COMMAND_ID).map_err(bad)?;
    let seqval = row
        .opt_lsn(fixed::SEQVAL)
        .map_err(bad)?
        .ok_or_else(|| bad(null(fixed::SEQVAL)))?;
    let operation = row.int(fixed::OPERATION).map_err(bad)?;
    let update_mask = decode_bytes(
        fixed::UPDATE_MASK,
        row.take_raw(fixed::UPDATE_MASK).map_err(bad)?,
    )
    .map_err(bad)?;
    let (begin_lsn, end_time) = transaction_times(capture_instance, &mut row, start_lsn, warned)?;
    let end_time_offsets = row
        .opt_offsets(fixed::END_TIME_OFFSET, fixed::END_TIME_OFFSET_LATER)
        .map_err(bad)?;
    let out_of_range = |column: &str, value: i64| {
        bad(DecodeError {
            column: column.to_owned(),
            message: format!("{value} is out of range"),
        })
    };
    let (values, replaced) = decode_values(capture_instance, &mut row, columns)?;
    let change = ChangeRow {
        key: RowKey {
            start_lsn,
            command_id: i32::try_from(command_id)
                .map_err(|_| out_of_range(fixed::COMMAND_ID, command_id))?,
            seqval,
            operation: u8::try_from(operation)
                .map_err(|_| out_of_range(fixed::OPERATION, operation))?,
        },
        update_mask,
        begin_lsn,
        end_time,
        end_time_offsets,
        values,
    };
    Ok((change, replaced))
}

/// The emitted columns of a change or table row, by name. Besides the values: the
/// names of the columns whose text held invalid UTF-16 (replaced with U+FFFD).
fn decode_values(
    capture_instance: &str,
    row: &mut NamedRow,
    columns: &[(String, SqlType)],
) -> Result<(Vec<Value>, Vec<String>), SourceError> {
    let mut values = Vec::with_capacity(columns.len());
    let mut replaced = Vec::new();
    for (name, sql_type) in columns {
        let data = row
            .take_raw(name)
            .map_err(|e| malformed(capture_instance, e))?;
        let (value, lossy) =
            decode_change_value(name, sql_type, data).map_err(|e| SourceError::CatalogChanged {
                message: format!("capture instance {capture_instance}: {e}"),
            })?;
        if lossy {
            replaced.push(name.clone());
        }
        values.push(value);
    }
    Ok((values, replaced))
}

/// The key of a capture instance with each column's type, for the load's keyset; an
/// error names a key column that is not captured or of a type CES leaves out (its
/// values could not be passed back to the server).
fn typed_key(instance: &CaptureInstance) -> Result<Vec<(String, SqlType)>, SourceError> {
    instance
        .key_columns
        .iter()
        .map(|name| {
            instance
                .columns
                .iter()
                .find(|c| &c.name == name)
                .and_then(|c| c.sql_type.as_ref().ok())
                .map(|t| (name.clone(), *t))
                .ok_or_else(|| SourceError::Malformed {
                    capture_instance: instance.name.clone(),
                    message: format!(
                        "key column `{name}` is not captured or of a type CES leaves out, so the table cannot be loaded in key order; load it with snapshot.mode = \"never\" and enable CDC with @captured_column_list including it"
                    ),
                })
        })
        .collect()
}

/// A pass over a table without a key, read by one statement on a connection of its
/// own and handed over in chunks through a channel of one: the statement streams,
/// so memory holds two chunks at most.
type Pass = tokio::sync::mpsc::Receiver<Result<Vec<Vec<Value>>, SourceError>>;

/// What one pass reads and how.
struct PassPlan {
    /// The statement.
    sql: String,
    capture_instance: String,
    /// The columns the rows carry, in order, with their types.
    columns: Vec<(String, SqlType)>,
    /// Rows per chunk handed over.
    chunk_rows: usize,
    /// How long the first row may take (`snapshot.first_row_timeout_ms`): the
    /// server sorts the whole table first.
    first_row_timeout: std::time::Duration,
}

/// Reads the pass's rows into the channel; each row must come within the query
/// time-out, else the pass (and its connection) ends with a transient error.
async fn stream_pass(
    settings: crate::mssql::SqlServerConfig,
    plan: PassPlan,
    out: tokio::sync::mpsc::Sender<Result<Vec<Vec<Value>>, SourceError>>,
) {
    let capture_instance = plan.capture_instance.clone();
    let mut client = match crate::mssql::connect(&settings).await {
        Ok(client) => client,
        Err(e) => {
            let _ = out.send(Err(SourceError::from(e))).await;
            return;
        }
    };
    let result = read_pass(&mut client, &settings, &plan, &out).await;
    let abandoned = match result {
        Ok(finished) => !finished,
        Err(e) => {
            let _ = out.send(Err(e)).await;
            true
        }
    };
    if abandoned {
        // The statement may still run on the server (a sort in tempdb, its
        // schema-stability lock queueing DDL): cancel it with a TDS Attention
        // before the connection goes, within a bound.
        match tokio::time::timeout(CANCEL_BUDGET, client.cancel_query()).await {
            Ok(Ok(())) => tracing::debug!(
                capture_instance,
                "the abandoned pass was cancelled on the server"
            ),
            _ => tracing::warn!(
                capture_instance,
                "could not cancel the abandoned pass on the server; closing its connection ends it when the server notices"
            ),
        }
    }
}

/// Streams the pass's rows in chunks to `out`. `Ok(true)` when every row was sent,
/// `Ok(false)` when the reader went away first (the load moved on or stopped).
async fn read_pass(
    client: &mut crate::mssql::TdsClient,
    settings: &crate::mssql::SqlServerConfig,
    plan: &PassPlan,
    out: &tokio::sync::mpsc::Sender<Result<Vec<Vec<Value>>, SourceError>>,
) -> Result<bool, SourceError> {
    let PassPlan {
        sql,
        capture_instance,
        columns,
        chunk_rows: limit,
        first_row_timeout,
    } = plan;
    let (limit, first_row_timeout) = (*limit, *first_row_timeout);
    use futures_util::TryStreamExt as _;
    let classify = |e: tiberius::error::Error| SourceError::from(crate::mssql::classify(&e));
    let first_row_late = || {
        SourceError::transient(format!(
            "the first row of the pass over table {capture_instance} (no key: read in one pass the server sorts first) took longer than {} ms (snapshot.first_row_timeout_ms)",
            first_row_timeout.as_millis()
        ))
    };
    let started = tokio::time::Instant::now();
    // The answer's first token may itself wait for the sort.
    let query = tokio::select! {
        query = tokio::time::timeout(first_row_timeout, client.query(sql, &[])) => {
            query.map_err(|_| first_row_late())?
        }
        () = out.closed() => return Ok(false),
    };
    let mut rows = query.map_err(classify)?.into_row_stream();
    let mut chunk = Vec::with_capacity(limit.min(4096));
    let mut first = true;
    let mut index: Option<std::sync::Arc<catalog::ColumnIndex>> = None;
    loop {
        // The first row comes only once the server has sorted the whole table:
        // bounded on its own, not by the query time-out.
        let wait = if first {
            first_row_timeout.saturating_sub(started.elapsed())
        } else {
            settings.query_timeout
        };
        let next = tokio::select! {
            next = tokio::time::timeout(wait, rows.try_next()) => next.map_err(|_| {
                if first {
                    first_row_late()
                } else {
                    SourceError::transient(format!(
                            "a row of the pass over table {capture_instance} took longer than {} ms (source.query_timeout_ms)",
                            wait.as_millis()
                        ))
                }
            })?,
            () = out.closed() => return Ok(false),
        };
        let Some(row) = next.map_err(classify)? else {
            break;
        };
        first = false;
        let mut row = NamedRow::in_result(row, &mut index);
        let (values, _) = decode_values(capture_instance, &mut row, columns)?;
        chunk.push(values);
        if chunk.len() >= limit {
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(limit.min(4096)));
            if out.send(Ok(full)).await.is_err() {
                return Ok(false);
            }
        }
    }
    if !chunk.is_empty() && out.send(Ok(chunk)).await.is_err() {
        return Ok(false);
    }
    Ok(true)
}

impl SqlServerSource {
    /// The next chunk of the one pass over a table without a key: `Start` opens the
    /// pass (a statement streaming on a connection of its own), `Continue` takes
    /// its next chunk; empty once the pass has ended.
    async fn pass_chunk(
        &mut self,
        instance: &CaptureInstance,
        cursor: TableCursor<'_>,
        limit: usize,
        columns: Vec<(String, SqlType)>,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        let misuse = |what: &str| SourceError::Malformed {
            capture_instance: instance.name.clone(),
            message: format!("read_table: {what}"),
        };
        if cursor == TableCursor::Start {
            let (sender, receiver) = tokio::sync::mpsc::channel(1);
            let plan = PassPlan {
                sql: queries::read_table(instance, &[], None),
                capture_instance: instance.name.clone(),
                columns,
                chunk_rows: limit.max(1),
                first_row_timeout: self.first_row_timeout,
            };
            tokio::spawn(stream_pass(self.conn.settings().clone(), plan, sender));
            self.passes.insert(instance.name.clone(), receiver);
        } else if cursor != TableCursor::Continue {
            return Err(misuse("the table has no key"));
        }
        let Some(pass) = self.passes.get_mut(&instance.name) else {
            return Err(misuse("no pass over the table was started"));
        };
        // The task bounds each row by the query time-out (the first by the
        // first-row bound); this bounds the wait for a whole chunk, which the task
        // may spend waiting for the channel.
        let mut wait = self.conn.settings().query_timeout.saturating_mul(2);
        if cursor == TableCursor::Start {
            wait = wait.saturating_add(self.first_row_timeout);
        }
        match tokio::time::timeout(wait, pass.recv()).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                self.passes.remove(&instance.name);
                Ok(Vec::new())
            }
            Err(_) => {
                self.passes.remove(&instance.name);
                Err(SourceError::transient(format!(
                    "reading table {} took longer than {} ms (source.query_timeout_ms)",
                    instance.qualified_table(),
                    wait.as_millis()
                )))
            }
        }
    }

    /// Runs one of the reads of changes or table rows, where a missing object means
    /// the catalog changed, and decodes each row in order.
    async fn read_rows<T>(
        &mut self,
        sql: &str,
        params: &[&dyn ToSql],
        mut decode: impl FnMut(NamedRow) -> Result<T, SourceError>,
    ) -> Result<Vec<T>, SourceError> {
        let rows = self
            .conn
            .query(sql, params)
            .await
            .map_err(catalog_changed)?;
        let mut index = None;
        rows.into_iter()
            .map(|row| decode(NamedRow::in_result(row, &mut index)))
            .collect()
    }

    pub fn new(config: SqlServerConfig) -> Self {
        SqlServerSource {
            conn: SqlConnection::new(config),
            server_zone: None,
            change_queries: HashMap::new(),
            passes: HashMap::new(),
            time_mapping_warned: None,
            first_row_timeout: DEFAULT_FIRST_ROW_TIMEOUT,
        }
    }

    /// Another bound on a keyless table's first row than [`DEFAULT_FIRST_ROW_TIMEOUT`].
    pub fn with_first_row_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.first_row_timeout = timeout;
        self
    }

    /// The change query for `instance`, rebuilt when its columns or change table
    /// differ from what the cached one was built from.
    fn change_query(&mut self, instance: &CaptureInstance) -> &ChangeQuery {
        let columns: Vec<(String, SqlType)> = instance
            .change_columns()
            .map(|e| (e.name().to_owned(), e.sql_type))
            .collect();
        let zone = self.server_zone.is_some();
        let entry = self
            .change_queries
            .entry(instance.name.clone())
            .or_insert_with(|| ChangeQuery {
                object_id: instance.object_id,
                columns: Vec::new(),
                sql: String::new(),
            });
        if entry.sql.is_empty() || entry.object_id != instance.object_id || entry.columns != columns
        {
            *entry = ChangeQuery {
                object_id: instance.object_id,
                sql: queries::read_changes(instance, zone),
                columns,
            };
        }
        entry
    }

    /// Warns about text values whose invalid UTF-16 was replaced, naming the table,
    /// the column and the row's key.
    fn warn_replaced(
        instance: &CaptureInstance,
        row: &ChangeRow,
        columns: &[(String, SqlType)],
        replaced: &[String],
    ) {
        let key: Vec<String> = instance
            .key_columns
            .iter()
            .filter_map(|k| {
                let at = columns.iter().position(|(name, _)| name == k)?;
                let value = row.values.get(at).and_then(Value::to_text);
                Some(format!("{k}={}", value.unwrap_or_else(|| "NULL".into())))
            })
            .collect();
        for column in replaced {
            tracing::warn!(
                table = %instance.qualified_table(),
                %column,
                key = %key.join(", "),
                lsn = %row.key.start_lsn,
                "text held invalid UTF-16 (a lone surrogate); each invalid unit was replaced with U+FFFD"
            );
        }
    }
}

impl CdcReads for SqlServerSource {
    async fn catalog(&mut self) -> Result<Catalog, SourceError> {
        let catalog = catalog::read_catalog(&mut self.conn).await?;
        self.server_zone = catalog.server_time_zone.clone();
        Ok(catalog)
    }

    async fn max_lsn(&mut self) -> Result<MaxLsn, SourceError> {
        let rows = self.conn.query(queries::MAX_LSN, &[]).await?;
        let Some(row) = rows.into_iter().next() else {
            return Err(catalog_error(null("max_lsn")));
        };
        let mut row = NamedRow::new(row);
        let lsn = row.opt_lsn("max_lsn").map_err(catalog_error)?;
        Ok(MaxLsn {
            lsn: lsn.filter(|l| !l.is_zero()),
            catalog_version: catalog::fingerprint(&mut row).map_err(catalog_error)?,
        })
    }

    async fn min_lsn(&mut self, capture_instance: &str) -> Result<Option<Lsn>, SourceError> {
        let name = capture_instance.to_owned();
        let rows = self.conn.query(queries::MIN_LSN, &[&name]).await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let lsn = NamedRow::new(row)
            .opt_lsn("min_lsn")
            .map_err(catalog_error)?;
        Ok(lsn.filter(|l| !l.is_zero()))
    }

    async fn probe(&mut self, probes: &[Probe], to: Lsn) -> Result<Vec<ProbeResult>, SourceError> {
        let mut results = Vec::with_capacity(probes.len());
        for chunk in probes.chunks(queries::PROBE_CHUNK) {
            let names: Vec<&str> = chunk.iter().map(|p| p.capture_instance.as_str()).collect();
            let sql = queries::probe(&names);
            let to_bytes = to.to_vec();
            let afters: Vec<Vec<u8>> = chunk.iter().map(|p| p.after.to_vec()).collect();
            let mut params: Vec<&dyn ToSql> = vec![&to_bytes];
            for (probe, after) in chunk.iter().zip(&afters) {
                params.push(&probe.capture_instance);
                params.push(after);
            }
            let rows = self
                .conn
                .query(&sql, &params)
                .await
                .map_err(catalog_changed)?;
            for row in rows {
                let mut row = NamedRow::new(row);
                results.push(ProbeResult {
                    capture_instance: row.string("capture_instance").map_err(catalog_error)?,
                    min_lsn: row
                        .opt_lsn("min_lsn")
                        .map_err(catalog_error)?
                        .filter(|l| !l.is_zero()),
                    next_change: row.opt_lsn("next_change").map_err(catalog_error)?,
                });
            }
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
        let query = self.change_query(instance);
        let (sql, columns) = (query.sql.clone(), query.columns.clone());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (to, start, seqval) = (to.to_vec(), after.start_lsn.to_vec(), after.seqval.to_vec());
        let operation = i32::from(after.operation);
        let zone = self.server_zone.clone().unwrap_or_default();
        let mut params: Vec<&dyn ToSql> =
            vec![&limit, &to, &start, &after.command_id, &seqval, &operation];
        if self.server_zone.is_some() {
            params.push(&zone);
        }
        let mut warned = self.time_mapping_warned.take();
        let read = self
            .read_rows(&sql, &params, |row| {
                let (change, replaced) =
                    decode_change_row(&instance.name, row, &columns, &mut warned)?;
                if !replaced.is_empty() {
                    Self::warn_replaced(instance, &change, &columns, &replaced);
                }
                Ok(change)
            })
            .await;
        self.time_mapping_warned = warned;
        read
    }

    async fn lsn_time(
        &mut self,
        lsn: Lsn,
    ) -> Result<Option<crate::source::CommitTime>, SourceError> {
        crate::source::facts::lsn_time(&mut self.conn, lsn, self.server_zone.as_deref()).await
    }

    async fn ddl_history(&mut self, capture_instance: &str) -> Result<Vec<DdlEvent>, SourceError> {
        let name = capture_instance.to_owned();
        let rows = match self.server_zone.as_deref() {
            Some(zone) => {
                self.conn
                    .query(queries::DDL_HISTORY_ZONED, &[&name, &zone])
                    .await?
            }
            None => self.conn.query(queries::DDL_HISTORY, &[&name]).await?,
        };
        let zoned = self.server_zone.is_some();
        let mut out = Vec::new();
        for row in rows {
            let mut row = NamedRow::new(row);
            out.push(DdlEvent {
                capture_instance: row.string("capture_instance").map_err(catalog_error)?,
                ddl_lsn: row
                    .opt_lsn("ddl_lsn")
                    .map_err(catalog_error)?
                    .ok_or_else(|| catalog_error(null("ddl_lsn")))?,
                ddl_time: row.datetime("ddl_time").map_err(catalog_error)?,
                offsets: match zoned {
                    true => row
                        .opt_offsets("at_offset", "hour_later_offset")
                        .map_err(catalog_error)?,
                    false => None,
                },
                ddl_command: row.string("ddl_command").map_err(catalog_error)?,
            });
        }
        Ok(out)
    }
}

impl TableReads for SqlServerSource {
    async fn table_rows(&mut self, instance: &CaptureInstance) -> Result<Option<u64>, SourceError> {
        let name = queries::source_table(instance);
        let rows = self.conn.query(queries::TABLE_ROWS, &[&name]).await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let count = NamedRow::new(row)
            .opt_int("row_count")
            .map_err(catalog_error)?;
        Ok(count.and_then(|c| u64::try_from(c).ok()))
    }

    async fn read_table(
        &mut self,
        instance: &CaptureInstance,
        cursor: TableCursor<'_>,
        limit: usize,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        // Loads run one table at a time: a pass still open over another table belongs
        // to a load that ended (or was dropped). Closing its channel ends its task
        // and its connection.
        self.passes.retain(|name, _| name == &instance.name);
        let columns = emitted(instance);
        let key = typed_key(instance)?;
        let misuse = |what: &str| SourceError::Malformed {
            capture_instance: instance.name.clone(),
            message: format!("read_table: {what}"),
        };
        if key.is_empty() {
            return self.pass_chunk(instance, cursor, limit, columns).await;
        }
        let after = match cursor {
            TableCursor::Start => None,
            TableCursor::AfterKey(values) if values.len() == key.len() => Some(values),
            _ => return Err(misuse("the cursor does not match the key")),
        };
        let nulls: Option<Vec<bool>> = after.map(|a| a.iter().map(Option::is_none).collect());
        let sql = queries::read_table(instance, &key, nulls.as_deref());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let texts: Vec<&str> = after
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_deref())
            .collect();
        let mut params: Vec<&dyn ToSql> = vec![&limit];
        for text in &texts {
            params.push(text);
        }
        self.read_rows(&sql, &params, |mut row| {
            let (values, replaced) = decode_values(&instance.name, &mut row, &columns)?;
            for column in replaced {
                if instance.key_columns.contains(&column) {
                    // The load would resume after U+FFFD, not after the stored value.
                    return Err(SourceError::Malformed {
                        capture_instance: instance.name.clone(),
                        message: format!(
                            "key column `{column}` of {} holds invalid UTF-16 (a lone surrogate), which cannot be sent back to seek past it: load this table with snapshot.mode = \"never\" or fix the value",
                            instance.qualified_table()
                        ),
                    });
                }
                tracing::warn!(table = %instance.qualified_table(), %column, "text held invalid UTF-16 (a lone surrogate); each invalid unit was replaced with U+FFFD");
            }
            Ok(values)
        })
        .await
    }

    async fn sample_rows(
        &mut self,
        instance: &CaptureInstance,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        let key = typed_key(instance)?;
        if key.is_empty() {
            return Ok(Vec::new());
        }
        let columns = emitted(instance);
        let sql = queries::sample_table(instance, &key);
        self.read_rows(&sql, &[], |mut row| {
            decode_values(&instance.name, &mut row, &columns).map(|(values, _)| values)
        })
        .await
    }
}

impl FactReads for SqlServerSource {
    async fn server_facts(&mut self) -> Result<crate::source::ServerFacts, SourceError> {
        crate::source::facts::read(&mut self.conn).await
    }

    async fn log_scan(
        &mut self,
    ) -> Result<crate::source::Fact<Option<crate::source::LogScan>>, SourceError> {
        crate::source::facts::log_scan(&mut self.conn).await
    }
}

impl CaptureDdl for SqlServerSource {
    async fn may_manage_capture(&mut self) -> Result<bool, SourceError> {
        capture_ddl::may_manage(&mut self.conn).await
    }

    async fn enable_capture(&mut self, request: &EnableCapture) -> Result<(), SourceError> {
        capture_ddl::enable(&mut self.conn, request).await
    }

    async fn disable_capture(&mut self, instance: &CaptureInstance) -> Result<(), SourceError> {
        capture_ddl::disable(&mut self.conn, instance).await
    }

    async fn uncaptured_columns(&mut self) -> Result<UncapturedColumns, SourceError> {
        capture_ddl::uncaptured_columns(&mut self.conn).await
    }

    async fn uncaptured_tables(&mut self) -> Result<Vec<UncapturedTable>, SourceError> {
        capture_ddl::uncaptured_tables(&mut self.conn).await
    }

    async fn cleanup_change_table(
        &mut self,
        capture_instance: &str,
        through: Lsn,
    ) -> Result<crate::source::Cleaned, SourceError> {
        capture_ddl::cleanup(&mut self.conn, capture_instance, through).await
    }
}

impl SourceClock for SqlServerSource {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::value::Length;
    use crate::source::CapturedColumn;
    use std::borrow::Cow;
    use std::time::Duration;
    use tiberius::ColumnData;

    fn instance(columns: &[(&str, SqlType, Option<u32>)]) -> CaptureInstance {
        CaptureInstance {
            name: "dbo_T".into(),
            schema: "dbo".into(),
            table: "T".into(),
            object_id: 11,
            start_lsn: Some(Lsn::from_parts(1, 0, 0)),
            create_date: chrono::NaiveDateTime::default(),
            columns: columns
                .iter()
                .enumerate()
                .map(|(i, (name, t, index))| CapturedColumn {
                    name: (*name).into(),
                    ordinal: u32::try_from(i + 1).unwrap(),
                    table_index: *index,
                    dropped: None,
                    sql_type: Ok(*t),
                    computed: false,
                    nullable: Some(true),
                    default: None,
                })
                .collect(),
            key_columns: vec!["Id".into()],
            descending_keys: Vec::new(),
            has_command_id: true,
            options: Default::default(),
        }
    }

    fn source() -> SqlServerSource {
        SqlServerSource::new(SqlServerConfig {
            connection_string: ConnectionString::new("Server=tcp:127.0.0.1,1;User Id=u;Password=p"),
            trust_server_certificate: false,
            encrypt: true,
            connect_timeout: Duration::from_secs(1),
            query_timeout: Duration::from_secs(1),
        })
    }

    #[test]
    fn the_change_query_is_rebuilt_when_the_columns_change() {
        let mut source = source();
        let before = instance(&[
            ("Id", SqlType::Int, Some(0)),
            ("Gone", SqlType::Int, Some(1)),
            ("Name", SqlType::NVarChar(Length::Bounded(10)), Some(2)),
        ]);
        let first = source.change_query(&before).sql.clone();
        assert!(first.contains("[Gone]"), "{first}");
        // DROP COLUMN: the catalog now has no position for it.
        let after = instance(&[
            ("Id", SqlType::Int, Some(0)),
            ("Gone", SqlType::Int, None),
            ("Name", SqlType::NVarChar(Length::Bounded(10)), Some(1)),
        ]);
        let second = source.change_query(&after).sql.clone();
        assert!(!second.contains("[Gone]"), "{second}");
        // ALTER COLUMN to another type: rebuilt too.
        let retyped = instance(&[
            ("Id", SqlType::BigInt, Some(0)),
            ("Name", SqlType::NVarChar(Length::Bounded(10)), Some(1)),
        ]);
        assert_eq!(
            source.change_query(&retyped).columns[0],
            ("Id".to_owned(), SqlType::BigInt)
        );
        // A re-created instance with the same columns: rebuilt for its new table.
        let mut recreated = retyped.clone();
        recreated.object_id = 12;
        assert_eq!(source.change_query(&recreated).object_id, 12);
    }

    fn utf16(s: &str) -> ColumnData<'static> {
        ColumnData::Binary(Some(Cow::Owned(
            s.encode_utf16().flat_map(u16::to_le_bytes).collect(),
        )))
    }

    fn lsn(n: u16) -> ColumnData<'static> {
        ColumnData::Binary(Some(Cow::Owned(Lsn::from_parts(1, 2, n).to_vec())))
    }

    fn change_row(extra: Vec<(&'static str, ColumnData<'static>)>) -> NamedRow {
        let mut pairs = vec![
            (fixed::START_LSN, lsn(3)),
            (fixed::COMMAND_ID, ColumnData::I32(Some(1))),
            (fixed::SEQVAL, lsn(2)),
            (fixed::OPERATION, ColumnData::I32(Some(2))),
            (
                fixed::UPDATE_MASK,
                ColumnData::Binary(Some(Cow::Owned(vec![0x07]))),
            ),
            (fixed::BEGIN_LSN, lsn(1)),
            (
                fixed::END_TIME,
                ColumnData::DateTime(Some(tiberius::time::DateTime::new(46_000, 300))),
            ),
            (fixed::END_TIME_OFFSET, ColumnData::I32(Some(120))),
            (fixed::END_TIME_OFFSET_LATER, ColumnData::I32(Some(60))),
            (fixed::MAPPED, lsn(3)),
            (
                fixed::BEGIN_TIME,
                ColumnData::DateTime(Some(tiberius::time::DateTime::new(46_000, 0))),
            ),
        ];
        // A later pair of the same name replaces an earlier one.
        for (name, value) in extra {
            pairs.retain(|(n, _)| *n != name);
            pairs.push((name, value));
        }
        NamedRow::from_pairs(pairs)
    }

    /// A missing `cdc.lsn_time_mapping` row (cleanup raced the read) is told from
    /// NULL columns of a row that is there: those fall back, with a warning.
    #[test]
    fn a_missing_time_mapping_row_is_told_from_its_null_columns() {
        let columns = vec![("Id".to_owned(), SqlType::Int)];
        let id = ("Id", ColumnData::I32(Some(7)));
        let missing = change_row(vec![
            id.clone(),
            (fixed::MAPPED, ColumnData::Binary(None)),
            (fixed::BEGIN_LSN, ColumnData::Binary(None)),
            (fixed::END_TIME, ColumnData::DateTime(None)),
            (fixed::BEGIN_TIME, ColumnData::DateTime(None)),
        ]);
        let err = decode_change_row("dbo_T", missing, &columns, &mut None).unwrap_err();
        assert!(matches!(err, SourceError::CatalogChanged { .. }), "{err}");

        let log = crate::test_log::capture();
        let no_begin = change_row(vec![
            id.clone(),
            (fixed::BEGIN_LSN, ColumnData::Binary(None)),
        ]);
        let (change, _) = decode_change_row("dbo_T", no_begin, &columns, &mut None).unwrap();
        assert_eq!(change.begin_lsn, change.key.start_lsn, "the commit LSN");

        let no_end = change_row(vec![
            id.clone(),
            (fixed::END_TIME, ColumnData::DateTime(None)),
        ]);
        let (change, _) = decode_change_row("dbo_T", no_end, &columns, &mut None).unwrap();
        let begin_time = crate::source::decode::decode_naive_datetime(
            "t",
            ColumnData::DateTime(Some(tiberius::time::DateTime::new(46_000, 0))),
        )
        .unwrap()
        .unwrap();
        assert_eq!(change.end_time, begin_time, "tran_begin_time");
        let warned = |what: &str| {
            log.lines()
                .iter()
                .filter(|l| {
                    l["level"] == "WARN" && l["message"].as_str().is_some_and(|m| m.contains(what))
                })
                .count()
        };
        assert_eq!(warned("NULL tran_begin_lsn"), 1);
        assert_eq!(warned("NULL tran_end_time"), 1);

        let neither = change_row(vec![
            id,
            (fixed::END_TIME, ColumnData::DateTime(None)),
            (fixed::BEGIN_TIME, ColumnData::DateTime(None)),
        ]);
        let err = decode_change_row("dbo_T", neither, &columns, &mut None).unwrap_err();
        assert!(!err.is_transient(), "{err}");
        assert!(err.to_string().contains("no commit time"), "{err}");
    }

    #[test]
    fn change_rows_are_read_by_name_whatever_the_column_order() {
        let columns = vec![
            ("Name".to_owned(), SqlType::NVarChar(Length::Bounded(10))),
            ("Id".to_owned(), SqlType::Int),
        ];
        // The result lists Id before Name: values still land under their names.
        let row = change_row(vec![
            ("Id", ColumnData::I32(Some(7))),
            ("Name", utf16("Ada")),
        ]);
        let (change, replaced) = decode_change_row("dbo_T", row, &columns, &mut None).unwrap();
        assert_eq!(
            change.values,
            vec![Value::Text("Ada".into()), Value::Int(7)]
        );
        assert!(replaced.is_empty());
        assert_eq!(
            change.end_time_offsets,
            Some(crate::source::ServerOffsets {
                at: 120,
                hour_later: 60
            })
        );
        assert_eq!(change.key.command_id, 1);
        assert_eq!(change.key.operation, 2);
    }

    #[test]
    fn a_value_of_another_type_asks_for_the_catalog_again() {
        let columns = vec![("Id".to_owned(), SqlType::Int)];
        let row = change_row(vec![("Id", ColumnData::I64(Some(7)))]);
        let err = decode_change_row("dbo_T", row, &columns, &mut None).unwrap_err();
        assert!(matches!(err, SourceError::CatalogChanged { .. }), "{err}");
        assert!(err.is_transient());
    }

    #[test]
    fn missing_fixed_values_are_errors_not_defaults() {
        let columns = vec![("Id".to_owned(), SqlType::Int)];
        let mut row = change_row(vec![("Id", ColumnData::I32(Some(7)))]);
        row.replace(fixed::COMMAND_ID, ColumnData::I32(None));
        let err = decode_change_row("dbo_T", row, &columns, &mut None).unwrap_err();
        assert!(matches!(err, SourceError::Malformed { .. }), "{err}");
        assert!(err.to_string().contains("__$command_id"), "{err}");
        let mut row = change_row(vec![("Id", ColumnData::I32(Some(7)))]);
        row.replace(fixed::OPERATION, ColumnData::I32(Some(300)));
        assert!(decode_change_row("dbo_T", row, &columns, &mut None).is_err());
    }

    #[test]
    fn invalid_utf16_is_replaced_and_reported() {
        let columns = vec![("Name".to_owned(), SqlType::NVarChar(Length::Bounded(10)))];
        let lone = ColumnData::Binary(Some(Cow::Owned(vec![0x00, 0xDC])));
        let row = change_row(vec![("Name", lone)]);
        let (change, replaced) = decode_change_row("dbo_T", row, &columns, &mut None).unwrap();
        assert_eq!(change.values, vec![Value::Text("\u{FFFD}".into())]);
        assert_eq!(replaced, vec!["Name".to_owned()]);
    }
}

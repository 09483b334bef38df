//! What `source.capture_instances = "managed"` and `source.enable_cdc` run on SQL
//! Server: the `db_owner` check, `sys.sp_cdc_enable_table` and
//! `sys.sp_cdc_disable_table`, and the two catalog reads that decide them (the
//! columns a capture instance lacks, the tables without CDC). The T-SQL is in
//! [`queries`].

use crate::lsn::Lsn;
use crate::mssql::SqlConnection;
use crate::source::catalog::{NamedRow, catalog_error};
use crate::source::queries;
use crate::source::{
    CaptureInstance, Cleaned, EnableCapture, SourceError, UncapturedColumns, UncapturedTable,
};

/// `IS_DB_OWNER`: whether the login may run the CDC procedures.
pub(crate) async fn may_manage(conn: &mut SqlConnection) -> Result<bool, SourceError> {
    let rows = conn.query(queries::IS_DB_OWNER, &[]).await?;
    match rows.into_iter().next() {
        Some(row) => Ok(NamedRow::new(row)
            .opt_int("is_db_owner")
            .map_err(catalog_error)?
            == Some(1)),
        None => Ok(false),
    }
}

/// `sys.sp_cdc_enable_table` as `request` says.
pub(crate) async fn enable(
    conn: &mut SqlConnection,
    request: &EnableCapture,
) -> Result<(), SourceError> {
    let options = &request.options;
    let columns = request.columns.as_deref().map(queries::column_list);
    let net = i32::from(options.supports_net_changes);
    let switch = i32::from(options.allow_partition_switch.unwrap_or(true));
    conn.query(
        queries::ENABLE_TABLE,
        &[
            &request.schema,
            &request.table,
            &request.capture_instance,
            &options.role_name,
            &options.index_name,
            &options.filegroup_name,
            &net,
            &columns,
            &switch,
        ],
    )
    .await
    .map_err(|e| lock_timeout(e, &request.schema, &request.table))?;
    Ok(())
}

/// A lock wait that ran out is [`SourceError::LockTimeout`]: 1222 itself, or the
/// procedures' own error that wraps it (they catch what fails inside and raise an
/// error of their own whose text names the original number). Anything else is
/// what the connection made of it.
fn lock_timeout(e: crate::mssql::SqlError, schema: &str, table: &str) -> SourceError {
    let message = e.error.to_string();
    if e.code == Some(1222) || message.contains("1222") {
        return SourceError::LockTimeout {
            table: format!("{schema}.{table}"),
            waited_ms: queries::CAPTURE_DDL_LOCK_TIMEOUT_MS,
            message,
        };
    }
    e.into()
}

/// `sys.sp_cdc_disable_table` for one capture instance.
pub(crate) async fn disable(
    conn: &mut SqlConnection,
    instance: &CaptureInstance,
) -> Result<(), SourceError> {
    conn.query(
        queries::DISABLE_TABLE,
        &[&instance.schema, &instance.table, &instance.name],
    )
    .await
    .map_err(|e| lock_timeout(e, &instance.schema, &instance.table))?;
    Ok(())
}

/// `CLEANUP_CHANGE_TABLE`: `capture_instance`'s change table cleaned below the
/// latest commit at or below `through`.
pub(crate) async fn cleanup(
    conn: &mut SqlConnection,
    capture_instance: &str,
    through: Lsn,
) -> Result<Cleaned, SourceError> {
    let rows = conn
        .query(
            queries::CLEANUP_CHANGE_TABLE,
            &[&capture_instance, &through.to_vec()],
        )
        .await?;
    let Some(row) = rows.into_iter().next() else {
        return Err(SourceError::definite(
            "unexpected catalog result: the change table cleanup answered no row",
        ));
    };
    let mut row = NamedRow::new(row);
    Ok(Cleaned {
        low_water_mark: row.opt_lsn("low_water_mark").map_err(catalog_error)?,
        min_lsn: row
            .opt_lsn("min_lsn")
            .map_err(catalog_error)?
            .filter(|l| !l.is_zero()),
    })
}

/// `UNCAPTURED_COLUMNS`: per capture instance, its table's columns it lacks.
pub(crate) async fn uncaptured_columns(
    conn: &mut SqlConnection,
) -> Result<UncapturedColumns, SourceError> {
    let rows = conn.query(queries::UNCAPTURED_COLUMNS, &[]).await?;
    let mut found = UncapturedColumns::default();
    for row in rows {
        let mut row = NamedRow::new(row);
        found.columns.push((
            row.string("capture_instance").map_err(catalog_error)?,
            row.string("column_name").map_err(catalog_error)?,
        ));
        // The same in every row: the statement's time and the job's progress.
        found.read_at = Some(row.datetime("read_at").map_err(catalog_error)?);
        found.scanned_through = row.opt_datetime("scanned_through").map_err(catalog_error)?;
    }
    Ok(found)
}

/// `UNCAPTURED_TABLES`: user tables without CDC.
pub(crate) async fn uncaptured_tables(
    conn: &mut SqlConnection,
) -> Result<Vec<UncapturedTable>, SourceError> {
    let rows = conn.query(queries::UNCAPTURED_TABLES, &[]).await?;
    rows.into_iter()
        .map(|row| {
            let mut row = NamedRow::new(row);
            Ok(UncapturedTable {
                schema: row.string("schema_name").map_err(catalog_error)?,
                table: row.string("table_name").map_err(catalog_error)?,
            })
        })
        .collect()
}

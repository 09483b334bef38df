//! Reading the CDC catalog: the database, its capture instances, their columns and
//! key columns, into a [`Catalog`].
//!
//! Facts are read by column name, never by position, and taken from where they are
//! true for the values the poller reads:
//! - column types from the **change table's** own columns (`sys.columns` of
//!   `cdc.change_tables.object_id`): after `ALTER COLUMN`, the source table has the
//!   new type at once, the change table only when the capture job reaches the DDL;
//! - a column's position (`cols[].index`) from the **source table**, where a dropped
//!   column has none; the change table keeps it (with values in the rows committed
//!   before the drop, NULL after), and where it stood is counted among the columns
//!   left;
//! - key columns from `cdc.index_columns`: the index CDC itself uses to identify
//!   rows (the `@index_name` given to `sp_cdc_enable_table`, else the primary key).
//!
//! A value that is missing where one is required is an error naming it, never an
//! invented default.

use std::collections::HashMap;

use tiberius::{ColumnData, Row};
use uuid::Uuid;

use crate::event::value::{SqlType, TypeError};
use crate::lsn::Lsn;
use crate::mssql::{SqlConnection, SqlError, SqlErrorKind};
use crate::source::decode::{
    DecodeError, decode_guid, decode_int, decode_lsn, decode_naive_datetime, decode_string,
};
use crate::source::{
    CaptureInstance, CaptureOptions, CapturedColumn, Catalog, CatalogVersion, DroppedColumn,
    ServerOffsets, SourceError,
};

/// The columns of a catalog fingerprint, shared by [`CATALOG_VERSION`] and the
/// per-poll `MAX_LSN` query so both compute the same thing: a checksum of every
/// capture instance's name, change table and `start_lsn`, their count, and the
/// number of DDL records.
macro_rules! catalog_version_columns {
    () => {
        "(SELECT CHECKSUM_AGG(CHECKSUM(ct.capture_instance, ct.object_id, ct.start_lsn)) \
FROM cdc.change_tables AS ct) AS tables_checksum, \
(SELECT COUNT_BIG(*) FROM cdc.change_tables) AS tables_count, \
(SELECT COUNT_BIG(*) FROM cdc.ddl_history) AS ddl_count"
    };
}
pub(crate) use catalog_version_columns;

/// The catalog fingerprint alone.
pub const CATALOG_VERSION: &str = concat!("SELECT ", catalog_version_columns!(), ";");

/// The database, whether CDC is enabled on it, the engine edition (5 is Azure SQL
/// Database, which has no `sys.database_recovery_status`), and the server's current
/// UTC offset in minutes.
/// <https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-databases-transact-sql>
pub const DATABASE_INFO: &str = "SELECT @@SERVERNAME AS server_name, \
DB_NAME() AS database_name, d.is_cdc_enabled, \
CAST(SERVERPROPERTY('EngineEdition') AS int) AS engine_edition, \
DATEPART(TZOFFSET, SYSDATETIMEOFFSET()) AS utc_offset_minutes \
FROM sys.databases AS d WHERE d.database_id = DB_ID();";

/// The database's GUID on SQL Server and Managed Instance: in an availability group
/// `sys.databases.group_database_id`, which every replica shares (each replica's own
/// `database_guid` differs: a restore makes a new one), so a failover keeps the
/// stream; otherwise `sys.database_recovery_status.database_guid`, which has no row
/// unless the login owns the database or has `VIEW ANY DATABASE`.
/// <https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-database-recovery-status-transact-sql>
pub const DATABASE_GUID: &str = "SELECT COALESCE(d.group_database_id, drs.database_guid) \
AS database_guid, drs.database_guid AS local_guid \
FROM sys.databases AS d \
LEFT JOIN sys.database_recovery_status AS drs ON drs.database_id = d.database_id \
WHERE d.database_id = DB_ID();";

/// The database GUID on Azure SQL Database (`logical_database_guid` stays the same
/// for the life of the database). Needs `VIEW DATABASE STATE`.
/// <https://learn.microsoft.com/sql/relational-databases/system-dynamic-management-views/sys-dm-user-db-resource-governor-azure-sql-database>
pub const DATABASE_GUID_AZURE: &str = "SELECT logical_database_guid AS database_guid, \
logical_database_guid AS local_guid \
FROM sys.dm_user_db_resource_governance WHERE database_id = DB_ID();";

/// The server's time zone (SQL Server 2022+, Azure SQL), and whether `AT TIME ZONE`
/// knows it (`sys.time_zone_info`): only then can the change query compute each
/// commit's offset with it. Older servers answer error 195 (not a built-in function).
/// <https://learn.microsoft.com/sql/t-sql/functions/current-timezone-id-transact-sql>
pub const SERVER_TIME_ZONE: &str = "SELECT CURRENT_TIMEZONE_ID() AS time_zone_id, \
CAST(CASE WHEN EXISTS (SELECT 1 FROM sys.time_zone_info AS tzi \
WHERE tzi.name = CURRENT_TIMEZONE_ID()) THEN 1 ELSE 0 END AS int) AS usable;";

/// Capture instances: change table, source table (NULL names when the login cannot
/// see it), `start_lsn` (NULL until the capture job's first scan) and whether the
/// change table has `__$command_id`.
/// <https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-change-tables-transact-sql>
pub const CAPTURE_INSTANCES: &str = "SELECT ct.capture_instance, ct.object_id, \
OBJECT_SCHEMA_NAME(ct.source_object_id) AS schema_name, \
OBJECT_NAME(ct.source_object_id) AS table_name, \
ct.start_lsn, ct.create_date, ct.role_name, ct.index_name, ct.filegroup_name, \
CAST(ct.supports_net_changes AS int) AS supports_net_changes, \
CAST(ct.partition_switch AS int) AS partition_switch, \
CAST(CASE WHEN EXISTS (SELECT 1 FROM sys.columns AS c \
WHERE c.object_id = ct.object_id AND c.name = N'__$command_id') THEN 1 ELSE 0 END AS int) \
AS has_command_id \
FROM cdc.change_tables AS ct \
ORDER BY ct.create_date, ct.capture_instance;";

/// Captured columns: type facts from the change table's column (`chg`), and from the
/// source table (`src`, matched by `cdc.captured_columns.column_id`) the column's
/// 0-based position, NULL once the column was dropped. CLR types (geography,
/// geometry, hierarchyid: `system_type_id` 240, which `TYPE_NAME` does not know) are
/// named by `sys.types.name`, so that they are left out as CES leaves them out.
/// `is_computed` marks a computed column, which CDC records as NULL. Names are
/// compared in a binary collation: `sys.columns` is in the catalog's collation and
/// `cdc.captured_columns` in the database's, which differ on an Azure SQL Database
/// created with another collation (its `CATALOG_COLLATION` defaults to
/// `SQL_Latin1_General_CP1_CI_AS`), where comparing them fails with a collation
/// conflict; the two spellings of a name are the same characters. The source
/// column's default constraint (`sys.columns.default_object_id`, 0 without one)
/// gives its text as the catalog keeps it (`sys.default_constraints.definition`,
/// NULL where the login may not see it).
/// <https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-captured-columns-transact-sql>
/// <https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-default-constraints-transact-sql>
pub const CAPTURED_COLUMNS: &str = "SELECT ct.capture_instance, cc.column_name, \
cc.column_ordinal, cc.column_type, CAST(cc.is_computed AS int) AS is_computed, \
CASE WHEN ty.is_assembly_type = 1 THEN ty.name ELSE TYPE_NAME(chg.system_type_id) END \
AS type_name, ty.is_user_defined, chg.column_id AS change_column_id, \
chg.max_length, chg.precision, chg.scale, \
(SELECT COUNT(*) FROM sys.columns AS prior \
WHERE prior.object_id = ct.source_object_id AND prior.column_id < cc.column_id) AS table_index, \
src.column_id AS source_column_id, CAST(src.is_nullable AS int) AS is_nullable, \
dc.definition AS default_definition \
FROM cdc.change_tables AS ct \
JOIN cdc.captured_columns AS cc ON cc.object_id = ct.object_id \
LEFT JOIN sys.columns AS chg ON chg.object_id = ct.object_id \
AND chg.name COLLATE Latin1_General_BIN2 = cc.column_name COLLATE Latin1_General_BIN2 \
LEFT JOIN sys.types AS ty ON ty.user_type_id = chg.user_type_id \
LEFT JOIN sys.columns AS src ON src.object_id = ct.source_object_id \
AND src.column_id = cc.column_id \
LEFT JOIN sys.default_constraints AS dc ON dc.object_id = src.default_object_id \
ORDER BY ct.capture_instance, cc.column_ordinal;";

/// Key columns in key order, as CDC identifies rows: the index given as
/// `@index_name` to `sp_cdc_enable_table`, else the primary key; and whether the
/// index sorts each descending (`sys.index_columns.is_descending_key`, found through
/// the index `cdc.change_tables.index_name` names; 0 where it cannot be found).
/// <https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-index-columns-transact-sql>
/// <https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-index-columns-transact-sql>
pub const KEY_COLUMNS: &str = "SELECT ct.capture_instance, ic.column_name, ic.index_ordinal, \
CAST(COALESCE(six.is_descending_key, 0) AS int) AS is_descending \
FROM cdc.change_tables AS ct \
JOIN cdc.index_columns AS ic ON ic.object_id = ct.object_id \
LEFT JOIN sys.indexes AS si ON si.object_id = ct.source_object_id \
AND si.name COLLATE Latin1_General_BIN2 = ct.index_name COLLATE Latin1_General_BIN2 \
LEFT JOIN sys.index_columns AS six ON six.object_id = si.object_id \
AND six.index_id = si.index_id AND six.column_id = ic.column_id \
ORDER BY ct.capture_instance, ic.index_ordinal;";

/// Every constant above, for the parse test.
pub const ALL_CONSTANTS: &[(&str, &str)] = &[
    ("CATALOG_VERSION", CATALOG_VERSION),
    ("DATABASE_INFO", DATABASE_INFO),
    ("DATABASE_GUID", DATABASE_GUID),
    ("DATABASE_GUID_AZURE", DATABASE_GUID_AZURE),
    ("SERVER_TIME_ZONE", SERVER_TIME_ZONE),
    ("CAPTURE_INSTANCES", CAPTURE_INSTANCES),
    ("CAPTURED_COLUMNS", CAPTURED_COLUMNS),
    ("KEY_COLUMNS", KEY_COLUMNS),
];

/// `SERVERPROPERTY('EngineEdition')` of Azure SQL Database.
const AZURE_SQL_DATABASE: i64 = 5;

/// Where each column of a result is, by name: built once per result set and shared
/// by its rows, so that taking a row's values by name costs no allocation per row.
#[derive(Debug, Default)]
pub struct ColumnIndex {
    by_name: HashMap<String, usize>,
    /// Each position's name, for taking columns in the order they were selected
    /// without hashing (see [`NamedRow::take`]), and whether it is the first
    /// position of that name (the one a lookup by name finds).
    names: Vec<(String, bool)>,
}

impl ColumnIndex {
    /// The positions of a result's columns (the first of a repeated name).
    pub fn of<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let mut by_name = HashMap::new();
        let mut ordered = Vec::new();
        for (at, name) in names.into_iter().enumerate() {
            let first = !by_name.contains_key(name);
            by_name.entry(name.to_owned()).or_insert(at);
            ordered.push((name.to_owned(), first));
        }
        ColumnIndex {
            by_name,
            names: ordered,
        }
    }

    /// The position of `name`; `next` first, where the caller expects it.
    fn position(&self, name: &str, next: usize) -> Option<usize> {
        match self.names.get(next) {
            Some((n, true)) if n == name => Some(next),
            _ => self.by_name.get(name).copied(),
        }
    }

    /// The index of `row`'s result set.
    pub fn of_row(row: &Row) -> Self {
        Self::of(row.columns().iter().map(|c| c.name()))
    }
}

/// The enable options of a [`CAPTURE_INSTANCES`] row.
fn capture_options(row: &mut NamedRow) -> Result<CaptureOptions, DecodeError> {
    Ok(CaptureOptions {
        role_name: row.opt_string("role_name")?,
        index_name: row.opt_string("index_name")?,
        filegroup_name: row.opt_string("filegroup_name")?,
        supports_net_changes: row.opt_int("supports_net_changes")? == Some(1),
        allow_partition_switch: row.opt_int("partition_switch")?.map(|p| p == 1),
    })
}

/// A result row whose columns are taken by name.
pub struct NamedRow {
    index: std::sync::Arc<ColumnIndex>,
    values: Vec<Option<ColumnData<'static>>>,
    /// After the last column taken: where the next is looked for first.
    next: usize,
}

impl NamedRow {
    pub fn new(row: Row) -> Self {
        Self::in_result(row, &mut None)
    }

    /// A row of a result set whose column index is built from its first row and
    /// shared by the rest (`shared` starts `None` for each result set).
    pub fn in_result(row: Row, shared: &mut Option<std::sync::Arc<ColumnIndex>>) -> Self {
        let index = shared.get_or_insert_with(|| std::sync::Arc::new(ColumnIndex::of_row(&row)));
        NamedRow {
            index: std::sync::Arc::clone(index),
            values: row.into_iter().map(Some).collect(),
            next: 0,
        }
    }

    /// A row from names and values (tests).
    pub fn from_pairs(pairs: Vec<(&str, ColumnData<'static>)>) -> Self {
        let index = ColumnIndex::of(pairs.iter().map(|(n, _)| *n));
        NamedRow {
            index: std::sync::Arc::new(index),
            values: pairs.into_iter().map(|(_, v)| Some(v)).collect(),
            next: 0,
        }
    }

    /// A row of values under a shared index, as [`in_result`](Self::in_result) makes
    /// them from the driver's rows (benches).
    #[cfg(feature = "testing")]
    pub fn with_index(
        index: std::sync::Arc<ColumnIndex>,
        values: Vec<ColumnData<'static>>,
    ) -> Self {
        NamedRow {
            index,
            values: values.into_iter().map(Some).collect(),
            next: 0,
        }
    }

    /// Replaces a value (tests).
    pub fn replace(&mut self, name: &str, value: ColumnData<'static>) {
        match self.index.by_name.get(name) {
            Some(&at) => self.values[at] = Some(value),
            None => {
                let names = self.index.names.iter().map(|(n, _)| n.as_str());
                let index = ColumnIndex::of(names.chain(std::iter::once(name)));
                self.index = std::sync::Arc::new(index);
                self.values.push(Some(value));
            }
        }
    }

    /// The raw value of `name`, taken out of the row.
    pub fn take_raw(&mut self, name: &str) -> Result<ColumnData<'static>, DecodeError> {
        self.take(name)
    }

    /// Takes `name`'s value. Columns are mostly taken in the order the query
    /// selects them, so the position after the last one taken is tried first: a
    /// string comparison instead of a hash lookup per value.
    fn take(&mut self, name: &str) -> Result<ColumnData<'static>, DecodeError> {
        let at = self.index.position(name, self.next);
        if let Some(at) = at {
            self.next = at + 1;
        }
        at.and_then(|at| self.values.get_mut(at)?.take())
            .ok_or_else(|| DecodeError {
                column: name.to_owned(),
                message: "missing from the result".into(),
            })
    }

    pub fn opt_string(&mut self, name: &str) -> Result<Option<String>, DecodeError> {
        decode_string(name, self.take(name)?)
    }

    pub fn string(&mut self, name: &str) -> Result<String, DecodeError> {
        self.opt_string(name)?.ok_or_else(|| null(name))
    }

    pub fn opt_int(&mut self, name: &str) -> Result<Option<i64>, DecodeError> {
        decode_int(name, self.take(name)?)
    }

    /// The offsets `AT TIME ZONE` gave a commit time (`at`) and an hour later
    /// (`hour_later`), in minutes; `None` when either is NULL (no zone named).
    pub fn opt_offsets(
        &mut self,
        at: &str,
        hour_later: &str,
    ) -> Result<Option<ServerOffsets>, DecodeError> {
        let mut minutes = |column: &str| -> Result<Option<i16>, DecodeError> {
            self.opt_int(column)?
                .map(|o| {
                    i16::try_from(o).map_err(|_| DecodeError {
                        column: column.to_owned(),
                        message: format!("{o} is out of range"),
                    })
                })
                .transpose()
        };
        Ok(match (minutes(at)?, minutes(hour_later)?) {
            (Some(at), Some(hour_later)) => Some(ServerOffsets { at, hour_later }),
            _ => None,
        })
    }

    pub fn int(&mut self, name: &str) -> Result<i64, DecodeError> {
        self.opt_int(name)?.ok_or_else(|| null(name))
    }

    pub fn opt_lsn(&mut self, name: &str) -> Result<Option<Lsn>, DecodeError> {
        decode_lsn(name, self.take(name)?)
    }

    pub fn opt_guid(&mut self, name: &str) -> Result<Option<Uuid>, DecodeError> {
        decode_guid(name, self.take(name)?)
    }

    pub fn datetime(&mut self, name: &str) -> Result<chrono::NaiveDateTime, DecodeError> {
        self.opt_datetime(name)?.ok_or_else(|| null(name))
    }

    pub fn opt_datetime(
        &mut self,
        name: &str,
    ) -> Result<Option<chrono::NaiveDateTime>, DecodeError> {
        decode_naive_datetime(name, self.take(name)?)
    }
}

pub fn null(column: &str) -> DecodeError {
    DecodeError {
        column: column.to_owned(),
        message: "is NULL".into(),
    }
}

/// A catalog answer that cannot be decoded: definite (the catalog is not what the
/// queries expect).
pub(crate) fn catalog_error(error: DecodeError) -> SourceError {
    SourceError::definite(format!("unexpected catalog result: {error}"))
}

/// A catalog integer in the range of `T`, or an error naming the column.
fn narrow<T: TryFrom<i64>>(column: &str, value: i64) -> Result<T, SourceError> {
    T::try_from(value).map_err(|_| {
        catalog_error(DecodeError {
            column: column.to_owned(),
            message: format!("{value} is out of range"),
        })
    })
}

/// Combines the fingerprint's parts into one number.
pub fn fingerprint(row: &mut NamedRow) -> Result<CatalogVersion, DecodeError> {
    let checksum = row.opt_int("tables_checksum")?.unwrap_or(0);
    let tables = row.int("tables_count")?;
    let ddl = row.int("ddl_count")?;
    Ok(checksum
        .wrapping_mul(1_000_003)
        .wrapping_add(tables.wrapping_mul(7_919))
        .wrapping_add(ddl))
}

async fn rows(conn: &mut SqlConnection, sql: &str) -> Result<Vec<NamedRow>, SourceError> {
    Ok(conn
        .query(sql, &[])
        .await?
        .into_iter()
        .map(NamedRow::new)
        .collect())
}

/// Reads the whole catalog. The fingerprint is read first, so a change made while
/// the rest is read shows up as a newer fingerprint at the next poll.
pub async fn read_catalog(conn: &mut SqlConnection) -> Result<Catalog, SourceError> {
    let mut version = rows(conn, CATALOG_VERSION).await?;
    let version = match version.first_mut() {
        Some(row) => fingerprint(row).map_err(catalog_error)?,
        None => return Err(catalog_error(null("tables_checksum"))),
    };
    let mut info = rows(conn, DATABASE_INFO).await?;
    let Some(info) = info.first_mut() else {
        return Err(SourceError::definite(
            "the database is not visible to this login",
        ));
    };
    let database = info.string("database_name").map_err(catalog_error)?;
    // @@SERVERNAME is NULL on a server whose name was never registered
    // (sp_addserver): the identity says so in words. Only the database and stream
    // GUIDs decide whether a checkpoint belongs here; the server's name is logged.
    let server = info
        .opt_string("server_name")
        .map_err(catalog_error)?
        .unwrap_or_else(|| "(@@SERVERNAME is NULL)".to_owned());
    if info.opt_int("is_cdc_enabled").map_err(catalog_error)? != Some(1) {
        return Err(SourceError::CdcNotEnabled { database });
    }
    let edition = info.opt_int("engine_edition").map_err(catalog_error)?;
    let offset = info.int("utc_offset_minutes").map_err(catalog_error)?;
    let (database_guid, local_database_guid) =
        read_guid(conn, edition == Some(AZURE_SQL_DATABASE)).await?;
    let server_time_zone = read_time_zone(conn).await?;

    let mut instances = Vec::new();
    let mut invisible = Vec::new();
    for mut row in rows(conn, CAPTURE_INSTANCES).await? {
        let name = row.string("capture_instance").map_err(catalog_error)?;
        let object_id = row.int("object_id").map_err(catalog_error)?;
        let schema = row.opt_string("schema_name").map_err(catalog_error)?;
        let table = row.opt_string("table_name").map_err(catalog_error)?;
        let (Some(schema), Some(table)) = (schema, table) else {
            invisible.push(name);
            continue;
        };
        instances.push(CaptureInstance {
            name,
            schema,
            table,
            object_id: narrow("object_id", object_id)?,
            start_lsn: row
                .opt_lsn("start_lsn")
                .map_err(catalog_error)?
                .filter(|l| !l.is_zero()),
            create_date: row.datetime("create_date").map_err(catalog_error)?,
            columns: Vec::new(),
            key_columns: Vec::new(),
            descending_keys: Vec::new(),
            has_command_id: row.int("has_command_id").map_err(catalog_error)? == 1,
            options: capture_options(&mut row).map_err(catalog_error)?,
        });
    }
    for mut row in rows(conn, CAPTURED_COLUMNS).await? {
        let instance = row.string("capture_instance").map_err(catalog_error)?;
        let column = captured_column(&mut row).map_err(catalog_error)?;
        if let Some(ci) = instances.iter_mut().find(|i| i.name == instance) {
            ci.columns.push(column);
        }
    }
    read_key_columns(conn, &mut instances).await?;
    Ok(Catalog {
        server,
        database,
        database_guid,
        local_database_guid,
        server_utc_offset_minutes: narrow("utc_offset_minutes", offset)?,
        server_time_zone,
        version,
        invisible,
        instances,
    })
}

/// Each instance's key columns in key order ([`KEY_COLUMNS`]), and which its index
/// sorts descending.
async fn read_key_columns(
    conn: &mut SqlConnection,
    instances: &mut [CaptureInstance],
) -> Result<(), SourceError> {
    for mut row in rows(conn, KEY_COLUMNS).await? {
        let instance = row.string("capture_instance").map_err(catalog_error)?;
        let column = row.string("column_name").map_err(catalog_error)?;
        let descending = row.opt_int("is_descending").map_err(catalog_error)? == Some(1);
        if let Some(ci) = instances.iter_mut().find(|i| i.name == instance) {
            if descending {
                ci.descending_keys.push(column.clone());
            }
            ci.key_columns.push(column);
        }
    }
    Ok(())
}

/// One row of [`CAPTURED_COLUMNS`].
fn captured_column(row: &mut NamedRow) -> Result<CapturedColumn, DecodeError> {
    let name = row.string("column_name")?;
    let ordinal = row.int("column_ordinal")?;
    // Named in messages about a type CES leaves out, and the type a `rowversion`
    // column is left out by (its change table column is `binary(8)`).
    let declared = row.opt_string("column_type")?;
    let base = row.opt_string("type_name")?;
    let user_defined = row.opt_int("is_user_defined")? == Some(1);
    let computed = row.opt_int("is_computed")? == Some(1);
    let in_change_table = row.opt_int("change_column_id")?.is_some();
    let max_length = row.opt_int("max_length")?;
    let precision = row.opt_int("precision")?;
    let scale = row.opt_int("scale")?;
    // The source table's columns before this one: its position, or for a column
    // dropped since, where it stood.
    let before = row.opt_int("table_index")?;
    let (table_index, nullable, default) = match row.opt_int("source_column_id")? {
        Some(_) => (
            before,
            row.opt_int("is_nullable")?.map(|n| n == 1),
            row.opt_string("default_definition")?,
        ),
        None => (None, None, None),
    };
    if !in_change_table {
        // The change table has no such column: the catalog cannot be trusted.
        return Err(DecodeError {
            column: name,
            message: "is listed in cdc.captured_columns but not in its change table".into(),
        });
    }
    let sql_type = match (base, max_length, precision, scale) {
        // CDC defines a `rowversion` (`timestamp`) column as `binary(8)` in the
        // change table (Learn, cdc.<capture_instance>_CT, Remarks: data types of
        // captured columns), so its type there names nothing CES leaves out; the
        // declared type does, and CES leaves it out.
        _ if declared.as_deref().is_some_and(|d| {
            d.eq_ignore_ascii_case("timestamp") || d.eq_ignore_ascii_case("rowversion")
        }) =>
        {
            Err(TypeError::Excluded {
                type_name: declared.clone().unwrap_or_default(),
            })
        }
        _ if user_defined => Err(TypeError::UserDefined {
            type_name: declared.unwrap_or_else(|| "(a type the catalog does not name)".into()),
        }),
        (Some(base), Some(len), Some(p), Some(s)) => SqlType::from_catalog(
            &base,
            i16::try_from(len).unwrap_or(i16::MIN),
            u8::try_from(p).unwrap_or(u8::MAX),
            u8::try_from(s).unwrap_or(u8::MAX),
        ),
        // A type without a name here: left out, as CES leaves unknown types out.
        (base, ..) => Err(TypeError::Excluded {
            type_name: base
                .or(declared)
                .unwrap_or_else(|| "(a type the catalog does not name)".into()),
        }),
    };
    let out_of_range = |what: &str, value: i64| DecodeError {
        column: name.clone(),
        message: format!("{what} {value} is out of range"),
    };
    Ok(CapturedColumn {
        ordinal: u32::try_from(ordinal).map_err(|_| out_of_range("column_ordinal", ordinal))?,
        table_index: table_index
            .map(|i| u32::try_from(i).map_err(|_| out_of_range("table_index", i)))
            .transpose()?,
        dropped: match (table_index, before) {
            (None, Some(before)) => Some(DroppedColumn {
                columns_before: u32::try_from(before)
                    .map_err(|_| out_of_range("table_index", before))?,
                at: None,
            }),
            _ => None,
        },
        sql_type,
        name,
        computed,
        nullable,
        default,
    })
}

/// The database's GUID and the replica's own.
async fn read_guid(
    conn: &mut SqlConnection,
    azure: bool,
) -> Result<(Option<Uuid>, Option<Uuid>), SourceError> {
    let sql = if azure {
        DATABASE_GUID_AZURE
    } else {
        DATABASE_GUID
    };
    let result = match conn.query(sql, &[]).await {
        Ok(rows) => rows,
        // Without the permission the view answers no row, or (Azure) error 297/300.
        Err(SqlError {
            error: SqlErrorKind::PermissionDenied { .. },
            ..
        }) => return Ok((None, None)),
        Err(e) => return Err(e.into()),
    };
    match result.into_iter().next() {
        Some(row) => {
            let mut row = NamedRow::new(row);
            Ok((
                row.opt_guid("database_guid").map_err(catalog_error)?,
                row.opt_guid("local_guid").map_err(catalog_error)?,
            ))
        }
        None => Ok((None, None)),
    }
}

async fn read_time_zone(conn: &mut SqlConnection) -> Result<Option<String>, SourceError> {
    match conn.query(SERVER_TIME_ZONE, &[]).await {
        Ok(rows) => match rows.into_iter().next() {
            Some(row) => {
                let mut row = NamedRow::new(row);
                let id = row.opt_string("time_zone_id").map_err(catalog_error)?;
                let usable = row.int("usable").map_err(catalog_error)? == 1;
                if !usable && let Some(id) = &id {
                    tracing::warn!(time_zone_id = %id, "the server's time zone is not in sys.time_zone_info, so AT TIME ZONE cannot use it");
                }
                Ok(id.filter(|_| usable))
            }
            None => Ok(None),
        },
        // 195: not a recognized built-in function (before SQL Server 2022).
        Err(SqlError {
            code: Some(195), ..
        }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::queries::assert_parses;
    use std::borrow::Cow;

    #[test]
    fn every_constant_parses_as_tsql() {
        for (name, sql) in ALL_CONSTANTS {
            assert_parses(name, sql);
        }
    }

    #[test]
    fn columns_are_taken_by_name_in_any_order_and_a_repeated_name_is_its_first() {
        let int = |v| ColumnData::I32(Some(v));
        let mut row = NamedRow::from_pairs(vec![("a", int(1)), ("b", int(2)), ("a", int(3))]);
        // Out of order, then in order.
        assert_eq!(row.opt_int("b").unwrap(), Some(2));
        assert_eq!(row.opt_int("a").unwrap(), Some(1));
        // Taken once; the repeated name is not reached by name.
        assert!(row.opt_int("a").is_err());
        assert!(row.opt_int("b").is_err());
        assert!(row.opt_int("c").is_err());
        // In order from the start: a repeated name right after its first is still
        // the first.
        let mut row = NamedRow::from_pairs(vec![("a", int(1)), ("a", int(3)), ("b", int(2))]);
        assert_eq!(row.opt_int("a").unwrap(), Some(1));
        assert!(row.opt_int("a").is_err());
        assert_eq!(row.opt_int("b").unwrap(), Some(2));
        row.replace("z", int(9));
        assert_eq!(row.opt_int("z").unwrap(), Some(9));
    }

    #[test]
    fn offsets_are_both_or_none_and_in_range() {
        let int = |v| ColumnData::I32(v);
        let mut row = NamedRow::from_pairs(vec![("a", int(Some(120))), ("b", int(Some(60)))]);
        assert_eq!(
            row.opt_offsets("a", "b").unwrap(),
            Some(ServerOffsets {
                at: 120,
                hour_later: 60
            })
        );
        let mut row = NamedRow::from_pairs(vec![("a", int(Some(120))), ("b", int(None))]);
        assert_eq!(row.opt_offsets("a", "b").unwrap(), None);
        let mut row = NamedRow::from_pairs(vec![("a", int(Some(40_000))), ("b", int(Some(0)))]);
        let err = row.opt_offsets("a", "b").unwrap_err();
        assert_eq!(err.column, "a");
        assert!(err.message.contains("40000 is out of range"), "{err:?}");
    }

    fn column_row(source_column_id: Option<i32>, type_name: Option<&'static str>) -> NamedRow {
        column_row_in(source_column_id, type_name, Some(4))
    }

    fn column_row_in(
        source_column_id: Option<i32>,
        type_name: Option<&'static str>,
        change_column_id: Option<i32>,
    ) -> NamedRow {
        declared_row("int", source_column_id, type_name, change_column_id)
    }

    fn declared_row(
        declared: &'static str,
        source_column_id: Option<i32>,
        type_name: Option<&'static str>,
        change_column_id: Option<i32>,
    ) -> NamedRow {
        let text = |s: &'static str| ColumnData::String(Some(Cow::Borrowed(s)));
        NamedRow::from_pairs(vec![
            ("column_name", text("Qty")),
            ("column_ordinal", ColumnData::I32(Some(3))),
            ("column_type", text(declared)),
            ("is_computed", ColumnData::I32(Some(0))),
            (
                "type_name",
                ColumnData::String(type_name.map(Cow::Borrowed)),
            ),
            ("is_user_defined", ColumnData::Bit(Some(false))),
            ("change_column_id", ColumnData::I32(change_column_id)),
            ("max_length", ColumnData::I16(Some(4))),
            ("precision", ColumnData::U8(Some(10))),
            ("scale", ColumnData::U8(Some(0))),
            ("table_index", ColumnData::I32(Some(2))),
            ("source_column_id", ColumnData::I32(source_column_id)),
            ("is_nullable", ColumnData::I32(Some(0))),
            (
                "default_definition",
                ColumnData::String(Some(Cow::Borrowed("((0))"))),
            ),
        ])
    }

    #[test]
    fn captured_columns_are_read_by_name_with_the_change_tables_type() {
        let column = captured_column(&mut column_row(Some(3), Some("bigint"))).unwrap();
        assert_eq!(column.name, "Qty");
        assert_eq!(column.ordinal, 3);
        assert_eq!(column.table_index, Some(2));
        assert_eq!(column.sql_type, Ok(SqlType::BigInt));
        assert_eq!(column.nullable, Some(false));
        assert_eq!(column.default.as_deref(), Some("((0))"));
    }

    /// A `rowversion` column is `binary(8)` in the change table: left out by its
    /// declared type, as CES leaves it out.
    #[test]
    fn a_rowversion_column_is_left_out_by_its_declared_type() {
        for declared in ["timestamp", "rowversion"] {
            let column = captured_column(&mut declared_row(
                declared,
                Some(3),
                Some("binary"),
                Some(4),
            ))
            .unwrap();
            assert_eq!(
                column.sql_type,
                Err(TypeError::Excluded {
                    type_name: declared.into()
                }),
                "{declared}"
            );
        }
        let binary = captured_column(&mut declared_row(
            "binary",
            Some(3),
            Some("binary"),
            Some(4),
        ))
        .unwrap();
        assert!(binary.sql_type.is_ok(), "{binary:?}");
    }

    #[test]
    fn a_dropped_column_has_no_table_position() {
        let column = captured_column(&mut column_row(None, Some("int"))).unwrap();
        assert_eq!(column.table_index, None);
        assert_eq!(column.nullable, None, "sys.columns has no row for it");
        assert_eq!(column.default, None, "nor a default");
        assert_eq!(column.sql_type, Ok(SqlType::Int));
    }

    #[test]
    fn a_column_missing_from_the_change_table_is_an_error() {
        let err = captured_column(&mut column_row_in(Some(3), Some("int"), None)).unwrap_err();
        assert!(err.to_string().contains("Qty"), "{err}");
    }

    #[test]
    fn clr_and_unnamed_types_are_left_out_not_fatal() {
        let geography = captured_column(&mut column_row(Some(3), Some("geography"))).unwrap();
        assert!(matches!(
            geography.sql_type,
            Err(TypeError::Excluded { .. })
        ));
        let unnamed = captured_column(&mut column_row(Some(3), None)).unwrap();
        assert!(matches!(unnamed.sql_type, Err(TypeError::Excluded { .. })));
    }

    #[test]
    fn a_missing_result_column_is_named() {
        let mut row = NamedRow::from_pairs(vec![]);
        let err = row.int("column_ordinal").unwrap_err();
        assert!(err.to_string().contains("column_ordinal"), "{err}");
        let mut row = NamedRow::from_pairs(vec![("command", ColumnData::I32(None))]);
        assert!(row.int("command").unwrap_err().to_string().contains("NULL"));
    }

    #[test]
    fn fingerprints_differ_when_any_part_does() {
        let row = |checksum: Option<i32>, tables: i64, ddl: i64| {
            fingerprint(&mut NamedRow::from_pairs(vec![
                ("tables_checksum", ColumnData::I32(checksum)),
                ("tables_count", ColumnData::I64(Some(tables))),
                ("ddl_count", ColumnData::I64(Some(ddl))),
            ]))
            .unwrap()
        };
        let base = row(Some(17), 2, 0);
        assert_ne!(base, row(Some(18), 2, 0));
        assert_ne!(base, row(Some(17), 3, 0));
        assert_ne!(base, row(Some(17), 2, 1));
        assert_eq!(row(None, 0, 0), row(Some(0), 0, 0));
    }
}

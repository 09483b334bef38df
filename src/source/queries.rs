//! Every T-SQL text the source runs.
//!
//! Values are always bound parameters (`@P1`, `@P2`…). The only identifiers placed in
//! SQL text are capture-instance and column names read from `cdc.change_tables` and
//! `cdc.captured_columns`, quoted by `QUOTENAME` rules ([`quote_name`]). A test parses
//! every constant, and every built query for awkward names, with `sqlparser`'s
//! `MsSqlDialect`.
//!
//! The change query follows the shape proven by peers (Debezium's direct mode, others):
//! read `cdc.[<ci>_CT]` directly, because `cdc.fn_cdc_get_all_changes_<ci>` does not
//! return `__$command_id`, join `cdc.lsn_time_mapping` for the transaction's begin LSN
//! and commit time, and page with a keyset on the full sort key (`__$start_lsn`,
//! `__$command_id`, `__$seqval`, `__$operation`), the same tuple as the `ORDER BY`, so
//! that pages neither skip nor repeat rows.

use crate::event::value::{Length, SqlType};
use crate::source::CaptureInstance;
use crate::source::catalog::catalog_version_columns;

/// `sys.fn_cdc_get_max_lsn()`: the high end of every capture instance's validity
/// interval (the highest `start_lsn` in `cdc.lsn_time_mapping`), and in the same
/// round trip the catalog's fingerprint, so that every poll notices a capture
/// instance enabled, disabled or altered (Debezium checks `cdc.change_tables` every
/// iteration too).
/// <https://learn.microsoft.com/sql/relational-databases/system-functions/sys-fn-cdc-get-max-lsn-transact-sql>
pub const MAX_LSN: &str = concat!(
    "SELECT sys.fn_cdc_get_max_lsn() AS max_lsn, ",
    catalog_version_columns!(),
    ";"
);

/// `sys.fn_cdc_get_min_lsn(@P1)`: the low end of a capture instance's validity
/// interval; 0x00 when the instance does not exist, has no low end yet, or the caller
/// may not read its changes.
/// <https://learn.microsoft.com/sql/relational-databases/system-functions/sys-fn-cdc-get-min-lsn-transact-sql>
pub const MIN_LSN: &str = "SELECT sys.fn_cdc_get_min_lsn(@P1) AS min_lsn;";

/// DDL recorded against a capture instance's change table.
/// <https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-ddl-history-transact-sql>
pub const DDL_HISTORY: &str = "SELECT ct.capture_instance, dh.ddl_lsn, dh.ddl_time, \
dh.ddl_command \
FROM cdc.ddl_history AS dh \
JOIN cdc.change_tables AS ct ON ct.object_id = dh.object_id \
WHERE ct.capture_instance = @P1 \
ORDER BY dh.ddl_lsn;";

/// [`DDL_HISTORY`] with the offsets the server's zone (`@P2`, `CURRENT_TIMEZONE_ID()`)
/// gives each `ddl_time` and an hour later, as [`LSN_TIME_ZONED`] computes a commit
/// time's: a DDL after a daylight-saving change reads in the offset then in force.
pub const DDL_HISTORY_ZONED: &str = "SELECT ct.capture_instance, dh.ddl_lsn, dh.ddl_time, \
DATEPART(TZOFFSET, dh.ddl_time AT TIME ZONE @P2) AS at_offset, \
DATEPART(TZOFFSET, DATEADD(minute, 60, dh.ddl_time) AT TIME ZONE @P2) AS hour_later_offset, \
dh.ddl_command \
FROM cdc.ddl_history AS dh \
JOIN cdc.change_tables AS ct ON ct.object_id = dh.object_id \
WHERE ct.capture_instance = @P1 \
ORDER BY dh.ddl_lsn;";

/// Whether the SQL Server Agent (which runs the CDC capture job) is running.
/// Requires VIEW SERVER STATE; `check` reports when it cannot tell.
/// <https://learn.microsoft.com/sql/relational-databases/system-dynamic-management-views/sys-dm-server-services-transact-sql>
pub const AGENT_STATUS: &str = "SELECT status_desc FROM sys.dm_server_services \
WHERE servicename LIKE N'SQL Server Agent%';";

/// `check`: the server's version and edition, whether CDC is enabled on this
/// database, whether this connection is encrypted, the server's local time, and
/// `max text repl size` (NULL where `sys.configurations` does not list it).
/// <https://learn.microsoft.com/sql/database-engine/configure-windows/configure-the-max-text-repl-size-server-configuration-option>
/// <https://learn.microsoft.com/sql/t-sql/functions/serverproperty-transact-sql>
/// <https://learn.microsoft.com/sql/t-sql/functions/connectionproperty-transact-sql>
pub const SERVER_FACTS: &str = "SELECT \
CAST(SERVERPROPERTY('ProductVersion') AS nvarchar(128)) AS product_version, \
CAST(SERVERPROPERTY('Edition') AS nvarchar(128)) AS edition, \
CAST(SERVERPROPERTY('EngineEdition') AS int) AS engine_edition, \
DB_NAME() AS database_name, \
CAST(d.is_cdc_enabled AS int) AS is_cdc_enabled, \
CAST(CONNECTIONPROPERTY('encrypt_option') AS nvarchar(10)) AS encrypt_option, \
SYSDATETIME() AS local_time, \
(SELECT CAST(c.value_in_use AS bigint) FROM sys.configurations AS c \
WHERE c.name = N'max text repl size (B)') AS max_text_repl_size \
FROM sys.databases AS d WHERE d.database_id = DB_ID();";

/// `check`: this database's CDC jobs: the capture job's settings and the cleanup
/// job's retention (minutes).
/// Needs SELECT on `msdb.dbo.cdc_jobs` (e.g. membership of msdb's
/// `SQLAgentReaderRole`, or sysadmin).
/// <https://learn.microsoft.com/sql/relational-databases/system-tables/dbo-cdc-jobs-transact-sql>
pub const CDC_JOBS: &str = "SELECT job_type, maxtrans, maxscans, \
CAST(continuous AS int) AS continuous, pollinginterval, retention \
FROM msdb.dbo.cdc_jobs WHERE database_id = DB_ID();";

/// `check` on Azure SQL Database: the same facts, which live in the database's own
/// `cdc.cdc_jobs` there ("The cdc.cdc_jobs table resides in the cdc schema, not
/// msdb", Learn: Change data capture with Azure SQL Database).
/// <https://learn.microsoft.com/azure/azure-sql/database/change-data-capture-overview>
pub const CDC_JOBS_AZURE: &str = "SELECT job_type, maxtrans, maxscans, \
CAST(continuous AS int) AS continuous, pollinginterval, retention FROM cdc.cdc_jobs;";

/// `check`: whether the capture job runs in the current SQL Server Agent session
/// (started, not stopped). No row: not running.
/// <https://learn.microsoft.com/sql/relational-databases/system-tables/dbo-sysjobactivity-transact-sql>
pub const CAPTURE_JOB_RUNNING: &str = "SELECT COUNT_BIG(*) AS running \
FROM msdb.dbo.cdc_jobs AS j \
JOIN msdb.dbo.sysjobactivity AS a ON a.job_id = j.job_id \
WHERE j.database_id = DB_ID() AND j.job_type = N'capture' \
AND a.session_id = (SELECT MAX(session_id) FROM msdb.dbo.syssessions) \
AND a.start_execution_date IS NOT NULL AND a.stop_execution_date IS NULL;";

/// `check` and the metrics: the latest log scan session of the capture job, and the
/// transactions of all sessions since the server started (session 0 is their
/// aggregate). Needs VIEW DATABASE STATE.
/// <https://learn.microsoft.com/sql/relational-databases/system-dynamic-management-views/change-data-capture-sys-dm-cdc-log-scan-sessions>
pub const LOG_SCAN: &str = "SELECT TOP (1) start_time, end_time, \
CAST(latency AS bigint) AS latency, CAST(error_count AS bigint) AS error_count, \
CAST(tran_count AS bigint) AS tran_count, \
(SELECT CAST(a.tran_count AS bigint) FROM sys.dm_cdc_log_scan_sessions AS a \
WHERE a.session_id = 0) AS total_tran_count \
FROM sys.dm_cdc_log_scan_sessions WHERE session_id > 0 ORDER BY session_id DESC;";

/// `check`: the commit time of the transaction at an LSN (`@P1`, binary(10)).
/// <https://learn.microsoft.com/sql/relational-databases/system-functions/sys-fn-cdc-map-lsn-to-time-transact-sql>
pub const LSN_TIME: &str = "SELECT sys.fn_cdc_map_lsn_to_time(@P1) AS commit_time;";

/// The same with the offsets the server's zone (`@P2`, `CURRENT_TIMEZONE_ID()`) gives
/// that time and an hour later, as the change query computes them per row
/// ([`read_changes`]): the commit time an initial load's rows carry.
pub const LSN_TIME_ZONED: &str = "SELECT m.commit_time, \
DATEPART(TZOFFSET, m.commit_time AT TIME ZONE @P2) AS at_offset, \
DATEPART(TZOFFSET, DATEADD(minute, 60, m.commit_time) AT TIME ZONE @P2) AS hour_later_offset \
FROM (SELECT sys.fn_cdc_map_lsn_to_time(@P1) AS commit_time) AS m;";

/// `QUOTENAME`: wraps an identifier in brackets, doubling any `]`.
fn quote_name(identifier: &str) -> String {
    let mut out = String::with_capacity(identifier.len() + 2);
    out.push('[');
    for c in identifier.chars() {
        if c == ']' {
            out.push(']');
        }
        out.push(c);
    }
    out.push(']');
    out
}

/// `cdc.[<capture instance>_CT]`.
fn change_table(capture_instance: &str) -> String {
    format!("cdc.{}", quote_name(&format!("{capture_instance}_CT")))
}

/// The select expression of an emitted column, named after the column.
///
/// - money and smallmoney are cast to `decimal(19,4)`: the driver decodes them as a
///   lossy `f64`;
/// - text of every kind arrives as its UTF-16LE bytes: `char`/`varchar` are first
///   converted to `nchar`/`nvarchar` by the server, which knows every collation's code
///   page (UTF-8 collations included; the driver's own tables do not), keeping
///   `char(n)` padding; then the bytes are decoded here, where a lone surrogate in an
///   `nvarchar` (legal UCS-2) becomes U+FFFD with a warning instead of failing the
///   whole read.
fn column_expression(name: &str, sql_type: SqlType) -> String {
    let column = format!("ct.{}", quote_name(name));
    let expression = match sql_type {
        SqlType::Money | SqlType::SmallMoney => format!("CAST({column} AS decimal(19,4))"),
        // `char(n)` holds n bytes, which in a UTF-8 or double-byte collation can be
        // fewer than n characters: `nvarchar(n)` keeps exactly the stored padding,
        // where `nchar(n)` would add spaces.
        SqlType::Char(length) | SqlType::VarChar(length) => format!(
            "CAST(CAST({column} AS {}) AS {})",
            unicode("nvarchar", length),
            utf16_bytes(length)
        ),
        SqlType::NChar(length) | SqlType::NVarChar(length) => {
            format!("CAST({column} AS {})", utf16_bytes(length))
        }
        _ => column,
    };
    format!("{expression} AS {}", quote_name(name))
}

/// `nvarchar(n)` holding `n` characters (at most 4,000; `max` beyond).
fn unicode(kind: &str, length: Length) -> String {
    match length {
        Length::Bounded(n) if n <= 4000 => format!("{kind}({n})"),
        _ => format!("{kind}(max)"),
    }
}

/// `varbinary` wide enough for `length` characters of UTF-16 (two bytes each, at
/// most 8,000; `max` beyond).
fn utf16_bytes(length: Length) -> String {
    match length {
        Length::Bounded(n) if n <= 4000 => format!("varbinary({})", 2 * n),
        _ => "varbinary(max)".to_owned(),
    }
}

/// Names of the fixed columns of a change row. None can be a captured column's name:
/// SQL Server reserves the `__$` prefix in change tables.
pub mod fixed {
    pub const START_LSN: &str = "__$start_lsn";
    pub const COMMAND_ID: &str = "__$command_id";
    pub const SEQVAL: &str = "__$seqval";
    pub const OPERATION: &str = "__$operation";
    pub const UPDATE_MASK: &str = "__$update_mask";
    pub const BEGIN_LSN: &str = "__$tran_begin_lsn";
    pub const END_TIME: &str = "__$tran_end_time";
    pub const END_TIME_OFFSET: &str = "__$tran_end_offset";
    /// The offset an hour after the commit's local time: tells a repeated hour.
    pub const END_TIME_OFFSET_LATER: &str = "__$tran_end_offset_later";
    /// `cdc.lsn_time_mapping.start_lsn`: NULL when the transaction has no mapping
    /// row (the cleanup job deleted it), which tells that from NULL columns.
    pub const MAPPED: &str = "__$tran_mapped";
    pub const BEGIN_TIME: &str = "__$tran_begin_time";

    /// Every fixed column, in the order [`read_changes`](super::read_changes) selects
    /// them (before the captured columns).
    pub const IN_ORDER: [&str; 11] = [
        START_LSN,
        COMMAND_ID,
        SEQVAL,
        OPERATION,
        UPDATE_MASK,
        BEGIN_LSN,
        END_TIME,
        END_TIME_OFFSET,
        END_TIME_OFFSET_LATER,
        MAPPED,
        BEGIN_TIME,
    ];
}

/// One page of a capture instance's changes, in CDC order.
///
/// Parameters: `@P1` page size, `@P2` upper LSN (inclusive), then the keyset to resume
/// after: `@P3` start LSN, `@P4` command id, `@P5` seqval, `@P6` operation; with
/// `server_zone`, `@P7` the server's time zone (`CURRENT_TIMEZONE_ID()`), from which
/// the offset at each commit's local time is computed, and the offset an hour
/// later, which tells a local time in an hour the clocks repeat
/// ([`ServerOffsets`](crate::source::ServerOffsets)).
/// Columns, by name: the [`fixed`] ones, then each emitted column under its own name.
///
/// **The seek.** "Rows after the keyset" is one OR of four conjunctions; written as
/// one OR, only `__$start_lsn >= @P3` can be a seek predicate on the change table's
/// clustered index (`__$start_lsn`, `__$command_id`, `__$seqval`, `__$operation`):
/// a column after the first is seekable only under an equality on the ones before
/// it (Craig Freedman, "Seek Predicates"). Every row of one transaction shares its
/// `__$start_lsn`, so page k of a big transaction would read again the k pages
/// before it — quadratic in the transaction's size. Here each conjunction is a
/// branch of its own (`UNION ALL`), whose equalities and one range are all seek
/// predicates, each with its own `TOP` and order; the union is ordered and cut
/// outside. A page costs at most four short seeks and the rows it returns.
///
/// **`NOLOCK`.** Microsoft's own generated change functions read the change table
/// and `cdc.lsn_time_mapping` `WITH (NOLOCK)`. Every row at or below `@P2`
/// (`max_lsn`) is committed and written once by the capture job, so a dirty read
/// cannot see an uncommitted or half-written row there; the one concurrent writer
/// that matters is the cleanup job's delete, which the poller's per-page low-end
/// check (`sys.fn_cdc_get_min_lsn`) already catches. Shared locks would only make
/// polls and the cleanup's escalated deletes block each other.
pub fn read_changes(instance: &CaptureInstance, server_zone: bool) -> String {
    let (offset, later) = if server_zone {
        (
            "DATEPART(TZOFFSET, ltm.tran_end_time AT TIME ZONE @P7)",
            "DATEPART(TZOFFSET, DATEADD(minute, 60, ltm.tran_end_time) AT TIME ZONE @P7)",
        )
    } else {
        ("CAST(NULL AS int)", "CAST(NULL AS int)")
    };
    let mut select = format!(
        "ct.__$start_lsn, ct.__$command_id, ct.__$seqval, ct.__$operation, \
ct.__$update_mask, ltm.tran_begin_lsn AS [{}], ltm.tran_end_time AS [{}], {offset} AS [{}], \
{later} AS [{}], ltm.start_lsn AS [{}], ltm.tran_begin_time AS [{}]",
        fixed::BEGIN_LSN,
        fixed::END_TIME,
        fixed::END_TIME_OFFSET,
        fixed::END_TIME_OFFSET_LATER,
        fixed::MAPPED,
        fixed::BEGIN_TIME,
    );
    for e in instance.change_columns() {
        select.push_str(", ");
        select.push_str(&column_expression(e.name(), e.sql_type));
    }
    let table = change_table(&instance.name);
    // After the keyset, in the index's order: the same operation's later rows are
    // none (the key is unique), so the branches are a later operation of the same
    // row, a later seqval of the same command, a later command of the same
    // transaction, a later transaction up to `@P2`.
    let branches = [
        "ct.__$start_lsn = @P3 AND ct.__$command_id = @P4 AND ct.__$seqval = @P5 \
AND ct.__$operation > @P6",
        "ct.__$start_lsn = @P3 AND ct.__$command_id = @P4 AND ct.__$seqval > @P5",
        "ct.__$start_lsn = @P3 AND ct.__$command_id > @P4",
        "ct.__$start_lsn > @P3 AND ct.__$start_lsn <= @P2",
    ];
    let order = "ct.__$start_lsn, ct.__$command_id, ct.__$seqval, ct.__$operation";
    let union: Vec<String> = branches
        .iter()
        .enumerate()
        .map(|(i, filter)| {
            format!(
                "SELECT b{i}.* FROM (SELECT TOP (@P1) {select} \
FROM {table} AS ct WITH (NOLOCK) \
LEFT JOIN cdc.lsn_time_mapping AS ltm WITH (NOLOCK) ON ltm.start_lsn = ct.__$start_lsn \
WHERE {filter} ORDER BY {order}) AS b{i}"
            )
        })
        .collect();
    format!(
        "SELECT TOP (@P1) page.* FROM ({}) AS page \
ORDER BY page.[__$start_lsn], page.[__$command_id], page.[__$seqval], page.[__$operation];",
        union.join(" UNION ALL ")
    )
}

/// Initial load: the number of rows in a table as `sys.partitions` counts them (the
/// heap or clustered index, every partition): an estimate without a scan. `@P1` is the
/// quoted two-part name.
/// <https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-partitions-transact-sql>
pub const TABLE_ROWS: &str = "SELECT SUM(p.rows) AS row_count FROM sys.partitions AS p \
WHERE p.object_id = OBJECT_ID(@P1) AND p.index_id IN (0, 1);";

/// `schema.table` of a capture instance's source table, quoted.
pub fn source_table(instance: &CaptureInstance) -> String {
    format!(
        "{}.{}",
        quote_name(&instance.schema),
        quote_name(&instance.table)
    )
}

/// A key value to resume after, given as its text form (an `nvarchar` parameter) and
/// converted by the server to the key column's type: `datetime` and `smalldatetime`
/// with style 121 (ODBC canonical, independent of the session's language and
/// `DATEFORMAT`), binary with style 1 (`0x` hex), everything else with `CAST`, whose
/// ISO forms do not depend on the session.
/// <https://learn.microsoft.com/sql/t-sql/functions/cast-and-convert-transact-sql>
fn key_parameter(parameter: usize, sql_type: SqlType) -> String {
    match sql_type {
        SqlType::DateTime | SqlType::SmallDateTime => {
            format!("CONVERT({sql_type}, @P{parameter}, 121)")
        }
        SqlType::Binary(_) | SqlType::VarBinary(_) => {
            format!("CONVERT({sql_type}, @P{parameter}, 1)")
        }
        _ => format!("CAST(@P{parameter} AS {sql_type})"),
    }
}

/// Initial load: one chunk of a source table.
///
/// `key` is the capture instance's key (name and type, in key order), empty for a
/// table without one; `after` says, per key column, whether the value to resume after
/// is NULL (`Some(true)`) or not, and is `None` for the first chunk. Parameters: `@P1`
/// the chunk size (only with a key), then the non-NULL values of `after`, in key
/// order, as text (see [`key_parameter`]). Columns, by name: each emitted column with
/// the casts of the change query (and, past the first chunk, each key column raw as
/// `[__$k0]`, `[__$k1]`…, which order the page).
///
/// A keyed table is read in its index's order (`instance.descending_keys` read
/// `DESC`: read the other way, the server would sort what is left of the table for
/// every chunk), each chunk one statement that seeks past the last key read (keyset
/// pagination: no offset to shift under concurrent writes, no transaction spanning
/// chunks). "After the keyset" is written as `UNION ALL` branches of equalities on a
/// prefix of the key and one range on the next column, each with its own `TOP` and
/// order, cut outside: as for the change query, one `OR` would let only the first
/// column seek, so a key whose first column repeats (`(tenant, id)`) would re-read
/// every earlier row of the tenant for each chunk. A table without a key is read by
/// one statement in one pass (the caller streams it; the statement holds the table's
/// schema-stability lock until the pass ends) ordered by every column, text in a
/// binary collation and then by length, `datetimeoffset` then by its offset: rows
/// that compare equal otherwise (case, trailing spaces, one instant in two offsets)
/// still come in one order, so a pass started again gives each row the same place.
/// Both under the session's default READ COMMITTED: only committed rows, each row's
/// shared lock released once read — no table lock, and no version store held for the
/// whole load as SNAPSHOT isolation would.
pub fn read_table(
    instance: &CaptureInstance,
    key: &[(String, SqlType)],
    after: Option<&[bool]>,
) -> String {
    let columns = table_columns(instance);
    let table = source_table(instance);
    if key.is_empty() {
        let order: Vec<String> = instance
            .emitted_columns()
            .flat_map(|e| heap_order(e.name(), e.sql_type))
            .collect();
        return format!(
            "SELECT {columns} FROM {table} AS ct ORDER BY {};",
            order.join(", ")
        );
    }
    let descending = |name: &str| instance.descending_keys.iter().any(|d| d == name);
    let direction = |name: &str| if descending(name) { " DESC" } else { "" };
    let order = index_order(instance, key);
    let Some(nulls) = after else {
        return format!("SELECT TOP (@P1) {columns} FROM {table} AS ct ORDER BY {order};");
    };
    let raw: Vec<String> = key
        .iter()
        .enumerate()
        .map(|(i, (name, _))| format!("ct.{} AS [__$k{i}]", quote_name(name)))
        .collect();
    let select = format!("{columns}, {}", raw.join(", "));
    let branches: Vec<String> = after_keyset(key, nulls, &descending)
        .iter()
        .enumerate()
        .map(|(b, filter)| {
            format!(
                "SELECT b{b}.* FROM (SELECT TOP (@P1) {select} FROM {table} AS ct \
WHERE {filter} ORDER BY {order}) AS b{b}"
            )
        })
        .collect();
    if branches.is_empty() {
        // Nothing comes after the keyset (a NULL in every descending column).
        return format!("SELECT TOP (@P1) {columns} FROM {table} AS ct WHERE 1 = 0;");
    }
    let outer: Vec<String> = key
        .iter()
        .enumerate()
        .map(|(i, (name, _))| format!("page.[__$k{i}]{}", direction(name)))
        .collect();
    format!(
        "SELECT TOP (@P1) page.* FROM ({}) AS page ORDER BY {};",
        branches.join(" UNION ALL "),
        outer.join(", ")
    )
}

/// The emitted columns of `instance` as a load reads them (casts and all).
fn table_columns(instance: &CaptureInstance) -> String {
    let columns: Vec<String> = instance
        .emitted_columns()
        .map(|e| column_expression(e.name(), e.sql_type))
        .collect();
    columns.join(", ")
}

/// `ORDER BY` of a keyed table in its index's order.
fn index_order(instance: &CaptureInstance, key: &[(String, SqlType)]) -> String {
    let descending = |name: &str| instance.descending_keys.iter().any(|d| d == name);
    let order: Vec<String> = key
        .iter()
        .map(|(name, _)| {
            let direction = if descending(name) { " DESC" } else { "" };
            format!("ct.{}{direction}", quote_name(name))
        })
        .collect();
    order.join(", ")
}

/// How many rows [`sample_table`] asks for.
pub const SAMPLE_ROWS: usize = 4000;

/// About [`SAMPLE_ROWS`] rows of a keyed table, in its index's order, with the
/// columns and casts of [`read_table`]: where a parallel load cuts the table into key
/// ranges. `TABLESAMPLE` reads whole pages picked at random, so it costs a few pages
/// whatever the table's size; the number of rows is approximate, and a table of a few
/// pages may give none (it is then read as one range).
/// <https://learn.microsoft.com/sql/t-sql/queries/from-transact-sql#tablesample-clause>
pub fn sample_table(instance: &CaptureInstance, key: &[(String, SqlType)]) -> String {
    format!(
        "SELECT {} FROM {} AS ct TABLESAMPLE ({SAMPLE_ROWS} ROWS) ORDER BY {};",
        table_columns(instance),
        source_table(instance),
        index_order(instance, key)
    )
}

/// "After the keyset" in the index's order, as conjunctions (one a branch): per key
/// column, equalities with the keyset on the columns before it and what comes after
/// its value. NULL sorts first: after NULL, ascending, comes every value;
/// descending, nothing; after a value, descending, come the smaller ones and then
/// NULL. Values are `@P2`, `@P3`… in key order, NULLs taking none.
fn after_keyset(
    key: &[(String, SqlType)],
    nulls: &[bool],
    descending: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut parameter = 1;
    let mut equal: Vec<String> = Vec::new();
    let mut branches = Vec::new();
    for ((name, sql_type), &is_null) in key.iter().zip(nulls) {
        let column = format!("ct.{}", quote_name(name));
        let (equality, later) = if is_null {
            let later = if descending(name) {
                Vec::new()
            } else {
                vec![format!("{column} IS NOT NULL")]
            };
            (format!("{column} IS NULL"), later)
        } else {
            parameter += 1;
            let value = key_parameter(parameter, *sql_type);
            let later = if descending(name) {
                vec![format!("{column} < {value}"), format!("{column} IS NULL")]
            } else {
                vec![format!("{column} > {value}")]
            };
            (format!("{column} = {value}"), later)
        };
        for alternative in later {
            let mut terms = equal.clone();
            terms.push(alternative);
            branches.push(terms.join(" AND "));
        }
        equal.push(equality);
    }
    branches
}

/// A heap's `ORDER BY` terms for one column: its value, and what tells apart values
/// that compare equal — text in a binary collation (its own code page's characters,
/// via `nvarchar`) and its length (trailing spaces compare equal even in a binary
/// collation), a `datetimeoffset`'s offset.
fn heap_order(name: &str, sql_type: SqlType) -> Vec<String> {
    let column = format!("ct.{}", quote_name(name));
    match sql_type {
        SqlType::Char(length) | SqlType::VarChar(length) => vec![
            format!(
                "CAST({column} AS {}) COLLATE Latin1_General_BIN2",
                unicode("nvarchar", length)
            ),
            format!("DATALENGTH({column})"),
        ],
        SqlType::NChar(_) | SqlType::NVarChar(_) => vec![
            format!("{column} COLLATE Latin1_General_BIN2"),
            format!("DATALENGTH({column})"),
        ],
        SqlType::DateTimeOffset { .. } => {
            vec![column.clone(), format!("DATEPART(TZOFFSET, {column})")]
        }
        _ => vec![column],
    }
}

/// Largest number of capture instances probed in one statement (SQL Server allows
/// 2,100 parameters; each instance takes two).
pub const PROBE_CHUNK: usize = 500;

/// One statement that answers, for each capture instance, its `min_lsn` and its first
/// change in (`after`, `to`]: an idle-or-not check for every table in one round trip.
///
/// Parameters: `@P1` the upper LSN `to`; then for instance `i` (0-based),
/// `@P{2i+2}` its name and `@P{2i+3}` its `after` LSN.
///
/// The change tables are read `WITH (NOLOCK)`, as [`read_changes`] reads them and
/// for its reasons: every row at or below `to` is committed and written once, and
/// the cleanup job's deletes (5,000 rows a statement, which can escalate to a table
/// lock) would otherwise hold the probe, and with it every table's poll, until
/// they end. A row the cleanup is deleting can only make `next_change` early; the
/// read that follows checks the low end again.
pub fn probe(capture_instances: &[&str]) -> String {
    let parts: Vec<String> = capture_instances
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let (name_param, after_param) = (2 * i + 2, 2 * i + 3);
            format!(
                "SELECT @P{name_param} AS capture_instance, \
sys.fn_cdc_get_min_lsn(@P{name_param}) AS min_lsn, \
(SELECT MIN(ct.__$start_lsn) FROM {table} AS ct WITH (NOLOCK) \
WHERE ct.__$start_lsn > @P{after_param} AND ct.__$start_lsn <= @P1) AS next_change",
                table = change_table(name),
            )
        })
        .collect();
    format!("{};", parts.join(" UNION ALL "))
}

/// Whether the login may run `sys.sp_cdc_enable_table` and `sys.sp_cdc_disable_table`,
/// which require `db_owner` (both pages' Permissions): a member of the role, or the
/// `dbo` user — the database's owner, and every `sysadmin` — for whom
/// `IS_ROLEMEMBER` answers 0 ("dbo always returns 0", its Remarks).
/// <https://learn.microsoft.com/sql/t-sql/functions/is-rolemember-transact-sql>
pub const IS_DB_OWNER: &str = "SELECT CAST(CASE WHEN IS_ROLEMEMBER(N'db_owner') = 1 \
OR IS_SRVROLEMEMBER(N'sysadmin') = 1 OR USER_NAME() = N'dbo' THEN 1 ELSE 0 END AS int) \
AS is_db_owner;";

/// How long `sys.sp_cdc_enable_table` and `sys.sp_cdc_disable_table` wait for a
/// lock on the table (`SET LOCK_TIMEOUT`, in the same batch) before failing with
/// 1222. Both take a schema-modification lock on the source table, which waits
/// behind any open transaction that wrote it, and every writer that comes after
/// queues behind that wait: unbounded, application writes would stall for as long
/// as the query timeout. A parameterized batch runs through `sp_executesql`, and a
/// `SET` option set in dynamic SQL is restored when the batch returns (Learn: SET
/// statements, "Considerations when you use the SET statements"), so the session's
/// other queries keep the default (wait for ever, bounded by the query timeout).
/// <https://learn.microsoft.com/sql/t-sql/statements/set-lock-timeout-transact-sql>
/// <https://learn.microsoft.com/sql/t-sql/statements/set-statements-transact-sql>
pub const CAPTURE_DDL_LOCK_TIMEOUT_MS: u64 = 5_000;

/// A new capture instance, with the options of the one it replaces. `@P8` is the
/// column list (`QUOTENAME`d names, comma-separated), NULL for every column. The
/// lock wait is bounded ([`CAPTURE_DDL_LOCK_TIMEOUT_MS`]).
/// <https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sys-sp-cdc-enable-table-transact-sql>
pub const ENABLE_TABLE: &str = "SET LOCK_TIMEOUT 5000; \
EXEC sys.sp_cdc_enable_table @source_schema = @P1, \
@source_name = @P2, @capture_instance = @P3, @role_name = @P4, @index_name = @P5, \
@filegroup_name = @P6, @supports_net_changes = @P7, @captured_column_list = @P8, \
@allow_partition_switch = @P9;";

/// One capture instance of a table disabled (its change table dropped), the lock
/// wait bounded ([`CAPTURE_DDL_LOCK_TIMEOUT_MS`]).
/// <https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sys-sp-cdc-disable-table-transact-sql>
pub const DISABLE_TABLE: &str = "SET LOCK_TIMEOUT 5000; \
EXEC sys.sp_cdc_disable_table @source_schema = @P1, \
@source_name = @P2, @capture_instance = @P3;";

/// `source.cleanup = "after_delivery"`: one capture instance's change table cleaned
/// below what every stream of the database delivered. `@P1` the capture instance,
/// `@P2` the highest LSN every such stream has delivered through. The procedure's
/// low-water mark must be a `start_lsn` of `cdc.lsn_time_mapping`, so the batch
/// takes the latest one at or below `@P2` (a row's `__$start_lsn` is one; an
/// idle position is `max_lsn`, also one), and runs the procedure only when that
/// mark is above the instance's current low end: a lower one is error 22957.
/// The procedure deletes the rows below the mark, 5,000 per statement, and needs
/// `db_owner`. It answers the mark it took (NULL: none) and the low end after it.
/// <https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sys-sp-cdc-cleanup-change-table-transact-sql>
pub const CLEANUP_CHANGE_TABLE: &str = "DECLARE @mark binary(10); \
SELECT @mark = MAX(start_lsn) FROM cdc.lsn_time_mapping WHERE start_lsn <= @P2; \
IF @mark > sys.fn_cdc_get_min_lsn(@P1) \
EXEC sys.sp_cdc_cleanup_change_table @capture_instance = @P1, @low_water_mark = @mark; \
SELECT @mark AS low_water_mark, sys.fn_cdc_get_min_lsn(@P1) AS min_lsn;";

/// Per capture instance, its source table's columns it does not capture (matched by
/// `cdc.captured_columns.column_id`), in column order; with each row the server's
/// time of the read and the commit time of the capture job's last scanned
/// transaction, which tell whether `cdc.ddl_history` already holds every DDL this
/// read shows.
pub const UNCAPTURED_COLUMNS: &str = "SELECT ct.capture_instance, c.name AS column_name, \
SYSDATETIME() AS read_at, \
sys.fn_cdc_map_lsn_to_time(sys.fn_cdc_get_max_lsn()) AS scanned_through \
FROM cdc.change_tables AS ct JOIN sys.columns AS c ON c.object_id = ct.source_object_id \
WHERE NOT EXISTS (SELECT 1 FROM cdc.captured_columns AS cc \
WHERE cc.object_id = ct.object_id AND cc.column_id = c.column_id) \
ORDER BY ct.capture_instance, c.column_id;";

/// User tables CDC does not capture (`sys.tables.is_tracked_by_cdc`), for
/// `source.enable_cdc`.
/// <https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-tables-transact-sql>
pub const UNCAPTURED_TABLES: &str = "SELECT s.name AS schema_name, t.name AS table_name \
FROM sys.tables AS t JOIN sys.schemas AS s ON s.schema_id = t.schema_id \
WHERE t.is_tracked_by_cdc = 0 AND t.is_ms_shipped = 0 AND s.name <> N'cdc' \
ORDER BY s.name, t.name;";

/// `@captured_column_list` for `columns`: each name quoted as `QUOTENAME` quotes
/// it, comma-separated.
pub fn column_list(columns: &[String]) -> String {
    columns
        .iter()
        .map(|c| quote_name(c))
        .collect::<Vec<_>>()
        .join(",")
}

/// Every constant above, for the parse test.
pub const ALL_CONSTANTS: &[(&str, &str)] = &[
    ("IS_DB_OWNER", IS_DB_OWNER),
    ("ENABLE_TABLE", ENABLE_TABLE),
    ("DISABLE_TABLE", DISABLE_TABLE),
    ("CLEANUP_CHANGE_TABLE", CLEANUP_CHANGE_TABLE),
    ("UNCAPTURED_COLUMNS", UNCAPTURED_COLUMNS),
    ("UNCAPTURED_TABLES", UNCAPTURED_TABLES),
    ("MAX_LSN", MAX_LSN),
    ("MIN_LSN", MIN_LSN),
    ("DDL_HISTORY", DDL_HISTORY),
    ("DDL_HISTORY_ZONED", DDL_HISTORY_ZONED),
    ("AGENT_STATUS", AGENT_STATUS),
    ("SERVER_FACTS", SERVER_FACTS),
    ("CDC_JOBS", CDC_JOBS),
    ("CDC_JOBS_AZURE", CDC_JOBS_AZURE),
    ("CAPTURE_JOB_RUNNING", CAPTURE_JOB_RUNNING),
    ("LOG_SCAN", LOG_SCAN),
    ("LSN_TIME", LSN_TIME),
    ("LSN_TIME_ZONED", LSN_TIME_ZONED),
    ("TABLE_ROWS", TABLE_ROWS),
];

/// Panics, naming the query, when `sql` does not parse as T-SQL (tests only).
#[cfg(test)]
pub(crate) fn assert_parses(name: &str, sql: &str) {
    use sqlparser::dialect::MsSqlDialect;
    use sqlparser::parser::Parser;
    if let Err(e) = Parser::parse_sql(&MsSqlDialect {}, sql) {
        panic!("{name} does not parse: {e}\n{sql}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsn::Lsn;
    use crate::source::CapturedColumn;
    use sqlparser::dialect::MsSqlDialect;
    use sqlparser::parser::Parser;

    fn parses(name: &str, sql: &str) {
        assert_parses(name, sql);
    }

    fn awkward_instance(name: &str) -> CaptureInstance {
        let column = |name: &str, ordinal, sql_type| CapturedColumn {
            name: name.into(),
            ordinal,
            table_index: Some(ordinal - 1),
            dropped: None,
            sql_type,
            computed: false,
            nullable: Some(true),
            default: None,
        };
        CaptureInstance {
            name: name.into(),
            schema: "dbo".into(),
            table: "order details".into(),
            object_id: 7,
            start_lsn: Some(Lsn::ZERO),
            has_command_id: true,
            options: Default::default(),
            create_date: chrono::NaiveDateTime::default(),
            columns: vec![
                column("Id", 1, Ok(SqlType::Int)),
                column("unit price", 2, Ok(SqlType::Money)),
                column("x]y", 3, Ok(SqlType::NVarChar(Length::Max))),
                column("Code", 5, Ok(SqlType::Char(Length::Bounded(10)))),
                column("Note", 6, Ok(SqlType::VarChar(Length::Bounded(8000)))),
                column("Name", 7, Ok(SqlType::NVarChar(Length::Bounded(50)))),
                column(
                    "Shape",
                    4,
                    Err(crate::event::value::TypeError::Excluded {
                        type_name: "geometry".into(),
                    }),
                ),
            ],
            key_columns: vec!["Id".into()],
            descending_keys: Vec::new(),
        }
    }

    #[test]
    fn every_constant_parses_as_tsql() {
        for (name, sql) in ALL_CONSTANTS {
            parses(name, sql);
        }
    }

    #[test]
    fn built_queries_parse_for_awkward_names() {
        for name in ["dbo_order details", "dbo_x]y", "plain", "dbo_ünïcode"] {
            let instance = awkward_instance(name);
            parses("read_changes", &read_changes(&instance, false));
            parses(
                "read_changes in the server's zone",
                &read_changes(&instance, true),
            );
            parses("probe", &probe(&[name, "dbo_other"]));
        }
    }

    #[test]
    fn load_queries_parse_for_every_key_shape_and_null_pattern() {
        let instance = awkward_instance("dbo_order details");
        let key = vec![
            ("Id".to_owned(), SqlType::Int),
            ("x]y".to_owned(), SqlType::NVarChar(Length::Bounded(10))),
            ("When".to_owned(), SqlType::DateTime),
            ("Raw".to_owned(), SqlType::VarBinary(Length::Bounded(16))),
        ];
        parses("read_table, no key", &read_table(&instance, &[], None));
        parses(
            "read_table, first chunk",
            &read_table(&instance, &key, None),
        );
        for nulls in 0..16u32 {
            let pattern: Vec<bool> = (0..4).map(|i| nulls & (1 << i) != 0).collect();
            parses(
                "read_table, after a key",
                &read_table(&instance, &key, Some(&pattern)),
            );
        }
        let sample = sample_table(&instance, &key);
        parses("sample_table", &sample);
        // The first chunk's columns and order, sampled instead of cut by TOP.
        let first = read_table(&instance, &key, None);
        let columns =
            |sql: &str| sql[sql.find(") ").unwrap() + 2..sql.find(" FROM ").unwrap()].to_owned();
        assert_eq!(
            columns(&first),
            sample["SELECT ".len()..sample.find(" FROM ").unwrap()]
        );
        assert!(
            sample.contains("TABLESAMPLE (4000 ROWS) ORDER BY ct.[Id], ct.[x]]y]"),
            "{sample}"
        );
    }

    #[test]
    fn the_load_query_seeks_past_the_key_in_key_order() {
        let instance = awkward_instance("dbo_order details");
        let key = vec![
            ("Id".to_owned(), SqlType::Int),
            ("When".to_owned(), SqlType::DateTime),
        ];
        assert_eq!(
            read_table(&instance, &key, None),
            "SELECT TOP (@P1) ct.[Id] AS [Id], CAST(ct.[unit price] AS decimal(19,4)) AS [unit price], \
CAST(ct.[x]]y] AS varbinary(max)) AS [x]]y], \
CAST(CAST(ct.[Code] AS nvarchar(10)) AS varbinary(20)) AS [Code], \
CAST(CAST(ct.[Note] AS nvarchar(max)) AS varbinary(max)) AS [Note], \
CAST(ct.[Name] AS varbinary(100)) AS [Name] \
FROM [dbo].[order details] AS ct ORDER BY ct.[Id], ct.[When];"
        );
        let after = read_table(&instance, &key, Some(&[false, false]));
        // Two branches, each a prefix of equalities and one range: all seekable.
        assert!(
            after.contains("WHERE ct.[Id] > CAST(@P2 AS int) ORDER BY ct.[Id], ct.[When]) AS b0"),
            "{after}"
        );
        assert!(
            after.contains(
                "WHERE ct.[Id] = CAST(@P2 AS int) AND ct.[When] > CONVERT(datetime, @P3, 121) \
ORDER BY ct.[Id], ct.[When]) AS b1"
            ),
            "{after}"
        );
        assert!(!after.contains(" OR "), "no OR: {after}");
        assert!(
            after.ends_with(") AS page ORDER BY page.[__$k0], page.[__$k1];"),
            "cut outside in key order: {after}"
        );
        // A NULL takes no parameter: the next value is @P2, and NULL sorts first.
        let after_null = read_table(&instance, &key, Some(&[true, false]));
        assert!(
            after_null.contains("WHERE ct.[Id] IS NOT NULL ORDER BY")
                && after_null.contains(
                    "WHERE ct.[Id] IS NULL AND ct.[When] > CONVERT(datetime, @P2, 121) ORDER BY"
                ),
            "{after_null}"
        );
        // A descending key column is read in its index's order: DESC, and after a
        // value come the smaller ones, then NULL (which sorts first ascending).
        let mut descending = instance.clone();
        descending.descending_keys = vec!["When".into()];
        assert!(read_table(&descending, &key, None).ends_with("ORDER BY ct.[Id], ct.[When] DESC;"));
        let after_desc = read_table(&descending, &key, Some(&[false, false]));
        for branch in [
            "WHERE ct.[Id] > CAST(@P2 AS int) ORDER BY ct.[Id], ct.[When] DESC",
            "WHERE ct.[Id] = CAST(@P2 AS int) AND ct.[When] < CONVERT(datetime, @P3, 121) ORDER BY",
            "WHERE ct.[Id] = CAST(@P2 AS int) AND ct.[When] IS NULL ORDER BY",
        ] {
            assert!(after_desc.contains(branch), "{branch}: {after_desc}");
        }
        assert!(after_desc.ends_with("ORDER BY page.[__$k0], page.[__$k1] DESC;"));
        // After NULL in a descending last column: only later first-column values.
        let after_desc_null = read_table(&descending, &key, Some(&[false, true]));
        assert_eq!(
            after_desc_null.matches(" AS b").count(),
            1,
            "{after_desc_null}"
        );
        for sql in [&after, &after_null, &after_desc, &after_desc_null] {
            assert_parses("read_table", sql);
        }
        let binary = read_table(
            &instance,
            &[("Raw".to_owned(), SqlType::Binary(Length::Bounded(8)))],
            Some(&[false]),
        );
        assert!(
            binary.contains("ct.[Raw] > CONVERT(binary(8), @P2, 1)"),
            "{binary}"
        );
        assert_eq!(
            read_table(&instance, &[], None),
            read_table(&instance, &[], Some(&[])),
            "a table without a key is one statement, whatever the cursor"
        );
        let heap = read_table(&instance, &[], None);
        assert!(!heap.contains("TOP"), "{heap}");
        assert!(
            heap.ends_with(
                "ORDER BY ct.[Id], ct.[unit price], \
ct.[x]]y] COLLATE Latin1_General_BIN2, DATALENGTH(ct.[x]]y]), \
CAST(ct.[Code] AS nvarchar(10)) COLLATE Latin1_General_BIN2, DATALENGTH(ct.[Code]), \
CAST(ct.[Note] AS nvarchar(max)) COLLATE Latin1_General_BIN2, DATALENGTH(ct.[Note]), \
ct.[Name] COLLATE Latin1_General_BIN2, DATALENGTH(ct.[Name]);"
            ),
            "a pass in one order, rows equal but for case or trailing spaces included: {heap}"
        );
        assert_parses("read_table, no key", &heap);
    }

    #[test]
    fn the_malformed_is_rejected_by_the_parse_check() {
        // The parse check has teeth: a broken query fails it.
        assert!(Parser::parse_sql(&MsSqlDialect {}, "SELECT FROM WHERE;").is_err());
        assert!(Parser::parse_sql(&MsSqlDialect {}, "SELECT * FROM cdc.[a_CT").is_err());
    }

    #[test]
    fn names_are_quoted_by_quotename_rules() {
        assert_eq!(quote_name("x]y"), "[x]]y]");
        assert_eq!(quote_name("order details"), "[order details]");
        assert_eq!(quote_name("a]]"), "[a]]]]]");
        assert_eq!(change_table("dbo_x]y"), "cdc.[dbo_x]]y_CT]");
    }

    #[test]
    fn the_change_query_selects_emitted_columns_by_name_with_their_casts() {
        let sql = read_changes(&awkward_instance("dbo_x]y"), false);
        assert!(sql.contains("FROM cdc.[dbo_x]]y_CT] AS ct"), "{sql}");
        assert!(
            sql.contains("CAST(ct.[unit price] AS decimal(19,4)) AS [unit price]"),
            "{sql}"
        );
        assert!(
            sql.contains("CAST(ct.[x]]y] AS varbinary(max)) AS [x]]y]"),
            "{sql}"
        );
        assert!(
            sql.contains("CAST(CAST(ct.[Code] AS nvarchar(10)) AS varbinary(20)) AS [Code]"),
            "char keeps exactly its stored padding: {sql}"
        );
        assert!(
            sql.contains("CAST(CAST(ct.[Note] AS nvarchar(max)) AS varbinary(max)) AS [Note]"),
            "{sql}"
        );
        assert!(
            sql.contains("CAST(ct.[Name] AS varbinary(100)) AS [Name]"),
            "{sql}"
        );
        assert!(sql.contains("ct.[Id] AS [Id]"), "{sql}");
        assert!(
            !sql.contains("Shape"),
            "excluded columns are not read: {sql}"
        );
        assert!(
            sql.contains("CAST(NULL AS int) AS [__$tran_end_offset]"),
            "{sql}"
        );
        assert!(
            sql.contains("WHERE ct.__$start_lsn > @P3 AND ct.__$start_lsn <= @P2 ORDER BY"),
            "the later transactions' branch: {sql}"
        );
        assert_eq!(
            sql.matches(" OR ").count(),
            0,
            "no OR: every branch's predicates are seek predicates"
        );
        assert_eq!(
            sql.matches("WITH (NOLOCK)").count(),
            8,
            "the change table and the time mapping, in each of the four branches: {sql}"
        );
        assert!(
            sql.contains(
                "ORDER BY ct.__$start_lsn, ct.__$command_id, ct.__$seqval, ct.__$operation"
            )
        );
        let zoned = read_changes(&awkward_instance("a"), true);
        assert!(
            zoned.contains(
                "DATEPART(TZOFFSET, ltm.tran_end_time AT TIME ZONE @P7) AS [__$tran_end_offset]"
            ),
            "{zoned}"
        );
        let probe = probe(&["a", "b"]);
        assert!(probe.contains("@P4 AS capture_instance"), "{probe}");
        assert_eq!(
            probe.matches("AS ct WITH (NOLOCK)").count(),
            2,
            "each change table read without shared locks: {probe}"
        );
        assert!(
            probe.contains("> @P5 AND ct.__$start_lsn <= @P1"),
            "{probe}"
        );
    }

    #[test]
    fn the_fixed_columns_are_selected_in_their_order_before_the_captured_ones() {
        for zoned in [false, true] {
            let sql = read_changes(&awkward_instance("a"), zoned);
            let first_branch = sql.split(" UNION ALL ").next().unwrap();
            let mut at = 0;
            for name in fixed::IN_ORDER {
                let found = first_branch[at..]
                    .find(name)
                    .unwrap_or_else(|| panic!("{name} after byte {at}: {first_branch}"));
                at += found + name.len();
            }
            let first_captured = first_branch.find("ct.[").unwrap();
            assert!(at <= first_captured, "{first_branch}");
        }
    }

    #[test]
    fn a_dropped_column_is_not_selected() {
        let mut instance = awkward_instance("a");
        instance.columns[0].table_index = None;
        let sql = read_changes(&instance, false);
        assert!(!sql.contains("[Id]"), "{sql}");
        assert!(sql.contains("[unit price]"), "{sql}");
    }

    #[test]
    fn the_fingerprint_comes_with_max_lsn() {
        assert!(MAX_LSN.contains("sys.fn_cdc_get_max_lsn() AS max_lsn"));
        assert!(MAX_LSN.contains("AS tables_checksum"));
        assert!(MAX_LSN.contains("COUNT_BIG(*) FROM cdc.ddl_history"));
    }

    #[test]
    fn cdcs_procedures_run_with_the_bounded_lock_wait_in_their_own_batch() {
        let set = format!("SET LOCK_TIMEOUT {CAPTURE_DDL_LOCK_TIMEOUT_MS}; EXEC ");
        for sql in [ENABLE_TABLE, DISABLE_TABLE] {
            assert!(sql.starts_with(&set), "{sql}");
        }
    }
}

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

use crate::event::value::SqlType;
use crate::source::CaptureInstance;

/// `sys.fn_cdc_get_max_lsn()`: the high end of every capture instance's validity
/// interval (the highest `start_lsn` in `cdc.lsn_time_mapping`).
/// <https://learn.microsoft.com/sql/relational-databases/system-functions/sys-fn-cdc-get-max-lsn-transact-sql>
pub const MAX_LSN: &str = "SELECT sys.fn_cdc_get_max_lsn() AS max_lsn;";

/// The database, its GUID (the default stream GUID), whether CDC is enabled on it,
/// and the server's current UTC offset in minutes.
/// <https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-database-recovery-status-transact-sql>
pub const DATABASE_INFO: &str = "SELECT DB_NAME() AS database_name, drs.database_guid, \
d.is_cdc_enabled, DATEPART(TZOFFSET, SYSDATETIMEOFFSET()) AS utc_offset_minutes \
FROM sys.databases AS d \
LEFT JOIN sys.database_recovery_status AS drs ON drs.database_id = d.database_id \
WHERE d.database_id = DB_ID();";

/// Capture instances and their source tables.
/// <https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-change-tables-transact-sql>
pub const CAPTURE_INSTANCES: &str = "SELECT ct.capture_instance, \
OBJECT_SCHEMA_NAME(ct.source_object_id) AS schema_name, \
OBJECT_NAME(ct.source_object_id) AS table_name, \
ct.start_lsn, ct.create_date \
FROM cdc.change_tables AS ct \
ORDER BY ct.create_date, ct.capture_instance;";

/// Captured columns with the type facts of the source column: the base system type
/// name (so alias types such as `sysname` resolve to `nvarchar`), whether the declared
/// type is user-defined, `max_length`, precision, scale, and the column's 0-based
/// position among the table's columns. A column dropped from the source table since
/// the capture instance was created has no `sys.columns` row: its facts are NULL.
/// <https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-captured-columns-transact-sql>
pub const CAPTURED_COLUMNS: &str = "SELECT ct.capture_instance, cc.column_name, \
cc.column_ordinal, cc.column_type, \
TYPE_NAME(sc.system_type_id) AS type_name, ty.is_user_defined, \
sc.max_length, sc.precision, sc.scale, \
(SELECT COUNT(*) FROM sys.columns AS prior \
WHERE prior.object_id = sc.object_id AND prior.column_id < sc.column_id) AS table_index \
FROM cdc.change_tables AS ct \
JOIN cdc.captured_columns AS cc ON cc.object_id = ct.object_id \
LEFT JOIN sys.columns AS sc ON sc.object_id = ct.source_object_id AND sc.column_id = cc.column_id \
LEFT JOIN sys.types AS ty ON ty.user_type_id = sc.user_type_id \
ORDER BY ct.capture_instance, cc.column_ordinal;";

/// Key columns in key order: the source table's primary key, or, for a table without
/// one, the unique index CDC was enabled with (`cdc.index_columns`).
/// <https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-index-columns-transact-sql>
pub const KEY_COLUMNS: &str = "SELECT ct.capture_instance, c.name AS column_name, \
ic.key_ordinal AS key_ordinal \
FROM cdc.change_tables AS ct \
JOIN sys.indexes AS i ON i.object_id = ct.source_object_id AND i.is_primary_key = 1 \
JOIN sys.index_columns AS ic ON ic.object_id = i.object_id AND ic.index_id = i.index_id \
AND ic.key_ordinal > 0 \
JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id \
UNION ALL \
SELECT ct.capture_instance, cic.column_name, cic.index_ordinal \
FROM cdc.change_tables AS ct \
JOIN cdc.index_columns AS cic ON cic.object_id = ct.object_id \
WHERE NOT EXISTS (SELECT 1 FROM sys.indexes AS pk \
WHERE pk.object_id = ct.source_object_id AND pk.is_primary_key = 1) \
ORDER BY 1, 3;";

/// DDL recorded against a capture instance's change table.
/// <https://learn.microsoft.com/sql/relational-databases/system-tables/cdc-ddl-history-transact-sql>
pub const DDL_HISTORY: &str = "SELECT ct.capture_instance, dh.ddl_lsn, dh.ddl_time, \
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

/// `QUOTENAME`: wraps an identifier in brackets, doubling any `]`.
pub fn quote_name(identifier: &str) -> String {
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
pub fn change_table(capture_instance: &str) -> String {
    format!("cdc.{}", quote_name(&format!("{capture_instance}_CT")))
}

/// The select expression of an emitted column: money and smallmoney are cast to
/// `decimal(19,4)` because the driver decodes them as a lossy `f64`.
fn column_expression(name: &str, sql_type: SqlType) -> String {
    let column = format!("ct.{}", quote_name(name));
    match sql_type {
        SqlType::Money | SqlType::SmallMoney => format!("CAST({column} AS decimal(19,4))"),
        _ => column,
    }
}

/// Number of fixed columns before the emitted values in [`read_changes`] rows.
pub const CHANGE_ROW_FIXED_COLUMNS: usize = 7;

/// One page of a capture instance's changes, in CDC order.
///
/// Parameters: `@P1` page size, `@P2` upper LSN (inclusive), then the keyset to resume
/// after: `@P3` start LSN, `@P4` command id, `@P5` seqval, `@P6` operation.
/// Columns: `__$start_lsn`, `__$command_id`, `__$seqval`, `__$operation`,
/// `__$update_mask`, `tran_begin_lsn`, `tran_end_time`, then the emitted columns in
/// column order.
pub fn read_changes(instance: &CaptureInstance) -> String {
    let columns: Vec<String> = instance
        .emitted_columns()
        .map(|(c, t)| column_expression(&c.name, t))
        .collect();
    let mut select = String::from(
        "ct.__$start_lsn, ct.__$command_id, ct.__$seqval, ct.__$operation, \
ct.__$update_mask, ltm.tran_begin_lsn, ltm.tran_end_time",
    );
    for column in &columns {
        select.push_str(", ");
        select.push_str(column);
    }
    format!(
        "SELECT TOP (@P1) {select} \
FROM {table} AS ct \
LEFT JOIN cdc.lsn_time_mapping AS ltm ON ltm.start_lsn = ct.__$start_lsn \
WHERE ct.__$start_lsn <= @P2 AND (ct.__$start_lsn > @P3 \
OR (ct.__$start_lsn = @P3 AND ct.__$command_id > @P4) \
OR (ct.__$start_lsn = @P3 AND ct.__$command_id = @P4 AND ct.__$seqval > @P5) \
OR (ct.__$start_lsn = @P3 AND ct.__$command_id = @P4 AND ct.__$seqval = @P5 \
AND ct.__$operation > @P6)) \
ORDER BY ct.__$start_lsn, ct.__$command_id, ct.__$seqval, ct.__$operation;",
        table = change_table(&instance.name),
    )
}

/// Largest number of capture instances probed in one statement (SQL Server allows
/// 2,100 parameters; each instance takes two).
pub const PROBE_CHUNK: usize = 500;

/// One statement that answers, for each capture instance, its `min_lsn` and its first
/// change in (`after`, `to`]: an idle-or-not check for every table in one round trip.
///
/// Parameters: `@P1` the upper LSN `to`; then for instance `i` (0-based),
/// `@P{2i+2}` its name and `@P{2i+3}` its `after` LSN.
pub fn probe(capture_instances: &[&str]) -> String {
    let parts: Vec<String> = capture_instances
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let (name_param, after_param) = (2 * i + 2, 2 * i + 3);
            format!(
                "SELECT @P{name_param} AS capture_instance, \
sys.fn_cdc_get_min_lsn(@P{name_param}) AS min_lsn, \
(SELECT MIN(ct.__$start_lsn) FROM {table} AS ct \
WHERE ct.__$start_lsn > @P{after_param} AND ct.__$start_lsn <= @P1) AS next_change",
                table = change_table(name),
            )
        })
        .collect();
    format!("{};", parts.join(" UNION ALL "))
}

/// The checkpoint table's read and upsert (see `sql/04_checkpoint_table.sql`).
pub const CHECKPOINT_READ: &str =
    "SELECT position FROM dbo.mssql_ces_checkpoint WHERE stream_name = @P1;";

/// Upsert of a stream's position. One poller writes a given stream name, so the
/// upsert needs no `HOLDLOCK` against a concurrent insert of the same key.
pub const CHECKPOINT_WRITE: &str = "MERGE dbo.mssql_ces_checkpoint AS t \
USING (SELECT @P1 AS stream_name, @P2 AS position) AS s \
ON t.stream_name = s.stream_name \
WHEN MATCHED THEN UPDATE SET position = s.position, updated_at = SYSUTCDATETIME() \
WHEN NOT MATCHED THEN INSERT (stream_name, position, updated_at) \
VALUES (s.stream_name, s.position, SYSUTCDATETIME());";

/// Every constant above, for the parse test.
pub const ALL_CONSTANTS: &[(&str, &str)] = &[
    ("MAX_LSN", MAX_LSN),
    ("DATABASE_INFO", DATABASE_INFO),
    ("CAPTURE_INSTANCES", CAPTURE_INSTANCES),
    ("CAPTURED_COLUMNS", CAPTURED_COLUMNS),
    ("KEY_COLUMNS", KEY_COLUMNS),
    ("DDL_HISTORY", DDL_HISTORY),
    ("AGENT_STATUS", AGENT_STATUS),
    ("CHECKPOINT_READ", CHECKPOINT_READ),
    ("CHECKPOINT_WRITE", CHECKPOINT_WRITE),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::value::Length;
    use crate::lsn::Lsn;
    use crate::source::CapturedColumn;
    use sqlparser::dialect::MsSqlDialect;
    use sqlparser::parser::Parser;

    fn parses(name: &str, sql: &str) {
        if let Err(e) = Parser::parse_sql(&MsSqlDialect {}, sql) {
            panic!("{name} does not parse: {e}\n{sql}");
        }
    }

    fn awkward_instance(name: &str) -> CaptureInstance {
        let column = |name: &str, ordinal, sql_type| CapturedColumn {
            name: name.into(),
            ordinal,
            table_index: ordinal - 1,
            sql_type,
        };
        CaptureInstance {
            name: name.into(),
            schema: "dbo".into(),
            table: "order details".into(),
            start_lsn: Lsn::ZERO,
            create_date: chrono::NaiveDateTime::default(),
            columns: vec![
                column("Id", 1, Ok(SqlType::Int)),
                column("unit price", 2, Ok(SqlType::Money)),
                column("x]y", 3, Ok(SqlType::NVarChar(Length::Max))),
                column(
                    "Shape",
                    4,
                    Err(crate::event::value::TypeError::Excluded {
                        type_name: "geometry".into(),
                    }),
                ),
            ],
            key_columns: vec!["Id".into()],
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
            parses("read_changes", &read_changes(&instance));
            parses("probe", &probe(&[name, "dbo_other"]));
        }
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
    fn the_change_query_selects_emitted_columns_and_casts_money() {
        let sql = read_changes(&awkward_instance("dbo_x]y"));
        assert!(sql.contains("FROM cdc.[dbo_x]]y_CT] AS ct"), "{sql}");
        assert!(
            sql.contains("CAST(ct.[unit price] AS decimal(19,4))"),
            "{sql}"
        );
        assert!(sql.contains("ct.[x]]y]"), "{sql}");
        assert!(
            !sql.contains("Shape"),
            "excluded columns are not read: {sql}"
        );
        assert!(
            sql.contains(
                "ORDER BY ct.__$start_lsn, ct.__$command_id, ct.__$seqval, ct.__$operation"
            )
        );
        let probe = probe(&["a", "b"]);
        assert!(probe.contains("@P4 AS capture_instance"), "{probe}");
        assert!(
            probe.contains("> @P5 AND ct.__$start_lsn <= @P1"),
            "{probe}"
        );
    }
}

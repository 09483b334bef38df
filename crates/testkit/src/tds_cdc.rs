//! The stand-in's answers to the poller's queries, from a CDC simulator (or any
//! [`ChangeSource`], such as the synthetic workload): the same state the simulator
//! tests read directly, now read through the real driver and TDS bytes.
//!
//! A query is recognised only when its text equals what the source module's constant
//! or builder produces for the state being served (the builders are run here with the
//! capture instances, names and key patterns the parameters name), so a query that
//! changes or a new one gets an error naming it. Columns are typed as SQL Server types
//! them: LSNs `binary(10)`, `tran_end_time` `datetime`, `COUNT_BIG` `bigint`, and each
//! change-table column in the form the query's cast gives it (text as the UTF-16
//! bytes of `varbinary`, money as `decimal(19,4)`).

use std::sync::{Arc, Mutex};

use chrono::{NaiveDate, NaiveDateTime, Timelike};
use futures_util::FutureExt as _;
use mssql_ces::event::Value;
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::lsn::Lsn;
use mssql_ces::mssql::SqlErrorKind;
use mssql_ces::source::catalog::{
    CAPTURE_INSTANCES, CAPTURED_COLUMNS, CATALOG_VERSION, DATABASE_GUID, DATABASE_INFO,
    KEY_COLUMNS, SERVER_TIME_ZONE,
};
use mssql_ces::source::queries::{self, fixed};
use mssql_ces::source::{
    CaptureInstance, CaptureOptions, CaptureSettings, Catalog, ChangeSource, EnableCapture, Probe,
    RowKey, SourceError, TableCursor,
};

use super::tds::{Cell, Column, ColumnType, Handler, Param, Reply, Request, ResultSet};

/// Runs a source call that completes at once (the simulator's do: they only lock).
fn now<T>(future: impl std::future::Future<Output = T>) -> T {
    future
        .now_or_never()
        .expect("the served source answers without waiting")
}

/// A handler answering from `source`.
pub fn handler<S: ChangeSource + Send + 'static>(source: S) -> Handler {
    let source = Arc::new(Mutex::new(source));
    Arc::new(move |request: &Request| {
        let mut source = source.lock().unwrap_or_else(|p| p.into_inner());
        answer(&mut *source, request).unwrap_or_else(error_reply)
    })
}

/// A source error as SQL Server would report it.
fn error_reply(error: SourceError) -> Reply {
    let message = error.to_string();
    let number = match &error {
        SourceError::CatalogChanged { message } if message.contains("207") => 207,
        SourceError::CatalogChanged { .. } => 208,
        SourceError::Sql(SqlErrorKind::PermissionDenied { message })
            if message.contains("22904") =>
        {
            22904
        }
        SourceError::Sql(SqlErrorKind::PermissionDenied { .. }) => 229,
        SourceError::Sql(SqlErrorKind::Transient { .. }) => 1205,
        _ => 50000,
    };
    Reply::Error {
        number,
        class: 16,
        message,
    }
}

fn one(columns: Vec<Column>, rows: Vec<Vec<Cell>>) -> Reply {
    Reply::Rows(vec![ResultSet { columns, rows }])
}

fn col(name: &str, column_type: ColumnType) -> Column {
    Column::new(name, column_type)
}

fn lsn_cell(lsn: Option<Lsn>) -> Cell {
    lsn.map_or(Cell::Null, |l| Cell::Bytes(l.to_vec()))
}

/// Text, or NULL.
fn opt_text(value: Option<&str>) -> Cell {
    value.map_or(Cell::Null, text)
}

fn text(value: &str) -> Cell {
    Cell::Text(value.to_owned())
}

fn param_text(request: &Request, at: usize) -> Option<&str> {
    match request.params.get(at) {
        Some(Param::Text(t)) => Some(t),
        _ => None,
    }
}

fn param_lsn(request: &Request, at: usize) -> Option<Lsn> {
    match request.params.get(at) {
        Some(Param::Bytes(b)) => Lsn::from_bytes(b).ok(),
        _ => None,
    }
}

fn param_int(request: &Request, at: usize) -> Option<i64> {
    match request.params.get(at) {
        Some(Param::Int(n)) => Some(*n),
        _ => None,
    }
}

/// `datetime`: days since 1900-01-01, 1/300-second ticks.
fn datetime_cell(t: NaiveDateTime) -> Cell {
    let base = NaiveDate::from_ymd_opt(1900, 1, 1).unwrap();
    let days = (t.date() - base).num_days() as i32;
    let nanos =
        u64::from(t.num_seconds_from_midnight()) * 1_000_000_000 + u64::from(t.nanosecond());
    Cell::DateTime {
        days,
        ticks: ((nanos * 300 + 500_000_000) / 1_000_000_000) as u32,
    }
}

fn days_from_ce(date: NaiveDate) -> u32 {
    (date - NaiveDate::from_ymd_opt(1, 1, 1).unwrap()).num_days() as u32
}

fn units(t: chrono::NaiveTime, scale: u8) -> u64 {
    let nanos =
        u64::from(t.num_seconds_from_midnight()) * 1_000_000_000 + u64::from(t.nanosecond());
    nanos / 10u64.pow(9 - u32::from(scale))
}

/// UTF-16 bytes of `varbinary(2n)`, `(max)` beyond 4,000 characters.
fn utf16_column(length: Length) -> ColumnType {
    match length {
        Length::Bounded(n) if n <= 4000 => ColumnType::VarBinary(Some((2 * n) as u16)),
        _ => ColumnType::VarBinary(None),
    }
}

/// The column type a change or table query's select expression gives `sql_type`.
fn wire_type(sql_type: SqlType) -> ColumnType {
    match sql_type {
        SqlType::Bit => ColumnType::Bit,
        SqlType::TinyInt => ColumnType::Int(1),
        SqlType::SmallInt => ColumnType::Int(2),
        SqlType::Int => ColumnType::Int(4),
        SqlType::BigInt => ColumnType::Int(8),
        SqlType::Decimal { precision, scale } | SqlType::Numeric { precision, scale } => {
            ColumnType::Decimal { precision, scale }
        }
        // CAST(… AS decimal(19,4)).
        SqlType::Money | SqlType::SmallMoney => ColumnType::Decimal {
            precision: 19,
            scale: 4,
        },
        SqlType::Float => ColumnType::Float(8),
        SqlType::Real => ColumnType::Float(4),
        SqlType::Date => ColumnType::Date,
        SqlType::Time { scale } => ColumnType::Time(scale),
        SqlType::DateTime => ColumnType::DateTime,
        SqlType::SmallDateTime => ColumnType::SmallDateTime,
        SqlType::DateTime2 { scale } => ColumnType::DateTime2(scale),
        SqlType::DateTimeOffset { scale } => ColumnType::DateTimeOffset(scale),
        SqlType::UniqueIdentifier => ColumnType::Guid,
        SqlType::Char(l) | SqlType::VarChar(l) | SqlType::NChar(l) | SqlType::NVarChar(l) => {
            utf16_column(l)
        }
        SqlType::Binary(Length::Bounded(n)) => ColumnType::Binary(n as u16),
        SqlType::Binary(Length::Max) | SqlType::VarBinary(Length::Max) => {
            ColumnType::VarBinary(None)
        }
        SqlType::VarBinary(Length::Bounded(n)) => ColumnType::VarBinary(Some(n as u16)),
    }
}

/// A value in its wire form.
fn cell(value: &Value) -> Cell {
    match value {
        Value::Null => Cell::Null,
        Value::Bit(b) => Cell::Bit(*b),
        Value::TinyInt(n) => Cell::Int(i64::from(*n)),
        Value::SmallInt(n) => Cell::Int(i64::from(*n)),
        Value::Int(n) => Cell::Int(i64::from(*n)),
        Value::BigInt(n) => Cell::Int(*n),
        Value::Decimal { unscaled, .. } => Cell::Decimal(*unscaled),
        Value::Float(f) => Cell::Float(*f),
        Value::Real(f) => Cell::Float(f64::from(*f)),
        Value::Date(d) => Cell::Date(days_from_ce(*d)),
        Value::Time { value, scale } => Cell::Time(units(*value, *scale)),
        Value::DateTime(t) => datetime_cell(*t),
        Value::SmallDateTime(t) => Cell::SmallDateTime {
            days: (t.date() - NaiveDate::from_ymd_opt(1900, 1, 1).unwrap()).num_days() as u16,
            minutes: (t.num_seconds_from_midnight() / 60) as u16,
        },
        Value::DateTime2 { value, scale } => Cell::DateTime2 {
            units: units(value.time(), *scale),
            days: days_from_ce(value.date()),
        },
        Value::DateTimeOffset { value, scale } => {
            let utc = value.naive_utc();
            Cell::DateTimeOffset {
                units: units(utc.time(), *scale),
                days: days_from_ce(utc.date()),
                offset: (value.offset().local_minus_utc() / 60) as i16,
            }
        }
        Value::Guid(g) => {
            // The first three groups travel little-endian (2.2.5.5.1.9 GUID).
            let b = g.as_bytes();
            Cell::Guid([
                b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9], b[10], b[11], b[12],
                b[13], b[14], b[15],
            ])
        }
        Value::Text(t) => Cell::Bytes(t.encode_utf16().flat_map(u16::to_le_bytes).collect()),
        Value::Binary(b) => Cell::Bytes(b.clone()),
    }
}

/// The catalog facts of a column type: `TYPE_NAME`, `max_length` (bytes; -1 for
/// `max`), `precision`, `scale`, as `sys.columns` holds them.
fn type_facts(sql_type: SqlType) -> (String, i64, i64, i64) {
    let chars = |l: Length, unit: i64| match l {
        Length::Max => -1,
        Length::Bounded(n) => i64::from(n) * unit,
    };
    let name = |t: &str| t.to_owned();
    match sql_type {
        SqlType::Bit => (name("bit"), 1, 1, 0),
        SqlType::TinyInt => (name("tinyint"), 1, 3, 0),
        SqlType::SmallInt => (name("smallint"), 2, 5, 0),
        SqlType::Int => (name("int"), 4, 10, 0),
        SqlType::BigInt => (name("bigint"), 8, 19, 0),
        SqlType::Decimal { precision, scale } => {
            (name("decimal"), 17, i64::from(precision), i64::from(scale))
        }
        SqlType::Numeric { precision, scale } => {
            (name("numeric"), 17, i64::from(precision), i64::from(scale))
        }
        SqlType::Money => (name("money"), 8, 19, 4),
        SqlType::SmallMoney => (name("smallmoney"), 4, 10, 4),
        SqlType::Float => (name("float"), 8, 53, 0),
        SqlType::Real => (name("real"), 4, 24, 0),
        SqlType::Date => (name("date"), 3, 10, 0),
        SqlType::Time { scale } => (name("time"), 5, 16, i64::from(scale)),
        SqlType::DateTime => (name("datetime"), 8, 23, 3),
        SqlType::SmallDateTime => (name("smalldatetime"), 4, 16, 0),
        SqlType::DateTime2 { scale } => (name("datetime2"), 8, 27, i64::from(scale)),
        SqlType::DateTimeOffset { scale } => (name("datetimeoffset"), 10, 34, i64::from(scale)),
        SqlType::UniqueIdentifier => (name("uniqueidentifier"), 16, 0, 0),
        SqlType::Char(l) => (name("char"), chars(l, 1), 0, 0),
        SqlType::VarChar(l) => (name("varchar"), chars(l, 1), 0, 0),
        SqlType::NChar(l) => (name("nchar"), chars(l, 2), 0, 0),
        SqlType::NVarChar(l) => (name("nvarchar"), chars(l, 2), 0, 0),
        SqlType::Binary(l) => (name("binary"), chars(l, 1), 0, 0),
        SqlType::VarBinary(l) => (name("varbinary"), chars(l, 1), 0, 0),
    }
}

fn answer<S: ChangeSource>(source: &mut S, request: &Request) -> Result<Reply, SourceError> {
    let sql = request.sql.as_str();
    let fingerprint = |version: i64| {
        // CHECKSUM_AGG is an int: the simulator's version fits the fingerprint's
        // arithmetic exactly when it is the checksum and the counts are zero.
        vec![
            Cell::Int(i64::from(version as i32)),
            Cell::Int(0),
            Cell::Int(0),
        ]
    };
    let fingerprint_columns = || {
        vec![
            col("tables_checksum", ColumnType::Int(4)),
            col("tables_count", ColumnType::Int(8)),
            col("ddl_count", ColumnType::Int(8)),
        ]
    };
    if sql == queries::MAX_LSN {
        let max = now(source.max_lsn())?;
        let mut columns = vec![col("max_lsn", ColumnType::Binary(10))];
        columns.extend(fingerprint_columns());
        let mut row = vec![lsn_cell(max.lsn)];
        row.extend(fingerprint(max.catalog_version));
        return Ok(one(columns, vec![row]));
    }
    if sql == CATALOG_VERSION {
        let max = now(source.max_lsn())?;
        return Ok(one(
            fingerprint_columns(),
            vec![fingerprint(max.catalog_version)],
        ));
    }
    if let Some(reply) = capture_ddl(source, request)? {
        return Ok(reply);
    }
    if sql == queries::MIN_LSN {
        let name = param_text(request, 0).unwrap_or_default().to_owned();
        let min = now(source.min_lsn(&name))?;
        return Ok(one(
            vec![col("min_lsn", ColumnType::Binary(10))],
            vec![vec![lsn_cell(Some(min.unwrap_or(Lsn::ZERO)))]],
        ));
    }
    if sql == queries::LSN_TIME {
        let lsn = param_lsn(request, 0).unwrap_or(Lsn::ZERO);
        let time = now(source.lsn_time(lsn))?;
        return Ok(one(
            vec![col("commit_time", ColumnType::DateTime)],
            vec![vec![time.map_or(Cell::Null, |t| datetime_cell(t.local))]],
        ));
    }
    if sql == queries::LSN_TIME_ZONED {
        // `@P2` names the zone the source's offsets were computed in.
        let lsn = param_lsn(request, 0).unwrap_or(Lsn::ZERO);
        let time = now(source.lsn_time(lsn))?;
        let offsets = time.and_then(|t| t.offsets);
        let offset = |o: Option<i16>| o.map_or(Cell::Null, |o| Cell::Int(i64::from(o)));
        return Ok(one(
            vec![
                col("commit_time", ColumnType::DateTime),
                col("at_offset", ColumnType::Int(4)),
                col("hour_later_offset", ColumnType::Int(4)),
            ],
            vec![vec![
                time.map_or(Cell::Null, |t| datetime_cell(t.local)),
                offset(offsets.map(|o| o.at)),
                offset(offsets.map(|o| o.hour_later)),
            ]],
        ));
    }
    if sql == queries::DDL_HISTORY || sql == queries::DDL_HISTORY_ZONED {
        // Zoned, `@P2` names the zone the source's offsets were computed in.
        let zoned = sql == queries::DDL_HISTORY_ZONED;
        let name = param_text(request, 0).unwrap_or_default().to_owned();
        let offset = |o: Option<i16>| o.map_or(Cell::Null, |o| Cell::Int(i64::from(o)));
        let rows = now(source.ddl_history(&name))?
            .into_iter()
            .map(|d| {
                let mut row = vec![
                    text(&d.capture_instance),
                    lsn_cell(Some(d.ddl_lsn)),
                    datetime_cell(d.ddl_time),
                ];
                if zoned {
                    row.push(offset(d.offsets.map(|o| o.at)));
                    row.push(offset(d.offsets.map(|o| o.hour_later)));
                }
                row.push(text(&d.ddl_command));
                row
            })
            .collect();
        let mut columns = vec![
            col("capture_instance", ColumnType::NVarChar(Some(128))),
            col("ddl_lsn", ColumnType::Binary(10)),
            col("ddl_time", ColumnType::DateTime),
        ];
        if zoned {
            columns.push(col("at_offset", ColumnType::Int(4)));
            columns.push(col("hour_later_offset", ColumnType::Int(4)));
        }
        columns.push(col("ddl_command", ColumnType::NVarChar(None)));
        return Ok(one(columns, rows));
    }
    if let Some(reply) = facts(source, sql, request.encrypted)? {
        return Ok(reply);
    }
    // Everything below needs the catalog.
    let catalog = match now(source.catalog()) {
        Ok(catalog) => catalog,
        Err(SourceError::CdcNotEnabled { database }) if sql == DATABASE_INFO => {
            return Ok(database_info("standin", &database, false, 0));
        }
        Err(e) => return Err(e),
    };
    if sql == DATABASE_INFO {
        return Ok(database_info(
            &catalog.server,
            &catalog.database,
            true,
            catalog.server_utc_offset_minutes,
        ));
    }
    if sql == DATABASE_GUID {
        let guid = |g: Option<uuid::Uuid>| g.map_or(Cell::Null, |g| cell(&Value::Guid(g)));
        return Ok(one(
            vec![
                col("database_guid", ColumnType::Guid),
                col("local_guid", ColumnType::Guid),
            ],
            vec![vec![
                guid(catalog.database_guid),
                guid(catalog.local_database_guid),
            ]],
        ));
    }
    if sql == SERVER_TIME_ZONE {
        return Ok(match &catalog.server_time_zone {
            Some(zone) => one(
                vec![
                    col("time_zone_id", ColumnType::NVarChar(Some(128))),
                    col("usable", ColumnType::Int(4)),
                ],
                vec![vec![text(zone), Cell::Int(1)]],
            ),
            // SQL Server 2019 and older.
            None => Reply::Error {
                number: 195,
                class: 15,
                message: "'CURRENT_TIMEZONE_ID' is not a recognized built-in function name.".into(),
            },
        });
    }
    if sql == CAPTURE_INSTANCES {
        return Ok(capture_instances(&catalog));
    }
    if sql == CAPTURED_COLUMNS {
        return Ok(captured_columns(&catalog));
    }
    if sql == KEY_COLUMNS {
        let rows = catalog
            .instances
            .iter()
            .flat_map(|i| {
                i.key_columns.iter().enumerate().map(move |(n, k)| {
                    vec![
                        text(&i.name),
                        text(k),
                        Cell::Int(n as i64 + 1),
                        Cell::Int(i64::from(i.descending_keys.contains(k))),
                    ]
                })
            })
            .collect();
        return Ok(one(
            vec![
                col("capture_instance", ColumnType::NVarChar(Some(128))),
                col("column_name", ColumnType::NVarChar(Some(128))),
                col("index_ordinal", ColumnType::Int(1)),
                col("is_descending", ColumnType::Int(4)),
            ],
            rows,
        ));
    }
    if sql == queries::TABLE_ROWS {
        let name = param_text(request, 0).unwrap_or_default();
        let Some(instance) = catalog
            .instances
            .iter()
            .find(|i| queries::source_table(i) == name)
        else {
            return Ok(one(
                vec![col("row_count", ColumnType::Int(8))],
                vec![vec![Cell::Null]],
            ));
        };
        let rows = now(source.table_rows(instance))?;
        return Ok(one(
            vec![col("row_count", ColumnType::Int(8))],
            vec![vec![rows.map_or(Cell::Null, |n| Cell::Int(n as i64))]],
        ));
    }
    if let Some(reply) = probe(source, request)? {
        return Ok(reply);
    }
    let zone = catalog.server_time_zone.is_some();
    for instance in &catalog.instances {
        if sql == queries::read_changes(instance, zone) {
            return read_changes(source, instance, request);
        }
    }
    for instance in &catalog.instances {
        if let Some(reply) = read_table(source, instance, request)? {
            return Ok(reply);
        }
    }
    Ok(super::tds::unknown(request))
}

/// What `check` and the load's plan ask about the server and its Agent jobs. A fact
/// the served source does not know is the permission error a login without it gets.
fn facts<S: ChangeSource>(
    source: &mut S,
    sql: &str,
    encrypted: bool,
) -> Result<Option<Reply>, SourceError> {
    use mssql_ces::source::Fact;
    let known = [
        queries::SERVER_FACTS,
        queries::AGENT_STATUS,
        queries::CDC_JOBS,
        queries::CDC_JOBS_AZURE,
        queries::CAPTURE_JOB_RUNNING,
        queries::LOG_SCAN,
    ];
    if !known.contains(&sql) {
        return Ok(None);
    }
    let facts = now(source.server_facts())?;
    let denied = |why: &str| Reply::Error {
        number: 229,
        class: 14,
        message: format!("The SELECT permission was denied ({why})"),
    };
    let name = |n: &str| col(n, ColumnType::NVarChar(Some(128)));
    Ok(Some(if sql == queries::SERVER_FACTS {
        one(
            vec![
                name("product_version"),
                name("edition"),
                col("engine_edition", ColumnType::Int(4)),
                name("database_name"),
                col("is_cdc_enabled", ColumnType::Int(4)),
                col("encrypt_option", ColumnType::NVarChar(Some(10))),
                col("local_time", ColumnType::DateTime2(7)),
                col("max_text_repl_size", ColumnType::Int(8)),
            ],
            vec![vec![
                text(&facts.product_version),
                text(&facts.edition),
                Cell::Int(facts.engine_edition),
                text(&facts.database),
                Cell::Int(i64::from(facts.cdc_enabled)),
                text(if encrypted { "TRUE" } else { "FALSE" }),
                cell(&Value::DateTime2 {
                    value: facts.local_time,
                    scale: 7,
                }),
                match facts.max_text_repl_size {
                    Fact::Known(size) => Cell::Int(size),
                    Fact::Unknown(_) => Cell::Null,
                },
            ]],
        )
    } else if sql == queries::AGENT_STATUS {
        match &facts.agent {
            Fact::Known(status) => one(vec![name("status_desc")], vec![vec![text(status)]]),
            Fact::Unknown(why) => denied(why),
        }
    } else if (sql == queries::CDC_JOBS || sql == queries::CDC_JOBS_AZURE)
        && (sql == queries::CDC_JOBS) == (facts.engine_edition == 5)
    {
        // Azure SQL Database (engine edition 5) keeps cdc_jobs in the database and
        // refuses three-part names into msdb; elsewhere there is no cdc.cdc_jobs.
        if facts.engine_edition == 5 {
            Reply::Error {
                number: 40515,
                class: 15,
                message: "Reference to database and/or server name in 'msdb.dbo.cdc_jobs' is not supported in this version of SQL Server.".into(),
            }
        } else {
            Reply::Error {
                number: 208,
                class: 16,
                message: "Invalid object name 'cdc.cdc_jobs'.".into(),
            }
        }
    } else if sql == queries::CDC_JOBS || sql == queries::CDC_JOBS_AZURE {
        match &facts.jobs {
            Fact::Known(jobs) => one(
                vec![
                    name("job_type"),
                    col("maxtrans", ColumnType::Int(4)),
                    col("maxscans", ColumnType::Int(4)),
                    col("continuous", ColumnType::Int(4)),
                    col("pollinginterval", ColumnType::Int(8)),
                    col("retention", ColumnType::Int(8)),
                ],
                jobs.iter()
                    .map(|j| {
                        // msdb keeps the cleanup job's capture columns at 0.
                        let c = j.capture.unwrap_or(CaptureSettings {
                            max_trans: 0,
                            max_scans: 0,
                            continuous: false,
                            polling_interval_s: 0,
                        });
                        vec![
                            text(&j.job_type),
                            Cell::Int(c.max_trans),
                            Cell::Int(c.max_scans),
                            Cell::Int(i64::from(c.continuous)),
                            Cell::Int(c.polling_interval_s),
                            j.retention_minutes.map_or(Cell::Null, Cell::Int),
                        ]
                    })
                    .collect(),
            ),
            Fact::Unknown(why) => denied(why),
        }
    } else if sql == queries::CAPTURE_JOB_RUNNING {
        match &facts.capture_running {
            Fact::Known(running) => one(
                vec![col("running", ColumnType::Int(8))],
                vec![vec![Cell::Int(i64::from(*running))]],
            ),
            Fact::Unknown(why) => denied(why),
        }
    } else {
        match &facts.log_scan {
            Fact::Known(scan) => one(
                vec![
                    col("start_time", ColumnType::DateTime),
                    col("end_time", ColumnType::DateTime),
                    col("latency", ColumnType::Int(8)),
                    col("error_count", ColumnType::Int(8)),
                    col("tran_count", ColumnType::Int(8)),
                    col("total_tran_count", ColumnType::Int(8)),
                ],
                scan.iter()
                    .map(|s| {
                        vec![
                            datetime_cell(s.start_time),
                            s.end_time.map_or(Cell::Null, datetime_cell),
                            Cell::Int(s.latency_seconds),
                            Cell::Int(s.error_count),
                            Cell::Int(s.tran_count),
                            s.total_tran_count.map_or(Cell::Null, Cell::Int),
                        ]
                    })
                    .collect(),
            ),
            Fact::Unknown(why) => denied(why),
        }
    }))
}

fn database_info(server: &str, database: &str, cdc: bool, offset: i32) -> Reply {
    one(
        vec![
            col("server_name", ColumnType::NVarChar(Some(128))),
            col("database_name", ColumnType::NVarChar(Some(128))),
            col("is_cdc_enabled", ColumnType::Bit),
            col("engine_edition", ColumnType::Int(4)),
            col("utc_offset_minutes", ColumnType::Int(4)),
        ],
        vec![vec![
            text(server),
            text(database),
            Cell::Bit(cdc),
            Cell::Int(3),
            Cell::Int(i64::from(offset)),
        ]],
    )
}

fn capture_instances(catalog: &Catalog) -> Reply {
    let mut rows: Vec<Vec<Cell>> = catalog
        .instances
        .iter()
        .map(|i| {
            vec![
                text(&i.name),
                Cell::Int(i64::from(i.object_id)),
                text(&i.schema),
                text(&i.table),
                lsn_cell(i.start_lsn),
                datetime_cell(i.create_date),
                opt_text(i.options.role_name.as_deref()),
                opt_text(i.options.index_name.as_deref()),
                opt_text(i.options.filegroup_name.as_deref()),
                Cell::Int(i64::from(i.options.supports_net_changes)),
                i.options
                    .allow_partition_switch
                    .map_or(Cell::Null, |p| Cell::Int(i64::from(p))),
                Cell::Int(i64::from(i.has_command_id)),
            ]
        })
        .collect();
    for (n, name) in catalog.invisible.iter().enumerate() {
        rows.push(vec![
            text(name),
            Cell::Int(-1 - n as i64),
            Cell::Null,
            Cell::Null,
            Cell::Null,
            datetime_cell(NaiveDateTime::default()),
            Cell::Null,
            Cell::Null,
            Cell::Null,
            Cell::Int(0),
            Cell::Null,
            Cell::Int(1),
        ]);
    }
    one(
        vec![
            col("capture_instance", ColumnType::NVarChar(Some(128))),
            col("object_id", ColumnType::Int(4)),
            col("schema_name", ColumnType::NVarChar(Some(128))),
            col("table_name", ColumnType::NVarChar(Some(128))),
            col("start_lsn", ColumnType::Binary(10)),
            col("create_date", ColumnType::DateTime),
            col("role_name", ColumnType::NVarChar(Some(128))),
            col("index_name", ColumnType::NVarChar(Some(128))),
            col("filegroup_name", ColumnType::NVarChar(Some(128))),
            col("supports_net_changes", ColumnType::Int(4)),
            col("partition_switch", ColumnType::Int(4)),
            col("has_command_id", ColumnType::Int(4)),
        ],
        rows,
    )
}

fn captured_columns(catalog: &Catalog) -> Reply {
    let mut rows = Vec::new();
    for i in &catalog.instances {
        for (n, c) in i.columns.iter().enumerate() {
            let (type_name, max_length, precision, scale, user_defined) = match &c.sql_type {
                Ok(t) => {
                    let (name, len, p, s) = type_facts(*t);
                    (name, len, p, s, false)
                }
                Err(mssql_ces::event::value::TypeError::UserDefined { type_name }) => {
                    (type_name.clone(), 8, 0, 0, true)
                }
                Err(mssql_ces::event::value::TypeError::Excluded { type_name })
                | Err(mssql_ces::event::value::TypeError::Unknown { type_name }) => {
                    (type_name.clone(), -1, 0, 0, false)
                }
                Err(other) => (other.to_string(), -1, 0, 0, false),
            };
            rows.push(vec![
                text(&i.name),
                text(&c.name),
                Cell::Int(i64::from(c.ordinal)),
                text(&type_name),
                Cell::Int(i64::from(c.computed)),
                text(&type_name),
                Cell::Bit(user_defined),
                Cell::Int(n as i64 + 6),
                Cell::Int(max_length),
                Cell::Int(precision),
                Cell::Int(scale),
                c.table_index
                    .or(c.dropped.map(|d| d.columns_before))
                    .map_or(Cell::Null, |t| Cell::Int(i64::from(t))),
                c.table_index
                    .map_or(Cell::Null, |t| Cell::Int(i64::from(t) + 1)),
                c.nullable.map_or(Cell::Null, |n| Cell::Int(i64::from(n))),
                c.default.as_deref().map_or(Cell::Null, text),
            ]);
        }
    }
    one(
        vec![
            col("capture_instance", ColumnType::NVarChar(Some(128))),
            col("column_name", ColumnType::NVarChar(Some(128))),
            col("column_ordinal", ColumnType::Int(4)),
            col("column_type", ColumnType::NVarChar(Some(128))),
            col("is_computed", ColumnType::Int(4)),
            col("type_name", ColumnType::NVarChar(Some(128))),
            col("is_user_defined", ColumnType::Bit),
            col("change_column_id", ColumnType::Int(4)),
            col("max_length", ColumnType::Int(2)),
            col("precision", ColumnType::Int(1)),
            col("scale", ColumnType::Int(1)),
            col("table_index", ColumnType::Int(4)),
            col("source_column_id", ColumnType::Int(4)),
            col("is_nullable", ColumnType::Int(4)),
            col("default_definition", ColumnType::NVarChar(None)),
        ],
        rows,
    )
}

/// `source.capture_instances = "managed"` and `source.enable_cdc`: the permission
/// check, `sys.sp_cdc_enable_table`, `sys.sp_cdc_disable_table` and
/// `sys.sp_cdc_cleanup_change_table`, a table's columns and the tables CDC does not
/// capture.
fn capture_ddl<S: ChangeSource>(
    source: &mut S,
    request: &Request,
) -> Result<Option<Reply>, SourceError> {
    let sql = request.sql.as_str();
    let done = || Reply::Rows(Vec::new());
    let opt = |at| param_text(request, at).map(str::to_owned);
    let text_at = |at| opt(at).unwrap_or_default();
    Ok(Some(if sql == queries::IS_DB_OWNER {
        let owner = now(source.may_manage_capture())?;
        one(
            vec![col("is_db_owner", ColumnType::Int(4))],
            vec![vec![Cell::Int(i64::from(owner))]],
        )
    } else if sql == queries::ENABLE_TABLE {
        let columns = opt(7).map(|list| {
            list.split("],[")
                .map(|name| {
                    name.trim_start_matches('[')
                        .trim_end_matches(']')
                        .replace("]]", "]")
                })
                .collect()
        });
        now(source.enable_capture(&EnableCapture {
            schema: text_at(0),
            table: text_at(1),
            capture_instance: text_at(2),
            options: CaptureOptions {
                role_name: opt(3),
                index_name: opt(4),
                filegroup_name: opt(5),
                supports_net_changes: param_int(request, 6) == Some(1),
                allow_partition_switch: param_int(request, 8).map(|p| p == 1),
            },
            columns,
        }))?;
        done()
    } else if sql == queries::DISABLE_TABLE {
        let name = text_at(2);
        let catalog = now(source.catalog())?;
        let Some(instance) = catalog.instances.into_iter().find(|i| i.name == name) else {
            // (The number SQL Server raises is not documented; a generic one here.)
            return Ok(Some(Reply::Error {
                number: 50000,
                class: 16,
                message: format!("Could not find capture instance '{name}'"),
            }));
        };
        now(source.disable_capture(&instance))?;
        done()
    } else if sql == queries::CLEANUP_CHANGE_TABLE {
        let (name, through) = (text_at(0), param_lsn(request, 1).unwrap_or(Lsn::ZERO));
        let cleaned = now(source.cleanup_change_table(&name, through))?;
        one(
            vec![
                col("low_water_mark", ColumnType::Binary(10)),
                col("min_lsn", ColumnType::Binary(10)),
            ],
            vec![vec![
                lsn_cell(cleaned.low_water_mark),
                lsn_cell(Some(cleaned.min_lsn.unwrap_or(Lsn::ZERO))),
            ]],
        )
    } else if sql == queries::UNCAPTURED_COLUMNS {
        let found = now(source.uncaptured_columns())?;
        let read_at = found.read_at.map_or(Cell::Null, |value| {
            cell(&Value::DateTime2 { value, scale: 7 })
        });
        let scanned_through = found.scanned_through.map_or(Cell::Null, datetime_cell);
        one(
            vec![
                col("capture_instance", ColumnType::NVarChar(Some(128))),
                col("column_name", ColumnType::NVarChar(Some(128))),
                col("read_at", ColumnType::DateTime2(7)),
                col("scanned_through", ColumnType::DateTime),
            ],
            found
                .columns
                .iter()
                .map(|(instance, column)| {
                    vec![
                        text(instance),
                        text(column),
                        read_at.clone(),
                        scanned_through.clone(),
                    ]
                })
                .collect(),
        )
    } else if sql == queries::UNCAPTURED_TABLES {
        let tables = now(source.uncaptured_tables())?;
        one(
            vec![
                col("schema_name", ColumnType::NVarChar(Some(128))),
                col("table_name", ColumnType::NVarChar(Some(128))),
            ],
            tables
                .iter()
                .map(|t| vec![text(&t.schema), text(&t.table)])
                .collect(),
        )
    } else {
        return Ok(None);
    }))
}

/// The probe names its capture instances in the parameters: `@P1` the upper LSN, then
/// a name and an LSN per instance.
fn probe<S: ChangeSource>(source: &mut S, request: &Request) -> Result<Option<Reply>, SourceError> {
    if !request.sql.contains("AS next_change") {
        return Ok(None);
    }
    let Some(to) = param_lsn(request, 0) else {
        return Ok(None);
    };
    let mut probes = Vec::new();
    let mut at = 1;
    while let (Some(name), Some(after)) = (param_text(request, at), param_lsn(request, at + 1)) {
        probes.push(Probe {
            capture_instance: name.to_owned(),
            after,
        });
        at += 2;
    }
    let names: Vec<&str> = probes.iter().map(|p| p.capture_instance.as_str()).collect();
    if request.sql != queries::probe(&names) {
        return Ok(None);
    }
    let rows = now(source.probe(&probes, to))?
        .into_iter()
        .map(|r| {
            vec![
                text(&r.capture_instance),
                lsn_cell(Some(r.min_lsn.unwrap_or(Lsn::ZERO))),
                lsn_cell(r.next_change),
            ]
        })
        .collect();
    Ok(Some(one(
        vec![
            col("capture_instance", ColumnType::NVarChar(Some(128))),
            col("min_lsn", ColumnType::Binary(10)),
            col("next_change", ColumnType::Binary(10)),
        ],
        rows,
    )))
}

fn emitted_columns(instance: &CaptureInstance) -> Vec<Column> {
    instance
        .emitted_columns()
        .map(|e| col(e.name(), wire_type(e.sql_type)))
        .collect()
}

fn read_changes<S: ChangeSource>(
    source: &mut S,
    instance: &CaptureInstance,
    request: &Request,
) -> Result<Reply, SourceError> {
    let bad = || SourceError::definite("stand-in: read_changes parameters");
    let limit = param_int(request, 0).ok_or_else(bad)? as usize;
    let to = param_lsn(request, 1).ok_or_else(bad)?;
    let after = RowKey {
        start_lsn: param_lsn(request, 2).ok_or_else(bad)?,
        command_id: param_int(request, 3).ok_or_else(bad)? as i32,
        seqval: param_lsn(request, 4).ok_or_else(bad)?,
        operation: param_int(request, 5).ok_or_else(bad)? as u8,
    };
    let rows = now(source.read_changes(instance, after, to, limit))?;
    let mut columns = vec![
        col(fixed::START_LSN, ColumnType::Binary(10)),
        col(fixed::COMMAND_ID, ColumnType::Int(4)),
        col(fixed::SEQVAL, ColumnType::Binary(10)),
        col(fixed::OPERATION, ColumnType::Int(4)),
        col(fixed::UPDATE_MASK, ColumnType::VarBinary(Some(128))),
        col(fixed::BEGIN_LSN, ColumnType::Binary(10)),
        col(fixed::END_TIME, ColumnType::DateTime),
        col(fixed::END_TIME_OFFSET, ColumnType::Int(4)),
        col(fixed::END_TIME_OFFSET_LATER, ColumnType::Int(4)),
        col(fixed::MAPPED, ColumnType::Binary(10)),
        col(fixed::BEGIN_TIME, ColumnType::DateTime),
    ];
    columns.extend(
        instance
            .change_columns()
            .map(|e| col(e.name(), wire_type(e.sql_type))),
    );
    let rows = rows
        .into_iter()
        .map(|r| {
            let mut row = vec![
                lsn_cell(Some(r.key.start_lsn)),
                Cell::Int(i64::from(r.key.command_id)),
                lsn_cell(Some(r.key.seqval)),
                Cell::Int(i64::from(r.key.operation)),
                Cell::Bytes(r.update_mask.clone()),
                lsn_cell(Some(r.begin_lsn)),
                datetime_cell(r.end_time),
                r.end_time_offsets
                    .map_or(Cell::Null, |o| Cell::Int(i64::from(o.at))),
                r.end_time_offsets
                    .map_or(Cell::Null, |o| Cell::Int(i64::from(o.hour_later))),
                lsn_cell(Some(r.key.start_lsn)),
                datetime_cell(r.end_time),
            ];
            row.extend(r.values.iter().map(cell));
            row
        })
        .collect();
    Ok(one(columns, rows))
}

/// A load's chunk (the query is rebuilt for each NULL pattern of the key that the
/// parameters' count allows, until one matches), or a keyed table's sample.
fn read_table<S: ChangeSource>(
    source: &mut S,
    instance: &CaptureInstance,
    request: &Request,
) -> Result<Option<Reply>, SourceError> {
    let key: Vec<(String, SqlType)> = instance
        .key_columns
        .iter()
        .filter_map(|k| {
            instance
                .columns
                .iter()
                .find(|c| &c.name == k)
                .and_then(|c| c.sql_type.as_ref().ok())
                .map(|t| (k.clone(), *t))
        })
        .collect();
    let columns = emitted_columns(instance);
    let reply = |rows: Vec<Vec<Value>>| {
        one(
            columns.clone(),
            rows.iter().map(|r| r.iter().map(cell).collect()).collect(),
        )
    };
    if key.is_empty() {
        if request.sql != queries::read_table(instance, &key, None) {
            return Ok(None);
        }
        // One pass, whole: the driver streams it.
        let mut rows = now(source.read_table(instance, TableCursor::Start, usize::MAX))?;
        let mut more = now(source.read_table(instance, TableCursor::Continue, usize::MAX))?;
        rows.append(&mut more);
        return Ok(Some(reply(rows)));
    }
    if request.sql == queries::sample_table(instance, &key) {
        return Ok(Some(reply(now(source.sample_rows(instance))?)));
    }
    let limit = param_int(request, 0).unwrap_or(0) as usize;
    if request.sql == queries::read_table(instance, &key, None) {
        let rows = now(source.read_table(instance, TableCursor::Start, limit))?;
        return Ok(Some(reply(rows)));
    }
    let values: Vec<String> = request
        .params
        .get(1..)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| match p {
            Param::Text(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    for pattern in 0u32..(1 << key.len()) {
        let nulls: Vec<bool> = (0..key.len()).map(|i| pattern & (1 << i) != 0).collect();
        if nulls.iter().filter(|n| !**n).count() != values.len() {
            continue;
        }
        if request.sql != queries::read_table(instance, &key, Some(&nulls)) {
            continue;
        }
        let mut given = values.iter();
        let after: Vec<Option<String>> = nulls
            .iter()
            .map(|&null| if null { None } else { given.next().cloned() })
            .collect();
        let rows = now(source.read_table(instance, TableCursor::AfterKey(&after), limit))?;
        return Ok(Some(reply(rows)));
    }
    Ok(None)
}

//! What `mssql-ces check` reads from SQL Server beyond the poll loop's needs
//! ([`FactReads::server_facts`](super::FactReads::server_facts)): one query
//! each, decoded by name in pure functions. A query the login may not run (a missing
//! permission, `msdb` out of reach, or no such view on Azure SQL Database) makes its
//! fact [`Fact::Unknown`] with the permission that would show it; only a fault of the
//! connection fails the whole read.

use crate::mssql::{PERMISSION_ERRORS, SqlConnection, SqlError};
use crate::source::catalog::{NamedRow, null};
use crate::source::decode::DecodeError;
use crate::source::queries;
use crate::source::{CommitTime, SourceError};
use chrono::NaiveDateTime;

/// Something the server may not let this login see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact<T> {
    Known(T),
    /// Why it is not known: the permission that would show it, or why it does not
    /// apply.
    Unknown(String),
}

/// A row of `msdb.dbo.cdc_jobs` for this database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcJob {
    /// `capture` or `cleanup`.
    pub job_type: String,
    /// Minutes change rows are kept (the cleanup job's `retention`).
    pub retention_minutes: Option<i64>,
    /// The capture job's settings (`None` for the cleanup job, or where a column is
    /// NULL).
    pub capture: Option<CaptureSettings>,
}

impl CdcJob {
    /// A capture job with `settings`.
    pub fn capture(settings: CaptureSettings) -> Self {
        CdcJob {
            job_type: "capture".into(),
            retention_minutes: None,
            capture: Some(settings),
        }
    }

    /// A cleanup job keeping changes `retention_minutes`.
    pub fn cleanup(retention_minutes: i64) -> Self {
        CdcJob {
            job_type: "cleanup".into(),
            retention_minutes: Some(retention_minutes),
            capture: None,
        }
    }
}

/// What bounds the capture job (`msdb.dbo.cdc_jobs`, set with
/// `sys.sp_cdc_change_job`): run continuously, each round of the job scans the log
/// at most `max_scans` times, taking at most `max_trans` transactions a scan, then
/// waits `polling_interval_s` seconds before the next round. The job reads them
/// when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureSettings {
    pub max_trans: i64,
    pub max_scans: i64,
    pub continuous: bool,
    pub polling_interval_s: i64,
}

impl CaptureSettings {
    /// `sys.sp_cdc_add_job`'s defaults: 500 transactions, 10 scans, continuous,
    /// 5 s.
    pub const DEFAULT: CaptureSettings = CaptureSettings {
        max_trans: 500,
        max_scans: 10,
        continuous: true,
        polling_interval_s: 5,
    };

    /// Transactions a round of the job takes at most.
    pub fn per_round(&self) -> i64 {
        self.max_trans.saturating_mul(self.max_scans)
    }

    /// Transactions a second the job captures at most while it keeps up its
    /// rounds, the scans' own time not counted: a round's transactions over the
    /// pause between rounds. `None` when there is no pause (the scans' speed is
    /// then the bound) or the job runs once rather than continuously.
    pub fn ceiling_per_second(&self) -> Option<i64> {
        (self.continuous && self.polling_interval_s > 0)
            .then(|| self.per_round() / self.polling_interval_s)
    }
}

/// The capture job's latest log scan session (`sys.dm_cdc_log_scan_sessions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogScan {
    /// Server-local; `None` while the session runs.
    pub end_time: Option<NaiveDateTime>,
    pub start_time: NaiveDateTime,
    /// Seconds between the session's end and its last commit's time.
    pub latency_seconds: i64,
    pub error_count: i64,
    /// Transactions the session took from the log (at most the job's `maxtrans`).
    pub tran_count: i64,
    /// Transactions every session took since the server started (session 0's),
    /// when the view has that row.
    pub total_tran_count: Option<i64>,
}

/// What [`FactReads::server_facts`](super::FactReads::server_facts) answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFacts {
    /// `SERVERPROPERTY('ProductVersion')`, e.g. `16.0.4135.4`.
    pub product_version: String,
    /// `SERVERPROPERTY('Edition')`.
    pub edition: String,
    /// `SERVERPROPERTY('EngineEdition')`: 5 is Azure SQL Database (no SQL Server
    /// Agent: CDC runs on its own scheduler), 8 Azure SQL Managed Instance.
    pub engine_edition: i64,
    /// `DB_NAME()`.
    pub database: String,
    /// `sys.databases.is_cdc_enabled`.
    pub cdc_enabled: bool,
    /// `CONNECTIONPROPERTY('encrypt_option')`: whether this connection uses TLS;
    /// `None` where there is no connection (a simulated server).
    pub encrypted: Option<bool>,
    /// `SYSDATETIME()`: the server's local time.
    pub local_time: NaiveDateTime,
    /// `sys.dm_server_services`' `status_desc` of SQL Server Agent.
    pub agent: Fact<String>,
    /// The capture and cleanup jobs of this database.
    pub jobs: Fact<Vec<CdcJob>>,
    /// Whether the capture job runs in the current Agent session.
    pub capture_running: Fact<bool>,
    /// The latest log scan session; `None` when there was none since the start.
    pub log_scan: Fact<Option<LogScan>>,
    /// `max text repl size (B)` in use: the largest LOB value one statement may
    /// write to a captured column (-1: no limit).
    pub max_text_repl_size: Fact<i64>,
}

/// `SERVERPROPERTY('EngineEdition')` of Azure SQL Database.
pub const AZURE_SQL_DATABASE_EDITION: i64 = 5;

/// `SERVERPROPERTY('EngineEdition')` of Azure SQL Managed Instance.
pub const AZURE_SQL_MANAGED_INSTANCE_EDITION: i64 = 8;

/// Server errors that mean "not allowed here" or "not on this edition": a
/// permission error ([`PERMISSION_ERRORS`], 916 being no access to `msdb`), or 208, no
/// such object.
fn not_visible(code: u32) -> bool {
    code == 208 || PERMISSION_ERRORS.contains(&code)
}

fn unexpected(error: DecodeError) -> SourceError {
    SourceError::definite(format!(
        "unexpected result while checking the server: {error}"
    ))
}

/// Runs `sql`; a refusal becomes `Err(reason)` inside `Ok`, and so does any other
/// answer of the server that is not a fault of the connection (an edition without
/// the view, a system object another version names otherwise): an optional fact is
/// then "not checked", never "cannot connect".
async fn optional(
    conn: &mut SqlConnection,
    sql: &str,
    needs: &str,
) -> Result<Result<Vec<NamedRow>, String>, SourceError> {
    match conn.query(sql, &[]).await {
        Ok(rows) => Ok(Ok(rows.into_iter().map(NamedRow::new).collect())),
        Err(SqlError {
            code: Some(code), ..
        }) if not_visible(code) => Ok(Err(format!("{needs} (error {code})"))),
        Err(SqlError {
            code: Some(code),
            error,
        }) if !error.is_transient() => Ok(Err(format!(
            "the server refused the query (error {code}: {error})"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Reads every fact, one query each.
pub async fn read(conn: &mut SqlConnection) -> Result<ServerFacts, SourceError> {
    let mut rows = conn.query(queries::SERVER_FACTS, &[]).await?;
    let Some(row) = rows.pop() else {
        return Err(SourceError::definite(
            "the database is not visible to this login (no row in sys.databases)",
        ));
    };
    let mut facts = decode_server(NamedRow::new(row)).map_err(unexpected)?;
    // Azure SQL Database runs CDC capture and cleanup on its own scheduler: no Agent
    // and no msdb, but its cleanup retention is in the database's own cdc.cdc_jobs.
    let azure = facts.engine_edition == AZURE_SQL_DATABASE_EDITION;
    let scheduler = "Azure SQL Database runs CDC capture and cleanup on its own scheduler, without SQL Server Agent";
    let msdb = "needs SELECT on msdb.dbo.cdc_jobs and msdb.dbo.sysjobactivity (membership of msdb's SQLAgentReaderRole, or db_owner and sys.sp_cdc_help_jobs)";
    facts.agent = if azure {
        Fact::Unknown(scheduler.into())
    } else {
        match optional(
            conn,
            queries::AGENT_STATUS,
            "needs VIEW SERVER STATE to read sys.dm_server_services",
        )
        .await?
        {
            Ok(rows) => decode_agent(rows).map_err(unexpected)?,
            Err(why) => Fact::Unknown(why),
        }
    };
    let (jobs, jobs_need) = if azure {
        (queries::CDC_JOBS_AZURE, "needs SELECT on cdc.cdc_jobs")
    } else {
        (queries::CDC_JOBS, msdb)
    };
    facts.jobs = match optional(conn, jobs, jobs_need).await? {
        Ok(rows) => Fact::Known(decode_jobs(rows).map_err(unexpected)?),
        Err(why) => Fact::Unknown(why),
    };
    facts.capture_running = if azure {
        Fact::Unknown(scheduler.into())
    } else {
        match optional(conn, queries::CAPTURE_JOB_RUNNING, msdb).await? {
            Ok(rows) => Fact::Known(decode_running(rows).map_err(unexpected)?),
            Err(why) => Fact::Unknown(why),
        }
    };
    facts.log_scan = log_scan(conn).await?;
    Ok(facts)
}

/// The capture job's latest log scan session ([`queries::LOG_SCAN`]).
pub async fn log_scan(conn: &mut SqlConnection) -> Result<Fact<Option<LogScan>>, SourceError> {
    Ok(
        match optional(
            conn,
            queries::LOG_SCAN,
            "needs VIEW DATABASE STATE (VIEW DATABASE PERFORMANCE STATE on SQL Server 2022 and later) to read sys.dm_cdc_log_scan_sessions",
        )
        .await?
        {
            Ok(rows) => Fact::Known(decode_log_scan(rows).map_err(unexpected)?),
            Err(why) => Fact::Unknown(why),
        },
    )
}

/// The row of [`queries::SERVER_FACTS`]; the optional facts start unknown.
fn decode_server(mut row: NamedRow) -> Result<ServerFacts, DecodeError> {
    fn pending<T>() -> Fact<T> {
        Fact::Unknown("not read".to_owned())
    }
    Ok(ServerFacts {
        product_version: row.string("product_version")?,
        edition: row.string("edition")?,
        engine_edition: row.int("engine_edition")?,
        database: row.string("database_name")?,
        cdc_enabled: row.opt_int("is_cdc_enabled")? == Some(1),
        encrypted: Some(
            row.opt_string("encrypt_option")?
                .is_some_and(|v| v.eq_ignore_ascii_case("TRUE")),
        ),
        local_time: row.datetime("local_time")?,
        agent: pending(),
        jobs: pending(),
        capture_running: pending(),
        log_scan: pending(),
        max_text_repl_size: match row.opt_int("max_text_repl_size")? {
            Some(size) => Fact::Known(size),
            None => Fact::Unknown("sys.configurations does not list it here".into()),
        },
    })
}

/// [`queries::AGENT_STATUS`]: no row means the login sees no Agent service.
fn decode_agent(rows: Vec<NamedRow>) -> Result<Fact<String>, DecodeError> {
    match rows.into_iter().next() {
        Some(mut row) => Ok(Fact::Known(row.string("status_desc")?)),
        None => Ok(Fact::Unknown(
            "sys.dm_server_services lists no SQL Server Agent (needs VIEW SERVER STATE)".into(),
        )),
    }
}

fn decode_jobs(rows: Vec<NamedRow>) -> Result<Vec<CdcJob>, DecodeError> {
    rows.into_iter()
        .map(|mut row| {
            let job_type = row.string("job_type")?;
            let retention_minutes = row.opt_int("retention")?;
            let settings = (
                row.opt_int("maxtrans")?,
                row.opt_int("maxscans")?,
                row.opt_int("continuous")?,
                row.opt_int("pollinginterval")?,
            );
            let capture = match settings {
                (Some(max_trans), Some(max_scans), Some(continuous), Some(polling_interval_s))
                    if job_type == "capture" =>
                {
                    Some(CaptureSettings {
                        max_trans,
                        max_scans,
                        continuous: continuous != 0,
                        polling_interval_s,
                    })
                }
                _ => None,
            };
            Ok(CdcJob {
                job_type,
                retention_minutes,
                capture,
            })
        })
        .collect()
}

fn decode_running(rows: Vec<NamedRow>) -> Result<bool, DecodeError> {
    match rows.into_iter().next() {
        Some(mut row) => Ok(row.int("running")? > 0),
        None => Err(null("running")),
    }
}

fn decode_log_scan(rows: Vec<NamedRow>) -> Result<Option<LogScan>, DecodeError> {
    let Some(mut row) = rows.into_iter().next() else {
        return Ok(None);
    };
    Ok(Some(LogScan {
        start_time: row.datetime("start_time")?,
        end_time: row.opt_datetime("end_time")?,
        latency_seconds: row.opt_int("latency")?.unwrap_or(0),
        error_count: row.opt_int("error_count")?.unwrap_or(0),
        tran_count: row.opt_int("tran_count")?.unwrap_or(0),
        total_tran_count: row.opt_int("total_tran_count")?,
    }))
}

/// [`queries::LSN_TIME`], or [`queries::LSN_TIME_ZONED`] with the server's zone.
pub async fn lsn_time(
    conn: &mut SqlConnection,
    lsn: crate::lsn::Lsn,
    server_zone: Option<&str>,
) -> Result<Option<CommitTime>, SourceError> {
    let bytes = lsn.to_vec();
    let rows = match server_zone {
        Some(zone) => {
            conn.query(queries::LSN_TIME_ZONED, &[&bytes, &zone])
                .await?
        }
        None => conn.query(queries::LSN_TIME, &[&bytes]).await?,
    };
    match rows.into_iter().next() {
        Some(row) => decode_commit_time(NamedRow::new(row), server_zone.is_some()),
        None => Ok(None),
    }
}

/// A row of [`queries::LSN_TIME`] or [`queries::LSN_TIME_ZONED`] (`zoned`).
fn decode_commit_time(mut row: NamedRow, zoned: bool) -> Result<Option<CommitTime>, SourceError> {
    let Some(local) = row.opt_datetime("commit_time").map_err(unexpected)? else {
        return Ok(None);
    };
    let offsets = if zoned {
        row.opt_offsets("at_offset", "hour_later_offset")
            .map_err(unexpected)?
    } else {
        None
    };
    Ok(Some(CommitTime { local, offsets }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiberius::ColumnData;

    fn text(value: &str) -> ColumnData<'static> {
        ColumnData::String(Some(value.to_owned().into()))
    }

    fn datetime(days: i32, seconds: u32) -> ColumnData<'static> {
        ColumnData::DateTime(Some(tiberius::time::DateTime::new(days, seconds * 300)))
    }

    #[test]
    fn the_server_row_decodes_by_name() {
        let row = NamedRow::from_pairs(vec![
            ("product_version", text("16.0.4135.4")),
            ("edition", text("Developer Edition (64-bit)")),
            ("engine_edition", ColumnData::I32(Some(3))),
            ("database_name", text("EmployeesDb")),
            ("is_cdc_enabled", ColumnData::I32(Some(1))),
            ("encrypt_option", text("TRUE")),
            ("local_time", datetime(46_239, 3_600)),
            ("max_text_repl_size", ColumnData::I64(Some(65_536))),
        ]);
        let facts = decode_server(row).expect("decodes");
        assert_eq!(facts.product_version, "16.0.4135.4");
        assert_eq!(facts.max_text_repl_size, Fact::Known(65_536));
        assert_eq!(facts.engine_edition, 3);
        assert!(facts.cdc_enabled && facts.encrypted == Some(true));
        assert_eq!(facts.local_time.to_string(), "2026-08-07 01:00:00");
        let off = NamedRow::from_pairs(vec![
            ("product_version", text("13.0.1")),
            ("edition", text("Express")),
            ("engine_edition", ColumnData::I32(Some(4))),
            ("database_name", text("d")),
            ("is_cdc_enabled", ColumnData::I32(Some(0))),
            ("encrypt_option", text("FALSE")),
            ("local_time", datetime(46_239, 0)),
            // Not listed in sys.configurations there.
            ("max_text_repl_size", ColumnData::I64(None)),
        ]);
        let facts = decode_server(off).expect("decodes");
        assert!(!facts.cdc_enabled && facts.encrypted == Some(false));
        assert!(matches!(facts.max_text_repl_size, Fact::Unknown(_)));
    }

    #[test]
    fn jobs_running_and_log_scans_decode() {
        let row = |job_type, settings: [i32; 4], retention| {
            let [max_trans, max_scans, continuous, polling] = settings;
            NamedRow::from_pairs(vec![
                ("job_type", text(job_type)),
                ("maxtrans", ColumnData::I32(Some(max_trans))),
                ("maxscans", ColumnData::I32(Some(max_scans))),
                ("continuous", ColumnData::I32(Some(continuous))),
                ("pollinginterval", ColumnData::I64(Some(i64::from(polling)))),
                ("retention", ColumnData::I64(retention)),
            ])
        };
        let jobs = decode_jobs(vec![
            row("capture", [1000, 20, 1, 2], None),
            row("cleanup", [0, 0, 0, 0], Some(4320)),
        ])
        .expect("decodes");
        assert_eq!(jobs[1].retention_minutes, Some(4320));
        assert_eq!(jobs[0].retention_minutes, None);
        assert_eq!(
            jobs[0].capture,
            Some(CaptureSettings {
                max_trans: 1000,
                max_scans: 20,
                continuous: true,
                polling_interval_s: 2,
            })
        );
        assert_eq!(jobs[1].capture, None, "the cleanup job's columns are 0");
        let running = |n| {
            decode_running(vec![NamedRow::from_pairs(vec![(
                "running",
                ColumnData::I64(Some(n)),
            )])])
        };
        assert_eq!(running(1), Ok(true));
        assert_eq!(running(0), Ok(false));
        assert_eq!(decode_log_scan(Vec::new()), Ok(None));
        let scan = decode_log_scan(vec![NamedRow::from_pairs(vec![
            ("start_time", datetime(46_239, 10)),
            ("end_time", ColumnData::DateTime(None)),
            ("latency", ColumnData::I64(Some(4))),
            ("error_count", ColumnData::I64(Some(0))),
            ("tran_count", ColumnData::I64(Some(500))),
            ("total_tran_count", ColumnData::I64(Some(123_456))),
        ])])
        .expect("decodes")
        .expect("a session");
        assert_eq!(scan.end_time, None);
        assert_eq!(scan.latency_seconds, 4);
        assert_eq!(scan.tran_count, 500);
        assert_eq!(scan.total_tran_count, Some(123_456));
        assert_eq!(
            decode_agent(Vec::new()).expect("decodes"),
            Fact::Unknown(
                "sys.dm_server_services lists no SQL Server Agent (needs VIEW SERVER STATE)".into()
            )
        );
    }

    /// The job's ceiling is a round's transactions over its pause: 1,000 a second
    /// with `sys.sp_cdc_add_job`'s defaults; none without a pause or when it runs
    /// once.
    #[test]
    fn the_capture_jobs_ceiling_is_a_rounds_transactions_over_its_pause() {
        let default = CaptureSettings::DEFAULT;
        assert_eq!(default.per_round(), 5_000);
        assert_eq!(default.ceiling_per_second(), Some(1_000));
        let faster = CaptureSettings {
            max_trans: 2_000,
            polling_interval_s: 1,
            ..default
        };
        assert_eq!(faster.ceiling_per_second(), Some(20_000));
        let no_pause = CaptureSettings {
            polling_interval_s: 0,
            ..default
        };
        assert_eq!(no_pause.ceiling_per_second(), None);
        let once = CaptureSettings {
            continuous: false,
            ..default
        };
        assert_eq!(once.ceiling_per_second(), None);
    }
}

//! The source checks: the server, CDC on the database, the SQL Server Agent and its
//! jobs, the stream GUID, and per included table whether this login can read its
//! changes (with the verdicts the poller itself acts on).

use super::*;
use crate::error::Chain;
use crate::mssql::SqlErrorKind;
use crate::source::diagnostics::{self, Invisible, LeftOut};
use crate::source::poller::{CaptureInstanceMode, CleanupMode};
use crate::source::{CaptureDdl, CaptureSettings, CdcReads, FactReads, LogScan};

/// What the source checks learn that the later ones need.
pub(super) struct SourceState {
    pub(super) catalog: Catalog,
    pub(super) facts: ServerFacts,
    pub(super) included: Vec<CaptureInstance>,
}

pub(super) async fn check_source<S: CdcReads + FactReads + CaptureDdl>(
    report: &mut Report,
    config: &Config,
    source: &mut S,
    server: &str,
) -> Option<SourceState> {
    let prefix = if server.is_empty() {
        String::new()
    } else {
        format!("{server}: ")
    };
    let facts = match source.server_facts().await {
        Ok(facts) => facts,
        Err(e) => {
            let fix = match &e {
                SourceError::Sql(SqlErrorKind::LoginFailed) => {
                    "check User Id and Password in source.connection_string".to_owned()
                }
                SourceError::Sql(SqlErrorKind::Transient { .. }) => "check Server= (host and port) in source.connection_string, that SQL Server listens there, and the firewall".to_owned(),
                _ => "see the error; the setting it names".to_owned(),
            };
            report.fail(
                "SQL Server",
                format!(
                    "{prefix}cannot connect and log in: {chain}",
                    chain = Chain(&e)
                ),
                fix,
            );
            report.skip("CDC catalog", "not checked: no connection to the source");
            return None;
        }
    };
    check_server(report, &facts, &prefix);
    check_agent(report, &facts);
    let catalog = match source.catalog().await {
        Ok(catalog) => catalog,
        Err(e) => {
            report.fail("CDC catalog", Chain(&e).to_string(), "see the error");
            return None;
        }
    };
    match (config.event.stream_guid, catalog.database_guid) {
        (Some(configured), _) => {
            report.pass("stream GUID", format!("{configured} (event.stream_guid)"))
        }
        (None, Some(guid)) => report.pass("stream GUID", format!("{guid} (the database GUID)")),
        (None, None) => report.fail(
            "stream GUID",
            "the database GUID is not readable by this login (sys.database_recovery_status)",
            "GRANT VIEW ANY DATABASE TO the login, or set event.stream_guid",
        ),
    }
    check_time_zone(report, config, &catalog);
    // Asked once: both checks below need the answer.
    let db_owner = source.may_manage_capture().await;
    check_capture_management(report, config, &db_owner);
    check_cleanup(report, config, &db_owner, &facts);
    let included = check_tables(report, config, source, &catalog).await;
    check_lob_limit(report, &facts, &included);
    Some(SourceState {
        catalog,
        facts,
        included,
    })
}

/// Whether the login may create and disable capture instances, which
/// `source.capture_instances = "managed"` and `source.enable_cdc` need (`db_owner`):
/// a failure when one is set and it may not; said either way.
fn check_capture_management(
    report: &mut Report,
    config: &Config,
    db_owner: &Result<bool, SourceError>,
) {
    const CHECK: &str = "capture instances";
    let managed = config.source.capture_instances == CaptureInstanceMode::Managed;
    let needed = managed || config.source.enable_cdc;
    let mode = if managed {
        "managed (source.capture_instances): a changed table gets a new capture instance, the old one goes once drained"
    } else {
        "manual (source.capture_instances): a DBA creates capture instances when columns change"
    };
    let enable = if config.source.enable_cdc {
        "; source.enable_cdc enables CDC on included tables that lack it"
    } else {
        ""
    };
    match db_owner {
        Ok(true) => report.pass(CHECK, format!("{mode}{enable}; the login is db_owner, which that needs")),
        Ok(false) if needed => report.fail(
            CHECK,
            format!("{mode}{enable}, but the login is not db_owner, which sys.sp_cdc_enable_table and sys.sp_cdc_disable_table require"),
            "ALTER ROLE db_owner ADD MEMBER <user>, or set source.capture_instances = \"manual\" and source.enable_cdc = false",
        ),
        Ok(false) => report.pass(CHECK, format!("{mode}; the login is not db_owner (\"managed\" would need it)")),
        Err(e) if needed => report.fail(CHECK, format!("cannot tell whether the login is db_owner: {chain}", chain = Chain(&e)), "see the error"),
        Err(e) => report.skip(CHECK, format!("{mode}; cannot tell whether the login is db_owner: {chain}", chain = Chain(&e))),
    }
}

/// Who removes change rows (`source.cleanup`). With `"after_delivery"`: a failure
/// when the login is not `db_owner`; a warning while the Agent's cleanup job still
/// purges by a retention, whatever was delivered.
fn check_cleanup(
    report: &mut Report,
    config: &Config,
    db_owner: &Result<bool, SourceError>,
    facts: &ServerFacts,
) {
    const CHECK: &str = "change table cleanup";
    if config.source.cleanup != CleanupMode::AfterDelivery {
        let retention = crate::source::initial_load::cleanup_retention(facts)
            .map_or_else(String::new, |r| format!(", {} minutes", r.as_secs() / 60));
        report.pass(
            CHECK,
            format!(
                "SQL Server's cleanup job, by its retention{retention} (source.cleanup = \"agent\")"
            ),
        );
        return;
    }
    match db_owner {
        Ok(true) => {}
        Ok(false) => {
            report.fail(
                CHECK,
                "source.cleanup = \"after_delivery\", but the login is not db_owner, which sys.sp_cdc_cleanup_change_table requires",
                "ALTER ROLE db_owner ADD MEMBER <user>, or set source.cleanup = \"agent\"",
            );
            return;
        }
        Err(e) => {
            report.fail(
                CHECK,
                format!(
                    "cannot tell whether the login is db_owner: {chain}",
                    chain = Chain(&e)
                ),
                "see the error",
            );
            return;
        }
    }
    let every = config.source.cleanup_interval.as_millis();
    let done = format!(
        "mssql-ces cleans the change tables it reads every {every} ms, below what every stream of the database delivered (source.cleanup = \"after_delivery\"; the login is db_owner)"
    );
    match crate::source::initial_load::cleanup_retention(facts) {
        Some(retention) => report.warn(
            CHECK,
            format!(
                "{done}; the Agent's cleanup job still purges changes older than {} minutes, delivered or not",
                retention.as_secs() / 60
            ),
            "keep it as a backstop with a retention longer than any outage you expect (EXEC sys.sp_cdc_change_job @job_type = N'cleanup', @retention = <minutes>), or stop it (see docs: operating.md, Cleanup after delivery)",
        ),
        None => report.pass(CHECK, done),
    }
}

/// How commit times become UTC: `source.time_zone` against what the server can say
/// of its own zone; the run refuses what fails here.
fn check_time_zone(report: &mut Report, config: &Config, catalog: &Catalog) {
    const CHECK: &str = "time zone";
    let Ok(setting) = crate::source::timezone::TimeZoneSetting::parse(&config.source.time_zone)
    else {
        // Validation refuses it before any check runs.
        return;
    };
    match catalog.commit_time_zone(&setting) {
        Ok(zone) => match &catalog.server_time_zone {
            Some(id) if setting == crate::source::timezone::TimeZoneSetting::Server => report.pass(
                CHECK,
                format!("the server's own zone ({id}), the offset in force at each commit"),
            ),
            _ => report.pass(CHECK, format!("{} (source.time_zone)", zone.describe())),
        },
        Err(e) => report.fail(
            CHECK,
            Chain(&e).to_string(),
            "set source.time_zone to the server's zone",
        ),
    }
}

/// `max text repl size` where streamed tables capture LOB columns: at its default
/// (65,536 bytes) a larger value written to such a column fails at the source, in
/// the application's statement ("This option applies to transactional replication
/// and Change Data Capture", Learn: max text repl size). Reported, not failed: the
/// application may never write larger values.
fn check_lob_limit(report: &mut Report, facts: &ServerFacts, included: &[CaptureInstance]) {
    let lob_columns: Vec<String> = included
        .iter()
        .flat_map(|i| {
            i.columns
                .iter()
                .filter(|c| is_lob(c))
                .map(move |c| format!("{}.{}", i.qualified_table(), c.name))
        })
        .collect();
    if lob_columns.is_empty() {
        return;
    }
    let check = "max text repl size";
    match &facts.max_text_repl_size {
        Fact::Known(-1) => report.pass(check, "-1: no limit on captured LOB values"),
        Fact::Known(size) => report.pass(
            check,
            format!(
                "{size} bytes: a statement writing a larger value to a captured LOB column ({}) fails at the source; EXEC sp_configure 'max text repl size', -1; RECONFIGURE lifts the limit",
                lob_columns.join(", ")
            ),
        ),
        Fact::Unknown(why) => report.skip(check, why.clone()),
    }
}

/// A column whose values `max text repl size` bounds: `(max)` text and binary, and
/// the old LOB types and xml (left out of events, but still captured).
fn is_lob(column: &crate::source::CapturedColumn) -> bool {
    use crate::event::value::{Length, SqlType, TypeError};
    match &column.sql_type {
        Ok(
            SqlType::VarChar(Length::Max)
            | SqlType::NVarChar(Length::Max)
            | SqlType::VarBinary(Length::Max),
        ) => true,
        Err(TypeError::Excluded { type_name }) => {
            matches!(
                type_name.to_ascii_lowercase().as_str(),
                "text" | "ntext" | "image" | "xml"
            )
        }
        _ => false,
    }
}

/// The server's version and encryption, and CDC on the database.
fn check_server(report: &mut Report, facts: &ServerFacts, prefix: &str) {
    let major = facts
        .product_version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    let tls = match facts.encrypted {
        Some(true) => "encrypted (TLS)",
        Some(false) => "not encrypted (source.encrypt = false)",
        None => "simulated: no network connection",
    };
    match major {
        // Azure SQL Database and Managed Instance report 12.x and run the current
        // engine ("Version 12 of Azure SQL Database is newer than version 15 of SQL
        // Server", Learn: SERVERPROPERTY).
        Some(m)
            if m < 13
                && facts.engine_edition != AZURE_SQL_DATABASE_EDITION
                && facts.engine_edition != AZURE_SQL_MANAGED_INSTANCE_EDITION =>
        {
            report.fail(
                "SQL Server",
                format!(
                    "{prefix}{} {}: mssql-ces needs SQL Server 2016 (13.x) or later",
                    facts.edition, facts.product_version
                ),
                "upgrade SQL Server to 2016 or later",
            )
        }
        _ => report.pass(
            "SQL Server",
            format!(
                "{prefix}{} {}, database {}; {tls}",
                facts.edition, facts.product_version, facts.database
            ),
        ),
    }
    let cdc = format!("CDC on database {}", facts.database);
    if facts.cdc_enabled {
        report.pass(cdc, "enabled");
    } else {
        report.fail(
            cdc,
            "not enabled (sys.databases.is_cdc_enabled = 0)",
            format!(
                "as sysadmin: USE [{}]; EXEC sys.sp_cdc_enable_db;",
                facts.database
            ),
        );
    }
}

pub(super) fn check_agent(report: &mut Report, facts: &ServerFacts) {
    match &facts.agent {
        Fact::Known(status) if status.eq_ignore_ascii_case("Running") => {
            report.pass("SQL Server Agent", "running")
        }
        Fact::Known(status) => report.fail(
            "SQL Server Agent",
            format!("{status}: without it the capture job does not run and no change reaches the change tables"),
            "start SQL Server Agent (Linux: mssql-conf set sqlagent.enabled true and restart; container: MSSQL_AGENT_ENABLED=true)",
        ),
        Fact::Unknown(why) => report.skip("SQL Server Agent", why.clone()),
    }
    let capture = match &facts.jobs {
        Fact::Known(jobs) => jobs.iter().any(|j| j.job_type == "capture"),
        Fact::Unknown(why) => {
            report.skip("capture job", why.clone());
            report.skip("cleanup retention", why.clone());
            check_log_scan(report, facts);
            return;
        }
    };
    if !capture {
        report.fail(
            "capture job",
            "this database has no CDC capture job",
            "EXEC sys.sp_cdc_add_job @job_type = N'capture';",
        );
    } else {
        match &facts.capture_running {
            Fact::Known(true) => report.pass("capture job", "running"),
            Fact::Known(false) => report.fail(
                "capture job",
                "present, not running: no change reaches the change tables",
                "EXEC sys.sp_cdc_start_job @job_type = N'capture';",
            ),
            Fact::Unknown(why) => report.skip("capture job", format!("present; running: {why}")),
        }
    }
    if let Fact::Known(jobs) = &facts.jobs {
        if let Some(settings) = jobs
            .iter()
            .find(|j| j.job_type == "capture")
            .and_then(|j| j.capture)
        {
            check_capture_settings(report, settings, &facts.log_scan);
        }
        match jobs
            .iter()
            .find(|j| j.job_type == "cleanup")
            .and_then(|j| j.retention_minutes)
        {
            Some(minutes) => report.pass(
                "cleanup retention",
                format!("changes are kept {minutes} min ({})", human_minutes(minutes)),
            ),
            None => report.pass(
                "cleanup retention",
                "no cleanup job: change tables grow until one is added (EXEC sys.sp_cdc_add_job @job_type = N'cleanup')",
            ),
        }
    }
    check_log_scan(report, facts);
}

/// The capture job's settings, and whether they, not mssql-ces, bound the stream:
/// its last scan took as many transactions as a scan may and the job is behind the
/// log, so the change tables fill no faster than the settings allow.
fn check_capture_settings(
    report: &mut Report,
    settings: CaptureSettings,
    log_scan: &Fact<Option<LogScan>>,
) {
    const CHECK: &str = "capture job settings";
    let CaptureSettings {
        max_trans,
        max_scans,
        continuous,
        polling_interval_s,
    } = settings;
    let bound = match settings.ceiling_per_second() {
        Some(ceiling) => format!(
            "at most {max_trans} transactions a scan and {max_scans} scans, then a pause of {polling_interval_s} s: at most about {ceiling} transactions/s"
        ),
        None if continuous => format!(
            "at most {max_trans} transactions a scan and {max_scans} scans, without a pause"
        ),
        None => format!(
            "runs once each time it is started (continuous = 0): at most {max_trans} transactions a scan and {max_scans} scans, then it stops"
        ),
    };
    let capped = match log_scan {
        Fact::Known(Some(scan))
            if scan.latency_seconds > LATENCY_LIMIT_SECONDS && scan.tran_count >= max_trans =>
        {
            Some(scan.latency_seconds)
        }
        _ => None,
    };
    let Some(latency) = capped else {
        report.pass(CHECK, bound);
        return;
    };
    let pause = if polling_interval_s > 1 {
        ", @pollinginterval = 1"
    } else {
        ""
    };
    report.fail(
        CHECK,
        format!(
            "they bound the stream: the last scan took the most transactions a scan may ({max_trans}) and the job is {latency} s behind the log; {bound}"
        ),
        format!(
            "EXEC sys.sp_cdc_change_job @job_type = N'capture', @maxtrans = {}{pause}; then restart the job, which reads its settings when it starts: EXEC sys.sp_cdc_stop_job @job_type = N'capture'; EXEC sys.sp_cdc_start_job @job_type = N'capture';",
            max_trans.saturating_mul(4)
        ),
    );
}

pub(super) fn check_log_scan(report: &mut Report, facts: &ServerFacts) {
    match &facts.log_scan {
        Fact::Unknown(why) => report.skip("last log scan", why.clone()),
        Fact::Known(None) => report.pass(
            "last log scan",
            "none since the server started (nothing captured yet)",
        ),
        Fact::Known(Some(scan)) if scan.error_count > 0 => report.fail(
            "last log scan",
            format!("the capture job's last scan had {} errors", scan.error_count),
            "read them in sys.dm_cdc_errors and the capture job's history",
        ),
        Fact::Known(Some(scan)) if scan.latency_seconds > LATENCY_LIMIT_SECONDS => report.fail(
            "last log scan",
            format!(
                "the capture job is {} s behind the log: changes reach the change tables late",
                scan.latency_seconds
            ),
            "look at the capture job's settings (sys.sp_cdc_change_job @maxtrans, @maxscans, @pollinginterval) and the log's growth",
        ),
        Fact::Known(Some(scan)) => {
            let ended = scan.end_time.unwrap_or(scan.start_time);
            let ago = (facts.local_time - ended).num_seconds().max(0);
            let state = if scan.end_time.is_none() { "running since" } else { "ended" };
            report.pass(
                "last log scan",
                format!("{state} {ago} s ago; latency {} s", scan.latency_seconds),
            );
        }
    }
}

/// Per included table: its capture instances, key, left-out columns and whether this
/// login can read its changes. Returns the included instances.
pub(super) async fn check_tables<S: CdcReads>(
    report: &mut Report,
    config: &Config,
    source: &mut S,
    catalog: &Catalog,
) -> Vec<CaptureInstance> {
    let (filter, rules) = match config.poller() {
        Ok(poller) => (poller.filter, poller.columns),
        Err(e) => {
            report.fail("tables", Chain(&e).to_string(), "fix the setting it names");
            return Vec::new();
        }
    };
    // The poller's own verdict: what would stop a run fails here.
    let (invisible, fails) = match diagnostics::invisible(catalog, &filter) {
        Invisible::None => (&[][..], false),
        Invisible::Stops(names) => (names, true),
        Invisible::NotStreamed(names) => (names, false),
    };
    for name in invisible {
        let check = format!("capture instance {name}");
        if fails {
            report.fail(
                check,
                "its table is not visible to this login (OBJECT_NAME is NULL)",
                "GRANT SELECT on the table to the login, or leave it out with source.exclude",
            );
        } else {
            report.skip(
                check,
                "its table is not visible to this login, so source.include/exclude cannot tell whether it is streamed",
            );
        }
    }
    if let Some(own) = catalog
        .instances
        .iter()
        .find(|i| crate::source::filter::is_checkpoint_table(&i.schema, &i.table))
    {
        report.warn(
            format!("table {}.{}", own.schema, own.table),
            format!(
                "CDC is enabled on the checkpoint table (capture instance {}): it is never streamed, but the capture job records every checkpoint written",
                own.name
            ),
            format!(
                "EXEC sys.sp_cdc_disable_table @source_schema = N'{}', @source_name = N'{}', @capture_instance = N'{}'",
                own.schema, own.table, own.name
            ),
        );
    }
    let included: Vec<CaptureInstance> = catalog
        .instances
        .iter()
        .filter(|i| filter.allows(&i.schema, &i.table))
        .cloned()
        .collect();
    if included.is_empty() {
        report.fail(
            "tables",
            format!(
                "no capture instance of the {} in the catalog matches source.include/source.exclude",
                catalog.instances.len()
            ),
            "enable CDC on a table (EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'…', @role_name = NULL) or widen source.include",
        );
        return included;
    }
    // Each table once, in catalog order, however its capture instances are named
    // (a second instance need not sort next to the first).
    let mut seen = std::collections::HashSet::new();
    let tables: Vec<String> = included
        .iter()
        .map(CaptureInstance::qualified_table)
        .filter(|table| seen.insert(table.clone()))
        .collect();
    for table in tables {
        let check = format!("table {table}");
        let mut details = Vec::new();
        let mut failure: Option<(String, String)> = None;
        for instance in included.iter().filter(|i| i.qualified_table() == table) {
            match instance_finding(source, instance).await {
                Ok(detail) => details.push(detail),
                Err(failed) => failure = Some(failed),
            }
        }
        match failure {
            Some((detail, fix)) => report.fail(check, detail, fix),
            None => report.pass(check, details.join(" | ")),
        }
    }
    check_column_rules(report, &rules, &included, &catalog.database);
    included
}

/// `[[event.columns]]`: per table, which columns are excluded, masked or
/// truncated (a failure where a rule would stop the run), and the rules that match
/// no column of any included table.
fn check_column_rules(
    report: &mut Report,
    rules: &crate::event::columns::ColumnRules,
    included: &[CaptureInstance],
    database: &str,
) {
    if rules.is_empty() {
        return;
    }
    let mut plans = crate::event::columns::PlanCache::default();
    let mut seen = std::collections::HashSet::new();
    for instance in included {
        let Ok(context) = crate::source::merge::InstanceContext::new(instance, database) else {
            continue;
        };
        let table = context.table.qualified_name();
        if !seen.insert(table.clone()) {
            continue;
        }
        let check = format!("column rules {table}");
        if let Err(e) = plans.plan(rules, &context.table) {
            report.fail(
                check,
                Chain(&e).to_string(),
                "change the rule the message names",
            );
            continue;
        }
        if let Some(detail) = rules.summary(&context.table) {
            report.pass(check, detail);
        }
    }
    let unmatched = rules.unmatched(&plans.matched);
    if !unmatched.is_empty() {
        report.fail(
            "column rules",
            format!(
                "matching no column of any included table: {}",
                unmatched.join(", ")
            ),
            "correct the pattern (schema.table.column, case-insensitive; * and ?) or remove the rule: a misspelt rule lets the column's data out",
        );
    }
}

/// What `check` says of one capture instance: where it starts, its key and the
/// columns events leave out; or, when this login cannot read it, why and the fix.
async fn instance_finding<S: CdcReads>(
    source: &mut S,
    instance: &CaptureInstance,
) -> Result<String, (String, String)> {
    let Some(start) = instance.start_lsn else {
        return Err((
            format!(
                "capture instance {} has no start_lsn yet: the capture job has not scanned since it was enabled",
                instance.name
            ),
            "make sure the capture job runs (EXEC sys.sp_cdc_start_job @job_type = N'capture')"
                .into(),
        ));
    };
    match source.min_lsn(&instance.name).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err((
                format!(
                    "this login cannot read the changes of capture instance {} (sys.fn_cdc_get_min_lsn is 0x00)",
                    instance.name
                ),
                format!(
                    "GRANT SELECT ON [{}].[{}] TO the login (every captured column){}",
                    instance.schema,
                    instance.table,
                    crate::source::gating_role_advice(instance.options.role_name.as_deref())
                ),
            ));
        }
        Err(e) => {
            return Err((
                format!(
                    "reading the low end of {}: {chain}",
                    instance.name,
                    chain = Chain(&e)
                ),
                "see the error".into(),
            ));
        }
    }
    let key = if instance.key_columns.is_empty() {
        "no key (no primary key or @index_name)".to_owned()
    } else {
        format!("key ({})", instance.key_columns.join(", "))
    };
    let left_out: Vec<String> = diagnostics::left_out_columns(instance)
        .map(|(c, why)| match why {
            LeftOut::Unsupported(reason) => format!("{} ({reason})", c.name),
            LeftOut::Dropped => format!("{} (dropped)", c.name),
            LeftOut::Computed => format!("{} (computed: NULL in every change row)", c.name),
        })
        .collect();
    let streamed = instance.emitted_columns().count();
    let mut detail = format!(
        "capture instance {} from {start}; {key}; {streamed} columns streamed",
        instance.name
    );
    if !left_out.is_empty() {
        detail.push_str(&format!("; left out: {}", left_out.join(", ")));
    }
    Ok(detail)
}

//! `mssql-ces check`: a preflight of everything a run needs, one finding per check:
//! passed (✔), failed (✘, with the exact fix) or not checked (–, saying why).
//!
//! The checks go through the same seams as a run — [`ChangeSource`] for the database,
//! [`CheckpointStore`] for the checkpoint, the sinks' own clients for the destination
//! — so the simulator and the Kafka test double exercise every verdict. Nothing is
//! written: the checkpoint's writability is probed without a write or the lease, so
//! `check` may run beside the active process.

use std::time::Duration;

use chrono::NaiveDateTime;

use crate::checkpoint::CheckpointStore;
use crate::config::{Config, SourceKind};
use crate::lsn::Lsn;
use crate::position::{Position, SourceIdentity};
use crate::sink::SinkConfig;
use crate::sink::kafka::{self, DestinationFacts, KafkaFlavour};
use crate::sink::{SinkHealth, expand_topic};
use crate::source::sqlserver::SqlServerSource;
use crate::source::{
    AZURE_SQL_DATABASE_EDITION, CaptureInstance, Catalog, ChangeSource, Fact, ServerFacts,
    SourceError,
};

/// How long each network check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// A checkpoint this far into the cleanup retention is at risk (its changes are
/// purged when it reaches 100 %).
const RETENTION_WARNING: f64 = 0.8;

/// A capture job this far behind the log is reported.
const LATENCY_LIMIT_SECONDS: i64 = 300;

/// The verdict of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    /// Could not be checked (a permission, an earlier failure): says why.
    Skip,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub check: String,
    pub status: Status,
    pub detail: String,
    /// For a failure: what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// Every finding, in the order checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    fn push(&mut self, check: impl Into<String>, status: Status, detail: impl Into<String>) {
        self.findings.push(Finding {
            check: check.into(),
            status,
            detail: detail.into(),
            fix: None,
        });
    }

    fn pass(&mut self, check: impl Into<String>, detail: impl Into<String>) {
        self.push(check, Status::Pass, detail);
    }

    fn skip(&mut self, check: impl Into<String>, why: impl Into<String>) {
        self.push(check, Status::Skip, why);
    }

    fn fail(
        &mut self,
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.findings.push(Finding {
            check: check.into(),
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        });
    }

    /// True when no check failed (skipped ones do not count against it).
    pub fn passed(&self) -> bool {
        self.findings.iter().all(|f| f.status != Status::Fail)
    }

    /// The finding named `check`, if any.
    pub fn get(&self, check: &str) -> Option<&Finding> {
        self.findings.iter().find(|f| f.check == check)
    }

    fn count(&self, status: Status) -> usize {
        self.findings.iter().filter(|f| f.status == status).count()
    }

    /// One line per check, a `fix:` line under each failure, and a total.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let mark = match f.status {
                Status::Pass => '✔',
                Status::Fail => '✘',
                Status::Skip => '–',
            };
            out.push_str(&format!("{mark} {}: {}\n", f.check, f.detail));
            if let Some(fix) = &f.fix {
                out.push_str(&format!("    fix: {fix}\n"));
            }
        }
        out.push_str(&format!(
            "{} passed, {} failed, {} not checked\n",
            self.count(Status::Pass),
            self.count(Status::Fail),
            self.count(Status::Skip)
        ));
        out
    }

    /// `{"passed": bool, "checks": [...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "passed": self.passed(),
            "failed": self.count(Status::Fail),
            "skipped": self.count(Status::Skip),
            "checks": self.findings,
        })
    }
}

/// Checks the configured stream: its secrets, the source, the checkpoint and the
/// destination.
pub async fn check(config: &Config) -> Report {
    match config.source.kind {
        SourceKind::Synthetic if config.source.synthetic.transaction_rows > 0 => {
            let mut source = crate::app::bulk_source(config);
            check_with(config, &mut source, "synthetic large transactions").await
        }
        SourceKind::Synthetic => {
            let mut source = crate::app::synthetic_source(config);
            check_with(config, &mut source, "synthetic source (a simulated server)").await
        }
        SourceKind::Sqlserver => match crate::app::sql_server_settings(config) {
            Ok(settings) => {
                let mut source = SqlServerSource::new(settings);
                check_with(config, &mut source, "").await
            }
            Err(e) => {
                let mut report = Report::default();
                secrets(&mut report, config);
                report.fail(
                    "SQL Server",
                    e.to_string(),
                    "set source.connection_string.env or .file to where the connection string is",
                );
                report
            }
        },
    }
}

/// [`check`] against a given source; `server`, when not empty, names it in the
/// report (the synthetic source says it is simulated).
pub async fn check_with<S: ChangeSource>(config: &Config, source: &mut S, server: &str) -> Report {
    let mut report = Report::default();
    secrets(&mut report, config);
    let catalog = check_source(&mut report, config, source, server).await;
    check_checkpoint(&mut report, config, source, catalog.as_ref()).await;
    check_destination(&mut report, config, catalog.as_ref()).await;
    report
}

fn secrets(report: &mut Report, config: &Config) {
    match config.check_secrets() {
        Ok(()) => report.pass("configuration", "valid; every secret it names resolves"),
        Err(e) => report.fail(
            "configuration",
            e.to_string(),
            "make the secret available (the environment variable or the file the setting names)",
        ),
    }
}

/// What the source checks learn that the later ones need.
struct SourceState {
    catalog: Catalog,
    facts: ServerFacts,
    included: Vec<CaptureInstance>,
    stream_guid: Option<uuid::Uuid>,
}

async fn check_source<S: ChangeSource>(
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
                SourceError::LoginFailed => {
                    "check User Id and Password in source.connection_string".to_owned()
                }
                SourceError::Transient { .. } => "check Server= (host and port) in source.connection_string, that SQL Server listens there, and the firewall".to_owned(),
                _ => "see the error; the setting it names".to_owned(),
            };
            report.fail(
                "SQL Server",
                format!("{prefix}cannot connect and log in: {e}"),
                fix,
            );
            report.skip("CDC catalog", "not checked: no connection to the source");
            return None;
        }
    };
    let major = facts
        .product_version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    let tls = if facts.encrypted {
        "encrypted (TLS)"
    } else {
        "not encrypted (source.encrypt = false)"
    };
    match major {
        Some(m) if m < 13 && facts.engine_edition != AZURE_SQL_DATABASE_EDITION => report.fail(
            "SQL Server",
            format!(
                "{prefix}{} {}: mssql-ces needs SQL Server 2016 (13.x) or later",
                facts.edition, facts.product_version
            ),
            "upgrade SQL Server to 2016 or later",
        ),
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
    check_agent(report, &facts);
    let catalog = match source.catalog().await {
        Ok(catalog) => catalog,
        Err(e) => {
            report.fail("CDC catalog", e.to_string(), "see the error");
            return None;
        }
    };
    let stream_guid = config.event.stream_guid.or(catalog.database_guid);
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
    let included = check_tables(report, config, source, &catalog).await;
    Some(SourceState {
        catalog,
        facts,
        included,
        stream_guid,
    })
}

fn check_agent(report: &mut Report, facts: &ServerFacts) {
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

fn check_log_scan(report: &mut Report, facts: &ServerFacts) {
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
async fn check_tables<S: ChangeSource>(
    report: &mut Report,
    config: &Config,
    source: &mut S,
    catalog: &Catalog,
) -> Vec<CaptureInstance> {
    let poller = config.poller().ok();
    let filter = poller.as_ref().map(|p| &p.filter);
    let allows = |i: &CaptureInstance| filter.is_none_or(|f| f.allows(&i.schema, &i.table));
    for name in &catalog.invisible {
        let check = format!("capture instance {name}");
        if filter.is_some_and(|f| f.has_patterns()) {
            report.skip(
                check,
                "its table is not visible to this login, so source.include/exclude cannot tell whether it is streamed",
            );
        } else {
            report.fail(
                check,
                "its table is not visible to this login (OBJECT_NAME is NULL)",
                "GRANT SELECT on the table to the login, or leave it out with source.exclude",
            );
        }
    }
    let included: Vec<CaptureInstance> = catalog
        .instances
        .iter()
        .filter(|i| allows(i))
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
            let Some(start) = instance.start_lsn else {
                failure = Some((
                    format!("capture instance {} has no start_lsn yet: the capture job has not scanned since it was enabled", instance.name),
                    "make sure the capture job runs (EXEC sys.sp_cdc_start_job @job_type = N'capture')".into(),
                ));
                continue;
            };
            match source.min_lsn(&instance.name).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    failure = Some((
                        format!(
                            "this login cannot read the changes of capture instance {} (sys.fn_cdc_get_min_lsn is 0x00)",
                            instance.name
                        ),
                        format!(
                            "GRANT SELECT ON [{}].[{}] TO the login (every captured column), and membership of the capture instance's gating role if it has one",
                            instance.schema, instance.table
                        ),
                    ));
                    continue;
                }
                Err(e) => {
                    failure = Some((
                        format!("reading the low end of {}: {e}", instance.name),
                        "see the error".into(),
                    ));
                    continue;
                }
            }
            let key = if instance.key_columns.is_empty() {
                "no key (no primary key or @index_name)".to_owned()
            } else {
                format!("key ({})", instance.key_columns.join(", "))
            };
            let left_out: Vec<String> = instance
                .columns
                .iter()
                .filter_map(|c| match &c.sql_type {
                    Err(reason) => Some(format!("{} ({reason})", c.name)),
                    Ok(_) if c.table_index.is_none() => Some(format!("{} (dropped)", c.name)),
                    Ok(_) => None,
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
            details.push(detail);
        }
        match failure {
            Some((detail, fix)) => report.fail(check, detail, fix),
            None => report.pass(check, details.join(" | ")),
        }
    }
    included
}

async fn check_checkpoint<S: ChangeSource>(
    report: &mut Report,
    config: &Config,
    source: &mut S,
    state: Option<&SourceState>,
) {
    let mut store = match crate::app::checkpoint_store(config) {
        Ok(store) => store,
        Err(e) => {
            report.fail("checkpoint", e.to_string(), "see the setting it names");
            return;
        }
    };
    let where_ = match config.checkpoint.store {
        crate::config::CheckpointStoreKind::File => config.checkpoint.path.display().to_string(),
        crate::config::CheckpointStoreKind::Table => "table dbo.mssql_ces_checkpoint".to_owned(),
    };
    let position = match store.load().await {
        Ok(Some(position)) => {
            let at = position
                .last_event
                .map_or_else(|| "no event yet".to_owned(), |e| e.to_string());
            report.pass(
                "checkpoint: readable",
                format!(
                    "{where_}, stream {}: at {at}",
                    config.checkpoint.stream_name
                ),
            );
            Some(position)
        }
        Ok(None) => {
            report.pass(
                "checkpoint: readable",
                format!(
                    "{where_}: none yet for stream {}; the first run starts at source.start_position ({})",
                    config.checkpoint.stream_name, config.source.start_position
                ),
            );
            None
        }
        Err(e) => {
            report.fail(
                "checkpoint: readable",
                e.to_string(),
                "the message says what to change (checkpoint.path, checkpoint.stream_name)",
            );
            None
        }
    };
    match check_writable(&mut store).await {
        Ok(()) => report.pass("checkpoint: writable", where_.clone()),
        Err(e) => report.fail(
            "checkpoint: writable",
            e.to_string(),
            match config.checkpoint.store {
                crate::config::CheckpointStoreKind::File => {
                    "make the checkpoint's directory writable by this user, or set checkpoint.path elsewhere"
                }
                crate::config::CheckpointStoreKind::Table => {
                    "create dbo.mssql_ces_checkpoint (sql/04_checkpoint_table.sql) and GRANT INSERT, UPDATE on it to the login"
                }
            },
        ),
    }
    let (Some(position), Some(state)) = (position, state) else {
        return;
    };
    check_identity(report, &position, state);
    check_retention(report, source, &position, state).await;
}

async fn check_writable(
    store: &mut CheckpointStore,
) -> Result<(), crate::checkpoint::CheckpointError> {
    tokio::time::timeout(CHECK_TIMEOUT, store.check_writable())
        .await
        .unwrap_or_else(|_| {
            Err(crate::checkpoint::CheckpointError::Io {
                location: "the checkpoint store".into(),
                reason: format!("no answer within {} s", CHECK_TIMEOUT.as_secs()),
            })
        })
}

fn check_identity(report: &mut Report, position: &Position, state: &SourceState) {
    let (Some(recorded), Some(stream_guid)) = (&position.source, state.stream_guid) else {
        report.pass(
            "checkpoint: this database",
            "the checkpoint does not record its database (written by an older version)",
        );
        return;
    };
    let now = SourceIdentity {
        server: state.catalog.server.clone(),
        database: state.catalog.database.clone(),
        database_guid: state.catalog.database_guid,
        stream_guid,
    };
    if recorded.same_stream(&now) {
        report.pass("checkpoint: this database", recorded.to_string());
    } else {
        report.fail(
            "checkpoint: this database",
            format!("the checkpoint is of {recorded}, but the source is {now}"),
            "point checkpoint.path (or checkpoint.stream_name) at this database's own checkpoint, or move the other one away to start afresh",
        );
    }
}

/// Whether changes the checkpoint still needs were purged, or soon will be.
async fn check_retention<S: ChangeSource>(
    report: &mut Report,
    source: &mut S,
    position: &Position,
    state: &SourceState,
) {
    let check = "checkpoint: within retention";
    let mut oldest_needed: Option<Lsn> = None;
    for instance in &state.included {
        let Some(&through) = position.instances.get(&instance.name) else {
            continue; // new since the checkpoint: read from its start
        };
        if position
            .change_tables
            .get(&instance.name)
            .is_some_and(|&id| id != instance.object_id)
        {
            continue; // re-created since: a new instance
        }
        let first_unread = through.increment().unwrap_or(Lsn::MAX);
        match source.min_lsn(&instance.name).await {
            Ok(Some(min_lsn)) if first_unread < min_lsn => {
                let last_lost =
                    Lsn::from_u128(min_lsn.to_u128().saturating_sub(1)).unwrap_or(min_lsn);
                report.fail(
                    check,
                    format!(
                        "CHANGES LOST: the cleanup job purged {}'s changes from {first_unread} to {last_lost} before they were delivered",
                        instance.name
                    ),
                    "they cannot be read from CDC any more: set source.on_gap = \"skip\" to go on (the loss is logged), or move the checkpoint away to start again from source.start_position",
                );
                return;
            }
            Ok(_) => {}
            Err(e) => {
                report.skip(
                    check,
                    format!("cannot read the low end of {}: {e}", instance.name),
                );
                return;
            }
        }
        oldest_needed = Some(oldest_needed.map_or(through, |o| o.min(through)));
    }
    let Some(oldest) = oldest_needed else {
        report.pass(check, "no table of the checkpoint is still read");
        return;
    };
    let max_lsn = match source.max_lsn().await {
        Ok(max) => max.lsn,
        Err(e) => {
            report.skip(check, format!("cannot read max_lsn: {e}"));
            return;
        }
    };
    if max_lsn.is_none_or(|max| max <= oldest) {
        report.pass(check, "caught up: nothing newer to lose");
        return;
    }
    let retention = match &state.facts.jobs {
        Fact::Known(jobs) => jobs
            .iter()
            .find(|j| j.job_type == "cleanup")
            .and_then(|j| j.retention_minutes),
        Fact::Unknown(why) => {
            report.skip(check, format!("the cleanup retention is not known: {why}"));
            return;
        }
    };
    let Some(retention) = retention else {
        report.pass(check, "no cleanup job: nothing is purged");
        return;
    };
    let since: Option<NaiveDateTime> = match source.lsn_time(oldest).await {
        Ok(time) => time,
        Err(e) => {
            report.skip(
                check,
                format!("cannot map the checkpoint's LSN to a time: {e}"),
            );
            return;
        }
    };
    let Some(since) = since else {
        report.skip(
            check,
            format!("cdc.lsn_time_mapping no longer holds {oldest}: the cleanup job is near it"),
        );
        return;
    };
    let age_minutes = (state.facts.local_time - since).num_minutes().max(0);
    let share = age_minutes as f64 / retention as f64;
    if share >= RETENTION_WARNING {
        report.fail(
            check,
            format!(
                "the oldest change still to deliver was committed {} ago, {:.0} % of the cleanup retention ({}): it is purged in about {}",
                human_minutes(age_minutes),
                share * 100.0,
                human_minutes(retention),
                human_minutes((retention - age_minutes).max(0))
            ),
            format!(
                "start mssql-ces now, or give it time: EXEC sys.sp_cdc_change_job @job_type = N'cleanup', @retention = {};",
                (retention * 2).min(52_494_800)
            ),
        );
    } else {
        report.pass(
            check,
            format!(
                "the oldest change still to deliver was committed {} ago; retention {}",
                human_minutes(age_minutes),
                human_minutes(retention)
            ),
        );
    }
}

/// `4320` → `3 d`, `90` → `1 h 30 min`.
fn human_minutes(minutes: i64) -> String {
    let (days, hours, mins) = (minutes / 1440, minutes % 1440 / 60, minutes % 60);
    let mut parts = Vec::new();
    if days > 0 {
        parts.push(format!("{days} d"));
    }
    if hours > 0 {
        parts.push(format!("{hours} h"));
    }
    if mins > 0 || parts.is_empty() {
        parts.push(format!("{mins} min"));
    }
    parts.join(" ")
}

async fn check_destination(report: &mut Report, config: &Config, state: Option<&SourceState>) {
    let routing = &config.sink.routing;
    let largest = config.event.max_message_size_kb.bytes();
    match &config.sink.kind {
        SinkConfig::Kafka(c) | SinkConfig::EventHubsKafka(c) => {
            let flavour = match &config.sink.kind {
                SinkConfig::Kafka(_) => KafkaFlavour::Kafka,
                _ => KafkaFlavour::EventHubs,
            };
            let (settings, template) = match c.settings(flavour, routing, largest) {
                Ok(found) => found,
                Err(e) => {
                    report.fail("destination", e.to_string(), "see the setting it names");
                    return;
                }
            };
            let topics = topics(&template, state);
            match kafka::describe_destination(&settings, &topics, CHECK_TIMEOUT).await {
                Ok(facts) => kafka_findings(report, &facts, largest, settings.check_topic_limits),
                Err(e) => report.fail(
                    "Kafka: brokers",
                    format!("no answer from sink.bootstrap_servers within {} s: {e}", CHECK_TIMEOUT.as_secs()),
                    "check sink.bootstrap_servers, that the brokers run and are reachable from here, and the credentials (sink.security_protocol, sink.sasl_*, sink.connection_string)",
                ),
            }
        }
        SinkConfig::EventHubsAmqp(c) => {
            let built =
                tokio::time::timeout(CHECK_TIMEOUT * 3, c.build(routing, SinkHealth::new(false)))
                    .await;
            match built {
                Ok(Ok(built)) => {
                    let partitions = match &built.sink {
                        crate::sink::Sink::EventHubsAmqp(s) => s.partition_count(),
                        _ => None,
                    };
                    match partitions {
                        Some(n) => report.pass(
                            format!("Event Hubs: {}", built.topic),
                            format!("connected; the hub exists with {n} partitions"),
                        ),
                        None => report.fail(
                            format!("Event Hubs: {}", built.topic),
                            "connected, but the hub's properties are not readable: every key would go through the gateway, slowly",
                            "give the credential the Listen or Manage right (or the Azure Event Hubs Data Owner role), so it can read the hub's partitions",
                        ),
                    }
                    let _ = built.sink.close().await;
                }
                Ok(Err(e)) => report.fail(
                    "Event Hubs",
                    e.to_string(),
                    "check sink.connection_string (or sink.namespace and sink.entra_credential) and sink.topic",
                ),
                Err(_) => report.fail(
                    "Event Hubs",
                    format!("no connection within {} s", (CHECK_TIMEOUT * 3).as_secs()),
                    "check the namespace, that AMQP (port 5671) is reachable from here, and sink.custom_endpoint",
                ),
            }
        }
        SinkConfig::File(c) => {
            let dir = match c.path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => std::path::PathBuf::from("."),
            };
            match crate::checkpoint::file::probe_writable(&dir) {
                Ok(()) => report.pass("destination", format!("file {}", c.path.display())),
                Err(e) => report.fail(
                    "destination",
                    format!("cannot write in {}: {e}", dir.display()),
                    "make the directory writable by this user, or set sink.path elsewhere",
                ),
            }
        }
        SinkConfig::Stdout(_) => report.pass("destination", "stdout"),
    }
}

/// The topics the stream writes to: the template for each included table.
fn topics(template: &str, state: Option<&SourceState>) -> Vec<String> {
    let mut topics: Vec<String> = match state {
        Some(state) => state
            .included
            .iter()
            .map(|i| expand_topic(template, &state.catalog.database, &i.schema, &i.table))
            .collect(),
        None if !template.contains('{') => vec![template.to_owned()],
        None => Vec::new(),
    };
    topics.sort();
    topics.dedup();
    topics
}

/// The verdicts on a Kafka destination's facts.
pub fn kafka_findings(
    report: &mut Report,
    facts: &DestinationFacts,
    largest: usize,
    check_limits: bool,
) {
    report.pass(
        "Kafka: brokers",
        format!("{} reachable; credentials accepted", facts.brokers),
    );
    for topic in &facts.topics {
        let check = format!("topic {}", topic.name);
        let Some(partitions) = topic.partitions else {
            match &facts.auto_create {
                Ok(true) => report.pass(
                    check,
                    "does not exist yet; the broker creates it on first use (auto.create.topics.enable), with its num.partitions",
                ),
                Ok(false) => report.fail(
                    check,
                    "does not exist, and the broker does not create topics (auto.create.topics.enable = false)",
                    format!("create it: kafka-topics.sh --create --topic {} --partitions <n>", topic.name),
                ),
                Err(why) => report.fail(
                    check,
                    format!("does not exist (whether the broker would create it: {why})"),
                    format!("create it (kafka-topics.sh --create --topic {} --partitions <n>; on Event Hubs, an event hub of that name)", topic.name),
                ),
            }
            continue;
        };
        if !check_limits {
            report.pass(check, format!("{partitions} partitions"));
            continue;
        }
        match &topic.max_message_bytes {
            Ok(limit) => match kafka::check_topic_limit(&topic.name, *limit, largest) {
                Ok(()) => report.pass(
                    check,
                    format!("{partitions} partitions; max.message.bytes {limit} fits segments of {largest} bytes"),
                ),
                Err(e) => report.fail(
                    check,
                    format!("{partitions} partitions; {e}"),
                    format!(
                        "kafka-configs.sh --alter --entity-type topics --entity-name {} --add-config max.message.bytes={}, or lower event.max_message_size_kb",
                        topic.name,
                        largest + kafka::RECORD_OVERHEAD_BYTES
                    ),
                ),
            },
            Err(why) => report.skip(
                check,
                format!("{partitions} partitions; max.message.bytes {why}: make sure it exceeds event.max_message_size_kb"),
            ),
        }
    }
}

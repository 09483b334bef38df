//! `check` with `source.databases`: which databases the patterns match on the
//! server, whether the probe reads each, and every matched database's own source
//! and checkpoint findings (named `<db>: …`); the destination once.

use super::*;
use crate::databases::usable_name;
use crate::error::Chain;
use crate::glob::matches;
use crate::source::server::DatabaseServer;

/// Checks many databases: `server` lists and probes them, `source_for` opens one.
pub async fn check_many<D: DatabaseServer, S: ChangeSource>(
    config: &Config,
    server: &mut D,
    mut source_for: impl FnMut(&Config) -> Result<S, crate::setting::ConfigError>,
) -> Report {
    let mut report = Report::default();
    secrets(&mut report, config);
    let patterns = &config.source.databases;
    if let Ok(crate::source::AZURE_SQL_DATABASE_EDITION) = server.engine_edition().await {
        report.fail(
            "databases",
            SourceError::NoCrossDatabaseQueries.to_string(),
            "give each database a configuration of its own, without source.databases",
        );
        return report;
    }
    let found = match server.cdc_databases().await {
        Ok(found) => found,
        Err(e) => {
            report.fail(
                "databases",
                format!(
                    "the server's databases could not be listed: {chain}",
                    chain = Chain(&e)
                ),
                "check source.connection_string and that the login can read sys.databases",
            );
            return report;
        }
    };
    let matched: Vec<String> = found
        .into_iter()
        .filter(|name| patterns.iter().any(|p| matches(p, name)) && usable_name(name))
        .collect();
    if matched.is_empty() {
        report.fail(
            "databases",
            format!("source.databases ({}) matches no CDC-enabled database that is online and open to this login", patterns.join(", ")),
            "enable CDC on the databases (EXEC sys.sp_cdc_enable_db), grant the login access, or correct source.databases",
        );
        return report;
    }
    report.pass(
        "databases",
        format!("{} matched: {}", matched.len(), list(&matched)),
    );
    for explicit in patterns.iter().filter(|p| !p.contains(['*', '?'])) {
        if !matched.iter().any(|name| matches(explicit, name)) {
            report.fail(
                format!("database {explicit}"),
                "named in source.databases but not CDC-enabled, online and open to this login",
                format!("EXEC sys.sp_cdc_enable_db in {explicit}, bring it online, or grant the login access to it"),
            );
        }
    }
    let secondaries = match server.unreadable_replicas().await {
        Ok(found) => found.unwrap_or_default(),
        Err(e) => {
            report.fail(
                "availability groups",
                format!("the databases this replica cannot read could not be listed: {chain}", chain = Chain(&e)),
                "check the connection; the login's VIEW SERVER STATE lets run skip them without probing",
            );
            Vec::new()
        }
    };
    let mut readable = matched.clone();
    readable.retain(|name| !secondaries.contains(name));
    for name in matched.iter().filter(|name| secondaries.contains(*name)) {
        report.warn(
            format!("{name}: replica"),
            "skipped: this replica is an availability group secondary that allows no connections; run does not stream it here and looks again at each discovery",
            "connect to the availability group's primary (its listener), or allow reads on this secondary (SECONDARY_ROLE (ALLOW_CONNECTIONS = ALL))",
        );
    }
    match server.probe(&readable).await {
        Ok(answers) => {
            for answer in answers {
                match answer.state {
                    Ok(_) => {}
                    // `run` skips such a database and asks again with backoff: a
                    // warning here, and no checks of what cannot be read.
                    Err(SourceError::NotReadableHere { message }) => {
                        readable.retain(|name| *name != answer.database);
                        report.warn(
                            format!("{}: probe", answer.database),
                            format!("skipped: this replica cannot read it ({message}); run streams the other databases and asks this one again with backoff"),
                            "connect to the availability group's primary (its listener), or allow reads on this secondary (SECONDARY_ROLE (ALLOW_CONNECTIONS = ALL))",
                        );
                    }
                    Err(e) => report.fail(
                        format!("{}: probe", answer.database),
                        Chain(&e).to_string(),
                        "grant the login SELECT on the database's cdc schema (db_datareader or the capture instances' gating role)",
                    ),
                }
            }
        }
        Err(e) => report.fail(
            "probe",
            format!(
                "the max LSN of the databases could not be read: {chain}",
                chain = Chain(&e)
            ),
            "check the connection and the login's access to the databases' cdc schema",
        ),
    }
    let unreachable = super::kafka_store_unreachable(config).await;
    let (states, resume) = check_each(
        &mut report,
        config,
        &readable,
        &mut source_for,
        unreachable.as_deref(),
    )
    .await;
    super::check_checkpoint_topic(&mut report, config, unreachable.as_deref()).await;
    check_delivery(&mut report, config, &states, resume).await;
    check_fleet(&mut report, config, matched.len()).await;
    report
}

/// With `fleet.group_id`: the control topic on the brokers, its slots (partitions)
/// and how the matched databases spread over them.
async fn check_fleet(report: &mut Report, config: &Config, databases: usize) {
    if !config.fleet.enabled() {
        return;
    }
    let topic = config.fleet.control_topic();
    let group = config.fleet.group_id.as_deref().unwrap_or_default();
    let connection = match config.sink.kind.kafka_connection(&config.sink.routing) {
        Some(Ok(connection)) => connection,
        _ => {
            report.skip(
                "fleet",
                "no Kafka connection to check it with (see the destination's findings)",
            );
            return;
        }
    };
    let mut client = rdkafka::ClientConfig::new();
    for (key, value) in &connection {
        client.set(key, value);
    }
    for advisory in config.fleet_advisories() {
        report.warn(
            "fleet",
            advisory,
            "see the book's Scaling out: a fleet on Event Hubs",
        );
    }
    match crate::kafka_client::topic_partitions(client, &topic, config.check.timeout).await {
        Ok(Some(partitions)) => report.pass(
            "fleet",
            format!(
                "group {group}: control topic {topic} has {} slots for {databases} databases; members share them as they join",
                partitions.len()
            ),
        ),
        Ok(None) if config.fleet_on_event_hubs() => report.fail(
            "fleet",
            format!("group {group}: the event hub {topic} does not exist, and Event Hubs' Kafka endpoint does not create event hubs"),
            format!(
                "create the event hub {topic} with {} partitions (fleet.slots) before the first member starts",
                config.fleet.slots(true)
            ),
        ),
        Ok(None) => report.pass(
            "fleet",
            format!(
                "group {group}: control topic {topic} does not exist yet; the first member creates it with {} slots (fleet.slots), which needs the right to create topics",
                config.fleet.slots(false)
            ),
        ),
        Err(e) => report.fail(
            "fleet",
            format!("group {group}: the control topic {topic} could not be looked up: {chain}", chain = Chain(&e)),
            "check the sink's brokers and that the login may describe topics",
        ),
    }
}

/// More databases than this: one whose every check passes is one line.
const DATABASES_IN_FULL: usize = 3;

/// Each database's own source and checkpoint findings, named `<db>: …` (with more
/// than [`DATABASES_IN_FULL`] databases, a database that passes every check is one
/// line); every readable database's state, for the topics the destination's checks
/// look at, and the first one's checkpoint.
async fn check_each<S: ChangeSource>(
    report: &mut Report,
    config: &Config,
    matched: &[String],
    source_for: &mut impl FnMut(&Config) -> Result<S, crate::setting::ConfigError>,
    unreachable: Option<&str>,
) -> (Vec<SourceState>, Option<Resume>) {
    let mut states = Vec::new();
    let mut first_resume = None;
    let summarise = matched.len() > DATABASES_IN_FULL;
    for name in matched {
        let own = config.for_database(name);
        let mut database = Report::default();
        let mut source = match source_for(&own) {
            Ok(source) => source,
            Err(e) => {
                report.fail(
                    format!("{name}: configuration"),
                    Chain(&e).to_string(),
                    "correct source.connection_string",
                );
                continue;
            }
        };
        let state = check_source(&mut database, &own, &mut source, "").await;
        let resume = check_checkpoint(
            &mut database,
            &own,
            &mut source,
            state.as_ref(),
            unreachable,
        )
        .await;
        if summarise && database.findings.iter().all(|f| f.status == Status::Pass) {
            let tables = state.as_ref().map_or(0, |s| s.included.len());
            report.pass(
                name.clone(),
                format!(
                    "all {} checks passed; {tables} tables streamed",
                    database.findings.len()
                ),
            );
        } else {
            for mut finding in database.findings {
                finding.check = format!("{name}: {}", finding.check);
                report.findings.push(finding);
            }
        }
        if let Some(state) = state {
            if states.is_empty() {
                first_resume = resume;
            }
            states.push(state);
        }
    }
    (states, first_resume)
}

/// Up to ten names, and how many more.
fn list(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(10).map(String::as_str).collect();
    match names.len().saturating_sub(10) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

//! The checkpoint checks: readable, writable (without a write or the lease), of
//! this database, and still within the cleanup retention.

use super::*;
use crate::error::Chain;
use crate::source::CdcReads;

/// Returns what the checkpoint says of the output file (for the file sink's check),
/// when it could be read. `unreachable`: why the store cannot be asked at all
/// ([`kafka_store_unreachable`](super::destination::kafka_store_unreachable)), so
/// that its checks say so at once.
pub(super) async fn check_checkpoint<S: CdcReads>(
    report: &mut Report,
    config: &Config,
    source: &mut S,
    state: Option<&SourceState>,
    unreachable: Option<&str>,
) -> Option<Resume> {
    if let Some(why) = unreachable {
        let where_ = store_location(config);
        report.skip(
            "checkpoint: readable",
            format!("{where_}: not checked: {why}"),
        );
        report.skip(
            "checkpoint: writable",
            format!("{where_}: not checked: {why}"),
        );
        return None;
    }
    let mut store = match crate::commands::run::checkpoint_store(config) {
        Ok(store) => store,
        Err(e) => {
            report.fail(
                "checkpoint",
                Chain(&e).to_string(),
                "see the setting it names",
            );
            return None;
        }
    };
    let where_ = store_location(config);
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
            Ok(Some(position))
        }
        Ok(None) => {
            report.pass(
                "checkpoint: readable",
                format!(
                    "{where_}: none yet for stream {}; the first run starts at source.start_position ({})",
                    config.checkpoint.stream_name, config.source.start_position
                ),
            );
            Ok(None)
        }
        Err(e) => {
            report.fail(
                "checkpoint: readable",
                Chain(&e).to_string(),
                "the message says what to change (checkpoint.path, checkpoint.stream_name)",
            );
            Err(())
        }
    };
    match check_writable(&mut store, config.check.timeout).await {
        // The Kafka store's topic was found (one partition), but check writes
        // nothing: whether the login may write it only a run shows.
        Ok(()) if config.checkpoint.store == crate::config::CheckpointStoreKind::Kafka => report.skip(
            "checkpoint: writable",
            format!(
                "{where_}: the topic is there with one partition; WRITE on it is not verified, since check writes nothing (a run stops at once, naming it)"
            ),
        ),
        Ok(()) => report.pass("checkpoint: writable", where_.clone()),
        Err(e) => report.fail("checkpoint: writable", Chain(&e).to_string(), writable_fix(config)),
    }
    let resume = position
        .as_ref()
        .ok()
        .map(|p| Resume::from_checkpoint(p.as_ref()));
    let (Ok(Some(position)), Some(state)) = (position, state) else {
        return resume;
    };
    check_identity(report, &position, state, config.event.stream_guid);
    check_retention(report, source, &position, state).await;
    resume
}

pub(super) async fn check_writable(
    store: &mut CheckpointStore,
    timeout: Duration,
) -> Result<(), crate::checkpoint::CheckpointError> {
    tokio::time::timeout(timeout, store.check_writable())
        .await
        .unwrap_or_else(|_| {
            Err(crate::checkpoint::CheckpointError::Io {
                cause: None,
                location: "the checkpoint store".into(),
                reason: format!("no answer within {} s", timeout.as_secs_f64()),
            })
        })
}

pub(super) fn check_identity(
    report: &mut Report,
    position: &Position,
    state: &SourceState,
    configured: Option<uuid::Uuid>,
) {
    // The stream GUID a run would use: the checkpoint's unless configured.
    let stream_guid = SourceIdentity::stream_guid_for(
        position.source.as_deref(),
        configured,
        state.catalog.database_guid,
    );
    let (Some(recorded), Some(stream_guid)) = (&position.source, stream_guid) else {
        report.pass(
            "checkpoint: this database",
            "the checkpoint does not record its database (written by an older version)",
        );
        return;
    };
    let now = SourceIdentity {
        local_database_guid: state.catalog.local_database_guid,
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
pub(super) async fn check_retention<S: CdcReads>(
    report: &mut Report,
    source: &mut S,
    position: &Position,
    state: &SourceState,
) {
    let check = "checkpoint: within retention";
    let oldest = match oldest_needed(source, position, state).await {
        Ok(Some(oldest)) => oldest,
        Ok(None) => {
            report.pass(check, "no table of the checkpoint is still read");
            return;
        }
        Err(Verdict::Lost { detail, fix }) => return report.fail(check, detail, fix),
        Err(Verdict::Unknown(why)) => return report.skip(check, why),
    };
    let max_lsn = match source.max_lsn().await {
        Ok(max) => max.lsn,
        Err(e) => {
            report.skip(
                check,
                format!("cannot read max_lsn: {chain}", chain = Chain(&e)),
            );
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
        Ok(time) => time.map(|t| t.local),
        Err(e) => {
            report.skip(
                check,
                format!(
                    "cannot map the checkpoint's LSN to a time: {chain}",
                    chain = Chain(&e)
                ),
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
    retention_finding(report, check, age_minutes, retention);
}

/// Why the oldest change still needed could not be judged.
enum Verdict {
    /// Changes were purged before delivery: the detail and the fix.
    Lost { detail: String, fix: &'static str },
    /// Not checked, and why.
    Unknown(String),
}

/// The oldest LSN through which an included instance of the checkpoint is complete:
/// the oldest change still to deliver follows it. `None` when the checkpoint holds
/// no instance that is still read.
async fn oldest_needed<S: CdcReads>(
    source: &mut S,
    position: &Position,
    state: &SourceState,
) -> Result<Option<Lsn>, Verdict> {
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
                return Err(Verdict::Lost {
                    detail: format!(
                        "CHANGES LOST: the cleanup job purged {}'s changes from {first_unread} to {last_lost} before they were delivered",
                        instance.name
                    ),
                    fix: "they cannot be read from CDC any more: set source.on_gap = \"skip\" to go on (the loss is logged), or move the checkpoint away to start again from source.start_position",
                });
            }
            Ok(_) => {}
            Err(e) => {
                return Err(Verdict::Unknown(format!(
                    "cannot read the low end of {}: {chain}",
                    instance.name,
                    chain = Chain(&e)
                )));
            }
        }
        oldest_needed = Some(oldest_needed.map_or(through, |o| o.min(through)));
    }
    Ok(oldest_needed)
}

/// How far into the cleanup retention the oldest change still to deliver is.
fn retention_finding(report: &mut Report, check: &str, age_minutes: i64, retention: i64) {
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
pub(super) fn human_minutes(minutes: i64) -> String {
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

/// Where the configured store keeps this stream's checkpoint, for the report.
fn store_location(config: &Config) -> String {
    match config.checkpoint.store {
        crate::config::CheckpointStoreKind::File => config.checkpoint.path.display().to_string(),
        crate::config::CheckpointStoreKind::Table => "table dbo.mssql_ces_checkpoint".to_owned(),
        crate::config::CheckpointStoreKind::Kafka => format!(
            "topic {} key {}",
            config.checkpoint.topic, config.checkpoint.stream_name
        ),
    }
}

/// What to do when the configured store cannot be written.
fn writable_fix(config: &Config) -> &'static str {
    match config.checkpoint.store {
        crate::config::CheckpointStoreKind::File => {
            "make the checkpoint's directory writable by this user, or set checkpoint.path elsewhere"
        }
        crate::config::CheckpointStoreKind::Table => {
            "create dbo.mssql_ces_checkpoint (sql/04_checkpoint_table.sql) and GRANT INSERT, UPDATE on it to the login"
        }
        crate::config::CheckpointStoreKind::Kafka => {
            "check the sink's brokers and the login's right to read and write checkpoint.topic"
        }
    }
}

/// With the Kafka store: whether the checkpoint topic keeps each stream's last
/// position (`checkpoint: kept`). Asked once per configuration, however many
/// databases share the topic, and within `check.timeout_ms` (a broker without
/// DescribeConfigs, such as Event Hubs, never answers it).
pub(super) async fn check_checkpoint_topic(
    report: &mut Report,
    config: &Config,
    unreachable: Option<&str>,
) {
    if config.checkpoint.store != crate::config::CheckpointStoreKind::Kafka {
        return;
    }
    if let Some(why) = unreachable {
        report.skip(
            "checkpoint: kept",
            format!("topic {}: not checked: {why}", config.checkpoint.topic),
        );
        return;
    }
    if let Ok(CheckpointStore::Kafka(kafka)) = crate::commands::run::checkpoint_store(config) {
        retention_of_topic(
            report,
            &kafka,
            &config.checkpoint.topic,
            config.check.timeout,
        )
        .await;
    }
}

/// What the Kafka store's topic does to a quiet stream's record.
async fn retention_of_topic(
    report: &mut Report,
    store: &crate::checkpoint::kafka::KafkaStore,
    topic: &str,
    wait: std::time::Duration,
) {
    use crate::checkpoint::kafka::Retention;
    const CHECK: &str = "checkpoint: kept";
    match store.retention(wait).await {
        Retention::Kept => report.pass(
            CHECK,
            format!("topic {topic} is compacted: each stream's last position stays"),
        ),
        Retention::Deleted { policy, retention } => report.fail(
            CHECK,
            format!(
                "topic {topic} has cleanup.policy={policy} (retention.ms {retention}): a stream quiet longer than that loses its checkpoint and starts again from source.start_position; a run refuses it"
            ),
            format!(
                "kafka-configs.sh --bootstrap-server <brokers> --alter --entity-type topics --entity-name {topic} --add-config cleanup.policy=compact"
            ),
        ),
        Retention::Unknown(why) => report.warn(
            CHECK,
            format!(
                "cannot read topic {topic}'s cleanup.policy ({why}): if it deletes records (Event Hubs keeps events only for its retention period), a quiet stream's checkpoint would expire; a run writes its last position again every 30 minutes"
            ),
            "make sure the topic is compacted, or that its retention is longer than 30 minutes",
        ),
    }
}

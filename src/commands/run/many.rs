//! `source.databases`: the supervisor over SQL Server, each database's read an
//! activation of the single-database run with that database's configuration.

use std::sync::Arc;
use std::time::Duration;

use super::{RunError, run_stream, serve_metrics};
use crate::backoff::Backoff;
use crate::config::{Config, SourceKind};
use crate::databases::fleet::{FleetEvent, Member, MemberSettings};
use crate::databases::{ManySettings, ManyStatus, QUANTUM, StreamRunner, Supervisor};
use crate::metrics::MetricsSet;
use crate::mssql::SqlConnection;
use crate::source::server::{DatabaseServer, SqlServerDatabases};
use crate::source::synthetic::server::SyntheticServer;
use tokio_util::sync::CancellationToken;

/// How long an activation waits for a database's lease that another process holds
/// before it gives its connection back (and is tried again with backoff).
const LEASE_PATIENCE: Duration = Duration::from_secs(5);

pub(super) async fn run(
    config: Config,
    until_idle: bool,
    shutdown: CancellationToken,
    stop_serving: CancellationToken,
) -> Result<(), RunError> {
    let (status_tx, status_rx) = tokio::sync::watch::channel(ManyStatus::default());
    let metrics = Arc::new(MetricsSet::new(config.metrics.stalled_after, status_rx));
    serve_metrics(&config, metrics.clone(), stop_serving).await?;
    if config.source.kind == SourceKind::Synthetic {
        let s = &config.source.synthetic;
        let server = SyntheticServer::new(s.databases, s.transactions);
        tracing::info!(
            databases = s.databases,
            transactions = s.transactions,
            "source: a synthetic server of many databases (generated workloads, not a database)"
        );
        return supervise(server, config, until_idle, shutdown, metrics, status_tx).await;
    }
    let source = config.sql_server()?;
    let (host, _) = source.connection_string.server_and_database();
    let server = SqlServerDatabases::new(SqlConnection::new(source));
    tracing::info!(
        server = host.as_deref().unwrap_or("(none given)"),
        databases = %config.source.databases.join(", "),
        max_connections = config.source.max_connections,
        discovery_interval_ms = config.source.discovery_interval.as_millis() as u64,
        checkpoints = %config.describe_per_database_checkpoint(),
        "source: many databases of one SQL Server"
    );
    supervise(server, config, until_idle, shutdown, metrics, status_tx).await
}

/// The supervisor over `server`, in the fleet when one is configured.
async fn supervise<S: DatabaseServer + 'static>(
    server: S,
    config: Config,
    until_idle: bool,
    shutdown: CancellationToken,
    metrics: Arc<MetricsSet>,
    status: tokio::sync::watch::Sender<ManyStatus>,
) -> Result<(), RunError> {
    let fleet = config.fleet.enabled();
    if fleet && until_idle {
        tracing::warn!(
            "--until-idle is ignored in a fleet: the group decides which databases this member reads, and a member runs until stopped"
        );
    }
    let settings = ManySettings {
        patterns: config.source.databases.clone(),
        discovery_interval: config.source.discovery_interval,
        poll_interval: config.source.poll_interval,
        // One connection is the probe's.
        max_active: config.source.max_connections.saturating_sub(1).max(1),
        quantum: QUANTUM,
        until_idle: until_idle && !fleet,
    };
    let member = if fleet {
        let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
        let Some(member) = join_fleet(&config, events_tx, &shutdown).await? else {
            return Ok(());
        };
        Some((member, events))
    } else {
        None
    };
    let runner = Activation {
        config: Arc::new(config),
        metrics,
    };
    let mut supervisor = Supervisor::new(server, runner, settings).reporting_to(status);
    let member = match member {
        Some((member, events)) => {
            supervisor = supervisor.in_fleet(member.slots(), events);
            Some(member)
        }
        None => None,
    };
    let summary = supervisor.run(shutdown).await;
    // Every database is stopped and checkpointed: the slots can go to the others.
    if let Some(member) = member {
        member.leave().await;
    }
    let summary = summary?;
    tracing::info!(
        reads = summary.activations,
        turns_given_up = summary.yielded,
        failures = summary.failures,
        probes = summary.probes,
        "stopped"
    );
    Ok(())
}

/// Joins the fleet's group, trying again while the brokers do not answer; `None`
/// when stopped meanwhile.
async fn join_fleet(
    config: &Config,
    events: tokio::sync::mpsc::UnboundedSender<FleetEvent>,
    shutdown: &CancellationToken,
) -> Result<Option<Member>, RunError> {
    let connection = match config.sink.kind.kafka_connection(&config.sink.routing) {
        Some(Ok(connection)) => connection,
        Some(Err(e)) => return Err(crate::setting::invalid("sink", e.to_string()).into()),
        None => {
            return Err(crate::setting::invalid(
                "fleet.group_id",
                "the fleet coordinates through a Kafka sink's brokers",
            )
            .into());
        }
    };
    let settings = MemberSettings {
        connection,
        group_id: config.fleet.group_id.clone().unwrap_or_default(),
        topic: config.fleet.control_topic(),
        slots: config.fleet.slots(config.fleet_on_event_hubs()),
        session_timeout: config.fleet.session_timeout,
        protocol: config.fleet.group_protocol,
        release_timeout: config.shutdown.drain_timeout + Duration::from_secs(30),
        timeout: Duration::from_secs(10),
    };
    tracing::info!(
        group = %settings.group_id,
        topic = %settings.topic,
        "joining the fleet: looking up its control topic on the sink's brokers"
    );
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        // A stop does not wait for brokers that do not answer.
        let joined = tokio::select! {
            joined = Member::join(settings.clone(), events.clone()) => joined,
            () = shutdown.cancelled() => return Ok(None),
        };
        match joined {
            Ok(member) => return Ok(Some(member)),
            Err(e) if e.is_transient() => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %crate::error::Chain(&e), retry_in_ms = wait.as_millis() as u64, "cannot join the fleet yet; trying again");
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(None),
                    () = tokio::time::sleep(wait) => {}
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// One database read until caught up, as the single-database run does it.
struct Activation {
    config: Arc<Config>,
    metrics: Arc<MetricsSet>,
}

impl StreamRunner for Activation {
    type Error = RunError;

    async fn run(&self, database: String, stop: CancellationToken) -> Result<(), RunError> {
        let config = self.config.for_database(&database);
        let metrics = self.metrics.database(&database);
        run_stream(config, true, stop, &metrics, Some(LEASE_PATIENCE))
            .await
            .map(|_| ())
    }
}

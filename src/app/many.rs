//! `source.databases`: the supervisor over SQL Server, each database's read an
//! activation of the single-database run with that database's configuration.

use std::sync::Arc;
use std::time::Duration;

use super::{RunError, run_stream, serve_metrics};
use crate::config::Config;
use crate::databases::{ManySettings, ManyStatus, QUANTUM, StreamRunner, Supervisor};
use crate::metrics::MetricsSet;
use crate::mssql::SqlConnection;
use crate::source::server::SqlServerDatabases;
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
    let source = config.sql_server()?;
    let (host, _) = source.connection_string.server_and_database();
    let server = SqlServerDatabases::new(SqlConnection::new(source));
    let (status_tx, status_rx) = tokio::sync::watch::channel(ManyStatus::default());
    let metrics = Arc::new(MetricsSet::new(config.metrics.stalled_after, status_rx));
    serve_metrics(&config, metrics.clone(), stop_serving).await?;
    tracing::info!(
        server = host.as_deref().unwrap_or("(none given)"),
        databases = %config.source.databases.join(", "),
        max_connections = config.source.max_connections,
        discovery_interval_ms = config.source.discovery_interval.as_millis() as u64,
        checkpoints = %config.describe_per_database_checkpoint(),
        "source: many databases of one SQL Server"
    );
    let settings = ManySettings {
        patterns: config.source.databases.clone(),
        discovery_interval: config.source.discovery_interval,
        poll_interval: config.source.poll_interval,
        // One connection is the probe's.
        max_active: config.source.max_connections.saturating_sub(1).max(1),
        quantum: QUANTUM,
        until_idle,
    };
    let runner = Activation {
        config: Arc::new(config),
        metrics,
    };
    let summary = Supervisor::new(server, runner, settings)
        .reporting_to(status_tx)
        .run(shutdown)
        .await?;
    tracing::info!(
        reads = summary.activations,
        turns_given_up = summary.yielded,
        failures = summary.failures,
        probes = summary.probes,
        "stopped"
    );
    Ok(())
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

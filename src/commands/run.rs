//! One run of the daemon, from a loaded configuration to a stopped pipeline: take the
//! stream's lease (waiting as a hot standby), read the checkpoint, open the source and
//! the sink, and run the pipeline until the source is idle (with `until_idle`) or
//! `shutdown` is cancelled. The binary adds only the command line, logging and
//! signals.

use crate::checkpoint::{CheckpointError, CheckpointStore, file::FileStore, table::TableStore};
use crate::config::{CheckpointStoreKind, Config, SourceKind};
use crate::event::EncoderOptions;
use crate::metrics::{Metrics, MetricsError};
use crate::pipeline::{self, PipelineError, PipelineSettings, RunSummary};
use crate::position::Position;
use crate::setting::ConfigError;
use crate::sink::SinkConfig;
use crate::sink::stream::Resume;
use crate::sink::{Router, SinkError, SinkHealth};
use crate::source::ChangeSource;
use crate::source::initial_load::SnapshotMode;
use crate::source::poller::{ChunkReader, CleanupMode, Poller, StartPosition};
use crate::source::sqlserver::SqlServerSource;
use crate::source::synthetic::{SyntheticConfig, SyntheticSource};
use tokio_util::sync::CancellationToken;

mod many;

/// Why a run stopped with a failure.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Its message begins with "checkpoint" already.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Many(#[from] crate::databases::ManyError),
    #[error(transparent)]
    Fleet(#[from] crate::databases::fleet::FleetError),
    /// One of many databases: another process holds its lease.
    #[error(
        "another process holds this database's lease (checkpoint {checkpoint}); it is tried again later"
    )]
    LeaseHeld { checkpoint: String },
}

impl RunError {
    /// True when a setting is at fault (the error names it): the run exits with
    /// code 2, as for an invalid configuration file.
    pub fn is_configuration(&self) -> bool {
        match self {
            RunError::Config(_) => true,
            RunError::Pipeline(PipelineError::Source(e))
            | RunError::Many(crate::databases::ManyError::Discovery(e)) => e.is_configuration(),
            _ => false,
        }
    }

    /// The sink's error, when the run stopped on one (to say whether a restart can
    /// help).
    pub fn sink_error(&self) -> Option<&SinkError> {
        match self {
            RunError::Sink(e) | RunError::Pipeline(PipelineError::Sink(e)) => Some(e),
            _ => None,
        }
    }
}

/// Runs the configured stream (or, with `source.databases`, every database's).
/// `Ok(None)` when stopped while waiting for the lease, and after many databases.
pub async fn run(
    config: Config,
    until_idle: bool,
    shutdown: CancellationToken,
) -> Result<Option<RunSummary>, RunError> {
    // Served for the whole run, the wait for the lease included.
    let stop_serving = CancellationToken::new();
    let _stop_serving = stop_serving.clone().drop_guard();
    if config.many_databases() {
        many::run(config, until_idle, shutdown, stop_serving).await?;
        return Ok(None);
    }
    let metrics = std::sync::Arc::new(Metrics::new(config.metrics.stalled_after));
    serve_metrics(&config, metrics.clone(), stop_serving).await?;
    let mut rebuilds = Rebuilds::default();
    loop {
        let ran = run_stream(config.clone(), until_idle, shutdown.clone(), &metrics, None).await;
        match ran {
            Err(e)
                if matches!(e.sink_error(), Some(SinkError::ProducerLost { .. }))
                    && rebuilds.allowed() =>
            {
                tracing::warn!(
                    error = %crate::error::Chain(&e),
                    rebuilds = rebuilds.recent.len(),
                    "the Kafka producer lost its state: a new one resumes from the checkpoint"
                );
                tokio::select! {
                    () = tokio::time::sleep(REBUILD_PAUSE) => {}
                    () = shutdown.cancelled() => return Ok(None),
                }
            }
            other => return other,
        }
    }
}

/// How many times within [`REBUILD_WINDOW`] a producer that lost its state is
/// replaced before the run fails: a cause that returns at once (a broker that keeps
/// forgetting producer ids) is reported rather than hidden.
const MAX_REBUILDS: usize = 3;
const REBUILD_WINDOW: std::time::Duration = std::time::Duration::from_secs(10 * 60);
/// The pause before a new producer, so that the broker's state can settle.
const REBUILD_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// The recent replacements of a producer that lost its state.
#[derive(Default)]
struct Rebuilds {
    recent: Vec<tokio::time::Instant>,
}

impl Rebuilds {
    /// Whether one more is allowed now (and counts it).
    fn allowed(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        self.recent
            .retain(|at| now.duration_since(*at) < REBUILD_WINDOW);
        if self.recent.len() >= MAX_REBUILDS {
            return false;
        }
        self.recent.push(now);
        true
    }
}

/// Runs one stream with these metrics. With `lease_patience`, a lease another
/// process holds is waited for that long only, then [`RunError::LeaseHeld`].
async fn run_stream(
    config: Config,
    until_idle: bool,
    shutdown: CancellationToken,
    metrics: &std::sync::Arc<Metrics>,
    lease_patience: Option<std::time::Duration>,
) -> Result<Option<RunSummary>, RunError> {
    let poller_config = config.poller()?;
    let mut store = checkpoint_store(&config)?;
    if !take_stream(&config, &mut store, &shutdown, metrics, lease_patience).await? {
        return Ok(None);
    }
    let health = SinkHealth::new(config.metrics.listen.is_some());
    metrics.watch_sink(std::sync::Arc::clone(&health));
    let opened = match open_before_reading(&config, &mut store, &health, &shutdown).await? {
        EarlySink::Stopped => return Ok(None),
        EarlySink::Opened(built) => Some(*built),
        EarlySink::NotNeeded => None,
    };
    let position = store.load().await?;
    log_start(&config, position.as_ref());
    let resumed_at = position.as_ref().and_then(|p| p.last_event);
    let resume = Resume::from_checkpoint(position.as_ref());
    let destination = Destination {
        store,
        opened,
        health,
    };
    let summary = match config.source.kind {
        SourceKind::Synthetic if config.source.synthetic.transaction_rows > 0 => {
            let poller = Poller::new(bulk_source(&config), poller_config, position);
            drive(
                &config,
                poller,
                destination,
                shutdown,
                until_idle,
                resume,
                metrics,
            )
            .await?
        }
        SourceKind::Synthetic => {
            let mut source = synthetic_source(&config);
            if let Some(position) = &position {
                source.resume_from(position);
            }
            let poller = Poller::new(source, poller_config, position);
            drive(
                &config,
                poller,
                destination,
                shutdown,
                until_idle,
                resume,
                metrics,
            )
            .await?
        }
        SourceKind::Sqlserver => {
            let settings = config.sql_server()?;
            let (server, database) = settings.connection_string.server_and_database();
            tracing::info!(
                server = server.as_deref().unwrap_or("(none given)"),
                database = database.as_deref().unwrap_or("(the login's default)"),
                "source: SQL Server"
            );
            let first_row_timeout = config.snapshot.first_row_timeout;
            let readers = config.snapshot.max_connections > 1;
            let reader_settings = readers.then(|| settings.clone());
            let source = SqlServerSource::new(settings).with_first_row_timeout(first_row_timeout);
            let mut poller = Poller::new(source, poller_config, position);
            if let Some(settings) = reader_settings {
                // Each a connection of its own, opened when the load reads ahead.
                poller.read_loads_with(std::sync::Arc::new(move || {
                    Box::new(
                        SqlServerSource::new(settings.clone())
                            .with_first_row_timeout(first_row_timeout),
                    ) as Box<dyn ChunkReader>
                }));
            }
            if config.source.cleanup == CleanupMode::AfterDelivery {
                // A reader of the same store, for the other streams' positions.
                poller.read_peers_from(checkpoint_store(&config)?);
            }
            drive(
                &config,
                poller,
                destination,
                shutdown,
                until_idle,
                resume,
                metrics,
            )
            .await?
        }
    };
    log_stopped(&summary, resumed_at);
    Ok(Some(summary))
}

/// Becomes the stream's one writer before its checkpoint is read: waits as a hot
/// standby while another process holds the lease (with `lease_patience`, that long
/// only: then [`RunError::LeaseHeld`]), and with exactly-once fences the stream's
/// earlier producers. `false` when stopped meanwhile.
async fn take_stream(
    config: &Config,
    store: &mut CheckpointStore,
    shutdown: &CancellationToken,
    metrics: &std::sync::Arc<Metrics>,
    lease_patience: Option<std::time::Duration>,
) -> Result<bool, RunError> {
    // One writer per stream: wait here as a hot standby while another process holds
    // the lease, and read the checkpoint only once this one does.
    metrics.set_standby(true);
    let waiting = shutdown.child_token();
    if let Some(patience) = lease_patience {
        let waiting = waiting.clone();
        tokio::spawn(async move {
            tokio::time::sleep(patience).await;
            waiting.cancel();
        });
    }
    if !store.acquire_lease(&waiting).await? {
        if !shutdown.is_cancelled() && lease_patience.is_some() {
            return Err(RunError::LeaseHeld {
                checkpoint: config.checkpoint.stream_name.clone(),
            });
        }
        tracing::info!("stopped while waiting for the lease");
        return Ok(false);
    }
    metrics.set_standby(false);
    Ok(true)
}

/// Where a stream's events and positions go: its checkpoint store, and with
/// `sink.exactly_once` the sink [opened before the position was
/// read](open_before_reading).
struct Destination {
    store: CheckpointStore,
    opened: Option<crate::sink::BuiltSink>,
    health: std::sync::Arc<SinkHealth>,
}

/// What [`open_before_reading`] did.
enum EarlySink {
    /// Not exactly-once: the sink is opened once the position is known.
    NotNeeded,
    /// The exactly-once sink, its transactional id taken.
    Opened(Box<crate::sink::BuiltSink>),
    /// Stopped while opening.
    Stopped,
}

/// With `sink.exactly_once`: opens the sink before the stream's position is read.
/// Its producer takes the transactional id, which fences every earlier producer of
/// the stream (and aborts what it left open), and it is the one that commits from
/// then on: a process that starts on the stream after this cannot commit before
/// this one reads, and one that started before has been fenced. (A producer that
/// only fenced, with another one committing, would leave a window between the two
/// in which a successor's commit goes unseen; Kafka Connect fences and commits
/// with one producer for the same reason.)
async fn open_before_reading(
    config: &Config,
    store: &mut CheckpointStore,
    health: &std::sync::Arc<SinkHealth>,
    shutdown: &CancellationToken,
) -> Result<EarlySink, RunError> {
    if !exactly_once_on(config) {
        return Ok(EarlySink::NotNeeded);
    }
    let sink_kind = exactly_once(config, store).await?;
    // The Kafka sink ignores where a file would resume.
    let build = sink_kind.build(
        &config.sink.routing,
        &config.event,
        Resume::Fresh,
        std::sync::Arc::clone(health),
    );
    // A stop (a revoked slot, a quantum, a signal) does not wait for the fence.
    tokio::select! {
        built = build => Ok(EarlySink::Opened(Box::new(built?))),
        () = shutdown.cancelled() => {
            tracing::info!("stopped while fencing the stream's earlier producers");
            Ok(EarlySink::Stopped)
        }
    }
}

/// Where the run starts, and what it reads.
fn log_start(config: &Config, position: Option<&Position>) {
    match position {
        Some(p) => tracing::info!(
            last_event = %p.last_event.map_or_else(|| "none".to_owned(), |e| e.to_string()),
            "resuming from the checkpoint"
        ),
        None => tracing::info!(start_position = %config.source.start_position, "no checkpoint"),
    }
    let mode = config.snapshot.mode;
    match position {
        Some(p) if mode.loads() && !p.is_start() && p.loads.is_empty() => tracing::warn!(
            snapshot_mode = %mode,
            "no initial load: the checkpoint shows this stream past its start, and a load runs only when a stream starts; to load the tables again, start a new stream with its own checkpoint (checkpoint.path, or checkpoint.stream_name)"
        ),
        Some(p) if mode.loads() && !p.loads.is_empty() => tracing::info!(
            tables = p.loads.len(),
            "resuming the initial load where the checkpoint left it"
        ),
        _ => {}
    }
    let s = &config.source.synthetic;
    match config.source.kind {
        SourceKind::Synthetic if s.transaction_rows > 0 => tracing::info!(
            transaction_rows = s.transaction_rows,
            "source: synthetic large transactions (generated as read, not a database)"
        ),
        SourceKind::Synthetic => tracing::info!(
            seed = s.seed,
            // Absent: endless, and unpaced.
            transactions = (s.transactions > 0).then_some(s.transactions),
            rate_per_second = (s.rate_per_second > 0.0).then_some(s.rate_per_second),
            "source: the synthetic workload (generated changes, not a database)"
        ),
        // Said where its settings are read (`run`), without reading the secret twice.
        SourceKind::Sqlserver => {}
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` when `[metrics] listen` is set, until
/// `stop`.
async fn serve_metrics(
    config: &Config,
    metrics: std::sync::Arc<dyn crate::metrics::Observed>,
    stop: CancellationToken,
) -> Result<(), RunError> {
    let Some(address) = config.metrics.listen_address()? else {
        return Ok(());
    };
    let listener = crate::metrics::bind(address).await?;
    let local = listener
        .local_addr()
        .map_or_else(|_| address.to_string(), |a| a.to_string());
    let admin = config.metrics.admin;
    if admin == crate::config::AdminAccess::Off {
        tracing::info!(listen = %local, "serving /metrics, /healthz and /readyz (metrics.listen)");
    } else {
        tracing::info!(listen = %local, admin = ?admin, "serving /metrics, /healthz, /readyz and POST /snapshot/<schema.table> (metrics.listen, metrics.admin)");
    }
    tokio::spawn(async move {
        if let Err(e) = crate::metrics::serve(listener, metrics, admin, stop).await {
            tracing::warn!(error = %crate::error::Chain(&e), "the metrics server stopped");
        }
    });
    Ok(())
}

/// The run's last line: what it delivered, what it left undelivered (sent again on
/// the next start) and the checkpoint it stopped at: the one it wrote last, else the
/// one it resumed from.
fn log_stopped(summary: &RunSummary, resumed_at: Option<crate::position::EventPosition>) {
    let checkpoint = match &summary.checkpoint {
        Some(p) => p.last_event,
        None => resumed_at,
    };
    tracing::info!(
        events = summary.delivered_events,
        messages = summary.delivered_messages,
        undelivered_events = summary.events.saturating_sub(summary.delivered_events),
        sent_bytes = summary.bytes,
        truncated_values = summary.truncated_values,
        checkpoint = %checkpoint.map_or_else(|| "none".to_owned(), |e| e.to_string()),
        unfinished_load = summary.checkpoint.as_ref().filter(|p| !p.loads.is_empty()).map(|p| {
            p.loads
                .values()
                .map(|l| format!("{} after {} rows", l.table, l.rows))
                .collect::<Vec<_>>()
                .join(", ")
        }),
        "stopped"
    );
}

/// The configured checkpoint store (not yet leased or read).
pub fn checkpoint_store(config: &Config) -> Result<CheckpointStore, ConfigError> {
    Ok(match config.checkpoint.store {
        CheckpointStoreKind::File => CheckpointStore::File(FileStore::new(
            &config.checkpoint.path,
            &config.checkpoint.stream_name,
        )),
        CheckpointStoreKind::Table => CheckpointStore::Table(Box::new(TableStore::new(
            config.checkpoint_sql_server()?,
            &config.checkpoint.stream_name,
        ))),
        CheckpointStoreKind::Kafka => {
            let connection = match config.sink.kind.kafka_connection(&config.sink.routing) {
                Some(Ok(connection)) => connection,
                Some(Err(e)) => {
                    return Err(crate::setting::invalid(
                        "sink",
                        crate::error::Chain(&e).to_string(),
                    ));
                }
                None => {
                    return Err(crate::setting::invalid(
                        "checkpoint.store",
                        "\"kafka\" needs a Kafka sink",
                    ));
                }
            };
            let delivery_timeout = config
                .sink
                .kind
                .delivery_timeout()
                .unwrap_or(std::time::Duration::from_secs(30));
            // A transaction of a stream that shares the topic stays open at most its
            // transaction.timeout.ms (the delivery time-out and 5 s, as this one's),
            // and the broker aborts timed-out ones every 10 s by default.
            let open_transaction_wait = delivery_timeout + std::time::Duration::from_secs(20);
            CheckpointStore::Kafka(Box::new(
                crate::checkpoint::kafka::KafkaStore::new(
                    connection,
                    &config.checkpoint.topic,
                    &config.checkpoint.stream_name,
                    delivery_timeout.min(std::time::Duration::from_secs(30)),
                )
                .with_open_transaction_wait(open_transaction_wait),
            ))
        }
    })
}

/// The synthetic workload of `[source.synthetic]`.
pub fn synthetic_source(config: &Config) -> SyntheticSource {
    let s = &config.source.synthetic;
    let mut source = SyntheticSource::new(SyntheticConfig {
        seed: s.seed,
        transactions: (s.transactions > 0).then_some(s.transactions),
        rate_per_second: (s.rate_per_second > 0.0).then_some(s.rate_per_second),
        large_value_every: s.large_value_every,
        existing_rows: s.existing_rows,
        oversized_value_every: s.oversized_value_every,
    });
    // One of a synthetic server's databases (`source.databases`).
    if let Some(database) = &config.source.database {
        source.rename_database(database);
    }
    source
}

/// The large-transaction workload of `[source.synthetic] transaction_rows`.
pub fn bulk_source(config: &Config) -> crate::source::synthetic::bulk::BulkSource {
    let s = &config.source.synthetic;
    let transactions = if s.transactions == 0 {
        u64::MAX
    } else {
        s.transactions
    };
    crate::source::synthetic::bulk::BulkSource::new(s.seed, transactions, s.transaction_rows)
}

async fn drive<S: ChangeSource + 'static>(
    config: &Config,
    mut poller: Poller<S>,
    destination: Destination,
    shutdown: CancellationToken,
    until_idle: bool,
    resume: Resume,
    metrics: &std::sync::Arc<Metrics>,
) -> Result<RunSummary, RunError> {
    let Destination {
        mut store,
        opened,
        health,
    } = destination;
    let fresh = resume == Resume::Fresh;
    let mut built = match opened {
        Some(built) => built,
        None => {
            // Opening may wait for an unreachable destination (up to the delivery
            // timeout): a shutdown ends that wait.
            let build = config
                .sink
                .kind
                .build(&config.sink.routing, &config.event, resume, health);
            tokio::select! {
                built = build => built?,
                () = shutdown.cancelled() => {
                    tracing::info!("stopped while opening the destination");
                    return Ok(RunSummary::default());
                }
            }
        }
    };
    log_destination(config, &built.topic);
    if !save_first_position(
        config,
        &mut poller,
        &mut store,
        &mut built.sink,
        &shutdown,
        fresh,
    )
    .await?
    {
        return Ok(RunSummary::default());
    }
    if let (CheckpointStore::Kafka(s), true) = (&mut store, exactly_once_on(config)) {
        s.hand_over_writes();
    }
    let event = config.event.clone();
    let routing = &config.sink.routing;
    let debezium = config.event.format == crate::event::settings::EventFormat::Debezium;
    let topic = match &routing.topic {
        None if debezium => config.event.debezium.topic_template(),
        _ => built.topic,
    };
    let router = Router::new(
        topic,
        routing.partition_key,
        routing.partition_key_column.clone(),
        routing.mode,
        event.encoding,
        config.checkpoint.stream_name.clone(),
    )
    .with_schema_changes(
        routing.schema_changes,
        match &routing.schema_topic {
            // Debezium's schema change topic is the topic prefix.
            None if debezium => config.event.debezium.topic_prefix.clone(),
            _ => routing.schema_topic(),
        },
    );
    let router = router.with_heartbeat(routing.heartbeat_interval, routing.heartbeat_topic());
    let router = router.with_registry(
        routing.schema_registry.clone(),
        config
            .sink
            .kind
            .delivery_timeout()
            .unwrap_or(std::time::Duration::from_secs(120)),
    );
    let router = if debezium {
        router.with_debezium(crate::sink::DebeziumRouting {
            settings: std::sync::Arc::new(config.event.debezium.clone()),
            open: poller.position().open_transaction.clone(),
            bound: config.sink.kind.record_bound(),
        })
    } else {
        router
    };
    let factory = Box::new(move |database_guid: uuid::Uuid| {
        let stream_guid = event.stream_guid.unwrap_or(database_guid);
        tracing::info!(%stream_guid, "stream GUID (event.stream_guid, default the database GUID)");
        EncoderOptions {
            stream_guid,
            encoding: event.encoding,
            final_event: event.final_event,
            max_message_size: event.max_message_size_kb,
        }
    });
    let settings = PipelineSettings {
        poll_interval: config.source.poll_interval,
        checkpoint_interval: config.checkpoint.interval,
        drain_timeout: config.shutdown.drain_timeout,
        // The delivery timeout, and the time a Kafka message's failure takes to say
        // why it stalled.
        idle_drain_timeout: config
            .sink
            .kind
            .delivery_timeout()
            .map_or(config.shutdown.drain_timeout, |timeout| {
                timeout + crate::sink::kafka::DIAGNOSIS_WITHIN
            }),
        // initial_only: the run ends once the load is delivered.
        until_idle: until_idle || config.snapshot.mode == SnapshotMode::InitialOnly,
        metrics: std::sync::Arc::clone(metrics),
    };
    Ok(pipeline::run(
        poller, factory, router, built.sink, store, settings, shutdown,
    )
    .await?)
}

/// `sink.transactional_id`, or `mssql-ces.<stream name>`.
pub(crate) fn transactional_id(
    k: &crate::sink::kafka::KafkaSinkConfig,
    stream_name: &str,
) -> String {
    k.transactional_id
        .clone()
        .unwrap_or_else(|| format!("mssql-ces.{stream_name}"))
}

/// Whether `sink.exactly_once` is on.
fn exactly_once_on(config: &Config) -> bool {
    matches!(&config.sink.kind, SinkConfig::Kafka(k) if k.exactly_once)
}

/// The sink's configuration, with `sink.exactly_once` tied to the stream: its
/// transactional id and where its positions go (the topic made ready first, so
/// that the transactions never auto-create it uncompacted).
async fn exactly_once(
    config: &Config,
    store: &mut CheckpointStore,
) -> Result<SinkConfig, RunError> {
    let mut kind = config.sink.kind.clone();
    if let (SinkConfig::Kafka(k), CheckpointStore::Kafka(s)) = (&mut kind, store)
        && k.exactly_once
    {
        s.prepare().await?;
        let stream_name = config.checkpoint.stream_name.clone();
        let id = transactional_id(k, &stream_name);
        tracing::info!(transactional_id = %id, checkpoint_topic = %config.checkpoint.topic, "exactly-once: each batch and its position in one Kafka transaction");
        k.transaction = Some(crate::sink::kafka::TransactionSettings {
            id,
            checkpoint_topic: config.checkpoint.topic.clone(),
            stream_name,
            bound: crate::sink::kafka::TransactionBound {
                max_open: k.transaction_max,
                max_bytes: k.transaction_max_bytes,
            },
        });
    }
    Ok(kind)
}

/// Where events go, as the configuration spells it, and in which format.
fn log_destination(config: &Config, topic: &str) {
    let what = match config.event.format {
        crate::event::settings::EventFormat::Ces => "writing CES events",
        crate::event::settings::EventFormat::Debezium => "writing Debezium records",
    };
    tracing::info!(
        destination = %config.sink.kind.describe(),
        // A topic only where there are topics.
        topic = (!matches!(config.sink.kind, SinkConfig::Stdout(_) | SinkConfig::File(_)))
            .then_some(topic),
        partition_key = %config.sink.routing.partition_key,
        mode = %config.sink.routing.mode,
        encoding = %config.event.encoding,
        "{what}"
    );
}

/// A first run's checkpoint, saved before anything is read: a planned load (its LSN,
/// so that a restart resumes this load with the same message ids), a settled
/// "latest", or for a file sink at "earliest" the empty file's length. False when
/// stopped meanwhile.
async fn save_first_position<S: ChangeSource>(
    config: &Config,
    poller: &mut Poller<S>,
    store: &mut CheckpointStore,
    sink: &mut crate::sink::Sink,
    shutdown: &CancellationToken,
    fresh: bool,
) -> Result<bool, RunError> {
    let fresh_file = matches!(config.sink.kind, SinkConfig::File(_)) && fresh;
    let first = if poller.needs_plan() {
        if first_step(poller, shutdown, FirstStep::PlanLoad).await? != Some(true) {
            return Ok(false);
        }
        Some(poller.position().clone())
    } else if fresh
        && match first_step(poller, shutdown, FirstStep::ResolveStart).await? {
            None => return Ok(false),
            Some(settled) => settled,
        }
    {
        // A restart before the first delivery starts at the same place: nothing
        // between two "latest"s is skipped.
        Some(poller.position().clone())
    } else if fresh_file && config.source.start_position == StartPosition::Earliest {
        // A crash before the first real checkpoint finds one that says the file was
        // empty.
        Some(Position::default())
    } else {
        None
    };
    if let Some(mut position) = first {
        if fresh_file {
            position.sink_length = Some(0);
        }
        if exactly_once_on(config) {
            // Through the fenced producer, in a transaction of its own (with no
            // events): a zombie's write outside a transaction could not be fenced.
            sink.end_batch(&position).await?;
        } else {
            store.save(&position).await?;
        }
    }
    Ok(true)
}

/// What a first run settles before reading: the initial load's plan, or where
/// "latest" is.
#[derive(Debug, Clone, Copy)]
enum FirstStep {
    PlanLoad,
    ResolveStart,
}

/// Plans the initial load (see [`Poller::plan_load`]) or settles a first run's start
/// (see [`Poller::resolve_start`]), retrying what can pass (a pending capture
/// instance, a dropped connection) with backoff. The step's answer; `None` when
/// stopped meanwhile.
async fn first_step<S: ChangeSource>(
    poller: &mut Poller<S>,
    shutdown: &CancellationToken,
    step: FirstStep,
) -> Result<Option<bool>, RunError> {
    let mut backoff = crate::backoff::Backoff::new(
        std::time::Duration::from_millis(500),
        std::time::Duration::from_secs(30),
    );
    loop {
        let wait = backoff.next_wait();
        // `None`: not yet (a capture instance without its start_lsn), ask again.
        let answer = match step {
            FirstStep::PlanLoad => poller
                .plan_load()
                .await
                .map(|planned| planned.then_some(true)),
            FirstStep::ResolveStart => poller.resolve_start().await.map(Some),
        };
        match answer {
            Ok(Some(done)) => return Ok(Some(done)),
            Ok(None) => {}
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %crate::error::Chain(&e), retry_in_ms = wait.as_millis() as u64, step = ?step, "a first run's first step failed; retrying");
            }
            Err(e) => return Err(RunError::Pipeline(PipelineError::Source(e))),
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            () = tokio::time::sleep(wait) => {}
        }
    }
}

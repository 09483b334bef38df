//! The `mssql-ces` command line.
//!
//! Exit codes: 0 success (including a signalled shutdown), 1 a run that failed, 2 a
//! configuration error (reported before any connection), 130 a second signal.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use mssql_ces::checkpoint::{CheckpointStore, file::FileStore, table::TableStore};
use mssql_ces::config::{
    CheckpointStoreKind, Config, EntraCredentialKind, SinkKind, SourceKind, parse_override_value,
};
use mssql_ces::event::EncoderOptions;
use mssql_ces::pipeline::{self, PipelineSettings};
use mssql_ces::sink::event_hubs_amqp::outcome::OutcomeLayer;
use mssql_ces::sink::event_hubs_amqp::{EventHubsAmqpSink, EventHubsCredential};
use mssql_ces::sink::kafka::{KafkaSettings, KafkaSink, parse_event_hubs_connection_string};
use mssql_ces::sink::stream::{Resume, StreamSink};
use mssql_ces::sink::{Router, Sink};
use mssql_ces::source::ChangeSource;
use mssql_ces::source::poller::{Poller, Position, StartPosition};
use mssql_ces::source::sim::synthetic::{SyntheticConfig, SyntheticSource};
use mssql_ces::source::sqlserver::{ConnectionString, SqlServerConfig, SqlServerSource};
use tokio_util::sync::CancellationToken;

/// SQL Server CDC to Change Event Streaming (CES) events, delivered to Kafka or Azure
/// Event Hubs.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Poll CDC and deliver events until stopped (SIGINT/SIGTERM).
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The TOML configuration file.
    #[arg(long, short)]
    config: PathBuf,
    /// Overrides `sink.topic`.
    #[arg(long)]
    topic: Option<String>,
    /// Overrides `sink.bootstrap_servers`.
    #[arg(long)]
    bootstrap_servers: Option<String>,
    /// Overrides `checkpoint.path`.
    #[arg(long)]
    checkpoint_path: Option<PathBuf>,
    /// Overrides `event.encoding` (`json` or `avro`).
    #[arg(long)]
    encoding: Option<String>,
    /// Overrides any setting: `--set section.key=value` (value read as TOML, else text).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Exit once the source has nothing new and everything is delivered.
    #[arg(long)]
    until_idle: bool,
}

fn main() -> ExitCode {
    use std::io::IsTerminal as _;
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter(filter),
        )
        // Reads Event Hubs' send outcomes whatever the log level.
        .with(
            OutcomeLayer::new().with_filter(
                tracing_subscriber::filter::filter_fn(OutcomeLayer::wants)
                    .with_max_level_hint(tracing::level_filters::LevelFilter::WARN),
            ),
        )
        .init();
    let cli = Cli::parse();
    let Command::Run(args) = cli.command;
    let config = match load_config(&args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(config, args.until_idle));
    // A blocking call still running (a metadata request to a broker that is down)
    // must not hold the exit past the drain timeout.
    runtime.shutdown_timeout(Duration::from_millis(500));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn load_config(args: &RunArgs) -> anyhow::Result<Config> {
    let mut overrides = Vec::new();
    let text = |v: &str| toml::Value::String(v.to_owned());
    if let Some(topic) = &args.topic {
        overrides.push(("sink.topic".to_owned(), text(topic)));
    }
    if let Some(servers) = &args.bootstrap_servers {
        overrides.push(("sink.bootstrap_servers".to_owned(), text(servers)));
    }
    if let Some(path) = &args.checkpoint_path {
        overrides.push(("checkpoint.path".to_owned(), text(&path.to_string_lossy())));
    }
    if let Some(encoding) = &args.encoding {
        overrides.push(("event.encoding".to_owned(), text(encoding)));
    }
    for item in &args.set {
        let (key, value) = item
            .split_once('=')
            .with_context(|| format!("--set {item}: expected KEY=VALUE"))?;
        overrides.push((key.trim().to_owned(), parse_override_value(value)));
    }
    let config = Config::load(&args.config, &overrides)?;
    config.check_secrets()?;
    Ok(config)
}

/// One shutdown trigger: the first SIGINT/SIGTERM cancels the token (graceful); a
/// second exits at once (the next start still loses nothing).
fn install_signals(token: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let mut seen = 0;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            seen += 1;
            if seen == 1 {
                tracing::info!(
                    "shutting down: finishing deliveries and writing the checkpoint (signal again to exit at once)"
                );
                token.cancel();
            } else {
                tracing::warn!("second signal: exiting now");
                std::process::exit(130);
            }
        }
    });
    Ok(())
}

async fn run(config: Config, until_idle: bool) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    install_signals(shutdown.clone())?;
    let poller_config = config.poller()?;
    let mut store = match config.checkpoint.store {
        CheckpointStoreKind::File => CheckpointStore::File(FileStore::new(
            &config.checkpoint.path,
            &config.checkpoint.stream_name,
        )),
        CheckpointStoreKind::Table => CheckpointStore::Table(Box::new(TableStore::new(
            sql_server_settings(&config)?,
            &config.checkpoint.stream_name,
        ))),
    };
    // One writer per stream: wait here as a hot standby while another process holds
    // the lease, and read the checkpoint only once this one does.
    if !store.acquire_lease(&shutdown).await? {
        tracing::info!("stopped while waiting for the lease");
        return Ok(());
    }
    let position = store.load().await?;
    match &position {
        Some(p) => tracing::info!(last_event = ?p.last_event, "resuming from the checkpoint"),
        None => tracing::info!(start_position = ?config.source.start_position, "no checkpoint"),
    }
    let resume = match &position {
        None => Resume::Fresh,
        Some(p) => p.sink_length.map_or(Resume::Unknown, Resume::At),
    };
    match config.source.kind {
        SourceKind::Synthetic => {
            let s = &config.source.synthetic;
            tracing::info!(
                seed = s.seed,
                "source: the synthetic workload (generated changes, not a database)"
            );
            let source = SyntheticSource::new(SyntheticConfig {
                seed: s.seed,
                transactions: (s.transactions > 0).then_some(s.transactions),
                rate_per_second: (s.rate_per_second > 0.0).then_some(s.rate_per_second),
                large_value_every: s.large_value_every,
            });
            drive(
                config,
                Poller::new(source, poller_config, position),
                store,
                shutdown,
                until_idle,
                resume,
            )
            .await
        }
        SourceKind::Sqlserver => {
            let source = SqlServerSource::new(sql_server_settings(&config)?);
            drive(
                config,
                Poller::new(source, poller_config, position),
                store,
                shutdown,
                until_idle,
                resume,
            )
            .await
        }
    }
}

fn sql_server_settings(config: &Config) -> anyhow::Result<SqlServerConfig> {
    let secret = config
        .source
        .connection_string
        .resolve("source.connection_string")?;
    Ok(SqlServerConfig {
        connection_string: ConnectionString::new(secret),
        trust_server_certificate: config.source.trust_server_certificate,
        encrypt: config.source.encrypt,
        connect_timeout: Duration::from_millis(config.source.connect_timeout_ms),
        query_timeout: Duration::from_millis(config.source.query_timeout_ms),
    })
}

async fn drive<S: ChangeSource + 'static>(
    config: Config,
    poller: Poller<S>,
    mut store: CheckpointStore,
    shutdown: CancellationToken,
    until_idle: bool,
    resume: Resume,
) -> anyhow::Result<()> {
    let max_bytes = config.event.max_message_size_kb.bytes();
    let (sink, topic) = match config.sink.kind {
        SinkKind::Stdout => (
            Sink::Stream(StreamSink::stdout(config.event.encoding)),
            config.sink.topic.clone().unwrap_or_else(|| "ces".into()),
        ),
        SinkKind::File => {
            let path = config.sink.path.clone().context("sink.path is required")?;
            let sink = StreamSink::file(path, config.event.encoding, resume)?;
            // Before the first line: a crash before the first real checkpoint must
            // still find one that says the file was empty. Not with "latest": a
            // restart would start later than the lines it cut, so there the restart
            // refuses the non-empty file instead of losing them.
            if resume == Resume::Fresh && config.source.start_position == StartPosition::Earliest {
                store
                    .save(&Position {
                        sink_length: Some(0),
                        ..Position::default()
                    })
                    .await?;
            }
            (
                Sink::Stream(sink),
                config.sink.topic.clone().unwrap_or_else(|| "ces".into()),
            )
        }
        SinkKind::Kafka => {
            let settings = KafkaSettings::new(&config.sink, max_bytes, None)?;
            (
                Sink::Kafka(KafkaSink::new(&settings, max_bytes)?),
                config.sink.topic.clone().unwrap_or_else(|| "ces".into()),
            )
        }
        SinkKind::EventHubsAmqp => {
            let (credential, entity) = match config.sink.entra_credential {
                None => {
                    let secret = config
                        .sink
                        .connection_string
                        .resolve("sink.connection_string")?;
                    let (_, entity) = parse_event_hubs_connection_string(&secret)?;
                    (EventHubsCredential::ConnectionString(secret), entity)
                }
                Some(kind) => {
                    let namespace = config
                        .sink
                        .namespace
                        .clone()
                        .context("sink.namespace is required")?;
                    let credential: std::sync::Arc<dyn azure_core::credentials::TokenCredential> =
                        match kind {
                            EntraCredentialKind::ManagedIdentity => {
                                azure_identity::ManagedIdentityCredential::new(None)?
                            }
                            EntraCredentialKind::WorkloadIdentity => {
                                azure_identity::WorkloadIdentityCredential::new(None)?
                            }
                            EntraCredentialKind::DeveloperTools => {
                                azure_identity::DeveloperToolsCredential::new(None)?
                            }
                        };
                    (
                        EventHubsCredential::Entra {
                            namespace,
                            credential,
                        },
                        None,
                    )
                }
            };
            let topic = config.sink.topic.clone().or(entity).context(
                "sink.topic: name the event hub, or put EntityPath= in the connection string",
            )?;
            let sink = EventHubsAmqpSink::connect(
                credential,
                &topic,
                config.sink.custom_endpoint.clone(),
                Duration::from_millis(config.sink.amqp_resend_after_ms),
                Duration::from_millis(config.sink.delivery_timeout_ms),
            )
            .await?;
            (Sink::EventHubsAmqp(Box::new(sink)), topic)
        }
        SinkKind::EventHubsKafka => {
            let secret = config
                .sink
                .connection_string
                .resolve("sink.connection_string")?;
            let (_, entity) = parse_event_hubs_connection_string(&secret)?;
            let topic = config.sink.topic.clone().or(entity).context(
                "sink.topic: name the event hub, or put EntityPath= in the connection string",
            )?;
            let settings = KafkaSettings::new(&config.sink, max_bytes, Some(&secret))?;
            (Sink::Kafka(KafkaSink::new(&settings, max_bytes)?), topic)
        }
    };
    let event = config.event.clone();
    let stream_key = config.checkpoint.stream_name.clone();
    let router = Router::new(
        topic,
        config.sink.partition_key,
        config.sink.partition_key_column.clone(),
        config.sink.mode,
        event.encoding,
        stream_key,
    );
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
        poll_interval: Duration::from_millis(config.source.poll_interval_ms),
        checkpoint_interval: Duration::from_millis(config.checkpoint.interval_ms),
        drain_timeout: Duration::from_millis(config.shutdown.drain_timeout_ms),
        until_idle,
    };
    let summary = pipeline::run(poller, factory, router, sink, store, settings, shutdown).await?;
    tracing::info!(
        events = summary.events,
        messages = summary.messages,
        bytes = summary.bytes,
        truncated_values = summary.truncated_values,
        checkpoint = ?summary.checkpoint.as_ref().and_then(|p| p.last_event),
        "stopped"
    );
    Ok(())
}

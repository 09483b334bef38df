//! The `mssql-ces` command line.
//!
//! Exit codes: 0 success (including a signalled shutdown), 1 a run that failed, 2 a
//! configuration error (reported before any connection), 130 a second signal.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use mssql_ces::config::{Config, LogFormat, Override};
use mssql_ces::error::Chain;
use mssql_ces::sink::SinkError;
use tokio_util::sync::CancellationToken;

/// jemalloc: per-thread caches without glibc's arena locks, and freed pages given
/// back to the system on a clock; buffers allocated on one thread and freed on
/// another (every encoded message) cost it least of the allocators measured in
/// `docs/src/dev/benchmarks.md`, *Memory*.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read as it starts (its `malloc_conf`, under the prefix of
/// the crate's build): pages freed and not reused within a second go back to the
/// system (`dirty_decay_ms`, 10 s by default), without a second, lazier stage
/// (`muzzy_decay_ms`). The environment variable `_RJEM_MALLOC_CONF` overrides them.
#[cfg(feature = "jemalloc")]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 = &b"dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0];

/// SQL Server CDC to Change Event Streaming (CES) events, delivered to Kafka, Azure
/// Event Hubs (its Kafka endpoint or AMQP), a file (exactly once) or stdout.
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
    /// Check that everything a run needs is in place: the configuration and its
    /// secrets, SQL Server and CDC, each table, the checkpoint, the destination. One
    /// line per check (✔ passed, ✘ failed with its fix, – not checked and why);
    /// exit 1 when a check failed.
    Check(CheckArgs),
    /// Ask a running process's metrics server for `/healthz` (or another path): exit 0
    /// when it answers 200, 1 otherwise. For container health checks, where no HTTP
    /// client is installed.
    Probe(ProbeArgs),
    /// Read events back as a consumer would: reassemble segments, drop duplicates,
    /// check order and completeness, print one JSON line per event, and a summary on
    /// stderr. Exit 1 when something could not be read.
    Read(ReadArgs),
    /// Ask the stream running with this configuration to read tables again while
    /// their changes stream on (a re-snapshot), through its metrics server
    /// (`metrics.admin`). Nothing is written to the database; the stream records
    /// the re-snapshot in its checkpoint. Exit 1 when a table was refused.
    Snapshot(SnapshotArgs),
    /// Print the configuration's JSON Schema (every setting, its default, bounds and
    /// documentation), for editors that check TOML against one (Taplo, VS Code's
    /// Even Better TOML: `#:schema ./mssql-ces.schema.json` at the file's top).
    Schema,
}

#[derive(Debug, clap::Args)]
struct ReadArgs {
    /// A newline-delimited file written by the file or stdout sink; `-` for stdin.
    #[arg(long, conflicts_with_all = ["topic", "bootstrap_servers", "partitions", "group", "idle_ms", "kafka", "isolation"])]
    file: Option<PathBuf>,
    /// A Kafka topic (or event hub through the Kafka endpoint, with `--kafka`
    /// security properties), read from the beginning.
    #[arg(long, requires = "bootstrap_servers")]
    topic: Option<String>,
    /// Kafka bootstrap servers (`host:port,…`).
    #[arg(long)]
    bootstrap_servers: Option<String>,
    /// Only this partition (repeatable; default all).
    #[arg(long = "partition")]
    partitions: Vec<i32>,
    /// A consumer group: continue from its committed offsets (the beginning the
    /// first time) and commit what was read, at the end.
    #[arg(long, requires = "topic")]
    group: Option<String>,
    /// `json` or `avro`: how the events were encoded (`event.encoding`). Unset: a
    /// file's first record says (JSON, or base64 Avro), a Kafka message's
    /// `content-type` says (JSON where it says nothing).
    #[arg(long)]
    encoding: Option<String>,
    /// Print the decoded Data object, `old` and `current` as objects, instead of the
    /// whole event.
    #[arg(long)]
    data: bool,
    /// Stop after this many events (0 reads none).
    #[arg(long)]
    max_events: Option<u64>,
    /// Keep reading for new events until interrupted: a topic's new messages, or the
    /// lines appended to a file.
    #[arg(long)]
    follow: bool,
    /// A topic without `--follow`: stop once it was quiet this long (default 2000).
    #[arg(long)]
    idle_ms: Option<u64>,
    /// A librdkafka property for the consumer (`--kafka security.protocol=SASL_SSL`).
    #[arg(long = "kafka", value_name = "KEY=VALUE")]
    kafka: Vec<String>,
    /// `read_committed` (default, as Kafka consumers read): only committed
    /// transactions' records, what a consumer of an exactly-once stream sees;
    /// `read_uncommitted`: also those of open and aborted transactions.
    #[arg(long, value_enum, default_value = "read_committed", requires = "topic")]
    isolation: Isolation,
}

/// `read --isolation`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
enum Isolation {
    ReadCommitted,
    ReadUncommitted,
}

#[derive(Debug, clap::Args)]
struct SnapshotArgs {
    #[command(flatten)]
    settings: ConfigArgs,
    /// A table to re-snapshot, as `schema.table` (repeatable).
    #[arg(long = "table", required = true)]
    tables: Vec<String>,
    /// With `source.databases`: the database whose table it is (default: every
    /// database being read that has such a table).
    #[arg(long)]
    database: Option<String>,
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    #[command(flatten)]
    settings: ConfigArgs,
    /// `text` (one line per check) or `json` (for automation).
    #[arg(long, value_enum, default_value = "text")]
    format: CheckFormat,
}

#[derive(Debug, clap::Args)]
struct ProbeArgs {
    /// Where the metrics server listens (`metrics.listen`).
    #[arg(long, default_value = "127.0.0.1:9187")]
    address: String,
    /// `/healthz`, `/readyz` or `/metrics`.
    #[arg(long, default_value = "/healthz")]
    path: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CheckFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
#[command(after_help = RUN_HELP)]
struct RunArgs {
    #[command(flatten)]
    settings: ConfigArgs,
    /// Exit once the source has nothing new and everything is delivered.
    #[arg(long)]
    until_idle: bool,
    /// `text` or `json` log lines (overrides `log.format`).
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

/// What `run --help` adds after the options.
const RUN_HELP: &str = "\
Every setting can also come from the environment: MSSQL_CES__<SECTION>__<KEY>
(e.g. MSSQL_CES__SINK__TOPIC=orders). A secret setting's variable holds the secret
itself: MSSQL_CES__SOURCE__CONNECTION_STRING, MSSQL_CES__SINK__CONNECTION_STRING.
The file is read first, then the environment, then --set and the other flags.

Exit codes: 0 stopped cleanly (a signal, or --until-idle with everything delivered);
1 the run failed (the last line says why, and whether a restart helps); 2 the
configuration is invalid (said before anything is contacted); 130 a second signal
(exit at once; the next start loses nothing).";

/// The configuration file and its overrides.
#[derive(Debug, clap::Args)]
struct ConfigArgs {
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Run(args) => args,
        Command::Read(args) => return read(&args),
        Command::Check(args) => return check(&args),
        Command::Probe(args) => return probe(&args),
        Command::Snapshot(args) => return snapshot(&args),
        Command::Schema => return schema(),
    };
    let (config, notices) = match load_config(&args.settings).and_then(|(config, notices)| {
        config.check_secrets()?;
        Ok((config, notices))
    }) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("error: {}", Chain(e.as_ref()));
            return ExitCode::from(2);
        }
    };
    let log_format = args.log_format.unwrap_or(config.log.format);
    init_logging(log_format);
    for notice in notices.iter().chain(&config.fleet_advisories()) {
        tracing::warn!("{notice}");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mut configuration = false;
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        install_signals(shutdown.clone())?;
        if !args.until_idle {
            tracing::info!(
                "running until stopped: Ctrl-C or SIGTERM finishes the batch being sent, writes the checkpoint and exits (--until-idle stops by itself once everything is delivered)"
            );
        }
        mssql_ces::commands::run::run(config, args.until_idle, shutdown)
            .await
            .map_err(|e| {
                configuration = e.is_configuration();
                let hint = match e.sink_error() {
                    Some(s) if s.is_transient() => {
                        " (transient: a restart resumes from the checkpoint)"
                    }
                    Some(SinkError::Definite { .. }) => " (a restart repeats it: change what it names)",
                    _ => "",
                };
                anyhow::anyhow!("{}{hint}", Chain(&e))
            })
    });
    // A blocking call still running (a metadata request to a broker that is down)
    // must not hold the exit past the drain timeout.
    runtime.shutdown_timeout(Duration::from_millis(500));
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            match log_format {
                // A log shipper reads the reason as one more JSON line.
                LogFormat::Json => {
                    tracing::error!(error = %Chain(e.as_ref()), "stopped with an error")
                }
                LogFormat::Text => eprintln!("error: {}", Chain(e.as_ref())),
            }
            ExitCode::from(if configuration { 2 } else { 1 })
        }
    }
}

/// `mssql-ces read`: events to stdout, the summary to stderr.
fn read(args: &ReadArgs) -> ExitCode {
    use mssql_ces::commands::read::{
        EventReader, KafkaInput, ReadOptions, follow_lines, read_kafka, read_lines,
    };
    let encoding = match args.encoding.as_deref() {
        None => None,
        Some("json") => Some(mssql_ces::event::Encoding::Json),
        Some("avro") => Some(mssql_ces::event::Encoding::Avro),
        Some(other) => {
            eprintln!("error: --encoding {other}: expected json or avro");
            return ExitCode::from(2);
        }
    };
    let properties = match kafka_properties(&args.kafka) {
        Ok(properties) => properties,
        Err(code) => return code,
    };
    let stdout = std::io::stdout().lock();
    let mut reader = EventReader::new(
        std::io::BufWriter::new(stdout),
        ReadOptions {
            encoding,
            data_only: args.data,
            max_events: args.max_events,
            resumed: args.group.is_some(),
        },
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let read = match (&args.file, &args.topic, &args.bootstrap_servers) {
        (Some(path), _, _) if path.as_os_str() == "-" => {
            read_lines(std::io::stdin().lock(), "stdin", &mut reader).map_err(Into::into)
        }
        (Some(path), _, _) => match std::fs::File::open(path) {
            Ok(file) => {
                if args.follow {
                    stop_on_ctrl_c(&stop);
                }
                follow_lines(
                    std::io::BufReader::new(file),
                    &path.display().to_string(),
                    &mut reader,
                    args.follow.then_some(&*stop),
                )
                .map_err(Into::into)
            }
            Err(e) => {
                eprintln!("error: --file {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        (None, Some(topic), Some(servers)) => {
            stop_on_ctrl_c(&stop);
            let input = KafkaInput {
                bootstrap_servers: servers.clone(),
                topic: topic.clone(),
                partitions: (!args.partitions.is_empty()).then(|| args.partitions.clone()),
                group: args.group.clone(),
                follow: args.follow,
                idle: Duration::from_millis(args.idle_ms.unwrap_or(2000)),
                properties,
                read_committed: matches!(args.isolation, Isolation::ReadCommitted),
            };
            read_kafka(&input, &mut reader, &stop)
        }
        _ => {
            eprintln!(
                "error: what to read: --file PATH (a file the file or stdout sink wrote; - for stdin), or --topic NAME with --bootstrap-servers HOST:PORT"
            );
            return ExitCode::from(2);
        }
    };
    // Whoever read the events stopped (`| head`): done, as any command-line tool.
    if let Err(mssql_ces::commands::read::InputError::Io(e)) = &read
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        return ExitCode::SUCCESS;
    }
    let summary = reader.finish(stop.load(std::sync::atomic::Ordering::Relaxed));
    if let Err(e) = read {
        eprintln!("error: {}", Chain(&e));
        return ExitCode::from(1);
    }
    report_summary(summary)
}

/// `--kafka KEY=VALUE` items as librdkafka properties; exit code 2 on a malformed one.
fn kafka_properties(items: &[String]) -> Result<Vec<(String, String)>, ExitCode> {
    let mut properties = Vec::new();
    for item in items {
        let Some((key, value)) = item.split_once('=') else {
            eprintln!("error: --kafka {item}: expected KEY=VALUE");
            return Err(ExitCode::from(2));
        };
        properties.push((key.trim().to_owned(), value.to_owned()));
    }
    Ok(properties)
}

/// The first Ctrl-C sets `stop`, which ends a read with its summary.
fn stop_on_ctrl_c(stop: &std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let flag = std::sync::Arc::clone(stop);
    std::thread::spawn(move || {
        if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            runtime.block_on(async {
                let _ = tokio::signal::ctrl_c().await;
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
}

/// Prints a read's problems and summary line; exit code 1 when there were problems.
fn report_summary<E: std::error::Error>(
    summary: Result<mssql_ces::commands::read::ReadSummary, E>,
) -> ExitCode {
    match summary {
        Ok(summary) => {
            for problem in &summary.problems {
                eprintln!("problem: {problem}");
            }
            eprintln!("{}", summary.line());
            if summary.problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {}", Chain(&e));
            ExitCode::from(1)
        }
    }
}

/// Log lines to stderr, as text for people or one JSON object a line for shippers
/// (`RUST_LOG` filters, default `info`).
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::prelude::*;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            // The Event Hubs client warns on every failed reconnection attempt; the
            // sink says an outage once itself.
            .unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(
                    "info,azure_messaging_eventhubs::common::recoverable=error",
                )
            })
    };
    let lines = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_writer(std::io::stderr)
            .with_filter(filter())
            .boxed(),
    };
    tracing_subscriber::registry().with(lines).init();
}

/// The configuration, and the environment variables to warn of (named like
/// settings, read by nothing).
fn load_config(args: &ConfigArgs) -> anyhow::Result<(Config, Vec<String>)> {
    let mut overrides = Vec::new();
    if let Some(topic) = &args.topic {
        overrides.push(Override::flag("--topic", "sink.topic", topic));
    }
    if let Some(servers) = &args.bootstrap_servers {
        overrides.push(Override::flag(
            "--bootstrap-servers",
            "sink.bootstrap_servers",
            servers,
        ));
    }
    if let Some(path) = &args.checkpoint_path {
        overrides.push(Override::flag(
            "--checkpoint-path",
            "checkpoint.path",
            &path.to_string_lossy(),
        ));
    }
    if let Some(encoding) = &args.encoding {
        overrides.push(Override::flag("--encoding", "event.encoding", encoding));
    }
    for item in &args.set {
        let (key, value) = item
            .split_once('=')
            .with_context(|| format!("--set {item}: expected KEY=VALUE"))?;
        overrides.push(Override::parse(key.trim(), value));
    }
    Ok(Config::load_noting(&args.config, &overrides)?)
}

/// `mssql-ces check`: the report to stdout; exit 1 when a check failed.
fn check(args: &CheckArgs) -> ExitCode {
    use mssql_ces::commands::check::Report;
    let (config, notices) = match load_config(&args.settings) {
        Ok(loaded) => loaded,
        Err(e) => {
            let mut report = Report::default();
            report.findings.push(mssql_ces::commands::check::Finding {
                check: "configuration".into(),
                status: mssql_ces::commands::check::Status::Fail,
                // The check is named "configuration" already.
                detail: Chain(e.as_ref())
                    .to_string()
                    .trim_start_matches("configuration: ")
                    .to_owned(),
                fix: Some("correct the setting the message names".into()),
            });
            print_report(&report, args.format);
            return ExitCode::from(1);
        }
    };
    // Warnings of the clients checked (librdkafka, the AMQP client) go to stderr.
    init_logging(LogFormat::Text);
    let mut report = match tokio::runtime::Runtime::new() {
        Ok(runtime) => {
            let report = runtime.block_on(mssql_ces::commands::check::check(&config));
            runtime.shutdown_timeout(Duration::from_millis(500));
            report
        }
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let environment = notices
        .into_iter()
        .map(|notice| mssql_ces::commands::check::Finding {
            check: "environment".into(),
            status: mssql_ces::commands::check::Status::Warn,
            detail: notice,
            fix: Some("rename the variable, or remove it".into()),
        });
    report.findings.splice(0..0, environment);
    print_report(&report, args.format);
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// `mssql-ces probe`: one HTTP/1.0 GET; the body to stdout.
fn schema() -> ExitCode {
    let schema = mssql_ces::config::Config::json_schema();
    match serde_json::to_string_pretty(&schema) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: writing the schema: {e}");
            ExitCode::from(1)
        }
    }
}

fn probe(args: &ProbeArgs) -> ExitCode {
    let timeout = Duration::from_secs(5);
    if !args.path.starts_with('/') {
        eprintln!(
            "error: --path {}: a path starts with / (e.g. --path /{})",
            args.path, args.path
        );
        return ExitCode::from(2);
    }
    if !args.address.contains(':') {
        let hint = if args.address.parse::<u16>().is_ok() {
            format!(" (a port alone? --address 127.0.0.1:{})", args.address)
        } else {
            format!(" (e.g. --address {}:9187)", args.address)
        };
        eprintln!(
            "error: --address {}: expected host:port, as metrics.listen gives it{hint}",
            args.address
        );
        return ExitCode::from(2);
    }
    let answer = std::net::ToSocketAddrs::to_socket_addrs(&args.address)
        .and_then(|mut a| a.next().ok_or_else(|| std::io::Error::other("no address")))
        .and_then(|address| {
            let request = format!("GET {} HTTP/1.0\r\nHost: localhost\r\n\r\n", args.path);
            mssql_ces::commands::snapshot::exchange(&address, &request, timeout)
        });
    match answer {
        Ok(response) => {
            let status_line = response.lines().next().unwrap_or("");
            let ok = response.split_whitespace().nth(1) == Some("200");
            let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
            print!("{body}");
            if ok {
                ExitCode::SUCCESS
            } else {
                // Not healthy: say what the server answered (a probe's output is
                // what an orchestrator shows).
                let status = status_line.split_once(' ').map_or(status_line, |(_, s)| s);
                eprintln!(
                    "{}{}: answered {}",
                    args.address,
                    args.path,
                    if status.is_empty() { "nothing" } else { status }
                );
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {}{}: {e}", args.address, args.path);
            ExitCode::from(1)
        }
    }
}

/// `mssql-ces snapshot`: one line per table, the stream's answer; exit 1 when one
/// was refused, 2 when the configuration does not allow asking.
fn snapshot(args: &SnapshotArgs) -> ExitCode {
    let (config, _) = match load_config(&args.settings) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("error: {}", Chain(e.as_ref()));
            return ExitCode::from(2);
        }
    };
    match mssql_ces::commands::snapshot::request(&config, args.database.as_deref(), &args.tables) {
        Ok(answers) => {
            for answer in &answers {
                if answer.accepted {
                    println!("{}", answer.text);
                } else {
                    eprintln!("{}: {}", answer.table, answer.text);
                }
            }
            if answers.iter().all(|a| a.accepted) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {}", Chain(&e));
            ExitCode::from(match e {
                mssql_ces::commands::snapshot::SnapshotCommandError::Unreachable { .. } => 1,
                _ => 2,
            })
        }
    }
}

fn print_report(report: &mssql_ces::commands::check::Report, format: CheckFormat) {
    match format {
        CheckFormat::Text => print!("{}", report.to_text()),
        CheckFormat::Json => println!("{}", report.to_json()),
    }
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

//! The configuration: one TOML file, every setting overridable by an environment
//! variable, the common ones by command-line flags.
//!
//! - Unknown keys are an error that names the key (`deny_unknown_fields`).
//! - Environment overrides: `MSSQL_CES__<SECTION>__<KEY>=<value>`, sections and keys
//!   separated by a double underscore, case-insensitive (`MSSQL_CES__SINK__TOPIC=orders`,
//!   `MSSQL_CES__SOURCE__SYNTHETIC__SEED=7`). The value is text, read as what the
//!   setting takes (see [`layers`] and [`crate::setting::de`]); an error names the
//!   variable or flag that gave it.
//! - Secrets (connection strings) are never in the file: the file names an environment
//!   variable or a file that holds them, and they are never printed.
//! - [`Config::validate`] checks everything that can be checked before connecting,
//!   and each error names the setting to fix.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod checkpoint;
mod databases;
mod errors;
mod fleet;
mod formats;
mod layers;
mod sql;

pub use crate::databases::fleet::GroupProtocol;
pub use fleet::FleetSettings;

use crate::event::settings::EventSettings;
use crate::mssql::SqlServerConfig;
use crate::setting::{ConfigError, SecretRef, invalid, millis};
use crate::sink::settings::SinkSettings;
use crate::source::filter::TableFilter;
use crate::source::initial_load::SnapshotMode;
use crate::source::poller::{CaptureInstanceMode, GapPolicy, PollerConfig, StartPosition};
use crate::source::timezone::TimeZoneSetting;
use errors::syntax_error;
use layers::{Layers, strip_env_prefix};
pub use layers::{Origin, Override};

pub use crate::setting::ENV_PREFIX;

/// Settings of earlier releases under their new names, with what to write instead
/// (one duration convention: every duration in milliseconds, `…_ms`).
const RENAMED: &[(&str, &str)] = &[(
    "source.catalog_refresh_s",
    "is now source.catalog_refresh_ms, in milliseconds: write catalog_refresh_ms = 30000 for 30 s",
)];

/// The settings that hold secrets, as override paths.
pub const SECRET_SETTINGS: &[&str] = &[
    "source.connection_string",
    "sink.connection_string",
    "sink.sasl_password",
    "sink.ssl_key_password",
    "checkpoint.connection_string",
];

/// Where changes come from: a SQL Server database with CDC (or several, with
/// `databases`), or the synthetic workload.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceSettings {
    /// What is read.
    #[serde(default = "default_source_kind")]
    pub kind: SourceKind,
    /// The ADO.NET connection string, `Server=tcp:host,1433;Database=db;User
    /// Id=u;Password=p`. A string the driver cannot parse, a keyword SQL Server's
    /// clients do not know (named, its value never shown), or no `Server=` is a
    /// configuration error before anything is contacted. Also
    /// `MSSQL_CES__SOURCE__CONNECTION_STRING` may hold the secret itself.
    #[serde(default)]
    pub connection_string: SecretRef,
    /// Accept any server certificate, self-signed included (only on a network you
    /// trust). To trust a private CA instead, put `TrustServerCertificateCA=<path to
    /// its .pem or .crt>` in the connection string; a rejected certificate's error
    /// names both.
    #[serde(default)]
    pub trust_server_certificate: bool,
    /// Require TLS. A server that offers none stops the run, naming this setting.
    #[serde(default = "default_true")]
    pub encrypt: bool,
    /// `schema.table` patterns to stream (`*`, `?`, case-insensitive); empty: every
    /// captured table.
    #[serde(default)]
    pub include: Vec<String>,
    /// `schema.table` patterns to leave out.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// How commit times become UTC: `"server"` (SQL Server 2022 and later, and Azure;
    /// refused on 2016–2019, which cannot name their zone), an IANA zone such as
    /// `"Europe/Berlin"`, an offset such as `"+02:00"`, or `"ces"`. See [Commit
    /// times](sql-server.md#commit-times).
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    /// What to do when the cleanup job purged changes before they were delivered.
    #[serde(default)]
    pub on_gap: GapPolicy,
    /// Who removes change rows: `"agent"`, SQL Server's cleanup job by its retention
    /// (the default), or `"after_delivery"`, this daemon, below what every stream of
    /// the database has delivered (needs `db_owner`). See [Cleanup after
    /// delivery](operating.md#cleanup-after-delivery).
    #[serde(default)]
    pub cleanup: crate::source::poller::CleanupMode,
    /// With `cleanup = "after_delivery"`: how often the change tables are cleaned, in
    /// milliseconds.
    #[serde(
        rename = "cleanup_interval_ms",
        with = "millis",
        default = "default_cleanup_interval_ms"
    )]
    #[schemars(with = "u64", range(min = 1))]
    pub cleanup_interval: Duration,
    /// Where to start when there is no checkpoint. `"latest"` is settled and saved
    /// before the first poll, so a restart before the first delivery starts at the same
    /// place and skips nothing.
    #[serde(default)]
    pub start_position: StartPosition,
    /// Pause between polls when nothing is new, in milliseconds.
    #[serde(
        rename = "poll_interval_ms",
        with = "millis",
        default = "default_poll_interval_ms"
    )]
    #[schemars(with = "u64")]
    pub poll_interval: Duration,
    /// Change rows per query.
    #[serde(default = "default_page_size")]
    #[schemars(range(min = 1))]
    pub page_size: usize,
    /// Events per batch: the unit of acknowledgement.
    #[serde(default = "default_batch_size")]
    #[schemars(range(min = 1))]
    pub batch_size: usize,
    /// How often the CDC catalog is re-read even when its fingerprint, checked every
    /// poll, did not change, in milliseconds; with `metrics.listen` set, also how
    /// often the capture job's latest log scan session is read for its metrics.
    #[serde(
        rename = "catalog_refresh_ms",
        with = "millis",
        default = "default_catalog_refresh_ms"
    )]
    #[schemars(with = "u64")]
    pub catalog_refresh: Duration,
    /// Bound on TCP connect plus TLS and login, in milliseconds.
    #[serde(
        rename = "connect_timeout_ms",
        with = "millis",
        default = "default_connect_timeout_ms"
    )]
    #[schemars(with = "u64")]
    pub connect_timeout: Duration,
    /// Bound on every query, in milliseconds; a query cut off is retried on a new
    /// connection.
    #[serde(
        rename = "query_timeout_ms",
        with = "millis",
        default = "default_query_timeout_ms"
    )]
    #[schemars(with = "u64")]
    pub query_timeout: Duration,
    /// How long an included table may answer `min_lsn` 0x00 (no SELECT grant, or CDC
    /// just enabled) before the run stops naming it, in milliseconds. Nothing is read
    /// meanwhile.
    #[serde(
        rename = "unreadable_grace_ms",
        with = "millis",
        default = "default_unreadable_grace_ms"
    )]
    #[schemars(with = "u64")]
    pub unreadable_grace: Duration,
    /// Who creates capture instances when a table's columns change. See [Schema
    /// changes](schema-changes.md).
    #[serde(default)]
    pub capture_instances: CaptureInstanceMode,
    /// Enable CDC on the tables `include` names that lack it (needs `db_owner` and a
    /// non-empty `include`).
    #[serde(default)]
    pub enable_cdc: bool,
    /// Databases to stream, by name or `*`/`?` pattern (case-insensitive) over the
    /// server's CDC-enabled, online databases the login can open; empty: the connection
    /// string's database alone. See [Scaling out](scaling-out.md).
    #[serde(default)]
    pub databases: Vec<String>,
    /// With `databases`: how often the server's databases are matched again, in
    /// milliseconds (a new one starts streaming, a gone one stops).
    #[serde(
        rename = "discovery_interval_ms",
        with = "millis",
        default = "databases::default_discovery_interval_ms"
    )]
    #[schemars(with = "u64", range(min = 1))]
    pub discovery_interval: Duration,
    /// With `databases`: connections to the source at most, one of them the probe's, so
    /// `max_connections` − 1 databases are read at once (at least 2).
    #[serde(default = "databases::default_max_connections")]
    pub max_connections: usize,
    /// Set by [`Config::for_database`]: the database of many this configuration
    /// reads (the connection string's `Database=` replaced).
    #[serde(skip)]
    pub database: Option<String>,
    /// The synthetic workload.
    #[serde(default)]
    pub synthetic: SyntheticSettings,
}

/// What `[source]` reads.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// SQL Server's CDC.
    Sqlserver,
    /// Generated changes, no database (`[source.synthetic]`).
    Synthetic,
}

/// The synthetic workload of `kind = "synthetic"`: generated changes of a small shop's
/// tables, deterministic for a seed, with no database. For trying the program, the
/// formats and the sinks.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyntheticSettings {
    /// The same seed gives the same change history.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Transactions in all; 0 for endless. With `rate_per_second` set, `--until-idle`
    /// waits for every transaction to be generated (an endless paced workload never
    /// idles), and a restarted run goes on from its checkpoint's point in the schedule.
    #[serde(default = "default_transactions")]
    pub transactions: u64,
    /// Transactions per second; 0 for as fast as possible.
    #[serde(default)]
    pub rate_per_second: f64,
    /// One transaction in this many carries a 300 KB value, which exercises
    /// segmentation; 0 for never.
    #[serde(default)]
    pub large_value_every: u64,
    /// 0: the mixed workload. N: `transactions` transactions of N inserts each into
    /// `dbo.bulk`, generated as they are read, for large transactions in bounded
    /// memory.
    #[serde(default)]
    pub transaction_rows: u64,
    /// 0: none. N: a table `dbo.products` of N rows that were there before CDC was
    /// enabled and that the workload never changes, generated as they are read, for
    /// trying [the initial load](initial-load.md).
    #[serde(default)]
    pub existing_rows: u64,
    /// One transaction in this many also inserts into `dbo.attachments` a row whose
    /// text and binary values are over the 1 MiB CES keeps, to see
    /// [truncation](event-format.md#truncation-and-segmentation); 0 for never. The
    /// other tables get the same rows either way.
    #[serde(default)]
    pub oversized_value_every: u64,
    /// 0: one database. N, with `source.databases`: a server of N databases
    /// `tenant001`, …, each its own workload with its seed derived from `seed` and its
    /// name, for trying [Scaling out](scaling-out.md) without SQL Server.
    #[serde(default)]
    pub databases: u32,
}

impl Default for SyntheticSettings {
    fn default() -> Self {
        SyntheticSettings {
            seed: default_seed(),
            transactions: default_transactions(),
            rate_per_second: 0.0,
            large_value_every: 0,
            transaction_rows: 0,
            existing_rows: 0,
            oversized_value_every: 0,
            databases: 0,
        }
    }
}

/// Where checkpoints are kept.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointStoreKind {
    /// A local JSON file (`path`).
    #[default]
    File,
    /// `dbo.mssql_ces_checkpoint` in the source database
    /// (`sql/04_checkpoint_table.sql`). That table is never streamed, enabled for CDC
    /// or loaded, whatever `source.include` says, and `check` warns when CDC is enabled
    /// on it.
    Table,
    /// A compacted topic on the sink's Kafka brokers (`topic`); needs a Kafka or Event
    /// Hubs Kafka-endpoint sink.
    Kafka,
}

/// Where the stream's position is kept. A position moves only when the destination
/// acknowledged every event before it.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSettings {
    /// Where the checkpoint is kept.
    #[serde(default)]
    pub store: CheckpointStoreKind,
    /// File store: the checkpoint file.
    #[serde(default = "default_checkpoint_path")]
    pub path: PathBuf,
    /// Names this stream's checkpoint, so several streams can share one store.
    #[serde(default = "default_stream_name")]
    pub stream_name: String,
    /// Table store: where `dbo.mssql_ces_checkpoint` is written, when not through the
    /// source's connection (a source on a readable secondary, whose database is
    /// read-only there). Unset: the source's connection string, without
    /// `ApplicationIntent=ReadOnly`. Also `MSSQL_CES__CHECKPOINT__CONNECTION_STRING`.
    #[serde(default)]
    pub connection_string: SecretRef,
    /// Kafka store: the topic. Created compacted with one partition when missing; an
    /// existing one that is not compacted is warned of, one of several partitions is
    /// refused. The login needs `READ` and `WRITE` on it.
    #[serde(default = "checkpoint::default_checkpoint_topic")]
    pub topic: String,
    /// Least time between checkpoint writes, in milliseconds; the final one at a stop
    /// is always written.
    #[serde(
        rename = "interval_ms",
        with = "millis",
        default = "default_checkpoint_interval_ms"
    )]
    #[schemars(with = "u64")]
    pub interval: Duration,
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        CheckpointSettings {
            store: CheckpointStoreKind::File,
            path: default_checkpoint_path(),
            stream_name: default_stream_name(),
            connection_string: SecretRef::default(),
            topic: checkpoint::default_checkpoint_topic(),
            interval: default_checkpoint_interval_ms(),
        }
    }
}

/// What a signalled stop waits for.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSettings {
    /// How long a signalled stop waits for outstanding deliveries, in milliseconds (a
    /// stop because the source is idle waits up to `sink.delivery_timeout_ms` instead).
    #[serde(
        rename = "drain_timeout_ms",
        with = "millis",
        default = "default_drain_timeout_ms"
    )]
    #[schemars(with = "u64")]
    pub drain_timeout: Duration,
}

impl Default for ShutdownSettings {
    fn default() -> Self {
        ShutdownSettings {
            drain_timeout: default_drain_timeout_ms(),
        }
    }
}

/// `mssql-ces check`.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckSettings {
    /// How long each network check of `mssql-ces check` (brokers, topics, the
    /// checkpoint store) waits for an answer, in milliseconds; an Event Hubs connection
    /// may take three times as long.
    #[serde(
        rename = "timeout_ms",
        with = "millis",
        default = "default_check_timeout_ms"
    )]
    #[schemars(with = "u64")]
    pub timeout: Duration,
}

impl Default for CheckSettings {
    fn default() -> Self {
        CheckSettings {
            timeout: default_check_timeout_ms(),
        }
    }
}

fn default_check_timeout_ms() -> Duration {
    Duration::from_millis(10_000)
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where changes come from.
    pub source: SourceSettings,
    /// The initial load.
    #[serde(default)]
    pub snapshot: SnapshotSettings,
    /// How changes are encoded.
    #[serde(default)]
    pub event: EventSettings,
    /// Where events go.
    pub sink: SinkSettings,
    /// Where the position is kept.
    #[serde(default)]
    pub checkpoint: CheckpointSettings,
    /// A fleet of processes.
    #[serde(default)]
    pub fleet: FleetSettings,

    /// Metrics and health probes.
    #[serde(default)]
    pub metrics: MetricsSettings,
    /// The log.
    #[serde(default)]
    pub log: LogSettings,
    /// A signalled stop.
    #[serde(default)]
    pub shutdown: ShutdownSettings,
    /// `mssql-ces check`.
    #[serde(default)]
    pub check: CheckSettings,
}

/// The initial load of the rows tables already hold. See [Initial
/// load](initial-load.md).
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSettings {
    /// Whether the rows tables already hold are loaded before changes are streamed.
    #[serde(default)]
    pub mode: SnapshotMode,
    /// Rows per statement and per batch.
    #[serde(default = "default_chunk_size")]
    #[schemars(range(min = 1, max = MAX_LOAD_CHUNK))]
    pub chunk_size: usize,
    /// A table without a key: how long its one pass may wait for its first row, which
    /// the server sends only once it has sorted the whole table, in milliseconds (later
    /// rows: `source.query_timeout_ms`).
    #[serde(
        rename = "first_row_timeout_ms",
        with = "millis",
        default = "default_first_row_timeout_ms"
    )]
    #[schemars(with = "u64")]
    pub first_row_timeout: Duration,
    /// Connections that read the load's rows at once: with more than one, tables and
    /// key ranges of a large table (an integer key) are read ahead on connections of
    /// their own while the stream sends, the events the same as over one. See
    /// [Initial load](initial-load.md#several-connections).
    #[serde(default = "default_load_connections")]
    #[schemars(range(min = 1, max = MAX_LOAD_CONNECTIONS))]
    pub max_connections: usize,
}

/// Most `snapshot.max_connections`.
pub const MAX_LOAD_CONNECTIONS: usize = 64;

fn default_load_connections() -> usize {
    1
}

fn default_first_row_timeout_ms() -> Duration {
    crate::source::sqlserver::DEFAULT_FIRST_ROW_TIMEOUT
}

impl Default for SnapshotSettings {
    fn default() -> Self {
        SnapshotSettings {
            mode: SnapshotMode::Never,
            chunk_size: default_chunk_size(),
            first_row_timeout: default_first_row_timeout_ms(),
            max_connections: default_load_connections(),
        }
    }
}

/// Largest `snapshot.chunk_size`: a chunk is held in memory and sent as one batch.
pub const MAX_LOAD_CHUNK: usize = 100_000;

/// Prometheus metrics and health probes over HTTP.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    /// Address and port to serve `/metrics`, `/healthz` and `/readyz` on, e.g.
    /// `"127.0.0.1:9187"` (`"0.0.0.0:9187"` in a container); unset: off. A busy port
    /// stops the start with an error naming this setting.
    #[serde(default)]
    pub listen: Option<String>,
    /// `/healthz` fails when no poll finished and no delivery was acknowledged for this
    /// long, in milliseconds.
    #[serde(
        rename = "stalled_after_ms",
        with = "millis",
        default = "default_stalled_after_ms"
    )]
    #[schemars(with = "u64", range(min = 1))]
    pub stalled_after: Duration,
    /// `POST /snapshot/<schema.table>` on the metrics server (what `mssql-ces
    /// snapshot` calls): `off`, answered only from this machine (`loopback`), or
    /// from anyone who reaches `metrics.listen` (`any`).
    #[serde(default)]
    pub admin: AdminAccess,
}

/// Who may ask the metrics server for a re-snapshot (`metrics.admin`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AdminAccess {
    /// No admin endpoint.
    #[default]
    Off,
    /// Requests from a loopback address only; others are refused (403).
    Loopback,
    /// Requests from anywhere `metrics.listen` is reachable.
    Any,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            listen: None,
            stalled_after: default_stalled_after_ms(),
            admin: AdminAccess::Off,
        }
    }
}

fn default_stalled_after_ms() -> Duration {
    Duration::from_millis(300_000)
}

impl MetricsSettings {
    /// The address to listen on, checked.
    pub fn listen_address(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        let Some(listen) = &self.listen else {
            if self.admin != AdminAccess::Off {
                return Err(invalid(
                    "metrics.admin",
                    "the admin endpoint is served by the metrics server: set metrics.listen too (e.g. \"127.0.0.1:9187\")".to_owned(),
                ));
            }
            return Ok(None);
        };
        listen.parse().map(Some).map_err(|_| {
            invalid(
                "metrics.listen",
                format!("{listen:?} is not an address and port, such as \"127.0.0.1:9187\" or \"0.0.0.0:9187\""),
            )
        })
    }
}

/// The log.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// How log lines are written; `--log-format` overrides it.
    #[serde(default)]
    pub format: LogFormat,
}

/// How log lines are written.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Deserialize,
    serde::Serialize,
    clap::ValueEnum,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// For people.
    #[default]
    Text,
    /// For log shippers: one object a line, with `timestamp`, `level`, `message`,
    /// `target` and the line's fields.
    Json,
}

fn default_source_kind() -> SourceKind {
    SourceKind::Sqlserver
}
fn default_true() -> bool {
    true
}
fn default_time_zone() -> String {
    "server".into()
}
fn default_poll_interval_ms() -> Duration {
    Duration::from_millis(1000)
}
fn default_connect_timeout_ms() -> Duration {
    Duration::from_millis(15_000)
}
fn default_query_timeout_ms() -> Duration {
    Duration::from_millis(60_000)
}
// The poll loop's defaults are its own (`PollerConfig::default`), kept in one place.
fn default_cleanup_interval_ms() -> Duration {
    PollerConfig::default().cleanup_interval
}
fn default_unreadable_grace_ms() -> Duration {
    PollerConfig::default().unreadable_grace
}
fn default_page_size() -> usize {
    PollerConfig::default().page_size
}
fn default_batch_size() -> usize {
    PollerConfig::default().batch_size
}
fn default_chunk_size() -> usize {
    PollerConfig::default().load_chunk
}
fn default_catalog_refresh_ms() -> Duration {
    PollerConfig::default().catalog_refresh
}
fn default_seed() -> u64 {
    1
}
fn default_transactions() -> u64 {
    10_000
}
fn default_checkpoint_path() -> PathBuf {
    PathBuf::from("mssql-ces.checkpoint.json")
}
fn default_stream_name() -> String {
    "default".into()
}
fn default_checkpoint_interval_ms() -> Duration {
    Duration::from_millis(1000)
}
fn default_drain_timeout_ms() -> Duration {
    Duration::from_millis(10_000)
}

/// Variables whose names look like this program's (`MSSQL_CES_…` in any case) that
/// no setting reads: neither a setting (`MSSQL_CES__<SECTION>__<KEY>`, two
/// underscores) nor a secret the file names (`{ env = "…" }`). Each said by name,
/// never with its value.
fn stray_environment(table: &toml::Table, env: &[(String, String)]) -> Vec<String> {
    fn referenced(value: &toml::Value, names: &mut Vec<String>) {
        match value {
            toml::Value::Table(t) => {
                if let Some(toml::Value::String(name)) = t.get("env") {
                    names.push(name.clone());
                }
                t.values().for_each(|v| referenced(v, names));
            }
            toml::Value::Array(items) => items.iter().for_each(|v| referenced(v, names)),
            _ => {}
        }
    }
    let mut names = Vec::new();
    table.values().for_each(|v| referenced(v, &mut names));
    let single = &ENV_PREFIX[..ENV_PREFIX.len() - 1];
    let mut stray: Vec<String> = env
        .iter()
        .map(|(name, _)| name)
        .filter(|name| {
            name.get(..single.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(single))
                && strip_env_prefix(name).is_none()
                && !names.contains(name)
        })
        .map(|name| {
            format!(
                "the environment variable {name} is not read: a setting's variable is {ENV_PREFIX}<SECTION>__<KEY> (two underscores after MSSQL_CES and between parts), and no {{ env = \"{name}\" }} in the configuration names it"
            )
        })
        .collect();
    stray.sort();
    stray
}

impl Config {
    /// The configuration's JSON Schema: every setting with its documentation,
    /// default and bounds (the book's settings reference is generated from it).
    pub fn json_schema() -> serde_json::Value {
        schemars::generate::SchemaSettings::draft2020_12()
            .into_generator()
            .into_root_schema_for::<Config>()
            .to_value()
    }

    /// Reads `path`, applies the environment's `MSSQL_CES__…` overrides and then
    /// `overrides` (from flags, as `section.key = value`), and validates.
    pub fn load(path: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        Self::load_noting(path, overrides).map(|(config, _)| config)
    }

    /// [`load`](Self::load), with what the run should warn of: environment
    /// variables that look like settings but that nothing reads.
    pub fn load_noting(
        path: &Path,
        overrides: &[Override],
    ) -> Result<(Self, Vec<String>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let env: Vec<(String, String)> = std::env::vars().collect();
        Self::from_parts_noting(&text, &env, overrides)
    }

    /// [`load`](Self::load) from text and an explicit environment (for tests).
    pub fn from_parts(
        text: &str,
        env: &[(String, String)],
        overrides: &[Override],
    ) -> Result<Self, ConfigError> {
        Self::from_parts_noting(text, env, overrides).map(|(config, _)| config)
    }

    /// [`load_noting`](Self::load_noting) from text and an explicit environment.
    pub fn from_parts_noting(
        text: &str,
        env: &[(String, String)],
        overrides: &[Override],
    ) -> Result<(Self, Vec<String>), ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
        let notices = stray_environment(&table, env);
        let mut layers = Layers::file(table);
        layers.environment(env)?;
        layers.command_line(overrides)?;
        layers.refuse_renamed(RENAMED)?;
        let config: Config =
            crate::setting::de::from_value(&toml::Value::Table(layers.table.clone()))
                .map_err(|e| layers.error(e))?;
        config.validate()?;
        Ok((config, notices))
    }

    /// Checks what can be checked before connecting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        TimeZoneSetting::parse(&self.source.time_zone)
            .map_err(|e| invalid("source.time_zone", e.to_string()))?;
        if self.source.page_size == 0 {
            return Err(invalid("source.page_size", "must be at least 1"));
        }
        if self.source.batch_size == 0 {
            return Err(invalid("source.batch_size", "must be at least 1"));
        }
        if !(1..=MAX_LOAD_CHUNK).contains(&self.snapshot.chunk_size) {
            return Err(invalid(
                "snapshot.chunk_size",
                format!(
                    "{} is outside 1 to {MAX_LOAD_CHUNK} (rows per statement and batch; the default is 1000)",
                    self.snapshot.chunk_size
                ),
            ));
        }
        if !(1..=MAX_LOAD_CONNECTIONS).contains(&self.snapshot.max_connections) {
            return Err(invalid(
                "snapshot.max_connections",
                format!(
                    "{} is outside 1 to {MAX_LOAD_CONNECTIONS} (connections reading the load at once; the default is 1)",
                    self.snapshot.max_connections
                ),
            ));
        }
        crate::source::poller::check_capture_settings(
            self.source.kind == SourceKind::Sqlserver,
            self.source.capture_instances,
            self.source.enable_cdc,
            &self.source.include,
        )
        .map_err(|(setting, reason)| invalid(setting, reason))?;
        if self.source.cleanup == crate::source::poller::CleanupMode::AfterDelivery
            && self.source.kind != SourceKind::Sqlserver
        {
            return Err(invalid(
                "source.cleanup",
                "\"after_delivery\" cleans SQL Server's change tables; the synthetic source has none: use kind = \"sqlserver\", or \"agent\"",
            ));
        }
        if self.source.cleanup_interval.is_zero() {
            return Err(invalid(
                "source.cleanup_interval_ms",
                "must be at least 1 (milliseconds between cleanups; the default is 300000)",
            ));
        }
        if self.source.kind == SourceKind::Sqlserver {
            let c = &self.source.connection_string;
            if c.env.is_none() && c.file.is_none() {
                return Err(ConfigError::MissingSecret {
                    setting: "source.connection_string".into(),
                    reason: format!(
                        "set the environment variable {} to it, or in the file source.connection_string = {{ env = \"NAME\" }} or {{ file = \"/path\" }}",
                        crate::setting::setting_variable("source.connection_string")
                    ),
                });
            }
        }
        self.sink.validate(&self.event)?;
        crate::event::columns::ColumnRules::validate(&self.event.columns, &self.event.hash_key)?;
        self.validate_debezium()?;
        self.validate_registry()?;
        self.validate_databases()?;
        self.validate_kafka_store()?;
        self.validate_fleet()?;
        self.validate_file_paths()?;
        self.metrics.listen_address()?;
        if self.metrics.stalled_after.is_zero() {
            return Err(invalid(
                "metrics.stalled_after_ms",
                "must be more than 0 (the default is 300000)",
            ));
        }
        Ok(())
    }

    /// A file sink's output is none of the checkpoint's own files: the checkpoint,
    /// its lock, or its temporary file.
    fn validate_file_paths(&self) -> Result<(), ConfigError> {
        let (crate::sink::SinkConfig::File(file), CheckpointStoreKind::File) =
            (&self.sink.kind, self.checkpoint.store)
        else {
            return Ok(());
        };
        // The file as the system resolves it: `..` and links followed where the
        // directory exists, so `x/../cp.json` or a link to it is caught too.
        let absolute = |p: &Path| {
            let plain = std::path::absolute(p).unwrap_or_else(|_| p.to_owned());
            if let Ok(real) = std::fs::canonicalize(&plain) {
                return real;
            }
            match (plain.parent().map(std::fs::canonicalize), plain.file_name()) {
                (Some(Ok(dir)), Some(name)) => dir.join(name),
                _ => plain,
            }
        };
        let checkpoint = absolute(&self.checkpoint.path);
        let mut lock = checkpoint.clone().into_os_string();
        lock.push(".lock");
        let temp = checkpoint.with_file_name(format!(
            ".{}.tmp",
            checkpoint
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        let output = absolute(&file.path);
        if output == checkpoint || output.as_os_str() == lock || output == temp {
            return Err(invalid(
                "sink.path",
                format!(
                    "{} is one of the checkpoint's own files (checkpoint.path {}, its .lock or its temporary file): choose another path",
                    file.path.display(),
                    self.checkpoint.path.display()
                ),
            ));
        }
        Ok(())
    }

    /// Checks that every secret the configuration needs can be read (without keeping
    /// it), so a missing one is reported before any connection is tried.
    pub fn check_secrets(&self) -> Result<(), ConfigError> {
        if self.source.kind == SourceKind::Sqlserver {
            self.sql_server()?;
        }
        self.sink.kind.check_secrets()?;
        self.event.column_rules()?;
        if let Some(registry) = &self.sink.routing.schema_registry
            && registry.password.is_set()
        {
            registry.password.resolve("sink.schema_registry.password")?;
        }
        Ok(())
    }

    /// The poll loop's settings.
    pub fn poller(&self) -> Result<PollerConfig, ConfigError> {
        let s = &self.source;
        Ok(PollerConfig {
            page_size: s.page_size,
            batch_size: s.batch_size,
            on_gap: s.on_gap,
            time_zone: TimeZoneSetting::parse(&s.time_zone)
                .map_err(|e| invalid("source.time_zone", e.to_string()))?,
            filter: TableFilter::new(s.include.clone(), s.exclude.clone()),
            start_position: s.start_position,
            catalog_refresh: s.catalog_refresh,
            stream_guid: self.event.stream_guid,
            unreadable_grace: s.unreadable_grace,
            capture_ddl_retry: PollerConfig::default().capture_ddl_retry,
            snapshot: self.snapshot.mode,
            load_chunk: self.snapshot.chunk_size,
            load_connections: self.snapshot.max_connections,
            schema_changes: self.sink.routing.schema_changes
                != crate::sink::settings::SchemaChangePlacement::Off,
            capture_instances: s.capture_instances,
            enable_cdc: s.enable_cdc,
            columns: std::sync::Arc::new(self.event.column_rules()?),
            allow_unmatched_column_rules: self.event.allow_unmatched_column_rules
                || self.many_databases(),
            // Read for the metrics, as often as the catalog.
            cdc_jobs_every: self.metrics.listen.is_some().then_some(s.catalog_refresh),
            cleanup: s.cleanup,
            cleanup_interval: s.cleanup_interval,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shipped example loads and passes the checks made before connecting
    /// (secrets are read only by `check_secrets`, not here).
    #[test]
    fn every_example_configuration_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let mut loaded = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            // docker.toml takes its connection string from the compose file's
            // environment (MSSQL_CES__SOURCE__CONNECTION_STRING), not from itself.
            if path.extension().is_some_and(|e| e == "toml") && !path.ends_with("docker.toml") {
                Config::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                loaded += 1;
            }
        }
        assert!(loaded >= 5, "{loaded} examples");
    }
    use crate::event::Encoding;
    use crate::sink::SinkConfig;
    use crate::sink::event_hubs_amqp::config::{EntraCredentialKind, EventHubsAmqpSinkConfig};
    use crate::sink::kafka::{Compression, KafkaSinkConfig, Partitioner};
    use crate::sink::settings::PartitionKeyScheme;
    use crate::sink::stream::{FileSinkConfig, StdoutSinkConfig};

    use crate::sink::settings::SchemaChangePlacement;

    const MINIMAL: &str = r#"
[source]
kind = "synthetic"

[sink]
kind = "stdout"
"#;

    const KAFKA: &str = r#"
[source]
kind = "synthetic"

[sink]
kind = "kafka"
bootstrap_servers = "localhost:9092"
"#;

    fn load(text: &str) -> Result<Config, ConfigError> {
        Config::from_parts(text, &[], &[])
    }

    #[test]
    fn a_transaction_may_not_stay_open_as_long_as_a_delivery_may_wait() {
        let eo =
            "exactly_once = true\ndelivery_timeout_ms = 5000\n[checkpoint]\nstore = \"kafka\"\n";
        let with = |max: &str| load(&format!("{KAFKA}transaction_max_ms = {max}\n{eo}"));
        assert!(with("4999").is_ok());
        let err = with("5000").unwrap_err().to_string();
        assert!(
            err.contains("sink.transaction_max_ms") && err.contains("5000 ms"),
            "{err}"
        );
        // Without exactly_once it is not used, and not held to anything.
        assert!(
            load(&format!(
                "{KAFKA}transaction_max_ms = 9999999\ndelivery_timeout_ms = 5000\n"
            ))
            .is_ok()
        );
    }

    #[test]
    fn a_debezium_record_s_bound_is_the_producer_s_not_ces_s_segment_size() {
        let debezium =
            |extra: &str| load(&format!("{KAFKA}{extra}\n[event]\nformat = \"debezium\"\n"));
        // Kafka's own default, less room for the key and headers.
        let c = debezium("").unwrap();
        assert_eq!(c.sink.kind.record_bound().bytes, 1_048_588 - 1024);
        let c = debezium("kafka = { \"message.max.bytes\" = \"5000000\" }").unwrap();
        assert_eq!(c.sink.kind.record_bound().bytes, 5_000_000 - 1024);
        assert_eq!(
            c.sink.kind.largest_message(&c.event).bytes,
            5_000_000 - 1024
        );
        let err = debezium("kafka = { \"message.max.bytes\" = \"lots\" }").unwrap_err();
        assert!(err.to_string().contains("message.max.bytes"), "{err}");
        // With CES, segments are event.max_message_size_kb and the property is owned.
        let err = load(&format!(
            "{KAFKA}kafka = {{ \"message.max.bytes\" = \"5000000\" }}\n"
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("event.max_message_size_kb"),
            "{err}"
        );
        // CES's segment size does not bound a record: set, it is refused by name.
        let err = load(&format!(
            "{KAFKA}\n[event]\nformat = \"debezium\"\nmax_message_size_kb = 512\n"
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("event.max_message_size_kb")
                && err.to_string().contains("sink.kafka.\"message.max.bytes\""),
            "{err}"
        );
        // A file or stdout takes a record of any size.
        let c = load(&format!("{MINIMAL}\n[event]\nformat = \"debezium\"\n")).unwrap();
        assert_eq!(c.sink.kind.record_bound().bytes, usize::MAX);
    }

    #[test]
    fn a_topic_template_s_own_text_must_be_a_topic_name() {
        assert!(
            load(&format!(
                "{KAFKA}topic = \"ces.{{db}}.{{schema}}.{{tbl}}\"\n"
            ))
            .is_ok()
        );
        let spaced = load(&format!("{KAFKA}topic = \"sales orders\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            spaced.contains("sink.topic") && spaced.contains("' '"),
            "{spaced}"
        );
        let schema = load(&format!(
            "{KAFKA}schema_changes = \"topic\"\nschema_topic = \"ddl/{{tbl}}\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(schema.contains("sink.schema_topic"), "{schema}");
        // Lines on stdout carry no topic name.
        assert!(load(&format!("{MINIMAL}topic = \"any name\"\n")).is_ok());
    }

    fn kafka(c: &Config) -> &KafkaSinkConfig {
        match &c.sink.kind {
            SinkConfig::Kafka(k) | SinkConfig::EventHubsKafka(k) => k,
            other => panic!("not a Kafka sink: {other:?}"),
        }
    }

    fn amqp(c: &Config) -> &EventHubsAmqpSinkConfig {
        match &c.sink.kind {
            SinkConfig::EventHubsAmqp(a) => a,
            other => panic!("not an AMQP sink: {other:?}"),
        }
    }

    #[test]
    fn defaults_fill_a_minimal_file() {
        let c = load(MINIMAL).unwrap();
        assert_eq!(c.event.max_message_size_kb.kb(), 256);
        assert_eq!(c.sink.routing.partition_key, PartitionKeyScheme::Table);
        assert_eq!(c.sink.kind, SinkConfig::Stdout(StdoutSinkConfig {}));
        assert_eq!(c.checkpoint.store, CheckpointStoreKind::File);
        assert_eq!(c.source.synthetic.transactions, 10_000);
        assert_eq!(c.event.encoding, Encoding::Json);
    }

    #[test]
    fn the_check_timeout_defaults_to_10_s_and_is_set_in_ms() {
        assert_eq!(
            load(MINIMAL).unwrap().check.timeout,
            Duration::from_secs(10)
        );
        let set = load(&format!("{MINIMAL}\n[check]\ntimeout_ms = 1500\n")).unwrap();
        assert_eq!(set.check.timeout, Duration::from_millis(1500));
        let err = load(&format!("{MINIMAL}\n[check]\ntimeout = 1\n")).unwrap_err();
        assert!(err.to_string().contains("timeout"), "{err}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = load(&format!("{MINIMAL}\n[event]\nmax_mesage_size_kb = 256\n")).unwrap_err();
        assert!(err.to_string().contains("max_mesage_size_kb"), "{err}");
        let err = load("[source]\nkind = \"synthetic\"\ncolour = 1\n[sink]\nkind = \"stdout\"")
            .unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn the_admin_endpoint_is_off_by_default_and_needs_the_metrics_server() {
        let c = load(MINIMAL).unwrap();
        assert_eq!(c.metrics.admin, AdminAccess::Off);
        let c = load(&format!(
            "{MINIMAL}\n[metrics]\nlisten = \"127.0.0.1:9187\"\nadmin = \"loopback\"\n"
        ))
        .unwrap();
        assert_eq!(c.metrics.admin, AdminAccess::Loopback);
        assert!(c.metrics.listen_address().unwrap().is_some());
        let err = load(&format!("{MINIMAL}\n[metrics]\nadmin = \"any\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("metrics.admin") && err.contains("metrics.listen"),
            "{err}"
        );
        let err = load(&format!("{MINIMAL}\n[metrics]\nadmin = \"everyone\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("admin"), "{err}");
    }

    #[test]
    fn snapshot_settings_default_to_never_and_are_checked_by_name() {
        let c = load(MINIMAL).unwrap();
        assert_eq!(c.snapshot.mode, SnapshotMode::Never);
        assert_eq!(c.poller().unwrap().snapshot, SnapshotMode::Never);
        let c = load(&format!(
            "{MINIMAL}\n[snapshot]\nmode = \"when_needed\"\nchunk_size = 100000\n"
        ))
        .unwrap();
        let poller = c.poller().unwrap();
        assert_eq!(poller.snapshot, SnapshotMode::WhenNeeded);
        assert_eq!(poller.load_chunk, 100_000);
        for bad in ["chunk_size = 0", "chunk_size = 100001"] {
            let err = load(&format!("{MINIMAL}\n[snapshot]\n{bad}\n")).unwrap_err();
            assert!(err.to_string().contains("snapshot.chunk_size"), "{err}");
        }
        let err = load(&format!("{MINIMAL}\n[snapshot]\nmode = \"always\"\n")).unwrap_err();
        assert!(err.to_string().contains("always"), "{err}");
    }

    #[test]
    fn out_of_range_message_size_names_the_setting() {
        let err = load(&format!("{MINIMAL}\n[event]\nmax_message_size_kb = 2000\n")).unwrap_err();
        assert!(err.to_string().contains("max_message_size_kb"), "{err}");
    }

    #[test]
    fn event_hubs_rejects_lz4() {
        let text = r#"
[source]
kind = "synthetic"
[sink]
kind = "event_hubs_kafka"
compression = "lz4"
connection_string = { env = "EH" }
"#;
        let err = load(text).unwrap_err();
        assert!(err.to_string().contains("sink.compression"), "{err}");
    }

    #[test]
    fn amqp_needs_a_connection_string_or_entra_with_a_namespace() {
        let base = "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"event_hubs_amqp\"\n";
        let err = load(base).unwrap_err();
        assert!(err.to_string().contains("sink.connection_string"), "{err}");
        let err = load(&format!(
            "{base}entra_credential = \"managed_identity\"\ntopic = \"hub\"\n"
        ))
        .unwrap_err();
        assert!(err.to_string().contains("sink.namespace"), "{err}");
        let ok = format!(
            "{base}entra_credential = \"workload_identity\"\nnamespace = \"ns.servicebus.windows.net\"\ntopic = \"hub\"\n"
        );
        assert_eq!(
            amqp(&load(&ok).unwrap()).entra_credential,
            Some(EntraCredentialKind::WorkloadIdentity)
        );
        assert!(load(&format!("{base}connection_string = {{ env = \"X\" }}\n")).is_ok());
    }

    #[test]
    fn missing_secrets_and_conflicting_passthrough_are_named() {
        let err = load("[source]\nkind = \"sqlserver\"\n[sink]\nkind = \"stdout\"").unwrap_err();
        assert!(
            err.to_string().contains("source.connection_string"),
            "{err}"
        );
        let secret = SecretRef {
            env: Some("MSSQL_CES_TEST_SURELY_UNSET_VARIABLE".into()),
            file: None,
        };
        let err = secret.resolve("source.connection_string").unwrap_err();
        assert!(
            err.to_string()
                .contains("MSSQL_CES_TEST_SURELY_UNSET_VARIABLE"),
            "{err}"
        );
        let text = format!(
            "{}\n[sink.kafka]\n\"enable.idempotence\" = \"false\"\n",
            MINIMAL.replace(
                "kind = \"stdout\"",
                "kind = \"kafka\"\nbootstrap_servers = \"x:9092\""
            )
        );
        let err = load(&text).unwrap_err();
        assert!(err.to_string().contains("enable.idempotence"), "{err}");
    }

    #[test]
    fn a_renamed_setting_says_its_new_name_wherever_it_was_given() {
        let err = load(&MINIMAL.replace("[sink]", "catalog_refresh_s = 30\n[sink]"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("source.catalog_refresh_s: is now source.catalog_refresh_ms"),
            "{err}"
        );
        let env = vec![(
            "MSSQL_CES__SOURCE__CATALOG_REFRESH_S".to_owned(),
            "30".to_owned(),
        )];
        let err = Config::from_parts(MINIMAL, &env, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("catalog_refresh_ms"), "{err}");
        assert!(
            err.contains("(set by the environment variable MSSQL_CES__SOURCE__CATALOG_REFRESH_S)"),
            "{err}"
        );
        // In the file, no variable is blamed, not even one that set something else.
        let unrelated = vec![Override::parse("sink.topic", "orders")];
        let err = Config::from_parts(
            &MINIMAL.replace("[sink]", "catalog_refresh_s = 30\n[sink]"),
            &[],
            &unrelated,
        )
        .unwrap_err()
        .to_string();
        assert!(!err.contains("set by"), "{err}");
        let ms = vec![Override::parse("source.catalog_refresh_ms", "250")];
        let c = Config::from_parts(MINIMAL, &[], &ms).unwrap();
        assert_eq!(
            c.poller().unwrap().catalog_refresh,
            Duration::from_millis(250)
        );
    }

    #[test]
    fn environment_and_flags_override_the_file() {
        let env = vec![
            ("MSSQL_CES__SINK__KIND".to_string(), "file".to_string()),
            (
                "MSSQL_CES__SINK__PATH".to_string(),
                "/tmp/out.ndjson".to_string(),
            ),
            (
                "MSSQL_CES__SOURCE__SYNTHETIC__SEED".to_string(),
                "7".to_string(),
            ),
            (
                "MSSQL_CES__SOURCE__INCLUDE".to_string(),
                "[\"dbo.*\"]".to_string(),
            ),
            ("UNRELATED".to_string(), "x".to_string()),
        ];
        let flags = vec![Override::flag("--encoding", "event.encoding", "avro")];
        let c = Config::from_parts(MINIMAL, &env, &flags).unwrap();
        assert_eq!(
            c.sink.kind,
            SinkConfig::File(FileSinkConfig {
                path: PathBuf::from("/tmp/out.ndjson")
            })
        );
        assert_eq!(c.source.synthetic.seed, 7);
        assert_eq!(c.source.include, ["dbo.*"]);
        assert_eq!(c.event.encoding, Encoding::Avro);
        let bad = vec![("MSSQL_CES__SINK__COLOUR".to_string(), "x".to_string())];
        let err = Config::from_parts(MINIMAL, &bad, &[]).unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    const EVENT_HUBS: &str = r#"
[source]
kind = "synthetic"

[sink]
kind = "event_hubs_kafka"
topic = "hub"
"#;

    const SECRET: &str = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=SUPERSECRET";

    #[test]
    fn a_secret_written_as_a_value_is_refused_without_echoing_it() {
        let text = format!("{EVENT_HUBS}connection_string = \"{SECRET}\"\n");
        let err = load(&text).unwrap_err().to_string();
        assert!(!err.contains("SUPERSECRET"), "{err}");
        assert!(err.contains("env"), "says what to write instead: {err}");
        let flags = vec![Override::parse("sink.connection_string", SECRET)];
        let err = Config::from_parts(EVENT_HUBS, &[], &flags)
            .unwrap_err()
            .to_string();
        assert!(!err.contains("SUPERSECRET"), "{err}");
        assert!(err.contains("MSSQL_CES__SINK__CONNECTION_STRING"), "{err}");
    }

    #[test]
    fn the_secret_settings_environment_variable_holds_the_secret_itself() {
        let name = "MSSQL_CES__SINK__CONNECTION_STRING";
        let env = vec![(name.to_string(), SECRET.to_string())];
        let c = Config::from_parts(EVENT_HUBS, &env, &[]).unwrap();
        assert_eq!(kafka(&c).connection_string.env.as_deref(), Some(name));
        assert!(!format!("{c:?}").contains("SUPERSECRET"));
    }

    /// An error names the setting where the user can find it: a mistyped key of a
    /// sink lists what that sink takes, a key from the environment names the
    /// variable, and no Rust type name reaches the user.
    #[test]
    fn configuration_errors_point_at_what_the_user_wrote() {
        let flags = vec![Override::parse("sink.topik", "x")];
        let err = Config::from_parts(MINIMAL, &[], &flags)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sink.topik: not a setting of a stdout sink"),
            "{err}"
        );
        assert!(
            err.contains("`topic`") && err.contains("`partition_key`"),
            "{err}"
        );
        assert!(!err.contains("no fields"), "{err}");
        let env = vec![("MSSQL_CES__SINK__TOPIK".to_owned(), "x".to_owned())];
        let err = Config::from_parts(MINIMAL, &env, &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the environment variable MSSQL_CES__SINK__TOPIK"),
            "{err}"
        );
        let env = vec![(
            "MSSQL_CES__SOURCE__POLL_INTERVAL_MS".to_owned(),
            "abc".to_owned(),
        )];
        let err = Config::from_parts(MINIMAL, &env, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a whole number"), "{err}");
        assert!(err.contains("MSSQL_CES__SOURCE__POLL_INTERVAL_MS"), "{err}");
        let flags = vec![Override::parse("source", "1")];
        let err = Config::from_parts(MINIMAL, &[], &flags)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a section"), "{err}");
        assert!(
            !err.contains("SourceSettings") && !err.contains("struct"),
            "{err}"
        );
        // A mistake in the file itself is not blamed on a variable.
        let err = load(&format!("{MINIMAL}colour = 1\n"))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("set by"), "{err}");
    }

    /// An error names the layer that gave the value: of two for one setting the later,
    /// and a variable still when a flag set something else.
    #[test]
    fn errors_name_the_layer_that_gave_the_value() {
        let env = vec![("MSSQL_CES__SOURCE__PAGE_SIZE".to_owned(), "many".to_owned())];
        let flags = vec![Override::parse("sink.topic", "orders")];
        let err = Config::from_parts(MINIMAL, &env, &flags)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("(set by the environment variable MSSQL_CES__SOURCE__PAGE_SIZE)"),
            "{err}"
        );
        // Of two variables in the section whose reader reports the error, the one
        // the error names.
        let env = vec![
            ("MSSQL_CES__SINK__TOPIC".to_owned(), "orders".to_owned()),
            ("MSSQL_CES__SINK__TOPIK".to_owned(), "x".to_owned()),
        ];
        let err = Config::from_parts(MINIMAL, &env, &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("(set by the environment variable MSSQL_CES__SINK__TOPIK)"),
            "{err}"
        );
        let env = vec![("MSSQL_CES__SOURCE__PAGE_SIZE".to_owned(), "many".to_owned())];
        let flags = vec![Override::parse("source.page_size", "lots")];
        let err = Config::from_parts(MINIMAL, &env, &flags)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"lots\" (set by --set source.page_size)"),
            "{err}"
        );
        assert!(!err.contains("MSSQL_CES__SOURCE__PAGE_SIZE"), "{err}");
    }

    /// A bad value names the flag the user typed, and a negative number is said as
    /// such, not in serde's words.
    #[test]
    fn value_errors_name_the_flag_and_say_negative_numbers_plainly() {
        let flags = vec![Override::flag("--encoding", "event.encoding", "protobuf")];
        let err = Config::from_parts(MINIMAL, &[], &flags)
            .unwrap_err()
            .to_string();
        assert!(err.contains("(set by --encoding)"), "{err}");
        let set = vec![Override::parse("source.poll_interval_ms", "-5")];
        let err = Config::from_parts(MINIMAL, &[], &set)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "source.poll_interval_ms: `-5` must not be negative (a whole number, 0 or more)"
            ) && err.contains("(set by --set source.poll_interval_ms)")
                && !err.contains("u64"),
            "{err}"
        );
    }

    /// Variables named like this program's that nothing reads are said by name
    /// (never their values); the settings' prefix is read in any case.
    #[test]
    fn environment_variables_that_name_no_setting_are_said() {
        let text = "[source]\nkind = \"sqlserver\"\nconnection_string = { env = \"MSSQL_CES_CONNECTION_STRING\" }\n[sink]\nkind = \"kafka\"\nbootstrap_servers = \"localhost:9092\"\n";
        let env: Vec<(String, String)> = [
            ("MSSQL_CES_SINK__TOPIC", "one-underscore-value"),
            ("MSSQL_CES_CONNECTION_STRING", "Server=x"),
            ("mssql_ces__sink__topic", "orders"),
            ("MSSQL_CESSPOOL", "x"),
            ("PATH", "/bin"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let (config, notices) = Config::from_parts_noting(text, &env, &[]).unwrap();
        assert_eq!(config.sink.routing.topic.as_deref(), Some("orders"));
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert!(
            notices[0].contains("MSSQL_CES_SINK__TOPIC")
                && notices[0].contains("MSSQL_CES__<SECTION>__<KEY>"),
            "{notices:?}"
        );
        assert!(!notices[0].contains("one-underscore-value"), "{notices:?}");
        // A missing secret names the variable that would hold it.
        let err = load("[source]\nkind = \"sqlserver\"\n[sink]\nkind = \"stdout\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("MSSQL_CES__SOURCE__CONNECTION_STRING"),
            "{err}"
        );
    }

    /// librdkafka's enumerations in any case, as librdkafka takes them and Kafka's
    /// guides write them; a value that is none of them lists those that are.
    #[test]
    fn kafka_s_own_spellings_of_its_enumerations_are_taken() {
        let spelled = "security_protocol = \"SASL_SSL\"\nsasl_mechanism = \"scram-sha-256\"\nsasl_username = \"u\"\nsasl_password = { env = \"P\" }\ncompression = \"ZSTD\"\npartitioner = \"Murmur2\"\n";
        let c = load(&format!("{KAFKA}{spelled}")).unwrap();
        let k = kafka(&c);
        assert_eq!(k.security_protocol.as_str(), "sasl_ssl");
        assert_eq!(k.sasl_mechanism.map(|m| m.as_str()), Some("SCRAM-SHA-256"));
        assert_eq!(k.compression.map(Compression::as_str), Some("zstd"));
        assert_eq!(k.partitioner.as_str(), "murmur2");
        let err = load(&format!("{KAFKA}security_protocol = \"SASL_TLS\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("security_protocol")
                && err.contains("`sasl_ssl`")
                && err.contains("SASL_TLS"),
            "{err}"
        );
    }

    /// Kafka's login and TLS settings: typed, checked together, each error naming
    /// the setting; the pass-through properties they own are refused by name.
    #[test]
    fn kafka_security_settings_are_typed_and_checked_together() {
        let sasl = "security_protocol = \"sasl_ssl\"\nsasl_mechanism = \"SCRAM-SHA-512\"\nsasl_username = \"u\"\nsasl_password = { env = \"KAFKA_PASSWORD\" }\nssl_ca_location = \"/etc/ca.pem\"\n";
        let c = load(&format!("{KAFKA}{sasl}")).unwrap();
        let k = kafka(&c);
        assert_eq!(k.sasl_mechanism.map(|m| m.as_str()), Some("SCRAM-SHA-512"));
        assert_eq!(k.sasl_password.env.as_deref(), Some("KAFKA_PASSWORD"));
        let cases = [
            (
                "security_protocol = \"sasl_ssl\"\nsasl_username = \"u\"\nsasl_password = { env = \"P\" }\n",
                "sink.sasl_mechanism",
            ),
            (
                "security_protocol = \"sasl_ssl\"\nsasl_mechanism = \"PLAIN\"\nsasl_password = { env = \"P\" }\n",
                "sink.sasl_username",
            ),
            (
                "security_protocol = \"sasl_ssl\"\nsasl_mechanism = \"PLAIN\"\nsasl_username = \"u\"\n",
                "sink.sasl_password",
            ),
            ("sasl_username = \"u\"\n", "sink.security_protocol"),
            ("ssl_ca_location = \"/ca.pem\"\n", "sink.security_protocol"),
            (
                "security_protocol = \"ssl\"\nssl_certificate_location = \"/c.pem\"\n",
                "sink.ssl_certificate_location",
            ),
            (
                "security_protocol = \"sasl_ssl\"\nsasl_mechanism = \"OAUTHBEARER\"\nsasl_username = \"u\"\nsasl_password = { env = \"P\" }\n",
                "OIDC",
            ),
            (
                "[sink.kafka]\n\"security.protocol\" = \"SASL_SSL\"\n",
                "sink.security_protocol",
            ),
            (
                "[sink.kafka]\n\"sasl.username\" = \"u\"\n",
                "sink.sasl_username",
            ),
            (
                "[sink.kafka]\n\"sasl.password\" = \"x\"\n",
                "sink.sasl_password",
            ),
        ];
        for (extra, named) in cases {
            let err = load(&format!("{KAFKA}{extra}")).unwrap_err().to_string();
            assert!(err.contains(named), "{extra}: {err}");
        }
        let err = load(&format!(
            "{EVENT_HUBS}connection_string = {{ env = \"X\" }}\nsecurity_protocol = \"sasl_ssl\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("Event Hubs"), "{err}");
        // The password itself from the environment, never in the tree.
        let env = vec![(
            "MSSQL_CES__SINK__SASL_PASSWORD".to_owned(),
            "HUNTER2".to_owned(),
        )];
        let c = Config::from_parts(&format!("{KAFKA}security_protocol = \"sasl_ssl\"\nsasl_mechanism = \"PLAIN\"\nsasl_username = \"u\"\n"), &env, &[]).unwrap();
        assert_eq!(
            kafka(&c).sasl_password.env.as_deref(),
            Some("MSSQL_CES__SINK__SASL_PASSWORD")
        );
        assert!(!format!("{c:?}").contains("HUNTER2"));
    }

    /// The table checkpoint store writes where the database can be written: the
    /// source's string without a read-only intent by default, or its own.
    #[test]
    fn the_table_store_connects_read_write_or_where_it_is_told() {
        let dir = std::env::temp_dir().join(format!("mssql-ces-cp-conn-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("source");
        std::fs::write(
            &source,
            "Server=tcp:ag-listener,1433;Database=Shop;User Id=u;Password=p;ApplicationIntent=ReadOnly",
        )
        .unwrap();
        let primary = dir.join("primary");
        std::fs::write(
            &primary,
            "Server=tcp:primary,1433;Database=Shop;User Id=w;Password=q",
        )
        .unwrap();
        let text = |own: &str| {
            format!(
                "[source]\nkind = \"sqlserver\"\nconnection_string = {{ file = \"{}\" }}\n[sink]\nkind = \"stdout\"\n[checkpoint]\nstore = \"table\"\n{own}",
                source.display()
            )
        };
        let c = load(&text("")).unwrap();
        assert!(c.sql_server().unwrap().connection_string.read_only_intent());
        let store = c.checkpoint_sql_server().unwrap().connection_string;
        assert!(!store.read_only_intent());
        assert!(store.expose().contains("Server=tcp:ag-listener,1433"));
        let own = format!(
            "connection_string = {{ file = \"{}\" }}\n",
            primary.display()
        );
        let c = load(&text(&own)).unwrap();
        let store = c.checkpoint_sql_server().unwrap().connection_string;
        assert_eq!(
            store.server_and_database().0.as_deref(),
            Some("tcp:primary,1433")
        );
        // A secret, like the source's: never on the command line.
        let err = Config::from_parts(
            &text(""),
            &[],
            &[Override::parse("checkpoint.connection_string", "Server=x")],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("MSSQL_CES__CHECKPOINT__CONNECTION_STRING"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).ok();
    }

    /// The file sink may not write over the checkpoint, its lock or its temporary
    /// file.
    #[test]
    fn a_file_sink_on_the_checkpoints_own_files_is_refused() {
        for output in [
            "cp.json",
            "cp.json.lock",
            ".cp.json.tmp",
            "./cp.json",
            "src/../cp.json",
        ] {
            let text = format!(
                "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"file\"\npath = \"{output}\"\n[checkpoint]\npath = \"cp.json\"\n"
            );
            let err = load(&text).unwrap_err().to_string();
            assert!(
                err.contains("sink.path") && err.contains("checkpoint"),
                "{output}: {err}"
            );
        }
        let text = "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"file\"\npath = \"out.jsonl\"\n[checkpoint]\npath = \"cp.json\"\n";
        assert!(load(text).is_ok());
    }

    /// A partitioner that ignores keys would scatter one key's events and one
    /// event's segments: refused by name.
    #[test]
    fn a_partitioner_that_ignores_keys_is_refused() {
        let err = load(&format!("{KAFKA}partitioner = \"random\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sink.partitioner") && err.contains("ignores keys"),
            "{err}"
        );
        assert!(load(&format!("{KAFKA}partitioner = \"consistent_random\"\n")).is_ok());
    }

    /// The log's destination line: brokers, namespace (never the key), file or
    /// stdout; and the SQL Server source's server and database, never its password.
    #[test]
    fn where_events_go_and_come_from_is_described_without_secrets() {
        assert_eq!(
            load(KAFKA).unwrap().sink.kind.describe(),
            "Kafka at localhost:9092"
        );
        assert_eq!(load(MINIMAL).unwrap().sink.kind.describe(), "stdout");
        let path =
            std::env::temp_dir().join(format!("mssql-ces-describe-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, SECRET).unwrap();
        for kind in ["event_hubs_kafka", "event_hubs_amqp"] {
            let text = format!(
                "{}connection_string = {{ file = \"{}\" }}\n",
                EVENT_HUBS.replace("event_hubs_kafka", kind),
                path.display()
            );
            let described = load(&text).unwrap().sink.kind.describe();
            assert!(
                described.starts_with("Event Hubs ns.servicebus.windows.net ("),
                "{described}"
            );
            assert!(!described.contains("SUPERSECRET"), "{described}");
        }
        std::fs::remove_file(&path).ok();
        let cs = crate::mssql::ConnectionString::new(
            "Server=tcp:db.example.com,1433;Initial Catalog=Shop;User Id=u;Password=SUPERSECRET",
        );
        assert_eq!(
            cs.server_and_database(),
            (Some("tcp:db.example.com,1433".into()), Some("Shop".into()))
        );
    }

    #[test]
    fn every_sinks_secret_is_checked_before_anything_connects() {
        let amqp = "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"event_hubs_amqp\"\ntopic = \"hub\"\nconnection_string = { env = \"MSSQL_CES_TEST_UNSET_VARIABLE\" }\n";
        let c = load(amqp).unwrap();
        let err = c.check_secrets().unwrap_err();
        assert!(matches!(err, ConfigError::MissingSecret { .. }), "{err}");
        // A string without Endpoint= is refused before connecting, not echoed.
        let path = std::env::temp_dir().join(format!("mssql-ces-secret-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, "SharedAccessKey=SUPERSECRET").unwrap();
        let text = format!(
            "{EVENT_HUBS}connection_string = {{ file = \"{}\" }}\n",
            path.display()
        );
        let err = load(&text)
            .unwrap()
            .check_secrets()
            .unwrap_err()
            .to_string();
        assert!(err.contains("Endpoint="), "{err}");
        assert!(!err.contains("SUPERSECRET"), "{err}");
        std::fs::remove_file(path).ok();
    }

    #[test]
    fn overrides_reach_pass_through_keys_and_keep_text_settings_text() {
        let flags = vec![Override::parse("sink.kafka.\"linger.ms\"", "5")];
        let c = Config::from_parts(KAFKA, &[], &flags).unwrap();
        assert_eq!(
            kafka(&c).kafka.get("linger.ms").map(String::as_str),
            Some("5")
        );
        let env = vec![
            ("MSSQL_CES__SINK__TOPIC".to_string(), "2024".to_string()),
            (
                "MSSQL_CES__CHECKPOINT__STREAM_NAME".to_string(),
                "1".to_string(),
            ),
            (
                "MSSQL_CES__SOURCE__SYNTHETIC__SEED".to_string(),
                "42".to_string(),
            ),
        ];
        let c = Config::from_parts(MINIMAL, &env, &[]).unwrap();
        assert_eq!(c.sink.routing.topic.as_deref(), Some("2024"));
        assert_eq!(c.checkpoint.stream_name, "1");
        assert_eq!(
            c.source.synthetic.seed, 42,
            "numbers stay numbers where meant"
        );
        // A flag overrides the environment, in the text fallback too.
        let flags = vec![Override::parse("checkpoint.stream_name", "2")];
        let c = Config::from_parts(MINIMAL, &env, &flags).unwrap();
        assert_eq!(c.checkpoint.stream_name, "2");
        // A typo elsewhere is reported as itself, not blamed on a numeric override.
        let env = vec![(
            "MSSQL_CES__CHECKPOINT__INTERVAL_MS".to_string(),
            "7".to_string(),
        )];
        let err = Config::from_parts(
            &format!("{MINIMAL}\n[event]\nencodin = \"json\"\n"),
            &env,
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("encodin"), "{err}");
        assert!(!err.contains("interval_ms"), "{err}");
        // The text as typed, not the number's own text.
        let flags = vec![
            Override::parse("sink.topic", "007"),
            Override::parse("checkpoint.stream_name", "1e3"),
        ];
        let c = Config::from_parts(MINIMAL, &[], &flags).unwrap();
        assert_eq!(c.sink.routing.topic.as_deref(), Some("007"));
        assert_eq!(c.checkpoint.stream_name, "1e3");
        // Quoted as in the file, the text is what the quotes hold.
        let flags = vec![
            Override::parse("sink.topic", "\"007\""),
            Override::parse("log.format", "\"json\""),
        ];
        let c = Config::from_parts(MINIMAL, &[], &flags).unwrap();
        assert_eq!(c.sink.routing.topic.as_deref(), Some("007"));
        assert_eq!(c.log.format, LogFormat::Json);
        // Text for a number is still an error naming the setting.
        let bad = vec![(
            "MSSQL_CES__SOURCE__PAGE_SIZE".to_string(),
            "many".to_string(),
        )];
        let err = Config::from_parts(MINIMAL, &bad, &[]).unwrap_err();
        assert!(err.to_string().contains("page_size"), "{err}");
        // A number out of its range is reported as such, not as text of the wrong type.
        let flags = [Override::parse("event.max_message_size_kb", "64")];
        let env = [(
            "MSSQL_CES__EVENT__MAX_MESSAGE_SIZE_KB".to_string(),
            "2048".to_string(),
        )];
        for (env, flags) in [(&[][..], &flags[..]), (&env[..], &[][..])] {
            let err = Config::from_parts(MINIMAL, env, flags)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("outside the allowed range 128..=1024"),
                "{err}"
            );
            assert!(!err.contains("invalid type"), "{err}");
        }
    }

    #[test]
    fn schema_change_placement_is_checked_against_the_partition_key_and_the_sink() {
        let off = load(KAFKA).unwrap();
        assert_eq!(off.sink.routing.schema_changes, SchemaChangePlacement::Off);
        assert!(!off.poller().unwrap().schema_changes);
        let inline = load(&format!("{KAFKA}schema_changes = \"inline\"\n")).unwrap();
        assert!(inline.poller().unwrap().schema_changes);
        let stream_group =
            format!("{KAFKA}schema_changes = \"inline\"\npartition_key = \"stream_group\"\n");
        assert!(load(&stream_group).is_ok());
        for scheme in ["none", "primary_key", "column"] {
            let spread = format!(
                "{KAFKA}schema_changes = \"inline\"\npartition_key = \"{scheme}\"\npartition_key_column = \"Id\"\n"
            );
            let err = load(&spread).unwrap_err().to_string();
            assert!(
                err.contains("sink.schema_changes") && err.contains(&format!("\"{scheme}\"")),
                "{err}"
            );
        }
        let topic = load(&format!(
            "{KAFKA}topic = \"cdc.{{tbl}}\"\nschema_changes = \"topic\"\n"
        ))
        .unwrap();
        assert_eq!(topic.sink.routing.schema_topic(), "cdc.{tbl}.schema");
        let named = load(&format!(
            "{KAFKA}schema_changes = \"topic\"\nschema_topic = \"ddl\"\n"
        ))
        .unwrap();
        assert_eq!(named.sink.routing.schema_topic(), "ddl");
        assert_eq!(off.sink.routing.schema_topic(), "ces.schema");
        let stray = format!("{KAFKA}schema_topic = \"ddl\"\n");
        let err = load(&stray).unwrap_err().to_string();
        assert!(err.contains("sink.schema_topic"), "{err}");
        let amqp = "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"event_hubs_amqp\"\nnamespace = \"ns.servicebus.windows.net\"\ntopic = \"hub\"\nschema_changes = \"topic\"\n";
        let err = load(amqp).unwrap_err().to_string();
        assert!(
            err.contains("sink.schema_changes") && err.contains("one"),
            "{err}"
        );
        let err = load(&format!("{KAFKA}schema_changes = \"yes\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("schema_changes"), "{err}");
    }

    #[test]
    fn heartbeats_are_off_by_default_and_need_a_topic_of_their_own() {
        let off = load(KAFKA).unwrap();
        assert!(off.sink.routing.heartbeat_interval.is_zero());
        assert_eq!(off.sink.routing.heartbeat_topic(), "ces.heartbeat");
        let on = load(&format!(
            "{KAFKA}heartbeat_interval_ms = 10000\ntopic = \"orders\"\n"
        ))
        .unwrap();
        assert_eq!(
            on.sink.routing.heartbeat_interval,
            std::time::Duration::from_secs(10)
        );
        assert_eq!(on.sink.routing.heartbeat_topic(), "orders.heartbeat");
        let named = load(&format!(
            "{KAFKA}heartbeat_interval_ms = 1000\nheartbeat_topic = \"beats.{{db}}\"\n"
        ))
        .unwrap();
        assert_eq!(named.sink.routing.heartbeat_topic(), "beats.{db}");
        let stray = load(&format!("{KAFKA}heartbeat_topic = \"beats\"\n"))
            .unwrap_err()
            .to_string();
        assert!(stray.contains("sink.heartbeat_topic"), "{stray}");
        let bad_name = load(&format!(
            "{KAFKA}heartbeat_interval_ms = 1000\nheartbeat_topic = \"beats here\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(bad_name.contains("sink.heartbeat_topic"), "{bad_name}");
        for sink in [
            "kind = \"stdout\"",
            "kind = \"file\"\npath = \"out.jsonl\"",
            "kind = \"event_hubs_amqp\"\nnamespace = \"ns.servicebus.windows.net\"\ntopic = \"hub\"",
        ] {
            let err = load(&format!(
                "[source]\nkind = \"synthetic\"\n[sink]\n{sink}\nheartbeat_interval_ms = 1000\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("sink.heartbeat_interval_ms") && err.contains("topic of their own"),
                "{sink}: {err}"
            );
        }
    }

    #[test]
    fn cleanup_after_delivery_is_checked_before_connecting() {
        let sqlserver = "[source]\nkind = \"sqlserver\"\nconnection_string = { env = \"X\" }\n";
        let sink = "[sink]\nkind = \"stdout\"\n";
        let default = load(&format!("{sqlserver}{sink}"))
            .unwrap()
            .poller()
            .unwrap();
        assert_eq!(default.cleanup, crate::source::poller::CleanupMode::Agent);
        assert_eq!(default.cleanup_interval, Duration::from_secs(300));
        let after = load(&format!(
            "{sqlserver}cleanup = \"after_delivery\"\ncleanup_interval_ms = 1500\n{sink}"
        ))
        .unwrap()
        .poller()
        .unwrap();
        assert_eq!(
            after.cleanup,
            crate::source::poller::CleanupMode::AfterDelivery
        );
        assert_eq!(after.cleanup_interval, Duration::from_millis(1500));
        let zero = load(&format!(
            "{sqlserver}cleanup = \"after_delivery\"\ncleanup_interval_ms = 0\n{sink}"
        ))
        .unwrap_err()
        .to_string();
        assert!(zero.contains("source.cleanup_interval_ms"), "{zero}");
        let synthetic = MINIMAL.replace(
            "kind = \"synthetic\"\n",
            "kind = \"synthetic\"\ncleanup = \"after_delivery\"\n",
        );
        let err = load(&synthetic).unwrap_err().to_string();
        assert!(
            err.contains("source.cleanup") && err.contains("synthetic"),
            "{err}"
        );
        let unknown = load(&format!("{sqlserver}cleanup = \"daily\"\n{sink}"))
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("after_delivery"), "{unknown}");
    }

    #[test]
    fn managed_capture_instances_and_enable_cdc_are_checked_before_connecting() {
        let sqlserver = "[source]\nkind = \"sqlserver\"\nconnection_string = { env = \"X\" }\n";
        let sink = "[sink]\nkind = \"stdout\"\n";
        let managed = load(&format!(
            "{sqlserver}capture_instances = \"managed\"\n{sink}"
        ))
        .unwrap();
        let poller = managed.poller().unwrap();
        assert_eq!(poller.capture_instances, CaptureInstanceMode::Managed);
        assert!(!poller.enable_cdc);
        let err = load(&format!("{sqlserver}enable_cdc = true\n{sink}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("source.enable_cdc") && err.contains("source.include"),
            "{err}"
        );
        let all = load(&format!(
            "{sqlserver}enable_cdc = true\ninclude = [\"dbo.T\", \"*.*\"]\n{sink}"
        ))
        .unwrap_err()
        .to_string();
        assert!(all.contains("source.enable_cdc"), "{all}");
        let named = load(&format!(
            "{sqlserver}enable_cdc = true\ninclude = [\"dbo.T\"]\n{sink}"
        ))
        .unwrap();
        assert!(named.poller().unwrap().enable_cdc);
        let err = load(&format!("{sqlserver}capture_instances = \"auto\"\n{sink}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("capture_instances") && err.contains("managed"),
            "{err}"
        );
        let synthetic = MINIMAL.replace(
            "kind = \"synthetic\"\n",
            "kind = \"synthetic\"\ncapture_instances = \"managed\"\n",
        );
        let err = load(&synthetic).unwrap_err().to_string();
        assert!(
            err.contains("source.capture_instances") && err.contains("synthetic"),
            "{err}"
        );
    }

    #[test]
    fn sink_settings_that_cannot_deliver_are_refused_by_name() {
        let template = "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"event_hubs_amqp\"\ntopic = \"{schema}.{tbl}\"\nconnection_string = { env = \"X\" }\n";
        let err = load(template).unwrap_err().to_string();
        assert!(
            err.contains("sink.topic") && err.contains("template"),
            "{err}"
        );
        let big = format!(
            "{EVENT_HUBS}connection_string = {{ env = \"X\" }}\n[event]\nmax_message_size_kb = 1024\n"
        );
        let err = load(&big).unwrap_err().to_string();
        assert!(err.contains("event.max_message_size_kb"), "{err}");
        let fits = format!(
            "{EVENT_HUBS}connection_string = {{ env = \"X\" }}\n[event]\nmax_message_size_kb = 1019\n"
        );
        assert!(load(&fits).is_ok());
        let partitioner = format!("{KAFKA}partitioner = \"consistent_random\"\n");
        assert_eq!(
            kafka(&load(&partitioner).unwrap()).partitioner,
            Partitioner::ConsistentRandom
        );
        let binary_file = format!("{MINIMAL}mode = \"binary\"\n");
        let err = load(&binary_file).unwrap_err().to_string();
        assert!(err.contains("sink.mode"), "{err}");
        let zero = format!("{KAFKA}delivery_timeout_ms = 0\n");
        let err = load(&zero).unwrap_err().to_string();
        assert!(err.contains("sink.delivery_timeout_ms"), "{err}");
        // A setting of another kind is refused, by name, not ignored.
        let err = load(&format!("{MINIMAL}partitioner = \"murmur2\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("partitioner"), "{err}");
        let timeout = format!("{KAFKA}delivery_timeout_ms = 1500\n");
        assert_eq!(
            kafka(&load(&timeout).unwrap()).delivery_timeout,
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn every_shipped_example_is_a_valid_configuration() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let env = vec![(
            "MSSQL_CES__SOURCE__CONNECTION_STRING".to_string(),
            "Server=tcp:mssql,1433".to_string(),
        )];
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            Config::from_parts(&text, &env, &[])
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
        assert!(seen >= 3, "the examples were read ({seen})");
    }
}

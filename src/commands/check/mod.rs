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
use crate::error::Chain;
use crate::lsn::Lsn;
use crate::position::{Position, SourceIdentity};
use crate::sink::SinkConfig;
use crate::sink::kafka::{self, DestinationFacts, KafkaFlavour};
use crate::sink::stream::Resume;
use crate::sink::{SinkHealth, expand_topic};
use crate::source::sqlserver::SqlServerSource;
use crate::source::{
    AZURE_SQL_DATABASE_EDITION, AZURE_SQL_MANAGED_INSTANCE_EDITION, CaptureInstance, Catalog,
    ChangeSource, Fact, ServerFacts, SourceError,
};

mod checkpoint;
mod destination;
mod many;
mod source;

use checkpoint::{check_checkpoint, check_checkpoint_topic, human_minutes};
pub use destination::kafka_findings;
use destination::{check_destination, kafka_store_unreachable};
pub use many::check_many;
use source::{SourceState, check_source};

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
    /// Works, but likely not as meant: says what to do about it.
    Warn,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub check: String,
    pub status: Status,
    pub detail: String,
    /// For a failure or a warning: what to do.
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
        self.advise(check, Status::Fail, detail, fix);
    }

    fn warn(
        &mut self,
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.advise(check, Status::Warn, detail, fix);
    }

    fn advise(
        &mut self,
        check: impl Into<String>,
        status: Status,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.findings.push(Finding {
            check: check.into(),
            status,
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
                Status::Warn => '!',
            };
            out.push_str(&format!("{mark} {}: {}\n", f.check, f.detail));
            if let Some(fix) = &f.fix {
                out.push_str(&format!("    fix: {fix}\n"));
            }
        }
        let warned = match self.count(Status::Warn) {
            0 => String::new(),
            1 => ", 1 warning".to_owned(),
            n => format!(", {n} warnings"),
        };
        out.push_str(&format!(
            "{} passed, {} failed, {} not checked{warned}\n",
            self.count(Status::Pass),
            self.count(Status::Fail),
            self.count(Status::Skip)
        ));
        out
    }

    /// `{"ok": bool, "passed": n, "failed": n, "skipped": n, "warnings": n, "checks": [...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "ok": self.passed(),
            "passed": self.count(Status::Pass),
            "failed": self.count(Status::Fail),
            "skipped": self.count(Status::Skip),
            "warnings": self.count(Status::Warn),
            "checks": self.findings,
        })
    }
}

/// Checks the configured stream: its secrets, the source, the checkpoint and the
/// destination.
pub async fn check(config: &Config) -> Report {
    match config.source.kind {
        SourceKind::Synthetic if config.many_databases() => {
            let s = &config.source.synthetic;
            let mut server =
                crate::source::synthetic::server::SyntheticServer::new(s.databases, s.transactions);
            check_many(config, &mut server, |own| {
                Ok(crate::commands::run::synthetic_source(own))
            })
            .await
        }
        SourceKind::Synthetic if config.source.synthetic.transaction_rows > 0 => {
            let mut source = crate::commands::run::bulk_source(config);
            check_with(config, &mut source, "synthetic large transactions").await
        }
        SourceKind::Synthetic => {
            let mut source = crate::commands::run::synthetic_source(config);
            check_with(config, &mut source, "synthetic source (a simulated server)").await
        }
        SourceKind::Sqlserver if config.many_databases() => match config.sql_server() {
            Ok(settings) => {
                let mut server = crate::source::server::SqlServerDatabases::new(
                    crate::mssql::SqlConnection::new(settings),
                );
                check_many(config, &mut server, |own| {
                    own.sql_server().map(SqlServerSource::new)
                })
                .await
            }
            Err(_) => unusable_connection_string(config),
        },
        SourceKind::Sqlserver => match config.sql_server() {
            Ok(settings) => {
                let mut source = SqlServerSource::new(settings);
                check_with(config, &mut source, "").await
            }
            Err(_) => unusable_connection_string(config),
        },
    }
}

/// The report when `source.connection_string` cannot be used.
fn unusable_connection_string(config: &Config) -> Report {
    // The configuration finding says what is wrong with it.
    let mut report = Report::default();
    secrets(&mut report, config);
    report.skip(
        "SQL Server",
        "not contacted: source.connection_string is not usable (see the configuration finding)",
    );
    report
}

/// [`check`] against a given source; `server`, when not empty, names it in the
/// report (the synthetic source says it is simulated).
pub async fn check_with<S: ChangeSource>(config: &Config, source: &mut S, server: &str) -> Report {
    let mut report = Report::default();
    secrets(&mut report, config);
    let catalog = check_source(&mut report, config, source, server).await;
    let unreachable = kafka_store_unreachable(config).await;
    let checkpoint = check_checkpoint(
        &mut report,
        config,
        source,
        catalog.as_ref(),
        unreachable.as_deref(),
    )
    .await;
    check_checkpoint_topic(&mut report, config, unreachable.as_deref()).await;
    check_delivery(&mut report, config, catalog.as_slice(), checkpoint).await;
    report
}

/// What is checked once per configuration, after the source and the checkpoint:
/// the destination, the schema registry and the metrics address.
async fn check_delivery(
    report: &mut Report,
    config: &Config,
    states: &[SourceState],
    resume: Option<Resume>,
) {
    check_destination(report, config, states, resume).await;
    if let Some(registry) = &config.sink.routing.schema_registry {
        destination::check_registry(report, registry).await;
    }
    check_metrics(report, config).await;
}

/// `metrics.listen`: the address can be bound, as a run binds it first.
async fn check_metrics(report: &mut Report, config: &Config) {
    let Ok(Some(address)) = config.metrics.listen_address() else {
        return;
    };
    match crate::metrics::bind(address).await {
        Ok(listener) => {
            drop(listener);
            report.pass("metrics", format!("{address} can be served"));
        }
        Err(e) => report.fail(
            "metrics",
            Chain(&e).to_string(),
            "set metrics.listen to a free address (a running mssql-ces may hold this one)",
        ),
    }
}

fn secrets(report: &mut Report, config: &Config) {
    match config.check_secrets() {
        Ok(()) => report.pass("configuration", "valid; every secret it names resolves"),
        Err(e) => {
            let fix = match &e {
                crate::setting::ConfigError::MissingSecret { .. } => {
                    "make the secret available (the environment variable or the file the setting names)"
                }
                _ => "correct the setting the message names",
            };
            let detail = match e {
                crate::setting::ConfigError::Parse(message) => message,
                other => other.to_string(),
            };
            report.fail("configuration", detail, fix)
        }
    }
}

//! The metrics of many databases in one process: each database's own [`Metrics`]
//! (every series labelled `database="<name>"`) and the supervisor's counts, served
//! as one exposition with each metric family's `# HELP`/`# TYPE` once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Metrics;
use crate::databases::ManyStatus;

/// What `/metrics`, `/healthz` and `/readyz` are served from.
pub trait Observed: Send + Sync + 'static {
    fn render(&self) -> String;
    fn health(&self) -> Result<String, String>;
    fn readiness(&self) -> Result<String, String>;
    /// Where re-snapshot requests go: each running stream's (of `database` only,
    /// when named), with its database's name (empty for a single stream).
    fn snapshot_handles(
        &self,
        database: Option<&str>,
    ) -> Vec<(String, crate::source::poller::SnapshotHandle)>;
}

impl Observed for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
    fn health(&self) -> Result<String, String> {
        Metrics::health(self)
    }
    fn readiness(&self) -> Result<String, String> {
        Metrics::readiness(self)
    }
    fn snapshot_handles(
        &self,
        _database: Option<&str>,
    ) -> Vec<(String, crate::source::poller::SnapshotHandle)> {
        self.snapshot_handle()
            .map(|h| (String::new(), h))
            .into_iter()
            .collect()
    }
}

/// Every database's metrics, and the supervisor's status.
#[derive(Debug)]
pub struct MetricsSet {
    stalled_after: Duration,
    databases: Mutex<BTreeMap<String, Arc<Metrics>>>,
    status: tokio::sync::watch::Receiver<ManyStatus>,
}

impl MetricsSet {
    pub fn new(stalled_after: Duration, status: tokio::sync::watch::Receiver<ManyStatus>) -> Self {
        MetricsSet {
            stalled_after,
            databases: Mutex::default(),
            status,
        }
    }

    /// A database's metrics, made on first use and kept across its activations.
    pub fn database(&self, name: &str) -> Arc<Metrics> {
        let mut databases = self.databases.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            databases
                .entry(name.to_owned())
                .or_insert_with(|| Arc::new(Metrics::for_database(self.stalled_after, name))),
        )
    }

    fn supervisor_text(&self) -> String {
        let s = self.status.borrow().clone();
        let gauge = |name: &str, help: &str, value: usize| {
            format!(
                "# HELP mssql_ces_{name} {help}\n# TYPE mssql_ces_{name} gauge\nmssql_ces_{name} {value}\n"
            )
        };
        let counter = |name: &str, help: &str, value: u64| {
            format!(
                "# HELP mssql_ces_{name} {help}\n# TYPE mssql_ces_{name} counter\nmssql_ces_{name}_total {value}\n"
            )
        };
        [
            gauge(
                "databases",
                "Databases streamed (source.databases matched on the server)",
                s.databases,
            ),
            gauge("databases_active", "Databases being read now", s.active),
            gauge(
                "databases_queued",
                "Databases with changes waiting for a connection",
                s.queued,
            ),
            gauge(
                "databases_failed",
                "Databases whose last read failed (retried with backoff)",
                s.failed,
            ),
            gauge(
                "databases_unreadable",
                "Databases the probe cannot read (offline, no access, an availability group secondary here)",
                s.unreadable,
            ),
            counter(
                "database_probes",
                "Probe rounds of every database's max LSN",
                s.probes,
            ),
            counter(
                "database_activations",
                "Reads of a database that ended caught up",
                s.activations,
            ),
            s.fleet.as_ref().map_or_else(String::new, |f| {
                [
                    gauge(
                        "fleet_slots_owned",
                        "Slots (fleet.topic partitions) the group assigned this member",
                        f.slots,
                    ),
                    gauge(
                        "fleet_databases_owned",
                        "Databases in this member's slots",
                        f.databases,
                    ),
                    counter(
                        "fleet_slot_changes",
                        "Assignments and revocations of slots to this member",
                        f.changes,
                    ),
                ]
                .concat()
            }),
        ]
        .concat()
    }
}

impl Observed for MetricsSet {
    fn render(&self) -> String {
        let databases: Vec<Arc<Metrics>> = self
            .databases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let mut texts = vec![self.supervisor_text()];
        texts.extend(databases.iter().map(|m| m.render()));
        merge(&texts)
    }

    fn health(&self) -> Result<String, String> {
        let s = self.status.borrow();
        Ok(format!(
            "ok: {} databases, {} being read, {} failed",
            s.databases, s.active, s.failed
        ))
    }

    fn readiness(&self) -> Result<String, String> {
        let s = self.status.borrow();
        if s.probes == 0 {
            Err("not ready: no probe of the databases has finished yet".into())
        } else {
            Ok("ready".into())
        }
    }

    fn snapshot_handles(
        &self,
        database: Option<&str>,
    ) -> Vec<(String, crate::source::poller::SnapshotHandle)> {
        self.databases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(name, _)| database.is_none_or(|d| d.eq_ignore_ascii_case(name)))
            .filter_map(|(name, m)| m.snapshot_handle().map(|h| (name.clone(), h)))
            .collect()
    }
}

/// Expositions merged: each family's comment lines once (from its first
/// appearance), then its samples from every text, in order; one `# EOF` at the end
/// when any had one.
pub fn merge(texts: &[String]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut families: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    let mut eof = false;
    for text in texts {
        let mut current = String::new();
        for line in text.lines() {
            if line == "# EOF" {
                eof = true;
                continue;
            }
            if let Some(rest) = line.strip_prefix("# ") {
                let mut words = rest.split(' ');
                let (_, Some(name)) = (words.next(), words.next()) else {
                    continue;
                };
                current = name.to_owned();
                let entry = families.entry(current.clone()).or_insert_with(|| {
                    order.push(current.clone());
                    (Vec::new(), Vec::new())
                });
                if !entry.0.iter().any(|l| l == line) && entry.1.is_empty() {
                    entry.0.push(line.to_owned());
                }
                continue;
            }
            if line.is_empty() {
                continue;
            }
            let entry = families.entry(current.clone()).or_insert_with(|| {
                order.push(current.clone());
                (Vec::new(), Vec::new())
            });
            entry.1.push(line.to_owned());
        }
    }
    let mut out = String::new();
    for name in order {
        if let Some((comments, samples)) = families.get(&name) {
            for line in comments.iter().chain(samples) {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if eof {
        out.push_str("# EOF\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_database_s_metrics_are_kept_and_served_with_the_supervisor_s_counts() {
        let (status, watched) = tokio::sync::watch::channel(ManyStatus::default());
        let set = MetricsSet::new(Duration::from_secs(60), watched);
        let a = set.database("A");
        assert!(
            Arc::ptr_eq(&a, &set.database("A")),
            "kept across activations"
        );
        assert!(set.readiness().is_err(), "no probe yet");
        status.send_replace(ManyStatus {
            probes: 3,
            activations: 2,
            databases: 5,
            active: 1,
            queued: 4,
            failed: 1,
            unreadable: 0,
            fleet: None,
        });
        assert_eq!(set.readiness(), Ok("ready".into()));
        assert!(
            !Observed::render(&set).contains("mssql_ces_fleet"),
            "no fleet, no fleet series"
        );
        assert_eq!(
            set.health(),
            Ok("ok: 5 databases, 1 being read, 1 failed".into())
        );
        let text = Observed::render(&set);
        for sample in [
            "mssql_ces_databases 5",
            "mssql_ces_databases_queued 4",
            "mssql_ces_database_probes_total 3",
            "mssql_ces_database_activations_total 2",
            "mssql_ces_source_polls_total{database=\"A\"} 0",
        ] {
            assert!(text.lines().any(|l| l == sample), "{sample} in\n{text}");
        }
        status.send_modify(|s| {
            s.fleet = Some(crate::databases::FleetStatus {
                slots: 6,
                databases: 2,
                changes: 3,
            });
        });
        let text = Observed::render(&set);
        for sample in [
            "mssql_ces_fleet_slots_owned 6",
            "mssql_ces_fleet_databases_owned 2",
            "mssql_ces_fleet_slot_changes_total 3",
        ] {
            assert!(text.lines().any(|l| l == sample), "{sample} in\n{text}");
        }
    }

    #[test]
    fn one_run_s_metrics_are_served_as_they_are() {
        let metrics = Metrics::new(Duration::from_secs(60));
        assert!(Observed::render(&metrics).contains("mssql_ces_build_info"));
        assert_eq!(Observed::health(&metrics), metrics.health());
        assert!(Observed::health(&metrics).is_ok_and(|h| h.starts_with("ok:")));
        assert_eq!(Observed::readiness(&metrics), metrics.readiness());
        assert!(Observed::readiness(&metrics).is_err());
    }

    #[test]
    fn each_family_is_described_once_with_every_databases_samples() {
        let a = Metrics::for_database(Duration::from_secs(60), "A").render();
        let b = Metrics::for_database(Duration::from_secs(60), "B").render();
        let merged = merge(&[a, b]);
        let types = merged
            .lines()
            .filter(|l| l.starts_with("# TYPE mssql_ces_source_polls_total "))
            .count();
        assert_eq!(types, 1, "{merged}");
        assert!(
            merged.contains("mssql_ces_source_polls_total{database=\"A\"} 0"),
            "{merged}"
        );
        assert!(
            merged.contains("mssql_ces_source_polls_total{database=\"B\"} 0"),
            "{merged}"
        );
        assert!(merged.matches("# EOF").count() <= 1);
        // The samples of a family follow its comments, not another family's.
        let at = |needle: &str| merged.find(needle).unwrap_or(usize::MAX);
        assert!(
            at("# TYPE mssql_ces_source_polls_total ")
                < at("mssql_ces_source_polls_total{database=\"B\"}")
        );
    }
}

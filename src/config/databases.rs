//! `source.databases`: what many databases in one process need of the rest of the
//! configuration, and each database's own configuration.

use std::path::PathBuf;
use std::time::Duration;

use super::{CheckpointStoreKind, Config, SourceKind};
use crate::setting::{ConfigError, invalid};
use crate::sink::SinkConfig;

pub(super) fn default_discovery_interval_ms() -> Duration {
    Duration::from_secs(60)
}

pub(super) fn default_max_connections() -> usize {
    9
}

/// The placeholder of a database's name in paths and stream names.
const DB: &str = "{db}";

impl Config {
    /// Whether this configuration streams many databases.
    pub fn many_databases(&self) -> bool {
        !self.source.databases.is_empty()
    }

    pub(super) fn validate_databases(&self) -> Result<(), ConfigError> {
        if self.source.discovery_interval.is_zero() {
            return Err(invalid(
                "source.discovery_interval_ms",
                "must be more than 0 (the default is 60000)",
            ));
        }
        if !self.many_databases() {
            return Ok(());
        }
        if self.source.kind == SourceKind::Synthetic {
            if self.source.synthetic.databases == 0 {
                return Err(invalid(
                    "source.databases",
                    "needs source.kind = \"sqlserver\", or a synthetic server of many databases (source.synthetic.databases = 12)",
                ));
            }
            if self.source.synthetic.transaction_rows > 0 {
                return Err(invalid(
                    "source.synthetic.transaction_rows",
                    "cannot be combined with source.databases (the large-transaction workload is one database)",
                ));
            }
        }
        if let Some(empty) = self.source.databases.iter().find(|p| p.trim().is_empty()) {
            return Err(invalid(
                "source.databases",
                format!(
                    "{empty:?} is empty: give a database name or a pattern such as \"Tenant*\""
                ),
            ));
        }
        if self.source.max_connections < 2 {
            return Err(invalid(
                "source.max_connections",
                "must be at least 2 with source.databases: one for the probe of every database, one or more to read them",
            ));
        }
        if self.event.stream_guid.is_some() {
            return Err(invalid(
                "event.stream_guid",
                "cannot be set with source.databases: each database is its own stream, with its own GUID",
            ));
        }
        if let SinkConfig::Kafka(k) = &self.sink.kind
            && k.transactional_id
                .as_ref()
                .is_some_and(|id| !id.contains(DB))
        {
            return Err(invalid(
                "sink.transactional_id",
                "must contain {db} with source.databases (each database's transactions are its own), or be left unset",
            ));
        }
        if let SinkConfig::File(file) = &self.sink.kind
            && !file.path.to_string_lossy().contains(DB)
        {
            return Err(invalid(
                "sink.path",
                "must contain {db} with source.databases (one file per database, e.g. \"out/{db}.jsonl\")",
            ));
        }
        Ok(())
    }

    /// The configuration of one of the databases: the connection string names it;
    /// the checkpoint file and the stream name are its own (`{db}` replaced, or the
    /// name added); so is a file sink's path.
    pub fn for_database(&self, database: &str) -> Config {
        let mut config = self.clone();
        config.source.databases.clear();
        config.source.database = Some(database.to_owned());
        if config.source.kind == SourceKind::Synthetic {
            config.source.synthetic.seed ^= crate::databases::fleet::name_hash(database);
        }
        config.checkpoint.path = per_database_path(&self.checkpoint.path, database);
        config.checkpoint.stream_name = if self.checkpoint.stream_name.contains(DB) {
            self.checkpoint.stream_name.replace(DB, database)
        } else {
            format!("{}/{database}", self.checkpoint.stream_name)
        };
        match &mut config.sink.kind {
            SinkConfig::File(file) => {
                file.path = PathBuf::from(file.path.to_string_lossy().replace(DB, database));
            }
            SinkConfig::Kafka(k) => {
                k.transactional_id = k
                    .transactional_id
                    .as_ref()
                    .map(|id| id.replace(DB, database));
            }
            _ => {}
        }
        config
    }

    /// What the log says of where each database's checkpoint goes.
    pub fn describe_per_database_checkpoint(&self) -> String {
        match self.checkpoint.store {
            CheckpointStoreKind::File => format!(
                "checkpoint files {}",
                per_database_path(&self.checkpoint.path, DB).display()
            ),
            CheckpointStoreKind::Table => format!(
                "checkpoint table rows of stream {}",
                self.for_database(DB).checkpoint.stream_name
            ),
            CheckpointStoreKind::Kafka => format!(
                "checkpoint records of topic {} under key {}",
                self.checkpoint.topic,
                self.for_database(DB).checkpoint.stream_name
            ),
        }
    }
}

/// `cp.json` → `cp.<db>.json`; a path with `{db}` has it replaced.
fn per_database_path(path: &std::path::Path, database: &str) -> PathBuf {
    let text = path.to_string_lossy();
    if text.contains(DB) {
        return PathBuf::from(text.replace(DB, database));
    }
    let stem = path
        .file_stem()
        .map_or_else(|| "checkpoint".into(), |s| s.to_string_lossy().into_owned());
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{database}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{database}"),
    };
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(source: &str, rest: &str) -> Result<Config, ConfigError> {
        let text = format!(
            "[source]\nkind = \"sqlserver\"\nconnection_string = {{ env = \"CS\" }}\n{source}\n[sink]\nkind = \"stdout\"\n{rest}"
        );
        Config::from_parts(&text, &[], &[])
    }

    #[test]
    fn many_databases_have_defaults_and_each_setting_is_checked_by_name() {
        let c = load("databases = [\"Tenant*\"]", "").expect("valid");
        assert!(c.many_databases());
        assert_eq!(c.source.max_connections, 9);
        assert_eq!(c.source.discovery_interval, Duration::from_secs(60));
        assert!(!load("", "").expect("valid").many_databases());
        let two = load("databases = [\"A\"]\nmax_connections = 2", "").expect("the least");
        assert_eq!(two.source.max_connections, 2);
        let refused = [
            ("databases = [\"\"]", "", "source.databases"),
            (
                "databases = [\"A\"]\nmax_connections = 1",
                "",
                "source.max_connections",
            ),
            (
                "databases = [\"A\"]\ndiscovery_interval_ms = 0",
                "",
                "source.discovery_interval_ms",
            ),
            (
                "databases = [\"A\"]",
                "[event]\nstream_guid = \"6f1c3d51-8a4e-4d0b-9a55-0c1d2e3f4a5b\"",
                "event.stream_guid",
            ),
        ];
        for (source, rest, setting) in refused {
            let error = load(source, rest).expect_err(setting).to_string();
            assert!(error.contains(setting), "{error}");
        }
        let synthetic = Config::from_parts(
            "[source]\nkind = \"synthetic\"\ndatabases = [\"A\"]\n[sink]\nkind = \"stdout\"\n",
            &[],
            &[],
        )
        .expect_err("synthetic")
        .to_string();
        assert!(
            synthetic.contains("source.databases") && synthetic.contains("synthetic.databases"),
            "{synthetic}"
        );
        let server = Config::from_parts(
            "[source]\nkind = \"synthetic\"\ndatabases = [\"tenant*\"]\n[source.synthetic]\ndatabases = 3\n[sink]\nkind = \"stdout\"\n",
            &[],
            &[],
        )
        .expect("a synthetic server");
        let one = server.for_database("tenant002");
        assert_eq!(one.source.database.as_deref(), Some("tenant002"));
        assert_ne!(
            one.source.synthetic.seed,
            server.for_database("tenant003").source.synthetic.seed,
            "each database its own workload"
        );
        let bulk = Config::from_parts(
            "[source]\nkind = \"synthetic\"\ndatabases = [\"tenant*\"]\n[source.synthetic]\ndatabases = 3\ntransaction_rows = 5\n[sink]\nkind = \"stdout\"\n",
            &[],
            &[],
        )
        .expect_err("bulk")
        .to_string();
        assert!(bulk.contains("source.synthetic.transaction_rows"), "{bulk}");
        let file = |path: &str| {
            Config::from_parts(
                &format!(
                    "[source]\nkind = \"sqlserver\"\nconnection_string = {{ env = \"CS\" }}\ndatabases = [\"A\"]\n[sink]\nkind = \"file\"\npath = \"{path}\"\n"
                ),
                &[],
                &[],
            )
        };
        let error = file("out.jsonl").expect_err("one file for all").to_string();
        assert!(
            error.contains("sink.path") && error.contains("{db}"),
            "{error}"
        );
        let one = file("out/{db}.jsonl")
            .expect("a file each")
            .for_database("A");
        assert!(
            matches!(&one.sink.kind, SinkConfig::File(f) if f.path == std::path::Path::new("out/A.jsonl"))
        );
    }

    #[test]
    fn a_transactional_id_is_each_database_s_own() {
        let sink = |id: &str| {
            Config::from_parts(
                &format!(
                    "[source]\nkind = \"sqlserver\"\nconnection_string = {{ env = \"CS\" }}\ndatabases = [\"T*\"]\n[sink]\nkind = \"kafka\"\nbootstrap_servers = \"b:9092\"\nexactly_once = true\ntransactional_id = \"{id}\"\n[checkpoint]\nstore = \"kafka\"\n"
                ),
                &[],
                &[],
            )
        };
        let error = sink("shared").expect_err("one id for all").to_string();
        assert!(
            error.contains("sink.transactional_id") && error.contains("{db}"),
            "{error}"
        );
        let one = sink("eos-{db}").expect("an id each").for_database("T7");
        assert!(
            matches!(&one.sink.kind, SinkConfig::Kafka(k) if k.transactional_id.as_deref() == Some("eos-T7")),
            "{:?}",
            one.sink.kind
        );
        let c = sink("eos-{db}").expect("valid");
        assert_eq!(
            c.describe_per_database_checkpoint(),
            "checkpoint records of topic mssql-ces-checkpoints under key default/{db}"
        );
        let file =
            load("databases = [\"T*\"]", "[checkpoint]\npath = \"s/cp.json\"").expect("valid");
        assert_eq!(
            file.describe_per_database_checkpoint(),
            "checkpoint files s/cp.{db}.json"
        );
    }

    #[test]
    fn a_database_s_configuration_names_it_everywhere_it_must() {
        let c = load(
            "databases = [\"T*\"]",
            "[checkpoint]\npath = \"state/cp.json\"\nstream_name = \"orders\"",
        )
        .expect("valid");
        let one = c.for_database("T1");
        assert_eq!(one.source.database.as_deref(), Some("T1"));
        assert!(one.source.databases.is_empty());
        assert_eq!(one.checkpoint.path, PathBuf::from("state/cp.T1.json"));
        assert_eq!(one.checkpoint.stream_name, "orders/T1");
        let named = load(
            "databases = [\"T*\"]",
            "[checkpoint]\nstream_name = \"s-{db}\"",
        )
        .expect("valid")
        .for_database("T2");
        assert_eq!(named.checkpoint.stream_name, "s-T2");
    }

    #[test]
    fn each_database_has_its_own_checkpoint_file_and_stream_name() {
        assert_eq!(
            per_database_path(std::path::Path::new("state/cp.json"), "Tenant1"),
            PathBuf::from("state/cp.Tenant1.json")
        );
        assert_eq!(
            per_database_path(std::path::Path::new("state/{db}/cp.json"), "T"),
            PathBuf::from("state/T/cp.json")
        );
        assert_eq!(
            per_database_path(std::path::Path::new("cp"), "T"),
            PathBuf::from("cp.T")
        );
    }
}

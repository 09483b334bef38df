//! Initial load (`[snapshot]`): the rows a table already holds, as CES events, before
//! its changes.
//!
//! CDC records only what changes after it is enabled, and its cleanup job drops
//! changes after the retention; a consumer that starts later never learns the rows
//! that did not change. The load reads them from the tables themselves:
//!
//! 1. Record L0 = `sys.fn_cdc_get_max_lsn()` and, per table, that its changes are
//!    complete through L0 — durably, in the checkpoint, before any row is sent.
//! 2. Read each table in key order, in chunks (keyset pagination on the key CDC uses),
//!    each chunk one statement under READ COMMITTED: no table lock, no transaction
//!    that spans chunks, no write. A table without a key is read in one ordered pass.
//! 3. Then stream the changes after L0.
//!
//! Every row is an `INS` event of the CES shape with `commitlsn` L0, `beginlsn`
//! 00000000:00000000:0000 (no transaction began at LSN zero: the marker of a loaded
//! row), `committime` the commit time of L0, `sequencenumber` counting the table's
//! rows, `finalevent` true on its last row. Its message ids derive from the table and
//! the row's key ([`id_seed`]), so a row re-sent after a restart has the same ids, and
//! none equals a CDC event's. Its `logicalid` is L0 and the row's number in its
//! load's own range (`TableLoad::logical_base`), unique across the tables loaded at
//! one LSN.
//!
//! The rule a consumer gets: applying each table's events in partition order, per key
//! (upsert on `INS`/`UPD`, delete on `DEL`), yields the table's current state. A row
//! that did not change after L0 is in the load with its current values; a row that did
//! has its last change after L0 among the changes, each of which carries the whole
//! row, and every one of them comes after the load's rows in the partition. A row
//! changed while the load ran may appear in the load already changed and then again in
//! the change; a delete of a row the load never saw deletes nothing.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::event::MESSAGE_ID_NAMESPACE;
use crate::lsn::Lsn;

/// `snapshot.mode`: whether the rows tables already hold are loaded.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Changes only, as CES.
    #[default]
    Never,
    /// With no checkpoint, load every included table, then stream changes.
    Initial,
    /// Load every included table and exit: a one-off export.
    InitialOnly,
    /// As `initial`, and re-load a table whose changes the cleanup job purged before
    /// delivery, instead of `source.on_gap`.
    WhenNeeded,
}

impl SnapshotMode {
    /// Whether a run without a checkpoint starts with a load.
    pub fn loads(self) -> bool {
        self != SnapshotMode::Never
    }
}

impl std::fmt::Display for SnapshotMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SnapshotMode::Never => "never",
            SnapshotMode::Initial => "initial",
            SnapshotMode::InitialOnly => "initial_only",
            SnapshotMode::WhenNeeded => "when_needed",
        })
    }
}

/// What identifies a loaded row for its message ids.
#[derive(Debug, Clone, Copy)]
pub enum RowIdentity<'a> {
    /// The key's text forms, in key order.
    Key(&'a [Option<String>]),
    /// A table without a key: the row's place in the pass.
    Ordinal(u64),
}

/// The seed of a loaded row's message ids: UUID v5 of the stream, the load's LSN, the
/// table and the row. The same row of the same load always gets the same ids; a
/// re-load (another LSN) gets new ones.
pub fn id_seed(stream_guid: Uuid, at: Lsn, table: &str, row: RowIdentity<'_>) -> Uuid {
    let mut name = Vec::with_capacity(64);
    name.extend_from_slice(b"mssql-ces load\0");
    name.extend_from_slice(stream_guid.as_bytes());
    name.extend_from_slice(at.as_bytes());
    // Lengths first, so that no two (table, key) pairs share a name.
    let mut field = |bytes: &[u8]| {
        name.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        name.extend_from_slice(bytes);
    };
    field(table.as_bytes());
    match row {
        RowIdentity::Key(values) => {
            for value in values {
                match value {
                    Some(text) => field(text.as_bytes()),
                    None => field(&[0xFF; 9]),
                }
            }
        }
        RowIdentity::Ordinal(n) => field(&n.to_be_bytes()),
    }
    Uuid::new_v5(&MESSAGE_ID_NAMESPACE, &name)
}

/// How long the cleanup job keeps changes (its `retention`, in minutes), when the
/// login may read `msdb.dbo.cdc_jobs`.
pub fn cleanup_retention(facts: &crate::source::ServerFacts) -> Option<std::time::Duration> {
    match &facts.jobs {
        crate::source::Fact::Known(jobs) => jobs
            .iter()
            .filter_map(|j| j.retention_minutes)
            .max()
            .and_then(|m| u64::try_from(m).ok())
            .map(|m| std::time::Duration::from_secs(m.saturating_mul(60))),
        crate::source::Fact::Unknown(_) => None,
    }
}

/// How a table's load is going, for the log and the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadStatus {
    /// `schema.table`.
    pub table: String,
    pub rows: u64,
    /// `sys.partitions`' count when the load of the table began.
    pub estimated: Option<u64>,
    pub rows_per_second: f64,
}

impl LoadStatus {
    /// Seconds left at the current rate, when the estimate and the rate allow it.
    pub fn seconds_left(&self) -> Option<f64> {
        let estimated = self.estimated?;
        (self.rows_per_second > 0.0)
            .then(|| estimated.saturating_sub(self.rows) as f64 / self.rows_per_second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_differ_by_every_part_and_repeat_for_the_same_row() {
        let guid = Uuid::from_u128(7);
        let at = Lsn::from_parts(0xB1, 0x10, 2);
        let key = [Some("1".to_owned()), Some("a".to_owned())];
        let seed = id_seed(guid, at, "dbo.t", RowIdentity::Key(&key));
        assert_eq!(seed, id_seed(guid, at, "dbo.t", RowIdentity::Key(&key)));
        let others = [
            id_seed(Uuid::from_u128(8), at, "dbo.t", RowIdentity::Key(&key)),
            id_seed(
                guid,
                Lsn::from_parts(0xB1, 0x10, 3),
                "dbo.t",
                RowIdentity::Key(&key),
            ),
            id_seed(guid, at, "dbo.u", RowIdentity::Key(&key)),
            id_seed(
                guid,
                at,
                "dbo.t",
                RowIdentity::Key(&[Some("1a".to_owned()), Some(String::new())]),
            ),
            id_seed(
                guid,
                at,
                "dbo.t",
                RowIdentity::Key(&[Some("1".to_owned()), None]),
            ),
            id_seed(guid, at, "dbo.t", RowIdentity::Ordinal(1)),
        ];
        for other in others {
            assert_ne!(seed, other);
        }
    }

    #[test]
    fn the_retention_is_the_cleanup_jobs_in_minutes() {
        use crate::source::{CdcJob, Fact, ServerFacts};
        let facts = |jobs| ServerFacts {
            product_version: "16.0".into(),
            edition: "Developer".into(),
            engine_edition: 3,
            database: "db".into(),
            cdc_enabled: true,
            encrypted: Some(true),
            local_time: chrono::NaiveDateTime::default(),
            agent: Fact::Unknown(String::new()),
            jobs,
            capture_running: Fact::Unknown(String::new()),
            log_scan: Fact::Unknown(String::new()),
            max_text_repl_size: Fact::Unknown(String::new()),
        };
        let job = |job_type: &str, retention_minutes| CdcJob {
            job_type: job_type.into(),
            retention_minutes,
            capture: None,
        };
        assert_eq!(
            cleanup_retention(&facts(Fact::Known(vec![
                job("capture", None),
                job("cleanup", Some(4320)),
            ]))),
            Some(std::time::Duration::from_secs(4320 * 60))
        );
        assert_eq!(
            cleanup_retention(&facts(Fact::Known(vec![job("capture", None)]))),
            None
        );
        assert_eq!(
            cleanup_retention(&facts(Fact::Unknown("no msdb".into()))),
            None
        );
    }

    #[test]
    fn time_left_needs_an_estimate_and_a_rate() {
        let status = LoadStatus {
            table: "dbo.t".into(),
            rows: 1000,
            estimated: Some(5000),
            rows_per_second: 500.0,
        };
        assert_eq!(status.seconds_left(), Some(8.0));
        assert_eq!(
            LoadStatus {
                estimated: None,
                ..status.clone()
            }
            .seconds_left(),
            None
        );
        assert_eq!(
            LoadStatus {
                rows_per_second: 0.0,
                ..status
            }
            .seconds_left(),
            None
        );
    }

    #[test]
    fn modes_read_as_configured() {
        for (text, mode) in [
            ("never", SnapshotMode::Never),
            ("initial", SnapshotMode::Initial),
            ("initial_only", SnapshotMode::InitialOnly),
            ("when_needed", SnapshotMode::WhenNeeded),
        ] {
            let parsed: SnapshotMode = serde_json::from_str(&format!("\"{text}\"")).unwrap();
            assert_eq!(parsed, mode);
            assert_eq!(mode.to_string(), text);
            assert_eq!(mode.loads(), mode != SnapshotMode::Never);
        }
    }
}

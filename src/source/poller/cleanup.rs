//! Change tables cleaned once every stream of the database has delivered their
//! changes (`source.cleanup = "after_delivery"`).
//!
//! SQL Server's cleanup job purges by age: a stream that falls behind by more than
//! the retention loses changes it never delivered. With this setting the daemon
//! cleans instead, by delivery: every `source.cleanup_interval_ms` it runs
//! `sys.sp_cdc_cleanup_change_table` for each capture instance it reads, with a
//! low-water mark no stream of the database needs anything below.
//!
//! - This stream's bound is its checkpoint as last written (what the destination
//!   acknowledged), never what was only read: per instance, the LSN through which
//!   every change was delivered.
//! - The other streams of the database are found through the checkpoint store: the
//!   files beside this one's, the table's rows, the topic's keys. A checkpoint of the
//!   same database (its GUID, else its server and database names) that names the
//!   instance bounds it by its own LSN for it; one that does not name it does not
//!   read it. A checkpoint that cannot be read stops this round's cleanup.
//! - The mark is the lowest of those bounds; the procedure takes the latest commit
//!   at or below it and removes the rows below that, so every row a stream still
//!   needs stays.
//!
//! It needs `db_owner`; without it the run stops at its first poll, naming the
//! setting. A cleanup that fails otherwise (a lock, a deadlock with the capture job,
//! a store that does not answer) is said and tried again at the next interval: the
//! stream goes on meanwhile.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checkpoint::{Checkpoint, CheckpointStore};
use crate::error::Chain;
use crate::lsn::Lsn;
use crate::position::{Position, SourceIdentity};
use crate::source::{CaptureDdl, SourceError};

/// `source.cleanup`: who removes change rows.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CleanupMode {
    /// SQL Server's cleanup job, by its retention.
    #[default]
    Agent,
    /// This daemon, once every stream of the database has delivered the changes
    /// (needs `db_owner`).
    AfterDelivery,
}

/// How far one capture instance may be cleaned: every stream of the database has
/// delivered it through `through`; `held_by` names the stream whose bound that is
/// when it is not this one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupBound {
    pub through: Lsn,
    pub held_by: Option<String>,
}

/// Whether `peer`'s checkpoint may be of the database `own` reads: the same GUID
/// where both know it, else the same server and database names.
fn may_be_same_database(own: &SourceIdentity, peer: Option<&SourceIdentity>) -> bool {
    let Some(peer) = peer else {
        // Written before checkpoints named their source: it counts by the
        // instances it names.
        return true;
    };
    match (own.database_guid, peer.database_guid) {
        (Some(a), Some(b)) => a == b,
        _ => {
            own.server.eq_ignore_ascii_case(&peer.server)
                && own.database.eq_ignore_ascii_case(&peer.database)
        }
    }
}

/// Per capture instance of `instances` that `own` has delivered, how far it may be
/// cleaned: the lowest of `own`'s LSN for it and those of the `peers` of the same
/// database that name it. Instances `own` has not recorded yet are left out.
pub fn cleanup_bounds(
    own: &Position,
    peers: &[Checkpoint],
    instances: &[String],
) -> BTreeMap<String, CleanupBound> {
    let mut bounds = BTreeMap::new();
    let Some(identity) = own.source.as_deref() else {
        return bounds;
    };
    let peers: Vec<&Checkpoint> = peers
        .iter()
        .filter(|p| may_be_same_database(identity, p.position.source.as_deref()))
        .collect();
    for name in instances {
        let Some(&own_through) = own.instances.get(name) else {
            continue;
        };
        let mut bound = CleanupBound {
            through: own_through,
            held_by: None,
        };
        for peer in &peers {
            if let Some(&through) = peer.position.instances.get(name)
                && through < bound.through
            {
                bound = CleanupBound {
                    through,
                    held_by: Some(peer.stream_name.clone()),
                };
            }
        }
        bounds.insert(name.clone(), bound);
    }
    bounds
}

/// The poller's part that cleans change tables after delivery.
pub(super) struct DeliveryCleanup {
    /// `source.cleanup`.
    mode: CleanupMode,
    /// `source.cleanup_interval_ms`.
    every: Duration,
    /// When the next round is due (the first an interval after the start).
    next: tokio::time::Instant,
    /// The positions the checkpoint holds, as the pipeline writes them.
    checkpoints: Option<tokio::sync::watch::Receiver<Option<Position>>>,
    /// A reader of the checkpoint store, for the other streams' positions; none:
    /// this stream is taken to be the database's only one.
    peers: Option<CheckpointStore>,
    /// The login was found to be `db_owner` (asked at the first poll).
    allowed: bool,
    /// Per capture instance, the bound last cleaned to: the procedure runs again only
    /// for a higher one.
    cleaned: BTreeMap<String, Lsn>,
    /// Rounds that ran the procedure at least once, for tests and the log.
    rounds: u64,
}

impl DeliveryCleanup {
    pub(super) fn new(mode: CleanupMode, every: Duration) -> Self {
        DeliveryCleanup {
            mode,
            every,
            next: tokio::time::Instant::now() + every,
            checkpoints: None,
            peers: None,
            allowed: false,
            cleaned: BTreeMap::new(),
            rounds: 0,
        }
    }

    /// Hands the part the positions the checkpoint holds, as each is written.
    pub(super) fn watch_checkpoints(
        &mut self,
        checkpoints: tokio::sync::watch::Receiver<Option<Position>>,
    ) {
        self.checkpoints = Some(checkpoints);
    }

    /// Where the other streams' checkpoints are read.
    pub(super) fn read_peers_from(&mut self, store: CheckpointStore) {
        self.peers = Some(store);
    }

    /// Rounds that cleaned at least one change table.
    pub(super) fn rounds(&self) -> u64 {
        self.rounds
    }

    /// Refuses the setting without `db_owner` (asked once, at the first poll).
    pub(super) async fn check_allowed(
        &mut self,
        source: &mut impl CaptureDdl,
    ) -> Result<(), SourceError> {
        if self.mode != CleanupMode::AfterDelivery || self.allowed {
            return Ok(());
        }
        if !source.may_manage_capture().await? {
            return Err(SourceError::ManageDenied {
                setting: "source.cleanup = \"after_delivery\"",
                procedures: "sys.sp_cdc_cleanup_change_table",
                instead: "set source.cleanup = \"agent\" and leave the cleanup to SQL Server's job",
            });
        }
        self.allowed = true;
        Ok(())
    }

    /// When a round is due: cleans each `tracked` capture instance as far as every
    /// stream of the database has delivered it. Only a refused permission is an
    /// error.
    pub(super) async fn run_if_due(
        &mut self,
        source: &mut impl CaptureDdl,
        tracked: &[super::Tracked],
    ) -> Result<(), SourceError> {
        if self.mode != CleanupMode::AfterDelivery {
            return Ok(());
        }
        self.check_allowed(source).await?;
        let now = tokio::time::Instant::now();
        if now < self.next {
            return Ok(());
        }
        self.next = now + self.every;
        let Some(own) = self.checkpoints.as_ref().and_then(|c| c.borrow().clone()) else {
            tracing::debug!("no checkpoint written yet: nothing is cleaned");
            return Ok(());
        };
        let peers = match self.peers.as_mut() {
            Some(store) => match store.peers().await {
                Ok(peers) => peers,
                Err(e) => {
                    tracing::warn!(error = %Chain(&e), "the other streams' checkpoints could not be read, so no change table is cleaned this time (source.cleanup = \"after_delivery\"); trying again in source.cleanup_interval_ms");
                    return Ok(());
                }
            },
            None => Vec::new(),
        };
        let instances: Vec<String> = tracked.iter().map(|t| t.instance.name.clone()).collect();
        let mut cleaned_any = false;
        for (instance, bound) in cleanup_bounds(&own, &peers, &instances) {
            if self
                .cleaned
                .get(&instance)
                .is_some_and(|&c| c >= bound.through)
            {
                continue;
            }
            match source.cleanup_change_table(&instance, bound.through).await {
                Ok(done) => {
                    self.cleaned.insert(instance.clone(), bound.through);
                    cleaned_any = true;
                    tracing::info!(
                        capture_instance = %instance,
                        delivered_through = %bound.through,
                        held_by = bound.held_by.as_deref().unwrap_or("this stream"),
                        low_water_mark = %done.low_water_mark.map_or_else(|| "none".to_owned(), |l| l.to_string()),
                        min_lsn = %done.min_lsn.map_or_else(|| "none".to_owned(), |l| l.to_string()),
                        "change table cleaned below what every stream of the database delivered (source.cleanup = \"after_delivery\")"
                    );
                }
                Err(e @ SourceError::Sql(crate::mssql::SqlErrorKind::PermissionDenied { .. })) => {
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(capture_instance = %instance, error = %Chain(&e), "the change table was not cleaned; trying again in source.cleanup_interval_ms");
                }
            }
        }
        if cleaned_any {
            self.rounds += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CHECKPOINT_VERSION;

    fn lsn(n: u32) -> Lsn {
        Lsn::from_parts(n, 0, 1)
    }

    fn identity(guid: Option<u128>, database: &str) -> Option<Box<SourceIdentity>> {
        Some(Box::new(SourceIdentity {
            server: "db1".into(),
            database: database.into(),
            database_guid: guid.map(uuid::Uuid::from_u128),
            local_database_guid: None,
            stream_guid: uuid::Uuid::nil(),
        }))
    }

    fn position(source: Option<Box<SourceIdentity>>, instances: &[(&str, u32)]) -> Position {
        Position {
            source,
            instances: instances
                .iter()
                .map(|(name, n)| (name.to_string(), lsn(*n)))
                .collect(),
            ..Default::default()
        }
    }

    fn peer(name: &str, position: Position) -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            stream_name: name.into(),
            position,
        }
    }

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn the_lowest_stream_of_the_database_bounds_each_instance() {
        let own = position(identity(Some(1), "shop"), &[("dbo_a", 50), ("dbo_b", 40)]);
        let peers = [
            peer(
                "behind",
                position(identity(Some(1), "shop"), &[("dbo_a", 30)]),
            ),
            peer(
                "ahead",
                position(identity(Some(1), "shop"), &[("dbo_a", 90), ("dbo_b", 99)]),
            ),
        ];
        let bounds = cleanup_bounds(&own, &peers, &names(&["dbo_a", "dbo_b"]));
        assert_eq!(
            bounds["dbo_a"],
            CleanupBound {
                through: lsn(30),
                held_by: Some("behind".into())
            }
        );
        assert_eq!(
            bounds["dbo_b"],
            CleanupBound {
                through: lsn(40),
                held_by: None
            }
        );
        // A stream at the same LSN as this one does not hold it back.
        let level = [peer(
            "level",
            position(identity(Some(1), "shop"), &[("dbo_b", 40)]),
        )];
        assert_eq!(
            cleanup_bounds(&own, &level, &names(&["dbo_b"]))["dbo_b"].held_by,
            None
        );
    }

    #[test]
    fn another_databases_streams_do_not_hold_it_back() {
        let own = position(identity(Some(1), "shop"), &[("dbo_a", 50)]);
        let peers = [
            // Another GUID (a restored copy) with the same names.
            peer(
                "copy",
                position(identity(Some(2), "shop"), &[("dbo_a", 10)]),
            ),
            // No GUID on one side: by names, another database.
            peer("other", position(identity(None, "crm"), &[("dbo_a", 11)])),
        ];
        let bounds = cleanup_bounds(&own, &peers, &names(&["dbo_a"]));
        assert_eq!(bounds["dbo_a"].through, lsn(50));
        // Same names and no GUID to tell: the same database.
        let same = [peer(
            "same",
            position(identity(None, "SHOP"), &[("dbo_a", 12)]),
        )];
        assert_eq!(
            cleanup_bounds(&own, &same, &names(&["dbo_a"]))["dbo_a"].through,
            lsn(12)
        );
        // A checkpoint that does not say its source counts by what it names.
        let unnamed = [peer("old", position(None, &[("dbo_a", 13)]))];
        assert_eq!(
            cleanup_bounds(&own, &unnamed, &names(&["dbo_a"]))["dbo_a"].through,
            lsn(13)
        );
    }

    #[test]
    fn only_instances_this_stream_delivered_and_reads_are_cleaned() {
        let own = position(identity(Some(1), "shop"), &[("dbo_a", 50), ("dbo_c", 5)]);
        let bounds = cleanup_bounds(&own, &[], &names(&["dbo_a", "dbo_b"]));
        assert_eq!(bounds.keys().collect::<Vec<_>>(), ["dbo_a"]);
        // No source identity yet: nothing can be matched, nothing is cleaned.
        let unknown = position(None, &[("dbo_a", 50)]);
        assert!(cleanup_bounds(&unknown, &[], &names(&["dbo_a"])).is_empty());
    }
}

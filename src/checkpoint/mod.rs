//! Checkpoint stores: where the stream's [`Position`] survives a restart.
//!
//! A checkpoint is written only for positions whose every earlier event the sink has
//! acknowledged (see `pipeline`), so resuming from it loses nothing; events after it
//! may be re-sent, with the same ids and bytes.
//!
//! Stores are keyed by a stream name, so several pollers can share one file
//! directory or one database table.
//!
//! **One writer per stream.** Before it reads the checkpoint, a run takes the
//! stream's exclusive lease ([`CheckpointStore::acquire_lease`]): an OS file lock on
//! `<checkpoint>.lock` for the file store, an `sp_getapplock` held by the store's own
//! session for the table store. A second process on the same stream waits as a hot
//! standby, says for whom, and takes over within a second or two when the holder dies
//! (the OS or the server releases the lock with the process or its session). Every
//! checkpoint write is fenced: the table store re-takes the lock on any new
//! connection before it writes, and stops the run if another process holds it.

pub mod file;
pub mod kafka;
pub mod memory;
pub mod table;

use serde::{Deserialize, Serialize};

use crate::error::Cause;
use crate::position::Position;

/// What a store holds for one stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub version: u32,
    pub stream_name: String,
    pub position: Position,
}

/// The checkpoint format this release writes.
///
/// - 1: `last_event` and `instances`; later releases of the same version added
///   `change_tables`, `sink_length`, `source`, `switches` and `loads`, each optional.
/// - 2: adds `next_load_base` and each load's `logical_base` (the `logicalid`
///   range of a table load), both 0 when absent. The number changed so that a
///   release that knows only version 1 refuses the document by name instead of
///   reading it without the fields it does not know (it would silently drop a load
///   in progress, a capture-instance switch or a load's `logicalid` range).
/// - 3: adds `sink_file`, which file `sink_length` is of (its path and last event
///   id); a release that knows only version 2 refuses the document by name rather
///   than cutting back a file it cannot tell is the checkpoint's.
/// - 4: adds `commit_clock_ns`, the latest commit instant read, which decides the
///   readings of an hour the clocks repeat; a release that knows only version 3
///   refuses the document by name rather than reading such an hour differently
///   from the run that wrote it (a re-sent event would get another `time`).
/// - 5: adds each table version's `since` and `columns` (the shape a schema-change
///   event described); a release that knows only version 4 refuses the document
///   by name rather than re-send a schema-change event with another shape before.
/// - 6: adds `resnapshots`, the re-snapshots under way; a release that knows only
///   version 5 refuses the document by name rather than dropping one.
pub const CHECKPOINT_VERSION: u32 = 6;

/// The oldest format this release reads: every version-1 to version-5 document is
/// a valid version-6 position (no version removed a field, and the ones they added
/// default to 0 or absent).
pub const OLDEST_READABLE_VERSION: u32 = 1;

/// Why a checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {location}: {reason}")]
    Io {
        location: String,
        reason: String,
        /// The system's, the driver's or the client's own error.
        #[source]
        cause: Option<Cause>,
    },
    /// A fault that can pass (deadlock victim, failover, a reset connection).
    #[error("checkpoint {location}: {reason}")]
    Transient {
        location: String,
        reason: String,
        #[source]
        cause: Option<Cause>,
    },
    #[error(
        "checkpoint {location} is not a valid checkpoint ({reason}); move it away to start from source.start_position"
    )]
    Corrupt { location: String, reason: String },
    /// A document written by a newer release, whose fields this one may not know.
    #[error(
        "checkpoint {location} has format version {found}, written by a newer mssql-ces; this release reads versions {oldest} to {newest}: run the newer release (or move the checkpoint away to start from source.start_position)"
    )]
    NewerVersion {
        location: String,
        found: u32,
        oldest: u32,
        newest: u32,
    },
    /// The position could not be written as JSON (it always can: a struct of
    /// strings, numbers and maps; kept as an error rather than an empty document).
    #[error("checkpoint {location}: the position cannot be written as JSON ({reason})")]
    Serialize { location: String, reason: String },
    #[error(
        "checkpoint {location}: another process took this stream's lease ({holder}); this one stops writing"
    )]
    LeaseLost { location: String, holder: String },
    #[error(
        "checkpoint {location} belongs to stream `{found}`, not `{expected}` (checkpoint.stream_name)"
    )]
    OtherStream {
        location: String,
        expected: String,
        found: String,
    },
}

impl CheckpointError {
    /// True when writing again can succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, CheckpointError::Transient { .. })
    }
}

/// A checkpoint store.
pub enum CheckpointStore {
    File(file::FileStore),
    Table(Box<table::TableStore>),
    Kafka(Box<kafka::KafkaStore>),
    Memory(memory::MemoryStore),
}

/// How long the file store's periodic lease check may take (a `stat` of the lock
/// file, on a blocking thread).
const FILE_CHECK_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a standby tries for the lease.
pub const LEASE_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

impl CheckpointStore {
    /// Takes the stream's exclusive lease, waiting as a hot standby while another
    /// process holds it. `Ok(false)` when `stop` was cancelled while waiting.
    pub async fn acquire_lease(
        &mut self,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<bool, CheckpointError> {
        let mut waiting_since: Option<std::time::Instant> = None;
        let mut last_report = std::time::Instant::now();
        loop {
            let tried = match self {
                CheckpointStore::File(s) => s.try_lease(),
                CheckpointStore::Table(s) => s.try_lease().await,
                CheckpointStore::Kafka(_) | CheckpointStore::Memory(_) => Ok(None),
            };
            let holder = match tried {
                Ok(holder) => holder,
                // A standby outlives a store that is briefly unreachable (a failover
                // is when it is needed most).
                Err(e) if e.is_transient() => {
                    tracing::warn!(error = %crate::error::Chain(&e), "cannot reach the checkpoint store to take the lease; trying again");
                    Some("unknown (the store did not answer)".to_owned())
                }
                Err(e) => return Err(e),
            };
            let Some(holder) = holder else {
                if let Some(since) = waiting_since {
                    tracing::info!(
                        waited_ms = since.elapsed().as_millis() as u64,
                        "took over the stream's lease: this process is now the active one"
                    );
                }
                return Ok(true);
            };
            if waiting_since.is_none()
                || last_report.elapsed() >= std::time::Duration::from_secs(60)
            {
                tracing::info!(held_by = %holder, "hot standby: another process holds this stream's lease (checkpoint.stream_name); waiting to take over");
                last_report = std::time::Instant::now();
            }
            waiting_since.get_or_insert_with(std::time::Instant::now);
            tokio::select! {
                () = tokio::time::sleep(LEASE_RETRY) => {}
                () = stop.cancelled() => return Ok(false),
            }
        }
    }

    /// Confirms this process still holds the stream's lease: the file store's lock
    /// file is still the one at the path; the table store's session still owns its
    /// application lock (or a new connection takes it again).
    pub async fn verify_lease(&mut self) -> Result<(), CheckpointError> {
        match self {
            // Off the async workers, and bounded: a hung mount must hold neither.
            CheckpointStore::File(s) => {
                let detached = s.detached()?;
                let location = s.path().display().to_string();
                let check = tokio::task::spawn_blocking(move || detached.check_lease());
                match tokio::time::timeout(FILE_CHECK_BUDGET, check).await {
                    Ok(Ok(checked)) => checked,
                    Ok(Err(e)) => Err(CheckpointError::Io {
                        cause: Some(crate::error::cause(e)),
                        location,
                        reason: "the lease check's thread failed".to_owned(),
                    }),
                    Err(_) => Err(CheckpointError::Transient {
                        cause: None,
                        location,
                        reason: format!(
                            "the lock file did not answer within {} s (a hung file system?)",
                            FILE_CHECK_BUDGET.as_secs()
                        ),
                    }),
                }
            }
            CheckpointStore::Table(s) => s.verify_lease().await,
            // No lease; where its topic's retention is unknown, its last position
            // is written again now and then.
            CheckpointStore::Kafka(s) => s.keep_alive().await,
            CheckpointStore::Memory(_) => Ok(()),
        }
    }

    /// How the lease is kept when it can lapse without this process's doing: the
    /// table store's is its session's, which a dropped connection ends. `None`
    /// where it lasts as long as the process (a file lock) or there is none.
    pub fn lapsing_lease(&self) -> Option<table::LeaseTiming> {
        match self {
            CheckpointStore::Table(s) => Some(s.lease_timing()),
            _ => None,
        }
    }

    pub async fn load(&mut self) -> Result<Option<Position>, CheckpointError> {
        match self {
            CheckpointStore::File(s) => s.load(),
            CheckpointStore::Table(s) => s.load().await,
            CheckpointStore::Kafka(s) => s.load().await,
            CheckpointStore::Memory(s) => Ok(s.load()),
        }
    }

    /// Whether a checkpoint could be written, without writing one or taking the
    /// lease (for `check`, which may run beside the active process).
    pub async fn check_writable(&mut self) -> Result<(), CheckpointError> {
        match self {
            CheckpointStore::File(s) => s.check_writable(),
            CheckpointStore::Table(s) => s.check_writable().await,
            CheckpointStore::Kafka(s) => s.check_writable().await,
            CheckpointStore::Memory(_) => Ok(()),
        }
    }

    /// The checkpoints of the other streams this store holds, for
    /// `source.cleanup = "after_delivery"`: the files beside this stream's, the
    /// table's other rows, the topic's other keys. A document that is not a
    /// checkpoint is passed over; one written by a newer release is an error (it
    /// may say more than this release can read), as is a store that cannot be read.
    pub async fn peers(&mut self) -> Result<Vec<Checkpoint>, CheckpointError> {
        match self {
            CheckpointStore::File(s) => {
                let detached = s.detached()?;
                let location = s.path().display().to_string();
                tokio::task::spawn_blocking(move || detached.peers())
                    .await
                    .map_err(|e| CheckpointError::Io {
                        cause: Some(crate::error::cause(e)),
                        location,
                        reason: "the read's thread failed".to_owned(),
                    })?
            }
            CheckpointStore::Table(s) => s.peers().await,
            CheckpointStore::Kafka(s) => s.peers().await,
            CheckpointStore::Memory(s) => Ok(s.peers()),
        }
    }

    pub async fn save(&mut self, position: &Position) -> Result<(), CheckpointError> {
        match self {
            // Off the async workers: an fsync on a hung mount must not hold them
            // (nor, with the caller's time bound, the exit).
            CheckpointStore::File(s) => {
                // The lock file's check is file-system I/O too: on the same thread.
                let detached = s.detached()?;
                let position = position.clone();
                tokio::task::spawn_blocking(move || {
                    detached.check_lease()?;
                    detached.save(&position)
                })
                .await
                .map_err(|e| CheckpointError::Io {
                    cause: Some(crate::error::cause(e)),
                    location: s.path().display().to_string(),
                    reason: "the write's thread failed".to_owned(),
                })?
            }
            CheckpointStore::Table(s) => s.save(position).await,
            CheckpointStore::Kafka(s) => s.save(position).await,
            CheckpointStore::Memory(s) => s.save(position).await,
        }
    }
}

/// Parses a stored checkpoint document and checks it belongs to `stream_name`.
pub fn parse(text: &str, stream_name: &str, location: &str) -> Result<Position, CheckpointError> {
    let checkpoint = parse_any(text, location)?;
    if checkpoint.stream_name != stream_name {
        return Err(CheckpointError::OtherStream {
            location: location.to_owned(),
            expected: stream_name.to_owned(),
            found: checkpoint.stream_name,
        });
    }
    Ok(checkpoint.position)
}

/// Parses a stored checkpoint document of any stream, in a format this release
/// reads.
pub fn parse_any(text: &str, location: &str) -> Result<Checkpoint, CheckpointError> {
    /// A document's format version alone: a newer format has fields this release
    /// does not know, which the whole document's read refuses first.
    #[derive(Deserialize)]
    struct VersionOnly {
        version: u32,
    }
    let checkpoint: Checkpoint = match serde_json::from_str(text) {
        Ok(checkpoint) => checkpoint,
        Err(e) => {
            if let Ok(VersionOnly { version }) = serde_json::from_str(text)
                && version > CHECKPOINT_VERSION
            {
                return Err(CheckpointError::NewerVersion {
                    location: location.to_owned(),
                    found: version,
                    oldest: OLDEST_READABLE_VERSION,
                    newest: CHECKPOINT_VERSION,
                });
            }
            return Err(CheckpointError::Corrupt {
                location: location.to_owned(),
                reason: e.to_string(),
            });
        }
    };
    if checkpoint.version > CHECKPOINT_VERSION {
        return Err(CheckpointError::NewerVersion {
            location: location.to_owned(),
            found: checkpoint.version,
            oldest: OLDEST_READABLE_VERSION,
            newest: CHECKPOINT_VERSION,
        });
    }
    if checkpoint.version < OLDEST_READABLE_VERSION {
        return Err(CheckpointError::Corrupt {
            location: location.to_owned(),
            reason: format!(
                "format version {} is older than any release wrote",
                checkpoint.version
            ),
        });
    }
    Ok(checkpoint)
}

/// The stored document for `position`, in the current format.
pub fn render(
    stream_name: &str,
    position: &Position,
    location: &str,
) -> Result<String, CheckpointError> {
    let checkpoint = Checkpoint {
        version: CHECKPOINT_VERSION,
        stream_name: stream_name.to_owned(),
        position: position.clone(),
    };
    serde_json::to_string_pretty(&checkpoint).map_err(|e| CheckpointError::Serialize {
        location: location.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsn::Lsn;
    use crate::position::{EventPosition, SourceIdentity, Switch, TableLoad};

    /// A checkpoint as release 0.1 (format version 1, with every optional field)
    /// wrote it: this release reads it whole.
    const V1_DOCUMENT: &str = include_str!("../../tests/fixtures/checkpoint/v1-release-0.1.json");

    #[test]
    fn a_version_1_checkpoint_is_read_whole() {
        let position = parse(V1_DOCUMENT, "default", "cp.json").expect("reads version 1");
        assert_eq!(
            position.last_event,
            Some(EventPosition {
                commit_lsn: Lsn::from_parts(0xB1, 0x8A8, 7),
                sequence_number: 3,
            })
        );
        assert_eq!(position.instances.len(), 2);
        assert_eq!(position.change_tables["dbo_Orders"], 1_205_579_333);
        assert_eq!(position.sink_length, Some(4096));
        let source = position.source.as_deref().expect("identity");
        assert_eq!(
            *source,
            SourceIdentity {
                server: "sql1".into(),
                database: "Shop".into(),
                database_guid: Some(
                    uuid::Uuid::parse_str("0b1f3c2e-9a4d-4f7b-8e21-6c5d4a3b2f10").unwrap()
                ),
                local_database_guid: None,
                stream_guid: uuid::Uuid::parse_str("1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0").unwrap(),
            }
        );
        assert_eq!(
            position.switches["dbo_Orders_v1"],
            Switch {
                to: "dbo_Orders".into(),
                at: Lsn::from_parts(0xB1, 0x810, 1),
            }
        );
        assert_eq!(
            position.loads["dbo_Items"],
            TableLoad {
                table: "dbo.Items".into(),
                at: Lsn::from_parts(0xB1, 0x8A0, 1),
                commit_time_ns: 1_786_120_000_123_000_000,
                after: Some(vec![Some("42".into()), None]),
                rows: 1000,
                logical_base: 0,
            }
        );
        // Written again, it is the current version with the same position.
        let again = render("default", &position, "cp.json").expect("renders");
        assert!(again.contains(&format!("\"version\": {CHECKPOINT_VERSION}")));
        assert_eq!(
            parse(&again, "default", "cp.json").map_err(|e| e.to_string()),
            Ok(position)
        );
    }

    #[test]
    fn a_newer_version_is_refused_by_name() {
        let newer = V1_DOCUMENT.replacen("\"version\": 1", "\"version\": 7", 1);
        let err = parse(&newer, "default", "cp.json").unwrap_err();
        assert!(
            matches!(
                &err,
                CheckpointError::NewerVersion { location, found: 7, oldest, newest }
                    if location == "cp.json"
                        && *oldest == OLDEST_READABLE_VERSION
                        && *newest == CHECKPOINT_VERSION
            ),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("version 7")
                && text.contains("versions 1 to 6")
                && text.contains("newer mssql-ces"),
            "{text}"
        );
        let older = V1_DOCUMENT.replacen("\"version\": 1", "\"version\": 0", 1);
        assert!(matches!(
            parse(&older, "default", "cp.json"),
            Err(CheckpointError::Corrupt { .. })
        ));
        // A newer format carries fields this release does not know: still newer,
        // not corrupt.
        let with_more = newer.replacen("\"version\": 7", "\"version\": 7, \"later\": true", 1);
        assert!(with_more.contains("later"));
        assert!(matches!(
            parse(&with_more, "default", "cp.json"),
            Err(CheckpointError::NewerVersion { found: 7, .. })
        ));
        // The same field in a document of this format is corrupt.
        let current = V1_DOCUMENT.replacen("\"version\": 1", "\"version\": 1, \"later\": true", 1);
        assert!(matches!(
            parse(&current, "default", "cp.json"),
            Err(CheckpointError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_field_this_release_does_not_know_is_refused() {
        let unknown = V1_DOCUMENT.replacen(
            "\"sink_length\": 4096,",
            "\"sink_length\": 4096,\n    \"leases\": {},",
            1,
        );
        let err = parse(&unknown, "default", "cp.json").unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("leases"), "{err}");
    }

    fn temp_checkpoint(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("mssql-ces-lease-{name}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("cp.json")
    }

    /// Deleting the lock file must not admit a second writer: the holder sees its
    /// lock file is no longer the one at the path and stops writing.
    #[tokio::test]
    async fn a_deleted_lock_file_stops_the_holders_writes() {
        let path = temp_checkpoint("deleted");
        let mut active = CheckpointStore::File(file::FileStore::new(&path, "s"));
        assert!(
            active
                .acquire_lease(&tokio_util::sync::CancellationToken::new())
                .await
                .unwrap()
        );
        active.save(&Position::default()).await.unwrap();
        active.verify_lease().await.expect("held");
        let lock = file::FileStore::new(&path, "s").lock_path();
        std::fs::remove_file(&lock).unwrap();
        // The periodic check (every 2 s in a run) sees it before any write.
        let err = active.verify_lease().await.unwrap_err();
        assert!(matches!(err, CheckpointError::LeaseLost { .. }), "{err}");
        let err = active.save(&Position::default()).await.unwrap_err();
        assert!(matches!(err, CheckpointError::LeaseLost { .. }), "{err}");
        assert!(err.to_string().contains("deleted or replaced"), "{err}");
        std::fs::remove_dir_all(path.parent().unwrap()).ok();
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_waits_for_the_lease_and_takes_it_when_the_holder_goes() {
        let path = temp_checkpoint("takeover");
        let mut active = CheckpointStore::File(file::FileStore::new(&path, "s"));
        let stop = tokio_util::sync::CancellationToken::new();
        assert_eq!(
            active.acquire_lease(&stop).await.map_err(|e| e.to_string()),
            Ok(true)
        );
        let standby = tokio::spawn(async move {
            let mut store = CheckpointStore::File(file::FileStore::new(&path, "s"));
            let stop = tokio_util::sync::CancellationToken::new();
            let took = store.acquire_lease(&stop).await;
            (took, tokio::time::Instant::now())
        });
        // The standby retries every LEASE_RETRY while the holder lives.
        tokio::time::sleep(LEASE_RETRY * 10).await;
        assert!(!standby.is_finished(), "waits while the lease is held");
        let released = tokio::time::Instant::now();
        drop(active);
        let (took, at) = standby.await.unwrap();
        assert_eq!(took.map_err(|e| e.to_string()), Ok(true));
        assert!(
            at - released <= LEASE_RETRY,
            "taken at the next try after the holder went: {:?}",
            at - released
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_stopped_while_waiting_returns_false() {
        let path = temp_checkpoint("stopped");
        let mut active = CheckpointStore::File(file::FileStore::new(&path, "s"));
        let never = tokio_util::sync::CancellationToken::new();
        assert_eq!(
            active
                .acquire_lease(&never)
                .await
                .map_err(|e| e.to_string()),
            Ok(true)
        );
        let mut standby = CheckpointStore::File(file::FileStore::new(&path, "s"));
        let stop = tokio_util::sync::CancellationToken::new();
        let stopper = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(LEASE_RETRY * 3).await;
            stopper.cancel();
        });
        assert_eq!(
            standby
                .acquire_lease(&stop)
                .await
                .map_err(|e| e.to_string()),
            Ok(false)
        );
        drop(active);
    }

    #[test]
    fn only_transient_faults_are_transient() {
        let at = |reason: &str| (String::from("cp"), reason.to_owned());
        let (location, reason) = at("deadlock victim");
        assert!(
            CheckpointError::Transient {
                location,
                reason,
                cause: None
            }
            .is_transient()
        );
        let (location, reason) = at("disk full");
        assert!(
            !CheckpointError::Io {
                location,
                reason,
                cause: None
            }
            .is_transient()
        );
        let (location, reason) = at("bad json");
        assert!(!CheckpointError::Corrupt { location, reason }.is_transient());
    }

    #[test]
    fn the_version_this_release_writes_is_6() {
        // An older release compares the version with the one it writes and refuses
        // a newer one by name: the bumps keep it from cutting back a file it cannot
        // tell is the checkpoint's (3), reading a repeated hour otherwise (4) or
        // re-sending a schema-change event with another shape before (5), or
        // dropping a re-snapshot under way (6).
        assert_eq!(CHECKPOINT_VERSION, 6);
        let text = render("s", &Position::default(), "x").expect("renders");
        let value: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(value["version"], 6);
    }
}

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
pub mod memory;
pub mod table;

use serde::{Deserialize, Serialize};

use crate::source::poller::Position;

/// What a store holds for one stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub version: u32,
    pub stream_name: String,
    pub position: Position,
}

/// The current checkpoint format.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Why a checkpoint could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {location}: {reason}")]
    Io { location: String, reason: String },
    /// A fault that can pass (deadlock victim, failover, a reset connection).
    #[error("checkpoint {location}: {reason}")]
    Transient { location: String, reason: String },
    #[error(
        "checkpoint {location} is not a valid checkpoint ({reason}); move it away to start from source.start_position"
    )]
    Corrupt { location: String, reason: String },
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
    Memory(memory::MemoryStore),
}

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
                CheckpointStore::Memory(_) => Ok(None),
            };
            let holder = match tried {
                Ok(holder) => holder,
                // A standby outlives a store that is briefly unreachable (a failover
                // is when it is needed most).
                Err(e) if e.is_transient() => {
                    tracing::warn!(error = %e, "cannot reach the checkpoint store to take the lease; trying again");
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

    pub async fn load(&mut self) -> Result<Option<Position>, CheckpointError> {
        match self {
            CheckpointStore::File(s) => s.load(),
            CheckpointStore::Table(s) => s.load().await,
            CheckpointStore::Memory(s) => Ok(s.load()),
        }
    }

    /// Whether a checkpoint could be written, without writing one or taking the
    /// lease (for `check`, which may run beside the active process).
    pub async fn check_writable(&mut self) -> Result<(), CheckpointError> {
        match self {
            CheckpointStore::File(s) => s.check_writable(),
            CheckpointStore::Table(s) => s.check_writable().await,
            CheckpointStore::Memory(_) => Ok(()),
        }
    }

    pub async fn save(&mut self, position: &Position) -> Result<(), CheckpointError> {
        match self {
            CheckpointStore::File(s) => s.save(position),
            CheckpointStore::Table(s) => s.save(position).await,
            CheckpointStore::Memory(s) => s.save(position),
        }
    }
}

/// Parses a stored checkpoint document and checks it belongs to `stream_name`.
pub fn parse(text: &str, stream_name: &str, location: &str) -> Result<Position, CheckpointError> {
    let checkpoint: Checkpoint =
        serde_json::from_str(text).map_err(|e| CheckpointError::Corrupt {
            location: location.to_owned(),
            reason: e.to_string(),
        })?;
    if checkpoint.version != CHECKPOINT_VERSION {
        return Err(CheckpointError::Corrupt {
            location: location.to_owned(),
            reason: format!("version {} is not {CHECKPOINT_VERSION}", checkpoint.version),
        });
    }
    if checkpoint.stream_name != stream_name {
        return Err(CheckpointError::OtherStream {
            location: location.to_owned(),
            expected: stream_name.to_owned(),
            found: checkpoint.stream_name,
        });
    }
    Ok(checkpoint.position)
}

/// The stored document for `position`.
pub fn render(stream_name: &str, position: &Position) -> String {
    let checkpoint = Checkpoint {
        version: CHECKPOINT_VERSION,
        stream_name: stream_name.to_owned(),
        position: position.clone(),
    };
    // A struct of strings, numbers and maps always serializes.
    serde_json::to_string_pretty(&checkpoint).unwrap_or_default()
}

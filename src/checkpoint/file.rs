//! The local-file checkpoint store (the default).
//!
//! Writes are atomic and durable: the document goes to a temporary file in the same
//! directory, which is fsynced, renamed over the checkpoint, and then the directory is
//! fsynced so the rename itself survives a power loss.
//!
//! The lease is an exclusive OS lock (`flock`) on `<checkpoint>.lock`, held by an open
//! file for the life of the process: the kernel releases it when the process dies,
//! however it dies. The file names the holder (process id and host) for the standby's
//! log.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::{CheckpointError, parse, render};
use crate::position::Position;

/// Creates and removes a file in `dir`: whether a file can be written there.
pub fn probe_writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".mssql-ces-check-{}", std::process::id()));
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)?;
    fs::remove_file(&probe)
}

pub struct FileStore {
    path: PathBuf,
    stream_name: String,
    /// The open lock file while this process holds the lease.
    lease: Option<File>,
}

impl FileStore {
    pub fn new(path: impl Into<PathBuf>, stream_name: impl Into<String>) -> Self {
        FileStore {
            path: path.into(),
            stream_name: stream_name.into(),
            lease: None,
        }
    }

    /// `<checkpoint>.lock`.
    pub fn lock_path(&self) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    }

    /// Tries to take the lease: `None` when taken (or already held), else who holds it.
    pub fn try_lease(&mut self) -> Result<Option<String>, CheckpointError> {
        if self.lease.is_some() {
            return Ok(None);
        }
        let lock_path = self.lock_path();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| self.io(e))?;
        match file.try_lock() {
            Ok(()) => {
                let holder = format!(
                    "pid {} on {}",
                    std::process::id(),
                    hostname().unwrap_or_else(|| "this host".into())
                );
                file.set_len(0).map_err(|e| self.io(e))?;
                // Advisory text for the standby's log: not worth an fsync.
                file.write_all(holder.as_bytes()).map_err(|e| self.io(e))?;
                self.lease = Some(file);
                Ok(None)
            }
            Err(fs::TryLockError::WouldBlock) => {
                let holder = fs::read_to_string(&lock_path).unwrap_or_default();
                Ok(Some(if holder.trim().is_empty() {
                    format!("a process holding {}", lock_path.display())
                } else {
                    holder.trim().to_owned()
                }))
            }
            Err(fs::TryLockError::Error(e)) => Err(self.io(e)),
        }
    }

    fn io(&self, error: std::io::Error) -> CheckpointError {
        CheckpointError::Io {
            location: self.path.display().to_string(),
            reason: crate::setting::file_error_advice("checkpoint.path", &self.path, &error)
                .unwrap_or_else(|| "the file cannot be used".to_owned()),
            cause: Some(crate::error::cause(error)),
        }
    }

    pub fn load(&self) -> Result<Option<Position>, CheckpointError> {
        match fs::read_to_string(&self.path) {
            Ok(text) => parse(&text, &self.stream_name, &self.path.display().to_string()).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io(e)),
        }
    }

    fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    /// Creates and removes a file beside the checkpoint: what a write needs.
    pub fn check_writable(&self) -> Result<(), CheckpointError> {
        probe_writable(&self.dir()).map_err(|e| self.io(e))
    }

    pub fn save(&self, position: &Position) -> Result<(), CheckpointError> {
        let text = render(
            &self.stream_name,
            position,
            &self.path.display().to_string(),
        )?;
        let dir = self.dir();
        let file_name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "checkpoint".into());
        let temp = dir.join(format!(".{file_name}.tmp"));
        let written = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&temp)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()
        })();
        if let Err(e) = written {
            // A full disk: no half-written temporary file is left behind.
            let _ = fs::remove_file(&temp);
            return Err(self.io(e));
        }
        fs::rename(&temp, &self.path).map_err(|e| self.io(e))?;
        sync_dir(&dir).map_err(|e| self.io(e))?;
        Ok(())
    }

    /// The other streams' checkpoints in this one's directory: every regular file
    /// there but this one's, its lock and temporary files, whose text is a
    /// checkpoint document. Files of another kind (a sink's output, a
    /// configuration) are passed over unread past their first byte or their size.
    pub fn peers(&self) -> Result<Vec<super::Checkpoint>, CheckpointError> {
        let mut peers = Vec::new();
        let entries = fs::read_dir(self.dir()).map_err(|e| self.io(e))?;
        for entry in entries {
            let entry = entry.map_err(|e| self.io(e))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let own = path.file_name() == self.path.file_name();
            if own || name.starts_with('.') || name.ends_with(".lock") {
                continue;
            }
            let Some(text) = read_if_checkpoint_sized(&path).map_err(|e| self.io(e))? else {
                continue;
            };
            let location = path.display().to_string();
            match super::parse_any(&text, &location) {
                Ok(checkpoint) if checkpoint.stream_name != self.stream_name => {
                    peers.push(checkpoint)
                }
                Ok(_) => {}
                Err(CheckpointError::Corrupt { reason, .. }) => {
                    tracing::debug!(%location, %reason, "not a checkpoint; passed over");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(peers)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stream_name(&self) -> &str {
        &self.stream_name
    }

    /// The same store for another thread: the lease's lock file shared (a duplicate
    /// of its descriptor, which holds the same lock; dropping it releases nothing).
    pub fn detached(&self) -> Result<FileStore, CheckpointError> {
        let lease = match &self.lease {
            Some(file) => Some(file.try_clone().map_err(|e| CheckpointError::Io {
                location: self.path.display().to_string(),
                reason: "cannot share the lock file with the write's thread".to_owned(),
                cause: Some(crate::error::cause(e)),
            })?),
            None => None,
        };
        Ok(FileStore {
            path: self.path.clone(),
            stream_name: self.stream_name.clone(),
            lease,
        })
    }

    /// Whether the lock file this process holds is still the one at the lock path.
    /// Deleted or replaced, another process could take a lock on the new file and
    /// write beside this one: this one stops writing instead.
    pub fn check_lease(&self) -> Result<(), CheckpointError> {
        let Some(held) = &self.lease else {
            return Ok(());
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt as _;
            let same = match (held.metadata(), fs::metadata(self.lock_path())) {
                (Ok(h), Ok(p)) => h.dev() == p.dev() && h.ino() == p.ino(),
                _ => false,
            };
            if !same {
                return Err(CheckpointError::LeaseLost {
                    location: self.path.display().to_string(),
                    holder: format!(
                        "the lock file {} was deleted or replaced while this process held it",
                        self.lock_path().display()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The host name, for naming the lease holder.
/// The largest file read as a possible checkpoint: a position is a few kilobytes
/// (a wide table's shape a few hundred more).
const LARGEST_CHECKPOINT: u64 = 16 << 20;

/// The text of `path` when it is a regular file of a checkpoint's size that starts
/// as a JSON object; `None` otherwise (or when it went away meanwhile).
fn read_if_checkpoint_sized(path: &Path) -> std::io::Result<Option<String>> {
    use std::io::Read as _;
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() > LARGEST_CHECKPOINT {
        return Ok(None);
    }
    let mut text = String::new();
    if file
        .take(LARGEST_CHECKPOINT)
        .read_to_string(&mut text)
        .is_err()
    {
        // Not UTF-8: not a checkpoint.
        return Ok(None);
    }
    Ok(text.trim_start().starts_with('{').then_some(text))
}

fn hostname() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsn::Lsn;
    use crate::position::EventPosition;
    use std::collections::BTreeMap;

    /// A write that fails (here the temporary file is `/dev/full`, as a full disk
    /// behaves) leaves no temporary file behind, and the checkpoint as it was.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("mssql-ces-full-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cp.json");
        let store = FileStore::new(&path, "s");
        store.save(&Position::default()).unwrap();
        let before = std::fs::read(&path).unwrap();
        let temp = dir.join(".cp.json.tmp");
        std::os::unix::fs::symlink("/dev/full", &temp).unwrap();
        let error = store.save(&position()).unwrap_err();
        let said = crate::error::Chain(&error).to_string();
        assert!(said.contains("No space left"), "{said}");
        assert!(said.contains("is full: free space"), "{said}");
        assert!(
            std::fs::symlink_metadata(&temp).is_err(),
            "the temporary file is gone"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before);
        std::fs::remove_dir_all(&dir).ok();
    }

    fn position() -> Position {
        Position {
            last_event: Some(EventPosition {
                commit_lsn: Lsn::from_parts(0xB1, 0x8A8, 7),
                sequence_number: 3,
            }),
            instances: [("dbo_Orders".to_string(), Lsn::from_parts(0xB1, 0x8A8, 7))].into(),
            change_tables: [("dbo_Orders".to_string(), 1_205_579_333)].into(),
            sink_length: Some(4096),
            sink_file: None,
            source: None,
            switches: BTreeMap::new(),
            loads: [(
                "dbo_Items".to_string(),
                crate::position::TableLoad {
                    table: "dbo.Items".into(),
                    at: Lsn::from_parts(0xB1, 0x8A0, 1),
                    commit_time_ns: 1_786_120_000_123_000_000,
                    after: Some(vec![Some("42".into()), None]),
                    rows: 1000,
                    logical_base: 1 << 40,
                },
            )]
            .into(),
            resnapshots: [(
                "dbo_Orders".to_string(),
                crate::position::Resnapshot {
                    load: crate::position::TableLoad {
                        table: "dbo.Orders".into(),
                        at: Lsn::from_parts(0xB1, 0x8A8, 7),
                        commit_time_ns: 1_786_120_000_456_000_000,
                        after: Some(vec![Some("17".into())]),
                        rows: 300,
                        logical_base: 2 << 40,
                    },
                    chunks: 3,
                    superseded: 2,
                },
            )]
            .into(),
            next_load_base: 3 << 40,
            commit_clock_ns: Some(1_790_000_000_123_456_789),
            table_versions: [(
                "dbo.Orders".to_string(),
                crate::position::TableVersion {
                    version: 3,
                    shape: uuid::Uuid::from_u128(0x5eed),
                    since: Some(Lsn::from_parts(0x2A, 0x10, 3)),
                    columns: Some(std::sync::Arc::new(crate::position::TableShape {
                        capture_instance: "dbo_T_v3".into(),
                        cols: vec![crate::position::ShapeColumn {
                            name: "Id".into(),
                            sql_type: "int".into(),
                            index: 0,
                            nullable: Some(false),
                            key_position: Some(1),
                        }],
                    })),
                },
            )]
            .into(),
            open_transaction: Some(crate::position::OpenTransaction {
                commit_lsn: Lsn::from_parts(0x2A, 0x10, 9),
                total: 1500,
                tables: vec![("Shop.dbo.Orders".into(), 1500)],
            }),
        }
    }

    fn temp_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mssql-ces-cp-{}", uuid::Uuid::new_v4()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn round_trips_and_replaces_atomically() {
        let dir = temp_dir();
        let store = FileStore::new(dir.join("cp.json"), "orders");
        assert_eq!(store.load().map_err(|e| e.to_string()), Ok(None));
        store.save(&position()).unwrap();
        assert_eq!(
            store.load().map_err(|e| e.to_string()),
            Ok(Some(position()))
        );
        let mut later = position();
        later.last_event = None;
        store.save(&later).unwrap();
        assert_eq!(store.load().map_err(|e| e.to_string()), Ok(Some(later)));
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        let text = fs::read_to_string(dir.join("cp.json")).unwrap();
        assert!(
            text.contains("000000B1:000008A8:0007"),
            "LSNs stored readably: {text}"
        );
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn corrupt_and_foreign_checkpoints_are_clear_errors() {
        let dir = temp_dir();
        let path = dir.join("cp.json");
        fs::write(&path, "{ not json").unwrap();
        let err = FileStore::new(&path, "orders").load().unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
        FileStore::new(&path, "orders").save(&position()).unwrap();
        let err = FileStore::new(&path, "billing").load().unwrap_err();
        assert!(err.to_string().contains("checkpoint.stream_name"), "{err}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn one_process_holds_the_lease_and_the_next_takes_it_when_it_is_gone() {
        let dir = temp_dir();
        let path = dir.join("cp.json");
        let mut active = FileStore::new(&path, "s");
        assert_eq!(active.try_lease().unwrap(), None);
        assert_eq!(
            active.try_lease().unwrap(),
            None,
            "held: taking it again is a no-op"
        );
        // Another open file on the same lock: what a second process sees.
        let mut standby = FileStore::new(&path, "s");
        let holder = standby
            .try_lease()
            .unwrap()
            .expect("held by the active one");
        assert!(holder.contains(&std::process::id().to_string()), "{holder}");
        drop(active);
        assert_eq!(standby.try_lease().unwrap(), None, "taken over");
        fs::remove_dir_all(dir).ok();
    }
}

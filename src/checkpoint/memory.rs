//! An in-memory checkpoint store: for embedding the pipeline in a program that keeps
//! the position itself, and for tests, which can make it fail on demand (the
//! `testing` feature).

use std::sync::{Arc, Mutex, MutexGuard};

use super::{Checkpoint, CheckpointError};
use crate::position::Position;

#[derive(Debug, Default)]
struct Inner {
    position: Option<Position>,
    writes: usize,
    /// Other streams' checkpoints, as the embedding program tells them.
    peers: Vec<Checkpoint>,
    #[cfg(any(test, feature = "testing"))]
    faults: Faults,
}

/// Faults a test injects.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Default)]
struct Faults {
    /// The next this many writes fail with a transient error.
    fail_next: usize,
    /// Each write first takes this long (a store that hangs).
    delay: Option<std::time::Duration>,
}

/// A handle to an in-memory position (`Clone` shares it).
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

impl MemoryStore {
    pub fn new(position: Option<Position>) -> Self {
        let store = MemoryStore::default();
        store.lock().position = position;
        store
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The position last written.
    pub fn position(&self) -> Option<Position> {
        self.lock().position.clone()
    }

    /// Writes that succeeded.
    pub fn writes(&self) -> usize {
        self.lock().writes
    }

    pub fn load(&self) -> Option<Position> {
        self.position()
    }

    /// Other streams' checkpoints ([`set_peers`](Self::set_peers)).
    pub fn peers(&self) -> Vec<Checkpoint> {
        self.lock().peers.clone()
    }

    /// Tells the store the other streams' checkpoints (what a shared store would
    /// hold beside this stream's).
    pub fn set_peers(&self, peers: Vec<Checkpoint>) {
        self.lock().peers = peers;
    }

    pub async fn save(&self, position: &Position) -> Result<(), CheckpointError> {
        #[cfg(any(test, feature = "testing"))]
        self.injected_fault().await?;
        let mut inner = self.lock();
        inner.position = Some(position.clone());
        inner.writes += 1;
        Ok(())
    }
}

/// Faults, for tests (the `testing` feature).
#[cfg(any(test, feature = "testing"))]
impl MemoryStore {
    /// Makes the next `writes` writes fail as a store fault that can pass would.
    pub fn fail_next(&self, writes: usize) {
        self.lock().faults.fail_next = writes;
    }

    /// Makes every write take `delay` first, as a hung store's would.
    pub fn delay_writes(&self, delay: std::time::Duration) {
        self.lock().faults.delay = Some(delay);
    }

    /// What a test injected: the delay, then a failure.
    async fn injected_fault(&self) -> Result<(), CheckpointError> {
        let delay = self.lock().faults.delay;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let mut inner = self.lock();
        if inner.faults.fail_next > 0 {
            inner.faults.fail_next -= 1;
            return Err(CheckpointError::Transient {
                cause: None,
                location: "memory".into(),
                reason: "injected fault".into(),
            });
        }
        Ok(())
    }
}

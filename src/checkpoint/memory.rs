//! An in-memory checkpoint store: for embedding the pipeline in a program that keeps
//! the position itself, and for tests, which can make it fail on demand.

use std::sync::{Arc, Mutex, MutexGuard};

use super::CheckpointError;
use crate::position::Position;

#[derive(Debug, Default)]
struct Inner {
    position: Option<Position>,
    /// The next this many writes fail with a transient error.
    fail_next: usize,
    writes: usize,
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

    /// Makes the next `writes` writes fail as a store fault that can pass would.
    pub fn fail_next(&self, writes: usize) {
        self.lock().fail_next = writes;
    }

    /// Makes every write take `delay` first, as a hung store's would.
    pub fn delay_writes(&self, delay: std::time::Duration) {
        self.lock().delay = Some(delay);
    }

    /// How long each write takes first, if set.
    pub fn write_delay(&self) -> Option<std::time::Duration> {
        self.lock().delay
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

    pub fn save(&self, position: &Position) -> Result<(), CheckpointError> {
        let mut inner = self.lock();
        if inner.fail_next > 0 {
            inner.fail_next -= 1;
            return Err(CheckpointError::Transient {
                cause: None,
                location: "memory".into(),
                reason: "injected fault".into(),
            });
        }
        inner.position = Some(position.clone());
        inner.writes += 1;
        Ok(())
    }
}

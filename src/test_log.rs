//! Test support: the log lines code under test writes, captured as JSON objects.

use std::sync::{Arc, Mutex};

/// Log lines captured on this thread (every level) while it lives.
pub(crate) struct CapturedLog {
    buffer: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

#[derive(Clone)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut buffer) = self.0.lock() {
            buffer.extend_from_slice(bytes);
        }
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures what this thread logs (a current-thread runtime's tasks included) until
/// the value is dropped.
pub(crate) fn capture() -> CapturedLog {
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let writer = Shared(Arc::clone(&buffer));
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    CapturedLog {
        buffer,
        _guard: tracing::subscriber::set_default(subscriber),
    }
}

impl CapturedLog {
    /// Every line so far.
    pub(crate) fn lines(&self) -> Vec<serde_json::Value> {
        let text = self
            .buffer
            .lock()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The lines whose message is `message`.
    pub(crate) fn with_message(&self, message: &str) -> Vec<serde_json::Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["message"] == message)
            .collect()
    }
}

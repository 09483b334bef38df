//! Whether Event Hubs stored what it acknowledged.
//!
//! The client library settles a send with the AMQP outcomes `Released` and
//! `Modified` as a success (with a warning), though neither means the service stored
//! the events. Its public API does not say which outcome came, so the sink reads the
//! warning: each send runs in a span carrying an attempt number, and [`OutcomeLayer`]
//! — which the binary installs in its tracing subscriber — notes an attempt whose
//! span saw that warning. The sink then sends the batch again. Without the layer
//! installed, such outcomes count as delivered (the sink logs that once).
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber, span};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The name of the span each send runs in.
pub const SPAN_NAME: &str = "mssql_ces_amqp_send";

static NEXT_ATTEMPT: AtomicU64 = AtomicU64::new(1);
static NOT_ACCEPTED: Mutex<Vec<u64>> = Mutex::new(Vec::new());
static INSTALLED: AtomicBool = AtomicBool::new(false);

struct Attempt(u64);

struct AttemptField(Option<u64>);

impl Visit for AttemptField {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "attempt" {
            self.0 = Some(value);
        }
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

struct MessageField(String);

impl Visit for MessageField {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.push_str(&format!("{value:?}"));
        }
    }
}

/// The layer that notes sends Event Hubs did not durably accept.
pub struct OutcomeLayer;

impl OutcomeLayer {
    pub fn new() -> Self {
        INSTALLED.store(true, Ordering::Relaxed);
        OutcomeLayer
    }

    /// Whether `metadata` can matter to this layer (for a per-layer filter).
    pub fn wants(metadata: &tracing::Metadata<'_>) -> bool {
        metadata.name() == SPAN_NAME
            || (metadata.target().starts_with("azure_messaging_eventhubs")
                && *metadata.level() <= tracing::Level::WARN)
    }
}

impl Default for OutcomeLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for OutcomeLayer {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != SPAN_NAME {
            return;
        }
        let mut field = AttemptField(None);
        attrs.record(&mut field);
        if let (Some(attempt), Some(span)) = (field.0, ctx.span(id)) {
            span.extensions_mut().insert(Attempt(attempt));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if !event
            .metadata()
            .target()
            .starts_with("azure_messaging_eventhubs")
        {
            return;
        }
        let mut message = MessageField(String::new());
        event.record(&mut message);
        if !message.0.contains("not durably accepted") {
            return;
        }
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope {
            if let Some(attempt) = span.extensions().get::<Attempt>() {
                if let Ok(mut list) = NOT_ACCEPTED.lock() {
                    list.push(attempt.0);
                }
                return;
            }
        }
    }
}

/// A new attempt number for a send's span.
pub fn new_attempt() -> u64 {
    NEXT_ATTEMPT.fetch_add(1, Ordering::Relaxed)
}

/// Whether the send of `attempt` was released or modified instead of accepted.
pub fn take_not_accepted(attempt: u64) -> bool {
    let Ok(mut list) = NOT_ACCEPTED.lock() else {
        return false;
    };
    match list.iter().position(|a| *a == attempt) {
        Some(at) => {
            list.swap_remove(at);
            true
        }
        None => false,
    }
}

/// Whether an [`OutcomeLayer`] was made (so outcomes are being read).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

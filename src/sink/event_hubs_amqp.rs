//! Azure Event Hubs over AMQP (`azure_messaging_eventhubs`).
//!
//! Messages of a pipeline batch are buffered, grouped by partition key (in order of
//! first appearance, each group in send order), packed into `EventDataBatch`es filled
//! up to the link's size limit, and sent at the end of the pipeline batch; each
//! message's delivery resolves when its AMQP batch is accepted. The partition key is
//! the scheme's key; with no key, a key derived from the event's `logicalid`, so its
//! segments share a partition. The body is the structured CloudEvent (or, in binary
//! mode, `data`), `content-type` is set, and binary mode's attributes travel as
//! `cloudEvents:`-prefixed application properties (the CloudEvents AMQP binding).

use azure_messaging_eventhubs::models::EventData;
use azure_messaging_eventhubs::{EventDataBatch, EventDataBatchOptions, ProducerClient};
use tokio::sync::oneshot;

use super::{Delivery, OutgoingMessage, SinkError};

/// How the producer authenticates.
#[derive(Clone)]
pub enum EventHubsCredential {
    /// A SAS connection string (`Endpoint=sb://…;SharedAccessKeyName=…;…`).
    ConnectionString(String),
    /// Microsoft Entra ID, for `namespace` (`<name>.servicebus.windows.net`).
    Entra {
        namespace: String,
        credential: std::sync::Arc<dyn azure_core::credentials::TokenCredential>,
    },
}

/// Largest batch we fill: below the 1 MiB link limit of Event Hubs' Standard tier,
/// leaving room for the batch envelope and per-message overhead that the client's size
/// estimate does not count exactly (a batch filled to the very limit was seen to stall
/// when messages carry application properties).
pub const BATCH_CAP_BYTES: u64 = 900 * 1024;

/// What it takes to open (and reopen) the producer.
#[derive(Clone)]
struct Target {
    credential: EventHubsCredential,
    event_hub: String,
    custom_endpoint: Option<String>,
}

/// What became of a chunk.
enum Sent {
    /// Stored: this many messages.
    Accepted(usize),
    /// Released or modified by the service: not stored.
    NotAccepted,
}

pub struct EventHubsAmqpSink {
    producer: ProducerClient,
    target: Target,
    /// A group not acknowledged within this time is resent on a new connection
    /// (`sink.amqp_resend_after_ms`): the client was seen to stall after an
    /// acknowledged send, and at-least-once makes the duplicate harmless.
    resend_after: std::time::Duration,
    /// A group still not acknowledged after this fails the run
    /// (`sink.delivery_timeout_ms`).
    send_timeout: std::time::Duration,
    pending: Vec<(OutgoingMessage, oneshot::Sender<Result<(), SinkError>>)>,
}

fn delivery_error(e: impl std::fmt::Display) -> SinkError {
    SinkError::Delivery(e.to_string())
}

/// The AMQP application-property name of a Kafka-binding header (`ce_id` →
/// `cloudEvents:id`); `None` for `content-type`, which is a message property.
fn property_name(header: &str) -> Option<String> {
    header
        .strip_prefix("ce_")
        .map(|attribute| format!("cloudEvents:{attribute}"))
}

impl EventHubsAmqpSink {
    /// Opens the producer. `custom_endpoint` (e.g. `amqp://127.0.0.1:5672`) sends the
    /// connection elsewhere than the namespace (a proxy, or a local test peer).
    pub async fn connect(
        credential: EventHubsCredential,
        event_hub: &str,
        custom_endpoint: Option<String>,
        resend_after: std::time::Duration,
        send_timeout: std::time::Duration,
    ) -> Result<Self, SinkError> {
        let target = Target {
            credential,
            event_hub: event_hub.to_owned(),
            custom_endpoint,
        };
        let producer = Self::open(&target, send_timeout).await?;
        if !outcome::installed() {
            tracing::warn!(
                "the tracing layer that reads Event Hubs' send outcomes is not installed: a Released or Modified outcome counts as delivered"
            );
        }
        Ok(EventHubsAmqpSink {
            producer,
            target,
            resend_after,
            send_timeout,
            pending: Vec::new(),
        })
    }

    /// Opens a producer, giving up after `timeout`.
    async fn open(
        target: &Target,
        timeout: std::time::Duration,
    ) -> Result<ProducerClient, SinkError> {
        tokio::time::timeout(timeout, Self::open_unbounded(target))
            .await
            .unwrap_or_else(|_| {
                Err(SinkError::Delivery(format!(
                    "opening the Event Hubs producer took longer than sink.delivery_timeout_ms ({} ms)",
                    timeout.as_millis()
                )))
            })
    }

    async fn open_unbounded(target: &Target) -> Result<ProducerClient, SinkError> {
        let mut builder = ProducerClient::builder().with_application_id("mssql-ces".into());
        if let Some(endpoint) = &target.custom_endpoint {
            builder = builder.with_custom_endpoint(endpoint.clone());
        }
        match &target.credential {
            // The client's errors do not quote the connection string.
            EventHubsCredential::ConnectionString(cs) => {
                builder
                    .open_with_connection_string(cs, Some(&target.event_hub))
                    .await
            }
            EventHubsCredential::Entra {
                namespace,
                credential,
            } => {
                builder
                    .open(namespace, &target.event_hub, credential.clone())
                    .await
            }
        }
        .map_err(|e| SinkError::Delivery(format!("cannot open the Event Hubs producer: {e}")))
    }

    /// Buffers a message until [`end_batch`](Self::end_batch).
    pub fn send(&mut self, message: OutgoingMessage) -> Delivery {
        let (tx, rx) = oneshot::channel();
        self.pending.push((message, tx));
        Delivery::Pending(rx)
    }

    /// Closes the AMQP connection.
    pub async fn close(self) -> Result<(), SinkError> {
        self.producer.close().await.map_err(delivery_error)
    }

    fn partition_key(message: &OutgoingMessage) -> String {
        match (&message.key, message.partition_hint) {
            (Some(key), _) => String::from_utf8_lossy(key).into_owned(),
            (None, Some(hint)) => format!("{hint:016x}"),
            (None, None) => String::new(),
        }
    }

    fn event_data(message: &OutgoingMessage) -> EventData {
        let mut builder = EventData::builder().with_body(message.payload.clone());
        for (name, value) in &message.headers {
            let text = String::from_utf8_lossy(value).into_owned();
            match property_name(name) {
                Some(property) => builder = builder.add_property(property, text.as_str()),
                None if name == "content-type" => builder = builder.with_content_type(text),
                None => {}
            }
        }
        builder.build()
    }

    /// Sends everything buffered, grouped by partition key, and settles each
    /// message's delivery with its own batch's outcome.
    pub async fn end_batch(&mut self) -> Result<(), SinkError> {
        let pending = std::mem::take(&mut self.pending);
        let mut groups: Vec<(String, Vec<(OutgoingMessage, oneshot::Sender<_>)>)> = Vec::new();
        for (message, tx) in pending {
            let key = Self::partition_key(&message);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, list)) => list.push((message, tx)),
                None => groups.push((key, vec![(message, tx)])),
            }
        }
        for (key, list) in groups {
            let (messages, senders): (Vec<OutgoingMessage>, Vec<oneshot::Sender<_>>) =
                list.into_iter().unzip();
            let messages: Vec<&OutgoingMessage> = messages.iter().collect();
            let mut senders = senders.into_iter();
            let mut start = 0;
            while start < messages.len() {
                match self.send_chunk_with_resend(&key, &messages[start..]).await {
                    Ok(count) => {
                        // A dropped receiver means the pipeline stopped listening.
                        for tx in senders.by_ref().take(count) {
                            let _ = tx.send(Ok(()));
                        }
                        start += count.max(1);
                    }
                    Err(e) => {
                        for tx in senders {
                            let _ = tx.send(Err(e.clone()));
                        }
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends the next chunk of a key's messages (as many as fit one batch, or one
    /// message alone); if it is not acknowledged within `resend_after`, sends that
    /// chunk again on a new connection, until `send_timeout` has passed for it. Each
    /// chunk has its own timer: a slow but moving key is never resent from its start.
    /// Returns how many messages the chunk held.
    async fn send_chunk_with_resend(
        &mut self,
        key: &str,
        messages: &[&OutgoingMessage],
    ) -> Result<usize, SinkError> {
        let deadline = tokio::time::Instant::now() + self.send_timeout;
        loop {
            let attempt = self
                .resend_after
                .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            match tokio::time::timeout(attempt, self.send_chunk(key, messages)).await {
                Ok(Ok(Sent::Accepted(count))) => return Ok(count),
                Ok(Ok(Sent::NotAccepted)) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(
                        "Event Hubs released the batch without storing it; sending it again"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Ok(Ok(Sent::NotAccepted)) => {
                    return Err(SinkError::Delivery(format!(
                        "Event Hubs did not store a batch (released or modified) within sink.delivery_timeout_ms ({} ms)",
                        self.send_timeout.as_millis()
                    )));
                }
                Ok(Err(e)) => return Err(e),
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(
                        resend_after_ms = self.resend_after.as_millis() as u64,
                        "Event Hubs did not acknowledge a batch in time; resending it on a new connection"
                    );
                    self.reopen_until(deadline).await?;
                }
                Err(_) => {
                    return Err(SinkError::Delivery(format!(
                        "Event Hubs did not acknowledge a batch within sink.delivery_timeout_ms ({} ms)",
                        self.send_timeout.as_millis()
                    )));
                }
            }
        }
    }

    /// Opens a new connection, retrying with backoff until `deadline`.
    async fn reopen_until(&mut self, deadline: tokio::time::Instant) -> Result<(), SinkError> {
        let mut wait = std::time::Duration::from_millis(100);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match Self::open(&self.target, left).await {
                Ok(fresh) => {
                    let stale = std::mem::replace(&mut self.producer, fresh);
                    // The old one is closed in the background: its close may stall as
                    // its send did.
                    tokio::spawn(async move {
                        let _ =
                            tokio::time::timeout(std::time::Duration::from_secs(5), stale.close())
                                .await;
                    });
                    return Ok(());
                }
                Err(e) if tokio::time::Instant::now() + wait < deadline => {
                    tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "reopening the Event Hubs connection failed; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(std::time::Duration::from_secs(10));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A new batch for `key`, capped at [`BATCH_CAP_BYTES`] (or the link's limit
    /// where that is lower).
    async fn new_batch(&self, key: &str) -> Result<EventDataBatch<'_>, SinkError> {
        let options = |cap| EventDataBatchOptions {
            partition_key: (!key.is_empty()).then(|| key.to_owned()),
            max_size_in_bytes: cap,
            ..Default::default()
        };
        match self
            .producer
            .create_batch(Some(options(Some(BATCH_CAP_BYTES))))
            .await
        {
            Ok(batch) => Ok(batch),
            // The link allows less than the cap: use the link's own limit.
            Err(_) => self
                .producer
                .create_batch(Some(options(None)))
                .await
                .map_err(delivery_error),
        }
    }

    /// Sends one batch of the first messages that fit it, or the first message
    /// alone when it fits no batch; says how many were stored, or that the service
    /// released them (see [`outcome`]).
    async fn send_chunk(
        &self,
        key: &str,
        messages: &[&OutgoingMessage],
    ) -> Result<Sent, SinkError> {
        use tracing::Instrument as _;
        let attempt = outcome::new_attempt();
        let span = tracing::warn_span!(target: "mssql_ces::amqp", "mssql_ces_amqp_send", attempt);
        // Boxed: the instrumented future would otherwise deepen every caller's type.
        let count = Box::pin(self.send_chunk_once(key, messages))
            .instrument(span)
            .await?;
        if outcome::take_not_accepted(attempt) {
            return Ok(Sent::NotAccepted);
        }
        Ok(Sent::Accepted(count))
    }

    async fn send_chunk_once(
        &self,
        key: &str,
        messages: &[&OutgoingMessage],
    ) -> Result<usize, SinkError> {
        let batch = self.new_batch(key).await?;
        let mut count = 0;
        for message in messages {
            if !batch
                .try_add_event_data(Self::event_data(message), None)
                .map_err(delivery_error)?
            {
                break;
            }
            count += 1;
        }
        if count == 0 {
            // Too large for any batch: the client counts a batch's first message
            // twice toward its size, so nothing above about half the limit fits.
            // Sent alone, in its place in the key's order, it is held only to the
            // link's own limit. (An empty batch is never sent: the client panics.)
            let Some(first) = messages.first() else {
                return Ok(0);
            };
            self.send_alone(key, Self::event_data(first), first.payload.len())
                .await?;
            return Ok(1);
        }
        self.producer
            .send_batch(batch, None)
            .await
            .map_err(delivery_error)?;
        Ok(count)
    }

    /// Sends one message outside a batch, with the partition key as the service reads
    /// it (`x-opt-partition-key`), so it lands where the key's batches do.
    async fn send_alone(&self, key: &str, event: EventData, size: usize) -> Result<(), SinkError> {
        let mut message = azure_core_amqp::AmqpMessage::from(event);
        message.set_message_id(azure_core::Uuid::new_v4());
        if !key.is_empty() {
            message.add_message_annotation(
                azure_core_amqp::AmqpSymbol::from("x-opt-partition-key"),
                key.to_owned(),
            );
        }
        self.producer
            .send_message(message, None)
            .await
            .map_err(|e| {
                SinkError::Delivery(format!(
                    "a {size}-byte message could not be sent on its own ({e}); if the event hub's tier allows less, lower event.max_message_size_kb"
                ))
            })
    }
}

/// Whether Event Hubs stored what it acknowledged.
///
/// The client library settles a send with the AMQP outcomes `Released` and
/// `Modified` as a success (with a warning), though neither means the service stored
/// the events. Its public API does not say which outcome came, so the sink reads the
/// warning: each send runs in a span carrying an attempt number, and [`OutcomeLayer`]
/// — which the binary installs in its tracing subscriber — notes an attempt whose
/// span saw that warning. The sink then sends the batch again. Without the layer
/// installed, such outcomes count as delivered (the sink logs that once).
pub mod outcome {
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
}

//! Azure Event Hubs over AMQP (`azure_messaging_eventhubs`).
//!
//! Messages of a pipeline batch are buffered and sent at the end of the pipeline
//! batch; each message's delivery resolves when its AMQP batch is accepted. The
//! partition key is the scheme's key; with no key, a key derived from the event's
//! `logicalid`, so its segments share a partition. The body is the structured
//! CloudEvent (or, in binary mode, `data`), `content-type` is set, and binary mode's
//! attributes travel as `cloudEvents:`-prefixed application properties (the
//! CloudEvents AMQP binding).
//!
//! At connect the sink reads the hub's partition ids and places each key on the
//! partition the service would ([`partitions`]), the key kept on the message
//! (`x-opt-partition-key`), as the client library's buffered producer does. A batch
//! then holds many keys of one partition, and the partitions are sent side by side
//! (at most [`PARTITIONS_IN_FLIGHT`] at once), each in order, so each key's order
//! holds. Where the partitions cannot be read, the sink falls back to the gateway:
//! one key per batch, one key at a time.

use std::sync::Arc;
use std::time::Duration;

use azure_messaging_eventhubs::ProducerClient;
use azure_messaging_eventhubs::models::{AmqpMessage, EventData};
use futures_util::StreamExt as _;
use tokio::sync::{RwLock, oneshot};

use super::{Delivery, OutgoingMessage, SinkError, SinkHealth};

pub mod config;
mod errors;
mod link;
pub mod partitions;

use errors::{delivery_error, is_definite, plain};
use link::{Batch, Links, Outcome};
use partitions::{PartitionMap, fixed_length_key};

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

/// The largest event a Debezium record may make: Event Hubs' 1 MiB event limit
/// (Standard and Premium tiers), less 1 KiB for the message's properties.
pub const LARGEST_EVENT_BYTES: usize = 1024 * 1024 - 1024;

/// How many partitions are sent to at once. Each has at most one batch in flight, so
/// per-key order holds; more partitions than this wait their turn.
pub const PARTITIONS_IN_FLIGHT: usize = 8;

/// How long reading the hub's partition ids at connect may take before the sink
/// falls back to sending through the gateway.
const PARTITION_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the hub's partitions are read again.
const PARTITION_REFRESH: Duration = Duration::from_secs(300);

/// How long closing the connection may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Waits between attempts to open an unreachable producer: doubling from the first
/// to the most.
const OPEN_RETRY_FIRST: Duration = Duration::from_millis(500);
const OPEN_RETRY_MOST: Duration = Duration::from_secs(10);

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
    /// Released or modified by the service (which of the two): not stored.
    NotAccepted(&'static str),
}

/// Where a run of messages is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Destination {
    /// A partition, each message carrying its own key.
    Partition(String),
    /// The gateway, which places the key (one key per batch).
    Key(String),
}

/// What the sink holds open to Event Hubs: the client library's producer, which
/// reads the hub's partitions, and the sink's own links, which send and read each
/// send's outcome ([`link`]).
struct Opened {
    producer: ProducerClient,
    links: Links,
}

/// The connection in use, and which one it is (a resend reopens it once, however
/// many partitions saw the stall).
struct Connection {
    producer: Arc<ProducerClient>,
    links: Arc<Links>,
    generation: u64,
}

type Waiting = (OutgoingMessage, oneshot::Sender<Result<(), SinkError>>);

pub struct EventHubsAmqpSink {
    connection: RwLock<Connection>,
    target: Target,
    /// The hub's partitions; `None` when they could not be read (gateway sends).
    partitions: Option<PartitionMap>,
    /// When the partitions were last read, and how often they are read again (a
    /// Premium or Dedicated hub may gain partitions).
    partitions_read_at: tokio::time::Instant,
    partition_refresh: Duration,
    /// A batch not acknowledged within this time is resent on a new connection
    /// (`sink.amqp_resend_after_ms`): the client was seen to stall after an
    /// acknowledged send, and at-least-once makes the duplicate harmless.
    resend_after: Duration,
    /// A batch still not acknowledged after this fails the run
    /// (`sink.delivery_timeout_ms`).
    send_timeout: Duration,
    pending: Vec<Waiting>,
    /// Connected, and re-sends, for the metrics and the readiness probe.
    health: Arc<SinkHealth>,
}

/// The AMQP application-property name of a Kafka-binding header (`ce_id` →
/// `cloudEvents:id`); `None` for `content-type`, which is a message property.
fn property_name(header: &str) -> Option<String> {
    header
        .strip_prefix("ce_")
        .map(|attribute| format!("cloudEvents:{attribute}"))
}

impl EventHubsAmqpSink {
    /// Opens the producer and reads the hub's partitions. `custom_endpoint` (e.g.
    /// `amqp://127.0.0.1:5672`) sends the connection elsewhere than the namespace (a
    /// proxy, or a local test peer).
    pub async fn connect(
        credential: EventHubsCredential,
        event_hub: &str,
        custom_endpoint: Option<String>,
        resend_after: Duration,
        send_timeout: Duration,
    ) -> Result<Self, SinkError> {
        let target = Target {
            credential,
            event_hub: event_hub.to_owned(),
            custom_endpoint,
        };
        let Opened { producer, links } = Self::open(&target, send_timeout).await?;
        let partitions = Self::read_partitions(&producer, event_hub).await;
        Ok(EventHubsAmqpSink {
            connection: RwLock::new(Connection {
                producer: Arc::new(producer),
                links: Arc::new(links),
                generation: 0,
            }),
            target,
            partitions,
            partitions_read_at: tokio::time::Instant::now(),
            partition_refresh: PARTITION_REFRESH,
            resend_after,
            send_timeout,
            pending: Vec::new(),
            health: Arc::default(),
        })
    }

    /// Reports the connection and re-sends to `health` from now on.
    pub fn with_health(mut self, health: Arc<SinkHealth>) -> Self {
        health.set_connected(true);
        self.health = health;
        self
    }

    /// A send failed or stalled and is tried again: not connected until one succeeds.
    fn count_resend(&self) {
        self.health.set_connected(false);
        self.health.add_retries(1);
    }

    /// The hub's partition ids, or `None` (logged) when they cannot be read: then
    /// each key goes through the gateway, which is correct but slower.
    async fn read_partitions(producer: &ProducerClient, event_hub: &str) -> Option<PartitionMap> {
        let read = tokio::time::timeout(PARTITION_READ_TIMEOUT, producer.get_eventhub_properties());
        match read.await {
            Ok(Ok(properties)) => {
                let map = PartitionMap::new(properties.partition_ids);
                match &map {
                    Some(map) => tracing::info!(
                        event_hub,
                        partitions = map.len(),
                        "sending to the event hub's partitions directly, each key where the service places it"
                    ),
                    None => tracing::warn!(
                        event_hub,
                        "the event hub reported no partitions; sending each partition key through the gateway"
                    ),
                }
                map
            }
            Ok(Err(e)) => {
                tracing::warn!(event_hub, error = %crate::error::Chain(&e), "cannot read the event hub's partitions; sending each partition key through the gateway, one key at a time (slower)");
                None
            }
            Err(_) => {
                tracing::warn!(
                    event_hub,
                    "reading the event hub's partitions timed out; sending each partition key through the gateway, one key at a time (slower)"
                );
                None
            }
        }
    }

    /// Reads the hub's partitions again every `every` instead of
    /// [`PARTITION_REFRESH`] (for tests).
    pub fn with_partition_refresh(mut self, every: Duration) -> Self {
        self.partition_refresh = every;
        self
    }

    /// Reads the partitions again when they are due: a hub that gained partitions
    /// gets keys placed on them as the service places them, said in the log (a key
    /// may move; its order across the move is not kept). A failed read keeps the map.
    async fn refresh_partitions(&mut self) {
        if self.partitions.is_none() || self.partitions_read_at.elapsed() < self.partition_refresh {
            return;
        }
        self.partitions_read_at = tokio::time::Instant::now();
        let (producer, generation) = {
            let connection = self.connection.read().await;
            (Arc::clone(&connection.producer), connection.generation)
        };
        // A read is a request and its reply on the connection's management link, and
        // is bounded as a send is: a reply that does not come within
        // `amqp_resend_after_ms` is a stalled link, and the connection is replaced
        // (the client matches a late reply to the next request, not to its own).
        let bound = self.resend_after.min(self.send_timeout);
        let properties = match tokio::time::timeout(bound, producer.get_eventhub_properties()).await
        {
            Ok(Ok(properties)) => properties,
            Ok(Err(e)) => {
                tracing::warn!(event_hub = %self.target.event_hub, error = %crate::error::Chain(&e), "reading the event hub's partitions again failed; keeping the partitions read before");
                return;
            }
            Err(_) => {
                tracing::warn!(
                    event_hub = %self.target.event_hub,
                    waited_ms = bound.as_millis() as u64,
                    "reading the event hub's partitions again got no answer; keeping the partitions read before and opening a new connection"
                );
                self.count_resend();
                let deadline = tokio::time::Instant::now() + self.send_timeout;
                if let Err(e) = self.reopen_until(generation, deadline).await {
                    tracing::warn!(event_hub = %self.target.event_hub, error = %crate::error::Chain(&e), "opening a new Event Hubs connection failed; the next send tries again");
                }
                return;
            }
        };
        let Some(map) = PartitionMap::new(properties.partition_ids) else {
            return;
        };
        if self.partitions.as_ref() != Some(&map) {
            tracing::warn!(
                event_hub = %self.target.event_hub,
                before = self.partitions.as_ref().map_or(0, PartitionMap::len),
                after = map.len(),
                "the event hub's partitions changed: keys go where the service now places them (a key may move to another partition; its order across the move is not kept)"
            );
            self.partitions = Some(map);
        }
    }

    /// How many partitions messages are spread over: `None` when sending through
    /// the gateway.
    pub fn partition_count(&self) -> Option<usize> {
        self.partitions.as_ref().map(PartitionMap::len)
    }

    /// Opens a producer, giving up after `timeout`.
    /// Opens the producer, retrying what can pass (a refused connection, a name not
    /// resolving yet) with backoff until `timeout` (`sink.delivery_timeout_ms`), as
    /// the Kafka sinks wait out an unreachable broker; what cannot pass (not
    /// authorized, no such hub) fails at once.
    async fn open(target: &Target, timeout: Duration) -> Result<Opened, SinkError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut backoff = crate::backoff::Backoff::new(OPEN_RETRY_FIRST, OPEN_RETRY_MOST);
        let mut last: Option<SinkError> = None;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // On a task of its own: the client was seen to hold its thread while it
            // retries a refused connection, which would hold this time-out too.
            let attempt = {
                let target = target.clone();
                tokio::spawn(async move { Self::open_unbounded(&target).await })
            };
            let abort = attempt.abort_handle();
            let joined = tokio::time::timeout(left, attempt).await;
            if joined.is_err() {
                abort.abort();
            }
            let opened = joined.map(|j| {
                j.unwrap_or_else(|e| {
                    Err(SinkError::transient(format!(
                        "opening the Event Hubs producer: {e}"
                    )))
                })
            });
            let error = match opened {
                Ok(Ok(opened)) => {
                    if last.is_some() {
                        tracing::info!(event_hub = %target.event_hub, "Event Hubs reachable again");
                    }
                    return Ok(opened);
                }
                Ok(Err(e)) if !e.is_transient() => return Err(e),
                Ok(Err(e)) => e,
                Err(_) => {
                    return Err(SinkError::transient(format!(
                        "the Event Hubs producer could not be opened within {} ms (what was left of sink.delivery_timeout_ms){}",
                        timeout.as_millis(),
                        last.map_or_else(String::new, |e| format!(
                            "; the last attempt: {}",
                            e.reason()
                        ))
                    )));
                }
            };
            let wait = backoff.next_wait();
            if last.is_none() {
                tracing::warn!(
                    event_hub = %target.event_hub,
                    error = %error.reason(),
                    "Event Hubs unreachable: trying again until sink.delivery_timeout_ms"
                );
            }
            last = Some(error);
            if tokio::time::Instant::now() + wait >= deadline {
                tokio::time::sleep_until(deadline).await;
            } else {
                tokio::time::sleep(wait).await;
            }
        }
    }

    async fn open_unbounded(target: &Target) -> Result<Opened, SinkError> {
        let producer = Self::open_producer(target).await?;
        let links = Links::open(target).await?;
        Ok(Opened { producer, links })
    }

    async fn open_producer(target: &Target) -> Result<ProducerClient, SinkError> {
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
        .map_err(|e| match is_definite(&e) {
            true => SinkError::definite(format!(
                "cannot open the Event Hubs producer: {}",
                plain(&e)
            )),
            false => SinkError::transient(format!(
                "cannot open the Event Hubs producer: {}",
                plain(&e)
            )),
        })
    }

    /// Buffers a message until [`end_batch`](Self::end_batch).
    pub fn send(&mut self, message: OutgoingMessage) -> Delivery {
        let (tx, rx) = oneshot::channel();
        self.pending.push((message, tx));
        Delivery::Pending(rx)
    }

    /// Closes the AMQP connection, waiting at most [`CLOSE_TIMEOUT`] (the client's
    /// close was seen to hang; everything sent is settled by then).
    pub async fn close(self) -> Result<(), SinkError> {
        let Connection {
            producer, links, ..
        } = self.connection.into_inner();
        let close = async {
            links.close().await?;
            match Arc::try_unwrap(producer) {
                Ok(producer) => producer.close().await.map_err(delivery_error),
                // Still shared: nothing is sending any more, dropping it closes it.
                Err(_) => Ok(()),
            }
        };
        match tokio::time::timeout(CLOSE_TIMEOUT, close).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    timeout_ms = CLOSE_TIMEOUT.as_millis() as u64,
                    "closing the Event Hubs connection did not finish in time; dropping it"
                );
                Ok(())
            }
        }
    }

    fn partition_key(message: &OutgoingMessage) -> String {
        let key = match (&message.key, message.partition_hint) {
            // An empty key would be no key to the gateway (a random partition): the
            // hint the router gave it instead.
            (Some(key), _) if !key.is_empty() => String::from_utf8_lossy(key).into_owned(),
            (_, Some(hint)) => format!("{hint:016x}"),
            (_, None) => String::new(),
        };
        fixed_length_key(key)
    }

    /// The AMQP message for `message`; with `key`, the key is written on the message
    /// itself (`x-opt-partition-key`), as a gateway send would have it.
    fn amqp_message(message: &OutgoingMessage, key: Option<&str>) -> AmqpMessage {
        let mut builder = EventData::builder().with_body(message.payload.clone());
        // AMQP tooling deduplicates by message-id: the CloudEvent's (segment's) id.
        if let Some(id) = message.message_id {
            builder = builder.with_message_id(id.to_string());
        }
        for (name, value) in &message.headers {
            let text = String::from_utf8_lossy(value).into_owned();
            match property_name(name) {
                Some(property) => builder = builder.add_property(property, text.as_str()),
                None if *name == "content-type" => builder = builder.with_content_type(text),
                None => {}
            }
        }
        let mut amqp = AmqpMessage::from(builder.build());
        if message.message_id.is_none() {
            // The client wants one: a message built elsewhere gets a random one.
            amqp.set_message_id(azure_core::Uuid::new_v4());
        }
        if let Some(key) = key.filter(|k| !k.is_empty()) {
            amqp.add_message_annotation(
                azure_core_amqp::AmqpSymbol::from("x-opt-partition-key"),
                key.to_owned(),
            );
        }
        amqp
    }

    /// Splits what is buffered by destination, each in send order; destinations in
    /// order of first appearance.
    fn route(&self, pending: Vec<Waiting>) -> Vec<(Destination, Vec<Waiting>)> {
        let mut runs: Vec<(Destination, Vec<Waiting>)> = Vec::new();
        for waiting in pending {
            let key = Self::partition_key(&waiting.0);
            let destination = match &self.partitions {
                Some(map) => Destination::Partition(map.partition_for(&key).to_owned()),
                None => Destination::Key(key),
            };
            match runs.iter_mut().find(|(d, _)| *d == destination) {
                Some((_, list)) => list.push(waiting),
                None => runs.push((destination, vec![waiting])),
            }
        }
        runs
    }

    /// Sends everything buffered and settles each message's delivery with its own
    /// batch's outcome. Partitions go side by side; through the gateway, one key at
    /// a time.
    pub async fn end_batch(&mut self) -> Result<(), SinkError> {
        self.refresh_partitions().await;
        let pending = std::mem::take(&mut self.pending);
        let runs = self.route(pending);
        let in_flight = if self.partitions.is_some() {
            PARTITIONS_IN_FLIGHT
        } else {
            1
        };
        let this = &*self;
        let mut sends = futures_util::stream::iter(runs)
            .map(|(destination, run)| this.send_run(destination, run))
            .buffer_unordered(in_flight);
        while let Some(result) = sends.next().await {
            // The first failure ends the batch; runs not yet settled see their
            // senders dropped, which fails their deliveries.
            result?;
        }
        Ok(())
    }

    /// Sends one destination's messages in order, a batch at a time.
    async fn send_run(&self, destination: Destination, run: Vec<Waiting>) -> Result<(), SinkError> {
        let (messages, senders): (Vec<OutgoingMessage>, Vec<oneshot::Sender<_>>) =
            run.into_iter().unzip();
        let mut senders = senders.into_iter();
        let mut start = 0;
        while start < messages.len() {
            match self
                .send_chunk_with_resend(&destination, &messages[start..])
                .await
            {
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
        Ok(())
    }

    /// Sends the next chunk of a destination's messages (as many as fit one batch,
    /// or one message alone); if it is not acknowledged within `resend_after`, sends
    /// that chunk again on a new connection, until `send_timeout` has passed for it.
    /// Each chunk has its own timer: a slow but moving run is never resent from its
    /// start. Returns how many messages the chunk held.
    async fn send_chunk_with_resend(
        &self,
        destination: &Destination,
        messages: &[OutgoingMessage],
    ) -> Result<usize, SinkError> {
        let deadline = tokio::time::Instant::now() + self.send_timeout;
        // Whether the service settled an attempt without storing it: what the run
        // says if the deadline passes.
        let mut not_stored = false;
        let out_of_time_reason = |not_stored: bool| {
            if not_stored {
                format!(
                    "Event Hubs did not store a batch (released or modified) within sink.delivery_timeout_ms ({} ms)",
                    self.send_timeout.as_millis()
                )
            } else {
                format!(
                    "Event Hubs did not acknowledge a batch within sink.delivery_timeout_ms ({} ms)",
                    self.send_timeout.as_millis()
                )
            }
        };
        let out_of_time = |not_stored: bool| SinkError::transient(out_of_time_reason(not_stored));
        // A new connection that could not be had before the deadline: the batch ran
        // out of time, for the reason it was being sent again (the last step behind it).
        let reopen_failed = |not_stored: bool, e: SinkError| {
            if tokio::time::Instant::now() >= deadline {
                SinkError::transient_because(out_of_time_reason(not_stored), e)
            } else {
                e
            }
        };
        loop {
            let (links, generation) = {
                let connection = self.connection.read().await;
                (Arc::clone(&connection.links), connection.generation)
            };
            let attempt = self
                .resend_after
                .min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            let send = Self::send_chunk(&links, destination, messages);
            match tokio::time::timeout(attempt, send).await {
                Ok(Ok(Sent::Accepted(count))) => {
                    self.health.set_connected(true);
                    return Ok(count);
                }
                Ok(Ok(Sent::NotAccepted(outcome))) if tokio::time::Instant::now() < deadline => {
                    not_stored = true;
                    self.health.add_retries(1);
                    tracing::warn!(
                        outcome,
                        "Event Hubs settled a batch without storing it (released or modified); sending it again"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(Ok(Sent::NotAccepted(_))) => return Err(out_of_time(true)),
                // Transient (a dropped connection, the service busy): again on a
                // new connection while the deadline allows.
                Ok(Err(e)) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                    tracing::warn!(error = %crate::error::Chain(&e), "sending a batch to Event Hubs failed; sending it again on a new connection");
                    self.count_resend();
                    drop(links);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    self.reopen_until(generation, deadline)
                        .await
                        .map_err(|e| reopen_failed(not_stored, e))?;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(
                        resend_after_ms = self.resend_after.as_millis() as u64,
                        "Event Hubs did not acknowledge a batch in time; resending it on a new connection"
                    );
                    self.count_resend();
                    drop(links);
                    self.reopen_until(generation, deadline)
                        .await
                        .map_err(|e| reopen_failed(not_stored, e))?;
                }
                Err(_) => return Err(out_of_time(not_stored)),
            }
        }
    }

    /// Replaces connection `stale` with a new one, retrying with backoff until
    /// `deadline`; if another run already replaced it, uses that one.
    async fn reopen_until(
        &self,
        stale: u64,
        deadline: tokio::time::Instant,
    ) -> Result<(), SinkError> {
        // A send that holds the connection may itself be stalled: waiting for it is
        // bounded by the same deadline.
        let Ok(mut connection) = tokio::time::timeout_at(deadline, self.connection.write()).await
        else {
            return Err(SinkError::transient(format!(
                "Event Hubs: the connection could not be replaced within sink.delivery_timeout_ms ({} ms): a send on it does not return",
                self.send_timeout.as_millis()
            )));
        };
        if connection.generation != stale {
            return Ok(());
        }
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
        loop {
            let wait = backoff.next_wait();
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match Self::open(&self.target, left).await {
                Ok(fresh) => {
                    let old_producer =
                        std::mem::replace(&mut connection.producer, Arc::new(fresh.producer));
                    let old_links = std::mem::replace(&mut connection.links, Arc::new(fresh.links));
                    connection.generation += 1;
                    // The old one is closed in the background once no send holds it:
                    // its close may stall as its send did.
                    tokio::spawn(close_when_free(old_producer, old_links));
                    return Ok(());
                }
                Err(e) if tokio::time::Instant::now() + wait < deadline => {
                    tracing::warn!(error = %crate::error::Chain(&e), retry_in_ms = wait.as_millis() as u64, "reopening the Event Hubs connection failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends one batch of the first messages that fit it (at most
    /// [`BATCH_CAP_BYTES`], or the link's limit where that is lower), or the first
    /// message alone, held to the link's own limit, when it is larger; says how many
    /// were stored, or that the service settled the batch without storing it.
    async fn send_chunk(
        links: &Links,
        destination: &Destination,
        messages: &[OutgoingMessage],
    ) -> Result<Sent, SinkError> {
        let address = links.address(match destination {
            Destination::Partition(id) => Some(id),
            Destination::Key(_) => None,
        });
        let link_max = links.max_message_size(&address).await?;
        // Each message carries its key; the batch carries its first message's,
        // which is what the gateway places it by.
        let amqp = |message: &OutgoingMessage| {
            Self::amqp_message(message, Some(&Self::partition_key(message)))
        };
        let mut batch = Batch::new(BATCH_CAP_BYTES.min(link_max));
        for message in messages {
            if !batch.try_add(&amqp(message))? {
                break;
            }
        }
        if batch.len() == 0 {
            let Some(first) = messages.first() else {
                return Ok(Sent::Accepted(0));
            };
            batch = Batch::new(link_max);
            if !batch.try_add(&amqp(first))? {
                return Err(SinkError::definite(format!(
                    "a {}-byte message is more than the event hub's link takes ({link_max} bytes): lower event.max_message_size_kb",
                    first.payload.len()
                )));
            }
        }
        let count = batch.len();
        let Some(message) = batch.into_message() else {
            return Ok(Sent::Accepted(0));
        };
        Ok(match links.send(&address, message).await? {
            Outcome::Accepted => Sent::Accepted(count),
            Outcome::NotAccepted(outcome) => Sent::NotAccepted(outcome),
        })
    }
}

/// Closes a replaced connection once no send holds it any more (bounded: a stalled
/// connection is dropped instead).
async fn close_when_free(producer: Arc<ProducerClient>, links: Arc<Links>) {
    let _ = tokio::time::timeout(Duration::from_secs(5), links.close()).await;
    let mut producer = producer;
    for _ in 0..50 {
        match Arc::try_unwrap(producer) {
            Ok(owned) => {
                let _ = tokio::time::timeout(Duration::from_secs(5), owned.close()).await;
                return;
            }
            Err(shared) => producer = shared,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gateway takes an empty partition key for none (a random partition): an
    /// empty key travels as the router's fixed hint instead.
    #[test]
    fn an_empty_key_goes_as_its_hint() {
        let message = |key: Option<&[u8]>, hint: Option<u64>| OutgoingMessage {
            topic: "hub".into(),
            key: key.map(<[u8]>::to_vec),
            partition_hint: hint,
            headers: Vec::new(),
            payload: Vec::new(),
            message_id: None,
            tombstone: false,
        };
        assert_eq!(
            EventHubsAmqpSink::partition_key(&message(Some(b"k"), None)),
            "k"
        );
        assert_eq!(
            EventHubsAmqpSink::partition_key(&message(Some(b""), Some(0xAB))),
            "00000000000000ab"
        );
        assert_eq!(
            EventHubsAmqpSink::partition_key(&message(None, Some(1))),
            "0000000000000001"
        );
        // Longer than the service takes: a fixed-length digest, the same each time.
        let long = "dbo.Orders\u{1f}".repeat(20);
        let key = EventHubsAmqpSink::partition_key(&message(Some(long.as_bytes()), None));
        assert_eq!(key.len(), 33, "{key}");
        assert!(key.starts_with('~'));
        assert_eq!(
            key,
            EventHubsAmqpSink::partition_key(&message(Some(long.as_bytes()), None))
        );
        let exactly = "k".repeat(128);
        assert_eq!(
            EventHubsAmqpSink::partition_key(&message(Some(exactly.as_bytes()), None)),
            exactly
        );
    }

    #[test]
    fn the_clients_layered_labels_are_dropped_from_its_errors() {
        assert_eq!(
            plain(&"AMQP Error: AMQP Error: Azure Core Error: Connection refused (os error 111)"),
            "Connection refused (os error 111)"
        );
        assert_eq!(plain(&"not authorized"), "not authorized");
    }
    use azure_core_amqp::error::{AmqpErrorCondition as C, AmqpErrorKind};
    use azure_core_amqp::{AmqpDescribedError, AmqpError};

    fn described(condition: C) -> AmqpError {
        AmqpError::from(AmqpErrorKind::AmqpDescribedError(AmqpDescribedError::new(
            condition,
            Some("from the service".into()),
            Default::default(),
        )))
    }

    #[test]
    fn the_kind_comes_from_the_clients_error_types_wherever_they_are_wrapped() {
        for condition in [
            C::UnauthorizedAccess,
            C::NotFound,
            C::LinkPayloadSizeExceeded,
        ] {
            assert!(is_definite(&described(condition.clone())), "{condition:?}");
            // As the client hands it over: inside an azure_core error.
            let wrapped = azure_core::Error::with_error(
                azure_core::error::ErrorKind::Other,
                described(condition.clone()),
                "send failed",
            );
            assert!(matches!(
                delivery_error(wrapped),
                SinkError::Definite { .. }
            ));
        }
        for condition in [C::ServerBusyError, C::TimeoutError, C::InternalError] {
            assert!(!is_definite(&described(condition.clone())), "{condition:?}");
        }
        let dropped = AmqpError::from(AmqpErrorKind::SimpleMessage("connection reset".into()));
        assert!(matches!(
            delivery_error(dropped),
            SinkError::Transient { .. }
        ));
    }
}

//! The Event Hubs AMQP scenario shared by `tests/event_hubs_amqp*.rs`: the pipeline's
//! AMQP sink against the local peer, checking body bytes, content type, partition key
//! and application properties of everything that arrives. Each scenario runs in its own
//! test process, so one producer is open at a time, as in the daemon.

use std::collections::BTreeMap;
use std::time::Duration;

use super::amqp_peer::{self, ArrivedEvent};
use mssql_ces::checkpoint::{CheckpointStore, file::FileStore};
use mssql_ces::event::{Encoder, EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit};
use mssql_ces::pipeline::{self, PipelineSettings};
use mssql_ces::sink::event_hubs_amqp::{EventHubsAmqpSink, EventHubsCredential};
use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};
use mssql_ces::sink::{OutgoingMessage, Router, Sink};
use mssql_ces::source::poller::{PollOutcome, Poller, PollerConfig};
use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};
use tokio_util::sync::CancellationToken;

pub const CONNECTION_STRING: &str = "Endpoint=sb://fake.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0;EntityPath=orders";

fn synthetic() -> SyntheticConfig {
    SyntheticConfig {
        seed: 4,
        transactions: Some(40),
        rate_per_second: None,
        large_value_every: 15,
        existing_rows: 0,
        oversized_value_every: 0,
    }
}

fn options(guid: uuid::Uuid) -> EncoderOptions {
    EncoderOptions {
        stream_guid: guid,
        encoding: Encoding::Json,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size: MessageSizeLimit::from_kb(128).expect("valid"),
    }
}

fn router(scheme: PartitionKeyScheme, mode: CloudEventsMode) -> Router {
    Router::new("orders", scheme, None, mode, Encoding::Json, "group")
}

/// The messages the pipeline should send, computed without it.
async fn expected(router: &Router) -> Vec<OutgoingMessage> {
    let mut poller = Poller::new(
        SyntheticSource::new(synthetic()),
        PollerConfig::default(),
        None,
    );
    let mut encoder = None;
    let mut out = Vec::new();
    while let PollOutcome::Batch(batch) = poller.poll().await.expect("poll") {
        let guid = poller.stream_guid().expect("stream GUID");
        let encoder =
            encoder.get_or_insert_with(|| Encoder::new(options(guid)).data_only(router.binary()));
        for change in &batch.changes {
            out.extend(
                router
                    .route(change, encoder.encode(change).expect("encode"))
                    .expect("route"),
            );
        }
    }
    out
}

/// A structured JSON message for `key` with `payload`, as the router makes them.
pub fn message(key: &str, payload: Vec<u8>) -> OutgoingMessage {
    OutgoingMessage {
        topic: "orders".into(),
        key: Some(key.as_bytes().to_vec()),
        partition_hint: None,
        headers: vec![(
            "content-type",
            b"application/cloudevents+json; charset=UTF-8".to_vec(),
        )],
        payload,
        message_id: None,
        tombstone: false,
    }
}

/// The partition key the sink must use for a message.
fn partition_key(m: &OutgoingMessage) -> String {
    match (&m.key, m.partition_hint) {
        (Some(k), _) => String::from_utf8_lossy(k).into_owned(),
        (None, Some(h)) => format!("{h:016x}"),
        (None, None) => String::new(),
    }
}

/// A local AMQP peer and the pipeline's AMQP sink connected to it, resending a batch
/// not acknowledged within `resend_after`.
pub async fn peer_and_sink(resend_after: Duration) -> (EventHubsAmqpSink, amqp_peer::Arrivals) {
    peer_and_sink_with(4, resend_after).await
}

/// [`peer_and_sink`] for a hub of `partitions` partitions (0: a hub whose partitions
/// the client cannot read).
pub async fn peer_and_sink_with(
    partitions: usize,
    resend_after: Duration,
) -> (EventHubsAmqpSink, amqp_peer::Arrivals) {
    let (endpoint, arrivals) = amqp_peer::start_with_partitions(partitions).await;
    let connect = EventHubsAmqpSink::connect(
        EventHubsCredential::ConnectionString(CONNECTION_STRING.into()),
        "orders",
        Some(endpoint),
        resend_after,
        Duration::from_secs(60),
    );
    let sink = crate::tools::within(
        "the AMQP sink to connect to the local peer",
        Duration::from_secs(90),
        connect,
    )
    .await
    .expect("producer opens against the local peer");
    (sink, arrivals)
}

pub async fn deliver(scheme: PartitionKeyScheme, mode: CloudEventsMode) {
    // The client was seen to stall after an acknowledged send: resend soon.
    let (sink, arrivals) = peer_and_sink(Duration::from_secs(2)).await;
    let dir = std::env::temp_dir().join(format!("mssql-ces-amqp-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let summary = crate::tools::within(
        "the pipeline into the local AMQP peer",
        Duration::from_secs(300),
        pipeline::run(
            Poller::new(
                SyntheticSource::new(synthetic()),
                PollerConfig {
                    batch_size: 25,
                    ..PollerConfig::default()
                },
                None,
            ),
            Box::new(options),
            router(scheme, mode),
            Sink::EventHubsAmqp(Box::new(sink)),
            CheckpointStore::File(FileStore::new(dir.join("cp.json"), "amqp")),
            PipelineSettings {
                poll_interval: Duration::from_millis(10),
                checkpoint_interval: Duration::from_millis(10),
                drain_timeout: Duration::from_secs(30),
                idle_drain_timeout: Duration::from_secs(30),
                until_idle: true,
                metrics: Default::default(),
            },
            CancellationToken::new(),
        ),
    )
    .await
    .expect("run");
    std::fs::remove_dir_all(dir).ok();

    let expected = expected(&router(scheme, mode)).await;
    let all: Vec<ArrivedEvent> = arrivals.events.lock().expect("lock").clone();
    // At least once: a batch resent after a stall arrives twice, identically. Keep
    // each distinct message (body and properties, which carry its id) once, in order
    // of first arrival.
    let mut seen = std::collections::HashSet::new();
    let arrived: Vec<ArrivedEvent> = all
        .iter()
        .filter(|a| {
            // Properties come from a map: a resend may list them in another order.
            let mut properties = a.properties.clone();
            properties.sort();
            seen.insert((a.body.clone(), properties))
        })
        .cloned()
        .collect();
    assert_eq!(summary.messages as usize, expected.len());
    assert_eq!(
        arrived.len(),
        expected.len(),
        "every message arrived, once or more"
    );
    // The peer's hub has four partitions: the sink sends to them directly, every
    // message of a key to one partition, and the keys spread over several.
    let mut partition_of_key: BTreeMap<String, String> = BTreeMap::new();
    for a in &arrived {
        let (hub, partition) = a
            .address
            .split_once("/Partitions/")
            .unwrap_or_else(|| panic!("sent to a partition, not {}", a.address));
        assert!(
            hub.ends_with("/orders"),
            "sent to the event hub: {}",
            a.address
        );
        let key = a.partition_key.clone().unwrap_or_default();
        let first = partition_of_key
            .entry(key.clone())
            .or_insert_with(|| partition.to_owned());
        assert_eq!(
            first, partition,
            "every message of key {key} on one partition"
        );
    }
    let used: std::collections::BTreeSet<&String> = partition_of_key.values().collect();
    if partition_of_key.len() > 8 {
        assert!(used.len() > 1, "keys spread over the partitions: {used:?}");
    }
    let tokens = arrivals.tokens.lock().expect("lock").clone();
    assert!(
        tokens
            .iter()
            .any(|t| t.contains("fake.servicebus.windows.net/orders")),
        "{tokens:?}"
    );
    assert!(
        expected.iter().any(|m| m.payload.len() > 100_000),
        "segmented events were sent"
    );

    // Per partition key, the same messages in the same order.
    let mut want: BTreeMap<String, Vec<&OutgoingMessage>> = BTreeMap::new();
    for m in &expected {
        want.entry(partition_key(m)).or_default().push(m);
    }
    let mut got: BTreeMap<String, Vec<&ArrivedEvent>> = BTreeMap::new();
    for a in &arrived {
        got.entry(a.partition_key.clone().unwrap_or_default())
            .or_default()
            .push(a);
    }
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "partition keys"
    );
    for (key, messages) in &want {
        let arrived = &got[key];
        assert_eq!(arrived.len(), messages.len(), "key {key}");
        for (m, a) in messages.iter().zip(arrived) {
            assert!(a.body == m.payload, "body bytes for key {key}");
            // AMQP's message-id is the CloudEvent's (the segment's) id.
            assert_eq!(
                a.message_id,
                m.message_id.map(|id| id.to_string()),
                "message-id for key {key}"
            );
            assert!(a.message_id.is_some());
            let content_type = m
                .headers
                .iter()
                .find(|(k, _)| *k == "content-type")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
            assert_eq!(a.content_type, content_type);
            for (header, value) in &m.headers {
                if let Some(attribute) = header.strip_prefix("ce_") {
                    let name = format!("cloudEvents:{attribute}");
                    let found = a
                        .properties
                        .iter()
                        .find(|(k, _)| *k == name)
                        .map(|(_, v)| v.as_bytes());
                    assert_eq!(found, Some(value.as_slice()), "property {name}");
                }
            }
        }
    }
    if mode == CloudEventsMode::Structured {
        assert!(
            arrived.iter().all(|a| a.content_type.as_deref()
                == Some("application/cloudevents+json; charset=UTF-8"))
        );
    } else {
        assert!(arrived.iter().all(|a| {
            a.properties
                .iter()
                .any(|(k, _)| k == "cloudEvents:logicalid")
        }));
    }
}

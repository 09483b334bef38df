//! Event Hubs over AMQP: the sink's throughput next to the bare `ProducerClient` on
//! the same message bytes, against the same local AMQP peer (`crates/testkit/src/
//! amqp_peer.rs`, a test double that accepts and records; not Event Hubs), in the same
//! run.
//!
//! Run: `cargo bench --bench amqp`. `AMQP_BENCH_SECONDS` (default 5) is how long each
//! side runs; `AMQP_BENCH_RTT_MS` (default `0,20`) the peer's settlement delays to
//! measure at, a stand-in for the service's round trip.
//!
//! The messages are CES-sized (about 1 KB) with 1,000 distinct primary-key partition
//! keys, 1,000 to a pipeline batch, as a busy table produces them. The sink keeps
//! each key's order. The bare client is the simplest fast use of the library: fill
//! batches without keys and send them one after another — it keeps no key's order and
//! places nothing, so it is an upper bound on a sequential sender, not a like-for-like
//! peer.
//!
//! Against this peer the client library now and then never reports the outcome of a
//! send to a partition link (seen with the bare client too, when it sends to
//! partitions). The sink resends such a batch after `resend_after` (1 s here); the
//! table gives the wall rate with those stalls, the rate at the median batch time
//! between them, and how many batches stalled.

use mssql_ces_testkit::amqp_peer;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use azure_messaging_eventhubs::models::EventData;
use azure_messaging_eventhubs::{EventDataBatchOptions, ProducerClient};
use mssql_ces::sink::event_hubs_amqp::{BATCH_CAP_BYTES, EventHubsAmqpSink, EventHubsCredential};
use mssql_ces::sink::{OutgoingMessage, Sink};

const CONNECTION_STRING: &str = "Endpoint=sb://bench.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0;EntityPath=orders";
const BATCH: usize = 1_000;
const KEYS: usize = 1_000;

fn messages() -> Vec<OutgoingMessage> {
    (0..BATCH)
        .map(|i| {
            let key = format!("dbo.orders|{}", (i * 7919) % KEYS);
            let mut payload = format!(
                "{{\"specversion\":\"1.0\",\"id\":\"{i:08}\",\"source\":\"/\",\"type\":\"com.microsoft.SQL.CES.DML.V1\",\"data\":\""
            )
            .into_bytes();
            payload.resize(1_000, b'x');
            payload.extend_from_slice(b"\"}");
            OutgoingMessage {
                topic: "orders".into(),
                key: Some(key.into_bytes()),
                partition_hint: None,
                headers: vec![(
                    "content-type",
                    b"application/cloudevents+json; charset=UTF-8".to_vec(),
                )],
                payload,
                message_id: None,
                tombstone: false,
            }
        })
        .collect()
}

/// What one side did: the time of each pipeline batch of [`BATCH`] messages.
struct Measured {
    batches: Vec<Duration>,
    elapsed: Duration,
}

impl Measured {
    /// Messages per second over the whole run, stalls included.
    fn wall_rate(&self) -> f64 {
        (self.batches.len() * BATCH) as f64 / self.elapsed.as_secs_f64()
    }

    fn median(&self) -> Duration {
        let mut sorted = self.batches.clone();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied().unwrap_or_default()
    }

    /// Messages per second at the median batch time: the rate between stalls.
    fn median_rate(&self) -> f64 {
        BATCH as f64 / self.median().as_secs_f64()
    }

    /// Batches that took over ten times the median: a stalled send, resent.
    fn stalls(&self) -> usize {
        let limit = self.median() * 10;
        self.batches.iter().filter(|b| **b > limit).count()
    }
}

/// Runs `one_batch` after one warm-up batch (links attach on first use) until `run`
/// has passed, timing each batch.
async fn measure<F: AsyncFnMut()>(mut one_batch: F, run: Duration) -> Measured {
    one_batch().await;
    let started = Instant::now();
    let mut batches = Vec::new();
    while started.elapsed() < run {
        let t = Instant::now();
        one_batch().await;
        batches.push(t.elapsed());
    }
    Measured {
        batches,
        elapsed: started.elapsed(),
    }
}

/// The sink: a pipeline batch, then every delivery.
async fn through_sink(endpoint: &str, messages: &[OutgoingMessage], run: Duration) -> Measured {
    let sink = EventHubsAmqpSink::connect(
        EventHubsCredential::ConnectionString(CONNECTION_STRING.into()),
        "orders",
        Some(endpoint.to_owned()),
        // The client stalls now and then against this peer (see `docs/src/configuration.md`, *Event Hubs over AMQP*); the
        // sink resends after this. Short here, so a stall costs a second, not 30.
        Duration::from_secs(1),
        Duration::from_secs(120),
    )
    .await
    .expect("sink opens");
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    let measured = measure(
        async || {
            let mut deliveries = Vec::with_capacity(messages.len());
            for m in messages {
                deliveries.push(sink.send(m.clone()).await.expect("queued"));
            }
            sink.end_batch(&Default::default()).await.expect("sent");
            for d in deliveries {
                d.wait().await.expect("delivered");
            }
        },
        run,
    )
    .await;
    sink.close().await.ok();
    measured
}

/// The bare client on the same bytes: full batches to the hub's gateway, sent one
/// after another.
async fn through_bare_client(
    endpoint: &str,
    messages: &[OutgoingMessage],
    run: Duration,
) -> Measured {
    let producer = ProducerClient::builder()
        .with_custom_endpoint(endpoint.to_owned())
        .open_with_connection_string(CONNECTION_STRING, Some("orders"))
        .await
        .expect("producer opens");
    let measured = measure(
        async || {
            let mut rest = messages;
            while !rest.is_empty() {
                // The sink's own cap: a batch filled to the link's very limit stalls
                // against this peer (the client's size estimate is short of the wire).
                let options = EventDataBatchOptions {
                    max_size_in_bytes: Some(BATCH_CAP_BYTES),
                    ..Default::default()
                };
                let batch = producer.create_batch(Some(options)).await.expect("batch");
                let mut taken = 0;
                for m in rest {
                    let event = EventData::builder()
                        .with_body(m.payload.clone())
                        .with_content_type("application/cloudevents+json; charset=UTF-8".into())
                        .build();
                    if !batch.try_add_event_data(event, None).expect("add") {
                        break;
                    }
                    taken += 1;
                }
                producer.send_batch(batch, None).await.expect("sent");
                rest = &rest[taken..];
            }
        },
        run,
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(5), producer.close()).await;
    measured
}

fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let seconds: u64 = std::env::var("AMQP_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let delays: Vec<u64> = std::env::var("AMQP_BENCH_RTT_MS")
        .unwrap_or_else(|_| "0,20".into())
        .split(',')
        .filter_map(|d| d.trim().parse().ok())
        .collect();
    let run = Duration::from_secs(seconds);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let messages = messages();
    let bytes: usize = messages.iter().map(|m| m.payload.len()).sum();
    println!(
        "AMQP sink vs bare ProducerClient: {BATCH} messages of ~{} B, {KEYS} keys, per batch; {seconds} s each side; 4-partition local peer",
        bytes / BATCH
    );
    println!(
        "| peer round trip | sink msg/s (wall) | sink msg/s (median batch) | sink stalls | bare msg/s (wall) | bare msg/s (median batch) | bare stalls | sink / bare (median) | gateway fallback msg/s (median batch) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for delay in delays {
        let (sink, bare, gateway) = runtime.block_on(async {
            let (endpoint, arrivals) = amqp_peer::start_with_partitions(4).await;
            arrivals.settle_delay_ms.store(delay, Ordering::SeqCst);
            let sink = through_sink(&endpoint, &messages, run).await;
            // The peer keeps what it received: start the other side on a fresh one.
            let (endpoint, arrivals) = amqp_peer::start_with_partitions(4).await;
            arrivals.settle_delay_ms.store(delay, Ordering::SeqCst);
            let bare = through_bare_client(&endpoint, &messages, run).await;
            // A hub whose partitions cannot be read: each key through the gateway,
            // one at a time (how every key was sent before partitions were read).
            let (endpoint, arrivals) = amqp_peer::start_with_partitions(0).await;
            arrivals.settle_delay_ms.store(delay, Ordering::SeqCst);
            let gateway = through_sink(&endpoint, &messages, run).await;
            (sink, bare, gateway)
        });
        println!(
            "| {delay} ms | {:.0} | {:.0} | {} of {} | {:.0} | {:.0} | {} of {} | {:.2} | {:.0} |",
            sink.wall_rate(),
            sink.median_rate(),
            sink.stalls(),
            sink.batches.len(),
            bare.wall_rate(),
            bare.median_rate(),
            bare.stalls(),
            bare.batches.len(),
            sink.median_rate() / bare.median_rate(),
            gateway.median_rate()
        );
    }
}

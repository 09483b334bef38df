//! Event Hubs over AMQP: a batch the service settles as `Released` (not stored) is
//! sent again, not counted as delivered. The client library reports that outcome as a
//! success with a warning; the sink reads the warning through its tracing layer,
//! installed here as the binary installs it.

use crate::support;

use std::time::Duration;

use mssql_ces::sink::event_hubs_amqp::outcome::OutcomeLayer;
use mssql_ces::sink::{OutgoingMessage, Sink};
use tracing_subscriber::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_batch_is_sent_again() {
    tracing_subscriber::registry()
        .with(
            OutcomeLayer::new()
                .with_filter(tracing_subscriber::filter::filter_fn(OutcomeLayer::wants)),
        )
        .init();
    let (sink, arrivals) = support::event_hubs::peer_and_sink(Duration::from_secs(5)).await;
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    arrivals
        .release_next
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let message = OutgoingMessage {
        topic: "orders".into(),
        key: Some(b"dbo.T".to_vec()),
        partition_hint: None,
        headers: Vec::new(),
        payload: b"{\"id\":\"x\"}".to_vec(),
        message_id: None,
        tombstone: false,
    };
    let delivery = sink.send(message).await.expect("queued");
    sink.end_batch(&Default::default())
        .await
        .expect("sent again after the release");
    delivery.wait().await.expect("delivered");
    let arrived = arrivals.events.lock().expect("lock").clone();
    // Stored after the released attempt (at least once: the client's known stall
    // can add a resend of the same bytes).
    assert!(!arrived.is_empty(), "stored after the released attempt");
    assert!(arrived.iter().all(|a| a.body == b"{\"id\":\"x\"}"));
    assert_eq!(
        arrivals
            .release_next
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the first attempt was released"
    );
}

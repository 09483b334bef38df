//! Event Hubs over AMQP with the largest legal messages: at `max_message_size_kb =
//! 1024`, events of about 1,000 KB must be delivered, in their key's order, against
//! the local AMQP peer (`support::amqp_peer`, whose links allow 1 MiB messages).
//!
//! Delivery is at least once: the client library is known to stall now and then after
//! an acknowledged send, which the sink answers by sending the batch again. So the
//! checks are on the distinct messages, in order of first arrival.

use crate::support;

use std::time::Duration;

use mssql_ces::sink::{Delivery, OutgoingMessage, Sink};

fn message(key: &str, size: usize, tag: u8) -> OutgoingMessage {
    let mut payload = vec![b'x'; size];
    payload[0] = tag;
    support::event_hubs::message(key, payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_about_a_megabyte_are_delivered_in_key_order() {
    let (sink, arrivals) = support::event_hubs::peer_and_sink(Duration::from_secs(5)).await;
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    // Small, about 1,000 KB (the first of its group: the case that crashed), small,
    // about 830 KB, and one more large: one key, so one order.
    let sizes = [2_000, 1_000_000, 3_000, 850_000, 1_010_000];
    let mut deliveries = send_tagged(&mut sink, "dbo.T", &sizes).await;
    // A group that starts with a large message.
    deliveries.push(
        sink.send(message("dbo.U", 1_000_000, 9))
            .await
            .expect("queued"),
    );
    sink.end_batch(&Default::default())
        .await
        .expect("the batch is sent");
    for delivery in deliveries {
        delivery.wait().await.expect("delivered");
    }
    let arrived = arrivals.events.lock().expect("lock").clone();
    let t = first_arrivals(
        arrived
            .iter()
            .filter(|a| a.partition_key.as_deref() == Some("dbo.T"))
            .map(|a| (a.body[0], a.body.len())),
    );
    assert_eq!(
        t,
        sizes
            .iter()
            .enumerate()
            .map(|(i, s)| (u8::try_from(i).expect("tag"), *s))
            .collect::<Vec<_>>(),
        "every message of the key, in order, with its partition key"
    );
    assert!(
        arrived
            .iter()
            .any(|a| a.partition_key.as_deref() == Some("dbo.U") && a.body.len() == 1_000_000)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_batch_is_resent_alone_on_a_new_connection() {
    let (sink, arrivals) = support::event_hubs::peer_and_sink(Duration::from_millis(1500)).await;
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    // One key, three chunks: a large message alone, then two small ones in a batch,
    // then another large one alone. The second transfer is never settled.
    let sizes = [1_000_000, 500, 600, 1_000_000];
    arrivals
        .hold_transfer
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let deliveries = send_tagged(&mut sink, "dbo.T", &sizes).await;
    let started = std::time::Instant::now();
    sink.end_batch(&Default::default())
        .await
        .expect("the stalled chunk is resent");
    for delivery in deliveries {
        delivery.wait().await.expect("delivered");
    }
    let arrived = first_arrivals(
        arrivals
            .events
            .lock()
            .expect("lock")
            .iter()
            .map(|a| (a.body[0], a.body.len())),
    );
    assert_eq!(
        arrived,
        vec![(0, 1_000_000), (1, 500), (2, 600), (3, 1_000_000)],
        "every message, in order, the stalled chunk included"
    );
    let transfers = arrivals.transfers.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        transfers > 3,
        "the stalled chunk was sent again ({transfers} transfers)"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "the timer fired"
    );
}

/// Queues one message of `key` per size, tagged with its index.
async fn send_tagged(sink: &mut Sink, key: &str, sizes: &[usize]) -> Vec<Delivery> {
    let mut deliveries = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let tag = u8::try_from(i).expect("tag");
        deliveries.push(sink.send(message(key, *size, tag)).await.expect("queued"));
    }
    deliveries
}

/// Each distinct message once, in order of first arrival.
fn first_arrivals(arrived: impl Iterator<Item = (u8, usize)>) -> Vec<(u8, usize)> {
    let mut seen = std::collections::HashSet::new();
    arrived.filter(|m| seen.insert(*m)).collect()
}

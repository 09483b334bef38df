//! Event Hubs over AMQP, where keys go: the sink reads the hub's partitions from the
//! local peer's `$management` node, places each key on the partition Event Hubs would
//! (checked with the Azure SDKs' published hash vectors, not with the sink's own
//! code), fills one batch per partition with many keys, and sends partitions side by
//! side — each key in order. Without readable partitions it falls back to the gateway,
//! one key per batch.

use crate::support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use mssql_ces::sink::event_hubs_amqp::PARTITIONS_IN_FLIGHT;
use mssql_ces::sink::{OutgoingMessage, Sink};
use support::amqp_peer::{Arrivals, ArrivedEvent};
use support::tools::within;

fn message(key: &str, seq: u32) -> OutgoingMessage {
    support::event_hubs::message(
        key,
        format!("{{\"key\":\"{key}\",\"seq\":{seq}}}").into_bytes(),
    )
}

/// `keys` keys (among them the published vectors "7" and "131"), `per_key` messages
/// each, interleaved as a table's changes are; sent as one pipeline batch.
async fn send_all(sink: &mut Sink, keys: usize, per_key: u32) -> Vec<(String, u32)> {
    let mut names: Vec<String> = vec!["7".into(), "131".into()];
    names.extend((names.len()..keys).map(|i| format!("dbo.orders|{i}")));
    let mut sent = Vec::new();
    let mut deliveries = Vec::new();
    for seq in 0..per_key {
        for key in &names {
            deliveries.push(sink.send(message(key, seq)).await.expect("queued"));
            sent.push((key.clone(), seq));
        }
    }
    sink.end_batch(&Default::default())
        .await
        .expect("the batch is sent");
    for delivery in deliveries {
        delivery.wait().await.expect("delivered");
    }
    sent
}

/// Each distinct message once, in order of first arrival (a resend after the client's
/// known stall repeats a message byte for byte), the warm-up's left out.
fn distinct(arrivals: &Arrivals) -> Vec<ArrivedEvent> {
    let mut seen = HashSet::new();
    let all = arrivals.events.lock().expect("lock").clone();
    all.into_iter()
        .filter(|a| {
            !a.partition_key
                .as_deref()
                .is_some_and(|k| k.starts_with("warm|"))
        })
        .filter(|a| seen.insert(a.body.clone()))
        .collect()
}

/// Every sent message arrived with its own key, and each key's in send order.
fn assert_complete_and_in_key_order(sent: &[(String, u32)], arrived: &[ArrivedEvent]) {
    assert_eq!(arrived.len(), sent.len(), "every message arrived");
    let mut order: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for a in arrived {
        let body: serde_json::Value = serde_json::from_slice(&a.body).expect("json body");
        let key = body["key"].as_str().expect("key").to_owned();
        assert_eq!(
            a.partition_key.as_deref(),
            Some(key.as_str()),
            "the message carries its key"
        );
        order
            .entry(key)
            .or_default()
            .push(u32::try_from(body["seq"].as_u64().expect("seq")).expect("seq"));
    }
    for (key, seqs) in order {
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(seqs, sorted, "key {key} in order");
    }
}

/// Sends a first batch, so every partition's link is attached (each attaches on
/// first use, one authorization at a time), then forgets what the peer saw. Its
/// keys are its own (`warm|…`): a warm-up transfer that the client's known stall
/// had sent again may still arrive after, and is not taken for the test's.
async fn warm_up(sink: &mut Sink, arrivals: &Arrivals) {
    let mut deliveries = Vec::new();
    for i in 0..300 {
        let key = format!("warm|{i}");
        let delivery = sink.send(message(&key, 0)).await.expect("queued");
        deliveries.push(delivery);
    }
    sink.end_batch(&Default::default())
        .await
        .expect("the batch is sent");
    for delivery in deliveries {
        delivery.wait().await.expect("delivered");
    }
    arrivals.events.lock().expect("lock").clear();
    arrivals.transfers.store(0, Ordering::SeqCst);
    arrivals.max_in_flight.store(0, Ordering::SeqCst);
}

fn partition_of(a: &ArrivedEvent) -> Option<&str> {
    a.address.split_once("/Partitions/").map(|(_, p)| p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_go_where_the_service_puts_them_many_to_a_batch_partitions_side_by_side() {
    let (sink, arrivals) = support::event_hubs::peer_and_sink_with(4, Duration::from_secs(5)).await;
    assert_eq!(sink.partition_count(), Some(4));
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    warm_up(&mut sink, &arrivals).await;
    // A service's round trip: makes sends that overlap visible to the peer. Long
    // enough that a partition's batch is still unsettled when the next partition's
    // arrives on a loaded machine (100 ms was not, now and then).
    arrivals.settle_delay_ms.store(400, Ordering::SeqCst);
    let sent = send_all(&mut sink, 200, 3).await;
    let arrived = distinct(&arrivals);
    assert_complete_and_in_key_order(&sent, &arrived);

    // The published vectors: "7" hashes to -15263 and "131" to 30562; of four
    // partitions that is |-15263 % 4| = 3 and 30562 % 4 = 2.
    for (key, partition) in [("7", "3"), ("131", "2")] {
        let places: HashSet<Option<&str>> = arrived
            .iter()
            .filter(|a| a.partition_key.as_deref() == Some(key))
            .map(partition_of)
            .collect();
        assert_eq!(places, HashSet::from([Some(partition)]), "key {key}");
    }
    let used: HashSet<Option<&str>> = arrived.iter().map(partition_of).collect();
    assert_eq!(used.len(), 4, "200 keys use every partition: {used:?}");

    // 600 messages of 200 keys: a batch per partition, not a round trip per key.
    let transfers = arrivals.transfers.load(Ordering::SeqCst);
    assert!(transfers <= 8, "{transfers} transfers for 4 partitions");
    let overlap = arrivals.max_in_flight.load(Ordering::SeqCst);
    assert!(overlap > 1, "partitions were sent side by side ({overlap})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_partitions_in_flight_than_the_bound() {
    let (sink, arrivals) =
        support::event_hubs::peer_and_sink_with(32, Duration::from_secs(5)).await;
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    warm_up(&mut sink, &arrivals).await;
    arrivals.settle_delay_ms.store(200, Ordering::SeqCst);
    let sent = send_all(&mut sink, 300, 2).await;
    assert_complete_and_in_key_order(&sent, &distinct(&arrivals));
    let overlap = arrivals.max_in_flight.load(Ordering::SeqCst);
    assert!(
        overlap > 1 && overlap <= PARTITIONS_IN_FLIGHT,
        "{overlap} batches in flight, bound {PARTITIONS_IN_FLIGHT}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_readable_partitions_each_key_goes_through_the_gateway() {
    let (sink, arrivals) = support::event_hubs::peer_and_sink_with(0, Duration::from_secs(5)).await;
    assert_eq!(sink.partition_count(), None);
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    let sent = send_all(&mut sink, 6, 3).await;
    let arrived = distinct(&arrivals);
    assert_complete_and_in_key_order(&sent, &arrived);
    assert!(
        arrived.iter().all(|a| a.address.ends_with("/orders")),
        "sent to the hub, which places the keys"
    );
    // The gateway places one key per batch: 18 messages of 6 keys take at least 6.
    assert!(
        arrivals.transfers.load(Ordering::SeqCst) >= 6,
        "a batch per key"
    );
}

/// A hub that gains partitions (Premium, Dedicated) is seen: the map is read again
/// when due, and keys go to the new partitions where the service now places them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_added_to_the_hub_are_read_again_and_used() {
    // The client was seen to stall after an acknowledged send: resend soon.
    let (sink, arrivals) = support::event_hubs::peer_and_sink_with(2, Duration::from_secs(2)).await;
    let mut sink = Sink::EventHubsAmqp(Box::new(
        sink.with_partition_refresh(Duration::from_millis(200)),
    ));
    let partition_of = |a: &ArrivedEvent| {
        a.address
            .rsplit('/')
            .next()
            .and_then(|p| p.parse::<u32>().ok())
    };
    send_all(&mut sink, 40, 1).await;
    let before: HashSet<u32> = distinct(&arrivals)
        .iter()
        .filter_map(partition_of)
        .collect();
    assert!(before.iter().all(|p| *p < 2), "{before:?}");
    *arrivals.partition_ids.lock().expect("lock") = (0..8).map(|i| i.to_string()).collect();
    // The map is read again once due and in the background: on a loaded machine the
    // first sends after that may still use the old one, so send in rounds until the
    // new partitions show (or 20 rounds pass).
    let rounds = async {
        let mut after: HashSet<u32> = HashSet::new();
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            arrivals.events.lock().expect("lock").clear();
            send_all(&mut sink, 40, 1).await;
            after = distinct(&arrivals)
                .iter()
                .filter_map(partition_of)
                .collect();
            if after.iter().any(|p| *p >= 2) {
                break;
            }
        }
        after
    };
    let after = within(
        "rounds of sends until the new partitions show",
        Duration::from_secs(120),
        rounds,
    )
    .await;
    assert!(
        after.iter().any(|p| *p >= 2),
        "the new partitions are used: {after:?}"
    );
}

/// A re-read of the partitions whose reply never comes is a stalled link: it costs
/// at most `amqp_resend_after_ms`, the batch is still sent (with the partitions read
/// before), and the connection is replaced, so later reads are answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_read_that_is_never_answered_is_bounded_and_the_connection_replaced() {
    let (sink, arrivals) = support::event_hubs::peer_and_sink_with(2, Duration::from_secs(1)).await;
    let mut sink = Sink::EventHubsAmqp(Box::new(
        sink.with_partition_refresh(Duration::from_millis(100)),
    ));
    arrivals.hold_management.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(150)).await;
    // With the read bounded only by its former fixed 30 s, this round took 30 s.
    let sent = within(
        "a batch while the partition read goes unanswered",
        Duration::from_secs(15),
        send_all(&mut sink, 10, 2),
    )
    .await;
    assert_complete_and_in_key_order(&sent, &distinct(&arrivals));
    // Answered again: the new partitions are read on the new connection.
    arrivals.hold_management.store(false, Ordering::SeqCst);
    *arrivals.partition_ids.lock().expect("lock") = (0..8).map(|i| i.to_string()).collect();
    let rounds = async {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            arrivals.events.lock().expect("lock").clear();
            send_all(&mut sink, 40, 1).await;
            let used: HashSet<u32> = distinct(&arrivals)
                .iter()
                .filter_map(|a| a.address.rsplit('/').next().and_then(|p| p.parse().ok()))
                .collect();
            if used.iter().any(|p| *p >= 2) {
                return used;
            }
        }
        HashSet::new()
    };
    let used = within(
        "the partitions read again after the stall",
        Duration::from_secs(60),
        rounds,
    )
    .await;
    assert!(
        used.iter().any(|p| *p >= 2),
        "read again after the stall: {used:?}"
    );
}

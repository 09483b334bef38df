//! Event Hubs over AMQP with the largest legal messages: at `max_message_size_kb =
//! 1024`, events of about 1,000 KB must be delivered, in their key's order, against
//! the local AMQP peer (`support::amqp_peer`, whose links allow 1 MiB messages).

mod support;

use std::time::Duration;

use mssql_ces::sink::event_hubs_amqp::{EventHubsAmqpSink, EventHubsCredential};
use mssql_ces::sink::{OutgoingMessage, Sink};

const CONNECTION_STRING: &str = "Endpoint=sb://fake.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0;EntityPath=orders";

fn message(key: &str, size: usize, tag: u8) -> OutgoingMessage {
    let mut payload = vec![b'x'; size];
    payload[0] = tag;
    OutgoingMessage {
        topic: "orders".into(),
        key: Some(key.as_bytes().to_vec()),
        partition_hint: None,
        headers: vec![(
            "content-type".into(),
            b"application/cloudevents+json; charset=UTF-8".to_vec(),
        )],
        payload,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_about_a_megabyte_are_delivered_in_key_order() {
    let (endpoint, arrivals) = support::amqp_peer::start().await;
    let sink = EventHubsAmqpSink::connect(
        EventHubsCredential::ConnectionString(CONNECTION_STRING.into()),
        "orders",
        Some(endpoint),
        Duration::from_secs(5),
        Duration::from_secs(60),
    )
    .await
    .expect("producer opens against the local peer");
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    // Small, about 1,000 KB (the first of its group: the case that crashed), small,
    // about 830 KB, and one more large: one key, so one order.
    let sizes = [2_000, 1_000_000, 3_000, 850_000, 1_010_000];
    let mut deliveries = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let tag = u8::try_from(i).expect("tag");
        deliveries.push(
            sink.send(message("dbo.T", *size, tag))
                .await
                .expect("queued"),
        );
    }
    // A group that starts with a large message.
    deliveries.push(
        sink.send(message("dbo.U", 1_000_000, 9))
            .await
            .expect("queued"),
    );
    sink.end_batch().await.expect("the batch is sent");
    for delivery in deliveries {
        delivery.wait().await.expect("delivered");
    }
    let arrived = arrivals.events.lock().expect("lock").clone();
    let t: Vec<(u8, usize)> = arrived
        .iter()
        .filter(|a| a.partition_key.as_deref() == Some("dbo.T"))
        .map(|a| (a.body[0], a.body.len()))
        .collect();
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

//! Event Hubs over AMQP: a batch the service rejects. A transient condition (the
//! service busy, a partition changing owner) is sent again until it is stored; a definite one (not authorized)
//! fails at once with a definite error, rather than being retried until
//! `delivery_timeout_ms`.

use crate::support;

use std::time::{Duration, Instant};

use mssql_ces::sink::{OutgoingMessage, Sink, SinkError};

fn message() -> OutgoingMessage {
    support::event_hubs::message("dbo.T", b"{\"id\":\"x\"}".to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_rejected_while_the_service_is_busy_is_sent_again() {
    let (sink, arrivals) = support::event_hubs::peer_and_sink(Duration::from_secs(20)).await;
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    // The client library retries a busy service on its own; a condition it hands
    // back at once but that passes (a partition changing owner during a service
    // update) is the sink's to retry, on a new connection.
    arrivals.reject_next.lock().expect("lock").extend([
        "com.microsoft:server-busy".to_owned(),
        "com.microsoft:partition-not-owned".to_owned(),
        "com.microsoft:partition-not-owned".to_owned(),
    ]);
    let delivery = sink.send(message()).await.expect("queued");
    sink.end_batch(&Default::default())
        .await
        .expect("stored once the service takes it");
    delivery.wait().await.expect("delivered");
    assert!(arrivals.reject_next.lock().expect("lock").is_empty());
    let arrived = arrivals.events.lock().expect("lock").clone();
    assert!(!arrived.is_empty(), "stored after the rejections");
    assert!(arrived.iter().all(|a| a.body == b"{\"id\":\"x\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_rejected_as_unauthorized_fails_at_once_as_definite() {
    // The resend timer is short: the client was once seen (1 run in 12 of the whole
    // in-process suite, on a loaded machine) not to return the rejection of its
    // first transfer, which the timer then resends. What is asserted is that the
    // rejection is not retried: at most that one resend, never a retry loop until
    // the delivery timeout (60 s).
    let (sink, arrivals) = support::event_hubs::peer_and_sink(Duration::from_secs(5)).await;
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    const REJECTIONS: usize = 20;
    arrivals
        .reject_next
        .lock()
        .expect("lock")
        .extend(std::iter::repeat_n(
            "amqp:unauthorized-access".to_owned(),
            REJECTIONS,
        ));
    let started = Instant::now();
    let delivery = sink.send(message()).await.expect("queued");
    let error = sink
        .end_batch(&Default::default())
        .await
        .expect_err("refused");
    assert!(matches!(error, SinkError::Definite { .. }), "{error:?}");
    assert!(
        matches!(delivery.wait().await, Err(SinkError::Definite { .. })),
        "the message's delivery fails with the same kind"
    );
    let transfers = REJECTIONS - arrivals.reject_next.lock().expect("lock").len();
    assert!(
        (1..=2).contains(&transfers),
        "the rejection is not retried ({transfers} transfers)"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "not retried until the delivery timeout: {:?} for {error:?}",
        started.elapsed()
    );
    assert!(arrivals.events.lock().expect("lock").is_empty());
}

/// An endpoint that refuses connections at the start is tried again, as Kafka's
/// brokers are waited for, until `delivery_timeout_ms`: a hub that comes up in time is
/// used; one that does not fails the run naming the setting, without the client's
/// layered labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_hub_at_the_start_is_waited_for_until_the_delivery_timeout() {
    use mssql_ces::sink::event_hubs_amqp::{EventHubsAmqpSink, EventHubsCredential};
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
    };
    let connect = |address: std::net::SocketAddr, timeout: Duration| {
        EventHubsAmqpSink::connect(
            EventHubsCredential::ConnectionString(support::event_hubs::CONNECTION_STRING.into()),
            "orders",
            Some(format!("amqp://{address}")),
            Duration::from_secs(20),
            timeout,
        )
    };
    // Nothing ever listens: a transient failure after the timeout, not at once.
    let started = Instant::now();
    let error = match connect(free(), Duration::from_secs(2)).await {
        Ok(_) => panic!("nothing listens there"),
        Err(e) => e,
    };
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(error.is_transient(), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("sink.delivery_timeout_ms"), "{text}");
    assert!(!text.contains("AMQP Error: AMQP Error"), "{text}");
    // The peer comes up after a second and a half: the sink connects to it.
    let address = free();
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let listener = tokio::net::TcpListener::bind(address).await.expect("bind");
        support::amqp_peer::serve_on(listener, 4)
    });
    let sink = connect(address, Duration::from_secs(20))
        .await
        .expect("connects once the peer listens");
    let _peer = late.await.expect("peer");
    drop(sink);
}

//! Event Hubs over AMQP: a batch the service settles as `Released` or `Modified`
//! (not stored) is sent again, not counted as delivered. The sink reads the outcome
//! of its own transfer, so nothing needs to be installed for it: no tracing
//! subscriber is set up here, as an embedder of the library may have none.

use crate::support;

use std::time::Duration;

use mssql_ces::sink::{OutgoingMessage, Sink};

/// One message through a sink whose next transfer the peer settles with
/// `outcome` (`release_next` or `modify_next`): delivered in the end, the first
/// attempt not counted as delivered.
async fn settled_without_storing(
    outcome: fn(&support::amqp_peer::Arrivals) -> &std::sync::atomic::AtomicUsize,
) {
    let (sink, arrivals) = support::event_hubs::peer_and_sink(Duration::from_secs(5)).await;
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    outcome(&arrivals).store(1, std::sync::atomic::Ordering::SeqCst);
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
        .expect("sent again after the first attempt was not stored");
    delivery.wait().await.expect("delivered");
    let arrived = arrivals.events.lock().expect("lock").clone();
    assert!(!arrived.is_empty(), "stored after the first attempt");
    assert!(arrived.iter().all(|a| a.body == b"{\"id\":\"x\"}"));
    assert_eq!(
        outcome(&arrivals).load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the first attempt was settled without storing"
    );
    assert!(
        arrivals.transfers.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "sent twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_batch_is_sent_again() {
    settled_without_storing(|a| &a.release_next).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modified_batch_is_sent_again() {
    settled_without_storing(|a| &a.modify_next).await;
}

/// Sends one message through `sink`, then the token the peer saw put for a
/// partition's link.
async fn partition_link_token(
    sink: mssql_ces::sink::event_hubs_amqp::EventHubsAmqpSink,
    arrivals: &support::amqp_peer::Arrivals,
) -> support::amqp_peer::TokenPut {
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    let delivery = sink
        .send(support::event_hubs::message("dbo.T", b"{}".to_vec()))
        .await
        .expect("queued");
    sink.end_batch(&Default::default()).await.expect("sent");
    delivery.wait().await.expect("delivered");
    let puts = arrivals.token_puts.lock().expect("lock").clone();
    puts.iter()
        .find(|p| p.name.contains("/Partitions/"))
        .cloned()
        .unwrap_or_else(|| panic!("a partition link was authorized: {puts:?}"))
}

/// The sink signs its own shared access signature for the `$cbs` node, as Event
/// Hubs checks it: `sr` the event hub's address, percent-encoded and lower-cased;
/// `sig` the HMAC-SHA256, under the connection string's key, of `sr` and `se`
/// joined by a newline, base64; `se` within the hour; `skn` the key's name. Checked
/// here with the key, not with the sink's code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_link_is_authorized_with_a_signature_made_from_the_key() {
    use base64::Engine as _;
    use hmac::Mac as _;
    let (sink, arrivals) = support::event_hubs::peer_and_sink(Duration::from_secs(5)).await;
    let link = partition_link_token(sink, &arrivals).await;
    assert_eq!(link.token_type, "servicebus.windows.net:sastoken");
    let fields: std::collections::BTreeMap<&str, &str> = link
        .token
        .strip_prefix("SharedAccessSignature ")
        .expect("a shared access signature")
        .split('&')
        .filter_map(|f| f.split_once('='))
        .collect();
    let resource = "amqps%3a%2f%2ffake.servicebus.windows.net%2forders";
    assert_eq!(fields["sr"], resource);
    assert_eq!(fields["skn"], "send");
    let se: i64 = fields["se"].parse().expect("se");
    let now = chrono::Utc::now().timestamp();
    assert!(
        se > now + 50 * 60 && se <= now + 61 * 60,
        "valid about an hour: {se}"
    );
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"c2VjcmV0").expect("key");
    mac.update(format!("{resource}\n{se}").as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let expected = expected
        .replace('+', "%2B")
        .replace('/', "%2F")
        .replace('=', "%3D");
    assert_eq!(fields["sig"], expected);
}

/// A Microsoft Entra credential that hands out one fixed token.
#[derive(Debug)]
struct FixedToken;

#[async_trait::async_trait]
impl azure_core::credentials::TokenCredential for FixedToken {
    async fn get_token(
        &self,
        scopes: &[&str],
        _: Option<azure_core::credentials::TokenRequestOptions<'_>>,
    ) -> azure_core::Result<azure_core::credentials::AccessToken> {
        assert_eq!(scopes, ["https://eventhubs.azure.net/.default"]);
        Ok(azure_core::credentials::AccessToken::new(
            azure_core::credentials::Secret::new("entra-token".to_owned()),
            azure_core::time::OffsetDateTime::now_utc() + azure_core::time::Duration::hours(1),
        ))
    }
}

/// With Microsoft Entra ID, each link is authorized with the credential's token
/// for Event Hubs' scope, as a `jwt`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_entra_each_link_is_authorized_with_the_credentials_token() {
    let (endpoint, arrivals) = support::amqp_peer::start_with_partitions(4).await;
    let connect = mssql_ces::sink::event_hubs_amqp::EventHubsAmqpSink::connect(
        mssql_ces::sink::event_hubs_amqp::EventHubsCredential::Entra {
            namespace: "fake.servicebus.windows.net".into(),
            credential: std::sync::Arc::new(FixedToken),
        },
        "orders",
        Some(endpoint),
        Duration::from_secs(5),
        Duration::from_secs(60),
    );
    let sink = support::tools::within("the sink to connect", Duration::from_secs(90), connect)
        .await
        .expect("opens with an Entra credential");
    let link = partition_link_token(sink, &arrivals).await;
    assert_eq!(
        (link.token_type.as_str(), link.token.as_str()),
        ("jwt", "entra-token")
    );
    assert!(
        link.name
            .starts_with("amqps://fake.servicebus.windows.net/orders/Partitions/"),
        "{}",
        link.name
    );
}

/// A service that never stores a batch (every transfer released) fails the run
/// within `sink.delivery_timeout_ms`, saying so, rather than counting the batch as
/// delivered or retrying for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_never_stored_fails_within_the_delivery_timeout() {
    let (endpoint, arrivals) = support::amqp_peer::start_with_partitions(4).await;
    let connect = mssql_ces::sink::event_hubs_amqp::EventHubsAmqpSink::connect(
        mssql_ces::sink::event_hubs_amqp::EventHubsCredential::ConnectionString(
            support::event_hubs::CONNECTION_STRING.into(),
        ),
        "orders",
        Some(endpoint),
        // A stalled attempt (the first attach on a loaded machine) is sent again
        // after 3 s; the run gives up after 10 s.
        Duration::from_secs(3),
        Duration::from_secs(10),
    );
    let sink = support::tools::within("the sink to connect", Duration::from_secs(90), connect)
        .await
        .expect("opens");
    let mut sink = Sink::EventHubsAmqp(Box::new(sink));
    // A first batch stored, so that the link is attached and authorized before the
    // service starts releasing: every attempt after it is answered at once, and
    // the run ends on the releases, not on a slow first attach.
    let warm = sink
        .send(support::event_hubs::message("dbo.T", b"{}".to_vec()))
        .await
        .expect("queued");
    sink.end_batch(&Default::default()).await.expect("stored");
    assert!(warm.wait().await.is_ok());
    arrivals
        .release_next
        .store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
    let before = arrivals.transfers.load(std::sync::atomic::Ordering::SeqCst);
    let delivery = sink
        .send(support::event_hubs::message("dbo.T", b"{}".to_vec()))
        .await
        .expect("queued");
    let started = std::time::Instant::now();
    let error = sink
        .end_batch(&Default::default())
        .await
        .expect_err("never stored");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "bounded by the delivery timeout: {:?}",
        started.elapsed()
    );
    let text = error.to_string();
    assert!(
        text.contains("released or modified") && text.contains("sink.delivery_timeout_ms"),
        "{text}"
    );
    assert!(delivery.wait().await.is_err(), "not counted as delivered");
    assert!(
        arrivals.transfers.load(std::sync::atomic::Ordering::SeqCst) > before + 1,
        "sent again meanwhile"
    );
}

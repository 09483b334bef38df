//! A local AMQP 1.0 peer that answers what `azure_messaging_eventhubs`' producer asks
//! of Event Hubs, enough to test the AMQP sink without Azure: SASL ANONYMOUS, the
//! `$cbs` put-token exchange (status 202), the `$management` READ of the event hub
//! (its name and partition ids, status 200), sender links with `max-message-size` to
//! the hub or to one of its partitions (`<hub>/Partitions/<id>`), and batched
//! transfers (format 0x80013700), each accepted and recorded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fe2o3_amqp::acceptor::{
    ConnectionAcceptor, LinkAcceptor, LinkEndpoint, SaslAnonymousMechanism, SessionAcceptor,
};
use fe2o3_amqp::types::messaging::message::__private::Deserializable;
use fe2o3_amqp::types::messaging::{AmqpValue, ApplicationProperties, Body, Message};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use fe2o3_amqp::{Receiver, Sender};
use tokio::net::TcpListener;

/// One event as it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrivedEvent {
    pub address: String,
    pub body: Vec<u8>,
    pub content_type: Option<String>,
    pub partition_key: Option<String>,
    pub properties: Vec<(String, String)>,
    /// The AMQP `message-id`, as text.
    pub message_id: Option<String>,
}

/// What the peer has received.
#[derive(Debug, Clone, Default)]
pub struct Arrivals {
    pub events: Arc<Mutex<Vec<ArrivedEvent>>>,
    pub tokens: Arc<Mutex<Vec<String>>>,
    /// Each `$cbs` put-token as it came: the address it authorizes (`name`), the
    /// token's `type`, and the token itself.
    pub token_puts: Arc<Mutex<Vec<TokenPut>>>,
    /// The event transfer with this 1-based number is never settled (a stalled
    /// send); 0 for none.
    pub hold_transfer: Arc<std::sync::atomic::AtomicUsize>,
    /// Event transfers received so far.
    pub transfers: Arc<std::sync::atomic::AtomicUsize>,
    /// The next this many event transfers are answered `Released` (not stored).
    pub release_next: Arc<std::sync::atomic::AtomicUsize>,
    /// The next this many event transfers are answered `Modified` (not stored).
    pub modify_next: Arc<std::sync::atomic::AtomicUsize>,
    /// Partition ids the `$management` READ reports; with none, that request is
    /// answered 404 (a hub whose partitions the client cannot read).
    pub partition_ids: Arc<Mutex<Vec<String>>>,
    /// While set, `$management` requests are accepted and never answered (a stalled
    /// management link).
    pub hold_management: Arc<std::sync::atomic::AtomicBool>,
    /// Settlement delay of each event transfer, in ms (a service's round trip).
    pub settle_delay_ms: Arc<std::sync::atomic::AtomicU64>,
    /// The next event transfers are answered `Rejected` with these AMQP error
    /// conditions, one each (e.g. `com.microsoft:server-busy`).
    pub reject_next: Arc<Mutex<std::collections::VecDeque<String>>>,
    /// Event transfers received and not yet settled, and the most there ever were.
    pub in_flight: Arc<std::sync::atomic::AtomicUsize>,
    pub max_in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

/// One put-token request on the `$cbs` node.
#[derive(Debug, Clone)]
pub struct TokenPut {
    pub name: String,
    pub token_type: String,
    pub token: String,
}

/// Takes one from a fault counter, if any is left.
fn take_one(counter: &std::sync::atomic::AtomicUsize) -> bool {
    use std::sync::atomic::Ordering;
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// Starts the peer on a loopback port, for an event hub of four partitions; returns
/// its `amqp://127.0.0.1:<port>` endpoint.
pub async fn start() -> (String, Arrivals) {
    start_with_partitions(4).await
}

/// [`start`] for a hub of `count` partitions (0: the partitions cannot be read).
pub async fn start_with_partitions(count: usize) -> (String, Arrivals) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    serve_on(listener, count)
}

/// [`start`] on a listener of the caller's (a port chosen before the peer runs).
pub fn serve_on(listener: TcpListener, count: usize) -> (String, Arrivals) {
    let endpoint = format!("amqp://{}", listener.local_addr().expect("addr"));
    let arrivals = Arrivals::default();
    *arrivals.partition_ids.lock().expect("lock") = (0..count).map(|i| i.to_string()).collect();
    let shared = arrivals.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_connection(stream, shared.clone()));
        }
    });
    (endpoint, arrivals)
}

async fn serve_connection(stream: tokio::net::TcpStream, arrivals: Arrivals) {
    // Outcomes go out at once: with Nagle's algorithm, a second small disposition
    // waits for the client's delayed ACK (40 ms), which a service would not add.
    let _ = stream.set_nodelay(true);
    let acceptor = ConnectionAcceptor::builder()
        .container_id("fake-event-hubs")
        // Whole batches in one frame: this peer's multi-frame transfers were seen to
        // stall with ~1 MB batches (a limit of the test double, not of Event Hubs).
        .max_frame_size(4 * 1024 * 1024u32)
        .sasl_acceptor(SaslAnonymousMechanism::new())
        .build();
    let Ok(mut connection) = acceptor.accept(stream).await else {
        return;
    };
    // Batches of up to 1 MiB arrive as many frames: a wide window keeps them flowing.
    let sessions = SessionAcceptor::builder()
        .incoming_window(1_000_000)
        .build();
    while let Ok(session) = sessions.accept(&mut connection).await {
        tokio::spawn(serve_session(session, arrivals.clone()));
    }
}

async fn serve_session(
    mut session: fe2o3_amqp::acceptor::ListenerSessionHandle,
    arrivals: Arrivals,
) {
    let links = LinkAcceptor::builder()
        .max_message_size(1024 * 1024u64)
        .build();
    // The client's receivers, by source address (`$cbs`, `$management`): where
    // replies go.
    let reply: Replies = Arc::default();
    loop {
        let link = match links.accept(&mut session).await {
            Ok(link) => link,
            Err(e) => {
                if std::env::var_os("AMQP_PEER_TRACE").is_some() {
                    eprintln!("amqp peer: link accept ended: {e:?}");
                }
                return;
            }
        };
        match link {
            LinkEndpoint::Sender(sender) => {
                let source = sender
                    .source()
                    .as_ref()
                    .and_then(|s| s.address.clone())
                    .unwrap_or_default();
                reply.lock().await.insert(source, sender);
            }
            LinkEndpoint::Receiver(receiver) => {
                tokio::spawn(serve_receiver(
                    receiver,
                    Arc::clone(&reply),
                    arrivals.clone(),
                ));
            }
        }
    }
}

fn text(value: &SimpleValue) -> String {
    match value {
        SimpleValue::String(s) => s.clone(),
        SimpleValue::Symbol(s) => s.0.clone(),
        other => format!("{other:?}"),
    }
}

fn record(
    address: &str,
    message: Message<Body<Value>>,
    envelope_key: Option<String>,
    out: &Arrivals,
) {
    let body = match message.body {
        Body::Data(batch) => batch.into_iter().flat_map(|d| d.0.into_vec()).collect(),
        Body::Value(v) => format!("{:?}", v.0).into_bytes(),
        _ => Vec::new(),
    };
    let partition_key = message
        .message_annotations
        .as_ref()
        .and_then(|a| {
            a.0.iter().find_map(|(k, v)| {
                let name = format!("{k:?}");
                (name.contains("x-opt-partition-key")).then(|| match v {
                    Value::String(s) => s.clone(),
                    other => format!("{other:?}"),
                })
            })
        })
        .or(envelope_key);
    let properties = message
        .application_properties
        .map(|p| p.0.into_iter().map(|(k, v)| (k, text(&v))).collect())
        .unwrap_or_default();
    let message_id = message
        .properties
        .as_ref()
        .and_then(|p| p.message_id.as_ref())
        .map(|id| match id {
            fe2o3_amqp::types::messaging::MessageId::String(s) => s.clone(),
            other => format!("{other:?}"),
        });
    let content_type = message.properties.and_then(|p| p.content_type).map(|s| s.0);
    if let Ok(mut events) = out.events.lock() {
        events.push(ArrivedEvent {
            address: address.to_owned(),
            body,
            content_type,
            partition_key,
            properties,
            message_id,
        });
    }
}

type Replies = Arc<tokio::sync::Mutex<std::collections::HashMap<String, Sender>>>;

/// Sends `answer` on the client's receiver for `node`, waiting for it to attach (it
/// may attach just after its request sender).
///
/// Both waits are bounded and said on stderr when they run out: a client that gave
/// up on its request (and so never settles the reply) must not hold the session's
/// replies, or every later request on it would go unanswered.
async fn reply_on(reply: &Replies, node: &str, answer: Message<AmqpValue<Value>>) {
    const SETTLE: Duration = Duration::from_secs(5);
    for _ in 0..3000 {
        let mut guard = reply.lock().await;
        if let Some(sender) = guard.get_mut(node) {
            match tokio::time::timeout(SETTLE, sender.send(answer)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => eprintln!("amqp peer: the reply on {node} failed: {e:?}"),
                Err(_) => eprintln!(
                    "amqp peer: the reply on {node} was not settled within {SETTLE:?}; going on"
                ),
            }
            return;
        }
        drop(guard);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "amqp peer: no receiver for replies on {node} attached within 30 s; the reply is dropped"
    );
}

/// The answer to a `$management` READ of the event hub: its runtime information, as
/// Event Hubs gives it (name, created_at, partition_count, partition_ids), or 404
/// when the peer is set to have no readable partitions.
fn management_answer(
    request: &Message<Body<Value>>,
    arrivals: &Arrivals,
) -> Message<AmqpValue<Value>> {
    use fe2o3_amqp::types::primitives::{Array, OrderedMap, Timestamp};
    let ids = arrivals.partition_ids.lock().expect("lock").clone();
    let name = request
        .application_properties
        .as_ref()
        .and_then(|p| p.0.get("name"))
        .map(text)
        .unwrap_or_default();
    let correlation = request
        .properties
        .as_ref()
        .and_then(|p| p.message_id.clone());
    let properties = fe2o3_amqp::types::messaging::Properties {
        correlation_id: correlation,
        ..Default::default()
    };
    if ids.is_empty() {
        return status_reply(404, "not found", properties, Value::Null);
    }
    let mut body: OrderedMap<Value, Value> = OrderedMap::new();
    body.insert(Value::String("name".into()), Value::String(name));
    body.insert(
        Value::String("created_at".into()),
        Value::Timestamp(Timestamp::from_milliseconds(1_700_000_000_000)),
    );
    body.insert(
        Value::String("partition_count".into()),
        Value::Int(ids.len() as i32),
    );
    body.insert(
        Value::String("partition_ids".into()),
        Value::Array(Array::from(
            ids.into_iter().map(Value::String).collect::<Vec<_>>(),
        )),
    );
    status_reply(200, "OK", properties, Value::Map(body))
}

/// A reply on a request-response node (`$cbs`, `$management`): its status in the
/// application properties, and its body.
fn status_reply(
    code: i32,
    description: &str,
    properties: fe2o3_amqp::types::messaging::Properties,
    body: Value,
) -> Message<AmqpValue<Value>> {
    Message::builder()
        .properties(properties)
        .application_properties(
            ApplicationProperties::builder()
                .insert("status-code", code)
                .insert("status-description", description)
                .build(),
        )
        .value(body)
        .build()
}

async fn serve_receiver(mut receiver: Receiver, reply: Replies, arrivals: Arrivals) {
    let address = receiver
        .target()
        .as_ref()
        .and_then(|t| t.address.clone())
        .unwrap_or_default();
    loop {
        let delivery = match receiver.recv::<Body<Value>>().await {
            Ok(delivery) => delivery,
            Err(e) => {
                eprintln!("amqp peer: receive on {address} failed: {e:?}");
                return;
            }
        };
        let control = address.starts_with('$');
        let trace = std::env::var_os("AMQP_PEER_TRACE").is_some();
        if trace {
            eprintln!(
                "peer: received on {address} at {:?}",
                std::time::SystemTime::now()
            );
        }
        let number = if control {
            0
        } else {
            arrivals
                .transfers
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                + 1
        };
        if number > 0
            && number
                == arrivals
                    .hold_transfer
                    .load(std::sync::atomic::Ordering::SeqCst)
        {
            // Never settled: the sender waits for an outcome that does not come.
            continue;
        }
        if !control {
            use std::sync::atomic::Ordering;
            let now = arrivals.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            arrivals.max_in_flight.fetch_max(now, Ordering::SeqCst);
            let delay = arrivals
                .settle_delay_ms
                .load(std::sync::atomic::Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
        }
        let rejection = if control {
            None
        } else {
            arrivals.reject_next.lock().expect("lock").pop_front()
        };
        if let Some(condition) = rejection {
            arrivals
                .in_flight
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            let error = fe2o3_amqp::types::definitions::Error::new(
                fe2o3_amqp::types::definitions::ErrorCondition::Custom(
                    fe2o3_amqp::types::primitives::Symbol::from(condition.as_str()),
                ),
                Some(format!("the test peer rejects this transfer: {condition}")),
                None,
            );
            if let Err(e) = receiver.reject(&delivery, error).await {
                eprintln!("amqp peer: reject on {address} failed: {e:?}");
                return;
            }
            continue;
        }
        if !control && take_one(&arrivals.modify_next) {
            arrivals
                .in_flight
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            let modified = fe2o3_amqp::types::messaging::Modified {
                delivery_failed: Some(true),
                undeliverable_here: None,
                message_annotations: None,
            };
            if let Err(e) = receiver.modify(&delivery, modified).await {
                eprintln!("amqp peer: modify on {address} failed: {e:?}");
                return;
            }
            continue;
        }
        if !control && take_one(&arrivals.release_next) {
            arrivals
                .in_flight
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            if let Err(e) = receiver.release(&delivery).await {
                eprintln!("amqp peer: release on {address} failed: {e:?}");
                return;
            }
            continue;
        }
        if !control {
            // Stored before it is acknowledged, as a service does: a sender that
            // sees the outcome finds the message already among the arrivals.
            record_transfer(&address, delivery.message().clone(), &arrivals);
        }
        let accepted = receiver.accept(&delivery).await;
        if trace {
            eprintln!("peer: accepted on {address}: {}", accepted.is_ok());
        }
        if !control {
            arrivals
                .in_flight
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
        if let Err(e) = accepted {
            eprintln!("amqp peer: accept on {address} failed: {e:?}");
            return;
        }
        let message = delivery.into_message();
        if address == "$cbs" {
            let property = |key: &str| {
                message
                    .application_properties
                    .as_ref()
                    .and_then(|p| p.0.get(key))
                    .map(text)
            };
            if let Some(name) = property("name") {
                if let Ok(mut tokens) = arrivals.tokens.lock() {
                    tokens.push(name.clone());
                }
                let token = match &message.body {
                    Body::Value(AmqpValue(Value::String(token))) => token.clone(),
                    other => format!("{other:?}"),
                };
                if let Ok(mut puts) = arrivals.token_puts.lock() {
                    puts.push(TokenPut {
                        name,
                        token_type: property("type").unwrap_or_default(),
                        token,
                    });
                }
            }
            let answer = status_reply(202, "Accepted", Default::default(), Value::Null);
            reply_on(&reply, "$cbs", answer).await;
            continue;
        }
        if address == "$management" {
            if arrivals
                .hold_management
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                continue;
            }
            let answer = management_answer(&message, &arrivals);
            reply_on(&reply, "$management", answer).await;
            continue;
        }
    }
}

/// Records an event transfer: a batch's messages one by one, the envelope's
/// partition key on each.
fn record_transfer(address: &str, message: Message<Body<Value>>, arrivals: &Arrivals) {
    let envelope_key = message.message_annotations.as_ref().and_then(|a| {
        a.0.iter().find_map(|(k, v)| {
            format!("{k:?}")
                .contains("x-opt-partition-key")
                .then(|| match v {
                    Value::String(s) => s.clone(),
                    other => format!("{other:?}"),
                })
        })
    });
    match &message.body {
        // A batch: each data section is one serialized AMQP message.
        Body::Data(sections) if message.header.is_none() || !sections.is_empty() => {
            let inner: Vec<Message<Body<Value>>> = sections
                .iter()
                .filter_map(|d| {
                    serde_amqp::from_slice::<Deserializable<Message<Body<Value>>>>(&d.0).ok()
                })
                .map(|d| d.0)
                .collect();
            if inner.is_empty() {
                record(address, message, envelope_key, arrivals);
            } else {
                for m in inner {
                    record(address, m, envelope_key.clone(), arrivals);
                }
            }
        }
        _ => record(address, message, envelope_key, arrivals),
    }
}

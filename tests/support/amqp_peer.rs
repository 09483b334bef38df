//! A local AMQP 1.0 peer that answers what `azure_messaging_eventhubs`' producer asks
//! of Event Hubs, enough to test the AMQP sink without Azure: SASL ANONYMOUS, the
//! `$cbs` put-token exchange (status 202), a sender link with `max-message-size`, and
//! batched transfers (format 0x80013700), each accepted and recorded.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fe2o3_amqp::acceptor::{
    ConnectionAcceptor, LinkAcceptor, LinkEndpoint, SaslAnonymousMechanism, SessionAcceptor,
};
use fe2o3_amqp::types::messaging::message::__private::Deserializable;
use fe2o3_amqp::types::messaging::{ApplicationProperties, Body, Message};
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
}

/// What the peer has received.
#[derive(Debug, Clone, Default)]
pub struct Arrivals {
    pub events: Arc<Mutex<Vec<ArrivedEvent>>>,
    pub tokens: Arc<Mutex<Vec<String>>>,
    /// The event transfer with this 1-based number is never settled (a stalled
    /// send); 0 for none.
    pub hold_transfer: Arc<std::sync::atomic::AtomicUsize>,
    /// Event transfers received so far.
    pub transfers: Arc<std::sync::atomic::AtomicUsize>,
    /// The next this many event transfers are answered `Released` (not stored).
    pub release_next: Arc<std::sync::atomic::AtomicUsize>,
}

/// Takes one from a fault counter, if any is left.
fn take_one(counter: &std::sync::atomic::AtomicUsize) -> bool {
    use std::sync::atomic::Ordering;
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// Starts the peer on a loopback port; returns its `amqp://127.0.0.1:<port>` endpoint.
pub async fn start() -> (String, Arrivals) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("amqp://{}", listener.local_addr().expect("addr"));
    let arrivals = Arrivals::default();
    let shared = arrivals.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_connection(stream, shared.clone()));
        }
    });
    (endpoint, arrivals)
}

async fn serve_connection(stream: tokio::net::TcpStream, arrivals: Arrivals) {
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
    let reply: Arc<tokio::sync::Mutex<Option<Sender>>> = Arc::default();
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
            // The client's receiver: where `$cbs` replies go.
            LinkEndpoint::Sender(sender) => *reply.lock().await = Some(sender),
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
    let content_type = message.properties.and_then(|p| p.content_type).map(|s| s.0);
    if let Ok(mut events) = out.events.lock() {
        events.push(ArrivedEvent {
            address: address.to_owned(),
            body,
            content_type,
            partition_key,
            properties,
        });
    }
}

async fn serve_receiver(
    mut receiver: Receiver,
    reply: Arc<tokio::sync::Mutex<Option<Sender>>>,
    arrivals: Arrivals,
) {
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
        let number = if address == "$cbs" {
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
        if address != "$cbs" && take_one(&arrivals.release_next) {
            if let Err(e) = receiver.release(&delivery).await {
                eprintln!("amqp peer: release on {address} failed: {e:?}");
                return;
            }
            continue;
        }
        if let Err(e) = receiver.accept(&delivery).await {
            eprintln!("amqp peer: accept on {address} failed: {e:?}");
            return;
        }
        let message = delivery.into_message();
        if address == "$cbs" {
            if let Some(name) = message
                .application_properties
                .as_ref()
                .and_then(|p| p.0.get("name"))
                && let Ok(mut tokens) = arrivals.tokens.lock()
            {
                tokens.push(text(name));
            }
            // The client's reply receiver may attach just after its request sender.
            for _ in 0..3000 {
                let mut guard = reply.lock().await;
                if let Some(sender) = guard.as_mut() {
                    let answer = Message::builder()
                        .application_properties(
                            ApplicationProperties::builder()
                                .insert("status-code", 202i32)
                                .insert("status-description", "Accepted")
                                .build(),
                        )
                        .value(Value::Null)
                        .build();
                    let _ = sender.send(answer).await;
                    break;
                }
                drop(guard);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            continue;
        }
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
                    record(&address, message, envelope_key, &arrivals);
                } else {
                    for m in inner {
                        record(&address, m, envelope_key.clone(), &arrivals);
                    }
                }
            }
            _ => record(&address, message, envelope_key, &arrivals),
        }
    }
}

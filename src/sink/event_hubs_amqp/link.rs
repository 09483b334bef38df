//! The sink's own AMQP send path: a connection, claims-based authorization of each
//! destination, one sender link per destination, and each batch's outcome exactly
//! as the service settled it.
//!
//! The client library's `ProducerClient` settles a send that Event Hubs answered
//! `Released` or `Modified` as a success (with a warning in its log), though
//! neither means the service stored the events; its buffered producer reports them
//! as failures but cannot send an event larger than about half a batch. So the
//! sink sends on links of its own, built from the same AMQP crate the library is
//! built on (`azure_core_amqp`), and reads the outcome of every transfer:
//! `Accepted` is stored, `Released` and `Modified` are sent again, `Rejected` is an
//! error, definite or transient by its condition.
//!
//! What Event Hubs expects of a sender, as the library does it:
//! - the connection goes to `amqps://<namespace>` (or `sink.event_hubs_endpoint`);
//! - before a link is attached, a token for its address is put on the `$cbs` node:
//!   a shared access signature (`servicebus.windows.net:sastoken`) signed with the
//!   connection string's key for the event hub's audience and valid for an hour, the
//!   connection string's own signature, or a Microsoft Entra token (`jwt`) for
//!   `https://eventhubs.azure.net/.default`; it is put again before it expires;
//! - a batch is one AMQP message of format `0x80013700` whose body is the encoded
//!   events, one data section each, and whose header, properties, annotations and
//!   footer are the first event's (the service reads the partition key there);
//! - the address is `<hub>/Partitions/<id>` for a partition, `<hub>` for the
//!   gateway, which places a batch by the key it carries.

use std::collections::HashMap;
use std::sync::Arc;

use azure_core::credentials::{Secret, TokenCredential};
use azure_core::http::Url;
use azure_core::time::OffsetDateTime;
use azure_core_amqp::{
    AmqpClaimsBasedSecurity, AmqpClaimsBasedSecurityApis as _, AmqpConnection,
    AmqpConnectionApis as _, AmqpConnectionOptions, AmqpMessage, AmqpSendOptions, AmqpSendOutcome,
    AmqpSender, AmqpSenderApis as _, AmqpSession, AmqpSessionApis as _,
};
use azure_messaging_eventhubs::ConnectionString;
use tokio::sync::Mutex;

use super::errors::{is_definite, plain};
use super::{EventHubsCredential, SinkError, Target};

/// The AMQP message format of a batch of events (Event Hubs' batched format).
const BATCH_FORMAT: u32 = 0x8001_3700;

/// The token type of a shared access signature on the `$cbs` node.
const SAS_TOKEN_TYPE: &str = "servicebus.windows.net:sastoken";

/// The token type of a Microsoft Entra token on the `$cbs` node.
const JWT_TOKEN_TYPE: &str = "jwt";

/// The scope of a Microsoft Entra token for Event Hubs.
const EVENT_HUBS_SCOPE: &str = "https://eventhubs.azure.net/.default";

/// How long a signature the sink makes from a key is valid.
const SIGNATURE_VALIDITY: azure_core::time::Duration = azure_core::time::Duration::hours(1);

/// A token is put again when less than this is left of it.
const RENEW_BEFORE: azure_core::time::Duration = azure_core::time::Duration::minutes(5);

/// The most a batch takes where the link does not say (Event Hubs' Standard
/// tier's 1 MiB).
const DEFAULT_LINK_MAX: u64 = 1024 * 1024;

/// What a batch's transfer came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Stored.
    Accepted,
    /// Released or modified: not stored, to be sent again.
    NotAccepted(&'static str),
}

/// How the sink proves who it is.
enum Authority {
    /// A key from the connection string: the sink signs its own tokens.
    SharedKey {
        audience: String,
        key_name: String,
        key: Secret,
    },
    /// A signature given whole in the connection string (it cannot be renewed).
    Signature {
        token: Secret,
        expires_on: OffsetDateTime,
    },
    /// Microsoft Entra ID.
    Entra(Arc<dyn TokenCredential>),
}

impl Authority {
    /// A token for the `$cbs` node, its type, and when it expires.
    async fn token(&self) -> Result<(Secret, &'static str, OffsetDateTime), SinkError> {
        match self {
            Authority::SharedKey {
                audience,
                key_name,
                key,
            } => {
                let expires_on = OffsetDateTime::now_utc() + SIGNATURE_VALIDITY;
                let token = sign(audience, key_name, key, expires_on.unix_timestamp())?;
                Ok((token, SAS_TOKEN_TYPE, expires_on))
            }
            Authority::Signature { token, expires_on } => {
                if OffsetDateTime::now_utc() >= *expires_on {
                    return Err(SinkError::definite(
                        "the SharedAccessSignature in the Event Hubs connection string has expired; give a new one, or a SharedAccessKey, which the sink renews itself",
                    ));
                }
                Ok((token.clone(), SAS_TOKEN_TYPE, *expires_on))
            }
            Authority::Entra(credential) => {
                let token = credential
                    .get_token(&[EVENT_HUBS_SCOPE], None)
                    .await
                    .map_err(|e| {
                        SinkError::transient(format!(
                            "no Microsoft Entra token for Event Hubs: {}",
                            plain(&e)
                        ))
                    })?;
                Ok((token.token, JWT_TOKEN_TYPE, token.expires_on))
            }
        }
    }
}

/// A shared access signature for `audience`, valid until `expiry` (Unix seconds):
/// `HMAC-SHA256(key, lower(encode(audience)) + "\n" + expiry)`, base64, in the
/// form Event Hubs reads.
fn sign(audience: &str, key_name: &str, key: &Secret, expiry: i64) -> Result<Secret, SinkError> {
    use hmac::{Hmac, Mac as _};
    let resource = query_escape(audience).to_lowercase();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key.secret().as_bytes())
        .map_err(|_| SinkError::definite("the Event Hubs SharedAccessKey cannot sign"))?;
    mac.update(format!("{resource}\n{expiry}").as_bytes());
    let signature = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        mac.finalize().into_bytes(),
    );
    Ok(Secret::new(format!(
        "SharedAccessSignature sr={resource}&sig={}&se={expiry}&skn={key_name}",
        query_escape(&signature)
    )))
}

/// Percent-encodes all but ASCII letters, digits and `-_.~`.
fn query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A sender link and the most bytes one message may have on it, read once when
/// it attaches.
#[derive(Clone)]
struct Link {
    sender: Arc<AmqpSender>,
    max_message_size: u64,
}

/// A link and until when its address is authorized.
struct Attached {
    link: Link,
    authorized_until: OffsetDateTime,
}

/// The sink's connection to Event Hubs and its sender links.
pub(super) struct Links {
    connection: AmqpConnection,
    session: AmqpSession,
    cbs: AmqpClaimsBasedSecurity,
    authority: Authority,
    /// `amqps://<namespace>/<hub>`: a link's address is this, or this and
    /// `/Partitions/<id>`.
    hub_url: String,
    /// By address.
    attached: Mutex<HashMap<String, Attached>>,
}

impl Links {
    /// Connects and attaches the `$cbs` node; links attach on first use.
    pub(super) async fn open(target: &Target) -> Result<Links, SinkError> {
        let (namespace, authority) = match &target.credential {
            EventHubsCredential::ConnectionString(text) => {
                // The parser's errors do not quote the string.
                let parsed: ConnectionString = text.parse().map_err(|e| {
                    SinkError::definite(format!(
                        "the Event Hubs connection string cannot be read: {}",
                        plain(&e)
                    ))
                })?;
                let authority = match (
                    &parsed.shared_access_signature,
                    &parsed.shared_access_key_name,
                    &parsed.shared_access_key,
                ) {
                    (Some(token), _, _) => Authority::Signature {
                        token: token.clone(),
                        expires_on: signature_expiry(token.secret())?,
                    },
                    (None, Some(key_name), Some(key)) => Authority::SharedKey {
                        audience: format!(
                            "amqps://{}/{}",
                            parsed.fully_qualified_namespace, target.event_hub
                        ),
                        key_name: key_name.clone(),
                        key: key.clone(),
                    },
                    _ => {
                        return Err(SinkError::definite(
                            "the Event Hubs connection string has neither SharedAccessKeyName and SharedAccessKey nor SharedAccessSignature",
                        ));
                    }
                };
                (parsed.fully_qualified_namespace, authority)
            }
            EventHubsCredential::Entra {
                namespace,
                credential,
            } => (namespace.clone(), Authority::Entra(Arc::clone(credential))),
        };
        let url = Url::parse(&format!("amqps://{namespace}")).map_err(|e| {
            SinkError::definite_because(format!("the Event Hubs namespace {namespace:?}"), e)
        })?;
        let custom_endpoint = target
            .custom_endpoint
            .as_deref()
            .map(Url::parse)
            .transpose()
            .map_err(|e| SinkError::definite_because("the Event Hubs endpoint", e))?;
        let connection = AmqpConnection::new();
        connection
            .open(
                format!("mssql-ces-{}", uuid::Uuid::new_v4()),
                url,
                Some(AmqpConnectionOptions {
                    custom_endpoint,
                    ..Default::default()
                }),
            )
            .await
            .map_err(|e| amqp_error("connecting", &e))?;
        let cbs_session = AmqpSession::new();
        cbs_session
            .begin(&connection, None)
            .await
            .map_err(|e| amqp_error("opening a session", &e))?;
        let cbs = AmqpClaimsBasedSecurity::new(cbs_session)
            .map_err(|e| amqp_error("opening the $cbs node", &e))?;
        cbs.attach()
            .await
            .map_err(|e| amqp_error("attaching the $cbs node", &e))?;
        let session = AmqpSession::new();
        session
            .begin(&connection, None)
            .await
            .map_err(|e| amqp_error("opening a session", &e))?;
        Ok(Links {
            connection,
            session,
            cbs,
            authority,
            hub_url: format!("amqps://{namespace}/{}", target.event_hub),
            attached: Mutex::new(HashMap::new()),
        })
    }

    /// The address of a partition's link, or of the gateway's (`None`).
    pub(super) fn address(&self, partition: Option<&str>) -> String {
        match partition {
            Some(id) => format!("{}/Partitions/{id}", self.hub_url),
            None => self.hub_url.clone(),
        }
    }

    /// The link for `address`, attached (and its address authorized) on first use,
    /// authorized again when its token is about to expire.
    async fn link(&self, address: &str) -> Result<Link, SinkError> {
        let mut attached = self.attached.lock().await;
        let now = OffsetDateTime::now_utc();
        if let Some(known) = attached.get_mut(address) {
            if known.authorized_until - now <= RENEW_BEFORE {
                known.authorized_until = self.authorize(address).await?;
            }
            return Ok(known.link.clone());
        }
        let authorized_until = self.authorize(address).await?;
        let sender = AmqpSender::new();
        sender
            .attach(
                &self.session,
                format!("mssql-ces-sender-{}", uuid::Uuid::new_v4()),
                address.to_owned(),
                None,
            )
            .await
            .map_err(|e| amqp_error("attaching a sender", &e))?;
        let max_message_size = sender
            .max_message_size()
            .await
            .map_err(|e| amqp_error("reading the link's size", &e))?
            .filter(|n| *n > 0)
            .unwrap_or(DEFAULT_LINK_MAX);
        let link = Link {
            sender: Arc::new(sender),
            max_message_size,
        };
        attached.insert(
            address.to_owned(),
            Attached {
                link: link.clone(),
                authorized_until,
            },
        );
        Ok(link)
    }

    /// Puts a token for `address` on the `$cbs` node; when it expires.
    async fn authorize(&self, address: &str) -> Result<OffsetDateTime, SinkError> {
        let (token, token_type, expires_on) = self.authority.token().await?;
        self.cbs
            .authorize_path(
                address.to_owned(),
                Some(token_type.to_owned()),
                &token,
                expires_on,
            )
            .await
            .map_err(|e| amqp_error("authorizing", &e))?;
        Ok(expires_on)
    }

    /// The most bytes one message may have on `address`'s link.
    pub(super) async fn max_message_size(&self, address: &str) -> Result<u64, SinkError> {
        Ok(self.link(address).await?.max_message_size)
    }

    /// Sends one batch to `address` and says what became of it.
    pub(super) async fn send(
        &self,
        address: &str,
        batch: AmqpMessage,
    ) -> Result<Outcome, SinkError> {
        let outcome = self
            .link(address)
            .await?
            .sender
            .send(
                batch,
                Some(AmqpSendOptions {
                    message_format: Some(BATCH_FORMAT),
                    ..Default::default()
                }),
            )
            .await
            .map_err(|e| amqp_error("sending", &e))?;
        match outcome {
            AmqpSendOutcome::Accepted => Ok(Outcome::Accepted),
            AmqpSendOutcome::Released => Ok(Outcome::NotAccepted("released")),
            AmqpSendOutcome::Modified(_) => Ok(Outcome::NotAccepted("modified")),
            AmqpSendOutcome::Rejected(reason) => {
                let text = reason.as_ref().map_or_else(
                    || "rejected, no reason given".to_owned(),
                    |r| {
                        format!(
                            "rejected: {:?}{}",
                            r.condition,
                            r.description
                                .as_deref()
                                .map_or_else(String::new, |d| format!(": {d}"))
                        )
                    },
                );
                let definite = reason.is_some_and(|r| {
                    let error = azure_core_amqp::AmqpError::from(
                        azure_core_amqp::error::AmqpErrorKind::AmqpDescribedError(r),
                    );
                    is_definite(&error)
                });
                let text = format!("Event Hubs {text}");
                Err(if definite {
                    SinkError::definite(text)
                } else {
                    SinkError::transient(text)
                })
            }
        }
    }

    /// Closes the connection (its links and sessions with it).
    pub(super) async fn close(&self) -> Result<(), SinkError> {
        self.connection
            .close()
            .await
            .map_err(|e| amqp_error("closing", &e))
    }
}

/// An `azure_core_amqp` error while `doing`, definite or transient by its
/// condition.
fn amqp_error(doing: &str, e: &azure_core_amqp::AmqpError) -> SinkError {
    let text = format!("Event Hubs: {doing}: {}", plain(e));
    if is_definite(e) {
        SinkError::definite(text)
    } else {
        SinkError::transient(text)
    }
}

/// The expiry (`se`, Unix seconds) of a shared access signature.
fn signature_expiry(token: &str) -> Result<OffsetDateTime, SinkError> {
    token
        .strip_prefix("SharedAccessSignature ")
        .and_then(|body| body.split('&').find_map(|f| f.strip_prefix("se=")))
        .and_then(|se| se.parse::<i64>().ok())
        .and_then(|se| OffsetDateTime::from_unix_timestamp(se).ok())
        .ok_or_else(|| {
            SinkError::definite("the SharedAccessSignature in the Event Hubs connection string has no readable expiry (se=)")
        })
}

/// Events gathered into one batch message, sized as they are encoded.
pub(super) struct Batch {
    envelope: Option<AmqpMessage>,
    encoded: Vec<Vec<u8>>,
    /// The batch's encoded size so far: the envelope without its body, and each
    /// event with its data section's framing.
    size: u64,
    limit: u64,
}

/// The framing of one data section around an event: its descriptor (3 bytes) and
/// a binary's constructor and 32-bit length (5 bytes) at most.
const SECTION_FRAMING: u64 = 8;

impl Batch {
    /// An empty batch that holds at most `limit` bytes.
    pub(super) fn new(limit: u64) -> Self {
        Batch {
            envelope: None,
            encoded: Vec::new(),
            size: 0,
            limit,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.encoded.len()
    }

    /// Adds `message` if the batch can take it; false (the batch unchanged) if not.
    pub(super) fn try_add(&mut self, message: &AmqpMessage) -> Result<bool, SinkError> {
        let encoded = AmqpMessage::serialize(message)
            .map_err(|e| SinkError::definite(format!("an event cannot be encoded: {e}")))?;
        let (envelope, base) = match &self.envelope {
            Some(_) => (None, self.size),
            None => {
                let envelope = envelope_of(message);
                let bare = AmqpMessage::serialize(&envelope)
                    .map_err(|e| SinkError::definite(format!("a batch cannot be encoded: {e}")))?;
                (Some(envelope), bare.len() as u64)
            }
        };
        let size = base + encoded.len() as u64 + SECTION_FRAMING;
        if size > self.limit {
            return Ok(false);
        }
        if envelope.is_some() {
            self.envelope = envelope;
        }
        self.size = size;
        self.encoded.push(encoded);
        Ok(true)
    }

    /// The batch as one message; `None` when it holds nothing.
    pub(super) fn into_message(self) -> Option<AmqpMessage> {
        let mut envelope = self.envelope?;
        envelope.set_message_body(self.encoded);
        Some(envelope)
    }
}

/// The batch message's frame: the first event's header, properties, annotations
/// and footer, with no body.
fn envelope_of(first: &AmqpMessage) -> AmqpMessage {
    let mut builder = AmqpMessage::builder();
    if let Some(header) = &first.header {
        builder = builder.with_header(header.clone());
    }
    if let Some(properties) = &first.properties {
        builder = builder.with_properties(properties.clone());
    }
    if let Some(properties) = &first.application_properties {
        builder = builder.with_application_properties(properties.clone());
    }
    if let Some(annotations) = &first.delivery_annotations {
        builder = builder.with_delivery_annotations(annotations.clone());
    }
    if let Some(annotations) = &first.message_annotations {
        builder = builder.with_message_annotations(annotations.clone());
    }
    if let Some(footer) = &first.footer {
        builder = builder.with_footer(footer.clone());
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_signed_as_event_hubs_reads_it() {
        // HMAC-SHA256 of "amqps%3a%2f%2fns.servicebus.windows.net%2fhub\n1700000000"
        // (the resource lower-cased after encoding) under the key "key".
        let token = sign(
            "amqps://ns.servicebus.windows.net/hub",
            "RootManageSharedAccessKey",
            &Secret::new("key".to_owned()),
            1_700_000_000,
        )
        .unwrap();
        let text = token.secret();
        assert!(
            text.starts_with(
                "SharedAccessSignature sr=amqps%3a%2f%2fns.servicebus.windows.net%2fhub&sig="
            ),
            "{text}"
        );
        assert!(
            text.ends_with("&se=1700000000&skn=RootManageSharedAccessKey"),
            "{text}"
        );
        let sig = text
            .split('&')
            .find_map(|f| f.strip_prefix("sig="))
            .unwrap();
        use hmac::{Hmac, Mac as _};
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"key").unwrap();
        mac.update(b"amqps%3a%2f%2fns.servicebus.windows.net%2fhub\n1700000000");
        let expected = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            mac.finalize().into_bytes(),
        );
        assert_eq!(sig, query_escape(&expected));
        assert!(!sig.contains('+') && !sig.contains('/') && !sig.contains('='));
        assert_eq!(
            signature_expiry(text).unwrap().unix_timestamp(),
            1_700_000_000
        );
    }

    #[test]
    fn a_batch_takes_what_fits_and_is_exactly_that_size() {
        let event = |n: usize| {
            let mut message = AmqpMessage::from(vec![7u8; n]);
            message.set_message_id(azure_core::Uuid::nil());
            message
        };
        let mut batch = Batch::new(2_000);
        assert!(batch.try_add(&event(900)).unwrap());
        assert!(batch.try_add(&event(900)).unwrap());
        assert!(!batch.try_add(&event(900)).unwrap(), "over the limit");
        assert_eq!(batch.len(), 2);
        let size = batch.size;
        let message = batch.into_message().unwrap();
        let encoded = AmqpMessage::serialize(&message).unwrap().len() as u64;
        assert!(
            encoded <= size,
            "{encoded} > {size}: the count is not short"
        );
        assert!(size - encoded <= 2 * SECTION_FRAMING, "{size} vs {encoded}");
        // One event alone as large as the limit allows fits; one byte more does not.
        let mut alone = Batch::new(2_000);
        let mut n = 1_900;
        while !alone.try_add(&event(n)).unwrap() {
            n -= 1;
        }
        assert!(n > 1_850, "{n}");
        assert!(Batch::new(0).into_message().is_none());
    }
}

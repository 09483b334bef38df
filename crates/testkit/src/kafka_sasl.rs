//! A Kafka front that authenticates — SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 —
//! before one `MockCluster` broker, which does not (librdkafka's mock brokers have no
//! SASL handlers). A **test double**: it speaks the Kafka protocol only as far as a
//! client's login needs, then relays bytes.
//!
//! Per connection it
//! - relays `ApiVersions`, adding `SaslHandshake` (v0–1) and `SaslAuthenticate`
//!   (v0–1) to the broker's answer, so that a client uses them (KIP-43, KIP-152);
//! - answers `SaslHandshake` and `SaslAuthenticate` itself: PLAIN checks
//!   `\0user\0password`; SCRAM runs RFC 5802's exchange (client-first, server-first
//!   with salt and 4096 iterations, client-final with the proof checked against the
//!   stored key, server-final with the server signature). A wrong password is error
//!   58, `SASL_AUTHENTICATION_FAILED`, and the connection is closed, as Kafka does;
//! - refuses any other request before the login by closing the connection;
//! - after it, relays both ways, rewriting the broker's port in `Metadata` answers to
//!   its own, so that the client comes back through the front.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Digest;

const API_METADATA: i16 = 3;
const API_SASL_HANDSHAKE: i16 = 17;
const API_API_VERSIONS: i16 = 18;
const API_SASL_AUTHENTICATE: i16 = 36;
const SASL_AUTHENTICATION_FAILED: i16 = 58;
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;

/// A running front: connect to `address` with SASL.
pub struct SaslFront {
    pub address: String,
    /// Logins refused so far.
    pub refused: Arc<Mutex<u32>>,
}

/// Starts a front on a loopback port for the broker at `upstream` (one broker's
/// `host:port`), accepting `users` (name, password) with every mechanism.
pub fn start(upstream: &str, users: &[(&str, &str)]) -> SaslFront {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let users: Arc<HashMap<String, String>> = Arc::new(
        users
            .iter()
            .map(|(u, p)| ((*u).to_owned(), (*p).to_owned()))
            .collect(),
    );
    let upstream = upstream.to_owned();
    let upstream_port: i32 = upstream
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("upstream host:port");
    let front_port = i32::from(address.port());
    let refused = Arc::new(Mutex::new(0));
    let counter = Arc::clone(&refused);
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let (users, upstream, counter) =
                (Arc::clone(&users), upstream.clone(), Arc::clone(&counter));
            std::thread::spawn(move || {
                let _ = serve(
                    client,
                    &upstream,
                    upstream_port,
                    front_port,
                    &users,
                    &counter,
                );
            });
        }
    });
    SaslFront {
        address: address.to_string(),
        refused,
    }
}

fn read_frame(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut length = [0u8; 4];
    stream.read_exact(&mut length)?;
    let mut frame = vec![0u8; i32::from_be_bytes(length).max(0) as usize];
    stream.read_exact(&mut frame)?;
    Ok(frame)
}

fn write_frame(stream: &Mutex<TcpStream>, body: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as i32).to_be_bytes());
    out.extend_from_slice(body);
    stream.lock().expect("lock").write_all(&out)
}

/// A request's header: api key, version, correlation id, and where its body starts
/// (request header v1: the body of the non-flexible SASL requests follows the
/// client id).
fn header(frame: &[u8]) -> Option<(i16, i16, i32, usize)> {
    let key = i16::from_be_bytes(frame.get(0..2)?.try_into().ok()?);
    let version = i16::from_be_bytes(frame.get(2..4)?.try_into().ok()?);
    let correlation = i32::from_be_bytes(frame.get(4..8)?.try_into().ok()?);
    let id_length = i16::from_be_bytes(frame.get(8..10)?.try_into().ok()?);
    Some((key, version, correlation, 10 + id_length.max(0) as usize))
}

enum Login {
    Plain,
    Scram {
        sha512: bool,
        state: Option<ScramState>,
    },
}

struct ScramState {
    client_first_bare: String,
    server_first: String,
    nonce: String,
    salted: Vec<u8>,
}

fn serve(
    mut client: TcpStream,
    upstream: &str,
    upstream_port: i32,
    front_port: i32,
    users: &HashMap<String, String>,
    refused: &Mutex<u32>,
) -> std::io::Result<()> {
    let mut broker = TcpStream::connect(upstream)?;
    let writer = Arc::new(Mutex::new(client.try_clone()?));
    let mut login: Option<Login> = None;
    // The login, answered here (ApiVersions relayed and extended).
    loop {
        let frame = read_frame(&mut client)?;
        let Some((key, version, correlation, body)) = header(&frame) else {
            return Ok(());
        };
        match key {
            API_API_VERSIONS => {
                write_frame(&Mutex::new(broker.try_clone()?), &frame)?;
                let answer = read_frame(&mut broker)?;
                write_frame(&writer, &with_sasl_apis(&answer, version))?;
            }
            API_SASL_HANDSHAKE => {
                let mechanism = string_at(&frame, body).unwrap_or_default();
                login = match mechanism.as_str() {
                    "PLAIN" => Some(Login::Plain),
                    "SCRAM-SHA-256" => Some(Login::Scram {
                        sha512: false,
                        state: None,
                    }),
                    "SCRAM-SHA-512" => Some(Login::Scram {
                        sha512: true,
                        state: None,
                    }),
                    _ => None,
                };
                let mut out = correlation.to_be_bytes().to_vec();
                let code = if login.is_some() {
                    0
                } else {
                    UNSUPPORTED_SASL_MECHANISM
                };
                out.extend_from_slice(&code.to_be_bytes());
                let mechanisms = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];
                out.extend_from_slice(&(mechanisms.len() as i32).to_be_bytes());
                for m in mechanisms {
                    put_string(&mut out, m);
                }
                write_frame(&writer, &out)?;
            }
            API_SASL_AUTHENTICATE => {
                let token = bytes_at(&frame, body).unwrap_or_default();
                let step = match login.as_mut() {
                    Some(Login::Plain) => plain(&token, users).then(Vec::new).ok_or(()),
                    Some(Login::Scram { sha512, state }) => scram(*sha512, state, &token, users),
                    None => Err(()),
                };
                let mut out = correlation.to_be_bytes().to_vec();
                match &step {
                    Ok(reply) => {
                        out.extend_from_slice(&0i16.to_be_bytes());
                        out.extend_from_slice(&(-1i16).to_be_bytes());
                        out.extend_from_slice(&(reply.len() as i32).to_be_bytes());
                        out.extend_from_slice(reply);
                    }
                    Err(()) => {
                        out.extend_from_slice(&SASL_AUTHENTICATION_FAILED.to_be_bytes());
                        put_string(
                            &mut out,
                            "Authentication failed: invalid username or password",
                        );
                        out.extend_from_slice(&0i32.to_be_bytes());
                    }
                }
                if version >= 1 {
                    out.extend_from_slice(&0i64.to_be_bytes());
                }
                write_frame(&writer, &out)?;
                if step.is_err() {
                    *refused.lock().expect("lock") += 1;
                    return Ok(());
                }
                let done = match &login {
                    Some(Login::Plain) => true,
                    Some(Login::Scram { state, .. }) => state.is_none(),
                    None => false,
                };
                if done {
                    break;
                }
            }
            // Anything else before the login: a broker that authenticates closes.
            _ => return Ok(()),
        }
    }
    // Logged in: relay, rewriting Metadata's broker port.
    let asked: Arc<Mutex<HashMap<i32, (i16, i16)>>> = Arc::default();
    let (mut from_broker, to_broker) = (broker.try_clone()?, Mutex::new(broker));
    let (answers, expecting) = (Arc::clone(&writer), Arc::clone(&asked));
    std::thread::spawn(move || {
        while let Ok(mut frame) = read_frame(&mut from_broker) {
            let correlation = frame
                .get(0..4)
                .map(|b| i32::from_be_bytes(b.try_into().unwrap_or([0; 4])));
            let request = correlation.and_then(|c| expecting.lock().expect("lock").remove(&c));
            if let Some((API_METADATA, version)) = request {
                rewrite_metadata_ports(&mut frame, version, upstream_port, front_port);
            }
            if write_frame(&answers, &frame).is_err() {
                return;
            }
        }
    });
    loop {
        let frame = read_frame(&mut client)?;
        if let Some((key, version, correlation, _)) = header(&frame) {
            asked
                .lock()
                .expect("lock")
                .insert(correlation, (key, version));
        }
        write_frame(&to_broker, &frame)?;
    }
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as i16).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn string_at(frame: &[u8], at: usize) -> Option<String> {
    let length = i16::from_be_bytes(frame.get(at..at + 2)?.try_into().ok()?).max(0) as usize;
    Some(String::from_utf8_lossy(frame.get(at + 2..at + 2 + length)?).into_owned())
}

fn bytes_at(frame: &[u8], at: usize) -> Option<Vec<u8>> {
    let length = i32::from_be_bytes(frame.get(at..at + 4)?.try_into().ok()?).max(0) as usize;
    Some(frame.get(at + 4..at + 4 + length)?.to_vec())
}

/// `authzid \0 user \0 password`.
fn plain(token: &[u8], users: &HashMap<String, String>) -> bool {
    let parts: Vec<&[u8]> = token.split(|&b| b == 0).collect();
    match parts.as_slice() {
        [_, user, password] => users
            .get(String::from_utf8_lossy(user).as_ref())
            .is_some_and(|p| p.as_bytes() == *password),
        _ => false,
    }
}

fn scram(
    sha512: bool,
    state: &mut Option<ScramState>,
    token: &[u8],
    users: &HashMap<String, String>,
) -> Result<Vec<u8>, ()> {
    let hash = if sha512 { Hash::Sha512 } else { Hash::Sha256 };
    let text = String::from_utf8_lossy(token).into_owned();
    match state.take() {
        None => {
            // client-first: "n,,n=user,r=nonce"
            let bare = text.strip_prefix("n,,").ok_or(())?.to_owned();
            let field = |name: &str| {
                bare.split(',')
                    .find_map(|f| f.strip_prefix(name).map(str::to_owned))
            };
            let user = field("n=").ok_or(())?;
            let client_nonce = field("r=").ok_or(())?;
            let password = users.get(&user).cloned().unwrap_or_default();
            let salt = b"mssql-ces-test-salt".to_vec();
            let nonce = format!("{client_nonce}{}", uuid::Uuid::new_v4().simple());
            let salted = hi(hash, password.as_bytes(), &salt, 4096);
            let b64 = base64::engine::general_purpose::STANDARD;
            let server_first = format!("r={nonce},s={},i=4096", b64.encode(&salt));
            *state = Some(ScramState {
                client_first_bare: bare,
                server_first: server_first.clone(),
                nonce,
                salted,
            });
            Ok(server_first.into_bytes())
        }
        Some(s) => {
            // client-final: "c=biws,r=nonce,p=proof"
            let (without_proof, proof) = text.rsplit_once(",p=").ok_or(())?;
            if !without_proof.contains(&format!("r={}", s.nonce)) {
                return Err(());
            }
            let b64 = base64::engine::general_purpose::STANDARD;
            let proof = b64.decode(proof).map_err(|_| ())?;
            let auth = format!(
                "{},{},{}",
                s.client_first_bare, s.server_first, without_proof
            );
            let (ok, server_signature) = verify(hash, &s.salted, &auth, &proof);
            if !ok {
                return Err(());
            }
            Ok(format!("v={}", b64.encode(server_signature)).into_bytes())
        }
    }
}

/// SCRAM's hash: SHA-256 or SHA-512.
#[derive(Clone, Copy)]
enum Hash {
    Sha256,
    Sha512,
}

fn hmac(hash: Hash, key: &[u8], data: &[u8]) -> Vec<u8> {
    match hash {
        Hash::Sha256 => {
            let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        Hash::Sha512 => {
            let mut mac = Hmac::<sha2::Sha512>::new_from_slice(key).expect("any key length");
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
    }
}

fn digest(hash: Hash, data: &[u8]) -> Vec<u8> {
    match hash {
        Hash::Sha256 => sha2::Sha256::digest(data).to_vec(),
        Hash::Sha512 => sha2::Sha512::digest(data).to_vec(),
    }
}

/// RFC 5802's Hi: PBKDF2 with HMAC.
fn hi(hash: Hash, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut first = salt.to_vec();
    first.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(hash, password, &first);
    let mut out = u.clone();
    for _ in 1..iterations {
        u = hmac(hash, password, &u);
        for (o, x) in out.iter_mut().zip(&u) {
            *o ^= x;
        }
    }
    out
}

/// Whether `proof` proves the password; and the server's signature.
fn verify(hash: Hash, salted: &[u8], auth: &str, proof: &[u8]) -> (bool, Vec<u8>) {
    let client_key = hmac(hash, salted, b"Client Key");
    let stored_key = digest(hash, &client_key);
    let signature = hmac(hash, &stored_key, auth.as_bytes());
    let recovered: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
    let ok = proof.len() == signature.len() && digest(hash, &recovered) == stored_key;
    let server_key = hmac(hash, salted, b"Server Key");
    (ok, hmac(hash, &server_key, auth.as_bytes()))
}

fn uvarint(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *data.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
        shift += 7;
    }
}

fn put_uvarint(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The broker's ApiVersions answer with SaslHandshake and SaslAuthenticate (v0–1)
/// added. Its header is always v0 (the correlation id alone).
fn with_sasl_apis(answer: &[u8], version: i16) -> Vec<u8> {
    let extra = [
        (API_SASL_HANDSHAKE, 0i16, 1i16),
        (API_SASL_AUTHENTICATE, 0, 1),
    ];
    let mut out = answer[..6].to_vec(); // correlation id, error code
    let mut at = 6;
    if version >= 3 {
        let Some(count) = uvarint(answer, &mut at) else {
            return answer.to_vec();
        };
        let count = count.saturating_sub(1);
        put_uvarint(&mut out, count + extra.len() as u64 + 1);
        // Each entry: key, min, max, and an empty tag buffer.
        let entries = 7 * count as usize;
        out.extend_from_slice(&answer[at..at + entries]);
        at += entries;
        for (key, min, max) in extra {
            out.extend_from_slice(&key.to_be_bytes());
            out.extend_from_slice(&min.to_be_bytes());
            out.extend_from_slice(&max.to_be_bytes());
            out.push(0);
        }
    } else {
        let count = i32::from_be_bytes(answer[6..10].try_into().unwrap_or([0; 4]));
        at = 10;
        out.extend_from_slice(&(count + extra.len() as i32).to_be_bytes());
        let entries = 6 * count.max(0) as usize;
        out.extend_from_slice(&answer[at..at + entries]);
        at += entries;
        for (key, min, max) in extra {
            out.extend_from_slice(&key.to_be_bytes());
            out.extend_from_slice(&min.to_be_bytes());
            out.extend_from_slice(&max.to_be_bytes());
        }
    }
    out.extend_from_slice(&answer[at..]);
    out
}

/// Rewrites each broker's port in a Metadata answer from the broker's to the
/// front's (the host, 127.0.0.1, stays).
fn rewrite_metadata_ports(frame: &mut [u8], version: i16, from: i32, to: i32) {
    let flexible = version >= 9;
    let mut at = 4; // correlation id
    if flexible && uvarint(frame, &mut at).is_none() {
        return; // header tag buffer (empty)
    }
    if version >= 3 {
        at += 4; // throttle time
    }
    let count = if flexible {
        match uvarint(frame, &mut at) {
            Some(n) => n.saturating_sub(1) as usize,
            None => return,
        }
    } else {
        let Some(bytes) = frame.get(at..at + 4) else {
            return;
        };
        at += 4;
        i32::from_be_bytes(bytes.try_into().unwrap_or([0; 4])).max(0) as usize
    };
    for _ in 0..count {
        at += 4; // node id
        let host = if flexible {
            uvarint(frame, &mut at).map(|n| n.saturating_sub(1) as usize)
        } else {
            frame
                .get(at..at + 2)
                .map(|b| i16::from_be_bytes([b[0], b[1]]).max(0) as usize)
                .inspect(|_| at += 2)
        };
        let Some(host) = host else { return };
        at += host;
        if let Some(port) = frame.get_mut(at..at + 4)
            && i32::from_be_bytes([port[0], port[1], port[2], port[3]]) == from
        {
            port.copy_from_slice(&to.to_be_bytes());
        }
        at += 4;
        if version >= 1 {
            // rack: nullable string
            if flexible {
                let Some(n) = uvarint(frame, &mut at) else {
                    return;
                };
                at += n.saturating_sub(1) as usize;
                let Some(_) = uvarint(frame, &mut at) else {
                    return;
                }; // tag buffer
            } else {
                let Some(b) = frame.get(at..at + 2) else {
                    return;
                };
                let n = i16::from_be_bytes([b[0], b[1]]);
                at += 2 + n.max(0) as usize;
            }
        }
    }
}

//! A **TDS-speaking stand-in** for SQL Server on loopback: a test double that follows
//! [MS-TDS] far enough for the real driver (tiberius) to connect, log in and run
//! queries, and answers them from a handler the test gives it. It is not SQL Server:
//! it parses no SQL (the handler matches the query text the poller sends), and it
//! speaks what tiberius 0.13 uses — TDS 7.4, SQL authentication, and either no TLS
//! (`ENCRYPT_NOT_SUP`) or TLS carried in PRELOGIN packets during the handshake and
//! directly on the socket after it (`ENCRYPT_ON`, a self-signed certificate).
//!
//! Encodings, with the [MS-TDS] section each follows:
//! - packet header: 8 bytes, type, status (0x01 end of message), length big-endian,
//!   SPID, packet id, window (2.2.3.1); messages split into packets of the
//!   negotiated size;
//! - PRELOGIN (2.2.6.5): the option table, answered with VERSION, ENCRYPTION
//!   (`ENCRYPT_NOT_SUP`), INSTOPT, THREADID, MARS;
//! - LOGIN7 (2.2.6.4): the fixed part's offset/length pairs; the password
//!   de-obfuscated (each byte XOR 0xA5, then its nibbles swapped);
//! - SQLBatch (2.2.6.7) and RPC requests (2.2.6.6) after ALL_HEADERS (2.2.5.3);
//!   `sp_executesql` by ProcID 10, its parameters' TYPE_INFO (2.2.5.6) and values;
//! - tokens: LOGINACK (2.2.7.14), ENVCHANGE (2.2.7.9), COLMETADATA (2.2.7.4), ROW
//!   (2.2.7.20), DONE (2.2.7.6), ERROR (2.2.7.10); values as 2.2.5.2.3 lays them out,
//!   `(max)` types as PLP chunks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Packet types (2.2.3.1.1).
mod packet {
    pub const SQL_BATCH: u8 = 0x01;
    pub const RPC: u8 = 0x03;
    pub const REPLY: u8 = 0x04;
    pub const LOGIN7: u8 = 0x10;
    pub const PRELOGIN: u8 = 0x12;
    pub const ATTENTION: u8 = 0x06;
}

/// DONE's status bit acknowledging an Attention ([MS-TDS] 2.2.7.6: DONE_ATTN).
const DONE_ATTN: u16 = 0x0020;

const PACKET_SIZE: usize = 4096;

/// A column's type as the stand-in sends it.
#[derive(Debug, Clone)]
pub enum ColumnType {
    /// INTNTYPE of 1, 2, 4 or 8 bytes.
    Int(u8),
    Bit,
    /// BIGVARBINTYPE; `None` is `varbinary(max)` (PLP).
    VarBinary(Option<u16>),
    /// NVARCHARTYPE; `None` is `nvarchar(max)` (PLP).
    NVarChar(Option<u16>),
    /// DATETIMNTYPE of 8 bytes.
    DateTime,
    /// DATETIMNTYPE of 4 bytes.
    SmallDateTime,
    /// BIGBINARYTYPE of this length.
    Binary(u16),
    /// DECIMALNTYPE with precision and scale.
    Decimal {
        precision: u8,
        scale: u8,
    },
    /// FLTNTYPE of 4 or 8 bytes.
    Float(u8),
    /// DATENTYPE.
    Date,
    /// TIMENTYPE, DATETIME2NTYPE, DATETIMEOFFSETNTYPE with their scale.
    Time(u8),
    DateTime2(u8),
    DateTimeOffset(u8),
    /// GUIDTYPE.
    Guid,
    /// BIGVARCHRTYPE of this length with this collation (2.2.5.1.2: LCID and flags
    /// in four bytes little-endian — bit 26 is fUTF8 — then the sort id).
    VarChar {
        length: u16,
        collation: [u8; 5],
    },
}

/// Bytes of a `time(n)` value (2.2.5.5.1.8): 3 up to scale 2, 4 up to 4, else 5.
fn time_bytes(scale: u8) -> usize {
    match scale {
        0..=2 => 3,
        3..=4 => 4,
        _ => 5,
    }
}

/// Bytes of a `decimal(p, s)` value after its sign byte (2.2.5.5.1.6).
fn decimal_bytes(precision: u8) -> usize {
    match precision {
        0..=9 => 4,
        10..=19 => 8,
        20..=28 => 12,
        _ => 16,
    }
}

#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub column_type: ColumnType,
}

impl Column {
    pub fn new(name: &str, column_type: ColumnType) -> Self {
        Column {
            name: name.into(),
            column_type,
        }
    }
}

/// One value of a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Bit(bool),
    Bytes(Vec<u8>),
    Text(String),
    /// `datetime`: days since 1900-01-01 and 1/300-second ticks since midnight.
    DateTime {
        days: i32,
        ticks: u32,
    },
    /// `smalldatetime`: days since 1900-01-01 and minutes since midnight.
    SmallDateTime {
        days: u16,
        minutes: u16,
    },
    /// `decimal`: the unscaled value (the column's scale applies).
    Decimal(i128),
    Float(f64),
    /// `date`: days since 0001-01-01.
    Date(u32),
    /// `time(n)`: 10^-n second units since midnight.
    Time(u64),
    /// `datetime2(n)`: the time units and the days since 0001-01-01.
    DateTime2 {
        units: u64,
        days: u32,
    },
    /// `datetimeoffset(n)`: UTC time units and days, and the offset in minutes.
    DateTimeOffset {
        units: u64,
        days: u32,
        offset: i16,
    },
    /// A `uniqueidentifier` in its wire order (the first three groups little-endian).
    Guid([u8; 16]),
}

#[derive(Debug, Clone, Default)]
pub struct ResultSet {
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<Cell>>,
}

/// What the stand-in does with a request.
#[derive(Debug, Clone)]
pub enum Reply {
    Rows(Vec<ResultSet>),
    /// An ERROR token with this number, severity and text, then DONE with the error bit.
    Error {
        number: u32,
        class: u8,
        message: String,
    },
    /// Closes the connection without answering.
    Drop,
    /// Sends part of the answer, then closes the connection (mid-result).
    DropMidResult(Vec<ResultSet>),
    /// Never answers (the connection stays open).
    Hang,
    /// Answers after a pause.
    Slow(Duration, Box<Reply>),
    /// An answer encoded before ([`encode_reply`]): its bytes are sent as they are,
    /// so that replaying it costs the stand-in next to nothing (benchmarks of the
    /// client side).
    Raw(Arc<Vec<u8>>),
}

/// The token stream a [`Reply::Rows`] or [`Reply::Error`] answers with, to a
/// request sent as an RPC (`rpc`, a query with parameters) or a batch; `None` for
/// the other replies.
pub fn encode_reply(reply: &Reply, rpc: bool) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match reply {
        Reply::Rows(sets) => result_sets(&mut out, sets, rpc),
        Reply::Error {
            number,
            class,
            message,
        } => {
            error_token(&mut out, *number, *class, message);
            if rpc {
                done_token(&mut out, 0xFE, 0x02, 0);
            } else {
                done(&mut out, 0x02, 0);
            }
        }
        _ => return None,
    }
    Some(out)
}

/// A parameter of an RPC request.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

/// A query as the driver sent it.
#[derive(Debug, Clone)]
pub struct Request {
    pub sql: String,
    /// `@P1`, `@P2`, … in order (RPC only).
    pub params: Vec<Param>,
    /// The connection runs over TLS (what `CONNECTIONPROPERTY('encrypt_option')` says).
    pub encrypted: bool,
    /// The connection's session (`@@SPID`): numbered from 1 in the order of logins.
    pub session: u64,
    /// The sessions whose connections are open now: what a handler that models
    /// session-owned state (application locks) needs to release it with the session.
    pub sessions: Sessions,
    /// The login asked for a read-only intent (LOGIN7 `TypeFlags` fReadOnlyIntent,
    /// [MS-TDS] 2.2.6.4: `ApplicationIntent=ReadOnly`).
    pub read_only_intent: bool,
    /// Sent as an RPC (a query with parameters), not a SQL batch.
    pub rpc: bool,
}

/// The stand-in's sessions that are live (logged in, connection open). A session
/// ends when its connection closes, either side, as SQL Server ends it.
#[derive(Debug, Clone, Default)]
pub struct Sessions {
    state: Arc<std::sync::Mutex<(u64, std::collections::BTreeSet<u64>)>>,
}

impl Sessions {
    fn begin(&self) -> SessionGuard {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0 += 1;
        let id = state.0;
        state.1.insert(id);
        SessionGuard {
            id,
            sessions: self.clone(),
        }
    }

    pub fn is_live(&self, session: u64) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.1.contains(&session)
    }
}

/// Ends its session when the connection's task ends.
struct SessionGuard {
    id: u64,
    sessions: Sessions,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let mut state = self
            .sessions
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        state.1.remove(&self.id);
    }
}

pub type Handler = Arc<dyn Fn(&Request) -> Reply + Send + Sync>;

/// The stand-in, listening on a loopback port.
pub struct StandIn {
    pub address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    attentions: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StandIn {
    /// Listens on 127.0.0.1 (a free port) for logins as `user`/`password` and answers
    /// queries with `handler`.
    pub async fn start(user: &str, password: &str, handler: Handler) -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0", user, password, handler).await
    }

    /// As [`StandIn::start`], on a given address.
    pub async fn start_on(
        address: &str,
        user: &str,
        password: &str,
        handler: Handler,
    ) -> std::io::Result<Self> {
        Self::listen(address, user, password, handler, None).await
    }

    /// As [`StandIn::start`], offering TLS with `tls` (see [`self_signed_tls`]): a
    /// client that asks for encryption gets it, as from SQL Server.
    pub async fn start_tls(
        user: &str,
        password: &str,
        handler: Handler,
        tls: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<Self> {
        Self::listen("127.0.0.1:0", user, password, handler, Some(tls)).await
    }

    /// As [`StandIn::start_tls`], on a given address.
    pub async fn start_tls_on(
        address: &str,
        user: &str,
        password: &str,
        handler: Handler,
        tls: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<Self> {
        Self::listen(address, user, password, handler, Some(tls)).await
    }

    async fn listen(
        address: &str,
        user: &str,
        password: &str,
        handler: Handler,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(address).await?;
        let address = listener.local_addr()?;
        let credentials = Arc::new((user.to_owned(), password.to_owned()));
        let sessions = Sessions::default();
        let attentions = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&attentions);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let handler = Arc::clone(&handler);
                let credentials = Arc::clone(&credentials);
                let tls = tls.clone();
                let sessions = sessions.clone();
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let _ = serve(stream, &credentials, handler, tls, (sessions, counted)).await;
                });
            }
        });
        Ok(StandIn {
            address,
            task,
            attentions,
        })
    }

    /// How many TDS Attention messages (a client cancelling its request) arrived.
    pub fn attentions(&self) -> usize {
        self.attentions.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// An ADO.NET connection string for this stand-in.
    pub fn connection_string(&self, user: &str, password: &str) -> String {
        format!(
            "Server=tcp:127.0.0.1,{};Database=CesDemo;User Id={user};Password={password};Encrypt=false",
            self.address.port()
        )
    }
}

/// The connection: plain TCP, or TLS over it once the handshake is done (then every
/// TDS packet travels inside TLS records, as with `Encrypt=true`).
struct Channel {
    tcp: TcpStream,
    tls: Option<rustls::ServerConnection>,
    /// Decrypted bytes not read yet.
    plain: std::collections::VecDeque<u8>,
}

fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl Channel {
    async fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        let Some(tls) = self.tls.as_mut() else {
            self.tcp.read_exact(buf).await?;
            return Ok(());
        };
        while self.plain.len() < buf.len() {
            let mut chunk = [0u8; 16 * 1024];
            match std::io::Read::read(&mut tls.reader(), &mut chunk) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.plain.extend(&chunk[..n]);
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            let n = self.tcp.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            // `read_tls` takes at most a few KiB a call: feed all of it.
            let mut rest = &chunk[..n];
            while !rest.is_empty() {
                tls.read_tls(&mut rest)?;
                tls.process_new_packets().map_err(io_error)?;
            }
        }
        let wanted = buf.len();
        for (to, from) in buf.iter_mut().zip(self.plain.drain(..wanted)) {
            *to = from;
        }
        Ok(())
    }

    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let Some(tls) = self.tls.as_mut() else {
            return self.tcp.write_all(bytes).await;
        };
        std::io::Write::write_all(&mut tls.writer(), bytes)?;
        let mut out = Vec::new();
        while tls.wants_write() {
            tls.write_tls(&mut out)?;
        }
        self.tcp.write_all(&out).await
    }
}

/// The TLS handshake inside PRELOGIN packets (2.2.6.5: "the TLS/SSL payload is
/// carried in PRELOGIN messages" until the handshake completes), then TLS directly
/// on the socket. TLS 1.3 session tickets are off: the client stops wrapping once
/// its handshake is done, so anything sent after would reach it unwrapped-expected.
async fn tls_handshake(
    channel: &mut Channel,
    config: Arc<rustls::ServerConfig>,
) -> std::io::Result<()> {
    let mut conn = rustls::ServerConnection::new(config).map_err(io_error)?;
    // A reply of any size is handed over at once (rustls buffers 64 KiB by default).
    conn.set_buffer_limit(None);
    let flush = |conn: &mut rustls::ServerConnection| -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out)?;
        }
        Ok(out)
    };
    while conn.is_handshaking() {
        let out = flush(&mut conn)?;
        if !out.is_empty() {
            write_message(channel, packet::PRELOGIN, &out).await?;
        }
        let (_, payload) = read_message(channel).await?;
        let mut rest = &payload[..];
        while !rest.is_empty() {
            conn.read_tls(&mut rest)?;
            conn.process_new_packets().map_err(io_error)?;
        }
    }
    // TLS 1.2 ends with the server's Finished, still wrapped.
    let out = flush(&mut conn)?;
    if !out.is_empty() {
        write_message(channel, packet::PRELOGIN, &out).await?;
    }
    channel.tls = Some(conn);
    Ok(())
}

/// A TLS configuration with a self-signed certificate for `localhost`, made now.
pub fn self_signed_tls() -> Result<Arc<rustls::ServerConfig>, String> {
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .map_err(|e| e.to_string())?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    // TLS 1.2, as SQL Server negotiates it inside TDS 7.x PRELOGIN (1.3 comes with
    // TDS 8's strict encryption, which this stand-in does not speak).
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .map_err(|e| e.to_string())?;
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// Reads one message (its packets up to end-of-message): its type and payload.
async fn read_message(stream: &mut Channel) -> std::io::Result<(u8, Vec<u8>)> {
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; 8];
        stream.read_exact(&mut header).await?;
        let length = usize::from(u16::from_be_bytes([header[2], header[3]]));
        let mut body = vec![0u8; length.saturating_sub(8)];
        stream.read_exact(&mut body).await?;
        payload.extend_from_slice(&body);
        if header[1] & 0x01 != 0 {
            return Ok((header[0], payload));
        }
    }
}

/// Writes `payload` as a reply message in packets of the negotiated size.
async fn write_message(stream: &mut Channel, kind: u8, payload: &[u8]) -> std::io::Result<()> {
    let chunk = PACKET_SIZE - 8;
    let parts: Vec<&[u8]> = if payload.is_empty() {
        vec![&[]]
    } else {
        payload.chunks(chunk).collect()
    };
    let last = parts.len() - 1;
    let mut out = Vec::with_capacity(payload.len() + 8 * parts.len());
    for (i, part) in parts.into_iter().enumerate() {
        out.push(kind);
        out.push(u8::from(i == last));
        out.extend_from_slice(&((part.len() + 8) as u16).to_be_bytes());
        out.extend_from_slice(&[0, 0, ((i + 1) % 256) as u8, 0]);
        out.extend_from_slice(part);
    }
    stream.write_all(&out).await
}

fn utf16(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

fn from_utf16(bytes: &[u8]) -> String {
    let units: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    String::from_utf16_lossy(&units)
}

/// B_VARCHAR: a one-byte count of UTF-16 units, then the units.
fn b_varchar(out: &mut Vec<u8>, text: &str) {
    let units = utf16(text);
    out.push((units.len() / 2) as u8);
    out.extend_from_slice(&units);
}

/// US_VARCHAR: a two-byte count of UTF-16 units, then the units.
fn us_varchar(out: &mut Vec<u8>, text: &str) {
    let units = utf16(text);
    out.extend_from_slice(&((units.len() / 2) as u16).to_le_bytes());
    out.extend_from_slice(&units);
}

/// The ENCRYPTION option of a client's PRELOGIN (2.2.6.5), if it sent one.
fn requested_encryption(prelogin: &[u8]) -> Option<u8> {
    let mut at = 0;
    while let Some(&token) = prelogin.get(at) {
        if token == 0xFF {
            return None;
        }
        let offset = usize::from(u16::from_be_bytes([
            *prelogin.get(at + 1)?,
            *prelogin.get(at + 2)?,
        ]));
        if token == 0x01 {
            return prelogin.get(offset).copied();
        }
        at += 5;
    }
    None
}

/// The PRELOGIN answer (2.2.6.5): option table, then the data it points at.
/// `encryption`: ENCRYPT_ON (0x01) or ENCRYPT_NOT_SUP (0x02).
fn prelogin_reply(encryption: u8) -> Vec<u8> {
    // VERSION 16.0.4135 (6 bytes), ENCRYPTION (1), INSTOPT "" (1),
    // THREADID (empty from a server), MARS off (1).
    let options: [(u8, Vec<u8>); 5] = [
        (0x00, vec![16, 0, 0x10, 0x27, 0, 0]),
        (0x01, vec![encryption]),
        (0x02, vec![0x00]),
        (0x03, Vec::new()),
        (0x04, vec![0x00]),
    ];
    let table_len = options.len() * 5 + 1;
    let mut table = Vec::new();
    let mut data = Vec::new();
    for (token, value) in &options {
        table.push(*token);
        table.extend_from_slice(&((table_len + data.len()) as u16).to_be_bytes());
        table.extend_from_slice(&(value.len() as u16).to_be_bytes());
        data.extend_from_slice(value);
    }
    table.push(0xFF);
    table.extend_from_slice(&data);
    table
}

/// User name and password from a LOGIN7 record (2.2.6.4).
fn login_credentials(login: &[u8]) -> Option<(String, String)> {
    let field = |at: usize| -> Option<&[u8]> {
        let offset = usize::from(u16::from_le_bytes([*login.get(at)?, *login.get(at + 1)?]));
        let chars = usize::from(u16::from_le_bytes([
            *login.get(at + 2)?,
            *login.get(at + 3)?,
        ]));
        login.get(offset..offset + 2 * chars)
    };
    let user = from_utf16(field(40)?);
    // The password travels obfuscated: each byte's nibbles swapped, then XOR 0xA5.
    let clear: Vec<u8> = field(44)?
        .iter()
        .map(|b| {
            let x = b ^ 0xA5;
            x.rotate_left(4)
        })
        .collect();
    Some((user, from_utf16(&clear)))
}

fn done(out: &mut Vec<u8>, status: u16, rows: u64) {
    done_token(out, 0xFD, status, rows);
}

/// DONE (0xFD), DONEINPROC (0xFF) or DONEPROC (0xFE): status, current command, rows.
fn done_token(out: &mut Vec<u8>, token: u8, status: u16, rows: u64) {
    out.push(token);
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&rows.to_le_bytes());
}

fn error_token(out: &mut Vec<u8>, number: u32, class: u8, message: &str) {
    let mut body = Vec::new();
    body.extend_from_slice(&number.to_le_bytes());
    body.push(1); // state
    body.push(class);
    us_varchar(&mut body, message);
    b_varchar(&mut body, "standin");
    b_varchar(&mut body, "");
    body.extend_from_slice(&1u32.to_le_bytes());
    out.push(0xAA);
    out.extend_from_slice(&(body.len() as u16).to_le_bytes());
    out.extend_from_slice(&body);
}

fn login_ack(out: &mut Vec<u8>) {
    let mut body = vec![0x01];
    body.extend_from_slice(&0x7400_0004u32.to_be_bytes());
    b_varchar(&mut body, "Microsoft SQL Server");
    body.extend_from_slice(&[16, 0, 0x10, 0x27]);
    out.push(0xAD);
    out.extend_from_slice(&(body.len() as u16).to_le_bytes());
    out.extend_from_slice(&body);
}

/// ENVCHANGE of the database (type 1) and the packet size (type 4).
fn env_changes(out: &mut Vec<u8>) {
    for (kind, new, old) in [(1u8, "CesDemo", "master"), (4u8, "4096", "4096")] {
        let mut body = vec![kind];
        b_varchar(&mut body, new);
        b_varchar(&mut body, old);
        out.push(0xE3);
        out.extend_from_slice(&(body.len() as u16).to_le_bytes());
        out.extend_from_slice(&body);
    }
}

/// The collation of text columns: SQL_Latin1_General_CP1_CI_AS (LCID 0x0409, sort id 52).
const COLLATION: [u8; 5] = [0x09, 0x04, 0xD0, 0x00, 0x34];

fn col_metadata(out: &mut Vec<u8>, columns: &[Column]) {
    out.push(0x81);
    out.extend_from_slice(&(columns.len() as u16).to_le_bytes());
    for c in columns {
        out.extend_from_slice(&0u32.to_le_bytes()); // UserType
        out.extend_from_slice(&0x0001u16.to_le_bytes()); // Flags: nullable
        match c.column_type {
            ColumnType::Int(len) => out.extend_from_slice(&[0x26, len]),
            ColumnType::Bit => out.extend_from_slice(&[0x68, 1]),
            ColumnType::VarBinary(max) => {
                out.push(0xA5);
                out.extend_from_slice(&max.unwrap_or(0xFFFF).to_le_bytes());
            }
            ColumnType::NVarChar(max) => {
                out.push(0xE7);
                out.extend_from_slice(&max.map_or(0xFFFF, |m| m * 2).to_le_bytes());
                out.extend_from_slice(&COLLATION);
            }
            ColumnType::DateTime => out.extend_from_slice(&[0x6F, 8]),
            ColumnType::SmallDateTime => out.extend_from_slice(&[0x6F, 4]),
            ColumnType::Binary(len) => {
                out.push(0xAD);
                out.extend_from_slice(&len.to_le_bytes());
            }
            ColumnType::Decimal { precision, scale } => out.extend_from_slice(&[
                0x6A,
                (decimal_bytes(precision) + 1) as u8,
                precision,
                scale,
            ]),
            ColumnType::Float(len) => out.extend_from_slice(&[0x6D, len]),
            ColumnType::Date => out.push(0x28),
            ColumnType::Time(scale) => out.extend_from_slice(&[0x29, scale]),
            ColumnType::DateTime2(scale) => out.extend_from_slice(&[0x2A, scale]),
            ColumnType::DateTimeOffset(scale) => out.extend_from_slice(&[0x2B, scale]),
            ColumnType::Guid => out.extend_from_slice(&[0x24, 16]),
            ColumnType::VarChar { length, collation } => {
                out.push(0xA7);
                out.extend_from_slice(&length.to_le_bytes());
                out.extend_from_slice(&collation);
            }
        }
        b_varchar(out, &c.name);
    }
}

/// A value as the column's type lays it out; `(max)` types as PLP in chunks.
fn value(out: &mut Vec<u8>, column: &ColumnType, cell: &Cell) {
    let plp = |out: &mut Vec<u8>, bytes: Option<&[u8]>| match bytes {
        None => out.extend_from_slice(&u64::MAX.to_le_bytes()),
        Some(bytes) => {
            out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            for chunk in bytes.chunks(1000) {
                out.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
                out.extend_from_slice(chunk);
            }
            out.extend_from_slice(&0u32.to_le_bytes());
        }
    };
    let short = |out: &mut Vec<u8>, bytes: Option<&[u8]>| match bytes {
        None => out.extend_from_slice(&0xFFFFu16.to_le_bytes()),
        Some(bytes) => {
            out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
            out.extend_from_slice(bytes);
        }
    };
    let le_units = |out: &mut Vec<u8>, units: u64, bytes: usize| {
        out.extend_from_slice(&units.to_le_bytes()[..bytes]);
    };
    match (column, cell) {
        (
            ColumnType::Int(_)
            | ColumnType::Bit
            | ColumnType::DateTime
            | ColumnType::SmallDateTime
            | ColumnType::Decimal { .. }
            | ColumnType::Float(_)
            | ColumnType::Date
            | ColumnType::Time(_)
            | ColumnType::DateTime2(_)
            | ColumnType::DateTimeOffset(_)
            | ColumnType::Guid,
            Cell::Null,
        ) => out.push(0),
        (ColumnType::SmallDateTime, Cell::SmallDateTime { days, minutes }) => {
            out.push(4);
            out.extend_from_slice(&days.to_le_bytes());
            out.extend_from_slice(&minutes.to_le_bytes());
        }
        (ColumnType::Binary(_) | ColumnType::VarChar { .. }, Cell::Bytes(b)) => short(out, Some(b)),
        (ColumnType::VarChar { .. }, Cell::Null) => short(out, None),
        (ColumnType::Binary(_), Cell::Null) => short(out, None),
        (ColumnType::Decimal { precision, .. }, Cell::Decimal(n)) => {
            let len = decimal_bytes(*precision);
            out.push((len + 1) as u8);
            out.push(u8::from(*n >= 0));
            out.extend_from_slice(&n.unsigned_abs().to_le_bytes()[..len]);
        }
        (ColumnType::Float(8), Cell::Float(f)) => {
            out.push(8);
            out.extend_from_slice(&f.to_le_bytes());
        }
        (ColumnType::Float(_), Cell::Float(f)) => {
            out.push(4);
            out.extend_from_slice(&(*f as f32).to_le_bytes());
        }
        (ColumnType::Date, Cell::Date(days)) => {
            out.push(3);
            le_units(out, u64::from(*days), 3);
        }
        (ColumnType::Time(scale), Cell::Time(units)) => {
            let len = time_bytes(*scale);
            out.push(len as u8);
            le_units(out, *units, len);
        }
        (ColumnType::DateTime2(scale), Cell::DateTime2 { units, days }) => {
            let len = time_bytes(*scale);
            out.push((len + 3) as u8);
            le_units(out, *units, len);
            le_units(out, u64::from(*days), 3);
        }
        (
            ColumnType::DateTimeOffset(scale),
            Cell::DateTimeOffset {
                units,
                days,
                offset,
            },
        ) => {
            let len = time_bytes(*scale);
            out.push((len + 5) as u8);
            le_units(out, *units, len);
            le_units(out, u64::from(*days), 3);
            out.extend_from_slice(&offset.to_le_bytes());
        }
        (ColumnType::Guid, Cell::Guid(bytes)) => {
            out.push(16);
            out.extend_from_slice(bytes);
        }
        (ColumnType::Int(len), Cell::Int(n)) => {
            out.push(*len);
            out.extend_from_slice(&n.to_le_bytes()[..usize::from(*len)]);
        }
        (ColumnType::Bit, Cell::Bit(b)) => out.extend_from_slice(&[1, u8::from(*b)]),
        (ColumnType::DateTime, Cell::DateTime { days, ticks }) => {
            out.push(8);
            out.extend_from_slice(&days.to_le_bytes());
            out.extend_from_slice(&ticks.to_le_bytes());
        }
        (ColumnType::VarBinary(None), Cell::Bytes(b)) => plp(out, Some(b)),
        (ColumnType::VarBinary(None) | ColumnType::NVarChar(None), Cell::Null) => plp(out, None),
        (ColumnType::VarBinary(Some(_)), Cell::Bytes(b)) => short(out, Some(b)),
        (ColumnType::NVarChar(None), Cell::Text(t)) => plp(out, Some(&utf16(t))),
        (ColumnType::NVarChar(Some(_)), Cell::Text(t)) => short(out, Some(&utf16(t))),
        (ColumnType::VarBinary(Some(_)) | ColumnType::NVarChar(Some(_)), Cell::Null) => {
            short(out, None)
        }
        (column, cell) => panic!("stand-in: a {cell:?} in a {column:?} column"),
    }
}

/// The result sets of a batch (each ending in DONE, 2.2.7.6) or of an RPC, where
/// each statement of the procedure ends in DONEINPROC (2.2.7.7) and the call in
/// RETURNSTATUS (2.2.7.18, status 0) and DONEPROC (2.2.7.8), as `sp_executesql`
/// answers.
fn result_sets(out: &mut Vec<u8>, sets: &[ResultSet], rpc: bool) {
    for (i, set) in sets.iter().enumerate() {
        col_metadata(out, &set.columns);
        for row in &set.rows {
            out.push(0xD1);
            for (column, cell) in set.columns.iter().zip(row) {
                value(out, &column.column_type, cell);
            }
        }
        // DONE_MORE (0x01) between sets, DONE_COUNT (0x10) on each.
        let more = if i + 1 < sets.len() || rpc { 0x01 } else { 0 };
        if rpc {
            done_token(out, 0xFF, 0x10 | more, set.rows.len() as u64);
        } else {
            done(out, 0x10 | more, set.rows.len() as u64);
        }
    }
    if rpc {
        out.push(0x79);
        out.extend_from_slice(&0i32.to_le_bytes());
        done_token(out, 0xFE, 0, 0);
    } else if sets.is_empty() {
        done(out, 0, 0);
    }
}

/// ALL_HEADERS' length comes first and counts itself (2.2.5.3).
fn skip_all_headers(payload: &[u8]) -> &[u8] {
    let total = payload
        .get(..4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
    payload.get(total..).unwrap_or_default()
}

/// Reads one RPC parameter value after its TYPE_INFO (2.2.5.6, 2.2.6.6).
fn read_param(data: &[u8], at: &mut usize) -> Option<Param> {
    let byte = |at: &mut usize| -> Option<u8> {
        let b = *data.get(*at)?;
        *at += 1;
        Some(b)
    };
    let take = |at: &mut usize, n: usize| -> Option<&[u8]> {
        let s = data.get(*at..*at + n)?;
        *at += n;
        Some(s)
    };
    let u16le = |at: &mut usize| -> Option<u16> {
        let s = take(at, 2)?;
        Some(u16::from_le_bytes([s[0], s[1]]))
    };
    let type_byte = byte(at)?;
    match type_byte {
        // NULLTYPE: no length, no value (how the driver sends a NULL of no type).
        0x1F => Some(Param::Null),
        // INTNTYPE, BITNTYPE: max length, then a length-prefixed value.
        0x26 | 0x68 => {
            let _max = byte(at)?;
            let len = usize::from(byte(at)?);
            if len == 0 {
                return Some(Param::Null);
            }
            let bytes = take(at, len)?;
            let mut wide = [0u8; 8];
            wide[..len].copy_from_slice(bytes);
            let mut n = i64::from_le_bytes(wide);
            if len < 8 && bytes[len - 1] & 0x80 != 0 && type_byte == 0x26 {
                n -= 1i64 << (8 * len);
            }
            Some(Param::Int(n))
        }
        // Fixed INT4 / INT8.
        0x38 => Some(Param::Int(i64::from(i32::from_le_bytes(
            take(at, 4)?.try_into().ok()?,
        )))),
        0x7F => Some(Param::Int(i64::from_le_bytes(
            take(at, 8)?.try_into().ok()?,
        ))),
        // NVARCHARTYPE, NCHARTYPE (with collation), BIGVARBINTYPE, BIGBINARYTYPE.
        0xE7 | 0xEF | 0xA5 | 0xAD => {
            let max = u16le(at)?;
            if matches!(type_byte, 0xE7 | 0xEF) {
                take(at, 5)?;
            }
            let bytes = if max == 0xFFFF {
                let total = u64::from_le_bytes(take(at, 8)?.try_into().ok()?);
                if total == u64::MAX {
                    return Some(Param::Null);
                }
                let mut bytes = Vec::new();
                loop {
                    let n = u32::from_le_bytes(take(at, 4)?.try_into().ok()?) as usize;
                    if n == 0 {
                        break;
                    }
                    bytes.extend_from_slice(take(at, n)?);
                }
                bytes
            } else {
                let n = u16le(at)?;
                if n == 0xFFFF {
                    return Some(Param::Null);
                }
                take(at, usize::from(n))?.to_vec()
            };
            Some(if matches!(type_byte, 0xE7 | 0xEF) {
                Param::Text(from_utf16(&bytes))
            } else {
                Param::Bytes(bytes)
            })
        }
        // A type whose value this stand-in cannot skip: the request is not parsed
        // (an error names it) rather than misread.
        _ => None,
    }
}

/// An RPC request (2.2.6.6): `sp_executesql` by ProcID 10, then `@stmt`, `@params`
/// and the values.
fn parse_rpc(payload: &[u8]) -> Option<Request> {
    let data = skip_all_headers(payload);
    let mut at = 0;
    let name_len = u16::from_le_bytes([*data.first()?, *data.get(1)?]);
    at += 2;
    if name_len != 0xFFFF {
        return None;
    }
    let proc_id = u16::from_le_bytes([*data.get(at)?, *data.get(at + 1)?]);
    at += 2;
    if proc_id != 10 {
        return None;
    }
    at += 2; // option flags
    let mut values = Vec::new();
    while at < data.len() {
        let name_chars = usize::from(*data.get(at)?);
        at += 1 + 2 * name_chars + 1; // name, status flags
        values.push(read_param(data, &mut at)?);
    }
    let mut values = values.into_iter();
    let sql = match values.next()? {
        Param::Text(sql) => sql,
        _ => return None,
    };
    let _declarations = values.next();
    Some(Request {
        sql,
        params: values.collect(),
        encrypted: false,
        session: 0,
        sessions: Sessions::default(),
        read_only_intent: false,
        rpc: true,
    })
}

async fn serve(
    tcp: TcpStream,
    credentials: &(String, String),
    handler: Handler,
    tls: Option<Arc<rustls::ServerConfig>>,
    (sessions, attentions): (Sessions, Arc<std::sync::atomic::AtomicUsize>),
) -> std::io::Result<()> {
    tcp.set_nodelay(true)?;
    let mut stream = Channel {
        tcp,
        tls: None,
        plain: Default::default(),
    };
    let (kind, prelogin) = read_message(&mut stream).await?;
    if kind != packet::PRELOGIN {
        return Ok(());
    }
    // ENCRYPT_OFF (0), ENCRYPT_ON (1) or ENCRYPT_REQ (3) from the client: TLS when
    // this stand-in has it; ENCRYPT_NOT_SUP (2): none.
    let wants_tls = requested_encryption(&prelogin).is_some_and(|e| e != 0x02);
    let tls = tls.filter(|_| wants_tls);
    let answer = if tls.is_some() { 0x01 } else { 0x02 };
    write_message(&mut stream, packet::REPLY, &prelogin_reply(answer)).await?;
    if let Some(config) = tls {
        tls_handshake(&mut stream, config).await?;
    }
    let (kind, login) = read_message(&mut stream).await?;
    if kind != packet::LOGIN7 {
        return Ok(());
    }
    let mut out = Vec::new();
    // TypeFlags, the 27th byte of LOGIN7: bit 5 is fReadOnlyIntent.
    let read_only_intent = login.get(26).is_some_and(|flags| flags & 0x20 != 0);
    match login_credentials(&login) {
        Some((user, password)) if user == credentials.0 && password == credentials.1 => {
            env_changes(&mut out);
            login_ack(&mut out);
            done(&mut out, 0, 0);
            write_message(&mut stream, packet::REPLY, &out).await?;
        }
        Some((user, _)) => {
            error_token(
                &mut out,
                18456,
                14,
                &format!("Login failed for user '{user}'."),
            );
            done(&mut out, 0x02, 0);
            write_message(&mut stream, packet::REPLY, &out).await?;
            return Ok(());
        }
        None => return Ok(()),
    }
    let session = sessions.begin();
    loop {
        let (kind, payload) = read_message(&mut stream).await?;
        if kind == packet::ATTENTION {
            // Nothing in flight any more: acknowledge it.
            attentions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut out = Vec::new();
            done(&mut out, DONE_ATTN, 0);
            write_message(&mut stream, packet::REPLY, &out).await?;
            continue;
        }
        let encrypted = stream.tls.is_some();
        let rpc = kind == packet::RPC;
        let request = match kind {
            packet::SQL_BATCH => Request {
                sql: from_utf16(skip_all_headers(&payload)),
                params: Vec::new(),
                encrypted,
                session: session.id,
                sessions: sessions.clone(),
                read_only_intent,
                rpc: false,
            },
            packet::RPC => match parse_rpc(&payload) {
                Some(mut request) => {
                    request.encrypted = encrypted;
                    request.session = session.id;
                    request.sessions = sessions.clone();
                    request.read_only_intent = read_only_intent;
                    request
                }
                None => {
                    let mut out = Vec::new();
                    error_token(&mut out, 2812, 16, "stand-in: an RPC it does not know");
                    done(&mut out, 0x02, 0);
                    write_message(&mut stream, packet::REPLY, &out).await?;
                    continue;
                }
            },
            _ => return Ok(()),
        };
        let mut reply = handler(&request);
        let mut cancelled = false;
        loop {
            match reply {
                Reply::Slow(pause, then) => {
                    // As SQL Server, a request still being worked on can be cancelled
                    // by an Attention (the only message a client sends meanwhile; a
                    // read cut short by the pause's end loses nothing then).
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        message = read_message(&mut stream) => {
                            if message?.0 == packet::ATTENTION {
                                attentions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                cancelled = true;
                            }
                        }
                    }
                    reply = *then;
                    if cancelled {
                        break;
                    }
                }
                other => {
                    reply = other;
                    break;
                }
            }
        }
        let mut out = Vec::new();
        if cancelled {
            done(&mut out, DONE_ATTN, 0);
            write_message(&mut stream, packet::REPLY, &out).await?;
            continue;
        }
        // Rows and errors: their tokens as `encode_reply` gives them.
        if let Some(tokens) = encode_reply(&reply, rpc) {
            write_message(&mut stream, packet::REPLY, &tokens).await?;
            continue;
        }
        match reply {
            Reply::Raw(bytes) => {
                write_message(&mut stream, packet::REPLY, &bytes).await?;
                continue;
            }
            Reply::Rows(_) | Reply::Error { .. } => unreachable!("encoded above"),
            Reply::Drop => return Ok(()),
            Reply::DropMidResult(sets) => {
                // Half of the answer in a packet that does not end the message, then
                // the connection closes.
                result_sets(&mut out, &sets, rpc);
                out.truncate((out.len() / 2).min(PACKET_SIZE - 8));
                let mut packet = vec![packet::REPLY, 0x00];
                packet.extend_from_slice(&((out.len() + 8) as u16).to_be_bytes());
                packet.extend_from_slice(&[0, 0, 1, 0]);
                packet.extend_from_slice(&out);
                stream.write_all(&packet).await?;
                return Ok(());
            }
            Reply::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return Ok(());
            }
            Reply::Slow(..) => unreachable!("unwrapped above"),
        }
    }
}

/// A query the handler does not know: an error that names it, so a new query can
/// never pass silently.
pub fn unknown(request: &Request) -> Reply {
    Reply::Error {
        number: 50000,
        class: 16,
        message: format!("stand-in: no answer for the query `{}`", request.sql),
    }
}

#[cfg(test)]
mod tests {
    //! The stand-in's own wire pieces against [MS-TDS]: the double is only worth what
    //! it follows.
    use super::*;

    #[test]
    fn the_prelogin_answer_is_an_option_table_whose_encryption_reads_back() {
        for encryption in [0x01, 0x02] {
            let reply = prelogin_reply(encryption);
            // 2.2.6.5: five 5-byte entries, the 0xFF terminator, then the data; the
            // first entry (VERSION) points just past the table.
            assert_eq!(reply[0], 0x00);
            assert_eq!(u16::from_be_bytes([reply[1], reply[2]]), 26);
            assert_eq!(reply[25], 0xFF);
            assert_eq!(requested_encryption(&reply), Some(encryption));
        }
        // A PRELOGIN without the ENCRYPTION option asks for none.
        assert_eq!(requested_encryption(&[0x00, 0, 6, 0, 0, 0xFF]), None);
        // A truncated table is not read past its end.
        assert_eq!(requested_encryption(&[0x01, 0]), None);
    }

    #[test]
    fn done_tokens_are_13_bytes_with_little_endian_counts() {
        // 2.2.7.6 (TDS 7.2 and later): token, Status u16, CurCmd u16, DoneRowCount u64.
        let mut out = Vec::new();
        done(&mut out, 0x0010, 0x0102_0304_0506_0708);
        assert_eq!(out, [0xFD, 0x10, 0x00, 0x00, 0x00, 8, 7, 6, 5, 4, 3, 2, 1]);
    }

    #[test]
    fn a_login7_password_is_unscrambled_as_the_client_scrambles_it() {
        // 2.2.6.4: each byte of the UTF-16 password has its nibbles swapped, then is
        // XORed with 0xA5. A LOGIN7 body with the user at offset 94 and the password
        // after it (the offsets sit at 40 and 44 of the fixed part).
        let scramble =
            |clear: &[u8]| -> Vec<u8> { clear.iter().map(|b| b.rotate_left(4) ^ 0xA5).collect() };
        let user = utf16("mssql_ces");
        let password = scramble(&utf16("Pässwörd!😀"));
        let mut login = vec![0u8; 94];
        let put = |login: &mut Vec<u8>, at: usize, offset: usize, bytes: usize| {
            login[at..at + 2].copy_from_slice(&(offset as u16).to_le_bytes());
            login[at + 2..at + 4].copy_from_slice(&((bytes / 2) as u16).to_le_bytes());
        };
        put(&mut login, 40, 94, user.len());
        put(&mut login, 44, 94 + user.len(), password.len());
        login.extend_from_slice(&user);
        login.extend_from_slice(&password);
        assert_eq!(
            login_credentials(&login),
            Some(("mssql_ces".to_owned(), "Pässwörd!😀".to_owned()))
        );
        assert_eq!(login_credentials(&login[..60]), None, "a cut record");
    }

    #[test]
    fn a_self_signed_certificate_is_made_for_each_run() {
        assert!(self_signed_tls().is_ok());
    }
}

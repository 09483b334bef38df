//! One SQL Server connection type, used by the CDC source and by the table checkpoint
//! store alike (so it depends on neither), with one policy for time-outs, reconnects and error classification.
//!
//! - Connects from an ADO.NET connection string with TLS required by default
//!   (`trust_server_certificate` only when configured; `Encrypt=strict` in the string
//!   selects TDS 8.0). TCP connect and the TLS/login handshake are bounded by
//!   `connect_timeout`, every query by `query_timeout`; TCP keepalive is on, so a
//!   silently dropped peer is noticed.
//! - A failed connection is dropped; the next query opens a new one.
//! - Errors are classified by SQL Server error number: the transient numbers of
//!   Microsoft.Data.SqlClient's retry logic (`SqlConfigurableRetryFactory`'s baseline
//!   list) and broken connections are retried by the caller; the rest are definite,
//!   each saying what to change.
//! - The connection string holds a password: it is never logged or put in an error,
//!   and no connection string can make the driver panic (conflicting trust settings
//!   are refused here first).

use std::fmt;
use std::time::Duration;

use crate::error::{Cause, cause};
use tiberius::{Client, Config, EncryptionLevel, Row, ToSql};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

/// The ADO.NET keys that name the server (synonyms).
const SERVER_KEYS: &[&str] = &[
    "server",
    "data source",
    "address",
    "addr",
    "network address",
];

/// `ApplicationIntent` and its synonym.
const APPLICATION_INTENT_KEYS: &[&str] = &["applicationintent", "application intent"];

/// A connection string: its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionString(String);

impl ConnectionString {
    pub fn new(value: impl Into<String>) -> Self {
        ConnectionString(value.into())
    }

    /// The secret itself, for the driver only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The server and the database it names (not secrets: for the log).
    pub fn server_and_database(&self) -> (Option<String>, Option<String>) {
        (self.setting(SERVER_KEYS), self.setting(DATABASE_KEYS))
    }

    /// Whether it asks for a read-only intent (`ApplicationIntent=ReadOnly`), with
    /// which an availability group listener routes it to a readable secondary.
    pub fn read_only_intent(&self) -> bool {
        self.setting(APPLICATION_INTENT_KEYS)
            .is_some_and(|v| v.eq_ignore_ascii_case("readonly"))
    }

    /// The same string without its application intent: read-write, which a
    /// listener routes to the primary.
    pub fn read_write(&self) -> ConnectionString {
        let kept: Vec<&str> = self
            .0
            .split(';')
            .filter(|pair| {
                pair.split_once('=').is_none_or(|(key, _)| {
                    !APPLICATION_INTENT_KEYS.contains(&key.trim().to_ascii_lowercase().as_str())
                })
            })
            .collect();
        ConnectionString(kept.join(";"))
    }

    /// The same string naming `database` (`Database=`, in place of any
    /// `Database=` or `Initial Catalog=` it had). The name is one the server listed
    /// and has none of `;{}'"` (the supervisor skips such names).
    pub fn with_database(&self, database: &str) -> ConnectionString {
        let mut kept: Vec<&str> = self
            .0
            .split(';')
            .filter(|pair| {
                pair.split_once('=').is_none_or(|(key, _)| {
                    !DATABASE_KEYS.contains(&key.trim().to_ascii_lowercase().as_str())
                })
            })
            .filter(|pair| !pair.trim().is_empty())
            .collect();
        let named = format!("Database={database}");
        kept.push(&named);
        ConnectionString(kept.join(";"))
    }

    /// The value of `key` (case-insensitive, any of its synonyms), if present.
    /// Its keywords, lower case, in order: `key=value` parts split at `;` outside a
    /// value quoted with `{…}`, `"…"` or `'…'` (where a password may hold `;`).
    fn keywords(&self) -> Vec<String> {
        let mut keys = Vec::new();
        let mut rest = self.0.as_str();
        while !rest.is_empty() {
            let Some(eq) = rest.find('=') else {
                if !rest.trim().trim_matches(';').trim().is_empty() {
                    keys.push(rest.trim().to_ascii_lowercase());
                }
                break;
            };
            // Parts before the key with no `=` of their own are keywords too (and
            // unknown ones).
            for key in rest[..eq].split(';') {
                let key = key.trim();
                if !key.is_empty() {
                    keys.push(key.to_ascii_lowercase());
                }
            }
            let value = rest[eq + 1..].trim_start();
            let close = match value.chars().next() {
                Some('{') => Some('}'),
                Some(q @ ('"' | '\'')) => Some(q),
                _ => None,
            };
            let end = match close {
                Some(close) => value[1..].find(close).map_or(value.len(), |at| 1 + at + 1),
                None => 0,
            };
            rest = match value[end..].find(';') {
                Some(at) => &value[end + at + 1..],
                None => "",
            };
        }
        keys
    }

    /// The first keyword SqlClient does not know, if any (the keyword alone: its
    /// value may be a secret), and whether a server is named.
    pub fn check_keywords(&self) -> Result<(), String> {
        let keys = self.keywords();
        if let Some(unknown) = keys.iter().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "source.connection_string has the keyword `{unknown}`, which SQL Server's clients do not know: correct it (Server, Database, User Id, Password, Encrypt, TrustServerCertificate, ApplicationIntent, …)"
            ));
        }
        if !keys.iter().any(|k| SERVER_KEYS.contains(&k.as_str())) {
            return Err(
                "source.connection_string names no server: add Server=tcp:host,1433".to_owned(),
            );
        }
        Ok(())
    }

    fn setting(&self, keys: &[&str]) -> Option<String> {
        self.0.split(';').find_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            let key = key.trim().to_ascii_lowercase();
            keys.contains(&key.as_str())
                .then(|| value.trim().trim_matches(['\'', '"']).to_owned())
        })
    }
}

/// The keys that name the database.
const DATABASE_KEYS: &[&str] = &["database", "initial catalog"];

/// Every keyword Microsoft.Data.SqlClient's connection strings take, with their
/// synonyms (`SqlConnectionStringBuilder`), lower case; and `TrustServerCertificateCA`,
/// which the driver takes besides. Any other keyword is a mistake, never ignored: a
/// misspelt `Server` would connect to `localhost`, a misspelt `Password` log in
/// without one.
const KNOWN_KEYS: &[&str] = &[
    "server",
    "data source",
    "address",
    "addr",
    "network address",
    "database",
    "initial catalog",
    "user id",
    "uid",
    "user",
    "password",
    "pwd",
    "integrated security",
    "trusted_connection",
    "authentication",
    "encrypt",
    "trustservercertificate",
    "trust server certificate",
    "trustservercertificateca",
    "hostnameincertificate",
    "host name in certificate",
    "servercertificate",
    "server certificate",
    "applicationintent",
    "application intent",
    "application name",
    "app",
    "multisubnetfailover",
    "multi subnet failover",
    "failover partner",
    "connect timeout",
    "connection timeout",
    "timeout",
    "command timeout",
    "connectretrycount",
    "connect retry count",
    "connectretryinterval",
    "connect retry interval",
    "packet size",
    "workstation id",
    "wsid",
    "current language",
    "language",
    "persist security info",
    "persistsecurityinfo",
    "pooling",
    "max pool size",
    "min pool size",
    "load balance timeout",
    "connection lifetime",
    "poolblockingperiod",
    "pool blocking period",
    "enlist",
    "multipleactiveresultsets",
    "multiple active result sets",
    "replication",
    "transaction binding",
    "type system version",
    "user instance",
    "attachdbfilename",
    "extended properties",
    "initial file name",
    "column encryption setting",
    "attestation protocol",
    "enclave attestation url",
    "ipaddresspreference",
    "ip address preference",
    "network library",
    "network",
    "net",
];

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConnectionString(<redacted>)")
    }
}

/// How to reach the database.
#[derive(Debug, Clone)]
pub struct SqlServerConfig {
    pub connection_string: ConnectionString,
    /// Accept the server's certificate without validating it (self-signed test
    /// servers only).
    pub trust_server_certificate: bool,
    /// Require TLS (default). Turning it off sends the password in clear.
    pub encrypt: bool,
    /// Bound on TCP connect plus the TLS and login handshake.
    pub connect_timeout: Duration,
    /// Bound on every query, from sending it to the last row.
    pub query_timeout: Duration,
}

/// A TDS connection.
pub type TdsClient = Client<Compat<TcpStream>>;

/// SQL Server error numbers that mean "try again": Microsoft.Data.SqlClient's
/// baseline transient list (`SqlConfigurableRetryFactory`) — 1204 lock resources,
/// 1205 deadlock victim, 1222 lock request time-out, 233/997/10060 connection
/// broken or timed out, 4060 database unavailable, 4221, 10928/10929 and 40501
/// resource limits, 40143/40197/40540/40613/42108/42109/49918–49920 Azure SQL
/// failover and service busy — plus the socket errors 64, 10053 and 10054; and what
/// EF Core's `SqlServerTransientExceptionDetector` adds for failovers, patches and
/// throttling that our users meet: 921 database not yet recovered, 941/952 database
/// being started or in transition, 18401 server in script-upgrade mode (patching),
/// 17197 login timed out during startup, 3947/3948/3966 transaction aborted by an
/// availability-group role change, 8628/8645/8651 memory-grant or resource waits
/// timed out, 10930/10936 and 40189 resource limits, 40642 and 40675 Azure SQL busy
/// or failing over, 49802 database unavailable during an upgrade. The
/// availability-group errors 976, 978 and 983 (not readable on this replica, readable
/// only with a read-only intent, replica resolving) are transient during a failover
/// but may never pass: see [`PERSISTENT_ERRORS`].
pub const TRANSIENT_ERRORS: &[u32] = &[
    64, 233, 921, 941, 952, 976, 978, 983, 997, 1204, 1205, 1222, 3947, 3948, 3966, 4060, 4221,
    8628, 8645, 8651, 10053, 10054, 10060, 10928, 10929, 10930, 10936, 17197, 18401, 40143, 40189,
    40197, 40501, 40540, 40613, 40642, 40675, 42108, 42109, 49802, 49918, 49919, 49920,
];

/// Transient errors that can also be a setting to fix, retried only for a while:
/// the error number, how long it may persist, and what to fix when it does.
pub const PERSISTENT_ERRORS: &[(u32, Duration, &str)] = &[
    (
        976,
        Duration::from_secs(120),
        "this replica does not allow reads: connect through the availability group listener to the primary, or allow reads on the secondary (ALTER AVAILABILITY GROUP … SECONDARY_ROLE (ALLOW_CONNECTIONS = READ_ONLY))",
    ),
    (
        978,
        Duration::from_secs(120),
        "this secondary allows reads only with a read-only intent: add ApplicationIntent=ReadOnly to source.connection_string",
    ),
    (
        983,
        Duration::from_secs(120),
        "the replica is neither primary nor secondary (resolving): connect through the availability group listener",
    ),
    (
        4060,
        Duration::from_secs(60),
        "check Database= in source.connection_string and that the login is a user of that database",
    ),
];

/// Permission errors: 229/230 permission denied on an object or column, 262 permission
/// denied in database, 297/300 a missing server permission, 916 no access to database,
/// 22904 a CDC procedure run without `db_owner` ("DBO privileges are required").
pub(crate) const PERMISSION_ERRORS: &[u32] = &[229, 230, 262, 297, 300, 916, 22904];

/// What a failed connection or query means for the caller; the source reports it as
/// it is (as `SourceError::Sql`). The driver's or the system's own
/// error, when there is one, is kept as the `source`, not copied into the message.
/// `Clone` because a shared cause is cheap to clone: a connection's verdict is
/// handed to each database that asked through it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SqlErrorKind {
    /// Connection loss, time-out, deadlock victim, throttling: retry with backoff.
    #[error("transient database error: {message}")]
    Transient {
        message: String,
        #[source]
        cause: Option<Cause>,
    },
    #[error(
        "login failed for the configured user: check source.connection_string (user and password)"
    )]
    LoginFailed,
    #[error(
        "permission denied: {message}. Grant the poller's user what `sql/03_least_privilege_login.sql` grants"
    )]
    PermissionDenied { message: String },
    /// Retrying the same request cannot help; the message says what to change.
    #[error("database error: {message}")]
    Definite {
        message: String,
        #[source]
        cause: Option<Cause>,
    },
}

impl SqlErrorKind {
    /// A failure that retrying can cure, with no lower error behind it.
    pub fn transient(message: impl Into<String>) -> Self {
        SqlErrorKind::Transient {
            message: message.into(),
            cause: None,
        }
    }

    /// A failure that retrying cannot cure, with no lower error behind it.
    pub fn definite(message: impl Into<String>) -> Self {
        SqlErrorKind::Definite {
            message: message.into(),
            cause: None,
        }
    }

    /// True when retrying the same request can succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SqlErrorKind::Transient { .. })
    }
}

/// A failed query: what to do about it, and the server's error number if it sent one.
#[derive(Debug, Clone)]
pub struct SqlError {
    pub code: Option<u32>,
    pub error: SqlErrorKind,
}

/// Shown as its kind: the number is in the kind's message where it helps.
impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for SqlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

/// The error a server answer with this number and text is: what [`classify`]
/// makes of a server's error token (for test doubles that answer as SQL Server).
pub fn server_error(code: u32, message: &str) -> SqlError {
    SqlError {
        code: Some(code),
        error: classify_server_error(code, message),
    }
}

/// Maps a driver error to a [`SqlErrorKind`].
pub fn classify(error: &tiberius::error::Error) -> SqlError {
    use tiberius::error::Error as E;
    let error = match error {
        // The server answered PRELOGIN without the encryption asked for: retrying
        // cannot change its configuration.
        E::Protocol(message) if message.contains("encryption level") => SqlErrorKind::Definite {
            cause: None,
            message: format!(
                "{message} The server does not offer TLS: enable encryption on the server, or set source.encrypt = false (only on a network you trust)"
            ),
        },
        E::Io { .. } | E::Protocol(_) | E::Routing { .. } => SqlErrorKind::Transient {
            message: "the connection to SQL Server failed".into(),
            cause: Some(cause(error.clone())),
        },
        // The driver's own text is left out: its advice is for programmers.
        E::Tls(message) => SqlErrorKind::Definite {
            cause: None,
            message: format!(
                "TLS handshake failed: {}. To trust the server: name the CA that signed its certificate with TrustServerCertificateCA=<path to the .pem or .crt> in source.connection_string, or (only on a network you trust) set source.trust_server_certificate = true, which accepts any certificate",
                tls_reason(message)
            ),
        },
        E::Server(token) => {
            return SqlError {
                code: Some(token.code()),
                error: classify_server_error(token.code(), token.message()),
            };
        }
        other => SqlErrorKind::Definite {
            message: "the SQL Server driver failed".into(),
            cause: Some(cause(other.clone())),
        },
    };
    SqlError { code: None, error }
}

/// Maps a SQL Server error number and message to a [`SqlErrorKind`].
fn classify_server_error(code: u32, message: &str) -> SqlErrorKind {
    let message = message.to_owned();
    match code {
        18456 => SqlErrorKind::LoginFailed,
        c if TRANSIENT_ERRORS.contains(&c) => SqlErrorKind::transient(message),
        c if PERMISSION_ERRORS.contains(&c) => SqlErrorKind::PermissionDenied { message },
        _ => SqlErrorKind::definite(format!("SQL Server error {code}: {message}")),
    }
}

/// The driver's TLS error without its advice, which is for programmers
/// (`Config::trust_cert_ca(path)`, building the driver another way): the operator is
/// told which settings to change instead.
fn tls_reason(message: &str) -> &str {
    let reason = message
        .split(" To connect anyway")
        .next()
        .unwrap_or(message);
    reason.trim().trim_end_matches('.')
}

/// Whether a run could use these settings: what connecting would refuse at once is
/// found here, before anything is contacted. The reason never quotes the string.
pub fn validate(settings: &SqlServerConfig) -> Result<(), String> {
    driver_config(settings).map(drop).map_err(|e| match e {
        SqlErrorKind::Definite { message, .. } => message,
        other => other.to_string(),
    })
}

/// The driver's configuration, refusing what would make it panic or hang.
fn driver_config(settings: &SqlServerConfig) -> Result<Config, SqlErrorKind> {
    let cs = &settings.connection_string;
    cs.check_keywords().map_err(SqlErrorKind::definite)?;
    let server = cs.setting(SERVER_KEYS);
    if let Some(server) = &server {
        let server = server.trim_start_matches("tcp:");
        if server
            .split(',')
            .next()
            .is_none_or(|host| host.trim().is_empty())
        {
            return Err(SqlErrorKind::definite(
                "source.connection_string has an empty Server: give the host (Server=tcp:host,1433)",
            ));
        }
        if let Some((_, instance)) = server.split_once('\\')
            && !instance.contains(',')
        {
            return Err(SqlErrorKind::definite(format!(
                "source.connection_string names the instance `{instance}` without a port; SQL Browser is not supported: give the instance's TCP port instead (Server=tcp:host,PORT)"
            )));
        }
    }
    let pins_ca = cs.setting(&["trustservercertificateca"]).is_some();
    if settings.trust_server_certificate && pins_ca {
        return Err(SqlErrorKind::definite(
            "source.trust_server_certificate = true conflicts with TrustServerCertificateCA in source.connection_string: use one of them",
        ));
    }
    let strict = cs
        .setting(&["encrypt"])
        .is_some_and(|v| v.eq_ignore_ascii_case("strict"));
    // The parse error could quote the string, which holds a password: not shown.
    let mut config = Config::from_ado_string(cs.expose()).map_err(|_| {
        SqlErrorKind::definite("source.connection_string is not a valid ADO.NET connection string (e.g. Server=tcp:host,1433;Database=db;User Id=user;Password=...)")
    })?;
    config.application_name("mssql-ces");
    if !strict {
        config.encryption(if settings.encrypt {
            EncryptionLevel::Required
        } else {
            EncryptionLevel::NotSupported
        });
    }
    if settings.trust_server_certificate {
        config.trust_cert();
    }
    Ok(config)
}

/// Opens a connection (TLS as configured; one Azure SQL redirect followed), bounded
/// by `connect_timeout`.
pub async fn connect(settings: &SqlServerConfig) -> Result<TdsClient, SqlError> {
    let config = driver_config(settings).map_err(|error| SqlError { code: None, error })?;
    let limit = settings.connect_timeout;
    let parallel = settings
        .connection_string
        .setting(&["multisubnetfailover", "multi subnet failover"])
        .is_some_and(|v| v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("yes"));
    match tokio::time::timeout(limit, connect_unbounded(config, parallel)).await {
        Ok(result) => result,
        Err(_) => Err(SqlError {
            code: None,
            error: SqlErrorKind::transient(format!(
                "connecting and logging in took longer than {} ms (source.connect_timeout_ms)",
                limit.as_millis()
            )),
        }),
    }
}

/// Opens TCP to `addr`. With `parallel` (`MultiSubnetFailover=True`), to every
/// address the name resolves to at once, keeping the first that answers, as
/// SqlClient does: a multi-subnet availability group listener resolves to one
/// address per subnet, and only the active subnet's answers — tried in turn, a dead
/// first address would use up the connect time-out. Otherwise the addresses in
/// turn.
async fn open_tcp(addr: &str, parallel: bool) -> std::io::Result<TcpStream> {
    if !parallel {
        return TcpStream::connect(addr).await;
    }
    let addresses: Vec<std::net::SocketAddr> = tokio::net::lookup_host(addr).await?.collect();
    first_connected(addresses.into_iter().map(TcpStream::connect).collect()).await
}

/// The first attempt that succeeds; the others are dropped (cancelled). When all
/// fail, the last error.
async fn first_connected<T, F>(attempts: Vec<F>) -> std::io::Result<T>
where
    F: std::future::Future<Output = std::io::Result<T>>,
{
    use futures_util::StreamExt as _;
    let mut pending: futures_util::stream::FuturesUnordered<F> = attempts.into_iter().collect();
    let mut last = None;
    while let Some(attempt) = pending.next().await {
        match attempt {
            Ok(connected) => return Ok(connected),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("the name resolves to no address")))
}

async fn connect_unbounded(mut config: Config, parallel: bool) -> Result<TdsClient, SqlError> {
    let transient = |message: String, error: std::io::Error| SqlError {
        code: None,
        error: SqlErrorKind::Transient {
            message,
            cause: Some(cause(error)),
        },
    };
    // Azure SQL may redirect to another node once.
    for _ in 0..2 {
        let addr = config.get_addr();
        let tcp = open_tcp(&addr, parallel)
            .await
            .map_err(|e| transient(format!("cannot connect to {addr}"), e))?;
        tcp.set_nodelay(true)
            .map_err(|e| transient("cannot set TCP_NODELAY".into(), e))?;
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(30))
            .with_interval(Duration::from_secs(10));
        socket2::SockRef::from(&tcp)
            .set_tcp_keepalive(&keepalive)
            .map_err(|e| transient("cannot set TCP keepalive".into(), e))?;
        match Client::connect(config.clone(), tcp.compat_write()).await {
            Ok(client) => return Ok(client),
            Err(tiberius::error::Error::Routing { host, port }) => {
                config.host(&host);
                config.port(port);
            }
            Err(e) => return Err(classify(&e)),
        }
    }
    Err(SqlError {
        code: None,
        error: SqlErrorKind::transient("the server redirected the connection more than once"),
    })
}

/// A connection that opens itself on first use and after a failure.
pub struct SqlConnection {
    settings: SqlServerConfig,
    client: Option<TdsClient>,
    connected_before: bool,
    /// Connections opened so far: session state (an application lock) lives only as
    /// long as one generation.
    generation: u64,
    /// A [`PERSISTENT_ERRORS`] error every attempt has met since then.
    persisting: Option<(u32, std::time::Instant)>,
}

impl SqlConnection {
    /// Keeps count of an error that may never pass: while one of
    /// [`PERSISTENT_ERRORS`] persists, it stays transient (with its fix named) up to
    /// its bound; after it, it is definite. 4060 (cannot open the database) is
    /// bounded only until a first connection worked: after that the name is right
    /// and the database is coming back (a restore, a failover). Another error resets
    /// the count; so does a success ([`SqlConnection::query`]).
    fn persisted(&mut self, mut e: SqlError, now: std::time::Instant) -> SqlError {
        let bounded = e.code.and_then(|c| {
            PERSISTENT_ERRORS
                .iter()
                .find(|(p, _, _)| *p == c && !(c == 4060 && self.connected_before))
        });
        let Some(&(code, bound, fix)) = bounded else {
            self.persisting = None;
            return e;
        };
        let since = match self.persisting {
            Some((seen, since)) if seen == code => since,
            _ => {
                self.persisting = Some((code, now));
                now
            }
        };
        let (message, cause) = match &e.error {
            SqlErrorKind::Transient { message, cause }
            | SqlErrorKind::Definite { message, cause } => (message.clone(), cause.clone()),
            other => (other.to_string(), None),
        };
        e.error = if now.duration_since(since) >= bound {
            SqlErrorKind::Definite {
                message: format!(
                    "SQL Server error {code} for {} s: {message} ({fix})",
                    bound.as_secs()
                ),
                cause,
            }
        } else {
            SqlErrorKind::Transient {
                message: format!(
                    "{message} (error {code}; retried for up to {} s, then the run stops: {fix})",
                    bound.as_secs()
                ),
                cause,
            }
        };
        e
    }
}

impl SqlConnection {
    pub fn new(settings: SqlServerConfig) -> Self {
        SqlConnection {
            settings,
            client: None,
            connected_before: false,
            generation: 0,
            persisting: None,
        }
    }

    /// Counts the connections opened: a change means a new session.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a connection is open now.
    pub fn is_open(&self) -> bool {
        self.client.is_some()
    }

    pub fn settings(&self) -> &SqlServerConfig {
        &self.settings
    }

    /// Runs one query and returns its first result set, (re)connecting first when
    /// needed. A transient failure or a time-out drops the connection (its stream
    /// is in an unknown state), so the next call opens a new one.
    pub async fn query(&mut self, sql: &str, params: &[&dyn ToSql]) -> Result<Vec<Row>, SqlError> {
        if self.client.is_none() {
            let client = connect(&self.settings)
                .await
                .map_err(|e| self.persisted(e, std::time::Instant::now()))?;
            self.client = Some(client);
            self.connected_before = true;
            self.generation += 1;
        }
        let Some(client) = self.client.as_mut() else {
            return Err(SqlError {
                code: None,
                error: SqlErrorKind::transient("no connection"),
            });
        };
        let run = async {
            match client.query(sql, params).await {
                Ok(stream) => stream.into_first_result().await,
                Err(e) => Err(e),
            }
        };
        let limit = self.settings.query_timeout;
        let result = match tokio::time::timeout(limit, run).await {
            Ok(result) => result.map_err(|e| classify(&e)),
            Err(_) => Err(SqlError {
                code: None,
                error: SqlErrorKind::transient(format!(
                    "a query took longer than {} ms (source.query_timeout_ms)",
                    limit.as_millis()
                )),
            }),
        };
        let result = match result {
            Ok(rows) => {
                self.persisting = None;
                Ok(rows)
            }
            Err(e) => Err(self.persisted(e, std::time::Instant::now())),
        };
        if let Err(e) = &result
            && e.error.is_transient()
            && !keeps_session(e)
        {
            self.client = None;
        }
        result
    }
}

/// Whether the session survives a failed query: after a deadlock (1205, the
/// transaction rolled back) or a lock timeout (1222) the server answered and the
/// session is as it was, so it is kept — with the session-owned application lock of
/// the checkpoint lease. Anything else transient (a dropped connection, a query that
/// timed out mid-response, throttling that is followed by a close) starts a new one.
fn keeps_session(e: &SqlError) -> bool {
    matches!(e.code, Some(1205 | 1222))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_string_for_another_database_names_it_once() {
        let original =
            ConnectionString::new("Server=tcp:h,1433;Initial Catalog=Old;User Id=u;Password=p;");
        let moved = original.with_database("Tenant 7");
        assert_eq!(
            moved.server_and_database(),
            (Some("tcp:h,1433".into()), Some("Tenant 7".into()))
        );
        assert_eq!(moved.expose().matches("=").count(), 4, "{}", moved.expose());
        assert!(moved.expose().contains("Password=p"));
        let without = ConnectionString::new("Server=h;User Id=u;Password=p");
        assert_eq!(
            without.with_database("A").server_and_database().1,
            Some("A".into())
        );
    }

    #[test]
    fn a_deadlock_or_lock_timeout_keeps_the_session_anything_else_transient_drops_it() {
        let transient = |code| SqlError {
            code,
            error: SqlErrorKind::transient("x"),
        };
        assert!(keeps_session(&transient(Some(1205))));
        assert!(keeps_session(&transient(Some(1222))));
        assert!(!keeps_session(&transient(Some(40613))));
        assert!(!keeps_session(&transient(None)));
    }

    fn settings(connection_string: &str) -> SqlServerConfig {
        SqlServerConfig {
            connection_string: ConnectionString::new(connection_string),
            trust_server_certificate: false,
            encrypt: true,
            connect_timeout: Duration::from_secs(1),
            query_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn connection_strings_never_print() {
        let config = settings("Server=db;User Id=sa;Password=hunter2");
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn a_malformed_connection_string_error_does_not_quote_it() {
        let err = driver_config(&settings("Server=tcp:db,notaport;Password='hunter2"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("source.connection_string"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    /// A misspelt keyword or no server is refused, naming the keyword, never its
    /// value; a quoted password may hold `;` and `=`.
    #[test]
    fn keywords_sql_server_s_clients_do_not_know_are_refused_by_name() {
        let err = validate(&settings("Srvr=tcp:db,1433;User Id=u;Passwort=hunter2"))
            .expect_err("a misspelt keyword");
        assert!(err.contains("`srvr`") && !err.contains("hunter2"), "{err}");
        let err = validate(&settings("Server=tcp:db,1433;User Id=u;Passwort=hunter2"))
            .expect_err("a misspelt keyword");
        assert!(
            err.contains("`passwort`") && !err.contains("hunter2"),
            "{err}"
        );
        let err =
            validate(&settings("Database=x;User Id=u;Password=hunter2")).expect_err("no server");
        assert!(
            err.contains("names no server") && !err.contains("hunter2"),
            "{err}"
        );
        for fine in [
            "Server=tcp:db,1433;Initial Catalog=x;uid=u;pwd={a;b=c};Encrypt=strict;",
            "Data Source=db,1433; User ID = u ; Password=\"x;y\";Application Name=z;MultiSubnetFailover=True",
            "server=db,1433;database=x;Integrated Security=false;user=u;password='p;q';Connect Timeout=5",
        ] {
            assert_eq!(validate(&settings(fine)), Ok(()), "{fine}");
        }
    }

    #[test]
    fn a_named_instance_without_a_port_is_refused_with_the_fix() {
        for cs in [
            r"Server=db\SQLEXPRESS;Database=x;User Id=u;Password=p",
            r"Data Source=tcp:db\SQLEXPRESS;Database=x;User Id=u;Password=p",
        ] {
            let err = driver_config(&settings(cs)).err().map(|e| e.to_string());
            let err = err.unwrap_or_default();
            assert!(err.contains("SQLEXPRESS") && err.contains("PORT"), "{err}");
        }
        // With a port, the instance name is harmless.
        assert!(
            driver_config(&settings(
                r"Server=tcp:db\SQLEXPRESS,1433;User Id=u;Password=p"
            ))
            .is_ok()
        );
        assert!(driver_config(&settings("Server=tcp:db,1433;User Id=u;Password=p")).is_ok());
    }

    #[test]
    fn conflicting_trust_settings_are_an_error_not_a_panic() {
        let mut s =
            settings("Server=tcp:db,1433;User Id=u;Password=p;TrustServerCertificateCA=/ca.pem");
        s.trust_server_certificate = true;
        let err = driver_config(&s)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("TrustServerCertificateCA"), "{err}");
        // Both inside the string: the driver's own parser refuses it.
        let both = settings(
            "Server=tcp:db,1433;User Id=u;Password=p;TrustServerCertificate=true;TrustServerCertificateCA=/ca.pem",
        );
        assert!(driver_config(&both).is_err());
    }

    #[test]
    fn encrypt_strict_is_kept() {
        let strict = driver_config(&settings(
            "Server=tcp:db,1433;User Id=u;Password=p;Encrypt=strict",
        ));
        assert!(strict.is_ok(), "{:?}", strict.err());
    }

    #[test]
    fn io_and_deadlock_errors_are_transient_others_definite() {
        let io = tiberius::error::Error::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            message: "reset".into(),
        };
        assert!(classify(&io).error.is_transient());
        let tls = tiberius::error::Error::Tls("bad certificate".into());
        let text = classify(&tls).error.to_string();
        assert!(!classify(&tls).error.is_transient());
        assert!(text.contains("source.trust_server_certificate"), "{text}");
        // The driver's advice is for programmers: the operator gets settings.
        let driver = tiberius::error::Error::Tls(
            "the server's certificate was rejected during the TLS handshake: invalid peer certificate: UnknownIssuer. To connect anyway you can: (1) trust a specific CA certificate with `Config::trust_cert_ca(path)`; (4) build tiberius with the `native-tls` backend".into(),
        );
        let text = classify(&driver).error.to_string();
        assert!(text.contains("UnknownIssuer"), "{text}");
        assert!(
            text.contains("TrustServerCertificateCA=")
                && text.contains("source.trust_server_certificate = true"),
            "{text}"
        );
        assert!(
            !text.contains("Config::") && !text.contains("tiberius"),
            "{text}"
        );
        let conversion = tiberius::error::Error::Conversion("x".into());
        assert!(!classify(&conversion).error.is_transient());
    }

    #[test]
    fn server_error_numbers_map_to_what_to_do() {
        // SqlClient's baseline and what EF Core adds for failovers, patches and
        // throttling.
        for code in [
            1204, 1205, 1222, 40143, 40540, 40613, 42108, 49918, 233, 10054, 18401, 921, 941, 952,
            40189, 10930, 10936, 40642, 40675, 49802, 17197, 8645, 8651, 8628, 3947, 3948, 3966,
            4060, 976, 978, 983,
        ] {
            assert!(classify_server_error(code, "x").is_transient(), "{code}");
        }
        assert!(matches!(
            classify_server_error(18456, "Login failed"),
            SqlErrorKind::LoginFailed
        ));
        assert!(
            SqlErrorKind::LoginFailed
                .to_string()
                .contains("source.connection_string")
        );
        let denied = classify_server_error(229, "SELECT permission denied");
        assert!(matches!(denied, SqlErrorKind::PermissionDenied { .. }));
        assert!(
            denied
                .to_string()
                .contains("sql/03_least_privilege_login.sql"),
            "{denied}"
        );
        let other = classify_server_error(208, "Invalid object name 'x'");
        assert!(!other.is_transient());
        assert!(other.to_string().contains("208"));
    }

    fn server_error(code: u32) -> SqlError {
        SqlError {
            code: Some(code),
            error: classify_server_error(code, "the server's words"),
        }
    }

    /// 976/978/983 against a replica that never allows reads, and 4060 before any
    /// connection worked (a wrong name), are retried for a while, naming the fix,
    /// then stop the run; anything between resets the count.
    #[test]
    fn errors_that_may_never_pass_are_retried_for_their_bound_then_stop_the_run() {
        let mut conn = SqlConnection::new(settings("Server=tcp:db,1433"));
        let start = std::time::Instant::now();
        let first = conn.persisted(server_error(978), start);
        assert!(first.error.is_transient());
        let text = first.error.to_string();
        assert!(
            text.contains("ApplicationIntent=ReadOnly") && text.contains("120 s"),
            "{text}"
        );
        let later = conn.persisted(server_error(978), start + Duration::from_secs(119));
        assert!(later.error.is_transient());
        let last = conn.persisted(server_error(978), start + Duration::from_secs(120));
        assert!(!last.error.is_transient(), "{}", last.error);
        assert!(
            last.error
                .to_string()
                .contains("ApplicationIntent=ReadOnly")
        );

        // Another error between resets the count.
        let mut conn = SqlConnection::new(settings("Server=tcp:db,1433"));
        conn.persisted(server_error(976), start);
        conn.persisted(server_error(1205), start + Duration::from_secs(60));
        let after = conn.persisted(server_error(976), start + Duration::from_secs(130));
        assert!(after.error.is_transient(), "counted afresh");
        assert!(after.error.to_string().contains("listener"));

        // 4060: bounded at the first connection (60 s), retried for good after one
        // worked.
        let mut conn = SqlConnection::new(settings("Server=tcp:db,1433"));
        conn.persisted(server_error(4060), start);
        let wrong = conn.persisted(server_error(4060), start + Duration::from_secs(60));
        assert!(!wrong.error.is_transient());
        assert!(
            wrong.error.to_string().contains("Database="),
            "{}",
            wrong.error
        );
        conn.connected_before = true;
        let back = conn.persisted(server_error(4060), start + Duration::from_secs(600));
        assert!(back.error.is_transient());
        assert_eq!(
            back.error.to_string(),
            classify_server_error(4060, "the server's words").to_string()
        );
    }

    /// With MultiSubnetFailover, a dead address (it never answers) does not hold
    /// the connection: the first address that answers wins at once.
    #[tokio::test(start_paused = true)]
    async fn the_first_address_that_answers_wins_and_a_dead_one_waits_for_nothing() {
        type Attempt = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<u8>>>>;
        let dead: Attempt = Box::pin(std::future::pending());
        let refused: Attempt =
            Box::pin(async { Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) });
        let alive: Attempt = Box::pin(async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(2)
        });
        let started = tokio::time::Instant::now();
        assert_eq!(
            first_connected(vec![dead, refused, alive]).await.unwrap(),
            2
        );
        assert_eq!(started.elapsed(), Duration::from_millis(20));
        let none: Vec<Attempt> = vec![Box::pin(async {
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        })];
        assert_eq!(
            first_connected(none).await.unwrap_err().kind(),
            std::io::ErrorKind::ConnectionRefused
        );
    }

    /// Through the resolver: `localhost` names more than one address here (::1 and
    /// 127.0.0.1); a listener on one of them is reached whichever comes first.
    #[tokio::test]
    async fn a_name_with_several_addresses_reaches_the_one_that_listens() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move { listener.accept().await.map(drop) });
        let tcp = open_tcp(&format!("localhost:{port}"), true)
            .await
            .expect("connects");
        assert_eq!(tcp.peer_addr().unwrap().port(), port);
        accept.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_server_that_never_answers_the_login_is_cut_off() {
        // Accepts TCP and then says nothing: the pre-login must not wait forever.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(socket);
        });
        let mut s = settings(&format!(
            "Server=tcp:127.0.0.1,{port};User Id=u;Password=hunter2"
        ));
        s.connect_timeout = Duration::from_millis(300);
        let started = std::time::Instant::now();
        let err = SqlConnection::new(s)
            .query("SELECT 1", &[])
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(err.error.is_transient(), "{:?}", err.error);
        let text = err.error.to_string();
        assert!(text.contains("source.connect_timeout_ms"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        hold.abort();
    }
}

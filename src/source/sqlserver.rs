//! [`ChangeSource`] on a real SQL Server, over TDS with tiberius.
//!
//! Connects from an ADO.NET connection string with TLS required by default
//! (`trust_server_certificate` only when configured). A connection that fails is
//! dropped and re-opened by the next call; the poll loop's caller retries transient
//! errors with backoff. Errors are classified by SQL Server error number into
//! transient ones (connection loss, deadlock victim 1205, Azure SQL throttling and
//! failover) and definite ones, each of which says what to change. The connection
//! string holds a password: it is never logged or put in an error.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use tiberius::{Client, ColumnData, Config, EncryptionLevel, Row, ToSql};
use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use crate::event::value::{SqlType, TypeError};
use crate::lsn::Lsn;
use crate::source::decode::{
    DecodeError, decode_bytes, decode_guid, decode_int, decode_lsn, decode_naive_datetime,
    decode_string, decode_value,
};
use crate::source::queries::{self, CHANGE_ROW_FIXED_COLUMNS};
use crate::source::{
    CaptureInstance, CapturedColumn, Catalog, ChangeRow, ChangeSource, DdlEvent, Probe,
    ProbeResult, RowKey, SourceError,
};

/// A connection string: its `Debug` and `Display` never show it.
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
}

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
    pub connect_timeout: Duration,
}

/// A TDS connection.
pub type TdsClient = Client<Compat<TcpStream>>;

/// A CDC source on SQL Server.
pub struct SqlServerSource {
    config: SqlServerConfig,
    client: Option<TdsClient>,
    change_queries: HashMap<String, String>,
}

/// SQL Server error numbers that mean "try again".
/// 1205 deadlock victim; 4221 and 10928/10929 resource limits; 40197, 40501, 40613,
/// 49918–49920 Azure SQL service busy or failing over; 233, 10053, 10054, 10060, 64
/// connection broken.
const TRANSIENT_ERRORS: &[u32] = &[
    1205, 4221, 10928, 10929, 40197, 40501, 40613, 49918, 49919, 49920, 233, 10053, 10054, 10060,
    64,
];

/// Permission errors: 229/230 permission denied on an object or column, 262 permission
/// denied in database, 297/300 a missing server permission, 916 no access to database.
const PERMISSION_ERRORS: &[u32] = &[229, 230, 262, 297, 300, 916];

/// Names of the fixed columns of a change row; the array length ties them to
/// [`CHANGE_ROW_FIXED_COLUMNS`] at compile time.
const CHANGE_ROW_FIXED: [&str; CHANGE_ROW_FIXED_COLUMNS] = [
    "__$start_lsn",
    "__$command_id",
    "__$seqval",
    "__$operation",
    "__$update_mask",
    "tran_begin_lsn",
    "tran_end_time",
];

/// Maps a driver error to a [`SourceError`].
pub fn classify(error: &tiberius::error::Error) -> SourceError {
    use tiberius::error::Error as E;
    match error {
        E::Io { .. } | E::Protocol(_) | E::Routing { .. } => SourceError::Transient {
            message: error.to_string(),
        },
        E::Tls(message) => SourceError::Definite {
            message: format!(
                "TLS handshake failed ({message}); for a server with a self-signed certificate set source.trust_server_certificate = true"
            ),
        },
        E::Server(token) => classify_server_error(token.code(), token.message()),
        other => SourceError::Definite {
            message: other.to_string(),
        },
    }
}

/// Maps a SQL Server error number and message to a [`SourceError`].
pub fn classify_server_error(code: u32, message: &str) -> SourceError {
    let message = message.to_owned();
    match code {
        18456 => SourceError::LoginFailed,
        4060 => SourceError::Definite {
            message: format!(
                "{message} (check Database= in source.connection_string and that the login is a user of that database)"
            ),
        },
        c if TRANSIENT_ERRORS.contains(&c) => SourceError::Transient { message },
        c if PERMISSION_ERRORS.contains(&c) => SourceError::PermissionDenied { message },
        _ => SourceError::Definite {
            message: format!("SQL Server error {code}: {message}"),
        },
    }
}

fn malformed(capture_instance: &str, error: DecodeError) -> SourceError {
    SourceError::Malformed {
        capture_instance: capture_instance.to_owned(),
        message: error.to_string(),
    }
}

/// Takes the columns of a row in order.
struct Columns {
    inner: std::vec::IntoIter<ColumnData<'static>>,
    names: &'static [&'static str],
    at: usize,
}

impl Columns {
    fn new(row: Row, names: &'static [&'static str]) -> Self {
        Columns {
            inner: row.into_iter().collect::<Vec<_>>().into_iter(),
            names,
            at: 0,
        }
    }

    fn next(&mut self) -> Result<(&'static str, ColumnData<'static>), DecodeError> {
        let name = self.names.get(self.at).copied().unwrap_or("column");
        self.at += 1;
        self.inner
            .next()
            .map(|data| (name, data))
            .ok_or_else(|| DecodeError {
                column: name.to_owned(),
                message: "missing from the result".into(),
            })
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let (name, data) = self.next()?;
        decode_string(name, data)?.ok_or_else(|| null(name))
    }

    fn opt_string(&mut self) -> Result<Option<String>, DecodeError> {
        let (name, data) = self.next()?;
        decode_string(name, data)
    }

    fn int(&mut self) -> Result<Option<i64>, DecodeError> {
        let (name, data) = self.next()?;
        decode_int(name, data)
    }

    fn lsn(&mut self) -> Result<Option<Lsn>, DecodeError> {
        let (name, data) = self.next()?;
        decode_lsn(name, data)
    }
}

fn null(column: &str) -> DecodeError {
    DecodeError {
        column: column.to_owned(),
        message: "is NULL".into(),
    }
}

fn catalog_error(error: DecodeError) -> SourceError {
    SourceError::Definite {
        message: format!("unexpected catalog result: {error}"),
    }
}

fn driver_config(settings: &SqlServerConfig) -> Result<Config, SourceError> {
    // The parse error could quote the string, which holds a password: not shown.
    let mut config = Config::from_ado_string(settings.connection_string.expose())
        .map_err(|_| SourceError::Definite {
            message: "source.connection_string is not a valid ADO.NET connection string (e.g. Server=tcp:host,1433;Database=db;User Id=user;Password=...)".into(),
        })?;
    config.application_name("mssql-ces");
    config.encryption(if settings.encrypt {
        EncryptionLevel::Required
    } else {
        EncryptionLevel::NotSupported
    });
    if settings.trust_server_certificate {
        config.trust_cert();
    }
    Ok(config)
}

/// Opens a connection (TLS as configured; one Azure SQL redirect followed).
pub async fn connect(settings: &SqlServerConfig) -> Result<TdsClient, SourceError> {
    let mut config = driver_config(settings)?;
    // Azure SQL may redirect to another node once.
    for _ in 0..2 {
        let addr = config.get_addr();
        let tcp = tokio::time::timeout(settings.connect_timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| SourceError::Transient {
                message: format!("connecting to {addr} timed out"),
            })?
            .map_err(|e| SourceError::Transient {
                message: format!("cannot connect to {addr}: {e}"),
            })?;
        tcp.set_nodelay(true).map_err(|e| SourceError::Transient {
            message: e.to_string(),
        })?;
        match Client::connect(config.clone(), tcp.compat_write()).await {
            Ok(client) => return Ok(client),
            Err(tiberius::error::Error::Routing { host, port }) => {
                config.host(&host);
                config.port(port);
            }
            Err(e) => return Err(classify(&e)),
        }
    }
    Err(SourceError::Transient {
        message: "the server redirected the connection more than once".into(),
    })
}

impl SqlServerSource {
    pub fn new(config: SqlServerConfig) -> Self {
        SqlServerSource {
            config,
            client: None,
            change_queries: HashMap::new(),
        }
    }

    /// Runs one query, (re)connecting first when needed; a failed connection is
    /// dropped so that the next call opens a new one.
    async fn query(&mut self, sql: &str, params: &[&dyn ToSql]) -> Result<Vec<Row>, SourceError> {
        if self.client.is_none() {
            self.client = Some(connect(&self.config).await?);
        }
        let Some(client) = self.client.as_mut() else {
            return Err(SourceError::Transient {
                message: "no connection".into(),
            });
        };
        let result = match client.query(sql, params).await {
            Ok(stream) => stream.into_first_result().await,
            Err(e) => Err(e),
        };
        result.map_err(|e| {
            let error = classify(&e);
            if error.is_transient() {
                self.client = None;
            }
            error
        })
    }

    fn change_query(&mut self, instance: &CaptureInstance) -> &str {
        self.change_queries
            .entry(instance.name.clone())
            .or_insert_with(|| queries::read_changes(instance))
    }
}

impl ChangeSource for SqlServerSource {
    async fn catalog(&mut self) -> Result<Catalog, SourceError> {
        let info = self.query(queries::DATABASE_INFO, &[]).await?;
        let row = info
            .into_iter()
            .next()
            .ok_or_else(|| SourceError::Definite {
                message: "the database is not visible to this login".into(),
            })?;
        let mut c = Columns::new(
            row,
            &[
                "database_name",
                "database_guid",
                "is_cdc_enabled",
                "utc_offset_minutes",
            ],
        );
        let database = c.string().map_err(catalog_error)?;
        let (name, data) = c.next().map_err(catalog_error)?;
        let database_guid = decode_guid(name, data)
            .map_err(catalog_error)?
            .unwrap_or_default();
        let cdc_enabled = c.int().map_err(catalog_error)?.unwrap_or(0) == 1;
        let offset = c.int().map_err(catalog_error)?.unwrap_or(0);
        if !cdc_enabled {
            return Err(SourceError::CdcNotEnabled { database });
        }

        let rows = self.query(queries::CAPTURE_INSTANCES, &[]).await?;
        let mut instances = Vec::new();
        for row in rows {
            let mut c = Columns::new(
                row,
                &[
                    "capture_instance",
                    "schema_name",
                    "table_name",
                    "start_lsn",
                    "create_date",
                ],
            );
            let name = c.string().map_err(catalog_error)?;
            let schema = c.string().map_err(catalog_error)?;
            let table = c.string().map_err(catalog_error)?;
            let start_lsn = c.lsn().map_err(catalog_error)?.unwrap_or(Lsn::ZERO);
            let (column, data) = c.next().map_err(catalog_error)?;
            let create_date = decode_naive_datetime(column, data)
                .map_err(catalog_error)?
                .unwrap_or_default();
            instances.push(CaptureInstance {
                name,
                schema,
                table,
                start_lsn,
                create_date,
                columns: Vec::new(),
                key_columns: Vec::new(),
            });
        }

        for row in self.query(queries::CAPTURED_COLUMNS, &[]).await? {
            let mut c = Columns::new(
                row,
                &[
                    "capture_instance",
                    "column_name",
                    "column_ordinal",
                    "column_type",
                    "type_name",
                    "is_user_defined",
                    "max_length",
                    "precision",
                    "scale",
                    "table_index",
                ],
            );
            let instance = c.string().map_err(catalog_error)?;
            let name = c.string().map_err(catalog_error)?;
            let ordinal = c.int().map_err(catalog_error)?.unwrap_or(0);
            let declared = c.opt_string().map_err(catalog_error)?.unwrap_or_default();
            let base = c.opt_string().map_err(catalog_error)?;
            let user_defined = c.int().map_err(catalog_error)?.unwrap_or(0) == 1;
            let max_length = c.int().map_err(catalog_error)?;
            let precision = c.int().map_err(catalog_error)?;
            let scale = c.int().map_err(catalog_error)?;
            let table_index = c.int().map_err(catalog_error)?;
            let sql_type = match (base, max_length, precision, scale) {
                _ if user_defined => Err(TypeError::UserDefined {
                    type_name: declared,
                }),
                (Some(base), Some(len), Some(p), Some(s)) => SqlType::from_catalog(
                    &base,
                    i16::try_from(len).unwrap_or(-1),
                    u8::try_from(p).unwrap_or(0),
                    u8::try_from(s).unwrap_or(0),
                ),
                // The column was dropped from the source table: its facts are gone.
                _ => Err(TypeError::InvalidFacts {
                    type_name: declared,
                    fact: "source column (dropped)",
                    value: 0,
                }),
            };
            if let Some(ci) = instances.iter_mut().find(|i| i.name == instance) {
                ci.columns.push(CapturedColumn {
                    name,
                    ordinal: u32::try_from(ordinal).unwrap_or(0),
                    table_index: u32::try_from(table_index.unwrap_or(ordinal - 1)).unwrap_or(0),
                    sql_type,
                });
            }
        }

        for row in self.query(queries::KEY_COLUMNS, &[]).await? {
            let mut c = Columns::new(row, &["capture_instance", "column_name", "key_ordinal"]);
            let instance = c.string().map_err(catalog_error)?;
            let column = c.string().map_err(catalog_error)?;
            if let Some(ci) = instances.iter_mut().find(|i| i.name == instance) {
                ci.key_columns.push(column);
            }
        }

        Ok(Catalog {
            database,
            database_guid,
            server_utc_offset_minutes: i32::try_from(offset).unwrap_or(0),
            instances,
        })
    }

    async fn max_lsn(&mut self) -> Result<Option<Lsn>, SourceError> {
        let rows = self.query(queries::MAX_LSN, &[]).await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let lsn = Columns::new(row, &["max_lsn"])
            .lsn()
            .map_err(catalog_error)?;
        Ok(lsn.filter(|l| !l.is_zero()))
    }

    async fn probe(&mut self, probes: &[Probe], to: Lsn) -> Result<Vec<ProbeResult>, SourceError> {
        let mut results = Vec::with_capacity(probes.len());
        for chunk in probes.chunks(queries::PROBE_CHUNK) {
            let names: Vec<&str> = chunk.iter().map(|p| p.capture_instance.as_str()).collect();
            let sql = queries::probe(&names);
            let to_bytes = to.to_vec();
            let afters: Vec<Vec<u8>> = chunk.iter().map(|p| p.after.to_vec()).collect();
            let mut params: Vec<&dyn ToSql> = vec![&to_bytes];
            for (probe, after) in chunk.iter().zip(&afters) {
                params.push(&probe.capture_instance);
                params.push(after);
            }
            for row in self.query(&sql, &params).await? {
                let mut c = Columns::new(row, &["capture_instance", "min_lsn", "next_change"]);
                let capture_instance = c.string().map_err(catalog_error)?;
                let min_lsn = c.lsn().map_err(catalog_error)?.filter(|l| !l.is_zero());
                let next_change = c.lsn().map_err(catalog_error)?;
                results.push(ProbeResult {
                    capture_instance,
                    min_lsn,
                    next_change,
                });
            }
        }
        Ok(results)
    }

    async fn read_changes(
        &mut self,
        instance: &CaptureInstance,
        after: RowKey,
        to: Lsn,
        limit: usize,
    ) -> Result<Vec<ChangeRow>, SourceError> {
        let sql = self.change_query(instance).to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (to, start, seqval) = (to.to_vec(), after.start_lsn.to_vec(), after.seqval.to_vec());
        let operation = i32::from(after.operation);
        let params: [&dyn ToSql; 6] = [&limit, &to, &start, &after.command_id, &seqval, &operation];
        let rows = self.query(&sql, &params).await?;
        let emitted: Vec<(String, SqlType)> = instance
            .emitted_columns()
            .map(|(c, t)| (c.name.clone(), t))
            .collect();
        let bad = |e| malformed(&instance.name, e);
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let mut c = Columns::new(row, &CHANGE_ROW_FIXED);
            let start_lsn = c
                .lsn()
                .map_err(bad)?
                .ok_or_else(|| bad(null("__$start_lsn")))?;
            let command_id = c.int().map_err(bad)?.unwrap_or(0);
            let seqval = c
                .lsn()
                .map_err(bad)?
                .ok_or_else(|| bad(null("__$seqval")))?;
            let operation = c
                .int()
                .map_err(bad)?
                .ok_or_else(|| bad(null("__$operation")))?;
            let (name, data) = c.next().map_err(bad)?;
            let update_mask = decode_bytes(name, data).map_err(bad)?;
            let begin_lsn = c.lsn().map_err(bad)?.ok_or_else(|| {
                bad(DecodeError {
                    column: "tran_begin_lsn".into(),
                    message: "no cdc.lsn_time_mapping row for this transaction".into(),
                })
            })?;
            let (name, data) = c.next().map_err(bad)?;
            let end_time = decode_naive_datetime(name, data)
                .map_err(bad)?
                .ok_or_else(|| bad(null("tran_end_time")))?;
            let mut values = Vec::with_capacity(emitted.len());
            for (column, sql_type) in &emitted {
                let data = c.inner.next().ok_or_else(|| {
                    bad(DecodeError {
                        column: column.clone(),
                        message: "missing from the result".into(),
                    })
                })?;
                values.push(decode_value(column, sql_type, data).map_err(bad)?);
            }
            out.push(ChangeRow {
                key: RowKey {
                    start_lsn,
                    command_id: i32::try_from(command_id).unwrap_or(i32::MAX),
                    seqval,
                    operation: u8::try_from(operation).unwrap_or(0),
                },
                update_mask,
                begin_lsn,
                end_time,
                values,
            });
        }
        Ok(out)
    }

    async fn ddl_history(&mut self, capture_instance: &str) -> Result<Vec<DdlEvent>, SourceError> {
        let name = capture_instance.to_owned();
        let rows = self.query(queries::DDL_HISTORY, &[&name]).await?;
        let mut out = Vec::new();
        for row in rows {
            let mut c = Columns::new(
                row,
                &["capture_instance", "ddl_lsn", "ddl_time", "ddl_command"],
            );
            let capture_instance = c.string().map_err(catalog_error)?;
            let ddl_lsn = c.lsn().map_err(catalog_error)?.unwrap_or(Lsn::ZERO);
            let (column, data) = c.next().map_err(catalog_error)?;
            let ddl_time = decode_naive_datetime(column, data)
                .map_err(catalog_error)?
                .unwrap_or_default();
            let ddl_command = c.opt_string().map_err(catalog_error)?.unwrap_or_default();
            out.push(DdlEvent {
                capture_instance,
                ddl_lsn,
                ddl_time,
                ddl_command,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_never_print() {
        let secret = ConnectionString::new("Server=db;User Id=sa;Password=hunter2");
        let config = SqlServerConfig {
            connection_string: secret,
            trust_server_certificate: false,
            encrypt: true,
            connect_timeout: Duration::from_secs(1),
        };
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn a_malformed_connection_string_error_does_not_quote_it() {
        let source = SqlServerSource::new(SqlServerConfig {
            connection_string: ConnectionString::new("Server=tcp:db,notaport;Password='hunter2"),
            trust_server_certificate: false,
            encrypt: true,
            connect_timeout: Duration::from_secs(1),
        });
        let err = driver_config(&source.config)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn io_and_deadlock_errors_are_transient_others_definite() {
        let io = tiberius::error::Error::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            message: "reset".into(),
        };
        assert!(classify(&io).is_transient());
        let tls = tiberius::error::Error::Tls("bad certificate".into());
        let text = classify(&tls).to_string();
        assert!(!classify(&tls).is_transient());
        assert!(text.contains("source.trust_server_certificate"), "{text}");
        let conversion = tiberius::error::Error::Conversion("x".into());
        assert!(!classify(&conversion).is_transient());
    }

    #[test]
    fn server_error_numbers_map_to_what_to_do() {
        assert!(classify_server_error(1205, "deadlock victim").is_transient());
        assert!(classify_server_error(40613, "database unavailable").is_transient());
        assert_eq!(
            classify_server_error(18456, "Login failed"),
            SourceError::LoginFailed
        );
        assert!(
            SourceError::LoginFailed
                .to_string()
                .contains("source.connection_string")
        );
        let denied = classify_server_error(229, "SELECT permission denied on cdc.change_tables");
        assert!(matches!(denied, SourceError::PermissionDenied { .. }));
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
}

//! The checkpoint store in the source database: `dbo.mssql_ces_checkpoint`
//! (created by `sql/04_checkpoint_table.sql`), one row per stream name, upserted
//! with `MERGE`. It uses the source's [`SqlConnection`]: the same time-outs,
//! reconnects and error classification.

use tiberius::ToSql;

use super::{CheckpointError, parse, render};
use crate::mssql::{SqlConnection, SqlError, SqlServerConfig};
use crate::position::Position;

/// The checkpoint table's read.
pub const CHECKPOINT_READ: &str =
    "SELECT position FROM dbo.mssql_ces_checkpoint WHERE stream_name = @P1;";

/// Every other stream's checkpoint in the table (`source.cleanup =
/// "after_delivery"`).
pub const CHECKPOINT_PEERS: &str =
    "SELECT stream_name, position FROM dbo.mssql_ces_checkpoint WHERE stream_name <> @P1;";

/// Upsert of a stream's position. The lease (`LEASE_ACQUIRE`, taken again before a
/// write on any new connection) keeps it to one writer per stream, so the first
/// insert of a key cannot race another.
pub const CHECKPOINT_WRITE: &str = "MERGE dbo.mssql_ces_checkpoint AS t \
USING (SELECT @P1 AS stream_name, @P2 AS position) AS s \
ON t.stream_name = s.stream_name \
WHEN MATCHED THEN UPDATE SET position = s.position, updated_at = SYSUTCDATETIME() \
WHEN NOT MATCHED THEN INSERT (stream_name, position, updated_at) \
VALUES (s.stream_name, s.position, SYSUTCDATETIME());";

/// `check`: whether the login may insert and update checkpoint rows; NULL when the
/// table does not exist.
/// <https://learn.microsoft.com/sql/t-sql/functions/has-perms-by-name-transact-sql>
pub const CHECKPOINT_WRITABLE: &str = "SELECT \
HAS_PERMS_BY_NAME(N'dbo.mssql_ces_checkpoint', N'OBJECT', N'INSERT') AS can_insert, \
HAS_PERMS_BY_NAME(N'dbo.mssql_ces_checkpoint', N'OBJECT', N'UPDATE') AS can_update;";

/// The stream's lease: an exclusive application lock owned by this session, released
/// by the server when the session ends (the process dies, the connection drops).
/// `@P1` the resource name, `@P2` how long to wait for it in ms. `APPLOCK_MODE` then
/// says whether this session holds it (`Exclusive`) or not (`NoLock`).
/// <https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sp-getapplock-transact-sql>
pub const LEASE_ACQUIRE: &str = "EXEC sys.sp_getapplock @Resource = @P1, \
@LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = @P2; \
SELECT APPLOCK_MODE(N'public', @P1, N'Session') AS lock_mode;";

/// Whether this session holds the lease now (`Exclusive`) or not (`NoLock`): the
/// periodic check that the session behind the lease is still this process's.
/// <https://learn.microsoft.com/sql/t-sql/functions/applock-mode-transact-sql>
pub const LEASE_HELD: &str = "SELECT APPLOCK_MODE(N'public', @P1, N'Session') AS lock_mode;";

/// How long a new connection waits for the lease before a write: the session this
/// process lost may not be ended by the server yet.
const FENCE_WAIT_MS: i32 = 30_000;

/// How the table store's lease, which lapses with its session, is kept. The
/// defaults are what a run uses; tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How often a run confirms that its session still holds the lease.
    pub confirm_every: std::time::Duration,
    /// How long after the last confirmation a run goes on handing messages to the
    /// sink; past it, it waits for the next one. It bounds how long a process whose
    /// session dropped (so that a standby could take over) goes on producing.
    pub trusted_for: std::time::Duration,
    /// How long after its last confirmation a lease this process cannot take again
    /// on a new connection may still be held by its own previous session, which the
    /// server has not ended yet (it notices a dead client by TCP keep-alive: 30 s by
    /// default, then a few probes). Within it, a refused fence is a fault that can
    /// pass; after it, another process holds the stream.
    pub own_session_grace: std::time::Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming {
            confirm_every: std::time::Duration::from_secs(2),
            trusted_for: std::time::Duration::from_secs(6),
            own_session_grace: std::time::Duration::from_secs(120),
        }
    }
}

pub struct TableStore {
    conn: SqlConnection,
    stream_name: String,
    /// The connection generation on which this process holds the lease.
    leased_on: Option<u64>,
    /// When this process last knew it held the lease.
    confirmed_at: Option<std::time::Instant>,
    timing: LeaseTiming,
}

const LOCATION: &str = "table dbo.mssql_ces_checkpoint";

fn error(reason: impl ToString) -> CheckpointError {
    CheckpointError::Io {
        cause: None,
        location: LOCATION.into(),
        reason: reason.to_string(),
    }
}

/// A failed query, keeping whether it can pass.
fn query_error(e: SqlError) -> CheckpointError {
    // "Failed to update database … because the database is read-only": the
    // connection reached a readable secondary, which no retry changes.
    let read_only = e.code == Some(3906);
    let reason = if read_only {
        "this connection reached a read-only copy of the database (a readable secondary); point checkpoint.connection_string at the primary (the availability group listener without ApplicationIntent=ReadOnly)"
    } else {
        "the checkpoint table's query failed"
    }
    .to_owned();
    let transient = !read_only && e.error.is_transient();
    let location = LOCATION.into();
    let cause = Some(crate::error::cause(e));
    if transient {
        CheckpointError::Transient {
            location,
            reason,
            cause,
        }
    } else {
        CheckpointError::Io {
            location,
            reason,
            cause,
        }
    }
}

impl TableStore {
    pub fn new(settings: SqlServerConfig, stream_name: impl Into<String>) -> Self {
        TableStore {
            conn: SqlConnection::new(settings),
            stream_name: stream_name.into(),
            leased_on: None,
            confirmed_at: None,
            timing: LeaseTiming::default(),
        }
    }

    /// Other timings than the defaults (tests).
    pub fn with_lease_timing(mut self, timing: LeaseTiming) -> Self {
        self.timing = timing;
        self
    }

    pub fn lease_timing(&self) -> LeaseTiming {
        self.timing
    }

    /// The application lock's name. `sp_getapplock` compares resources in binary,
    /// whatever the collation, while the checkpoint row's key compares as the
    /// database does (case-insensitively by default): lower-cased, `Orders` and
    /// `orders`, one row, take one lease.
    fn resource(&self) -> String {
        format!("mssql-ces:{}", self.stream_name.to_lowercase())
    }

    /// Tries to take the lease on the current connection, waiting up to `wait_ms`:
    /// `None` when taken, else a description of the holder.
    async fn lease(&mut self, wait_ms: i32) -> Result<Option<String>, CheckpointError> {
        let resource = self.resource();
        let rows = self.query(LEASE_ACQUIRE, &[&resource, &wait_ms]).await?;
        let mode: Option<String> = rows
            .first()
            .and_then(|row| row.try_get::<&str, _>("lock_mode").ok().flatten())
            .map(str::to_owned);
        match mode.as_deref() {
            Some("Exclusive") => {
                self.leased_on = Some(self.conn.generation());
                self.confirmed_at = Some(std::time::Instant::now());
                Ok(None)
            }
            Some(_) => Ok(Some(format!(
                "another session holds application lock `{resource}`"
            ))),
            None => Err(error("APPLOCK_MODE answered nothing")),
        }
    }

    /// Tries to take the lease without waiting (a standby's poll).
    pub async fn try_lease(&mut self) -> Result<Option<String>, CheckpointError> {
        self.lease(0).await
    }

    fn leased_here(&self) -> bool {
        self.leased_on.is_some_and(|g| g == self.conn.generation()) && self.conn.is_open()
    }

    /// Before a read or a write: the lease must be held on this very connection; a
    /// new one (after a drop, which released the lock) takes it again or stops.
    async fn fence(&mut self) -> Result<(), CheckpointError> {
        if self.leased_here() {
            return Ok(());
        }
        // Without the lease for longer than the grace, a standby may have taken the
        // stream, written and gone: taking the free lock again would write an older
        // position over its newer one. The run stops; a restart reads the checkpoint.
        if let Some(at) = self.confirmed_at
            && at.elapsed() >= self.timing.own_session_grace
        {
            return Err(CheckpointError::LeaseLost {
                location: LOCATION.into(),
                holder: format!(
                    "this process had not held the lease for {} s (another process may have taken the stream and let it go since)",
                    at.elapsed().as_secs()
                ),
            });
        }
        // The server's wait ends before the client's query time-out does, so that a
        // lease held elsewhere is an answer, not a time-out.
        let margin = std::time::Duration::from_secs(2);
        let wait = self
            .conn
            .settings()
            .query_timeout
            .saturating_sub(margin)
            .as_millis()
            .min(FENCE_WAIT_MS as u128) as i32;
        let Some(holder) = self.lease(wait).await? else {
            return Ok(());
        };
        // Held by another session: the one this process just lost, which the
        // server has not ended yet, or a standby that took over once it had. Only
        // the time since the lease was last ours tells them apart.
        match self.confirmed_at {
            Some(at) if at.elapsed() < self.timing.own_session_grace => {
                Err(CheckpointError::Transient {
                    cause: None,
                    location: LOCATION.into(),
                    reason: format!(
                        "{holder}: this process's previous session, which the server has not ended yet, or a standby that took over; trying again (after {} s without the lease, this process stops)",
                        self.timing.own_session_grace.as_secs()
                    ),
                })
            }
            _ => Err(CheckpointError::LeaseLost {
                location: LOCATION.into(),
                holder,
            }),
        }
    }

    /// Confirms this process still holds the lease: on the connection that took
    /// it, `APPLOCK_MODE` must say so (a session the server ended has no locks);
    /// on a new connection, it is taken again (the fence).
    pub async fn verify_lease(&mut self) -> Result<(), CheckpointError> {
        if self.leased_here() {
            let resource = self.resource();
            let rows = self.query(LEASE_HELD, &[&resource]).await?;
            let mode: Option<&str> = rows
                .first()
                .and_then(|row| row.try_get::<&str, _>("lock_mode").ok().flatten());
            if mode == Some("Exclusive") {
                self.confirmed_at = Some(std::time::Instant::now());
                return Ok(());
            }
            // This session no longer holds it (the server ended the session and the
            // driver has not seen the connection close yet): take it again.
            self.leased_on = None;
        }
        self.fence().await
    }

    async fn query(
        &mut self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Vec<tiberius::Row>, CheckpointError> {
        self.conn.query(sql, params).await.map_err(query_error)
    }

    /// Reads the stream's checkpoint, holding the lease on the connection that
    /// reads it (a read on a connection without it could race a standby's write).
    pub async fn load(&mut self) -> Result<Option<Position>, CheckpointError> {
        self.fence().await?;
        let name = self.stream_name.clone();
        let rows = self.query(CHECKPOINT_READ, &[&name]).await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let text: Option<&str> = row.try_get("position").map_err(error)?;
        let text = text.ok_or_else(|| error("position is NULL"))?;
        parse(text, &self.stream_name, LOCATION).map(Some)
    }

    /// The other streams' checkpoints in the table. Read without the lease: this
    /// store is a reader of its own, never the stream's writer.
    pub async fn peers(&mut self) -> Result<Vec<super::Checkpoint>, CheckpointError> {
        let name = self.stream_name.clone();
        let rows = self.query(CHECKPOINT_PEERS, &[&name]).await?;
        let mut peers = Vec::new();
        for row in rows {
            let stream: Option<&str> = row.try_get("stream_name").map_err(error)?;
            let text: Option<&str> = row.try_get("position").map_err(error)?;
            let (Some(stream), Some(text)) = (stream, text) else {
                continue;
            };
            let location = format!("{LOCATION} (stream {stream})");
            match super::parse_any(text, &location) {
                Ok(checkpoint) => peers.push(checkpoint),
                Err(CheckpointError::Corrupt { reason, .. }) => {
                    tracing::warn!(%location, %reason, "another stream's row is not a checkpoint; the cleanup after delivery passes it over");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(peers)
    }

    /// Whether the table exists and this login may write it.
    pub async fn check_writable(&mut self) -> Result<(), CheckpointError> {
        let rows = self.query(CHECKPOINT_WRITABLE, &[]).await?;
        let row = rows.into_iter().next();
        let allowed = |column: &str| -> Option<i32> { row.as_ref()?.try_get(column).ok()? };
        match (allowed("can_insert"), allowed("can_update")) {
            (Some(1), Some(1)) => Ok(()),
            (None, _) | (_, None) => Err(error(
                "the table does not exist: create it with sql/04_checkpoint_table.sql",
            )),
            _ => Err(error(
                "this login may not write it: GRANT INSERT, UPDATE ON dbo.mssql_ces_checkpoint TO the login",
            )),
        }
    }

    pub async fn save(&mut self, position: &Position) -> Result<(), CheckpointError> {
        self.fence().await?;
        let (name, text) = (
            self.stream_name.clone(),
            render(&self.stream_name, position, LOCATION)?,
        );
        self.query(CHECKPOINT_WRITE, &[&name, &text]).await?;
        self.confirmed_at = Some(std::time::Instant::now());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::queries::assert_parses;

    /// The table the statements write is the one the source never streams.
    #[test]
    fn the_statements_name_the_table_the_source_leaves_out() {
        let (schema, table) = crate::source::filter::CHECKPOINT_TABLE;
        let name = format!("{schema}.{table}");
        for sql in [CHECKPOINT_READ, CHECKPOINT_WRITE, CHECKPOINT_PEERS] {
            assert!(sql.contains(&name), "{sql}");
        }
        assert_eq!(LOCATION, format!("table {name}"));
    }

    #[test]
    fn stream_names_that_differ_in_case_take_one_lease() {
        let settings = || crate::mssql::SqlServerConfig {
            connection_string: crate::mssql::ConnectionString::new("Server=tcp:db,1433"),
            trust_server_certificate: false,
            encrypt: true,
            connect_timeout: std::time::Duration::from_secs(1),
            query_timeout: std::time::Duration::from_secs(1),
        };
        let upper = TableStore::new(settings(), "Orders");
        let lower = TableStore::new(settings(), "orders");
        assert_eq!(upper.resource(), lower.resource());
        assert_eq!(lower.resource(), "mssql-ces:orders");
    }

    #[test]
    fn the_checkpoint_queries_parse_as_tsql() {
        assert_parses("CHECKPOINT_READ", CHECKPOINT_READ);
        assert_parses("CHECKPOINT_WRITE", CHECKPOINT_WRITE);
        assert_parses("CHECKPOINT_PEERS", CHECKPOINT_PEERS);
        assert_parses("LEASE_ACQUIRE", LEASE_ACQUIRE);
        assert_parses("LEASE_HELD", LEASE_HELD);
        assert_parses("CHECKPOINT_WRITABLE", CHECKPOINT_WRITABLE);
    }
}

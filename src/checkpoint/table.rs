//! The checkpoint store in the source database: `dbo.mssql_ces_checkpoint`
//! (created by `sql/04_checkpoint_table.sql`), one row per stream name, upserted
//! with `MERGE`. It uses the source's [`SqlConnection`]: the same time-outs,
//! reconnects and error classification.

use tiberius::ToSql;

use super::{CheckpointError, parse, render};
use crate::source::connection::{SqlConnection, SqlError, SqlServerConfig};
use crate::source::poller::Position;

/// The checkpoint table's read.
pub const CHECKPOINT_READ: &str =
    "SELECT position FROM dbo.mssql_ces_checkpoint WHERE stream_name = @P1;";

/// Upsert of a stream's position. The lease keeps it to one writer per stream;
/// `HOLDLOCK` still makes the first insert of a key safe against a racing one.
pub const CHECKPOINT_WRITE: &str = "MERGE dbo.mssql_ces_checkpoint WITH (HOLDLOCK) AS t \
USING (SELECT @P1 AS stream_name, @P2 AS position) AS s \
ON t.stream_name = s.stream_name \
WHEN MATCHED THEN UPDATE SET position = s.position, updated_at = SYSUTCDATETIME() \
WHEN NOT MATCHED THEN INSERT (stream_name, position, updated_at) \
VALUES (s.stream_name, s.position, SYSUTCDATETIME());";

/// The stream's lease: an exclusive application lock owned by this session, released
/// by the server when the session ends (the process dies, the connection drops).
/// `@P1` the resource name. Returns 0 or 1 when granted, -1 when another session holds
/// it (no wait: `@LockTimeout = 0`).
/// <https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sp-getapplock-transact-sql>
pub const LEASE_ACQUIRE: &str = "DECLARE @result int; \
EXEC @result = sys.sp_getapplock @Resource = @P1, @LockMode = N'Exclusive', \
@LockOwner = N'Session', @LockTimeout = 0; \
SELECT @result AS result;";

pub struct TableStore {
    conn: SqlConnection,
    stream_name: String,
    /// The connection generation on which this process holds the lease.
    leased_on: Option<u64>,
}

const LOCATION: &str = "table dbo.mssql_ces_checkpoint";

fn error(reason: impl ToString) -> CheckpointError {
    CheckpointError::Io {
        location: LOCATION.into(),
        reason: reason.to_string(),
    }
}

/// A failed query, keeping whether it can pass.
fn query_error(e: SqlError) -> CheckpointError {
    if e.error.is_transient() {
        CheckpointError::Transient {
            location: LOCATION.into(),
            reason: e.error.to_string(),
        }
    } else {
        error(e.error)
    }
}

impl TableStore {
    pub fn new(settings: SqlServerConfig, stream_name: impl Into<String>) -> Self {
        TableStore {
            conn: SqlConnection::new(settings),
            stream_name: stream_name.into(),
            leased_on: None,
        }
    }

    fn resource(&self) -> String {
        format!("mssql-ces:{}", self.stream_name)
    }

    /// Tries to take the lease on the current connection: `None` when taken, else a
    /// description of the holder.
    pub async fn try_lease(&mut self) -> Result<Option<String>, CheckpointError> {
        let resource = self.resource();
        let rows = self.query(LEASE_ACQUIRE, &[&resource]).await?;
        let result: Option<i32> = rows
            .first()
            .and_then(|row| row.try_get::<i32, _>("result").ok().flatten());
        match result {
            Some(r) if r >= 0 => {
                self.leased_on = Some(self.conn.generation());
                Ok(None)
            }
            Some(-1) => Ok(Some(format!(
                "another session holds application lock `{resource}`"
            ))),
            other => Err(error(format!("sp_getapplock answered {other:?}"))),
        }
    }

    /// Before a write: the lease must be held on this very connection; a new one
    /// (after a drop, which released the lock) takes it again or stops.
    async fn fence(&mut self) -> Result<(), CheckpointError> {
        if self.leased_on.is_some_and(|g| g == self.conn.generation()) && self.conn.is_open() {
            return Ok(());
        }
        if let Some(holder) = self.try_lease().await? {
            return Err(CheckpointError::LeaseLost {
                location: LOCATION.into(),
                holder,
            });
        }
        Ok(())
    }

    async fn query(
        &mut self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Vec<tiberius::Row>, CheckpointError> {
        self.conn.query(sql, params).await.map_err(query_error)
    }

    pub async fn load(&mut self) -> Result<Option<Position>, CheckpointError> {
        let name = self.stream_name.clone();
        let rows = self.query(CHECKPOINT_READ, &[&name]).await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let text: Option<&str> = row.try_get("position").map_err(error)?;
        let text = text.ok_or_else(|| error("position is NULL"))?;
        parse(text, &self.stream_name, LOCATION).map(Some)
    }

    pub async fn save(&mut self, position: &Position) -> Result<(), CheckpointError> {
        self.fence().await?;
        let (name, text) = (
            self.stream_name.clone(),
            render(&self.stream_name, position),
        );
        self.query(CHECKPOINT_WRITE, &[&name, &text]).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::queries::assert_parses;

    #[test]
    fn the_checkpoint_queries_parse_as_tsql() {
        assert_parses("CHECKPOINT_READ", CHECKPOINT_READ);
        assert_parses("CHECKPOINT_WRITE", CHECKPOINT_WRITE);
        assert_parses("LEASE_ACQUIRE", LEASE_ACQUIRE);
    }
}

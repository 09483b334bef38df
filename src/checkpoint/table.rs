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

/// Upsert of a stream's position. One poller writes a given stream name, so the
/// upsert needs no `HOLDLOCK` against a concurrent insert of the same key.
pub const CHECKPOINT_WRITE: &str = "MERGE dbo.mssql_ces_checkpoint AS t \
USING (SELECT @P1 AS stream_name, @P2 AS position) AS s \
ON t.stream_name = s.stream_name \
WHEN MATCHED THEN UPDATE SET position = s.position, updated_at = SYSUTCDATETIME() \
WHEN NOT MATCHED THEN INSERT (stream_name, position, updated_at) \
VALUES (s.stream_name, s.position, SYSUTCDATETIME());";

pub struct TableStore {
    conn: SqlConnection,
    stream_name: String,
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
        }
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
    }
}

//! The checkpoint store in the source database: `dbo.mssql_ces_checkpoint`
//! (created by `sql/04_checkpoint_table.sql`), one row per stream name, upserted
//! with `MERGE`.

use tiberius::ToSql;

use super::{CheckpointError, parse, render};
use crate::source::poller::Position;
use crate::source::queries::{CHECKPOINT_READ, CHECKPOINT_WRITE};
use crate::source::sqlserver::{SqlServerConfig, TdsClient, classify, connect};

pub struct TableStore {
    settings: SqlServerConfig,
    stream_name: String,
    client: Option<TdsClient>,
}

const LOCATION: &str = "table dbo.mssql_ces_checkpoint";

fn error(reason: impl ToString) -> CheckpointError {
    CheckpointError::Io {
        location: LOCATION.into(),
        reason: reason.to_string(),
    }
}

impl TableStore {
    pub fn new(settings: SqlServerConfig, stream_name: impl Into<String>) -> Self {
        TableStore {
            settings,
            stream_name: stream_name.into(),
            client: None,
        }
    }

    async fn query(
        &mut self,
        sql: &str,
        params: &[&dyn ToSql],
    ) -> Result<Vec<tiberius::Row>, CheckpointError> {
        if self.client.is_none() {
            self.client = Some(connect(&self.settings).await.map_err(error)?);
        }
        let Some(client) = self.client.as_mut() else {
            return Err(error("no connection"));
        };
        let result = match client.query(sql, params).await {
            Ok(stream) => stream.into_first_result().await,
            Err(e) => Err(e),
        };
        result.map_err(|e| {
            self.client = None;
            error(classify(&e))
        })
    }

    pub async fn load(&mut self) -> Result<Option<Position>, CheckpointError> {
        let name = self.stream_name.clone();
        let rows = self.query(CHECKPOINT_READ, &[&name]).await?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let text: Option<&str> = row.try_get(0).map_err(error)?;
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

//! A **synthetic** source of large transactions: `transactions` transactions of
//! `rows` inserts each into one table (`dbo.bulk`), generated as they are read.
//!
//! The simulator keeps every change row of a committed transaction in memory, as SQL
//! Server keeps them in the change table; for a transaction of a million rows that is
//! the simulator's memory, not the poller's. This source makes each page on demand
//! from its key, so what a run holds while it streams such a transaction is only the
//! poller's and the pipeline's own: what `[source.synthetic] transaction_rows`
//! measures. It answers the same queries as the simulator, in the same order and
//! with the same keys (`__$command_id` and `__$seqval` count the rows).

use chrono::{NaiveDate, NaiveDateTime};
use uuid::Uuid;

use crate::event::Value;
use crate::event::value::{Length, SqlType};
use crate::lsn::Lsn;
use crate::source::{
    CaptureDdl, CaptureInstance, CaptureSettings, CapturedColumn, Catalog, CdcJob, CdcReads,
    ChangeRow, CommitTime, DdlEvent, Fact, FactReads, MaxLsn, Probe, ProbeResult, RowKey,
    ServerFacts, SourceClock, SourceError, TableCursor, TableReads, op,
};

const INSTANCE: &str = "dbo_bulk";
/// `start_lsn` of the capture instance; transaction `t` commits at `FIRST + 1 + t`.
const FIRST: u128 = 0x0000_00B1_0000_0000_0000;

/// Large transactions, generated on read.
pub struct BulkSource {
    transactions: u64,
    rows: u64,
    guid: Uuid,
    start: NaiveDateTime,
}

impl BulkSource {
    /// `transactions` transactions of `rows` inserts each.
    pub fn new(seed: u64, transactions: u64, rows: u64) -> Self {
        BulkSource {
            transactions,
            rows: rows.max(1),
            guid: Uuid::from_u64_pair(0x4255_4c4b_0000_0000, seed),
            start: NaiveDate::from_ymd_opt(2026, 8, 7)
                .and_then(|d| d.and_hms_opt(16, 25, 0))
                .unwrap_or_default(),
        }
    }

    fn lsn(offset: u128) -> Lsn {
        Lsn::from_u128(FIRST + offset).unwrap_or(Lsn::MAX)
    }

    fn commit_lsn(t: u64) -> Lsn {
        Self::lsn(1 + u128::from(t))
    }

    /// The transaction committed at `lsn`, if it is one of ours.
    fn transaction_at(&self, lsn: Lsn) -> Option<u64> {
        let t = lsn.to_u128().checked_sub(FIRST + 1)?;
        u64::try_from(t).ok().filter(|&t| t < self.transactions)
    }

    fn max_lsn_now(&self) -> Option<Lsn> {
        self.transactions
            .checked_sub(1)
            .map(Self::commit_lsn)
            .or(Some(Self::lsn(0)))
    }

    fn instance(&self) -> CaptureInstance {
        let column = |name: &str, ordinal: u32, sql_type| CapturedColumn {
            name: name.into(),
            ordinal,
            table_index: Some(ordinal - 1),
            dropped: None,
            sql_type: Ok(sql_type),
            computed: false,
            nullable: Some(true),
            default: None,
        };
        CaptureInstance {
            name: INSTANCE.into(),
            schema: "dbo".into(),
            table: "bulk".into(),
            object_id: 1_000,
            start_lsn: Some(Self::lsn(0)),
            create_date: self.start,
            columns: vec![
                column("id", 1, SqlType::BigInt),
                column("payload", 2, SqlType::NVarChar(Length::Bounded(100))),
            ],
            has_command_id: true,
            options: Default::default(),
            key_columns: vec!["id".into()],
            descending_keys: Vec::new(),
        }
    }

    /// The first row strictly after `after`: (transaction, row), rows counted from 1.
    fn next_after(&self, after: &RowKey) -> (u64, u64) {
        match self.transaction_at(after.start_lsn) {
            Some(t) if u64::try_from(after.command_id).unwrap_or(0) < self.rows => {
                (t, u64::try_from(after.command_id).unwrap_or(0) + 1)
            }
            Some(t) => (t + 1, 1),
            None if after.start_lsn < Self::commit_lsn(0) => (0, 1),
            None => (self.transactions, 1),
        }
    }

    fn row(&self, t: u64, k: u64) -> ChangeRow {
        let commit = Self::commit_lsn(t);
        let id = i64::try_from(t * self.rows + k).unwrap_or(i64::MAX);
        ChangeRow {
            key: RowKey {
                start_lsn: commit,
                command_id: i32::try_from(k).unwrap_or(i32::MAX),
                seqval: Lsn::from_u128(u128::from(k)).unwrap_or(Lsn::MAX),
                operation: op::INSERT,
            },
            update_mask: vec![0x03],
            begin_lsn: commit,
            end_time: self.start + chrono::Duration::seconds(i64::try_from(t).unwrap_or(0)),
            end_time_offsets: Some(crate::source::ServerOffsets {
                at: 0,
                hour_later: 0,
            }),
            values: vec![
                Value::BigInt(id),
                Value::Text(format!("row {k} of transaction {t}")),
            ],
        }
    }
}

impl CdcReads for BulkSource {
    async fn catalog(&mut self) -> Result<Catalog, SourceError> {
        Ok(Catalog {
            server: "synthetic".into(),
            database: "bulk".into(),
            database_guid: Some(self.guid),
            local_database_guid: Some(self.guid),
            server_utc_offset_minutes: 0,
            server_time_zone: Some("UTC".into()),
            version: 1,
            invisible: Vec::new(),
            instances: vec![self.instance()],
        })
    }

    async fn max_lsn(&mut self) -> Result<MaxLsn, SourceError> {
        Ok(MaxLsn {
            lsn: self.max_lsn_now(),
            catalog_version: 1,
        })
    }

    async fn min_lsn(&mut self, _capture_instance: &str) -> Result<Option<Lsn>, SourceError> {
        Ok(Some(Self::lsn(0)))
    }

    async fn probe(&mut self, probes: &[Probe], to: Lsn) -> Result<Vec<ProbeResult>, SourceError> {
        Ok(probes
            .iter()
            .map(|p| {
                let (t, _) = self.next_after(&RowKey::after_lsn(p.after));
                let next = (t < self.transactions)
                    .then(|| Self::commit_lsn(t))
                    .filter(|&l| l <= to);
                ProbeResult {
                    capture_instance: p.capture_instance.clone(),
                    min_lsn: Some(Self::lsn(0)),
                    next_change: next,
                }
            })
            .collect())
    }

    async fn read_changes(
        &mut self,
        _instance: &CaptureInstance,
        after: RowKey,
        to: Lsn,
        limit: usize,
    ) -> Result<Vec<ChangeRow>, SourceError> {
        let (mut t, mut k) = self.next_after(&after);
        let mut out = Vec::with_capacity(limit.min(4096));
        while out.len() < limit && t < self.transactions && Self::commit_lsn(t) <= to {
            out.push(self.row(t, k));
            if k < self.rows {
                k += 1;
            } else {
                (t, k) = (t + 1, 1);
            }
        }
        Ok(out)
    }

    async fn ddl_history(&mut self, _capture_instance: &str) -> Result<Vec<DdlEvent>, SourceError> {
        Ok(Vec::new())
    }

    async fn lsn_time(&mut self, lsn: Lsn) -> Result<Option<CommitTime>, SourceError> {
        Ok(self.transaction_at(lsn).map(|t| CommitTime {
            local: self.start + chrono::Duration::seconds(i64::try_from(t).unwrap_or(0)),
            offsets: Some(crate::source::ServerOffsets {
                at: 0,
                hour_later: 0,
            }),
        }))
    }
}

impl TableReads for BulkSource {
    /// `dbo.bulk` held no rows before CDC: all of them come as changes.
    async fn table_rows(
        &mut self,
        _instance: &CaptureInstance,
    ) -> Result<Option<u64>, SourceError> {
        Ok(Some(0))
    }

    async fn read_table(
        &mut self,
        _instance: &CaptureInstance,
        _cursor: TableCursor<'_>,
        _limit: usize,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        Ok(Vec::new())
    }
}

impl FactReads for BulkSource {
    async fn server_facts(&mut self) -> Result<ServerFacts, SourceError> {
        Ok(ServerFacts {
            product_version: "16.0.4135.4".into(),
            edition: "synthetic (bulk transactions)".into(),
            engine_edition: 3,
            database: "bulk".into(),
            cdc_enabled: true,
            encrypted: None,
            local_time: self.start,
            agent: Fact::Known("Running".into()),
            jobs: Fact::Known(vec![CdcJob::capture(CaptureSettings::DEFAULT)]),
            capture_running: Fact::Known(true),
            log_scan: Fact::Known(None),
            // SQL Server's default.
            max_text_repl_size: Fact::Known(65_536),
        })
    }
}

impl CaptureDdl for BulkSource {}

impl SourceClock for BulkSource {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::poller::{PollOutcome, Poller, PollerConfig};

    /// Every row once, in order, numbered within its transaction, only the last of
    /// each transaction final; pages of `page_size` over transaction boundaries.
    #[tokio::test]
    async fn the_poller_reads_every_row_of_every_transaction_once_in_order() {
        let config = PollerConfig {
            page_size: 7,
            batch_size: 10,
            ..PollerConfig::default()
        };
        let mut poller = Poller::new(BulkSource::new(1, 3, 25), config, None);
        let mut seen = Vec::new();
        loop {
            match poller.poll().await.expect("poll") {
                PollOutcome::Idle => break,
                PollOutcome::Batch(batch) => {
                    assert!(batch.changes.len() <= 10);
                    for c in batch.changes {
                        let Some(Value::BigInt(id)) = c.current.as_ref().and_then(|r| r.first())
                        else {
                            panic!("an insert with an id");
                        };
                        seen.push((*id, c.sequence_number, c.last_in_transaction));
                    }
                }
            }
        }
        assert_eq!(seen.len(), 75);
        // The columns' positions in the table (`cols[].index`), and an LSN past the
        // last transaction belongs to none.
        let mut source = BulkSource::new(1, 3, 25);
        let catalog = source.catalog().await.expect("catalog");
        let indexes: Vec<Option<u32>> = catalog.instances[0]
            .columns
            .iter()
            .map(|c| c.table_index)
            .collect();
        assert_eq!(indexes, [Some(0), Some(1)]);
        assert_eq!(source.transaction_at(BulkSource::commit_lsn(3)), None);
        assert_eq!(source.transaction_at(BulkSource::commit_lsn(2)), Some(2));
        for (i, (id, sequence, last)) in seen.iter().enumerate() {
            let (t, k) = (i as u64 / 25, i as u64 % 25 + 1);
            assert_eq!(*id, (t * 25 + k) as i64);
            assert_eq!(*sequence, k);
            assert_eq!(*last, k == 25, "row {k} of transaction {t}");
        }
    }
}

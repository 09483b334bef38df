//! The simulator's cost model hook: what a change page costs on the server.

use std::sync::Arc;

use mssql_ces::lsn::Lsn;
use mssql_ces::source::RowKey;

/// What SQL Server examines to answer one page of the change query: given the
/// change table's keys in its clustered index's order (`key(i)` of `len`), the
/// keyset to resume after, the upper LSN and the page size, the rows its seeks
/// read. Built from the query text the SQL Server source sends (the test kit's
/// seek-cost analyzer), so that the simulator charges what that query would cost.
#[derive(Clone)]
pub struct SeekCost(
    /// The model: `(key(i), len, after, to, limit)` → rows examined.
    #[allow(clippy::type_complexity)]
    Arc<dyn Fn(&dyn Fn(usize) -> RowKey, usize, &RowKey, Lsn, usize) -> usize + Send + Sync>,
);

impl SeekCost {
    pub fn new(
        cost: impl Fn(&dyn Fn(usize) -> RowKey, usize, &RowKey, Lsn, usize) -> usize
        + Send
        + Sync
        + 'static,
    ) -> Self {
        SeekCost(Arc::new(cost))
    }

    /// Rows examined for one page.
    pub(super) fn examined(
        &self,
        key: &dyn Fn(usize) -> RowKey,
        len: usize,
        after: &RowKey,
        to: Lsn,
        limit: usize,
    ) -> usize {
        (self.0)(key, len, after, to, limit)
    }
}

impl std::fmt::Debug for SeekCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SeekCost")
    }
}

/// What a keyed table read costs in time: a server's work and the network's, as a
/// statement's round trip plus a time per row sent. The reader waits it out (with
/// the lock released), so reads on several connections overlap as on a server with
/// the cores and the I/O for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLatency {
    pub statement: std::time::Duration,
    pub per_row: std::time::Duration,
}

impl ReadLatency {
    /// The time a read of `rows` rows takes.
    pub fn of(&self, rows: usize) -> std::time::Duration {
        self.statement + self.per_row * u32::try_from(rows).unwrap_or(u32::MAX)
    }
}

//! What callers ask of a CDC database, one trait per kind of caller.
//!
//! Every method is one round trip to the database (or none), so the cost of a poll
//! is known: an idle poll is [`max_lsn`](CdcReads::max_lsn) alone, and a poll with
//! work is that, one [`probe`](CdcReads::probe) for all capture instances, and per
//! page read one [`read_changes`](CdcReads::read_changes) and one
//! [`min_lsn`](CdcReads::min_lsn) (the re-check that catches cleanup racing the read).
//!
//! | trait | asked by | what |
//! |---|---|---|
//! | [`CdcReads`] | the poll loop (catalog tracker, merge, shape announcer) | the catalog, LSNs, change rows, DDL history, commit times |
//! | [`TableReads`] | the initial load | source-table estimates and rows |
//! | [`FactReads`] | `check`, the load's retention estimate | the server's version, Agent, jobs, scans |
//! | [`CaptureDdl`] | managed capture, cleanup after delivery | enabling and disabling capture, what is not captured, cleaning change tables |
//! | [`SourceClock`] | ages measured from commit times | the source's own clock |
//!
//! [`ChangeSource`] is all of them, what a poller or `check` is given; each part
//! names only the trait it needs, so a reader sees which part may change capture.

use std::future::Future;

use crate::event::Value;
use crate::lsn::Lsn;
use crate::source::{
    CaptureInstance, Catalog, ChangeRow, Cleaned, CommitTime, DdlEvent, EnableCapture, Fact,
    LogScan, MaxLsn, Probe, ProbeResult, RowKey, ServerFacts, SourceError, UncapturedColumns,
    UncapturedTable,
};

/// What the poll loop reads every poll: the catalog, LSNs, change rows and DDL.
pub trait CdcReads: Send {
    /// The database, its GUID and its capture instances.
    fn catalog(&mut self) -> impl Future<Output = Result<Catalog, SourceError>> + Send;

    /// `sys.fn_cdc_get_max_lsn()` and the catalog's fingerprint.
    fn max_lsn(&mut self) -> impl Future<Output = Result<MaxLsn, SourceError>> + Send;

    /// `sys.fn_cdc_get_min_lsn(capture_instance)`; `None` when it is 0x00.
    fn min_lsn(
        &mut self,
        capture_instance: &str,
    ) -> impl Future<Output = Result<Option<Lsn>, SourceError>> + Send;

    /// For every probe at once: the instance's `min_lsn` and its first change in
    /// (`after`, `to`].
    fn probe(
        &mut self,
        probes: &[Probe],
        to: Lsn,
    ) -> impl Future<Output = Result<Vec<ProbeResult>, SourceError>> + Send;

    /// Up to `limit` rows of `instance` strictly after `after` with
    /// `__$start_lsn <= to`, in [`RowKey`] order. Values are in the order of
    /// [`CaptureInstance::emitted_columns`].
    fn read_changes(
        &mut self,
        instance: &CaptureInstance,
        after: RowKey,
        to: Lsn,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ChangeRow>, SourceError>> + Send;

    /// The DDL recorded for a capture instance's source table.
    fn ddl_history(
        &mut self,
        capture_instance: &str,
    ) -> impl Future<Output = Result<Vec<DdlEvent>, SourceError>> + Send;

    /// `sys.fn_cdc_map_lsn_to_time(lsn)`: the server-local commit time of the
    /// transaction at `lsn` (the latest one at or before it), with the offsets the
    /// server's zone gives it where the server names its zone; `None` when
    /// `cdc.lsn_time_mapping` no longer holds it.
    fn lsn_time(
        &mut self,
        lsn: Lsn,
    ) -> impl Future<Output = Result<Option<CommitTime>, SourceError>> + Send;

    /// Whether changes are known to be on their way although none is there now: a
    /// paced workload that has not generated all of its transactions. A database
    /// cannot know its future writes, so by default nothing new means idle.
    fn more_expected(&self) -> bool {
        false
    }
}

/// What the initial load reads from source tables.
pub trait TableReads: Send {
    /// The number of rows in `instance`'s source table as the server estimates it
    /// (`sys.partitions`, no scan); `None` when it cannot tell.
    fn table_rows(
        &mut self,
        instance: &CaptureInstance,
    ) -> impl Future<Output = Result<Option<u64>, SourceError>> + Send;

    /// Up to `limit` committed rows of `instance`'s source table, read without a
    /// long transaction or table lock: a keyed table in the order of
    /// [`CaptureInstance::key_columns`] (keyset pagination: each call is one statement
    /// seeking past `cursor`), a table without a key as one ordered pass. Values are
    /// in the order of [`CaptureInstance::emitted_columns`], with the types and
    /// decoding of [`read_changes`](CdcReads::read_changes).
    fn read_table(
        &mut self,
        instance: &CaptureInstance,
        cursor: TableCursor<'_>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Vec<Value>>, SourceError>> + Send;

    /// Rows of a keyed table spread over it, in its index's order, with the values
    /// of [`read_table`](Self::read_table): where a load over several connections
    /// cuts the table into key ranges. None (the default) reads it as one range.
    fn sample_rows(
        &mut self,
        instance: &CaptureInstance,
    ) -> impl Future<Output = Result<Vec<Vec<Value>>, SourceError>> + Send {
        let _ = instance;
        std::future::ready(Ok(Vec::new()))
    }
}

/// What `mssql-ces check` asks beyond the poll loop's needs.
pub trait FactReads: Send {
    /// Version, CDC, the Agent and its jobs, the last log scan. Parts this login
    /// may not read are [`Fact::Unknown`](crate::source::Fact::Unknown), saying which
    /// permission would show them.
    fn server_facts(&mut self) -> impl Future<Output = Result<ServerFacts, SourceError>> + Send;

    /// The capture job's latest log scan session alone (what the daemon watches);
    /// by default taken from [`server_facts`](Self::server_facts).
    fn log_scan(
        &mut self,
    ) -> impl Future<Output = Result<Fact<Option<LogScan>>, SourceError>> + Send {
        async { Ok(self.server_facts().await?.log_scan) }
    }
}

/// What managed capture asks and does. A source that cannot manage capture keeps
/// the defaults: it may not, and says so when asked to.
pub trait CaptureDdl: Send {
    /// Whether this login may enable and disable capture instances
    /// (`IS_ROLEMEMBER('db_owner')`); a source that cannot says no.
    fn may_manage_capture(&mut self) -> impl Future<Output = Result<bool, SourceError>> + Send {
        std::future::ready(Ok(false))
    }

    /// `sys.sp_cdc_enable_table` as `request` says.
    fn enable_capture(
        &mut self,
        request: &EnableCapture,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        std::future::ready(Err(SourceError::definite(format!(
            "this source cannot enable CDC on {}.{}",
            request.schema, request.table
        ))))
    }

    /// `sys.sp_cdc_disable_table` for one capture instance of a table.
    fn disable_capture(
        &mut self,
        instance: &CaptureInstance,
    ) -> impl Future<Output = Result<(), SourceError>> + Send {
        std::future::ready(Err(SourceError::definite(format!(
            "this source cannot disable capture instance {}",
            instance.name
        ))))
    }

    /// Per capture instance, the columns of its source table it does not capture,
    /// and how far the capture job had got at the read, in one round trip.
    fn uncaptured_columns(
        &mut self,
    ) -> impl Future<Output = Result<UncapturedColumns, SourceError>> + Send {
        std::future::ready(Ok(UncapturedColumns::default()))
    }

    /// `source.cleanup = "after_delivery"`: `sys.sp_cdc_cleanup_change_table` for
    /// `capture_instance` with the latest commit at or below `through` as the new
    /// low-water mark, run only when that is above the instance's low end. A source
    /// that cannot says so.
    fn cleanup_change_table(
        &mut self,
        capture_instance: &str,
        through: Lsn,
    ) -> impl Future<Output = Result<Cleaned, SourceError>> + Send {
        let _ = through;
        std::future::ready(Err(SourceError::definite(format!(
            "this source cannot clean the change table of capture instance {capture_instance}"
        ))))
    }

    /// The user tables CDC does not capture.
    fn uncaptured_tables(
        &mut self,
    ) -> impl Future<Output = Result<Vec<UncapturedTable>, SourceError>> + Send {
        std::future::ready(Ok(Vec::new()))
    }
}

/// The source's clock, for ages measured from a commit time (how long ago the load's
/// LSN was committed).
pub trait SourceClock {
    /// The source's own clock in UTC when it is not the wall clock (a simulator's,
    /// whose commit times are simulated); `None`: the wall clock.
    fn clock(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        None
    }
}

/// A whole CDC database: everything a poller or `check` may ask of it.
pub trait ChangeSource: CdcReads + TableReads + FactReads + CaptureDdl + SourceClock {}

impl<S: CdcReads + TableReads + FactReads + CaptureDdl + SourceClock> ChangeSource for S {}

/// Where a read of a source table ([`TableReads::read_table`]) starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableCursor<'a> {
    /// The first rows: a keyed table from its smallest key; a table without a key
    /// starts a new pass over all its rows.
    Start,
    /// A keyed table: the rows whose key is greater than these key values (the text
    /// forms of [`Value::to_text`], in key order; `None` is NULL).
    AfterKey(&'a [Option<String>]),
    /// A table without a key: the next rows of the pass [`TableCursor::Start`] began.
    Continue,
}

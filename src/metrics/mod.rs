//! What a run reports while it runs: Prometheus metrics and the health probes, served
//! over HTTP when `[metrics] listen` is set.
//!
//! - `/metrics`: the Prometheus text format (the `prometheus-client` registry and
//!   encoder; nothing is formatted here).
//! - `/healthz`: alive and making progress (a poll finished or a delivery was
//!   acknowledged within `metrics.stalled_after_ms`), or waiting by choice (a hot
//!   standby waiting for the lease).
//! - `/readyz`: the source answered its last poll, the sink is connected and has
//!   acknowledged a delivery within `sink::ACKNOWLEDGEMENT_WAIT` whenever messages
//!   wait, and the run is not waiting for the lease.
//!
//! The pipeline updates the metrics once per poll and once per acknowledged batch,
//! never per event: counts by table and operation are gathered per batch
//! ([`BatchCounts`]) and added when the destination has acknowledged the whole batch,
//! so the counters say what was delivered. Gauges that depend on the time (lag,
//! checkpoint age) are computed when scraped.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

mod admin;
mod set;
pub use set::{MetricsSet, Observed, merge};

use crate::config::AdminAccess;
use tokio_util::sync::CancellationToken;

use crate::event::{Operation, TableDescription};
use crate::lsn::Lsn;
use crate::sink::{SinkError, SinkHealth};
use crate::source::SourceError;

/// Why the metrics could not be served.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics.listen = {address}: cannot listen there")]
    Bind {
        address: String,
        #[source]
        cause: std::io::Error,
    },
}

/// Labels of the per-table counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableOperation {
    /// `schema.table`.
    table: String,
    /// `INS`, `UPD` or `DEL`.
    operation: &'static str,
}

/// The `kind` label of error counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    kind: &'static str,
}

/// The `table` label of the load gauges.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Table {
    /// `schema.table`.
    table: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Action {
    action: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildInfo {
    version: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The run's metrics and health state.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    events: Family<TableOperation, Counter>,
    messages: Family<TableOperation, Counter>,
    bytes: Family<TableOperation, Counter>,
    truncated_values: Counter,
    segmented_events: Counter,
    delivery_retries: Counter,
    delivery_errors: Family<Kind, Counter>,
    source_errors: Family<Kind, Counter>,
    polls: Counter,
    rows_per_poll: Histogram,
    poll_duration: Histogram,
    lag: FloatGauge,
    lsn_lag: FloatGauge,
    checkpoint_age: FloatGauge,
    checkpoint_writes: Counter,
    capture_instances: Gauge,
    batches_in_flight: Gauge,
    load_rows: Family<Table, Gauge>,
    load_rows_estimated: Family<Table, Gauge>,
    load_rows_per_second: Family<Table, FloatGauge>,
    load_tables: Gauge,
    resnapshot_rows: Family<Table, Gauge>,
    resnapshot_chunks: Family<Table, Gauge>,
    resnapshot_superseded: Family<Table, Gauge>,
    resnapshot_tables: Gauge,
    heartbeats: Counter,
    heartbeat_time: FloatGauge,
    /// Where `POST /snapshot/…` hands its requests: the running poller's.
    snapshots: Mutex<Option<crate::source::poller::SnapshotHandle>>,
    table_shape_version: Family<Table, Gauge>,
    schema_change_events: Family<Table, Counter>,
    capture_actions: Family<Action, Counter>,
    capture_job_latency: FloatGauge,
    capture_job_transactions: FloatGauge,
    capture_job_transactions_total: Counter,
    table_delivered_commit: Family<Table, FloatGauge>,
    oldest_undelivered: FloatGauge,
    retention_headroom: FloatGauge,
    stalled_after: Duration,
    state: Mutex<RunState>,
}

#[derive(Debug)]
struct RunState {
    started: Instant,
    /// Waiting for the lease: healthy, not ready.
    standby: bool,
    last_progress: Instant,
    /// A poll has succeeded since the start.
    polled: bool,
    /// The last poll succeeded (false while the source is retrying).
    source_ok: bool,
    /// The last poll found nothing new.
    idle: bool,
    /// The first commit time of each batch in flight, oldest first (acknowledged
    /// in the order sent).
    in_flight_commits: std::collections::VecDeque<Option<DateTime<Utc>>>,
    /// The cleanup job's retention, as the source last read it.
    retention: crate::source::poller::Retention,
    /// The capture job's transactions since the server started, as last read.
    capture_job_total: Option<i64>,
    /// Batches the source produced, and those the destination acknowledged: caught
    /// up when equal and the source idle (batches wait between the two stages).
    produced: u64,
    acknowledged: u64,
    delivered_commit: Option<DateTime<Utc>>,
    delivered_lsn: Option<Lsn>,
    max_lsn: Option<Lsn>,
    last_checkpoint: Option<Instant>,
    /// The sink's re-send count already added to the counter.
    retries_seen: u64,
    sink: Option<Arc<SinkHealth>>,
}

impl RunState {
    fn new() -> Self {
        RunState {
            started: Instant::now(),
            standby: false,
            last_progress: Instant::now(),
            polled: false,
            source_ok: false,
            idle: false,
            in_flight_commits: std::collections::VecDeque::new(),
            retention: crate::source::poller::Retention::Unknown,
            capture_job_total: None,
            produced: 0,
            acknowledged: 0,
            delivered_commit: None,
            delivered_lsn: None,
            max_lsn: None,
            last_checkpoint: None,
            retries_seen: 0,
            sink: None,
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(Duration::from_secs(300))
    }
}

impl Metrics {
    /// Metrics of a run whose `/healthz` fails after `stalled_after` without progress.
    pub fn new(stalled_after: Duration) -> Self {
        Self::with_registry(stalled_after, Registry::default())
    }

    /// Metrics of one of many databases: every series labelled
    /// `database="<name>"`.
    pub fn for_database(stalled_after: Duration, database: &str) -> Self {
        let label = (
            std::borrow::Cow::Borrowed("database"),
            std::borrow::Cow::Owned(database.to_owned()),
        );
        Self::with_registry(stalled_after, Registry::with_labels(std::iter::once(label)))
    }

    fn with_registry(stalled_after: Duration, mut registry: Registry) -> Self {
        let start_time = FloatGauge::default();
        start_time.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, in seconds",
            start_time,
        );
        let mut metrics = Metrics {
            registry,
            events: Family::default(),
            messages: Family::default(),
            bytes: Family::default(),
            truncated_values: Counter::default(),
            segmented_events: Counter::default(),
            delivery_retries: Counter::default(),
            delivery_errors: Family::default(),
            source_errors: Family::default(),
            polls: Counter::default(),
            // 0, then 1 to 100,000 by tens: a poll reads up to source.batch_size rows.
            rows_per_poll: Histogram::new(
                std::iter::once(0.0).chain(exponential_buckets(1.0, 10.0, 6)),
            ),
            // 1 ms to about 16 s.
            poll_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            lag: FloatGauge::default(),
            lsn_lag: FloatGauge::default(),
            checkpoint_age: FloatGauge::default(),
            checkpoint_writes: Counter::default(),
            capture_instances: Gauge::default(),
            batches_in_flight: Gauge::default(),
            load_rows: Family::default(),
            load_rows_estimated: Family::default(),
            load_rows_per_second: Family::default(),
            load_tables: Gauge::default(),
            resnapshot_rows: Family::default(),
            resnapshot_chunks: Family::default(),
            resnapshot_superseded: Family::default(),
            resnapshot_tables: Gauge::default(),
            heartbeats: Counter::default(),
            heartbeat_time: FloatGauge::default(),
            snapshots: Mutex::new(None),
            table_shape_version: Family::default(),
            schema_change_events: Family::default(),
            capture_actions: Family::default(),
            capture_job_latency: FloatGauge::default(),
            capture_job_transactions: FloatGauge::default(),
            capture_job_transactions_total: Counter::default(),
            table_delivered_commit: Family::default(),
            oldest_undelivered: FloatGauge::default(),
            retention_headroom: FloatGauge::default(),
            stalled_after,
            state: Mutex::new(RunState::new()),
        };
        metrics.set_capture_job(None);
        // Every kind exists from the start at 0, so that `increase(…) > 0` sees the
        // first error (a series that appears at 1 has no increase).
        for kind in DELIVERY_ERROR_KINDS {
            let _ = metrics.delivery_errors.get_or_create(&Kind { kind });
        }
        for kind in SOURCE_ERROR_KINDS {
            let _ = metrics.source_errors.get_or_create(&Kind { kind });
        }
        // Registered in this order, which is the order of the exposition.
        let mut registry = std::mem::take(&mut metrics.registry);
        let ours = registry.sub_registry_with_prefix("mssql_ces");
        let build = Family::<BuildInfo, Gauge>::default();
        build
            .get_or_create(&BuildInfo {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        ours.register("build_info", "The running version (always 1)", build);
        Self::register_delivery(ours, &metrics);
        Self::register_source(ours, &metrics);
        Self::register_progress(ours, &metrics);
        Self::register_loads(ours, &metrics);
        metrics.registry = registry;
        metrics
    }

    /// What was delivered, and the sink's retries and errors.
    fn register_delivery(ours: &mut Registry, m: &Metrics) {
        ours.register(
            "events",
            "Events delivered (acknowledged by the destination), by table and operation",
            m.events.clone(),
        );
        ours.register(
            "messages",
            "Messages delivered (an event is several when segmented), by table and operation",
            m.messages.clone(),
        );
        ours.register_with_unit(
            "delivered",
            "Message payload bytes delivered, by table and operation",
            Unit::Bytes,
            m.bytes.clone(),
        );
        ours.register(
            "truncated_values",
            "Column values truncated to 1 MiB in delivered events",
            m.truncated_values.clone(),
        );
        ours.register(
            "segmented_events",
            "Delivered events that took more than one message",
            m.segmented_events.clone(),
        );
        ours.register(
            "delivery_retries",
            "Messages or batches the sink sent again (broker retries, Event Hubs re-sends)",
            m.delivery_retries.clone(),
        );
        ours.register(
            "delivery_errors",
            "Deliveries that failed, by kind (transient, definite, io)",
            m.delivery_errors.clone(),
        );
    }

    /// The source's errors and polls.
    fn register_source(ours: &mut Registry, m: &Metrics) {
        ours.register(
            "source_errors",
            "Failed polls, by kind (transient: retried; definite: the run stops)",
            m.source_errors.clone(),
        );
        ours.register(
            "source_polls",
            "Polls of the CDC source that succeeded",
            m.polls.clone(),
        );
        ours.register(
            "source_rows_per_poll",
            "Changes returned by each successful poll",
            m.rows_per_poll.clone(),
        );
        ours.register_with_unit(
            "source_poll_duration",
            "Time each successful poll took",
            Unit::Seconds,
            m.poll_duration.clone(),
        );
    }

    /// How far behind the run is, and its checkpoints and batches in flight.
    fn register_progress(ours: &mut Registry, m: &Metrics) {
        ours.register_with_unit(
            "lag",
            "Now minus the commit time of the last delivered event; 0 when caught up, NaN before the first delivery",
            Unit::Seconds,
            m.lag.clone(),
        );
        ours.register(
            "lsn_lag",
            "CDC's max_lsn minus the last delivered commit LSN, as 80-bit numbers (VLF * 2^48 + block * 2^16 + slot); 0 when caught up",
            m.lsn_lag.clone(),
        );
        ours.register_with_unit(
            "oldest_undelivered",
            "Now minus the commit time of the oldest event sent and not yet acknowledged; 0 when nothing is in flight",
            Unit::Seconds,
            m.oldest_undelivered.clone(),
        );
        ours.register_with_unit(
            "retention_headroom",
            "The cleanup job's retention minus the lag: how much longer the stream may fall behind before changes it has not delivered are purged; +Inf without a cleanup job, NaN when the retention is not read (metrics read it every 10 catalog refreshes) or nothing was delivered yet",
            Unit::Seconds,
            m.retention_headroom.clone(),
        );
        ours.register(
            "table_delivered_commit_timestamp_seconds",
            "Commit time of the last delivered event of each table, in seconds since the Unix epoch",
            m.table_delivered_commit.clone(),
        );
        ours.register_with_unit(
            "checkpoint_age",
            "Time since the last checkpoint write (since the start before the first)",
            Unit::Seconds,
            m.checkpoint_age.clone(),
        );
        ours.register(
            "checkpoint_writes",
            "Checkpoint writes",
            m.checkpoint_writes.clone(),
        );
        ours.register(
            "capture_instances",
            "Capture instances the poller tracks",
            m.capture_instances.clone(),
        );
        ours.register(
            "batches_in_flight",
            "Batches sent and not yet acknowledged",
            m.batches_in_flight.clone(),
        );
        ours.register_with_unit(
            "capture_job_latency",
            "How far the capture job's latest log scan session was behind the log (sys.dm_cdc_log_scan_sessions.latency); NaN when not read",
            Unit::Seconds,
            m.capture_job_latency.clone(),
        );
        ours.register(
            "capture_job_transactions",
            "Transactions the capture job took from the log since this process first read its log scan sessions (from their aggregate): rate() is the job's throughput",
            m.capture_job_transactions_total.clone(),
        );
        ours.register(
            "capture_job_scan_transactions",
            "Transactions the capture job's latest log scan session took from the log; at the job's maxtrans, the job's settings bound the stream; NaN when not read",
            m.capture_job_transactions.clone(),
        );
    }

    /// The initial loads not finished.
    fn register_loads(ours: &mut Registry, m: &Metrics) {
        ours.register(
            "load_rows",
            "Rows an unfinished initial load ([snapshot]) has sent, by table",
            m.load_rows.clone(),
        );
        ours.register(
            "load_rows_estimated",
            "Rows of a table being loaded, as sys.partitions estimated them when its load began",
            m.load_rows_estimated.clone(),
        );
        ours.register(
            "load_rows_per_second",
            "Rows per second of a table's load in this process",
            m.load_rows_per_second.clone(),
        );
        ours.register(
            "load_tables",
            "Tables whose initial load has not finished (changes stream once it is 0)",
            m.load_tables.clone(),
        );
        ours.register(
            "heartbeats",
            "Heartbeat records delivered (sink.heartbeat_interval_ms)",
            m.heartbeats.clone(),
        );
        ours.register(
            "heartbeat_timestamp_seconds",
            "When the last heartbeat record delivered was made, in seconds since 1970 (0: none yet)",
            m.heartbeat_time.clone(),
        );
        ours.register(
            "resnapshot_tables",
            "Tables being re-snapshotted (mssql-ces snapshot) while their changes stream",
            m.resnapshot_tables.clone(),
        );
        ours.register(
            "resnapshot_rows",
            "Rows a table's re-snapshot has sent (kept after it finishes, until the next)",
            m.resnapshot_rows.clone(),
        );
        ours.register(
            "resnapshot_chunks",
            "Chunks a table's re-snapshot has sent (kept after it finishes, until the next)",
            m.resnapshot_chunks.clone(),
        );
        ours.register(
            "resnapshot_superseded_rows",
            "Rows a table's re-snapshot read but did not send, because a change of the same key streamed while their chunk waited",
            m.resnapshot_superseded.clone(),
        );
        ours.register(
            "table_shape_version",
            "Version of the shape (columns, types, key) of each table's events read: 1 for the first, one more for each change",
            m.table_shape_version.clone(),
        );
        ours.register(
            "schema_change_events",
            "Schema-change events delivered (sink.schema_changes), by table",
            m.schema_change_events.clone(),
        );
        ours.register(
            "capture_instance_actions",
            "What this process did to the CDC configuration: capture instances created and disabled (source.capture_instances = \"managed\"), tables enabled (source.enable_cdc)",
            m.capture_actions.clone(),
        );
    }

    /// The cleanup job's retention, as the source last read it.
    pub fn set_retention(&self, retention: crate::source::poller::Retention) {
        self.state().retention = retention;
    }

    /// The capture job's latest log scan session, or none read.
    pub fn set_capture_job(&self, scan: Option<&crate::source::LogScan>) {
        let (latency, transactions) = scan.map_or((f64::NAN, f64::NAN), |s| {
            (s.latency_seconds as f64, s.tran_count as f64)
        });
        self.capture_job_latency.set(latency);
        self.capture_job_transactions.set(transactions);
        if let Some(total) = scan.and_then(|s| s.total_tran_count) {
            let mut state = self.state();
            // The first reading is where counting starts; a smaller total means the
            // server restarted, and every transaction since is new.
            let new = match state.capture_job_total {
                Some(last) if total >= last => total - last,
                Some(_) => total,
                None => 0,
            };
            self.capture_job_transactions_total
                .inc_by(u64::try_from(new).unwrap_or(0));
            state.capture_job_total = Some(total);
        }
    }

    /// The source's capture-instance actions so far (totals of this process).
    pub fn set_capture_actions(&self, actions: crate::source::poller::CaptureActions) {
        for (action, total) in [
            ("created", actions.created),
            ("disabled", actions.disabled),
            ("cdc_enabled", actions.tables_enabled),
        ] {
            let counter = self.capture_actions.get_or_create(&Action { action });
            let now = counter.get();
            if total > now {
                counter.inc_by(total - now);
            }
        }
    }

    /// Each table's shape version, from a batch's position.
    pub fn set_table_versions(
        &self,
        versions: &std::collections::BTreeMap<String, crate::position::TableVersion>,
    ) {
        for (table, version) in versions {
            let table = Table {
                table: table.clone(),
            };
            self.table_shape_version
                .get_or_create(&table)
                .set(i64::try_from(version.version).unwrap_or(i64::MAX));
        }
    }

    /// The unfinished loads, after a poll: a finished table's series are removed.
    pub fn set_loads(&self, loads: &[crate::source::initial_load::LoadStatus]) {
        let tables = i64::try_from(loads.len()).unwrap_or(i64::MAX);
        if tables == 0 && self.load_tables.get() == 0 {
            return;
        }
        self.load_tables.set(tables);
        self.load_rows.clear();
        self.load_rows_estimated.clear();
        self.load_rows_per_second.clear();
        for load in loads {
            let table = Table {
                table: load.table.clone(),
            };
            self.load_rows
                .get_or_create(&table)
                .set(i64::try_from(load.rows).unwrap_or(i64::MAX));
            if let Some(estimated) = load.estimated {
                self.load_rows_estimated
                    .get_or_create(&table)
                    .set(i64::try_from(estimated).unwrap_or(i64::MAX));
            }
            self.load_rows_per_second
                .get_or_create(&table)
                .set(load.rows_per_second);
        }
    }

    /// The re-snapshots under way, after a poll. A finished table's series keep
    /// their last values (its rows, chunks, superseded rows) until it is asked again.
    pub fn set_resnapshots(&self, running: &[crate::source::poller::ResnapshotStatus]) {
        if running.is_empty() && self.resnapshot_tables.get() == 0 {
            return;
        }
        let tables = running.iter().filter(|r| r.running).count();
        self.resnapshot_tables
            .set(i64::try_from(tables).unwrap_or(i64::MAX));
        for r in running {
            let table = Table {
                table: r.table.clone(),
            };
            let set = |family: &Family<Table, Gauge>, value: u64| {
                family
                    .get_or_create(&table)
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            };
            set(&self.resnapshot_rows, r.rows);
            set(&self.resnapshot_chunks, r.chunks);
            set(&self.resnapshot_superseded, r.superseded);
        }
    }

    /// The running poller's re-snapshot requests go to `handle` (`None`: no stream
    /// runs).
    pub fn set_snapshot_handle(&self, handle: Option<crate::source::poller::SnapshotHandle>) {
        *self.snapshots.lock().unwrap_or_else(|e| e.into_inner()) = handle;
    }

    /// Where re-snapshot requests go now, if a stream runs.
    pub fn snapshot_handle(&self) -> Option<crate::source::poller::SnapshotHandle> {
        self.snapshots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RunState> {
        // A panic while holding the lock leaves plain values behind: still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waiting for the lease (`true`), or holding it (`false`).
    pub fn set_standby(&self, standby: bool) {
        let mut state = self.state();
        state.standby = standby;
        state.last_progress = Instant::now();
    }

    /// The sink whose connection `/readyz` reports.
    pub fn watch_sink(&self, health: Arc<SinkHealth>) {
        self.state().sink = Some(health);
    }

    /// A poll succeeded: a batch of `rows` changes, or `None` when there was nothing
    /// new; the poller tracks `capture_instances`.
    pub fn poll_finished(&self, took: Duration, rows: Option<usize>, capture_instances: usize) {
        self.polls.inc();
        self.rows_per_poll.observe(rows.unwrap_or(0) as f64);
        self.poll_duration.observe(took.as_secs_f64());
        self.capture_instances
            .set(i64::try_from(capture_instances).unwrap_or(i64::MAX));
        let mut state = self.state();
        state.polled = true;
        state.source_ok = true;
        state.idle = rows.is_none();
        state.produced += u64::from(rows.is_some());
        state.last_progress = Instant::now();
    }

    /// A poll failed.
    pub fn poll_failed(&self, error: &SourceError) {
        let kind = if error.is_transient() {
            SOURCE_ERROR_KINDS[0]
        } else {
            SOURCE_ERROR_KINDS[1]
        };
        self.source_errors.get_or_create(&Kind { kind }).inc();
        self.state().source_ok = false;
    }

    /// A batch was handed to the acknowledgement stage; `max_lsn` is CDC's at the
    /// poll that produced it.
    pub fn batch_sent(&self, max_lsn: Lsn, counts: &BatchCounts) {
        self.batches_in_flight.inc();
        let mut state = self.state();
        state.in_flight_commits.push_back(counts.first_commit);
        if !max_lsn.is_zero() {
            state.max_lsn = state.max_lsn.max(Some(max_lsn));
        }
    }

    /// Every message of a batch was acknowledged.
    pub fn batch_delivered(&self, counts: &BatchCounts) {
        self.batches_in_flight.dec();
        for (table, operation, tally) in &counts.tables {
            let labels = TableOperation {
                table: table.qualified_name(),
                operation: operation.as_str(),
            };
            if let Some(commit) = tally.last_commit {
                let gauge = self.table_delivered_commit.get_or_create(&Table {
                    table: labels.table.clone(),
                });
                let seconds = commit.timestamp_micros() as f64 / 1e6;
                if gauge.get() < seconds {
                    gauge.set(seconds);
                }
            }
            self.events.get_or_create(&labels).inc_by(tally.events);
            self.messages.get_or_create(&labels).inc_by(tally.messages);
            self.bytes.get_or_create(&labels).inc_by(tally.bytes);
        }
        self.truncated_values.inc_by(counts.truncated_values);
        self.segmented_events.inc_by(counts.segmented_events);
        if let Some(made) = counts.heartbeat {
            self.heartbeats.inc();
            self.heartbeat_time
                .set(made.timestamp_micros() as f64 / 1e6);
        }
        for (table, _) in &counts.schema_changes {
            self.schema_change_events
                .get_or_create(&Table {
                    table: table.clone(),
                })
                .inc();
        }
        let mut state = self.state();
        state.in_flight_commits.pop_front();
        state.acknowledged += 1;
        state.last_progress = Instant::now();
        if let Some((time, lsn)) = counts.last_commit {
            state.delivered_commit = Some(time);
            state.delivered_lsn = state.delivered_lsn.max(Some(lsn));
        }
    }

    /// A send or delivery failed with `error`.
    pub fn delivery_failed(&self, error: &SinkError) {
        let kind = match error {
            SinkError::Transient { .. }
            | SinkError::Abandoned(_)
            | SinkError::ProducerLost { .. } => DELIVERY_ERROR_KINDS[0],
            SinkError::Definite { .. } => DELIVERY_ERROR_KINDS[1],
            SinkError::Io { .. } => DELIVERY_ERROR_KINDS[2],
        };
        self.delivery_errors.get_or_create(&Kind { kind }).inc();
    }

    /// The checkpoint was written.
    pub fn checkpoint_written(&self) {
        self.checkpoint_writes.inc();
        self.state().last_checkpoint = Some(Instant::now());
    }

    /// Sets the gauges that depend on the time and pulls the sink's re-send count.
    fn refresh(&self) {
        let mut state = self.state();
        let caught_up = state.idle && state.acknowledged >= state.produced;
        let lag = if caught_up {
            0.0
        } else {
            state.delivered_commit.map_or(f64::NAN, seconds_since)
        };
        self.lag.set(lag);
        use crate::source::poller::Retention;
        self.retention_headroom.set(match state.retention {
            Retention::Unknown => f64::NAN,
            Retention::Forever => f64::INFINITY,
            Retention::Kept(kept) => kept.as_secs_f64() - lag,
        });
        let lsn_lag = match (caught_up, state.max_lsn, state.delivered_lsn) {
            (true, _, _) => 0.0,
            (false, Some(max), Some(delivered)) => {
                max.to_u128().saturating_sub(delivered.to_u128()) as f64
            }
            (false, Some(max), None) => max.to_u128() as f64,
            (false, None, _) => f64::NAN,
        };
        self.lsn_lag.set(lsn_lag);
        let oldest = state
            .in_flight_commits
            .iter()
            .flatten()
            .next()
            .map_or(0.0, |t| seconds_since(*t));
        self.oldest_undelivered.set(oldest);
        let since = state.last_checkpoint.unwrap_or(state.started);
        self.checkpoint_age.set(since.elapsed().as_secs_f64());
        if let Some(sink) = &state.sink {
            let total = sink.retries();
            if total > state.retries_seen {
                self.delivery_retries.inc_by(total - state.retries_seen);
                state.retries_seen = total;
            }
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.refresh();
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        text
    }

    /// `/healthz`: whether the run is alive, and why not.
    pub fn health(&self) -> Result<String, String> {
        let state = self.state();
        if state.standby {
            return Ok("ok: standby, waiting for the lease".to_owned());
        }
        let quiet = state.last_progress.elapsed();
        if quiet < self.stalled_after {
            Ok(format!(
                "ok: last progress {:.1} s ago",
                quiet.as_secs_f64()
            ))
        } else {
            Err(format!(
                "stalled: no poll finished and no delivery acknowledged for {:.0} s (metrics.stalled_after_ms = {})",
                quiet.as_secs_f64(),
                self.stalled_after.as_millis()
            ))
        }
    }

    /// `/readyz`: whether the source and the sink are connected, and why not.
    pub fn readiness(&self) -> Result<String, String> {
        let state = self.state();
        let mut problems = Vec::new();
        if state.standby {
            problems.push("standby: another process holds the lease");
        } else if !state.polled {
            problems.push("source: no poll has succeeded yet");
        } else if !state.source_ok {
            problems.push("source: the last poll failed; retrying with backoff");
        }
        let stalled;
        match &state.sink {
            Some(sink) if sink.connected() => {
                if let Some((waiting, quiet)) = sink
                    .waiting()
                    .filter(|(_, quiet)| *quiet >= crate::sink::ACKNOWLEDGEMENT_WAIT)
                {
                    stalled = format!(
                        "sink: {waiting} messages wait and none was acknowledged for {} s (the destination is connected but does not answer)",
                        quiet.as_secs()
                    );
                    problems.push(&stalled);
                }
            }
            Some(_) => problems.push("sink: not connected to the destination"),
            None if !state.standby => problems.push("sink: not open yet"),
            None => {}
        }
        if problems.is_empty() {
            Ok("ready".to_owned())
        } else {
            Err(format!("not ready: {}", problems.join("; ")))
        }
    }
}

/// Seconds from a commit time to now (0 for a time ahead of this clock).
fn seconds_since(time: DateTime<Utc>) -> f64 {
    ((Utc::now() - time).num_milliseconds() as f64 / 1000.0).max(0.0)
}

/// Counts by table and operation, gathered while a batch is encoded and added to the
/// metrics once the destination acknowledged the batch.
#[derive(Debug, Default)]
pub struct BatchCounts {
    tables: Vec<(Arc<TableDescription>, Operation, Tally)>,
    truncated_values: u64,
    segmented_events: u64,
    /// Commit time and LSN of the batch's last event.
    last_commit: Option<(DateTime<Utc>, Lsn)>,
    /// Commit time of the batch's first event.
    first_commit: Option<DateTime<Utc>>,
    /// The table (`schema.table`) of each schema-change event of the batch, and
    /// its messages.
    schema_changes: Vec<(String, u64)>,
    /// When the batch's heartbeat record was made, if it carries one.
    heartbeat: Option<DateTime<Utc>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    events: u64,
    messages: u64,
    bytes: u64,
    /// The latest commit time of these events.
    last_commit: Option<DateTime<Utc>>,
}

impl BatchCounts {
    /// The batch carries a heartbeat record made at `made`.
    pub fn add_heartbeat(&mut self, made: DateTime<Utc>) {
        self.heartbeat = Some(made);
    }

    /// Counts one event of `table`, committed at `commit_time`, that became
    /// `messages` messages of `bytes` in all.
    pub fn add(
        &mut self,
        table: &Arc<TableDescription>,
        operation: Operation,
        commit_time: DateTime<Utc>,
        messages: u64,
        bytes: u64,
        truncated_values: u64,
    ) {
        self.first_commit.get_or_insert(commit_time);
        // Batches hold runs of one table: the last entry is the likely one.
        let found = self
            .tables
            .iter_mut()
            .rev()
            .find(|(t, o, _)| *o == operation && Arc::ptr_eq(t, table));
        let tally = match found {
            Some((_, _, tally)) => tally,
            None => {
                self.tables
                    .push((Arc::clone(table), operation, Tally::default()));
                match self.tables.last_mut() {
                    Some((_, _, tally)) => tally,
                    None => return, // just pushed
                }
            }
        };
        tally.events += 1;
        tally.messages += messages;
        tally.bytes += bytes;
        tally.last_commit = tally.last_commit.max(Some(commit_time));
        self.truncated_values += truncated_values;
        if messages > 1 {
            self.segmented_events += 1;
        }
    }

    /// Counts a schema-change event of `table` (`schema.table`) that became
    /// `messages` messages.
    pub fn add_schema_change(&mut self, table: String, messages: u64) {
        self.schema_changes.push((table, messages));
    }

    /// The batch's change events, and its messages (schema-change events' too),
    /// over all its tables.
    pub fn totals(&self) -> (u64, u64) {
        let schema_messages: u64 = self.schema_changes.iter().map(|(_, m)| m).sum();
        self.tables
            .iter()
            .fold((0, schema_messages), |(events, messages), (_, _, t)| {
                (events + t.events, messages + t.messages)
            })
    }

    /// The batch's last event was committed at `time`, LSN `lsn`.
    pub fn set_last_commit(&mut self, time: DateTime<Utc>, lsn: Lsn) {
        self.last_commit = Some((time, lsn));
    }
}

/// The `kind` label values of `mssql_ces_delivery_errors_total`.
const DELIVERY_ERROR_KINDS: [&str; 3] = ["transient", "definite", "io"];
/// The `kind` label values of `mssql_ces_source_errors_total`.
const SOURCE_ERROR_KINDS: [&str; 2] = ["transient", "definite"];

/// Binds `address` for [`serve`]; the error names the setting.
pub async fn bind(address: std::net::SocketAddr) -> Result<tokio::net::TcpListener, MetricsError> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| MetricsError::Bind {
            address: address.to_string(),
            cause: e,
        })
}

/// Serves `/metrics`, `/healthz` and `/readyz` until `stop` is cancelled, and with
/// `admin` not off `POST /snapshot/…` ([`admin`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<dyn Observed>,
    admin: AdminAccess,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let mut app = axum::Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    if admin != AdminAccess::Off {
        app = app
            .route("/snapshot/{table}", post(admin::snapshot_table))
            .route(
                "/snapshot/{database}/{table}",
                post(admin::snapshot_database_table),
            );
    }
    let app = app.with_state(Served { metrics, admin });
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(stop.cancelled_owned())
    .await
}

/// What the handlers answer from.
#[derive(Clone)]
struct Served {
    metrics: Arc<dyn Observed>,
    admin: AdminAccess,
}

type Page = (StatusCode, [(header::HeaderName, &'static str); 1], String);

async fn metrics_page(State(Served { metrics, .. }): State<Served>) -> Page {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )],
        metrics.render(),
    )
}

fn probe(result: Result<String, String>) -> Page {
    let (status, text) = match result {
        Ok(text) => (StatusCode::OK, text),
        Err(text) => (StatusCode::SERVICE_UNAVAILABLE, text),
    };
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text + "\n",
    )
}

async fn healthz(State(Served { metrics, .. }): State<Served>) -> Page {
    probe(metrics.health())
}

async fn readyz(State(Served { metrics, .. }): State<Served>) -> Page {
    probe(metrics.readiness())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_support::employees;

    /// The value of the sample `name` with exactly `labels` (`""` for none).
    fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
        let prefix = if labels.is_empty() {
            format!("{name} ")
        } else {
            format!("{name}{{{labels}}} ")
        };
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|value| value.trim().parse().ok())
    }

    #[test]
    fn table_shape_versions_are_gauges_per_table() {
        let metrics = Metrics::new(Duration::from_secs(60));
        let version = |version| crate::position::TableVersion {
            version,
            shape: uuid::Uuid::nil(),
            since: None,
            columns: None,
        };
        let mut versions = std::collections::BTreeMap::new();
        versions.insert("dbo.a".to_owned(), version(1));
        versions.insert("dbo.b".to_owned(), version(3));
        metrics.set_table_versions(&versions);
        let text = metrics.render();
        assert!(
            text.contains("mssql_ces_table_shape_version{table=\"dbo.b\"} 3"),
            "{text}"
        );
        versions.insert("dbo.a".to_owned(), version(2));
        metrics.set_table_versions(&versions);
        assert!(
            metrics
                .render()
                .contains("mssql_ces_table_shape_version{table=\"dbo.a\"} 2")
        );
    }

    #[test]
    fn schema_change_events_count_per_table_and_their_messages_in_the_totals() {
        let metrics = Metrics::new(Duration::from_secs(60));
        let mut counts = BatchCounts::default();
        counts.add_schema_change("dbo.a".into(), 2);
        counts.add_schema_change("dbo.a".into(), 1);
        counts.add_schema_change("dbo.b".into(), 1);
        assert_eq!(counts.totals(), (0, 4), "no change event, four messages");
        metrics.batch_sent(Lsn::ZERO, &counts);
        metrics.batch_delivered(&counts);
        let text = metrics.render();
        assert_eq!(
            sample(
                &text,
                "mssql_ces_schema_change_events_total",
                "table=\"dbo.a\""
            ),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                "mssql_ces_schema_change_events_total",
                "table=\"dbo.b\""
            ),
            Some(1.0)
        );
    }

    #[test]
    fn unfinished_loads_are_gauges_per_table_and_go_when_done() {
        let metrics = Metrics::default();
        let status = |table: &str, rows, estimated| crate::source::initial_load::LoadStatus {
            table: table.into(),
            rows,
            estimated,
            rows_per_second: 250.5,
        };
        metrics.set_loads(&[status("dbo.a", 1000, Some(5000)), status("dbo.b", 0, None)]);
        let text = metrics.render();
        assert!(text.contains("mssql_ces_load_tables 2"), "{text}");
        assert!(
            text.contains("mssql_ces_load_rows{table=\"dbo.a\"} 1000"),
            "{text}"
        );
        assert!(
            text.contains("mssql_ces_load_rows_estimated{table=\"dbo.a\"} 5000"),
            "{text}"
        );
        assert!(
            !text.contains("mssql_ces_load_rows_estimated{table=\"dbo.b\"}"),
            "{text}"
        );
        assert!(
            text.contains("mssql_ces_load_rows_per_second{table=\"dbo.b\"} 250.5"),
            "{text}"
        );
        metrics.set_loads(&[status("dbo.b", 10, None)]);
        let text = metrics.render();
        assert!(text.contains("mssql_ces_load_tables 1"), "{text}");
        assert!(
            !text.contains("table=\"dbo.a\""),
            "a finished table's series go: {text}"
        );
        metrics.set_loads(&[]);
        assert!(metrics.render().contains("mssql_ces_load_tables 0"));
        assert!(!metrics.render().contains("table=\"dbo.b\""));
    }

    #[test]
    fn counts_reach_the_counters_only_once_the_batch_is_delivered() {
        let metrics = Metrics::default();
        let table = employees();
        let mut counts = BatchCounts::default();
        let ago = |seconds| Utc::now() - chrono::Duration::seconds(seconds);
        let (first, last) = (ago(120), ago(30));
        counts.add(&table, Operation::Insert, first, 1, 100, 0);
        counts.add(&table, Operation::Insert, ago(60), 3, 300, 2);
        counts.add(&table, Operation::Delete, last, 1, 50, 0);
        counts.set_last_commit(last, Lsn::from_parts(1, 2, 3));
        metrics.batch_sent(Lsn::from_parts(1, 2, 5), &counts);
        let before = metrics.render();
        assert_eq!(
            sample(&before, "mssql_ces_batches_in_flight", ""),
            Some(1.0)
        );
        // In flight since its first event's commit, two minutes ago.
        let oldest =
            sample(&before, "mssql_ces_oldest_undelivered_seconds", "").unwrap_or(f64::NAN);
        assert!((120.0..125.0).contains(&oldest), "{oldest}");
        assert_eq!(
            sample(
                &before,
                "mssql_ces_table_delivered_commit_timestamp_seconds",
                r#"table="dbo.Employees""#
            ),
            None,
            "nothing of the table delivered yet"
        );
        let ins = r#"table="dbo.Employees",operation="INS""#;
        assert_eq!(
            sample(&before, "mssql_ces_events_total", ins),
            None,
            "{before}"
        );

        metrics.batch_delivered(&counts);
        let after = metrics.render();
        assert_eq!(sample(&after, "mssql_ces_batches_in_flight", ""), Some(0.0));
        assert_eq!(sample(&after, "mssql_ces_events_total", ins), Some(2.0));
        assert_eq!(sample(&after, "mssql_ces_messages_total", ins), Some(4.0));
        assert_eq!(
            sample(&after, "mssql_ces_delivered_bytes_total", ins),
            Some(400.0)
        );
        let del = r#"table="dbo.Employees",operation="DEL""#;
        assert_eq!(sample(&after, "mssql_ces_events_total", del), Some(1.0));
        assert_eq!(
            sample(&after, "mssql_ces_oldest_undelivered_seconds", ""),
            Some(0.0),
            "nothing in flight"
        );
        let delivered = sample(
            &after,
            "mssql_ces_table_delivered_commit_timestamp_seconds",
            r#"table="dbo.Employees""#,
        )
        .unwrap_or(f64::NAN);
        assert!(
            (delivered - last.timestamp_micros() as f64 / 1e6).abs() < 0.001,
            "the table's latest commit: {delivered}"
        );
        // An older batch delivered later (a re-load's rows) does not move it back.
        let mut older = BatchCounts::default();
        older.add(&table, Operation::Insert, first, 1, 100, 0);
        metrics.batch_sent(Lsn::from_parts(1, 2, 5), &older);
        metrics.batch_delivered(&older);
        assert_eq!(
            sample(
                &metrics.render(),
                "mssql_ces_table_delivered_commit_timestamp_seconds",
                r#"table="dbo.Employees""#,
            ),
            Some(delivered)
        );
        assert_eq!(
            sample(&after, "mssql_ces_truncated_values_total", ""),
            Some(2.0)
        );
        assert_eq!(
            sample(&after, "mssql_ces_segmented_events_total", ""),
            Some(1.0)
        );
        // Not idle: the LSN lag is max_lsn minus the delivered LSN, in LSN units.
        assert_eq!(sample(&after, "mssql_ces_lsn_lag", ""), Some(2.0));
        let lag = sample(&after, "mssql_ces_lag_seconds", "").unwrap_or(f64::NAN);
        assert!(
            (30.0..35.0).contains(&lag),
            "the last event committed 30 s ago: lag {lag}"
        );
        assert!(after.contains("mssql_ces_build_info{version=\""), "{after}");
        assert!(
            sample(&after, "process_start_time_seconds", "").is_some_and(|t| t > 1.0e9),
            "{after}"
        );
    }

    #[test]
    fn lag_is_zero_when_caught_up_and_unknown_before_the_first_delivery() {
        let metrics = Metrics::default();
        let text = metrics.render();
        assert!(
            sample(&text, "mssql_ces_lag_seconds", "").is_some_and(f64::is_nan),
            "{text}"
        );
        let mut counts = BatchCounts::default();
        counts.set_last_commit(
            Utc::now() - chrono::Duration::seconds(90),
            Lsn::from_parts(1, 0, 0),
        );
        metrics.poll_finished(Duration::from_millis(3), Some(7), 4);
        metrics.batch_sent(Lsn::from_parts(2, 0, 0), &counts);
        metrics.batch_delivered(&counts);
        // The next batch is produced, not yet acknowledged.
        metrics.poll_finished(Duration::from_millis(3), Some(3), 4);
        metrics.batch_sent(Lsn::from_parts(2, 0, 0), &BatchCounts::default());
        let busy = metrics.render();
        let lag = sample(&busy, "mssql_ces_lag_seconds", "").unwrap_or(f64::NAN);
        assert!((89.0..100.0).contains(&lag), "lag {lag}");
        assert_eq!(
            sample(&busy, "mssql_ces_capture_instances", ""),
            Some(4.0),
            "{busy}"
        );
        assert_eq!(sample(&busy, "mssql_ces_source_polls_total", ""), Some(2.0));
        assert_eq!(
            sample(&busy, "mssql_ces_source_rows_per_poll_bucket", r#"le="10""#),
            Some(2.0),
            "{busy}"
        );
        assert_eq!(
            sample(&busy, "mssql_ces_source_rows_per_poll_bucket", r#"le="1""#),
            Some(0.0)
        );
        // The source has nothing new, but its batch is not acknowledged yet.
        metrics.poll_finished(Duration::from_millis(1), None, 4);
        let waiting = metrics.render();
        assert!(
            sample(&waiting, "mssql_ces_lag_seconds", "").is_some_and(|l| l > 89.0),
            "{waiting}"
        );
        // Acknowledged: caught up.
        metrics.batch_delivered(&BatchCounts::default());
        let idle = metrics.render();
        assert_eq!(sample(&idle, "mssql_ces_lag_seconds", ""), Some(0.0));
        assert_eq!(sample(&idle, "mssql_ces_lsn_lag", ""), Some(0.0));
    }

    /// Each error kind is exposed at 0 before the first error, so an alert on its
    /// increase fires on the first one.
    #[test]
    fn every_error_kind_starts_at_zero() {
        let text = Metrics::default().render();
        for kind in DELIVERY_ERROR_KINDS {
            let label = format!("kind=\"{kind}\"");
            assert_eq!(
                sample(&text, "mssql_ces_delivery_errors_total", &label),
                Some(0.0),
                "{text}"
            );
        }
        for kind in SOURCE_ERROR_KINDS {
            let label = format!("kind=\"{kind}\"");
            assert_eq!(
                sample(&text, "mssql_ces_source_errors_total", &label),
                Some(0.0),
                "{text}"
            );
        }
    }

    /// The headroom is the retention less the lag: unknown until the retention is
    /// read and something delivered, endless without a cleanup job.
    #[test]
    fn the_retention_headroom_is_the_retention_less_the_lag() {
        use crate::source::poller::Retention;
        let metrics = Metrics::default();
        let headroom = |metrics: &Metrics| {
            sample(
                &metrics.render(),
                "mssql_ces_retention_headroom_seconds",
                "",
            )
            .unwrap_or(0.0)
        };
        assert!(headroom(&metrics).is_nan(), "not read");
        let mut counts = BatchCounts::default();
        counts.set_last_commit(
            Utc::now() - chrono::Duration::seconds(90),
            Lsn::from_parts(1, 0, 0),
        );
        metrics.poll_finished(Duration::from_millis(3), Some(7), 4);
        metrics.batch_sent(Lsn::from_parts(2, 0, 0), &counts);
        metrics.batch_delivered(&counts);
        metrics.set_retention(Retention::Kept(Duration::from_secs(3 * 86_400)));
        let left = headroom(&metrics);
        assert!(
            (3.0 * 86_400.0 - 100.0..3.0 * 86_400.0 - 89.0).contains(&left),
            "three days less the 90 s lag: {left}"
        );
        metrics.set_retention(Retention::Forever);
        assert_eq!(headroom(&metrics), f64::INFINITY);
        metrics.set_retention(Retention::Unknown);
        assert!(headroom(&metrics).is_nan());
    }

    /// The capture job's gauges are NaN until a log scan session is read, then
    /// its latency and transactions, and NaN again when it can no longer be read.
    #[test]
    fn the_capture_jobs_gauges_follow_its_last_log_scan() {
        let metrics = Metrics::default();
        let gauges = |metrics: &Metrics| {
            let text = metrics.render();
            (
                sample(&text, "mssql_ces_capture_job_latency_seconds", "").unwrap_or(0.0),
                sample(&text, "mssql_ces_capture_job_scan_transactions", "").unwrap_or(0.0),
            )
        };
        let (latency, transactions) = gauges(&metrics);
        assert!(latency.is_nan() && transactions.is_nan(), "not read yet");
        metrics.set_capture_job(Some(&crate::source::LogScan {
            start_time: chrono::NaiveDateTime::default(),
            end_time: None,
            latency_seconds: 412,
            error_count: 0,
            tran_count: 500,
            total_tran_count: Some(9_000),
        }));
        assert_eq!(gauges(&metrics), (412.0, 500.0));
        let total = |metrics: &Metrics| {
            sample(
                &metrics.render(),
                "mssql_ces_capture_job_transactions_total",
                "",
            )
        };
        assert_eq!(
            total(&metrics),
            Some(0.0),
            "counting starts at the first reading"
        );
        let scan_with = |total_tran_count| crate::source::LogScan {
            start_time: chrono::NaiveDateTime::default(),
            end_time: None,
            latency_seconds: 1,
            error_count: 0,
            tran_count: 10,
            total_tran_count: Some(total_tran_count),
        };
        metrics.set_capture_job(Some(&scan_with(9_250)));
        assert_eq!(total(&metrics), Some(250.0));
        // The server restarted: its count starts again from nothing.
        metrics.set_capture_job(Some(&scan_with(40)));
        assert_eq!(total(&metrics), Some(290.0));
        metrics.set_capture_job(None);
        assert!(gauges(&metrics).0.is_nan());
        assert_eq!(total(&metrics), Some(290.0), "a counter keeps its count");
    }

    #[test]
    fn errors_and_checkpoints_are_counted_by_kind() {
        let metrics = Metrics::default();
        metrics.delivery_failed(&SinkError::transient("x"));
        metrics.delivery_failed(&SinkError::definite("x"));
        metrics.delivery_failed(&SinkError::definite("y"));
        metrics.poll_failed(&SourceError::transient("x"));
        metrics.checkpoint_written();
        let sink = SinkHealth::new(true);
        metrics.watch_sink(Arc::clone(&sink));
        sink.add_retries(3);
        let text = metrics.render();
        assert_eq!(
            sample(
                &text,
                "mssql_ces_delivery_errors_total",
                r#"kind="definite""#
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                "mssql_ces_delivery_errors_total",
                r#"kind="transient""#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                "mssql_ces_source_errors_total",
                r#"kind="transient""#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "mssql_ces_checkpoint_writes_total", ""),
            Some(1.0)
        );
        assert!(
            sample(&text, "mssql_ces_checkpoint_age_seconds", "").is_some_and(|a| a < 5.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, "mssql_ces_delivery_retries_total", ""),
            Some(3.0)
        );
        // Pulled again: only the increase is added.
        sink.raise_retries_to(5);
        let again = metrics.render();
        assert_eq!(
            sample(&again, "mssql_ces_delivery_retries_total", ""),
            Some(5.0)
        );
    }

    #[test]
    fn healthz_fails_after_the_stall_time_unless_on_standby() {
        let metrics = Metrics::new(Duration::from_millis(50));
        assert!(metrics.health().is_ok());
        std::thread::sleep(Duration::from_millis(70));
        let stalled = metrics.health().unwrap_err();
        assert!(
            stalled.contains("metrics.stalled_after_ms = 50"),
            "{stalled}"
        );
        metrics.poll_finished(Duration::ZERO, None, 1);
        assert!(metrics.health().is_ok());
        metrics.set_standby(true);
        std::thread::sleep(Duration::from_millis(70));
        assert!(metrics.health().is_ok(), "a standby waits by choice");
    }

    #[test]
    fn readyz_needs_a_successful_poll_and_a_connected_sink() {
        let metrics = Metrics::default();
        let not = metrics.readiness().unwrap_err();
        assert!(
            not.contains("no poll") && not.contains("sink: not open"),
            "{not}"
        );
        let sink = SinkHealth::new(true);
        metrics.watch_sink(Arc::clone(&sink));
        metrics.poll_finished(Duration::ZERO, None, 1);
        let not = metrics.readiness().unwrap_err();
        assert_eq!(not, "not ready: sink: not connected to the destination");
        sink.set_connected(true);
        assert_eq!(metrics.readiness(), Ok("ready".to_owned()));
        metrics.poll_failed(&SourceError::transient("x"));
        let not = metrics.readiness().unwrap_err();
        assert!(not.contains("last poll failed"), "{not}");
        metrics.poll_finished(Duration::ZERO, None, 1);
        assert!(metrics.readiness().is_ok());
        metrics.set_standby(true);
        assert!(metrics.readiness().unwrap_err().contains("standby"));
    }
}

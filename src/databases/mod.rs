//! Many databases in one process: every CDC-enabled database that `source.databases`
//! names (or matches) is a stream of its own — its own position, stream GUID, lease,
//! checkpoint and failures — and the work follows the changes, not the number of
//! databases.
//!
//! - **Discovery**: the server's CDC-enabled, online databases that the login can
//!   open are matched against the patterns every `source.discovery_interval_ms`; a
//!   new one starts streaming without a restart, one that is gone stops (logged).
//! - **The probe**: every poll interval, one query per [`PROBE_CHUNK`] databases
//!   reads each database's max LSN and catalog fingerprint. An idle database costs
//!   its share of that query and a few hundred bytes of state: no connection, no
//!   pipeline.
//! - **Activations**: a database whose probe answer moved (or that was never read
//!   since the start) is queued; up to `source.max_connections` − 1 databases are
//!   read at once, each by the single-database run (lease, checkpoint, source,
//!   pipeline) until it is idle with everything delivered. The queue is first come,
//!   first served; a database that is still busy after [`QUANTUM`] while others wait
//!   is stopped (drained, checkpointed) and queued again at the back.
//! - **Failures** stay with their database: a failed activation is retried with
//!   backoff (1 s doubling to 5 min), a database the probe cannot read is reported,
//!   and the others go on.
//!
//! [`PROBE_CHUNK`]: crate::source::server::PROBE_CHUNK

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use fleet::FleetEvent;

pub mod fleet;
mod slots;
use crate::glob::matches;
use crate::source::server::DatabaseServer;
use crate::source::{MaxLsn, SourceError};
use slots::{Ownership, fleet_event, owns};

/// How long a busy database keeps its turn while others wait.
pub const QUANTUM: Duration = Duration::from_secs(30);

/// What the supervisor is told.
#[derive(Debug, Clone)]
pub struct ManySettings {
    /// `source.databases`: names or `*`/`?` patterns.
    pub patterns: Vec<String>,
    pub discovery_interval: Duration,
    pub poll_interval: Duration,
    /// Databases read at once.
    pub max_active: usize,
    /// How long a busy database keeps its turn while others wait ([`QUANTUM`]).
    pub quantum: Duration,
    /// Stop once every database has been read up to its probed max LSN.
    pub until_idle: bool,
}

/// Runs one database's stream until it is idle with everything delivered, or until
/// `stop` (then it drains and checkpoints as at a shutdown).
pub trait StreamRunner: Send + Sync + 'static {
    type Error: std::error::Error + Send + 'static;

    fn run(
        &self,
        database: String,
        stop: CancellationToken,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// Why the supervisor stopped with a failure.
#[derive(Debug, thiserror::Error)]
pub enum ManyError {
    #[error(
        "source.databases matches no CDC-enabled database that is online and open to this login ({patterns})"
    )]
    NoDatabases { patterns: String },
    /// The server's databases could not be listed, and trying again cannot help
    /// (the login refused, no permission).
    #[error("listing the server's databases failed")]
    Discovery(#[source] SourceError),
    #[error("{count} database(s) failed: {detail}")]
    Failed { count: usize, detail: String },
    /// The fleet's group membership ended; a restart joins again.
    #[error("the fleet's group membership ended (see the log for why); every database was stopped")]
    FleetLost,
    /// The control topic's partition count changed while running: members would
    /// disagree on which slot a database is in.
    #[error(
        "fleet.topic now has {now} partitions, not the {was} this member joined with: restart every member (each reads the new count at start)"
    )]
    FleetResized { was: u32, now: u32 },
    /// The brokers refuse this member for good: what to change.
    #[error("{0}; every database was stopped, and a restart repeats it")]
    FleetRefused(String),
}

/// Where a database's stream stands.
#[derive(Debug)]
enum Phase {
    /// Read up to `served`'s probe answer (or never read, `served` none).
    Waiting,
    /// In the queue.
    Queued,
    /// Being read since `since`; `stop` ends it early.
    Active {
        stop: CancellationToken,
        since: Instant,
        /// Stopped for its quantum: to be queued again.
        yielded: bool,
    },
    /// Its last activation failed: tried again at `retry_at`.
    Failed { retry_at: Instant, error: String },
}

/// One database's state: a few hundred bytes.
#[derive(Debug)]
struct Stream {
    /// The probe's latest answer, or why the probe could not read it.
    probed: Option<Result<MaxLsn, SourceError>>,
    /// The probe answer its last complete activation started at.
    served: Option<MaxLsn>,
    /// The answer the current activation started at.
    starting: Option<MaxLsn>,
    phase: Phase,
    backoff: Backoff,
    /// While the probe cannot read it: when to ask again, and how long to wait
    /// after that (1 s doubling to 5 min), so that a database that stays unreadable
    /// does not cost a query of its own at every poll.
    probe_again_at: Option<Instant>,
    probe_backoff: Backoff,
    /// Discovery found this replica of it unreadable (an availability group
    /// secondary that allows no connections): not probed until discovery finds it
    /// readable again.
    secondary: bool,
    /// Gone from the server: dropped once its activation ended.
    gone: bool,
}

impl Stream {
    fn new() -> Self {
        Stream {
            probed: None,
            served: None,
            starting: None,
            phase: Phase::Waiting,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
            probe_again_at: None,
            probe_backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(300)),
            secondary: false,
            gone: false,
        }
    }

    /// Whether the probe asks about it this round: not while an unreadable
    /// database's backoff runs, nor while discovery knows it unreadable here.
    fn probed_now(&self, now: Instant) -> bool {
        !self.secondary && self.probe_again_at.is_none_or(|at| now >= at)
    }

    /// Has changes (or a catalog change) not yet read.
    fn behind(&self) -> bool {
        match &self.probed {
            Some(Ok(now)) => self.served.as_ref() != Some(now),
            // Unreadable or not yet probed: nothing to read until it is.
            _ => false,
        }
    }
}

/// What a run of the supervisor did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ManySummary {
    /// Activations that ended idle with everything delivered.
    pub activations: u64,
    /// Activations stopped for their quantum.
    pub yielded: u64,
    /// Activations that failed.
    pub failures: u64,
    /// Probe rounds.
    pub probes: u64,
}

/// A view for metrics and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ManyStatus {
    /// Probe rounds so far.
    pub probes: u64,
    /// Activations that ended idle, so far.
    pub activations: u64,
    pub databases: usize,
    pub active: usize,
    pub queued: usize,
    pub failed: usize,
    pub unreadable: usize,
    /// In a fleet: the slots this member owns, and the databases in them.
    pub fleet: Option<FleetStatus>,
}

/// A fleet member's share, for metrics.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FleetStatus {
    pub slots: usize,
    pub databases: usize,
    /// Assignments and revocations so far.
    pub changes: u64,
}

/// The supervisor: discovery, the probe, the queue and the activations.
pub struct Supervisor<S, R: StreamRunner> {
    /// Out while a fleet member's call on it runs in a task of its own.
    server: Option<S>,
    runner: std::sync::Arc<R>,
    settings: ManySettings,
    streams: BTreeMap<String, Stream>,
    queue: VecDeque<String>,
    running: JoinSet<Result<(), R::Error>>,
    /// The database of each running activation.
    tasks: std::collections::HashMap<tokio::task::Id, String>,
    summary: ManySummary,
    status: tokio::sync::watch::Sender<ManyStatus>,
    /// Explicit names (no wildcard) already reported missing.
    reported_missing: BTreeSet<String>,
    /// In a fleet: the slots this member owns, and the group's word on them.
    fleet: Option<Ownership>,
    /// The control topic's partition count changed: (joined with, now).
    resized: Option<(u32, u32)>,
    /// The group refused this member (why).
    refused: Option<String>,
    /// The fleet's membership ended while the server was being asked.
    lost: bool,
    /// Whether the server's edition was found to allow cross-database queries.
    edition_checked: bool,
    /// The run's shutdown (set by `run`).
    shutdown: CancellationToken,
}

impl<S: DatabaseServer + 'static, R: StreamRunner> Supervisor<S, R> {
    pub fn new(server: S, runner: R, settings: ManySettings) -> Self {
        Supervisor {
            server: Some(server),
            runner: std::sync::Arc::new(runner),
            settings,
            streams: BTreeMap::new(),
            queue: VecDeque::new(),
            running: JoinSet::new(),
            tasks: std::collections::HashMap::new(),
            summary: ManySummary::default(),
            status: tokio::sync::watch::Sender::new(ManyStatus::default()),
            reported_missing: BTreeSet::new(),
            fleet: None,
            resized: None,
            refused: None,
            lost: false,
            edition_checked: false,
            shutdown: CancellationToken::new(),
        }
    }

    /// A member of a fleet of `slots` slots: reads only the databases of the slots
    /// the group assigns it (none until the first assignment), and stops those of a
    /// revoked slot before answering the revocation.
    pub fn in_fleet(
        mut self,
        slots: u32,
        events: tokio::sync::mpsc::UnboundedReceiver<FleetEvent>,
    ) -> Self {
        self.fleet = Some(Ownership {
            slots,
            owned: BTreeSet::new(),
            changes: 0,
            closed: false,
            events,
        });
        self
    }

    /// Whether this process reads `name`: always, unless a fleet gave its slot to
    /// another member.
    fn owns(&self, name: &str) -> bool {
        owns(self.fleet.as_ref(), name)
    }

    /// Follows the counts of databases, active, queued and failed.
    pub fn status(&self) -> tokio::sync::watch::Receiver<ManyStatus> {
        self.status.subscribe()
    }

    /// Reports the counts to `status` (made before the supervisor, for the metrics).
    pub fn reporting_to(mut self, status: tokio::sync::watch::Sender<ManyStatus>) -> Self {
        self.status = status;
        self
    }

    /// Runs until `shutdown` (then every activation drains and checkpoints), or with
    /// `until_idle` until every database has been read up to its probed max LSN.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<ManySummary, ManyError> {
        self.shutdown = shutdown.clone();
        let mut discovery_backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let mut next_discovery = Instant::now();
        let mut next_probe = Instant::now();
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            if Instant::now() >= next_discovery {
                next_discovery = self.discovery_round(&mut discovery_backoff).await?;
            }
            if Instant::now() >= next_probe {
                self.probe().await;
                next_probe = Instant::now() + self.settings.poll_interval;
            }
            self.schedule();
            self.publish();
            if self.settings.until_idle && self.all_idle() {
                break;
            }
            let wake = next_probe.min(next_discovery).min(self.next_retry());
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep_until(wake) => {}
                Some(joined) = self.running.join_next_with_id() => self.finished(joined),
                event = fleet_event(&mut self.fleet) => match event {
                    Some(event) => {
                        if self.on_fleet_event(event).await {
                            next_probe = Instant::now();
                        }
                    }
                    // The membership ended (its thread stopped): this member can no
                    // longer know which databases are its own.
                    None => {
                        self.stop_all().await;
                        return Err(ManyError::FleetLost);
                    }
                },
            }
            if let Some((was, now)) = self.resized {
                self.stop_all().await;
                return Err(ManyError::FleetResized { was, now });
            }
            if let Some(reason) = self.refused.take() {
                self.stop_all().await;
                return Err(ManyError::FleetRefused(reason));
            }
            if self.lost {
                self.stop_all().await;
                return Err(ManyError::FleetLost);
            }
        }
        self.stop_all().await;
        let failed: Vec<String> = self
            .streams
            .iter()
            .filter_map(|(name, s)| match &s.phase {
                Phase::Failed { error, .. } => Some(format!("{name}: {error}")),
                _ => None,
            })
            .collect();
        if self.settings.until_idle && !failed.is_empty() {
            return Err(ManyError::Failed {
                count: failed.len(),
                detail: failed.join("; "),
            });
        }
        Ok(self.summary)
    }

    /// One discovery, and when the next is due (later after a transient failure).
    async fn discovery_round(&mut self, backoff: &mut Backoff) -> Result<Instant, ManyError> {
        match self.discover().await {
            Ok(()) => {
                backoff.reset();
                if self.streams.is_empty() && self.settings.until_idle {
                    return Err(ManyError::NoDatabases {
                        patterns: self.settings.patterns.join(", "),
                    });
                }
                Ok(Instant::now() + self.settings.discovery_interval)
            }
            Err(e) if e.is_transient() => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %crate::error::Chain(&e), retry_in_ms = wait.as_millis() as u64, "listing the server's databases failed; retrying");
                Ok(Instant::now() + wait)
            }
            Err(e) => {
                self.stop_all().await;
                Err(ManyError::Discovery(e))
            }
        }
    }

    /// Matches the server's databases against the patterns: new ones become streams,
    /// gone ones stop.
    async fn discover(&mut self) -> Result<(), SourceError> {
        if !self.edition_checked {
            // The probe reads every database with three-part names; a server
            // without cross-database queries fails each of them for ever.
            let edition = self
                .on_server(|mut server| async move {
                    let edition = server.engine_edition().await;
                    (server, edition)
                })
                .await?;
            if edition == crate::source::AZURE_SQL_DATABASE_EDITION {
                return Err(SourceError::NoCrossDatabaseQueries);
            }
            self.edition_checked = true;
        }
        let found = self
            .on_server(|mut server| async move {
                let found = server.cdc_databases().await;
                (server, found)
            })
            .await?;
        let matched: BTreeSet<String> = found
            .into_iter()
            .filter(|name| self.settings.patterns.iter().any(|p| matches(p, name)))
            .filter(|name| {
                let usable = usable_name(name);
                if !usable {
                    tracing::warn!(database = %name, "skipped: a database name with ; {{ }} ' or \" cannot be put in a connection string");
                }
                usable
            })
            .collect();
        for pattern in &self.settings.patterns {
            let explicit = !pattern.contains(['*', '?']);
            if explicit
                && !matched.iter().any(|name| matches(pattern, name))
                && self.reported_missing.insert(pattern.clone())
            {
                tracing::warn!(database = %pattern, "source.databases names a database that is not CDC-enabled, online and open to this login; it is looked for again at each discovery");
            }
        }
        for name in &matched {
            if !self.streams.contains_key(name) {
                tracing::info!(database = %name, "database found: streaming it");
                self.reported_missing.remove(name);
                self.streams.insert(name.clone(), Stream::new());
            }
        }
        let gone: Vec<String> = self
            .streams
            .keys()
            .filter(|name| !matched.contains(*name))
            .cloned()
            .collect();
        for name in gone {
            self.forget(&name);
        }
        self.note_unreadable_replicas().await
    }

    /// Where the login may read the availability-group views: the databases this
    /// replica cannot read are not probed (each would fail its probe query), and
    /// are reported as unreadable until a discovery finds them readable.
    async fn note_unreadable_replicas(&mut self) -> Result<(), SourceError> {
        let unreadable = self
            .on_server(|mut server| async move {
                let found = server.unreadable_replicas().await;
                (server, found)
            })
            .await?;
        let Some(unreadable) = unreadable else {
            return Ok(());
        };
        for (name, stream) in &mut self.streams {
            let secondary = unreadable.contains(name);
            if secondary && !stream.secondary {
                tracing::warn!(database = %name, "this replica of the database is an availability group secondary that allows no connections: not streamed here; discovery looks again every source.discovery_interval_ms");
                stream.probed = Some(Err(SourceError::NotReadableHere {
                    message: "an availability group secondary that allows no connections (sys.availability_replicas.secondary_role_allow_connections = NO)".into(),
                }));
            } else if !secondary && stream.secondary {
                tracing::info!(database = %name, "this replica of the database is readable again: streaming it");
                stream.probed = None;
                stream.probe_again_at = None;
                stream.probe_backoff.reset();
            }
            stream.secondary = secondary;
        }
        Ok(())
    }

    /// A database no longer on the server (or no longer matched): its activation is
    /// stopped, and it is forgotten once that ends.
    fn forget(&mut self, name: &str) {
        let Some(stream) = self.streams.get_mut(name) else {
            return;
        };
        tracing::info!(database = %name, "database gone (dropped, offline, CDC disabled or no longer matched): no longer streamed");
        self.queue.retain(|q| q != name);
        match &stream.phase {
            Phase::Active { stop, .. } => {
                stop.cancel();
                stream.gone = true;
            }
            _ => {
                self.streams.remove(name);
            }
        }
    }

    /// One probe round over every database (but those the probe could not read,
    /// while their backoff runs).
    async fn probe(&mut self) {
        let now = Instant::now();
        // Those the probe could not read are asked alone when their backoff ends,
        // so that one that is still unreadable costs its own query only, not a
        // failed chunk narrowed down database by database.
        let (mut retried, mut names) = (Vec::new(), Vec::new());
        for (name, stream) in &self.streams {
            if self.owns(name) && stream.probed_now(now) {
                match stream.probe_again_at {
                    Some(_) => retried.push(name.clone()),
                    None => names.push(name.clone()),
                }
            }
        }
        if names.is_empty() && retried.is_empty() {
            return;
        }
        self.summary.probes += 1;
        let probed = self
            .on_server(|mut server| async move {
                let mut answers = if names.is_empty() {
                    Ok(Vec::new())
                } else {
                    server.probe(&names).await
                };
                for name in &retried {
                    let Ok(found) = &mut answers else { break };
                    match server.probe(std::slice::from_ref(name)).await {
                        Ok(alone) => found.extend(alone),
                        Err(e) => answers = Err(e),
                    }
                }
                (server, answers)
            })
            .await;
        match probed {
            Ok(answers) => {
                for answer in answers {
                    let Some(stream) = self.streams.get_mut(&answer.database) else {
                        continue;
                    };
                    if let Err(e) = &answer.state {
                        let was_readable = !matches!(stream.probed, Some(Err(_)));
                        let wait = stream.probe_backoff.next_wait();
                        stream.probe_again_at = Some(Instant::now() + wait);
                        if was_readable {
                            tracing::warn!(database = %answer.database, error = %crate::error::Chain(&e), "the probe cannot read this database; the others go on, and it is asked again with backoff");
                        }
                    } else {
                        if matches!(stream.probed, Some(Err(_))) {
                            tracing::info!(database = %answer.database, "the probe reads this database again");
                        }
                        stream.probe_again_at = None;
                        stream.probe_backoff.reset();
                    }
                    stream.probed = Some(answer.state);
                }
            }
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "the probe of every database's max LSN failed; trying again at the next poll");
            }
        }
    }

    /// Queues what is behind; starts what the bound allows; ends turns that ran
    /// their quantum while others wait.
    fn schedule(&mut self) {
        let now = Instant::now();
        let fleet = self.fleet.as_ref();
        for (name, stream) in &mut self.streams {
            if !owns(fleet, name) {
                continue;
            }
            let due = match &stream.phase {
                Phase::Waiting => stream.behind(),
                Phase::Failed { retry_at, .. } => *retry_at <= now,
                Phase::Queued | Phase::Active { .. } => false,
            };
            if due {
                stream.phase = Phase::Queued;
                self.queue.push_back(name.clone());
            }
        }
        while self.running.len() < self.settings.max_active.max(1) {
            let Some(name) = self.queue.pop_front() else {
                break;
            };
            self.start(name);
        }
        if !self.queue.is_empty() {
            for (name, stream) in &mut self.streams {
                if let Phase::Active {
                    stop,
                    since,
                    yielded,
                } = &mut stream.phase
                    && !*yielded
                    && since.elapsed() >= self.settings.quantum
                {
                    tracing::debug!(database = %name, "quantum over with others waiting: stopping to let them in");
                    *yielded = true;
                    stop.cancel();
                }
            }
        }
    }

    fn start(&mut self, name: String) {
        let Some(stream) = self.streams.get_mut(&name) else {
            return;
        };
        let stop = CancellationToken::new();
        stream.starting = match &stream.probed {
            Some(Ok(answer)) => Some(*answer),
            _ => None,
        };
        stream.phase = Phase::Active {
            stop: stop.clone(),
            since: Instant::now(),
            yielded: false,
        };
        let runner = std::sync::Arc::clone(&self.runner);
        let span = tracing::info_span!("database", db = %name);
        let database = name.clone();
        let task = self.running.spawn(tracing::Instrument::instrument(
            async move { runner.run(database, stop).await },
            span,
        ));
        self.tasks.insert(task.id(), name);
    }

    /// An activation ended.
    fn finished(
        &mut self,
        joined: Result<(tokio::task::Id, Result<(), R::Error>), tokio::task::JoinError>,
    ) {
        let (id, result) = match joined {
            Ok((id, result)) => (id, result.map_err(|e| crate::error::Chain(&e).to_string())),
            Err(e) => (
                e.id(),
                Err(format!("the activation stopped unexpectedly: {e}")),
            ),
        };
        let Some(name) = self.tasks.remove(&id) else {
            return;
        };
        let Some(stream) = self.streams.get_mut(&name) else {
            return;
        };
        let yielded = matches!(stream.phase, Phase::Active { yielded: true, .. });
        if stream.gone {
            self.streams.remove(&name);
            return;
        }
        match result {
            Ok(()) if yielded => {
                self.summary.yielded += 1;
                stream.served = None;
                stream.phase = Phase::Queued;
                self.queue.push_back(name);
            }
            Ok(()) => {
                self.summary.activations += 1;
                stream.backoff.reset();
                stream.served = stream.starting.take();
                stream.phase = Phase::Waiting;
            }
            Err(e) => {
                self.summary.failures += 1;
                let e: String = e;
                let wait = stream.backoff.next_wait();
                tracing::warn!(database = %name, error = %e, retry_in_ms = wait.as_millis() as u64, "this database's stream failed; the others go on, and it is tried again");
                stream.served = None;
                stream.phase = Phase::Failed {
                    retry_at: Instant::now() + wait,
                    error: e,
                };
            }
        }
    }

    /// The earliest retry of a failed database (far off when none).
    fn next_retry(&self) -> Instant {
        self.streams
            .iter()
            // Another member's database is not retried here.
            .filter(|(name, _)| self.owns(name))
            .filter_map(|(_, s)| match &s.phase {
                Phase::Failed { retry_at, .. } => Some(*retry_at),
                _ => None,
            })
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
    }

    /// Every database read up to its probed answer, nothing queued or running, and
    /// nothing left to retry.
    fn all_idle(&self) -> bool {
        self.running.is_empty()
            && self.queue.is_empty()
            && self.streams.iter().all(|(name, s)| {
                !self.owns(name)
                    || matches!(s.phase, Phase::Waiting | Phase::Failed { .. })
                        && s.probed.is_some()
                        && !s.behind()
            })
    }

    fn publish(&self) {
        let mut status = ManyStatus {
            probes: self.summary.probes,
            activations: self.summary.activations,
            databases: self.streams.len(),
            queued: self.queue.len(),
            active: self.running.len(),
            ..ManyStatus::default()
        };
        // In a fleet, another member's databases are its own to report.
        for (_, stream) in self.streams.iter().filter(|(name, _)| self.owns(name)) {
            if matches!(stream.phase, Phase::Failed { .. }) {
                status.failed += 1;
            }
            if matches!(stream.probed, Some(Err(_))) {
                status.unreadable += 1;
            }
        }
        status.fleet = self.fleet.as_ref().map(|f| FleetStatus {
            slots: f.owned.len(),
            databases: self.streams.keys().filter(|n| self.owns(n)).count(),
            changes: f.changes,
        });
        self.status.send_if_modified(|old| {
            let changed = *old != status;
            *old = status;
            changed
        });
    }

    /// Stops every activation and waits for each to drain and checkpoint.
    async fn stop_all(&mut self) {
        for stream in self.streams.values() {
            if let Phase::Active { stop, .. } = &stream.phase {
                stop.cancel();
            }
        }
        while let Some(joined) = self.running.join_next_with_id().await {
            self.finished(joined);
        }
    }
}

/// Whether a database name can be put in a connection string as it is.
pub fn usable_name(name: &str) -> bool {
    !name.contains([';', '{', '}', '\'', '"'])
}

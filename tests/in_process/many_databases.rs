//! Many databases in one process, against the simulated server (`SimServer`: many
//! `CdcSimulator` databases and a count of the server-level queries). Each
//! activation is the real single-database pipeline into a file per database, with
//! its checkpoint in memory, so "every event exactly once" is read off the files.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use cdc_sim::server::SimServer;
use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::checkpoint::CheckpointStore;
use mssql_ces::checkpoint::memory::MemoryStore;
use mssql_ces::databases::{ManySettings, ManyStatus, StreamRunner, Supervisor};
use mssql_ces::event::value::{Length, SqlType, Value};
use mssql_ces::pipeline::{self, PipelineSettings};
use mssql_ces::sink::Sink;
use mssql_ces::sink::stream::{Resume, StreamSink};
use mssql_ces::source::poller::{Poller, PollerConfig};
use mssql_ces::source::server::PROBE_CHUNK;
use tokio_util::sync::CancellationToken;

use crate::pipeline_faults::{factory, router};

/// Runs a database of the simulated server through the pipeline into
/// `<dir>/<db>.jsonl`, resuming from its checkpoint in memory.
struct SimRunner {
    server: SimServer,
    dir: std::path::PathBuf,
    stores: Mutex<HashMap<String, MemoryStore>>,
}

impl StreamRunner for SimRunner {
    type Error = std::io::Error;

    async fn run(&self, database: String, stop: CancellationToken) -> Result<(), std::io::Error> {
        let sim = self
            .server
            .database(&database)
            .ok_or_else(|| std::io::Error::other(format!("{database}: no such database")))?;
        let store = self
            .stores
            .lock()
            .expect("stores")
            .entry(database.clone())
            .or_default()
            .clone();
        let position = store.position();
        let sink = StreamSink::file(
            self.dir.join(format!("{database}.jsonl")),
            mssql_ces::event::Encoding::Json,
            Resume::from_checkpoint(position.as_ref()),
        )
        .map_err(std::io::Error::other)?;
        pipeline::run(
            Poller::new(sim, PollerConfig::default(), position),
            factory(),
            router(),
            Sink::Stream(sink),
            CheckpointStore::Memory(store),
            PipelineSettings {
                poll_interval: Duration::from_millis(5),
                checkpoint_interval: Duration::from_millis(20),
                drain_timeout: Duration::from_secs(5),
                idle_drain_timeout: Duration::from_secs(5),
                until_idle: true,
                metrics: Default::default(),
            },
            stop,
        )
        .await
        .map(|_| ())
        .map_err(std::io::Error::other)
    }
}

/// A CDC database with `dbo.T (Id int, Name nvarchar(50))` captured.
fn database(name: &str, guid: u128) -> CdcSimulator {
    let sim = CdcSimulator::new(name, uuid::Uuid::from_u128(guid), 0);
    sim.create_table(
        "dbo",
        "T",
        vec![
            SimColumn::new("Id", SqlType::Int),
            SimColumn::new("Name", SqlType::NVarChar(Length::Bounded(50))),
        ],
        &["Id"],
    );
    sim.enable_table("dbo.T", None).expect("enable");
    sim
}

/// Inserts row `id` named `<db>-<id>`.
fn insert(sim: &CdcSimulator, db: &str, id: i32) {
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(id), Value::Text(format!("{db}-{id}"))],
        )
        .commit()
        .expect("commit");
}

/// The rows named in `db`'s file, in order (each line one event).
fn delivered(dir: &std::path::Path, db: &str) -> Vec<i32> {
    let text = std::fs::read_to_string(dir.join(format!("{db}.jsonl"))).unwrap_or_default();
    let marker = format!("{db}-");
    text.lines()
        .map(|line| {
            let at = line.find(&marker).expect("a row name in the event");
            line[at + marker.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .expect("row id")
        })
        .collect()
}

fn settings(patterns: &[&str]) -> ManySettings {
    ManySettings {
        patterns: patterns.iter().map(|p| (*p).to_owned()).collect(),
        discovery_interval: Duration::from_millis(50),
        poll_interval: Duration::from_millis(10),
        max_active: 4,
        quantum: Duration::from_secs(30),
        until_idle: false,
    }
}

/// The supervisor over `server`, each database read into `dir`.
fn supervisor(
    server: &SimServer,
    dir: &std::path::Path,
    settings: ManySettings,
) -> Supervisor<SimServer, SimRunner> {
    let runner = SimRunner {
        server: server.clone(),
        dir: dir.to_owned(),
        stores: Mutex::default(),
    };
    Supervisor::new(server.clone(), runner, settings)
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mssql-ces-many-{name}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// Waits until `status` satisfies `until`, up to 60 s.
async fn wait_for(
    status: &mut tokio::sync::watch::Receiver<ManyStatus>,
    what: &str,
    until: impl Fn(&ManyStatus) -> bool,
) -> ManyStatus {
    let wait = tokio::time::timeout(Duration::from_secs(60), status.wait_for(|s| until(s)))
        .await
        .map(|r| r.map(|s| s.clone()));
    match wait {
        Ok(Ok(s)) => s,
        _ => panic!("{what}: {:?}", *status.borrow()),
    }
}

/// 1,000 idle databases: after the first pass (each read once), a poll costs one
/// probe query per 100 databases and not one query of any database's own; a change
/// in one database activates that one alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_databases_cost_one_probe_query_per_hundred_and_no_reads() {
    let count: usize = 1_000;
    let server = SimServer::default();
    let names: Vec<String> = (0..count).map(|i| format!("Tenant{i:04}")).collect();
    for (i, name) in names.iter().enumerate() {
        let sim = database(name, i as u128 + 1);
        insert(&sim, name, 1);
        server.add(name, sim);
    }
    let dir = temp_dir("idle");
    let supervisor = supervisor(
        &server,
        &dir,
        ManySettings {
            discovery_interval: Duration::from_secs(3600),
            max_active: 8,
            ..settings(&["Tenant*"])
        },
    );
    let mut status = supervisor.status();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(shutdown.clone()));
    // The first pass: every database read once, its one row delivered.
    wait_for(&mut status, "the first pass", |s| {
        s.activations == count as u64 && s.active == 0 && s.queued == 0
    })
    .await;
    for name in names.iter().step_by(97) {
        assert_eq!(delivered(&dir, name), vec![1], "{name}");
    }
    let own_queries = || -> usize {
        names
            .iter()
            .map(|n| server.database(n).expect("db").round_trips())
            .sum()
    };
    // Idle: 20 probe rounds.
    let (server_before, own_before, probes_before) =
        (server.round_trips(), own_queries(), status.borrow().probes);
    wait_for(&mut status, "20 probe rounds", |s| {
        s.probes >= probes_before + 20
    })
    .await;
    let rounds = status.borrow().probes - probes_before;
    let server_queries = server.round_trips() - server_before;
    let per_round = count.div_ceil(PROBE_CHUNK);
    assert!(
        server_queries.abs_diff(rounds as usize * per_round) <= per_round,
        "{server_queries} server queries over {rounds} idle rounds of {count} databases: {per_round} a round"
    );
    assert_eq!(
        own_queries(),
        own_before,
        "no idle database was queried on its own"
    );
    assert_eq!(
        status.borrow().activations,
        count as u64,
        "nothing activated"
    );
    // One change: that database alone is read.
    let busy = &names[421];
    insert(&server.database(busy).expect("db"), busy, 2);
    wait_for(&mut status, "the changed database read", |s| {
        s.activations == count as u64 + 1 && s.active == 0
    })
    .await;
    assert_eq!(delivered(&dir, busy), vec![1, 2]);
    shutdown.cancel();
    let summary = run.await.expect("join").expect("clean stop");
    assert_eq!(summary.failures, 0);
    println!(
        "{count} idle databases: {per_round} server queries a poll; {} activations",
        summary.activations
    );
    std::fs::remove_dir_all(dir).ok();
}

/// A busy database beside idle ones, one the probe cannot read (taken offline
/// after it was found) and one whose every read fails: the busy one's events all
/// arrive once and in order, the idle ones' too, and the two failures are reported
/// without stopping anything; the offline one is read again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_database_and_two_failing_ones_do_not_hold_up_the_others() {
    let server = SimServer::default();
    let names: Vec<String> = (0..12).map(|i| format!("Shop{i:02}")).collect();
    for (i, name) in names.iter().enumerate() {
        let sim = database(name, i as u128 + 1);
        insert(&sim, name, 1);
        server.add(name, sim);
    }
    // Shop11: every read fails.
    let failing = server.database("Shop11").expect("db");
    for _ in 0..10_000 {
        failing.inject_fault(mssql_ces::source::SourceError::definite(
            "SQL Server error 229: SELECT permission denied",
        ));
    }
    let dir = temp_dir("busy");
    let supervisor = supervisor(
        &server,
        &dir,
        ManySettings {
            max_active: 2,
            quantum: Duration::from_millis(200),
            // Found once: Shop10 then goes offline under the probe's feet.
            discovery_interval: Duration::from_secs(3600),
            ..settings(&["Shop*"])
        },
    );
    let mut status = supervisor.status();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(shutdown.clone()));
    wait_for(&mut status, "the first probe", |s| s.probes > 0).await;
    server.set_online("Shop10", false);
    insert(&server.database("Shop10").expect("db"), "Shop10", 2);
    // Shop00 busy for a while: 300 rows, 2 ms apart.
    let busy = server.database("Shop00").expect("db");
    let writer = tokio::spawn(async move {
        for id in 2..=300 {
            insert(&busy, "Shop00", id);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    writer.await.expect("writer");
    let healthy = &names[..10];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done = delivered(&dir, "Shop00").len() == 300
            && healthy[1..].iter().all(|n| delivered(&dir, n) == vec![1]);
        if done {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not everything arrived: Shop00 {} rows; {:?}",
            delivered(&dir, "Shop00").len(),
            *status.borrow()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        delivered(&dir, "Shop00"),
        (1..=300).collect::<Vec<_>>(),
        "the busy database's rows, each once, in order"
    );
    let now = wait_for(&mut status, "the failures reported", |s| {
        s.unreadable == 1 && s.failed == 1
    })
    .await;
    assert_eq!(now.databases, 12);
    assert!(delivered(&dir, "Shop11").is_empty());
    // Back online: Shop10 is read.
    server.set_online("Shop10", true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while delivered(&dir, "Shop10") != vec![1, 2] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Shop10 after it came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let summary = run.await.expect("join").expect("a shutdown is clean");
    assert!(summary.failures >= 1, "{summary:?}");
    std::fs::remove_dir_all(dir).ok();
}

/// Two databases whose replica here is an availability group secondary (one that
/// allows no reads, error 976; one that allows read-intent sessions only, 978)
/// beside healthy ones: the healthy ones stream, the two are reported as
/// unreadable, and they are not asked again at every poll (a backoff of their own),
/// so a poll costs about one query however long they stay unreadable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn availability_group_secondaries_stop_nothing_and_are_asked_with_backoff() {
    use cdc_sim::server::Replica;
    let server = SimServer::default();
    let names: Vec<String> = (0..6).map(|i| format!("Shop{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let sim = database(name, i as u128 + 1);
        insert(&sim, name, 1);
        server.add(name, sim);
    }
    server.set_replica("Shop2", Replica::NotReadable);
    server.set_replica("Shop4", Replica::ReadIntentOnly);
    let dir = temp_dir("secondaries");
    let supervisor = supervisor(
        &server,
        &dir,
        ManySettings {
            discovery_interval: Duration::from_secs(3600),
            ..settings(&["Shop*"])
        },
    );
    let mut status = supervisor.status();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(shutdown.clone()));
    let readable = ["Shop0", "Shop1", "Shop3", "Shop5"];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !readable.iter().all(|n| delivered(&dir, n) == vec![1]) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the readable databases' rows: {:?}",
            *status.borrow()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(&mut status, "the two reported", |s| s.unreadable == 2).await;
    assert!(delivered(&dir, "Shop2").is_empty() && delivered(&dir, "Shop4").is_empty());
    // Steady state: 50 polls cost about one query each, not one for the whole
    // chunk and one per database after it.
    let (queries_before, probes_before) = (server.round_trips(), status.borrow().probes);
    wait_for(&mut status, "50 probe rounds", |s| {
        s.probes >= probes_before + 50
    })
    .await;
    let rounds = (status.borrow().probes - probes_before) as usize;
    let queries = server.round_trips() - queries_before;
    assert!(
        queries <= rounds + rounds / 5,
        "{queries} queries in {rounds} polls with two unreadable databases"
    );
    // A change in a readable database still streams; the primary back, Shop2 too.
    insert(&server.database("Shop3").expect("db"), "Shop3", 2);
    server.set_replica("Shop2", Replica::Primary);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while delivered(&dir, "Shop3") != vec![1, 2] || delivered(&dir, "Shop2") != vec![1] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "after the change: {:?}",
            *status.borrow()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    run.await.expect("join").expect("a clean stop");
    std::fs::remove_dir_all(dir).ok();
}

/// With `VIEW SERVER STATE`, discovery reads the availability-group views: a
/// database whose replica here is a secondary that allows no connections is never
/// probed (no query fails on it), it is reported unreadable, the others stream,
/// and once it is the primary the next discovery streams it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secondary_discovery_knows_is_never_probed() {
    use cdc_sim::server::Replica;
    let server = SimServer::default();
    server.set_view_server_state(true);
    let names: Vec<String> = (0..4).map(|i| format!("Shop{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let sim = database(name, i as u128 + 1);
        insert(&sim, name, 1);
        server.add(name, sim);
    }
    server.set_replica("Shop2", Replica::NotReadable);
    let dir = temp_dir("known-secondary");
    let supervisor = supervisor(
        &server,
        &dir,
        ManySettings {
            discovery_interval: Duration::from_millis(300),
            ..settings(&["Shop*"])
        },
    );
    let mut status = supervisor.status();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(shutdown.clone()));
    let readable = ["Shop0", "Shop1", "Shop3"];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !readable.iter().all(|n| delivered(&dir, n) == vec![1]) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the readable databases' rows: {:?}",
            *status.borrow()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(&mut status, "the secondary reported", |s| s.unreadable == 1).await;
    let probes = status.borrow().probes;
    wait_for(&mut status, "20 more probe rounds", |s| {
        s.probes >= probes + 20
    })
    .await;
    assert_eq!(server.failed_queries(), 0, "no query named the secondary");
    assert!(delivered(&dir, "Shop2").is_empty());
    server.set_replica("Shop2", Replica::Primary);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while delivered(&dir, "Shop2") != vec![1] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "after the failover: {:?}",
            *status.borrow()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(&mut status, "none unreadable", |s| s.unreadable == 0).await;
    shutdown.cancel();
    run.await.expect("join").expect("a clean stop");
    std::fs::remove_dir_all(dir).ok();
}

/// Azure SQL Database has no cross-database queries: many databases from one
/// connection cannot be probed there, and the run says so, naming the setting and
/// what to do instead, rather than reporting every database unreadable for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_databases_on_azure_sql_database_is_refused_with_what_to_do() {
    let server = SimServer::default();
    for (i, name) in ["Tenant1", "Tenant2"].iter().enumerate() {
        let sim = database(name, i as u128 + 1);
        insert(&sim, name, 1);
        server.add(name, sim);
    }
    server.set_engine_edition(5);
    let dir = temp_dir("azure-sql-database");
    let supervisor = supervisor(
        &server,
        &dir,
        ManySettings {
            until_idle: true,
            ..settings(&["Tenant*"])
        },
    );
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        supervisor.run(CancellationToken::new()),
    )
    .await
    .expect("it stops at once");
    let err = result.expect_err("refused");
    let text = mssql_ces::error::Chain(&err).to_string();
    assert!(
        text.contains("source.databases") && text.contains("Azure SQL Database"),
        "{text}"
    );
    assert!(delivered(&dir, "Tenant1").is_empty());
    std::fs::remove_dir_all(dir).ok();
}

/// Discovery: a database created (and CDC-enabled) while running is streamed
/// without a restart; a dropped one stops; one no pattern matches is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_added_while_running_is_streamed_and_a_dropped_one_stops() {
    let server = SimServer::default();
    for (i, name) in ["TenantA", "TenantB"].iter().enumerate() {
        let sim = database(name, i as u128 + 1);
        insert(&sim, name, 1);
        server.add(name, sim);
    }
    let other = database("Billing", 9);
    insert(&other, "Billing", 1);
    server.add("Billing", other);
    let dir = temp_dir("discovery");
    let supervisor = supervisor(&server, &dir, settings(&["tenant*"]));
    let mut status = supervisor.status();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(shutdown.clone()));
    wait_for(&mut status, "two tenants read", |s| {
        s.databases == 2 && s.activations == 2
    })
    .await;
    let added = database("TenantC", 3);
    insert(&added, "TenantC", 1);
    insert(&added, "TenantC", 2);
    server.add("TenantC", added);
    wait_for(&mut status, "the new tenant read", |s| {
        s.databases == 3 && s.activations == 3
    })
    .await;
    assert_eq!(delivered(&dir, "TenantC"), vec![1, 2]);
    server.drop_database("TenantA");
    wait_for(&mut status, "the dropped tenant gone", |s| s.databases == 2).await;
    assert!(
        delivered(&dir, "Billing").is_empty(),
        "a database no pattern matches"
    );
    shutdown.cancel();
    let summary = run.await.expect("join").expect("clean stop");
    assert_eq!(summary.failures, 0);
    std::fs::remove_dir_all(dir).ok();
}

/// `until_idle` ends once every database is read up to its probed max LSN, and a
/// pattern that matches nothing is an error naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_idle_stops_when_every_database_is_caught_up() {
    let server = SimServer::default();
    for (i, name) in ["A1", "A2", "A3"].iter().enumerate() {
        let sim = database(name, i as u128 + 1);
        for id in 1..=5 {
            insert(&sim, name, id);
        }
        server.add(name, sim);
    }
    let dir = temp_dir("idle-stop");
    let summary = supervisor(
        &server,
        &dir,
        ManySettings {
            until_idle: true,
            ..settings(&["A?"])
        },
    )
    .run(CancellationToken::new())
    .await
    .expect("caught up");
    assert_eq!(summary.activations, 3);
    for name in ["A1", "A2", "A3"] {
        assert_eq!(delivered(&dir, name), (1..=5).collect::<Vec<_>>());
    }
    let error = supervisor(
        &server,
        &dir,
        ManySettings {
            until_idle: true,
            ..settings(&["Nothing*"])
        },
    )
    .run(CancellationToken::new())
    .await
    .expect_err("nothing matched");
    assert!(error.to_string().contains("source.databases"), "{error}");
    std::fs::remove_dir_all(dir).ok();
}

/// A database that stays busy until stopped, shared by two fleet members: counts
/// who reads each database at once.
#[derive(Default)]
struct HoldingRunner {
    /// Database → members reading it now, and the most seen at once.
    active: Mutex<HashMap<String, (usize, usize)>>,
    /// Database → reads started, by member.
    reads: Mutex<HashMap<(String, &'static str), usize>>,
}

struct Member {
    name: &'static str,
    shared: std::sync::Arc<HoldingRunner>,
}

impl StreamRunner for Member {
    type Error = std::io::Error;

    async fn run(&self, database: String, stop: CancellationToken) -> Result<(), std::io::Error> {
        {
            let mut active = self.shared.active.lock().expect("active");
            let entry = active.entry(database.clone()).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(entry.0);
            *self
                .shared
                .reads
                .lock()
                .expect("reads")
                .entry((database.clone(), self.name))
                .or_default() += 1;
        }
        stop.cancelled().await;
        // Draining and saving the position takes a while.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.shared
            .active
            .lock()
            .expect("active")
            .entry(database)
            .or_default()
            .0 -= 1;
        Ok(())
    }
}

impl HoldingRunner {
    fn active(&self, database: &str) -> usize {
        self.active
            .lock()
            .expect("active")
            .get(database)
            .map_or(0, |a| a.0)
    }

    fn reads(&self, database: &str, member: &'static str) -> usize {
        self.reads
            .lock()
            .expect("reads")
            .get(&(database.to_owned(), member))
            .copied()
            .unwrap_or(0)
    }
}

/// Waits until `check` holds, up to 30 s.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Revokes `slots` and waits (as librdkafka's rebalance callback does) for the
/// member's word that their databases are stopped.
async fn revoke(
    events: &tokio::sync::mpsc::UnboundedSender<mssql_ces::databases::fleet::FleetEvent>,
    slots: &[u32],
) {
    let (released, answer) = std::sync::mpsc::sync_channel(1);
    events
        .send(mssql_ces::databases::fleet::FleetEvent::Revoked {
            slots: slots.iter().copied().collect(),
            released,
        })
        .expect("member running");
    tokio::task::spawn_blocking(move || answer.recv_timeout(Duration::from_secs(30)))
        .await
        .expect("join")
        .expect("the member answers the revocation");
}

/// Two fleet members over one server: each reads only the databases of the slots
/// it was assigned; a revoked slot's databases are stopped before the revocation
/// is answered, and the member that gets the slot reads them next. No database is
/// ever read by both at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_members_read_only_their_slots_and_hand_one_over_only_once_stopped() {
    use mssql_ces::databases::fleet::{FleetEvent, slot_of};
    const SLOTS: u32 = 4;
    let server = SimServer::default();
    let names: Vec<String> = (1..=8).map(|i| format!("Tenant{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let sim = database(name, i as u128 + 1);
        insert(&sim, name, 1);
        server.add(name, sim);
    }
    let slot = |name: &str| slot_of(name, SLOTS);
    let moved: Vec<&String> = names.iter().filter(|n| slot(n) >= 2).collect();
    let kept: Vec<&String> = names.iter().filter(|n| slot(n) < 2).collect();
    assert!(
        !moved.is_empty() && !kept.is_empty(),
        "both halves hold databases"
    );
    let shared = std::sync::Arc::new(HoldingRunner::default());
    let mut many = settings(&["tenant*"]);
    many.max_active = 8;
    let start = |name: &'static str| {
        let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
        let member = Member {
            name,
            shared: shared.clone(),
        };
        let supervisor =
            Supervisor::new(server.clone(), member, many.clone()).in_fleet(SLOTS, events);
        let status = supervisor.status();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(supervisor.run(shutdown.clone()));
        (events_tx, status, shutdown, run)
    };
    let (a_events, mut a_status, a_stop, a_run) = start("a");
    let (b_events, mut b_status, b_stop, b_run) = start("b");
    // Before any assignment nothing is read.
    wait_for(&mut a_status, "a lists the databases", |s| s.databases == 8).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a_status.borrow().active, 0, "no slot, no read");
    a_events
        .send(FleetEvent::Assigned((0..SLOTS).collect()))
        .expect("a");
    let a = wait_for(&mut a_status, "a reads every database", |s| s.active == 8).await;
    assert_eq!(
        a.fleet,
        Some(mssql_ces::databases::FleetStatus {
            slots: 4,
            databases: 8,
            changes: 1
        })
    );
    assert_eq!(b_status.borrow().active, 0);
    revoke(&a_events, &[2, 3]).await;
    let a = wait_for(&mut a_status, "a's share shrinks", |s| {
        s.fleet.as_ref().is_some_and(|f| f.slots == 2)
    })
    .await;
    assert_eq!(
        a.fleet.map(|f| (f.databases, f.changes)),
        Some((kept.len(), 2))
    );
    for name in &moved {
        assert_eq!(shared.active(name), 0, "{name} stopped before the answer");
    }
    for name in &kept {
        assert_eq!(shared.active(name), 1, "{name} still read by a");
    }
    b_events
        .send(FleetEvent::Assigned([2, 3].into()))
        .expect("b");
    wait_for(&mut b_status, "b reads the moved databases", |s| {
        s.active == moved.len()
    })
    .await;
    // Counted by the activation itself, once its task runs.
    eventually("b's reads begin", || {
        moved.iter().all(|name| shared.reads(name, "b") == 1)
    })
    .await;
    for name in &moved {
        assert_eq!(shared.reads(name, "a"), 1, "{name} not read by a again");
    }
    for name in &kept {
        assert_eq!(shared.reads(name, "b"), 0, "{name} is not b's");
    }
    // The slots come back to a: read again from the checkpoint b left.
    revoke(&b_events, &[2, 3]).await;
    a_events
        .send(FleetEvent::Assigned([2, 3].into()))
        .expect("a");
    wait_for(&mut a_status, "a reads every database again", |s| {
        s.active == 8
    })
    .await;
    eventually("a reads the moved databases again", || {
        moved.iter().all(|name| shared.reads(name, "a") == 2)
    })
    .await;
    a_stop.cancel();
    b_stop.cancel();
    a_run.await.expect("join").expect("a stops");
    b_run.await.expect("join").expect("b stops");
    let most = shared
        .active
        .lock()
        .expect("active")
        .values()
        .map(|a| a.1)
        .max();
    assert_eq!(
        most,
        Some(1),
        "no database was ever read by both members at once"
    );
}

/// A server whose probe can be made slow (as a real one is when a chunk's query
/// waits for `source.query_timeout_ms`).
#[derive(Clone)]
struct SlowServer {
    inner: SimServer,
    slow: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl mssql_ces::source::server::DatabaseServer for SlowServer {
    async fn engine_edition(&mut self) -> Result<i64, mssql_ces::source::SourceError> {
        self.inner.engine_edition().await
    }

    async fn cdc_databases(&mut self) -> Result<Vec<String>, mssql_ces::source::SourceError> {
        self.inner.cdc_databases().await
    }

    async fn probe_chunk(
        &mut self,
        chunk: &[String],
    ) -> Result<Vec<mssql_ces::source::server::DatabaseProbe>, mssql_ces::source::SourceError> {
        if self.slow.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_secs(6)).await;
        }
        self.inner.probe_chunk(chunk).await
    }
}

/// Fails one database's reads; holds the others until stopped.
struct FailingOne {
    failing: String,
    holding: Member,
}

impl StreamRunner for FailingOne {
    type Error = std::io::Error;

    async fn run(&self, database: String, stop: CancellationToken) -> Result<(), std::io::Error> {
        if database == self.failing {
            return Err(std::io::Error::other(format!("{database}: no permission")));
        }
        self.holding.run(database, stop).await
    }
}

/// A revocation that arrives while the probe waits on a slow server is answered at
/// once, not after the probe; a database that failed in a revoked slot is no longer
/// this member's to count or retry, and is read at once when its slot comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_is_answered_during_a_slow_probe_and_takes_failures_along() {
    use mssql_ces::databases::fleet::{FleetEvent, slot_of};
    const SLOTS: u32 = 2;
    let inner = SimServer::default();
    let names: Vec<String> = (1..=6).map(|i| format!("Tenant{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let sim = database(name, i as u128 + 1);
        insert(&sim, name, 1);
        inner.add(name, sim);
    }
    let failing = names
        .iter()
        .find(|n| slot_of(n, SLOTS) == 1)
        .expect("a database in slot 1")
        .clone();
    let in_slot_1: Vec<&String> = names.iter().filter(|n| slot_of(n, SLOTS) == 1).collect();
    let slow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = SlowServer {
        inner,
        slow: slow.clone(),
    };
    let shared = std::sync::Arc::new(HoldingRunner::default());
    let runner = FailingOne {
        failing: failing.clone(),
        holding: Member {
            name: "a",
            shared: shared.clone(),
        },
    };
    let mut many = settings(&["tenant*"]);
    many.max_active = 8;
    let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
    let supervisor = Supervisor::new(server, runner, many).in_fleet(SLOTS, events);
    let mut status = supervisor.status();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(shutdown.clone()));
    events_tx
        .send(FleetEvent::Assigned([0, 1].into()))
        .expect("running");
    wait_for(&mut status, "every database read, one failed", |s| {
        s.active == 5 && s.failed == 1
    })
    .await;
    // Every probe from now on waits 6 s.
    slow.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asked = std::time::Instant::now();
    revoke(&events_tx, &[1]).await;
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "answered in {:?}, not after the slow probe",
        asked.elapsed()
    );
    for name in &in_slot_1 {
        assert_eq!(shared.active(name), 0, "{name} stopped before the answer");
    }
    slow.store(false, std::sync::atomic::Ordering::Relaxed);
    let s = wait_for(&mut status, "the failure is not this member's now", |s| {
        s.fleet.as_ref().is_some_and(|f| f.slots == 1)
    })
    .await;
    assert_eq!(s.failed, 0, "{s:?}");
    // Back again: the failed database is tried at once, not after its backoff.
    let other = in_slot_1
        .iter()
        .find(|n| ***n != failing)
        .map(|n| n.as_str());
    let reads_before = other.map(|n| shared.reads(n, "a"));
    events_tx
        .send(FleetEvent::Assigned([1].into()))
        .expect("running");
    wait_for(&mut status, "slot 1's databases read again", |s| {
        s.failed == 1 && s.active == 5
    })
    .await;
    if let (Some(other), Some(before)) = (other, reads_before) {
        eventually("read again", || shared.reads(other, "a") > before).await;
    }
    shutdown.cancel();
    run.await.expect("join").expect("stops");
}

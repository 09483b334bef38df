//! `source.cleanup = "after_delivery"` against the CDC simulator: change tables are
//! cleaned below what this stream's checkpoint and every other stream of the
//! database have delivered, never below what one of them still needs; the setting is
//! refused without `db_owner`; the default leaves cleanup to SQL Server's job; a
//! store whose other checkpoints cannot be read cleans nothing; and the whole run,
//! with a file store holding another stream's checkpoint beside its own.

use std::time::Duration;

use cdc_sim::CdcSimulator;
use mssql_ces::checkpoint::file::FileStore;
use mssql_ces::checkpoint::memory::MemoryStore;
use mssql_ces::checkpoint::{CHECKPOINT_VERSION, Checkpoint, CheckpointStore};
use mssql_ces::event::Value;
use mssql_ces::lsn::Lsn;
use mssql_ces::position::Position;
use mssql_ces::source::poller::{CleanupMode, PollOutcome, Poller, PollerConfig};
use mssql_ces::source::{CdcReads, SourceError};
use tokio::sync::watch;

use crate::common::Item;

const INTERVAL: Duration = Duration::from_secs(60);

fn config() -> PollerConfig {
    PollerConfig {
        catalog_refresh: Duration::ZERO,
        cleanup: CleanupMode::AfterDelivery,
        cleanup_interval: INTERVAL,
        ..PollerConfig::default()
    }
}

/// `dbo.T` with ten rows inserted, each in a transaction of its own.
fn database() -> CdcSimulator {
    let sim = crate::common::shop_with_t(0);
    sim.enable_table("dbo.T", None).expect("enable");
    for id in 1..=10 {
        insert(&sim, id);
    }
    sim
}

fn insert(sim: &CdcSimulator, id: i32) {
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(id), Value::Text(format!("row {id}"))],
        )
        .commit()
        .expect("commit");
}

fn min_lsn(sim: &CdcSimulator) -> Option<Lsn> {
    let mut source = sim.clone();
    futures_util::FutureExt::now_or_never(source.min_lsn("dbo_T"))
        .expect("the simulator answers at once")
        .expect("min_lsn")
}

fn commit_lsns(items: &[Item]) -> Vec<Lsn> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Change(c) => Some(c.commit_lsn),
            Item::Schema(_) => None,
        })
        .collect()
}

fn peer(name: &str, position: &Position) -> Checkpoint {
    Checkpoint {
        version: CHECKPOINT_VERSION,
        stream_name: name.into(),
        position: position.clone(),
    }
}

/// One poll, which must not fail.
async fn poll(poller: &mut Poller<CdcSimulator>) -> PollOutcome {
    poller.poll().await.expect("poll")
}

#[tokio::test(start_paused = true)]
async fn change_tables_are_cleaned_below_what_every_stream_of_the_database_delivered() {
    let sim = database();
    // Another stream of the database, which has delivered the first four changes.
    let mut audit = Poller::new(
        sim.clone(),
        PollerConfig {
            batch_size: 4,
            ..PollerConfig::default()
        },
        None,
    );
    let PollOutcome::Batch(first) = audit.poll().await.expect("poll") else {
        panic!("the audit stream's first batch");
    };
    assert_eq!(first.changes.len(), 4);
    let audit_at = first.position.clone();

    let (checkpoint, checkpoints) = watch::channel(None::<Position>);
    let peers = MemoryStore::default();
    peers.set_peers(vec![peer("audit", &audit_at)]);
    let mut poller = Poller::new(sim.clone(), config(), None);
    poller.watch_checkpoints(checkpoints);
    poller.read_peers_from(CheckpointStore::Memory(peers.clone()));
    let items = crate::common::drain_items(&mut poller)
        .await
        .expect("drain");
    let lsns = commit_lsns(&items);
    assert_eq!(lsns.len(), 10);
    let start = min_lsn(&sim).expect("min_lsn");
    assert!(start <= lsns[0]);

    // Read but not yet delivered: nothing is cleaned, however long it waits.
    tokio::time::advance(INTERVAL).await;
    poll(&mut poller).await;
    assert_eq!(sim.change_table_cleanups(), (0, 0));
    assert_eq!(min_lsn(&sim), Some(start));

    // Delivered through the tenth change here, the fourth in the audit stream: the
    // rows below the fourth go, not before the interval is out.
    checkpoint.send_replace(Some(poller.position().clone()));
    poll(&mut poller).await;
    assert_eq!(sim.change_table_cleanups(), (0, 0), "within the interval");
    tokio::time::advance(INTERVAL).await;
    poll(&mut poller).await;
    assert_eq!(sim.change_table_cleanups(), (1, 3));
    assert_eq!(min_lsn(&sim), Some(lsns[3]));
    assert_eq!(poller.cleanup_rounds(), 1);

    // The same bounds again: the procedure does not run again.
    tokio::time::advance(INTERVAL).await;
    poll(&mut poller).await;
    assert_eq!(poller.cleanup_rounds(), 1);

    // The audit stream resumes from its checkpoint and misses nothing (a change it
    // had not delivered that was cleaned would stop it: `on_gap = "fail"`).
    let mut audit = Poller::new(sim.clone(), PollerConfig::default(), Some(audit_at));
    let rest = crate::common::drain_items(&mut audit)
        .await
        .expect("no gap");
    assert_eq!(commit_lsns(&rest), lsns[4..]);

    // Once it has delivered everything, so is everything cleaned but the last
    // commit, which the procedure's mark keeps.
    peers.set_peers(vec![peer("audit", audit.position())]);
    tokio::time::advance(INTERVAL).await;
    poll(&mut poller).await;
    assert_eq!(sim.change_table_cleanups(), (2, 9));
    assert_eq!(min_lsn(&sim), Some(lsns[9]));
    assert_eq!(poller.cleanup_rounds(), 2);

    // Between rounds an idle poll costs what it costs without the setting: the
    // permission was asked once, and nothing else is.
    let before = sim.round_trips();
    poll(&mut poller).await;
    let idle_cost = sim.round_trips() - before;
    let agent_config = PollerConfig {
        cleanup: CleanupMode::Agent,
        ..config()
    };
    let mut agent = Poller::new(sim.clone(), agent_config, None);
    crate::common::drain_items(&mut agent).await.expect("drain");
    let before = sim.round_trips();
    agent.poll().await.expect("poll");
    assert_eq!(idle_cost, sim.round_trips() - before);

    // New changes stream on after the cleanup.
    insert(&sim, 11);
    let more = crate::common::drain_items(&mut poller)
        .await
        .expect("drain");
    assert_eq!(commit_lsns(&more).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stream_of_another_database_or_a_table_it_does_not_read_holds_nothing_back() {
    let sim = database();
    let (checkpoint, checkpoints) = watch::channel(None::<Position>);
    let peers = MemoryStore::default();
    let mut poller = Poller::new(sim.clone(), config(), None);
    poller.watch_checkpoints(checkpoints);
    poller.read_peers_from(CheckpointStore::Memory(peers.clone()));
    let lsns = commit_lsns(
        &crate::common::drain_items(&mut poller)
            .await
            .expect("drain"),
    );
    let mut own = poller.position().clone();
    let low = *own.instances.get("dbo_T").expect("recorded");
    // The simulator's database has no GUID; a server's has.
    if let Some(source) = own.source.as_mut() {
        source.database_guid = Some(uuid::Uuid::from_u128(1));
    }
    // A restored copy (another GUID) far behind, and a stream of this database
    // that reads other tables only.
    let mut copy = Position {
        instances: [("dbo_T".to_owned(), Lsn::from_parts(0, 0, 1))].into(),
        ..own.clone()
    };
    if let Some(source) = copy.source.as_mut() {
        source.database_guid = Some(uuid::Uuid::from_u128(7));
    }
    let other_tables = Position {
        instances: [("dbo_Other".to_owned(), Lsn::from_parts(0, 0, 1))].into(),
        ..own.clone()
    };
    peers.set_peers(vec![peer("copy", &copy), peer("other", &other_tables)]);
    checkpoint.send_replace(Some(own));
    tokio::time::advance(INTERVAL).await;
    poll(&mut poller).await;
    assert_eq!(min_lsn(&sim), Some(lsns[9]));
    assert!(low >= lsns[9]);
}

#[tokio::test(start_paused = true)]
async fn without_db_owner_the_first_poll_stops_naming_the_setting() {
    let sim = database();
    sim.set_db_owner(false);
    let mut poller = Poller::new(sim.clone(), config(), None);
    let refused = poller.poll().await.expect_err("refused");
    assert!(
        matches!(refused, SourceError::ManageDenied { .. }),
        "{refused:?}"
    );
    let said = refused.to_string();
    for named in [
        "source.cleanup = \"after_delivery\"",
        "db_owner",
        "sys.sp_cdc_cleanup_change_table",
        "source.cleanup = \"agent\"",
    ] {
        assert!(said.contains(named), "{named}: {said}");
    }
    // The default leaves cleanup to SQL Server's job: no permission asked.
    let (checkpoint, checkpoints) = watch::channel(None::<Position>);
    let mut agent = Poller::new(
        sim.clone(),
        PollerConfig {
            cleanup_interval: INTERVAL,
            ..PollerConfig::default()
        },
        None,
    );
    agent.watch_checkpoints(checkpoints);
    crate::common::drain_items(&mut agent).await.expect("drain");
    checkpoint.send_replace(Some(agent.position().clone()));
    tokio::time::advance(INTERVAL * 2).await;
    poll(&mut agent).await;
    assert_eq!(sim.change_table_cleanups(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn other_checkpoints_that_cannot_be_read_clean_nothing_and_the_stream_goes_on() {
    let sim = database();
    let (checkpoint, checkpoints) = watch::channel(None::<Position>);
    let mut poller = Poller::new(sim.clone(), config(), None);
    poller.watch_checkpoints(checkpoints);
    let gone = std::env::temp_dir().join(format!("mssql-ces-gone-{}", uuid::Uuid::new_v4()));
    poller.read_peers_from(CheckpointStore::File(FileStore::new(
        gone.join("cp.json"),
        "own",
    )));
    crate::common::drain_items(&mut poller)
        .await
        .expect("drain");
    checkpoint.send_replace(Some(poller.position().clone()));
    tokio::time::advance(INTERVAL).await;
    poll(&mut poller).await;
    assert_eq!(sim.change_table_cleanups(), (0, 0));
    insert(&sim, 11);
    let more = crate::common::drain_items(&mut poller)
        .await
        .expect("drain");
    assert_eq!(commit_lsns(&more).len(), 1);
}

/// The file store's other checkpoints: the documents beside this stream's, not its
/// own, its lock, other files or a sink's output.
#[tokio::test]
async fn the_file_store_finds_the_other_streams_beside_its_own() {
    let dir = std::env::temp_dir().join(format!("mssql-ces-peers-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let position = Position {
        instances: [("dbo_T".to_owned(), Lsn::from_parts(1, 2, 3))].into(),
        ..Position::default()
    };
    let mut own = CheckpointStore::File(FileStore::new(dir.join("own.json"), "own"));
    own.save(&position).await.expect("save");
    let mut audit = CheckpointStore::File(FileStore::new(dir.join("audit.json"), "audit"));
    audit.save(&position).await.expect("save");
    std::fs::write(dir.join("own.json.lock"), "pid 1").expect("lock");
    std::fs::write(dir.join("events.jsonl"), "{\"specversion\":\"1.0\"}\n").expect("sink");
    std::fs::write(dir.join("notes.txt"), "hello").expect("notes");
    let found = own.peers().await.expect("peers");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].stream_name, "audit");
    assert_eq!(found[0].position, position);
    // A newer release's checkpoint, with a field this one does not know, may need
    // more than this one can tell: an error, not a document passed over.
    let newer = std::fs::read_to_string(dir.join("audit.json"))
        .expect("read")
        .replacen(
            &format!("\"version\": {CHECKPOINT_VERSION}"),
            &format!("\"version\": {}, \"later\": 1", CHECKPOINT_VERSION + 1),
            1,
        );
    assert!(newer.contains("later"), "{newer}");
    std::fs::write(dir.join("newer.json"), newer).expect("newer");
    let refused = own.peers().await.expect_err("newer");
    assert!(refused.to_string().contains("newer"), "{refused}");
    std::fs::remove_dir_all(dir).ok();
}

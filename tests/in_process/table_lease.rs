//! The table checkpoint store's lease through the real driver, against the
//! stand-in's model of `dbo.mssql_ces_checkpoint` and session-owned application
//! locks (`support::tds_checkpoint`): a process whose session the server ended
//! stops producing within a bound, and stops for good once another process holds
//! the stream; one whose own old session lingers waits and goes on.

use std::time::{Duration, Instant};

use mssql_ces::checkpoint::table::{LeaseTiming, TableStore};
use mssql_ces::checkpoint::{CheckpointError, CheckpointStore};
use mssql_ces::event::Encoding;
use mssql_ces::pipeline::{self, PipelineError, PipelineSettings};
use mssql_ces::position::Position;
use mssql_ces::sink::Sink;
use mssql_ces::sink::stream::{Resume, StreamSink};
use mssql_ces::source::poller::{Poller, PollerConfig};
use mssql_ces::source::sqlserver::{ConnectionString, SqlServerConfig};
use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};
use tokio_util::sync::CancellationToken;

use crate::support::tds::StandIn;
use crate::support::tds_checkpoint::CheckpointTable;

const USER: &str = "ces";
const PASSWORD: &str = "Lease-Test-1";
/// The lock resource of stream `orders` (the name lower-cased).
const RESOURCE: &str = "mssql-ces:orders";

async fn standin() -> (StandIn, CheckpointTable) {
    let table = CheckpointTable::default();
    let standin = StandIn::start(USER, PASSWORD, table.handler())
        .await
        .expect("stand-in");
    (standin, table)
}

/// The store's connection settings for `connection_string`.
fn settings(connection_string: ConnectionString) -> SqlServerConfig {
    SqlServerConfig {
        connection_string,
        trust_server_certificate: true,
        encrypt: false,
        connect_timeout: Duration::from_secs(5),
        query_timeout: Duration::from_secs(5),
    }
}

fn store(standin: &StandIn, stream: &str) -> TableStore {
    TableStore::new(
        settings(ConnectionString::new(
            standin.connection_string(USER, PASSWORD),
        )),
        stream,
    )
}

async fn leased(store: TableStore) -> CheckpointStore {
    let mut store = CheckpointStore::Table(Box::new(store));
    // A lease that cannot be had is retried until cancelled: a test gives up after
    // a while, saying so.
    let give_up = CancellationToken::new();
    let timer = {
        let give_up = give_up.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            give_up.cancel();
        })
    };
    let acquired = store.acquire_lease(&give_up).await;
    timer.abort();
    assert!(
        !give_up.is_cancelled(),
        "the lease was not acquired within 60 s"
    );
    assert!(matches!(acquired, Ok(true)), "{acquired:?}");
    store
}

#[tokio::test]
async fn a_killed_session_loses_the_stream_to_the_standby_and_its_writes_stop() {
    let (standin, table) = standin().await;
    let mut active = leased(store(&standin, "Orders")).await;
    active
        .save(&Position::default())
        .await
        .expect("first write");
    let active_session = table.holder(RESOURCE).expect("held");

    // The server ends the active's session (a dropped connection it noticed): the
    // standby, on its own session, takes the stream.
    assert_eq!(table.kill_holder(RESOURCE), Some(active_session));
    let mut standby = leased(store(&standin, "orders")).await;
    let standby_session = table.holder(RESOURCE).expect("taken over");
    assert_ne!(standby_session, active_session);

    // The active's check fails: first on its dead connection (a fault that can
    // pass), then on a new one, where the lease is another's. Within the grace for
    // its own old session, that too is a fault that can pass...
    let first = active.verify_lease().await.unwrap_err();
    assert!(first.is_transient(), "{first}");
    let second = active.verify_lease().await.unwrap_err();
    assert!(second.is_transient(), "{second}");
    assert!(
        second.to_string().contains("standby that took over"),
        "{second}"
    );
    // ... and a write is refused the same way: nothing written by the active since.
    assert!(active.save(&Position::default()).await.is_err());
    assert!(
        table
            .writes()
            .iter()
            .skip(1)
            .all(|(session, _)| *session != active_session),
        "{:?}",
        table.writes()
    );
    standby
        .save(&Position::default())
        .await
        .expect("the standby writes");

    // Past the grace, the lease is lost: the run stops.
    let mut late = CheckpointStore::Table(Box::new(
        store(&standin, "orders").with_lease_timing(grace(Duration::ZERO)),
    ));
    let err = late.verify_lease().await.unwrap_err();
    assert!(
        matches!(err, CheckpointError::LeaseLost { .. }),
        "a store that never held the lease cannot take it: {err}"
    );
}

#[tokio::test]
async fn a_lost_lease_past_the_grace_is_lost_for_good() {
    let (standin, table) = standin().await;
    let mut active =
        leased(store(&standin, "orders").with_lease_timing(grace(Duration::ZERO))).await;
    table.kill_holder(RESOURCE).expect("held");
    let _standby = leased(store(&standin, "orders")).await;
    // The dead connection, then the fence on a new one.
    let _ = active.verify_lease().await;
    let err = active.verify_lease().await.unwrap_err();
    assert!(matches!(err, CheckpointError::LeaseLost { .. }), "{err}");
    assert!(err.to_string().contains("another process took"), "{err}");
}

#[tokio::test]
async fn the_own_previous_session_lingering_is_waited_out() {
    let (standin, table) = standin().await;
    let mut active = leased(store(&standin, "orders")).await;
    let old = table.drop_holder_lingering(RESOURCE).expect("held");
    // The connection is gone; the server still holds the old session's lock.
    let _ = active.verify_lease().await;
    let err = active.verify_lease().await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(table.holder(RESOURCE), Some(old));
    // Once the server ends it, the new session takes the lease again.
    table.release_lingering();
    active.verify_lease().await.expect("taken again");
    assert_ne!(table.holder(RESOURCE), Some(old));
    active
        .save(&Position::default())
        .await
        .expect("writes again");
}

#[tokio::test]
async fn the_checkpoint_is_read_only_under_the_lease() {
    let (standin, table) = standin().await;
    let mut first = leased(store(&standin, "orders")).await;
    first.save(&Position::default()).await.expect("write");
    let session = table.holder(RESOURCE).expect("held");
    table.kill_holder(RESOURCE);
    let _standby = leased(store(&standin, "orders")).await;
    // The dead connection fails the read; the next read's connection cannot take
    // the lease, so it does not read.
    assert!(first.load().await.is_err());
    assert!(first.load().await.is_err());
    let reads_without_lease = table
        .requests()
        .iter()
        .filter(|(s, sql)| *s != session && sql.starts_with("SELECT position"))
        .filter(|(s, _)| Some(*s) != table.holder(RESOURCE))
        .count();
    assert_eq!(reads_without_lease, 0, "{:?}", table.requests());
}

/// `source.cleanup = "after_delivery"` reads the other streams' rows through a store
/// of its own, without the lease: every row but its stream's.
#[tokio::test]
async fn the_other_streams_rows_are_read_without_the_lease() {
    let (standin, table) = standin().await;
    let position = |n: u32| Position {
        instances: [("dbo_T".to_owned(), mssql_ces::lsn::Lsn::from_parts(n, 0, 1))].into(),
        ..Position::default()
    };
    let mut orders = leased(store(&standin, "orders")).await;
    orders.save(&position(1)).await.expect("write");
    let mut audit = leased(store(&standin, "audit")).await;
    audit.save(&position(2)).await.expect("write");
    let holder = table.holder(RESOURCE).expect("held");
    let mut reader = CheckpointStore::Table(Box::new(store(&standin, "Orders")));
    let peers = reader.peers().await.expect("peers");
    assert_eq!(peers.len(), 1, "{peers:?}");
    assert_eq!(peers[0].stream_name, "audit");
    assert_eq!(peers[0].position, position(2));
    // The reader asked for no lease: the writer's session still holds it, and
    // the reader's session sent the one query.
    assert_eq!(table.holder(RESOURCE), Some(holder));
    let readers: Vec<_> = (table.requests().into_iter())
        .filter(|(session, _)| {
            *session != holder && Some(*session) != table.holder("mssql-ces:audit")
        })
        .map(|(_, sql)| sql)
        .collect();
    assert_eq!(readers, [mssql_ces::checkpoint::table::CHECKPOINT_PEERS]);
}

/// The default lease timings with another grace.
fn grace(own_session_grace: Duration) -> LeaseTiming {
    LeaseTiming {
        own_session_grace,
        ..LeaseTiming::default()
    }
}

fn synthetic() -> SyntheticConfig {
    SyntheticConfig {
        seed: 5,
        transactions: Some(1_000_000),
        rate_per_second: Some(200.0),
        large_value_every: 0,
        existing_rows: 0,
        oversized_value_every: 0,
    }
}

/// The lines in the output file.
fn lines(path: &std::path::Path) -> usize {
    std::fs::read(path).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
}

/// A run whose store session the server ended while a standby took the stream:
/// it hands nothing more to the sink once its last lease confirmation is
/// `trusted_for` old, and (the grace after it) fails naming the lost lease. The
/// timings are shorter than a run's (2 s, 6 s, 120 s), each wait more than a
/// second from the bound it tests.
#[tokio::test]
async fn a_run_whose_session_was_ended_stops_producing_within_the_bound() {
    let (standin, table) = standin().await;
    let timing = LeaseTiming {
        confirm_every: Duration::from_millis(400),
        trusted_for: Duration::from_millis(1_000),
        own_session_grace: Duration::from_millis(4_400),
    };
    let active = leased(store(&standin, "orders").with_lease_timing(timing)).await;
    let path = std::env::temp_dir().join(format!("mssql-ces-lease-run-{}", uuid::Uuid::new_v4()));
    let sink = StreamSink::file(path.clone(), Encoding::Json, Resume::Fresh).expect("file sink");
    let run_settings = PipelineSettings {
        poll_interval: Duration::from_millis(10),
        // No checkpoint write in the test: the lease checks alone must pause it.
        checkpoint_interval: Duration::from_secs(600),
        drain_timeout: Duration::from_secs(2),
        idle_drain_timeout: Duration::from_secs(2),
        until_idle: false,
        metrics: Default::default(),
    };
    let run = tokio::spawn(pipeline::run(
        Poller::new(
            SyntheticSource::new(synthetic()),
            PollerConfig::default(),
            None,
        ),
        crate::pipeline_faults::factory(),
        crate::pipeline_faults::router(),
        Sink::Stream(sink),
        active,
        run_settings,
        CancellationToken::new(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(lines(&path) > 0, "producing");
    let killed = Instant::now();
    table.kill_holder(RESOURCE).expect("held");
    let _standby = leased(store(&standin, "orders")).await;

    // Within trusted_for of the last confirmation (at most confirm_every before
    // the kill) plus a batch in flight, nothing more reaches the file.
    tokio::time::sleep(timing.trusted_for + Duration::from_millis(800)).await;
    let paused_at = lines(&path);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(
        lines(&path),
        paused_at,
        "nothing sent while the lease is unconfirmed"
    );
    assert!(!run.is_finished(), "within the grace it waits");

    let result = tokio::time::timeout(Duration::from_secs(15), run)
        .await
        .expect("ends after the grace")
        .expect("no panic");
    match result {
        Err(PipelineError::Checkpoint(CheckpointError::LeaseLost { .. })) => {}
        other => panic!("expected the lost lease, got {other:?}"),
    }
    // The grace counts from the last confirmation, up to confirm_every before the
    // kill.
    assert!(
        killed.elapsed() >= timing.own_session_grace - timing.confirm_every,
        "not before the grace: {:?}",
        killed.elapsed()
    );
    assert_eq!(lines(&path), paused_at);
    std::fs::remove_file(path).ok();
}

/// A source on a readable secondary (`ApplicationIntent=ReadOnly`): the checkpoint
/// write fails there as on SQL Server (3906, the database is read-only), naming the
/// setting; without the read-only intent (what the store uses by default) it works.
#[tokio::test]
async fn a_checkpoint_store_on_a_readable_secondary_is_refused_by_name_and_the_primary_works() {
    let (standin, _table) = standin().await;
    let read_only = ConnectionString::new(format!(
        "{};ApplicationIntent=ReadOnly",
        standin.connection_string(USER, PASSWORD)
    ));
    assert!(read_only.read_only_intent());
    let mut secondary = leased(TableStore::new(settings(read_only.clone()), "orders")).await;
    let err = secondary.save(&Position::default()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        !err.is_transient()
            && text.contains("read-only")
            && text.contains("checkpoint.connection_string"),
        "{text}"
    );
    drop(secondary);
    let primary = read_only.read_write();
    assert!(!primary.read_only_intent());
    let mut store = leased(TableStore::new(settings(primary), "orders")).await;
    store
        .save(&Position::default())
        .await
        .expect("written on the primary");
}

/// Without the lease for longer than the grace, the lock being free proves nothing:
/// a standby may have taken the stream, written a newer checkpoint and gone. The
/// store does not take the lease back (it would write an older position over the
/// standby's); the run stops, and a restart reads the checkpoint.
#[tokio::test]
async fn a_lease_unconfirmed_past_the_grace_is_not_taken_back_even_when_free() {
    let (standin, table) = standin().await;
    let mut active =
        leased(store(&standin, "orders").with_lease_timing(grace(Duration::from_millis(300))))
            .await;
    table.kill_holder(RESOURCE).expect("held");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The dead connection, then the fence: the lock is free, but too late.
    let _ = active.verify_lease().await;
    let err = active.verify_lease().await.unwrap_err();
    assert!(matches!(err, CheckpointError::LeaseLost { .. }), "{err}");
    assert_eq!(table.holder(RESOURCE), None, "not taken back");
    assert!(active.save(&Position::default()).await.is_err());
}

//! The initial load over several connections (`snapshot.max_connections`) against
//! the CDC simulator: the same events, ids and bytes as over one connection, from
//! the start and from every checkpoint; a table with an integer key cut into key
//! ranges; writes during the load still replay to the current tables; reads
//! overlapping in (simulated) time, with the rows read ahead bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cdc_sim::{CdcSimulator, ReadLatency};
use futures_util::future::BoxFuture;
use mssql_ces::event::{Change, Value};
use mssql_ces::position::Position;
use mssql_ces::source::initial_load::SnapshotMode;
use mssql_ces::source::poller::{ChunkReader, PollOutcome, Poller, PollerConfig, RANGE_CHUNKS};
use mssql_ces::source::{CaptureInstance, SourceError, TableCursor, TableReads};
use uuid::Uuid;

use crate::initial_load::{
    Rng, assert_replay_gives_the_tables, database, drain, encoder, is_loaded, item, pair,
    random_write,
};

fn config(connections: usize, chunk: usize) -> PollerConfig {
    PollerConfig {
        page_size: 40,
        batch_size: 40,
        snapshot: SnapshotMode::Initial,
        load_chunk: chunk,
        load_connections: connections,
        ..PollerConfig::default()
    }
}

/// A reader on a connection of its own: the simulator, counting the rows it read
/// and the readers open.
struct Counted {
    sim: CdcSimulator,
    rows: Arc<AtomicUsize>,
    live: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ChunkReader for Counted {
    fn read<'a>(
        &'a mut self,
        instance: &'a CaptureInstance,
        after: Option<&'a [Option<String>]>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Vec<Value>>, SourceError>> {
        Box::pin(async move {
            let cursor = after.map_or(TableCursor::Start, TableCursor::AfterKey);
            let rows = self.sim.read_table(instance, cursor, limit).await?;
            self.rows.fetch_add(rows.len(), Ordering::SeqCst);
            Ok(rows)
        })
    }
}

/// A poller reading `sim` over `connections`, its readers' rows counted in `read`.
fn poller(
    sim: &CdcSimulator,
    config: PollerConfig,
    position: Option<Position>,
    read: &Arc<AtomicUsize>,
) -> Poller<CdcSimulator> {
    poller_counting(sim, config, position, read, &Arc::default())
}

/// [`poller`], its readers open counted in `live`.
fn poller_counting(
    sim: &CdcSimulator,
    config: PollerConfig,
    position: Option<Position>,
    read: &Arc<AtomicUsize>,
    live: &Arc<AtomicUsize>,
) -> Poller<CdcSimulator> {
    let most = config.load_connections;
    let mut poller = Poller::new(sim.clone(), config, position);
    let (sim, read, live) = (sim.clone(), Arc::clone(read), Arc::clone(live));
    poller.read_loads_with(Arc::new(move || {
        let open = live.fetch_add(1, Ordering::SeqCst);
        assert!(open < most, "a reader beyond snapshot.max_connections");
        Box::new(Counted {
            sim: sim.clone(),
            rows: Arc::clone(&read),
            live: Arc::clone(&live),
        }) as Box<dyn ChunkReader>
    }));
    poller
}

/// `dbo.items` with `items` rows and `dbo.pairs` with 60, from before CDC.
fn tables(items: i32) -> CdcSimulator {
    let sim = database();
    let mut txn = sim.transaction();
    for id in 1..=items {
        txn = txn.insert("dbo.items", item(id * 3, &format!("item {id}"), id));
    }
    for a in 0..60 {
        txn = txn.insert("dbo.pairs", pair(a % 7, &format!("b{a}"), i64::from(a)));
    }
    txn.commit().unwrap();
    sim.enable_table("dbo.items", None).unwrap();
    sim.enable_table("dbo.pairs", None).unwrap();
    sim
}

fn bytes(changes: &[Change]) -> Vec<(Uuid, Vec<u8>)> {
    let encoder = encoder();
    changes
        .iter()
        .flat_map(|c| encoder.encode(c).unwrap().messages)
        .map(|m| (m.id, m.bytes))
        .collect()
}

#[tokio::test]
async fn four_connections_send_the_bytes_one_sends_and_cut_the_integer_key() {
    let sim = tables(2000);
    let read = Arc::new(AtomicUsize::new(0));
    let one = drain(&mut Poller::new(sim.clone(), config(1, 50), None), |_| {}).await;
    let live = Arc::new(AtomicUsize::new(0));
    let mut four = poller_counting(&sim, config(4, 50), None, &read, &live);
    let parallel = drain(&mut four, |_| {}).await;
    assert_eq!(
        live.load(Ordering::SeqCst),
        0,
        "the readers close with the load"
    );
    assert_eq!(four.load_readers_open(), 0);
    assert_eq!(one.len(), 2060);
    assert_eq!(
        bytes(&parallel),
        bytes(&one),
        "the same events, ids and bytes"
    );
    // dbo.items (an int key, 2000 rows) in ten key ranges of four chunks;
    // dbo.pairs (a text column in its key) whole.
    assert_eq!(four.load_segments_read(), 11);
    // A range reads at most one chunk past its end (cut off, not sent).
    let rows_read = read.load(Ordering::SeqCst);
    assert!(
        (2060..=2060 + 9 * 50).contains(&rows_read),
        "{rows_read} rows read"
    );
}

#[tokio::test]
async fn a_load_resumed_over_four_connections_sends_what_one_would() {
    let sim = tables(600);
    let mut whole = Poller::new(sim.clone(), config(1, 40), None);
    let mut batches = Vec::new();
    while let PollOutcome::Batch(batch) = whole.poll().await.unwrap() {
        batches.push(batch);
    }
    let all: Vec<Change> = batches.iter().flat_map(|b| b.changes.clone()).collect();
    assert_eq!(all.len(), 660);
    for at in (1..batches.len() - 1).step_by(3) {
        let sent_before: usize = batches[..=at].iter().map(|b| b.changes.len()).sum();
        let read = Arc::new(AtomicUsize::new(0));
        let checkpoint = batches[at].position.clone();
        let mut resumed = poller(&sim, config(4, 40), Some(checkpoint), &read);
        let rest = drain(&mut resumed, |_| {}).await;
        assert_eq!(
            bytes(&rest),
            bytes(&all[sent_before..]),
            "resumed after batch {at}"
        );
        let rows_read = read.load(Ordering::SeqCst);
        assert!(
            (660 - sent_before..=660 - sent_before + 3 * 40).contains(&rows_read),
            "resumed after batch {at}: {rows_read} rows read, the rows not sent and at most a chunk past each cut"
        );
    }
}

/// The initial load's randomized test over four connections: writes between the
/// load's chunks (while the readers read ahead) and after it; applying the events
/// per key gives the tables.
#[tokio::test]
async fn writes_during_a_load_over_four_connections_replay_to_the_current_tables() {
    for held in mssql_ces_testkit::test_seeds(&[5, 23, 4242]) {
        let seed = held.0;
        let sim = tables(400);
        let mut rng = Rng(seed);
        let mut next_id = 10_000;
        for _ in 0..10 {
            random_write(&sim, &mut rng, &mut next_id);
        }
        let read = Arc::new(AtomicUsize::new(0));
        let mut poller = poller(&sim, config(4, 9), None, &read);
        let writer = sim.clone();
        let mut writes = Rng(seed ^ 0x5EED);
        let events = drain(&mut poller, |polls| {
            if polls < 150 {
                for _ in 0..writes.below(3) {
                    random_write(&writer, &mut writes, &mut next_id);
                }
            }
        })
        .await;
        assert!(
            poller.load_segments_read() > 2,
            "seed {seed}: key ranges read"
        );
        assert!(events.iter().filter(|c| is_loaded(c)).count() >= 350);
        assert_replay_gives_the_tables(seed, &events, &sim);
    }
}

/// With each read taking time (a statement's round trip and a time per row), four
/// connections load in well under half the time one takes, and never hold more
/// than two ranges per connection and two chunks more read ahead of what was sent.
#[tokio::test(start_paused = true)]
async fn reads_overlap_and_what_is_read_ahead_is_bounded() {
    let sim = tables(4000);
    sim.set_read_latency(Some(ReadLatency {
        statement: Duration::from_millis(5),
        per_row: Duration::from_micros(20),
    }));
    let chunk = 100;
    let load_time = |connections: usize| {
        let sim = sim.clone();
        async move {
            let read = Arc::new(AtomicUsize::new(0));
            let mut poller = poller(&sim, config(connections, chunk), None, &read);
            let started = tokio::time::Instant::now();
            let mut sent = 0;
            let mut most_ahead = 0;
            loop {
                match poller.poll().await.unwrap() {
                    PollOutcome::Batch(batch) => {
                        sent += batch.changes.iter().filter(|c| is_loaded(c)).count();
                    }
                    PollOutcome::Idle => break,
                }
                // Let the readers run on as the pipeline would while sending.
                tokio::time::sleep(Duration::from_millis(1)).await;
                most_ahead = most_ahead.max(read.load(Ordering::SeqCst).saturating_sub(sent));
            }
            assert_eq!(sent, 4060);
            (started.elapsed(), most_ahead)
        }
    };
    let (one, _) = load_time(1).await;
    let (four, ahead) = load_time(4).await;
    println!(
        "simulated load time: one connection {one:?}, four {four:?}; {ahead} rows read ahead at most"
    );
    assert!(
        four.as_secs_f64() < one.as_secs_f64() * 0.5,
        "four connections {four:?}, one {one:?}"
    );
    assert!(
        ahead <= (2 * 4 * RANGE_CHUNKS + 2) * chunk,
        "{ahead} rows read ahead"
    );
}

/// More tables than a plan takes at once (two connections plan four tables at a
/// time): each next plan takes the tables after, and the bytes are still one
/// connection's.
#[tokio::test]
async fn many_tables_are_planned_a_few_at_a_time_with_the_bytes_of_one_connection() {
    let sim = CdcSimulator::new("shop", crate::initial_load::GUID, 0);
    for t in 0..11 {
        let table = format!("t{t:02}");
        sim.create_table("dbo", &table, crate::initial_load::item_columns(), &["id"]);
        let mut txn = sim.transaction();
        for id in 1..=(20 + 37 * t) {
            txn = txn.insert(&format!("dbo.{table}"), item(id, "x", t));
        }
        txn.commit().unwrap();
        sim.enable_table(&format!("dbo.{table}"), None).unwrap();
    }
    let one = drain(&mut Poller::new(sim.clone(), config(1, 25), None), |_| {}).await;
    let read = Arc::new(AtomicUsize::new(0));
    let mut two = poller(&sim, config(2, 25), None, &read);
    let parallel = drain(&mut two, |_| {}).await;
    assert_eq!(
        one.len(),
        (0..11).map(|t| 20 + 37 * t).sum::<i32>() as usize
    );
    assert_eq!(bytes(&parallel), bytes(&one));
    assert!(
        two.load_segments_read() > 11,
        "{}",
        two.load_segments_read()
    );
}

/// A key that can hold NULL (a unique index on a nullable column) is not cut: a
/// NULL has no place among the integers the cut compares. The table is read whole,
/// with the bytes of one connection.
#[tokio::test]
async fn a_nullable_integer_key_is_read_whole() {
    let sim = CdcSimulator::new("shop", crate::initial_load::GUID, 0);
    sim.create_table(
        "dbo",
        "alt",
        vec![
            cdc_sim::SimColumn::not_null("id", mssql_ces::event::value::SqlType::Int),
            cdc_sim::SimColumn::new("code", mssql_ces::event::value::SqlType::Int),
        ],
        &["id"],
    );
    let mut txn = sim.transaction();
    for id in 1..=600 {
        let code = if id == 300 {
            Value::Null
        } else {
            Value::Int(-id)
        };
        txn = txn.insert("dbo.alt", vec![Value::Int(id), code]);
    }
    txn.commit().unwrap();
    sim.enable_table("dbo.alt", None).unwrap();
    sim.set_index_columns("dbo_alt", &["code"]);
    let one = drain(&mut Poller::new(sim.clone(), config(1, 20), None), |_| {}).await;
    let read = Arc::new(AtomicUsize::new(0));
    let mut four = poller(&sim, config(4, 20), None, &read);
    let parallel = drain(&mut four, |_| {}).await;
    assert_eq!(one.len(), 600);
    assert_eq!(bytes(&parallel), bytes(&one));
    assert_eq!(four.load_segments_read(), 1, "one range");
}

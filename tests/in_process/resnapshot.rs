//! Re-snapshots (`mssql-ces snapshot`) against the CDC simulator: a table read again
//! while its changes stream on, with writes before, during and after each chunk's
//! read and a capture job that lags behind the commits.

use std::collections::{BTreeMap, HashSet};

use cdc_sim::CdcSimulator;
use mssql_ces::event::{Change, Origin, Value};
use mssql_ces::lsn::Lsn;
use mssql_ces::source::initial_load::SnapshotMode;
use mssql_ces::source::poller::{
    PollOutcome, Poller, PollerConfig, ResnapshotStatus, SnapshotAccepted, SnapshotHandle,
    SnapshotRefused,
};
use mssql_ces::source::{
    CaptureDdl, CaptureInstance, CdcReads, FactReads, SourceClock, SourceError, TableCursor,
    TableReads,
};

use super::initial_load::{
    Copy, Rng, apply, as_map, assert_replay_gives_the_tables, contents, database, drain, encoder,
    item, item_columns, key_of, random_write, rows_before_cdc,
};

fn config(chunk: usize) -> PollerConfig {
    PollerConfig {
        page_size: 40,
        batch_size: 40,
        snapshot: SnapshotMode::Never,
        load_chunk: chunk,
        ..PollerConfig::default()
    }
}

/// What a test does to the database right after a table read.
type AfterRead = Box<dyn FnOnce(&CdcSimulator) + Send>;

/// The simulator, with random transactions committed just before and just after
/// each table read (rows a chunk shows changed, or changed right after it), and
/// sometimes a scan of the capture job right after.
struct WritesAroundReads {
    sim: CdcSimulator,
    rng: Rng,
    next_id: i32,
    reads: usize,
    /// Random transactions around every read (else only `after_read`'s).
    random: bool,
    /// Run once each, right after a read, in order.
    after_read: std::collections::VecDeque<AfterRead>,
}

impl WritesAroundReads {
    fn write_some(&mut self) {
        if !self.random {
            return;
        }
        for _ in 0..self.rng.below(3) {
            random_write(&self.sim, &mut self.rng, &mut self.next_id);
        }
    }
}

impl CdcReads for WritesAroundReads {
    async fn catalog(&mut self) -> Result<mssql_ces::source::Catalog, SourceError> {
        self.sim.catalog().await
    }
    async fn max_lsn(&mut self) -> Result<mssql_ces::source::MaxLsn, SourceError> {
        self.sim.max_lsn().await
    }
    async fn min_lsn(&mut self, ci: &str) -> Result<Option<Lsn>, SourceError> {
        self.sim.min_lsn(ci).await
    }
    async fn probe(
        &mut self,
        probes: &[mssql_ces::source::Probe],
        to: Lsn,
    ) -> Result<Vec<mssql_ces::source::ProbeResult>, SourceError> {
        self.sim.probe(probes, to).await
    }
    async fn read_changes(
        &mut self,
        instance: &CaptureInstance,
        after: mssql_ces::source::RowKey,
        to: Lsn,
        limit: usize,
    ) -> Result<Vec<mssql_ces::source::ChangeRow>, SourceError> {
        self.sim.read_changes(instance, after, to, limit).await
    }
    async fn ddl_history(
        &mut self,
        ci: &str,
    ) -> Result<Vec<mssql_ces::source::DdlEvent>, SourceError> {
        self.sim.ddl_history(ci).await
    }
    async fn lsn_time(
        &mut self,
        lsn: Lsn,
    ) -> Result<Option<mssql_ces::source::CommitTime>, SourceError> {
        self.sim.lsn_time(lsn).await
    }
}

impl TableReads for WritesAroundReads {
    async fn table_rows(&mut self, instance: &CaptureInstance) -> Result<Option<u64>, SourceError> {
        self.sim.table_rows(instance).await
    }
    async fn read_table(
        &mut self,
        instance: &CaptureInstance,
        cursor: TableCursor<'_>,
        limit: usize,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        self.reads += 1;
        self.write_some();
        let rows = self.sim.read_table(instance, cursor, limit).await;
        if let Some(after) = self.after_read.pop_front() {
            after(&self.sim);
        }
        self.write_some();
        // Sometimes the capture job scans before the poller reads max_lsn: changes
        // the chunk does not show are then at or below its high mark.
        if self.rng.below(2) == 0 {
            self.sim.run_capture_job();
        }
        rows
    }
}

impl FactReads for WritesAroundReads {
    async fn server_facts(&mut self) -> Result<mssql_ces::source::ServerFacts, SourceError> {
        self.sim.server_facts().await
    }
}

impl CaptureDdl for WritesAroundReads {}

impl SourceClock for WritesAroundReads {}

/// Asks `handle` for `table` while `poller` polls until the answer comes.
async fn ask<S: mssql_ces::source::ChangeSource>(
    poller: &mut Poller<S>,
    handle: &SnapshotHandle,
    table: &str,
    out: &mut Vec<Change>,
) -> Result<SnapshotAccepted, SnapshotRefused> {
    let handle = handle.clone();
    let table = table.to_owned();
    let answer = tokio::spawn(async move { handle.request(&table).await });
    while !answer.is_finished() {
        tokio::task::yield_now().await;
        match poller.poll().await {
            Ok(PollOutcome::Batch(batch)) => out.extend(batch.changes),
            Ok(PollOutcome::Idle) => {}
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("poll failed: {e}"),
        }
    }
    answer.await.expect("the request task ends")
}

/// As `drain`, and the most rows each re-snapshot (by capture instance) had
/// superseded, as the batches' positions recorded it.
async fn drain_counting<S: mssql_ces::source::ChangeSource>(
    poller: &mut Poller<S>,
    mut between: impl FnMut(usize),
    superseded: &mut BTreeMap<String, u64>,
) -> Vec<Change> {
    let mut out = Vec::new();
    for polls in 1.. {
        match poller.poll().await {
            Ok(PollOutcome::Batch(batch)) => {
                for (name, r) in &batch.position.resnapshots {
                    let most = superseded.entry(name.clone()).or_default();
                    *most = (*most).max(r.superseded);
                }
                out.extend(batch.changes);
            }
            Ok(PollOutcome::Idle) => break,
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("poll failed: {e}"),
        }
        between(polls);
        assert!(polls < 100_000, "the poller never went idle");
    }
    out
}

/// A key's state after an event: its row's values, or absent.
type State = Option<BTreeMap<String, Option<String>>>;

/// Per table and key, the states `events` leave it in, in order.
fn transitions(events: &[Change]) -> BTreeMap<(String, Vec<String>), Vec<State>> {
    let mut out: BTreeMap<(String, Vec<String>), Vec<State>> = BTreeMap::new();
    for c in events {
        let table = c.table.qualified_name();
        let new_key = c.current.as_ref().map(|row| key_of(c, row));
        if let Some(old) = &c.old {
            let old_key = key_of(c, old);
            if new_key.as_ref() != Some(&old_key) {
                out.entry((table.clone(), old_key)).or_default().push(None);
            }
        }
        if let (Some(row), Some(key)) = (&c.current, new_key) {
            out.entry((table, key))
                .or_default()
                .push(Some(as_map(c, row)));
        }
    }
    out
}

/// Each key's states as the consumer saw them must be states the table had, in the
/// order it had them: a re-read row never takes a key back to an older state.
/// `history` is every CDC event from the start, `before` the rows from before CDC.
fn assert_no_state_goes_back(seed: u64, seen: &[Change], history: &[Change], before: &Copy) {
    let mut truth = transitions(history);
    for (table, rows) in before {
        for (key, row) in rows {
            truth
                .entry((table.clone(), key.clone()))
                .or_default()
                .insert(0, Some(row.clone()));
        }
    }
    for (key, states) in transitions(seen) {
        let had = truth.get(&key).cloned().unwrap_or_default();
        let mut at = 0;
        for state in &states {
            match had[at..].iter().position(|h| h == state) {
                Some(found) => at += found,
                None => panic!(
                    "seed {seed}: {key:?} went to {state:?}, not a later state of the table's (it had {had:?}; the stream sent {states:?})"
                ),
            }
        }
    }
}

fn incremental(change: &Change) -> bool {
    matches!(
        change.origin,
        Origin::Load {
            incremental: true,
            ..
        }
    )
}

/// Rows the tables held before CDC was enabled (no change row tells of them), and a
/// few transactions after.
fn populated(seed: u64) -> (CdcSimulator, i32, Copy) {
    let sim = database();
    rows_before_cdc(&sim);
    let before = ["dbo.items", "dbo.pairs"]
        .into_iter()
        .map(|t| (t.to_owned(), contents(&sim, t)))
        .collect();
    let mut rng = Rng(seed);
    let mut next_id = 1_000;
    for _ in 0..20 {
        random_write(&sim, &mut rng, &mut next_id);
    }
    (sim, next_id, before)
}

#[tokio::test]
async fn a_re_snapshot_under_concurrent_writes_and_a_lagging_capture_job_gives_the_current_tables()
{
    randomized_resnapshots(1).await;
}

/// The same over two connections: a chunk of each table read at once, between the
/// same marks, held and sent together.
#[tokio::test]
async fn re_snapshots_of_two_tables_read_at_once_give_the_current_tables() {
    randomized_resnapshots(2).await;
}

async fn randomized_resnapshots(connections: usize) {
    let mut superseded_somewhere = false;
    for held in mssql_ces_testkit::test_seeds(&[5, 41, 2027, 31337, 8_675_309]) {
        let seed = held.0;
        let (sim, next_id, before) = populated(seed);
        let source = WritesAroundReads {
            sim: sim.clone(),
            rng: Rng(seed ^ 0x5EED),
            next_id: next_id + 100_000,
            reads: 0,
            random: true,
            after_read: Default::default(),
        };
        let mut poller = Poller::new(
            source,
            PollerConfig {
                load_connections: connections,
                ..config(7)
            },
            None,
        );
        if connections > 1 {
            // Each reader writes around its reads as the stream's own source does.
            let (sim, readers) = (sim.clone(), std::sync::atomic::AtomicU64::new(1));
            poller.read_loads_with(std::sync::Arc::new(move || {
                let n = readers.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Box::new(WritesAroundReads {
                    sim: sim.clone(),
                    rng: Rng(seed ^ (n << 20)),
                    next_id: next_id + 200_000 * (n as i32 + 1),
                    reads: 0,
                    random: true,
                    after_read: Default::default(),
                }) as Box<dyn mssql_ces::source::poller::ChunkReader>
            }));
        }
        let handle = poller.snapshot_handle();
        // The changes so far, as a consumer that joined at the start of CDC has them:
        // the rows from before it are missing.
        let mut events = drain(&mut poller, |_| {}).await;
        let mut copy = Copy::new();
        for change in &events {
            apply(&mut copy, change);
        }
        assert_ne!(
            copy.get("dbo.items").cloned().unwrap_or_default(),
            contents(&sim, "dbo.items"),
            "seed {seed}: before the re-snapshot the copy lacks the rows CDC never saw"
        );
        // From here the capture job lags: commits wait for its scans, which come
        // between polls and harvest a few records at a time.
        sim.set_capture_job_manual(true);
        let items = ask(&mut poller, &handle, "dbo.items", &mut events).await;
        let pairs = ask(&mut poller, &handle, "DBO.PAIRS", &mut events).await;
        let (items, pairs) = (items.unwrap(), pairs.unwrap());
        assert!(items.new && pairs.new, "seed {seed}");
        assert_eq!(
            pairs.table, "dbo.pairs",
            "seed {seed}: named as the catalog does"
        );
        let again = ask(&mut poller, &handle, "dbo.items", &mut events).await;
        assert!(!again.unwrap().new, "seed {seed}: asked twice, run once");
        let writer = sim.clone();
        let mut writes = Rng(seed ^ 0xABCD);
        let mut next = next_id;
        let mut superseded = BTreeMap::new();
        events.extend(
            drain_counting(
                &mut poller,
                |polls| {
                    if polls < 400 {
                        for _ in 0..writes.below(3) {
                            random_write(&writer, &mut writes, &mut next);
                        }
                        writer.run_capture_job_for(writes.below(4) as usize);
                    } else {
                        writer.run_capture_job();
                    }
                },
                &mut superseded,
            )
            .await,
        );
        sim.set_capture_job_manual(false);
        sim.run_capture_job();
        events.extend(drain(&mut poller, |_| {}).await);
        assert!(
            poller.position().resnapshots.is_empty(),
            "seed {seed}: both finished"
        );
        let chunks: u64 = poller.resnapshot_status().iter().map(|r| r.chunks).sum();
        assert!(chunks > 40, "seed {seed}: read in chunks ({chunks})");
        if connections == 1 {
            assert!(
                poller.source().reads > 40,
                "seed {seed}: on its own connection"
            );
        } else {
            // Both tables' chunks on the readers, at once; the longer table's last
            // ones alone, on the stream's own connection.
            assert!(
                (poller.source().reads as u64) < chunks,
                "seed {seed}: {} of {chunks} chunks on its own connection",
                poller.source().reads
            );
        }

        // The consumer's rule: per key, in order, over everything the stream sent.
        assert_replay_gives_the_tables(seed, &events, &sim);
        let history = drain(&mut Poller::new(sim.clone(), config(7), None), |_| {}).await;
        assert_no_state_goes_back(seed, &events, &history, &before);
        for (table, asked) in [("dbo.items", &items), ("dbo.pairs", &pairs)] {
            let rows: Vec<&Change> = events
                .iter()
                .filter(|c| incremental(c) && c.table.qualified_name() == table)
                .collect();
            assert!(!rows.is_empty(), "seed {seed}: {table} re-read");
            for (n, row) in rows.iter().enumerate() {
                assert_eq!(row.commit_lsn, asked.at, "seed {seed}: at the asked LSN");
                assert_eq!(row.begin_lsn, Lsn::ZERO, "seed {seed}: marked as loaded");
                assert_eq!(row.sequence_number, n as u64 + 1, "seed {seed}: {table}");
                assert!(
                    !row.last_in_transaction || n + 1 == rows.len(),
                    "seed {seed}: only the last row can be final"
                );
            }
            let keys: HashSet<Vec<String>> = rows
                .iter()
                .map(|c| key_of(c, c.current.as_ref().unwrap()))
                .collect();
            assert_eq!(keys.len(), rows.len(), "seed {seed}: a key re-read once");
        }
        superseded_somewhere |= superseded.values().any(|&n| n > 0);
        // Message ids and logicalids: all distinct, re-read rows' included.
        let encoder = encoder();
        let mut ids = HashSet::new();
        let mut logical = HashSet::new();
        for change in &events {
            for message in encoder.encode(change).unwrap().messages {
                assert!(
                    ids.insert(message.id),
                    "seed {seed}: id {} twice",
                    message.id
                );
            }
            let sequence = match change.origin {
                Origin::Load {
                    logical_sequence, ..
                } => logical_sequence,
                Origin::Cdc => change.sequence_number,
            };
            assert!(
                logical.insert((change.commit_lsn, sequence)),
                "seed {seed}: a logicalid twice"
            );
        }
    }
    assert!(
        superseded_somewhere,
        "some held row was superseded by a change in its window"
    );
}

#[tokio::test]
async fn a_re_snapshot_stopped_midway_resumes_after_its_last_key_from_the_checkpoint() {
    let (sim, _, _) = populated(99);
    let mut first = Poller::new(sim.clone(), config(10), None);
    let handle = first.snapshot_handle();
    let mut sent = drain(&mut first, |_| {}).await;
    ask(&mut first, &handle, "dbo.items", &mut sent)
        .await
        .unwrap();
    // A few chunks, then the process stops: what was delivered is what the last
    // batch's position covers.
    let mut checkpoint = None;
    for _ in 0..6 {
        if let PollOutcome::Batch(batch) = first.poll().await.unwrap() {
            sent.extend(batch.changes);
            checkpoint = Some(batch.position);
        }
    }
    let checkpoint = checkpoint.expect("batches");
    let midway = checkpoint
        .resnapshots
        .values()
        .next()
        .expect("under way")
        .clone();
    assert!(midway.load.rows > 0 && midway.chunks > 0);
    let mut writes = Rng(7);
    let mut next_id = 50_000;
    for _ in 0..10 {
        random_write(&sim, &mut writes, &mut next_id);
    }
    let mut second = Poller::new(sim.clone(), config(10), Some(checkpoint));
    let resumed = drain(&mut second, |_| {}).await;
    let rows: Vec<&Change> = resumed.iter().filter(|c| incremental(c)).collect();
    assert_eq!(
        rows.first().map(|c| c.sequence_number),
        Some(midway.load.rows + 1),
        "numbered on from the checkpoint"
    );
    assert!(
        rows.iter().all(|c| c.commit_lsn == midway.load.at),
        "the same re-snapshot"
    );
    let id = |key: Vec<String>| key[0].parse::<i64>().unwrap();
    let resumed_at = id(midway
        .load
        .after
        .clone()
        .unwrap()
        .into_iter()
        .flatten()
        .collect());
    assert!(
        rows.iter()
            .all(|c| id(key_of(c, c.current.as_ref().unwrap())) > resumed_at),
        "no row at or before the last key sent is read again"
    );
    assert!(rows.last().unwrap().last_in_transaction, "finished");
    assert!(second.position().resnapshots.is_empty());
    let mut copy = Copy::new();
    for change in sent.iter().chain(&resumed) {
        apply(&mut copy, change);
    }
    assert_eq!(copy["dbo.items"], contents(&sim, "dbo.items"));
}

#[tokio::test]
async fn a_re_snapshot_is_refused_by_name_for_what_it_cannot_read() {
    let (sim, _, _) = populated(3);
    sim.create_table(
        "dbo",
        "heap",
        vec![cdc_sim::SimColumn::new(
            "v",
            mssql_ces::event::value::SqlType::Int,
        )],
        &[],
    );
    sim.enable_table("dbo.heap", None).unwrap();
    let mut poller = Poller::new(sim.clone(), config(10), None);
    let handle = poller.snapshot_handle();
    let mut sent = drain(&mut poller, |_| {}).await;
    let unknown = ask(&mut poller, &handle, "dbo.nope", &mut sent)
        .await
        .unwrap_err();
    assert!(
        matches!(&unknown, SnapshotRefused::NotStreamed { streamed, .. } if streamed.contains("dbo.items")),
        "{unknown}"
    );
    let keyless = ask(&mut poller, &handle, "dbo.heap", &mut sent)
        .await
        .unwrap_err();
    assert_eq!(
        keyless,
        SnapshotRefused::NoKey {
            table: "dbo.heap".into()
        }
    );
    assert!(poller.position().resnapshots.is_empty());
    drop(poller);
    assert_eq!(
        handle.request("dbo.items").await.unwrap_err(),
        SnapshotRefused::Stopped,
        "no poller to answer"
    );
    let mut once = Poller::new(
        sim,
        PollerConfig {
            snapshot: SnapshotMode::InitialOnly,
            ..config(10)
        },
        None,
    );
    let handle = once.snapshot_handle();
    let refused = ask(&mut once, &handle, "dbo.items", &mut sent)
        .await
        .unwrap_err();
    assert_eq!(refused, SnapshotRefused::InitialOnly);
}

/// A change of another table of the same schema and key type supersedes nothing;
/// one of the table itself supersedes its held row. The status says how it went,
/// while it runs and once it finished.
#[tokio::test]
async fn only_the_tables_own_changes_supersede_and_the_status_counts_them() {
    let sim = database();
    // The same columns and key as dbo.items.
    sim.create_table("dbo", "other", item_columns(), &["id"]);
    let mut txn = sim.transaction();
    for id in 1..=30 {
        txn = txn
            .insert("dbo.items", item(id, &format!("item {id}"), id))
            .insert("dbo.other", item(id, &format!("other {id}"), id));
    }
    txn.commit().unwrap();
    for table in ["dbo.items", "dbo.other"] {
        sim.enable_table(table, None).unwrap();
    }
    let mut source = WritesAroundReads {
        sim: sim.clone(),
        rng: Rng(1),
        next_id: 0,
        reads: 0,
        random: false,
        after_read: Default::default(),
    };
    // Right after the first chunk (items 1 to 10) is read: a change of other's 5,
    // and of items' 7.
    source.after_read.push_back(Box::new(|sim: &CdcSimulator| {
        let txn = sim
            .transaction()
            .update(
                "dbo.other",
                vec![Value::Int(5)],
                vec![("qty", Value::Int(500))],
            )
            .update(
                "dbo.items",
                vec![Value::Int(7)],
                vec![("qty", Value::Int(700))],
            );
        txn.commit().unwrap();
    }));
    let mut poller = Poller::new(source, config(10), None);
    let handle = poller.snapshot_handle();
    let mut events = drain(&mut poller, |_| {}).await;
    // The poll that takes the request on returns a batch of its own that records
    // it, before any chunk is read: durable once delivered.
    let asked = tokio::spawn({
        let handle = handle.clone();
        async move { handle.request("dbo.items").await }
    });
    tokio::task::yield_now().await;
    let PollOutcome::Batch(recorded) = poller.poll().await.unwrap() else {
        panic!("the request's own batch");
    };
    assert!(recorded.changes.is_empty());
    assert_eq!(
        recorded.position.resnapshots["dbo_items"].load.rows, 0,
        "{:?}",
        recorded.position.resnapshots
    );
    assert!(asked.await.unwrap().unwrap().new);
    let mut running = None;
    loop {
        match poller.poll().await.unwrap() {
            PollOutcome::Batch(batch) => events.extend(batch.changes),
            PollOutcome::Idle => break,
        }
        if running.is_none() {
            running = poller.resnapshot_status().first().cloned();
        }
    }
    let running = running.expect("a status while it ran");
    assert!(
        running.running && running.table == "dbo.items",
        "{running:?}"
    );
    let sent: Vec<i32> = events
        .iter()
        .filter(|c| incremental(c))
        .filter_map(|c| match c.current.as_ref()?[0] {
            Value::Int(id) => Some(id),
            _ => None,
        })
        .collect();
    let expected: Vec<i32> = (1..=30).filter(|&id| id != 7).collect();
    assert_eq!(
        sent, expected,
        "items' 7 superseded by its change, other's 5 by nothing"
    );
    assert_eq!(
        poller.resnapshot_status(),
        [ResnapshotStatus {
            table: "dbo.items".into(),
            rows: 29,
            chunks: 3,
            superseded: 1,
            running: false,
        }],
        "how it ended"
    );
    assert_replay_gives_the_tables(0, &events, &sim);
}

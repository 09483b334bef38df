//! The initial load (`[snapshot]`) against the CDC simulator: the rows tables already
//! hold, then their changes, with writes running while the load reads.

use std::collections::{BTreeMap, HashMap, HashSet};

use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::event::{
    Change, Encoder, EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit, Operation, Origin,
    Value,
};
use mssql_ces::lsn::Lsn;
use mssql_ces::position::Position;
use mssql_ces::source::SourceError;
use mssql_ces::source::initial_load::SnapshotMode;
use mssql_ces::source::poller::{PollOutcome, Poller, PollerConfig};
use uuid::Uuid;

pub(crate) const GUID: Uuid = Uuid::from_u128(0x1bf2_756a_c15f_4d2e_a2d5_7d3f_9dbf_85b0);

fn config(mode: SnapshotMode, chunk: usize) -> PollerConfig {
    PollerConfig {
        page_size: 40,
        batch_size: 40,
        snapshot: mode,
        load_chunk: chunk,
        ..PollerConfig::default()
    }
}

/// The columns of `dbo.items`: `id` (its key), `name`, `qty`.
pub(crate) fn item_columns() -> Vec<SimColumn> {
    vec![
        SimColumn::new("id", SqlType::Int),
        SimColumn::new("name", SqlType::NVarChar(Length::Bounded(50))),
        SimColumn::new("qty", SqlType::Int),
    ]
}

/// `dbo.items` (int key) and `dbo.pairs` (two-column key, text second).
pub(crate) fn database() -> CdcSimulator {
    let sim = CdcSimulator::new("shop", GUID, 0);
    sim.create_table("dbo", "items", item_columns(), &["id"]);
    sim.create_table(
        "dbo",
        "pairs",
        vec![
            SimColumn::new("a", SqlType::Int),
            SimColumn::new("b", SqlType::NVarChar(Length::Bounded(10))),
            SimColumn::new("v", SqlType::BigInt),
        ],
        &["a", "b"],
    );
    sim
}

pub(crate) fn item(id: i32, name: &str, qty: i32) -> Vec<Value> {
    vec![Value::Int(id), Value::Text(name.into()), Value::Int(qty)]
}

pub(crate) fn pair(a: i32, b: &str, v: i64) -> Vec<Value> {
    vec![Value::Int(a), Value::Text(b.into()), Value::BigInt(v)]
}

/// Applying `events` per key, in order, as a consumer does, gives both tables as
/// the simulator holds them now.
pub(crate) fn assert_replay_gives_the_tables(seed: u64, events: &[Change], sim: &CdcSimulator) {
    let mut copy = Copy::new();
    for change in events {
        apply(&mut copy, change);
    }
    for table in ["dbo.items", "dbo.pairs"] {
        assert_eq!(
            copy.get(table).cloned().unwrap_or_default(),
            contents(sim, table),
            "seed {seed}: {table} as a consumer applies the events"
        );
    }
}

/// Rows the tables hold before CDC is enabled on them (no change row tells of
/// them): 230 items, 60 pairs.
pub(crate) fn rows_before_cdc(sim: &CdcSimulator) {
    let mut txn = sim.transaction();
    for id in 1..=230 {
        txn = txn.insert("dbo.items", item(id, &format!("item {id}"), id * 2));
    }
    for a in 0..60 {
        txn = txn.insert("dbo.pairs", pair(a % 7, &format!("b{a}"), i64::from(a)));
    }
    txn.commit().unwrap();
    sim.enable_table("dbo.items", None).unwrap();
    sim.enable_table("dbo.pairs", None).unwrap();
}

/// xorshift: the seed is printed when an assertion fails.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A table's rows as a consumer keeps them: key text → column name → value text.
pub(crate) type Copy = BTreeMap<String, BTreeMap<Vec<String>, BTreeMap<String, Option<String>>>>;

pub(crate) fn key_of(change: &Change, row: &[Value]) -> Vec<String> {
    change
        .table
        .key()
        .iter()
        .map(|&at| row[at].to_text().unwrap_or_default())
        .collect()
}

pub(crate) fn as_map(change: &Change, row: &[Value]) -> BTreeMap<String, Option<String>> {
    change
        .table
        .columns()
        .iter()
        .zip(row)
        .map(|(c, v)| (c.name.clone(), v.to_text()))
        .collect()
}

/// Applies events per key in order: upsert on INS/UPD (an UPD that changed the key
/// removes the old one), delete on DEL.
pub(crate) fn apply(copy: &mut Copy, change: &Change) {
    let table = copy.entry(change.table.qualified_name()).or_default();
    if let Some(old) = &change.old {
        table.remove(&key_of(change, old));
    }
    if let Some(current) = &change.current {
        table.insert(key_of(change, current), as_map(change, current));
    }
}

pub(crate) fn contents(
    sim: &CdcSimulator,
    table: &str,
) -> BTreeMap<Vec<String>, BTreeMap<String, Option<String>>> {
    let key: &[&str] = if table == "dbo.items" {
        &["id"]
    } else {
        &["a", "b"]
    };
    sim.table_contents(table)
        .into_iter()
        .map(|row| {
            let map: BTreeMap<String, Option<String>> =
                row.into_iter().map(|(n, v)| (n, v.to_text())).collect();
            let k = key
                .iter()
                .map(|k| map[*k].clone().unwrap_or_default())
                .collect();
            (k, map)
        })
        .collect()
}

/// One random transaction: inserts, updates, deletes and key changes on both tables.
pub(crate) fn random_write(sim: &CdcSimulator, rng: &mut Rng, next_id: &mut i32) {
    let items: Vec<i32> = sim
        .table_contents("dbo.items")
        .iter()
        .filter_map(|row| match row[0].1 {
            Value::Int(id) => Some(id),
            _ => None,
        })
        .collect();
    let pairs: Vec<(i32, String)> = sim
        .table_contents("dbo.pairs")
        .iter()
        .filter_map(|row| match (&row[0].1, &row[1].1) {
            (Value::Int(a), Value::Text(b)) => Some((*a, b.clone())),
            _ => None,
        })
        .collect();
    let mut txn = sim.transaction();
    for _ in 0..1 + rng.below(3) {
        let pick = |rng: &mut Rng, n: usize| rng.below(n as u64) as usize;
        txn = match rng.below(9) {
            0 | 1 => {
                *next_id += 1;
                txn.insert("dbo.items", item(*next_id, &format!("new {next_id}"), 1))
            }
            2 | 3 if !items.is_empty() => {
                let id = items[pick(rng, items.len())];
                txn.update(
                    "dbo.items",
                    vec![Value::Int(id)],
                    vec![("qty", Value::Int(rng.below(1000) as i32))],
                )
            }
            4 if !items.is_empty() => {
                let id = items[pick(rng, items.len())];
                txn.delete("dbo.items", vec![Value::Int(id)])
            }
            5 if !items.is_empty() => {
                // A key change: the row moves to a new id (maybe below the cursor).
                let id = items[pick(rng, items.len())];
                *next_id += 1;
                let to = if rng.below(2) == 0 {
                    -*next_id
                } else {
                    *next_id
                };
                txn.update(
                    "dbo.items",
                    vec![Value::Int(id)],
                    vec![("id", Value::Int(to))],
                )
            }
            6 if !pairs.is_empty() => {
                let (a, b) = &pairs[pick(rng, pairs.len())];
                txn.update(
                    "dbo.pairs",
                    vec![Value::Int(*a), Value::Text(b.clone())],
                    vec![("v", Value::BigInt(rng.below(99) as i64))],
                )
            }
            7 if !pairs.is_empty() => {
                let (a, b) = &pairs[pick(rng, pairs.len())];
                *next_id += 1;
                txn.update(
                    "dbo.pairs",
                    vec![Value::Int(*a), Value::Text(b.clone())],
                    vec![("b", Value::Text(format!("k{next_id}")))],
                )
            }
            8 if !pairs.is_empty() => {
                let (a, b) = &pairs[pick(rng, pairs.len())];
                txn.delete("dbo.pairs", vec![Value::Int(*a), Value::Text(b.clone())])
            }
            _ => {
                *next_id += 1;
                txn.insert("dbo.pairs", pair(*next_id % 7, &format!("p{next_id}"), 0))
            }
        };
    }
    // A statement may address a row an earlier one in the same transaction removed:
    // such a transaction is refused by the simulator and simply not made.
    let _ = txn.commit();
}

/// Events until the poller is idle, with `between` run after every batch.
pub(crate) async fn drain<S: mssql_ces::source::ChangeSource>(
    poller: &mut Poller<S>,
    mut between: impl FnMut(usize),
) -> Vec<Change> {
    let mut out = Vec::new();
    let mut polls = 0;
    loop {
        match poller.poll().await {
            Ok(PollOutcome::Batch(batch)) => out.extend(batch.changes),
            Ok(PollOutcome::Idle) => return out,
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("poll failed: {e}"),
        }
        polls += 1;
        between(polls);
        assert!(polls < 100_000, "the poller never went idle");
    }
}

pub(crate) fn encoder() -> Encoder {
    Encoder::new(EncoderOptions {
        stream_guid: GUID,
        encoding: Encoding::Json,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size: MessageSizeLimit::default(),
    })
}

pub(crate) fn is_loaded(change: &Change) -> bool {
    matches!(change.origin, Origin::Load { .. })
}

#[tokio::test]
async fn a_load_under_concurrent_writes_plus_the_changes_after_it_give_the_current_tables() {
    for held in mssql_ces_testkit::test_seeds(&[3, 17, 2026, 90210, 7_777_777]) {
        let seed = held.0;
        let sim = database();
        let mut rng = Rng(seed);
        rows_before_cdc(&sim);
        let mut next_id = 1_000;
        for _ in 0..20 {
            random_write(&sim, &mut rng, &mut next_id);
        }
        // L0: what max_lsn says when the load is planned (nothing commits before the
        // first poll plans it).
        let planned_at = sim.current_max_lsn().unwrap();
        let mut poller = Poller::new(sim.clone(), config(SnapshotMode::Initial, 9), None);
        let writer = sim.clone();
        let mut writes = Rng(seed ^ 0xABCD);
        let events = drain(&mut poller, |polls| {
            // Writes between the load's chunks, and on for a while after it.
            if polls < 120 {
                for _ in 0..writes.below(3) {
                    random_write(&writer, &mut writes, &mut next_id);
                }
            }
        })
        .await;
        let loaded: Vec<&Change> = events.iter().filter(|c| is_loaded(c)).collect();
        assert!(
            loaded.len() >= 200,
            "seed {seed}: {} rows loaded",
            loaded.len()
        );
        assert!(
            events.iter().any(|c| !is_loaded(c)),
            "seed {seed}: changes followed the load"
        );
        // The consumer's rule: per key, in order.
        assert_replay_gives_the_tables(seed, &events, &sim);
        // Each table's loaded rows come before any of its changes, all at L0, with
        // beginlsn zero, numbered 1.. per table, the last one final; no change at or
        // below L0 is sent (the load holds it).
        let l0 = loaded[0].commit_lsn;
        assert_eq!(l0, planned_at, "seed {seed}: L0 is max_lsn at the plan");
        for table in ["dbo.items", "dbo.pairs"] {
            let of_table: Vec<&Change> = events
                .iter()
                .filter(|c| c.table.qualified_name() == table)
                .collect();
            let first_change = of_table.iter().position(|c| !is_loaded(c));
            let last_load = of_table.iter().rposition(|c| is_loaded(c)).unwrap();
            assert!(
                first_change.is_none_or(|f| f > last_load),
                "seed {seed}: {table}: a change came before the end of the load"
            );
            let rows: Vec<&&Change> = of_table.iter().filter(|c| is_loaded(c)).collect();
            for (n, row) in rows.iter().enumerate() {
                assert_eq!(row.operation, Operation::Insert);
                assert_eq!(row.commit_lsn, l0);
                assert_eq!(row.begin_lsn, Lsn::ZERO);
                assert_eq!(row.sequence_number, n as u64 + 1, "seed {seed}: {table}");
                assert_eq!(row.last_in_transaction, n + 1 == rows.len(), "seed {seed}");
            }
            for change in of_table.iter().filter(|c| !is_loaded(c)) {
                assert!(
                    change.commit_lsn > l0,
                    "seed {seed}: a change at or below L0"
                );
            }
        }
        // Message ids: all distinct, loaded rows' included.
        let encoder = encoder();
        let mut ids = HashSet::new();
        for change in &events {
            for message in encoder.encode(change).unwrap().messages {
                assert!(
                    ids.insert(message.id),
                    "seed {seed}: id {} twice",
                    message.id
                );
            }
        }
    }
}

#[tokio::test]
async fn a_load_resumed_from_a_checkpoint_re_sends_identical_rows_and_loses_none() {
    let sim = database();
    let mut txn = sim.transaction();
    for id in 1..=100 {
        txn = txn.insert("dbo.items", item(id, &format!("item {id}"), id));
    }
    txn.commit().unwrap();
    sim.enable_table("dbo.items", None).unwrap();
    sim.enable_table("dbo.pairs", None).unwrap();
    // The uninterrupted run.
    let mut whole = Poller::new(sim.clone(), config(SnapshotMode::Initial, 8), None);
    let mut batches = Vec::new();
    while let PollOutcome::Batch(batch) = whole.poll().await.unwrap() {
        batches.push(batch);
    }
    let all: Vec<Change> = batches.iter().flat_map(|b| b.changes.clone()).collect();
    assert_eq!(all.len(), 100);
    let encoder = encoder();
    let bytes = |changes: &[Change]| -> Vec<(Uuid, Vec<u8>)> {
        changes
            .iter()
            .flat_map(|c| encoder.encode(c).unwrap().messages)
            .map(|m| (m.id, m.bytes))
            .collect()
    };
    // Crashes after each checkpoint of the load: the next process starts from it.
    for at in 1..batches.len() - 1 {
        let checkpoint: Position = batches[at].position.clone();
        assert!(!checkpoint.loads.is_empty() || at + 2 >= batches.len());
        let sent_before: usize = batches[..=at].iter().map(|b| b.changes.len()).sum();
        let mut resumed = Poller::new(
            sim.clone(),
            config(SnapshotMode::Initial, 8),
            Some(checkpoint),
        );
        let rest = drain(&mut resumed, |_| {}).await;
        assert_eq!(
            bytes(&rest),
            bytes(&all[sent_before..]),
            "resumed after batch {at}: the same rows, ids and bytes"
        );
    }
}

/// A computed column is NULL in every change row (CDC does not record its value),
/// so it is left out of the changes and of the load alike: a consumer's copy never
/// holds a value that the first change would take back.
#[tokio::test]
async fn a_computed_column_is_left_out_of_the_load_and_the_changes() {
    let sim = CdcSimulator::new("shop", GUID, 0);
    sim.create_table(
        "dbo",
        "lines",
        vec![
            SimColumn::new("id", SqlType::Int),
            SimColumn::new("qty", SqlType::Int),
            SimColumn::computed("total", SqlType::Int),
        ],
        &["id"],
    );
    let line = |id, qty| vec![Value::Int(id), Value::Int(qty), Value::Int(qty * 10)];
    sim.transaction()
        .insert("dbo.lines", line(1, 2))
        .commit()
        .unwrap();
    sim.enable_table("dbo.lines", None).unwrap();
    let mut poller = Poller::new(sim.clone(), config(SnapshotMode::Initial, 1000), None);
    let loaded = drain(&mut poller, |_| {}).await;
    sim.transaction()
        .update(
            "dbo.lines",
            vec![Value::Int(1)],
            vec![("qty", Value::Int(3))],
        )
        .commit()
        .unwrap();
    sim.run_capture_job();
    let changed = drain(&mut poller, |_| {}).await;
    assert_eq!((loaded.len(), changed.len()), (1, 1));
    for change in loaded.iter().chain(&changed) {
        let names: Vec<&str> = change
            .table
            .columns()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["id", "qty"], "the computed column is left out");
        assert_eq!(change.current.as_ref().unwrap().len(), 2);
    }
    assert_eq!(
        changed[0].current.as_ref().unwrap()[1],
        Value::Int(3),
        "the change still carries what it changed"
    );
}

#[tokio::test]
async fn initial_only_loads_and_then_stays_idle_whatever_changes() {
    let sim = database();
    sim.transaction()
        .insert("dbo.items", item(1, "a", 1))
        .insert("dbo.items", item(2, "b", 2))
        .commit()
        .unwrap();
    sim.enable_table("dbo.items", None).unwrap();
    sim.enable_table("dbo.pairs", None).unwrap();
    let mut poller = Poller::new(sim.clone(), config(SnapshotMode::InitialOnly, 1000), None);
    let events = drain(&mut poller, |_| {}).await;
    assert_eq!(events.len(), 2);
    assert!(events.iter().all(is_loaded));
    sim.transaction()
        .insert("dbo.items", item(3, "c", 3))
        .commit()
        .unwrap();
    assert_eq!(poller.poll().await.unwrap(), PollOutcome::Idle);
    // The position records L0, so a later run in mode "initial" streams from there.
    let position = poller.position().clone();
    assert!(position.loads.is_empty());
    let mut later = Poller::new(
        sim.clone(),
        config(SnapshotMode::Initial, 1000),
        Some(position),
    );
    let changes = drain(&mut later, |_| {}).await;
    assert_eq!(changes.len(), 1);
    assert!(!is_loaded(&changes[0]));
    assert_eq!(changes[0].current.as_ref().unwrap()[0], Value::Int(3));
}

#[tokio::test]
async fn never_loads_nothing_and_a_checkpoint_prevents_a_second_load() {
    let sim = database();
    sim.transaction()
        .insert("dbo.items", item(1, "a", 1))
        .commit()
        .unwrap();
    sim.enable_table("dbo.items", None).unwrap();
    sim.transaction()
        .insert("dbo.items", item(2, "b", 2))
        .commit()
        .unwrap();
    let mut never = Poller::new(sim.clone(), config(SnapshotMode::Never, 1000), None);
    let events = drain(&mut never, |_| {}).await;
    assert_eq!(events.len(), 1, "only the change");
    assert!(!is_loaded(&events[0]));
    let mut initial = Poller::new(
        sim.clone(),
        config(SnapshotMode::Initial, 1000),
        Some(never.position().clone()),
    );
    assert!(!initial.needs_plan());
    assert!(drain(&mut initial, |_| {}).await.is_empty());
}

#[tokio::test]
async fn the_plan_waits_for_a_start_lsn_and_a_table_enabled_after_l0_is_read_from_its_start() {
    let sim = database();
    sim.transaction()
        .insert("dbo.items", item(1, "a", 1))
        .commit()
        .unwrap();
    sim.enable_table("dbo.items", None).unwrap();
    sim.set_capture_job_manual(true);
    sim.transaction()
        .insert("dbo.pairs", pair(1, "x", 1))
        .commit()
        .unwrap();
    sim.enable_table("dbo.pairs", None).unwrap();
    let mut poller = Poller::new(sim.clone(), config(SnapshotMode::Initial, 1000), None);
    let waiting = poller.poll().await.unwrap_err();
    assert!(waiting.is_transient(), "{waiting}");
    assert!(waiting.to_string().contains("start_lsn"), "{waiting}");
    assert!(poller.needs_plan());
    // The scan sets dbo_pairs' start_lsn above max_lsn (nothing committed since).
    sim.run_capture_job();
    sim.set_capture_job_manual(false);
    let events = drain(&mut poller, |_| {}).await;
    assert_eq!(events.len(), 2, "both tables' rows: {events:?}");
    assert!(events.iter().all(is_loaded));
    sim.transaction()
        .insert("dbo.pairs", pair(2, "y", 2))
        .commit()
        .unwrap();
    let after = drain(&mut poller, |_| {}).await;
    assert_eq!(
        after.len(),
        1,
        "no gap for the instance that began after L0"
    );
}

#[tokio::test]
async fn when_needed_re_loads_a_table_whose_changes_were_purged() {
    let sim = database();
    sim.enable_table("dbo.items", None).unwrap();
    sim.enable_table("dbo.pairs", None).unwrap();
    for id in 1..=5 {
        sim.transaction()
            .insert("dbo.items", item(id, "x", id))
            .commit()
            .unwrap();
    }
    let mut poller = Poller::new(sim.clone(), config(SnapshotMode::WhenNeeded, 2), None);
    let first = drain(&mut poller, |_| {}).await;
    assert_eq!(first.iter().filter(|c| is_loaded(c)).count(), 5);
    let mut copy = Copy::new();
    first.iter().for_each(|c| apply(&mut copy, c));
    // The process is away; changes happen and the cleanup job purges them.
    let position = poller.position().clone();
    sim.transaction()
        .delete("dbo.items", vec![Value::Int(1)])
        .commit()
        .unwrap();
    sim.transaction()
        .update(
            "dbo.items",
            vec![Value::Int(2)],
            vec![("name", Value::Text("y".into()))],
        )
        .commit()
        .unwrap();
    let purged_to = sim
        .transaction()
        .insert("dbo.items", item(6, "z", 6))
        .commit()
        .unwrap();
    sim.cleanup(purged_to);
    // With on_gap = "fail" and no load mode that is an error.
    let mut failing = Poller::new(
        sim.clone(),
        config(SnapshotMode::Initial, 2),
        Some(position.clone()),
    );
    let error = drain_error(&mut failing).await;
    assert!(matches!(error, SourceError::Gap { .. }), "{error}");
    let mut reloading = Poller::new(
        sim.clone(),
        config(SnapshotMode::WhenNeeded, 2),
        Some(position),
    );
    sim.transaction()
        .insert("dbo.items", item(7, "w", 7))
        .commit()
        .unwrap();
    let second = drain(&mut reloading, |_| {}).await;
    let reloaded: Vec<&Change> = second.iter().filter(|c| is_loaded(c)).collect();
    assert_eq!(
        reloaded.len(),
        6,
        "rows 2 to 7: 7 was committed before the re-load's LSN"
    );
    assert!(reloaded[0].commit_lsn > first.iter().map(|c| c.commit_lsn).max().unwrap());
    // New ids for the re-load: a consumer that drops duplicates by id keeps them.
    let encoder = encoder();
    let ids: HashSet<Uuid> = first
        .iter()
        .map(|c| encoder.encode(c).unwrap().messages[0].id)
        .collect();
    assert!(
        reloaded
            .iter()
            .all(|c| !ids.contains(&encoder.encode(c).unwrap().messages[0].id))
    );
    second.iter().for_each(|c| apply(&mut copy, c));
    let mut expected = contents(&sim, "dbo.items");
    // The documented limit: the purged delete of row 1 is not in the re-load.
    let stale = copy["dbo.items"].get(&vec!["1".to_owned()]).cloned();
    assert!(
        stale.is_some(),
        "row 1's delete was purged: the copy still has it"
    );
    expected.insert(vec!["1".to_owned()], stale.unwrap());
    assert_eq!(copy["dbo.items"], expected);
}

async fn drain_error(poller: &mut Poller<CdcSimulator>) -> SourceError {
    for _ in 0..100 {
        match poller.poll().await {
            Err(e) if !e.is_transient() => return e,
            _ => {}
        }
    }
    panic!("no error");
}

#[tokio::test]
async fn a_table_without_a_key_is_read_in_one_pass_and_restarts_after_a_fault() {
    let sim = CdcSimulator::new("shop", GUID, 0);
    sim.create_table(
        "dbo",
        "log",
        vec![SimColumn::new(
            "msg",
            SqlType::NVarChar(Length::Bounded(20)),
        )],
        &[],
    );
    let mut txn = sim.transaction();
    for n in 0..12 {
        // Equal rows too: a heap may hold duplicates.
        txn = txn.insert("dbo.log", vec![Value::Text(format!("m{}", n % 5))]);
    }
    txn.commit().unwrap();
    sim.enable_table("dbo.log", None).unwrap();
    // A chunk size that divides the table: the last row is still marked final.
    let mut poller = Poller::new(sim.clone(), config(SnapshotMode::Initial, 4), None);
    let mut events = Vec::new();
    let mut polls = 0;
    loop {
        polls += 1;
        if polls == 4 {
            // A fault mid-pass: the pass starts over from the first row.
            sim.inject_fault(SourceError::transient("connection reset"));
        }
        match poller.poll().await {
            Ok(PollOutcome::Batch(batch)) => events.extend(batch.changes),
            Ok(PollOutcome::Idle) => break,
            Err(e) => assert!(e.is_transient(), "{e}"),
        }
    }
    let pass: Vec<&Change> = events
        .iter()
        .rev()
        .take(12)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let messages: Vec<String> = pass
        .iter()
        .map(|c| c.current.as_ref().unwrap()[0].to_text().unwrap())
        .collect();
    let mut expected: Vec<String> = (0..12).map(|n| format!("m{}", n % 5)).collect();
    expected.sort();
    assert_eq!(
        messages, expected,
        "the whole pass, ordered by every column"
    );
    let numbers: Vec<u64> = pass.iter().map(|c| c.sequence_number).collect();
    assert_eq!(numbers, (1..=12).collect::<Vec<u64>>());
    assert!(pass[11].last_in_transaction);
    assert!(pass[..11].iter().all(|c| !c.last_in_transaction));
    assert!(
        events.len() > 12,
        "the rows before the fault were sent again"
    );
    let mut by_sequence: HashMap<u64, Uuid> = HashMap::new();
    let encoder = encoder();
    for change in &events {
        let id = encoder.encode(change).unwrap().messages[0].id;
        let first = by_sequence.entry(change.sequence_number).or_insert(id);
        assert_eq!(*first, id, "a re-sent row keeps its id");
    }
}

#[tokio::test]
async fn when_needed_re_loads_also_when_the_purge_races_a_read() {
    use cdc_sim::SimAction;
    let sim = database();
    sim.enable_table("dbo.items", None).unwrap();
    sim.enable_table("dbo.pairs", None).unwrap();
    let mut poller = Poller::new(sim.clone(), config(SnapshotMode::WhenNeeded, 100), None);
    assert!(drain(&mut poller, |_| {}).await.is_empty(), "empty tables");
    let mut last = Lsn::ZERO;
    for id in 1..=30 {
        last = sim
            .transaction()
            .insert("dbo.items", item(id, "x", id))
            .commit()
            .unwrap();
    }
    // The cleanup job starts between the poller's probe and its first page.
    sim.on_next_read(SimAction::BeginCleanup {
        low_water: last,
        rows: 1_000,
    });
    // on_gap stays "fail": when_needed decides first.
    let events = drain(&mut poller, |_| {}).await;
    let reloaded: Vec<&Change> = events.iter().filter(|c| is_loaded(c)).collect();
    assert_eq!(
        reloaded.len(),
        30,
        "the table again, all its rows: {events:?}"
    );
    let mut copy = Copy::new();
    events.iter().for_each(|c| apply(&mut copy, c));
    assert_eq!(copy["dbo.items"], contents(&sim, "dbo.items"));
}

#[tokio::test]
async fn a_load_whose_capture_instance_is_replaced_continues_through_the_new_one() {
    let sim = database();
    let mut txn = sim.transaction();
    for id in 1..=50 {
        txn = txn.insert("dbo.items", item(id, "x", id));
    }
    txn.commit().unwrap();
    sim.enable_table("dbo.items", Some("items_v1")).unwrap();
    // Another table, loaded first (its capture instance sorts first): it must not be
    // mistaken for the replaced instance's successor.
    sim.transaction()
        .insert("dbo.pairs", pair(1, "a", 1))
        .insert("dbo.pairs", pair(2, "b", 2))
        .commit()
        .unwrap();
    sim.enable_table("dbo.pairs", None).unwrap();
    let config = PollerConfig {
        // The catalog read before every chunk: the change is seen mid-load.
        catalog_refresh: std::time::Duration::ZERO,
        ..config(SnapshotMode::Initial, 10)
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    let mut events = Vec::new();
    for _ in 0..3 {
        if let PollOutcome::Batch(batch) = poller.poll().await.unwrap() {
            events.extend(batch.changes);
        }
    }
    let items_sent = events.iter().filter(|c| c.table.table() == "items").count();
    assert!(items_sent > 0 && items_sent < 50, "mid-load: {items_sent}");
    // The documented schema change: a second capture instance, then the first goes.
    sim.enable_table("dbo.items", Some("items_v2")).unwrap();
    sim.transaction()
        .update(
            "dbo.items",
            vec![Value::Int(45)],
            vec![("qty", Value::Int(-1))],
        )
        .commit()
        .unwrap();
    sim.disable_instance("items_v1");
    events.extend(drain(&mut poller, |_| {}).await);
    let mut copy = Copy::new();
    events.iter().for_each(|c| apply(&mut copy, c));
    assert_eq!(
        copy["dbo.items"],
        contents(&sim, "dbo.items"),
        "no row lost"
    );
    assert_eq!(copy["dbo.pairs"], contents(&sim, "dbo.pairs"));
    let loads: HashSet<Lsn> = events
        .iter()
        .filter(|c| is_loaded(c) && c.table.table() == "items")
        .map(|c| c.commit_lsn)
        .collect();
    assert_eq!(
        loads.len(),
        2,
        "the first load, and the load through items_v2"
    );
}

/// The simulator, except that its seek after a key lands back at the table's start,
/// as a server's does when a key's text does not survive the round trip.
struct SeekBack(CdcSimulator);

impl mssql_ces::source::CdcReads for SeekBack {
    async fn catalog(&mut self) -> Result<mssql_ces::source::Catalog, SourceError> {
        self.0.catalog().await
    }

    async fn max_lsn(&mut self) -> Result<mssql_ces::source::MaxLsn, SourceError> {
        self.0.max_lsn().await
    }

    async fn min_lsn(&mut self, ci: &str) -> Result<Option<Lsn>, SourceError> {
        self.0.min_lsn(ci).await
    }

    async fn probe(
        &mut self,
        probes: &[mssql_ces::source::Probe],
        to: Lsn,
    ) -> Result<Vec<mssql_ces::source::ProbeResult>, SourceError> {
        self.0.probe(probes, to).await
    }

    async fn read_changes(
        &mut self,
        instance: &mssql_ces::source::CaptureInstance,
        after: mssql_ces::source::RowKey,
        to: Lsn,
        limit: usize,
    ) -> Result<Vec<mssql_ces::source::ChangeRow>, SourceError> {
        self.0.read_changes(instance, after, to, limit).await
    }

    async fn ddl_history(
        &mut self,
        ci: &str,
    ) -> Result<Vec<mssql_ces::source::DdlEvent>, SourceError> {
        self.0.ddl_history(ci).await
    }

    async fn lsn_time(
        &mut self,
        lsn: Lsn,
    ) -> Result<Option<mssql_ces::source::CommitTime>, SourceError> {
        self.0.lsn_time(lsn).await
    }
}

impl mssql_ces::source::TableReads for SeekBack {
    async fn table_rows(
        &mut self,
        instance: &mssql_ces::source::CaptureInstance,
    ) -> Result<Option<u64>, SourceError> {
        self.0.table_rows(instance).await
    }

    async fn read_table(
        &mut self,
        instance: &mssql_ces::source::CaptureInstance,
        _cursor: mssql_ces::source::TableCursor<'_>,
        limit: usize,
    ) -> Result<Vec<Vec<Value>>, SourceError> {
        self.0
            .read_table(instance, mssql_ces::source::TableCursor::Start, limit)
            .await
    }
}

impl mssql_ces::source::FactReads for SeekBack {
    async fn server_facts(&mut self) -> Result<mssql_ces::source::ServerFacts, SourceError> {
        self.0.server_facts().await
    }
}

impl mssql_ces::source::CaptureDdl for SeekBack {}

impl mssql_ces::source::SourceClock for SeekBack {}

#[tokio::test]
async fn a_seek_that_does_not_move_on_stops_the_load_instead_of_looping() {
    let sim = database();
    let mut txn = sim.transaction();
    for id in 1..=20 {
        txn = txn.insert("dbo.items", item(id, "x", id));
    }
    txn.commit().unwrap();
    sim.enable_table("dbo.items", None).unwrap();
    let mut poller = Poller::new(SeekBack(sim), config(SnapshotMode::Initial, 5), None);
    let mut sent = 0;
    let error = loop {
        match poller.poll().await {
            Ok(PollOutcome::Batch(batch)) => sent += batch.changes.len(),
            Ok(PollOutcome::Idle) => panic!("the load ended after {sent} rows"),
            Err(e) => break e,
        }
        assert!(sent < 100, "the load loops");
    };
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("does not move past the key (5)"),
        "{error}"
    );
}

#[tokio::test]
async fn loaded_rows_read_back_as_ces_events_in_both_encodings_large_values_segmented() {
    use mssql_ces::event::readback::{Reassembler, decode_avro_message, decode_json_message};
    let sim = CdcSimulator::new("shop", GUID, 0);
    sim.create_table(
        "dbo",
        "docs",
        vec![
            SimColumn::new("id", SqlType::Int),
            SimColumn::new("body", SqlType::NVarChar(Length::Max)),
        ],
        &["id"],
    );
    sim.transaction()
        .insert("dbo.docs", vec![Value::Int(1), Value::Text("short".into())])
        // 1.5 MiB of text: truncated to 1 MiB, then segmented.
        .insert(
            "dbo.docs",
            vec![Value::Int(2), Value::Text("é".repeat(786_432))],
        )
        .commit()
        .unwrap();
    sim.enable_table("dbo.docs", None).unwrap();
    let mut poller = Poller::new(sim, config(SnapshotMode::Initial, 10), None);
    let events = drain(&mut poller, |_| {}).await;
    assert_eq!(events.len(), 2);
    for encoding in [Encoding::Json, Encoding::Avro] {
        let encoder = Encoder::new(EncoderOptions {
            stream_guid: GUID,
            encoding,
            final_event: FinalEventMode::LastInTransaction,
            max_message_size: MessageSizeLimit::from_kb(128).unwrap(),
        });
        let mut reassembler = Reassembler::new();
        let mut whole = Vec::new();
        let mut truncated = 0;
        for change in &events {
            let encoded = encoder.encode(change).unwrap();
            truncated += encoded.truncated_values;
            for message in encoded.messages {
                assert!(message.bytes.len() <= 128 * 1024);
                let event = match encoding {
                    Encoding::Json => decode_json_message(&message.bytes),
                    Encoding::Avro => decode_avro_message(&message.bytes),
                }
                .unwrap_or_else(|e| panic!("{encoding:?}: not a CES message: {e}"));
                assert_eq!(event.specversion, "1.0");
                assert_eq!(event.event_type, "com.microsoft.SQL.CES.DML.V1");
                assert_eq!(event.operation, "INS");
                if let Some(done) = reassembler.push(event).unwrap() {
                    whole.push(done);
                }
            }
        }
        assert_eq!(truncated, 1, "{encoding:?}: the large value cut to 1 MiB");
        assert_eq!(whole.len(), 2, "{encoding:?}");
        assert!(whole[1].segment_ids.len() > 1, "{encoding:?}: segmented");
        for (n, event) in whole.iter().enumerate() {
            let data = event.data_json(encoding).unwrap();
            let transaction = &data["eventsource"]["transaction"];
            assert_eq!(transaction["beginlsn"], "00000000:00000000:0000");
            assert_eq!(transaction["sequencenumber"], n as u64 + 1);
            assert_eq!(transaction["finalevent"], n == 1);
            assert_eq!(
                data["eventsource"]["pkkey"][0]["value"],
                (n + 1).to_string()
            );
            assert_eq!(data["eventrow"]["old"], "{}");
        }
    }
}

/// Loaded rows of different tables share the load's LSN and count their own rows.
/// A consumer that reads several tables' partitions into one reassembler keyed by
/// `logicalid` alone (CES: segments are reassembled by `logicalid`, `segmentindex`
/// and `finalsegment`) must get every event back whole, and never two tables' rows
/// under one id.
#[tokio::test]
async fn loaded_rows_of_different_tables_never_share_a_logicalid() {
    use mssql_ces::event::readback::{CloudEvent, decode_json_message};
    let sim = database();
    sim.create_table(
        "dbo",
        "docs",
        vec![
            SimColumn::new("id", SqlType::Int),
            SimColumn::new("body", SqlType::NVarChar(Length::Max)),
        ],
        &["id"],
    );
    let mut t = sim.transaction();
    for id in 1..=12 {
        t = t
            .insert("dbo.items", item(id, "x", id))
            .insert("dbo.pairs", pair(id, "k", i64::from(id)))
            // Every third document is segmented (300 KiB against 128 KiB messages).
            .insert(
                "dbo.docs",
                vec![
                    Value::Int(id),
                    Value::Text("d".repeat(if id % 3 == 0 { 300_000 } else { 10 })),
                ],
            );
    }
    t.commit().unwrap();
    for table in ["dbo.items", "dbo.pairs", "dbo.docs"] {
        sim.enable_table(table, None).unwrap();
    }
    let mut poller = Poller::new(sim, config(SnapshotMode::Initial, 5), None);
    let events = drain(&mut poller, |_| {}).await;
    assert_eq!(events.len(), 36);
    assert!(events.iter().all(is_loaded));
    let encoder = Encoder::new(EncoderOptions {
        stream_guid: GUID,
        encoding: Encoding::Json,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size: MessageSizeLimit::from_kb(128).unwrap(),
    });
    // Each table's messages in order, as its partition holds them.
    let mut partitions: BTreeMap<String, Vec<CloudEvent>> = BTreeMap::new();
    for change in &events {
        for message in encoder.encode(change).unwrap().messages {
            partitions
                .entry(change.table.table().to_owned())
                .or_default()
                .push(decode_json_message(&message.bytes).unwrap());
        }
    }
    // Read round-robin across the partitions into one reassembler keyed by logicalid.
    let mut open: HashMap<String, Vec<CloudEvent>> = HashMap::new();
    let mut whole = Vec::new();
    let mut cursors: Vec<std::vec::IntoIter<CloudEvent>> =
        partitions.into_values().map(Vec::into_iter).collect();
    while cursors.iter().any(|c| c.len() > 0) {
        for cursor in &mut cursors {
            let Some(message) = cursor.next() else {
                continue;
            };
            let segments = open.entry(message.logicalid.clone()).or_default();
            assert_eq!(
                message.segmentindex as usize,
                segments.len(),
                "segment {} of {} arrives in order, and no other event's segment has its id",
                message.segmentindex,
                message.logicalid
            );
            let last = message.finalsegment;
            let id = message.logicalid.clone();
            segments.push(message);
            if last {
                whole.extend(open.remove(&id));
            }
        }
    }
    assert!(open.is_empty(), "every event completed");
    assert_eq!(whole.len(), events.len(), "one logical event per logicalid");
    let ids: HashSet<&str> = whole.iter().map(|s| s[0].logicalid.as_str()).collect();
    assert_eq!(ids.len(), events.len(), "no logicalid used twice");
    assert!(
        whole.iter().any(|s| s.len() > 1),
        "some events were segmented"
    );
}

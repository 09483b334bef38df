//! What the SQL Server source's queries cost on the server, by the CDC simulator's
//! cost model (`support::seek_cost`, derived from the query text the source sends):
//! rows examined per page, for the transactions where the shape of the query decides
//! whether paging is linear or quadratic.

use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::Value;
use mssql_ces::event::value::SqlType;
use mssql_ces::lsn::Lsn;
use mssql_ces::source::{CdcReads, RowKey, queries};
use uuid::Uuid;

use crate::support::seek_cost::change_query_cost;

/// Rows in the big transaction: 200,000 on a plain `cargo test` (the ratio asserted
/// does not depend on the size, and a million rows built in the simulator starve the
/// suite's timing tests on two cores), a million with `MSSQL_CES_SOAK=full`, or
/// `MSSQL_CES_BIG_TRANSACTION_ROWS`.
fn big_transaction_rows() -> usize {
    std::env::var("MSSQL_CES_BIG_TRANSACTION_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| crate::support::soak_rounds(200_000, 1_000_000))
}

const PAGE: usize = 1000;

/// The change query's filter as releases before this one wrote it: one OR of the
/// keyset's conjunctions, with a redundant lower bound on `__$start_lsn` as its only
/// seek predicate (what the model should find quadratic).
const OR_CHAIN: &str = "SELECT TOP (@P1) ct.__$start_lsn FROM cdc.[dbo_Big_CT] AS ct \
WHERE ct.__$start_lsn >= @P3 AND ct.__$start_lsn <= @P2 AND (ct.__$start_lsn > @P3 \
OR (ct.__$start_lsn = @P3 AND ct.__$command_id > @P4) \
OR (ct.__$start_lsn = @P3 AND ct.__$command_id = @P4 AND ct.__$seqval > @P5) \
OR (ct.__$start_lsn = @P3 AND ct.__$command_id = @P4 AND ct.__$seqval = @P5 \
AND ct.__$operation > @P6)) \
ORDER BY ct.__$start_lsn, ct.__$command_id, ct.__$seqval, ct.__$operation;";

/// A database with one transaction of `rows` inserts into `dbo.Big`, then a small
/// one, captured.
fn one_big_transaction(rows: usize) -> CdcSimulator {
    let sim = CdcSimulator::new("Shop", Uuid::from_u128(9), 0);
    sim.create_table(
        "dbo",
        "Big",
        vec![
            SimColumn::new("Id", SqlType::Int),
            SimColumn::new("V", SqlType::Int),
        ],
        &["Id"],
    );
    sim.enable_table("dbo.Big", None).expect("enable");
    let mut transaction = sim.transaction();
    for id in 0..rows as i32 {
        transaction = transaction.insert("dbo.Big", vec![Value::Int(id), Value::Int(1)]);
    }
    transaction.commit().expect("commit");
    sim.transaction()
        .insert("dbo.Big", vec![Value::Int(-1), Value::Int(2)])
        .commit()
        .expect("commit");
    sim.run_capture_job();
    sim
}

/// Pages through every change as the poller does (each page after the last row's
/// key); the rows read.
async fn page_through(sim: &mut CdcSimulator) -> usize {
    let catalog = sim.catalog().await.expect("catalog");
    let instance = catalog.instances.first().expect("instance").clone();
    let to = sim.max_lsn().await.expect("max_lsn").lsn.expect("a max");
    let mut after = RowKey {
        start_lsn: Lsn::ZERO,
        command_id: 0,
        seqval: Lsn::ZERO,
        operation: 0,
    };
    let mut read = 0;
    loop {
        let page = sim
            .read_changes(&instance, after, to, PAGE)
            .await
            .expect("page");
        read += page.len();
        let Some(last) = page.last() else {
            return read;
        };
        after = last.key;
    }
}

/// A page of the change query examines the rows it returns and a few more, so a
/// transaction of a million rows costs about a million rows examined, where the OR
/// chain examined about rows² / (2 × page): half a billion.
#[tokio::test]
async fn paging_a_big_transaction_costs_its_rows_not_their_square() {
    let rows = big_transaction_rows();
    let mut sim = one_big_transaction(rows);
    let catalog = sim.catalog().await.expect("catalog");
    let instance = &catalog.instances[0];

    let query = queries::read_changes(instance, false);
    sim.set_change_seek(change_query_cost(&query).expect("the model reads the query"));
    let read = page_through(&mut sim).await;
    assert_eq!(read, rows + 1, "every change, once");
    let examined = sim.rows_examined();
    let pages = read / PAGE + 1;
    println!("change query: {read} rows in {pages} pages, {examined} rows examined");
    assert!(
        examined <= read + 4 * pages,
        "linear: {examined} rows examined for {read} rows"
    );

    // The model tells the shapes apart: the OR chain is quadratic.
    sim.set_change_seek(change_query_cost(OR_CHAIN).expect("the model reads it"));
    page_through(&mut sim).await;
    let quadratic = sim.rows_examined() - examined;
    println!("OR chain: {quadratic} rows examined");
    assert!(
        quadratic as f64 >= (rows as f64).powi(2) / (2.0 * PAGE as f64) * 0.9,
        "{quadratic}"
    );
}

/// A thousand busy tables, each with changes in its own transactions: the merge
/// reads a table when it reaches that table's changes, and the rows held stay
/// within one shared budget (`page_size`), not a page per table; each page costs
/// one round trip (the cleanup job's low end is checked once per poll for all of
/// them, not once per page). Before, every busy table's page was read (and held)
/// before the first event, with a `min_lsn` round trip after each: here 2,000 rows
/// and over 2,000 round trips.
#[tokio::test]
async fn a_thousand_busy_tables_hold_few_rows_and_cost_a_round_trip_a_page() {
    use mssql_ces::source::poller::{PollOutcome, Poller, PollerConfig};
    const TABLES: usize = 1000;
    let sim = CdcSimulator::new("Shop", Uuid::from_u128(9), 0);
    for t in 0..TABLES {
        let name = format!("t{t:04}");
        sim.create_table(
            "dbo",
            &name,
            vec![SimColumn::new("Id", SqlType::Int)],
            &["Id"],
        );
        sim.enable_table(&format!("dbo.{name}"), None)
            .expect("enable");
    }
    sim.run_capture_job();
    let config = PollerConfig {
        page_size: 1000,
        batch_size: 1000,
        catalog_refresh: std::time::Duration::from_secs(3600),
        ..PollerConfig::default()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    // Settle the start before the changes (the catalog read and a first probe).
    assert_eq!(poller.poll().await.expect("poll"), PollOutcome::Idle);
    // Two rounds: every table gets one transaction, in table order.
    for round in 0..2 {
        for t in 0..TABLES {
            sim.transaction()
                .insert(&format!("dbo.t{t:04}"), vec![Value::Int(round)])
                .commit()
                .expect("commit");
        }
    }
    sim.run_capture_job();
    let before = sim.round_trips();
    let mut events = 0;
    let mut polls = 0;
    loop {
        polls += 1;
        match poller.poll().await.expect("poll") {
            PollOutcome::Batch(batch) => events += batch.changes.len(),
            PollOutcome::Idle => break,
        }
    }
    let round_trips = sim.round_trips() - before;
    println!(
        "{TABLES} busy tables: {events} events in {polls} polls, {round_trips} round trips, at most {} rows held",
        poller.peak_rows_held()
    );
    assert_eq!(events, 2 * TABLES);
    // Each table's page brings both its rows (so at least two are held at once);
    // its second waits for the merge, within the row budget.
    assert!(
        (2..=1000 + 1).contains(&poller.peak_rows_held()),
        "rows held: {}",
        poller.peak_rows_held()
    );
    // A page per table, plus a few statements a poll.
    assert!(
        round_trips <= TABLES + 4 * polls,
        "{round_trips} round trips in {polls} polls"
    );
}

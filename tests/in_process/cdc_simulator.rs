//! The poll loop against the in-memory CDC simulator: every CDC behaviour `docs/src/sql-server.md` states,
//! each test written so that it fails if the poller ignores that behaviour.

use std::time::Duration;

use crate::common::drain;
use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::event::{Change, Operation, Value};
use mssql_ces::lsn::Lsn;
use mssql_ces::position::Position;
use mssql_ces::source::SourceError;
use mssql_ces::source::filter::TableFilter;
use mssql_ces::source::poller::{GapPolicy, PollOutcome, Poller, PollerConfig, StartPosition};
use mssql_ces::source::timezone::TimeZoneSetting;
use uuid::Uuid;

fn database() -> CdcSimulator {
    let sim = CdcSimulator::new("Shop", Uuid::from_u128(7), 120);
    sim.create_table(
        "dbo",
        "Customers",
        vec![
            SimColumn::new("Id", SqlType::Int),
            SimColumn::new("Name", SqlType::NVarChar(Length::Bounded(50))),
            SimColumn::new("Bio", SqlType::NVarChar(Length::Max)),
        ],
        &["Id"],
    );
    sim.create_table(
        "dbo",
        "Orders",
        vec![
            SimColumn::new("Id", SqlType::BigInt),
            SimColumn::new("CustomerId", SqlType::Int),
            SimColumn::new(
                "Total",
                SqlType::Decimal {
                    precision: 18,
                    scale: 2,
                },
            ),
            SimColumn::excluded("Route", "geography"),
        ],
        &["Id"],
    );
    sim.enable_table("dbo.Customers", None).unwrap();
    sim.enable_table("dbo.Orders", None).unwrap();
    sim
}

fn config() -> PollerConfig {
    PollerConfig {
        page_size: 1000,
        batch_size: 1000,
        catalog_refresh: Duration::ZERO,
        ..PollerConfig::default()
    }
}

fn customer(id: i32, name: &str, bio: Option<&str>) -> Vec<Value> {
    vec![
        Value::Int(id),
        Value::Text(name.into()),
        bio.map_or(Value::Null, |b| Value::Text(b.into())),
    ]
}

fn order(id: i64, customer: i32, cents: i128) -> Vec<Value> {
    vec![
        Value::BigInt(id),
        Value::Int(customer),
        Value::Decimal {
            unscaled: cents,
            scale: 2,
        },
        Value::Binary(vec![0xE6, 0x10]),
    ]
}

/// `(table, operation, sequence number, last in transaction)` of each change.
fn summary(changes: &[Change]) -> Vec<(String, &'static str, u64, bool)> {
    changes
        .iter()
        .map(|c| {
            (
                c.table.table().to_owned(),
                c.operation.as_str(),
                c.sequence_number,
                c.last_in_transaction,
            )
        })
        .collect()
}

fn text(value: &Value) -> String {
    value.to_text().unwrap_or_else(|| "NULL".into())
}

#[tokio::test]
async fn inserts_updates_and_deletes_become_paired_events() {
    let sim = database();
    sim.transaction()
        .insert("dbo.Customers", customer(1, "Ada", None))
        .commit()
        .unwrap();
    sim.transaction()
        .update(
            "dbo.Customers",
            vec![Value::Int(1)],
            vec![("Name", Value::Text("Ada L.".into()))],
        )
        .commit()
        .unwrap();
    sim.transaction()
        .delete("dbo.Customers", vec![Value::Int(1)])
        .commit()
        .unwrap();
    let mut poller = Poller::new(sim.clone(), config(), None);
    let changes = drain(&mut poller).await.unwrap();
    let ops: Vec<_> = changes.iter().map(|c| c.operation).collect();
    assert_eq!(
        ops,
        [Operation::Insert, Operation::Update, Operation::Delete]
    );
    let update = &changes[1];
    assert_eq!(text(&update.old.as_ref().unwrap()[1]), "Ada");
    assert_eq!(text(&update.current.as_ref().unwrap()[1]), "Ada L.");
    assert!(changes[0].old.is_none() && changes[2].current.is_none());
    assert!(
        changes
            .windows(2)
            .all(|w| w[0].commit_lsn < w[1].commit_lsn)
    );
    assert!(
        changes
            .iter()
            .all(|c| c.sequence_number == 1 && c.last_in_transaction)
    );
    assert!(changes.iter().all(|c| c.begin_lsn < c.commit_lsn));
}

#[tokio::test]
async fn a_transaction_across_tables_is_numbered_in_commit_order() {
    let sim = database();
    sim.transaction()
        .insert("dbo.Customers", customer(1, "Ada", None))
        .insert("dbo.Orders", order(10, 1, 1999))
        .insert("dbo.Customers", customer(2, "Bob", None))
        .update(
            "dbo.Orders",
            vec![Value::BigInt(10)],
            vec![(
                "Total",
                Value::Decimal {
                    unscaled: 2999,
                    scale: 2,
                },
            )],
        )
        .commit()
        .unwrap();
    sim.transaction()
        .insert("dbo.Orders", order(11, 2, 500))
        .commit()
        .unwrap();
    let mut poller = Poller::new(sim, config(), None);
    let changes = drain(&mut poller).await.unwrap();
    assert_eq!(
        summary(&changes),
        vec![
            ("Customers".into(), "INS", 1, false),
            ("Orders".into(), "INS", 2, false),
            ("Customers".into(), "INS", 3, false),
            ("Orders".into(), "UPD", 4, true),
            ("Orders".into(), "INS", 1, true),
        ]
    );
    assert!(
        changes[..4]
            .iter()
            .all(|c| c.commit_lsn == changes[0].commit_lsn)
    );
}

#[tokio::test]
async fn command_id_orders_statements_whose_seqvals_run_backwards() {
    let sim = database();
    sim.transaction()
        .insert("dbo.Customers", customer(1, "first statement", None))
        .insert("dbo.Orders", order(10, 1, 1))
        .insert("dbo.Customers", customer(2, "third statement", None))
        .with_reversed_seqvals()
        .commit()
        .unwrap();
    let mut poller = Poller::new(sim, config(), None);
    let changes = drain(&mut poller).await.unwrap();
    let order: Vec<String> = changes
        .iter()
        .map(|c| text(&c.current.as_ref().unwrap()[1]))
        .collect();
    // Ordering by __$seqval alone would give the reverse.
    assert_eq!(order, ["first statement", "1", "third statement"]);
}

#[tokio::test]
async fn one_statement_updating_many_rows_pairs_each_row() {
    let sim = database();
    sim.transaction()
        .insert("dbo.Customers", customer(1, "a", None))
        .insert("dbo.Customers", customer(2, "b", None))
        .insert("dbo.Customers", customer(3, "c", None))
        .commit()
        .unwrap();
    sim.transaction()
        .update_many(
            "dbo.Customers",
            vec![
                vec![Value::Int(1)],
                vec![Value::Int(2)],
                vec![Value::Int(3)],
            ],
            vec![("Name", Value::Text("z".into()))],
        )
        .commit()
        .unwrap();
    let mut poller = Poller::new(sim, config(), None);
    let changes = drain(&mut poller).await.unwrap();
    let updates: Vec<_> = changes
        .iter()
        .filter(|c| c.operation == Operation::Update)
        .collect();
    assert_eq!(updates.len(), 3);
    let seq: Vec<_> = updates
        .iter()
        .map(|c| (c.sequence_number, c.last_in_transaction))
        .collect();
    assert_eq!(seq, [(1, false), (2, false), (3, true)]);
    let olds: Vec<_> = updates
        .iter()
        .map(|c| text(&c.old.as_ref().unwrap()[1]))
        .collect();
    assert_eq!(olds, ["a", "b", "c"]);
}

#[tokio::test]
async fn unchanged_lob_before_images_are_filled_from_the_after_image() {
    let sim = database();
    sim.transaction()
        .insert(
            "dbo.Customers",
            customer(1, "Ada", Some("a long biography")),
        )
        .commit()
        .unwrap();
    sim.transaction()
        .update(
            "dbo.Customers",
            vec![Value::Int(1)],
            vec![("Name", Value::Text("Ada L.".into()))],
        )
        .commit()
        .unwrap();
    sim.transaction()
        .update(
            "dbo.Customers",
            vec![Value::Int(1)],
            vec![("Bio", Value::Null)],
        )
        .commit()
        .unwrap();
    let mut poller = Poller::new(sim, config(), None);
    let changes = drain(&mut poller).await.unwrap();
    // Bio did not change: CDC's op 3 has NULL, the event has the real value.
    assert_eq!(
        text(&changes[1].old.as_ref().unwrap()[2]),
        "a long biography"
    );
    assert_eq!(
        text(&changes[1].current.as_ref().unwrap()[2]),
        "a long biography"
    );
    // Bio changed to NULL: the before image keeps the real old value.
    assert_eq!(
        text(&changes[2].old.as_ref().unwrap()[2]),
        "a long biography"
    );
    assert_eq!(text(&changes[2].current.as_ref().unwrap()[2]), "NULL");
}

#[tokio::test]
async fn excluded_types_are_left_out_and_tables_without_a_key_have_no_pkkey() {
    let sim = database();
    sim.create_table(
        "dbo",
        "Log",
        vec![SimColumn::new("Line", SqlType::NVarChar(Length::Max))],
        &[],
    );
    sim.enable_table("dbo.Log", None).unwrap();
    sim.transaction()
        .insert("dbo.Orders", order(10, 1, 1))
        .insert("dbo.Log", vec![Value::Text("hello".into())])
        .commit()
        .unwrap();
    let mut poller = Poller::new(sim, config(), None);
    let changes = drain(&mut poller).await.unwrap();
    let columns: Vec<_> = changes[0]
        .table
        .columns()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        ["Id", "CustomerId", "Total"],
        "geography column left out"
    );
    assert_eq!(changes[0].current.as_ref().unwrap().len(), 3);
    assert_eq!(changes[0].key_values().count(), 1);
    assert_eq!(changes[1].table.table(), "Log");
    assert_eq!(changes[1].key_values().count(), 0);
}

#[tokio::test]
async fn quiet_tables_advance_to_max_lsn_and_survive_cleanup() {
    let sim = database();
    sim.transaction()
        .insert("dbo.Customers", customer(1, "Ada", None))
        .commit()
        .unwrap();
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    // Only idle markers for a while: Orders never had a change.
    let mut last = Lsn::ZERO;
    for _ in 0..3 {
        last = sim.idle_marker();
    }
    assert_eq!(drain(&mut poller).await.unwrap().len(), 0);
    let position = poller.position().clone();
    assert_eq!(
        position.instances["dbo_Orders"], last,
        "quiet instance at max_lsn"
    );
    assert_eq!(position.instances["dbo_Customers"], last);
    // The cleanup job purges up to the latest marker; a restart from the position
    // finds no gap, because the quiet table kept up.
    sim.cleanup(last);
    sim.transaction()
        .insert("dbo.Orders", order(10, 1, 1))
        .commit()
        .unwrap();
    let mut restarted = Poller::new(sim, config(), Some(position));
    let changes = drain(&mut restarted).await.expect("no gap");
    assert_eq!(summary(&changes), vec![("Orders".into(), "INS", 1, true)]);
}

fn gap_setup() -> (CdcSimulator, Position, Lsn) {
    let sim = database();
    sim.transaction()
        .insert("dbo.Customers", customer(1, "Ada", None))
        .commit()
        .unwrap();
    let position = Position {
        last_event: None,
        instances: [
            ("dbo_Customers".to_string(), Lsn::ZERO),
            ("dbo_Orders".to_string(), Lsn::ZERO),
        ]
        .into(),
        ..Position::default()
    };
    let lost = sim
        .transaction()
        .insert("dbo.Customers", customer(2, "Lost", None))
        .commit()
        .unwrap();
    sim.transaction()
        .insert("dbo.Customers", customer(3, "Kept", None))
        .commit()
        .unwrap();
    let low_water = lost.increment().unwrap();
    sim.cleanup(low_water);
    (sim, position, low_water)
}

#[tokio::test]
async fn purged_changes_are_a_gap_error_naming_instance_and_range() {
    let (sim, position, low_water) = gap_setup();
    let mut poller = Poller::new(sim, config(), Some(position));
    let err = drain(&mut poller).await.unwrap_err();
    match &err {
        SourceError::Gap {
            capture_instance,
            first_lost,
            last_lost,
        } => {
            assert_eq!(capture_instance, "dbo_Customers");
            assert_eq!(*first_lost, Lsn::from_parts(0, 0, 1));
            assert_eq!(last_lost.increment(), Some(low_water));
        }
        other => panic!("expected a gap, got {other}"),
    }
    assert!(err.to_string().contains("source.on_gap"), "{err}");
}

#[tokio::test]
async fn the_skip_policy_continues_after_a_gap() {
    let (sim, position, _) = gap_setup();
    let config = PollerConfig {
        on_gap: GapPolicy::Skip,
        ..config()
    };
    let mut poller = Poller::new(sim, config, Some(position));
    let changes = drain(&mut poller).await.unwrap();
    let names: Vec<_> = changes
        .iter()
        .map(|c| text(&c.current.as_ref().unwrap()[1]))
        .collect();
    assert_eq!(names, ["Kept"]);
}

#[tokio::test]
async fn null_min_and_max_lsn_after_enabling_are_retried() {
    let sim = CdcSimulator::new("Shop", Uuid::nil(), 0);
    sim.create_table(
        "dbo",
        "T",
        vec![SimColumn::new("Id", SqlType::Int)],
        &["Id"],
    );
    sim.enable_table("dbo.T", None).unwrap();
    let mut poller = Poller::new(sim.clone(), config(), None);
    // No lsn_time_mapping row yet: max_lsn is NULL.
    assert_eq!(poller.poll().await.unwrap(), PollOutcome::Idle);
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1)])
        .commit()
        .unwrap();
    sim.set_min_lsn_available(false);
    assert_eq!(poller.poll().await.unwrap(), PollOutcome::Idle);
    sim.set_min_lsn_available(true);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_schema_change_switches_to_the_new_capture_instance() {
    let sim = database();
    sim.transaction()
        .insert("dbo.Customers", customer(1, "Ada", None))
        .commit()
        .unwrap();
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);

    sim.add_column(
        "dbo.Customers",
        SimColumn::new("Email", SqlType::VarChar(Length::Bounded(100))),
        Value::Null,
    )
    .unwrap();
    // Old instance only: the new column is not captured yet.
    sim.transaction()
        .update(
            "dbo.Customers",
            vec![Value::Int(1)],
            vec![("Email", Value::Text("a@x".into()))],
        )
        .commit()
        .unwrap();
    let new_instance = sim
        .enable_table("dbo.Customers", Some("dbo_Customers_v2"))
        .unwrap();
    // The new instance's start LSN is above max_lsn until the next commit: it waits.
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    sim.transaction()
        .update(
            "dbo.Customers",
            vec![Value::Int(1)],
            vec![("Email", Value::Text("b@x".into()))],
        )
        .commit()
        .unwrap();
    // Both instances captured this change; only the new one may deliver it.
    // Old instance: insert (1) + two updates (op 3 + op 4 each); new instance: one update.
    assert_eq!(sim.change_rows("dbo_Customers"), 5);
    assert_eq!(sim.change_rows("dbo_Customers_v2"), 2);
    let changes = drain(&mut poller).await.unwrap();
    assert_eq!(changes.len(), 1, "delivered once, not by both instances");
    let columns: Vec<_> = changes[0]
        .table
        .columns()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Id", "Name", "Bio", "Email"]);
    assert_eq!(text(&changes[0].current.as_ref().unwrap()[3]), "b@x");
    assert!(poller.position().instances.contains_key(&new_instance));
}

#[tokio::test]
async fn page_boundaries_change_nothing() {
    let sim = database();
    for t in 0..5 {
        let mut txn = sim.transaction();
        for i in 0..4 {
            let id = t * 10 + i;
            txn = txn
                .insert("dbo.Customers", customer(id, "x", None))
                .insert("dbo.Orders", order(i64::from(id), id, 1));
        }
        txn.commit().unwrap();
    }
    let mut whole = Poller::new(sim.clone(), config(), None);
    let expected = drain(&mut whole).await.unwrap();
    assert_eq!(expected.len(), 40);
    for page_size in [1, 2, 3, 7] {
        let config = PollerConfig {
            page_size,
            ..config()
        };
        let mut paged = Poller::new(sim.clone(), config, None);
        assert_eq!(
            drain(&mut paged).await.unwrap(),
            expected,
            "page size {page_size}"
        );
    }
}

#[tokio::test]
async fn resuming_mid_transaction_loses_and_repeats_nothing() {
    let sim = database();
    for t in 0..3 {
        let mut txn = sim.transaction();
        for i in 0..5 {
            txn = txn.insert("dbo.Customers", customer(t * 10 + i, "x", None));
        }
        txn.commit().unwrap();
    }
    let mut whole = Poller::new(sim.clone(), config(), None);
    let expected = drain(&mut whole).await.unwrap();
    assert_eq!(expected.len(), 15);
    // Stop after every possible batch and resume from its position.
    for cut in 1..15 {
        let config = PollerConfig {
            batch_size: cut,
            ..config()
        };
        let mut first = Poller::new(sim.clone(), config.clone(), None);
        let PollOutcome::Batch(batch) = first.poll().await.unwrap() else {
            panic!("expected a batch");
        };
        assert_eq!(batch.changes.len(), cut);
        let mut resumed = Poller::new(sim.clone(), config, Some(batch.position));
        let mut all = batch.changes;
        all.extend(drain(&mut resumed).await.unwrap());
        assert_eq!(all, expected, "resumed after {cut} events");
    }
}

#[tokio::test]
async fn transient_faults_lose_and_repeat_nothing() {
    let sim = database();
    for i in 0..6 {
        sim.transaction()
            .insert("dbo.Customers", customer(i, "x", None))
            .insert("dbo.Orders", order(i64::from(i), i, 1))
            .commit()
            .unwrap();
    }
    let mut clean = Poller::new(sim.clone(), config(), None);
    let expected = drain(&mut clean).await.unwrap();
    let config = PollerConfig {
        page_size: 2,
        batch_size: 3,
        ..config()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    let mut got = Vec::new();
    let mut faults = 0;
    for call in 0..200 {
        // Two polls in three start with a fault.
        if call % 3 != 2 {
            sim.inject_fault(SourceError::transient("connection reset"));
        }
        match poller.poll().await {
            Ok(PollOutcome::Idle) => break,
            Ok(PollOutcome::Batch(batch)) => got.extend(batch.changes),
            Err(e) => {
                assert!(e.is_transient());
                faults += 1;
            }
        }
    }
    assert!(faults > 3, "faults were injected ({faults})");
    assert_eq!(got, expected);
}

#[tokio::test]
async fn an_idle_poll_costs_a_constant_number_of_round_trips() {
    let mut costs = Vec::new();
    for tables in [2, 50] {
        let sim = CdcSimulator::new("Shop", Uuid::nil(), 0);
        for t in 0..tables {
            let name = format!("T{t}");
            sim.create_table(
                "dbo",
                &name,
                vec![SimColumn::new("Id", SqlType::Int)],
                &["Id"],
            );
            sim.enable_table(&format!("dbo.{name}"), None).unwrap();
        }
        sim.transaction()
            .insert("dbo.T0", vec![Value::Int(1)])
            .commit()
            .unwrap();
        let config = PollerConfig {
            catalog_refresh: Duration::from_secs(3600),
            ..config()
        };
        let mut poller = Poller::new(sim.clone(), config, None);
        drain(&mut poller).await.unwrap();
        let before = sim.round_trips();
        assert_eq!(poller.poll().await.unwrap(), PollOutcome::Idle);
        let nothing_new = sim.round_trips() - before;
        sim.idle_marker();
        let before = sim.round_trips();
        drain(&mut poller).await.unwrap();
        let only_markers = sim.round_trips() - before;
        costs.push((nothing_new, only_markers));
    }
    assert_eq!(
        costs[0], costs[1],
        "cost does not grow with the number of tables"
    );
    assert_eq!(costs[0].0, 1, "max_lsn only");
    assert_eq!(costs[0].1, 3, "max_lsn and one probe, then max_lsn again");
}

#[tokio::test]
async fn commit_times_are_converted_to_utc() {
    let sim = database();
    sim.transaction()
        .insert("dbo.Customers", customer(1, "Ada", None))
        .commit()
        .unwrap();
    let local_time = |zone: TimeZoneSetting| {
        let sim = sim.clone();
        async move {
            let config = PollerConfig {
                time_zone: zone,
                ..config()
            };
            let mut poller = Poller::new(sim, config, None);
            let changes = drain(&mut poller).await.unwrap();
            mssql_ces::event::format_time(changes[0].commit_time)
        }
    };
    // The simulated server runs at UTC+2 and committed at 16:25:00.007 local.
    assert_eq!(
        local_time(TimeZoneSetting::Server).await,
        "2026-08-07T14:25:00.007Z"
    );
    assert_eq!(
        local_time(TimeZoneSetting::CesLocalAsUtc).await,
        "2026-08-07T16:25:00.007Z"
    );
    let berlin = TimeZoneSetting::parse("Europe/Berlin").unwrap();
    assert_eq!(local_time(berlin).await, "2026-08-07T14:25:00.007Z");
}

#[tokio::test]
async fn table_filters_select_what_is_streamed() {
    let sim = database();
    sim.transaction()
        .insert("dbo.Customers", customer(1, "Ada", None))
        .insert("dbo.Orders", order(10, 1, 1))
        .commit()
        .unwrap();
    let config = PollerConfig {
        filter: TableFilter::new(vec!["dbo.*".into()], vec!["dbo.Orders".into()]),
        ..config()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    let changes = drain(&mut poller).await.unwrap();
    assert_eq!(
        summary(&changes),
        vec![("Customers".into(), "INS", 1, true)]
    );
    let none = PollerConfig {
        filter: TableFilter::new(vec!["hr.*".into()], vec![]),
        ..PollerConfig::default()
    };
    let err = Poller::new(sim, none, None).poll().await.unwrap_err();
    assert!(matches!(err, SourceError::NoCapturedTables { .. }), "{err}");
}

/// "latest" settled before the first poll (what a run saves at once): a restarted
/// poller from that position reads the change made in between, where one that chose
/// "latest" again would skip it. With nothing recorded yet, the start is before each
/// instance's first change, and nothing is called a gap.
#[tokio::test]
async fn start_position_latest_is_settled_before_the_first_poll() {
    let sim = database();
    let config = PollerConfig {
        start_position: StartPosition::Latest,
        ..config()
    };
    // Nothing recorded yet: everything the instances record is to be read.
    let mut empty = Poller::new(sim.clone(), config.clone(), None);
    assert!(
        empty.resolve_start().await.unwrap(),
        "settled before everything"
    );
    sim.transaction()
        .insert("dbo.Customers", customer(1, "first", None))
        .commit()
        .unwrap();
    let mut restarted = Poller::new(sim.clone(), config.clone(), Some(empty.position().clone()));
    assert!(
        !restarted.resolve_start().await.unwrap(),
        "a checkpoint settles it"
    );
    let changes = drain(&mut restarted).await.unwrap();
    assert_eq!(changes.len(), 1, "the first change, no gap");

    // With history: settled at today's latest; the change made before the restart
    // is read by the restarted poller.
    let mut first = Poller::new(sim.clone(), config.clone(), None);
    assert!(first.resolve_start().await.unwrap());
    let settled = first.position().clone();
    sim.transaction()
        .insert("dbo.Customers", customer(2, "in between", None))
        .commit()
        .unwrap();
    let mut restarted = Poller::new(sim.clone(), config, Some(settled));
    let changes = drain(&mut restarted).await.unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(text(&changes[0].current.as_ref().unwrap()[1]), "in between");
}

#[tokio::test]
async fn start_position_latest_skips_history() {
    let sim = database();
    sim.transaction()
        .insert("dbo.Customers", customer(1, "old", None))
        .commit()
        .unwrap();
    let config = PollerConfig {
        start_position: StartPosition::Latest,
        ..config()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    assert!(drain(&mut poller).await.unwrap().is_empty());
    sim.transaction()
        .insert("dbo.Customers", customer(2, "new", None))
        .commit()
        .unwrap();
    let changes = drain(&mut poller).await.unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(text(&changes[0].current.as_ref().unwrap()[1]), "new");
}

//! The poll loop against what SQL Server really does (issue "Meet a real SQL Server"):
//! capture-job latency, capture instances disabled and re-created, DDL on captured
//! tables, cleanup racing reads, permission-shaped answers and the server's time zone.
//! Each test sets the simulator up the way SQL Server behaves (see the simulator's
//! module documentation for the pages each behaviour comes from) and fails if the
//! poller takes the kind shortcut.

use std::time::Duration;

use crate::common::drain;
use cdc_sim::{CdcSimulator, SimAction, SimColumn};
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::event::{Change, Value};
use mssql_ces::lsn::Lsn;
use mssql_ces::source::SourceError;
use mssql_ces::source::filter::TableFilter;
use mssql_ces::source::poller::{GapPolicy, PollOutcome, Poller, PollerConfig, StartPosition};
use uuid::Uuid;

fn config() -> PollerConfig {
    PollerConfig {
        catalog_refresh: Duration::from_secs(3600),
        unreadable_grace: Duration::ZERO,
        ..PollerConfig::default()
    }
}

/// `dbo.T (Id int PRIMARY KEY, Name nvarchar(50))`, not yet enabled.
fn database() -> CdcSimulator {
    crate::common::shop_with_t(120)
}

fn row(id: i32, name: &str) -> Vec<Value> {
    vec![Value::Int(id), Value::Text(name.into())]
}

fn insert(sim: &CdcSimulator, table: &str, values: Vec<Value>) -> Lsn {
    sim.transaction().insert(table, values).commit().unwrap()
}

/// Polls until idle, retrying transient errors (as the pipeline does) a bounded
/// number of times.
async fn drain_retrying(poller: &mut Poller<CdcSimulator>) -> Result<Vec<Change>, SourceError> {
    let mut changes = Vec::new();
    let mut retries = 0;
    loop {
        match poller.poll().await {
            Ok(PollOutcome::Idle) => return Ok(changes),
            Ok(PollOutcome::Batch(batch)) => changes.extend(batch.changes),
            Err(e) if e.is_transient() && retries < 5 => retries += 1,
            Err(e) => return Err(e),
        }
    }
}

fn names(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| {
            let row = c.current.as_ref().or(c.old.as_ref()).unwrap();
            let at = c
                .table
                .columns()
                .iter()
                .position(|col| col.name == "Name")
                .unwrap();
            row[at].to_text().unwrap_or_default()
        })
        .collect()
}

#[tokio::test]
async fn start_lsn_is_null_until_the_capture_job_scans() {
    let sim = database();
    sim.set_capture_job_manual(true);
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    assert_eq!(
        sim.start_lsn("dbo_T"),
        None,
        "not established before a scan"
    );
    let mut poller = Poller::new(sim.clone(), config(), None);
    // A pending instance is neither an error nor read.
    assert_eq!(drain(&mut poller).await.unwrap().len(), 0);
    sim.run_capture_job();
    assert!(sim.start_lsn("dbo_T").is_some());
    let changes = drain(&mut poller).await.unwrap();
    assert_eq!(
        names(&changes),
        ["a"],
        "the change after enabling is delivered"
    );
}

#[tokio::test]
async fn latest_right_after_enabling_is_not_a_gap() {
    let sim = database();
    sim.create_table(
        "dbo",
        "U",
        vec![SimColumn::new("Id", SqlType::Int)],
        &["Id"],
    );
    sim.enable_table("dbo.U", None).unwrap();
    insert(&sim, "dbo.U", vec![Value::Int(1)]);
    sim.set_capture_job_manual(true);
    sim.enable_table("dbo.T", None).unwrap();
    let config = PollerConfig {
        start_position: StartPosition::Latest,
        ..config()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    assert!(drain(&mut poller).await.unwrap().is_empty());
    insert(&sim, "dbo.T", row(2, "after start"));
    sim.run_capture_job();
    // T's start_lsn is now above the position "latest" recorded: new, not lost.
    let changes = drain(&mut poller).await.expect("no false gap");
    assert_eq!(names(&changes), ["after start"]);
}

#[tokio::test]
async fn disable_and_enable_while_running_never_stops_the_run() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    sim.disable_instance("dbo_T");
    insert(&sim, "dbo.T", row(2, "not captured"));
    // The change table is gone: every poll notices, none fails with error 208.
    assert!(drain(&mut poller).await.unwrap().is_empty());
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(3, "re-enabled"));
    let changes = drain(&mut poller)
        .await
        .expect("a re-created instance is new");
    assert_eq!(names(&changes), ["re-enabled"]);
}

#[tokio::test]
async fn an_instance_dropped_between_probe_and_read_is_retried_not_fatal() {
    let sim = database();
    sim.create_table(
        "dbo",
        "U",
        vec![SimColumn::new("Id", SqlType::Int)],
        &["Id"],
    );
    sim.enable_table("dbo.T", None).unwrap();
    sim.enable_table("dbo.U", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    insert(&sim, "dbo.U", vec![Value::Int(1)]);
    sim.on_next_read(SimAction::Disable("dbo_T".into()));
    let mut poller = Poller::new(sim.clone(), config(), None);
    let err = poller.poll().await.unwrap_err();
    assert!(matches!(err, SourceError::CatalogChanged { .. }), "{err}");
    assert!(err.is_transient());
    // Next poll: the catalog is read again and the remaining table delivered.
    let changes = drain(&mut poller).await.unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].table.table(), "U");
}

#[tokio::test]
async fn re_enabled_while_the_poller_was_down_is_new_not_a_gap() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    let position = poller.position().clone();
    drop(poller);
    // While down: disabled, writes nobody captured, enabled again under the same name.
    sim.disable_instance("dbo_T");
    insert(&sim, "dbo.T", row(2, "uncaptured"));
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(3, "b"));
    let mut restarted = Poller::new(sim, config(), Some(position));
    let changes = drain(&mut restarted).await.expect("no false gap");
    assert_eq!(names(&changes), ["b"]);
}

#[tokio::test]
async fn a_real_gap_on_a_re_used_position_still_stops_the_stream() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    let position = poller.position().clone();
    let lost = insert(&sim, "dbo.T", row(2, "lost"));
    insert(&sim, "dbo.T", row(3, "kept"));
    sim.cleanup(lost.increment().unwrap());
    let mut restarted = Poller::new(sim, config(), Some(position));
    let err = drain(&mut restarted).await.unwrap_err();
    assert!(matches!(err, SourceError::Gap { .. }), "{err}");
}

#[tokio::test]
async fn a_newer_instance_without_start_lsn_holds_the_old_one_no_duplicates() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    // Scanned: visible in the old instance.
    insert(&sim, "dbo.T", row(2, "before switch"));
    sim.set_capture_job_manual(true);
    sim.add_column(
        "dbo.T",
        SimColumn::new("Email", SqlType::VarChar(Length::Bounded(100))),
        Value::Null,
    )
    .unwrap();
    let v2 = sim.enable_table("dbo.T", Some("dbo_T_v2")).unwrap();
    // The new instance exists with start_lsn NULL: where the old one ends is unknown.
    let held = drain(&mut poller).await.unwrap();
    assert!(
        held.is_empty(),
        "nothing read while the switch point is unknown"
    );
    sim.transaction()
        .insert(
            "dbo.T",
            vec![
                Value::Int(3),
                Value::Text("after".into()),
                Value::Text("x@y".into()),
            ],
        )
        .commit()
        .unwrap();
    sim.run_capture_job();
    // Both instances captured the last insert; it must come once, from the new one.
    assert_eq!(sim.change_rows(&v2), 1);
    let changes = drain(&mut poller).await.unwrap();
    assert_eq!(names(&changes), ["before switch", "after"]);
    assert_eq!(changes[1].table.columns().len(), 3);
}

#[tokio::test]
async fn a_dropped_column_is_left_out_and_values_never_shift() {
    let sim = CdcSimulator::new("Shop", Uuid::from_u128(7), 0);
    sim.create_table(
        "dbo",
        "T",
        vec![
            SimColumn::new("Id", SqlType::Int),
            SimColumn::new("Gone", SqlType::Int),
            SimColumn::new("Name", SqlType::NVarChar(Length::Bounded(50))),
            SimColumn::new("Qty", SqlType::SmallInt),
        ],
        &["Id"],
    );
    sim.enable_table("dbo.T", None).unwrap();
    insert(
        &sim,
        "dbo.T",
        vec![
            Value::Int(1),
            Value::Int(9),
            Value::Text("a".into()),
            Value::SmallInt(5),
        ],
    );
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    sim.drop_column("dbo.T", "Gone").unwrap();
    insert(
        &sim,
        "dbo.T",
        vec![Value::Int(2), Value::Text("b".into()), Value::SmallInt(6)],
    );
    let changes = drain(&mut poller).await.unwrap();
    assert_eq!(changes.len(), 1);
    let columns: Vec<(&str, u32)> = changes[0]
        .table
        .columns()
        .iter()
        .map(|c| (c.name.as_str(), c.index))
        .collect();
    assert_eq!(columns, [("Id", 0), ("Name", 1), ("Qty", 2)]);
    assert_eq!(
        changes[0].current.as_ref().unwrap(),
        &vec![Value::Int(2), Value::Text("b".into()), Value::SmallInt(6)]
    );
}

#[tokio::test]
async fn a_type_change_racing_a_read_re_reads_the_catalog() {
    let sim = CdcSimulator::new("Shop", Uuid::from_u128(7), 0);
    sim.create_table(
        "dbo",
        "T",
        vec![
            SimColumn::new("Id", SqlType::Int),
            SimColumn::new("Qty", SqlType::Int),
        ],
        &["Id"],
    );
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", vec![Value::Int(1), Value::Int(5)]);
    sim.set_capture_job_manual(true);
    sim.alter_column_type("dbo.T", "Qty", SqlType::BigInt)
        .unwrap();
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(2), Value::BigInt(5_000_000_000)])
        .commit()
        .unwrap();
    // The capture job reaches the DDL while the poller reads with the old catalog.
    sim.on_next_read(SimAction::RunCaptureJob);
    let mut poller = Poller::new(sim.clone(), config(), None);
    let changes = drain_retrying(&mut poller).await.expect("never stops");
    let qty: Vec<Value> = changes
        .iter()
        .map(|c| c.current.as_ref().unwrap()[1].clone())
        .collect();
    assert_eq!(qty, [Value::BigInt(5), Value::BigInt(5_000_000_000)]);
    assert_eq!(changes[1].table.columns()[1].sql_type, SqlType::BigInt);
}

/// Three inserts in one transaction, then one more transaction.
fn cleanup_race(policy: GapPolicy) -> (CdcSimulator, Poller<CdcSimulator>, Lsn) {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "seen"));
    let sim2 = sim.clone();
    let poller = Poller::new(
        sim2,
        PollerConfig {
            on_gap: policy,
            ..config()
        },
        None,
    );
    (sim, poller, Lsn::ZERO)
}

#[tokio::test]
async fn cleanup_racing_a_read_is_a_gap_never_part_of_a_transaction() {
    for policy in [GapPolicy::Fail, GapPolicy::Skip] {
        let (sim, mut poller, _) = cleanup_race(policy);
        assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
        let big = sim
            .transaction()
            .insert("dbo.T", row(2, "x"))
            .insert("dbo.T", row(3, "y"))
            .insert("dbo.T", row(4, "z"))
            .commit()
            .unwrap();
        insert(&sim, "dbo.T", row(5, "after"));
        // The cleanup raises the low end past the big transaction and has deleted
        // one of its three rows when the read runs.
        sim.on_next_read(SimAction::BeginCleanup {
            low_water: big.increment().unwrap(),
            rows: 1,
        });
        match policy {
            GapPolicy::Fail => {
                let err = drain(&mut poller).await.unwrap_err();
                match err {
                    SourceError::Gap {
                        first_lost,
                        last_lost,
                        ..
                    } => assert!(first_lost <= big && big <= last_lost),
                    other => panic!("expected a gap, got {other}"),
                }
            }
            GapPolicy::Skip => {
                let changes = drain_retrying(&mut poller).await.unwrap();
                assert_eq!(
                    names(&changes),
                    ["after"],
                    "no part of the purged transaction"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_table_the_login_cannot_read_is_named_with_the_grant() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    sim.deny_select("dbo.T", true);
    let mut poller = Poller::new(sim.clone(), config(), None);
    let err = drain(&mut poller).await.unwrap_err();
    assert!(matches!(err, SourceError::TableUnreadable { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("dbo.T") && text.contains("GRANT SELECT"),
        "{text}"
    );
    assert!(
        text.contains("has no gating role") && !text.contains("ALTER ROLE"),
        "no role to join: {text}"
    );
    // Within the grace period it waits instead, and reads once granted.
    let patient = PollerConfig {
        unreadable_grace: Duration::from_secs(3600),
        ..config()
    };
    let mut poller = Poller::new(sim.clone(), patient, None);
    assert!(drain(&mut poller).await.unwrap().is_empty());
    sim.deny_select("dbo.T", false);
    assert_eq!(names(&drain(&mut poller).await.unwrap()), ["a"]);
}

#[tokio::test]
async fn a_login_outside_the_gating_role_is_told_the_roles_name() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    sim.set_gating_role("dbo_T", Some("cdc_readers"));
    insert(&sim, "dbo.T", row(1, "a"));
    let mut poller = Poller::new(sim.clone(), config(), None);
    let err = drain(&mut poller).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("gating role `cdc_readers`")
            && text.contains("ALTER ROLE [cdc_readers] ADD MEMBER"),
        "{text}"
    );
    // A member reads.
    sim.set_role_member("cdc_readers", true);
    let mut poller = Poller::new(sim, config(), None);
    assert_eq!(names(&drain(&mut poller).await.unwrap()), ["a"]);
}

#[tokio::test]
async fn invisible_tables_fail_only_when_they_may_be_streamed() {
    let sim = database();
    sim.create_table(
        "dbo",
        "Secret",
        vec![SimColumn::new("Id", SqlType::Int)],
        &["Id"],
    );
    sim.enable_table("dbo.T", None).unwrap();
    sim.enable_table("dbo.Secret", None).unwrap();
    sim.hide_table("dbo.Secret");
    insert(&sim, "dbo.T", row(1, "a"));
    let all = drain(&mut Poller::new(sim.clone(), config(), None)).await;
    let err = all.unwrap_err();
    assert!(matches!(err, SourceError::TableInvisible { .. }), "{err}");
    assert!(err.to_string().contains("dbo_Secret"), "{err}");
    let only_t = PollerConfig {
        filter: TableFilter::new(vec!["dbo.T".into()], vec![]),
        ..config()
    };
    let changes = drain(&mut Poller::new(sim.clone(), only_t, None)).await;
    assert_eq!(names(&changes.unwrap()), ["a"]);
    let names_secret = PollerConfig {
        filter: TableFilter::new(vec!["dbo.T".into(), "dbo.Secret".into()], vec![]),
        ..config()
    };
    let err = drain(&mut Poller::new(sim, names_secret, None))
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::TableInvisible { .. }), "{err}");
}

#[tokio::test]
async fn an_unreadable_database_guid_is_an_error_never_the_nil_uuid() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    sim.set_guid_readable(false);
    let err = drain(&mut Poller::new(sim.clone(), config(), None))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SourceError::DatabaseGuidUnreadable),
        "{err:?}"
    );
    assert!(err.to_string().contains("event.stream_guid"), "{err}");
    let fixed = Uuid::from_u128(42);
    let configured = PollerConfig {
        stream_guid: Some(fixed),
        ..config()
    };
    let mut poller = Poller::new(sim, configured, None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    assert_eq!(poller.stream_guid(), Some(fixed));
}

#[tokio::test]
async fn a_change_table_without_command_id_is_named() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    sim.remove_command_id("dbo_T");
    let err = drain(&mut Poller::new(sim, config(), None))
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::NoCommandId { .. }), "{err}");
    assert!(err.to_string().contains("__$command_id"), "{err}");
}

#[tokio::test]
async fn keys_follow_the_index_cdc_was_enabled_with() {
    let sim = CdcSimulator::new("Shop", Uuid::from_u128(7), 0);
    sim.create_table(
        "dbo",
        "NoPk",
        vec![
            SimColumn::new("Code", SqlType::VarChar(Length::Bounded(10))),
            SimColumn::new("Name", SqlType::NVarChar(Length::Bounded(50))),
        ],
        &[],
    );
    let name = sim.enable_table("dbo.NoPk", None).unwrap();
    sim.set_index_columns(&name, &["Code"]);
    insert(
        &sim,
        "dbo.NoPk",
        vec![Value::Text("K1".into()), Value::Text("a".into())],
    );
    let changes = drain(&mut Poller::new(sim, config(), None)).await.unwrap();
    let table = &changes[0].table;
    let key: Vec<&str> = table
        .key()
        .iter()
        .map(|&i| table.columns()[i].name.as_str())
        .collect();
    assert_eq!(key, ["Code"]);
}

#[tokio::test]
async fn a_checkpoint_from_another_database_or_a_restored_copy_is_refused() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    let position = poller.position().clone();
    let recorded = position
        .source
        .clone()
        .expect("the position names its database");
    assert_eq!(recorded.database, "Shop");
    assert_eq!(recorded.database_guid, Some(Uuid::from_u128(7)));
    // The same database: fine.
    let mut again = Poller::new(sim.clone(), config(), Some(position.clone()));
    assert!(drain(&mut again).await.is_ok());
    // A restored copy has a new GUID: refused, naming both.
    sim.set_guid(Uuid::from_u128(8));
    let mut restored = Poller::new(sim.clone(), config(), Some(position.clone()));
    let err = drain(&mut restored).await.unwrap_err();
    assert!(matches!(err, SourceError::OtherDatabase { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&Uuid::from_u128(7).to_string())
            && text.contains(&Uuid::from_u128(8).to_string()),
        "{text}"
    );
    assert!(text.contains("checkpoint.path"), "{text}");
    // Another database name.
    let other = CdcSimulator::new("Other", Uuid::from_u128(7), 0);
    other.create_table(
        "dbo",
        "T",
        vec![SimColumn::new("Id", SqlType::Int)],
        &["Id"],
    );
    other.enable_table("dbo.T", None).unwrap();
    let err = drain(&mut Poller::new(other, config(), Some(position)))
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::OtherDatabase { .. }), "{err}");
}

/// Joining an availability group gives the database the group's GUID (its
/// `group_database_id`), which was also the default stream GUID: the stream goes on
/// with the GUID it started with, so every event id stays, through a failover to
/// another replica (whose own GUID differs) and after leaving the group; a restored
/// copy still shares no GUID and is refused.
#[tokio::test]
async fn joining_and_leaving_an_availability_group_keeps_the_stream_and_its_ids() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    let local = Uuid::from_u128(7);
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    assert_eq!(poller.stream_guid(), Some(local));

    // Joined: sys.databases.group_database_id is the database's GUID now.
    let group = Uuid::from_u128(0xA6);
    sim.set_availability_group(Some(group));
    let mut steps = vec![("joined", None)];
    // Failed over: another replica, with its own database_guid, is primary.
    steps.push(("failed over", Some(Uuid::from_u128(0xB2))));
    let mut position = poller.position().clone();
    for (n, (step, replica)) in steps.into_iter().enumerate() {
        if let Some(replica) = replica {
            sim.set_guid(replica);
        }
        insert(&sim, "dbo.T", row(10 + n as i32, step));
        let mut resumed = Poller::new(sim.clone(), config(), Some(position.clone()));
        let changes = drain(&mut resumed)
            .await
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        assert_eq!(changes.len(), 1, "{step}");
        assert_eq!(
            resumed.stream_guid(),
            Some(local),
            "{step}: the stream GUID stays"
        );
        position = resumed.position().clone();
        let recorded = position.source.as_deref().expect("identity");
        assert_eq!(recorded.database_guid, Some(group), "{step}");
        assert_eq!(recorded.stream_guid, local, "{step}");
    }
    // Left the group on that replica: its own GUID is the database's again.
    sim.set_availability_group(None);
    insert(&sim, "dbo.T", row(30, "left"));
    let mut left = Poller::new(sim.clone(), config(), Some(position.clone()));
    assert_eq!(drain(&mut left).await.unwrap().len(), 1);
    assert_eq!(left.stream_guid(), Some(local));

    // A restored copy: a new GUID, no group, nothing in common.
    sim.set_guid(Uuid::from_u128(0xC3));
    let mut restored = Poller::new(sim.clone(), config(), Some(left.position().clone()));
    let err = drain(&mut restored).await.unwrap_err();
    assert!(matches!(err, SourceError::OtherDatabase { .. }), "{err}");
}

/// Streaming from readable secondaries: each shows the primary's changes as far as
/// its redo got, and a failover to a replica further behind moves `max_lsn` back.
/// Nothing is read twice or skipped: the stream waits until the new replica has
/// caught up past the position, then goes on.
#[tokio::test]
async fn a_failover_to_a_replica_further_behind_neither_repeats_nor_skips() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    let mut commits = Vec::new();
    for id in 1..=6 {
        insert(&sim, "dbo.T", row(id, &format!("r{id}")));
        commits.push(sim.current_max_lsn().expect("max"));
    }
    // Replica A has redone the first four commits.
    sim.set_redone_through(Some(commits[3]));
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(
        names(&drain(&mut poller).await.unwrap()),
        ["r1", "r2", "r3", "r4"]
    );
    // Failover to replica B, which has redone only two.
    sim.set_redone_through(Some(commits[1]));
    assert!(
        drain(&mut poller).await.unwrap().is_empty(),
        "nothing again"
    );
    // B catches up, then the primary itself.
    sim.set_redone_through(Some(commits[4]));
    assert_eq!(names(&drain(&mut poller).await.unwrap()), ["r5"]);
    sim.set_redone_through(None);
    assert_eq!(names(&drain(&mut poller).await.unwrap()), ["r6"]);
}

#[tokio::test]
async fn cleanup_past_the_switch_point_is_neither_a_gap_nor_a_repeat() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    sim.add_column(
        "dbo.T",
        SimColumn::new("Email", SqlType::VarChar(Length::Bounded(100))),
        Value::Null,
    )
    .unwrap();
    sim.enable_table("dbo.T", Some("dbo_T_v2")).unwrap();
    sim.advance_local_time(chrono::Duration::seconds(1));
    for id in 2..5 {
        sim.transaction()
            .insert(
                "dbo.T",
                vec![Value::Int(id), Value::Text(format!("n{id}")), Value::Null],
            )
            .commit()
            .unwrap();
    }
    assert_eq!(
        names(&drain(&mut poller).await.unwrap()),
        ["n2", "n3", "n4"]
    );
    let position = poller.position().clone();
    assert!(
        position.switches.contains_key("dbo_T"),
        "the switch is remembered"
    );
    // Days later the cleanup job raises both instances' start_lsn past the switch
    // (its low water mark is a cdc.lsn_time_mapping row the poller has passed).
    let marker = sim.idle_marker();
    assert!(drain(&mut poller).await.unwrap().is_empty());
    let position = poller.position().clone();
    sim.cleanup(marker);
    assert_eq!(sim.start_lsn("dbo_T"), sim.start_lsn("dbo_T_v2"));
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(5), Value::Text("n5".into()), Value::Null],
        )
        .commit()
        .unwrap();
    for poller in [
        &mut poller,
        &mut Poller::new(sim.clone(), config(), Some(position)),
    ] {
        let changes = drain(poller).await.expect("no false gap");
        assert_eq!(
            names(&changes),
            ["n5"],
            "delivered once, by the newer instance"
        );
        assert_eq!(changes[0].table.columns().len(), 3);
    }
}

#[tokio::test]
async fn a_catalog_change_that_never_settles_stops_the_run() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    let mut poller = Poller::new(sim.clone(), config(), None);
    for _ in 0..5 {
        sim.inject_fault(SourceError::CatalogChanged {
            message: "Invalid column name 'x' (error 207)".into(),
        });
    }
    let mut errors = Vec::new();
    for _ in 0..5 {
        errors.push(poller.poll().await.unwrap_err());
    }
    assert!(
        errors[..4].iter().all(SourceError::is_transient),
        "{errors:?}"
    );
    assert!(!errors[4].is_transient(), "{}", errors[4]);
    assert!(errors[4].to_string().contains("error 207"), "{}", errors[4]);
    // One success resets the count.
    assert_eq!(names(&drain(&mut poller).await.unwrap()), ["a"]);
}

#[tokio::test]
async fn a_table_invisible_for_a_while_keeps_its_position() {
    let sim = database();
    sim.create_table(
        "dbo",
        "U",
        vec![SimColumn::new("Id", SqlType::Int)],
        &["Id"],
    );
    sim.enable_table("dbo.T", None).unwrap();
    sim.enable_table("dbo.U", None).unwrap();
    insert(&sim, "dbo.T", row(1, "a"));
    // An exclude pattern: the filter cannot tell whether an invisible table is wanted.
    let config = PollerConfig {
        filter: TableFilter::new(vec![], vec!["dbo.tmp_*".into()]),
        ..config()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    sim.hide_table("dbo.T");
    insert(&sim, "dbo.U", vec![Value::Int(1)]);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
    assert!(
        poller.position().instances.contains_key("dbo_T"),
        "the invisible table's position is kept"
    );
    sim.show_table("dbo.T");
    insert(&sim, "dbo.T", row(2, "b"));
    assert_eq!(
        names(&drain(&mut poller).await.unwrap()),
        ["b"],
        "no repeat of a"
    );
}

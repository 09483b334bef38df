//! Schema changes on captured tables as the CDC simulator models them (issue
//! "Schema evolution end to end", simulator first): what SQL Server does on
//! `ALTER TABLE`, `sp_rename` and `sys.sp_cdc_enable_table` / `disable_table`, with
//! the errors a login meets. The simulator's `ddl` module cites the pages.

use std::time::Duration;

use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::event::{Change, Value};
use mssql_ces::source::CdcReads;
use mssql_ces::source::poller::{Poller, PollerConfig};

/// `dbo.T (Id int PRIMARY KEY, Name nvarchar(50))`, not yet enabled.
fn database() -> CdcSimulator {
    crate::common::shop_with_t(0)
}

fn config() -> PollerConfig {
    PollerConfig {
        catalog_refresh: Duration::ZERO,
        unreadable_grace: Duration::ZERO,
        ..PollerConfig::default()
    }
}

async fn drain(poller: &mut Poller<CdcSimulator>) -> Vec<Change> {
    crate::common::drain(poller).await.expect("poll")
}

#[test]
fn enabling_and_disabling_fail_with_sql_servers_errors() {
    let sim = database();
    assert_eq!(sim.enable_table("dbo.T", None).unwrap(), "dbo_T");
    let reused = sim.enable_table("dbo.T", None).unwrap_err();
    assert_eq!(reused.number, 22926, "{reused}");
    assert!(reused.message.contains("'dbo_T' already exists"));
    sim.enable_table("dbo.T", Some("dbo_T_v2")).unwrap();
    let third = sim.enable_table("dbo.T", Some("dbo_T_v3")).unwrap_err();
    assert_eq!(third.number, 22962, "{third}");
    assert!(third.message.contains("'dbo.T'"), "{third}");
    let missing = sim.enable_table("dbo.Nope", None).unwrap_err();
    assert_eq!(missing.number, 22931, "{missing}");
    // A login that is not db_owner may do neither.
    sim.set_db_owner(false);
    let denied = sim.try_disable_instance("dbo_T").unwrap_err();
    assert_eq!(denied.number, 22904, "{denied}");
    sim.set_db_owner(true);
    sim.try_disable_instance("dbo_T").unwrap();
    sim.set_db_owner(false);
    assert_eq!(
        sim.enable_table("dbo.T", Some("dbo_T_v3"))
            .unwrap_err()
            .number,
        22904
    );
}

#[tokio::test]
async fn a_column_added_to_the_table_is_not_captured_by_its_instance() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    sim.set_capture_job_manual(true);
    sim.add_column(
        "dbo.T",
        SimColumn::new("Email", SqlType::NVarChar(Length::Bounded(80))),
        Value::Null,
    )
    .unwrap();
    // cdc.ddl_history gets its row when the capture job reaches the DDL.
    let mut source = sim.clone();
    assert!(source.ddl_history("dbo_T").await.unwrap().is_empty());
    sim.run_capture_job();
    let ddl = source.ddl_history("dbo_T").await.unwrap();
    assert_eq!(ddl.len(), 1);
    assert!(ddl[0].ddl_command.contains("ADD [Email]"), "{ddl:?}");
    sim.set_capture_job_manual(false);
    sim.transaction()
        .insert(
            "dbo.T",
            vec![
                Value::Int(1),
                Value::Text("a".into()),
                Value::Text("a@example.com".into()),
            ],
        )
        .commit()
        .unwrap();
    // The instance keeps its column list, and so do the events.
    let catalog = source.catalog().await.unwrap();
    let names: Vec<&str> = catalog.instances[0]
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["Id", "Name"]);
    let mut poller = Poller::new(sim, config(), None);
    let changes = drain(&mut poller).await;
    assert_eq!(changes.len(), 1);
    let columns: Vec<&str> = changes[0]
        .table
        .columns()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Id", "Name"]);
}

#[tokio::test]
async fn a_renamed_table_keeps_its_capture_instance_and_is_named_anew() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    let insert = |sim: &CdcSimulator, table: &str, id: i32| {
        sim.transaction()
            .insert(table, vec![Value::Int(id), Value::Text("x".into())])
            .commit()
            .unwrap();
    };
    insert(&sim, "dbo.T", 1);
    let mut poller = Poller::new(sim.clone(), config(), None);
    let before = drain(&mut poller).await;
    assert_eq!(before[0].table.table(), "T");
    sim.rename_table("dbo.T", "Customers").unwrap();
    insert(&sim, "dbo.Customers", 2);
    let after = drain(&mut poller).await;
    assert_eq!(after.len(), 1, "the rename loses nothing");
    assert_eq!(after[0].table.table(), "Customers");
    let mut source = sim.clone();
    let catalog = source.catalog().await.unwrap();
    assert_eq!(
        catalog.instances[0].name, "dbo_T",
        "the instance keeps its name"
    );
    assert_eq!(catalog.instances[0].table, "Customers");
}

#[test]
fn a_captured_column_cannot_be_renamed_an_uncaptured_one_can() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1), Value::Text("x".into())])
        .commit()
        .unwrap();
    let err = sim.rename_column("dbo.T", "Name", "FullName").unwrap_err();
    assert_eq!(err.number, 4928, "{err}");
    sim.add_column(
        "dbo.T",
        SimColumn::new("Note", SqlType::NVarChar(Length::Bounded(10))),
        Value::Null,
    )
    .unwrap();
    sim.rename_column("dbo.T", "Note", "Remark").unwrap();
    let columns: Vec<String> = sim.table_contents("dbo.T")[0]
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    assert_eq!(columns, ["Id", "Name", "Remark"]);
    // With no instance capturing it, the captured column can be renamed too.
    sim.disable_instance("dbo_T");
    sim.rename_column("dbo.T", "Name", "FullName").unwrap();
}

/// The documented way to capture a new column (a second capture instance, then the
/// first disabled), and a captured column dropped: the table's version grows at the
/// first event of each new shape, once, and a restart keeps the numbering.
#[tokio::test]
async fn table_versions_grow_at_the_first_event_of_each_new_shape() {
    let sim = database();
    sim.enable_table("dbo.T", None).unwrap();
    let text = |s: &str| Value::Text(s.into());
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1), text("a")])
        .commit()
        .unwrap();
    let mut poller = Poller::new(sim.clone(), config(), None);
    assert_eq!(drain(&mut poller).await.len(), 1);
    let version = |p: &Poller<CdcSimulator>| p.position().table_versions["dbo.T"].version;
    assert_eq!(version(&poller), 1);
    // A column added and captured by a new instance.
    sim.add_column(
        "dbo.T",
        SimColumn::new("Email", SqlType::NVarChar(Length::Bounded(80))),
        Value::Null,
    )
    .unwrap();
    sim.enable_table("dbo.T", Some("dbo_T_v2")).unwrap();
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(2), text("b"), text("b@example.com")],
        )
        .commit()
        .unwrap();
    sim.disable_instance("dbo_T");
    let changes = drain(&mut poller).await;
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].table.columns().len(), 3);
    assert_eq!(version(&poller), 2);
    let second_shape = poller.position().clone();
    // A captured column dropped: left out of the events from then on.
    sim.drop_column("dbo.T", "Email").unwrap();
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(3), text("c")])
        .commit()
        .unwrap();
    let changes = drain(&mut poller).await;
    assert_eq!(changes[0].table.columns().len(), 2);
    assert_eq!(version(&poller), 3);
    // Nothing new: no new version.
    assert!(drain(&mut poller).await.is_empty());
    assert_eq!(version(&poller), 3);
    // A restart from the checkpoint before the drop numbers the change after it the
    // same way.
    let mut restarted = Poller::new(sim.clone(), config(), Some(second_shape));
    assert_eq!(drain(&mut restarted).await.len(), 1);
    assert_eq!(version(&restarted), 3);
    assert_eq!(
        restarted.position().table_versions,
        poller.position().table_versions
    );
}

fn columns(change: &Change) -> Vec<(String, u32)> {
    change
        .table
        .columns()
        .iter()
        .map(|c| (c.name.clone(), c.index))
        .collect()
}

/// `DROP COLUMN` leaves the change table as it was: rows committed before the drop
/// keep the column's values, and the events of those rows carry them, at the
/// position the column had, though the stream reads them after the drop. Rows
/// after it leave the column out, and the columns after it move up. The cut is the
/// drop's LSN in `cdc.ddl_history`; before the capture job has recorded it, every
/// row it has written precedes the drop.
#[tokio::test]
async fn rows_committed_before_a_drop_keep_the_dropped_columns_values() {
    let sim = CdcSimulator::new("Shop", uuid::Uuid::from_u128(7), 0);
    sim.create_table(
        "dbo",
        "W",
        vec![
            SimColumn::new("Id", SqlType::Int),
            SimColumn::new("A", SqlType::NVarChar(Length::Bounded(10))),
            SimColumn::new("B", SqlType::NVarChar(Length::Bounded(10))),
            SimColumn::new("C", SqlType::NVarChar(Length::Bounded(10))),
        ],
        &["Id"],
    );
    sim.enable_table("dbo.W", None).unwrap();
    let text = |s: &str| Value::Text(s.into());
    let row = |id, values: &[&str]| {
        let mut row = vec![Value::Int(id)];
        row.extend(values.iter().map(|v| text(v)));
        row
    };
    sim.transaction()
        .insert("dbo.W", row(1, &["a1", "b1", "c1"]))
        .commit()
        .unwrap();
    // The capture job reaches row 1, not yet the drops after it.
    sim.set_capture_job_manual(true);
    sim.drop_column("dbo.W", "A").unwrap();
    let mut poller = Poller::new(sim.clone(), config(), None);
    let changes = drain(&mut poller).await;
    assert_eq!(changes.len(), 1);
    assert_eq!(
        columns(&changes[0]),
        [
            ("Id".into(), 0),
            ("A".into(), 1),
            ("B".into(), 2),
            ("C".into(), 3)
        ],
        "the drop is not recorded yet: row 1 has every column"
    );
    assert_eq!(
        changes[0].current.as_deref(),
        Some(&row(1, &["a1", "b1", "c1"])[..])
    );

    sim.transaction()
        .insert("dbo.W", row(2, &["b2", "c2"]))
        .commit()
        .unwrap();
    sim.drop_column("dbo.W", "B").unwrap();
    sim.transaction()
        .insert("dbo.W", row(3, &["c3"]))
        .commit()
        .unwrap();
    sim.run_capture_job();
    let changes = drain(&mut poller).await;
    let got: Vec<_> = changes
        .iter()
        .map(|c| (columns(c), c.current.clone().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            (
                vec![("Id".into(), 0), ("B".into(), 1), ("C".into(), 2)],
                row(2, &["b2", "c2"])
            ),
            (vec![("Id".into(), 0), ("C".into(), 1)], row(3, &["c3"])),
        ],
        "row 2 was committed after A's drop and before B's"
    );
    // A stream that reads all three after both drops gives the same events.
    let mut again = Poller::new(sim.clone(), config(), None);
    let all = drain(&mut again).await;
    assert_eq!(all.len(), 3);
    assert_eq!(columns(&all[0]).len(), 4);
    assert_eq!(
        all[0].current.as_deref(),
        Some(&row(1, &["a1", "b1", "c1"])[..])
    );
    for (first, second) in all[1..].iter().zip(&changes) {
        assert_eq!(columns(first), columns(second));
        assert_eq!(first.current, second.current);
    }
    assert_eq!(
        again.position().table_versions["dbo.W"].version,
        3,
        "three shapes, in LSN order"
    );
}

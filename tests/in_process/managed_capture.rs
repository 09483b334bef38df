//! Capture instances that manage themselves (`source.capture_instances = "managed"`)
//! and `source.enable_cdc`, against the CDC simulator: a column added is captured by
//! a new instance with the old one's options, the old one is disabled only once its
//! changes are checkpointed, never a third instance, the permission is checked first,
//! and — randomized, with restarts at random points — a table whose columns are
//! added, dropped and retyped while it is written streams without loss.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::Item;
use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::event::{Operation, Value};
use mssql_ces::position::Position;
use mssql_ces::source::poller::{CaptureInstanceMode, Poller, PollerConfig};
use mssql_ces::source::{CaptureOptions, CdcReads, SourceError};
use tokio::sync::watch;

fn config() -> PollerConfig {
    PollerConfig {
        catalog_refresh: Duration::ZERO,
        unreadable_grace: Duration::ZERO,
        schema_changes: true,
        capture_instances: CaptureInstanceMode::Managed,
        batch_size: 7,
        ..PollerConfig::default()
    }
}

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

/// `dbo.T (Id int PRIMARY KEY, Name nvarchar(50))`, enabled with a gating role, a
/// filegroup and net changes.
fn database() -> CdcSimulator {
    let sim = crate::common::shop_with_t(0);
    sim.enable_table_with("dbo.T", None, &options(), None)
        .expect("enable");
    sim.set_role_member("cdc_reader", true);
    sim
}

/// `ALTER TABLE dbo.T ADD <name> nvarchar(80) NULL`.
fn add_column(sim: &CdcSimulator, name: &str) {
    sim.add_column(
        "dbo.T",
        SimColumn::new(name, SqlType::NVarChar(Length::Bounded(80))),
        Value::Null,
    )
    .expect("add column");
}

fn options() -> CaptureOptions {
    CaptureOptions {
        role_name: Some("cdc_reader".into()),
        index_name: None,
        filegroup_name: Some("CDC".into()),
        supports_net_changes: true,
        allow_partition_switch: Some(false),
    }
}

/// Polls until idle; every event in order.
async fn drain(poller: &mut Poller<CdcSimulator>) -> Result<Vec<Item>, SourceError> {
    crate::common::drain_items(poller).await
}

fn instance_names(sim: &CdcSimulator) -> Vec<String> {
    let mut source = sim.clone();
    let catalog = futures_util::FutureExt::now_or_never(source.catalog())
        .expect("the simulator answers at once")
        .expect("catalog");
    catalog.instances.into_iter().map(|i| i.name).collect()
}

fn ids(items: &[Item]) -> Vec<i64> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Change(c) => match c.key_values().next() {
                Some((_, Value::Int(id))) => Some(i64::from(*id)),
                _ => None,
            },
            Item::Schema(_) => None,
        })
        .collect()
}

#[tokio::test]
async fn an_added_column_gets_a_new_instance_and_the_old_one_goes_once_checkpointed() {
    let sim = database();
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1), text("a")])
        .commit()
        .expect("commit");
    let (checkpoint, checkpoints) = watch::channel(None::<Position>);
    let mut poller = Poller::new(sim.clone(), config(), None);
    poller.watch_checkpoints(checkpoints);
    assert_eq!(ids(&drain(&mut poller).await.expect("poll")), [1]);

    add_column(&sim, "Email");
    // Written before the new instance exists: captured by the old one, without Email.
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(2), text("b"), text("early@example.com")],
        )
        .commit()
        .expect("commit");
    let items = drain(&mut poller).await.expect("poll");
    assert_eq!(ids(&items), [2]);
    assert_eq!(
        instance_names(&sim),
        ["dbo_T", "dbo_T_v2"],
        "created, old kept"
    );
    let mut source = sim.clone();
    let catalog = source.catalog().await.expect("catalog");
    let new = &catalog.instances[1];
    assert_eq!(new.options, options(), "the old instance's options");
    let captured: Vec<&str> = new.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(captured, ["Id", "Name", "Email"]);
    assert_eq!(poller.capture_actions().created, 1);

    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(3), text("c"), text("c@example.com")],
        )
        .commit()
        .expect("commit");
    let items = drain(&mut poller).await.expect("poll");
    let [Item::Schema(schema), Item::Change(change)] = items.as_slice() else {
        panic!("a schema change, then the row");
    };
    assert_eq!(schema.after.capture_instance, "dbo_T_v2");
    assert_eq!(schema.version, 2);
    assert!(
        schema.ddl.iter().any(|d| d.command.contains("ADD [Email]")),
        "the DDL from the old instance's history: {:?}",
        schema.ddl
    );
    assert_eq!(
        change.current.as_ref().expect("row")[2],
        text("c@example.com")
    );
    // Not checkpointed: the old instance stays, however often the catalog is read.
    for _ in 0..3 {
        assert!(drain(&mut poller).await.expect("poll").is_empty());
    }
    assert_eq!(instance_names(&sim).len(), 2);
    // Checkpointed up to before the switch only: still kept.
    let mut early = poller.position().clone();
    early
        .instances
        .insert("dbo_T".into(), mssql_ces::lsn::Lsn::ZERO);
    checkpoint.send_replace(Some(early));
    drain(&mut poller).await.expect("poll");
    assert_eq!(instance_names(&sim).len(), 2);
    checkpoint.send_replace(Some(poller.position().clone()));
    assert!(drain(&mut poller).await.expect("poll").is_empty());
    assert_eq!(instance_names(&sim), ["dbo_T_v2"]);
    assert_eq!(poller.capture_actions().disabled, 1);
    // And the stream goes on from the new instance alone.
    sim.transaction()
        .update(
            "dbo.T",
            vec![Value::Int(2)],
            vec![("Email", text("b@example.com"))],
        )
        .commit()
        .expect("commit");
    let items = drain(&mut poller).await.expect("poll");
    assert_eq!(ids(&items), [2]);
}

/// Killed right after creating the new instance, before anything after it was
/// checkpointed: the next process starts from the old checkpoint, finds two
/// instances, creates no third, reads the old one up to the switch and the new one
/// from it — each change once — and retires the old one once that is checkpointed.
#[tokio::test]
async fn a_crash_after_the_create_resumes_from_the_checkpoint_without_loss_or_a_third() {
    let sim = database();
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1), text("a")])
        .commit()
        .expect("commit");
    let mut first = Poller::new(sim.clone(), config(), None);
    drain(&mut first).await.expect("poll");
    let checkpoint = first.position().clone();
    add_column(&sim, "Email");
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(2), text("b"), text("lost?")])
        .commit()
        .expect("commit");
    // The first process reads the catalog, creates the instance, and dies before
    // its next checkpoint.
    let _ = first.poll().await.expect("poll");
    drop(first);
    assert_eq!(instance_names(&sim), ["dbo_T", "dbo_T_v2"]);
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(3), text("c"), text("c@example.com")],
        )
        .commit()
        .expect("commit");
    let (written, checkpoints) = watch::channel(None::<Position>);
    let mut second = Poller::new(sim.clone(), config(), Some(checkpoint));
    second.watch_checkpoints(checkpoints);
    let items = drain(&mut second).await.expect("poll");
    assert_eq!(ids(&items), [2, 3], "each change once, none lost");
    assert_eq!(second.capture_actions().created, 0, "no third instance");
    assert_eq!(instance_names(&sim), ["dbo_T", "dbo_T_v2"]);
    written.send_replace(Some(second.position().clone()));
    drain(&mut second).await.expect("poll");
    assert_eq!(instance_names(&sim), ["dbo_T_v2"]);
    // Killed after the disable, before another checkpoint: the next process starts
    // from the one that allowed the disable (it knows the gone instance), re-sends
    // nothing of it and goes on with the new one.
    let durable = written.borrow().clone();
    let mut third = Poller::new(sim.clone(), config(), durable);
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(4), text("d"), text("d@example.com")],
        )
        .commit()
        .expect("commit");
    let items = drain(&mut third).await.expect("poll");
    assert_eq!(ids(&items), [4]);
    assert_eq!(
        third.capture_actions(),
        Default::default(),
        "nothing more to do"
    );
}

#[tokio::test]
async fn a_dropped_column_gets_an_instance_without_it_and_two_instances_wait() {
    let sim = database();
    add_column(&sim, "Note");
    // A DBA's second instance, with the new column: managed mode creates no third.
    sim.enable_table("dbo.T", Some("dbo_T_dba"))
        .expect("second");
    sim.drop_column("dbo.T", "Name").expect("drop");
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1), text("n")])
        .commit()
        .expect("commit");
    let (checkpoint, checkpoints) = watch::channel(None::<Position>);
    let mut poller = Poller::new(sim.clone(), config(), None);
    poller.watch_checkpoints(checkpoints);
    drain(&mut poller).await.expect("poll");
    assert_eq!(instance_names(&sim), ["dbo_T", "dbo_T_dba"]);
    assert_eq!(poller.capture_actions().created, 0);
    checkpoint.send_replace(Some(poller.position().clone()));
    drain(&mut poller).await.expect("poll");
    // The drained older one goes; then the one left, which lost Name, is replaced
    // by one without it.
    assert_eq!(instance_names(&sim), ["dbo_T_dba", "dbo_T_dba_v2"]);
    let actions = poller.capture_actions();
    assert_eq!((actions.created, actions.disabled), (1, 1));
    // Kept, though nothing of it is left to deliver, until the schema-change event
    // of the newer one (at its first row) is checkpointed.
    checkpoint.send_replace(Some(poller.position().clone()));
    drain(&mut poller).await.expect("poll");
    assert_eq!(instance_names(&sim).len(), 2);
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(2), text("m")])
        .commit()
        .expect("commit");
    let items = drain(&mut poller).await.expect("poll");
    let schema = crate::common::schema_events(&items);
    assert_eq!(
        schema.len(),
        1,
        "the switch is announced, though the columns are the same"
    );
    assert_eq!(schema[0].after.capture_instance, "dbo_T_dba_v2");
    checkpoint.send_replace(Some(poller.position().clone()));
    drain(&mut poller).await.expect("poll");
    assert_eq!(instance_names(&sim), ["dbo_T_dba_v2"]);
    let mut source = sim.clone();
    let catalog = source.catalog().await.expect("catalog");
    let captured: Vec<&str> = catalog.instances[0]
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(captured, ["Id", "Note"]);
}

#[tokio::test]
async fn managed_mode_needs_db_owner_and_says_so_before_doing_anything() {
    let sim = database();
    sim.set_db_owner(false);
    let mut poller = Poller::new(sim.clone(), config(), None);
    let err = drain(&mut poller).await.expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("source.capture_instances = \"managed\"")
            && text.contains("db_owner")
            && text.contains("ALTER ROLE db_owner ADD MEMBER"),
        "{text}"
    );
    assert!(!err.is_transient());
    let mut enabling = Poller::new(
        sim.clone(),
        PollerConfig {
            capture_instances: CaptureInstanceMode::Manual,
            enable_cdc: true,
            ..config()
        },
        None,
    );
    let text = drain(&mut enabling).await.expect_err("refused").to_string();
    assert!(text.contains("source.enable_cdc = true"), "{text}");
}

#[tokio::test]
async fn enable_cdc_enables_included_tables_that_lack_it_and_streams_them() {
    let sim = database();
    for name in ["U", "Skipped"] {
        sim.create_table(
            "dbo",
            name,
            vec![SimColumn::new("Id", SqlType::Int)],
            &["Id"],
        );
    }
    let mut poller = Poller::new(
        sim.clone(),
        PollerConfig {
            capture_instances: CaptureInstanceMode::Manual,
            enable_cdc: true,
            filter: mssql_ces::source::filter::TableFilter::new(
                vec!["dbo.T".into(), "dbo.U".into()],
                Vec::new(),
            ),
            ..config()
        },
        None,
    );
    drain(&mut poller).await.expect("poll");
    assert_eq!(instance_names(&sim), ["dbo_T", "dbo_U"]);
    assert_eq!(poller.capture_actions().tables_enabled, 1);
    sim.transaction()
        .insert("dbo.U", vec![Value::Int(5)])
        .commit()
        .expect("commit");
    assert_eq!(ids(&drain(&mut poller).await.expect("poll")), [5]);
}

/// The table checkpoint store's own table is never enabled or streamed, whatever
/// the patterns: each checkpoint would be a change whose delivery writes another.
#[tokio::test]
async fn the_checkpoint_table_is_never_enabled_or_streamed() {
    let sim = database();
    sim.create_table(
        "dbo",
        "mssql_ces_checkpoint",
        vec![
            SimColumn::new("stream_name", SqlType::NVarChar(Length::Bounded(200))),
            SimColumn::new("position", SqlType::NVarChar(Length::Max)),
        ],
        &["stream_name"],
    );
    let mut poller = Poller::new(
        sim.clone(),
        PollerConfig {
            capture_instances: CaptureInstanceMode::Manual,
            enable_cdc: true,
            filter: mssql_ces::source::filter::TableFilter::new(vec!["dbo.*".into()], Vec::new()),
            ..config()
        },
        None,
    );
    drain(&mut poller).await.expect("poll");
    assert_eq!(
        instance_names(&sim),
        ["dbo_T"],
        "not enabled on the checkpoint table"
    );
    // Enabled by a DBA: still not streamed.
    sim.enable_table("dbo.mssql_ces_checkpoint", None)
        .expect("enable");
    sim.transaction()
        .insert(
            "dbo.mssql_ces_checkpoint",
            vec![Value::Text("s".into()), Value::Text("{}".into())],
        )
        .insert("dbo.T", vec![Value::Int(7), text("b")])
        .commit()
        .expect("commit");
    let changes = drain(&mut poller).await.expect("poll");
    assert_eq!(ids(&changes), [7]);
    let streamed = changes
        .iter()
        .filter(|i| matches!(i, Item::Change(_)))
        .count();
    assert_eq!(streamed, 1, "only dbo.T's row");
}

/// A small deterministic generator (xorshift64*): the test needs no dependency.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What a consumer rebuilds from the stream: per key, the columns of its last event.
#[derive(Default)]
struct Replica {
    rows: BTreeMap<String, BTreeMap<String, Option<String>>>,
    /// Per table version seen, the columns its schema-change event announced.
    columns: Option<Vec<String>>,
    versions: Vec<u64>,
    events: usize,
}

impl Replica {
    fn apply(&mut self, items: Vec<Item>) {
        for item in items {
            match item {
                Item::Schema(s) => {
                    self.columns = Some(s.after.cols.iter().map(|c| c.name.clone()).collect());
                    if self.versions.last().is_none_or(|&v| v < s.version) {
                        self.versions.push(s.version); // not a re-send
                    }
                }
                Item::Change(c) => {
                    self.events += 1;
                    let names: Vec<String> =
                        c.table.columns().iter().map(|c| c.name.clone()).collect();
                    assert_eq!(
                        Some(&names),
                        self.columns.as_ref(),
                        "every event has the columns of the last schema change"
                    );
                    let key = c
                        .key_values()
                        .map(|(_, v)| v.to_text().unwrap_or_default())
                        .collect::<Vec<_>>()
                        .join(",");
                    match c.operation {
                        Operation::Delete => {
                            self.rows.remove(&key);
                        }
                        _ => {
                            let row = names
                                .iter()
                                .cloned()
                                .zip(c.current.unwrap_or_default().iter().map(Value::to_text))
                                .collect();
                            self.rows.insert(key, row);
                        }
                    }
                }
            }
        }
    }
}

/// Columns are added, dropped and retyped (and renaming a captured one is tried and
/// refused) while the table is written, in managed mode; the poller restarts from its last checkpoint at random points, and the
/// checkpoint lags the stream by a random amount. The replica rebuilt from the events
/// equals the table, with every column the table has at the end.
#[tokio::test]
async fn randomized_schema_changes_in_managed_mode_lose_nothing_across_restarts() {
    let steps: u64 = std::env::var("MSSQL_CES_SCHEMA_SOAK_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    for seed in mssql_ces_testkit::test_seeds(&[1, 2, 3]) {
        randomized(seed.0, steps).await;
    }
}

async fn randomized(seed: u64, steps: u64) {
    let mut random = Random(0x9E37_79B9_7F4A_7C15 ^ seed);
    let sim = database();
    let (mut checkpoint, checkpoints) = watch::channel(None::<Position>);
    let mut durable: Option<Position> = None;
    let mut poller = Poller::new(sim.clone(), config(), None);
    poller.watch_checkpoints(checkpoints);
    let mut replica = Replica::default();
    let mut next_id = 0i32;
    let mut next_column = 0;
    // Columns written only once the poller ran after they were added (values written
    // to a column before a capture instance captures it are in no event: CDC's gap).
    let mut writable: Vec<String> = vec!["Name".into()];
    let mut pending_new: Vec<String> = Vec::new();
    let mut row_changes = 0usize;
    let mut restarts = 0;
    for _ in 0..steps {
        match random.below(100) {
            0..=39 => {
                next_id += 1;
                insert_row(&sim, next_id, &writable);
                row_changes += 1;
            }
            40..=64 if next_id > 0 => {
                let id = 1 + random.below(next_id as u64) as i32;
                let Some(column) = writable
                    .get(random.below(writable.len() as u64) as usize)
                    .cloned()
                else {
                    continue;
                };
                let before = sim.table_contents("dbo.T").len();
                let value = text(&format!("u{}", random.below(1000)));
                if sim
                    .transaction()
                    .update("dbo.T", vec![Value::Int(id)], vec![(&column, value)])
                    .commit()
                    .is_ok()
                    && exists(&sim, id)
                {
                    row_changes += 1;
                }
                assert_eq!(before, sim.table_contents("dbo.T").len());
            }
            65..=72 if next_id > 0 => {
                let id = 1 + random.below(next_id as u64) as i32;
                if exists(&sim, id) {
                    sim.transaction()
                        .delete("dbo.T", vec![Value::Int(id)])
                        .commit()
                        .expect("delete");
                    row_changes += 1;
                }
            }
            73..=78 => {
                next_column += 1;
                let name = format!("C{next_column}");
                add_column(&sim, &name);
                pending_new.push(name);
            }
            79..=82 => {
                // Drop a column written so far (never the key).
                if writable.len() > 1 {
                    let at = random.below(writable.len() as u64) as usize;
                    let name = writable.remove(at);
                    sim.drop_column("dbo.T", &name).expect("drop");
                }
            }
            83..=85 => {
                if let Some(name) = writable.get(random.below(writable.len() as u64) as usize) {
                    let length = 40 + random.below(60) as u32;
                    sim.alter_column_type(
                        "dbo.T",
                        name,
                        SqlType::NVarChar(Length::Bounded(length)),
                    )
                    .expect("alter");
                }
            }
            86 => {
                // A captured column cannot be renamed: the stream goes on as it was.
                if let Some(name) = writable.get(random.below(writable.len() as u64) as usize) {
                    let refused = sim
                        .rename_column("dbo.T", name, &format!("{name}_renamed"))
                        .expect_err("a captured column is not renamed");
                    assert_eq!(refused.number, 4928);
                }
            }
            87..=95 => {
                let items = drain(&mut poller).await.expect("poll");
                replica.apply(items);
                // The poller has run: new columns it captures can be written now.
                writable.append(&mut pending_new_captured(&sim, &mut pending_new));
                if random.below(2) == 0 {
                    durable = Some(poller.position().clone());
                    checkpoint.send_replace(durable.clone());
                }
            }
            _ => {
                // Killed: a new process from the checkpoint, which re-sends what
                // followed it.
                restarts += 1;
                // What is re-sent starts in the shape of the checkpoint's version,
                // which the checkpoint describes.
                replica.columns = durable
                    .as_ref()
                    .and_then(|d| d.table_versions.get("dbo.T"))
                    .and_then(|v| v.columns.as_ref())
                    .map(|shape| shape.cols.iter().map(|c| c.name.clone()).collect());
                let (tx, rx) = watch::channel(durable.clone());
                checkpoint = tx;
                poller = Poller::new(sim.clone(), config(), durable.clone());
                poller.watch_checkpoints(rx);
            }
        }
    }
    // Caught up, checkpointed, and the drained instances retired: each round a
    // catalog read may create an instance or retire one.
    for _ in 0..20 {
        let items = drain(&mut poller).await.expect("poll");
        replica.apply(items);
        writable.append(&mut pending_new_captured(&sim, &mut pending_new));
        checkpoint.send_replace(Some(poller.position().clone()));
        let settled = instance_names(&sim).len() == 1
            && replica.columns.as_ref() == Some(&sim.table_columns("dbo.T"));
        if settled {
            break;
        }
        // A shape is announced before its first event: a row written now is one.
        next_id += 1;
        insert_row(&sim, next_id, &[]);
        row_changes += 1;
    }
    let table = sim.table_contents("dbo.T");
    let final_columns = sim.table_columns("dbo.T");
    assert_eq!(
        replica.columns.as_ref().map(Vec::len),
        Some(final_columns.len()),
        "seed {seed}: the stream carries every column the table has: {:?} vs {final_columns:?}",
        replica.columns
    );
    assert_eq!(replica.rows.len(), table.len(), "seed {seed}: rows");
    for row in &table {
        let key = row[0].1.to_text().unwrap_or_default();
        let rebuilt = replica
            .rows
            .get(&key)
            .unwrap_or_else(|| panic!("seed {seed}: row {key} missing"));
        for (column, value) in row {
            assert_eq!(
                rebuilt.get(column).cloned().flatten(),
                value.to_text(),
                "seed {seed}: row {key} column {column}"
            );
        }
    }
    assert!(
        replica.events >= row_changes,
        "seed {seed}: every change is an event ({} events for {row_changes} changes)",
        replica.events
    );
    assert!(
        instance_names(&sim).len() == 1,
        "seed {seed}: one instance left once drained: {:?}",
        instance_names(&sim)
    );
    assert!(replica.versions.windows(2).all(|w| w[0] < w[1]));
    assert!(
        restarts > 0 || steps < 50,
        "seed {seed}: the run was restarted"
    );
}

/// A row `id` of `dbo.T`: a value in each of the `writable` columns, NULL in the rest.
fn insert_row(sim: &CdcSimulator, id: i32, writable: &[String]) {
    let row: Vec<Value> = sim
        .table_columns("dbo.T")
        .iter()
        .map(|name| {
            if name == "Id" {
                Value::Int(id)
            } else if writable.contains(name) {
                text(&format!("{name}{id}"))
            } else {
                Value::Null
            }
        })
        .collect();
    sim.transaction()
        .insert("dbo.T", row)
        .commit()
        .expect("insert");
}

fn exists(sim: &CdcSimulator, id: i32) -> bool {
    sim.table_contents("dbo.T")
        .iter()
        .any(|row| row[0].1 == Value::Int(id))
}

/// The columns of `pending` that the newest capture instance now captures: written
/// from here on.
fn pending_new_captured(sim: &CdcSimulator, pending: &mut Vec<String>) -> Vec<String> {
    let mut source = sim.clone();
    let catalog = futures_util::FutureExt::now_or_never(source.catalog())
        .expect("the simulator answers at once")
        .expect("catalog");
    let Some(newest) = catalog.instances.iter().max_by_key(|i| i.create_date) else {
        return Vec::new();
    };
    let captured: Vec<String> = newest.columns.iter().map(|c| c.name.clone()).collect();
    let (now, later): (Vec<String>, Vec<String>) =
        pending.drain(..).partition(|c| captured.contains(c));
    *pending = later;
    now
}

/// Managed mode costs nothing while no table changes: an idle poll makes the same
/// round trips as in manual mode (the columns are compared only when the catalog's
/// fingerprint moved), and nothing is created while an initial load reads through
/// the instances as they are.
#[tokio::test]
async fn managed_mode_is_free_when_idle_and_waits_for_the_initial_load() {
    let idle_trips = |mode: CaptureInstanceMode| async move {
        let sim = database();
        let mut poller = Poller::new(
            sim.clone(),
            PollerConfig {
                capture_instances: mode,
                ..config()
            },
            None,
        );
        drain(&mut poller).await.expect("poll");
        let before = sim.round_trips();
        for _ in 0..5 {
            drain(&mut poller).await.expect("poll");
        }
        sim.round_trips() - before
    };
    assert_eq!(
        idle_trips(CaptureInstanceMode::Managed).await,
        idle_trips(CaptureInstanceMode::Manual).await
    );

    let sim = database();
    for id in 1..=20 {
        sim.transaction()
            .insert("dbo.T", vec![Value::Int(id), text("x")])
            .commit()
            .expect("commit");
    }
    let mut poller = Poller::new(
        sim.clone(),
        PollerConfig {
            snapshot: mssql_ces::source::initial_load::SnapshotMode::Initial,
            load_chunk: 5,
            ..config()
        },
        None,
    );
    // The load plans and reads its first chunk; then a column is added.
    for _ in 0..2 {
        poller.poll().await.expect("poll");
    }
    assert!(!poller.position().loads.is_empty(), "the load is under way");
    add_column(&sim, "Email");
    poller.poll().await.expect("poll");
    assert_eq!(instance_names(&sim), ["dbo_T"], "not during the load");
    drain(&mut poller).await.expect("poll");
    assert_eq!(
        instance_names(&sim),
        ["dbo_T", "dbo_T_v2"],
        "once it is done"
    );
}

/// A table `enable_cdc` cannot enable (here its default instance name is another
/// table's) is warned about and left out; the stream goes on.
#[tokio::test]
async fn a_table_enable_cdc_cannot_enable_is_left_out_and_the_stream_goes_on() {
    let sim = crate::common::shop_with_t(0);
    sim.create_table(
        "dbo",
        "U",
        vec![SimColumn::new("Id", SqlType::Int)],
        &["Id"],
    );
    sim.enable_table("dbo.T", Some("dbo_U"))
        .expect("enable T as dbo_U");
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1), text("a")])
        .commit()
        .expect("commit");
    let mut poller = Poller::new(
        sim.clone(),
        PollerConfig {
            capture_instances: CaptureInstanceMode::Manual,
            enable_cdc: true,
            ..config()
        },
        None,
    );
    let items = drain(&mut poller).await.expect("the stream goes on");
    assert_eq!(ids(&items), [1]);
    assert_eq!(instance_names(&sim), ["dbo_U"]);
    assert_eq!(poller.capture_actions().tables_enabled, 0);
}

/// `dbo.T` with a row streamed, then a column added while an application
/// transaction holds the table's locks, and a row written: the poller, and what it
/// delivered of that row.
async fn added_while_locked(retry: Duration) -> (CdcSimulator, Poller<CdcSimulator>, Vec<Item>) {
    let sim = database();
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1), text("a")])
        .commit()
        .expect("commit");
    let config = PollerConfig {
        capture_ddl_retry: retry,
        ..config()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    assert_eq!(ids(&drain(&mut poller).await.expect("poll")), [1]);
    sim.hold_write_lock("dbo.T", true);
    add_column(&sim, "Email");
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(2), text("b"), text("b@example.com")],
        )
        .commit()
        .expect("commit");
    let items = drain(&mut poller)
        .await
        .expect("a procedure that gave up on a lock does not stop the stream");
    (sim, poller, items)
}

/// Row 3 (with its email) written and streamed.
async fn write_row_3(sim: &CdcSimulator, poller: &mut Poller<CdcSimulator>) {
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(3), text("c"), text("c@example.com")],
        )
        .commit()
        .expect("commit");
    assert_eq!(ids(&drain(poller).await.expect("poll")), [3]);
}

/// `sys.sp_cdc_enable_table` runs with a short lock timeout: on a table an open
/// transaction holds it gives up (1222) instead of holding every later writer in
/// its queue; the stream goes on with the old instance, and no procedure runs
/// again until the backoff has passed.
#[tokio::test]
async fn a_table_locked_by_a_writer_defers_the_new_instance_and_the_stream_goes_on() {
    let (sim, mut poller, items) = added_while_locked(Duration::from_secs(3600)).await;
    assert_eq!(ids(&items), [2], "streamed by the old instance");
    assert_eq!(instance_names(&sim), ["dbo_T"], "nothing created");
    assert_eq!(sim.capture_ddl_calls(), 1);
    write_row_3(&sim, &mut poller).await;
    assert_eq!(
        sim.capture_ddl_calls(),
        1,
        "not called again within the backoff"
    );
    assert_eq!(poller.capture_actions().created, 0);
}

/// Once the backoff has passed and the transaction has ended, the step is
/// decided again from the catalog and the new instance is created.
#[tokio::test]
async fn a_deferred_instance_is_created_once_the_lock_is_released() {
    let (sim, mut poller, items) = added_while_locked(Duration::ZERO).await;
    assert_eq!(ids(&items), [2]);
    assert_eq!(instance_names(&sim), ["dbo_T"]);
    sim.hold_write_lock("dbo.T", false);
    // The transaction that held the lock commits its row.
    write_row_3(&sim, &mut poller).await;
    assert_eq!(instance_names(&sim), ["dbo_T", "dbo_T_v2"]);
    assert_eq!(poller.capture_actions().created, 1);
}

/// The captured columns of the table's capture instances, newest last.
async fn captured_columns(sim: &CdcSimulator) -> Vec<(String, Vec<String>)> {
    let mut source = sim.clone();
    let catalog = source.catalog().await.expect("catalog");
    catalog
        .instances
        .into_iter()
        .map(|i| (i.name, i.columns.into_iter().map(|c| c.name).collect()))
        .collect()
}

/// A column dropped and added again under its name is another column
/// (`sys.columns.column_id` is never given twice), and the capture job writes the
/// two statements to `cdc.ddl_history` as it reaches them in the log. A catalog
/// read between the two records sees the name uncaptured with no `ADD` naming it
/// yet: the new instance waits until the capture job has recorded every DDL the
/// catalog showed, and then captures the column.
#[tokio::test]
async fn a_column_dropped_and_added_again_between_the_capture_jobs_records_is_captured() {
    let sim = database();
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1), text("a")])
        .commit()
        .expect("commit");
    let (checkpoint, checkpoints) = watch::channel(None::<Position>);
    let mut poller = Poller::new(sim.clone(), config(), None);
    poller.watch_checkpoints(checkpoints);
    assert_eq!(ids(&drain(&mut poller).await.expect("poll")), [1]);

    sim.set_capture_job_manual(true);
    sim.drop_column("dbo.T", "Name").expect("drop");
    sim.add_column(
        "dbo.T",
        SimColumn::new("Name", SqlType::BigInt),
        Value::Null,
    )
    .expect("add");
    sim.run_capture_job_for(1); // the DROP, not yet the ADD
    drain(&mut poller).await.expect("poll");
    assert_eq!(
        instance_names(&sim),
        ["dbo_T"],
        "nothing decided before the capture job has recorded the DDL the catalog shows"
    );

    sim.set_capture_job_manual(false);
    sim.run_capture_job();
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(2), Value::BigInt(20)])
        .commit()
        .expect("commit");
    drain(&mut poller).await.expect("poll");
    assert_eq!(
        captured_columns(&sim).await.last(),
        Some(&(
            "dbo_T_v2".to_owned(),
            vec!["Id".to_owned(), "Name".to_owned()]
        ))
    );
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(3), Value::BigInt(30)])
        .commit()
        .expect("commit");
    let items = drain(&mut poller).await.expect("poll");
    let [Item::Schema(_), Item::Change(row)] = items.as_slice() else {
        panic!("the switch announced, then row 3: {items:?}");
    };
    assert_eq!(
        row.current.as_deref(),
        Some(&[Value::Int(3), Value::BigInt(30)][..])
    );
    checkpoint.send_replace(Some(poller.position().clone()));
    drain(&mut poller).await.expect("poll");
    assert_eq!(instance_names(&sim), ["dbo_T_v2"], "the old one retired");
}

/// A column left out of the instance on purpose (`@captured_column_list`) is never
/// named by an `ADD`: the new instance for an added column waits only until the
/// capture job has passed the catalog read, and leaves it out.
#[tokio::test]
async fn a_column_left_out_on_purpose_waits_for_the_capture_job_then_stays_out() {
    let sim = crate::common::shop_with_t(0);
    sim.add_column(
        "dbo.T",
        SimColumn::new("Secret", SqlType::NVarChar(Length::Bounded(80))),
        Value::Null,
    )
    .expect("add");
    sim.enable_table_with(
        "dbo.T",
        None,
        &options(),
        Some(&["Id".to_owned(), "Name".to_owned()]),
    )
    .expect("enable");
    sim.set_role_member("cdc_reader", true);
    let mut poller = Poller::new(sim.clone(), config(), None);
    drain(&mut poller).await.expect("poll");
    add_column(&sim, "Email");
    drain(&mut poller).await.expect("poll");
    assert_eq!(
        instance_names(&sim),
        ["dbo_T"],
        "the capture job has not passed the catalog read yet"
    );
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(1), text("a"), text("s"), text("e")],
        )
        .commit()
        .expect("commit");
    drain(&mut poller).await.expect("poll");
    assert_eq!(
        captured_columns(&sim).await.last(),
        Some(&(
            "dbo_T_v2".to_owned(),
            vec!["Id".to_owned(), "Name".to_owned(), "Email".to_owned()]
        ))
    );
    assert_eq!(poller.capture_actions().created, 1);
}

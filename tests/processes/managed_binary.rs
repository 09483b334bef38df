//! Schema changes through the real binary and the TDS stand-in (a test double
//! following [MS-TDS], serving the CDC simulator): managed capture instances and
//! inline schema-change events, every statement through tiberius — the db_owner
//! check, the uncaptured columns, `sys.sp_cdc_enable_table`, `sys.sp_cdc_disable_table`
//! — also when the process is killed at random moments while columns change.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::Value;
use mssql_ces::event::schema_change::SCHEMA_CHANGE_TYPE;
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::source::CdcReads;
use support::tds::StandIn;
use support::temp_dir;

use crate::harness::{self, ConfigFile, Moments, STANDIN_SOURCE, spawn_logged};
use crate::standin_binary::{PASSWORD, USER};

/// `dbo.T (Id int PRIMARY KEY, Name nvarchar(50))`, enabled, one row, served by a
/// stand-in.
pub(crate) async fn served() -> (CdcSimulator, StandIn) {
    let sim = CdcSimulator::new("Shop", uuid::Uuid::from_u128(7), 0);
    sim.create_table(
        "dbo",
        "T",
        vec![
            SimColumn::new("Id", SqlType::Int),
            SimColumn::new("Name", SqlType::NVarChar(Length::Bounded(50))),
        ],
        &["Id"],
    );
    sim.enable_table("dbo.T", None).expect("enable");
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1), text("a")])
        .commit()
        .expect("commit");
    let standin = StandIn::start(USER, PASSWORD, support::tds_cdc::handler(sim.clone()))
        .await
        .expect("stand-in");
    (sim, standin)
}

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

/// Managed mode, inline schema-change events, to `dir/events.jsonl`.
fn config(dir: &Path) -> PathBuf {
    ConfigFile::new()
        .set("source", STANDIN_SOURCE)
        .set(
            "source",
            "poll_interval_ms = 20\ncatalog_refresh_ms = 0\ncapture_instances = \"managed\"",
        )
        .file_sink(&dir.join("events.jsonl"))
        .set("sink", "schema_changes = \"inline\"")
        .file_checkpoint(&dir.join("cp.json"), 20)
        .write(dir)
}

/// A run until idle, which must succeed.
async fn run_until_idle(config: &Path, standin: &StandIn, dir: &Path, name: &str) {
    let run = crate::standin_binary::command(config, standin, &["run", "--until-idle"]);
    let status = harness::run_logged(run, dir, name, "the managed run").await;
    assert!(status.success(), "{name} failed; logs in {}", dir.display());
}

fn instance_names(sim: &CdcSimulator) -> Vec<String> {
    let mut source = sim.clone();
    futures_util::FutureExt::now_or_never(source.catalog())
        .expect("at once")
        .expect("catalog")
        .instances
        .into_iter()
        .map(|i| i.name)
        .collect()
}

/// Each line of the output: its `type` and its `data` as JSON.
fn events(dir: &Path) -> Vec<(String, serde_json::Value)> {
    std::fs::read_to_string(dir.join("events.jsonl"))
        .expect("output")
        .lines()
        .map(|l| {
            let line: serde_json::Value = serde_json::from_str(l).expect("json");
            let data = serde_json::from_str(line["data"].as_str().expect("data")).expect("data");
            (line["type"].as_str().expect("type").to_owned(), data)
        })
        .collect()
}

/// `ALTER TABLE … ADD` on a streamed table: the next run creates a capture instance
/// for it, and the file gets a schema-change event and then a row carrying the new
/// column; a later run retires the old instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_column_in_managed_mode_yields_a_schema_change_then_rows_with_it() {
    let (sim, standin) = served().await;
    let dir = temp_dir("standin-managed");
    let config = config(&dir);
    run_until_idle(&config, &standin, &dir, "run-1").await;
    sim.add_column(
        "dbo.T",
        SimColumn::new("Email", SqlType::NVarChar(Length::Bounded(80))),
        Value::Null,
    )
    .expect("add column");
    run_until_idle(&config, &standin, &dir, "run-2").await;
    assert_eq!(
        instance_names(&sim),
        ["dbo_T", "dbo_T_v2"],
        "logs in {}",
        dir.display()
    );
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(2), text("b"), text("b@example.com")],
        )
        .commit()
        .expect("commit");
    run_until_idle(&config, &standin, &dir, "run-3").await;
    run_until_idle(&config, &standin, &dir, "run-4").await;
    assert_eq!(
        instance_names(&sim),
        ["dbo_T_v2"],
        "retired once checkpointed; logs in {}",
        dir.display()
    );
    let kinds = events(&dir);
    assert_eq!(kinds.len(), 4, "{kinds:?}");
    assert_eq!(kinds[0].0, SCHEMA_CHANGE_TYPE);
    assert_eq!(kinds[0].1["tableversion"], 1);
    assert_eq!(
        kinds[2].0, SCHEMA_CHANGE_TYPE,
        "the change comes before the row with the new column"
    );
    assert_eq!(kinds[2].1["tableversion"], 2);
    assert_eq!(kinds[2].1["after"]["captureinstance"], "dbo_T_v2");
    assert!(
        kinds[2].1["ddl"][0]["command"]
            .as_str()
            .is_some_and(|c| c.contains("ADD [Email]")),
        "{}",
        kinds[2].1
    );
    let row: serde_json::Value =
        serde_json::from_str(kinds[3].1["eventrow"]["current"].as_str().expect("current"))
            .expect("row");
    assert_eq!(row["Email"], "b@example.com");
    std::fs::remove_dir_all(dir).ok();
}

/// Columns added, dropped and retyped while rows are written and the process is
/// SIGKILLed at random moments (managed mode creating and retiring instances in
/// between); then a run to the end. The file (exactly once: the file sink cuts back
/// to the checkpoint on start) rebuilt per key, each row's columns those of the last
/// schema-change event before it, equals the table; `read` finds no problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_while_columns_change_the_file_rebuilds_the_table() {
    let (sim, standin) = served().await;
    let dir = temp_dir("standin-managed-kills");
    let config = config(&dir);
    let mut moments = Moments::new();
    let seed = moments.seed();
    let mut id = 1;
    let mut added = 0;
    let write = |id: i32, sim: &CdcSimulator, writable: &[String]| {
        let row = sim
            .table_columns("dbo.T")
            .iter()
            .map(|c| match c.as_str() {
                "Id" => Value::Int(id),
                c if writable.iter().any(|w| w == c) => text(&format!("{c}{id}")),
                _ => Value::Null,
            })
            .collect();
        sim.transaction()
            .insert("dbo.T", row)
            .commit()
            .expect("insert");
    };
    for round in 0..6 {
        // Columns the newest capture instance captures may be written.
        let writable = newest_captured(&sim);
        for _ in 0..5 {
            id += 1;
            write(id, &sim, &writable);
        }
        match moments.between(0, 3) {
            0 => {
                added += 1;
                sim.add_column(
                    "dbo.T",
                    SimColumn::new(&format!("C{added}"), SqlType::NVarChar(Length::Bounded(40))),
                    Value::Null,
                )
                .expect("add");
            }
            1 => {
                if let Some(column) = writable.iter().find(|c| c.starts_with('C')) {
                    sim.drop_column("dbo.T", column).expect("drop");
                }
            }
            _ => {
                sim.alter_column_type(
                    "dbo.T",
                    "Name",
                    SqlType::NVarChar(Length::Bounded(50 + moments.between(0, 40) as u32)),
                )
                .expect("alter");
            }
        }
        let mut child = spawn_logged(
            crate::standin_binary::command(&config, &standin, &["run"]),
            &dir,
            &format!("run-{round}"),
        );
        tokio::time::sleep(moments.millis(50, 450)).await;
        child.kill().expect("kill");
        child.wait().expect("reap");
    }
    // To the end: runs until the newest instance captures every column and the
    // older ones are retired, a row each time so the last shape has an event.
    for settle in 0..6 {
        run_until_idle(&config, &standin, &dir, &format!("settle-{settle}")).await;
        if instance_names(&sim).len() == 1 && newest_captured(&sim) == sim.table_columns("dbo.T") {
            break;
        }
        id += 1;
        write(id, &sim, &[]);
    }
    id += 1;
    write(id, &sim, &newest_captured(&sim));
    run_until_idle(&config, &standin, &dir, "last").await;

    let mut rows: BTreeMap<String, serde_json::Map<String, serde_json::Value>> = BTreeMap::new();
    let mut columns: Option<Vec<String>> = None;
    for (event_type, data) in events(&dir) {
        if event_type == SCHEMA_CHANGE_TYPE {
            columns = Some(
                data["after"]["cols"]
                    .as_array()
                    .expect("cols")
                    .iter()
                    .map(|c| c["name"].as_str().expect("name").to_owned())
                    .collect(),
            );
            continue;
        }
        let cols: Vec<String> = data["eventsource"]["cols"]
            .as_array()
            .expect("cols")
            .iter()
            .map(|c| c["name"].as_str().expect("name").to_owned())
            .collect();
        assert_eq!(
            Some(&cols),
            columns.as_ref(),
            "seed {seed}: a row's columns are the last schema change's; logs in {}",
            dir.display()
        );
        let current: serde_json::Value =
            serde_json::from_str(data["eventrow"]["current"].as_str().expect("current"))
                .expect("row");
        let key = current["Id"].as_str().expect("key").to_owned();
        rows.insert(key, current.as_object().expect("row").clone());
    }
    let table = sim.table_contents("dbo.T");
    assert_eq!(rows.len(), table.len(), "seed {seed}: rows");
    for row in &table {
        let key = row[0].1.to_text().expect("key");
        let rebuilt = &rows[&key];
        for (column, value) in row {
            let got = rebuilt
                .get(column)
                .and_then(|v| v.as_str())
                .map(str::to_owned);
            assert_eq!(
                got,
                value.to_text(),
                "seed {seed}: row {key} column {column}"
            );
        }
    }
    let read = harness::output(
        harness::bare(&["read", "--file"]).arg(dir.join("events.jsonl")),
        "read of the managed run's file",
    );
    let summary = String::from_utf8_lossy(&read.stderr);
    assert!(read.status.success(), "seed {seed}: {summary}");
    assert!(summary.contains(" 0 problems"), "seed {seed}: {summary}");
    std::fs::remove_dir_all(dir).ok();
}

/// The columns the newest capture instance of `dbo.T` captures, in column order.
fn newest_captured(sim: &CdcSimulator) -> Vec<String> {
    let mut source = sim.clone();
    let catalog = futures_util::FutureExt::now_or_never(source.catalog())
        .expect("at once")
        .expect("catalog");
    let newest = catalog
        .instances
        .iter()
        .max_by_key(|i| (i.create_date, i.object_id));
    newest.map_or_else(Vec::new, |i| {
        i.emitted_columns().map(|c| c.name().to_owned()).collect()
    })
}

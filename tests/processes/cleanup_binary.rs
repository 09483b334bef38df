//! `source.cleanup = "after_delivery"` through the real binary and the TDS stand-in
//! (a test double following [MS-TDS], serving the CDC simulator): the daemon cleans
//! the change table through `sys.sp_cdc_cleanup_change_table`, bounded by another
//! stream's checkpoint in the same directory, and further once that stream moves on.

use crate::harness::{self, ConfigFile, STANDIN_SOURCE, spawn_logged, wait_in_runtime};
use crate::support;

use std::path::Path;

use cdc_sim::CdcSimulator;
use mssql_ces::checkpoint::render;
use mssql_ces::event::Value;
use mssql_ces::lsn::Lsn;
use mssql_ces::position::Position;
use mssql_ces::source::CdcReads;
use support::temp_dir;

fn config(dir: &Path) -> std::path::PathBuf {
    ConfigFile::new()
        .set("source", STANDIN_SOURCE)
        .set(
            "source",
            "poll_interval_ms = 20\ncleanup = \"after_delivery\"\ncleanup_interval_ms = 100",
        )
        .file_sink(&dir.join("events.jsonl"))
        .file_checkpoint(&dir.join("orders.json"), 20)
        .set("checkpoint", "stream_name = \"orders\"")
        .write(dir)
}

/// Another stream's checkpoint beside this one's: dbo_T delivered through `through`.
fn write_peer(dir: &Path, through: Lsn) {
    let position = Position {
        instances: [("dbo_T".to_owned(), through)].into(),
        ..Position::default()
    };
    let text = render("audit", &position, "audit.json").expect("render");
    std::fs::write(dir.join("audit.json"), text).expect("peer");
}

fn min_lsn(sim: &CdcSimulator) -> Option<Lsn> {
    let mut source = sim.clone();
    futures_util::FutureExt::now_or_never(source.min_lsn("dbo_T"))
        .expect("at once")
        .expect("min_lsn")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_cleans_below_what_every_stream_in_the_directory_delivered() {
    let (sim, standin) = crate::managed_binary::served().await;
    let mut commits = vec![sim.current_max_lsn().expect("the first row's")];
    for id in 2..=10 {
        sim.transaction()
            .insert(
                "dbo.T",
                vec![Value::Int(id), Value::Text(format!("row {id}"))],
            )
            .commit()
            .expect("commit");
        commits.push(sim.current_max_lsn().expect("committed"));
    }
    let dir = temp_dir("standin-cleanup");
    let config = config(&dir);
    write_peer(&dir, commits[4]);
    let log = dir.join("run.log");
    let child = spawn_logged(
        crate::standin_binary::command(&config, &standin, &["run"]),
        &dir,
        "run",
    );

    // Delivered through the tenth row here, the fifth in the audit stream: the rows
    // below the fifth go.
    wait_in_runtime("a cleanup bounded by the audit stream", &dir, || {
        sim.change_table_cleanups().0 >= 1
    });
    assert_eq!(sim.change_table_cleanups(), (1, 4));
    assert_eq!(min_lsn(&sim), Some(commits[4]));
    let said = std::fs::read_to_string(&log).expect("log");
    assert!(
        said.contains("change table cleaned") && said.contains("held_by=\"audit\""),
        "{said}"
    );

    // The audit stream delivers the rest: the next round cleans up to the last
    // commit, which it keeps.
    write_peer(&dir, commits[9]);
    wait_in_runtime("a cleanup once the audit stream moved on", &dir, || {
        sim.change_table_cleanups().0 >= 2
    });
    assert_eq!(sim.change_table_cleanups(), (2, 9));
    assert_eq!(min_lsn(&sim), Some(commits[9]));

    drop(child);
    let events = std::fs::read_to_string(dir.join("events.jsonl")).expect("events");
    assert_eq!(events.lines().count(), 10, "every row delivered once");
    std::fs::remove_dir_all(dir).ok();
}

/// Without `db_owner` the run stops at its first poll, naming the setting and the
/// grant, before anything is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_db_owner_the_run_stops_naming_the_setting() {
    let (sim, standin) = crate::managed_binary::served().await;
    sim.set_db_owner(false);
    let dir = temp_dir("standin-cleanup-denied");
    let config = config(&dir);
    let output = harness::output(
        &mut crate::standin_binary::command(&config, &standin, &["run", "--until-idle"]),
        "the run without db_owner",
    );
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    for named in [
        "source.cleanup = \"after_delivery\"",
        "db_owner",
        "ALTER ROLE db_owner ADD MEMBER",
    ] {
        assert!(said.contains(named), "{named}: {said}");
    }
    assert_eq!(sim.change_table_cleanups(), (0, 0));
    std::fs::remove_dir_all(dir).ok();
}

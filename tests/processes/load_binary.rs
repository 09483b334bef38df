//! The initial load over several connections (`snapshot.max_connections`) through
//! the real binary and the TDS stand-in (a test double following [MS-TDS], serving
//! the CDC simulator): the sample query and four reader connections through the
//! driver write the bytes one connection writes.

use crate::support;

use std::path::Path;

use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::Value;
use mssql_ces::event::value::{Length, SqlType};
use support::tds::StandIn;
use support::temp_dir;

use crate::harness::{self, ConfigFile, STANDIN_SOURCE};
use crate::standin_binary::{PASSWORD, USER};

/// `dbo.T (Id bigint PRIMARY KEY, Name nvarchar(50))` with 3,000 rows from before
/// CDC, and `dbo.U` (a text key) with 200, served by a stand-in.
async fn served() -> (CdcSimulator, StandIn) {
    let sim = CdcSimulator::new("Shop", uuid::Uuid::from_u128(7), 0);
    let name = SimColumn::new("Name", SqlType::NVarChar(Length::Bounded(50)));
    sim.create_table(
        "dbo",
        "T",
        vec![SimColumn::new("Id", SqlType::BigInt), name.clone()],
        &["Id"],
    );
    sim.create_table(
        "dbo",
        "U",
        vec![
            SimColumn::new("Code", SqlType::NVarChar(Length::Bounded(20))),
            name,
        ],
        &["Code"],
    );
    let mut txn = sim.transaction();
    for id in 1..=3000i64 {
        txn = txn.insert(
            "dbo.T",
            vec![Value::BigInt(id * 7), Value::Text(format!("row {id}"))],
        );
    }
    for code in 0..200 {
        txn = txn.insert(
            "dbo.U",
            vec![Value::Text(format!("c{code:04}")), Value::Text("u".into())],
        );
    }
    txn.commit().expect("commit");
    sim.enable_table("dbo.T", None).expect("enable");
    sim.enable_table("dbo.U", None).expect("enable");
    let standin = StandIn::start(USER, PASSWORD, support::tds_cdc::handler(sim.clone()))
        .await
        .expect("stand-in");
    (sim, standin)
}

/// A load of both tables over `connections`, until idle: the events and the log.
async fn load(standin: &StandIn, dir: &Path, connections: usize) -> (Vec<u8>, String) {
    let out = dir.join(format!("events-{connections}.jsonl"));
    let run_dir = dir.join(format!("connections-{connections}"));
    std::fs::create_dir_all(&run_dir).expect("dir");
    let config = ConfigFile::new()
        .set("source", STANDIN_SOURCE)
        .set("source", "poll_interval_ms = 20")
        .set(
            "snapshot",
            &format!("mode = \"initial_only\"\nchunk_size = 100\nmax_connections = {connections}"),
        )
        .file_sink(&out)
        .file_checkpoint(&run_dir.join("cp.json"), 20)
        .write(&run_dir);
    let run = crate::standin_binary::command(&config, standin, &["run", "--until-idle"]);
    let status = harness::run_logged(run, &run_dir, "run", "the load").await;
    let log = run_dir.join("run.log");
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{said}");
    (std::fs::read(out).expect("events"), said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_connections_through_the_wire_write_the_bytes_one_writes() {
    let (_sim, standin) = served().await;
    let dir = temp_dir("standin-parallel-load");
    let (one, _) = load(&standin, &dir, 1).await;
    let (four, said) = load(&standin, &dir, 4).await;
    assert_eq!(one.split(|b| *b == b'\n').count() - 1, 3200);
    assert!(one == four, "byte for byte; logs in {}", dir.display());
    // dbo.T cut into key ranges of four chunks from its sample; dbo.U whole.
    assert!(said.contains("tables=2 ranges=8 connections=4"), "{said}");
    std::fs::remove_dir_all(dir).ok();
}

//! The cost of an idle poll with many capture instances: round trips to the source
//! and CPU per poll, once caught up, against the CDC simulator (which counts every
//! call as one round trip, as each is one query on SQL Server).
//!
//! Run: `cargo bench --bench idle` (`IDLE_BENCH_INSTANCES`, default 1000;
//! `IDLE_BENCH_SECONDS`, default 5).

use std::time::{Duration, Instant};

use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::Value;
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::source::poller::{PollOutcome, Poller, PollerConfig};

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let env = mssql_ces_testkit::bench_setting::<f64>;
    let instances = env("IDLE_BENCH_INSTANCES", 1000.0) as usize;
    let seconds = Duration::from_secs_f64(env("IDLE_BENCH_SECONDS", 5.0));
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() else {
        return;
    };
    let sim = CdcSimulator::new("Idle", uuid::Uuid::from_u128(1), 0);
    for i in 0..instances {
        let name = format!("t{i:04}");
        sim.create_table(
            "dbo",
            &name,
            vec![
                SimColumn::new("Id", SqlType::Int),
                SimColumn::new("Note", SqlType::NVarChar(Length::Bounded(40))),
            ],
            &["Id"],
        );
        if sim.enable_table(&format!("dbo.{name}"), None).is_err() {
            return;
        }
        let committed = sim
            .transaction()
            .insert(
                &format!("dbo.{name}"),
                vec![Value::Int(1), Value::Text("x".into())],
            )
            .commit();
        if committed.is_err() {
            return;
        }
    }
    let mut poller = Poller::new(sim.clone(), PollerConfig::default(), None);
    // Catch up: every instance's first change.
    let mut events = 0;
    loop {
        match runtime.block_on(poller.poll()) {
            Ok(PollOutcome::Batch(batch)) => events += batch.changes.len(),
            Ok(PollOutcome::Idle) => break,
            Err(e) => {
                eprintln!("poll failed: {e}");
                return;
            }
        }
    }
    let trips_before = sim.round_trips();
    let (started, cpu_before) = (Instant::now(), mssql_ces_testkit::thread_cpu());
    let mut polls = 0u64;
    while started.elapsed() < seconds {
        if !matches!(runtime.block_on(poller.poll()), Ok(PollOutcome::Idle)) {
            eprintln!("an idle poll found something");
            return;
        }
        polls += 1;
    }
    let cpu = mssql_ces_testkit::thread_cpu() - cpu_before;
    let trips = sim.round_trips() - trips_before;
    println!(
        "{instances} capture instances, caught up after {events} events; {polls} idle polls in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    println!(
        "round trips per idle poll: {:.3}; CPU per idle poll: {:.1} µs (the catalog re-read every source.catalog_refresh_ms included)",
        trips as f64 / polls as f64,
        cpu.as_secs_f64() * 1e6 / polls as f64
    );
}

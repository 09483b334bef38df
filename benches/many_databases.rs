//! Many idle databases in one process: what a poll costs once every database has
//! been read, against the simulated server (`SimServer`, which counts each probe
//! query as one round trip). The activations here return at once: this measures
//! the supervisor (discovery, the probe, the queue), not the pipeline.
//!
//! Reported: server round trips per idle poll, CPU per idle poll (the supervisor's
//! and the simulated server's answer together, one thread), and the supervisor's
//! live heap per database (a counting allocator).
//!
//! Run: `cargo bench --bench many_databases` (`MANY_BENCH_DATABASES`, default
//! 1000; `MANY_BENCH_SECONDS`, default 5).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use cdc_sim::CdcSimulator;
use cdc_sim::server::SimServer;
use mssql_ces::databases::{ManySettings, StreamRunner, Supervisor};
use tokio_util::sync::CancellationToken;

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a counter
// is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, as given.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: a pointer this allocator gave, with its layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as for `dealloc`, and the caller's new size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// An activation that finds nothing to do.
struct Instant;

impl StreamRunner for Instant {
    type Error = std::io::Error;
    async fn run(&self, _database: String, _stop: CancellationToken) -> Result<(), std::io::Error> {
        Ok(())
    }
}

fn main() {
    let env = mssql_ces_testkit::bench_setting::<f64>;
    let count = env("MANY_BENCH_DATABASES", 1000.0) as usize;
    let seconds = Duration::from_secs_f64(env("MANY_BENCH_SECONDS", 5.0));
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        return;
    };
    let server = SimServer::default();
    for i in 0..count {
        let name = format!("Tenant{i:05}");
        server.add(
            &name,
            CdcSimulator::new(&name, uuid::Uuid::from_u128(i as u128 + 1), 0),
        );
    }
    let _context = runtime.enter();
    let before = LIVE.load(Ordering::Relaxed);
    let supervisor = Supervisor::new(
        server.clone(),
        Instant,
        ManySettings {
            patterns: vec!["Tenant*".into()],
            discovery_interval: Duration::from_secs(3600),
            poll_interval: Duration::from_millis(1),
            max_active: 8,
            quantum: Duration::from_secs(30),
            until_idle: false,
        },
    );
    let mut status = supervisor.status();
    let shutdown = CancellationToken::new();
    let run = runtime.spawn(supervisor.run(shutdown.clone()));
    // The first pass: every database activated once.
    runtime.block_on(async {
        let _ = status
            .wait_for(|s| s.activations == count as u64 && s.active == 0 && s.queued == 0)
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    });
    let held = LIVE.load(Ordering::Relaxed) - before;
    let (probes_before, trips_before, cpu_before) = (
        status.borrow().probes,
        server.round_trips(),
        mssql_ces_testkit::thread_cpu(),
    );
    runtime.block_on(tokio::time::sleep(seconds));
    let probes = status.borrow().probes - probes_before;
    let trips = server.round_trips() - trips_before;
    let cpu = mssql_ces_testkit::thread_cpu() - cpu_before;
    shutdown.cancel();
    let _ = runtime.block_on(run);
    let polls = probes.max(1) as f64;
    println!(
        "{count} idle databases: {probes} polls in {:.1} s; {:.1} server round trips a poll; \
         {:.0} µs CPU a poll ({:.2} µs a database); supervisor heap {} KiB ({} B a database)",
        seconds.as_secs_f64(),
        trips as f64 / polls,
        cpu.as_secs_f64() * 1e6 / polls,
        cpu.as_secs_f64() * 1e6 / polls / count as f64,
        held / 1024,
        held / count as isize,
    );
}

//! The synthetic workload's own change log against the CDC simulator: the same
//! transactions committed to the simulator of SQL Server (its tables created and
//! enabled as the workload's catalog describes them) give the same events, to the
//! byte, as the workload's log gives. The log is the product's, small and fixed; the
//! simulator is the test double that models SQL Server: each is the other's oracle.

use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::Change;
use mssql_ces::source::CdcReads;
use mssql_ces::source::poller::{Poller, PollerConfig};
use mssql_ces::source::synthetic::{Statement, SyntheticConfig, SyntheticSource};

use crate::common::drain;

/// The simulator with the workload's tables, created and enabled in the
/// workload's order, as its catalog describes them.
async fn simulator_like(source: &mut SyntheticSource) -> CdcSimulator {
    let catalog = source.catalog().await.expect("catalog");
    let guid = catalog.database_guid.expect("a GUID");
    let sim = CdcSimulator::new(&catalog.database, guid, 0);
    for instance in &catalog.instances {
        let columns = instance
            .columns
            .iter()
            .map(|c| SimColumn::new(&c.name, *c.sql_type.as_ref().expect("a streamed type")))
            .collect();
        let key: Vec<&str> = instance.key_columns.iter().map(String::as_str).collect();
        sim.create_table(&instance.schema, &instance.table, columns, &key);
        sim.enable_table(&instance.qualified_table(), None)
            .expect("enabled");
    }
    sim
}

/// The events of `config`'s workload read from its own log, and read from the
/// simulator after its transactions were committed there.
async fn both(config: SyntheticConfig, batch_size: usize) -> (Vec<Change>, Vec<Change>) {
    let poller_config = PollerConfig {
        batch_size,
        page_size: batch_size.min(1000),
        ..PollerConfig::default()
    };
    let mut source = SyntheticSource::new(config).record_transactions();
    let sim = simulator_like(&mut source).await;
    let mut poller = Poller::new(source, poller_config.clone(), None);
    let own = drain(&mut poller).await.expect("the workload's log");
    for transaction in poller.source().committed() {
        let mut txn = sim.transaction();
        for (table, statement) in transaction.statements() {
            txn = match statement.clone() {
                Statement::Insert(row) => txn.insert(table, row),
                Statement::Update(key, set) => txn.update(table, key, set),
                Statement::Delete(key) => txn.delete(table, key),
            };
        }
        txn.commit().expect("committed to the simulator");
    }
    let mut from_sim = Poller::new(sim, poller_config, None);
    let simulated = drain(&mut from_sim).await.expect("the simulator");
    (own, simulated)
}

/// Inserts, updates (with a large-value column left NULL in the row before) and
/// deletes on three tables, large values, and over-large ones on a fourth table:
/// the same events, LSNs, sequence numbers and commit times from both.
#[tokio::test]
async fn the_workloads_log_gives_the_events_the_simulator_of_sql_server_gives() {
    for (seed, batch_size) in [(1, 1000), (7, 97)] {
        let (own, simulated) = both(
            SyntheticConfig {
                seed,
                transactions: Some(1_500),
                large_value_every: 250,
                oversized_value_every: 700,
                ..SyntheticConfig::default()
            },
            batch_size,
        )
        .await;
        assert!(own.len() > 4_000, "seed {seed}: {} events", own.len());
        assert_eq!(own.len(), simulated.len(), "seed {seed}");
        for (k, (a, b)) in own.iter().zip(&simulated).enumerate() {
            assert_eq!(a, b, "seed {seed}: event {k} differs");
        }
    }
}

//! The synthetic workload as a server of many databases (`source.kind = "synthetic"`
//! with `source.databases` and `[source.synthetic] databases = N`): `tenant001`, …,
//! each its own seeded workload. Not a database: what it answers is what the
//! supervisor needs to try many databases and a fleet without SQL Server.
//!
//! A database's workload is fixed by its seed and `transactions`, so its probe
//! answer is fixed too: the LSN of its last transaction stand-in (its number of
//! transactions) and an unchanging catalog. The first probe queues every database;
//! an activation reads its workload (paced or not) until idle with everything
//! delivered, after which the database stays idle.

use crate::lsn::Lsn;
use crate::source::server::{DatabaseProbe, DatabaseServer, PROBE_CHUNK};
use crate::source::{MaxLsn, SourceError};

/// `databases` synthetic databases, each with `transactions` transactions.
#[derive(Debug, Clone)]
pub struct SyntheticServer {
    names: Vec<String>,
    answer: MaxLsn,
    /// Queries answered (discovery and probe chunks).
    round_trips: usize,
}

impl SyntheticServer {
    pub fn new(databases: u32, transactions: u64) -> Self {
        let width = databases.to_string().len().max(3);
        SyntheticServer {
            names: (1..=databases)
                .map(|i| format!("tenant{i:0width$}"))
                .collect(),
            answer: MaxLsn {
                lsn: Lsn::from_u128(u128::from(transactions.max(1))),
                catalog_version: 1,
            },
            round_trips: 0,
        }
    }

    /// Queries answered so far.
    pub fn round_trips(&self) -> usize {
        self.round_trips
    }
}

impl DatabaseServer for SyntheticServer {
    /// A simulated SQL Server (Developer Edition answers 3, as Enterprise).
    async fn engine_edition(&mut self) -> Result<i64, SourceError> {
        self.round_trips += 1;
        Ok(3)
    }

    async fn cdc_databases(&mut self) -> Result<Vec<String>, SourceError> {
        self.round_trips += 1;
        Ok(self.names.clone())
    }

    async fn probe_chunk(&mut self, chunk: &[String]) -> Result<Vec<DatabaseProbe>, SourceError> {
        debug_assert!(chunk.len() <= PROBE_CHUNK);
        self.round_trips += 1;
        Ok(chunk
            .iter()
            .map(|name| DatabaseProbe {
                database: name.clone(),
                state: if self.names.contains(name) {
                    Ok(self.answer)
                } else {
                    Err(SourceError::definite(format!(
                        "no synthetic database {name}"
                    )))
                },
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lists_its_databases_and_answers_each_probe_the_same() {
        let mut server = SyntheticServer::new(12, 300);
        let names = server.cdc_databases().await.expect("listed");
        assert_eq!(names.len(), 12);
        assert_eq!(names[0], "tenant001");
        assert_eq!(names[11], "tenant012");
        assert_eq!(
            SyntheticServer::new(1500, 1)
                .cdc_databases()
                .await
                .expect("listed")[0],
            "tenant0001"
        );
        let answers = server
            .probe(&[names[0].clone(), "other".into()])
            .await
            .expect("probed");
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0].state.as_ref().ok(), Some(&server.answer));
        assert!(answers[1].state.is_err());
        assert_eq!(server.round_trips(), 2);
    }
}

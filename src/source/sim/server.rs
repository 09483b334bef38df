//! A simulated server of many CDC databases (each a [`CdcSimulator`]): databases
//! added, dropped, taken offline, and a count of the server-level round trips the
//! discovery and the probe make.
//!
//! What it models: `sys.databases` lists an online database with CDC enabled; a
//! query with a three-part name into a database that is offline or gone fails as a
//! whole (error 942 "Database … cannot be opened because it is offline", 911 "does
//! not exist"), so one such database fails the probe of its chunk.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::CdcSimulator;
use crate::source::SourceError;
use crate::source::server::{DatabaseProbe, DatabaseServer};

/// A handle to the simulated server (`Clone`: tests change it while it is read).
#[derive(Debug, Clone, Default)]
pub struct SimServer {
    state: Arc<Mutex<ServerState>>,
}

#[derive(Debug, Default)]
struct ServerState {
    databases: BTreeMap<String, SimDatabase>,
    round_trips: usize,
}

#[derive(Debug)]
struct SimDatabase {
    sim: CdcSimulator,
    online: bool,
}

impl SimServer {
    fn lock(&self) -> MutexGuard<'_, ServerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds (or replaces) a database, online.
    pub fn add(&self, name: &str, sim: CdcSimulator) {
        self.lock()
            .databases
            .insert(name.to_owned(), SimDatabase { sim, online: true });
    }

    /// Drops a database.
    pub fn drop_database(&self, name: &str) {
        self.lock().databases.remove(name);
    }

    /// Takes a database offline (`ALTER DATABASE … SET OFFLINE`) or back online.
    pub fn set_online(&self, name: &str, online: bool) {
        if let Some(db) = self.lock().databases.get_mut(name) {
            db.online = online;
        }
    }

    /// The simulator of a database, to change it or read it.
    pub fn database(&self, name: &str) -> Option<CdcSimulator> {
        self.lock().databases.get(name).map(|db| db.sim.clone())
    }

    /// Server-level queries answered so far (discovery and probes).
    pub fn round_trips(&self) -> usize {
        self.lock().round_trips
    }
}

impl DatabaseServer for SimServer {
    async fn cdc_databases(&mut self) -> Result<Vec<String>, SourceError> {
        let mut state = self.lock();
        state.round_trips += 1;
        Ok(state
            .databases
            .iter()
            .filter(|(_, db)| db.online && db.sim.cdc_enabled())
            .map(|(name, _)| name.clone())
            .collect())
    }

    async fn probe_chunk(&mut self, chunk: &[String]) -> Result<Vec<DatabaseProbe>, SourceError> {
        let mut state = self.lock();
        state.round_trips += 1;
        let mut answers = Vec::with_capacity(chunk.len());
        for name in chunk {
            let db = match state.databases.get(name) {
                Some(db) if db.online => db,
                Some(_) => {
                    return Err(SourceError::Definite {
                        message: format!(
                            "SQL Server error 942: Database '{name}' cannot be opened because it is offline"
                        ),
                    });
                }
                None => {
                    return Err(SourceError::Definite {
                        message: format!("SQL Server error 911: Database '{name}' does not exist"),
                    });
                }
            };
            answers.push(DatabaseProbe {
                database: name.clone(),
                state: Ok(db.sim.peek_max_lsn()),
            });
        }
        Ok(answers)
    }
}

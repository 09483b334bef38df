//! A simulated server of many CDC databases (each a [`CdcSimulator`]): databases
//! added, dropped, taken offline, and a count of the server-level round trips the
//! discovery and the probe make.
//!
//! What it models: `sys.databases` lists an online database with CDC enabled; a
//! query with a three-part name into a database that is offline or gone fails as a
//! whole (error 942 "Database … cannot be opened because it is offline", 911 "does
//! not exist"), so one such database fails the probe of its chunk.
//!
//! A database whose replica on this server is an availability group secondary that
//! allows no connections is still `ONLINE` in `sys.databases` (its `state` is the
//! local replica's, and `HAS_DBACCESS` is 1), but any query naming it fails with
//! error 976 ("The target database, '…', is participating in an availability group
//! and is currently not accessible for queries"); on a secondary that allows only
//! read-intent connections, 978 for a session without `ApplicationIntent=ReadOnly`
//! (Learn: "Configure read-only access to a secondary replica of an Always On
//! availability group"; the error numbers are SqlClient's and EF Core's
//! availability-group retry list). The probe gets the error as the real probe
//! does, through [`probe_error`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::CdcSimulator;
use mssql_ces::source::SourceError;
use mssql_ces::source::server::{DatabaseProbe, DatabaseServer, probe_error};

/// A handle to the simulated server (`Clone`: tests change it while it is read).
#[derive(Debug, Clone, Default)]
pub struct SimServer {
    state: Arc<Mutex<ServerState>>,
}

#[derive(Debug, Default)]
struct ServerState {
    databases: BTreeMap<String, SimDatabase>,
    round_trips: usize,
    /// `SERVERPROPERTY('EngineEdition')`; 0 answers 3 (Enterprise, as Developer).
    engine_edition: i64,
    /// Whether the login has `VIEW SERVER STATE` (the availability-group views).
    view_server_state: bool,
    /// Server-level queries that failed (a probe naming a database it cannot read).
    failed_queries: usize,
}

#[derive(Debug)]
struct SimDatabase {
    sim: CdcSimulator,
    online: bool,
    replica: Replica,
}

/// What this server's replica of a database allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replica {
    /// The primary, or no availability group: readable.
    Primary,
    /// A secondary with `ALLOW_CONNECTIONS = NO`: error 976.
    NotReadable,
    /// A secondary with `ALLOW_CONNECTIONS = READ_ONLY`, to a session without a
    /// read-only intent: error 978.
    ReadIntentOnly,
}

impl SimServer {
    fn lock(&self) -> MutexGuard<'_, ServerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds (or replaces) a database, online.
    pub fn add(&self, name: &str, sim: CdcSimulator) {
        self.lock().databases.insert(
            name.to_owned(),
            SimDatabase {
                sim,
                online: true,
                replica: Replica::Primary,
            },
        );
    }

    /// Makes this server's replica of a database a secondary, or the primary again.
    pub fn set_replica(&self, name: &str, replica: Replica) {
        if let Some(db) = self.lock().databases.get_mut(name) {
            db.replica = replica;
        }
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

    /// Makes the server another edition: 5 is Azure SQL Database, where a query with
    /// a three-part name fails with error 40515 ("Reference to database and/or
    /// server name in '…' is not supported in this version of SQL Server").
    pub fn set_engine_edition(&self, edition: i64) {
        self.lock().engine_edition = edition;
    }

    /// Server-level queries answered so far (discovery and probes).
    pub fn round_trips(&self) -> usize {
        self.lock().round_trips
    }

    /// Server-level queries that failed so far.
    pub fn failed_queries(&self) -> usize {
        self.lock().failed_queries
    }

    /// Grants the login `VIEW SERVER STATE` (or takes it back): with it, the
    /// availability-group views say which databases this replica cannot read.
    pub fn set_view_server_state(&self, granted: bool) {
        self.lock().view_server_state = granted;
    }
}

impl DatabaseServer for SimServer {
    async fn engine_edition(&mut self) -> Result<i64, SourceError> {
        let mut state = self.lock();
        state.round_trips += 1;
        Ok(match state.engine_edition {
            0 => 3,
            edition => edition,
        })
    }

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

    /// Without `VIEW SERVER STATE` the views fail the query (error 300): `None`.
    /// With it: the secondaries that allow no connections (a read-intent-only one
    /// is not listed).
    async fn unreadable_replicas(&mut self) -> Result<Option<Vec<String>>, SourceError> {
        let mut state = self.lock();
        state.round_trips += 1;
        if !state.view_server_state {
            state.failed_queries += 1;
            return Ok(None);
        }
        Ok(Some(
            state
                .databases
                .iter()
                .filter(|(_, db)| db.sim.cdc_enabled() && db.replica == Replica::NotReadable)
                .map(|(name, _)| name.clone())
                .collect(),
        ))
    }

    async fn probe_chunk(&mut self, chunk: &[String]) -> Result<Vec<DatabaseProbe>, SourceError> {
        let mut state = self.lock();
        state.round_trips += 1;
        let answered = Self::answer_probe(&state, chunk);
        if answered.is_err() {
            state.failed_queries += 1;
        }
        answered
    }
}

impl SimServer {
    /// The probe of `chunk` as the server answers it.
    fn answer_probe(
        state: &ServerState,
        chunk: &[String],
    ) -> Result<Vec<DatabaseProbe>, SourceError> {
        if state.engine_edition == mssql_ces::source::AZURE_SQL_DATABASE_EDITION
            && let Some(name) = chunk.first()
        {
            return Err(probe_error(mssql_ces::mssql::server_error(
                40515,
                &format!(
                    "Reference to database and/or server name in '{name}.sys.fn_cdc_get_max_lsn' is not supported in this version of SQL Server."
                ),
            )));
        }
        let mut answers = Vec::with_capacity(chunk.len());
        for name in chunk {
            let db = match state.databases.get(name) {
                Some(db) if db.online && db.replica == Replica::NotReadable => {
                    return Err(probe_error(mssql_ces::mssql::server_error(
                        976,
                        &format!(
                            "The target database, '{name}', is participating in an availability group and is currently not accessible for queries. Either data movement is suspended or the availability replica is not enabled for read access."
                        ),
                    )));
                }
                Some(db) if db.online && db.replica == Replica::ReadIntentOnly => {
                    return Err(probe_error(mssql_ces::mssql::server_error(
                        978,
                        &format!(
                            "The target database ('{name}') is in an availability group and is currently accessible for connections when the application intent is set to read only."
                        ),
                    )));
                }
                Some(db) if db.online => db,
                Some(_) => {
                    return Err(SourceError::definite(format!(
                        "SQL Server error 942: Database '{name}' cannot be opened because it is offline"
                    )));
                }
                None => {
                    return Err(SourceError::definite(format!(
                        "SQL Server error 911: Database '{name}' does not exist"
                    )));
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

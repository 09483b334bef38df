//! The stand-in's model of the table checkpoint store: `dbo.mssql_ces_checkpoint`
//! and the session-owned application locks that lease a stream to one writer.
//!
//! What it models of SQL Server, from Learn's `sp_getapplock` and `APPLOCK_MODE`
//! pages (<https://learn.microsoft.com/sql/relational-databases/system-stored-procedures/sp-getapplock-transact-sql>):
//! a lock owned by a session is held until that session ends; another session asking
//! for it gets `NoLock` from `APPLOCK_MODE` after its wait; a session ends when the
//! server ends it (its connection dropped, `KILL`). Between the client seeing its
//! connection drop and the server noticing (TCP keep-alive), the old session and
//! its locks live on: [`CheckpointTable::drop_holder_lingering`] models that.
//!
//! A session that logged in with a read-only intent reached a readable secondary,
//! where the database is read-only: its checkpoint write fails with error 3906 as
//! there ("Failed to update database … because the database is read-only").
//!
//! Not modelled: the wait itself (a lock held by another session answers `NoLock`
//! at once, as when the wait ran out), lock modes other than exclusive.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use mssql_ces::checkpoint::table::{
    CHECKPOINT_PEERS, CHECKPOINT_READ, CHECKPOINT_WRITE, LEASE_ACQUIRE, LEASE_HELD,
};

use super::tds::{Cell, Column, ColumnType, Handler, Param, Reply, Request, ResultSet};

#[derive(Default)]
struct State {
    /// Checkpoint rows by stream name, lower-cased (the default collation compares
    /// case-insensitively).
    rows: BTreeMap<String, String>,
    /// Application locks: resource → owning session.
    locks: BTreeMap<String, u64>,
    /// Sessions the server ended: their next request finds the connection closed.
    killed: BTreeSet<u64>,
    /// Sessions whose connection the client sees closed at its next request, while
    /// the server keeps the session (and its locks) until `release_lingering`.
    lingering: BTreeSet<u64>,
    /// Every checkpoint write: the writing session and the stream name.
    writes: Vec<(u64, String)>,
    /// Every query the handler answered, by session.
    requests: Vec<(u64, String)>,
}

/// The checkpoint table and its locks, shared with the handler serving them.
#[derive(Clone, Default)]
pub struct CheckpointTable {
    state: Arc<Mutex<State>>,
}

impl CheckpointTable {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handler answering the checkpoint store's queries.
    pub fn handler(&self) -> Handler {
        let table = self.clone();
        Arc::new(move |request: &Request| table.answer(request))
    }

    /// The session holding `resource` now, if any.
    pub fn holder(&self, resource: &str) -> Option<u64> {
        self.state().locks.get(resource).copied()
    }

    /// The server ends the session holding `resource` (as `KILL` or a dead
    /// connection it noticed): its locks go at once; the client learns at its
    /// next request. Returns that session.
    pub fn kill_holder(&self, resource: &str) -> Option<u64> {
        let mut state = self.state();
        let session = state.locks.remove(resource)?;
        state.locks.retain(|_, owner| *owner != session);
        state.killed.insert(session);
        Some(session)
    }

    /// The holder's connection drops (the client sees it at its next request), but
    /// the server has not noticed: the session keeps its locks until
    /// [`CheckpointTable::release_lingering`].
    pub fn drop_holder_lingering(&self, resource: &str) -> Option<u64> {
        let mut state = self.state();
        let session = *state.locks.get(resource)?;
        state.lingering.insert(session);
        Some(session)
    }

    /// The server notices the lingering sessions are gone and releases their locks.
    pub fn release_lingering(&self) {
        let mut state = self.state();
        let gone = std::mem::take(&mut state.lingering);
        state.locks.retain(|_, owner| !gone.contains(owner));
        state.killed.extend(gone);
    }

    /// The stored checkpoint document of `stream_name`.
    pub fn row(&self, stream_name: &str) -> Option<String> {
        self.state().rows.get(&stream_name.to_lowercase()).cloned()
    }

    /// Every checkpoint write so far: (session, stream name).
    pub fn writes(&self) -> Vec<(u64, String)> {
        self.state().writes.clone()
    }

    /// Every query answered so far: (session, text).
    pub fn requests(&self) -> Vec<(u64, String)> {
        self.state().requests.clone()
    }

    fn answer(&self, request: &Request) -> Reply {
        let mut state = self.state();
        let session = request.session;
        if state.killed.contains(&session) || state.lingering.contains(&session) {
            return Reply::Drop;
        }
        state.requests.push((session, request.sql.clone()));
        // Locks of sessions that ended (their connection closed and the server
        // noticed) are released; a lingering one's are not.
        let lingering = state.lingering.clone();
        state
            .locks
            .retain(|_, owner| request.sessions.is_live(*owner) || lingering.contains(owner));
        let text = |at: usize| match request.params.get(at) {
            Some(Param::Text(t)) => Some(t.clone()),
            _ => None,
        };
        let sql = request.sql.as_str();
        if sql == LEASE_ACQUIRE {
            let Some(resource) = text(0) else {
                return bad(request);
            };
            let owner = *state.locks.entry(resource).or_insert(session);
            return lock_mode(owner == session);
        }
        if sql == LEASE_HELD {
            let Some(resource) = text(0) else {
                return bad(request);
            };
            return lock_mode(state.locks.get(&resource) == Some(&session));
        }
        if sql == CHECKPOINT_READ {
            let Some(name) = text(0) else {
                return bad(request);
            };
            let rows = state
                .rows
                .get(&name.to_lowercase())
                .map(|p| vec![vec![Cell::Text(p.clone())]])
                .unwrap_or_default();
            return Reply::Rows(vec![ResultSet {
                columns: vec![Column::new("position", ColumnType::NVarChar(None))],
                rows,
            }]);
        }
        if sql == CHECKPOINT_PEERS {
            // Every other stream's row; `<>` compares as the collation does.
            let Some(name) = text(0) else {
                return bad(request);
            };
            let rows = (state.rows.iter())
                .filter(|(stream, _)| **stream != name.to_lowercase())
                .map(|(stream, p)| vec![Cell::Text(stream.clone()), Cell::Text(p.clone())])
                .collect();
            return Reply::Rows(vec![ResultSet {
                columns: vec![
                    Column::new("stream_name", ColumnType::NVarChar(Some(128))),
                    Column::new("position", ColumnType::NVarChar(None)),
                ],
                rows,
            }]);
        }
        if sql == CHECKPOINT_WRITE {
            if request.read_only_intent {
                return Reply::Error {
                    number: 3906,
                    class: 16,
                    message:
                        "Failed to update database \"CesDemo\" because the database is read-only."
                            .into(),
                };
            }
            let (Some(name), Some(position)) = (text(0), text(1)) else {
                return bad(request);
            };
            state.rows.insert(name.to_lowercase(), position);
            state.writes.push((session, name));
            return Reply::Rows(Vec::new());
        }
        super::tds::unknown(request)
    }
}

/// `APPLOCK_MODE`'s answer for this session.
fn lock_mode(held: bool) -> Reply {
    let mode = if held { "Exclusive" } else { "NoLock" };
    Reply::Rows(vec![ResultSet {
        columns: vec![Column::new("lock_mode", ColumnType::NVarChar(Some(32)))],
        rows: vec![vec![Cell::Text(mode.into())]],
    }])
}

fn bad(request: &Request) -> Reply {
    Reply::Error {
        number: 50000,
        class: 16,
        message: format!(
            "stand-in: parameters it does not expect for: {}",
            request.sql
        ),
    }
}

//! The fleet side of the supervisor: the slots a member owns, the group's
//! assignments and revocations, and calls on the server that do not hold a
//! revocation up.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use super::{Phase, Stream, StreamRunner, Supervisor};
use crate::databases::fleet::{FleetEvent, slot_of};
use crate::source::SourceError;
use crate::source::server::DatabaseServer;

/// A fleet member's share: only the databases of its slots are probed and read.
pub(super) struct Ownership {
    pub(super) slots: u32,
    pub(super) owned: BTreeSet<u32>,
    /// Assignments and revocations so far.
    pub(super) changes: u64,
    /// The membership's channel ended.
    pub(super) closed: bool,
    pub(super) events: tokio::sync::mpsc::UnboundedReceiver<FleetEvent>,
}

impl<S: DatabaseServer + 'static, R: StreamRunner> Supervisor<S, R> {
    /// Runs `call` on the server. In a fleet it runs in a task of its own while the
    /// group's word is answered: a revocation must not wait for a slow probe or
    /// listing (a query may take `source.query_timeout_ms`, a failing chunk one
    /// query a database).
    pub(super) async fn on_server<T, Fut>(
        &mut self,
        call: impl FnOnce(S) -> Fut,
    ) -> Result<T, SourceError>
    where
        T: Send + 'static,
        Fut: Future<Output = (S, Result<T, SourceError>)> + Send + 'static,
    {
        let Some(server) = self.server.take() else {
            return Err(SourceError::definite(
                "the connection to the server was lost with a task that panicked",
            ));
        };
        if self.fleet.is_none() {
            let (server, result) = call(server).await;
            self.server = Some(server);
            return result;
        }
        let mut task = tokio::spawn(call(server));
        let shutdown = self.shutdown.clone();
        loop {
            tokio::select! {
                // A stop does not wait for a slow query either (the run ends, and
                // with it the connection).
                () = shutdown.cancelled() => {
                    task.abort();
                    return Err(SourceError::transient("stopped while the server was being asked"));
                }
                joined = &mut task => {
                    return match joined {
                        Ok((server, result)) => {
                            self.server = Some(server);
                            result
                        }
                        Err(e) => Err(SourceError::definite(format!("the server's query task failed: {e}"))),
                    };
                }
                event = fleet_event(&mut self.fleet) => match event {
                    Some(event) => {
                        self.on_fleet_event(event).await;
                    }
                    None => self.lost = true,
                },
            }
        }
    }

    /// The group's word. `true`: slots were assigned (probe them now).
    pub(super) async fn on_fleet_event(&mut self, event: FleetEvent) -> bool {
        match event {
            FleetEvent::Assigned(slots) => {
                let Some(fleet) = &mut self.fleet else {
                    return false;
                };
                fleet.owned.extend(slots.iter().copied());
                fleet.changes += 1;
                let count = fleet.slots;
                let mut databases = 0;
                for (name, stream) in &mut self.streams {
                    if slots.contains(&slot_of(name, count)) {
                        databases += 1;
                        // Read once from its checkpoint: another member may have
                        // moved it on since this one last did.
                        stream.served = None;
                        if matches!(stream.phase, Phase::Failed { .. }) {
                            stream.phase = Phase::Waiting;
                            stream.backoff.reset();
                        }
                    }
                }
                tracing::info!(
                    slots = slots.len(),
                    owned_slots = self.fleet.as_ref().map_or(0, |f| f.owned.len()),
                    databases,
                    "fleet: slots assigned to this member"
                );
                true
            }
            FleetEvent::Resized { now } => {
                let was = self.fleet.as_ref().map_or(0, |f| f.slots);
                self.resized = Some((was, now));
                false
            }
            FleetEvent::Refused(reason) => {
                self.refused = Some(reason);
                false
            }
            FleetEvent::Revoked { slots, released } => {
                let stopped = self.release(&slots).await;
                tracing::info!(
                    slots = slots.len(),
                    databases = stopped,
                    owned_slots = self.fleet.as_ref().map_or(0, |f| f.owned.len()),
                    "fleet: slots revoked; their databases stopped and checkpointed"
                );
                let _ = released.send(());
                false
            }
        }
    }

    /// Stops every database of `slots` (drained, checkpointed) and gives up the
    /// slots; returns how many databases they hold.
    async fn release(&mut self, slots: &BTreeSet<u32>) -> usize {
        let Some(fleet) = &mut self.fleet else {
            return 0;
        };
        for slot in slots {
            fleet.owned.remove(slot);
        }
        fleet.changes += 1;
        let count = fleet.slots;
        let names: Vec<String> = self
            .streams
            .keys()
            .filter(|name| slots.contains(&slot_of(name, count)))
            .cloned()
            .collect();
        self.queue.retain(|q| !names.contains(q));
        for name in &names {
            if let Some(stream) = self.streams.get(name)
                && let Phase::Active { stop, .. } = &stream.phase
            {
                stop.cancel();
            }
        }
        let active = |streams: &BTreeMap<String, Stream>| {
            names.iter().any(|name| {
                streams
                    .get(name)
                    .is_some_and(|s| matches!(s.phase, Phase::Active { .. }))
            })
        };
        while active(&self.streams) {
            let Some(joined) = self.running.join_next_with_id().await else {
                break;
            };
            self.finished(joined);
        }
        self.queue.retain(|q| !names.contains(q));
        for name in &names {
            if let Some(stream) = self.streams.get_mut(name) {
                stream.served = None;
                // Queued, or failed (before or while stopping): another member's
                // now, read by this one again only once assigned again.
                if matches!(stream.phase, Phase::Queued | Phase::Failed { .. }) {
                    stream.phase = Phase::Waiting;
                    stream.backoff.reset();
                }
            }
        }
        names.len()
    }
}

/// Whether a member with this share reads `name` (no fleet: every database).
pub(super) fn owns(fleet: Option<&Ownership>, name: &str) -> bool {
    fleet.is_none_or(|f| f.owned.contains(&slot_of(name, f.slots)))
}

/// The group's next word; never, outside a fleet.
pub(super) async fn fleet_event(fleet: &mut Option<Ownership>) -> Option<FleetEvent> {
    match fleet {
        Some(f) if !f.closed => {
            let event = f.events.recv().await;
            f.closed = event.is_none();
            event
        }
        _ => std::future::pending().await,
    }
}

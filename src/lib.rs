//! # mssql-ces
//!
//! Turns SQL Server Change Data Capture into CES events — the CloudEvents that SQL
//! Server 2025's Change Event Streaming emits — for any CDC-enabled SQL Server, and
//! delivers them to Kafka or Azure Event Hubs.
//!
//! ```text
//! SQL Server (CDC)          mssql-ces                                      destination
//! cdc.<ci>_CT ──poll──▶ source ─▶ merge/pair ─▶ event (encode) ─▶ segment ─▶ sink ─▶ Kafka / Event Hubs
//! lsn_time_mapping                                                             │
//!                          checkpoint ◀──────── delivery acks, in LSN order ◀──┘
//! ```
//!
//! The modules, in the order of the data flow; each imports only modules below it
//! in this list (`docs/src/dev/architecture.md` has the table):
//!
//! - [`commands`]: what the binary's commands do: `run` (the composition root: one
//!   run of the daemon, from a [`config::Config`] to a stopped pipeline; the
//!   embedding API is [`commands::run::run`] and [`commands::run::RunError`]),
//!   `check` (the preflight) and `read` (reading back what was written, as a
//!   consumer would).
//! - [`databases`]: many databases in one process (discovery, the probe, the queue
//!   of activations) and a fleet of processes sharing them (`databases::fleet`).
//! - [`config`]: the TOML file and its overrides; it composes the sections that each
//!   stage keeps beside its code.
//! - [`pipeline`]: the stages wired with bounded channels and ordered acknowledgement;
//!   [`metrics`]: Prometheus metrics and health probes over HTTP.
//! - [`source`]: the `ChangeSource` seam, SQL Server over tiberius, the synthetic
//!   workload, merge/pairing, and the poller (`source::poller`: one
//!   iteration, capture-instance tracking, the initial load's runner).
//! - [`sink`]: routing (topic, key, CloudEvents mode) and destinations.
//! - [`checkpoint`]: where the position survives restarts, as a versioned document.
//! - [`event`]: one paired change → the exact CES messages on the wire: value text
//!   forms, JSON and Avro encodings, 1 MiB truncation, segmentation, read-back.
//! - [`mssql`]: the one SQL Server connection (time-outs, reconnects, error kinds),
//!   used by the source and by the table checkpoint store.
//! - [`position`]: where a stream stands — the checkpoint's content, owned by neither
//!   the poller that produces it nor the stores that keep it.
//! - [`setting`]: the primitives of every setting (its error, secrets, durations).
//! - [`backoff`]: the one exponential backoff of every retry loop.
//! - [`lsn`]: the 10-byte log sequence number and its text forms.

// A `pub` item no one outside its module can reach is a mistake in the public
// surface (CI's clippy runs with -D warnings, so this is enforced).
#![warn(unreachable_pub)]

pub mod backoff;
pub mod checkpoint;
pub mod commands;
pub mod config;
pub mod databases;
pub mod error;
pub mod event;
pub mod glob;
pub mod kafka_client;
pub mod lsn;
pub mod metrics;
pub mod mssql;
pub mod pipeline;
pub mod position;
pub mod setting;
pub mod sink;
pub mod source;
#[cfg(test)]
pub(crate) mod test_log;

// The simulator of a CDC database (crates/cdc-sim) names this crate `mssql_ces`; so
// does this crate, so that the simulator's source also compiles into its unit tests
// as `cdc_sim` below. (A dev-dependency on the simulator crate would bring this
// crate's types in a second time, which the unit tests' own could not be given.)
extern crate self as mssql_ces;
#[cfg(test)]
#[path = "../crates/cdc-sim/src/lib.rs"]
#[allow(unreachable_pub, dead_code)]
pub(crate) mod cdc_sim;

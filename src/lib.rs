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
//! - [`lsn`]: the 10-byte log sequence number and its text forms.
//! - [`source`]: the `ChangeSource` seam, SQL Server over tiberius, the CDC simulator,
//!   the synthetic workload, merge/pairing and the poll loop.
//! - [`event`]: one paired change → the exact CES messages on the wire: value text
//!   forms, JSON and Avro encodings, 1 MiB truncation, segmentation, read-back.
//! - [`sink`]: routing (topic, key, CloudEvents mode) and destinations.
//! - [`checkpoint`]: where the position survives restarts.
//! - [`pipeline`]: the stages wired with bounded channels and ordered acknowledgement.
//! - [`config`]: the TOML configuration and its overrides.
//! - [`check`]: the preflight of `mssql-ces check`.
//! - [`app`]: one run of the daemon, from a configuration to a stopped pipeline.
//! - [`metrics`]: Prometheus metrics and health probes over HTTP.
//! - [`read`]: reading back what was written, as a consumer would (`mssql-ces read`).

pub mod app;
pub mod check;
pub mod checkpoint;
pub mod config;
pub mod event;
pub mod lsn;
pub mod metrics;
pub mod position;
pub mod read;
pub mod setting;
pub mod pipeline;
pub mod sink;
pub mod source;

//! # mssql-ces
//!
//! Turns SQL Server Change Data Capture into CES events — the CloudEvents that SQL
//! Server 2025's Change Event Streaming emits — for any CDC-enabled SQL Server.
//!
//! ```text
//! SQL Server (CDC)          mssql-ces                                     destination
//! cdc.<ci>_CT ──poll──▶ source ─▶ merge/pair ─▶ event (encode) ─▶ segment ─▶ sink ─▶ Kafka / Event Hubs
//! lsn_time_mapping                                                            │
//!                          checkpoint ◀──────── delivery acks, in LSN order ◀─┘
//! ```
//!
//! - [`lsn`]: the 10-byte log sequence number and its text forms.
//! - [`event`]: one paired change → the exact CES messages on the wire: value text
//!   forms, JSON and Avro encodings, 1 MiB truncation, segmentation, read-back.

pub mod event;
pub mod lsn;
pub mod source;

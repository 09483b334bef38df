//! The suites that run the real binary as a user does (`run`, `check`, `read`,
//! metrics, SIGKILL and restart).

#![recursion_limit = "256"]

use mssql_ces_testkit as support;

mod apache_kafka;
mod apache_kafka_secured;
mod check;
mod cleanup_binary;
mod debezium_binary;
mod docs;
mod fleet;
mod harness;
mod load_binary;
mod managed_binary;
mod metrics_binary;
mod reference;
mod resnapshot_binary;
mod run_binary;
mod standin_binary;

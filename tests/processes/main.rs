//! The suites that run the real binary as a user does (`run`, `check`, `read`,
//! metrics, SIGKILL and restart) and the one that installs a process-global tracing
//! subscriber as the binary does (`event_hubs_amqp_released`), kept out of the
//! in-process binary so that its subscriber sees only its own test.

#![recursion_limit = "256"]

use mssql_ces_testkit as support;

mod apache_kafka;
mod apache_kafka_secured;
mod binary;
mod check;
mod debezium_binary;
mod docs;
mod event_hubs_amqp_released;
mod fleet;
mod managed_binary;
mod metrics_binary;
mod reference;
mod run_binary;
mod standin_binary;

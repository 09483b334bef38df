//! The in-process suites: the library's stages wired together against the CDC
//! simulator, the TDS stand-in (the real driver over loopback), rdkafka's
//! `MockCluster` and a local AMQP peer (the doubles are `crates/testkit`). One
//! binary, so that librdkafka, tiberius and the Azure SDK link once for all of them.

#![recursion_limit = "256"]

use mssql_ces_testkit as support;

mod cdc_scenarios;
mod cdc_simulator;
mod ces_conformance;
mod cleanup;
mod column_rules;
mod commit_times;
mod common;
mod debezium_sinks;
mod event_hubs_amqp;
mod event_hubs_amqp_binary;
mod event_hubs_amqp_large;
mod event_hubs_amqp_partitions;
mod event_hubs_amqp_rejected;
mod event_hubs_amqp_released;
mod initial_load;
mod kafka_checkpoint;
mod kafka_pipeline;
mod kafka_sasl;
mod managed_capture;
mod many_databases;
mod parallel_load;
mod pipeline_faults;
mod query_cost;
mod readback;
mod resnapshot;
mod schema_change_events;
mod schema_changes;
mod schema_registry;
mod segmentation;
mod synthetic_workload;
mod table_lease;
mod tds_standin;

//! Event Hubs over AMQP, structured mode with the primary key as partition key: the
//! pipeline's AMQP sink (`azure_messaging_eventhubs`' `ProducerClient`) against a local
//! AMQP 1.0 peer built with `fe2o3-amqp` (`support::amqp_peer`).

use crate::support;

use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_events_arrive_with_body_content_type_and_partition_key() {
    support::event_hubs::deliver(PartitionKeyScheme::PrimaryKey, CloudEventsMode::Structured).await;
}

//! Event Hubs over AMQP, binary mode with no key: CloudEvents attributes arrive as
//! `cloudEvents:` application properties, and each event's segments share a partition
//! key derived from the event (see `tests/event_hubs_amqp.rs`).

use crate::support;

use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_events_arrive_with_cloudevents_application_properties() {
    support::event_hubs::deliver(PartitionKeyScheme::None, CloudEventsMode::Binary).await;
}

//! The Debezium envelope through the pipeline into Kafka (`MockCluster`) and Event
//! Hubs over AMQP (the local peer): keys, null-valued tombstones, the `id` header,
//! the transaction topic.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mssql_ces::event::Encoding;
use mssql_ces::event::debezium::DebeziumSettings;
use mssql_ces::pipeline::RunSummary;
use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};
use mssql_ces::sink::{Router, Sink};
use mssql_ces::source::synthetic::SyntheticConfig;
use rdkafka::mocking::MockCluster;
use support::kafka::{consume, consume_quietly};

use crate::kafka_pipeline::kafka_sink_with;

/// The tables' topic suffixes: Kafka allows no space, Debezium writes `_`.
const TABLES: [&str; 3] = ["dbo.customers", "dbo.orders", "sales.order_details"];

fn synthetic() -> SyntheticConfig {
    SyntheticConfig {
        seed: 9,
        transactions: Some(80),
        rate_per_second: None,
        large_value_every: 0,
        existing_rows: 0,
        oversized_value_every: 0,
    }
}

fn router(settings: DebeziumSettings) -> Router {
    Router::new(
        settings.topic_template(),
        PartitionKeyScheme::PrimaryKey,
        None,
        CloudEventsMode::Structured,
        Encoding::Json,
        "g",
    )
    .with_debezium(mssql_ces::sink::DebeziumRouting {
        settings: Arc::new(settings),
        open: None,
        bound: mssql_ces::event::debezium::RecordBound::NONE,
    })
}

async fn run(router: Router, sink: Sink) -> RunSummary {
    crate::common::run_synthetic(synthetic(), Encoding::Json, router, sink)
        .await
        .expect("run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_gets_keys_null_tombstones_and_the_transaction_topic() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    for table in TABLES {
        cluster
            .create_topic(&format!("srv.synthetic.{table}"), 2, 1)
            .expect("topic");
    }
    cluster
        .create_topic("srv.transaction", 1, 1)
        .expect("topic");
    let settings = DebeziumSettings {
        topic_prefix: "srv".into(),
        provide_transaction_metadata: true,
        ..DebeziumSettings::default()
    };
    let summary = run(
        router(settings),
        Sink::Kafka(kafka_sink_with(&bootstrap, None)),
    )
    .await;
    let mut total = 0;
    let mut ops: BTreeMap<String, u64> = BTreeMap::new();
    for table in TABLES {
        let topic = format!("srv.synthetic.{table}");
        let messages = consume_quietly(
            &bootstrap,
            &topic,
            2,
            Duration::from_secs(20),
            Duration::from_millis(500),
            |m| !m.is_empty(),
        );
        total += messages.len() as u64;
        let mut last_delete_key: BTreeMap<i32, Option<Vec<u8>>> = BTreeMap::new();
        for m in &messages {
            let id = m
                .headers
                .iter()
                .find(|(n, _)| n == "id")
                .expect("id header");
            assert_eq!(id.1.len(), 36);
            let key: serde_json::Value =
                serde_json::from_slice(m.key.as_deref().expect("keyed")).expect("key json");
            assert!(key["schema"]["name"].as_str().unwrap().ends_with(".Key"));
            if m.null_payload {
                assert_eq!(
                    last_delete_key.get(&m.partition),
                    Some(&m.key),
                    "the tombstone follows its delete"
                );
                *ops.entry("tombstone".into()).or_default() += 1;
                continue;
            }
            let value: serde_json::Value = serde_json::from_slice(&m.payload).expect("value json");
            let op = value["payload"]["op"].as_str().expect("op").to_owned();
            assert_eq!(
                value["payload"]["transaction"]["id"],
                value["payload"]["source"]["commit_lsn"]
            );
            if op == "d" {
                last_delete_key.insert(m.partition, m.key.clone());
            }
            *ops.entry(op).or_default() += 1;
        }
    }
    assert_eq!(ops.get("d"), ops.get("tombstone"), "{ops:?}");
    assert!(ops.contains_key("c") && ops.contains_key("u"), "{ops:?}");
    let transactions = consume(
        &bootstrap,
        "srv.transaction",
        1,
        Duration::from_secs(30),
        |m| m.len() >= 160,
    );
    assert_eq!(
        transactions.len(),
        160,
        "BEGIN and END of each of the 80 transactions"
    );
    assert_eq!(total + 160, summary.delivered_messages);
    let mut events_in_ends = 0;
    for pair in transactions.chunks(2) {
        let begin: serde_json::Value = serde_json::from_slice(&pair[0].payload).expect("json");
        let end: serde_json::Value = serde_json::from_slice(&pair[1].payload).expect("json");
        assert_eq!(begin["payload"]["status"], "BEGIN");
        assert_eq!(end["payload"]["status"], "END");
        assert_eq!(begin["payload"]["id"], end["payload"]["id"]);
        events_in_ends += end["payload"]["event_count"].as_u64().expect("count");
    }
    // Every data event is counted by its transaction's END (tombstones are not events).
    assert_eq!(events_in_ends, total - ops["tombstone"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_hubs_over_amqp_gets_the_envelope_keyed_without_tombstones() {
    let (sink, arrivals) = support::event_hubs::peer_and_sink(Duration::from_secs(2)).await;
    let settings = DebeziumSettings {
        topic_prefix: "srv".into(),
        tombstones_on_delete: false,
        schemas_enable: false,
        ..DebeziumSettings::default()
    };
    let summary = run(router(settings), Sink::EventHubsAmqp(Box::new(sink))).await;
    let arrived = arrivals.events.lock().expect("lock").clone();
    let mut distinct = std::collections::HashSet::new();
    for a in &arrived {
        let value: serde_json::Value = serde_json::from_slice(&a.body).expect("json body");
        assert!(
            value.get("schema").is_none(),
            "schemas_enable = false: the payload alone"
        );
        assert!(["c", "u", "d"].contains(&value["op"].as_str().expect("op")));
        let key = a
            .partition_key
            .as_deref()
            .expect("the key is the partition key");
        let key: serde_json::Value = serde_json::from_str(key).expect("key json");
        let image = if value["op"] == "d" {
            "before"
        } else {
            "after"
        };
        for (column, v) in key.as_object().expect("key object") {
            assert_eq!(&value[image][column], v);
        }
        distinct.insert(a.message_id.clone().expect("message id"));
    }
    assert_eq!(
        distinct.len() as u64,
        summary.delivered_messages,
        "one id per message"
    );
}

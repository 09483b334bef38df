//! Avro with a schema registry (the REST double in `crates/testkit`), into Kafka
//! (`MockCluster`): the Confluent wire format, subjects, the registry down for a
//! while and refusing a schema; CES's `ChangeEvent` and Debezium's envelope.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use apache_avro::types::Value as Avro;
use mssql_ces::event::Encoding;
use mssql_ces::event::debezium::DebeziumSettings;
use mssql_ces::pipeline::{PipelineError, RunSummary};
use mssql_ces::sink::registry::{SchemaRegistrySettings, SubjectNameStrategy};
use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};
use mssql_ces::sink::{Router, Sink};
use mssql_ces::source::synthetic::SyntheticConfig;
use rdkafka::mocking::MockCluster;
use support::kafka::{Consumed, consume};
use support::registry::RegistryDouble;

use crate::kafka_pipeline::kafka_sink_with;

fn synthetic(transactions: u64) -> SyntheticConfig {
    SyntheticConfig {
        seed: 5,
        transactions: Some(transactions),
        rate_per_second: None,
        large_value_every: 0,
        existing_rows: 0,
        oversized_value_every: 0,
    }
}

fn registry_settings(url: &str) -> SchemaRegistrySettings {
    SchemaRegistrySettings {
        url: url.into(),
        username: None,
        password: Default::default(),
        ca_location: None,
        subject_name_strategy: SubjectNameStrategy::Topic,
        request_timeout_ms: 2_000,
    }
}

async fn run(
    bootstrap: &str,
    router: Router,
    transactions: u64,
) -> Result<RunSummary, PipelineError> {
    let sink = Sink::Kafka(kafka_sink_with(bootstrap, None));
    crate::common::run_synthetic(synthetic(transactions), Encoding::Avro, router, sink).await
}

/// The schema id and datum of a wire-format message.
fn unwire(bytes: &[u8]) -> (u32, &[u8]) {
    assert_eq!(bytes[0], 0, "magic byte");
    let id = u32::from_be_bytes(bytes[1..5].try_into().expect("4 bytes"));
    (id, &bytes[5..])
}

/// Decodes with apache-avro and the schema the registry holds for the id.
fn decode(registry: &RegistryDouble, bytes: &[u8]) -> Avro {
    let (id, mut datum) = unwire(bytes);
    let text = registry.schema(id).expect("the id is registered");
    let schema = apache_avro::Schema::parse_str(&text).expect("the registered schema parses");
    let value = mssql_ces::event::avro::read_datum(&schema, &mut datum).expect("the datum decodes");
    assert!(datum.is_empty(), "the whole datum is read");
    value
}

fn field<'a>(record: &'a Avro, name: &str) -> &'a Avro {
    let Avro::Record(fields) = record else {
        panic!("not a record: {record:?}");
    };
    let value = &fields.iter().find(|(n, _)| n == name).expect(name).1;
    match value {
        Avro::Union(_, inner) => inner,
        other => other,
    }
}

/// CES events in Avro to `topic`, keyed by table, their schemas registered at
/// `registry` (waited for up to `wait`).
fn ces_avro_router(topic: &str, registry: &str, wait: Duration) -> Router {
    Router::new(
        topic,
        PartitionKeyScheme::Table,
        None,
        CloudEventsMode::Structured,
        Encoding::Avro,
        "g",
    )
    .with_registry(Some(registry_settings(registry)), wait)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ces_avro_goes_out_in_the_wire_format_once_the_registry_is_back() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces-reg", 2, 1).expect("topic");
    let registry = RegistryDouble::start().await;
    registry.set_down(true);
    let router = ces_avro_router("ces-reg", &registry.url, Duration::from_secs(60));
    // Down for a while: waited for, then everything goes.
    let (summary, ()) = tokio::join!(run(&bootstrap, router, 40), async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        registry.set_down(false);
    });
    let summary = summary.expect("run");
    assert!(registry.posts() > 1, "asked again while down");
    let messages = consume(&bootstrap, "ces-reg", 2, Duration::from_secs(30), |m| {
        m.len() as u64 >= summary.delivered_messages
    });
    assert_eq!(messages.len() as u64, summary.delivered_messages);
    let subjects = registry.subjects();
    assert_eq!(subjects.keys().collect::<Vec<_>>(), ["ces-reg-value"]);
    let id = subjects["ces-reg-value"][0];
    assert_eq!(
        registry.schema(id).as_deref(),
        Some(mssql_ces::event::avro::CHANGE_EVENT_SCHEMA)
    );
    let decoded = python_decode(&registry, "ces-reg", &messages, "string").await;
    assert_eq!(decoded.len(), messages.len());
    for (d, m) in decoded.iter().zip(&messages) {
        let event =
            mssql_ces::event::readback::decode_message(&m.payload, Encoding::Avro).expect("CES");
        assert_eq!(d["value"]["logicalid"], event.logicalid.as_str());
        assert_eq!(d["value"]["specversion"], "1.0");
    }
    for m in &messages {
        let (message_id, datum) = unwire(&m.payload);
        assert_eq!(message_id, id);
        // The datum is the structured message CES Avro always was.
        let event = mssql_ces::event::readback::decode_message(datum, Encoding::Avro).expect("CES");
        let decoded = decode(&registry, &m.payload);
        assert_eq!(field(&decoded, "logicalid"), &Avro::String(event.logicalid));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_the_registry_refuses_stops_the_run_naming_the_subject() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces-refused", 1, 1).expect("topic");
    let registry = RegistryDouble::start().await;
    registry.preload("ces-refused-value", r#"{"type":"string"}"#);
    registry.set_incompatible("ces-refused-value");
    let router = ces_avro_router("ces-refused", &registry.url, Duration::from_secs(60));
    let err = run(&bootstrap, router, 5).await.expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("ces-refused-value") && text.contains("incompatible"),
        "{text}"
    );
    assert_eq!(registry.posts(), 1, "a refusal is not retried");
}

/// Decodes `messages` with the Confluent Python client's `AvroDeserializer` against
/// the registry (an independent reader; CI installs it, see `.ci/run`): one JSON
/// value per message.
async fn python_decode(
    registry: &RegistryDouble,
    topic: &str,
    messages: &[Consumed],
    keys: &str,
) -> Vec<serde_json::Value> {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let lines: String = messages
        .iter()
        .map(|m| {
            let value = if m.null_payload {
                String::new()
            } else {
                hex(&m.payload)
            };
            format!(
                "{topic}\t{}\t{value}\n",
                m.key.as_deref().map(hex).unwrap_or_default()
            )
        })
        .collect();
    let path = std::env::temp_dir().join(format!("mssql-ces-avro-{}.tsv", uuid::Uuid::new_v4()));
    std::fs::write(&path, lines).expect("write");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/readers/avro_deserialize.py"
    );
    let mut command = std::process::Command::new(support::tools::python());
    command.arg(script).arg(&registry.url).arg(&path).arg(keys);
    // The reader asks the registry double, which runs on this runtime: wait for it
    // on a blocking thread.
    let output = tokio::task::spawn_blocking(move || {
        support::tools::output_within(
            &mut command,
            std::time::Duration::from_secs(120),
            "the Confluent AvroDeserializer",
        )
    })
    .await
    .expect("the reader's thread");
    std::fs::remove_file(&path).ok();
    assert!(
        output.status.success(),
        "the Confluent AvroDeserializer failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

fn consumed_ops(registry: &RegistryDouble, messages: &[Consumed]) -> BTreeMap<String, usize> {
    let mut ops = BTreeMap::new();
    for m in messages {
        if m.null_payload {
            *ops.entry("tombstone".into()).or_default() += 1;
            continue;
        }
        let value = decode(registry, &m.payload);
        let op = match field(&value, "op") {
            Avro::String(op) => op.clone(),
            other => panic!("{other:?}"),
        };
        // The key decodes with its own schema and names the row the value has.
        let key = decode(registry, m.key.as_deref().expect("keyed"));
        let image = if op == "d" { "before" } else { "after" };
        assert_eq!(field(&key, "id"), field(field(&value, image), "id"));
        let source = field(&value, "source");
        assert_eq!(
            field(source, "connector"),
            &Avro::String("sqlserver".into())
        );
        *ops.entry(op).or_default() += 1;
    }
    ops
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_avro_keys_and_values_decode_with_the_registered_schemas() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    let topic = "srv.synthetic.dbo.customers";
    for t in [
        topic,
        "srv.synthetic.dbo.orders",
        "srv.synthetic.sales.order_details",
    ] {
        cluster.create_topic(t, 1, 1).expect("topic");
    }
    let registry = RegistryDouble::start().await;
    let settings = DebeziumSettings {
        topic_prefix: "srv".into(),
        ..DebeziumSettings::default()
    };
    let router = Router::new(
        settings.topic_template(),
        PartitionKeyScheme::PrimaryKey,
        None,
        CloudEventsMode::Structured,
        Encoding::Avro,
        "g",
    )
    .with_registry(
        Some(registry_settings(&registry.url)),
        Duration::from_secs(60),
    )
    .with_debezium(mssql_ces::sink::DebeziumRouting {
        settings: std::sync::Arc::new(settings),
        open: None,
        bound: mssql_ces::event::debezium::RecordBound::NONE,
    });
    let summary = run(&bootstrap, router, 60).await.expect("run");
    assert!(summary.delivered_messages > 0);
    let subjects = registry.subjects();
    assert!(
        subjects.contains_key(&format!("{topic}-key")),
        "{subjects:?}"
    );
    assert!(
        subjects.contains_key(&format!("{topic}-value")),
        "{subjects:?}"
    );
    let messages = consume(&bootstrap, topic, 1, Duration::from_secs(20), |m| {
        !m.is_empty()
    });
    let messages = consume(&bootstrap, topic, 1, Duration::from_secs(20), |m| {
        m.len() >= messages.len() && m.len() > 5
    });
    let ops = consumed_ops(&registry, &messages);
    // The Confluent client reads the same records the same way.
    let decoded = python_decode(&registry, topic, &messages, "avro").await;
    let mut python_ops = BTreeMap::new();
    for d in &decoded {
        let op = match d["value"]["op"].as_str() {
            Some(op) => {
                let image = if op == "d" { "before" } else { "after" };
                assert_eq!(d["key"]["id"], d["value"][image]["id"], "{d}");
                assert_eq!(d["value"]["source"]["connector"], "sqlserver");
                op.to_owned()
            }
            None => {
                assert!(d["value"].is_null());
                "tombstone".to_owned()
            }
        };
        *python_ops.entry(op).or_insert(0usize) += 1;
    }
    assert_eq!(python_ops, ops);
    assert!(ops.contains_key("c") && ops.contains_key("u"), "{ops:?}");
    assert_eq!(
        ops.get("d"),
        ops.get("tombstone"),
        "a tombstone after each delete"
    );
    // One value schema per table version: registered once, ids cached.
    assert_eq!(subjects[&format!("{topic}-value")].len(), 1);
}

#[tokio::test]
async fn basic_authentication_and_the_check_probe() {
    let registry = RegistryDouble::start().await;
    registry.require_auth("api-key", "s3cret-value");
    // SAFETY: a variable of this test's own.
    unsafe { std::env::set_var("MSSQL_CES_TEST_REGISTRY_PASSWORD", "s3cret-value") };
    let settings = SchemaRegistrySettings {
        username: Some("api-key".into()),
        password: mssql_ces::setting::SecretRef {
            env: Some("MSSQL_CES_TEST_REGISTRY_PASSWORD".into()),
            file: None,
        },
        ..registry_settings(&registry.url)
    };
    let mut client = mssql_ces::sink::registry::SchemaRegistry::new(&settings).expect("client");
    assert_eq!(client.probe().await, Ok(0));
    let id = client
        .id("t-value", r#"{"type":"string"}"#)
        .await
        .expect("registered");
    assert_eq!(client.id("t-value", r#"{"type":"string"}"#).await, Ok(id));
    assert_eq!(client.requests, 1, "the id is cached");
    let anonymous = registry_settings(&registry.url);
    let mut client = mssql_ces::sink::registry::SchemaRegistry::new(&anonymous).expect("client");
    let err = client.probe().await.expect_err("refused");
    assert!(
        !err.is_transient() && err.to_string().contains("not authorized"),
        "{err}"
    );
    let err = client
        .id("t-value", r#"{"type":"int"}"#)
        .await
        .expect_err("refused");
    assert!(
        err.to_string().contains("sink.schema_registry.username"),
        "{err}"
    );
    assert!(!err.to_string().contains("s3cret"), "no secret in messages");
    registry.set_down(true);
    let err = client.probe().await.expect_err("down");
    assert!(err.is_transient(), "{err}");
    // Nothing listens: transient, not refused.
    let gone = registry_settings("http://127.0.0.1:9");
    let err = mssql_ces::sink::registry::SchemaRegistry::new(&gone)
        .expect("client")
        .probe()
        .await
        .expect_err("no registry");
    assert!(err.is_transient(), "{err}");
}

/// A shutdown while the registry is down ends the run within the drain timeout: the
/// encoder's wait for the registry (a request, or the pause between two) ends with
/// it, though the registry is waited for up to the delivery timeout otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_during_a_registry_outage_keeps_its_bound() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces-down", 2, 1).expect("topic");
    let registry = RegistryDouble::start().await;
    registry.set_down(true);
    let router = ces_avro_router("ces-down", &registry.url, Duration::from_secs(120));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let settings = mssql_ces::pipeline::PipelineSettings {
        drain_timeout: Duration::from_secs(2),
        until_idle: false,
        ..crate::kafka_pipeline::until_idle()
    };
    let run = crate::common::run_synthetic_with(
        synthetic(40),
        Encoding::Avro,
        router,
        Sink::Kafka(kafka_sink_with(&bootstrap, None)),
        settings,
        shutdown.clone(),
    );
    let stopped = async {
        // Long enough for the backoff to reach pauses of seconds.
        tokio::time::sleep(Duration::from_secs(3)).await;
        shutdown.cancel();
        std::time::Instant::now()
    };
    let (result, signalled) = tokio::join!(run, stopped);
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "stopped {took:?} after the shutdown, with a 2 s drain timeout"
    );
    assert!(
        registry.posts() > 1,
        "the registry was asked again while down"
    );
    // Nothing was delivered: the run's error, if any, is the registry's.
    if let Ok(summary) = result {
        assert_eq!(summary.delivered_events, 0, "{summary:?}");
    }
}

/// `ALTER TABLE dbo.T ADD Qty int NOT NULL DEFAULT …` while the table streams in
/// Debezium's Avro (managed capture instances, so the new instance carries `Qty`):
/// the value schemas of the events before and after, registered in order under
/// the table's subject as the pipeline registers them; the registry's answer to
/// the last.
async fn register_across_an_added_column(
    definition: &str,
) -> (
    Result<u32, mssql_ces::sink::registry::RegistryError>,
    String,
) {
    use cdc_sim::SimColumn;
    use mssql_ces::event::Value;
    use mssql_ces::event::debezium::DebeziumEncoder;
    use mssql_ces::event::value::SqlType;
    use mssql_ces::source::poller::{CaptureInstanceMode, Poller, PollerConfig};

    let sim = crate::common::shop_with_t(0);
    sim.enable_table("dbo.T", None).expect("enable");
    let config = PollerConfig {
        catalog_refresh: Duration::ZERO,
        unreadable_grace: Duration::ZERO,
        capture_instances: CaptureInstanceMode::Managed,
        ..PollerConfig::default()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    let settings = DebeziumSettings {
        topic_prefix: "srv".into(),
        ..DebeziumSettings::default()
    };
    let mut encoder = DebeziumEncoder::new(
        std::sync::Arc::new(settings),
        uuid::Uuid::nil(),
        mssql_ces::event::debezium::RecordBound::NONE,
        None,
    )
    .with_avro(true);
    let registry = RegistryDouble::start().await;
    let mut client =
        mssql_ces::sink::registry::SchemaRegistry::new(&registry_settings(&registry.url))
            .expect("client");
    let subject = "srv.Shop.dbo.T-value";
    let mut last = None;
    let mut value_schema = String::new();
    let write = |rows: Vec<Value>| {
        sim.transaction()
            .insert("dbo.T", rows)
            .commit()
            .expect("commit");
    };
    write(vec![Value::Int(1), Value::Text("a".into())]);
    let mut round = 0;
    loop {
        for item in crate::common::drain_items(&mut poller).await.expect("poll") {
            let crate::common::Item::Change(change) = item else {
                continue;
            };
            for record in encoder.encode(&change).expect("encode") {
                let Some((schema, _)) = record.avro.and_then(|a| a.value) else {
                    continue;
                };
                value_schema = schema.to_string();
                last = Some(client.id(subject, &schema).await);
            }
        }
        round += 1;
        match round {
            1 => {
                sim.add_column(
                    "dbo.T",
                    SimColumn::not_null("Qty", SqlType::Int).with_default(definition),
                    Value::Int(0),
                )
                .expect("add column");
                write(vec![Value::Int(2), Value::Text("b".into()), Value::Int(5)]);
            }
            2 => write(vec![Value::Int(3), Value::Text("c".into()), Value::Int(6)]),
            _ => break,
        }
    }
    assert!(
        value_schema.contains("\"Qty\""),
        "the last event has the new column: {value_schema}"
    );
    (last.expect("registered"), value_schema)
}

#[tokio::test]
async fn an_added_not_null_column_with_a_constant_default_passes_a_backward_registry() {
    let (answer, schema) = register_across_an_added_column("((0))").await;
    answer.expect("BACKWARD-compatible: the new field has a default");
    assert!(
        schema.contains(r#"{"name":"Qty","type":{"type":"int","connect.default":0},"default":0}"#),
        "{schema}"
    );
    // Without a constant (an expression Debezium does not evaluate), the field has
    // no default and the registry refuses the schema, as Confluent's does.
    let (answer, schema) = register_across_an_added_column("((1)+(1))").await;
    assert!(!schema.contains("\"default\":0"), "{schema}");
    let refusal = answer.expect_err("refused").to_string();
    assert!(
        refusal.contains("409") || refusal.contains("incompatible"),
        "{refusal}"
    );
}

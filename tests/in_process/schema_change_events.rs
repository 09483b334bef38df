//! Schema-change events (`sink.schema_changes`): a table's shape announced before its
//! first event, each change of it between the last event of the old shape and the
//! first of the new one, the same event again after a restart, and — through Kafka —
//! in the table's own partition (`inline`) or a topic of their own (`topic`).

use crate::common::{Item, schema_events};
use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::readback::{Reassembler, decode_message};
use mssql_ces::event::schema_change::{SCHEMA_CHANGE_TYPE, SchemaChange, SchemaChangeReason};
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::event::{
    EVENT_TYPE, EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit, Value,
};
use mssql_ces::pipeline;
use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme, SchemaChangePlacement};
use mssql_ces::sink::{Router, Sink};
use mssql_ces::source::poller::{Poller, PollerConfig};
use rdkafka::mocking::MockCluster;
use tokio_util::sync::CancellationToken;

/// Polls until idle: every event in stream order.
async fn drain(poller: &mut Poller<CdcSimulator>) -> Vec<Item> {
    crate::common::drain_items(poller).await.expect("poll")
}

fn config(schema_changes: bool) -> PollerConfig {
    PollerConfig {
        catalog_refresh: Duration::ZERO,
        unreadable_grace: Duration::ZERO,
        schema_changes,
        ..PollerConfig::default()
    }
}

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

fn names(event: &SchemaChange) -> Vec<&str> {
    event.after.cols.iter().map(|c| c.name.as_str()).collect()
}

/// `dbo.T (Id int PRIMARY KEY, Name nvarchar(50) NOT NULL)` enabled, one row.
fn database() -> CdcSimulator {
    let sim = crate::common::shop_with(
        0,
        SimColumn::not_null("Name", SqlType::NVarChar(Length::Bounded(50))),
    );
    sim.enable_table("dbo.T", None).expect("enable");
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(1), text("a")])
        .commit()
        .expect("commit");
    sim
}

/// A column added and captured the documented way: a second capture instance and
/// a row through it; the first instance is disabled once the stream switched
/// ([`retire_first`]).
fn add_email(sim: &CdcSimulator) {
    sim.add_column(
        "dbo.T",
        SimColumn::new("Email", SqlType::NVarChar(Length::Bounded(80))),
        Value::Null,
    )
    .expect("add column");
    sim.enable_table("dbo.T", Some("dbo_T_v2"))
        .expect("enable v2");
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(2), text("b"), text("b@example.com")],
        )
        .commit()
        .expect("commit");
}

fn retire_first(sim: &CdcSimulator) {
    sim.disable_instance("dbo_T");
}

#[tokio::test]
async fn a_table_is_announced_first_and_each_change_between_its_shapes() {
    let sim = database();
    let mut poller = Poller::new(sim.clone(), config(true), None);
    let items = drain(&mut poller).await;
    let Item::Schema(first) = &items[0] else {
        panic!("the table's shape comes before its first event: {items:?}");
    };
    let Item::Change(insert) = &items[1] else {
        panic!("then the event");
    };
    assert_eq!(first.reason, SchemaChangeReason::Initial);
    assert_eq!((first.version, first.before.clone()), (1, None));
    assert_eq!(first.lsn, insert.commit_lsn);
    assert_eq!(first.time, insert.commit_time);
    assert_eq!(first.after.capture_instance, "dbo_T");
    type Described<'a> = (&'a str, &'a str, u32, Option<bool>, Option<u32>);
    let cols: Vec<Described> = first
        .after
        .cols
        .iter()
        .map(|c| {
            (
                c.name.as_str(),
                c.sql_type.as_str(),
                c.index,
                c.nullable,
                c.key_position,
            )
        })
        .collect();
    assert_eq!(
        cols,
        [
            ("Id", "int", 0, Some(false), Some(1)),
            ("Name", "nvarchar(50)", 1, Some(false), None)
        ]
    );
    assert!(first.ddl.is_empty());
    let before_add = poller.position().clone();

    add_email(&sim);
    let items = drain(&mut poller).await;
    retire_first(&sim);
    assert_eq!(items.len(), 2, "{items:?}");
    let (Item::Schema(added), Item::Change(change)) = (&items[0], &items[1]) else {
        panic!("the change comes first: {items:?}");
    };
    assert_eq!(
        (added.version, added.reason),
        (2, SchemaChangeReason::Changed)
    );
    assert_eq!(added.before.as_deref(), Some(&*first.after));
    assert_eq!(added.after.capture_instance, "dbo_T_v2");
    assert_eq!(names(added), ["Id", "Name", "Email"]);
    assert_eq!(added.after.cols[2].nullable, Some(true));
    assert_eq!(added.lsn, change.commit_lsn);
    assert_eq!(change.table.columns().len(), 3);
    // The ALTER TABLE the capture job recorded for the old instance.
    assert_eq!(added.ddl.len(), 1, "{:?}", added.ddl);
    assert!(
        added.ddl[0].command.contains("ADD [Email]"),
        "{:?}",
        added.ddl
    );
    assert!(added.ddl[0].lsn > first.lsn && added.ddl[0].lsn < added.lsn);
    let after_add = poller.position().clone();

    // A captured column dropped: left out from then on.
    sim.drop_column("dbo.T", "Email").expect("drop");
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(3), text("c")])
        .commit()
        .expect("commit");
    let items = drain(&mut poller).await;
    let dropped = schema_events(&items);
    assert_eq!(dropped.len(), 1);
    let dropped = dropped[0].clone();
    assert_eq!(
        (dropped.version, dropped.reason),
        (3, SchemaChangeReason::Changed)
    );
    assert_eq!(dropped.before.as_deref(), Some(&*added.after));
    assert_eq!(names(&dropped), ["Id", "Name"]);
    assert_eq!(dropped.after.capture_instance, "dbo_T_v2");
    assert_eq!(dropped.ddl.len(), 1, "only the DDL since version 2");
    assert!(dropped.ddl[0].command.contains("DROP COLUMN [Email]"));
    assert!(
        drain(&mut poller).await.is_empty(),
        "nothing new, nothing sent"
    );

    // A restart from before the drop sends the same event again, byte for byte.
    let mut restarted = Poller::new(sim.clone(), config(true), Some(after_add));
    assert_eq!(schema_events(&drain(&mut restarted).await), [&dropped]);
    // From before the column was added, once the old instance is gone: its changes
    // are gone with it (the instance was disabled before the stream got there),
    // and so is its DDL history.
    // What is left to read is the new instance's rows. Row 2, committed before the
    // drop, still holds Email in the change table and carries it; row 3 does not:
    // the switch of capture instance is announced without DDL (gone with the old
    // instance), the drop at row 3 with its DDL.
    let mut again = Poller::new(sim.clone(), config(true), Some(before_add));
    let items = drain(&mut again).await;
    let events = schema_events(&items);
    assert_eq!(events.len(), 2, "{items:?}");
    assert_eq!(
        (events[0].version, events[0].after.capture_instance.as_str()),
        (2, "dbo_T_v2")
    );
    assert_eq!(names(events[0]), ["Id", "Name", "Email"]);
    assert!(events[0].ddl.is_empty());
    assert_eq!(names(events[1]), ["Id", "Name"]);
    assert_eq!(events[1].version, 3);
    assert_eq!(events[1].ddl, dropped.ddl);
    let rows: Vec<_> = items
        .iter()
        .filter_map(|i| match i {
            Item::Change(c) => c.current.clone(),
            Item::Schema(_) => None,
        })
        .collect();
    assert_eq!(
        rows,
        [
            vec![Value::Int(2), text("b"), text("b@example.com")],
            vec![Value::Int(3), text("c")]
        ]
    );
}

#[tokio::test]
async fn turned_on_later_the_current_shape_is_announced_and_off_sends_none() {
    let sim = database();
    let mut off = Poller::new(sim.clone(), config(false), None);
    let items = drain(&mut off).await;
    assert!(schema_events(&items).is_empty());
    add_email(&sim);
    let items = drain(&mut off).await;
    retire_first(&sim);
    assert!(schema_events(&items).is_empty());
    assert_eq!(off.position().table_versions["dbo.T"].version, 2);
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(3), text("c"), Value::Null])
        .commit()
        .expect("commit");
    // On from here: the consumer has never been told the shape.
    let mut on = Poller::new(sim.clone(), config(true), Some(off.position().clone()));
    let items = drain(&mut on).await;
    let events = schema_events(&items);
    assert_eq!(events.len(), 1, "{items:?}");
    assert_eq!(
        (
            events[0].version,
            events[0].reason,
            events[0].before.clone()
        ),
        (2, SchemaChangeReason::Initial, None)
    );
    assert_eq!(names(events[0]), ["Id", "Name", "Email"]);
    assert!(matches!(items[0], Item::Schema(_)));
}

#[tokio::test]
async fn a_load_announces_the_table_before_its_first_row() {
    let sim = database();
    let mut poller = Poller::new(
        sim.clone(),
        PollerConfig {
            snapshot: mssql_ces::source::initial_load::SnapshotMode::Initial,
            ..config(true)
        },
        None,
    );
    let items = drain(&mut poller).await;
    let Item::Schema(first) = &items[0] else {
        panic!("{items:?}");
    };
    let Item::Change(row) = &items[1] else {
        panic!("{items:?}");
    };
    assert_eq!(first.lsn, row.commit_lsn);
    assert_eq!(schema_events(&items).len(), 1, "once, not per chunk");
}

fn options(guid: uuid::Uuid, encoding: Encoding) -> EncoderOptions {
    EncoderOptions {
        stream_guid: guid,
        encoding,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size: MessageSizeLimit::from_kb(128).expect("valid"),
    }
}

/// A table with a column added, one dropped and one retyped while it is written, next
/// to a table that does not change, streamed into Kafka with `placement`: a run
/// (until idle) after each step, each resuming from the checkpoint of the one before.
async fn stream_into_kafka(
    bootstrap: &str,
    placement: SchemaChangePlacement,
    encoding: Encoding,
    mode: CloudEventsMode,
) {
    let sim = database();
    sim.create_table(
        "dbo",
        "U",
        vec![SimColumn::new("Id", SqlType::Int)],
        &["Id"],
    );
    sim.enable_table("dbo.U", None).expect("enable U");
    sim.transaction()
        .insert("dbo.U", vec![Value::Int(1)])
        .commit()
        .expect("commit");
    let dir = std::env::temp_dir().join(format!("mssql-ces-sce-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let run = || async {
        let sink = Sink::Kafka(crate::kafka_pipeline::kafka_sink_with(bootstrap, None));
        let router = Router::new("data", PartitionKeyScheme::Table, None, mode, encoding, "g")
            .with_schema_changes(placement, "schemas");
        let mut store = mssql_ces::checkpoint::CheckpointStore::File(
            mssql_ces::checkpoint::file::FileStore::new(dir.join("cp.json"), "test"),
        );
        let position = store.load().await.expect("checkpoint");
        pipeline::run(
            Poller::new(sim.clone(), config_with_batches(), position),
            Box::new(move |guid| options(guid, encoding)),
            router,
            sink,
            store,
            crate::kafka_pipeline::until_idle(),
            CancellationToken::new(),
        )
        .await
        .expect("run");
    };
    let write = |id: i32, extra: Vec<Value>| {
        let mut row = vec![Value::Int(id), text("x")];
        row.extend(extra);
        sim.transaction()
            .insert("dbo.T", row)
            .insert("dbo.U", vec![Value::Int(id)])
            .commit()
            .expect("commit");
    };
    write(11, vec![]);
    run().await;
    add_email(&sim);
    write(12, vec![text("e")]);
    run().await;
    retire_first(&sim);
    sim.drop_column("dbo.T", "Email").expect("drop");
    write(13, vec![]);
    run().await;
    sim.alter_column_type("dbo.T", "Name", SqlType::NVarChar(Length::Bounded(90)))
        .expect("alter");
    write(14, vec![]);
    run().await;
    std::fs::remove_dir_all(&dir).ok();
}

fn config_with_batches() -> PollerConfig {
    PollerConfig {
        batch_size: 2,
        ..config(true)
    }
}

/// Every logical event of a topic, per partition in order: (type, data as JSON).
fn read_topic(
    bootstrap: &str,
    topic: &str,
    encoding: Encoding,
    mode: CloudEventsMode,
    until: usize,
) -> BTreeMap<i32, Vec<(String, serde_json::Value)>> {
    let messages = support::kafka::consume(bootstrap, topic, 4, Duration::from_secs(30), |m| {
        m.len() >= until
    });
    let mut out = BTreeMap::new();
    for (partition, list) in support::kafka::by_partition(&messages) {
        let mut reassembler = Reassembler::new();
        let mut events = Vec::new();
        for m in list {
            let event = match mode {
                CloudEventsMode::Structured => {
                    decode_message(&m.payload, encoding).expect("decodes")
                }
                CloudEventsMode::Binary => {
                    let header = |name: &str| {
                        m.headers
                            .iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| String::from_utf8(v.clone()).expect("utf-8"))
                            .expect(name)
                    };
                    mssql_ces::event::readback::CloudEvent {
                        specversion: header("ce_specversion"),
                        event_type: header("ce_type"),
                        source: header("ce_source"),
                        id: header("ce_id"),
                        logicalid: header("ce_logicalid"),
                        time: header("ce_time"),
                        datacontenttype: header("content-type"),
                        operation: header("ce_operation"),
                        segmentindex: header("ce_segmentindex").parse().expect("index"),
                        finalsegment: header("ce_finalsegment") == "true",
                        data: m.payload.clone(),
                    }
                }
            };
            if let Some(whole) = reassembler.push(event).expect("in order") {
                let data = mssql_ces::event::readback::decode_data_of(
                    &whole.event.event_type,
                    &whole.event.data,
                    encoding,
                )
                .expect("data decodes");
                events.push((whole.event.event_type, data));
            }
        }
        out.insert(partition, events);
    }
    out
}

/// The column names a change event's `cols` lists.
fn data_columns(data: &serde_json::Value) -> Vec<String> {
    data["eventsource"]["cols"]
        .as_array()
        .expect("cols")
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_owned())
        .collect()
}

fn shape_columns(data: &serde_json::Value) -> Vec<String> {
    data["after"]["cols"]
        .as_array()
        .expect("cols")
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_schema_changes_sit_between_the_shapes_in_each_tables_partition() {
    for (encoding, mode) in [
        (Encoding::Json, CloudEventsMode::Structured),
        (Encoding::Avro, CloudEventsMode::Binary),
    ] {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("data", 4, 1).expect("topic");
        let bootstrap = cluster.bootstrap_servers();
        stream_into_kafka(&bootstrap, SchemaChangePlacement::Inline, encoding, mode).await;
        // T: 6 rows and 4 shapes; U: 5 rows and 1 shape.
        let partitions = read_topic(&bootstrap, "data", encoding, mode, 16);
        let mut versions: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut rows: BTreeMap<String, usize> = BTreeMap::new();
        for events in partitions.values() {
            let mut shapes: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (event_type, data) in events {
                let table = format!(
                    "{}.{}",
                    data["eventsource"]["schema"].as_str().expect("schema"),
                    data["eventsource"]["tbl"].as_str().expect("tbl")
                );
                if event_type == SCHEMA_CHANGE_TYPE {
                    versions
                        .entry(table.clone())
                        .or_default()
                        .push(data["tableversion"].as_u64().expect("version"));
                    shapes.insert(table, shape_columns(data));
                } else {
                    assert_eq!(event_type, EVENT_TYPE);
                    let shape = shapes.get(&table).unwrap_or_else(|| {
                        panic!("{table}: an event before its table's schema: {data}")
                    });
                    assert_eq!(&data_columns(data), shape, "{encoding} {mode}: {data}");
                    *rows.entry(table).or_default() += 1;
                }
            }
        }
        assert_eq!(versions["dbo.T"], [1, 2, 3, 4], "{encoding} {mode}");
        assert_eq!(versions["dbo.U"], [1]);
        assert_eq!(rows["dbo.T"], 6);
        assert_eq!(rows["dbo.U"], 5);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_placement_keeps_the_data_topic_ces_only() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("data", 4, 1).expect("topic");
    cluster.create_topic("schemas", 4, 1).expect("topic");
    let bootstrap = cluster.bootstrap_servers();
    let (encoding, mode) = (Encoding::Json, CloudEventsMode::Structured);
    stream_into_kafka(&bootstrap, SchemaChangePlacement::Topic, encoding, mode).await;
    let data = read_topic(&bootstrap, "data", encoding, mode, 11);
    assert!(
        data.values().flatten().all(|(t, _)| t == EVENT_TYPE),
        "only CES events in the data topic"
    );
    assert_eq!(data.values().flatten().count(), 11);
    let schemas = read_topic(&bootstrap, "schemas", encoding, mode, 5);
    // One partition per table (keyed by schema.table), versions in order.
    for events in schemas.values() {
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        for (event_type, data) in events {
            assert_eq!(event_type, SCHEMA_CHANGE_TYPE);
            let table = data["eventsource"]["tbl"].as_str().expect("tbl").to_owned();
            let version = data["tableversion"].as_u64().expect("version");
            assert!(last.get(&table).is_none_or(|&v| version == v + 1), "{data}");
            last.insert(table, version);
        }
    }
    assert_eq!(schemas.values().flatten().count(), 5);
}

/// The DDL of a change is read from the newer instance's history too: here the
/// older instance (and its history) is gone before the stream reaches the switch,
/// and the type change recorded after the newer one was created still shows.
#[tokio::test]
async fn ddl_comes_from_the_newer_instances_history_too() {
    let sim = database();
    let mut poller = Poller::new(sim.clone(), config(true), None);
    drain(&mut poller).await;
    sim.add_column(
        "dbo.T",
        SimColumn::new("Email", SqlType::NVarChar(Length::Bounded(80))),
        Value::Null,
    )
    .expect("add");
    sim.enable_table("dbo.T", Some("dbo_T_v2"))
        .expect("enable v2");
    sim.alter_column_type("dbo.T", "Name", SqlType::NVarChar(Length::Bounded(90)))
        .expect("alter");
    retire_first(&sim);
    sim.transaction()
        .insert(
            "dbo.T",
            vec![Value::Int(2), text("b"), text("b@example.com")],
        )
        .commit()
        .expect("commit");
    let items = drain(&mut poller).await;
    let events = schema_events(&items);
    assert_eq!(events.len(), 1, "{items:?}");
    assert!(
        events[0]
            .ddl
            .iter()
            .any(|d| d.command.contains("ALTER COLUMN [Name]")),
        "{:?}",
        events[0].ddl
    );
}

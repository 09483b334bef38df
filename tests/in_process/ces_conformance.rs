//! Conformance with the CES documentation: rebuild its three example events (insert,
//! update, delete of `EmployeesDb.dbo.Employees`) from the facts they show and compare
//! with the documented JSON, attribute by attribute and inside every nested string.
//! Only `id` differs: CES's ids are random, ours are deterministic.

use crate::support;

use mssql_ces::event::readback::decode_avro_message;
use mssql_ces::event::{Change, Encoder, Encoding, FinalEventMode, Operation};
use serde_json::Value as Json;
use support::*;

fn documented(name: &str) -> Json {
    let path = format!(
        "{}/tests/fixtures/ces_docs/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("fixture present");
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// Parses the JSON held in strings: `data`, then `eventrow.old` and `.current`.
fn unfold(mut event: Json) -> Json {
    let data_text = event["data"].as_str().expect("data is a string").to_owned();
    let mut data: Json = serde_json::from_str(&data_text).expect("data holds JSON");
    for image in ["old", "current"] {
        let text = data["eventrow"][image]
            .as_str()
            .expect("image is a string")
            .to_owned();
        data["eventrow"][image] = serde_json::from_str(&text).expect("image holds JSON");
    }
    event["data"] = data;
    event
}

fn the_three_examples() -> Vec<(&'static str, Change)> {
    let table = employees();
    vec![
        (
            "insert",
            ChangeBuilder::new(table.clone(), Operation::Insert)
                .lsns("000000B1:000008A8:0007", "000000B1:000008A8:0003")
                .time("2026-08-07T16:25:00.890")
                .current(employee(8, "Nikola", "Nikolic"))
                .build(),
        ),
        (
            "update",
            ChangeBuilder::new(table.clone(), Operation::Update)
                .lsns("000000B1:00000930:0009", "000000B1:00000930:0002")
                .time("2026-08-07T16:30:10.123")
                .old(employee(8, "Nikola", "Nikolic"))
                .current(employee(8, "Nikola", "Nikolic-Smith"))
                .build(),
        ),
        (
            "delete",
            ChangeBuilder::new(table, Operation::Delete)
                .lsns("000000B1:00000970:0008", "000000B1:00000970:0003")
                .time("2026-08-07T16:35:42.450")
                .old(employee(8, "Nikola", "Nikolic-Smith"))
                .build(),
        ),
    ]
}

#[test]
fn json_events_match_the_documented_examples() {
    // CES writes finalevent = false always; the option restores that.
    let encoder = Encoder::new(options(Encoding::Json, FinalEventMode::AlwaysFalse, 256));
    for (name, change) in the_three_examples() {
        let encoded = encoder.encode(&change).expect("encodes");
        assert_eq!(encoded.messages.len(), 1, "{name}: one segment");
        let ours: Json = serde_json::from_slice(&encoded.messages[0].bytes).expect("JSON");
        let expected = documented(name);

        let id = ours["id"].as_str().expect("id is a string");
        assert!(
            uuid::Uuid::parse_str(id).is_ok(),
            "{name}: id {id} is a UUID"
        );

        let (mut ours, mut expected) = (unfold(ours), unfold(expected));
        ours.as_object_mut().map(|o| o.remove("id"));
        expected.as_object_mut().map(|o| o.remove("id"));
        let (ours, expected) = (ours.as_object().unwrap(), expected.as_object().unwrap());
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{name}: attribute names and order"
        );
        for (attribute, value) in expected {
            assert_eq!(&ours[attribute], value, "{name}: attribute `{attribute}`");
        }
    }
}

#[test]
fn data_text_keeps_the_documented_key_order() {
    // Consumers that compare text (or hash it) see the same layout as CES's.
    let encoder = Encoder::new(options(Encoding::Json, FinalEventMode::AlwaysFalse, 256));
    for (name, change) in the_three_examples() {
        let encoded = encoder.encode(&change).expect("encodes");
        let ours: Json = serde_json::from_slice(&encoded.messages[0].bytes).expect("JSON");
        assert_eq!(
            ours["data"],
            documented(name)["data"],
            "{name}: data text, byte for byte"
        );
    }
}

#[test]
fn finalevent_is_true_on_the_last_event_by_default() {
    let encoder = Encoder::new(options(
        Encoding::Json,
        FinalEventMode::LastInTransaction,
        256,
    ));
    let (_, change) = the_three_examples().remove(0);
    let mut not_last = change.clone();
    not_last.last_in_transaction = false;
    for (change, expected) in [(change, true), (not_last, false)] {
        let encoded = encoder.encode(&change).expect("encodes");
        let event = unfold(serde_json::from_slice(&encoded.messages[0].bytes).unwrap());
        assert_eq!(
            event["data"]["eventsource"]["transaction"]["finalevent"],
            expected
        );
    }
}

#[test]
fn avro_events_carry_the_same_content_as_json() {
    let json = Encoder::new(options(Encoding::Json, FinalEventMode::AlwaysFalse, 256));
    let avro = Encoder::new(options(Encoding::Avro, FinalEventMode::AlwaysFalse, 256));
    for (name, change) in the_three_examples() {
        let from_json = json.encode(&change).expect("encodes");
        let from_avro = avro.encode(&change).expect("encodes");
        let json_event: Json = serde_json::from_slice(&from_json.messages[0].bytes).unwrap();
        let avro_event = decode_avro_message(&from_avro.messages[0].bytes).expect("decodes");
        assert_eq!(avro_event.datacontenttype, "application/avro");
        assert_eq!(avro_event.logicalid, json_event["logicalid"], "{name}");
        assert_eq!(
            avro_event.id, json_event["id"],
            "{name}: ids do not depend on encoding"
        );
        assert_eq!(avro_event.time, json_event["time"]);
        assert_eq!(avro_event.operation, json_event["operation"]);
        assert_eq!(avro_event.specversion, "1.0");
        assert_eq!(avro_event.event_type, "com.microsoft.SQL.CES.DML.V1");
        assert_eq!(avro_event.source, "/");
        assert!(avro_event.finalsegment);
        let avro_data = mssql_ces::event::readback::decode_data(&avro_event.data, Encoding::Avro)
            .expect("data decodes with the shipped schema");
        let json_data: Json = serde_json::from_str(json_event["data"].as_str().unwrap()).unwrap();
        assert_eq!(avro_data, json_data, "{name}: data");
    }
}

//! `[[event.columns]]` against the CDC simulator: loaded rows and changes, both
//! images, every action, a hashed key, and the refusals.

use std::sync::Arc;

use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::columns::{ColumnRuleSetting, ColumnRules, MaskSetting};
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::event::{Change, Operation, Value};
use mssql_ces::setting::SecretRef;
use mssql_ces::source::SourceError;
use mssql_ces::source::initial_load::SnapshotMode;
use mssql_ces::source::poller::{Poller, PollerConfig};
use uuid::Uuid;

use crate::common::drain;

const KEY_VAR: &str = "MSSQL_CES_COLUMN_RULES_TEST_KEY";

fn rule(column: &str) -> ColumnRuleSetting {
    ColumnRuleSetting {
        column: column.into(),
        exclude: false,
        mask: None,
        replacement: None,
        truncate: None,
    }
}

fn rules(settings: Vec<ColumnRuleSetting>) -> Arc<ColumnRules> {
    // SAFETY: one variable, always set to the same value, by this file's tests only.
    unsafe { std::env::set_var(KEY_VAR, "a key of at least sixteen bytes") };
    let key = SecretRef {
        env: Some(KEY_VAR.into()),
        file: None,
    };
    Arc::new(ColumnRules::new(&settings, &key).unwrap())
}

/// `dbo.customers (email PK, name, ssn, notes)` and `sales.orders (id PK, email)`.
fn shop() -> CdcSimulator {
    let sim = CdcSimulator::new("Shop", Uuid::from_u128(9), 0);
    sim.create_table(
        "dbo",
        "customers",
        vec![
            SimColumn::new("email", SqlType::NVarChar(Length::Bounded(100))),
            SimColumn::new("name", SqlType::NVarChar(Length::Bounded(50))),
            SimColumn::new("ssn", SqlType::Char(Length::Bounded(11))),
            SimColumn::new("notes", SqlType::NVarChar(Length::Max)),
        ],
        &["email"],
    );
    sim.create_table(
        "sales",
        "orders",
        vec![
            SimColumn::new("id", SqlType::Int),
            SimColumn::new("email", SqlType::NVarChar(Length::Bounded(100))),
        ],
        &["id"],
    );
    sim
}

fn customer(email: &str, name: &str) -> Vec<Value> {
    vec![
        Value::Text(email.into()),
        Value::Text(name.into()),
        Value::Text("123-45-6789".into()),
        Value::Text(format!("private notes about {name}")),
    ]
}

fn privacy_rules() -> Arc<ColumnRules> {
    rules(vec![
        ColumnRuleSetting {
            mask: Some(MaskSetting::Hash),
            ..rule("*.*.EMAIL")
        },
        ColumnRuleSetting {
            exclude: true,
            ..rule("dbo.customers.notes")
        },
        ColumnRuleSetting {
            mask: Some(MaskSetting::Redact),
            replacement: Some("xxx-xx-xxxx".into()),
            ..rule("dbo.*.ssn")
        },
        ColumnRuleSetting {
            truncate: Some(3),
            ..rule("dbo.customers.na?e")
        },
    ])
}

fn text(value: &Value) -> &str {
    match value {
        Value::Text(s) => s,
        other => panic!("not text: {other:?}"),
    }
}

/// Every image of every event, loaded or changed, carries only what the rules let
/// out; equal e-mails hash equally across tables; the key is the hashed e-mail.
#[tokio::test]
async fn loaded_rows_and_both_images_of_changes_follow_the_rules() {
    let sim = shop();
    sim.transaction()
        .insert("dbo.customers", customer("ada@example.com", "Ada"))
        .commit()
        .unwrap();
    sim.enable_table("dbo.customers", None).unwrap();
    sim.enable_table("sales.orders", None).unwrap();
    let config = PollerConfig {
        snapshot: SnapshotMode::Initial,
        columns: privacy_rules(),
        ..PollerConfig::default()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    let mut changes = drain(&mut poller).await.unwrap();
    assert_eq!(changes.len(), 1, "Ada, loaded");
    sim.transaction()
        .insert("dbo.customers", customer("bob@example.com", "Bob"))
        .insert(
            "sales.orders",
            vec![Value::Int(1), Value::Text("ada@example.com".into())],
        )
        .commit()
        .unwrap();
    sim.transaction()
        .update(
            "dbo.customers",
            vec![Value::Text("bob@example.com".into())],
            vec![("name", Value::Text("Robert".into()))],
        )
        .commit()
        .unwrap();
    sim.transaction()
        .delete("dbo.customers", vec![Value::Text("ada@example.com".into())])
        .commit()
        .unwrap();
    changes.extend(drain(&mut poller).await.unwrap());
    let ops: Vec<(String, Operation)> = changes
        .iter()
        .map(|c| (c.table.qualified_name(), c.operation))
        .collect();
    assert_eq!(ops.len(), 5, "{ops:?}");
    let mut hashes = std::collections::HashMap::new();
    for change in &changes {
        let names: Vec<&str> = change
            .table
            .columns()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert!(!names.contains(&"notes"), "excluded everywhere: {names:?}");
        for row in [&change.old, &change.current].into_iter().flatten() {
            for (column, value) in change.table.columns().iter().zip(row) {
                match column.name.as_str() {
                    "email" => {
                        let hash = text(value);
                        assert_eq!(hash.len(), 64, "hex HMAC-SHA-256");
                        assert!(!hash.contains('@'));
                        assert_eq!(column.type_label(), "hashed(nvarchar(100))");
                        hashes
                            .entry(hash.to_owned())
                            .or_insert_with(Vec::new)
                            .push(change.table.qualified_name());
                    }
                    "ssn" => assert_eq!(text(value), "xxx-xx-xxxx"),
                    "name" => assert!(text(value).chars().count() <= 3, "{value:?}"),
                    _ => {}
                }
            }
        }
        // The key is the hashed column: every event of a row carries one key.
        let keys: Vec<&Value> = change.key_values().map(|(_, v)| v).collect();
        assert_eq!(keys.len(), 1);
    }
    // Ada's e-mail in the customers table and in the order hash the same.
    assert!(
        hashes
            .values()
            .any(|tables| tables.iter().any(|t| t == "dbo.customers")
                && tables.iter().any(|t| t == "sales.orders")),
        "{hashes:?}"
    );
    let update = changes
        .iter()
        .find(|c| c.operation == Operation::Update)
        .unwrap();
    assert_eq!(text(&update.old.as_ref().unwrap()[1]), "Bob");
    assert_eq!(text(&update.current.as_ref().unwrap()[1]), "Rob");
    let delete: &Change = changes
        .iter()
        .find(|c| c.operation == Operation::Delete)
        .unwrap();
    assert_eq!(delete.old.as_ref().unwrap().len(), 3);
}

/// A rule that would exclude a key column stops the run when the catalog is read,
/// before any row is read, naming the rule.
#[tokio::test]
async fn excluding_a_key_column_stops_the_run_before_anything_is_read() {
    let sim = shop();
    sim.enable_table("sales.orders", None).unwrap();
    sim.transaction()
        .insert("sales.orders", vec![Value::Int(1), Value::Text("x".into())])
        .commit()
        .unwrap();
    let config = PollerConfig {
        columns: rules(vec![ColumnRuleSetting {
            exclude: true,
            ..rule("sales.orders.id")
        }]),
        ..PollerConfig::default()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    let err = poller.poll().await.unwrap_err();
    let SourceError::ColumnRule(_) = &err else {
        panic!("{err:?}");
    };
    assert!(err.is_configuration(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("event.columns[0]") && message.contains("key column id"),
        "{message}"
    );
}

/// A rule that matches no column of any included table (a misspelt pattern) stops
/// the run before anything is read, naming it; allowed, the run goes on.
#[tokio::test]
async fn a_rule_that_matches_no_column_stops_the_run_unless_allowed() {
    let sim = shop();
    sim.enable_table("dbo.customers", None).unwrap();
    sim.transaction()
        .insert("dbo.customers", customer("a@example.com", "Ann"))
        .commit()
        .unwrap();
    let misspelt = || {
        rules(vec![
            ColumnRuleSetting {
                exclude: true,
                ..rule("dbo.customers.ssn")
            },
            ColumnRuleSetting {
                exclude: true,
                ..rule("dbo.customers.nots")
            },
        ])
    };
    let config = PollerConfig {
        columns: misspelt(),
        ..PollerConfig::default()
    };
    let mut poller = Poller::new(sim.clone(), config, None);
    let err = poller.poll().await.unwrap_err();
    assert!(err.is_configuration(), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("dbo.customers.nots")
            && !message.contains("dbo.customers.ssn")
            && message.contains("event.allow_unmatched_column_rules"),
        "{message}"
    );
    let allowed = PollerConfig {
        columns: misspelt(),
        allow_unmatched_column_rules: true,
        ..PollerConfig::default()
    };
    let changes = drain(&mut Poller::new(sim, allowed, None)).await.unwrap();
    assert_eq!(changes.len(), 1);
}

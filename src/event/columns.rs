//! `[[event.columns]]`: which column values leave the database, and in what form.
//!
//! CES streams data unmasked (it ignores dynamic data masking and row-level
//! security), so the choice is made here. Each rule names columns by a pattern on
//! `schema.table.column` (`*` any run of characters, `?` one; case-insensitive, as
//! SQL Server's default collations compare names) and does one thing:
//!
//! - `exclude = true`: the column is left out of `cols`, `old` and `current`;
//! - `mask = "redact"`: a non-NULL value becomes a fixed text (`replacement`,
//!   default `"****"`);
//! - `mask = "hash"`: a non-NULL value becomes the lowercase hex HMAC-SHA-256 of its
//!   CES text form under `event.hash_key`, so equal values stay equal (and joinable)
//!   across tables and runs;
//! - `truncate = N`: a character value keeps its first N characters, a binary value
//!   its first N bytes.
//!
//! The first rule that matches a column decides. NULL stays NULL under every mask.
//! A key column may be hashed (every event of a row then carries the same hash, and
//! the partition key is built from it) but not excluded, redacted or truncated:
//! rows would merge. Rules apply to changes and loaded rows, to both images, before
//! any encoding, so every format carries the same values. The column's `cols[].type`
//! says what was done (`hashed(nvarchar(50))`, `redacted(…)`,
//! `truncated(nvarchar(max),100)`), so a consumer can tell a masked value from data.

use std::sync::Arc;

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use super::{Change, ColumnDescription, EventError, Row, SqlType, TableDescription, Value};
use crate::setting::{ConfigError, SecretRef, invalid};

/// What `redact` writes when no `replacement` is given.
pub const DEFAULT_REPLACEMENT: &str = "****";

/// A column rule: `column` and one of `exclude`, `mask` or `truncate`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ColumnRuleSetting {
    /// A `schema.table.column` pattern, with `*` (any run of characters) and `?` (one),
    /// case-insensitive.
    pub column: String,
    /// Leave the column out of `cols`, `old` and `current`.
    #[serde(default)]
    pub exclude: bool,
    /// Replace each value.
    #[serde(default)]
    pub mask: Option<MaskSetting>,
    /// With `mask = "redact"`: the text that replaces each value; unset: `"****"`.
    #[serde(default)]
    pub replacement: Option<String>,
    /// A character value keeps its first N characters, a binary value its first N
    /// bytes. A key column cannot be truncated.
    #[serde(default)]
    pub truncate: Option<u32>,
}

/// What `mask` does to a value (NULL stays NULL).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum MaskSetting {
    /// A fixed text (`replacement`).
    Redact,
    /// The lowercase hex HMAC-SHA-256 of its CES text form under `event.hash_key`:
    /// equal values stay equal, and joinable, across tables and runs. A key column may
    /// be hashed.
    Hash,
}

/// What a rule does to the values of the columns it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Exclude,
    Redact(String),
    Hash,
    Truncate(u32),
}

impl Action {
    fn describe(&self) -> &'static str {
        match self {
            Action::Exclude => "excluded",
            Action::Redact(_) => "redacted",
            Action::Hash => "hashed",
            Action::Truncate(_) => "truncated",
        }
    }
}

/// What a consumer is told about a column whose values were changed
/// (`cols[].type`, see [`ColumnDescription::type_label`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnMask {
    Hashed,
    Redacted,
    Truncated(u32),
}

/// A rule ready to match: its pattern lower-cased, and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    /// `event.columns[i]` and its pattern, for messages.
    name: String,
    pattern: Vec<char>,
    action: Action,
}

/// The rules of `[[event.columns]]` with the hash key read.
#[derive(Clone, Default)]
pub struct ColumnRules {
    rules: Vec<Rule>,
    hash_key: Option<Vec<u8>>,
}

impl std::fmt::Debug for ColumnRules {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColumnRules")
            .field("rules", &self.rules)
            .field("hash_key", &self.hash_key.as_ref().map(|_| "(secret)"))
            .finish()
    }
}

/// Why a table cannot be streamed under the rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ColumnRuleError {
    #[error(
        "{rule} would leave key column {column} of {table} {action}: rows would become indistinguishable; a key column may only be hashed (mask = \"hash\"), or narrow the rule's pattern"
    )]
    KeyColumn {
        rule: String,
        table: String,
        column: String,
        action: &'static str,
    },
}

impl ColumnRuleSetting {
    /// The action the rule takes; an error names the rule and what is wrong.
    fn action(&self, name: &str) -> Result<Action, ConfigError> {
        let pattern = self.column.trim();
        if pattern.matches('.').count() < 2 {
            return Err(invalid(
                &format!("{name}.column"),
                format!(
                    "\"{pattern}\" is not a schema.table.column pattern (for every table's Email column: \"*.*.Email\")"
                ),
            ));
        }
        let mut actions = Vec::new();
        if self.exclude {
            actions.push(Action::Exclude);
        }
        match self.mask {
            Some(MaskSetting::Redact) => actions.push(Action::Redact(
                self.replacement
                    .clone()
                    .unwrap_or_else(|| DEFAULT_REPLACEMENT.to_owned()),
            )),
            Some(MaskSetting::Hash) => actions.push(Action::Hash),
            None => {}
        }
        if let Some(n) = self.truncate {
            if n == 0 {
                return Err(invalid(
                    &format!("{name}.truncate"),
                    "must be at least 1 (to leave the column out, use exclude = true)",
                ));
            }
            actions.push(Action::Truncate(n));
        }
        if self.replacement.is_some() && self.mask != Some(MaskSetting::Redact) {
            return Err(invalid(
                &format!("{name}.replacement"),
                "only applies with mask = \"redact\"",
            ));
        }
        match actions.len() {
            1 => Ok(actions.remove(0)),
            0 => Err(invalid(
                name,
                "says nothing to do: set one of exclude = true, mask = \"redact\" | \"hash\", truncate = N",
            )),
            _ => Err(invalid(
                name,
                "sets more than one of exclude, mask and truncate: write one rule per action (the first matching rule decides)",
            )),
        }
    }
}

impl ColumnRules {
    /// Reads the rules; the hash key is read (from `hash_key`, a secret) only when a
    /// rule hashes. Errors name the setting.
    pub fn new(settings: &[ColumnRuleSetting], hash_key: &SecretRef) -> Result<Self, ConfigError> {
        let rules = Self::rules(settings, hash_key)?;
        let hash_key = if rules.iter().any(|r| r.action == Action::Hash) {
            let key = hash_key.resolve("event.hash_key")?;
            if key.len() < 16 {
                return Err(invalid(
                    "event.hash_key",
                    "the key is shorter than 16 bytes: use a long random secret (for example 32 random bytes, hex-encoded)",
                ));
            }
            Some(key.into_bytes())
        } else {
            None
        };
        Ok(ColumnRules { rules, hash_key })
    }

    /// Checks the rules as written (not the key's value: that is a secret, read by
    /// [`new`](Self::new)). Errors name the setting.
    pub fn validate(
        settings: &[ColumnRuleSetting],
        hash_key: &SecretRef,
    ) -> Result<(), ConfigError> {
        Self::rules(settings, hash_key).map(drop)
    }

    fn rules(
        settings: &[ColumnRuleSetting],
        hash_key: &SecretRef,
    ) -> Result<Vec<Rule>, ConfigError> {
        let mut rules = Vec::with_capacity(settings.len());
        for (i, setting) in settings.iter().enumerate() {
            let name = format!("event.columns[{i}]");
            let action = setting.action(&name)?;
            rules.push(Rule {
                name: format!("{name} (\"{}\")", setting.column.trim()),
                pattern: setting.column.trim().to_lowercase().chars().collect(),
                action,
            });
        }
        if rules.iter().any(|r| r.action == Action::Hash) && !hash_key.is_set() {
            return Err(invalid(
                "event.hash_key",
                "a rule in [[event.columns]] has mask = \"hash\", which needs a secret key: hash_key = { env = \"VARIABLE\" } or { file = \"/path\" } (keep it: another key gives other hashes)",
            ));
        }
        Ok(rules)
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The first rule that matches `schema.table.column` and applies to it (a
    /// truncation applies only to characters and bytes), and its index.
    fn rule_for(
        &self,
        table: &TableDescription,
        column: &ColumnDescription,
    ) -> Option<(usize, &Rule)> {
        let name: Vec<char> = format!("{}.{}.{}", table.schema(), table.table(), column.name)
            .to_lowercase()
            .chars()
            .collect();
        self.rules.iter().enumerate().find(|(_, rule)| {
            (!matches!(rule.action, Action::Truncate(_)) || truncatable(column))
                && crate::glob::glob_match(&rule.pattern, &name)
        })
    }

    /// What the rules do to `table`: `None` when no rule matches any column.
    /// Refuses a key column excluded, redacted or truncated.
    pub fn plan(
        &self,
        table: &Arc<TableDescription>,
    ) -> Result<Option<TablePlan>, ColumnRuleError> {
        if self.rules.is_empty() {
            return Ok(None);
        }
        let mut actions = Vec::with_capacity(table.columns().len());
        let mut matched = Vec::new();
        for (position, column) in table.columns().iter().enumerate() {
            let found = self.rule_for(table, column);
            if let Some((i, rule)) = found {
                if rule.action != Action::Hash && table.key().contains(&position) {
                    return Err(ColumnRuleError::KeyColumn {
                        rule: rule.name.clone(),
                        table: table.qualified_name(),
                        column: column.name.clone(),
                        action: rule.action.describe(),
                    });
                }
                matched.push(i);
            }
            actions.push(found.map(|(_, rule)| rule.action.clone()));
        }
        if actions.iter().all(Option::is_none) {
            return Ok(None);
        }
        let mut kept = Vec::new();
        let mut columns = Vec::new();
        for (position, (column, action)) in table.columns().iter().zip(&actions).enumerate() {
            let mask = match action {
                Some(Action::Exclude) => continue,
                Some(Action::Hash) => Some(ColumnMask::Hashed),
                Some(Action::Redact(_)) => Some(ColumnMask::Redacted),
                Some(Action::Truncate(n)) => Some(ColumnMask::Truncated(*n)),
                None => None,
            };
            kept.push(position);
            columns.push(ColumnDescription {
                mask,
                ..column.clone()
            });
        }
        let key = table
            .key()
            .iter()
            .filter_map(|k| kept.iter().position(|p| p == k))
            .collect();
        let derived = TableDescription::new(
            table.database(),
            table.schema(),
            table.table(),
            columns,
            key,
        )
        .map_err(|e: EventError| ColumnRuleError::KeyColumn {
            rule: "(internal)".into(),
            table: table.qualified_name(),
            column: e.to_string(),
            action: "out of range",
        })?;
        matched.sort_unstable();
        matched.dedup();
        Ok(Some(TablePlan {
            table: Arc::new(derived),
            kept,
            actions,
            matched,
        }))
    }

    /// Per table, what happens to which column (for `check` and the start-up log):
    /// `(column, what)` with `what` one of excluded, redacted, hashed, truncated to N.
    pub fn describe(&self, table: &TableDescription) -> Vec<(String, String)> {
        table
            .columns()
            .iter()
            .filter_map(|c| {
                let (_, rule) = self.rule_for(table, c)?;
                let what = match &rule.action {
                    Action::Truncate(n) => format!("truncated to {n}"),
                    other => other.describe().to_owned(),
                };
                Some((c.name.clone(), what))
            })
            .collect()
    }

    /// [`describe`](Self::describe) as one line (`Email hashed, Notes excluded`);
    /// `None` when no rule touches the table.
    pub fn summary(&self, table: &TableDescription) -> Option<String> {
        let columns = self.describe(table);
        (!columns.is_empty()).then(|| {
            columns
                .iter()
                .map(|(c, what)| format!("{c} {what}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
    }

    /// The names (`event.columns[i] ("pattern")`) of the rules whose index is not in
    /// `matched`.
    pub fn unmatched(&self, matched: &std::collections::BTreeSet<usize>) -> Vec<String> {
        self.rules
            .iter()
            .enumerate()
            .filter(|(i, _)| !matched.contains(i))
            .map(|(_, r)| r.name.clone())
            .collect()
    }

    fn hash(&self, value: &Value) -> Value {
        let Some(text) = value.to_text() else {
            return Value::Null;
        };
        // A key of any length is valid for HMAC; `new` checked it is set.
        let key = self.hash_key.as_deref().unwrap_or_default();
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
            return Value::Null;
        };
        mac.update(text.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(64);
        for b in digest {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        }
        Value::Text(out)
    }

    fn transform(&self, action: &Action, value: &Value) -> Value {
        if value.is_null() {
            return Value::Null;
        }
        match action {
            Action::Exclude => Value::Null,
            Action::Redact(text) => Value::Text(text.clone()),
            Action::Hash => self.hash(value),
            Action::Truncate(n) => match value {
                Value::Text(s) => Value::Text(s.chars().take(*n as usize).collect()),
                Value::Binary(b) => Value::Binary(b.iter().take(*n as usize).copied().collect()),
                other => other.clone(),
            },
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn truncatable(column: &ColumnDescription) -> bool {
    matches!(
        column.sql_type,
        SqlType::Char(_)
            | SqlType::VarChar(_)
            | SqlType::NChar(_)
            | SqlType::NVarChar(_)
            | SqlType::Binary(_)
            | SqlType::VarBinary(_)
    )
}

/// What the rules do to one table.
#[derive(Debug, Clone, PartialEq)]
pub struct TablePlan {
    /// The table as events describe it: excluded columns gone, masked ones flagged.
    pub table: Arc<TableDescription>,
    /// Positions (in the source table description) of the columns kept, in order.
    kept: Vec<usize>,
    /// Per source column: what happens to it.
    actions: Vec<Option<Action>>,
    /// Indexes of the rules that matched a column of the table.
    pub matched: Vec<usize>,
}

impl TablePlan {
    /// The change as the rules let it leave: rows narrowed and masked, the table
    /// replaced by [`table`](Self::table).
    pub fn apply(&self, rules: &ColumnRules, change: &mut Change) {
        let map_row = |row: &Row| -> Row {
            self.kept
                .iter()
                .map(|&p| match (&self.actions[p], row.get(p)) {
                    (Some(action), Some(value)) => rules.transform(action, value),
                    (None, Some(value)) => value.clone(),
                    (_, None) => Value::Null,
                })
                .collect()
        };
        change.old = change.old.as_ref().map(map_row);
        change.current = change.current.as_ref().map(map_row);
        change.table = Arc::clone(&self.table);
    }
}

/// The plans of the tables seen so far, by table description (held, so that a
/// pointer is never reused while it is a key here).
#[derive(Debug, Default)]
pub struct PlanCache {
    plans: crate::event::PerTable<Option<Arc<TablePlan>>>,
    /// Rules that matched some column of some table.
    pub matched: std::collections::BTreeSet<usize>,
}

impl PlanCache {
    /// The plan for `table`, computed once per description.
    pub fn plan(
        &mut self,
        rules: &ColumnRules,
        table: &Arc<TableDescription>,
    ) -> Result<Option<Arc<TablePlan>>, ColumnRuleError> {
        let matched = &mut self.matched;
        self.plans.get_or_try_insert(table, || {
            let plan = rules.plan(table)?.map(Arc::new);
            if let Some(plan) = &plan {
                matched.extend(plan.matched.iter().copied());
            }
            Ok(plan)
        })
    }

    /// Applies the rules to each change in place.
    pub fn apply(
        &mut self,
        rules: &ColumnRules,
        changes: &mut [Change],
    ) -> Result<(), ColumnRuleError> {
        if rules.is_empty() {
            return Ok(());
        }
        for change in changes {
            if let Some(plan) = self.plan(rules, &change.table)? {
                plan.apply(rules, change);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::test_support::{column, employee_row, employees, insert};
    use crate::event::{Encoder, Encoding, Length, Operation};

    fn rule(column: &str) -> ColumnRuleSetting {
        ColumnRuleSetting {
            column: column.into(),
            exclude: false,
            mask: None,
            replacement: None,
            truncate: None,
        }
    }

    fn key_var(value: &str) -> SecretRef {
        let var = format!("MSSQL_CES_TEST_HASH_KEY_{}", value.len());
        // SAFETY: each test sets a variable of its own name, read back at once.
        unsafe { std::env::set_var(&var, value) };
        SecretRef {
            env: Some(var),
            file: None,
        }
    }

    fn rules(settings: Vec<ColumnRuleSetting>) -> ColumnRules {
        ColumnRules::new(&settings, &key_var("0123456789abcdef0123")).unwrap()
    }

    #[test]
    fn each_action_changes_the_values_and_says_so_in_cols() {
        let rules = rules(vec![
            ColumnRuleSetting {
                truncate: Some(2),
                ..rule("dbo.employees.firstname")
            },
            ColumnRuleSetting {
                exclude: true,
                ..rule("*.*.SignupDate")
            },
            ColumnRuleSetting {
                mask: Some(MaskSetting::Redact),
                ..rule("dbo.Emp*.LastName")
            },
        ]);
        let table = employees();
        let plan = rules.plan(&table).unwrap().unwrap();
        let mut change = insert(table, employee_row(7, "Ada", "Lovelace"));
        plan.apply(&rules, &mut change);
        assert_eq!(
            change.current,
            Some(vec![
                Value::Int(7),
                Value::Text("Ad".into()),
                Value::Text(DEFAULT_REPLACEMENT.into()),
            ])
        );
        let labels: Vec<String> = change
            .table
            .columns()
            .iter()
            .map(ColumnDescription::type_label)
            .collect();
        assert_eq!(
            labels,
            ["int", "truncated(nvarchar(50),2)", "redacted(nvarchar(50))"]
        );
        assert_eq!(change.table.key(), &[0]);
        let json = Encoder::new(crate::event::test_support::options(Encoding::Json))
            .encode(&change)
            .unwrap();
        let text = String::from_utf8(json.messages[0].bytes.clone()).unwrap();
        assert!(
            !text.contains("Lovelace") && !text.contains("SignupDate"),
            "{text}"
        );
        assert!(
            text.contains(r#"\"type\":\"redacted(nvarchar(50))\""#),
            "{text}"
        );
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let rules = rules(vec![ColumnRuleSetting {
            mask: Some(MaskSetting::Hash),
            ..rule("*.*.Id")
        }]);
        let text = format!("{rules:?}");
        assert!(text.contains("(secret)") && text.contains("Hash"), "{text}");
        assert!(!text.contains("0123456789abcdef"), "{text}");
    }

    #[test]
    fn hashing_is_keyed_stable_and_leaves_null_alone() {
        let settings = vec![ColumnRuleSetting {
            mask: Some(MaskSetting::Hash),
            ..rule("*.*.Id")
        }];
        let a = ColumnRules::new(&settings, &key_var("0123456789abcdef0123")).unwrap();
        let b = ColumnRules::new(&settings, &key_var("another key of 16+ bytes")).unwrap();
        // HMAC-SHA-256("0123456789abcdef0123", "7"), computed with Python's hmac module.
        assert_eq!(
            a.hash(&Value::Int(7)),
            Value::Text("73094d108ff279a22335430e5dffddc83590810d995585a856d25551c31676a0".into())
        );
        assert_eq!(a.hash(&Value::Int(7)), a.hash(&Value::Text("7".into())));
        assert_ne!(a.hash(&Value::Int(7)), b.hash(&Value::Int(7)));
        assert_eq!(a.hash(&Value::Null), Value::Null);
        // A hashed key column keeps the row's key, hashed.
        let plan = a.plan(&employees()).unwrap().unwrap();
        assert_eq!(plan.table.key(), &[0]);
        assert_eq!(plan.table.columns()[0].mask, Some(ColumnMask::Hashed));
    }

    #[test]
    fn a_key_column_cannot_be_excluded_redacted_or_truncated() {
        for setting in [
            ColumnRuleSetting {
                exclude: true,
                ..rule("dbo.Employees.Id")
            },
            ColumnRuleSetting {
                mask: Some(MaskSetting::Redact),
                ..rule("*.*.i?")
            },
        ] {
            let err = rules(vec![setting]).plan(&employees()).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("event.columns[0]") && text.contains("key column Id"),
                "{text}"
            );
        }
        // Truncating a key column of characters is refused too.
        let table = Arc::new(
            TableDescription::new(
                "d",
                "dbo",
                "T",
                vec![column("Code", SqlType::VarChar(Length::Bounded(10)), 0)],
                vec![0],
            )
            .unwrap(),
        );
        let err = rules(vec![ColumnRuleSetting {
            truncate: Some(3),
            ..rule("*.*.code")
        }])
        .plan(&table)
        .unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn bad_rules_are_refused_by_name() {
        let no_key = ColumnRules::new(
            &[ColumnRuleSetting {
                mask: Some(MaskSetting::Hash),
                ..rule("*.*.x")
            }],
            &SecretRef::default(),
        )
        .unwrap_err();
        assert!(no_key.to_string().starts_with("event.hash_key"), "{no_key}");
        // The check before connecting says the same, without reading any secret;
        // rules that hash nothing need no key.
        let hashing = [ColumnRuleSetting {
            mask: Some(MaskSetting::Hash),
            ..rule("*.*.x")
        }];
        let err = ColumnRules::validate(&hashing, &SecretRef::default()).unwrap_err();
        assert!(err.to_string().contains("needs a secret key"), "{err}");
        let redacting = [ColumnRuleSetting {
            mask: Some(MaskSetting::Redact),
            ..rule("*.*.x")
        }];
        assert_eq!(
            ColumnRules::validate(&redacting, &SecretRef::default()),
            Ok(())
        );
        assert!(ColumnRules::validate(&[rule("dbo.T")], &SecretRef::default()).is_err());
        let cases = [
            (rule("dbo.T"), "event.columns[0].column"),
            (rule("*.*.x"), "says nothing to do"),
            (
                ColumnRuleSetting {
                    exclude: true,
                    truncate: Some(3),
                    ..rule("*.*.x")
                },
                "more than one",
            ),
            (
                ColumnRuleSetting {
                    truncate: Some(0),
                    ..rule("*.*.x")
                },
                "event.columns[0].truncate",
            ),
            (
                ColumnRuleSetting {
                    exclude: true,
                    replacement: Some("x".into()),
                    ..rule("*.*.x")
                },
                "replacement",
            ),
        ];
        for (setting, expected) in cases {
            let err = ColumnRules::new(&[setting], &SecretRef::default()).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn unmatched_rules_and_the_description_per_table() {
        let rules = rules(vec![
            ColumnRuleSetting {
                exclude: true,
                ..rule("*.*.LastName")
            },
            ColumnRuleSetting {
                exclude: true,
                ..rule("sales.*.x")
            },
            ColumnRuleSetting {
                truncate: Some(4),
                ..rule("*.*.*Date")
            },
        ]);
        let mut cache = PlanCache::default();
        let table = employees();
        let mut changes = vec![insert(Arc::clone(&table), employee_row(1, "a", "b"))];
        changes[0].operation = Operation::Insert;
        cache.apply(&rules, &mut changes).unwrap();
        assert_eq!(changes[0].current.as_ref().unwrap().len(), 3);
        // Truncation of a datetime2 means nothing: not applied, not listed.
        assert_eq!(
            rules.describe(&table),
            vec![("LastName".to_owned(), "excluded".to_owned())]
        );
        assert_eq!(rules.summary(&table).as_deref(), Some("LastName excluded"));
        let untouched = Arc::new(
            TableDescription::new(
                "d",
                "dbo",
                "T",
                vec![column("Id", SqlType::Int, 0)],
                vec![0],
            )
            .unwrap(),
        );
        assert_eq!(rules.summary(&untouched), None);
        assert_eq!(
            rules.unmatched(&cache.matched),
            vec![
                "event.columns[1] (\"sales.*.x\")".to_owned(),
                "event.columns[2] (\"*.*.*Date\")".to_owned()
            ]
        );
    }
}

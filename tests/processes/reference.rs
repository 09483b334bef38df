//! The book's settings reference (`docs/src/reference.md`) is generated from the
//! configuration's JSON Schema ([`Config::json_schema`]), which comes from the
//! settings types themselves: their `///` documentation, their defaults and their
//! bounds. The test fails when the checked-in page differs from what the code
//! generates; `MSSQL_CES_WRITE_REFERENCE=1` writes it instead.

use std::fmt::Write as _;
use std::path::PathBuf;

use mssql_ces::config::Config;
use serde_json::{Map, Value};

/// Where the generated page lives.
fn page() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/src/reference.md")
}

const HEADER: &str = "# Settings reference

<!-- Generated from the settings types' documentation by
     `MSSQL_CES_WRITE_REFERENCE=1 cargo test --test processes reference`;
     a test fails when this page and the code differ. Edit the `///` comments. -->

Every setting of the configuration file, by section: its type and bounds, its
default, and what it does. [Configuration](configuration.md) says how the file, the
environment and flags combine, and how secrets are given. `mssql-ces schema` prints
the same as a JSON Schema, for editors that check TOML against one.
";

/// The generated page.
pub(crate) fn markdown() -> String {
    let schema = Config::json_schema();
    let defs = schema
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let reference = Reference { defs };
    let mut out = String::from(HEADER);
    let Some(sections) = schema.get("properties").and_then(Value::as_object) else {
        panic!("the configuration's schema has no properties");
    };
    for (name, section) in sections {
        let section = reference.resolve(section);
        if section.get("oneOf").is_some() {
            reference.kinds(&mut out, name, &section);
        } else {
            reference.table(&mut out, 2, &format!("[{name}]"), name, &section);
        }
    }
    out
}

struct Reference {
    defs: Map<String, Value>,
}

impl Reference {
    /// `schema` with `$ref`s followed and `Option`'s `null` alternative dropped;
    /// the field's own description and default kept over the type's.
    fn resolve(&self, schema: &Value) -> Value {
        let mut own = schema.as_object().cloned().unwrap_or_default();
        let mut target = None;
        if let Some(Value::String(reference)) = own.remove("$ref") {
            let name = reference.trim_start_matches("#/$defs/");
            target = self.defs.get(name).cloned();
        } else if let Some(Value::Array(any)) = own.get("anyOf").cloned() {
            let not_null: Vec<&Value> = any
                .iter()
                .filter(|s| s.get("type") != Some(&Value::String("null".into())))
                .collect();
            if let [one] = not_null.as_slice() {
                own.remove("anyOf");
                target = Some(self.resolve(one));
            }
        }
        let Some(Value::Object(mut merged)) = target.map(|t| self.resolve(&t)) else {
            return Value::Object(own);
        };
        // The field's description says what the setting does; its type's is used
        // where the field has none, and to introduce a table of settings.
        if let Some(kind) = merged.get("description").cloned() {
            merged.insert("x-type-description".into(), kind);
        }
        merged.extend(own);
        Value::Object(merged)
    }

    /// Whether `schema` is a table of settings of its own (a struct).
    fn is_table(schema: &Value) -> bool {
        schema.get("properties").is_some() && schema.get("x-secret").is_none()
    }

    /// `[sink]`: the keys every kind takes, then each kind's own.
    fn kinds(&self, out: &mut String, name: &str, schema: &Value) {
        let variants: Vec<Value> = schema
            .get("oneOf")
            .and_then(Value::as_array)
            .map(|v| v.iter().map(|s| self.resolve(s)).collect())
            .unwrap_or_default();
        let keys = |v: &Value| -> Vec<String> {
            v.get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default()
        };
        let common: Vec<String> = variants
            .first()
            .map(keys)
            .unwrap_or_default()
            .into_iter()
            .filter(|k| variants.iter().all(|v| keys(v).contains(k)))
            .collect();
        let kinds_of = |v: &Value| -> Vec<String> {
            v.pointer("/properties/kind/enum")
                .and_then(Value::as_array)
                .map(|k| {
                    k.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let kinds: Vec<String> = variants.iter().flat_map(kinds_of).collect();
        let mut shared = Map::new();
        let mut properties = Map::new();
        if let Some(first) = variants.first().and_then(|v| v.get("properties")) {
            for key in &common {
                let mut property = first[key].clone();
                if key == "kind" {
                    property = serde_json::json!({
                        "description": "Which sink. Each kind takes the keys of this table and its own, below.",
                        "enum": kinds,
                    });
                }
                properties.insert(key.clone(), property);
            }
        }
        shared.insert("properties".into(), Value::Object(properties));
        shared.insert("required".into(), serde_json::json!(["kind"]));
        if let Some(description) = schema
            .get("x-type-description")
            .or_else(|| schema.get("description"))
        {
            shared.insert("description".into(), description.clone());
        }
        self.table(out, 2, &format!("[{name}]"), name, &Value::Object(shared));
        for variant in &variants {
            let kinds = kinds_of(variant);
            if kinds.is_empty() {
                continue;
            }
            let kind: Vec<String> = kinds.iter().map(|k| format!("kind = \"{k}\"")).collect();
            let kind = kind.join(" or ");
            let mut own = Map::new();
            for (key, property) in variant
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                if !common.contains(key) {
                    own.insert(key.clone(), property.clone());
                }
            }
            let mut section = Map::new();
            section.insert("properties".into(), Value::Object(own));
            if let Some(description) = variant.get("description") {
                section.insert("description".into(), description.clone());
            }
            self.table(
                out,
                3,
                &format!("[{name}] with {kind}"),
                name,
                &Value::Object(section),
            );
        }
    }

    /// One section: its description, a row per setting, then its own tables.
    fn table(&self, out: &mut String, depth: usize, title: &str, path: &str, schema: &Value) {
        let hashes = "#".repeat(depth);
        let _ = write!(out, "\n{hashes} `{title}`\n\n");
        if let Some(description) = schema
            .get("x-type-description")
            .or_else(|| schema.get("description"))
            .and_then(Value::as_str)
        {
            let _ = write!(out, "{}\n\n", description.trim());
        }
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut nested = Vec::new();
        let mut rows = String::new();
        for (key, property) in schema
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let property = self.resolve(property);
            if Self::is_table(&property) {
                nested.push((format!("{path}.{key}"), property, false));
                continue;
            }
            if property.get("type") == Some(&Value::String("array".into())) {
                let items = self.resolve(&property["items"]);
                if Self::is_table(&items) {
                    let mut items = items.as_object().cloned().unwrap_or_default();
                    if let Some(description) = property.get("description") {
                        items.insert("x-type-description".into(), description.clone());
                    }
                    nested.push((format!("{path}.{key}"), Value::Object(items), true));
                    continue;
                }
            }
            let _ = writeln!(
                rows,
                "| `{key}` | {} | {} | {} |",
                self.kind(&property),
                if required.contains(&key.as_str()) {
                    "required".to_owned()
                } else {
                    default(&property)
                },
                cell(&self.meaning(&property)),
            );
        }
        if !rows.is_empty() {
            out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
            out.push_str(&rows);
        }
        for (path, schema, array) in nested {
            let title = if array {
                format!("[[{path}]]")
            } else {
                format!("[{path}]")
            };
            self.table(out, (depth + 1).min(4), &title, &path, &schema);
        }
    }

    /// A setting's type, values and bounds.
    fn kind(&self, schema: &Value) -> String {
        if schema.get("x-secret").is_some() {
            return "secret".into();
        }
        if let Some(values) = enum_values(schema) {
            let any_case = if schema.get("x-any-case").is_some() {
                " (any case)"
            } else {
                ""
            };
            return format!(
                "{}{any_case}",
                values
                    .iter()
                    .map(|v| format!("`\"{v}\"`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        // `Option<T>` written as a type list: `["string", "null"]`.
        let kind = match schema.get("type") {
            Some(Value::String(kind)) => kind.as_str(),
            Some(Value::Array(kinds)) => kinds
                .iter()
                .filter_map(Value::as_str)
                .find(|k| *k != "null")
                .unwrap_or(""),
            _ => "",
        };
        match kind {
            "number" => "number".into(),
            "integer" => {
                let bound = |k: &str| schema.get(k).and_then(Value::as_u64);
                let unsigned = schema
                    .get("format")
                    .and_then(Value::as_str)
                    .is_some_and(|f| f.starts_with("uint"));
                match (
                    bound("minimum").filter(|m| !(unsigned && *m == 0)),
                    bound("maximum"),
                ) {
                    (Some(min), Some(max)) => format!("integer, {min} to {max}"),
                    (Some(min), None) => format!("integer, at least {min}"),
                    (None, Some(max)) => format!("integer, at most {max}"),
                    (None, None) => "integer".into(),
                }
            }
            "boolean" => "boolean".into(),
            "string" => "string".into(),
            "array" => {
                let items = self.resolve(&schema["items"]);
                format!("list of {}", self.kind(&items))
                    .replace("list of string", "list of strings")
            }
            "object" => "table of strings".into(),
            _ => "—".into(),
        }
    }

    /// The description, and each value's own where the values have one.
    fn meaning(&self, schema: &Value) -> String {
        let mut text = schema
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_owned();
        if let Some(Value::Array(variants)) = schema.get("oneOf") {
            let described: Vec<String> = variants
                .iter()
                .filter_map(|v| {
                    let value = v.get("const").and_then(Value::as_str)?;
                    let what = v.get("description").and_then(Value::as_str)?;
                    Some(format!("`\"{value}\"`: {}", what.trim()))
                })
                .collect();
            if !described.is_empty() {
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(&described.join("\n\n"));
            }
        }
        text
    }
}

/// An enumeration's values, as written.
fn enum_values(schema: &Value) -> Option<Vec<String>> {
    if let Some(Value::Array(values)) = schema.get("enum") {
        return Some(
            values
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        );
    }
    let Some(Value::Array(variants)) = schema.get("oneOf") else {
        return None;
    };
    let mut values = Vec::new();
    for variant in variants {
        match (variant.get("const"), variant.get("enum")) {
            (Some(Value::String(v)), _) => values.push(v.clone()),
            (_, Some(Value::Array(many))) => {
                values.extend(many.iter().filter_map(|v| v.as_str().map(str::to_owned)));
            }
            _ => return None,
        }
    }
    Some(values)
}

/// A default as TOML writes it; `—` where there is none (the description says
/// what happens then).
fn default(schema: &Value) -> String {
    match schema.get("default") {
        None | Some(Value::Null) => "—".into(),
        Some(Value::String(text)) => format!("`{text:?}`"),
        Some(Value::Array(items)) if items.is_empty() => "`[]`".into(),
        Some(other) => format!("`{other}`"),
    }
}

/// Text as one table cell: lines joined, paragraphs kept with `<br>`, pipes escaped,
/// rustdoc's links (``[`name`]``) plain code.
fn cell(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("[`") {
        let Some(end) = rest[at..].find("`]") else {
            break;
        };
        let end = at + end;
        plain.push_str(&rest[..at]);
        let after = &rest[end + 2..];
        if after.starts_with('(') {
            plain.push_str(&rest[at..end + 2]);
        } else {
            plain.push_str(&rest[at + 1..end + 1]);
        }
        rest = after;
    }
    plain.push_str(rest);
    plain
        .split("\n\n")
        .map(|paragraph| {
            paragraph
                .lines()
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("<br>")
        .replace('|', "\\|")
}

#[test]
fn the_settings_reference_is_what_the_code_generates() {
    let generated = markdown();
    if std::env::var_os("MSSQL_CES_WRITE_REFERENCE").is_some() {
        std::fs::write(page(), &generated).expect("writing docs/src/reference.md");
        return;
    }
    let checked_in = std::fs::read_to_string(page()).unwrap_or_default();
    if checked_in != generated {
        let first = checked_in
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
        panic!(
            "docs/src/reference.md differs from what the settings types generate (first at line {}):\n  checked in: {}\n  generated:  {}\nwrite it anew with: MSSQL_CES_WRITE_REFERENCE=1 cargo test --test processes reference",
            first + 1,
            checked_in.lines().nth(first).unwrap_or("(end)"),
            generated.lines().nth(first).unwrap_or("(end)"),
        );
    }
}

#[test]
fn every_setting_has_its_documentation() {
    let page = markdown();
    let undocumented: Vec<&str> = page
        .lines()
        .filter(|line| line.starts_with("| `") && line.ends_with("|  |"))
        .collect();
    assert!(
        undocumented.is_empty(),
        "settings without a /// comment:\n{}",
        undocumented.join("\n")
    );
}

/// A bounded setting: where it is, and its bounds.
struct Bounded {
    /// The TOML that sets the others a section needs, with `{}` for the setting.
    config: String,
    setting: String,
    min: Option<u64>,
    max: Option<u64>,
}

/// Every setting whose schema has bounds, with a configuration to try it in.
fn bounded_settings() -> Vec<Bounded> {
    let schema = Config::json_schema();
    let reference = Reference {
        defs: schema["$defs"].as_object().cloned().unwrap_or_default(),
    };
    const BASE: &str = "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"stdout\"\n";
    let mut out = Vec::new();
    let walk =
        |prefix: &str, table: &str, context: &str, schema: &Value, out: &mut Vec<Bounded>| {
            for (key, property) in schema["properties"].as_object().into_iter().flatten() {
                let property = reference.resolve(property);
                let unsigned = property["format"]
                    .as_str()
                    .is_some_and(|f| f.starts_with("uint"));
                let min = property["minimum"]
                    .as_u64()
                    .filter(|m| !(unsigned && *m == 0));
                let max = property["maximum"].as_u64();
                if min.is_none() && max.is_none() {
                    continue;
                }
                out.push(Bounded {
                    config: format!("{context}{table}\n{key} = {{}}\n"),
                    setting: format!("{prefix}.{key}"),
                    min,
                    max,
                });
            }
        };
    for (name, section) in schema["properties"].as_object().into_iter().flatten() {
        let section = reference.resolve(section);
        if name == "sink" {
            let kinds = [
                ("kafka", "bootstrap_servers = \"localhost:9092\"\n"),
                ("event_hubs_amqp", "connection_string = { env = \"EH\" }\n"),
            ];
            for variant in section["oneOf"].as_array().into_iter().flatten() {
                let variant = reference.resolve(variant);
                let Some(kind) = variant["properties"]["kind"]["enum"][0].as_str() else {
                    continue;
                };
                let Some((_, extra)) = kinds.iter().find(|(k, _)| *k == kind) else {
                    continue;
                };
                let context = "[source]\nkind = \"synthetic\"\n";
                walk(
                    "sink",
                    &format!("[sink]\nkind = \"{kind}\"\n{extra}"),
                    context,
                    &variant,
                    &mut out,
                );
                if kind != "kafka" {
                    continue;
                }
                let registry = reference.resolve(&variant["properties"]["schema_registry"]);
                walk(
                    "sink.schema_registry",
                    &format!(
                        "[sink]\nkind = \"{kind}\"\n{extra}[sink.schema_registry]\nurl = \"http://localhost:8081\""
                    ),
                    "[source]\nkind = \"synthetic\"\n[event]\nencoding = \"avro\"\n",
                    &registry,
                    &mut out,
                );
            }
            continue;
        }
        let context = if name == "source" {
            "[sink]\nkind = \"stdout\"\n"
        } else {
            BASE
        };
        let table = if name == "source" {
            "[source]\nkind = \"synthetic\"".to_owned()
        } else {
            format!("[{name}]")
        };
        walk(name, &table, context, &section, &mut out);
    }
    out
}

#[test]
fn the_bounds_the_reference_gives_are_the_ones_the_configuration_refuses() {
    let bounded = bounded_settings();
    let load = |text: &str| Config::from_parts(text, &[], &[]);
    let mut seen = Vec::new();
    for b in &bounded {
        let at = |value: u64| load(&b.config.replace("{}", &value.to_string()));
        let refused = |value: u64| {
            let err =
                at(value).expect_err(&format!("{} = {value} is outside its bounds", b.setting));
            assert!(
                err.to_string().contains(&b.setting),
                "{} = {value}: the error names it: {err}",
                b.setting
            );
        };
        if let Some(min) = b.min {
            refused(min - 1);
            assert!(
                at(min).is_ok(),
                "{} = {min}: {:?}",
                b.setting,
                at(min).err()
            );
        }
        if let Some(max) = b.max {
            refused(max + 1);
            assert!(
                at(max).is_ok(),
                "{} = {max}: {:?}",
                b.setting,
                at(max).err()
            );
        }
        seen.push(b.setting.as_str());
    }
    // The walk reached each kind of section (and would notice one gone missing).
    for setting in [
        "source.page_size",
        "snapshot.chunk_size",
        "event.max_message_size_kb",
        "sink.delivery_timeout_ms",
        "sink.schema_registry.request_timeout_ms",
        "fleet.slots",
        "metrics.stalled_after_ms",
    ] {
        assert!(seen.contains(&setting), "{setting} in {seen:?}");
    }
}

#[test]
fn the_schema_command_prints_the_configuration_s_json_schema() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_mssql-ces"))
        .arg("schema")
        .output()
        .expect("mssql-ces schema");
    assert!(output.status.success());
    let printed: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(printed, Config::json_schema());
    assert_eq!(
        printed.pointer("/$defs/SnapshotSettings/properties/chunk_size/maximum"),
        Some(&Value::from(mssql_ces::config::MAX_LOAD_CHUNK as u64))
    );
}

//! Overrides of the file's settings: environment variables and command-line flags,
//! applied to the TOML tree before it is read.

use super::Config;
use crate::setting::{ConfigError, invalid};

/// One command-line override: the setting, its value, and the text it was typed as,
/// for the text fallback (`--set sink.topic=007` reads as the number 7; where a number
/// does not fit the setting, the text is taken as typed: `"007"`, not `"7"`).
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub key: String,
    pub value: toml::Value,
    pub typed: Option<String>,
    /// The flag the user typed, when the setting has its own (`--encoding`); an
    /// error about the value names it.
    pub flag: Option<&'static str>,
}

impl Override {
    /// A text setting given by its own flag (`--topic` for `sink.topic`): taken as
    /// text.
    pub fn flag(flag: &'static str, key: &str, value: &str) -> Self {
        Override {
            key: key.to_owned(),
            value: toml::Value::String(value.to_owned()),
            typed: None,
            flag: Some(flag),
        }
    }

    /// `--set key=value`: read as a TOML value when it parses as one, else as text.
    pub fn parse(key: &str, raw: &str) -> Self {
        Override {
            key: key.to_owned(),
            value: parse_override_value(raw),
            typed: Some(raw.to_owned()),
            flag: None,
        }
    }

    /// Where the value came from, as an error says it.
    pub(super) fn origin(&self) -> String {
        match self.flag {
            Some(flag) => flag.to_owned(),
            None => format!("--set {}", self.key),
        }
    }
}

/// An override's value (environment variable or `--set`): read as a TOML value when
/// it parses as one (`7`, `true`, `["a"]`), else taken as text.
pub(super) fn parse_override_value(text: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(text.to_owned()))
}

/// An override key as a path: a TOML dotted key, so `sink.kafka."linger.ms"` is the
/// `linger.ms` entry of `[sink.kafka]`.
pub(super) fn override_path(key: &str) -> Result<Vec<String>, ConfigError> {
    let parsed: toml::Table = toml::from_str(&format!("{key} = 0")).map_err(|_| {
        invalid(
            key,
            "not a setting name (e.g. sink.topic, or sink.kafka.\"linger.ms\")",
        )
    })?;
    let mut path = Vec::new();
    let mut current = &parsed;
    loop {
        let Some((name, value)) = current.iter().next() else {
            return Err(invalid(key, "empty setting name"));
        };
        path.push(name.clone());
        match value {
            toml::Value::Table(inner) => current = inner,
            _ => return Ok(path),
        }
    }
}

/// Deserializes the tree; where an override read as a number or boolean makes it fail
/// and the same override read as text does not, the text was meant (`TOPIC=2024`).
pub(super) fn deserialize_with_text_fallback(
    mut table: toml::Table,
    applied: &mut [(Vec<String>, Option<String>, toml::Value)],
) -> Result<Config, ConfigError> {
    loop {
        let error = match toml::Value::Table(table.clone()).try_into::<Config>() {
            Ok(config) => return Ok(config),
            Err(e) => e.to_string(),
        };
        let mut fixed = false;
        for (path, text, parsed) in applied.iter_mut() {
            let Some(raw) = text.as_ref().filter(|_| !parsed.is_str()) else {
                continue;
            };
            let mut candidate = table.clone();
            let as_text = toml::Value::String(raw.clone());
            set_path(&mut candidate, path, as_text.clone(), "override")?;
            // Text helps when it makes the whole parse, or when the error is this
            // value's type (it quotes it) and changes; never to hide another error,
            // nor a number's own (out of range is not a reason to try it as text).
            let better = match toml::Value::Table(candidate.clone()).try_into::<Config>() {
                Ok(_) => true,
                Err(e) => {
                    error.contains("invalid type")
                        && error.contains(raw.as_str())
                        && e.to_string() != error
                }
            };
            if better {
                table = candidate;
                *parsed = as_text;
                fixed = true;
                break;
            }
        }
        if !fixed {
            // One line: "… in `sink.topic`", as the other errors read.
            let lines: Vec<&str> = error
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            return Err(ConfigError::Parse(lines.join(" ")));
        }
    }
}

/// Sets `path` in `table` to `value`, creating sections as needed.
pub(super) fn set_path(
    table: &mut toml::Table,
    path: &[String],
    value: toml::Value,
    origin: &str,
) -> Result<(), ConfigError> {
    let Some((last, sections)) = path.split_last() else {
        return Err(invalid(origin, "empty setting name"));
    };
    let mut current = table;
    for section in sections {
        let entry = current
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry
            .as_table_mut()
            .ok_or_else(|| invalid(origin, format!("`{section}` is not a section")))?;
    }
    current.insert(last.clone(), value);
    Ok(())
}

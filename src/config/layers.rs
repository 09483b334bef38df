//! The configuration in layers: the file, then the environment's `MSSQL_CES__…`
//! variables, then the command line's flags and `--set`s, each later layer setting
//! values over the earlier ones. Every value a variable or a flag gave is recorded
//! with where it came from, so that an error about it names the variable or flag
//! (the file does not hold it).
//!
//! A variable or a flag gives text (without its quotes, when it is quoted as in
//! the file), and text it stays in the tree: the reader
//! ([`crate::setting::de`]) reads it as the number, boolean or list it spells where
//! the setting wants one, and as the text it is where the setting wants text
//! (`--set sink.topic=007` is the topic `007`).

use crate::setting::de::ReadError;
use crate::setting::{ConfigError, ENV_PREFIX, invalid, setting_variable};

use super::SECRET_SETTINGS;

/// One command-line override: the setting and the text given for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub key: String,
    pub text: String,
    /// The flag the user typed, when the setting has its own (`--encoding`); an
    /// error about the value names it.
    pub flag: Option<&'static str>,
}

impl Override {
    /// A setting given by its own flag (`--topic` for `sink.topic`).
    pub fn flag(flag: &'static str, key: &str, value: &str) -> Self {
        Override {
            key: key.to_owned(),
            text: value.to_owned(),
            flag: Some(flag),
        }
    }

    /// `--set key=value`.
    pub fn parse(key: &str, raw: &str) -> Self {
        Override {
            key: key.to_owned(),
            text: raw.to_owned(),
            flag: None,
        }
    }

    /// Where the value came from, as an error says it.
    fn origin(&self) -> Origin {
        match self.flag {
            Some(flag) => Origin::Flag(flag.to_owned()),
            None => Origin::Flag(format!("--set {}", self.key)),
        }
    }
}

/// Where a value that is not the file's came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `MSSQL_CES__SINK__TOPIC`.
    Environment(String),
    /// `--topic`, `--set sink.topic`.
    Flag(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Environment(name) => write!(f, "the environment variable {name}"),
            Origin::Flag(flag) => f.write_str(flag),
        }
    }
}

/// The file's tree with the environment's and the command line's values set over
/// it, and where each of those came from.
pub(super) struct Layers {
    pub(super) table: toml::Table,
    /// Each overridden setting's path and origin, the last one of a path winning.
    origins: Vec<(Vec<String>, Origin)>,
}

impl Layers {
    pub(super) fn file(table: toml::Table) -> Self {
        Layers {
            table,
            origins: Vec::new(),
        }
    }

    /// The environment's `MSSQL_CES__<SECTION>__<KEY>` variables. A secret setting's
    /// variable holds the secret itself: the tree names the variable (`{ env = … }`)
    /// and never holds the secret.
    pub(super) fn environment(&mut self, env: &[(String, String)]) -> Result<(), ConfigError> {
        for (name, value) in env {
            let Some(rest) = strip_env_prefix(name) else {
                continue;
            };
            let path: Vec<String> = rest.split("__").map(str::to_lowercase).collect();
            if SECRET_SETTINGS.contains(&path.join(".").as_str()) {
                let mut reference = toml::Table::new();
                reference.insert("env".into(), toml::Value::String(name.clone()));
                set_path(&mut self.table, &path, toml::Value::Table(reference), name)?;
                continue;
            }
            self.set(path, value, Origin::Environment(name.clone()), name)?;
        }
        Ok(())
    }

    /// The command line's flags and `--set`s, in order.
    pub(super) fn command_line(&mut self, overrides: &[Override]) -> Result<(), ConfigError> {
        for given in overrides {
            let path = override_path(&given.key)?;
            let setting = path.join(".");
            if SECRET_SETTINGS.contains(&setting.as_str()) {
                let variable = setting_variable(&setting);
                return Err(invalid(
                    &given.key,
                    format!(
                        "a secret is not given on the command line (it would show in the process list): set the environment variable {variable} to it, or {{ env = … }} / {{ file = … }} in the file"
                    ),
                ));
            }
            self.set(path, &given.text, given.origin(), &given.key)?;
        }
        Ok(())
    }

    fn set(
        &mut self,
        path: Vec<String>,
        text: &str,
        origin: Origin,
        named: &str,
    ) -> Result<(), ConfigError> {
        // Quoted as in the file (`--set log.format='"json"'`), the text is what the
        // quotes hold.
        let text = match crate::setting::de::spelled(text) {
            Some(toml::Value::String(quoted)) => quoted,
            _ => text.to_owned(),
        };
        set_path(&mut self.table, &path, toml::Value::String(text), named)?;
        self.origins.retain(|(p, _)| *p != path);
        self.origins.push((path, origin));
        Ok(())
    }

    /// Refuses a setting of an earlier release, saying its new name (`renamed`: the
    /// old dotted path and what to write instead), wherever it was given.
    pub(super) fn refuse_renamed(&self, renamed: &[(&str, &str)]) -> Result<(), ConfigError> {
        for (old, instead) in renamed {
            let path: Vec<String> = old.split('.').map(str::to_owned).collect();
            let mut at = Some(&self.table);
            let mut found = None;
            for key in &path {
                found = at.and_then(|table| table.get(key));
                at = found.and_then(toml::Value::as_table);
            }
            if found.is_some() {
                let origin = self.origins.iter().find(|(p, _)| *p == path);
                let set_by = set_by(origin.map(|(_, origin)| origin));
                return Err(invalid(old, format!("{instead}{set_by}")));
            }
        }
        Ok(())
    }

    /// Where the value an error is about came from, when a variable or a flag gave
    /// it: the one at the error's setting or a section around it, else the one
    /// inside the section the error is about that its text names (a section's
    /// reader reports its keys' errors on the section).
    pub(super) fn origin_of(&self, error: &ReadError) -> Option<&Origin> {
        let at = &error.path;
        let around = self
            .origins
            .iter()
            .filter(|(path, _)| at.starts_with(path))
            .max_by_key(|(path, _)| path.len());
        around
            .or_else(|| {
                let text = error.to_string();
                self.origins.iter().find(|(path, _)| {
                    path.starts_with(at) && text.starts_with(&crate::setting::de::dotted(path))
                })
            })
            .map(|(_, origin)| origin)
    }

    /// An error of reading the tree, naming the variable or flag that gave the value.
    pub(super) fn error(&self, error: ReadError) -> ConfigError {
        let set_by = set_by(self.origin_of(&error));
        ConfigError::Parse(format!("{error}{set_by}"))
    }
}

/// What an error adds about where its value came from: ` (set by --topic)`, or
/// nothing for the file's own.
fn set_by(origin: Option<&Origin>) -> String {
    origin.map_or_else(String::new, |origin| format!(" (set by {origin})"))
}

/// `name` without the settings' prefix, which is matched in any case
/// (`MSSQL_CES__SINK__TOPIC`, `mssql_ces__sink__topic`).
pub(super) fn strip_env_prefix(name: &str) -> Option<&str> {
    let head = name.get(..ENV_PREFIX.len())?;
    head.eq_ignore_ascii_case(ENV_PREFIX)
        .then(|| &name[ENV_PREFIX.len()..])
}

/// An override key as a path: a TOML dotted key, so `sink.kafka."linger.ms"` is the
/// `linger.ms` entry of `[sink.kafka]`.
fn override_path(key: &str) -> Result<Vec<String>, ConfigError> {
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

/// Sets `path` in `table` to `value`, creating sections as needed.
fn set_path(
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

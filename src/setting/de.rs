//! Settings read into their types: the one deserializer of the configuration's
//! values. It knows where it is, so that every error names the setting's path, and
//! it words its errors itself rather than passing on a parser's (no Rust type name
//! reaches the user, and a parser upgrade cannot change what the user reads).
//!
//! Text stands for what a setting wants: an environment variable or a `--set` gives
//! text, so a value given as text where a number, a boolean or a list is wanted is
//! read as one (`"30"` for `poll_interval_ms`, `'["dbo.*"]'` for `include`), as it
//! would be written in the file. Text is never made of a number, so `sink.topic =
//! "007"` stays `007`.

use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

/// Reads `value` (a section of the configuration) as a `T`.
pub fn from_value<T: de::DeserializeOwned>(value: &toml::Value) -> Result<T, ReadError> {
    T::deserialize(Reader::new(value, Vec::new()))
}

/// Reads `table` as a `T`.
pub fn from_table<T: de::DeserializeOwned>(table: toml::Table) -> Result<T, ReadError> {
    from_value(&toml::Value::Table(table))
}

/// A setting that cannot be read, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// The setting's path from the section read (`["source", "poll_interval_ms"]`,
    /// `["source", "include", "[0]"]`).
    pub path: Vec<String>,
    pub kind: ReadErrorKind,
}

/// What is wrong with a setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadErrorKind {
    /// A key no setting has; `expected` are the keys of its section.
    UnknownKey {
        key: String,
        expected: &'static [&'static str],
    },
    MissingKey(&'static str),
    /// A value where a section (a table of settings) belongs.
    NotSection {
        found: String,
    },
    /// Not a whole number where one belongs.
    NotWholeNumber {
        found: String,
    },
    /// A negative number where only 0 or more can be.
    Negative {
        value: i64,
    },
    /// A whole number beyond what the setting can hold.
    TooLarge {
        value: String,
        max: u64,
    },
    /// A value of another kind than the setting's.
    WrongKind {
        found: String,
        expected: String,
    },
    /// A value of the right kind that the setting does not take.
    WrongValue {
        found: String,
        expected: String,
    },
    /// A name that is none of the setting's choices.
    UnknownChoice {
        value: String,
        expected: &'static [&'static str],
    },
    /// What a setting's own reader said.
    Said(String),
}

impl ReadError {
    fn new(kind: ReadErrorKind) -> Self {
        ReadError {
            path: Vec::new(),
            kind,
        }
    }

    /// The error of a value at `path`: its own path when it has none yet (a visitor
    /// raised it without knowing where it was).
    fn at(mut self, path: &[String]) -> Self {
        if self.path.is_empty() {
            self.path = path.to_vec();
        }
        self
    }

    /// The error as seen from a section further out (`sink`, for an error of a
    /// sink's own settings).
    pub fn within(mut self, section: &[&str]) -> Self {
        let mut path: Vec<String> = section.iter().map(|s| (*s).to_owned()).collect();
        path.append(&mut self.path);
        self.path = path;
        self
    }

    /// The path as the file spells it: `source.include[0]`.
    pub fn setting(&self) -> String {
        dotted(&self.path)
    }

    /// What is wrong, without where.
    pub fn reason(&self) -> String {
        use ReadErrorKind as K;
        let names = |names: &[&str]| {
            if names.is_empty() {
                "none".to_owned()
            } else {
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        match &self.kind {
            K::UnknownKey { key, expected } => {
                format!(
                    "unknown key `{key}`; this section takes {}",
                    names(expected)
                )
            }
            K::MissingKey(key) => format!("`{key}` is missing"),
            K::NotSection { found } => {
                format!("expected a section (a table of settings), found {found}")
            }
            K::NotWholeNumber { found } => format!("expected a whole number, found {found}"),
            K::Negative { value } => {
                format!("`{value}` must not be negative (a whole number, 0 or more)")
            }
            K::TooLarge { value, max } => format!("`{value}` is too large (at most {max})"),
            K::WrongKind { found, expected } => format!("expected {expected}, found {found}"),
            K::WrongValue { found, expected } => {
                format!("{found} is not allowed here: expected {expected}")
            }
            K::UnknownChoice { value, expected } => {
                format!("unknown choice `{value}`; one of {}", names(expected))
            }
            K::Said(text) => text.clone(),
        }
    }
}

/// `source.include[0]` from its segments.
pub fn dotted(path: &[String]) -> String {
    let mut out = String::new();
    for segment in path {
        if !out.is_empty() && !segment.starts_with('[') {
            out.push('.');
        }
        out.push_str(segment);
    }
    out
}

/// `setting: reason`, as every configuration error reads; a reason that names its
/// setting itself (a section's own reader, which knows better) is left as it is.
impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let setting = self.setting();
        let reason = self.reason();
        let names_itself = matches!(self.kind, ReadErrorKind::Said(_))
            && reason
                .strip_prefix(setting.as_str())
                .is_some_and(|rest| rest.starts_with(['.', ':']));
        if setting.is_empty() || names_itself {
            f.write_str(&reason)
        } else {
            write!(f, "{setting}: {reason}")
        }
    }
}

impl std::error::Error for ReadError {}

impl de::Error for ReadError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        ReadError::new(ReadErrorKind::Said(message.to_string()))
    }

    fn invalid_type(found: de::Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        ReadError::new(ReadErrorKind::WrongKind {
            found: found.to_string(),
            expected: expected.to_string(),
        })
    }

    fn invalid_value(found: de::Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        ReadError::new(ReadErrorKind::WrongValue {
            found: found.to_string(),
            expected: expected.to_string(),
        })
    }

    fn unknown_variant(value: &str, expected: &'static [&'static str]) -> Self {
        ReadError::new(ReadErrorKind::UnknownChoice {
            value: value.to_owned(),
            expected,
        })
    }

    fn unknown_field(key: &str, expected: &'static [&'static str]) -> Self {
        ReadError::new(ReadErrorKind::UnknownKey {
            key: key.to_owned(),
            expected,
        })
    }

    fn missing_field(key: &'static str) -> Self {
        ReadError::new(ReadErrorKind::MissingKey(key))
    }
}

/// What a value is, as an error says it.
fn described(value: &toml::Value) -> String {
    match value {
        toml::Value::String(text) => format!("the text {text:?}"),
        toml::Value::Integer(n) => format!("the number {n}"),
        toml::Value::Float(x) => format!("the number {x}"),
        toml::Value::Boolean(b) => format!("`{b}`"),
        toml::Value::Datetime(d) => format!("the date {d}"),
        toml::Value::Array(_) => "a list".to_owned(),
        toml::Value::Table(_) => "a section".to_owned(),
    }
}

/// Text read as the TOML value it spells (`30`, `true`, `["a", "b"]`, `"a"`), if
/// it spells one.
pub fn spelled(text: &str) -> Option<toml::Value> {
    toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut table| table.remove("v"))
}

fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'_')
}

/// The deserializer of one value at `path`.
struct Reader<'a> {
    value: &'a toml::Value,
    path: Vec<String>,
}

impl<'a> Reader<'a> {
    fn new(value: &'a toml::Value, path: Vec<String>) -> Self {
        Reader { value, path }
    }

    fn fail(&self, kind: ReadErrorKind) -> ReadError {
        ReadError::new(kind).at(&self.path)
    }

    /// The value as a whole number: an integer, or text that spells one.
    fn whole(&self) -> Result<i64, ReadError> {
        let not_whole = || {
            self.fail(ReadErrorKind::NotWholeNumber {
                found: described(self.value),
            })
        };
        match (self.value, self.respelled()) {
            (&toml::Value::Integer(n), _) | (_, Some(toml::Value::Integer(n))) => Ok(n),
            // Digits TOML's 64 bits cannot hold.
            (toml::Value::String(text), _) if is_digits(text.trim().trim_start_matches('-')) => {
                Err(self.fail(ReadErrorKind::TooLarge {
                    value: text.trim().to_owned(),
                    max: i64::MAX.unsigned_abs(),
                }))
            }
            _ => Err(not_whole()),
        }
    }

    /// The value as a whole number from 0 to `max`.
    fn unsigned(&self, max: u64) -> Result<u64, ReadError> {
        let n = self.whole()?;
        let n = u64::try_from(n).map_err(|_| self.fail(ReadErrorKind::Negative { value: n }))?;
        if n > max {
            return Err(self.fail(ReadErrorKind::TooLarge {
                value: n.to_string(),
                max,
            }));
        }
        Ok(n)
    }

    /// The value as a whole number from `min` to `max`.
    fn signed(&self, min: i64, max: i64) -> Result<i64, ReadError> {
        let n = self.whole()?;
        if n < min {
            return Err(self.fail(ReadErrorKind::WrongValue {
                found: format!("`{n}`"),
                expected: format!("{min} or more"),
            }));
        }
        if n > max {
            return Err(self.fail(ReadErrorKind::TooLarge {
                value: n.to_string(),
                max: max.unsigned_abs(),
            }));
        }
        Ok(n)
    }

    /// The value spelled by text, read in its place (a list or a boolean given as
    /// text); `None` when it is not text, or spells nothing.
    fn respelled(&self) -> Option<toml::Value> {
        match self.value {
            toml::Value::String(text) => spelled(text),
            _ => None,
        }
    }

    fn wrong_kind(&self, expected: &str) -> ReadError {
        self.fail(ReadErrorKind::WrongKind {
            found: described(self.value),
            expected: expected.to_owned(),
        })
    }
}

macro_rules! unsigned {
    ($($method:ident: $type:ty => $visit:ident),+) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
            let n = self.unsigned(<$type>::MAX as u64)?;
            visitor.$visit(n as $type)
        }
    )+};
}

macro_rules! signed {
    ($($method:ident: $type:ty => $visit:ident),+) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
            let n = self.signed(<$type>::MIN as i64, <$type>::MAX as i64)?;
            visitor.$visit(n as $type)
        }
    )+};
}

impl<'de> de::Deserializer<'de> for Reader<'_> {
    type Error = ReadError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        let path = self.path.clone();
        match self.value {
            toml::Value::String(text) => visitor.visit_str(text),
            toml::Value::Integer(n) => visitor.visit_i64(*n),
            toml::Value::Float(x) => visitor.visit_f64(*x),
            toml::Value::Boolean(b) => visitor.visit_bool(*b),
            toml::Value::Datetime(d) => visitor.visit_string(d.to_string()),
            toml::Value::Array(items) => visitor.visit_seq(Items::new(items, self.path)),
            toml::Value::Table(table) => visitor.visit_map(Entries::new(table, self.path)),
        }
        .map_err(|e| e.at(&path))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        match (self.value, self.respelled()) {
            (&toml::Value::Boolean(b), _) | (_, Some(toml::Value::Boolean(b))) => {
                visitor.visit_bool(b)
            }
            _ => Err(self.wrong_kind("true or false")),
        }
    }

    unsigned!(
        deserialize_u8: u8 => visit_u8,
        deserialize_u16: u16 => visit_u16,
        deserialize_u32: u32 => visit_u32,
        deserialize_u64: u64 => visit_u64
    );

    signed!(
        deserialize_i8: i8 => visit_i8,
        deserialize_i16: i16 => visit_i16,
        deserialize_i32: i32 => visit_i32,
        deserialize_i64: i64 => visit_i64
    );

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        match (self.value, self.respelled()) {
            (&toml::Value::Float(x), _) | (_, Some(toml::Value::Float(x))) => visitor.visit_f64(x),
            (&toml::Value::Integer(n), _) | (_, Some(toml::Value::Integer(n))) => {
                visitor.visit_f64(n as f64)
            }
            _ => Err(self.wrong_kind("a number")),
        }
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        let path = self.path.clone();
        match self.value {
            toml::Value::String(text) => {
                visitor.visit_str(text).map_err(|e: ReadError| e.at(&path))
            }
            _ => Err(self.wrong_kind("text")),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_any(visitor)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_any(visitor)
    }

    /// TOML has no null: a value that is there is `Some`.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_some(self)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        match (self.value, self.respelled()) {
            (toml::Value::Array(items), _) => {
                let path = self.path.clone();
                visitor
                    .visit_seq(Items::new(items, self.path))
                    .map_err(|e| e.at(&path))
            }
            (_, Some(spelled @ toml::Value::Array(_))) => {
                Reader::new(&spelled, self.path).deserialize_seq(visitor)
            }
            _ => Err(self.wrong_kind("a list")),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        match self.value {
            toml::Value::Table(table) => {
                let path = self.path.clone();
                visitor
                    .visit_map(Entries::new(table, self.path))
                    .map_err(|e| e.at(&path))
            }
            other => Err(self.fail(ReadErrorKind::NotSection {
                found: described(other),
            })),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        self.deserialize_map(visitor)
    }

    /// A choice is written as its name (`encoding = "avro"`).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ReadError> {
        match self.value {
            toml::Value::String(text) => {
                let name: de::value::StrDeserializer<'_, ReadError> =
                    text.as_str().into_deserializer();
                visitor.visit_enum(name).map_err(|e| e.at(&self.path))
            }
            _ => Err(self.wrong_kind("a name")),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ReadError> {
        visitor.visit_unit()
    }
}

/// The entries of a section, each read at its own path.
struct Entries<'a> {
    entries: toml::map::Iter<'a, String, toml::Value>,
    path: Vec<String>,
    value: Option<(&'a String, &'a toml::Value)>,
}

impl<'a> Entries<'a> {
    fn new(table: &'a toml::Table, path: Vec<String>) -> Self {
        Entries {
            entries: table.iter(),
            path,
            value: None,
        }
    }

    fn path_of(&self, key: &str) -> Vec<String> {
        let mut path = self.path.clone();
        path.push(key.to_owned());
        path
    }
}

impl<'de> de::MapAccess<'de> for Entries<'_> {
    type Error = ReadError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, ReadError> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some((key, value));
        let name: de::value::StrDeserializer<'_, ReadError> = key.as_str().into_deserializer();
        seed.deserialize(name).map(Some).map_err(|e| match e.kind {
            // An unknown key is where it was written, not in the section.
            ReadErrorKind::UnknownKey { .. } => e.at(&self.path_of(key)),
            _ => e.at(&self.path),
        })
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, ReadError> {
        let Some((key, value)) = self.value.take() else {
            return Err(de::Error::custom("a value was asked for before its key"));
        };
        let path = self.path_of(key);
        seed.deserialize(Reader::new(value, path.clone()))
            .map_err(|e| e.at(&path))
    }
}

/// The items of a list, each read at its own path (`include[0]`).
struct Items<'a> {
    items: std::iter::Enumerate<std::slice::Iter<'a, toml::Value>>,
    path: Vec<String>,
}

impl<'a> Items<'a> {
    fn new(items: &'a [toml::Value], path: Vec<String>) -> Self {
        Items {
            items: items.iter().enumerate(),
            path,
        }
    }
}

impl<'de> de::SeqAccess<'de> for Items<'_> {
    type Error = ReadError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, ReadError> {
        let Some((index, item)) = self.items.next() else {
            return Ok(None);
        };
        let mut path = self.path.clone();
        path.push(format!("[{index}]"));
        seed.deserialize(Reader::new(item, path.clone()))
            .map(Some)
            .map_err(|e| e.at(&path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Section {
        #[serde(default)]
        count: u32,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        on: bool,
        #[serde(default)]
        names: Vec<String>,
        #[serde(default)]
        choice: Option<Choice>,
        #[serde(default)]
        passed: BTreeMap<String, String>,
        #[serde(default)]
        inner: Option<Inner>,
        #[serde(default)]
        rate: f64,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "lowercase")]
    enum Choice {
        Json,
        Avro,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        limit: i16,
    }

    fn read(text: &str) -> Result<Section, ReadError> {
        from_table(toml::from_str(text).expect("toml"))
    }

    #[test]
    fn values_of_their_own_kind_are_read() {
        let section = read(
            "count = 3\nname = \"a\"\non = true\nnames = [\"x\", \"y\"]\nchoice = \"avro\"\npassed = { \"linger.ms\" = \"5\" }\ninner = { limit = -2 }\n",
        )
        .unwrap();
        assert_eq!(section.count, 3);
        assert_eq!(section.name.as_deref(), Some("a"));
        assert!(section.on);
        assert_eq!(section.names, ["x", "y"]);
        assert_eq!(section.choice, Some(Choice::Avro));
        assert_eq!(section.passed["linger.ms"], "5");
        assert_eq!(section.inner, Some(Inner { limit: -2 }));
    }

    #[test]
    fn text_is_read_as_the_number_boolean_or_list_it_spells_but_text_stays_text() {
        let section = read(
            "count = \"30\"\non = \"true\"\nnames = '[\"dbo.*\"]'\nname = \"007\"\npassed = { x = \"1e3\" }\n",
        )
        .unwrap();
        assert_eq!(section.count, 30);
        assert!(section.on);
        assert_eq!(section.names, ["dbo.*"]);
        assert_eq!(section.name.as_deref(), Some("007"));
        assert_eq!(section.passed["x"], "1e3");
    }

    #[test]
    fn errors_name_the_setting_and_say_what_is_wrong_in_the_files_words() {
        let said = |text: &str| read(text).unwrap_err().to_string();
        assert_eq!(
            said("count = -5"),
            "count: `-5` must not be negative (a whole number, 0 or more)"
        );
        assert_eq!(
            said("count = \"many\""),
            "count: expected a whole number, found the text \"many\""
        );
        assert_eq!(
            said("count = 5000000000"),
            "count: `5000000000` is too large (at most 4294967295)"
        );
        assert_eq!(
            said("inner = 1"),
            "inner: expected a section (a table of settings), found the number 1"
        );
        assert_eq!(
            said("inner = { limit = 40000 }"),
            "inner.limit: `40000` is too large (at most 32767)"
        );
        assert_eq!(said("inner = {}"), "inner: `limit` is missing");
        assert_eq!(
            said("count = \"99999999999999999999\""),
            "count: `99999999999999999999` is too large (at most 9223372036854775807)"
        );
        assert_eq!(
            said("colour = 1"),
            "colour: unknown key `colour`; this section takes `count`, `name`, `on`, `names`, `choice`, `passed`, `inner`, `rate`"
        );
        assert_eq!(
            said("choice = \"xml\""),
            "choice: unknown choice `xml`; one of `json`, `avro`"
        );
        assert_eq!(
            said("names = [1]"),
            "names[0]: expected text, found the number 1"
        );
        assert_eq!(
            said("on = 2"),
            "on: expected true or false, found the number 2"
        );
        let error = read("count = -5").unwrap_err();
        assert_eq!(error.path, ["count"]);
        assert_eq!(error.kind, ReadErrorKind::Negative { value: -5 });
    }

    #[test]
    fn whole_numbers_are_taken_up_to_their_types_bounds_and_not_past() {
        assert_eq!(read("count = 4294967295").unwrap().count, u32::MAX);
        assert_eq!(
            read("count = 4294967296").unwrap_err().kind,
            ReadErrorKind::TooLarge {
                value: "4294967296".into(),
                max: 4294967295
            }
        );
        let limit = |text: &str| read(text).map(|s| s.inner.map(|i| i.limit));
        assert_eq!(limit("inner = { limit = -32768 }").unwrap(), Some(i16::MIN));
        assert_eq!(limit("inner = { limit = 32767 }").unwrap(), Some(i16::MAX));
        assert_eq!(
            limit("inner = { limit = -32769 }").unwrap_err().to_string(),
            "inner.limit: `-32769` is not allowed here: expected -32768 or more"
        );
        assert!(limit("inner = { limit = 32768 }").is_err());
    }

    #[test]
    fn numbers_with_a_fraction_are_read_as_written_or_as_text() {
        assert_eq!(read("rate = 2.5").unwrap().rate, 2.5);
        assert_eq!(read("rate = \"0.25\"").unwrap().rate, 0.25);
        assert_eq!(read("rate = 3").unwrap().rate, 3.0);
        assert_eq!(
            read("rate = \"fast\"").unwrap_err().to_string(),
            "rate: expected a number, found the text \"fast\""
        );
    }

    #[test]
    fn an_error_seen_from_further_out_names_the_whole_path() {
        let error = read("count = -1").unwrap_err().within(&["source"]);
        assert_eq!(error.setting(), "source.count");
        let said = ReadError::new(ReadErrorKind::Said("sink.topik: not a setting".into()))
            .at(&["sink".to_owned()]);
        assert_eq!(said.to_string(), "sink.topik: not a setting");
        let other = ReadError::new(ReadErrorKind::Said("bad".into())).at(&["sink".to_owned()]);
        assert_eq!(other.to_string(), "sink: bad");
    }
}

//! Kafka Connect schemas and JSON text exactly as Kafka's `JsonConverter` writes
//! them (connect/json `JsonConverter.java`: `asJsonSchema`, `convertToJson`; text
//! by Jackson 2.x's `UTF8JsonGenerator`):
//!
//! - a schema object's keys in the order `type`, `fields`/`items`, `optional`
//!   (always), `name`, `version`, `parameters`, `default` (each only when set), and
//!   in a struct's member list `field` last;
//! - compact text, non-ASCII as UTF-8 except characters beyond U+FFFF, which Jackson
//!   escapes as two `\uXXXX` surrogates; control characters as `\b \t \n \f \r` or
//!   `\u00XX` (upper-case hex); `/` not escaped;
//! - doubles and floats as Java's `Double.toString`/`Float.toString` (`100.0`,
//!   `1.0E10`), NaN and infinities as the strings `"NaN"`, `"Infinity"`.

use std::fmt::Write as _;

use crate::event::avro::write_long;

/// A Connect schema type.
#[derive(Debug, Clone, PartialEq)]
pub enum Type {
    Int16,
    Int32,
    Int64,
    Float32,
    Float64,
    Boolean,
    String,
    Bytes,
    Struct(Vec<(String, Schema)>),
    Array(Box<Schema>),
}

/// A Connect schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    pub ty: Type,
    pub optional: bool,
    pub name: Option<String>,
    pub version: Option<u32>,
    pub parameters: Vec<(&'static str, String)>,
    /// The default as JSON text.
    pub default: Option<String>,
}

impl Schema {
    pub fn of(ty: Type, optional: bool) -> Self {
        Schema {
            ty,
            optional,
            name: None,
            version: None,
            parameters: Vec::new(),
            default: None,
        }
    }

    pub fn named(mut self, name: impl Into<String>, version: Option<u32>) -> Self {
        self.name = Some(name.into());
        self.version = version;
        self
    }

    pub fn parameter(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.parameters.push((key, value.into()));
        self
    }

    /// The schema as `JsonConverter.asJsonSchema` writes it, with `"field"` last
    /// when it is a struct member.
    pub fn write(&self, out: &mut String, field: Option<&str>) {
        out.push_str("{\"type\":\"");
        out.push_str(match &self.ty {
            Type::Int16 => "int16",
            Type::Int32 => "int32",
            Type::Int64 => "int64",
            Type::Float32 => "float",
            Type::Float64 => "double",
            Type::Boolean => "boolean",
            Type::String => "string",
            Type::Bytes => "bytes",
            Type::Struct(_) => "struct",
            Type::Array(_) => "array",
        });
        out.push('"');
        match &self.ty {
            Type::Struct(fields) => {
                out.push_str(",\"fields\":[");
                for (i, (name, schema)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    schema.write(out, Some(name));
                }
                out.push(']');
            }
            Type::Array(items) => {
                out.push_str(",\"items\":");
                items.write(out, None);
            }
            _ => {}
        }
        out.push_str(if self.optional {
            ",\"optional\":true"
        } else {
            ",\"optional\":false"
        });
        if let Some(name) = &self.name {
            out.push_str(",\"name\":");
            write_string(out, name);
        }
        self.write_metadata(out, "");
        if let Some(field) = field {
            out.push_str(",\"field\":");
            write_string(out, field);
        }
        out.push('}');
    }
}

impl Schema {
    /// The Avro schema Confluent's `AvroData` derives from this one (its defaults:
    /// `connect.meta.data` on), as compact JSON: a struct is a record named by the
    /// last part of its name in the namespace of the rest, and written once (later
    /// uses name it); an optional field is `["null", T]` with default null (`[T,
    /// "null"]` with a Connect default); `connect.version`, `connect.parameters`,
    /// `connect.default`, `connect.name` and `connect.type` (int16) as properties;
    /// `Decimal`, `Date`, `Time` and `Timestamp` with their Avro logical types.
    /// Record and field names are made names Avro allows ([`avro_fullname`],
    /// [`avro_name`]), as Debezium's name adjustment mode `avro` makes them: a
    /// topic prefix `mssql-ces` or a column `order id` would otherwise be refused by
    /// a registry.
    pub fn avro_json(&self) -> String {
        let mut out = String::new();
        let mut defined = std::collections::HashSet::new();
        self.write_avro(&mut out, "", &mut defined);
        out
    }

    /// The full name of the record this schema becomes (its Connect name, as Avro
    /// allows it: see [`avro_fullname`]).
    pub fn record_name(&self) -> Option<String> {
        self.name.as_deref().map(avro_fullname)
    }

    /// The type, not made optional.
    fn write_avro(
        &self,
        out: &mut String,
        namespace: &str,
        defined: &mut std::collections::HashSet<String>,
    ) {
        match &self.ty {
            Type::Struct(fields) => self.write_avro_record(out, fields, namespace, defined),
            Type::Array(items) => {
                out.push_str("{\"type\":\"array\",\"items\":");
                items.write_avro_optional(out, namespace, defined);
                out.push('}');
            }
            primitive => self.write_avro_primitive(out, primitive),
        }
    }

    /// A struct as an Avro record, or its name once it has been written.
    fn write_avro_record(
        &self,
        out: &mut String,
        fields: &[(String, Schema)],
        namespace: &str,
        defined: &mut std::collections::HashSet<String>,
    ) {
        let full = avro_fullname(
            self.name
                .as_deref()
                .unwrap_or("io.confluent.connect.avro.ConnectDefault"),
        );
        let (space, short) = match full.rsplit_once('.') {
            Some((space, short)) => (space.to_owned(), short.to_owned()),
            None => (String::new(), full.clone()),
        };
        if !defined.insert(full.clone()) {
            write_string(out, if space == namespace { &short } else { &full });
            return;
        }
        out.push_str("{\"type\":\"record\",\"name\":");
        write_string(out, &short);
        if space != namespace && !space.is_empty() {
            out.push_str(",\"namespace\":");
            write_string(out, &space);
        }
        out.push_str(",\"fields\":[");
        let inner = if space.is_empty() { namespace } else { &space };
        for (i, (name, field)) in fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"name\":");
            write_string(out, &avro_name(name));
            out.push_str(",\"type\":");
            field.write_avro_optional(out, inner, defined);
            match (&field.default, field.optional) {
                (Some(default), _) => {
                    out.push_str(",\"default\":");
                    out.push_str(default);
                }
                (None, true) => out.push_str(",\"default\":null"),
                (None, false) => {}
            }
            out.push('}');
        }
        out.push(']');
        self.write_avro_properties(out, &full);
        out.push('}');
    }

    /// A primitive: its Avro type, bare or with the properties and logical type.
    fn write_avro_primitive(&self, out: &mut String, primitive: &Type) {
        let avro = match primitive {
            Type::Int16 | Type::Int32 => "int",
            Type::Int64 => "long",
            Type::Float32 => "float",
            Type::Float64 => "double",
            Type::Boolean => "boolean",
            Type::Bytes => "bytes",
            _ => "string",
        };
        let logical = match self.name.as_deref() {
            Some("org.apache.kafka.connect.data.Decimal") => Some("decimal"),
            Some("org.apache.kafka.connect.data.Date") => Some("date"),
            Some("org.apache.kafka.connect.data.Time") => Some("time-millis"),
            Some("org.apache.kafka.connect.data.Timestamp") => Some("timestamp-millis"),
            _ => None,
        };
        let int16 = matches!(primitive, Type::Int16);
        if self.name.is_none()
            && self.version.is_none()
            && self.parameters.is_empty()
            && self.default.is_none()
            && !int16
        {
            write_string(out, avro);
            return;
        }
        out.push_str("{\"type\":");
        write_string(out, avro);
        if logical == Some("decimal") {
            let parameter = |key: &str| {
                self.parameters
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v.clone())
            };
            let _ = write!(
                out,
                ",\"scale\":{},\"precision\":{}",
                parameter("scale").unwrap_or_else(|| "0".into()),
                parameter("connect.decimal.precision").unwrap_or_else(|| "64".into())
            );
        }
        self.write_avro_properties(out, self.name.as_deref().unwrap_or_default());
        if int16 {
            out.push_str(",\"connect.type\":\"int16\"");
        }
        if let Some(logical) = logical {
            out.push_str(",\"logicalType\":");
            write_string(out, logical);
        }
        out.push('}');
    }

    /// `version`, `parameters` and `default`, each when set, with their names
    /// prefixed (`""` in JsonConverter's schema, `"connect."` in AvroData's).
    fn write_metadata(&self, out: &mut String, prefix: &str) {
        if let Some(version) = self.version {
            let _ = write!(out, ",\"{prefix}version\":{version}");
        }
        if !self.parameters.is_empty() {
            let _ = write!(out, ",\"{prefix}parameters\":{{");
            for (i, (k, v)) in self.parameters.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_string(out, v);
            }
            out.push('}');
        }
        if let Some(default) = &self.default {
            let _ = write!(out, ",\"{prefix}default\":{default}");
        }
    }

    /// `connect.version`, `connect.parameters`, `connect.default`, `connect.name`.
    fn write_avro_properties(&self, out: &mut String, name: &str) {
        self.write_metadata(out, "connect.");
        if !name.is_empty() {
            out.push_str(",\"connect.name\":");
            write_string(out, name);
        }
    }

    /// The type as a field or array item has it: optional ones in a union with
    /// null (null first without a default, last with one).
    fn write_avro_optional(
        &self,
        out: &mut String,
        namespace: &str,
        defined: &mut std::collections::HashSet<String>,
    ) {
        if !self.optional {
            self.write_avro(out, namespace, defined);
        } else if self.default.is_some() {
            out.push('[');
            self.write_avro(out, namespace, defined);
            out.push_str(",\"null\"]");
        } else {
            out.push_str("[\"null\",");
            self.write_avro(out, namespace, defined);
            out.push(']');
        }
    }

    /// Appends the Avro binary datum of `value` (the JSON payload JsonConverter
    /// would write for this schema) to `out`.
    pub fn write_avro_datum(
        &self,
        out: &mut Vec<u8>,
        value: &serde_json::Value,
    ) -> Result<(), String> {
        if self.optional {
            let null_first = self.default.is_none();
            let branch: i64 = match (value.is_null(), null_first) {
                (true, true) | (false, false) => 0,
                _ => 1,
            };
            write_long(out, branch);
            if value.is_null() {
                return Ok(());
            }
        }
        let mismatch = || format!("{value} does not fit {:?}", self.ty);
        match &self.ty {
            Type::Int16 | Type::Int32 | Type::Int64 => {
                write_long(out, value.as_i64().ok_or_else(mismatch)?);
            }
            Type::Float32 => {
                let v = json_float(value).ok_or_else(mismatch)?;
                out.extend_from_slice(&(v as f32).to_le_bytes());
            }
            Type::Float64 => {
                let v = json_float(value).ok_or_else(mismatch)?;
                out.extend_from_slice(&v.to_le_bytes());
            }
            Type::Boolean => out.push(u8::from(value.as_bool().ok_or_else(mismatch)?)),
            Type::String => {
                let s = value.as_str().ok_or_else(mismatch)?;
                write_long(out, s.len() as i64);
                out.extend_from_slice(s.as_bytes());
            }
            Type::Bytes => {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(value.as_str().ok_or_else(mismatch)?)
                    .map_err(|e| e.to_string())?;
                write_long(out, bytes.len() as i64);
                out.extend_from_slice(&bytes);
            }
            Type::Struct(fields) => {
                for (name, field) in fields {
                    field.write_avro_datum(
                        out,
                        value.get(name).unwrap_or(&serde_json::Value::Null),
                    )?;
                }
            }
            Type::Array(items) => {
                let list = value.as_array().ok_or_else(mismatch)?;
                if !list.is_empty() {
                    write_long(out, list.len() as i64);
                    for item in list {
                        items.write_avro_datum(out, item)?;
                    }
                }
                write_long(out, 0);
            }
        }
        Ok(())
    }
}

/// A JSON number, or the strings JsonConverter writes for NaN and the infinities.
fn json_float(value: &serde_json::Value) -> Option<f64> {
    match value {
        serde_json::Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        other => other.as_f64(),
    }
}

/// A name as Avro allows it: a letter or `_` first, then letters, digits and `_`;
/// anything else becomes `_`, as Debezium's `schema.name.adjustment.mode` and
/// `field.name.adjustment.mode` = `avro` adjust it (`order id` is `order_id`,
/// `2024` is `_024`). A valid name is itself.
pub fn avro_name(name: &str) -> String {
    name.chars()
        .enumerate()
        .map(|(i, c)| match c {
            'A'..='Z' | 'a'..='z' | '_' => c,
            '0'..='9' if i > 0 => c,
            _ => '_',
        })
        .collect()
}

/// A full name (`namespace.name`) as Avro allows it: each dot-separated part
/// adjusted as [`avro_name`] does (`mssql-ces.Shop.dbo.T` is `mssql_ces.Shop.dbo.T`).
pub fn avro_fullname(name: &str) -> String {
    name.split('.').map(avro_name).collect::<Vec<_>>().join(".")
}

/// A JSON string as Jackson writes it.
pub fn write_string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.reserve(s.len() + 2);
    out.push('"');
    let unit = |out: &mut String, u: u16| {
        out.push_str("\\u");
        for shift in [12, 8, 4, 0] {
            out.push(char::from(HEX[usize::from((u >> shift) & 0xF)]));
        }
    };
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{0C}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => unit(out, c as u16),
            c if (c as u32) > 0xFFFF => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    unit(out, *u);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Java's `Double.toString` (shortest digits that read back, as Java 19 and later
/// print them), or the quoted names Jackson writes for NaN and the infinities.
pub fn write_double(out: &mut String, v: f64) {
    write_java_number(out, v, &format!("{:e}", v.abs()));
}

/// Java's `Float.toString`, as [`write_double`]: the float's own shortest digits.
pub fn write_float(out: &mut String, v: f32) {
    // Widening keeps NaN, the infinities, zero and the sign: only the digits
    // must be the float's.
    write_java_number(out, f64::from(v), &format!("{:e}", v.abs()));
}

/// `v`, whose shortest digits are `scientific` (`d.ddde±x`), as Java prints it.
fn write_java_number(out: &mut String, v: f64, scientific: &str) {
    match (v.is_nan(), v.is_finite(), v > 0.0) {
        (true, _, _) => out.push_str("\"NaN\""),
        (false, false, true) => out.push_str("\"Infinity\""),
        (false, false, false) => out.push_str("\"-Infinity\""),
        (false, true, _) => java_decimal(out, v == 0.0, v.is_sign_negative(), scientific),
    }
}

/// Formats Rust's shortest scientific form (`d.ddde±x`) the way Java does: plain
/// with at least one fraction digit for 10⁻³ ≤ |v| < 10⁷, else `d.dddE±x`.
fn java_decimal(out: &mut String, zero: bool, negative: bool, scientific: &str) {
    if negative {
        out.push('-');
    }
    if zero {
        out.push_str("0.0");
        return;
    }
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((scientific, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-3..7).contains(&exponent) {
        if exponent >= 0 {
            let int_len = exponent as usize + 1;
            let (int, frac) = if digits.len() > int_len {
                (digits[..int_len].to_owned(), digits[int_len..].to_owned())
            } else {
                (
                    format!("{digits}{}", "0".repeat(int_len - digits.len())),
                    String::new(),
                )
            };
            out.push_str(&int);
            out.push('.');
            out.push_str(if frac.is_empty() { "0" } else { &frac });
        } else {
            out.push_str("0.");
            out.push_str(&"0".repeat((-exponent - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        out.push('.');
        out.push_str(if digits.len() > 1 { &digits[1..] } else { "0" });
        let _ = write!(out, "E{exponent}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn double(v: f64) -> String {
        let mut out = String::new();
        write_double(&mut out, v);
        out
    }

    /// Java 21's `Double.toString` and `Float.toString` of the same values.
    #[test]
    fn numbers_print_as_java_prints_them() {
        for (v, java) in [
            (100.0, "100.0"),
            (0.1, "0.1"),
            (3.323, "3.323"),
            (1e10, "1.0E10"),
            (1.5e-5, "1.5E-5"),
            (0.001, "0.001"),
            (1234567.0, "1234567.0"),
            (12345678.0, "1.2345678E7"),
            (-2.5, "-2.5"),
            (0.0, "0.0"),
            (f64::NAN, "\"NaN\""),
            (f64::NEG_INFINITY, "\"-Infinity\""),
        ] {
            assert_eq!(double(v), java, "{v}");
        }
        let mut out = String::new();
        write_float(&mut out, 4.323f32);
        assert_eq!(out, "4.323");
        out.clear();
        write_float(&mut out, 1e10f32);
        assert_eq!(out, "1.0E10");
    }

    #[test]
    fn strings_are_escaped_as_jackson_escapes_them() {
        let mut out = String::new();
        write_string(&mut out, "a\"\\/\u{1}\t\u{7F}é😀");
        assert_eq!(out, "\"a\\\"\\\\/\\u0001\\t\u{7F}é\\uD83D\\uDE00\"");
    }

    #[test]
    fn schema_keys_come_in_the_converters_order() {
        let schema = Schema::of(Type::Bytes, true)
            .named("org.apache.kafka.connect.data.Decimal", Some(1))
            .parameter("scale", "3")
            .parameter("connect.decimal.precision", "6");
        let mut out = String::new();
        schema.write(&mut out, Some("val_decimal"));
        assert_eq!(
            out,
            r#"{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"3","connect.decimal.precision":"6"},"field":"val_decimal"}"#
        );
    }

    /// The strings Confluent's `AvroData` writes for these Connect schemas (its
    /// code's order of properties; the Decimal and Timestamp ones as seen in
    /// registries' answers quoted in kafka-connect-jdbc#788 and ksql#7031).
    #[test]
    fn avro_schemas_are_avrodatas() {
        let decimal = Schema::of(Type::Bytes, false)
            .named("org.apache.kafka.connect.data.Decimal", Some(1))
            .parameter("scale", "2")
            .parameter("connect.decimal.precision", "10");
        assert_eq!(
            decimal.avro_json(),
            r#"{"type":"bytes","scale":2,"precision":10,"connect.version":1,"connect.parameters":{"scale":"2","connect.decimal.precision":"10"},"connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"}"#
        );
        let timestamp = Schema::of(Type::Int64, false)
            .named("org.apache.kafka.connect.data.Timestamp", Some(1));
        assert_eq!(
            timestamp.avro_json(),
            r#"{"type":"long","connect.version":1,"connect.name":"org.apache.kafka.connect.data.Timestamp","logicalType":"timestamp-millis"}"#
        );
        assert_eq!(
            Schema::of(Type::Int16, false).avro_json(),
            r#"{"type":"int","connect.type":"int16"}"#
        );
        let row = Schema::of(
            Type::Struct(vec![
                ("id".into(), Schema::of(Type::Int32, false)),
                ("name".into(), Schema::of(Type::String, true)),
            ]),
            true,
        )
        .named("srv.db.dbo.t.Value", None);
        let envelope = Schema::of(
            Type::Struct(vec![("before".into(), row.clone()), ("after".into(), row)]),
            false,
        )
        .named("srv.db.dbo.t.Envelope", Some(2));
        assert_eq!(
            envelope.avro_json(),
            r#"{"type":"record","name":"Envelope","namespace":"srv.db.dbo.t","fields":[{"name":"before","type":["null",{"type":"record","name":"Value","fields":[{"name":"id","type":"int"},{"name":"name","type":["null","string"],"default":null}],"connect.name":"srv.db.dbo.t.Value"}],"default":null},{"name":"after","type":["null","Value"],"default":null}],"connect.version":2,"connect.name":"srv.db.dbo.t.Envelope"}"#
        );
        // And it is a schema apache-avro takes.
        apache_avro::Schema::parse_str(&envelope.avro_json()).unwrap();
    }
}

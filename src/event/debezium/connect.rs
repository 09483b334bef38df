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
        if let Some(version) = self.version {
            let _ = write!(out, ",\"version\":{version}");
        }
        if !self.parameters.is_empty() {
            out.push_str(",\"parameters\":{");
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
            out.push_str(",\"default\":");
            out.push_str(default);
        }
        if let Some(field) = field {
            out.push_str(",\"field\":");
            write_string(out, field);
        }
        out.push('}');
    }
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
    if !v.is_finite() {
        out.push_str(non_finite(v.is_nan(), v > 0.0));
        return;
    }
    java_decimal(
        out,
        v == 0.0,
        v.is_sign_negative(),
        &format!("{:e}", v.abs()),
    );
}

/// Java's `Float.toString`, as [`write_double`].
pub fn write_float(out: &mut String, v: f32) {
    if !v.is_finite() {
        out.push_str(non_finite(v.is_nan(), v > 0.0));
        return;
    }
    java_decimal(
        out,
        v == 0.0,
        v.is_sign_negative(),
        &format!("{:e}", v.abs()),
    );
}

fn non_finite(nan: bool, positive: bool) -> &'static str {
    match (nan, positive) {
        (true, _) => "\"NaN\"",
        (false, true) => "\"Infinity\"",
        (false, false) => "\"-Infinity\"",
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
}

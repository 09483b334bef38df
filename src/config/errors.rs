//! How a configuration error is worded: by line and column for a syntax error
//! (never the line's text), naming the variable or flag that gave a bad value, and
//! in the file's words rather than Rust's.

use crate::setting::ConfigError;

/// A TOML syntax error by line, column and what was expected, never with the line's
/// text: the line may hold a secret written where it does not belong
/// (`connection_string = Server=…;Password=…` without quotes).
pub(super) fn syntax_error(text: &str, error: &toml::de::Error) -> ConfigError {
    let reason = error.message().trim().replace('\n', "; ");
    let Some(span) = error.span() else {
        return ConfigError::Parse(format!("not valid TOML: {reason}"));
    };
    let before = &text.as_bytes()[..span.start.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
    ConfigError::Parse(format!(
        "not valid TOML at line {line}, column {column}: {reason}"
    ))
}

/// A configuration error about a setting an environment variable or a flag gave,
/// saying which (the file does not hold it); and serde's Rust names (`struct
/// SourceSettings`, `u64`) said as the file's words.
pub(super) fn with_origin(error: ConfigError, origins: &[(Vec<String>, String)]) -> ConfigError {
    let ConfigError::Parse(text) = error else {
        return error;
    };
    let mut text = plain_types(&text);
    let named = |path: &[String]| {
        let dotted = path.join(".");
        let last = path.last().map_or(String::new(), |l| format!("`{l}`"));
        text.contains(&dotted) || (!last.is_empty() && text.contains(&last))
    };
    if let Some((_, origin)) = origins.iter().rev().find(|(path, _)| named(path)) {
        text = format!("{text} (set by {origin})");
    }
    ConfigError::Parse(text)
}

/// serde's "invalid value: integer `-5`, expected u64" as "`-5` must not be
/// negative".
fn negative_said(text: String) -> String {
    const NEGATIVE: &str = "invalid value: integer `-";
    let Some(at) = text.find(NEGATIVE) else {
        return text;
    };
    let number_at = at + NEGATIVE.len() - 2;
    let Some(expected) = text[at..].find(", expected u").map(|e| at + e) else {
        return text;
    };
    let type_at = expected + ", expected ".len();
    let type_end = text[type_at..]
        .find(|c: char| c.is_whitespace())
        .map_or(text.len(), |e| type_at + e);
    format!(
        "{}{} must not be negative (a whole number, 0 or more){}",
        &text[..at],
        &text[number_at..expected],
        &text[type_end..]
    )
}

/// serde's words for Rust types as a configuration's: `expected struct
/// SourceSettings` is a section, `u64` a whole number.
fn plain_types(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("struct ") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "struct ".len()..];
        let end = after
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .unwrap_or(after.len());
        out.push_str("a section (a table of settings)");
        rest = &after[end..];
    }
    out.push_str(rest);
    let out = negative_said(out);
    let mut out = out;
    for (rust, plain) in [
        ("expected u64", "expected a whole number"),
        ("expected u32", "expected a whole number"),
        ("expected u16", "expected a whole number"),
        ("expected usize", "expected a whole number"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
    ] {
        out = out.replace(rust, plain);
    }
    out
}

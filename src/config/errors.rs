//! How a TOML syntax error is worded: by line and column (never the line's text).

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

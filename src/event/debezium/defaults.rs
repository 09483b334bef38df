//! Column defaults in Debezium's schemas.
//!
//! SQL Server keeps a default constraint as the text of its expression wrapped in
//! parentheses (`sys.default_constraints.definition`): `DEFAULT 0` is `((0))`,
//! `DEFAULT N'new'` is `(N'new')`, `DEFAULT 1.5` is `((1.5))`, a `bigint` beyond
//! `int` is `((3147483648.))`, `DEFAULT getdate()` is `(getdate())`. Debezium's
//! SQL Server connector reads a constant of the column's type into the field's
//! Connect schema as `default` (and Confluent's AvroData into the Avro field's
//! `default`); an expression it cannot evaluate — a function call, arithmetic —
//! gives no default. That default is what lets a schema registry's `BACKWARD`
//! check accept a new `NOT NULL` column.
//!
//! The constant is read here as a value of the column's type, and then written as
//! any value of the column is; anything that is not a plain constant of that type
//! gives no default. Date and time constants are read in their ISO forms
//! (`'2024-01-31'`, `'2024-01-31 12:30:00.5'`, `'20240131'`); another form gives no
//! default (Debezium asks the server to parse these, which accepts more).

use chrono::{DateTime, FixedOffset, NaiveDate, NaiveDateTime, NaiveTime};

use crate::event::{SqlType, Value};

/// The default `definition` gives a column of `sql_type`; `None` for `NULL`, for
/// an expression that is not a constant, or for a constant of another type.
pub fn parse(definition: &str, sql_type: SqlType) -> Option<Value> {
    let inner = unwrap_parentheses(definition.trim());
    if inner.eq_ignore_ascii_case("null") {
        return None;
    }
    match sql_type {
        SqlType::Char(_) | SqlType::VarChar(_) | SqlType::NChar(_) | SqlType::NVarChar(_) => {
            string_literal(inner).map(Value::Text)
        }
        SqlType::UniqueIdentifier => string_literal(inner)
            .and_then(|s| uuid::Uuid::parse_str(s.trim()).ok())
            .map(Value::Guid),
        SqlType::Bit => match string_literal(inner) {
            // SQL Server converts the strings TRUE and FALSE to bit.
            Some(text) if text.eq_ignore_ascii_case("true") => Some(Value::Bit(true)),
            Some(text) if text.eq_ignore_ascii_case("false") => Some(Value::Bit(false)),
            Some(_) => None,
            // Any number but zero is 1.
            None => decimal(inner).map(|(unscaled, _)| Value::Bit(unscaled != 0)),
        },
        SqlType::TinyInt => integer(inner)
            .and_then(|n| u8::try_from(n).ok())
            .map(Value::TinyInt),
        SqlType::SmallInt => integer(inner)
            .and_then(|n| i16::try_from(n).ok())
            .map(Value::SmallInt),
        SqlType::Int => integer(inner)
            .and_then(|n| i32::try_from(n).ok())
            .map(Value::Int),
        SqlType::BigInt => integer(inner).map(Value::BigInt),
        SqlType::Decimal { .. }
        | SqlType::Numeric { .. }
        | SqlType::Money
        | SqlType::SmallMoney => {
            decimal(inner).map(|(unscaled, scale)| Value::Decimal { unscaled, scale })
        }
        SqlType::Float => number_text(inner)
            .and_then(|t| t.parse::<f64>().ok())
            .map(Value::Float),
        SqlType::Real => number_text(inner)
            .and_then(|t| t.parse::<f32>().ok())
            .map(Value::Real),
        SqlType::Binary(_) | SqlType::VarBinary(_) => hex(inner).map(Value::Binary),
        SqlType::Date => string_literal(inner)
            .and_then(|s| date(&s))
            .map(Value::Date),
        SqlType::Time { scale } => string_literal(inner)
            .and_then(|s| time(&s))
            .map(|value| Value::Time { value, scale }),
        SqlType::DateTime => string_literal(inner)
            .and_then(|s| datetime(&s))
            .map(Value::DateTime),
        SqlType::SmallDateTime => string_literal(inner)
            .and_then(|s| datetime(&s))
            .map(Value::SmallDateTime),
        SqlType::DateTime2 { scale } => string_literal(inner)
            .and_then(|s| datetime(&s))
            .map(|value| Value::DateTime2 { value, scale }),
        SqlType::DateTimeOffset { scale } => string_literal(inner)
            .and_then(|s| datetime_offset(&s))
            .map(|value| Value::DateTimeOffset { value, scale }),
    }
}

/// The text inside the parentheses that wrap the whole of `text`, however many.
fn unwrap_parentheses(mut text: &str) -> &str {
    while let Some(inner) = text.strip_prefix('(').and_then(|t| t.strip_suffix(')')) {
        if !balanced(inner) {
            break;
        }
        text = inner.trim();
    }
    text
}

/// Whether no `)` in `text` closes a parenthesis opened before it (outside string
/// literals): `(1)+(2)` stripped of its ends is not.
fn balanced(text: &str) -> bool {
    let mut depth = 0usize;
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            _ => {}
        }
    }
    depth == 0 && !quoted
}

/// The value of a string literal (`'it''s'`, `N'…'`), the whole of `text`.
fn string_literal(text: &str) -> Option<String> {
    let body = text
        .strip_prefix(['N', 'n'])
        .unwrap_or(text)
        .strip_prefix('\'')?
        .strip_suffix('\'')?;
    let mut value = String::with_capacity(body.len());
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            // Inside, a quote is only ever doubled.
            if chars.next() != Some('\'') {
                return None;
            }
        }
        value.push(c);
    }
    Some(value)
}

/// A numeric constant's text, with a sign that may stand outside its own
/// parentheses (`(-(1))` is how SQL Server keeps some negative constants).
fn number_text(text: &str) -> Option<String> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, unwrap_parentheses(rest.trim())),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let plain = rest
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'));
    if rest.is_empty() || !plain || !rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    Some(if negative {
        format!("-{rest}")
    } else {
        rest.to_owned()
    })
}

/// An exact numeric constant as an unscaled value and its scale (`1.50` is
/// `(150, 2)`); `None` with an exponent or beyond 38 digits.
fn decimal(text: &str) -> Option<(i128, u8)> {
    let text = number_text(text)?;
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if !whole
        .chars()
        .chain(fraction.chars())
        .all(|c| c.is_ascii_digit())
        || (whole.is_empty() && fraction.is_empty())
    {
        return None;
    }
    let scale = u8::try_from(fraction.len()).ok().filter(|s| *s <= 38)?;
    let mut unscaled: i128 = 0;
    for c in whole.chars().chain(fraction.chars()) {
        unscaled = unscaled
            .checked_mul(10)?
            .checked_add(i128::from(c.to_digit(10)?))?;
    }
    Some((if negative { -unscaled } else { unscaled }, scale))
}

/// A whole number (`3147483648.` is how SQL Server keeps a constant beyond `int`).
fn integer(text: &str) -> Option<i64> {
    let (unscaled, scale) = decimal(text)?;
    if scale != 0 {
        // `1.0` is not an integer constant SQL Server would keep for an int.
        return None;
    }
    i64::try_from(unscaled).ok()
}

/// `0x0102…`.
fn hex(text: &str) -> Option<Vec<u8>> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))?;
    if digits.len() % 2 != 0 {
        return None;
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(digits.get(i..i + 2)?, 16).ok())
        .collect()
}

fn date(text: &str) -> Option<NaiveDate> {
    let text = text.trim();
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .or_else(|_| NaiveDate::parse_from_str(text, "%Y%m%d"))
        .ok()
}

fn time(text: &str) -> Option<NaiveTime> {
    let text = text.trim();
    NaiveTime::parse_from_str(text, "%H:%M:%S%.f")
        .or_else(|_| NaiveTime::parse_from_str(text, "%H:%M"))
        .ok()
}

fn datetime(text: &str) -> Option<NaiveDateTime> {
    let text = text.trim();
    if let Some(day) = date(text) {
        return day.and_hms_opt(0, 0, 0);
    }
    let (day, clock) = text.split_once([' ', 'T'])?;
    Some(date(day)?.and_time(time(clock)?))
}

fn datetime_offset(text: &str) -> Option<DateTime<FixedOffset>> {
    let text = text.trim();
    DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f %:z")
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f%:z"))
        .or_else(|_| DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%:z"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Length;

    fn text(s: &str) -> Option<Value> {
        Some(Value::Text(s.into()))
    }

    #[test]
    fn numbers_as_sql_server_keeps_them() {
        assert_eq!(parse("((0))", SqlType::Int), Some(Value::Int(0)));
        assert_eq!(parse("((-1))", SqlType::Int), Some(Value::Int(-1)));
        assert_eq!(
            parse("(-(1))", SqlType::SmallInt),
            Some(Value::SmallInt(-1))
        );
        assert_eq!(
            parse("((255))", SqlType::TinyInt),
            Some(Value::TinyInt(255))
        );
        assert_eq!(parse("((256))", SqlType::TinyInt), None, "out of range");
        assert_eq!(
            parse("((3147483648.))", SqlType::BigInt),
            Some(Value::BigInt(3_147_483_648))
        );
        assert_eq!(parse("((3147483648.))", SqlType::Int), None);
        assert_eq!(parse("((1))", SqlType::Bit), Some(Value::Bit(true)));
        assert_eq!(parse("((0))", SqlType::Bit), Some(Value::Bit(false)));
        assert_eq!(parse("('true')", SqlType::Bit), Some(Value::Bit(true)));
        assert_eq!(
            parse(
                "((100.12345))",
                SqlType::Decimal {
                    precision: 10,
                    scale: 5
                }
            ),
            Some(Value::Decimal {
                unscaled: 10_012_345,
                scale: 5
            })
        );
        assert_eq!(
            parse("((-0.5))", SqlType::Money),
            Some(Value::Decimal {
                unscaled: -5,
                scale: 1
            })
        );
        assert_eq!(
            parse("((1.2345000000000000e+003))", SqlType::Float),
            Some(Value::Float(1234.5))
        );
        assert_eq!(parse("((2.5))", SqlType::Real), Some(Value::Real(2.5)));
    }

    #[test]
    fn strings_binary_and_guids() {
        let nvarchar = SqlType::NVarChar(Length::Bounded(20));
        assert_eq!(parse("(N'new')", nvarchar), text("new"));
        assert_eq!(parse("('it''s')", nvarchar), text("it's"));
        assert_eq!(parse("('')", nvarchar), text(""));
        assert_eq!(parse("('a(b')", nvarchar), text("a(b"));
        assert_eq!(parse("('a'+'b')", nvarchar), None, "an expression");
        assert_eq!(parse("(NULL)", nvarchar), None);
        assert_eq!(
            parse("(0x0102FF)", SqlType::VarBinary(Length::Bounded(8))),
            Some(Value::Binary(vec![1, 2, 0xFF]))
        );
        let guid = "6F9619FF-8B86-D011-B42D-00C04FC964FF";
        assert_eq!(
            parse(&format!("('{guid}')"), SqlType::UniqueIdentifier),
            Some(Value::Guid(uuid::Uuid::parse_str(guid).unwrap()))
        );
        assert_eq!(parse("(newid())", SqlType::UniqueIdentifier), None);
    }

    #[test]
    fn dates_and_times_in_iso_forms() {
        let day = NaiveDate::from_ymd_opt(2019, 2, 3).unwrap();
        assert_eq!(
            parse("('2019-02-03')", SqlType::Date),
            Some(Value::Date(day))
        );
        assert_eq!(parse("('20190203')", SqlType::Date), Some(Value::Date(day)));
        assert_eq!(
            parse("('2019-02-03 04:05:06.5')", SqlType::DateTime2 { scale: 7 }),
            Some(Value::DateTime2 {
                value: day.and_hms_milli_opt(4, 5, 6, 500).unwrap(),
                scale: 7
            })
        );
        assert_eq!(
            parse("('2019-02-03')", SqlType::DateTime),
            Some(Value::DateTime(day.and_hms_opt(0, 0, 0).unwrap()))
        );
        assert_eq!(
            parse("('12:30')", SqlType::Time { scale: 3 }),
            Some(Value::Time {
                value: NaiveTime::from_hms_opt(12, 30, 0).unwrap(),
                scale: 3
            })
        );
        let offset = parse(
            "('2019-02-03 04:05:06 +02:00')",
            SqlType::DateTimeOffset { scale: 0 },
        );
        assert!(
            matches!(offset, Some(Value::DateTimeOffset { value, .. }) if value.offset().local_minus_utc() == 7200)
        );
        assert_eq!(parse("(getdate())", SqlType::DateTime), None);
        assert_eq!(
            parse("(sysutcdatetime())", SqlType::DateTime2 { scale: 7 }),
            None
        );
        assert_eq!(parse("('Feb 3 2019')", SqlType::Date), None, "not ISO");
    }

    #[test]
    fn parentheses_that_do_not_wrap_the_whole_are_kept() {
        assert_eq!(unwrap_parentheses("((1))"), "1");
        assert_eq!(unwrap_parentheses("((1)+(2))"), "(1)+(2)");
        assert_eq!(parse("((1)+(2))", SqlType::Int), None);
        assert_eq!(parse("((1)*(2))", SqlType::Int), None);
    }
}

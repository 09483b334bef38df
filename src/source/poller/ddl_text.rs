//! Reading `cdc.ddl_history.ddl_command`: which columns an `ALTER TABLE` adds or
//! drops. The text is the statement as it was issued, so names may be bare, in
//! brackets or in double quotes, in any case (the default collations compare names
//! case-insensitively, and so does this, in ASCII).

/// Whether `command` (a `cdc.ddl_history.ddl_command`) adds a column named `column`:
/// after its `ADD`, one of the comma-separated items (at the top level: not inside
/// parentheses, brackets or quotes) starts with the name — bare, in brackets or in
/// double quotes. A name that only appears inside an item (a computed column's
/// expression, a constraint) is not added. Names compare case-insensitively (ASCII),
/// as in the default collations.
pub(super) fn adds_column(command: &str, column: &str) -> bool {
    let upper = command.to_ascii_uppercase();
    let Some(at) = find_word(&upper, "ADD") else {
        return false;
    };
    let column = column.to_ascii_uppercase();
    top_level_items(&upper[at + 3..])
        .iter()
        .any(|item| first_name(item).is_some_and(|name| name == column))
}

/// `text` cut at its top-level commas.
fn top_level_items(text: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut quote, mut start) = (0usize, None::<char>, 0);
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(close), c) if c == close => quote = None,
            (None, '[') => quote = Some(']'),
            (None, '"') => quote = Some('"'),
            (None, '\'') => quote = Some('\''),
            (None, '(') => depth += 1,
            (None, ')') => depth = depth.saturating_sub(1),
            (None, ',') if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&text[start..]);
    items
}

/// The name an item of an `ADD` list starts with, unquoted (`]]` and `""` undone).
fn first_name(item: &str) -> Option<String> {
    let item = item.trim_start();
    let quoted = |open: char, close: char| -> Option<String> {
        let mut rest = item.strip_prefix(open)?;
        let mut name = String::new();
        loop {
            let end = rest.find(close)?;
            name.push_str(&rest[..end]);
            rest = &rest[end + close.len_utf8()..];
            match rest.strip_prefix(close) {
                // Doubled: the character itself.
                Some(more) => {
                    name.push(close);
                    rest = more;
                }
                None => return Some(name),
            }
        }
    };
    quoted('[', ']').or_else(|| quoted('"', '"')).or_else(|| {
        let word: String = item.chars().take_while(|&c| is_identifier(c)).collect();
        (!word.is_empty()).then_some(word)
    })
}

/// The byte offset of `word` in `text` where it is not part of a longer identifier.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let identifier = is_identifier;
    text.match_indices(word).map(|(at, _)| at).find(|&at| {
        let before = text[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !identifier(c));
        let after = text[at + word.len()..]
            .chars()
            .next()
            .is_none_or(|c| !identifier(c));
        before && after
    })
}

/// Whether `command` drops a column named `column`: after its `DROP`, an item of a
/// `COLUMN` clause is the name (`DROP COLUMN a, b`, `DROP COLUMN IF EXISTS a`,
/// `DROP CONSTRAINT c, COLUMN a`). Items without a keyword continue the clause
/// before them; the first one, without `COLUMN`, names a constraint.
pub(super) fn drops_column(command: &str, column: &str) -> bool {
    let upper = command.to_ascii_uppercase();
    let Some(at) = find_word(&upper, "DROP") else {
        return false;
    };
    let column = column.to_ascii_uppercase();
    let mut in_columns = false;
    for item in top_level_items(&upper[at + 4..]) {
        let mut rest = item;
        if let Some(after) = strip_word(rest, "COLUMN") {
            in_columns = true;
            rest = after;
        } else if let Some(after) = strip_word(rest, "CONSTRAINT") {
            in_columns = false;
            rest = after;
        }
        if let Some(after) = strip_word(rest, "IF").and_then(|r| strip_word(r, "EXISTS")) {
            rest = after;
        }
        if in_columns && first_name(rest).is_some_and(|name| name == column) {
            return true;
        }
    }
    false
}

/// `text` after a leading `word` that is not the start of a longer identifier.
fn strip_word<'a>(text: &'a str, word: &str) -> Option<&'a str> {
    let rest = text.trim_start().strip_prefix(word)?;
    rest.chars()
        .next()
        .is_none_or(|c| !is_identifier(c))
        .then_some(rest)
}

fn is_identifier(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '@' | '#' | '$')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_is_not_part_of_a_longer_identifier() {
        assert_eq!(find_word("ADD", "ADD"), Some(0));
        assert_eq!(find_word("ADDX ADD", "ADD"), Some(5));
        assert_eq!(find_word("XADD ADD", "ADD"), Some(5));
        for joined in ["_", "@", "#", "$", "9"] {
            let before = format!("{joined}ADD ADD");
            assert_eq!(
                find_word(&before, "ADD"),
                Some(before.len() - 3),
                "{before}"
            );
            let after = format!("ADD{joined} ADD");
            assert_eq!(find_word(&after, "ADD"), Some(after.len() - 3), "{after}");
        }
        assert_eq!(find_word("[ADD](ADD", "ADD"), Some(1));
        assert_eq!(find_word("ADDRESS", "ADD"), None);
    }

    #[test]
    fn an_add_is_recognised_by_the_columns_name_as_a_word() {
        assert!(adds_column(
            "ALTER TABLE dbo.T ADD [Email] nvarchar(80)",
            "Email"
        ));
        assert!(adds_column(
            "alter table dbo.T add Email nvarchar(80) null",
            "Email"
        ));
        assert!(adds_column("ALTER TABLE T ADD a int, \"b c\" int", "b c"));
        assert!(adds_column("ALTER TABLE T ADD a int, b int", "b"));
        assert!(!adds_column("ALTER TABLE T ADD Emails int", "Email"));
        assert!(!adds_column(
            "ALTER TABLE T ALTER COLUMN Email nvarchar(90)",
            "Email"
        ));
        assert!(!adds_column("ALTER TABLE T DROP COLUMN Email", "Email"));
        assert!(!adds_column("ALTER TABLE T ADD x int -- no", "Email"));
        // Named inside an item, not added by it.
        assert!(!adds_column(
            "ALTER TABLE T ADD Total AS (Price * Secret)",
            "Secret"
        ));
        assert!(!adds_column(
            "ALTER TABLE T ADD CONSTRAINT c CHECK (Secret > 0)",
            "Secret"
        ));
        assert!(!adds_column(
            "ALTER TABLE T ADD x int DEFAULT (1), y AS (Secret)",
            "Secret"
        ));
        assert!(adds_column(
            "ALTER TABLE T ADD x decimal(9, 2), [Secret] int",
            "Secret"
        ));
        // A comma inside parentheses, brackets or quotes does not start an item.
        for inside in [
            "ALTER TABLE T ADD Total AS (COALESCE(Price, Secret))",
            "ALTER TABLE T ADD [a,Secret] int",
            "ALTER TABLE T ADD \"a,Secret\" int",
            "ALTER TABLE T ADD x varchar(9) DEFAULT ('a,Secret')",
            "ALTER TABLE T ADD x varchar(9) DEFAULT 'a, Secret'",
        ] {
            assert!(!adds_column(inside, "Secret"), "{inside}");
        }
        // After a quoted name closes, the next comma does; nothing counts inside one.
        assert!(adds_column(
            "ALTER TABLE T ADD [a] int, Secret int",
            "Secret"
        ));
        assert!(adds_column(
            "ALTER TABLE T ADD [a(b] int, Secret int",
            "Secret"
        ));
        assert!(adds_column("ALTER TABLE T ADD [we]]ird] int", "we]ird"));
        assert!(
            adds_column("alter table t add email int", "Email"),
            "case-insensitive"
        );
        // "ADD" inside a name is not the keyword.
        assert!(!adds_column(
            "ALTER TABLE ADDRESS ALTER COLUMN Email int",
            "Email"
        ));
    }

    #[test]
    fn a_drop_is_recognised_in_its_column_clause() {
        assert!(drops_column("ALTER TABLE dbo.T DROP COLUMN [Name]", "Name"));
        assert!(drops_column("alter table t drop column name", "Name"));
        assert!(drops_column("ALTER TABLE T DROP COLUMN a, Name", "Name"));
        assert!(drops_column(
            "ALTER TABLE T DROP COLUMN IF EXISTS Name",
            "Name"
        ));
        assert!(drops_column(
            "ALTER TABLE T DROP CONSTRAINT c, COLUMN \"Name\"",
            "Name"
        ));
        assert!(drops_column(
            "ALTER TABLE T DROP COLUMN [we]]ird]",
            "we]ird"
        ));
        // A constraint, not a column; another column; no drop at all.
        assert!(!drops_column("ALTER TABLE T DROP CONSTRAINT Name", "Name"));
        assert!(!drops_column("ALTER TABLE T DROP Name", "Name"));
        assert!(!drops_column("ALTER TABLE T DROP COLUMN Names", "Name"));
        assert!(!drops_column(
            "ALTER TABLE T DROP COLUMN a, CONSTRAINT Name",
            "Name"
        ));
        assert!(!drops_column("ALTER TABLE T ADD Name int", "Name"));
        assert!(!drops_column("ALTER TABLE DROPS ADD Name int", "Name"));
        // A column named like a keyword.
        assert!(drops_column("ALTER TABLE T DROP COLUMN [Column]", "Column"));
        assert!(drops_column("ALTER TABLE T DROP COLUMN COLUMNS", "Columns"));
    }
}

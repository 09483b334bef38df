//! Topic names. A topic template's `{db}`, `{schema}` and `{tbl}` are replaced by
//! the names of the change's table, each with every character a topic name cannot
//! hold replaced by `_`: Kafka accepts only ASCII letters and digits, `.`, `_` and
//! `-` (and so do Event Hubs' names), while SQL Server names may hold spaces and
//! any letter. Debezium's records take the same rule for their whole topic name.

use std::borrow::Cow;

/// The longest topic name Kafka accepts.
pub const MAX_TOPIC_LENGTH: usize = 249;

/// The placeholders a template may hold.
const PLACEHOLDERS: [&str; 3] = ["{db}", "{schema}", "{tbl}"];

/// Whether a topic name may hold `c`.
pub fn legal_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// `name` with every character a topic name cannot hold replaced by `_`.
pub fn sanitize_topic(name: &str) -> String {
    safe_name(name).into_owned()
}

fn safe_name(name: &str) -> Cow<'_, str> {
    if name.chars().all(legal_topic_char) {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(
            name.chars()
                .map(|c| if legal_topic_char(c) { c } else { '_' })
                .collect(),
        )
    }
}

/// A topic template with `{db}`, `{schema}` and `{tbl}` replaced by the names,
/// each made safe for a topic name.
pub fn expand_names(template: &str, database: &str, schema: &str, table: &str) -> String {
    if !template.contains('{') {
        // A fixed topic (the common case): no search per event.
        return template.to_owned();
    }
    template
        .replace("{db}", &safe_name(database))
        .replace("{schema}", &safe_name(schema))
        .replace("{tbl}", &safe_name(table))
}

/// What makes `template`'s own text (outside its placeholders) no topic name, if
/// anything: a character Kafka does not allow, or a fixed name Kafka refuses.
pub fn template_problem(template: &str) -> Option<String> {
    let literal = PLACEHOLDERS
        .iter()
        .fold(template.to_owned(), |text, p| text.replace(p, ""));
    if let Some(c) = literal.chars().find(|c| !legal_topic_char(*c)) {
        return Some(format!(
            "\"{template}\" holds {c:?}, which a topic name cannot hold (only A-Z, a-z, 0-9, '.', '_' and '-'; the names put in for {{db}}, {{schema}} and {{tbl}} have other characters replaced by '_')"
        ));
    }
    if literal.len() == template.len() {
        if template.is_empty() || template == "." || template == ".." {
            return Some(format!("\"{template}\" is not a topic name Kafka accepts"));
        }
        if template.len() > MAX_TOPIC_LENGTH {
            return Some(format!(
                "is {} characters long; Kafka's topic names have at most {MAX_TOPIC_LENGTH}",
                template.len()
            ));
        }
    }
    None
}

/// Tables whose topics differ only because names were made safe, so that their
/// events would share one topic: each such topic with the raw names that meet in it.
pub fn collisions<'a>(
    template: &str,
    tables: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
) -> Vec<(String, Vec<String>)> {
    let raw = |database: &str, schema: &str, table: &str| {
        template
            .replace("{db}", database)
            .replace("{schema}", schema)
            .replace("{tbl}", table)
    };
    let mut by_topic: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for (database, schema, table) in tables {
        by_topic
            .entry(expand_names(template, database, schema, table))
            .or_default()
            .insert(raw(database, schema, table));
    }
    by_topic
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|(topic, names)| (topic, names.into_iter().collect()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_characters_kafka_refuses_are_made_safe_and_others_kept() {
        assert_eq!(
            expand_names(
                "ces.{db}.{schema}.{tbl}",
                "CesDemo",
                "sales",
                "order details"
            ),
            "ces.CesDemo.sales.order_details"
        );
        assert_eq!(
            expand_names("{db}-{tbl}", "Shop", "dbo", "Bestellungen_é+ü"),
            "Shop-Bestellungen____"
        );
        assert_eq!(
            expand_names("cdc.{schema}.{tbl}", "d", "dbo", "a-b_c.D9"),
            "cdc.dbo.a-b_c.D9"
        );
        // A fixed topic is left alone: its text was checked with the configuration.
        assert_eq!(expand_names("ces", "d", "s", "t t"), "ces");
        // A name cannot bring a placeholder in.
        assert_eq!(expand_names("{db}.{tbl}", "{tbl}", "s", "t"), "_tbl_.t");
        assert_eq!(
            sanitize_topic("srv.Shop.sales.order details"),
            "srv.Shop.sales.order_details"
        );
        assert_eq!(sanitize_topic("a-b_c.D9é"), "a-b_c.D9_");
    }

    #[test]
    fn a_template_s_own_text_must_be_a_topic_name() {
        assert_eq!(template_problem("ces.{db}.{schema}.{tbl}"), None);
        assert_eq!(template_problem("orders"), None);
        assert_eq!(template_problem("{tbl}"), None);
        let spaced = template_problem("my topic.{tbl}").expect("a space");
        assert!(spaced.contains("' '"), "{spaced}");
        assert!(template_problem("ces/{tbl}").is_some());
        assert!(template_problem("").is_some());
        assert!(template_problem("..").is_some());
        assert_eq!(template_problem(&"a".repeat(249)), None);
        let long = template_problem(&"a".repeat(250)).expect("too long");
        assert!(long.contains("250"), "{long}");
    }

    #[test]
    fn tables_that_meet_in_one_topic_once_made_safe_are_named() {
        let tables = [
            ("CesDemo", "sales", "order details"),
            ("CesDemo", "sales", "order_details"),
            ("CesDemo", "sales", "order+details"),
            ("CesDemo", "dbo", "documents"),
        ];
        assert_eq!(
            collisions("ces.{db}.{schema}.{tbl}", tables),
            vec![(
                "ces.CesDemo.sales.order_details".to_owned(),
                vec![
                    "ces.CesDemo.sales.order details".to_owned(),
                    "ces.CesDemo.sales.order+details".to_owned(),
                    "ces.CesDemo.sales.order_details".to_owned(),
                ]
            )]
        );
        // Tables that share a topic by the template's choice are no collision.
        assert!(collisions("ces.{db}", tables).is_empty());
        assert!(collisions("ces", tables).is_empty());
    }
}

//! Which tables to stream: include and exclude patterns on `schema.table`.
//!
//! A pattern is matched case-insensitively (SQL Server's default collations are) against
//! `schema.table`; `*` matches any run of characters and `?` one character. A table is
//! streamed when it matches some include pattern (or none are given) and no exclude
//! pattern, and it is not the checkpoint table.

use crate::glob::glob_match;

/// The table the table checkpoint store writes (`checkpoint.store = "table"`), in
/// the source database: never streamed, enabled or loaded, whatever the patterns,
/// since each checkpoint written would be a change whose delivery writes another.
pub const CHECKPOINT_TABLE: (&str, &str) = ("dbo", "mssql_ces_checkpoint");

/// Include and exclude patterns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableFilter {
    include: Vec<String>,
    exclude: Vec<String>,
}

impl TableFilter {
    pub fn new(include: Vec<String>, exclude: Vec<String>) -> Self {
        let lower = |v: Vec<String>| v.into_iter().map(|p| p.to_lowercase()).collect();
        TableFilter {
            include: lower(include),
            exclude: lower(exclude),
        }
    }

    /// Whether any include or exclude pattern is set.
    pub fn has_patterns(&self) -> bool {
        !self.include.is_empty() || !self.exclude.is_empty()
    }

    /// Include patterns that name one table exactly (no `*` or `?`), lower-cased.
    pub fn literal_includes(&self) -> impl Iterator<Item = &str> {
        self.include
            .iter()
            .filter(|p| !p.contains(['*', '?']))
            .map(String::as_str)
    }

    /// Whether the patterns select `schema.table` (never the checkpoint table).
    pub fn allows(&self, schema: &str, table: &str) -> bool {
        if is_checkpoint_table(schema, table) {
            return false;
        }
        let name = format!("{schema}.{table}").to_lowercase();
        let name: Vec<char> = name.chars().collect();
        let matches = |pattern: &String| {
            let pattern: Vec<char> = pattern.chars().collect();
            glob_match(&pattern, &name)
        };
        (self.include.is_empty() || self.include.iter().any(matches))
            && !self.exclude.iter().any(matches)
    }
}

/// Whether `schema.table` is [`CHECKPOINT_TABLE`] (names compared as SQL Server's
/// default collation does, without case).
pub fn is_checkpoint_table(schema: &str, table: &str) -> bool {
    schema.eq_ignore_ascii_case(CHECKPOINT_TABLE.0)
        && table.eq_ignore_ascii_case(CHECKPOINT_TABLE.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(include: &[&str], exclude: &[&str]) -> TableFilter {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        TableFilter::new(own(include), own(exclude))
    }

    #[test]
    fn empty_filter_allows_everything_but_the_checkpoint_table() {
        assert!(filter(&[], &[]).allows("dbo", "Orders"));
        for f in [
            filter(&[], &[]),
            filter(&["dbo.*"], &[]),
            filter(&["dbo.mssql_ces_checkpoint"], &[]),
        ] {
            assert!(!f.allows("dbo", "mssql_ces_checkpoint"));
            assert!(!f.allows("DBO", "MSSQL_CES_CHECKPOINT"));
        }
        assert!(filter(&[], &[]).allows("sales", "mssql_ces_checkpoint"));
    }

    #[test]
    fn include_and_exclude_patterns() {
        let f = filter(&["dbo.*", "sales.Order?"], &["dbo.tmp_*"]);
        assert!(f.allows("dbo", "Orders"));
        assert!(f.allows("DBO", "orders"));
        assert!(f.allows("sales", "Orders"));
        assert!(!f.allows("sales", "OrderLines"));
        assert!(!f.allows("dbo", "tmp_import"));
        assert!(!f.allows("hr", "People"));
        let awkward = filter(&["dbo.order details", "dbo.x]y"], &[]);
        assert!(awkward.allows("dbo", "order details"));
        assert!(awkward.allows("dbo", "x]y"));
        assert!(filter(&["*.*a*b*"], &[]).allows("s", "xaxxbx"));
        assert!(!filter(&["*.*a*b"], &[]).allows("s", "xaxxbx"));
    }
}

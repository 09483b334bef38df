//! What a login may see and what events leave out: the verdicts the poller acts on
//! (it stops or warns) and `mssql-ces check` reports, decided once here so that both
//! say the same.

use crate::event::value::TypeError;
use crate::source::filter::TableFilter;
use crate::source::{CaptureInstance, CapturedColumn, Catalog};

/// Capture instances whose source table this login cannot see (`OBJECT_NAME` is
/// NULL), judged against the table filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invisible<'a> {
    /// Every capture instance's table is visible.
    None,
    /// A table that may be one to stream is invisible: a run stops. With no
    /// `source.include`/`exclude` pattern every table is streamed, so each invisible
    /// one is; with a table named exactly in `source.include` that no visible
    /// instance matches, that table may be one of them.
    Stops(&'a [String]),
    /// The filter cannot tell whether the invisible tables are streamed: they are
    /// not, and a run says so once each.
    NotStreamed(&'a [String]),
}

/// Judges the catalog's invisible capture instances against `filter`.
pub fn invisible<'a>(catalog: &'a Catalog, filter: &TableFilter) -> Invisible<'a> {
    if catalog.invisible.is_empty() {
        return Invisible::None;
    }
    if !filter.has_patterns() {
        return Invisible::Stops(&catalog.invisible);
    }
    let named_but_unseen = filter.literal_includes().any(|name| {
        !catalog
            .instances
            .iter()
            .any(|i| i.qualified_table().eq_ignore_ascii_case(name))
    });
    if named_but_unseen {
        Invisible::Stops(&catalog.invisible)
    } else {
        Invisible::NotStreamed(&catalog.invisible)
    }
}

/// Why events leave a captured column out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftOut<'a> {
    /// A type CES does not stream.
    Unsupported(&'a TypeError),
    /// Dropped from the source table: the change table keeps it, NULL from then on
    /// (rows committed before the drop still carry it).
    Dropped,
    /// A computed column: CDC records it as NULL in every change row.
    Computed,
}

impl std::fmt::Display for LeftOut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeftOut::Unsupported(reason) => write!(f, "{reason}"),
            LeftOut::Dropped => f.write_str("dropped from the source table"),
            LeftOut::Computed => {
                f.write_str("a computed column, which CDC records as NULL in every change row")
            }
        }
    }
}

/// The captured columns of `instance` that events leave out, and why.
pub fn left_out_columns(
    instance: &CaptureInstance,
) -> impl Iterator<Item = (&CapturedColumn, LeftOut<'_>)> {
    instance
        .columns
        .iter()
        .filter_map(|column| match (&column.sql_type, column.table_index) {
            _ if column.computed => Some((column, LeftOut::Computed)),
            (Err(reason), _) => Some((column, LeftOut::Unsupported(reason))),
            (Ok(_), None) => Some((column, LeftOut::Dropped)),
            (Ok(_), Some(_)) => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::value::SqlType;

    fn instance(schema: &str, table: &str, columns: Vec<CapturedColumn>) -> CaptureInstance {
        CaptureInstance {
            name: format!("{schema}_{table}"),
            schema: schema.into(),
            table: table.into(),
            object_id: 1,
            start_lsn: None,
            create_date: chrono::NaiveDateTime::default(),
            columns,
            has_command_id: true,
            options: Default::default(),
            key_columns: Vec::new(),
            descending_keys: Vec::new(),
        }
    }

    fn catalog(visible: &[&str], invisible: &[&str]) -> Catalog {
        Catalog {
            server: "s".into(),
            database: "d".into(),
            database_guid: None,
            local_database_guid: None,
            server_utc_offset_minutes: 0,
            server_time_zone: None,
            version: 0,
            invisible: invisible.iter().map(|s| s.to_string()).collect(),
            instances: visible
                .iter()
                .map(|t| {
                    let (schema, name) = t.split_once('.').unwrap();
                    instance(schema, name, Vec::new())
                })
                .collect(),
        }
    }

    fn filter(include: &[&str]) -> TableFilter {
        TableFilter::new(include.iter().map(|s| s.to_string()).collect(), Vec::new())
    }

    #[test]
    fn an_invisible_table_stops_a_run_unless_the_filter_leaves_it_out() {
        let none = catalog(&["dbo.a"], &[]);
        assert_eq!(invisible(&none, &filter(&[])), Invisible::None);
        let some = catalog(&["dbo.a"], &["dbo_hidden"]);
        let hidden = ["dbo_hidden".to_owned()];
        // Every table is streamed: so is the invisible one.
        assert_eq!(invisible(&some, &filter(&[])), Invisible::Stops(&hidden));
        // Named exactly, but not among the visible: it may be the invisible one.
        assert_eq!(
            invisible(&some, &filter(&["dbo.b"])),
            Invisible::Stops(&hidden)
        );
        // Named exactly and seen, or a pattern: the filter cannot tell.
        assert_eq!(
            invisible(&some, &filter(&["dbo.a"])),
            Invisible::NotStreamed(&hidden)
        );
        assert_eq!(
            invisible(&some, &filter(&["dbo.*"])),
            Invisible::NotStreamed(&hidden)
        );
    }

    #[test]
    fn columns_are_left_out_for_their_type_or_because_they_were_dropped() {
        let column = |name: &str, sql_type, table_index| CapturedColumn {
            name: name.into(),
            ordinal: 1,
            table_index,
            dropped: None,
            sql_type,
            computed: false,
            nullable: Some(true),
            default: None,
        };
        let instance = instance(
            "dbo",
            "t",
            vec![
                column("kept", Ok(SqlType::Int), Some(0)),
                column("gone", Ok(SqlType::Int), None),
                column(
                    "shape",
                    Err(TypeError::Excluded {
                        type_name: "geography".into(),
                    }),
                    Some(1),
                ),
                CapturedColumn {
                    computed: true,
                    ..column("total", Ok(SqlType::Int), Some(2))
                },
            ],
        );
        let left: Vec<(&str, String)> = left_out_columns(&instance)
            .map(|(c, why)| (c.name.as_str(), why.to_string()))
            .collect();
        assert_eq!(
            left,
            [
                ("gone", "dropped from the source table".to_owned()),
                (
                    "shape",
                    "type `geography` is not streamed by CES".to_owned()
                ),
                (
                    "total",
                    "a computed column, which CDC records as NULL in every change row".to_owned()
                )
            ]
        );
        let emitted: Vec<&str> = instance
            .emitted_columns()
            .map(|e| e.column.name.as_str())
            .collect();
        assert_eq!(emitted, ["kept"]);
    }
}

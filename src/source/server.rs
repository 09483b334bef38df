//! One server, many databases: which CDC-enabled databases there are, and each one's
//! max LSN and catalog fingerprint in a few round trips for all of them, so that an
//! idle database costs a share of one query per poll rather than a query of its own.
//!
//! Debezium reads several databases of one server (`database.names`) with three-part
//! names (`SELECT [db].sys.fn_cdc_get_max_lsn()`, `SqlServerConnection`), one query
//! per database per iteration; [`probe_sql`] puts up to [`PROBE_CHUNK`] such selects
//! in one `UNION ALL`.

use std::future::Future;

use crate::mssql::{SqlConnection, SqlError, SqlErrorKind};
use crate::source::catalog::{self, NamedRow, catalog_error};
use crate::source::{MaxLsn, SourceError};

/// The databases the login can stream: CDC enabled, online, and open to it.
/// <https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-databases-transact-sql>
/// (`is_cdc_enabled`, `state` 0 = ONLINE) and `HAS_DBACCESS`
/// (<https://learn.microsoft.com/sql/t-sql/functions/has-dbaccess-transact-sql>).
pub const CDC_DATABASES: &str = "SELECT name FROM sys.databases \
WHERE is_cdc_enabled = 1 AND state = 0 AND HAS_DBACCESS(name) = 1 ORDER BY name;";

/// The databases whose replica on this server no session can read: a secondary of
/// an availability group that allows no connections
/// (`secondary_role_allow_connections` 0), or a replica resolving its role (`role`
/// 0). A secondary that allows read-intent sessions only (1) is left to the probe:
/// whether this session may read it depends on its `ApplicationIntent`. The
/// availability-group views need `VIEW SERVER STATE`; without it the query fails
/// and discovery lists every database, the probe then finding those it cannot read.
/// <https://learn.microsoft.com/sql/relational-databases/system-dynamic-management-views/sys-dm-hadr-availability-replica-states-transact-sql>
/// <https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-availability-replicas-transact-sql>
pub const UNREADABLE_REPLICAS: &str = "SELECT d.name FROM sys.databases AS d \
JOIN sys.dm_hadr_availability_replica_states AS rs ON rs.replica_id = d.replica_id \
JOIN sys.availability_replicas AS ar ON ar.replica_id = d.replica_id \
WHERE d.is_cdc_enabled = 1 AND rs.is_local = 1 \
AND (rs.role = 0 OR (rs.role = 2 AND ar.secondary_role_allow_connections = 0)) \
ORDER BY d.name;";

/// The server's engine edition: 5 is Azure SQL Database, which has no
/// cross-database queries (a three-part name fails with error 40515), so the probe
/// of many databases cannot run there.
/// <https://learn.microsoft.com/sql/t-sql/functions/serverproperty-transact-sql>
pub const ENGINE_EDITION: &str =
    "SELECT CAST(SERVERPROPERTY('EngineEdition') AS int) AS engine_edition;";

/// One database's part of the probe: the catalog fingerprint of `MAX_LSN`, with
/// `{db}` the bracketed database name and `@P{n}` its name as text.
pub const PROBE_DATABASE: &str = "SELECT @P{n} AS database_name, \
{db}.sys.fn_cdc_get_max_lsn() AS max_lsn, \
(SELECT CHECKSUM_AGG(CHECKSUM(ct.capture_instance, ct.object_id, ct.start_lsn)) \
FROM {db}.cdc.change_tables AS ct) AS tables_checksum, \
(SELECT COUNT_BIG(*) FROM {db}.cdc.change_tables) AS tables_count, \
(SELECT COUNT_BIG(*) FROM {db}.cdc.ddl_history) AS ddl_count";

/// Databases per probe query: a query of this many three-part selects stays small
/// (about 25 KB of text) and its failure, one database offline, is narrowed down
/// database by database only then.
pub const PROBE_CHUNK: usize = 100;

/// A database name as a bracketed identifier (`]` doubled).
pub fn bracketed(name: &str) -> String {
    format!("[{}]", name.replace(']', "]]"))
}

/// The probe of `databases`, their names bound as `@P1…` in order.
pub fn probe_sql(databases: &[String]) -> String {
    let parts: Vec<String> = databases
        .iter()
        .enumerate()
        .map(|(i, name)| {
            PROBE_DATABASE
                .replace("{n}", &(i + 1).to_string())
                .replace("{db}", &bracketed(name))
        })
        .collect();
    parts.join(" UNION ALL ") + ";"
}

/// The errors of a database that this server's replica cannot read: 976 (an
/// availability group secondary that allows no connections), 978 (one that allows
/// only read-intent sessions) and 983 (a replica resolving its role). They are
/// transient for one database's own connection, which a failover may route
/// elsewhere, but in a probe they are the named database's alone.
pub const NOT_READABLE_HERE: &[u32] = &[976, 978, 983];

/// A probe query's failure as the probe takes it: a database this replica cannot
/// read fails its chunk as one database does, to be found and answered alone, not
/// as a connection fault that fails every database's probe.
pub fn probe_error(error: crate::mssql::SqlError) -> SourceError {
    match error.code {
        Some(code) if NOT_READABLE_HERE.contains(&code) => SourceError::NotReadableHere {
            message: error.error.to_string(),
        },
        _ => error.into(),
    }
}

/// What one database answered to the probe.
#[derive(Debug)]
pub struct DatabaseProbe {
    pub database: String,
    /// Its max LSN and catalog fingerprint, or why it could not be read.
    pub state: Result<MaxLsn, SourceError>,
}

/// A server of many CDC-enabled databases.
pub trait DatabaseServer: Send {
    /// `SERVERPROPERTY('EngineEdition')`.
    fn engine_edition(&mut self) -> impl Future<Output = Result<i64, SourceError>> + Send;

    /// The databases that can be streamed now, by name.
    fn cdc_databases(&mut self) -> impl Future<Output = Result<Vec<String>, SourceError>> + Send;

    /// The CDC-enabled databases this replica cannot read ([`UNREADABLE_REPLICAS`]),
    /// so that the probe does not ask them; `None` when the login may not tell.
    fn unreadable_replicas(
        &mut self,
    ) -> impl Future<Output = Result<Option<Vec<String>>, SourceError>> + Send {
        std::future::ready(Ok(None))
    }

    /// One probe query: the max LSN and catalog fingerprint of each of `chunk`, or
    /// the error of the whole query.
    fn probe_chunk(
        &mut self,
        chunk: &[String],
    ) -> impl Future<Output = Result<Vec<DatabaseProbe>, SourceError>> + Send;

    /// Every database's max LSN and catalog fingerprint, [`PROBE_CHUNK`] to a query.
    /// One database that cannot be read (offline, closed to the login) fails its
    /// chunk's query; that chunk is then asked database by database, and the one
    /// is answered as such while the others are still answered. A transient fault
    /// (the connection) fails the probe.
    fn probe(
        &mut self,
        databases: &[String],
    ) -> impl Future<Output = Result<Vec<DatabaseProbe>, SourceError>> + Send
    where
        Self: Sized,
    {
        async move {
            let mut answers = Vec::with_capacity(databases.len());
            for chunk in databases.chunks(PROBE_CHUNK) {
                match self.probe_chunk(chunk).await {
                    Ok(found) => answers.extend(found),
                    Err(e) if e.is_transient() => return Err(e),
                    Err(e) if chunk.len() == 1 => answers.push(DatabaseProbe {
                        database: chunk[0].clone(),
                        state: Err(e),
                    }),
                    Err(_) => {
                        for name in chunk {
                            match self.probe_chunk(std::slice::from_ref(name)).await {
                                Ok(found) => answers.extend(found),
                                Err(e) if e.is_transient() => return Err(e),
                                Err(e) => answers.push(DatabaseProbe {
                                    database: name.clone(),
                                    state: Err(e),
                                }),
                            }
                        }
                    }
                }
            }
            Ok(answers)
        }
    }
}

/// SQL Server: one connection, three-part names.
pub struct SqlServerDatabases {
    conn: SqlConnection,
}

impl SqlServerDatabases {
    pub fn new(conn: SqlConnection) -> Self {
        SqlServerDatabases { conn }
    }
}

impl DatabaseServer for SqlServerDatabases {
    async fn engine_edition(&mut self) -> Result<i64, SourceError> {
        let rows = self.conn.query(ENGINE_EDITION, &[]).await?;
        let row = rows.into_iter().next().ok_or_else(|| {
            SourceError::definite("SERVERPROPERTY('EngineEdition') returned no row")
        })?;
        NamedRow::new(row)
            .int("engine_edition")
            .map_err(catalog_error)
    }

    async fn cdc_databases(&mut self) -> Result<Vec<String>, SourceError> {
        let rows = self.conn.query(CDC_DATABASES, &[]).await?;
        rows.into_iter()
            .map(|row| NamedRow::new(row).string("name").map_err(catalog_error))
            .collect()
    }

    async fn unreadable_replicas(&mut self) -> Result<Option<Vec<String>>, SourceError> {
        let rows = match self.conn.query(UNREADABLE_REPLICAS, &[]).await {
            Ok(rows) => rows,
            // Without VIEW SERVER STATE: the probe finds them instead.
            Err(SqlError {
                error: SqlErrorKind::PermissionDenied { .. },
                ..
            }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        rows.into_iter()
            .map(|row| NamedRow::new(row).string("name").map_err(catalog_error))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    async fn probe_chunk(&mut self, chunk: &[String]) -> Result<Vec<DatabaseProbe>, SourceError> {
        let sql = probe_sql(chunk);
        let params: Vec<&dyn tiberius::ToSql> =
            chunk.iter().map(|n| n as &dyn tiberius::ToSql).collect();
        let rows = self.conn.query(&sql, &params).await.map_err(probe_error)?;
        rows.into_iter()
            .map(|row| {
                let mut row = NamedRow::new(row);
                let database = row.string("database_name").map_err(catalog_error)?;
                let lsn = row.opt_lsn("max_lsn").map_err(catalog_error)?;
                let catalog_version = catalog::fingerprint(&mut row).map_err(catalog_error)?;
                Ok(DatabaseProbe {
                    database,
                    state: Ok(MaxLsn {
                        lsn: lsn.filter(|l| !l.is_zero()),
                        catalog_version,
                    }),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server where `bad` cannot be read (a definite error, which fails any query
    /// naming it) and `flaky` drops the connection (transient), `lone` too when it
    /// is asked alone; counts queries.
    struct Fake {
        queries: usize,
    }

    impl DatabaseServer for Fake {
        async fn engine_edition(&mut self) -> Result<i64, SourceError> {
            Ok(3)
        }

        async fn cdc_databases(&mut self) -> Result<Vec<String>, SourceError> {
            Ok(Vec::new())
        }

        async fn probe_chunk(
            &mut self,
            chunk: &[String],
        ) -> Result<Vec<DatabaseProbe>, SourceError> {
            self.queries += 1;
            // `lone` drops the connection only when asked alone.
            if chunk.iter().any(|n| n == "flaky") || chunk == ["lone"] {
                return Err(SourceError::transient("connection reset"));
            }
            if chunk.iter().any(|n| n == "bad") {
                return Err(SourceError::definite("error 942: offline"));
            }
            Ok(chunk
                .iter()
                .map(|n| DatabaseProbe {
                    database: n.clone(),
                    state: Ok(MaxLsn {
                        lsn: None,
                        catalog_version: 0,
                    }),
                })
                .collect())
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| (*n).to_owned()).collect()
    }

    #[tokio::test]
    async fn one_unreadable_database_is_found_alone_and_the_others_are_answered() {
        let mut server = Fake { queries: 0 };
        let answers = server
            .probe(&names(&["a", "bad", "c"]))
            .await
            .expect("probe");
        assert_eq!(server.queries, 1 + 3, "the chunk, then each alone");
        let states: Vec<(&str, bool)> = answers
            .iter()
            .map(|a| (a.database.as_str(), a.state.is_ok()))
            .collect();
        assert_eq!(states, vec![("a", true), ("bad", false), ("c", true)]);
        assert!(
            answers[1]
                .state
                .as_ref()
                .is_err_and(|e| e.to_string().contains("942"))
        );
        // Alone in its chunk: answered as unreadable at once.
        let mut server = Fake { queries: 0 };
        let answers = server.probe(&names(&["bad"])).await.expect("probe");
        assert_eq!(server.queries, 1);
        assert!(answers[0].state.is_err());
        // A chunk of PROBE_CHUNK + 1: two queries when all can be read.
        let many: Vec<String> = (0..=PROBE_CHUNK).map(|i| format!("t{i}")).collect();
        let mut server = Fake { queries: 0 };
        assert_eq!(server.probe(&many).await.expect("probe").len(), many.len());
        assert_eq!(server.queries, 2);
    }

    #[tokio::test]
    async fn a_connection_fault_fails_the_probe_to_be_tried_again() {
        for list in [
            vec!["flaky"],
            vec!["a", "flaky"],
            vec!["bad", "x", "flaky"],
            vec!["bad", "lone"],
        ] {
            let mut server = Fake { queries: 0 };
            let result = server.probe(&names(&list)).await;
            assert!(
                result.as_ref().is_err_and(SourceError::is_transient),
                "{list:?}: {result:?}"
            );
        }
    }

    /// An availability group secondary's refusal is the database's own, not a
    /// connection fault: the probe narrows it down instead of failing every database.
    #[test]
    fn a_replica_that_cannot_read_a_database_is_that_database_s_failure() {
        for code in NOT_READABLE_HERE {
            let e = probe_error(crate::mssql::server_error(*code, "not accessible"));
            assert!(
                matches!(e, SourceError::NotReadableHere { .. }) && !e.is_transient(),
                "{code}: {e:?}"
            );
            assert!(e.to_string().contains("this replica cannot read it"), "{e}");
        }
        assert!(probe_error(crate::mssql::server_error(1205, "deadlock")).is_transient());
        assert!(matches!(
            probe_error(crate::mssql::server_error(942, "offline")),
            SourceError::Sql(SqlErrorKind::Definite { .. })
        ));
    }

    #[test]
    fn names_are_bracketed_with_closing_brackets_doubled() {
        assert_eq!(bracketed("Tenant 1"), "[Tenant 1]");
        assert_eq!(bracketed("a]b"), "[a]]b]");
    }

    #[test]
    fn the_probe_selects_each_database_by_its_three_part_name_and_binds_its_name() {
        let sql = probe_sql(&["a".into(), "b]c".into()]);
        assert_eq!(sql.matches(" UNION ALL ").count(), 1);
        assert!(sql.contains("SELECT @P1 AS database_name, [a].sys.fn_cdc_get_max_lsn()"));
        assert!(sql.contains("SELECT @P2 AS database_name, [b]]c].sys.fn_cdc_get_max_lsn()"));
        assert!(sql.contains("FROM [b]]c].cdc.ddl_history"));
        assert!(sql.ends_with(';'));
    }

    #[test]
    fn the_probe_and_discovery_parse_as_t_sql() {
        use sqlparser::dialect::MsSqlDialect;
        use sqlparser::parser::Parser;
        let names: Vec<String> = (0..PROBE_CHUNK).map(|i| format!("Tenant{i}")).collect();
        for sql in [
            CDC_DATABASES.to_owned(),
            UNREADABLE_REPLICAS.to_owned(),
            ENGINE_EDITION.to_owned(),
            probe_sql(&names),
        ] {
            Parser::parse_sql(&MsSqlDialect {}, &sql)
                .unwrap_or_else(|e| panic!("{e}: {}", &sql[..sql.len().min(200)]));
        }
    }
}

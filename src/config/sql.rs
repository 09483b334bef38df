//! How the configuration reaches SQL Server: the source's connection, and the table
//! checkpoint store's.

use super::*;
use crate::mssql::ConnectionString;

impl Config {
    /// How to reach SQL Server: the secret read now (kept out of every log), and
    /// refused as a configuration error when the driver could not use it (a
    /// connection string that does not parse, an empty server), before anything is
    /// contacted.
    pub fn sql_server(&self) -> Result<SqlServerConfig, ConfigError> {
        let secret = self
            .source
            .connection_string
            .resolve("source.connection_string")?;
        let connection_string = ConnectionString::new(secret);
        let settings = SqlServerConfig {
            connection_string: match &self.source.database {
                Some(database) => connection_string.with_database(database),
                None => connection_string,
            },
            trust_server_certificate: self.source.trust_server_certificate,
            encrypt: self.source.encrypt,
            connect_timeout: self.source.connect_timeout,
            query_timeout: self.source.query_timeout,
        };
        // The reason names the setting (and never quotes the string).
        crate::mssql::validate(&settings).map_err(ConfigError::Parse)?;
        Ok(settings)
    }

    /// Where the table checkpoint store connects: `checkpoint.connection_string`
    /// when set; else the source's connection string without a read-only intent —
    /// a source reading a readable secondary through the listener
    /// (`ApplicationIntent=ReadOnly`) keeps its checkpoints on the primary, where the
    /// database can be written.
    pub fn checkpoint_sql_server(&self) -> Result<SqlServerConfig, ConfigError> {
        let own = &self.checkpoint.connection_string;
        let connection_string = if own.env.is_some() || own.file.is_some() {
            ConnectionString::new(own.resolve("checkpoint.connection_string")?)
        } else {
            let source = self.sql_server()?.connection_string;
            if source.read_only_intent() {
                tracing::info!(
                    "the table checkpoint store connects without the source's ApplicationIntent=ReadOnly, through the listener to the primary (checkpoint.connection_string sets another)"
                );
            }
            source.read_write()
        };
        let settings = SqlServerConfig {
            connection_string,
            trust_server_certificate: self.source.trust_server_certificate,
            encrypt: self.source.encrypt,
            connect_timeout: self.source.connect_timeout,
            query_timeout: self.source.query_timeout,
        };
        crate::mssql::validate(&settings)
            .map_err(|reason| invalid("checkpoint.connection_string", reason))?;
        Ok(settings)
    }
}

-- A login with only what the poller needs. The password comes from the sqlcmd
-- variable CES_PASSWORD (docker-compose passes MSSQL_CES_PASSWORD).
--
-- What the poller reads and why:
--   cdc schema (SELECT): cdc.change_tables, cdc.captured_columns, cdc.index_columns,
--     cdc.ddl_history, cdc.lsn_time_mapping and the cdc.<instance>_CT change tables.
--   source tables (SELECT): sys.fn_cdc_get_min_lsn returns 0x00… to a caller that
--     cannot SELECT every captured column, and catalog views show only what the
--     caller may see.
--   the database GUID: sys.database_recovery_status needs VIEW ANY DATABASE, which
--     the public role has unless revoked (Azure SQL Database: VIEW DATABASE STATE).
--   the checkpoint table (SELECT, INSERT, UPDATE) when checkpoint.store = "table".
-- The poller never writes to source tables or to the cdc schema.
IF SUSER_ID(N'mssql_ces') IS NULL
    CREATE LOGIN mssql_ces WITH PASSWORD = N'$(CES_PASSWORD)', CHECK_POLICY = OFF;
GO
USE CesDemo;
GO
IF USER_ID(N'mssql_ces') IS NULL
    CREATE USER mssql_ces FOR LOGIN mssql_ces;
GO
GRANT SELECT ON SCHEMA::cdc TO mssql_ces;
GRANT SELECT ON SCHEMA::dbo TO mssql_ces;
GRANT SELECT ON SCHEMA::sales TO mssql_ces;
GRANT VIEW DATABASE STATE TO mssql_ces;
GO

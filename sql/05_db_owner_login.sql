-- A login for source.capture_instances = "managed" (and source.enable_cdc): those
-- run sys.sp_cdc_enable_table and sys.sp_cdc_disable_table, which require
-- membership in db_owner. The password comes from the sqlcmd variable CES_PASSWORD
-- (docker-compose passes MSSQL_CES_PASSWORD). Use the least-privilege login of
-- 03_least_privilege_login.sql for the default, manual mode.
IF SUSER_ID(N'mssql_ces_owner') IS NULL
    CREATE LOGIN mssql_ces_owner WITH PASSWORD = N'$(CES_PASSWORD)', CHECK_POLICY = OFF;
GO
USE CesDemo;
GO
IF USER_ID(N'mssql_ces_owner') IS NULL
    CREATE USER mssql_ces_owner FOR LOGIN mssql_ces_owner;
GO
ALTER ROLE db_owner ADD MEMBER mssql_ces_owner;
GO

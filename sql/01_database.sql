-- Creates the sample database and enables CDC on it (needs sysadmin).
-- Idempotent: safe to apply again.
IF DB_ID(N'CesDemo') IS NULL
    CREATE DATABASE CesDemo;
GO
USE CesDemo;
GO
IF NOT EXISTS (SELECT 1 FROM sys.databases WHERE name = N'CesDemo' AND is_cdc_enabled = 1)
    EXEC sys.sp_cdc_enable_db;
GO
IF SCHEMA_ID(N'sales') IS NULL
    EXEC (N'CREATE SCHEMA sales');
GO

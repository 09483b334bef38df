-- The checkpoint table for checkpoint.store = "table": one row per stream name, so
-- several pollers can share a database. `position` is the JSON position document.
USE CesDemo;
GO
IF OBJECT_ID(N'dbo.mssql_ces_checkpoint') IS NULL
CREATE TABLE dbo.mssql_ces_checkpoint (
    stream_name nvarchar(200) NOT NULL PRIMARY KEY,
    position    nvarchar(max) NOT NULL,
    updated_at  datetime2(3)  NOT NULL
);
GO
GRANT SELECT, INSERT, UPDATE ON dbo.mssql_ces_checkpoint TO mssql_ces;
GO

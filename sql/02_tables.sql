-- Sample tables covering every type CES streams, plus the awkward cases: a table
-- without a primary key, (max) columns, names that need quoting, and columns of
-- types CES leaves out. Each is enabled for CDC with every column captured.
USE CesDemo;
GO
IF OBJECT_ID(N'dbo.all_types') IS NULL
CREATE TABLE dbo.all_types (
    id               int              NOT NULL PRIMARY KEY,
    c_bit            bit              NULL,
    c_tinyint        tinyint          NULL,
    c_smallint       smallint         NULL,
    c_bigint         bigint           NULL,
    c_decimal        decimal(18, 2)   NULL,
    c_numeric38      numeric(38, 10)  NULL,
    c_money          money            NULL,
    c_smallmoney     smallmoney       NULL,
    c_float          float            NULL,
    c_real           real             NULL,
    c_date           date             NULL,
    c_time0          time(0)          NULL,
    c_time7          time(7)          NULL,
    c_datetime       datetime         NULL,
    c_smalldatetime  smalldatetime    NULL,
    c_datetime2_3    datetime2(3)     NULL,
    c_datetime2_7    datetime2(7)     NULL,
    c_dto            datetimeoffset(7) NULL,
    c_guid           uniqueidentifier NULL,
    c_char           char(10)         NULL,
    c_varchar        varchar(50)      NULL,
    c_nchar          nchar(5)         NULL,
    c_nvarchar       nvarchar(50)     NULL,
    c_binary         binary(4)        NULL,
    c_varbinary      varbinary(16)    NULL,
    c_geography      geography        NULL,  -- left out by CES
    c_xml            xml              NULL   -- left out by CES
);
GO
IF OBJECT_ID(N'dbo.documents') IS NULL
CREATE TABLE dbo.documents (
    id      int            NOT NULL PRIMARY KEY,
    title   nvarchar(50)   NULL,
    body    nvarchar(max)  NULL,
    notes   varchar(max)   NULL,
    blob    varbinary(max) NULL
);
GO
IF OBJECT_ID(N'dbo.no_key') IS NULL
CREATE TABLE dbo.no_key (
    happened_at datetime2(3) NOT NULL,
    message     nvarchar(200) NULL
);
GO
IF OBJECT_ID(N'sales.[order details]') IS NULL
CREATE TABLE sales.[order details] (
    order_id   bigint        NOT NULL,
    line       int           NOT NULL,
    sku        char(10)      NOT NULL,
    [unit price] money       NOT NULL,
    CONSTRAINT [pk order details] PRIMARY KEY (order_id, line)
);
GO
IF OBJECT_ID(N'dbo.[x]]y]') IS NULL
CREATE TABLE dbo.[x]]y] (
    id       int          NOT NULL PRIMARY KEY,
    [a]]b]   nvarchar(10) NULL
);
GO
-- Enable CDC on each table once. @role_name = NULL: no gating role; access is
-- governed by SELECT permissions (see 03_least_privilege_login.sql).
DECLARE @tables TABLE (schema_name sysname, table_name sysname, capture_instance sysname NULL);
INSERT INTO @tables VALUES
    (N'dbo', N'all_types', NULL),
    (N'dbo', N'documents', NULL),
    (N'dbo', N'no_key', NULL),
    (N'sales', N'order details', NULL),
    -- SQL Server builds the default instance name from the table name; give this
    -- one a plain name and let the table name carry the bracket.
    (N'dbo', N'x]y', N'dbo_x_y');
DECLARE @schema sysname, @table sysname, @instance sysname;
DECLARE c CURSOR LOCAL FAST_FORWARD FOR SELECT schema_name, table_name, capture_instance FROM @tables;
OPEN c;
FETCH NEXT FROM c INTO @schema, @table, @instance;
WHILE @@FETCH_STATUS = 0
BEGIN
    IF NOT EXISTS (SELECT 1 FROM sys.tables AS t
                   WHERE t.object_id = OBJECT_ID(QUOTENAME(@schema) + N'.' + QUOTENAME(@table))
                     AND t.is_tracked_by_cdc = 1)
        EXEC sys.sp_cdc_enable_table
            @source_schema = @schema,
            @source_name = @table,
            @capture_instance = @instance,
            @role_name = NULL,
            @supports_net_changes = 0;
    FETCH NEXT FROM c INTO @schema, @table, @instance;
END
CLOSE c;
DEALLOCATE c;
GO

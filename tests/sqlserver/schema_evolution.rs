//! Schema evolution against a real SQL Server (the docker test bed; run as the
//! module `sqlserver_integration` says): schema-change events between the shapes in
//! `manual` mode as the least-privilege login, and `managed` mode as the `db_owner`
//! login of `sql/05_db_owner_login.sql` (`mssql_ces_owner`, the compose file's
//! poller password; or `MSSQL_CES_TEST_OWNER_URL`).

use std::time::{Duration, Instant};

use mssql_ces::event::Change;
use mssql_ces::event::schema_change::{SchemaChange, SchemaChangeReason};
use mssql_ces::position::Position;
use mssql_ces::source::filter::TableFilter;
use mssql_ces::source::poller::{
    CaptureInstanceMode, PollOutcome, Poller, PollerConfig, StartPosition,
};
use mssql_ces::source::sqlserver::{ConnectionString, SqlServerConfig, SqlServerSource};

use crate::sqlserver_integration::{
    admin, cdc_table, drop_table, exec, poller_url, poller_with, suffix,
};

/// The `db_owner` login's connection string.
fn owner_url(admin_url: &str) -> String {
    if let Ok(url) = std::env::var("MSSQL_CES_TEST_OWNER_URL") {
        return url;
    }
    poller_url(admin_url).replace("User Id=mssql_ces;", "User Id=mssql_ces_owner;")
}

fn owner_poller(admin_url: &str, table: &str) -> Poller<SqlServerSource> {
    owner_poller_of(admin_url, vec![format!("dbo.{table}")])
}

/// A managed-mode poller as the `db_owner` login, of the tables `include` names.
pub(crate) fn owner_poller_of(admin_url: &str, include: Vec<String>) -> Poller<SqlServerSource> {
    let source = SqlServerSource::new(SqlServerConfig {
        connection_string: ConnectionString::new(owner_url(admin_url)),
        trust_server_certificate: false,
        encrypt: true,
        connect_timeout: Duration::from_secs(5),
        query_timeout: Duration::from_secs(30),
    });
    Poller::new(
        source,
        PollerConfig {
            filter: TableFilter::new(include, vec![]),
            start_position: StartPosition::Latest,
            catalog_refresh: Duration::ZERO,
            schema_changes: true,
            capture_instances: CaptureInstanceMode::Managed,
            ..PollerConfig::default()
        },
        None,
    )
}

enum Item {
    Schema(SchemaChange),
    Change(Change),
}

/// Polls until `changes` row changes arrived (or a minute passed); schema changes
/// on the way too.
async fn collect(poller: &mut Poller<SqlServerSource>, changes: usize) -> Vec<Item> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut items = Vec::new();
    let count = |items: &[Item]| {
        items
            .iter()
            .filter(|i| matches!(i, Item::Change(_)))
            .count()
    };
    while count(&items) < changes && Instant::now() < deadline {
        match poller.poll().await.expect("poll") {
            PollOutcome::Batch(batch) => {
                let mut schema = batch.schema_changes.into_iter().peekable();
                for (at, change) in batch.changes.into_iter().enumerate() {
                    while let Some(placed) = schema.next_if(|p| p.before <= at) {
                        items.push(Item::Schema(placed.event));
                    }
                    items.push(Item::Change(change));
                }
            }
            PollOutcome::Idle => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    assert_eq!(count(&items), changes, "changes captured within a minute");
    items
}

/// Polls (every half second) until `done` holds or `seconds` passed.
async fn polled_until(
    p: &mut Poller<SqlServerSource>,
    seconds: u64,
    done: impl Fn(&Poller<SqlServerSource>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while !done(p) && Instant::now() < deadline {
        p.poll().await.expect("poll");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The `email` column's value in a change's after image.
fn email_of(change: &Change) -> Option<String> {
    let at = change
        .table
        .columns()
        .iter()
        .position(|c| c.name == "email")?;
    change.current.as_ref()?.get(at)?.to_text()
}

fn schema_events(items: &[Item]) -> Vec<&SchemaChange> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Schema(s) => Some(s),
            Item::Change(_) => None,
        })
        .collect()
}

/// The documented way to capture a new column, done by hand: a second capture
/// instance; the stream switches to it without duplicates, the table's version goes
/// from 1 to 2, and a schema-change event before the first row of the new shape says
/// so, with the `ALTER TABLE` from `cdc.ddl_history`.
#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn a_schema_change_moves_to_the_second_capture_instance_and_is_announced() {
    let (mut db, url) = admin().await;
    let table = format!("it_ddl_{}", suffix());
    let v1 = format!("{table}_v1");
    cdc_table(
        &mut db,
        &table,
        "id int NOT NULL PRIMARY KEY, v int NULL",
        Some(&v1),
    )
    .await;
    let mut p = poller_with(&url, &[&table], None, |c| c.schema_changes = true);
    p.poll().await.expect("first poll");
    exec(&mut db, &format!("INSERT INTO dbo.[{table}] VALUES (1, 1)")).await;
    let items = collect(&mut p, 1).await;
    let first = schema_events(&items);
    assert_eq!(first.len(), 1);
    assert_eq!(
        (first[0].version, first[0].reason),
        (1, SchemaChangeReason::Initial)
    );
    assert_eq!(first[0].after.cols[0].nullable, Some(false));
    assert_eq!(first[0].after.cols[0].key_position, Some(1));
    assert_eq!(first[0].after.cols[1].nullable, Some(true));
    exec(
        &mut db,
        &format!("ALTER TABLE dbo.[{table}] ADD email varchar(100) NULL"),
    )
    .await;
    let v2 = format!("{table}_v2");
    exec(
        &mut db,
        &format!(
            "EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'{table}', \
             @capture_instance = N'{v2}', @role_name = NULL, @supports_net_changes = 0"
        ),
    )
    .await;
    exec(
        &mut db,
        &format!("UPDATE dbo.[{table}] SET email = 'a@x' WHERE id = 1"),
    )
    .await;
    let items = collect(&mut p, 1).await;
    let changed = schema_events(&items);
    assert_eq!(changed.len(), 1);
    let (Item::Schema(_), Item::Change(update)) = (&items[0], &items[1]) else {
        panic!("the schema change comes before the row");
    };
    assert_eq!(changed[0].version, 2);
    assert_eq!(changed[0].after.capture_instance, v2);
    assert_eq!(
        changed[0]
            .before
            .as_ref()
            .map(|b| b.capture_instance.clone()),
        Some(v1)
    );
    assert!(
        changed[0]
            .ddl
            .iter()
            .any(|d| d.command.to_lowercase().contains("add email")),
        "the ALTER TABLE from cdc.ddl_history: {:?}",
        changed[0].ddl
    );
    let columns: Vec<&str> = update
        .table
        .columns()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        ["id", "v", "email"],
        "the event carries the new column list"
    );
    assert_eq!(email_of(update).as_deref(), Some("a@x"));
    assert!(p.position().instances.contains_key(&v2));
    assert_eq!(
        p.position().table_versions[&format!("dbo.{table}")].version,
        2
    );
    // Nothing more: the old instance's copy of the update is not delivered twice.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut more = 0;
    while let PollOutcome::Batch(b) = p.poll().await.expect("poll") {
        more += b.changes.len();
    }
    assert_eq!(more, 0, "extra events");
    drop_table(&mut db, &table).await;
}

#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn managed_mode_as_db_owner_follows_an_added_column_and_retires_the_old_instance() {
    let (mut db, url) = admin().await;
    let table = format!("it_managed_{}", suffix());
    cdc_table(
        &mut db,
        &table,
        "id int NOT NULL PRIMARY KEY, v int NULL",
        None,
    )
    .await;
    let mut p = owner_poller(&url, &table);
    let (written, checkpoints) = tokio::sync::watch::channel(None::<Position>);
    p.watch_checkpoints(checkpoints);
    p.poll().await.expect("first poll");
    exec(&mut db, &format!("INSERT INTO dbo.[{table}] VALUES (1, 1)")).await;
    collect(&mut p, 1).await;
    exec(
        &mut db,
        &format!("ALTER TABLE dbo.[{table}] ADD email varchar(100) NULL"),
    )
    .await;
    // The capture job records the ADD in cdc.ddl_history within its 5-second scan;
    // the next catalog read creates the new instance, whose start_lsn the job sets.
    polled_until(&mut p, 60, |p| p.capture_actions().created > 0).await;
    assert_eq!(p.capture_actions().created, 1, "a new capture instance");
    tokio::time::sleep(Duration::from_secs(6)).await;
    exec(
        &mut db,
        &format!("UPDATE dbo.[{table}] SET email = 'a@x' WHERE id = 1"),
    )
    .await;
    let items = collect(&mut p, 1).await;
    let changed = schema_events(&items);
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].after.capture_instance, format!("dbo_{table}_v2"));
    let Some(Item::Change(update)) = items.last() else {
        panic!("the row");
    };
    assert_eq!(email_of(update).as_deref(), Some("a@x"));
    written.send_replace(Some(p.position().clone()));
    polled_until(&mut p, 30, |p| p.capture_actions().disabled > 0).await;
    assert_eq!(
        p.capture_actions().disabled,
        1,
        "the drained instance is disabled"
    );
    drop_table(&mut db, &table).await;
}

#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn managed_mode_as_the_least_privilege_login_is_refused_naming_the_grant() {
    let (mut db, url) = admin().await;
    let table = format!("it_denied_{}", suffix());
    cdc_table(&mut db, &table, "id int NOT NULL PRIMARY KEY", None).await;
    let mut p = poller_with(&url, &[&table], None, |c| {
        c.capture_instances = CaptureInstanceMode::Managed;
    });
    let err = p.poll().await.expect_err("refused");
    assert!(
        err.to_string().contains("ALTER ROLE db_owner ADD MEMBER"),
        "{err}"
    );
    drop_table(&mut db, &table).await;
}

/// Managed mode never holds up the application's writers: with a transaction that
/// wrote the table still open, `sys.sp_cdc_enable_table` gives up after its lock
/// timeout (5 s) instead of queueing every later writer behind it, the stream goes
/// on, and once the transaction ends the new instance is created after the backoff.
#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn managed_mode_waits_for_an_open_writer_instead_of_blocking_writers() {
    let (mut db, url) = admin().await;
    let (mut writer, _) = admin().await;
    let table = format!("it_locked_{}", suffix());
    cdc_table(
        &mut db,
        &table,
        "id int NOT NULL PRIMARY KEY, v int NULL",
        None,
    )
    .await;
    let mut p = owner_poller(&url, &table);
    p.poll().await.expect("first poll");
    exec(&mut db, &format!("INSERT INTO dbo.[{table}] VALUES (1, 1)")).await;
    collect(&mut p, 1).await;
    exec(
        &mut db,
        &format!("ALTER TABLE dbo.[{table}] ADD email varchar(100) NULL"),
    )
    .await;
    // An application transaction that wrote the table stays open.
    exec(
        &mut writer,
        &format!("BEGIN TRANSACTION; UPDATE dbo.[{table}] SET v = 2 WHERE id = 1;"),
    )
    .await;
    // Within the capture job's scan the ADD is in cdc.ddl_history; each poll that
    // tries the new instance waits at most the lock timeout.
    let started = Instant::now();
    for _ in 0..20 {
        let poll = Instant::now();
        p.poll()
            .await
            .expect("a lock timeout does not stop the stream");
        assert!(
            poll.elapsed() < Duration::from_secs(15),
            "a poll waited {:?} behind the open transaction",
            poll.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        p.capture_actions().created,
        0,
        "not while the writer is open"
    );
    exec(&mut writer, "COMMIT;").await;
    polled_until(&mut p, 120, |p| p.capture_actions().created > 0).await;
    assert_eq!(
        p.capture_actions().created,
        1,
        "created once the writer committed ({:?} in all)",
        started.elapsed()
    );
    drop_table(&mut db, &table).await;
}

/// The catalog gives a column's default as SQL Server keeps its text, for
/// Debezium's schemas; and on a server that names its zone, `cdc.ddl_history`
/// comes with the zone's offsets (0 on the test bed's UTC server).
#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn column_defaults_and_zoned_ddl_times_come_from_the_catalog() {
    use mssql_ces::source::CdcReads as _;
    let (mut db, url) = admin().await;
    let table = format!("it_default_{}", suffix());
    cdc_table(
        &mut db,
        &table,
        "id int NOT NULL PRIMARY KEY, qty int NOT NULL DEFAULT 0, note nvarchar(20) NULL DEFAULT N'it''s'",
        None,
    )
    .await;
    exec(
        &mut db,
        &format!("ALTER TABLE dbo.[{table}] ADD extra int NULL"),
    )
    .await;
    // As the admin login: a default's text is metadata a login sees only where it
    // may see the table's definition.
    let mut source = SqlServerSource::new(SqlServerConfig {
        connection_string: ConnectionString::new(url.clone()),
        trust_server_certificate: false,
        encrypt: true,
        connect_timeout: Duration::from_secs(5),
        query_timeout: Duration::from_secs(30),
    });
    let catalog = source.catalog().await.expect("catalog");
    let instance = catalog
        .instances
        .iter()
        .find(|i| i.table == table)
        .expect("the table's capture instance");
    let defaults: Vec<(&str, Option<&str>)> = instance
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.default.as_deref()))
        .collect();
    assert_eq!(
        defaults,
        [
            ("id", None),
            ("qty", Some("((0))")),
            ("note", Some("(N'it''s')"))
        ]
    );
    // The capture job records the ADD within its scan.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ddl = loop {
        let ddl = source
            .ddl_history(&instance.name)
            .await
            .expect("ddl history");
        if !ddl.is_empty() || Instant::now() > deadline {
            break ddl;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(ddl.len(), 1, "{ddl:?}");
    if catalog.server_time_zone.is_some() {
        let offsets = ddl[0].offsets.expect("the zone's offsets");
        assert_eq!((offsets.at, offsets.hour_later), (0, 0), "a UTC server");
    }
    drop_table(&mut db, &table).await;
}

/// `DROP COLUMN` on a captured table: the rows committed before it and read after
/// it still carry the column's values (SQL Server keeps them in the change table),
/// and the first row after it has the new shape, announced with the DDL.
#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn rows_committed_before_a_drop_carry_the_dropped_column() {
    let (mut db, url) = admin().await;
    let table = format!("it_drop_{}", suffix());
    cdc_table(
        &mut db,
        &table,
        "id int NOT NULL PRIMARY KEY, email varchar(100) NULL, v int NULL",
        None,
    )
    .await;
    let mut p = poller_with(&url, &[&table], None, |c| c.schema_changes = true);
    p.poll().await.expect("first poll");
    exec(
        &mut db,
        &format!("INSERT INTO dbo.[{table}] VALUES (1, 'a@x', 1)"),
    )
    .await;
    // Captured by the job before the drop, read by the stream after it.
    tokio::time::sleep(Duration::from_secs(6)).await;
    exec(
        &mut db,
        &format!("ALTER TABLE dbo.[{table}] DROP COLUMN email"),
    )
    .await;
    exec(&mut db, &format!("INSERT INTO dbo.[{table}] VALUES (2, 2)")).await;
    let items = collect(&mut p, 2).await;
    let rows: Vec<&Change> = items
        .iter()
        .filter_map(|i| match i {
            Item::Change(c) => Some(c),
            Item::Schema(_) => None,
        })
        .collect();
    let shape = |c: &Change| -> Vec<(String, u32)> {
        c.table
            .columns()
            .iter()
            .map(|c| (c.name.clone(), c.index))
            .collect()
    };
    assert_eq!(
        shape(rows[0]),
        [("id".into(), 0), ("email".into(), 1), ("v".into(), 2)]
    );
    assert_eq!(email_of(rows[0]).as_deref(), Some("a@x"));
    assert_eq!(shape(rows[1]), [("id".into(), 0), ("v".into(), 1)]);
    let events = schema_events(&items);
    let dropped = events.last().expect("the drop announced");
    assert!(
        dropped
            .ddl
            .iter()
            .any(|d| d.command.to_lowercase().contains("drop column email")),
        "{:?}",
        dropped.ddl
    );
    drop_table(&mut db, &table).await;
}

/// Managed mode, a column dropped and added again under its name: the new capture
/// instance captures the new column, whenever the catalog is read between the
/// capture job's records of the two statements.
#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn managed_mode_captures_a_column_dropped_and_added_again() {
    let (mut db, url) = admin().await;
    let table = format!("it_readd_{}", suffix());
    cdc_table(
        &mut db,
        &table,
        "id int NOT NULL PRIMARY KEY, v int NULL",
        None,
    )
    .await;
    let mut p = owner_poller(&url, &table);
    p.poll().await.expect("first poll");
    exec(
        &mut db,
        &format!(
            "ALTER TABLE dbo.[{table}] DROP COLUMN v; ALTER TABLE dbo.[{table}] ADD v bigint NULL"
        ),
    )
    .await;
    polled_until(&mut p, 60, |p| p.capture_actions().created > 0).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    exec(
        &mut db,
        &format!("INSERT INTO dbo.[{table}] VALUES (1, 5000000000)"),
    )
    .await;
    let items = collect(&mut p, 1).await;
    let Some(Item::Change(row)) = items.last() else {
        panic!("the row");
    };
    let columns: Vec<&str> = row
        .table
        .columns()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["id", "v"], "the new instance captures the new v");
    assert_eq!(
        row.current.as_ref().map(|r| r[1].clone()),
        Some(mssql_ces::event::Value::BigInt(5_000_000_000))
    );
    drop_table(&mut db, &table).await;
}

//! Schema evolution against a real SQL Server (the docker test bed; run as the
//! module `sqlserver_integration` says): schema-change events between the shapes in
//! `manual` mode as the least-privilege login, and `managed` mode as the `db_owner`
//! login of `sql/05_db_owner_login.sql` (`mssql_ces_owner`, the compose file's
//! poller password; or `MSSQL_CES_TEST_OWNER_URL`).

use std::time::{Duration, Instant};

use mssql_ces::event::Change;
use mssql_ces::event::schema::{SchemaChange, SchemaChangeReason};
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
            filter: TableFilter::new(vec![format!("dbo.{table}")], vec![]),
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

fn schema_events(items: &[Item]) -> Vec<&SchemaChange> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Schema(s) => Some(s),
            Item::Change(_) => None,
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn manual_mode_announces_each_shape_before_its_first_event() {
    let (mut db, url) = admin().await;
    let table = format!("it_sce_{}", suffix());
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
    assert!(matches!(items[0], Item::Schema(_)), "before the row");
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
    let deadline = Instant::now() + Duration::from_secs(60);
    while p.capture_actions().created == 0 && Instant::now() < deadline {
        p.poll().await.expect("poll");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
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
    let email = update
        .table
        .columns()
        .iter()
        .position(|c| c.name == "email")
        .expect("email is captured");
    assert_eq!(
        update.current.as_ref().expect("row")[email]
            .to_text()
            .as_deref(),
        Some("a@x")
    );
    written.send_replace(Some(p.position().clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.capture_actions().disabled == 0 && Instant::now() < deadline {
        p.poll().await.expect("poll");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
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

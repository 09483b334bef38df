//! What the simulator and the TDS stand-in model of a real server, checked on the
//! docker test bed (run as the module `sqlserver_integration` says): discovery's
//! availability-group query, reads of a change table another session has locked,
//! the checkpoint table kept out of managed mode, and `rowversion` columns left out
//! as CES leaves them out.

use std::time::{Duration, Instant};

use mssql_ces::mssql::SqlConnection;
use mssql_ces::source::poller::PollOutcome;
use mssql_ces::source::server::{DatabaseServer, SqlServerDatabases};
use mssql_ces::source::sqlserver::{ConnectionString, SqlServerConfig};
use mssql_ces::source::{CaptureSettings, Fact};

use crate::schema_evolution::owner_poller_of;
use crate::sqlserver_integration::{
    Admin, admin, cdc_table, drop_table, exec, poller_url, poller_with, suffix,
};

fn server(url: String) -> SqlServerDatabases {
    SqlServerDatabases::new(SqlConnection::new(SqlServerConfig {
        connection_string: ConnectionString::new(url),
        trust_server_certificate: false,
        encrypt: true,
        connect_timeout: Duration::from_secs(5),
        query_timeout: Duration::from_secs(30),
    }))
}

/// The rows of `cdc.<instance>_CT`, as the admin login counts them.
async fn change_rows(db: &mut Admin, instance: &str) -> i32 {
    db.simple_query(format!("SELECT COUNT(*) FROM cdc.[{instance}_CT]"))
        .await
        .expect("count")
        .into_row()
        .await
        .expect("count")
        .expect("a row")
        .get::<i32, _>(0)
        .expect("an int")
}

/// Waits (up to a minute) until the capture job has written `rows` change rows.
async fn captured(db: &mut Admin, instance: &str, rows: i32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while change_rows(db, instance).await < rows {
        assert!(
            Instant::now() < deadline,
            "the capture job wrote {rows} rows within a minute"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// On a server without availability groups the replica query answers an empty
/// list to a login with `VIEW SERVER STATE` (the test bed's admin), and a login
/// without it (the least-privilege poller) is told "not known" rather than failed,
/// so discovery goes on and the probe finds what it cannot read.
#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn discovery_asks_the_replicas_and_a_login_without_server_state_goes_on() {
    let (_, url) = admin().await;
    let mut as_admin = server(url.clone());
    assert_eq!(
        as_admin.unreadable_replicas().await.expect("replica query"),
        Some(vec![])
    );
    let mut as_poller = server(poller_url(&url));
    assert_eq!(
        as_poller.unreadable_replicas().await.expect("not an error"),
        None
    );
    let databases = as_poller.cdc_databases().await.expect("discovery");
    assert!(databases.iter().any(|d| d == "CesDemo"), "{databases:?}");
    let probed = as_poller.probe(&databases).await.expect("probe");
    let demo = probed
        .iter()
        .find(|p| p.database == "CesDemo")
        .expect("CesDemo probed");
    assert!(demo.state.is_ok(), "{:?}", demo.state.as_ref().err());
}

/// The capture job's settings are read from `msdb.dbo.cdc_jobs` as the test bed's
/// `sys.sp_cdc_enable_db` left them (SQL Server's defaults), and the last log scan
/// session is read with the aggregate of all of them.
#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn the_capture_jobs_settings_and_last_scan_are_read_from_the_server() {
    let (_, url) = admin().await;
    let mut conn = SqlConnection::new(SqlServerConfig {
        connection_string: ConnectionString::new(url),
        trust_server_certificate: false,
        encrypt: true,
        connect_timeout: Duration::from_secs(5),
        query_timeout: Duration::from_secs(30),
    });
    let facts = mssql_ces::source::facts::read(&mut conn)
        .await
        .expect("facts");
    let Fact::Known(jobs) = facts.jobs else {
        panic!("the admin reads msdb: {:?}", facts.jobs);
    };
    let capture = jobs
        .iter()
        .find(|j| j.job_type == "capture")
        .and_then(|j| j.capture);
    assert_eq!(capture, Some(CaptureSettings::DEFAULT), "{jobs:?}");
    assert!(
        jobs.iter().any(|j| j.job_type == "cleanup"
            && j.capture.is_none()
            && j.retention_minutes.is_some()),
        "{jobs:?}"
    );
    // Session 0 aggregates the others: there whenever one is.
    assert!(
        matches!(
            facts.log_scan,
            Fact::Known(Some(mssql_ces::source::LogScan {
                total_tran_count: Some(_),
                ..
            }))
        ),
        "the admin reads the capture job's log scan sessions and their aggregate: {:?}",
        facts.log_scan
    );
}

/// A poll reads change tables as the cleanup job's deletes leave them: with another
/// session holding an exclusive lock on the change table (as a lock escalated from
/// the cleanup's 5,000-row deletes does), the poll still answers within seconds,
/// with the rows captured before the lock, instead of waiting out its query timeout.
#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn a_locked_change_table_is_read_without_waiting_for_the_lock() {
    let (mut db, url) = admin().await;
    let (mut locker, _) = admin().await;
    let table = format!("it_locked_ct_{}", suffix());
    let instance = format!("dbo_{table}");
    cdc_table(
        &mut db,
        &table,
        "id int NOT NULL PRIMARY KEY, v int NULL",
        None,
    )
    .await;
    let mut p = poller_with(&url, &[&table], None, |_| {});
    p.poll().await.expect("first poll");
    exec(&mut db, &format!("INSERT INTO dbo.[{table}] VALUES (1, 1)")).await;
    captured(&mut db, &instance, 1).await;
    exec(
        &mut locker,
        &format!(
            "BEGIN TRANSACTION; SELECT TOP (0) * FROM cdc.[{instance}_CT] WITH (TABLOCKX, HOLDLOCK);"
        ),
    )
    .await;
    let started = Instant::now();
    let mut rows = 0;
    while rows == 0 && started.elapsed() < Duration::from_secs(20) {
        match p
            .poll()
            .await
            .expect("a locked change table does not fail the poll")
        {
            PollOutcome::Batch(batch) => rows += batch.changes.len(),
            PollOutcome::Idle => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let waited = started.elapsed();
    exec(&mut locker, "ROLLBACK;").await;
    assert_eq!(rows, 1, "the captured row read under the lock");
    assert!(
        waited < Duration::from_secs(10),
        "the poll waited {waited:?} behind the lock"
    );
    drop_table(&mut db, &table).await;
}

/// Managed mode never enables CDC on the checkpoint table, even named by an include
/// pattern: its rows change at every checkpoint, and capturing them would make each
/// delivery write another change to deliver.
#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn managed_mode_never_enables_capture_on_the_checkpoint_table() {
    let (mut db, url) = admin().await;
    let table = format!("it_beside_ckpt_{}", suffix());
    cdc_table(
        &mut db,
        &table,
        "id int NOT NULL PRIMARY KEY, v int NULL",
        None,
    )
    .await;
    // As the db_owner login, which managed mode needs; the checkpoint table named
    // outright.
    let mut p = owner_poller_of(
        &url,
        vec![format!("dbo.{table}"), "dbo.mssql_ces_checkpoint".into()],
    );
    for _ in 0..5 {
        p.poll().await.expect("poll");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let tracked = db
        .simple_query(
            "SELECT CAST(is_tracked_by_cdc AS int) FROM sys.tables \
             WHERE object_id = OBJECT_ID(N'dbo.mssql_ces_checkpoint')",
        )
        .await
        .expect("query")
        .into_row()
        .await
        .expect("query")
        .expect("the checkpoint table exists on the test bed")
        .get::<i32, _>(0);
    assert_eq!(tracked, Some(0), "the checkpoint table stays uncaptured");
    assert_eq!(p.capture_actions().tables_enabled, 0);
    drop_table(&mut db, &table).await;
}

/// A `rowversion` column is left out as CES leaves it out, although the change
/// table holds it as `binary(8)`: the exclusion goes by the source column's
/// declared type, and the other values stay in their columns.
#[tokio::test]
#[ignore = "needs the docker SQL Server: see the module docs (cargo test --test sqlserver -- --ignored)"]
async fn a_rowversion_column_is_left_out_by_its_declared_type() {
    let (mut db, url) = admin().await;
    let table = format!("it_rowversion_{}", suffix());
    cdc_table(
        &mut db,
        &table,
        "id int NOT NULL PRIMARY KEY, rv rowversion, name nvarchar(20) NULL",
        None,
    )
    .await;
    let mut p = poller_with(&url, &[&table], None, |_| {});
    p.poll().await.expect("first poll");
    exec(
        &mut db,
        &format!("INSERT INTO dbo.[{table}] (id, name) VALUES (1, N'a')"),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let change = loop {
        assert!(
            Instant::now() < deadline,
            "the insert captured within a minute"
        );
        match p.poll().await.expect("poll") {
            PollOutcome::Batch(batch) if !batch.changes.is_empty() => {
                break batch.changes.into_iter().next().expect("a change");
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    let columns: Vec<&str> = change
        .table
        .columns()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["id", "name"]);
    let values: Vec<Option<String>> = change
        .current
        .as_ref()
        .expect("an after image")
        .iter()
        .map(|v| v.to_text())
        .collect();
    assert_eq!(values, [Some("1".to_owned()), Some("a".to_owned())]);
    drop_table(&mut db, &table).await;
}

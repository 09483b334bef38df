//! `mssql-ces check` against the CDC simulator and Kafka's `MockCluster`: a healthy
//! setup passes, and each thing that can be wrong fails its own check with a fix —
//! or, where the login may not look, is reported as not checked.

use crate::harness;
use crate::support;

use std::path::Path;

use cdc_sim::{CdcSimulator, SimColumn};
use chrono::Duration as Days;
use mssql_ces::checkpoint::file::FileStore;
use mssql_ces::commands::check::{Report, Status, check_with, kafka_findings};
use mssql_ces::config::Config;
use mssql_ces::event::Value;
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::position::Position;
use mssql_ces::sink::LargestMessage;
use mssql_ces::sink::kafka::{DestinationFacts, TopicFacts};
use mssql_ces::source::poller::{PollOutcome, Poller, PollerConfig};
use mssql_ces::source::{Fact, LogScan, SourceError};
use rdkafka::mocking::MockCluster;
use support::temp_dir;
use uuid::Uuid;

fn database() -> CdcSimulator {
    database_named("Shop")
}

/// `dbo.Customers` and `dbo.Orders`, CDC-enabled, in a database named `name`.
fn database_named(name: &str) -> CdcSimulator {
    let sim = CdcSimulator::new(name, Uuid::from_u128(7), 0);
    sim.create_table(
        "dbo",
        "Customers",
        vec![
            SimColumn::new("Id", SqlType::Int),
            SimColumn::new("Name", SqlType::NVarChar(Length::Bounded(50))),
        ],
        &["Id"],
    );
    sim.create_table(
        "dbo",
        "Orders",
        vec![
            SimColumn::new("Id", SqlType::BigInt),
            SimColumn::excluded("Route", "geography"),
        ],
        &["Id"],
    );
    sim.enable_table("dbo.Customers", None).expect("enable");
    sim.enable_table("dbo.Orders", None).expect("enable");
    sim
}

fn insert(sim: &CdcSimulator, id: i32) {
    sim.transaction()
        .insert(
            "dbo.Customers",
            vec![Value::Int(id), Value::Text(format!("c{id}"))],
        )
        .commit()
        .expect("commit");
}

/// What a network check may wait in these tests (`[check] timeout_ms`): the doubles
/// answer on loopback at once, and what does not answer is given up on sooner than
/// the 10 s a user's network gets.
const CHECK_TIMEOUT: &str = "\n[check]\ntimeout_ms = 2000\n";

/// Writes `text` (with [`CHECK_TIMEOUT`]) as `dir/name` and loads it.
fn load(dir: &Path, name: &str, text: &str) -> Config {
    let path = dir.join(name);
    std::fs::write(&path, format!("{text}{CHECK_TIMEOUT}")).expect("config");
    Config::load(&path, &[]).expect("valid configuration")
}

/// A configuration with `sink` (TOML lines of `[sink]`) and a file checkpoint in `dir`.
fn config(dir: &Path, sink: &str, extra: &str) -> Config {
    let text = format!(
        "[source]\nkind = \"synthetic\"\n[sink]\n{sink}\n[checkpoint]\npath = \"{cp}\"\n{extra}\n",
        cp = dir.join("cp.json").display()
    );
    load(dir, "config.toml", &text)
}

fn stdout_config(dir: &Path) -> Config {
    config(dir, "kind = \"stdout\"", "")
}

async fn run(config: &Config, sim: &CdcSimulator) -> Report {
    let mut source = sim.clone();
    check_with(config, &mut source, "simulator").await
}

/// The finding named `check`, asserting its status.
fn expect<'a>(
    report: &'a Report,
    check: &str,
    status: Status,
) -> &'a mssql_ces::commands::check::Finding {
    let finding = report
        .get(check)
        .unwrap_or_else(|| panic!("no check {check:?} in\n{}", report.to_text()));
    assert_eq!(finding.status, status, "{}", report.to_text());
    if status == Status::Fail {
        assert!(finding.fix.is_some(), "a failure says how to fix it");
    }
    finding
}

/// Delivers everything the simulator holds and saves the position as the checkpoint.
async fn checkpoint_everything(sim: &CdcSimulator, dir: &Path) -> Position {
    let mut poller = Poller::new(sim.clone(), PollerConfig::default(), None);
    loop {
        match poller.poll().await.expect("poll") {
            PollOutcome::Idle => break,
            PollOutcome::Batch(_) => {}
        }
    }
    let position = poller.position().clone();
    FileStore::new(dir.join("cp.json"), "default")
        .save(&position)
        .expect("save");
    position
}

#[tokio::test]
async fn a_healthy_setup_passes_every_check() {
    let dir = temp_dir("check-ok");
    let sim = database();
    insert(&sim, 1);
    let report = run(&stdout_config(&dir), &sim).await;
    assert!(report.passed(), "{}", report.to_text());
    assert!(report.findings.iter().all(|f| f.status == Status::Pass));
    let orders = expect(&report, "table dbo.Orders", Status::Pass);
    assert!(
        orders.detail.contains("key (Id)") && orders.detail.contains("left out: Route"),
        "{}",
        orders.detail
    );
    expect(&report, "cleanup retention", Status::Pass);
    let zone = expect(&report, "time zone", Status::Pass);
    assert!(
        zone.detail.contains("the server's own zone (UTC)"),
        "{}",
        zone.detail
    );
    let scan = expect(&report, "last log scan", Status::Pass);
    assert!(scan.detail.contains("latency 0 s"), "{}", scan.detail);
    let text = report.to_text();
    assert!(text.ends_with("0 failed, 0 not checked\n"), "{text}");
    std::fs::remove_dir_all(dir).ok();
}

/// On a server that cannot name its zone (2016–2019), the default `time_zone =
/// "server"` fails with the setting to fix; a named zone passes.
#[tokio::test]
async fn server_time_zone_fails_where_the_server_cannot_name_its_zone() {
    let dir = temp_dir("check-zone");
    let sim = database();
    sim.forget_time_zone();
    insert(&sim, 1);
    let report = run(&stdout_config(&dir), &sim).await;
    let zone = expect(&report, "time zone", Status::Fail);
    assert!(zone.detail.contains("source.time_zone"), "{}", zone.detail);
    assert!(!report.passed());
    let mut named = stdout_config(&dir);
    named.source.time_zone = "Europe/Berlin".into();
    let report = run(&named, &sim).await;
    let zone = expect(&report, "time zone", Status::Pass);
    assert!(zone.detail.contains("Europe/Berlin"), "{}", zone.detail);
    std::fs::remove_dir_all(dir).ok();
}

/// `source.capture_instances = "managed"` needs `db_owner`: the check says whether
/// the login is, and fails only when the setting needs it.
#[tokio::test]
async fn managed_capture_instances_need_db_owner_and_the_check_says_so() {
    let dir = temp_dir("check-managed");
    let sim = database();
    insert(&sim, 1);
    let report = run(&stdout_config(&dir), &sim).await;
    let manual = expect(&report, "capture instances", Status::Pass);
    assert!(
        manual.detail.contains("manual") && manual.detail.contains("is db_owner"),
        "{}",
        manual.detail
    );
    let mut managed = stdout_config(&dir);
    managed.source.capture_instances = mssql_ces::source::poller::CaptureInstanceMode::Managed;
    expect(
        &run(&managed, &sim).await,
        "capture instances",
        Status::Pass,
    );
    sim.set_db_owner(false);
    let report = run(&stdout_config(&dir), &sim).await;
    let manual = expect(&report, "capture instances", Status::Pass);
    assert!(manual.detail.contains("not db_owner"), "{}", manual.detail);
    let report = run(&managed, &sim).await;
    let denied = expect(&report, "capture instances", Status::Fail);
    assert!(
        denied
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("ALTER ROLE db_owner ADD MEMBER"),
        "{denied:?}"
    );
    assert!(!report.passed());
    std::fs::remove_dir_all(dir).ok();
}

/// `source.cleanup`: the default says the Agent's job cleans; `"after_delivery"`
/// fails without `db_owner`, and warns while the Agent's job still purges by age.
#[tokio::test]
async fn cleanup_after_delivery_needs_db_owner_and_warns_of_the_agents_job() {
    let dir = temp_dir("check-cleanup");
    let sim = database();
    insert(&sim, 1);
    let report = run(&stdout_config(&dir), &sim).await;
    let agent = expect(&report, "change table cleanup", Status::Pass);
    assert!(
        agent.detail.contains("source.cleanup = \"agent\""),
        "{}",
        agent.detail
    );
    let mut after = stdout_config(&dir);
    after.source.cleanup = mssql_ces::source::poller::CleanupMode::AfterDelivery;
    let report = run(&after, &sim).await;
    let warned = expect(&report, "change table cleanup", Status::Warn);
    assert!(
        warned.detail.contains("still purges changes older than"),
        "{}",
        warned.detail
    );
    assert!(
        (warned.fix.as_deref().unwrap_or_default()).contains("sp_cdc_change_job"),
        "{warned:?}"
    );
    sim.set_db_owner(false);
    let report = run(&after, &sim).await;
    let denied = expect(&report, "change table cleanup", Status::Fail);
    assert!(denied.detail.contains("not db_owner"), "{}", denied.detail);
    assert!(
        (denied.fix.as_deref().unwrap_or_default()).contains("source.cleanup = \"agent\""),
        "{denied:?}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// A table with two capture instances whose names do not sort together (another
/// table's instance between them) is one finding, not two.
#[tokio::test]
async fn a_table_with_two_capture_instances_is_reported_once() {
    let dir = temp_dir("check-two-instances");
    let sim = database();
    sim.enable_table("dbo.Customers", Some("zz_customers_v2"))
        .expect("second instance");
    insert(&sim, 1);
    let report = run(&stdout_config(&dir), &sim).await;
    for table in ["table dbo.Customers", "table dbo.Orders"] {
        let findings = report.findings.iter().filter(|f| f.check == table).count();
        assert_eq!(findings, 1, "{table}: {}", report.to_text());
    }
    let customers = expect(&report, "table dbo.Customers", Status::Pass);
    assert!(
        customers.detail.contains("zz_customers_v2"),
        "both instances named: {}",
        customers.detail
    );
    std::fs::remove_dir_all(dir).ok();
}

/// The capture job's settings are reported with the ceiling they put on the
/// stream, and named as its bound (with the change to make) only when the job's
/// last scan took all a scan may and the job is behind the log.
#[tokio::test]
async fn the_capture_jobs_settings_are_named_when_they_bound_the_stream() {
    let dir = temp_dir("check-capture-settings");
    let config = stdout_config(&dir);
    let sim = database();
    let report = run(&config, &sim).await;
    let settings = expect(&report, "capture job settings", Status::Pass);
    assert!(
        settings
            .detail
            .contains("at most 500 transactions a scan and 10 scans, then a pause of 5 s: at most about 1000 transactions/s"),
        "{}",
        settings.detail
    );
    let behind_after = |tran_count| {
        move |s: &mut mssql_ces::source::ServerFacts| {
            s.log_scan = Fact::Known(Some(LogScan {
                start_time: s.local_time,
                end_time: Some(s.local_time),
                latency_seconds: 900,
                error_count: 0,
                tran_count,
                total_tran_count: None,
            }))
        }
    };
    // Behind, but its last scan took fewer than a scan may: something else
    // (the log's growth, the server) holds it back.
    sim.configure_server(behind_after(499));
    let report = run(&config, &sim).await;
    expect(&report, "capture job settings", Status::Pass);
    expect(&report, "last log scan", Status::Fail);
    sim.configure_server(behind_after(500));
    let report = run(&config, &sim).await;
    let bound = expect(&report, "capture job settings", Status::Fail);
    assert!(
        bound
            .detail
            .starts_with("they bound the stream: the last scan took the most transactions a scan may (500) and the job is 900 s behind the log"),
        "{}",
        bound.detail
    );
    let fix = bound.fix.as_deref().unwrap_or_default();
    for part in [
        "@job_type = N'capture', @maxtrans = 2000, @pollinginterval = 1;",
        "EXEC sys.sp_cdc_stop_job @job_type = N'capture'; EXEC sys.sp_cdc_start_job",
    ] {
        assert!(fix.contains(part), "{part}: {fix}");
    }
    // A job already without a long pause is not told to shorten it.
    sim.configure_server(|s| {
        s.jobs = Fact::Known(vec![mssql_ces::source::CdcJob::capture(
            mssql_ces::source::CaptureSettings {
                polling_interval_s: 1,
                ..mssql_ces::source::CaptureSettings::DEFAULT
            },
        )])
    });
    let report = run(&config, &sim).await;
    let fix = expect(&report, "capture job settings", Status::Fail)
        .fix
        .clone()
        .unwrap_or_default();
    assert!(!fix.contains("@pollinginterval"), "{fix}");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn the_server_checks_fail_with_their_fix() {
    let dir = temp_dir("check-server");
    let config = stdout_config(&dir);
    let sim = database();
    sim.configure_server(|s| {
        s.agent = Fact::Known("Stopped".into());
        s.capture_running = Fact::Known(false);
        s.log_scan = Fact::Known(Some(LogScan {
            start_time: s.local_time,
            end_time: Some(s.local_time),
            latency_seconds: 2,
            error_count: 3,
            tran_count: 12,
            total_tran_count: Some(12),
        }));
    });
    let report = run(&config, &sim).await;
    assert!(!report.passed());
    let agent = expect(&report, "SQL Server Agent", Status::Fail);
    assert!(agent.detail.starts_with("Stopped"), "{}", agent.detail);
    let job = expect(&report, "capture job", Status::Fail);
    assert!(
        job.fix
            .as_deref()
            .is_some_and(|f| f.contains("sys.sp_cdc_start_job")),
        "{job:?}"
    );
    let scan = expect(&report, "last log scan", Status::Fail);
    assert!(scan.detail.contains("3 errors"), "{}", scan.detail);
    assert!(
        report.get("max text repl size").is_none(),
        "no captured LOB column, nothing to say"
    );
    // A captured nvarchar(max): the default LOB limit is reported.
    sim.create_table(
        "dbo",
        "Notes",
        vec![
            SimColumn::new("Id", SqlType::Int),
            SimColumn::new("Body", SqlType::NVarChar(Length::Max)),
        ],
        &["Id"],
    );
    sim.enable_table("dbo.Notes", None).expect("enable");
    let report = run(&config, &sim).await;
    let lob = expect(&report, "max text repl size", Status::Pass);
    assert!(
        lob.detail.contains("65536 bytes") && lob.detail.contains("dbo.Notes.Body"),
        "{}",
        lob.detail
    );

    sim.configure_server(|s| {
        s.jobs = Fact::Known(Vec::new());
        s.product_version = "12.0.6024.0".into();
    });
    let report = run(&config, &sim).await;
    let job = expect(&report, "capture job", Status::Fail);
    assert!(
        job.fix
            .as_deref()
            .is_some_and(|f| f.contains("sys.sp_cdc_add_job")),
        "{job:?}"
    );
    expect(&report, "SQL Server", Status::Fail);
    // Managed Instance and Azure SQL Database report 12.x and are current.
    for edition in [8, 5] {
        sim.configure_server(|s| {
            s.product_version = "12.0.2000.8".into();
            s.engine_edition = edition;
        });
        let report = run(&config, &sim).await;
        expect(&report, "SQL Server", Status::Pass);
    }
    sim.configure_server(|s| s.engine_edition = 3);

    // CDC off: the database check says how to enable it, and the catalog cannot be
    // read (as on SQL Server).
    sim.configure_server(|s| s.cdc_enabled = false);
    let report = run(&config, &sim).await;
    let cdc = expect(&report, "CDC on database Shop", Status::Fail);
    assert!(
        cdc.fix
            .as_deref()
            .is_some_and(|f| f.contains("sys.sp_cdc_enable_db")),
        "{cdc:?}"
    );
    expect(&report, "CDC catalog", Status::Fail);
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn what_the_login_may_not_see_is_not_checked_and_does_not_fail() {
    let dir = temp_dir("check-perm");
    let sim = database();
    let msdb = "needs SELECT on msdb.dbo.cdc_jobs (error 229)";
    sim.configure_server(|s| {
        s.agent = Fact::Unknown("needs VIEW SERVER STATE (error 300)".into());
        s.jobs = Fact::Unknown(msdb.into());
        s.capture_running = Fact::Unknown(msdb.into());
        s.log_scan = Fact::Unknown("needs VIEW DATABASE STATE (error 300)".into());
    });
    let report = run(&stdout_config(&dir), &sim).await;
    assert!(report.passed(), "{}", report.to_text());
    for check in [
        "SQL Server Agent",
        "capture job",
        "cleanup retention",
        "last log scan",
    ] {
        let finding = expect(&report, check, Status::Skip);
        assert!(finding.detail.contains("needs"), "{finding:?}");
    }
    assert!(
        report
            .to_text()
            .contains("– SQL Server Agent: needs VIEW SERVER STATE")
    );
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn tables_the_login_cannot_read_or_see_fail_by_name() {
    let dir = temp_dir("check-tables");
    let config = stdout_config(&dir);
    let sim = database();
    sim.deny_select("dbo.Orders", true);
    let report = run(&config, &sim).await;
    let orders = expect(&report, "table dbo.Orders", Status::Fail);
    assert!(orders.detail.contains("cannot read"), "{orders:?}");
    assert!(
        orders
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("GRANT SELECT ON [dbo].[Orders]")),
        "{orders:?}"
    );
    expect(&report, "table dbo.Customers", Status::Pass);

    // Outside the capture instance's gating role: the fix names the role.
    sim.deny_select("dbo.Orders", false);
    sim.set_gating_role("dbo_Orders", Some("cdc_readers"));
    let report = run(&config, &sim).await;
    let orders = expect(&report, "table dbo.Orders", Status::Fail);
    assert!(
        orders
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("ALTER ROLE [cdc_readers] ADD MEMBER")),
        "{orders:?}"
    );
    sim.set_gating_role("dbo_Orders", None);

    sim.hide_table("dbo.Orders");
    let report = run(&config, &sim).await;
    expect(&report, "capture instance dbo_Orders", Status::Fail);

    // A table enabled while the capture job is not scanning has no start_lsn yet.
    let sim = database();
    sim.set_capture_job_manual(true);
    sim.create_table(
        "dbo",
        "Late",
        vec![SimColumn::new("Id", SqlType::Int)],
        &["Id"],
    );
    sim.enable_table("dbo.Late", None).expect("enable");
    let report = run(&config, &sim).await;
    let late = expect(&report, "table dbo.Late", Status::Fail);
    assert!(late.detail.contains("no start_lsn"), "{late:?}");

    // Nothing included.
    let filtered = config_with(
        &dir,
        "[source]\nkind = \"synthetic\"\ninclude = [\"nope.*\"]\n",
    );
    let report = run(&filtered, &database()).await;
    expect(&report, "tables", Status::Fail);
    std::fs::remove_dir_all(dir).ok();
}

fn config_with(dir: &Path, source: &str) -> Config {
    let text = format!(
        "{source}[sink]\nkind = \"stdout\"\n[checkpoint]\npath = \"{}\"\n",
        dir.join("cp.json").display()
    );
    load(dir, "filtered.toml", &text)
}

#[tokio::test]
async fn an_unreadable_database_guid_fails_unless_the_stream_guid_is_set() {
    let dir = temp_dir("check-guid");
    let sim = database();
    sim.set_guid_readable(false);
    let report = run(&stdout_config(&dir), &sim).await;
    let guid = expect(&report, "stream GUID", Status::Fail);
    assert!(
        guid.fix
            .as_deref()
            .is_some_and(|f| f.contains("event.stream_guid")),
        "{guid:?}"
    );
    let set = config(
        &dir,
        "kind = \"stdout\"",
        "[event]\nstream_guid = \"1bf2756a-c15f-4d2e-a2d5-7d3f9dbf85b0\"",
    );
    let report = run(&set, &sim).await;
    expect(&report, "stream GUID", Status::Pass);
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_checkpoint_past_or_near_the_retention_fails_naming_the_range() {
    let dir = temp_dir("check-retention");
    let config = stdout_config(&dir);
    let sim = database();
    insert(&sim, 1);
    checkpoint_everything(&sim, &dir).await;
    let report = run(&config, &sim).await;
    expect(&report, "checkpoint: readable", Status::Pass);
    expect(&report, "checkpoint: this database", Status::Pass);
    let fresh = expect(&report, "checkpoint: within retention", Status::Pass);
    assert!(fresh.detail.contains("caught up"), "{fresh:?}");

    // Changes after the checkpoint, then 2.5 of the 3 days pass undelivered.
    insert(&sim, 2);
    sim.advance_local_time(Days::hours(60));
    insert(&sim, 3);
    let report = run(&config, &sim).await;
    let near = expect(&report, "checkpoint: within retention", Status::Fail);
    assert!(
        near.detail.contains("2 d 12 h") && near.detail.contains("83 %"),
        "{near:?}"
    );
    assert!(
        near.fix
            .as_deref()
            .is_some_and(|f| f.contains("sys.sp_cdc_change_job")),
        "{near:?}"
    );

    // The cleanup job purges past the checkpoint: lost, with the range.
    let third = sim.current_max_lsn().expect("max_lsn");
    sim.cleanup(third);
    let report = run(&config, &sim).await;
    let lost = expect(&report, "checkpoint: within retention", Status::Fail);
    assert!(
        lost.detail.contains("CHANGES LOST") && lost.detail.contains("dbo_Customers"),
        "{lost:?}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_checkpoint_of_another_database_or_one_that_cannot_be_written_fails() {
    let dir = temp_dir("check-other");
    let config = stdout_config(&dir);
    let sim = database();
    insert(&sim, 1);
    checkpoint_everything(&sim, &dir).await;
    // A restored copy: same name, new GUID.
    sim.set_guid(Uuid::from_u128(8));
    let report = run(&config, &sim).await;
    let other = expect(&report, "checkpoint: this database", Status::Fail);
    assert!(
        other
            .detail
            .contains("00000000-0000-0000-0000-000000000007"),
        "{other:?}"
    );

    // A checkpoint path under a file: neither readable nor writable there.
    let blocker = dir.join("a-file");
    std::fs::write(&blocker, "x").expect("file");
    let unwritable = config_with_checkpoint(&dir, &blocker.join("cp.json"));
    let report = run(&unwritable, &sim).await;
    expect(&report, "checkpoint: writable", Status::Fail);
    // A corrupt checkpoint says to move it away.
    std::fs::write(dir.join("cp.json"), "{ not json").expect("write");
    let report = run(&config, &sim).await;
    let corrupt = expect(&report, "checkpoint: readable", Status::Fail);
    assert!(corrupt.detail.contains("move it away"), "{corrupt:?}");
    std::fs::remove_dir_all(dir).ok();
}

fn config_with_checkpoint(dir: &Path, checkpoint: &Path) -> Config {
    let text = format!(
        "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"stdout\"\n[checkpoint]\npath = \"{}\"\n",
        checkpoint.display()
    );
    load(dir, "cp-config.toml", &text)
}

#[tokio::test]
async fn a_source_that_refuses_the_login_stops_the_source_checks() {
    let dir = temp_dir("check-login");
    let sim = database();
    sim.inject_fault(SourceError::Sql(
        mssql_ces::mssql::SqlErrorKind::LoginFailed,
    ));
    let report = run(&stdout_config(&dir), &sim).await;
    let login = expect(&report, "SQL Server", Status::Fail);
    assert!(
        login
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("source.connection_string")),
        "{login:?}"
    );
    expect(&report, "CDC catalog", Status::Skip);
    // The checkpoint and destination are still checked.
    expect(&report, "checkpoint: writable", Status::Pass);
    expect(&report, "destination", Status::Pass);
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_secret_that_does_not_resolve_fails_the_configuration_check() {
    let dir = temp_dir("check-secret");
    let config = config(
        &dir,
        "kind = \"event_hubs_kafka\"\nconnection_string = { env = \"MSSQL_CES_CHECK_NO_SUCH_VAR\" }\ntopic = \"hub\"",
        "",
    );
    let report = run(&config, &database()).await;
    let secret = expect(&report, "configuration", Status::Fail);
    assert!(
        secret.detail.contains("sink.connection_string"),
        "{secret:?}"
    );
    assert!(
        !secret.detail.contains("Endpoint="),
        "no secret in the report"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// What `run` refuses, `check` fails: an output file holding lines no checkpoint
/// accounts for, a metrics address another process holds, a connection string the
/// driver cannot parse or without a server.
#[tokio::test]
async fn check_fails_what_run_would_refuse() {
    let dir = temp_dir("check-refuse");
    let out = dir.join("out.jsonl");
    let file_sink = format!("kind = \"file\"\npath = \"{}\"", out.display());
    // No file yet, then an empty one: a first run may write it.
    let report = run(&config(&dir, &file_sink, ""), &database()).await;
    expect(&report, "destination", Status::Pass);
    std::fs::write(&out, "").expect("empty file");
    let report = run(&config(&dir, &file_sink, ""), &database()).await;
    expect(&report, "destination", Status::Pass);
    std::fs::write(&out, "{\"a line\":1}\n").expect("a line");
    let report = run(&config(&dir, &file_sink, ""), &database()).await;
    let file = expect(&report, "destination", Status::Fail);
    assert!(file.detail.contains("no checkpoint"), "{file:?}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("address");
    let serving = config(
        &dir,
        "kind = \"stdout\"",
        &format!("[metrics]\nlisten = \"{address}\""),
    );
    let report = run(&serving, &database()).await;
    let metrics = expect(&report, "metrics", Status::Fail);
    assert!(metrics.detail.contains(&address.to_string()), "{metrics:?}");
    drop(taken);
    let report = run(&serving, &database()).await;
    expect(&report, "metrics", Status::Pass);

    let path = dir.join("sql.toml");
    for (cs, says) in [
        (
            "Server=tcp:db,1433;Bogus;Password=HUNTER2",
            "the keyword `bogus`",
        ),
        ("Server=;User Id=u;Password=HUNTER2", "empty Server"),
        // A misspelt keyword: it would have connected to localhost for ever.
        (
            "Srvr=tcp:db,1433;User Id=u;Passwort=HUNTER2",
            "the keyword `srvr`",
        ),
        ("Database=x;User Id=u;Password=HUNTER2", "names no server"),
    ] {
        std::fs::write(
            &path,
            format!("[source]\nkind = \"sqlserver\"\nconnection_string = {{ env = \"MSSQL_CES_CHECK_CS\" }}\n[sink]\nkind = \"stdout\"\n{CHECK_TIMEOUT}"),
        )
        .expect("config");
        for args in [&["check"][..], &["run"]] {
            let output = harness::output(
                harness::command(args, &path).env("MSSQL_CES_CHECK_CS", cs),
                "mssql-ces with a connection string it refuses",
            );
            let all = harness::printed(&output);
            assert!(
                all.contains(says) && all.contains("source.connection_string"),
                "{args:?}: {all}"
            );
            assert!(!all.contains("HUNTER2"), "{all}");
            // `run`: a configuration error (2), before anything is contacted.
            let code = if args[0] == "run" { 2 } else { 1 };
            assert_eq!(output.status.code(), Some(code), "{args:?}: {all}");
            if args[0] == "check" {
                assert!(
                    all.contains("✘ configuration: source.connection_string"),
                    "{all}"
                );
                assert!(all.contains("– SQL Server: not contacted"), "{all}");
            }
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

fn kafka_sink(bootstrap: &str, topic: &str) -> String {
    format!("kind = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\ntopic = \"{topic}\"")
}

#[tokio::test]
async fn kafka_topics_are_checked_per_table_and_a_missing_one_fails() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster
        .create_topic("Shop.dbo.Customers", 3, 1)
        .expect("topic");
    let dir = temp_dir("check-kafka");
    let config = config(&dir, &kafka_sink(&bootstrap, "{db}.{schema}.{tbl}"), "");
    let report = run(&config, &database()).await;
    let brokers = expect(&report, "Kafka: brokers", Status::Pass);
    // A plaintext cluster without a login: nothing was authenticated.
    assert!(
        brokers.detail.contains("no login configured") && !brokers.detail.contains("credentials"),
        "{brokers:?}"
    );
    // The test double does not answer DescribeConfigs: the limit is not checked.
    let customers = expect(&report, "topic Shop.dbo.Customers", Status::Skip);
    assert!(
        customers.detail.starts_with("3 partitions"),
        "{customers:?}"
    );
    let orders = expect(&report, "topic Shop.dbo.Orders", Status::Fail);
    assert!(orders.detail.contains("does not exist"), "{orders:?}");
    // With schema-change events on their own topic, that topic is checked too.
    let mut with_schema = config.clone();
    with_schema.sink.routing.schema_changes =
        mssql_ces::sink::settings::SchemaChangePlacement::Topic;
    with_schema.sink.routing.schema_topic = Some("Shop.schema".into());
    let report = run(&with_schema, &database()).await;
    let schema = expect(&report, "topic Shop.schema", Status::Fail);
    assert!(schema.detail.contains("does not exist"), "{schema:?}");
    // So is the heartbeat topic, with heartbeats on.
    let mut with_beats = config.clone();
    with_beats.sink.routing.heartbeat_interval = std::time::Duration::from_secs(10);
    with_beats.sink.routing.heartbeat_topic = Some("beats.{db}".into());
    let report = run(&with_beats, &database()).await;
    let beats = expect(&report, "topic beats.Shop", Status::Fail);
    assert!(beats.detail.contains("does not exist"), "{beats:?}");
    std::fs::remove_dir_all(dir).ok();
}

/// Table names Kafka does not allow in a topic (the docker sample's `sales.order
/// details`) give topics with `_` in their place; tables that meet in one topic
/// that way are a warning naming them, not a failure.
#[tokio::test]
async fn topics_of_names_kafka_refuses_are_made_safe_and_tables_that_meet_are_named() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster
        .create_topic("Shop.sales.order_details", 1, 1)
        .expect("topic");
    let sim = CdcSimulator::new("Shop", Uuid::from_u128(9), 0);
    for table in ["order details", "order_details"] {
        sim.create_table(
            "sales",
            table,
            vec![SimColumn::new("Id", SqlType::Int)],
            &["Id"],
        );
        sim.enable_table(&format!("sales.{table}"), None)
            .expect("enable");
    }
    let dir = temp_dir("check-topic-names");
    let config = config(&dir, &kafka_sink(&bootstrap, "{db}.{schema}.{tbl}"), "");
    let report = run(&config, &sim).await;
    let text = report.to_text();
    assert!(
        !text.contains("order details\n") && !text.contains("topic Shop.sales.order details"),
        "{text}"
    );
    let shared = report
        .findings
        .iter()
        .find(|f| f.check == "topic Shop.sales.order_details" && f.status == Status::Warn)
        .unwrap_or_else(|| panic!("a warning on the shared topic:\n{text}"));
    assert!(
        shared
            .detail
            .contains("Shop.sales.order details, Shop.sales.order_details"),
        "{shared:?}"
    );
    assert!(shared.fix.is_some(), "{shared:?}");
    assert!(report.passed(), "a warning fails nothing:\n{text}");
    assert!(text.ends_with(", 1 warning\n"), "{text}");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn brokers_that_do_not_answer_fail_the_destination() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let dir = temp_dir("check-down");
    let config = config(&dir, &kafka_sink(&closed.to_string(), "ces"), "");
    let report = run(&config, &database()).await;
    let brokers = expect(&report, "Kafka: brokers", Status::Fail);
    assert!(brokers.detail.contains("no answer"), "{brokers:?}");
    std::fs::remove_dir_all(dir).ok();
}

/// With the checkpoint topic on brokers that do not answer, the checkpoint checks
/// say so at once, for every database, instead of each waiting out
/// `check.timeout_ms` and reporting a metadata or time-out error as the
/// checkpoint's fault; `Kafka: brokers` names the cause.
#[tokio::test]
async fn a_checkpoint_topic_on_brokers_that_do_not_answer_is_not_checked_per_database() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let dir = temp_dir("check-down-store");
    let text = format!(
        "[source]\nkind = \"synthetic\"\ndatabases = [\"tenant*\"]\n[source.synthetic]\ndatabases = 4\n\
         [sink]\n{}\n[checkpoint]\nstore = \"kafka\"\n",
        kafka_sink(&closed.to_string(), "ces")
    );
    let config = load(&dir, "down.toml", &text);
    let report = mssql_ces::commands::check::check(&config).await;
    let brokers = expect(&report, "Kafka: brokers", Status::Fail);
    assert!(brokers.detail.contains("no answer"), "{brokers:?}");
    for database in ["tenant001", "tenant004"] {
        for check in ["checkpoint: readable", "checkpoint: writable"] {
            let finding = expect(&report, &format!("{database}: {check}"), Status::Skip);
            assert!(
                finding.detail.contains("no answer from the sink's brokers"),
                "{finding:?}"
            );
        }
    }
    let kept = expect(&report, "checkpoint: kept", Status::Skip);
    assert!(kept.detail.contains("not checked"), "{kept:?}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_topic_limit_below_the_largest_segment_fails_with_the_command_to_raise_it() {
    let facts = DestinationFacts {
        brokers: 3,
        topics: vec![
            TopicFacts {
                name: "small".into(),
                partitions: Some(6),
                refused: false,
                max_message_bytes: Ok(100_000),
            },
            TopicFacts {
                name: "big".into(),
                partitions: Some(6),
                refused: false,
                max_message_bytes: Ok(2_000_000),
            },
            TopicFacts {
                name: "new".into(),
                partitions: None,
                refused: false,
                max_message_bytes: Err("no such topic".into()),
            },
        ],
        auto_create: Ok(true),
        login: None,
    };
    let mut report = Report::default();
    // The producer's largest record batch: a 1 MiB segment with its headers.
    kafka_findings(
        &mut report,
        &facts,
        Some("b:9092"),
        LargestMessage {
            bytes: 1024 * 1024 + 1024,
            setting: "event.max_message_size_kb",
        },
        true,
    );
    let small = expect(&report, "topic small", Status::Fail);
    assert!(
        small.detail.contains("100000") && small.detail.contains("event.max_message_size_kb"),
        "{small:?}"
    );
    assert!(
        small
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("max.message.bytes=1049600")),
        "{small:?}"
    );
    expect(&report, "topic big", Status::Pass);
    let new = expect(&report, "topic new", Status::Pass);
    assert!(new.detail.contains("auto.create.topics.enable"), "{new:?}");
    let refused = DestinationFacts {
        auto_create: Ok(false),
        ..facts
    };
    let mut report = Report::default();
    kafka_findings(
        &mut report,
        &refused,
        Some("b:9092"),
        LargestMessage {
            bytes: 1024 * 1024,
            setting: "event.max_message_size_kb",
        },
        true,
    );
    let missing = expect(&report, "topic new", Status::Fail);
    // A command to paste as it is: no placeholder a shell would take for a redirection.
    assert!(
        missing.fix.as_deref().is_some_and(|f| f.ends_with(
            "kafka-topics.sh --bootstrap-server 'b:9092' --create --topic 'new' --partitions 6"
        )),
        "{missing:?}"
    );
}

/// Event Hubs over AMQP, against the local AMQP peer: the hub's partitions are read,
/// and a hub whose properties cannot be read fails (sends would crawl through the
/// gateway).
#[tokio::test]
async fn event_hubs_is_checked_by_connecting_and_reading_the_hub() {
    let dir = temp_dir("check-amqp");
    let secret = dir.join("eh.secret");
    std::fs::write(
        &secret,
        "Endpoint=sb://fake.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0;EntityPath=orders",
    )
    .expect("secret");
    for (partitions, status) in [(4, Status::Pass), (0, Status::Fail)] {
        let (endpoint, _arrivals) = support::amqp_peer::start_with_partitions(partitions).await;
        let sink = format!(
            "kind = \"event_hubs_amqp\"\nconnection_string = {{ file = \"{}\" }}\ncustom_endpoint = \"{endpoint}\"",
            secret.display()
        );
        let report = run(&config(&dir, &sink, ""), &database()).await;
        let hub = expect(&report, "Event Hubs: orders", status);
        if status == Status::Pass {
            assert!(hub.detail.contains("4 partitions"), "{hub:?}");
        }
        assert!(
            !report.to_text().contains("c2VjcmV0"),
            "no secret in the report"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

/// The binary: exit 0 and one line per check when all pass; exit 1 and JSON for
/// automation when one fails.
#[test]
fn the_binary_reports_each_check_and_exits_by_the_verdict() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces", 2, 1).expect("topic");
    let dir = temp_dir("check-binary");
    let path = dir.join("config.toml");
    let write = |topic: &str| {
        let text = format!(
            "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 20\n[sink]\n{}\n[checkpoint]\npath = \"{}\"\n{CHECK_TIMEOUT}",
            kafka_sink(&bootstrap, topic),
            dir.join("cp.json").display()
        );
        std::fs::write(&path, text).expect("config");
    };
    write("ces");
    let output = harness::output(&mut harness::command(&["check"], &path), "check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("✔ Kafka: brokers"), "{stdout}");
    assert!(stdout.contains("– topic ces: 2 partitions"), "{stdout}");
    assert!(stdout.contains(" 0 failed"), "{stdout}");

    write("missing");
    let output = harness::output(
        &mut harness::command(&["check", "--format", "json"], &path),
        "check --format json",
    );
    assert_eq!(output.status.code(), Some(1));
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("one JSON document");
    assert_eq!(report["ok"], false);
    assert_eq!(report["failed"], 1);
    assert!(
        report["passed"].as_u64().is_some_and(|n| n > 0),
        "a count: {report}"
    );
    let missing = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["check"] == "topic missing")
        .expect("the topic's check");
    assert_eq!(missing["status"], "fail");
    assert!(
        missing["fix"]
            .as_str()
            .is_some_and(|f| f.contains("--topic 'missing'"))
    );

    // A configuration that does not load is a failed check too, not a crash.
    std::fs::write(&path, "[source]\nkind = \"nope\"\n").expect("config");
    let output = harness::output(&mut harness::command(&["check"], &path), "check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.starts_with("✘ configuration:"), "{stdout}");
    std::fs::remove_dir_all(dir).ok();
}

/// A server that does not listen is said with the system's own reason behind ours,
/// once, and never with the password.
#[test]
fn a_server_that_does_not_listen_is_said_with_the_system_s_reason() {
    let dir = temp_dir("check-refused");
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let path = dir.join("config.toml");
    let text = format!(
        "[source]\nkind = \"sqlserver\"\nconnection_string = {{ env = \"CHECK_REFUSED_CS\" }}\nconnect_timeout_ms = 2000\n[sink]\nkind = \"stdout\"\n[checkpoint]\npath = \"{}\"\n",
        dir.join("cp.json").display()
    );
    std::fs::write(&path, text).expect("config");
    let output = support::tools::output_within(
        harness::command(&["check"], &path).env(
            "CHECK_REFUSED_CS",
            format!("Server=tcp:127.0.0.1,{port};User Id=u;Password=Secret_Pw1;Encrypt=false"),
        ),
        std::time::Duration::from_secs(60),
        "mssql-ces check",
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.contains("SQL Server:"))
        .unwrap_or_default();
    assert!(
        line.contains(&format!(
            "cannot connect to 127.0.0.1:{port}: Connection refused"
        )),
        "{stdout}"
    );
    assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
    assert!(!stdout.contains("Secret_Pw1"), "{stdout}");
    std::fs::remove_dir_all(dir).ok();
}

/// `source.databases = [patterns]` on a server whose connection string is in a
/// file of `dir`, into `sink` (TOML lines of `[sink]`), a file checkpoint per
/// database.
fn many_databases_config(dir: &Path, patterns: &str, sink: &str) -> Config {
    let secret = dir.join("cs");
    std::fs::write(
        &secret,
        "Server=tcp:sql,1433;Database=Shop1;User Id=u;Password=p",
    )
    .expect("secret");
    let text = format!(
        "[source]\nkind = \"sqlserver\"\ndatabases = [{patterns}]\nconnection_string = {{ file = \"{secret}\" }}\n[sink]\n{sink}\n[checkpoint]\npath = \"{cp}\"\n",
        secret = secret.display(),
        cp = dir.join("cp-{db}.json").display()
    );
    load(dir, "config.toml", &text)
}

/// `check` of many databases on the simulated `server`, each database its simulator.
async fn check_server(config: &Config, server: &cdc_sim::server::SimServer) -> Report {
    mssql_ces::commands::check::check_many(config, &mut server.clone(), |own| {
        let name = own
            .source
            .database
            .clone()
            .expect("one database's configuration");
        Ok(server.database(&name).expect("a simulated database"))
    })
    .await
}

/// `check` with `source.databases`: which databases match, a named one that is
/// missing, each matched database's own findings (named `<db>: …`), and the
/// destination once.
#[tokio::test]
async fn many_databases_are_checked_each_by_name() {
    use cdc_sim::server::SimServer;
    let dir = temp_dir("check-many");
    let config = many_databases_config(&dir, "\"Shop*\", \"Billing\"", "kind = \"stdout\"");
    let server = SimServer::default();
    server.add("Shop1", database());
    server.add("Shop2", database());
    server.add("Other", database());
    let report = check_server(&config, &server).await;
    let databases = expect(&report, "databases", Status::Pass);
    assert_eq!(databases.detail, "2 matched: Shop1, Shop2");
    // On Azure SQL Database, which has no cross-database queries: refused, with
    // what to do instead.
    server.set_engine_edition(5);
    let refused = check_server(&config, &server).await;
    let databases = expect(&refused, "databases", Status::Fail);
    assert!(
        databases.detail.contains("Azure SQL Database")
            && databases.detail.contains("source.databases"),
        "{databases:?}"
    );
    server.set_engine_edition(0);
    let missing = expect(&report, "database Billing", Status::Fail);
    assert!(
        missing.detail.contains("not CDC-enabled"),
        "{}",
        missing.detail
    );
    for name in ["Shop1", "Shop2"] {
        expect(&report, &format!("{name}: table dbo.Orders"), Status::Pass);
        expect(
            &report,
            &format!("{name}: checkpoint: writable"),
            Status::Pass,
        );
    }
    assert!(
        report.get("Other: table dbo.Orders").is_none(),
        "{}",
        report.to_text()
    );
    assert_eq!(
        report
            .findings
            .iter()
            .filter(|f| f.check == "destination")
            .count(),
        1,
        "{}",
        report.to_text()
    );
    std::fs::remove_dir_all(dir).ok();
}

/// A database this server's replica cannot read (an availability group secondary
/// that allows no connections, or only read-intent ones) is what `run` skips and
/// asks again with backoff: `check` says it is skipped, with the fix, as a warning
/// (not a failure), and checks nothing more of it; the other databases are checked
/// as usual.
#[tokio::test]
async fn a_database_this_replica_cannot_read_is_reported_skipped_not_failed() {
    use cdc_sim::server::{Replica, SimServer};
    let dir = temp_dir("check-secondary");
    let config = many_databases_config(&dir, "\"Shop*\"", "kind = \"stdout\"");
    let server = SimServer::default();
    server.add("Shop1", database());
    server.add("Shop2", database());
    server.add("Shop3", database());
    server.set_replica("Shop2", Replica::NotReadable);
    server.set_replica("Shop3", Replica::ReadIntentOnly);
    let report = check_server(&config, &server).await;
    for name in ["Shop2", "Shop3"] {
        let skipped = expect(&report, &format!("{name}: probe"), Status::Warn);
        assert!(
            skipped
                .detail
                .starts_with("skipped: this replica cannot read it"),
            "{}",
            skipped.detail
        );
        assert!(
            skipped
                .fix
                .as_deref()
                .is_some_and(|f| f.contains("ALLOW_CONNECTIONS")),
            "{skipped:?}"
        );
        assert!(
            report.get(&format!("{name}: table dbo.Orders")).is_none(),
            "nothing more is checked of it: {}",
            report.to_text()
        );
    }
    expect(&report, "Shop1: table dbo.Orders", Status::Pass);
    assert!(
        report.findings.iter().all(|f| f.status != Status::Fail),
        "{}",
        report.to_text()
    );
    std::fs::remove_dir_all(dir).ok();
}

/// With `VIEW SERVER STATE` the availability-group views name the secondary that
/// allows no connections: `check` skips it without probing it (a warning naming
/// the replica), and the read-intent-only one is still found by the probe.
#[tokio::test]
async fn a_secondary_the_views_name_is_skipped_without_a_probe() {
    use cdc_sim::server::{Replica, SimServer};
    let dir = temp_dir("check-known-secondary");
    let config = many_databases_config(&dir, "\"Shop*\"", "kind = \"stdout\"");
    let server = SimServer::default();
    server.set_view_server_state(true);
    server.add("Shop1", database());
    server.add("Shop2", database());
    server.add("Shop3", database());
    server.set_replica("Shop2", Replica::NotReadable);
    server.set_replica("Shop3", Replica::ReadIntentOnly);
    let report = check_server(&config, &server).await;
    let skipped = expect(&report, "Shop2: replica", Status::Warn);
    assert!(
        skipped
            .detail
            .contains("secondary that allows no connections"),
        "{skipped:?}"
    );
    assert!(report.get("Shop2: probe").is_none(), "{}", report.to_text());
    expect(&report, "Shop3: probe", Status::Warn);
    expect(&report, "Shop1: table dbo.Orders", Status::Pass);
    // The chunk of Shop1 and Shop3, then Shop3 alone; asking Shop2 too would
    // have failed a third.
    assert_eq!(server.failed_queries(), 2, "no probe named Shop2");
    std::fs::remove_dir_all(dir).ok();
}

/// `fleet.group_id`: `check` looks the control topic up on the sink's brokers and
/// says how many slots the members share (or that the first member creates it).
/// The synthetic server's databases are checked each by name.
#[tokio::test]
async fn a_fleet_s_control_topic_is_checked_on_the_sink_s_brokers() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    cluster.create_topic("ces", 2, 1).expect("topic");
    let dir = temp_dir("check-fleet");
    let text = |bootstrap: &str| {
        format!(
            "[source]\nkind = \"synthetic\"\ndatabases = [\"tenant*\"]\n[source.synthetic]\ndatabases = 3\n\
             [sink]\n{}\nexactly_once = true\n[checkpoint]\nstore = \"kafka\"\n[fleet]\ngroup_id = \"g\"\nslots = 12\n",
            kafka_sink(bootstrap, "ces")
        )
    };
    let config = load(&dir, "fleet.toml", &text(&bootstrap));
    let report = mssql_ces::commands::check::check(&config).await;
    let databases = expect(&report, "databases", Status::Pass);
    assert!(databases.detail.starts_with("3 matched"), "{databases:?}");
    expect(
        &report,
        "tenant002: CDC on database tenant002",
        Status::Pass,
    );
    let fleet = expect(&report, "fleet", Status::Pass);
    assert!(
        fleet
            .detail
            .contains("mssql-ces-fleet.g does not exist yet")
            && fleet.detail.contains("12 slots"),
        "{fleet:?}"
    );
    // The databases share the checkpoint topic: its retention is asked once (a
    // broker that never answers it, as MockCluster and Event Hubs, costs one
    // check.timeout_ms, not one a database).
    let kept: Vec<_> = report
        .findings
        .iter()
        .filter(|f| f.check.ends_with("checkpoint: kept"))
        .collect();
    assert_eq!(kept.len(), 1, "{}", report.to_text());
    assert_eq!(
        kept[0].check, "checkpoint: kept",
        "not a database's own finding"
    );
    assert_eq!(
        kept[0].status,
        Status::Warn,
        "MockCluster does not describe topics"
    );
    cluster
        .create_topic("mssql-ces-fleet.g", 7, 1)
        .expect("control topic");
    let report = mssql_ces::commands::check::check(&config).await;
    let fleet = expect(&report, "fleet", Status::Pass);
    assert!(
        fleet.detail.contains("has 7 slots for 3 databases"),
        "{fleet:?}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Many databases into per-database topics: every database's topics are checked,
/// not the first one's alone, and a database whose every check passes is one line.
#[tokio::test]
async fn many_databases_have_every_topic_checked_and_passing_ones_summarised() {
    use cdc_sim::server::SimServer;
    let cluster = MockCluster::new(1).expect("mock cluster");
    let bootstrap = cluster.bootstrap_servers();
    for n in 1..=4 {
        for table in ["Customers", "Orders"] {
            cluster
                .create_topic(&format!("Shop{n}.dbo.{table}"), 1, 1)
                .expect("topic");
        }
    }
    let dir = temp_dir("check-many-topics");
    let config = many_databases_config(
        &dir,
        "\"Shop*\"",
        &kafka_sink(&bootstrap, "{db}.{schema}.{tbl}"),
    );
    let server = SimServer::default();
    for n in 1..=5 {
        server.add(&format!("Shop{n}"), database_named(&format!("Shop{n}")));
    }
    let report = check_server(&config, &server).await;
    let text = report.to_text();
    // Shop5's topics were not created: found, though Shop1 is the first database.
    expect(&report, "topic Shop5.dbo.Orders", Status::Fail);
    expect(&report, "topic Shop5.dbo.Customers", Status::Fail);
    expect(&report, "topic Shop3.dbo.Orders", Status::Skip);
    // Five databases whose own checks pass: a line each.
    for n in 1..=5 {
        let line = expect(&report, &format!("Shop{n}"), Status::Pass);
        assert!(
            line.detail.starts_with("all ")
                && line.detail.ends_with("checks passed; 2 tables streamed"),
            "{line:?}"
        );
        assert!(
            report.get(&format!("Shop{n}: table dbo.Orders")).is_none(),
            "{text}"
        );
    }
    assert!(text.lines().count() < 30, "{text}");
    std::fs::remove_dir_all(dir).ok();
}

/// CDC enabled on the table checkpoint store's own table: a warning with the
/// statement that disables it; the table is not among those streamed.
#[tokio::test]
async fn cdc_on_the_checkpoint_table_is_a_warning_with_the_fix() {
    let sim = database();
    sim.create_table(
        "dbo",
        "mssql_ces_checkpoint",
        vec![SimColumn::new(
            "stream_name",
            SqlType::NVarChar(Length::Bounded(200)),
        )],
        &["stream_name"],
    );
    sim.enable_table("dbo.mssql_ces_checkpoint", None)
        .expect("enable");
    let dir = temp_dir("check-own-table");
    let report = run(&stdout_config(&dir), &sim).await;
    let own = expect(&report, "table dbo.mssql_ces_checkpoint", Status::Warn);
    assert!(
        own.fix
            .as_deref()
            .is_some_and(|f| f.contains("sys.sp_cdc_disable_table")),
        "{own:?}"
    );
    assert!(report.passed(), "{}", report.to_text());
    expect(&report, "table dbo.Orders", Status::Pass);
    std::fs::remove_dir_all(dir).ok();
}

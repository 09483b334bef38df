//! Commit times against the server's time zone: daylight-saving changes, the hour the
//! clocks repeat, restarts inside it, loaded rows, and servers that cannot name their
//! zone. The simulator's server computes offsets as SQL Server's `AT TIME ZONE`
//! does (a local time in the repeated hour gets the offset before the change,
//! Learn: *AT TIME ZONE (Transact-SQL)*); its clock can be set to an instant, so a
//! commit can fall in the second occurrence of the repeated hour.

use std::time::Duration;

use crate::common::drain;
use cdc_sim::CdcSimulator;
use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeZone, Utc};
use mssql_ces::event::{Change, Value};
use mssql_ces::position::Position;
use mssql_ces::source::SourceError;
use mssql_ces::source::initial_load::SnapshotMode;
use mssql_ces::source::poller::{Poller, PollerConfig};
use mssql_ces::source::timezone::TimeZoneSetting;

fn config() -> PollerConfig {
    PollerConfig {
        catalog_refresh: Duration::from_secs(3600),
        unreadable_grace: Duration::ZERO,
        ..PollerConfig::default()
    }
}

/// `dbo.T (Id int PRIMARY KEY, Name nvarchar(50))`, enabled, on a server in Berlin
/// that reports `reported_offset` minutes at startup.
fn berlin(reported_offset: i32) -> CdcSimulator {
    let sim = crate::common::shop_with_t(reported_offset);
    sim.set_time_zone(chrono_tz::Europe::Berlin);
    sim.enable_table("dbo.T", None).unwrap();
    sim
}

fn insert(sim: &CdcSimulator, id: i32) {
    sim.transaction()
        .insert("dbo.T", vec![Value::Int(id), Value::Text(format!("r{id}"))])
        .commit()
        .unwrap();
}

fn local(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> NaiveDateTime {
    NaiveDate::from_ymd_opt(y, mo, d)
        .unwrap()
        .and_hms_opt(h, mi, 0)
        .unwrap()
}

fn utc(h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 10, 25, h, mi, s).unwrap()
}

/// Each event's `time`, to the second.
fn times(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| c.commit_time.format("%m-%d %H:%M:%S").to_string())
        .collect()
}

#[tokio::test]
async fn commit_times_follow_the_servers_zone_across_daylight_saving() {
    let sim = berlin(120);
    // Summer time (+02:00); the server reports +120 at startup.
    sim.set_local_time(local(2026, 10, 24, 12, 0));
    insert(&sim, 1);
    let mut poller = Poller::new(sim.clone(), config(), None);
    let first = drain(&mut poller).await.unwrap();
    // The clocks go back on 2026-10-25 at 03:00; winter time is +01:00.
    sim.set_local_time(local(2026, 10, 26, 12, 0));
    insert(&sim, 2);
    let second = drain(&mut poller).await.unwrap();
    assert_eq!(times(&first), ["10-24 10:00:00"]);
    assert_eq!(
        times(&second),
        ["10-26 11:00:00"],
        "winter offset, not the startup one"
    );
    // A restart re-reads both with the same times.
    let mut again = Poller::new(sim, config(), None);
    let reread = drain(&mut again).await.unwrap();
    assert_eq!(times(&reread), ["10-24 10:00:00", "10-26 11:00:00"]);
}

/// Commits on 2026-10-25 around Berlin's change at 01:00 UTC (03:00 summer time back
/// to 02:00 winter time), as instants; their local times repeat 02:10–02:59.
const COMMITS: [(u32, u32, u32); 6] = [
    (0, 10, 0),  // 02:10 summer time
    (0, 50, 0),  // 02:50 summer time
    (0, 59, 50), // 02:59:50 summer time
    (1, 10, 0),  // 02:10 winter time: the same local time as the first
    (1, 40, 0),  // 02:40 winter time
    (2, 5, 0),   // 03:05 winter time
];

fn expected() -> Vec<String> {
    COMMITS
        .iter()
        .map(|&(h, m, s)| utc(h, m, s).format("10-25 %H:%M:%S").to_string())
        .collect()
}

/// Writes the commits from `from` on, one transaction each, at their instants.
fn write_commits(sim: &CdcSimulator, from: usize, to: usize) {
    for (i, &(h, m, s)) in COMMITS.iter().enumerate().take(to).skip(from) {
        // The simulator adds a few milliseconds per transaction; start just before.
        sim.set_utc_time(utc(h, m, s) - chrono::TimeDelta::milliseconds(7));
        insert(sim, i32::try_from(i).unwrap());
    }
}

#[tokio::test]
async fn the_repeated_hour_is_read_in_commit_order_also_after_a_restart_inside_it() {
    let sim = berlin(60);
    write_commits(&sim, 0, 4);
    // The server's clock is in the second occurrence: its UTC time did not go back.
    let source = sim.clone();
    use mssql_ces::source::SourceClock as _;
    assert_eq!(source.clock(), Some(utc(1, 10, 0)));
    let mut poller = Poller::new(sim.clone(), config(), None);
    let before = drain(&mut poller).await.unwrap();
    // The position after the fourth commit: inside the second occurrence.
    let checkpoint = poller.position().clone();
    write_commits(&sim, 4, 6);
    let after = drain(&mut poller).await.unwrap();
    let all: Vec<String> = times(&before).into_iter().chain(times(&after)).collect();
    assert_eq!(
        all,
        expected(),
        "02:10 and 02:40 in winter time are an hour after their summer readings"
    );
    // A restart from the checkpoint (through its JSON, as a store keeps it) reads
    // the later commits the same way: 02:40 is still the second occurrence.
    let saved: Position =
        serde_json::from_str(&serde_json::to_string(&checkpoint).unwrap()).unwrap();
    assert!(saved.commit_clock_ns.is_some(), "{saved:?}");
    let mut restarted = Poller::new(sim.clone(), config(), Some(saved.clone()));
    assert_eq!(
        times(&drain(&mut restarted).await.unwrap()),
        expected()[4..]
    );
    // The saved clock is what tells it: without it 02:40 reads as summer time.
    let without = Position {
        commit_clock_ns: None,
        ..saved
    };
    let mut forgetful = Poller::new(sim.clone(), config(), Some(without));
    assert_eq!(
        times(&drain(&mut forgetful).await.unwrap())[0],
        "10-25 00:40:00"
    );
    // And a stream read from the start gives every event the same time.
    let mut fresh = Poller::new(sim, config(), None);
    assert_eq!(times(&drain(&mut fresh).await.unwrap()), expected());
}

#[tokio::test]
async fn a_configured_zone_reads_the_repeated_hour_the_same_way_on_a_server_without_one() {
    // SQL Server 2016–2019 cannot name its zone; source.time_zone names it.
    let sim = berlin(60);
    write_commits(&sim, 0, COMMITS.len());
    sim.forget_time_zone();
    let config = PollerConfig {
        time_zone: TimeZoneSetting::parse("Europe/Berlin").unwrap(),
        ..config()
    };
    let mut poller = Poller::new(sim, config, None);
    assert_eq!(times(&drain(&mut poller).await.unwrap()), expected());
}

#[tokio::test]
async fn server_on_a_server_that_cannot_name_its_zone_is_refused_naming_the_setting() {
    let sim = berlin(60);
    sim.forget_time_zone();
    insert(&sim, 1);
    let mut poller = Poller::new(sim.clone(), config(), None);
    let err = drain(&mut poller).await.unwrap_err();
    assert!(matches!(err, SourceError::UnknownServerZone(_)), "{err:?}");
    assert!(!err.is_transient());
    let text = err.to_string();
    assert!(
        text.contains("source.time_zone") && text.contains("\"+01:00\""),
        "{text}"
    );
    // With the zone set, the same server streams.
    let config = PollerConfig {
        time_zone: TimeZoneSetting::parse("Europe/Berlin").unwrap(),
        ..config()
    };
    let mut poller = Poller::new(sim, config, None);
    assert_eq!(drain(&mut poller).await.unwrap().len(), 1);
}

#[tokio::test]
async fn loaded_rows_carry_the_offset_of_the_load_commit_not_the_startup_one() {
    // The server reports winter time (+01:00) at startup; the load's commit was in
    // summer (+02:00).
    let sim = berlin(60);
    sim.set_local_time(local(2026, 8, 7, 16, 25));
    insert(&sim, 1);
    let config = PollerConfig {
        snapshot: SnapshotMode::Initial,
        ..config()
    };
    let mut poller = Poller::new(sim, config, None);
    let loaded = drain(&mut poller).await.unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(times(&loaded), ["08-07 14:25:00"]);
    // Every instance is complete through the load's LSN: the clock has read it.
    assert_eq!(
        poller.position().commit_clock_ns,
        loaded[0].commit_time.timestamp_nanos_opt()
    );
}

/// A DDL's time in a schema-change event is read in the offset in force when it
/// ran, as the server computes it, not the one the server reported at startup: a
/// column added after the clocks went back is an hour later in UTC than the
/// startup offset would make it, and the event's DDL time is the same after a
/// restart on the other side of the change.
#[tokio::test]
async fn ddl_times_follow_the_servers_zone_across_daylight_saving() {
    use cdc_sim::SimColumn;
    use mssql_ces::event::value::{Length, SqlType};
    let sim = berlin(120);
    // Summer time (+02:00); the server reports +120 at startup.
    sim.set_local_time(local(2026, 10, 24, 12, 0));
    insert(&sim, 1);
    let config = PollerConfig {
        schema_changes: true,
        catalog_refresh: Duration::ZERO,
        ..config()
    };
    let mut poller = Poller::new(sim.clone(), config.clone(), None);
    crate::common::drain_items(&mut poller).await.unwrap();
    // Winter time (+01:00): 12:00 local is 11:00 UTC.
    sim.set_local_time(local(2026, 10, 26, 12, 0));
    sim.add_column(
        "dbo.T",
        SimColumn::new("Email", SqlType::NVarChar(Length::Bounded(80))),
        Value::Null,
    )
    .unwrap();
    sim.enable_table("dbo.T", Some("dbo_T_v2")).unwrap();
    sim.transaction()
        .insert(
            "dbo.T",
            vec![
                Value::Int(2),
                Value::Text("r2".into()),
                Value::Text("e".into()),
            ],
        )
        .commit()
        .unwrap();
    let ddl_time = |items: &[crate::common::Item]| {
        items
            .iter()
            .find_map(|i| match i {
                crate::common::Item::Schema(s) if !s.ddl.is_empty() => Some(s.ddl[0].time),
                _ => None,
            })
            .expect("the added column's schema-change event, with its DDL")
    };
    let items = crate::common::drain_items(&mut poller).await.unwrap();
    let expected = Utc.with_ymd_and_hms(2026, 10, 26, 11, 0, 0).unwrap();
    assert_eq!(ddl_time(&items), expected, "the offset in force at the DDL");
    // A new run started in winter reads the same DDL the same way.
    let fresh = Poller::new(sim.clone(), config, None);
    let mut fresh = fresh;
    let again = crate::common::drain_items(&mut fresh).await.unwrap();
    assert_eq!(ddl_time(&again), expected);
}

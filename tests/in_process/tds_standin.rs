//! The SQL Server source through the real driver (tiberius) and real TDS bytes,
//! against the TDS-speaking stand-in of `support::tds` — a test double following
//! [MS-TDS] on loopback, not SQL Server: login, queries as sent, result decoding,
//! server errors, dropped and hung connections.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mssql_ces::lsn::Lsn;
use mssql_ces::mssql::SqlErrorKind;
use mssql_ces::source::queries;
use mssql_ces::source::sqlserver::{ConnectionString, SqlServerConfig, SqlServerSource};
use mssql_ces::source::{CaptureDdl, CdcReads, ChangeSource, FactReads, SourceError, TableReads};
use support::tds::{Cell, Column, ColumnType, Handler, Param, Reply, Request, ResultSet, StandIn};

const USER: &str = "mssql_ces";
const PASSWORD: &str = "Ces_Poller_Passw0rd!";

fn source(standin: &StandIn, password: &str, query_timeout: Duration) -> SqlServerSource {
    SqlServerSource::new(SqlServerConfig {
        connection_string: ConnectionString::new(standin.connection_string(USER, password)),
        trust_server_certificate: false,
        encrypt: false,
        connect_timeout: Duration::from_secs(5),
        query_timeout,
    })
}

fn lsn(n: u16) -> Lsn {
    Lsn::from_parts(0xB1, 0x8A8, n)
}

/// `sys.fn_cdc_get_max_lsn()` and the catalog fingerprint, typed as SQL Server types
/// them: binary(10), int (CHECKSUM_AGG), bigint (COUNT_BIG).
fn max_lsn_rows(max: Option<Lsn>) -> Reply {
    Reply::Rows(vec![ResultSet {
        columns: vec![
            Column::new("max_lsn", ColumnType::VarBinary(Some(10))),
            Column::new("tables_checksum", ColumnType::Int(4)),
            Column::new("tables_count", ColumnType::Int(8)),
            Column::new("ddl_count", ColumnType::Int(8)),
        ],
        rows: vec![vec![
            max.map_or(Cell::Null, |l| Cell::Bytes(l.to_vec())),
            Cell::Int(-7),
            Cell::Int(3),
            Cell::Int(1),
        ]],
    }])
}

/// Polls until idle and encodes every change as JSON, with `guid` as the stream GUID
/// and `max_kb` as the message size limit (the default without); returns the
/// messages and how many transient errors were polled past. Any other error ends it.
async fn drain<S: ChangeSource>(
    poller: &mut mssql_ces::source::poller::Poller<S>,
    guid: uuid::Uuid,
    max_kb: Option<u32>,
) -> Result<(Vec<Vec<u8>>, usize), SourceError> {
    use mssql_ces::event::{Encoder, EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit};
    use mssql_ces::source::poller::PollOutcome;
    let max_message_size = match max_kb {
        Some(kb) => MessageSizeLimit::from_kb(kb).expect("a legal max_message_size_kb"),
        None => MessageSizeLimit::default(),
    };
    let encoder = Encoder::new(EncoderOptions {
        stream_guid: guid,
        encoding: Encoding::Json,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size,
    });
    let (mut out, mut retries) = (Vec::new(), 0);
    for _ in 0..10_000 {
        match poller.poll().await {
            Ok(PollOutcome::Batch(batch)) => {
                for change in &batch.changes {
                    let event = encoder.encode(change).expect("encodes");
                    out.extend(event.messages.into_iter().map(|m| m.bytes));
                }
            }
            Ok(PollOutcome::Idle) => return Ok((out, retries)),
            Err(e) if e.is_transient() => retries += 1,
            Err(e) => return Err(e),
        }
    }
    panic!("never idle");
}

/// [`drain`] where no error of any kind is expected.
async fn drain_clean<S: ChangeSource>(
    poller: &mut mssql_ces::source::poller::Poller<S>,
    guid: uuid::Uuid,
) -> Vec<Vec<u8>> {
    let (out, retries) = drain(poller, guid, None).await.expect("poll");
    assert_eq!(retries, 0, "transient errors where none were expected");
    out
}

fn handler(f: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Handler {
    Arc::new(f)
}

#[tokio::test]
async fn the_poller_queries_reach_the_wire_and_their_answers_decode() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<Request>::new()));
    let log = Arc::clone(&seen);
    let standin = StandIn::start(
        USER,
        PASSWORD,
        handler(move |request| {
            log.lock().unwrap().push(request.clone());
            if request.sql == queries::MAX_LSN {
                max_lsn_rows(Some(lsn(7)))
            } else if request.sql == queries::MIN_LSN {
                Reply::Rows(vec![ResultSet {
                    columns: vec![Column::new("min_lsn", ColumnType::VarBinary(Some(10)))],
                    rows: vec![vec![Cell::Bytes(lsn(2).to_vec())]],
                }])
            } else if request.sql == queries::LSN_TIME {
                Reply::Rows(vec![ResultSet {
                    columns: vec![Column::new("commit_time", ColumnType::DateTime)],
                    // 2026-08-07 16:25:00.890: days since 1900, then 1/300 s ticks.
                    rows: vec![vec![Cell::DateTime {
                        days: 46_239,
                        ticks: (16 * 3600 + 25 * 60) * 300 + 267,
                    }]],
                }])
            } else {
                support::tds::unknown(request)
            }
        }),
    )
    .await
    .unwrap();
    let mut source = source(&standin, PASSWORD, Duration::from_secs(5));
    let max = source.max_lsn().await.unwrap();
    assert_eq!(max.lsn, Some(lsn(7)));
    let min = source.min_lsn("dbo_Orders").await.unwrap();
    assert_eq!(min, Some(lsn(2)));
    let time = source.lsn_time(lsn(7)).await.unwrap().unwrap();
    assert_eq!(time.local.to_string(), "2026-08-07 16:25:00.890");
    assert_eq!(time.offsets, None, "no zone named: no offsets asked for");
    let requests = seen.lock().unwrap().clone();
    // The parameters as the driver typed them: the capture instance as text, the LSN
    // as binary.
    assert_eq!(requests[1].params, vec![Param::Text("dbo_Orders".into())]);
    assert_eq!(requests[2].params, vec![Param::Bytes(lsn(7).to_vec())]);
    // A query the stand-in does not know is an error that names it.
    let error = source.ddl_history("dbo_Orders").await.unwrap_err();
    assert!(
        error.to_string().contains("no answer for the query"),
        "{error}"
    );
}

/// `MultiSubnetFailover=True` (a multi-subnet listener): the driver gets the
/// connection the parallel attempt opened, to whichever address answered.
#[tokio::test]
async fn multi_subnet_failover_connects_through_the_name_to_the_address_that_answers() {
    let standin = StandIn::start(
        USER,
        PASSWORD,
        handler(|request| {
            if request.sql == queries::MAX_LSN {
                max_lsn_rows(Some(lsn(7)))
            } else {
                support::tds::unknown(request)
            }
        }),
    )
    .await
    .unwrap();
    let mut source = SqlServerSource::new(SqlServerConfig {
        connection_string: ConnectionString::new(format!(
            "Server=tcp:localhost,{};Database=CesDemo;User Id={USER};Password={PASSWORD};Encrypt=false;MultiSubnetFailover=True",
            standin.address.port()
        )),
        trust_server_certificate: false,
        encrypt: false,
        connect_timeout: Duration::from_secs(5),
        query_timeout: Duration::from_secs(5),
    });
    assert_eq!(source.max_lsn().await.unwrap().lsn, Some(lsn(7)));
}

#[tokio::test]
async fn a_wrong_password_is_the_login_error_that_names_the_setting() {
    let standin = StandIn::start(USER, PASSWORD, handler(support::tds::unknown))
        .await
        .unwrap();
    let mut source = source(&standin, "not the password", Duration::from_secs(5));
    let error = source.max_lsn().await.unwrap_err();
    assert!(
        matches!(error, SourceError::Sql(SqlErrorKind::LoginFailed)),
        "{error:?}"
    );
    assert!(error.to_string().contains("source.connection_string"));
    assert!(
        !error.to_string().contains("not the password"),
        "no secret in errors"
    );
}

#[tokio::test]
async fn server_errors_are_classified_as_documented() {
    let number = Arc::new(AtomicUsize::new(0));
    let current = Arc::clone(&number);
    let standin = StandIn::start(
        USER,
        PASSWORD,
        handler(move |request| {
            if request.sql == queries::MAX_LSN {
                return max_lsn_rows(Some(lsn(1)));
            }
            Reply::Error {
                number: current.load(Ordering::SeqCst) as u32,
                class: 16,
                message: "the stand-in's error".into(),
            }
        }),
    )
    .await
    .unwrap();
    let mut source = source(&standin, PASSWORD, Duration::from_secs(5));
    // Connected once, so 4060 (database unavailable) is a failover, not a typo.
    source.max_lsn().await.unwrap();
    for (code, expect) in [
        (1205, "transient"),
        (40613, "transient"),
        (4060, "transient"),
        // Failover, patching and availability-group errors EF Core retries.
        (18401, "transient"),
        (3947, "transient"),
        (921, "transient"),
        (978, "transient"),
        (229, "permission"),
        (916, "permission"),
        (2627, "definite"),
    ] {
        number.store(code, Ordering::SeqCst);
        let error = source.min_lsn("dbo_Orders").await.unwrap_err();
        let kind = match &error {
            SourceError::Sql(SqlErrorKind::Transient { .. }) => "transient",
            SourceError::Sql(SqlErrorKind::PermissionDenied { .. }) => "permission",
            SourceError::Sql(SqlErrorKind::Definite { .. }) => "definite",
            other => panic!("{code}: {other:?}"),
        };
        assert_eq!(kind, expect, "error {code}: {error}");
    }
    // 208 on a change table means the catalog moved: read it again, then retry.
    number.store(208, Ordering::SeqCst);
    let probe = mssql_ces::source::Probe {
        capture_instance: "dbo_Orders".into(),
        after: lsn(1),
    };
    let error = source.probe(&[probe], lsn(9)).await.unwrap_err();
    assert!(
        matches!(error, SourceError::CatalogChanged { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_dropped_or_hung_connection_is_transient_and_the_next_query_reconnects() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let standin = StandIn::start(
        USER,
        PASSWORD,
        handler(move |request| {
            if request.sql != queries::MAX_LSN {
                return support::tds::unknown(request);
            }
            match counter.fetch_add(1, Ordering::SeqCst) {
                0 => Reply::Drop,
                1 => Reply::DropMidResult(match max_lsn_rows(Some(lsn(3))) {
                    Reply::Rows(sets) => sets,
                    _ => unreachable!(),
                }),
                2 => Reply::Hang,
                3 => Reply::Slow(
                    Duration::from_millis(100),
                    Box::new(max_lsn_rows(Some(lsn(4)))),
                ),
                _ => max_lsn_rows(Some(lsn(5))),
            }
        }),
    )
    .await
    .unwrap();
    let mut source = source(&standin, PASSWORD, Duration::from_millis(700));
    let dropped = source.max_lsn().await.unwrap_err();
    assert!(dropped.is_transient(), "{dropped:?}");
    assert!(
        !dropped.to_string().contains("query_timeout_ms"),
        "not a time-out: {dropped}"
    );
    let cut = source.max_lsn().await.unwrap_err();
    assert!(cut.is_transient(), "{cut:?}");
    assert!(
        !cut.to_string().contains("query_timeout_ms"),
        "not a time-out: {cut}"
    );
    let hung = source.max_lsn().await.unwrap_err();
    assert!(hung.is_transient(), "{hung:?}");
    assert!(
        hung.to_string().contains("source.query_timeout_ms"),
        "{hung}"
    );
    // Slow but within the time-out, on a new connection.
    assert_eq!(source.max_lsn().await.unwrap().lsn, Some(lsn(4)));
    assert_eq!(source.max_lsn().await.unwrap().lsn, Some(lsn(5)));
}

mod through_the_wire {
    use super::*;
    use cdc_sim::{CdcSimulator, SimColumn};
    use chrono::{FixedOffset, NaiveDate, NaiveTime, TimeZone};
    use mssql_ces::event::Value;
    use mssql_ces::event::value::{Length, SqlType};
    use mssql_ces::source::initial_load::SnapshotMode;
    use mssql_ces::source::poller::{Poller, PollerConfig};

    const GUID: uuid::Uuid = uuid::Uuid::from_u128(0x1bf2_756a_c15f_4d2e_a2d5_7d3f_9dbf_85b0);

    fn every_type() -> Vec<SimColumn> {
        let t = |name: &str, sql_type| SimColumn::new(name, sql_type);
        vec![
            t("id", SqlType::Int),
            t("c_bit", SqlType::Bit),
            t("c_tinyint", SqlType::TinyInt),
            t("c_smallint", SqlType::SmallInt),
            t("c_bigint", SqlType::BigInt),
            t(
                "c_decimal",
                SqlType::Decimal {
                    precision: 18,
                    scale: 2,
                },
            ),
            t(
                "c_numeric38",
                SqlType::Numeric {
                    precision: 38,
                    scale: 10,
                },
            ),
            t("c_money", SqlType::Money),
            t("c_smallmoney", SqlType::SmallMoney),
            t("c_float", SqlType::Float),
            t("c_real", SqlType::Real),
            t("c_date", SqlType::Date),
            t("c_time0", SqlType::Time { scale: 0 }),
            t("c_time7", SqlType::Time { scale: 7 }),
            t("c_datetime", SqlType::DateTime),
            t("c_smalldatetime", SqlType::SmallDateTime),
            t("c_datetime2_3", SqlType::DateTime2 { scale: 3 }),
            t("c_datetime2_7", SqlType::DateTime2 { scale: 7 }),
            t("c_dto", SqlType::DateTimeOffset { scale: 7 }),
            t("c_guid", SqlType::UniqueIdentifier),
            t("c_char", SqlType::Char(Length::Bounded(10))),
            t("c_varchar", SqlType::VarChar(Length::Bounded(50))),
            t("c_nchar", SqlType::NChar(Length::Bounded(5))),
            t("c_nvarchar", SqlType::NVarChar(Length::Bounded(50))),
            t("c_nvmax", SqlType::NVarChar(Length::Max)),
            t("c_binary", SqlType::Binary(Length::Bounded(4))),
            t("c_varbinary", SqlType::VarBinary(Length::Bounded(16))),
            t("c_vbmax", SqlType::VarBinary(Length::Max)),
            SimColumn::excluded("c_geo", "geography"),
            // Left out by `cdc.captured_columns.is_computed`, read through the wire.
            SimColumn::computed("c_total", SqlType::Int),
        ]
    }

    fn row(id: i32, text: &str) -> Vec<Value> {
        let day = NaiveDate::from_ymd_opt(2026, 8, 7).unwrap();
        let at = |h, m, s, nano| day.and_hms_nano_opt(h, m, s, nano).unwrap();
        vec![
            Value::Int(id),
            Value::Bit(id % 2 == 0),
            Value::TinyInt(255),
            Value::SmallInt(-32768),
            Value::BigInt(i64::MIN + 1),
            Value::Decimal {
                unscaled: -12_345_678_901_234_567,
                scale: 2,
            },
            Value::Decimal {
                unscaled: 12_345_678_901_234_567_890_123_456_789_012_345_678,
                scale: 10,
            },
            Value::Decimal {
                unscaled: -9_223_372_036_854_775_808,
                scale: 4,
            },
            Value::Decimal {
                unscaled: 2_147_483_647,
                scale: 4,
            },
            Value::Float(0.1 + 0.2),
            Value::Real(3.402_823_5e38),
            Value::Date(NaiveDate::from_ymd_opt(1, 1, 1).unwrap()),
            Value::Time {
                value: NaiveTime::from_hms_opt(23, 59, 59).unwrap(),
                scale: 0,
            },
            Value::Time {
                value: NaiveTime::from_hms_nano_opt(16, 25, 0, 883_333_300).unwrap(),
                scale: 7,
            },
            Value::DateTime(at(16, 45, 1, 3_000_000)),
            Value::SmallDateTime(at(16, 45, 0, 0)),
            Value::DateTime2 {
                value: at(16, 25, 0, 883_000_000),
                scale: 3,
            },
            Value::DateTime2 {
                value: NaiveDate::from_ymd_opt(9999, 12, 31)
                    .unwrap()
                    .and_hms_nano_opt(23, 59, 59, 999_999_900)
                    .unwrap(),
                scale: 7,
            },
            Value::DateTimeOffset {
                value: FixedOffset::east_opt(-(5 * 3600 + 30 * 60))
                    .unwrap()
                    .from_local_datetime(&at(0, 10, 0, 100))
                    .unwrap(),
                scale: 7,
            },
            Value::Guid(uuid::Uuid::parse_str("6F9619FF-8B86-D011-B42D-00C04FD430C8").unwrap()),
            Value::Text("pad       ".into()),
            Value::Text(format!("{text} – Zoë “quoted” \\ \u{1F600}")),
            Value::Text("ab   ".into()),
            Value::Text("日本語 text".into()),
            Value::Text("x".repeat(9000)),
            Value::Binary(vec![0, 0xFF, 0x10, 0]),
            Value::Binary(vec![0xDE, 0xAD]),
            Value::Binary((0..=255).cycle().take(10_000).collect()),
            Value::Null,
            Value::Int(7),
        ]
    }

    fn nulls(id: i32) -> Vec<Value> {
        let mut values = vec![Value::Int(id)];
        values.extend(std::iter::repeat_n(Value::Null, every_type().len() - 1));
        values
    }

    async fn events<S: ChangeSource>(poller: &mut Poller<S>) -> Vec<Vec<u8>> {
        drain_clean(poller, GUID).await
    }

    #[tokio::test]
    async fn every_type_reads_through_the_wire_to_the_same_events_as_from_the_simulator() {
        let sim = CdcSimulator::new("CesDemo", GUID, 120);
        sim.create_table("dbo", "every type", every_type(), &["id"]);
        sim.create_table(
            "sales",
            "heap",
            vec![SimColumn::new(
                "note",
                SqlType::NVarChar(Length::Bounded(20)),
            )],
            &[],
        );
        sim.transaction()
            .insert("dbo.every type", row(1, "loaded"))
            .insert("dbo.every type", nulls(2))
            .insert("sales.heap", vec![Value::Text("before CDC".into())])
            .commit()
            .unwrap();
        sim.enable_table("dbo.every type", None).unwrap();
        sim.enable_table("sales.heap", None).unwrap();
        let config = PollerConfig {
            snapshot: SnapshotMode::Initial,
            load_chunk: 1,
            page_size: 2,
            batch_size: 3,
            ..PollerConfig::default()
        };
        // Over TLS inside TDS, as the default `encrypt = true` connects.
        let tls = support::tds::self_signed_tls().expect("certificate");
        let standin =
            StandIn::start_tls(USER, PASSWORD, support::tds_cdc::handler(sim.clone()), tls)
                .await
                .unwrap();
        let mut direct = Poller::new(sim.clone(), config.clone(), None);
        let url = standin
            .connection_string(USER, PASSWORD)
            .replace(";Encrypt=false", "");
        let encrypted = SqlServerSource::new(SqlServerConfig {
            connection_string: ConnectionString::new(url),
            trust_server_certificate: true,
            encrypt: true,
            connect_timeout: Duration::from_secs(5),
            query_timeout: Duration::from_secs(10),
        });
        let mut wire = Poller::new(encrypted, config, None);
        // Both plan their load at the same LSN; the changes come after it.
        assert!(direct.plan_load().await.unwrap());
        assert!(wire.plan_load().await.unwrap());
        assert_eq!(direct.position(), wire.position());
        sim.transaction()
            .insert("dbo.every type", row(3, "inserted"))
            .update(
                "dbo.every type",
                vec![Value::Int(1)],
                vec![("c_nvarchar", Value::Text("changed".into()))],
            )
            .delete("dbo.every type", vec![Value::Int(2)])
            .insert("sales.heap", vec![Value::Text("after".into())])
            .commit()
            .unwrap();
        let expected = events(&mut direct).await;
        assert!(expected.len() >= 7, "{} messages", expected.len());
        let got = events(&mut wire).await;
        for (n, (got, expected)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(
                String::from_utf8_lossy(got),
                String::from_utf8_lossy(expected),
                "message {n}"
            );
        }
        assert_eq!(got.len(), expected.len());
    }

    /// `CesDemo` on a server at `utc_offset_minutes`, with `dbo.T (id int PRIMARY
    /// KEY)` enabled.
    fn int_table(utc_offset_minutes: i32) -> CdcSimulator {
        let sim = CdcSimulator::new("CesDemo", GUID, utc_offset_minutes);
        sim.create_table(
            "dbo",
            "T",
            vec![SimColumn::new("id", SqlType::Int)],
            &["id"],
        );
        sim.enable_table("dbo.T", None).unwrap();
        sim
    }

    /// On a server that names its zone, `cdc.ddl_history` is read with the offsets
    /// the zone gives each DDL's time (the zoned query), and they cross the wire as
    /// the simulator computes them.
    #[tokio::test]
    async fn ddl_history_carries_the_zones_offsets_through_the_wire() {
        let sim = int_table(60);
        sim.set_time_zone(chrono_tz::Europe::Berlin);
        sim.add_column("dbo.T", SimColumn::new("n", SqlType::Int), Value::Null)
            .unwrap();
        let standin = StandIn::start(USER, PASSWORD, support::tds_cdc::handler(sim.clone()))
            .await
            .unwrap();
        let mut wire = source(&standin, PASSWORD, Duration::from_secs(10));
        let mut direct = sim.clone();
        wire.catalog().await.unwrap();
        let over_wire = wire.ddl_history("dbo_T").await.unwrap();
        let from_sim = direct.ddl_history("dbo_T").await.unwrap();
        assert_eq!(over_wire.len(), 1);
        assert!(over_wire[0].offsets.is_some(), "{over_wire:?}");
        assert_eq!(over_wire, from_sim);
    }

    /// A column's default constraint text (`sys.default_constraints.definition`)
    /// crosses the wire as the simulator holds it; none where there is none.
    #[tokio::test]
    async fn column_defaults_read_the_same_through_the_wire() {
        let sim = CdcSimulator::new("CesDemo", GUID, 0);
        sim.create_table(
            "dbo",
            "T",
            vec![
                SimColumn::new("id", SqlType::Int),
                SimColumn::not_null("qty", SqlType::Int).with_default("((0))"),
                SimColumn::new("note", SqlType::NVarChar(Length::Bounded(20)))
                    .with_default("(N'it''s')"),
            ],
            &["id"],
        );
        sim.enable_table("dbo.T", None).unwrap();
        let standin = StandIn::start(USER, PASSWORD, support::tds_cdc::handler(sim.clone()))
            .await
            .unwrap();
        let mut wire = source(&standin, PASSWORD, Duration::from_secs(10));
        let mut direct = sim.clone();
        let over_wire = wire.catalog().await.unwrap().instances[0].columns.clone();
        let from_sim = direct.catalog().await.unwrap().instances[0].columns.clone();
        assert_eq!(over_wire, from_sim);
        let defaults: Vec<Option<&str>> = over_wire.iter().map(|c| c.default.as_deref()).collect();
        assert_eq!(defaults, [None, Some("((0))"), Some("(N'it''s')")]);
    }

    /// The options a capture instance was enabled with cross the wire as the
    /// simulator holds them (`cdc.change_tables.role_name` and the rest).
    #[tokio::test]
    async fn capture_options_read_the_same_through_the_wire() {
        let sim = int_table(0);
        sim.set_gating_role("dbo_T", Some("cdc_readers"));
        let standin = StandIn::start(USER, PASSWORD, support::tds_cdc::handler(sim.clone()))
            .await
            .unwrap();
        let mut wire = source(&standin, PASSWORD, Duration::from_secs(10));
        let mut direct = sim.clone();
        let over_wire = wire.catalog().await.unwrap().instances[0].options.clone();
        let from_sim = direct.catalog().await.unwrap().instances[0].options.clone();
        assert_eq!(over_wire, from_sim);
        assert_eq!(over_wire.role_name.as_deref(), Some("cdc_readers"));
        // An instance created through the wire (managed mode's statement) with every
        // option set reads back with them.
        let options = mssql_ces::source::CaptureOptions {
            role_name: Some("cdc_readers".into()),
            index_name: None,
            filegroup_name: Some("CDC".into()),
            supports_net_changes: true,
            allow_partition_switch: Some(false),
        };
        wire.enable_capture(&mssql_ces::source::EnableCapture {
            schema: "dbo".into(),
            table: "T".into(),
            capture_instance: "dbo_T_v2".into(),
            options: options.clone(),
            columns: Some(vec!["id".into()]),
        })
        .await
        .unwrap();
        let created = wire.catalog().await.unwrap().instances[1].clone();
        assert_eq!(created.name, "dbo_T_v2");
        assert_eq!(created.options, options);
    }

    /// Commits in the hour Berlin's clocks repeat, on a server that names its zone:
    /// the offsets `AT TIME ZONE` gives each row and an hour later cross the wire
    /// (the change query's two offset columns, the load's `LSN_TIME_ZONED`), and the
    /// second occurrence is read an hour after the first, as from the simulator.
    #[tokio::test]
    async fn the_repeated_hour_reads_the_same_through_the_wire() {
        let sim = int_table(60);
        sim.set_time_zone(chrono_tz::Europe::Berlin);
        let at = |h, m| chrono::Utc.with_ymd_and_hms(2026, 10, 25, h, m, 0).unwrap();
        sim.set_utc_time(at(0, 20));
        sim.transaction()
            .insert("dbo.T", vec![Value::Int(0)])
            .commit()
            .unwrap();
        let config = PollerConfig {
            snapshot: SnapshotMode::Initial,
            ..PollerConfig::default()
        };
        let standin = StandIn::start(USER, PASSWORD, support::tds_cdc::handler(sim.clone()))
            .await
            .unwrap();
        let wire = source(&standin, PASSWORD, Duration::from_secs(10));
        let mut wire = Poller::new(wire, config.clone(), None);
        let mut direct = Poller::new(sim.clone(), config, None);
        // Both load the first row at its commit (02:20 summer time)…
        assert!(direct.plan_load().await.unwrap());
        assert!(wire.plan_load().await.unwrap());
        // …then 02:50 summer time, 02:10 and 02:30 winter time.
        for (n, (h, m)) in [(0, 50), (1, 10), (1, 30)].into_iter().enumerate() {
            sim.set_utc_time(at(h, m));
            let id = i32::try_from(n).unwrap() + 1;
            sim.transaction()
                .insert("dbo.T", vec![Value::Int(id)])
                .commit()
                .unwrap();
        }
        let expected = events(&mut direct).await;
        let got = events(&mut wire).await;
        // The load reads the table as it is by then (four rows), then the changes.
        assert_eq!(got.len(), 7);
        let text = |m: &Vec<u8>| String::from_utf8_lossy(m).into_owned();
        assert_eq!(
            got.iter().map(text).collect::<Vec<_>>(),
            expected.iter().map(text).collect::<Vec<_>>()
        );
        let times: Vec<String> = got
            .iter()
            .map(|m| {
                let m = text(m);
                let at = m.find("\"time\":\"").unwrap() + 8;
                m[at..at + 19].to_owned()
            })
            .collect();
        assert_eq!(
            times[3..],
            [
                "2026-10-25T00:20:00",
                "2026-10-25T00:50:00",
                "2026-10-25T01:10:00",
                "2026-10-25T01:30:00"
            ]
        );
    }

    /// A key whose first column repeats and whose second the index sorts
    /// descending (`PRIMARY KEY (tenant, id DESC)`): loaded in chunks through the
    /// wire in the index's order, the same rows as from the simulator, each once.
    #[tokio::test]
    async fn a_descending_composite_key_loads_in_its_index_order_through_the_wire() {
        let sim = CdcSimulator::new("CesDemo", GUID, 0);
        sim.create_table(
            "dbo",
            "lines",
            vec![
                SimColumn::new("tenant", SqlType::Int),
                SimColumn::new("id", SqlType::Int),
            ],
            &["tenant", "id"],
        );
        let mut transaction = sim.transaction();
        for tenant in 1..=3 {
            for id in 1..=7 {
                transaction =
                    transaction.insert("dbo.lines", vec![Value::Int(tenant), Value::Int(id)]);
            }
        }
        transaction.commit().unwrap();
        let name = sim.enable_table("dbo.lines", None).unwrap();
        sim.set_descending_key_columns(&name, &["id"]);
        let config = PollerConfig {
            snapshot: SnapshotMode::Initial,
            load_chunk: 4,
            ..PollerConfig::default()
        };
        let standin = StandIn::start(USER, PASSWORD, support::tds_cdc::handler(sim.clone()))
            .await
            .unwrap();
        let mut direct = Poller::new(sim.clone(), config.clone(), None);
        let mut wire = Poller::new(
            source(&standin, PASSWORD, Duration::from_secs(5)),
            config,
            None,
        );
        let expected = events(&mut direct).await;
        let got = events(&mut wire).await;
        assert_eq!(got, expected);
        let keys: Vec<(i64, i64)> = got
            .iter()
            .map(|m| {
                let event: serde_json::Value = serde_json::from_slice(m).unwrap();
                let data: serde_json::Value =
                    serde_json::from_str(event["data"].as_str().unwrap()).unwrap();
                // `current` is itself JSON text, as CES writes it.
                let current: serde_json::Value =
                    serde_json::from_str(data["eventrow"]["current"].as_str().unwrap()).unwrap();
                let value = |c: &str| match &current[c] {
                    serde_json::Value::String(t) => t.parse::<i64>().unwrap(),
                    other => other.as_i64().unwrap(),
                };
                (value("tenant"), value("id"))
            })
            .collect();
        let mut index_order = keys.clone();
        index_order.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        assert_eq!(keys, index_order, "tenant ascending, id descending");
        assert_eq!(keys.len(), 21, "every row once");
    }
}

mod faults_through_the_poller {
    use super::*;
    use mssql_ces::source::poller::{Poller, PollerConfig};
    use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};

    fn workload() -> SyntheticConfig {
        SyntheticConfig {
            seed: 5,
            transactions: Some(300),
            rate_per_second: None,
            large_value_every: 50,
            existing_rows: 0,
            oversized_value_every: 0,
        }
    }

    fn config() -> PollerConfig {
        PollerConfig {
            page_size: 25,
            batch_size: 40,
            ..PollerConfig::default()
        }
    }

    /// Every event's message bytes, retrying transient errors as the pipeline does.
    async fn messages<S: ChangeSource>(poller: &mut Poller<S>) -> (Vec<Vec<u8>>, usize) {
        drain(poller, uuid::Uuid::nil(), Some(128))
            .await
            .unwrap_or_else(|e| panic!("poll: {e}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_cut_and_hung_pages_are_retried_and_nothing_is_lost_or_repeated() {
        let mut direct = Poller::new(SyntheticSource::new(workload()), config(), None);
        let (expected, _) = messages(&mut direct).await;
        assert!(expected.len() > 600, "{} messages", expected.len());

        let served = support::tds_cdc::handler(SyntheticSource::new(workload()).keep_history());
        let pages = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&pages);
        let faulty: Handler = Arc::new(move |request: &Request| {
            let reply = served(request);
            if !request.sql.contains("ORDER BY ct.__$start_lsn") {
                return reply;
            }
            // Every seventh page of changes fails, one way or another.
            match counter.fetch_add(1, Ordering::SeqCst) % 21 {
                6 => Reply::Drop,
                13 => match reply {
                    Reply::Rows(sets) => Reply::DropMidResult(sets),
                    other => other,
                },
                20 => Reply::Hang,
                _ => reply,
            }
        });
        let standin = StandIn::start(USER, PASSWORD, faulty).await.unwrap();
        let mut wire = Poller::new(
            source(&standin, PASSWORD, Duration::from_millis(800)),
            config(),
            None,
        );
        let (got, retries) = messages(&mut wire).await;
        assert!(retries >= 3, "{retries} transient errors");
        assert_eq!(got.len(), expected.len(), "every message once");
        assert!(got == expected, "the same messages, in order");
    }
}

mod tls {
    use super::*;
    use support::tds::self_signed_tls;

    fn encrypted(standin: &StandIn, trust: bool) -> SqlServerSource {
        let url = standin
            .connection_string(USER, PASSWORD)
            .replace(";Encrypt=false", "");
        SqlServerSource::new(SqlServerConfig {
            connection_string: ConnectionString::new(url),
            trust_server_certificate: trust,
            encrypt: true,
            connect_timeout: Duration::from_secs(5),
            query_timeout: Duration::from_secs(5),
        })
    }

    fn answers() -> Handler {
        handler(|request| {
            if request.sql == queries::MAX_LSN {
                max_lsn_rows(Some(lsn(9)))
            } else {
                support::tds::unknown(request)
            }
        })
    }

    #[tokio::test]
    async fn the_default_encrypted_connection_runs_over_tls_inside_tds() {
        let tls = self_signed_tls().expect("certificate");
        let standin = StandIn::start_tls(USER, PASSWORD, answers(), tls)
            .await
            .unwrap();
        let mut source = encrypted(&standin, true);
        assert_eq!(source.max_lsn().await.unwrap().lsn, Some(lsn(9)));
        // The session goes on over the same TLS connection.
        assert_eq!(source.max_lsn().await.unwrap().lsn, Some(lsn(9)));
    }

    #[tokio::test]
    async fn a_self_signed_certificate_without_trust_is_refused_with_the_setting_named() {
        let tls = self_signed_tls().expect("certificate");
        let standin = StandIn::start_tls(USER, PASSWORD, answers(), tls)
            .await
            .unwrap();
        let mut source = encrypted(&standin, false);
        let error = source.max_lsn().await.unwrap_err();
        assert!(!error.is_transient(), "{error:?}");
        let text = error.to_string();
        assert!(text.contains("source.trust_server_certificate"), "{text}");
        // The operator's settings, not the driver's API.
        assert!(text.contains("TrustServerCertificateCA="), "{text}");
        assert!(
            !text.contains("Config::") && !text.contains("native-tls"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_server_without_tls_is_refused_when_encryption_is_required() {
        let standin = StandIn::start(USER, PASSWORD, answers()).await.unwrap();
        let mut source = encrypted(&standin, true);
        let error = source.max_lsn().await.unwrap_err();
        assert!(
            !error.is_transient(),
            "an unencrypted server is not retried: {error:?}"
        );
        assert!(error.to_string().contains("source.encrypt"), "{error}");
    }
}

mod lifecycle_through_the_wire {
    use super::*;
    use cdc_sim::{CdcSimulator, SimColumn};
    use mssql_ces::event::Value;
    use mssql_ces::event::value::{Length, SqlType};
    use mssql_ces::source::poller::{Poller, PollerConfig};

    fn config() -> PollerConfig {
        PollerConfig {
            catalog_refresh: Duration::ZERO,
            unreadable_grace: Duration::ZERO,
            ..PollerConfig::default()
        }
    }

    /// Messages until idle, or the error that stopped the poller.
    async fn step<S: ChangeSource>(poller: &mut Poller<S>) -> Result<Vec<Vec<u8>>, String> {
        // On the heap: this test awaits many polls of two pollers in one future,
        // which in a debug build would not fit the test thread's stack.
        Box::pin(drain(poller, uuid::Uuid::from_u128(7), None))
            .await
            .map(|(out, _)| out)
            // The kind of error, as both sources must agree on it.
            .map_err(|e| format!("{:?}", std::mem::discriminant(&e)))
    }

    fn row(id: i32, name: &str) -> Vec<Value> {
        vec![
            Value::Int(id),
            Value::Text(name.into()),
            Value::Int(id * 10),
        ]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn capture_instance_lifecycle_ddl_and_permissions_read_the_same_through_the_wire() {
        let sim = CdcSimulator::new("Shop", uuid::Uuid::from_u128(7), 60);
        sim.create_table(
            "dbo",
            "T",
            vec![
                SimColumn::new("Id", SqlType::Int),
                SimColumn::new("Name", SqlType::NVarChar(Length::Bounded(50))),
                SimColumn::new("Qty", SqlType::Int),
            ],
            &["Id"],
        );
        sim.enable_table("dbo.T", None).unwrap();
        let standin = StandIn::start(USER, PASSWORD, support::tds_cdc::handler(sim.clone()))
            .await
            .unwrap();
        let mut direct = Poller::new(sim.clone(), config(), None);
        let mut wire = Poller::new(
            source(&standin, PASSWORD, Duration::from_secs(5)),
            config(),
            None,
        );
        let compare = async |what: &str,
                             direct: &mut Poller<CdcSimulator>,
                             wire: &mut Poller<SqlServerSource>| {
            let expected = step(direct).await;
            let got = step(wire).await;
            assert_eq!(got, expected, "{what}");
            expected
        };
        let tx = |f: &dyn Fn(cdc_sim::Transaction) -> cdc_sim::Transaction| {
            f(sim.transaction()).commit().unwrap()
        };
        tx(&|t| t.insert("dbo.T", row(1, "a")).insert("dbo.T", row(2, "b")));
        assert_eq!(
            compare("inserts", &mut direct, &mut wire)
                .await
                .unwrap()
                .len(),
            2
        );
        // ALTER TABLE … DROP COLUMN: the change table keeps it, events leave it out.
        sim.drop_column("dbo.T", "Qty").unwrap();
        tx(&|t| {
            t.update(
                "dbo.T",
                vec![Value::Int(1)],
                vec![("Name", Value::Text("a2".into()))],
            )
        });
        assert!(
            !compare("after DROP COLUMN", &mut direct, &mut wire)
                .await
                .unwrap()
                .is_empty(),
            "after DROP COLUMN"
        );
        // ALTER COLUMN to another type, then a second capture instance, the first disabled.
        sim.alter_column_type("dbo.T", "Name", SqlType::NVarChar(Length::Bounded(100)))
            .unwrap();
        sim.enable_table("dbo.T", Some("dbo_T_v2")).unwrap();
        tx(&|t| t.insert("dbo.T", vec![Value::Int(3), Value::Text("c".into())]));
        assert!(
            !compare("a second capture instance", &mut direct, &mut wire)
                .await
                .unwrap()
                .is_empty(),
            "a second capture instance"
        );
        sim.disable_instance("dbo_T");
        tx(&|t| t.delete("dbo.T", vec![Value::Int(2)]));
        assert!(
            !compare("the first instance disabled", &mut direct, &mut wire)
                .await
                .unwrap()
                .is_empty(),
            "the first instance disabled"
        );
        // Disabled and enabled again under the same name: a new change table.
        sim.disable_instance("dbo_T_v2");
        sim.enable_table("dbo.T", Some("dbo_T_v2")).unwrap();
        tx(&|t| t.insert("dbo.T", vec![Value::Int(4), Value::Text("d".into())]));
        assert!(
            !compare("re-created", &mut direct, &mut wire)
                .await
                .unwrap()
                .is_empty(),
            "re-created"
        );
        // SELECT denied: min_lsn 0x00, then the error that names the grant.
        sim.deny_select("dbo.T", true);
        tx(&|t| t.insert("dbo.T", vec![Value::Int(5), Value::Text("e".into())]));
        let denied = compare("SELECT denied", &mut direct, &mut wire).await;
        assert!(denied.is_err(), "{denied:?}");
    }
}

mod collations {
    use super::*;
    use mssql_ces::mssql::SqlConnection;

    /// `varchar` bytes in a collation, answered for any query.
    fn varchar(collation: [u8; 5], bytes: Vec<u8>) -> Handler {
        handler(move |_| {
            Reply::Rows(vec![ResultSet {
                columns: vec![Column::new(
                    "v",
                    ColumnType::VarChar {
                        length: 50,
                        collation,
                    },
                )],
                rows: vec![vec![Cell::Bytes(bytes.clone())]],
            }])
        })
    }

    async fn first_text(standin: &StandIn) -> Result<String, String> {
        let mut conn = SqlConnection::new(SqlServerConfig {
            connection_string: ConnectionString::new(standin.connection_string(USER, PASSWORD)),
            trust_server_certificate: false,
            encrypt: false,
            connect_timeout: Duration::from_secs(5),
            query_timeout: Duration::from_secs(5),
        });
        let rows = conn
            .query("SELECT v FROM t;", &[])
            .await
            .map_err(|e| mssql_ces::error::Chain(&e).to_string())?;
        let row = rows.into_iter().next().ok_or("no row")?;
        row.try_get::<&str, _>(0)
            .map_err(|e| e.to_string())?
            .map(str::to_owned)
            .ok_or_else(|| "NULL".to_owned())
    }

    /// Why every text column is converted to UTF-16 on the server (the change and
    /// load queries' casts): handed `varchar` in a UTF-8 collation the driver decodes
    /// it with the LCID's code page, ignoring the fUTF8 flag, and a CP437 collation it
    /// cannot decode at all. Through the casts the same text arrives exact (the
    /// every-type test above).
    #[tokio::test]
    async fn the_driver_alone_gets_utf8_and_cp437_varchar_wrong() {
        let text = "Zoë 日本";
        // Latin1_General_100_CI_AS_SC_UTF8: LCID 0x0409, fIgnoreCase, fUTF8, sort id 0.
        let utf8 = [0x09, 0x04, 0x10, 0x04, 0x00];
        let standin = StandIn::start(USER, PASSWORD, varchar(utf8, text.as_bytes().to_vec()))
            .await
            .unwrap();
        let decoded = first_text(&standin).await;
        assert_eq!(
            decoded.as_deref(),
            Ok("ZoÃ« æ—¥æœ¬"),
            "tiberius reads UTF-8 as cp1252"
        );
        // SQL_Latin1_General_CP437_CI_AS: sort id 32.
        let cp437 = [0x09, 0x04, 0x00, 0x00, 32];
        let standin = StandIn::start(USER, PASSWORD, varchar(cp437, vec![0x82, 0x94]))
            .await
            .unwrap();
        let decoded = first_text(&standin).await;
        let error = decoded.expect_err("tiberius has no CP437");
        assert!(
            error.contains("encoding") || error.contains("ollation"),
            "{error}"
        );
    }
}

mod large_over_tls {
    use super::*;
    use cdc_sim::{CdcSimulator, SimColumn};
    use mssql_ces::event::Value;
    use mssql_ces::event::value::SqlType;
    use mssql_ces::source::initial_load::SnapshotMode;
    use mssql_ces::source::poller::{Poller, PollerConfig};

    async fn all<S: ChangeSource>(poller: &mut Poller<S>) -> Vec<Vec<u8>> {
        drain_clean(poller, uuid::Uuid::from_u128(3)).await
    }

    /// A wide table: its change query is longer than a TDS packet (and a TLS
    /// record's worth of rustls' read), and a chunk of its rows is far more than the
    /// 64 KiB rustls buffers by default.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_and_answers_larger_than_a_packet_and_a_tls_buffer_cross_intact() {
        let sim = CdcSimulator::new("Wide", uuid::Uuid::from_u128(3), 0);
        let mut columns = vec![SimColumn::new("id", SqlType::Int)];
        columns.extend(
            (1..80).map(|n| SimColumn::new(&format!("measurement_column_{n:03}"), SqlType::BigInt)),
        );
        sim.create_table("dbo", "wide", columns, &["id"]);
        let row = |id: i32| -> Vec<Value> {
            std::iter::once(Value::Int(id))
                .chain((1..80).map(|n| Value::BigInt(i64::from(id) * 1_000 + n)))
                .collect()
        };
        let mut txn = sim.transaction();
        for id in 1..=2_500 {
            txn = txn.insert("dbo.wide", row(id));
        }
        txn.commit().unwrap();
        sim.enable_table("dbo.wide", None).unwrap();
        let config = PollerConfig {
            snapshot: SnapshotMode::Initial,
            ..PollerConfig::default()
        };
        let tls = support::tds::self_signed_tls().expect("certificate");
        let standin =
            StandIn::start_tls(USER, PASSWORD, support::tds_cdc::handler(sim.clone()), tls)
                .await
                .unwrap();
        let url = standin
            .connection_string(USER, PASSWORD)
            .replace(";Encrypt=false", "");
        let wire_source = SqlServerSource::new(SqlServerConfig {
            connection_string: ConnectionString::new(url),
            trust_server_certificate: true,
            encrypt: true,
            connect_timeout: Duration::from_secs(5),
            query_timeout: Duration::from_secs(30),
        });
        let mut direct = Poller::new(sim.clone(), config.clone(), None);
        let mut wire = Poller::new(wire_source, config, None);
        assert!(direct.plan_load().await.unwrap());
        assert!(wire.plan_load().await.unwrap());
        let mut txn = sim.transaction();
        for id in 2_501..=3_000 {
            txn = txn.insert("dbo.wide", row(id));
        }
        txn.commit().unwrap();
        let expected = all(&mut direct).await;
        // The load reads all 3,000 rows (the last 500 committed after L0 but before the
        // read), and the 500 inserts follow as changes.
        assert_eq!(expected.len(), 3_500);
        let got = all(&mut wire).await;
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "the same bytes");
    }
}

/// What `check` reads of the server, on the editions that differ: Azure SQL Database
/// keeps the cleanup retention in its own `cdc.cdc_jobs` (msdb's is out of reach),
/// and a facts query the server refuses for a reason other than a permission makes
/// that fact unknown, never the whole read fail.
mod server_kinds_through_the_wire {
    use super::*;
    use cdc_sim::CdcSimulator;
    use mssql_ces::source::{CdcJob, Fact};

    fn azure() -> CdcSimulator {
        let sim = CdcSimulator::new("Shop", uuid::Uuid::from_u128(7), 0);
        sim.configure_server(|s| {
            s.engine_edition = 5;
            s.product_version = "12.0.2000.8".into();
            s.jobs = Fact::Known(vec![CdcJob::cleanup(1440)]);
        });
        sim
    }

    #[tokio::test]
    async fn azure_sql_database_reads_its_retention_from_its_own_cdc_jobs() {
        let served = support::tds_cdc::handler(azure());
        let standin = StandIn::start(USER, PASSWORD, served).await.unwrap();
        let facts = source(&standin, PASSWORD, Duration::from_secs(5))
            .server_facts()
            .await
            .expect("facts");
        match facts.jobs {
            Fact::Known(jobs) => assert_eq!(jobs[0].retention_minutes, Some(1440)),
            Fact::Unknown(why) => panic!("retention not read: {why}"),
        }
        assert!(matches!(facts.agent, Fact::Unknown(_)));
    }

    #[tokio::test]
    async fn a_facts_query_the_server_refuses_is_not_checked_rather_than_failing() {
        let inner =
            support::tds_cdc::handler(CdcSimulator::new("Shop", uuid::Uuid::from_u128(7), 0));
        let refusing: Handler = Arc::new(move |request: &Request| {
            if request.sql == queries::LOG_SCAN {
                return Reply::Error {
                    number: 40515,
                    class: 15,
                    message: "not supported in this version of SQL Server".into(),
                };
            }
            inner(request)
        });
        let standin = StandIn::start(USER, PASSWORD, refusing).await.unwrap();
        let facts = source(&standin, PASSWORD, Duration::from_secs(5))
            .server_facts()
            .await
            .expect("the read goes on");
        match facts.log_scan {
            Fact::Unknown(why) => assert!(why.contains("40515"), "{why}"),
            Fact::Known(_) => panic!("the refused fact is not known"),
        }
        assert!(matches!(facts.jobs, Fact::Known(_)), "the others are read");
    }

    /// The capture job's settings and the last scan's transactions come through
    /// the wire as the server keeps them.
    #[tokio::test]
    async fn the_capture_jobs_settings_and_last_scan_are_read() {
        let sim = CdcSimulator::new("Shop", uuid::Uuid::from_u128(7), 0);
        let settings = mssql_ces::source::CaptureSettings {
            max_trans: 2_000,
            max_scans: 20,
            continuous: true,
            polling_interval_s: 1,
        };
        sim.configure_server(|s| {
            s.jobs = Fact::Known(vec![CdcJob::capture(settings), CdcJob::cleanup(4320)]);
            s.log_scan = Fact::Known(Some(mssql_ces::source::LogScan {
                start_time: s.local_time,
                end_time: None,
                latency_seconds: 7,
                error_count: 0,
                tran_count: 1_999,
                total_tran_count: Some(80_000),
            }));
        });
        let standin = StandIn::start(USER, PASSWORD, support::tds_cdc::handler(sim))
            .await
            .unwrap();
        let facts = source(&standin, PASSWORD, Duration::from_secs(5))
            .server_facts()
            .await
            .expect("facts");
        let Fact::Known(jobs) = facts.jobs else {
            panic!("jobs not read: {:?}", facts.jobs);
        };
        assert_eq!(jobs[0].capture, Some(settings));
        assert_eq!(jobs[1].capture, None);
        assert_eq!(jobs[1].retention_minutes, Some(4320));
        let Fact::Known(Some(scan)) = facts.log_scan else {
            panic!("no log scan: {:?}", facts.log_scan);
        };
        assert_eq!(scan.tran_count, 1_999);
        assert_eq!(scan.total_tran_count, Some(80_000));
    }
}

/// A table without a key is read in one pass ordered by every column: SQL Server
/// sorts the whole table before the first row. That wait has its own bound (not the
/// query time-out), and a pass given up is cancelled on the server with a TDS
/// Attention, so its sort (and its schema-stability lock) does not run on.
mod keyless_pass {
    use super::*;
    use cdc_sim::{CdcSimulator, SimColumn};
    use mssql_ces::event::value::{Length, SqlType};
    use mssql_ces::source::TableCursor;

    #[tokio::test]
    async fn the_first_row_has_its_own_bound_and_an_abandoned_pass_is_cancelled() {
        let sim = CdcSimulator::new("CesDemo", uuid::Uuid::from_u128(7), 0);
        sim.create_table(
            "dbo",
            "log",
            vec![SimColumn::new(
                "line",
                SqlType::NVarChar(Length::Bounded(50)),
            )],
            &[],
        );
        sim.enable_table("dbo.log", None).unwrap();
        let mut direct = sim.clone();
        let instance = direct.catalog().await.unwrap().instances[0].clone();
        let pass = queries::read_table(&instance, &[], None);
        let served = support::tds_cdc::handler(sim);
        // The sort takes a minute before the first row.
        let standin = StandIn::start(
            USER,
            PASSWORD,
            Arc::new(move |request: &Request| {
                let reply = served(request);
                if request.sql == pass {
                    Reply::Slow(Duration::from_secs(60), Box::new(reply))
                } else {
                    reply
                }
            }),
        )
        .await
        .unwrap();
        let mut source = source(&standin, PASSWORD, Duration::from_secs(5))
            .with_first_row_timeout(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let err = source
            .read_table(&instance, TableCursor::Start, 100)
            .await
            .unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(
            err.to_string().contains("snapshot.first_row_timeout_ms"),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not the query time-out"
        );
        // The server was told to stop.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while standin.attentions() == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            standin.attentions(),
            1,
            "the pass was cancelled on the server"
        );
    }
}

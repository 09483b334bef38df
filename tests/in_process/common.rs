//! Helpers several in-process suites share.

use cdc_sim::{CdcSimulator, SimColumn};
use mssql_ces::event::Change;
use mssql_ces::event::schema_change::SchemaChange;
use mssql_ces::event::value::{Length, SqlType};
use mssql_ces::source::poller::{BatchEvent, PollOutcome, Poller};
use mssql_ces::source::{ChangeSource, SourceError};
use uuid::Uuid;

/// Polls until idle; every change on the way.
pub async fn drain<S: ChangeSource>(poller: &mut Poller<S>) -> Result<Vec<Change>, SourceError> {
    let mut changes = Vec::new();
    loop {
        match poller.poll().await? {
            PollOutcome::Idle => return Ok(changes),
            PollOutcome::Batch(batch) => changes.extend(batch.changes),
        }
    }
}

/// An event of the stream: a schema change or a change.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Schema(SchemaChange),
    Change(Box<Change>),
}

/// Polls until idle: every event in stream order, schema changes included.
pub async fn drain_items<S: ChangeSource>(
    poller: &mut Poller<S>,
) -> Result<Vec<Item>, SourceError> {
    let mut items = Vec::new();
    loop {
        match poller.poll().await? {
            PollOutcome::Idle => return Ok(items),
            PollOutcome::Batch(batch) => {
                items.extend(batch.events().into_iter().map(|e| match e {
                    BatchEvent::Schema(s) => Item::Schema(s.clone()),
                    BatchEvent::Change(c) => Item::Change(Box::new(c.clone())),
                }))
            }
        }
    }
}

/// The schema-change events among `items`.
pub fn schema_events(items: &[Item]) -> Vec<&SchemaChange> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Schema(s) => Some(s),
            Item::Change(_) => None,
        })
        .collect()
}

/// Database `Shop` on a server at `utc_offset_minutes`, with `dbo.T (Id int PRIMARY
/// KEY, Name nvarchar(50))`, not yet enabled.
pub fn shop_with_t(utc_offset_minutes: i32) -> CdcSimulator {
    shop_with(
        utc_offset_minutes,
        SimColumn::new("Name", SqlType::NVarChar(Length::Bounded(50))),
    )
}

/// As [`shop_with_t`], with `name` as `dbo.T`'s second column.
pub fn shop_with(utc_offset_minutes: i32, name: SimColumn) -> CdcSimulator {
    let sim = CdcSimulator::new("Shop", Uuid::from_u128(7), utc_offset_minutes);
    sim.create_table(
        "dbo",
        "T",
        vec![SimColumn::new("Id", SqlType::Int), name],
        &["Id"],
    );
    sim
}

/// The synthetic source through the whole pipeline into `sink` until idle, with a
/// checkpoint in a temporary directory (1 MiB messages, `encoding`).
pub async fn run_synthetic(
    synthetic: mssql_ces::source::synthetic::SyntheticConfig,
    encoding: mssql_ces::event::Encoding,
    router: mssql_ces::sink::Router,
    sink: mssql_ces::sink::Sink,
) -> Result<mssql_ces::pipeline::RunSummary, mssql_ces::pipeline::PipelineError> {
    run_synthetic_with(
        synthetic,
        encoding,
        router,
        sink,
        crate::kafka_pipeline::until_idle(),
        tokio_util::sync::CancellationToken::new(),
    )
    .await
}

/// As [`run_synthetic`], with `settings` and a `shutdown` the test triggers.
pub async fn run_synthetic_with(
    synthetic: mssql_ces::source::synthetic::SyntheticConfig,
    encoding: mssql_ces::event::Encoding,
    router: mssql_ces::sink::Router,
    sink: mssql_ces::sink::Sink,
    settings: mssql_ces::pipeline::PipelineSettings,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<mssql_ces::pipeline::RunSummary, mssql_ces::pipeline::PipelineError> {
    use mssql_ces::checkpoint::{CheckpointStore, file::FileStore};
    use mssql_ces::event::{EncoderOptions, FinalEventMode, MessageSizeLimit};
    use mssql_ces::source::poller::PollerConfig;
    let dir = std::env::temp_dir().join(format!("mssql-ces-run-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let result = mssql_ces::pipeline::run(
        Poller::new(
            mssql_ces::source::synthetic::SyntheticSource::new(synthetic),
            PollerConfig {
                batch_size: 30,
                ..PollerConfig::default()
            },
            None,
        ),
        Box::new(move |guid| EncoderOptions {
            stream_guid: guid,
            encoding,
            final_event: FinalEventMode::LastInTransaction,
            max_message_size: MessageSizeLimit::from_kb(1024).expect("valid"),
        }),
        router,
        sink,
        CheckpointStore::File(FileStore::new(dir.join("cp.json"), "test")),
        settings,
        shutdown,
    )
    .await;
    std::fs::remove_dir_all(dir).ok();
    result
}

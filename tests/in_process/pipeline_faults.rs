//! The pipeline under faults that are not the destination's: a source that vanishes,
//! a checkpoint store that fails for a while, and quiet periods after the last batch.

use std::time::{Duration, Instant};

use mssql_ces::checkpoint::CheckpointStore;
use mssql_ces::checkpoint::memory::MemoryStore;
use mssql_ces::event::{EncoderOptions, Encoding, FinalEventMode, MessageSizeLimit};
use mssql_ces::lsn::Lsn;
use mssql_ces::pipeline::{self, PipelineError, PipelineSettings};
use mssql_ces::sink::settings::{CloudEventsMode, PartitionKeyScheme};
use mssql_ces::sink::stream::{Resume, StreamSink};
use mssql_ces::sink::{Router, Sink};
use mssql_ces::source::poller::{PollOutcome, Poller, PollerConfig};
use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};
use mssql_ces::source::{
    CaptureDdl, CaptureInstance, Catalog, CdcReads, ChangeRow, DdlEvent, FactReads, MaxLsn, Probe,
    ProbeResult, RowKey, SourceClock, SourceError, TableReads,
};
use tokio_util::sync::CancellationToken;

pub(crate) fn router() -> Router {
    Router::new(
        "ces",
        PartitionKeyScheme::Table,
        None,
        CloudEventsMode::Structured,
        Encoding::Json,
        "default",
    )
}

pub(crate) fn factory() -> pipeline::EncoderFactory {
    Box::new(|guid| EncoderOptions {
        stream_guid: guid,
        encoding: Encoding::Json,
        final_event: FinalEventMode::LastInTransaction,
        max_message_size: MessageSizeLimit::default(),
    })
}

fn file_sink(name: &str) -> (Sink, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("mssql-ces-{name}-{}", uuid::Uuid::new_v4()));
    let sink = StreamSink::file(path.clone(), Encoding::Json, Resume::Fresh).expect("file sink");
    (Sink::Stream(sink), path)
}

fn settings(until_idle: bool) -> PipelineSettings {
    PipelineSettings {
        poll_interval: Duration::from_millis(10),
        checkpoint_interval: Duration::from_millis(20),
        drain_timeout: Duration::from_secs(5),
        idle_drain_timeout: Duration::from_secs(5),
        until_idle,
        metrics: Default::default(),
    }
}

/// A source whose every call panics after the catalog.
struct Panicking(SyntheticSource);

impl CdcReads for Panicking {
    async fn catalog(&mut self) -> Result<Catalog, SourceError> {
        self.0.catalog().await
    }

    async fn max_lsn(&mut self) -> Result<MaxLsn, SourceError> {
        panic!("the source broke")
    }

    async fn min_lsn(&mut self, _: &str) -> Result<Option<Lsn>, SourceError> {
        panic!("the source broke")
    }

    async fn probe(&mut self, _: &[Probe], _: Lsn) -> Result<Vec<ProbeResult>, SourceError> {
        panic!("the source broke")
    }

    async fn read_changes(
        &mut self,
        _: &CaptureInstance,
        _: RowKey,
        _: Lsn,
        _: usize,
    ) -> Result<Vec<ChangeRow>, SourceError> {
        panic!("the source broke")
    }

    async fn ddl_history(&mut self, _: &str) -> Result<Vec<DdlEvent>, SourceError> {
        panic!("the source broke")
    }

    async fn lsn_time(
        &mut self,
        _: Lsn,
    ) -> Result<Option<mssql_ces::source::CommitTime>, SourceError> {
        panic!("the source broke")
    }
}

impl TableReads for Panicking {
    async fn table_rows(&mut self, _: &CaptureInstance) -> Result<Option<u64>, SourceError> {
        panic!("the source broke")
    }

    async fn read_table(
        &mut self,
        _: &CaptureInstance,
        _: mssql_ces::source::TableCursor<'_>,
        _: usize,
    ) -> Result<Vec<Vec<mssql_ces::event::Value>>, SourceError> {
        panic!("the source broke")
    }
}

impl FactReads for Panicking {
    async fn server_facts(&mut self) -> Result<mssql_ces::source::ServerFacts, SourceError> {
        panic!("the source broke")
    }
}

impl CaptureDdl for Panicking {}

impl SourceClock for Panicking {}

fn synthetic(transactions: u64) -> SyntheticConfig {
    SyntheticConfig {
        seed: 9,
        transactions: Some(transactions),
        rate_per_second: None,
        large_value_every: 0,
        existing_rows: 0,
        oversized_value_every: 0,
    }
}

#[tokio::test]
async fn a_source_that_panics_fails_the_run_with_the_cause() {
    let poller = Poller::new(
        Panicking(SyntheticSource::new(synthetic(10))),
        PollerConfig::default(),
        None,
    );
    let (sink, path) = file_sink("panic");
    let result = pipeline::run(
        poller,
        factory(),
        router(),
        sink,
        CheckpointStore::Memory(MemoryStore::default()),
        settings(false),
        CancellationToken::new(),
    )
    .await;
    match result {
        Err(PipelineError::SourceStopped { cause }) => {
            assert!(cause.to_string().contains("panic"), "{cause}")
        }
        other => panic!("expected the source's failure, got {other:?}"),
    }
    std::fs::remove_file(path).ok();
}

#[tokio::test]
async fn checkpoint_faults_are_retried_and_the_last_batch_is_checkpointed_while_idle() {
    // The position the whole history ends at.
    let mut reference = Poller::new(
        SyntheticSource::new(synthetic(300)),
        PollerConfig::default(),
        None,
    );
    let mut last = None;
    while let PollOutcome::Batch(batch) = reference.poll().await.expect("poll") {
        last = batch
            .changes
            .last()
            .map(|c| (c.commit_lsn, c.sequence_number));
    }
    let last = last.expect("events");

    let store = MemoryStore::default();
    store.fail_next(3);
    let (sink, path) = file_sink("cp-faults");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(pipeline::run(
        Poller::new(
            SyntheticSource::new(synthetic(300)),
            PollerConfig::default(),
            None,
        ),
        factory(),
        router(),
        sink,
        CheckpointStore::Memory(store.clone()),
        settings(false),
        shutdown.clone(),
    ));
    // Not stopping: the pipeline idles after the last batch, and the checkpoint must
    // still reach it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let reached = loop {
        let at = store
            .position()
            .and_then(|p| p.last_event)
            .map(|e| (e.commit_lsn, e.sequence_number));
        if at == Some(last) {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(reached, "the last batch was checkpointed while idle");
    assert!(
        !run.is_finished(),
        "still running: the write was not the final one"
    );
    shutdown.cancel();
    let summary = run
        .await
        .expect("join")
        .expect("a run with store faults succeeds");
    assert!(summary.events > 0);
    std::fs::remove_file(path).ok();
}

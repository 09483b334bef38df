//! What the synthetic source must produce, computed without the pipeline: the
//! reference the delivery tests compare what arrived against.

use std::collections::BTreeMap;

use mssql_ces::event::readback::decode_message;
use mssql_ces::event::{Encoder, EncoderOptions, Encoding};
use mssql_ces::source::poller::{PollOutcome, Poller, PollerConfig};
use mssql_ces::source::synthetic::{SyntheticConfig, SyntheticSource};

/// `logicalid` → the event's whole `data`, for every event of the workload.
pub async fn events(
    synthetic: SyntheticConfig,
    options: impl Fn(uuid::Uuid) -> EncoderOptions,
    encoding: Encoding,
) -> BTreeMap<String, Vec<u8>> {
    events_of(SyntheticSource::new(synthetic), options, encoding).await
}

/// As [`events`], for one database of a synthetic server (`source.databases`): its
/// name is in its events, and its seed is derived from the configured one as
/// `Config::for_database` derives it.
pub async fn database_events(
    mut synthetic: SyntheticConfig,
    database: &str,
    options: impl Fn(uuid::Uuid) -> EncoderOptions,
    encoding: Encoding,
) -> BTreeMap<String, Vec<u8>> {
    synthetic.seed ^= mssql_ces::databases::fleet::name_hash(database);
    let mut source = SyntheticSource::new(synthetic);
    source.rename_database(database);
    events_of(source, options, encoding).await
}

async fn events_of(
    source: SyntheticSource,
    options: impl Fn(uuid::Uuid) -> EncoderOptions,
    encoding: Encoding,
) -> BTreeMap<String, Vec<u8>> {
    let mut poller = Poller::new(source, PollerConfig::default(), None);
    let mut out = BTreeMap::new();
    let mut encoder = None;
    while let PollOutcome::Batch(batch) = poller.poll().await.expect("poll") {
        let guid = poller.stream_guid().expect("stream GUID");
        let encoder = encoder.get_or_insert_with(|| Encoder::new(options(guid)));
        for change in &batch.changes {
            let event = encoder.encode(change).expect("encode");
            let data = event
                .messages
                .iter()
                .flat_map(|m| decode_message(&m.bytes, encoding).expect("decode").data)
                .collect();
            out.insert(event.logical_id, data);
        }
    }
    out
}

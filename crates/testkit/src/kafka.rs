//! Kafka helpers for the tests: a consumer that reads whole topics back from a
//! `MockCluster`, and decoding of what it read.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// One consumed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub payload: Vec<u8>,
    /// The value is null (a tombstone), not empty.
    pub null_payload: bool,
}

/// Reads `topic` from the beginning until `until(&messages)` holds or `timeout` passes.
pub fn consume(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
    until: impl Fn(&[Consumed]) -> bool,
) -> Vec<Consumed> {
    consume_quietly(bootstrap, topic, partitions, timeout, Duration::ZERO, until)
}

/// As [`consume`], but once `until` holds keeps reading until nothing arrived for
/// `quiet` (to catch re-sent duplicates that follow).
pub fn consume_quietly(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
    quiet: Duration,
    until: impl Fn(&[Consumed]) -> bool,
) -> Vec<Consumed> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("test-{}", uuid::Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .set("fetch.message.max.bytes", "2000000")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&assignment).expect("assign");
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut last_arrival = Instant::now();
    let mut satisfied = false;
    while Instant::now() < deadline {
        if !satisfied && until(&out) {
            satisfied = true;
        }
        if satisfied && last_arrival.elapsed() >= quiet {
            break;
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default();
                last_arrival = Instant::now();
                out.push(Consumed {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    headers,
                    payload: m.payload().unwrap_or_default().to_vec(),
                    null_payload: m.payload().is_none(),
                });
            }
            Some(Err(e)) => panic!("consume: {e}"),
            None => {}
        }
    }
    out
}

/// Messages grouped by partition, in offset order.
pub fn by_partition(messages: &[Consumed]) -> BTreeMap<i32, Vec<Consumed>> {
    let mut map: BTreeMap<i32, Vec<Consumed>> = BTreeMap::new();
    for m in messages {
        map.entry(m.partition).or_default().push(m.clone());
    }
    for list in map.values_mut() {
        list.sort_by_key(|m| m.offset);
    }
    map
}

/// `(commit LSN, sequence number)` from a `logicalid`, for ordering checks.
pub fn position_of(logicalid: &str) -> (String, u64) {
    let mut parts = logicalid.rsplitn(3, ':');
    let sequence = parts.next().and_then(|s| s.parse().ok()).expect("sequence");
    let lsn = parts.next().expect("lsn").to_owned();
    (lsn, sequence)
}

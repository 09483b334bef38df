//! Why a topic takes no writes though its brokers answer: when a message was not
//! acknowledged within `sink.delivery_timeout_ms` and no broker is down, the
//! cluster's own description of the topic says why — a partition without a leader,
//! or fewer in-sync replicas than the topic's `min.insync.replicas`, which makes
//! Kafka refuse every `acks=all` write with `NOT_ENOUGH_REPLICAS`, an error it calls
//! retriable (so librdkafka retries it and reports nothing until the run gives up).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, Producer as _};

use super::HealthContext;

/// How long the description may take: it is asked once, when the run is failing.
const DESCRIBE_WITHIN: Duration = Duration::from_secs(5);

/// How long a stalled message's diagnosis takes at most: a run that stops because
/// its source is idle waits this much longer than the delivery timeout, so that
/// the diagnosis is not cut short.
pub const DIAGNOSIS_WITHIN: Duration = DESCRIBE_WITHIN.saturating_add(Duration::from_secs(1));

/// What a topic's messages are asked about when they stall.
pub(super) struct TopicProbe {
    topic: String,
    producer: FutureProducer<HealthContext>,
    admin: Option<Arc<AdminClient<DefaultClientContext>>>,
    /// The topic's `min.insync.replicas`, as read with its limit at its first
    /// message.
    min_in_sync: std::sync::OnceLock<usize>,
}

/// One partition as the cluster describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PartitionState {
    pub(super) id: i32,
    /// The leader's broker id; `None` without one.
    pub(super) leader: Option<i32>,
    pub(super) in_sync: usize,
}

impl TopicProbe {
    pub(super) fn new(
        topic: &str,
        producer: FutureProducer<HealthContext>,
        admin: Option<Arc<AdminClient<DefaultClientContext>>>,
    ) -> TopicProbe {
        TopicProbe {
            topic: topic.to_owned(),
            producer,
            admin,
            min_in_sync: std::sync::OnceLock::new(),
        }
    }

    /// The topic's `min.insync.replicas`, read with its limit.
    pub(super) fn knows_min_in_sync(&self, min_in_sync: usize) {
        let _ = self.min_in_sync.set(min_in_sync);
    }

    pub(super) fn topic(&self) -> &str {
        &self.topic
    }

    /// The producer's fatal error, once it has one: its cause and librdkafka's reason.
    pub(super) fn fatal_error(&self) -> Option<(rdkafka::types::RDKafkaErrorCode, String)> {
        self.producer.client().fatal_error()
    }

    /// Why the topic takes no writes, as the cluster describes it; `None` when
    /// its description shows nothing wrong (or cannot be had).
    pub(super) async fn why_stalled(&self) -> Option<String> {
        let (producer, topic) = (self.producer.clone(), self.topic.clone());
        let described = tokio::task::spawn_blocking(move || {
            let metadata = producer
                .client()
                .fetch_metadata(Some(&topic), DESCRIBE_WITHIN)
                .ok()?;
            let described = metadata.topics().first()?;
            Some(
                described
                    .partitions()
                    .iter()
                    .map(|p| PartitionState {
                        id: p.id(),
                        leader: (p.leader() >= 0).then_some(p.leader()),
                        in_sync: p.isr().len(),
                    })
                    .collect::<Vec<_>>(),
            )
        });
        // Read at the first message, as a rule; asked now only where it was not.
        let configured = async {
            match (self.min_in_sync.get(), &self.admin) {
                (Some(known), _) => Some(*known),
                (None, Some(admin)) => min_insync_replicas(Arc::clone(admin), &self.topic).await,
                (None, None) => None,
            }
        };
        // Both at once: the whole answer within `DESCRIBE_WITHIN` and a second.
        let (partitions, min_in_sync) = tokio::join!(described, configured);
        let partitions = partitions.ok()??;
        diagnosis(&self.topic, &partitions, min_in_sync)
    }
}

/// The topic's `min.insync.replicas` (DescribeConfigs), where it can be read.
/// Kafka answers DescribeConfigs from the controller the client's metadata names,
/// which may be the broker that went down: the metadata is asked afresh first.
async fn min_insync_replicas(
    admin: Arc<AdminClient<DefaultClientContext>>,
    topic: &str,
) -> Option<usize> {
    const REFRESH_WITHIN: Duration = Duration::from_secs(2);
    let refreshed = Arc::clone(&admin);
    let _ =
        tokio::task::spawn_blocking(move || refreshed.inner().fetch_metadata(None, REFRESH_WITHIN))
            .await;
    let left = DESCRIBE_WITHIN.saturating_sub(REFRESH_WITHIN);
    let options = AdminOptions::new().request_timeout(Some(left));
    tokio::time::timeout(
        left + Duration::from_secs(1),
        super::admin::described_value(
            &admin,
            &ResourceSpecifier::Topic(topic),
            "min.insync.replicas",
            &options,
        ),
    )
    .await
    .ok()?
    .ok()?
    .parse()
    .ok()
}

/// What the partitions' states say, naming the first partitions at fault.
pub(super) fn diagnosis(
    topic: &str,
    partitions: &[PartitionState],
    min_in_sync: Option<usize>,
) -> Option<String> {
    let ids = |which: &dyn Fn(&PartitionState) -> bool| -> Vec<String> {
        partitions
            .iter()
            .filter(|p| which(p))
            .map(|p| p.id.to_string())
            .collect()
    };
    let leaderless = ids(&|p| p.leader.is_none());
    if !leaderless.is_empty() {
        return Some(format!(
            "partition {} of topic {topic} has no leader (LEADER_NOT_AVAILABLE): its replicas' brokers are down or the controller has not elected one; bring them back",
            leaderless.join(", ")
        ));
    }
    let min = min_in_sync?;
    let short = ids(&|p| p.in_sync < min);
    if short.is_empty() {
        return None;
    }
    let fewest = partitions.iter().map(|p| p.in_sync).min().unwrap_or(0);
    Some(format!(
        "partition {} of topic {topic} has {fewest} in-sync replicas, fewer than its min.insync.replicas ({min}), so Kafka refuses every acks=all write (NOT_ENOUGH_REPLICAS) until a replica catches up: bring the replicas' brokers back, or lower the topic's min.insync.replicas",
        short.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(id: i32, leader: Option<i32>, in_sync: usize) -> PartitionState {
        PartitionState {
            id,
            leader,
            in_sync,
        }
    }

    #[test]
    fn partitions_short_of_in_sync_replicas_or_without_a_leader_are_named() {
        let healthy = [partition(0, Some(1), 3), partition(1, Some(2), 3)];
        assert_eq!(diagnosis("t", &healthy, Some(2)), None);
        assert_eq!(diagnosis("t", &healthy, None), None);
        let short = [partition(0, Some(1), 3), partition(1, Some(2), 1)];
        let text = diagnosis("t", &short, Some(2)).expect("a diagnosis");
        assert!(
            text.contains("partition 1 of topic t has 1 in-sync replicas")
                && text.contains("min.insync.replicas (2)")
                && text.contains("NOT_ENOUGH_REPLICAS"),
            "{text}"
        );
        // Without min.insync.replicas, a short ISR is not said to be the cause.
        assert_eq!(diagnosis("t", &short, None), None);
        let leaderless = [partition(0, None, 0), partition(1, Some(2), 3)];
        let text = diagnosis("t", &leaderless, Some(2)).expect("a diagnosis");
        assert!(
            text.contains("partition 0 of topic t has no leader"),
            "{text}"
        );
    }
}

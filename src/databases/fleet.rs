//! A fleet: several processes with the same configuration (`fleet.group_id`) share
//! `source.databases` through Kafka's consumer group protocol, the coordination
//! Kafka Connect distributes its tasks with. No coordinator of our own.
//!
//! - **Slots**: the control topic's partitions. A database belongs to slot
//!   `fnv1a64(lowercase name) mod partitions`, the same in every member, so the
//!   group's assignment of partitions is the assignment of databases.
//! - **Membership**: each member is a consumer of the control topic in the group,
//!   with the cooperative-sticky assignor: a rebalance moves only the slots it must,
//!   and a member that joins takes its share from the others. Nothing is written to
//!   or read from the topic; only the assignment is used.
//! - **Hand-over**: a revoked slot is released only once this member has stopped
//!   every database in it (drained, its position saved): librdkafka's rebalance
//!   callback waits for the supervisor's word. A member that stops answering loses
//!   its slots after `fleet.session_timeout_ms`; if it was only paused, its first
//!   poll after it wakes revokes them (assignment lost) and stops their pipelines,
//!   and with `sink.exactly_once` the successor's transactions have fenced it
//!   already.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::topic_partition_list::TopicPartitionList;
use tokio::sync::mpsc::UnboundedSender;

/// FNV-1a (64 bits) of the lowercased name: stable across processes, versions and
/// platforms, as the slot mapping and the synthetic seeds need.
pub fn name_hash(name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.to_lowercase().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The slot of a database among `slots` (at least 1).
pub fn slot_of(database: &str, slots: u32) -> u32 {
    (name_hash(database) % u64::from(slots.max(1))) as u32
}

/// What the group tells the supervisor.
#[derive(Debug)]
pub enum FleetEvent {
    /// These slots are this member's now.
    Assigned(BTreeSet<u32>),
    /// These slots are taken away: stop their databases, then answer on `released`
    /// (the slots are handed to another member once answered).
    Revoked {
        slots: BTreeSet<u32>,
        released: std::sync::mpsc::SyncSender<()>,
    },
    /// The control topic has `now` partitions, not the count this member joined
    /// with: members would put databases in different slots.
    Resized { now: u32 },
    /// The brokers refuse this member for good (a right it lacks, a session
    /// time-out they do not allow): the membership ends, saying what to change.
    Refused(String),
}

/// Why the member could not join.
/// The consumer group protocol a fleet's members speak.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum GroupProtocol {
    /// The members assign slots among themselves (cooperative-sticky), with
    /// `session_timeout_ms`.
    #[default]
    Classic,
    /// Kafka 4's consumer group protocol (KIP-848): the group coordinator assigns, and
    /// the session time-out is the broker's `group.consumer.session.timeout.ms` (45 s
    /// by default).
    Consumer,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The brokers did not answer: worth trying again.
    #[error("fleet.topic {topic}: the brokers did not answer")]
    Unreachable {
        topic: String,
        #[source]
        cause: crate::error::Cause,
    },
    #[error("fleet.topic {topic}: {reason}")]
    Topic { topic: String, reason: String },
    #[error("the fleet's group consumer: {reason}")]
    Consumer {
        reason: String,
        #[source]
        cause: Option<crate::error::Cause>,
    },
}

impl FleetError {
    /// Whether trying again may help.
    pub fn is_transient(&self) -> bool {
        matches!(self, FleetError::Unreachable { .. })
    }
}

/// What a member needs to join (its `{:?}` hides the connection's secrets).
#[derive(Clone)]
pub struct MemberSettings {
    /// Where and how to connect: the sink's Kafka client properties.
    pub connection: Vec<(String, String)>,
    pub group_id: String,
    pub topic: String,
    /// Partitions of the control topic when this member creates it.
    pub slots: u32,
    pub session_timeout: Duration,
    /// The group protocol (`fleet.group_protocol`).
    pub protocol: GroupProtocol,
    /// How long a revocation waits for the databases to stop before the slots are
    /// released anyway (the drain time-out and a margin).
    pub release_timeout: Duration,
    /// Bound on the topic's metadata and creation.
    pub timeout: Duration,
}

impl std::fmt::Debug for MemberSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberSettings")
            .field(
                "connection",
                &crate::kafka_client::Redacted(&self.connection),
            )
            .field("group_id", &self.group_id)
            .field("topic", &self.topic)
            .field("slots", &self.slots)
            .field("session_timeout", &self.session_timeout)
            .field("protocol", &self.protocol)
            .field("release_timeout", &self.release_timeout)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A member of the group: a thread that serves the group protocol.
pub struct Member {
    slots: u32,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Member {
    /// Makes sure the control topic exists, then joins the group; assignments and
    /// revocations arrive on `events`.
    pub async fn join(
        settings: MemberSettings,
        events: UnboundedSender<FleetEvent>,
    ) -> Result<Member, FleetError> {
        let slots = control_topic(&settings).await?;
        let mut config = ClientConfig::new();
        for (key, value) in &settings.connection {
            config.set(key, value);
        }
        let session_ms = settings.session_timeout.as_millis();
        // librdkafka wants it at least the session time-out; a revocation waits for
        // the databases to stop inside a poll, up to the release time-out.
        let poll_interval_ms = (settings.release_timeout.as_millis() + 60_000)
            .max(300_000)
            .max(session_ms);
        config.set("group.id", &settings.group_id);
        match settings.protocol {
            GroupProtocol::Classic => {
                config
                    .set("partition.assignment.strategy", "cooperative-sticky")
                    .set("session.timeout.ms", session_ms.to_string())
                    .set(
                        "heartbeat.interval.ms",
                        (session_ms / 3).max(100).to_string(),
                    );
            }
            // The coordinator assigns (incrementally, as cooperative-sticky does) and
            // owns the session time-out and heartbeat: librdkafka refuses both here.
            GroupProtocol::Consumer => {
                config.set("group.protocol", "consumer");
            }
        }
        config
            .set("max.poll.interval.ms", poll_interval_ms.to_string())
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "latest");
        let context = FleetContext {
            topic: settings.topic.clone(),
            events,
            release_timeout: settings.release_timeout,
            owned: std::sync::Mutex::new(BTreeSet::new()),
        };
        let consumer: BaseConsumer<FleetContext> =
            config
                .create_with_context(context)
                .map_err(|e| FleetError::Consumer {
                    reason: crate::kafka_client::config_error(&e),
                    cause: None,
                })?;
        consumer
            .subscribe(&[settings.topic.as_str()])
            .map_err(|e| FleetError::Consumer {
                reason: "cannot subscribe to fleet.topic".to_owned(),
                cause: Some(crate::error::cause(e)),
            })?;
        match settings.protocol {
            GroupProtocol::Classic => tracing::info!(
                group = %settings.group_id,
                topic = %settings.topic,
                slots,
                session_timeout_ms = session_ms as u64,
                "joining the fleet"
            ),
            GroupProtocol::Consumer => tracing::info!(
                group = %settings.group_id,
                topic = %settings.topic,
                slots,
                "joining the fleet with the consumer group protocol (the session time-out is the broker's group.consumer.session.timeout.ms)"
            ),
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let watch = Watch {
            group: settings.group_id.clone(),
            topic: settings.topic.clone(),
            slots,
            every: Duration::from_secs(60),
            timeout: settings.timeout,
        };
        let thread = std::thread::Builder::new()
            .name("fleet-member".into())
            .spawn(move || serve(consumer, &stopping, &watch))
            .map_err(|e| FleetError::Consumer {
                reason: "cannot start its thread".to_owned(),
                cause: Some(crate::error::cause(e)),
            })?;
        Ok(Member {
            slots,
            stop,
            thread: Some(thread),
        })
    }

    /// The number of slots (the control topic's partitions).
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Leaves the group (its slots go to the others at once). Call once this
    /// member's databases are stopped.
    pub async fn leave(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How often, and where, a member looks at the control topic's partition count.
struct Watch {
    group: String,
    topic: String,
    slots: u32,
    every: Duration,
    timeout: Duration,
}

/// What the brokers' refusal of this member means, when retrying cannot change it:
/// a right the login lacks on the group or the control topic, or a session
/// time-out outside the brokers' bounds.
fn refusal(error: &rdkafka::error::KafkaError, watch: &Watch) -> Option<String> {
    use rdkafka::types::RDKafkaErrorCode as C;
    let grant = match crate::kafka_client::error_code(error)? {
        C::GroupAuthorizationFailed => format!("READ on group {}", watch.group),
        C::TopicAuthorizationFailed => format!("READ on topic {}", watch.topic),
        C::InvalidSessionTimeout => {
            return Some(format!(
                "the brokers refuse fleet.session_timeout_ms ({error}): set it within their group.min.session.timeout.ms and group.max.session.timeout.ms (6000 and 1800000 by default)"
            ));
        }
        _ => return None,
    };
    crate::kafka_client::refused_right(error, &grant)
        .map(|refused| format!("the fleet (fleet.group_id, fleet.topic): {refused} ({error})"))
}

/// Serves the group until told to stop, then leaves it. Says so when the group
/// refuses this member (a session time-out below the broker's minimum, no right
/// to the group), and when the control topic's partition count changes.
fn serve(consumer: BaseConsumer<FleetContext>, stop: &AtomicBool, watch: &Watch) {
    let mut last_error = String::new();
    let mut next_look = std::time::Instant::now() + watch.every;
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(200)) {
            // Nobody writes to the control topic; a record there is not ours to read.
            Some(Ok(_)) | None => {}
            Some(Err(e)) => {
                if let Some(reason) = refusal(&e, watch) {
                    tracing::error!(error = %crate::error::Chain(&e), "{reason}");
                    let _ = consumer.context().events.send(FleetEvent::Refused(reason));
                    break;
                }
                let text = e.to_string();
                if text != last_error {
                    tracing::warn!(error = %text, "the fleet's group consumer (fleet.group_id, fleet.session_timeout_ms: brokers refuse a session time-out outside their group.min/max.session.timeout.ms)");
                    last_error = text;
                }
            }
        }
        if std::time::Instant::now() >= next_look {
            next_look = std::time::Instant::now() + watch.every;
            let count = consumer
                .fetch_metadata(Some(&watch.topic), watch.timeout)
                .ok()
                .and_then(|m| m.topics().first().map(|t| t.partitions().len()));
            if let Some(now) = count.and_then(|c| u32::try_from(c).ok())
                && now > 0
                && now != watch.slots
            {
                tracing::error!(topic = %watch.topic, was = watch.slots, now, "the fleet's control topic changed its partition count");
                let _ = consumer.context().events.send(FleetEvent::Resized { now });
            }
        }
    }
    // Closing revokes what is left (the supervisor has stopped by now) and leaves.
    consumer.unsubscribe();
    for _ in 0..10 {
        if consumer.poll(Duration::from_millis(100)).is_none()
            && consumer.assignment().is_ok_and(|a| a.count() == 0)
        {
            break;
        }
    }
    tracing::info!("left the fleet");
}

/// The control topic's partition count, the topic created when missing.
async fn control_topic(settings: &MemberSettings) -> Result<u32, FleetError> {
    let mut config = ClientConfig::new();
    for (key, value) in &settings.connection {
        config.set(key, value);
    }
    let unreachable = |cause: crate::error::Cause| FleetError::Unreachable {
        topic: settings.topic.clone(),
        cause,
    };
    let error = |reason: String| FleetError::Topic {
        topic: settings.topic.clone(),
        reason,
    };
    let lookup = |e: crate::kafka_client::LookupError| match e {
        crate::kafka_client::LookupError::Unreachable(_) => unreachable(crate::error::cause(e)),
        crate::kafka_client::LookupError::Client(_) => error(e.to_string()),
    };
    let found =
        crate::kafka_client::topic_partitions(config.clone(), &settings.topic, settings.timeout)
            .await
            .map_err(lookup)?;
    if let Some(partitions) = found {
        return Ok(partitions.len() as u32);
    }
    let created = crate::kafka_client::create_topic(
        &config,
        &settings.topic,
        settings.slots as i32,
        &[],
        settings.timeout,
    )
    .await;
    match created {
        Ok(true) => {
            tracing::info!(topic = %settings.topic, slots = settings.slots, "created the fleet's control topic");
        }
        Ok(false) => {}
        // A topic the login may not describe looks missing: it may well exist.
        Err(crate::kafka_client::CreateTopicError::Refused(
            code @ rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed,
        )) => {
            return Err(error(format!(
                "Kafka refused the login a right (TOPIC_AUTHORIZATION_FAILED, {code}): it may not see the topic nor create it: grant it READ on topic {topic} (and CREATE, for a member to create it with fleet.slots partitions); a restart repeats it",
                topic = settings.topic
            )));
        }
        Err(crate::kafka_client::CreateTopicError::Refused(code)) => {
            return Err(error(format!(
                "the broker refused to create it ({code}): create it with fleet.slots partitions, or give the login the right to create topics"
            )));
        }
        Err(e @ crate::kafka_client::CreateTopicError::Transient(_)) => {
            return Err(unreachable(crate::error::cause(e)));
        }
        Err(e) => return Err(error(e.to_string())),
    }
    // Members that raced to create it agree on what the broker now says.
    let deadline = tokio::time::Instant::now() + settings.timeout;
    loop {
        let found = crate::kafka_client::topic_partitions(
            config.clone(),
            &settings.topic,
            settings.timeout,
        )
        .await
        .map_err(lookup)?;
        if let Some(partitions) = found {
            return Ok(partitions.len() as u32);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(error("cannot be found after it was created".into()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The slots of `topic` in a partition list.
fn slots_in(topic: &str, list: &TopicPartitionList) -> BTreeSet<u32> {
    list.elements()
        .iter()
        .filter(|e| e.topic() == topic)
        .filter_map(|e| u32::try_from(e.partition()).ok())
        .collect()
}

/// Turns librdkafka's rebalance callbacks into [`FleetEvent`]s.
struct FleetContext {
    topic: String,
    events: UnboundedSender<FleetEvent>,
    release_timeout: Duration,
    /// The slots assigned and not yet revoked: what a failed rebalance takes away.
    owned: std::sync::Mutex<BTreeSet<u32>>,
}

impl FleetContext {
    fn owned(&self) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
        self.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the supervisor to stop the databases of `slots`, and waits for it.
    fn revoke(&self, slots: BTreeSet<u32>) {
        if slots.is_empty() {
            return;
        }
        self.owned().retain(|s| !slots.contains(s));
        let (released, answer) = std::sync::mpsc::sync_channel(1);
        let count = slots.len();
        if self
            .events
            .send(FleetEvent::Revoked { slots, released })
            .is_err()
        {
            return;
        }
        match answer.recv_timeout(self.release_timeout) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                tracing::info!(slots = count, "slots released, their databases stopped");
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    slots = count,
                    waited_ms = self.release_timeout.as_millis() as u64,
                    "the databases of revoked slots did not stop in time; releasing the slots anyway"
                );
            }
        }
    }
}

impl rdkafka::ClientContext for FleetContext {}

impl ConsumerContext for FleetContext {
    /// A revocation waits here, before librdkafka releases the slots, until the
    /// supervisor has stopped their databases.
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => self.revoke(slots_in(&self.topic, list)),
            // rdkafka unassigns after a failed rebalance: stop what was ours.
            Rebalance::Error(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "a rebalance failed; this member's databases stop and the group tries again");
                let all = self.owned().clone();
                self.revoke(all);
            }
            Rebalance::Assign(_) => {}
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            let slots = slots_in(&self.topic, list);
            if !slots.is_empty() {
                self.owned().extend(slots.iter().copied());
                let _ = self.events.send(FleetEvent::Assigned(slots));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_has_the_same_slot_in_every_member_whatever_its_case() {
        // FNV-1a's published test vectors: "" and "a".
        assert_eq!(name_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(name_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(name_hash("A"), name_hash("a"));
        assert_eq!(slot_of("Tenant7", 60), slot_of("tenant7", 60));
        assert_eq!(slot_of("anything", 1), 0);
        assert_eq!(slot_of("anything", 0), 0, "no slot count is one slot");
        // Spread: 1,200 names over 60 slots leave no slot empty and none with more
        // than twice its share.
        let mut counts = [0u32; 60];
        for i in 0..1200 {
            counts[slot_of(&format!("tenant{i:04}"), 60) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (1..=40).contains(&c)), "{counts:?}");
    }

    #[test]
    fn only_the_control_topics_partitions_are_slots() {
        let mut list = TopicPartitionList::new();
        list.add_partition("control", 3);
        list.add_partition("control", 0);
        list.add_partition("other", 5);
        assert_eq!(slots_in("control", &list), BTreeSet::from([0, 3]));
        assert!(slots_in("none", &list).is_empty());
    }
}

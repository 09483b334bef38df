//! The Kafka store: each stream's checkpoint is the latest record under its stream
//! name in a compacted topic (`checkpoint.topic`), so a deployment needs neither a
//! shared file system nor write permission on SQL Server, only the brokers it
//! already writes to.
//!
//! - Written by an idempotent producer (`acks=all`), one record per write, keyed by
//!   the stream name; the value is the same versioned JSON document the file store
//!   writes. A write returns once the broker acknowledged it.
//! - Read by assigning every partition of the topic from its start to its end and
//!   keeping the last record of the stream's key. The end is the partition's high
//!   watermark (what was written, committed or not), and the records are read
//!   `read_committed` (a transaction not yet committed is not a checkpoint). Another
//!   writer's transaction left open on the partition holds a `read_committed` reader
//!   at its first record (the last stable offset), below checkpoints committed after
//!   it: the read waits until it ends (its writer commits or aborts it, or Kafka
//!   aborts it at its `transaction.timeout.ms`) rather than return an older
//!   checkpoint, and fails naming it if it does not end in time. Compaction keeps
//!   the read short; the result is the same without it.
//! - The topic is created compacted (`cleanup.policy=compact`, one partition) when
//!   it does not exist. An existing topic whose policy deletes records (`delete`,
//!   or `compact,delete`) is refused, naming the command that fixes it: a stream
//!   quiet for longer than the topic's retention would lose its only record and
//!   start again from `source.start_position`. Where the policy cannot be read
//!   (Event Hubs' Kafka endpoint has no DescribeConfigs; a login without
//!   `DESCRIBE_CONFIGS`), that is said, and the last position is written again
//!   every [`REWRITE_EVERY`], so a quiet stream's record outlives any retention of
//!   an hour or more.
//! - No lease: the store cannot tell two processes on one stream apart. Run one
//!   process per stream (a Kubernetes Deployment of one replica, or
//!   `source.databases`, where each database is read by one process at a time).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::{CheckpointError, parse, render};
use crate::position::Position;

/// The consumer group the checkpoint is read in: nothing is committed to it, and the
/// login needs no right on it.
pub const READER_GROUP: &str = "mssql-ces-checkpoint-reader";

/// The default `checkpoint.topic`.
pub const DEFAULT_TOPIC: &str = "mssql-ces-checkpoints";

/// How often the last position is written again where the topic's policy could not
/// be read (Event Hubs keeps events for at least an hour).
pub const REWRITE_EVERY: Duration = Duration::from_secs(30 * 60);

/// How long a start waits for the topic's `cleanup.policy` before going on without
/// it: a broker that answers DescribeConfigs does so in milliseconds.
const RETENTION_WAIT_AT_START: Duration = Duration::from_millis(300);

/// What the topic's `cleanup.policy` does to a quiet stream's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retention {
    /// Compacted: the last record of each stream stays.
    Kept,
    /// The policy deletes records after `retention.ms`.
    Deleted { policy: String, retention: String },
    /// The policy could not be read, and why.
    Unknown(String),
}

/// A stream's checkpoint in a compacted topic.
pub struct KafkaStore {
    topic: String,
    stream_name: String,
    /// Where and how to connect (bootstrap servers, security), secrets included.
    connection: Vec<(String, String)>,
    producer: Option<FutureProducer>,
    /// Bound on one read or write.
    timeout: Duration,
    /// Bound on the question of what the topic keeps (`timeout` unless set).
    question_timeout: Duration,
    /// How long a read waits, beyond `timeout`, for a transaction left open on the
    /// topic to end.
    open_transaction_wait: Duration,
    /// Whether the topic was looked at (created when missing).
    prepared: bool,
    /// The sink writes the positions, each in its batch's transaction
    /// (`sink.exactly_once`): the store's own writes end once the run starts.
    sink_writes: bool,
    /// What the topic keeps, once known.
    retention: Option<Retention>,
    /// The question of what the topic keeps, while it is unanswered.
    retention_asked: Option<tokio::task::JoinHandle<Retention>>,
    /// The last document written, and when: written again every `rewrite_every`
    /// where the topic's retention is unknown.
    last_written: Option<(String, std::time::Instant)>,
    rewrite_every: Duration,
}

impl KafkaStore {
    /// `connection`: the client properties that say where and how to connect.
    pub fn new(
        connection: Vec<(String, String)>,
        topic: impl Into<String>,
        stream_name: impl Into<String>,
        timeout: Duration,
    ) -> Self {
        KafkaStore {
            topic: topic.into(),
            stream_name: stream_name.into(),
            connection,
            producer: None,
            timeout,
            question_timeout: timeout,
            open_transaction_wait: timeout,
            prepared: false,
            sink_writes: false,
            retention: None,
            retention_asked: None,
            last_written: None,
            rewrite_every: REWRITE_EVERY,
        }
    }

    /// Bounds the question of what the topic keeps by `wait` instead of the
    /// store's time-out: a broker that never answers it is then given up on sooner
    /// (or later) than a write.
    pub fn with_question_timeout(mut self, wait: Duration) -> Self {
        self.question_timeout = wait;
        self
    }

    /// Writes the last position again this often where the topic's retention is
    /// unknown (default [`REWRITE_EVERY`]).
    pub fn with_rewrite_every(mut self, every: Duration) -> Self {
        self.rewrite_every = every;
        self
    }

    /// Waits up to `wait` (beyond the read's own time-out) for a transaction left
    /// open on the topic to end, before a read fails: at least as long as a
    /// transaction of the streams that share the topic may stay open, and the
    /// broker's interval for aborting timed-out ones.
    pub fn with_open_transaction_wait(mut self, wait: Duration) -> Self {
        self.open_transaction_wait = wait;
        self
    }

    fn location(&self) -> String {
        format!("topic {} key {}", self.topic, self.stream_name)
    }

    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (key, value) in &self.connection {
            config.set(key, value);
        }
        config
    }

    fn transient(&self, reason: impl std::fmt::Display) -> CheckpointError {
        CheckpointError::Transient {
            cause: None,
            location: self.location(),
            reason: reason.to_string(),
        }
    }

    fn producer(&mut self) -> Result<FutureProducer, CheckpointError> {
        if let Some(producer) = &self.producer {
            return Ok(producer.clone());
        }
        let mut config = self.client_config();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", self.timeout.as_millis().to_string());
        let producer: FutureProducer = config.create().map_err(|e| CheckpointError::Io {
            location: self.location(),
            // The client's own error may quote a property's value (a secret): the
            // redacted text stands in for it.
            reason: format!(
                "cannot create the Kafka producer: {}",
                crate::kafka_client::config_error(&e)
            ),
            cause: None,
        })?;
        self.producer = Some(producer.clone());
        Ok(producer)
    }

    /// Creates the topic compacted when it does not exist; on an existing topic,
    /// asks what its `cleanup.policy` does (see [`KafkaStore::settle_retention`]).
    /// Once per store, before its first write (a read of a topic that does not
    /// exist finds no checkpoint, and creates nothing).
    pub async fn prepare(&mut self) -> Result<(), CheckpointError> {
        if self.prepared {
            return Ok(());
        }
        let exists = self.topic_partitions().await?.is_some();
        if !exists {
            self.create_topic().await?;
            self.retention = Some(Retention::Kept);
        } else {
            let mut asked = tokio::spawn(describe_retention(
                self.client_config(),
                self.topic.clone(),
                self.question_timeout,
            ));
            // A broker that answers DescribeConfigs does so at once: its verdict
            // comes before the first write.
            match tokio::time::timeout(RETENTION_WAIT_AT_START, &mut asked).await {
                Ok(answered) => {
                    self.settle(answered.unwrap_or_else(|e| Retention::Unknown(e.to_string())))?;
                }
                Err(_) => self.retention_asked = Some(asked),
            }
        }
        self.prepared = true;
        Ok(())
    }

    /// Acts on the topic's `cleanup.policy` once its answer is in (asked in the
    /// background, so that brokers that never answer, as the test double, hold no
    /// start): a policy that deletes records fails the run with the command that
    /// fixes it; one that could not be read is said, and the last position is then
    /// written again every [`REWRITE_EVERY`]. Called before each write and between
    /// batches.
    async fn settle_retention(&mut self) -> Result<(), CheckpointError> {
        let Some(asked) = self.retention_asked.take_if(|asked| asked.is_finished()) else {
            return Ok(());
        };
        // Finished: the join returns at once.
        let answered = asked
            .await
            .unwrap_or_else(|e| Retention::Unknown(e.to_string()));
        self.settle(answered)
    }

    fn settle(&mut self, retention: Retention) -> Result<(), CheckpointError> {
        match &retention {
            Retention::Kept => {}
            Retention::Deleted { policy, retention } => {
                return Err(CheckpointError::Io {
                    cause: None,
                    location: self.location(),
                    reason: format!(
                        "checkpoint.topic {} has cleanup.policy={policy} (retention.ms {retention}): a stream quiet longer than that would lose its only record and start again from source.start_position; make it compacted: kafka-configs.sh --bootstrap-server <brokers> --alter --entity-type topics --entity-name {} --add-config cleanup.policy=compact",
                        self.topic, self.topic
                    ),
                });
            }
            Retention::Unknown(why) => tracing::warn!(
                topic = %self.topic,
                reason = %why,
                "cannot read the checkpoint topic's cleanup.policy: if it deletes records (Event Hubs keeps events only for its retention period), a quiet stream's checkpoint would expire; the last position is written again every 30 minutes so that it stays"
            ),
        }
        self.retention = Some(retention);
        Ok(())
    }

    /// What the topic's `cleanup.policy` does to a quiet stream's record (the
    /// admin API's DescribeConfigs, bounded by the store's time-out).
    /// What the topic's `cleanup.policy` does to a quiet stream, waiting at most
    /// `wait` for the answer.
    pub async fn retention(&self, wait: Duration) -> Retention {
        describe_retention(self.client_config(), self.topic.clone(), wait).await
    }

    /// Writes the last position again where the topic's retention is unknown and
    /// it is [`REWRITE_EVERY`] old, so that a quiet stream's record stays. Called
    /// between batches (with the lease checks of the other stores).
    pub async fn keep_alive(&mut self) -> Result<(), CheckpointError> {
        self.settle_retention().await?;
        let unknown = matches!(self.retention, Some(Retention::Unknown(_)));
        let Some((document, at)) = self.last_written.clone() else {
            return Ok(());
        };
        if !unknown || self.sink_writes || at.elapsed() < self.rewrite_every {
            return Ok(());
        }
        self.send(document).await?;
        tracing::debug!(topic = %self.topic, "wrote the last position again (the topic's retention is unknown)");
        Ok(())
    }

    /// The topic's partitions, `None` when it does not exist. A topic of more than
    /// one partition is refused: the store's writes and the sink's transactional
    /// ones may be placed by different partitioners, and positions found in two
    /// partitions cannot be told apart by age.
    async fn topic_partitions(&self) -> Result<Option<Vec<i32>>, CheckpointError> {
        use crate::kafka_client::LookupError;
        let partitions =
            crate::kafka_client::topic_partitions(self.client_config(), &self.topic, self.timeout)
                .await
                .map_err(|e| match e {
                    LookupError::Unreachable(_) => self.transient(e),
                    LookupError::Client(_) => CheckpointError::Io {
                        location: self.location(),
                        reason: "cannot read the topic's partitions".to_owned(),
                        cause: Some(crate::error::cause(e)),
                    },
                })?;
        match &partitions {
            Some(list) if list.len() > 1 => Err(CheckpointError::Io {
                cause: None,
                location: self.location(),
                reason: format!(
                    "checkpoint.topic has {} partitions; it must have one (every stream's checkpoints in one ordered log): create a topic with one partition and cleanup.policy=compact (kafka-topics.sh --create --topic <name> --partitions 1 --config cleanup.policy=compact) and set checkpoint.topic to it",
                    list.len()
                ),
            }),
            _ => Ok(partitions),
        }
    }

    async fn create_topic(&self) -> Result<(), CheckpointError> {
        use crate::kafka_client::CreateTopicError;
        let created = crate::kafka_client::create_topic(
            &self.client_config(),
            &self.topic,
            1,
            &[("cleanup.policy", "compact")],
            self.timeout,
        )
        .await;
        match created {
            Ok(true) => {
                tracing::info!(topic = %self.topic, "created the checkpoint topic (compacted, one partition)");
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e @ CreateTopicError::Transient(_)) => Err(self.transient(e)),
            Err(e @ CreateTopicError::Client(_)) => Err(CheckpointError::Io {
                location: self.location(),
                reason: "cannot create the topic".to_owned(),
                cause: Some(crate::error::cause(e)),
            }),
            Err(CreateTopicError::Refused(code)) => Err(CheckpointError::Io {
                cause: None,
                location: self.location(),
                reason: format!(
                    "cannot create the topic ({code}): create it with cleanup.policy=compact, or give the login the right to create topics"
                ),
            }),
        }
    }

    /// The last checkpoint of this stream in the topic.
    pub async fn load(&mut self) -> Result<Option<Position>, CheckpointError> {
        let key = Some(self.stream_name.clone());
        let mut found = self.last_values(key).await?;
        match found.remove(&self.stream_name) {
            Some(text) => parse(&text, &self.stream_name, &self.location()).map(Some),
            None => Ok(None),
        }
    }

    /// The last checkpoint of every other stream in the topic. Read without the
    /// lease or the writes: this store is a reader of its own.
    pub async fn peers(&mut self) -> Result<Vec<super::Checkpoint>, CheckpointError> {
        let found = self.last_values(None).await?;
        let mut peers = Vec::new();
        for (stream, text) in found {
            if stream == self.stream_name {
                continue;
            }
            let location = format!("{} (key {stream})", self.location());
            match super::parse_any(&text, &location) {
                Ok(checkpoint) => peers.push(checkpoint),
                Err(CheckpointError::Corrupt { reason, .. }) => {
                    tracing::warn!(%location, %reason, "another key's record is not a checkpoint; the cleanup after delivery passes it over");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(peers)
    }

    /// The last value of `key` (every key's, with `None`) in the topic.
    async fn last_values(
        &mut self,
        key: Option<String>,
    ) -> Result<std::collections::BTreeMap<String, String>, CheckpointError> {
        let Some(partitions) = self.topic_partitions().await? else {
            return Ok(Default::default());
        };
        let config = self.client_config();
        let read = Read {
            topic: self.topic.clone(),
            key,
            timeout: self.timeout,
            open_transaction_wait: self.open_transaction_wait,
        };
        let read = tokio::task::spawn_blocking(move || read.last_values(config, &partitions))
            .await
            .map_err(|e| CheckpointError::Io {
                location: self.location(),
                reason: "the read's thread failed".to_owned(),
                cause: Some(crate::error::cause(e)),
            })?;
        let read = read.map_err(|failure| match failure {
            ReadFailure::Transient { reason, cause } => CheckpointError::Transient {
                location: self.location(),
                reason,
                cause: cause.map(crate::error::cause),
            },
            ReadFailure::Refused { reason, cause } => CheckpointError::Io {
                location: self.location(),
                reason,
                cause: Some(crate::error::cause(cause)),
            },
        })?;
        Ok(read)
    }

    /// Whether the topic can be reached (for `check`: nothing written).
    pub async fn check_writable(&mut self) -> Result<(), CheckpointError> {
        self.topic_partitions().await.map(|_| ())
    }

    /// From now on the sink writes the positions in its transactions
    /// (`sink.exactly_once`), and [`save`](Self::save) writes nothing: a write of its
    /// own, outside a transaction, could put back an older position after a
    /// successor committed a newer one (a paused process resuming).
    pub fn hand_over_writes(&mut self) {
        self.sink_writes = true;
    }

    /// Writes `position`, returning once the broker acknowledged it (nothing once
    /// the writes are [handed over](Self::hand_over_writes)).
    pub async fn save(&mut self, position: &Position) -> Result<(), CheckpointError> {
        if self.sink_writes {
            return Ok(());
        }
        self.prepare().await?;
        self.settle_retention().await?;
        let document = render(&self.stream_name, position, &self.location())?;
        self.send(document).await
    }

    /// Sends one document as the stream's record, returning once acknowledged.
    async fn send(&mut self, document: String) -> Result<(), CheckpointError> {
        let producer = self.producer()?;
        let record = FutureRecord::to(&self.topic)
            .key(self.stream_name.as_bytes())
            .payload(document.as_bytes());
        let grant = format!("WRITE on topic {}", self.topic);
        let sent = producer
            .send(record, self.timeout)
            .await
            .map(|_| ())
            .map_err(
                |(e, _)| match crate::kafka_client::refused_right(&e, &grant) {
                    Some(refused) => CheckpointError::Io {
                        location: self.location(),
                        reason: format!("{refused}; a restart repeats it"),
                        cause: Some(crate::error::cause(e)),
                    },
                    None => CheckpointError::Transient {
                        location: self.location(),
                        reason: "the write was not acknowledged".to_owned(),
                        cause: Some(crate::error::cause(e)),
                    },
                },
            );
        if sent.is_ok() {
            self.last_written = Some((document, std::time::Instant::now()));
        }
        sent
    }
}

/// The group's coordinator refused the login (no DESCRIBE on the reader's group):
/// the read does not use the group, so this is no failure of it.
fn is_group_refusal(error: &rdkafka::error::KafkaError) -> bool {
    crate::kafka_client::error_code(error)
        == Some(rdkafka::types::RDKafkaErrorCode::GroupAuthorizationFailed)
}

/// The checkpoint reader's client context: librdkafka's errors as the default
/// context logs them, but a refused coordinator lookup of the reader's group only
/// at debug (the read needs no right on the group).
struct ReaderContext;

impl rdkafka::ClientContext for ReaderContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if is_group_refusal(&error) {
            tracing::debug!(error = %crate::error::Chain(&error), reason, "the checkpoint reader's group is not authorised; the read does not need it");
        } else {
            tracing::warn!(error = %crate::error::Chain(&error), reason, "the checkpoint reader's Kafka client");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ReaderContext {}

/// Why a read failed, with the client's error behind it when there is one.
enum ReadFailure {
    /// It may pass (brokers down, a time-out).
    Transient {
        reason: String,
        cause: Option<rdkafka::error::KafkaError>,
    },
    /// The login lacks a right: a restart repeats it.
    Refused {
        reason: String,
        cause: rdkafka::error::KafkaError,
    },
}

impl ReadFailure {
    fn transient(reason: impl Into<String>) -> Self {
        ReadFailure::Transient {
            reason: reason.into(),
            cause: None,
        }
    }

    /// The client failed while `doing`.
    fn client(doing: impl Into<String>) -> impl FnOnce(rdkafka::error::KafkaError) -> Self {
        move |cause| ReadFailure::Transient {
            reason: doing.into(),
            cause: Some(cause),
        }
    }
}

/// One read of the checkpoint topic: the last record under `key` in `topic`, or
/// under every key.
struct Read {
    topic: String,
    key: Option<String>,
    /// Bound on reading what is there.
    timeout: Duration,
    /// Further bound on waiting for a transaction left open below the end.
    open_transaction_wait: Duration,
}

impl Read {
    /// A consumer's error: a refused right names the ACL the login lacks.
    fn failure(&self, error: &rdkafka::error::KafkaError) -> ReadFailure {
        let grant = format!("READ on topic {}", self.topic);
        match crate::kafka_client::refused_right(error, &grant) {
            Some(refused) => ReadFailure::Refused {
                reason: format!("{refused}; a restart repeats it"),
                cause: error.clone(),
            },
            None => ReadFailure::Transient {
                reason: "the read failed".to_owned(),
                cause: Some(error.clone()),
            },
        }
    }

    /// The last payload under the key (each key) in `partitions`, read
    /// `read_committed` up to each partition's high watermark as it stood when the
    /// read began. A key whose last record has no payload has none.
    fn last_values(
        &self,
        config: ClientConfig,
        partitions: &[i32],
    ) -> Result<BTreeMap<String, String>, ReadFailure> {
        let (assignment, ends) = self.ends(&config, partitions)?;
        if ends.is_empty() {
            return Ok(BTreeMap::new());
        }
        let consumer = self.consumer(config, &assignment)?;
        let mut progress = ToTheEnd {
            read: self,
            ends,
            started: Instant::now(),
            waiting_said: false,
        };
        let mut last = LastValues::default();
        while !progress.ends.is_empty() {
            progress.within_bound()?;
            match consumer.poll(Duration::from_millis(100)) {
                None => {
                    let positions = consumer
                        .position()
                        .map_err(ReadFailure::client("cannot read the consumer's position"))?;
                    progress.quiet(&positions)?;
                }
                Some(Err(e)) if is_group_refusal(&e) => {}
                Some(Err(e)) => return Err(self.failure(&e)),
                Some(Ok(message)) => {
                    last.keep(self.key.as_deref(), &message);
                    progress.record_read(message.partition(), message.offset());
                }
            }
        }
        Ok(last.into_values())
    }

    /// What was written, as a read_uncommitted client lists it (a read_committed one
    /// lists the last stable offset, which an open transaction holds back): each
    /// partition that holds records, assigned from its first offset, and its end.
    fn ends(
        &self,
        config: &ClientConfig,
        partitions: &[i32],
    ) -> Result<(rdkafka::TopicPartitionList, BTreeMap<i32, i64>), ReadFailure> {
        let lister: BaseConsumer = config
            .clone()
            .set("isolation.level", "read_uncommitted")
            .create()
            .map_err(|e| ReadFailure::transient(crate::kafka_client::config_error(&e)))?;
        let mut assignment = rdkafka::TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        for &partition in partitions {
            let (low, high) = lister
                .fetch_watermarks(&self.topic, partition, self.timeout)
                .map_err(ReadFailure::client(format!(
                    "cannot read partition {partition}'s offsets"
                )))?;
            if high > low {
                assignment
                    .add_partition_offset(&self.topic, partition, rdkafka::Offset::Offset(low))
                    .map_err(ReadFailure::client("cannot assign the partition"))?;
                ends.insert(partition, high);
            }
        }
        Ok((assignment, ends))
    }

    /// A read_committed consumer of `assignment`. librdkafka reads assigned
    /// partitions only in a group, and looks its coordinator up; nothing is committed
    /// to it, and fetching needs no right on it, so a login without DESCRIBE on the
    /// group reads all the same: its refusal is not an error of the read (see
    /// `ReaderContext`).
    fn consumer(
        &self,
        mut config: ClientConfig,
        assignment: &rdkafka::TopicPartitionList,
    ) -> Result<BaseConsumer<ReaderContext>, ReadFailure> {
        let consumer: BaseConsumer<ReaderContext> = config
            .set("group.id", READER_GROUP)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create_with_context(ReaderContext)
            .map_err(|e| ReadFailure::transient(crate::kafka_client::config_error(&e)))?;
        consumer
            .assign(assignment)
            .map_err(ReadFailure::client("cannot assign the partitions"))?;
        Ok(consumer)
    }
}

/// Where a read stands against the ends it reads to: the partitions not yet read to
/// their end, since when it reads, and whether the wait for a transaction left open
/// was said.
struct ToTheEnd<'a> {
    read: &'a Read,
    ends: BTreeMap<i32, i64>,
    started: Instant,
    waiting_said: bool,
}

impl ToTheEnd<'_> {
    /// Records that keep coming without the end in reach fail the read past twice its
    /// time-out and the wait for an open transaction (that wait is bounded in
    /// [`ToTheEnd::quiet`], where nothing comes).
    fn within_bound(&self) -> Result<(), ReadFailure> {
        let read = self.read;
        if self.started.elapsed() > 2 * read.timeout + read.open_transaction_wait {
            return Err(self.not_read_to_the_end());
        }
        Ok(())
    }

    fn not_read_to_the_end(&self) -> ReadFailure {
        ReadFailure::transient(format!(
            "the topic was not read to its end within {} ms",
            self.started.elapsed().as_millis()
        ))
    }

    /// A record at `offset` of `partition` was read: the partition is done once it
    /// is the last before the end.
    fn record_read(&mut self, partition: i32, offset: i64) {
        if self
            .ends
            .get(&partition)
            .is_some_and(|end| offset + 1 >= *end)
        {
            self.ends.remove(&partition);
        }
    }

    /// Nothing came within a poll. A partition whose last records are aborted or
    /// control records ends before its high watermark: its position tells. One held
    /// below its end by a transaction left open is waited for, said once, up to the
    /// read's time-out and the wait for open transactions; past them the read fails
    /// naming the partition and the offset.
    fn quiet(&mut self, positions: &rdkafka::TopicPartitionList) -> Result<(), ReadFailure> {
        let mut held = None;
        for element in positions.elements() {
            let end = self.ends.get(&element.partition()).copied();
            match (element.offset(), end) {
                (rdkafka::Offset::Offset(at), Some(end)) if at >= end => {
                    self.ends.remove(&element.partition());
                }
                (rdkafka::Offset::Offset(at), Some(end)) => {
                    held = Some((element.partition(), at, end))
                }
                _ => {}
            }
        }
        let read = self.read;
        let waited = self.started.elapsed();
        if waited < read.timeout {
            return Ok(());
        }
        let past_the_wait = waited > read.timeout + read.open_transaction_wait;
        let Some((partition, at, end)) = held else {
            return match past_the_wait {
                true => Err(self.not_read_to_the_end()),
                false => Ok(()),
            };
        };
        if past_the_wait {
            return Err(ReadFailure::transient(format!(
                "partition {partition} holds a transaction that is neither committed nor aborted at offset {at}, below checkpoints written up to offset {end}; waited {} ms for it to end. It is another writer's on this topic: it ends when that writer commits or aborts it, or when Kafka aborts it at its transaction.timeout.ms",
                waited.as_millis()
            )));
        }
        if !self.waiting_said {
            self.waiting_said = true;
            tracing::info!(
                topic = read.topic.as_str(),
                partition,
                offset = at,
                end,
                wait_ms = read.open_transaction_wait.as_millis() as u64,
                "a transaction left open on the checkpoint topic hides later checkpoints; waiting for it to end rather than resume from an older one"
            );
        }
        Ok(())
    }
}

/// Per key, the offset and payload of its last record read. One partition holds a
/// key (the producer's partitioner), so its last record is the one of the highest
/// offset.
#[derive(Default)]
struct LastValues(BTreeMap<Vec<u8>, (i64, Option<String>)>);

impl LastValues {
    /// Keeps `message` if it is under `key` (any key when `None`) and later than what
    /// is kept for its key. A record without a key is no one's.
    fn keep(&mut self, key: Option<&str>, message: &impl Message) {
        let wanted = match (key, message.key()) {
            (_, None) => None,
            (Some(key), Some(found)) => (found == key.as_bytes()).then_some(found),
            (None, Some(found)) => Some(found),
        };
        let Some(key) = wanted else { return };
        let value = message
            .payload()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let slot = self.0.entry(key.to_vec()).or_insert((-1, None));
        if message.offset() > slot.0 {
            *slot = (message.offset(), value);
        }
    }

    /// Each key's last payload; a key whose last record has none (a tombstone), or
    /// that is not UTF-8, has none.
    fn into_values(self) -> BTreeMap<String, String> {
        self.0
            .into_iter()
            .filter_map(|(key, (_, value))| Some((String::from_utf8(key).ok()?, value?)))
            .collect()
    }
}

/// What `topic`'s `cleanup.policy` does to a quiet stream's record: DescribeConfigs,
/// bounded by `wait`.
async fn describe_retention(config: ClientConfig, topic: String, wait: Duration) -> Retention {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    let admin = match config.create::<AdminClient<rdkafka::client::DefaultClientContext>>() {
        Ok(admin) => admin,
        Err(e) => return Retention::Unknown(crate::kafka_client::config_error(&e)),
    };
    let options = AdminOptions::new().request_timeout(Some(wait));
    let described = tokio::time::timeout(
        wait + Duration::from_secs(1),
        admin.describe_configs([&ResourceSpecifier::Topic(&topic)], &options),
    )
    .await;
    let config = match described {
        Ok(Ok(results)) => match results.into_iter().next() {
            Some(Ok(config)) => config,
            Some(Err(code)) => return Retention::Unknown(format!("{code:?}")),
            None => return Retention::Unknown("no answer for the topic".into()),
        },
        Ok(Err(e)) => return Retention::Unknown(e.to_string()),
        Err(_) => {
            return Retention::Unknown(format!("no answer within {} ms", wait.as_millis()));
        }
    };
    let value = |key: &str| config.get(key).and_then(|e| e.value.clone());
    match value("cleanup.policy") {
        Some(policy) if policy.contains("delete") => Retention::Deleted {
            policy,
            retention: value("retention.ms").unwrap_or_else(|| "unknown".into()),
        },
        Some(_) => Retention::Kept,
        None => Retention::Unknown("no cleanup.policy in the answer".into()),
    }
}

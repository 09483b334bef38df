//! Reading back what the poller wrote, the way a consumer would: messages from a
//! newline-delimited file (the stream sinks' output: JSON, or base64 Avro lines) or
//! from Kafka (structured or binary mode), segments reassembled per ordered stream (a
//! file, a partition), and each logical event printed once as a JSON line — the whole
//! event with its reassembled `data`, or (`data_only`) the decoded Data object with
//! `old` and `current` as objects.
//!
//! It also checks what a consumer relies on: no segment missing, no event cut off at
//! the end, per-stream commit order, and it drops and counts duplicates (by event
//! `id`), which at-least-once delivery allows after a restart.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Write};

use base64::Engine as _;

use crate::event::Encoding;
use crate::event::readback::{
    self, CloudEvent, LogicalEvent, ReadError, Reassembler, decode_data_of, decode_message,
};
use crate::event::schema_change::SCHEMA_CHANGE_TYPE;

/// How events are printed.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// How the events were encoded (`--encoding`); `None`: a file's from its first
    /// record, a Kafka message's from what it says (JSON where it says nothing).
    pub encoding: Option<Encoding>,
    /// Print the decoded Data object instead of the whole event.
    pub data_only: bool,
    /// Stop after this many logical events.
    pub max_events: Option<u64>,
    /// The read continues where an earlier one stopped (a consumer group): an event
    /// earlier in commit order may then be a restart's re-send of one that earlier
    /// read printed, which this one cannot tell from disorder. Counted, not a problem.
    pub resumed: bool,
}

/// What a read found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReadSummary {
    /// Messages (segments) read.
    pub messages: u64,
    /// Logical events printed.
    pub events: u64,
    /// Whole events seen again (same first-segment `id`) and not printed again.
    pub duplicates: u64,
    /// Partial events dropped because the producer re-sent from an earlier point.
    pub abandoned: u64,
    /// Events earlier in commit order than one already printed from the same stream,
    /// other than duplicates.
    pub out_of_order: u64,
    /// Events per `schema.table` (change events; schema changes are counted on
    /// their own).
    pub per_table: BTreeMap<String, u64>,
    /// Schema-change events printed.
    pub schema_changes: u64,
    /// What could not be read: undecodable messages, missing segments, events cut
    /// off at the end. Each names the stream and the event.
    pub problems: Vec<String>,
}

impl ReadSummary {
    /// One line for a person.
    pub fn line(&self) -> String {
        let tables: Vec<String> = self
            .per_table
            .iter()
            .map(|(table, n)| format!("{table}={n}"))
            .collect();
        let counted =
            |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let schema_changes = if self.schema_changes == 0 {
            String::new()
        } else {
            format!(
                " ({})",
                counted(self.schema_changes, "schema change", "schema changes")
            )
        };
        format!(
            "read {}: {}{schema_changes}, {} dropped, {} re-sent, {} out of order, {}; per table: {}",
            counted(self.messages, "message", "messages"),
            counted(self.events, "event", "events"),
            counted(self.duplicates, "duplicate", "duplicates"),
            counted(self.abandoned, "partial event", "partial events"),
            self.out_of_order,
            counted(self.problems.len() as u64, "problem", "problems"),
            if tables.is_empty() {
                "none".to_owned()
            } else {
                tables.join(", ")
            }
        )
    }
}

#[derive(Default)]
struct Stream {
    reassembler: Reassembler,
    /// Per stream GUID (the `logicalid`'s first part): the position of the last
    /// event printed from this stream. Two databases writing one topic or file each
    /// have their own commit order.
    last: HashMap<String, (String, String)>,
    /// Per stream GUID and `schema.table`: the last table version a schema-change
    /// event of this stream announced.
    versions: HashMap<(String, String), u64>,
}

/// Takes messages from one or more ordered streams and prints logical events.
pub struct EventReader<W: Write> {
    out: W,
    options: ReadOptions,
    streams: HashMap<String, Stream>,
    seen: HashSet<String>,
    summary: ReadSummary,
    /// Where in its stream the message being read is (`line 12`, `offset 345`).
    place: Option<String>,
    /// Messages that could not be decoded.
    undecodable: u64,
}

impl<W: Write> EventReader<W> {
    pub fn new(out: W, options: ReadOptions) -> Self {
        EventReader {
            out,
            undecodable: 0,
            options,
            streams: HashMap::new(),
            seen: HashSet::new(),
            summary: ReadSummary::default(),
            place: None,
        }
    }

    /// The next message (or undecodable input) is at `place` of its stream: problems
    /// name it.
    pub fn at(&mut self, place: String) {
        self.place = Some(place);
    }

    /// `stream line 12`: where a problem was found.
    fn located(&self, stream: &str) -> String {
        match &self.place {
            Some(place) => format!("{stream} {place}"),
            None => stream.to_owned(),
        }
    }

    /// Whether `max_events` has been reached.
    pub fn done(&self) -> bool {
        self.options
            .max_events
            .is_some_and(|max| self.summary.events >= max)
    }

    /// Whether `stream` has an event waiting for more segments.
    pub fn is_open(&self, stream: &str) -> bool {
        self.streams
            .get(stream)
            .is_some_and(|s| s.reassembler.is_open())
    }

    /// A message of `stream` that could not be decoded. After
    /// [`UNDECODABLE_LISTED`] of them, the rest are counted in one problem rather
    /// than listed one by one.
    pub fn undecodable(&mut self, stream: &str, error: impl std::fmt::Display) {
        self.summary.messages += 1;
        self.undecodable += 1;
        if self.undecodable <= UNDECODABLE_LISTED {
            let at = self.located(stream);
            self.summary
                .problems
                .push(format!("{at}: undecodable message: {error}"));
        }
    }

    /// The next message of `stream`, in that stream's order.
    pub fn push(&mut self, stream: &str, message: CloudEvent) -> std::io::Result<()> {
        self.summary.messages += 1;
        let at = self.located(stream);
        let state = self.streams.entry(stream.to_owned()).or_default();
        // Kept while an event is open: if this message breaks it, it may well be
        // the start of the next one.
        let retry = state.reassembler.is_open().then(|| message.clone());
        let event = match state.reassembler.push(message) {
            Ok(Some(event)) => Some(event),
            Ok(None) => None,
            Err(e) => {
                self.summary.problems.push(format!("{at}: {e}"));
                // Start the stream afresh with this message.
                state.reassembler = Reassembler::new();
                match retry.map(|m| state.reassembler.push(m)) {
                    Some(Ok(event)) => event,
                    Some(Err(_)) => {
                        state.reassembler = Reassembler::new();
                        None
                    }
                    None => None,
                }
            }
        };
        match event {
            Some(event) => self.emit(stream, event),
            None => Ok(()),
        }
    }

    fn emit(&mut self, stream: &str, event: LogicalEvent) -> std::io::Result<()> {
        if self.done() {
            return Ok(());
        }
        let at = self.located(stream);
        let first_id = event.segment_ids.first().cloned().unwrap_or_default();
        if !self.seen.insert(first_id) {
            self.summary.duplicates += 1;
            return Ok(());
        }
        // The event says how its data is encoded (`datacontenttype`), whatever
        // `--encoding` said of the messages.
        let encoding = match event.event.datacontenttype.as_str() {
            crate::event::AVRO_CONTENT_TYPE => Encoding::Avro,
            crate::event::JSON_CONTENT_TYPE => Encoding::Json,
            _ => self.options.encoding.unwrap_or(Encoding::Json),
        };
        let schema_change = event.event.event_type == SCHEMA_CHANGE_TYPE;
        let data = match decode_data_of(&event.event.event_type, &event.event.data, encoding) {
            Ok(data) => data,
            Err(e) => {
                self.summary
                    .problems
                    .push(format!("{at}: {}: {e}", event.event.logicalid));
                return Ok(());
            }
        };
        // A loaded row (beginlsn zero) numbers its table's rows at the load's LSN, so
        // its logicalid is no place in commit order: only changes are checked.
        let loaded =
            data["eventsource"]["transaction"]["beginlsn"].as_str() == Some(LOADED_BEGIN_LSN);
        let guid = event
            .event
            .logicalid
            .split(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        if schema_change {
            // Not a place in commit order (it precedes its table's first event of
            // a new shape, wherever in the transaction that is): its table's
            // versions must grow instead.
            self.check_version(stream, &at, guid, &data);
            let line = if self.options.data_only {
                serde_json::json!({ "schemachange": data })
            } else {
                whole_event(&event.event, &data, encoding)
            };
            serde_json::to_writer(&mut self.out, &line)?;
            self.out.write_all(b"\n")?;
            self.summary.events += 1;
            self.summary.schema_changes += 1;
            return Ok(());
        }
        if let Some(state) = self.streams.get_mut(stream).filter(|_| !loaded) {
            let here = readback::position(&event.event.logicalid)
                .map(|(lsn, sequence)| (lsn.to_owned(), sequence.to_owned()));
            if let (Some(here), Some(last)) = (&here, state.last.get(&guid))
                && here < last
            {
                self.summary.out_of_order += 1;
                if !self.options.resumed {
                    self.summary.problems.push(format!(
                        "{at}: event {} is out of commit order: it comes after {}:{}",
                        event.event.logicalid, last.0, last.1
                    ));
                }
            }
            if let Some(here) = here
                && state.last.get(&guid).is_none_or(|last| &here > last)
            {
                state.last.insert(guid, here);
            }
        }
        let table = table_of(&data);
        *self.summary.per_table.entry(table).or_default() += 1;
        let line = if self.options.data_only {
            expand_rows(data)
        } else {
            whole_event(&event.event, &data, encoding)
        };
        serde_json::to_writer(&mut self.out, &line)?;
        self.out.write_all(b"\n")?;
        self.summary.events += 1;
        Ok(())
    }

    /// A schema-change event's table version must be above the last one this
    /// stream announced for the table (a re-send has the same id and is dropped
    /// before it gets here).
    fn check_version(&mut self, stream: &str, at: &str, guid: String, data: &serde_json::Value) {
        let table = table_of(data);
        let Some(version) = data["tableversion"].as_u64() else {
            self.summary.problems.push(format!(
                "{at}: a schema-change event of {table} has no tableversion"
            ));
            return;
        };
        let Some(state) = self.streams.get_mut(stream) else {
            return;
        };
        let last = state.versions.insert((guid, table.clone()), version);
        if let Some(last) = last.filter(|&last| version <= last) {
            self.summary.out_of_order += 1;
            if !self.options.resumed {
                self.summary.problems.push(format!(
                    "{at}: table {table} version {version} comes after version {last}: versions only grow"
                ));
            }
        }
    }

    /// Ends every stream and returns what was read. An event still missing segments
    /// is a problem when the streams were read to their end; not when the read was
    /// `cut_short` (`max_events`, an interrupt), which stopped it mid-event.
    pub fn finish(mut self, cut_short: bool) -> std::io::Result<ReadSummary> {
        if self.undecodable > UNDECODABLE_LISTED {
            self.summary.problems.push(format!(
                "{} more undecodable messages, not listed",
                self.undecodable - UNDECODABLE_LISTED
            ));
        }
        self.out.flush()?;
        let cut_short = cut_short || self.done();
        let mut streams: Vec<(String, Stream)> = self.streams.drain().collect();
        streams.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, state) in streams {
            self.summary.abandoned += state.reassembler.abandoned() as u64;
            if let Err(e) = state.reassembler.finish()
                && !cut_short
            {
                self.summary.problems.push(format!("{name}: {e}"));
            }
        }
        Ok(self.summary)
    }
}

/// `beginlsn` of a row an initial load read: no transaction begins at LSN zero.
const LOADED_BEGIN_LSN: &str = "00000000:00000000:0000";

/// `schema.table` from a Data object's `eventsource`.
fn table_of(data: &serde_json::Value) -> String {
    let source = &data["eventsource"];
    match (source["schema"].as_str(), source["tbl"].as_str()) {
        (Some(schema), Some(table)) => format!("{schema}.{table}"),
        _ => "?".to_owned(),
    }
}

/// The Data object with `eventrow.old` and `eventrow.current` (JSON text in CES)
/// parsed into objects.
fn expand_rows(mut data: serde_json::Value) -> serde_json::Value {
    for image in ["old", "current"] {
        let row = &mut data["eventrow"][image];
        if let Some(text) = row.as_str()
            && let Ok(parsed) = serde_json::from_str::<serde_json::Value>(text)
        {
            *row = parsed;
        }
    }
    data
}

/// The event's attributes, `data` as CES carries it in JSON (the Data object as
/// text), whatever the encoding it arrived in.
fn whole_event(
    event: &CloudEvent,
    data: &serde_json::Value,
    encoding: Encoding,
) -> serde_json::Value {
    // Avro's Data record is printed as the JSON text CES carries: so says its
    // content type then.
    let (data_text, content_type) = match encoding {
        Encoding::Json => (
            String::from_utf8_lossy(&event.data).into_owned(),
            event.datacontenttype.as_str(),
        ),
        Encoding::Avro => (data.to_string(), "application/json"),
    };
    serde_json::json!({
        "specversion": event.specversion,
        "type": event.event_type,
        "source": event.source,
        "id": event.id,
        "logicalid": event.logicalid,
        "time": event.time,
        "datacontenttype": content_type,
        "operation": event.operation,
        "segmentindex": 0,
        "finalsegment": true,
        "data": data_text,
    })
}

/// Undecodable messages listed one by one; more are counted.
pub const UNDECODABLE_LISTED: u64 = 5;

/// The encoding other than `encoding`.
fn other(encoding: Encoding) -> Encoding {
    match encoding {
        Encoding::Json => Encoding::Avro,
        Encoding::Avro => Encoding::Json,
    }
}

/// A line's decoding error, saying when the line decodes with the other encoding
/// (a file written with `event.encoding = "avro"` read without `--encoding avro`).
fn decode_line_or_say(line: &str, encoding: Encoding) -> Result<CloudEvent, String> {
    decode_line(line, encoding).map_err(|e| match decode_line(line, other(encoding)) {
        Ok(_) => format!(
            "{e}; it decodes as {}: read with --encoding {}",
            other(encoding),
            other(encoding)
        ),
        Err(_) => e.to_string(),
    })
}

/// Decodes one line of a stream sink's output: JSON as it is, Avro as base64.
fn decode_line(line: &str, encoding: Encoding) -> Result<CloudEvent, ReadError> {
    match encoding {
        Encoding::Json => decode_message(line.as_bytes(), encoding),
        Encoding::Avro => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(line.trim())
                .map_err(|e| ReadError::Avro {
                    reason: format!("not base64: {e}"),
                })?;
            decode_message(&bytes, encoding)
        }
    }
}

/// Reads a newline-delimited stream (a file, stdin) as one ordered stream, to its
/// end.
pub fn read_lines<W: Write>(
    input: impl BufRead,
    stream: &str,
    reader: &mut EventReader<W>,
) -> std::io::Result<()> {
    follow_lines(input, stream, reader, None)
}

/// Reads a newline-delimited stream as one ordered stream. With `follow`, its end is
/// only "nothing yet": lines appended later are read as they come (a line still
/// being written waits for its newline), until the flag is set. A line that is not
/// UTF-8 is a problem naming its line; the reading goes on.
pub fn follow_lines<W: Write>(
    mut input: impl BufRead,
    stream: &str,
    reader: &mut EventReader<W>,
    follow: Option<&std::sync::atomic::AtomicBool>,
) -> std::io::Result<()> {
    let mut number = 0u64;
    let mut line = Vec::new();
    while !reader.done() {
        let read = input.read_until(b'\n', &mut line)?;
        let whole = line.ends_with(b"\n");
        if !whole {
            match follow {
                Some(stop) if !stop.load(std::sync::atomic::Ordering::Relaxed) => {
                    // What was read is printed before waiting for more.
                    reader.out.flush()?;
                    std::thread::sleep(FOLLOW_POLL);
                    continue;
                }
                // Interrupted: a line still being written is not read.
                Some(_) => break,
                None if line.is_empty() => break,
                None => {}
            }
        }
        number += 1;
        reader.at(format!("line {number}"));
        read_line(&line, stream, reader)?;
        line.clear();
        if read == 0 || !whole {
            break;
        }
    }
    Ok(())
}

/// How often `--follow` looks for lines appended to a file.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(200);

fn read_line<W: Write>(
    bytes: &[u8],
    stream: &str,
    reader: &mut EventReader<W>,
) -> std::io::Result<()> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        reader.undecodable(stream, "the line is not UTF-8");
        return Ok(());
    };
    if text.trim().is_empty() {
        return Ok(());
    }
    let encoding = match reader.options.encoding {
        Some(encoding) => encoding,
        None => {
            // Not said: the first record says it, and the rest are read alike.
            let found = if decode_line(text, Encoding::Json).is_err()
                && decode_line(text, Encoding::Avro).is_ok()
            {
                Encoding::Avro
            } else {
                Encoding::Json
            };
            reader.options.encoding = Some(found);
            found
        }
    };
    match decode_line_or_say(text, encoding) {
        Ok(message) => reader.push(stream, message),
        Err(e) => {
            reader.undecodable(stream, e);
            Ok(())
        }
    }
}

/// A binary-mode Kafka message as a CloudEvent: the `ce_*` headers and the value as
/// `data`.
fn from_binary_mode(headers: &[(String, Vec<u8>)], value: &[u8]) -> Result<CloudEvent, ReadError> {
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    let missing = |name: &str| ReadError::Json {
        reason: format!("binary mode: no `{name}` header"),
    };
    let required = |name: &str| get(name).ok_or_else(|| missing(name));
    Ok(CloudEvent {
        specversion: required("ce_specversion")?,
        event_type: required("ce_type")?,
        source: required("ce_source")?,
        id: required("ce_id")?,
        logicalid: required("ce_logicalid")?,
        time: required("ce_time")?,
        datacontenttype: required("content-type")?,
        operation: required("ce_operation")?,
        segmentindex: required("ce_segmentindex")?
            .parse()
            .map_err(|_| missing("ce_segmentindex"))?,
        finalsegment: required("ce_finalsegment")? == "true",
        data: value.to_vec(),
    })
}

/// Why reading could not go on.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("writing the events")]
    Io(#[from] std::io::Error),
    #[error("Kafka: {0}")]
    Kafka(String),
}

/// Where and how to read a topic (its `{:?}` hides the properties' secrets).
#[derive(Clone)]
pub struct KafkaInput {
    pub bootstrap_servers: String,
    pub topic: String,
    /// Only these partitions (default: all).
    pub partitions: Option<Vec<i32>>,
    /// A consumer group: read from its committed offsets (the beginning the first
    /// time) and commit what was printed, so the next read continues there.
    pub group: Option<String>,
    /// Keep reading after the topic is drained.
    pub follow: bool,
    /// Without `follow`: stop once nothing arrived for this long.
    pub idle: std::time::Duration,
    /// More librdkafka properties (security, SASL).
    pub properties: Vec<(String, String)>,
    /// Only committed transactions' records (`isolation.level=read_committed`).
    pub read_committed: bool,
}

impl std::fmt::Debug for KafkaInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaInput")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("topic", &self.topic)
            .field("partitions", &self.partitions)
            .field("group", &self.group)
            .field("follow", &self.follow)
            .field("idle", &self.idle)
            .field(
                "properties",
                &crate::kafka_client::Redacted(&self.properties),
            )
            .field("read_committed", &self.read_committed)
            .finish()
    }
}

/// Reads a topic from the beginning, each partition as one ordered stream; a message
/// with a `ce_id` header is binary mode, any other structured. Stops at `max_events`,
/// when `stop` is set, or (without `follow`) once the topic has been quiet for `idle`.
pub fn read_kafka<W: Write>(
    input: &KafkaInput,
    reader: &mut EventReader<W>,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), InputError> {
    use rdkafka::message::Message;
    let consumer = assigned_consumer(input)?;
    let encoding = reader.options.encoding.unwrap_or(Encoding::Json);
    let mut next_offsets: BTreeMap<i32, i64> = BTreeMap::new();
    let mut quiet_since = std::time::Instant::now();
    // Before the first message, fetching may take longer than `idle` (a remote
    // cluster, TLS): wait for it at least this long.
    let first_wait = input.idle.max(std::time::Duration::from_secs(10));
    let mut received = false;
    while !reader.done() && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let Some(result) = consumer.poll(std::time::Duration::from_millis(100)) else {
            // What was read is printed before waiting for more.
            reader.out.flush()?;
            let limit = if received { input.idle } else { first_wait };
            if !input.follow && quiet_since.elapsed() >= limit {
                break;
            }
            continue;
        };
        let message = match result {
            Ok(message) => message,
            // A broker that restarts, all brokers down: librdkafka reconnects.
            Err(e) => {
                eprintln!("warning: Kafka: {e}");
                continue;
            }
        };
        received = true;
        quiet_since = std::time::Instant::now();
        let stream = format!("{}[{}]", message.topic(), message.partition());
        reader.at(format!("offset {}", message.offset()));
        match decode_kafka_message(&message, encoding) {
            Ok(event) => reader.push(&stream, event)?,
            Err(e) => reader.undecodable(&stream, e),
        }
        // Committed only past whole events: an event cut off by a stop is read
        // again, from its first segment, by the next read of the group.
        if !reader.is_open(&stream) {
            next_offsets.insert(message.partition(), message.offset() + 1);
        }
    }
    if input.group.is_some() && !next_offsets.is_empty() {
        // What was read is committed only now, once it has been printed.
        reader.out.flush()?;
        commit_offsets(&consumer, &input.topic, &next_offsets)?;
    }
    Ok(())
}

/// How long `read` waits for the topic's partitions before it gives up.
const METADATA_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn kafka_error(e: rdkafka::error::KafkaError) -> InputError {
    InputError::Kafka(e.to_string())
}

/// A consumer assigned the topic's partitions (the given ones, else all): with a
/// group where it left off, else from the beginning.
fn assigned_consumer(input: &KafkaInput) -> Result<rdkafka::consumer::BaseConsumer, InputError> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &input.bootstrap_servers)
        .set(
            "group.id",
            input.group.as_deref().unwrap_or("mssql-ces-read"),
        )
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set(
            "isolation.level",
            if input.read_committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        );
    for (key, value) in &input.properties {
        config.set(key, value);
    }
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| InputError::Kafka(crate::sink::kafka::config_error(&e)))?;
    let partitions = match &input.partitions {
        Some(list) => list.clone(),
        None => {
            let metadata = consumer
                .fetch_metadata(Some(&input.topic), METADATA_WAIT)
                .map_err(|e| {
                    InputError::Kafka(format!(
                        "no answer from the brokers at {} (--bootstrap-servers) within {} s: {e}",
                        input.bootstrap_servers,
                        METADATA_WAIT.as_secs()
                    ))
                })?;
            let topic = metadata
                .topics()
                .first()
                .ok_or_else(|| InputError::Kafka(format!("no topic {}", input.topic)))?;
            if let Some(e) = topic.error() {
                return Err(InputError::Kafka(format!(
                    "topic {}: {}",
                    input.topic,
                    rdkafka::error::RDKafkaErrorCode::from(e)
                )));
            }
            topic.partitions().iter().map(|p| p.id()).collect()
        }
    };
    let offset = if input.group.is_some() {
        Offset::Stored
    } else {
        Offset::Beginning
    };
    let mut assignment = TopicPartitionList::new();
    for partition in &partitions {
        assignment
            .add_partition_offset(&input.topic, *partition, offset)
            .map_err(kafka_error)?;
    }
    consumer.assign(&assignment).map_err(kafka_error)?;
    Ok(consumer)
}

/// A consumed message as a CloudEvent: binary mode when it has a `ce_id` header,
/// else structured.
fn decode_kafka_message(
    message: &rdkafka::message::BorrowedMessage<'_>,
    encoding: Encoding,
) -> Result<CloudEvent, ReadError> {
    use rdkafka::message::{Headers, Message};
    let headers: Vec<(String, Vec<u8>)> = message
        .headers()
        .map(|h| {
            h.iter()
                .map(|header| {
                    (
                        header.key.to_owned(),
                        // A header without a value is an empty one.
                        header.value.map(<[u8]>::to_vec).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    // A message without a payload is an empty one, which does not decode.
    let value = message.payload().unwrap_or_default();
    if headers.iter().any(|(k, _)| k == "ce_id") {
        from_binary_mode(&headers, value)
    } else {
        // A structured message says its encoding in `content-type`.
        let said = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .and_then(|(_, v)| match v.as_slice() {
                v if v == crate::sink::STRUCTURED_AVRO_CONTENT_TYPE.as_bytes() => {
                    Some(Encoding::Avro)
                }
                v if v == crate::sink::STRUCTURED_JSON_CONTENT_TYPE.as_bytes() => {
                    Some(Encoding::Json)
                }
                _ => None,
            });
        decode_message(value, said.unwrap_or(encoding))
    }
}

/// Commits the group's offsets: past the last whole event read in each partition.
fn commit_offsets(
    consumer: &rdkafka::consumer::BaseConsumer,
    topic: &str,
    next_offsets: &BTreeMap<i32, i64>,
) -> Result<(), InputError> {
    use rdkafka::consumer::Consumer;
    use rdkafka::{Offset, TopicPartitionList};
    let mut commit = TopicPartitionList::new();
    for (partition, offset) in next_offsets {
        commit
            .add_partition_offset(topic, *partition, Offset::Offset(*offset))
            .map_err(kafka_error)?;
    }
    consumer
        .commit(&commit, rdkafka::consumer::CommitMode::Sync)
        .map_err(kafka_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_event(id: &str, seq: u32, index: u32, last: bool, data: &str) -> String {
        serde_json::json!({
            "specversion": "1.0", "type": "com.microsoft.SQL.CES.DML.V1", "source": "/",
            "id": id,
            "logicalid": format!("g:0000000A000000000001:{seq:020}"),
            "time": "2026-01-01T00:00:00Z", "datacontenttype": "application/json",
            "operation": "INS", "segmentindex": index, "finalsegment": last,
            "data": data,
        })
        .to_string()
    }

    const DATA: &str = r#"{"eventsource":{"schema":"dbo","tbl":"t"},"eventrow":{"old":"{}","current":"{\"id\":\"1\"}"}}"#;

    fn read(lines: &[String], data_only: bool) -> (String, ReadSummary) {
        let mut out = Vec::new();
        let mut reader = EventReader::new(
            &mut out,
            ReadOptions {
                encoding: Some(Encoding::Json),
                data_only,
                max_events: None,
                resumed: false,
            },
        );
        read_lines(lines.join("\n").as_bytes(), "file", &mut reader).unwrap();
        let summary = reader.finish(false).unwrap();
        (String::from_utf8(out).unwrap(), summary)
    }

    #[test]
    fn segments_are_joined_duplicates_dropped_and_rows_expanded() {
        let (first, second) = DATA.split_at(20);
        let lines = vec![
            json_event("a", 1, 0, false, first),
            json_event("b", 1, 1, true, second),
            // Re-sent after a restart: the whole event again.
            json_event("a", 1, 0, false, first),
            json_event("b", 1, 1, true, second),
        ];
        let (out, summary) = read(&lines, true);
        assert_eq!(summary.events, 1);
        assert_eq!(summary.messages, 4);
        assert_eq!(summary.duplicates, 1);
        assert!(summary.problems.is_empty(), "{:?}", summary.problems);
        assert_eq!(summary.per_table.get("dbo.t"), Some(&1));
        let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(line["eventrow"]["current"]["id"], "1");
        assert!(line["eventrow"]["old"].is_object());
        let (out, _) = read(&lines, false);
        let line: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(line["data"], DATA, "the whole data, reassembled");
        assert_eq!(line["id"], "a");
    }

    #[test]
    fn a_missing_segment_a_cut_off_event_and_disorder_are_reported() {
        let lines = vec![
            json_event("c", 2, 0, true, DATA),
            json_event("d", 1, 0, true, DATA),
            json_event("e", 3, 0, false, "{"),
            json_event("f", 3, 2, true, "}"),
            json_event("g", 4, 0, false, "{"),
            "not json".to_owned(),
        ];
        let (_, summary) = read(&lines, false);
        assert_eq!(summary.events, 2);
        assert_eq!(summary.out_of_order, 1, "seq 1 after seq 2");
        let problems = &summary.problems;
        assert_eq!(problems.len(), 4, "{problems:?}");
        // Each names the line of the file it was found at.
        assert!(
            problems[0].starts_with("file line 2: event ")
                && problems[0].contains("out of commit order"),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("file line 4: ") && problems[1].contains("segment"),
            "{problems:?}"
        );
        assert!(
            problems[2].starts_with("file line 6: undecodable"),
            "{problems:?}"
        );
        assert!(problems[3].contains("ended"), "{problems:?}");
    }

    #[test]
    fn loaded_rows_of_two_tables_are_not_disorder() {
        let loaded = |table: &str| {
            format!(
                r#"{{"eventsource":{{"schema":"dbo","tbl":"{table}","transaction":{{"beginlsn":"00000000:00000000:0000"}}}},"eventrow":{{"old":"{{}}","current":"{{}}"}}}}"#
            )
        };
        let lines = vec![
            json_event("l1", 1, 0, true, &loaded("a")),
            json_event("l2", 2, 0, true, &loaded("a")),
            // The next table's rows count from 1 again at the same LSN.
            json_event("l3", 1, 0, true, &loaded("b")),
            json_event("c1", 3, 0, true, DATA),
            json_event("c0", 2, 0, true, DATA),
        ];
        let (_, summary) = read(&lines, false);
        assert_eq!(summary.events, 5, "{:?}", summary.problems);
        assert_eq!(summary.out_of_order, 1, "only the change that went back");
    }

    #[test]
    fn an_event_after_a_broken_one_is_still_read() {
        let lines = vec![
            json_event("p", 1, 0, false, "{"),
            // Seq 2 starts before seq 1 ended: a problem, but seq 2 itself is whole.
            json_event("q", 2, 0, true, DATA),
            json_event("r", 3, 0, true, DATA),
        ];
        let (out, summary) = read(&lines, false);
        assert_eq!(summary.events, 2, "{:?}", summary.problems);
        assert_eq!(summary.problems.len(), 1, "{:?}", summary.problems);
        assert!(out.contains("\"id\":\"q\""), "{out}");
    }

    #[test]
    fn a_read_cut_short_does_not_report_the_event_it_cut() {
        let lines = [
            json_event("s", 1, 0, true, DATA),
            json_event("t", 2, 0, false, "{"),
        ];
        let mut out = Vec::new();
        let mut reader = EventReader::new(
            &mut out,
            ReadOptions {
                encoding: Some(Encoding::Json),
                data_only: false,
                max_events: None,
                resumed: false,
            },
        );
        read_lines(lines.join("\n").as_bytes(), "file", &mut reader).unwrap();
        let summary = reader.finish(true).unwrap();
        assert!(summary.problems.is_empty(), "{:?}", summary.problems);
        assert_eq!(summary.events, 1);
    }

    #[test]
    fn binary_mode_headers_make_the_event() {
        let headers: Vec<(String, Vec<u8>)> = [
            ("ce_specversion", "1.0"),
            ("ce_type", "t"),
            ("ce_source", "/"),
            ("ce_id", "x"),
            ("ce_logicalid", "g:1:2"),
            ("ce_time", "2026-01-01T00:00:00Z"),
            ("content-type", "application/json"),
            ("ce_operation", "DEL"),
            ("ce_segmentindex", "0"),
            ("ce_finalsegment", "true"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect();
        let event = from_binary_mode(&headers, b"{}").unwrap();
        assert_eq!(event.operation, "DEL");
        assert!(event.finalsegment);
        assert_eq!(event.data, b"{}");
        let err = from_binary_mode(&headers[1..], b"{}").unwrap_err();
        assert!(err.to_string().contains("ce_specversion"), "{err}");
    }

    /// A line that is not UTF-8 is one problem naming its line; the lines after it
    /// are read.
    #[test]
    fn a_line_that_is_not_utf8_is_a_problem_and_the_read_goes_on() {
        let mut input = json_event("u", 1, 0, true, DATA).into_bytes();
        input.extend_from_slice(b"\n\xff\xfe{}\n");
        input.extend_from_slice(json_event("v", 2, 0, true, DATA).as_bytes());
        let mut out = Vec::new();
        let mut reader = EventReader::new(&mut out, options(Encoding::Json, false, None));
        read_lines(input.as_slice(), "f", &mut reader).unwrap();
        let summary = reader.finish(false).unwrap();
        assert_eq!(summary.events, 2, "the line after it too");
        assert_eq!(
            summary.problems,
            ["f line 2: undecodable message: the line is not UTF-8"]
        );
    }

    /// A read that continues a consumer group's cannot tell a restart's re-send of
    /// an event an earlier read printed from disorder: it counts it, and it is no
    /// problem; a read from the beginning calls it one.
    #[test]
    fn a_resumed_read_counts_disorder_without_calling_it_a_problem() {
        let lines = [
            json_event("b", 2, 0, true, DATA),
            json_event("a", 1, 0, true, DATA),
        ];
        for resumed in [false, true] {
            let mut out = Vec::new();
            let mut reader = EventReader::new(
                &mut out,
                ReadOptions {
                    resumed,
                    ..options(Encoding::Json, false, None)
                },
            );
            read_lines(lines.join("\n").as_bytes(), "t[0]", &mut reader).unwrap();
            let summary = reader.finish(false).unwrap();
            assert_eq!(summary.out_of_order, 1);
            assert_eq!(
                summary.problems.is_empty(),
                resumed,
                "{:?}",
                summary.problems
            );
        }
    }

    /// Two streams (databases) in one topic or file interleave their own commit
    /// orders: each is checked against its own.
    #[test]
    fn two_streams_in_one_partition_are_ordered_each_on_its_own() {
        let event = |guid: &str, id: &str, lsn: u32| {
            json_event(id, 1, 0, true, DATA)
                .replace("g:0000000A000000000001:", &format!("{guid}:{lsn:020}:"))
        };
        let lines = [
            event("a", "1", 9),
            event("b", "2", 1),
            event("a", "3", 10),
            event("b", "4", 2),
        ];
        let (_, summary) = read(&lines.map(String::from), false);
        assert_eq!(summary.events, 4, "{:?}", summary.problems);
        assert_eq!(summary.out_of_order, 0, "{:?}", summary.problems);
    }

    fn options(encoding: Encoding, data_only: bool, max_events: Option<u64>) -> ReadOptions {
        ReadOptions {
            encoding: Some(encoding),
            data_only,
            max_events,
            resumed: false,
        }
    }

    #[test]
    fn max_events_prints_that_many_and_zero_prints_none() {
        let lines: Vec<String> = (1..=3)
            .map(|n| json_event(&n.to_string(), n, 0, true, DATA))
            .collect();
        for max in [0, 2] {
            let mut out = Vec::new();
            let mut reader = EventReader::new(&mut out, options(Encoding::Json, false, Some(max)));
            read_lines(lines.join("\n").as_bytes(), "f", &mut reader).unwrap();
            let summary = reader.finish(false).unwrap();
            assert_eq!(summary.events, max);
            assert_eq!(String::from_utf8(out).unwrap().lines().count() as u64, max);
        }
    }

    /// A file that grows is followed: lines appended later are read, a line still
    /// being written waits for its newline, and the stop flag ends it.
    #[test]
    fn follow_reads_what_is_appended_until_stopped() {
        let path =
            std::env::temp_dir().join(format!("mssql-ces-follow-{}.jsonl", std::process::id()));
        std::fs::write(&path, format!("{}\n", json_event("a", 1, 0, true, DATA))).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let file = std::fs::File::open(&path).unwrap();
        let reading = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut reader = EventReader::new(&mut out, options(Encoding::Json, false, None));
            follow_lines(std::io::BufReader::new(file), "f", &mut reader, Some(&flag)).unwrap();
            let summary = reader.finish(true).unwrap();
            (summary, String::from_utf8(out).unwrap())
        });
        std::thread::sleep(FOLLOW_POLL * 2);
        let second = json_event("b", 2, 0, true, DATA);
        let (head, tail) = second.split_at(40);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(head.as_bytes()).unwrap();
        file.flush().unwrap();
        std::thread::sleep(FOLLOW_POLL * 2);
        file.write_all(format!("{tail}\n").as_bytes()).unwrap();
        file.flush().unwrap();
        std::thread::sleep(FOLLOW_POLL * 3);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (summary, out) = reading.join().unwrap();
        std::fs::remove_file(&path).ok();
        assert!(
            summary.problems.is_empty(),
            "the torn line was read whole: {:?}",
            summary.problems
        );
        assert_eq!(summary.events, 2, "{out}");
    }

    /// What `read` prints keeps the event's order: attributes as CES writes them, and
    /// `--data` columns in the table's column order (`cols`), not sorted. Avro's Data
    /// record comes out as JSON text, and its content type says so.
    #[test]
    fn printed_events_keep_the_order_of_attributes_and_columns() {
        use crate::event::test_support::{
            employee_row, employees, insert, options as encoder_options,
        };
        let change = insert(employees(), employee_row(7, "Ada", "Lovelace"));
        for encoding in [Encoding::Json, Encoding::Avro] {
            let encoder = crate::event::Encoder::new(encoder_options(encoding));
            let message = encoder.encode(&change).unwrap().messages.remove(0).bytes;
            let cloud_event = crate::event::readback::decode_message(&message, encoding).unwrap();
            for data_only in [false, true] {
                let mut out = Vec::new();
                let mut reader = EventReader::new(&mut out, options(encoding, data_only, None));
                reader.push("s", cloud_event.clone()).unwrap();
                reader.finish(false).unwrap();
                let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
                let keys = |v: &serde_json::Value| -> Vec<String> {
                    v.as_object().unwrap().keys().cloned().collect()
                };
                if data_only {
                    assert_eq!(
                        keys(&line["eventrow"]["current"]),
                        ["Id", "FirstName", "LastName", "SignupDate"],
                        "{encoding:?}"
                    );
                } else {
                    assert_eq!(
                        keys(&line),
                        [
                            "specversion",
                            "type",
                            "source",
                            "id",
                            "logicalid",
                            "time",
                            "datacontenttype",
                            "operation",
                            "segmentindex",
                            "finalsegment",
                            "data"
                        ]
                    );
                    assert_eq!(line["datacontenttype"], "application/json", "{encoding:?}");
                    let data: serde_json::Value =
                        serde_json::from_str(line["data"].as_str().unwrap()).unwrap();
                    assert_eq!(keys(&data), ["eventsource", "eventrow"], "{encoding:?}");
                }
            }
        }
    }

    /// Avro lines read as JSON (the default): each problem says they decode as
    /// Avro and names the flag; past five, the rest are counted in one problem.
    #[test]
    fn lines_in_the_other_encoding_name_the_flag_and_many_are_counted() {
        use crate::event::schema_change::tests::added_email;
        let encoder =
            crate::event::Encoder::new(crate::event::test_support::options(Encoding::Avro));
        let avro_line = |version: u64| {
            let event = crate::event::schema_change::SchemaChange {
                version,
                ..added_email()
            };
            base64::engine::general_purpose::STANDARD
                .encode(&encoder.encode_schema_change(&event).unwrap().messages[0].bytes)
        };
        let lines: Vec<String> = (2..10).map(avro_line).collect();
        let (_, summary) = read(&lines, false);
        assert_eq!(summary.messages, 8);
        assert_eq!(summary.problems.len(), 6, "{:?}", summary.problems);
        assert!(
            summary.problems[..5]
                .iter()
                .all(|p| p.contains("it decodes as avro: read with --encoding avro")),
            "{:?}",
            summary.problems
        );
        assert_eq!(
            summary.problems[5],
            "3 more undecodable messages, not listed"
        );
        // A line neither decodes: the error alone.
        let (_, summary) = read(&["not an event".to_owned()], false);
        assert!(
            !summary.problems[0].contains("decodes as"),
            "{:?}",
            summary.problems
        );
    }

    #[test]
    fn schema_changes_print_apart_and_their_versions_must_grow() {
        use crate::event::schema_change::{SchemaChange, tests::added_email};
        for encoding in [Encoding::Json, Encoding::Avro] {
            let encoder = crate::event::Encoder::new(crate::event::test_support::options(encoding));
            let line = |event: &SchemaChange| {
                let bytes = encoder.encode_schema_change(event).unwrap().messages[0]
                    .bytes
                    .clone();
                match encoding {
                    Encoding::Json => String::from_utf8(bytes).unwrap(),
                    Encoding::Avro => base64::engine::general_purpose::STANDARD.encode(bytes),
                }
            };
            let v2 = added_email();
            let v3 = SchemaChange {
                version: 3,
                ..added_email()
            };
            let lines = [line(&v2), line(&v3), line(&v3), line(&v2)];
            for data_only in [true, false] {
                let mut out = Vec::new();
                let mut reader = EventReader::new(
                    &mut out,
                    ReadOptions {
                        encoding: Some(encoding),
                        data_only,
                        max_events: None,
                        resumed: false,
                    },
                );
                read_lines(lines.join("\n").as_bytes(), "file", &mut reader).unwrap();
                let summary = reader.finish(false).unwrap();
                assert_eq!(
                    (summary.events, summary.schema_changes),
                    (2, 2),
                    "{encoding}"
                );
                assert_eq!(summary.duplicates, 2, "v3 and v2 again: the same ids");
                assert!(summary.problems.is_empty(), "{:?}", summary.problems);
                assert!(summary.per_table.is_empty(), "not counted as change events");
                assert!(
                    summary.line().contains("2 events (2 schema changes)"),
                    "{}",
                    summary.line()
                );
                let printed: Vec<serde_json::Value> = String::from_utf8(out)
                    .unwrap()
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
                if data_only {
                    assert_eq!(printed[0]["schemachange"]["tableversion"], 2);
                    assert_eq!(
                        printed[1]["schemachange"]["after"]["captureinstance"],
                        "dbo_Customers_v2"
                    );
                } else {
                    assert_eq!(
                        printed[0]["type"],
                        crate::event::schema_change::SCHEMA_CHANGE_TYPE
                    );
                    let data: serde_json::Value =
                        serde_json::from_str(printed[1]["data"].as_str().unwrap()).unwrap();
                    assert_eq!(data["tableversion"], 3);
                }
            }
            // A version that does not grow: v2 after v3 (not seen before here, so
            // not a duplicate).
            let backwards = [line(&v3), line(&v2)];
            let mut out = Vec::new();
            let mut reader = EventReader::new(
                &mut out,
                ReadOptions {
                    encoding: Some(encoding),
                    data_only: true,
                    max_events: None,
                    resumed: false,
                },
            );
            read_lines(backwards.join("\n").as_bytes(), "file", &mut reader).unwrap();
            let summary = reader.finish(false).unwrap();
            assert_eq!(summary.problems.len(), 1, "{:?}", summary.problems);
            assert!(
                summary.problems[0].contains("table dbo.Customers version 2 comes after version 3"),
                "{:?}",
                summary.problems
            );
        }
    }
}

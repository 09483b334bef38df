//! `[sink]`: how events are routed (topic, key, CloudEvents mode), shared by every
//! kind, and the kind with its own settings ([`SinkConfig`]).

use serde::Deserialize;

use crate::event::settings::EventSettings;
use crate::setting::de::{self, ReadError, ReadErrorKind};
use crate::setting::{ConfigError, invalid, millis};
use crate::sink::SinkConfig;
use crate::sink::kafka::KafkaSinkConfig;

/// What a message is keyed by: CES's `partition_key_scheme`, plus `primary_key`. One
/// key's events stay in order in one partition.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PartitionKeyScheme {
    /// No key; each event's segments are still pinned to one partition (chosen from its
    /// `logicalid`).
    None,
    /// One constant key for the whole stream.
    StreamGroup,
    /// `schema.table`.
    #[default]
    Table,
    /// The value of `partition_key_column`. A NULL or empty value goes to one fixed
    /// partition per table, since partitioners scatter NULL and empty keys.
    Column,
    /// `schema.table` plus the key values: per-row order, with parallelism.
    PrimaryKey,
}

impl std::fmt::Display for PartitionKeyScheme {
    /// As the configuration writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PartitionKeyScheme::None => "none",
            PartitionKeyScheme::StreamGroup => "stream_group",
            PartitionKeyScheme::Table => "table",
            PartitionKeyScheme::Column => "column",
            PartitionKeyScheme::PrimaryKey => "primary_key",
        })
    }
}

/// The CloudEvents binding a Kafka or Event Hubs message has.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum CloudEventsMode {
    /// The whole CloudEvent is the message value.
    #[default]
    Structured,
    /// `ce_*` headers, `data` as the value; Kafka and Event Hubs sinks only (a file or
    /// stdout has no headers).
    Binary,
}

impl std::fmt::Display for CloudEventsMode {
    /// As the configuration writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CloudEventsMode::Structured => "structured",
            CloudEventsMode::Binary => "binary",
        })
    }
}

/// Whether [schema-change events](schema-changes.md) are sent, and where.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SchemaChangePlacement {
    /// None are sent: the stream is CES's alone.
    #[default]
    Off,
    /// To their own topic, `schema_topic`, keyed by `schema.table`; refused for
    /// `event_hubs_amqp`, which sends to one hub.
    Topic,
    /// Into each table's own partition, just before the first event of the shape they
    /// describe; needs `partition_key = "table"` or `"stream_group"`. A file or stdout
    /// has no topics: both placements write them into the stream, in order.
    Inline,
}

impl std::fmt::Display for SchemaChangePlacement {
    /// As the configuration writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SchemaChangePlacement::Off => "off",
            SchemaChangePlacement::Topic => "topic",
            SchemaChangePlacement::Inline => "inline",
        })
    }
}

/// `[sink]`: how events are routed, and where they go — `kind` with that sink's
/// own settings, each kind's settings beside its sink ([`SinkConfig`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SinkSettings {
    pub routing: RoutingSettings,
    pub kind: SinkConfig,
}

/// The keys of `[sink]` every kind takes: where and how messages are keyed.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoutingSettings {
    /// A topic, or a template over `{db}`, `{schema}`, `{tbl}`; unset: `"ces"`
    /// (Debezium: `<topic_prefix>.{db}.{schema}.{tbl}`). Event Hubs: the hub (unset:
    /// the connection string's `EntityPath`); `event_hubs_amqp` takes one hub, a
    /// template is refused. A topic name holds only `A-Z a-z 0-9 . _ -`: the template's
    /// own text is checked when the configuration is read, and in the names put in
    /// every other character becomes `_` (`sales.order details` →
    /// `sales.order_details`, as Debezium's topics; `check` warns of tables that meet
    /// in one topic that way).
    #[serde(default)]
    pub topic: Option<String>,
    /// What messages are keyed by; it decides what stays in order.
    #[serde(default)]
    pub partition_key: PartitionKeyScheme,
    /// The column whose value is the key, with `partition_key = "column"`.
    #[serde(default)]
    pub partition_key_column: Option<String>,
    /// The CloudEvents binding.
    #[serde(default)]
    pub mode: CloudEventsMode,
    /// Whether schema-change events are sent, and where.
    #[serde(default)]
    pub schema_changes: SchemaChangePlacement,
    /// With `schema_changes = "topic"`: their topic, or a template like `topic`'s;
    /// unset: `topic` with `.schema` appended (`"ces.schema"`; Debezium: the topic
    /// prefix). Refused with the other placements.
    #[serde(default)]
    pub schema_topic: Option<String>,
    /// Avro in the Confluent wire format, schemas in a registry: see [Avro with a
    /// schema registry](formats.md#avro-with-a-schema-registry).
    #[serde(default)]
    pub schema_registry: Option<crate::sink::registry::SchemaRegistrySettings>,
    /// Every this many milliseconds a heartbeat record goes to `heartbeat_topic`,
    /// also when nothing changes: proof that the stream is alive and where it
    /// stands. 0: none. Kafka and the Event Hubs Kafka endpoint only.
    #[serde(rename = "heartbeat_interval_ms", with = "millis", default)]
    #[schemars(with = "u64")]
    pub heartbeat_interval: std::time::Duration,
    /// The heartbeat records' topic, or a template over `{db}`; unset: `topic`
    /// with `.heartbeat` appended (`"ces.heartbeat"`). The record is mssql-ces's
    /// own JSON, in both event formats: see [Heartbeats](operating.md#heartbeats).
    #[serde(default)]
    pub heartbeat_topic: Option<String>,
}

impl RoutingSettings {
    /// The topic (template) heartbeat records go to.
    pub fn heartbeat_topic(&self) -> String {
        self.heartbeat_topic
            .clone()
            .unwrap_or_else(|| format!("{}.heartbeat", self.topic.as_deref().unwrap_or("ces")))
    }

    /// The topic (template) schema-change events go to with `schema_changes =
    /// "topic"`.
    pub fn schema_topic(&self) -> String {
        self.schema_topic
            .clone()
            .unwrap_or_else(|| format!("{}.schema", self.topic.as_deref().unwrap_or("ces")))
    }
}

/// The keys of `[sink]` that [`RoutingSettings`] reads; the rest belong to the kind.
const ROUTING_KEYS: &[&str] = &[
    "topic",
    "partition_key",
    "partition_key_column",
    "mode",
    "schema_changes",
    "schema_topic",
    "schema_registry",
    "heartbeat_interval_ms",
    "heartbeat_topic",
];

impl schemars::JsonSchema for SinkSettings {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SinkSettings".into()
    }

    /// One object per `kind`: the routing keys every kind shares, `kind` itself,
    /// and that kind's own keys.
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        use crate::sink::{event_hubs_amqp, kafka, stream};
        let routing = RoutingSettings::json_schema(generator);
        let variant = |kinds: &[&str], own: schemars::Schema| {
            let mut properties = serde_json::Map::new();
            properties.insert(
                "kind".into(),
                serde_json::json!({ "description": "Which sink this is.", "enum": kinds }),
            );
            for schema in [&routing, &own] {
                if let Some(more) = schema.get("properties").and_then(|p| p.as_object()) {
                    properties.extend(more.clone());
                }
            }
            let title: Vec<String> = kinds.iter().map(|k| format!("kind = \"{k}\"")).collect();
            serde_json::json!({
                "title": title.join(" or "),
                "description": own.get("description").cloned().unwrap_or_default(),
                "type": "object",
                "properties": properties,
                "required": ["kind"],
                "additionalProperties": false
            })
        };
        let variants = vec![
            variant(
                &["kafka", "event_hubs_kafka"],
                kafka::KafkaSinkConfig::json_schema(generator),
            ),
            variant(
                &["event_hubs_amqp"],
                event_hubs_amqp::config::EventHubsAmqpSinkConfig::json_schema(generator),
            ),
            variant(&["file"], stream::FileSinkConfig::json_schema(generator)),
            variant(
                &["stdout"],
                stream::StdoutSinkConfig::json_schema(generator),
            ),
        ];
        schemars::json_schema!({
            "description": "Where events go: `kind` picks the sink, and the keys it takes are the routing keys every sink shares plus that kind's own; a key of another kind is refused by name.",
            "oneOf": variants
        })
    }
}

/// The section is read in two parts, on tables of their own: the routing keys every
/// sink takes, and the rest as the kind's own settings. An error names the key in
/// the file (`sink.topik: …`); an unknown key lists what this kind of sink takes.
impl<'de> Deserialize<'de> for SinkSettings {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut rest = toml::Table::deserialize(deserializer)?;
        let mut routing = toml::Table::new();
        for key in ROUTING_KEYS {
            if let Some(value) = rest.remove(*key) {
                routing.insert((*key).to_owned(), value);
            }
        }
        let in_sink = |e: ReadError| D::Error::custom(e.within(&["sink"]));
        let routing = de::from_table::<RoutingSettings>(routing).map_err(in_sink)?;
        let kind = match rest.remove("kind") {
            None => {
                return Err(D::Error::custom(
                    "sink.kind: missing; one of kafka, event_hubs_kafka, event_hubs_amqp, stdout, file",
                ));
            }
            Some(toml::Value::String(kind)) => kind,
            Some(_) => return Err(D::Error::custom("sink.kind: expected a string")),
        };
        if rest.get("connection_string").is_some_and(|v| !v.is_table()) {
            return Err(D::Error::custom(
                "sink.connection_string: expected { env = \"VARIABLE\" } or { file = \"/path\" }; a secret is never written in the configuration itself",
            ));
        }
        let in_kind = |e: ReadError| match &e.kind {
            // The kind's own keys and the routing ones every sink takes.
            ReadErrorKind::UnknownKey { key, expected } if e.path.len() == 1 => {
                let all: Vec<String> = ["kind"]
                    .iter()
                    .chain(ROUTING_KEYS)
                    .chain(expected.iter())
                    .map(|f| format!("`{f}`"))
                    .collect();
                D::Error::custom(format!(
                    "sink.{key}: not a setting of a {kind} sink; it takes {}",
                    all.join(", ")
                ))
            }
            _ => in_sink(e),
        };
        let kind = match kind.as_str() {
            "kafka" => SinkConfig::Kafka(de::from_table(rest).map_err(in_kind)?),
            "event_hubs_kafka" => {
                SinkConfig::EventHubsKafka(de::from_table(rest).map_err(in_kind)?)
            }
            "event_hubs_amqp" => SinkConfig::EventHubsAmqp(de::from_table(rest).map_err(in_kind)?),
            "stdout" => SinkConfig::Stdout(de::from_table(rest).map_err(in_kind)?),
            "file" => SinkConfig::File(de::from_table(rest).map_err(in_kind)?),
            other => {
                return Err(D::Error::custom(format!(
                    "sink.kind: unknown kind \"{other}\"; one of kafka, event_hubs_kafka, event_hubs_amqp, stdout, file"
                )));
            }
        };
        Ok(SinkSettings { routing, kind })
    }
}

impl SinkSettings {
    /// A Kafka sink at `bootstrap_servers`, every other setting at its default.
    pub fn kafka(bootstrap_servers: &str) -> Self {
        SinkSettings {
            routing: RoutingSettings::default(),
            kind: SinkConfig::Kafka(KafkaSinkConfig::new(bootstrap_servers)),
        }
    }

    /// Checks the routing and the kind's own settings.
    pub fn validate(&self, event: &EventSettings) -> Result<(), ConfigError> {
        if self.routing.partition_key == PartitionKeyScheme::Column
            && self.routing.partition_key_column.is_none()
        {
            return Err(invalid(
                "sink.partition_key_column",
                "partition_key = \"column\" needs the column name",
            ));
        }
        self.validate_schema_changes()?;
        self.validate_heartbeat()?;
        self.validate_topic_names()?;
        if self.routing.mode == CloudEventsMode::Binary
            && matches!(self.kind, SinkConfig::Stdout(_) | SinkConfig::File(_))
        {
            return Err(invalid(
                "sink.mode",
                "\"binary\" puts the attributes in message headers, which a file or stdout has not: the lines would lose them; use \"structured\"",
            ));
        }
        self.kind.validate(&self.routing, event)
    }

    /// `sink.topic` and `sink.schema_topic`, where a destination takes them as
    /// names, must be topic names once their placeholders are filled in.
    fn validate_topic_names(&self) -> Result<(), ConfigError> {
        if matches!(self.kind, SinkConfig::Stdout(_) | SinkConfig::File(_)) {
            return Ok(());
        }
        for (setting, template) in [
            ("sink.topic", &self.routing.topic),
            ("sink.schema_topic", &self.routing.schema_topic),
            ("sink.heartbeat_topic", &self.routing.heartbeat_topic),
        ] {
            if let Some(problem) = template
                .as_deref()
                .and_then(crate::event::topic_template_problem)
            {
                return Err(invalid(setting, problem));
            }
        }
        Ok(())
    }

    /// Heartbeats need a destination with topics of their own; a topic without an
    /// interval is a mistake said by name.
    fn validate_heartbeat(&self) -> Result<(), ConfigError> {
        let routing = &self.routing;
        if routing.heartbeat_interval.is_zero() {
            if routing.heartbeat_topic.is_some() {
                return Err(invalid(
                    "sink.heartbeat_topic",
                    "is only used with sink.heartbeat_interval_ms above 0: set that, or remove sink.heartbeat_topic",
                ));
            }
            return Ok(());
        }
        let kind = match &self.kind {
            SinkConfig::Stdout(_) => "stdout",
            SinkConfig::File(_) => "file",
            SinkConfig::EventHubsAmqp(_) => "event_hubs_amqp",
            _ => return Ok(()),
        };
        Err(invalid(
            "sink.heartbeat_interval_ms",
            format!(
                "heartbeats go to a topic of their own, which a {kind} sink has not: use kind = \"kafka\" or \"event_hubs_kafka\", or set it to 0"
            ),
        ))
    }

    /// `inline` needs each table in one partition; `topic` needs a sink that can
    /// write a second topic; `schema_topic` is only read with `topic`.
    fn validate_schema_changes(&self) -> Result<(), ConfigError> {
        let routing = &self.routing;
        match routing.schema_changes {
            SchemaChangePlacement::Inline
                if !matches!(
                    routing.partition_key,
                    PartitionKeyScheme::Table | PartitionKeyScheme::StreamGroup
                ) =>
            {
                return Err(invalid(
                    "sink.schema_changes",
                    format!(
                        "\"inline\" puts a table's schema-change events in its partition, between its events, but partition_key = \"{}\" spreads one table over partitions, where a consumer could read an event before the schema change it follows: set sink.partition_key = \"table\" or \"stream_group\", or sink.schema_changes = \"topic\"",
                        routing.partition_key
                    ),
                ));
            }
            SchemaChangePlacement::Topic if matches!(self.kind, SinkConfig::EventHubsAmqp(_)) => {
                return Err(invalid(
                    "sink.schema_changes",
                    "\"topic\" needs a second event hub, but an Event Hubs AMQP sink sends to one: use \"inline\" (with partition_key = \"table\"), or the Kafka endpoint (kind = \"event_hubs_kafka\")",
                ));
            }
            _ => {}
        }
        if routing.schema_topic.is_some() && routing.schema_changes != SchemaChangePlacement::Topic
        {
            return Err(invalid(
                "sink.schema_topic",
                format!(
                    "is only used with sink.schema_changes = \"topic\" (it is \"{}\"): set that, or remove sink.schema_topic",
                    routing.schema_changes
                ),
            ));
        }
        Ok(())
    }
}

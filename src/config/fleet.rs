//! `[fleet]`: several processes with the same configuration share `source.databases`
//! through Kafka's consumer group protocol (see `crate::databases::fleet`).

use std::time::Duration;

use serde::Deserialize;

use super::{CheckpointStoreKind, Config};
use crate::databases::fleet::GroupProtocol;
use crate::setting::{ConfigError, invalid, millis};
use crate::sink::SinkConfig;

/// A fleet: several processes with the same configuration share `source.databases`
/// through Kafka's consumer group protocol. See [A fleet of
/// processes](scaling-out.md#a-fleet-of-processes).
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetSettings {
    /// The consumer group the members join; unset: no fleet. Needs `source.databases`,
    /// a sink reached over Kafka (`kafka`, `event_hubs_kafka`) or `event_hubs_amqp`
    /// with a connection string (the group then goes through the namespace's Kafka
    /// endpoint), and a checkpoint store that fences a member that lost its databases:
    /// `"kafka"` with `sink.exactly_once`, or `"table"` (its lease).
    #[serde(default)]
    pub group_id: Option<String>,
    /// The control topic, whose partitions are the assignment slots; unset:
    /// `mssql-ces-fleet.<group_id>`. Created with `slots` partitions when missing.
    /// Nothing is written to it.
    #[serde(default)]
    pub topic: Option<String>,
    /// Partitions of the control topic when a member creates it; unset: 60, or 32 when
    /// the fleet goes through Event Hubs (the most partitions an event hub of the Basic
    /// and Standard tiers has). An existing topic's partition count is used as it is.
    #[serde(default)]
    #[schemars(range(min = 1, max = MAX_SLOTS))]
    pub slots: Option<u32>,
    /// How long a member that stopped answering keeps its databases, in milliseconds
    /// (librdkafka's `session.timeout.ms`; at least 1000, and Kafka's brokers refuse
    /// less than their `group.min.session.timeout.ms`, 6000 by default; 6000 to 300000
    /// on Event Hubs). Not used with `group_protocol = "consumer"`.
    #[serde(
        rename = "session_timeout_ms",
        with = "millis",
        default = "default_session_timeout_ms"
    )]
    #[schemars(with = "u64", range(min = 1000))]
    pub session_timeout: Duration,
    /// How slots are assigned. Both protocols are tested on Apache Kafka 4.4.
    #[serde(default)]
    pub group_protocol: GroupProtocol,
}

impl Default for FleetSettings {
    fn default() -> Self {
        FleetSettings {
            group_id: None,
            topic: None,
            slots: None,
            session_timeout: default_session_timeout_ms(),
            group_protocol: GroupProtocol::default(),
        }
    }
}

/// Slots when `fleet.slots` is unset: 60 (many ways to share, few partitions to
/// keep), and 32 on Event Hubs, the most partitions an event hub of the Basic and
/// Standard tiers has.
const DEFAULT_SLOTS: u32 = 60;
const EVENT_HUBS_SLOTS: u32 = 32;

/// What Event Hubs takes as a consumer group's session time-out.
const EVENT_HUBS_SESSION: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(6)..=Duration::from_secs(300);

fn default_session_timeout_ms() -> Duration {
    Duration::from_secs(10)
}

/// The most slots a control topic is created with.
const MAX_SLOTS: u32 = 10_000;

impl FleetSettings {
    /// The slots a member creates the control topic with: `fleet.slots`, or the
    /// default for where the fleet coordinates (`event_hubs`: Event Hubs' Kafka
    /// endpoint).
    pub fn slots(&self, event_hubs: bool) -> u32 {
        self.slots.unwrap_or(if event_hubs {
            EVENT_HUBS_SLOTS
        } else {
            DEFAULT_SLOTS
        })
    }

    /// Whether a group is configured.
    pub fn enabled(&self) -> bool {
        self.group_id.is_some()
    }

    /// The control topic: `topic`, or `mssql-ces-fleet.<group_id>`.
    pub fn control_topic(&self) -> String {
        match (&self.topic, &self.group_id) {
            (Some(topic), _) => topic.clone(),
            (None, Some(group)) => format!("mssql-ces-fleet.{group}"),
            (None, None) => "mssql-ces-fleet".to_owned(),
        }
    }
}

impl Config {
    /// Whether the fleet coordinates through Event Hubs' Kafka endpoint.
    pub fn fleet_on_event_hubs(&self) -> bool {
        matches!(
            self.sink.kind,
            SinkConfig::EventHubsKafka(_) | SinkConfig::EventHubsAmqp(_)
        )
    }

    /// What a fleet on Event Hubs should know before it starts: an event hub of
    /// more than 32 partitions needs the Premium or Dedicated tier, and the control
    /// hub is one more of a namespace's (10 on Standard). Said at start and by
    /// `check`.
    pub fn fleet_advisories(&self) -> Vec<String> {
        if !self.fleet.enabled() || !self.fleet_on_event_hubs() {
            return Vec::new();
        }
        let slots = self.fleet.slots(true);
        let topic = self.fleet.control_topic();
        let mut said = vec![format!(
            "fleet on Event Hubs: its control topic is the event hub {topic} with {slots} partitions (fleet.slots); the Kafka endpoint does not create event hubs, so create it before the first member starts (a Standard namespace holds 10 event hubs)"
        )];
        if slots > EVENT_HUBS_SLOTS {
            said.push(format!(
                "fleet.slots = {slots}: an event hub of the Basic and Standard tiers has at most {EVENT_HUBS_SLOTS} partitions; this needs Premium or Dedicated, or set fleet.slots to {EVENT_HUBS_SLOTS} or fewer"
            ));
        }
        said
    }

    pub(super) fn validate_fleet(&self) -> Result<(), ConfigError> {
        if self
            .fleet
            .slots
            .is_some_and(|n| !(1..=MAX_SLOTS).contains(&n))
        {
            return Err(invalid(
                "fleet.slots",
                format!("must be from 1 to {MAX_SLOTS} (unset: 60, 32 on Event Hubs)"),
            ));
        }
        if self.fleet.session_timeout < Duration::from_secs(1) {
            return Err(invalid(
                "fleet.session_timeout_ms",
                "must be at least 1000 (the default is 10000)",
            ));
        }
        let Some(group) = &self.fleet.group_id else {
            return Ok(());
        };
        if group.trim().is_empty() {
            return Err(invalid(
                "fleet.group_id",
                "must name the group (the same in every member's configuration), or be left unset for no fleet",
            ));
        }
        if !self.many_databases() {
            return Err(invalid(
                "fleet.group_id",
                "needs source.databases: the fleet shares databases among its members (for one database, list it: databases = [\"Sales\"])",
            ));
        }
        match &self.sink.kind {
            SinkConfig::Kafka(_) | SinkConfig::EventHubsKafka(_) => {}
            SinkConfig::EventHubsAmqp(c) if c.connection_string.is_set() => {}
            SinkConfig::EventHubsAmqp(_) => {
                return Err(invalid(
                    "fleet.group_id",
                    "with sink.kind = \"event_hubs_amqp\" the fleet coordinates through the namespace's Kafka endpoint, signed in with sink.connection_string (SAS); a Microsoft Entra credential is not supported there",
                ));
            }
            _ => {
                return Err(invalid(
                    "fleet.group_id",
                    "the fleet coordinates through the sink's Kafka brokers: it needs sink.kind = \"kafka\", \"event_hubs_kafka\" or \"event_hubs_amqp\" (through the namespace's Kafka endpoint)",
                ));
            }
        }
        if self.checkpoint.store == CheckpointStoreKind::File {
            return Err(invalid(
                "checkpoint.store",
                "must be \"kafka\" (or \"table\") with fleet.group_id: a database moves between members, and its next owner must read the checkpoint its last owner wrote",
            ));
        }
        // The consumer group's membership does not exclude in time: a member paused
        // past its session time-out still writes what it had read once resumed. Its
        // writes must be fenced: by the transactions (exactly-once), or by the table
        // store's lease.
        let exactly_once = matches!(&self.sink.kind, SinkConfig::Kafka(k) if k.exactly_once);
        if self.checkpoint.store == CheckpointStoreKind::Kafka && !exactly_once {
            return Err(invalid(
                "checkpoint.store",
                "\"kafka\" with fleet.group_id needs sink.exactly_once = true: a member paused past its session time-out could otherwise write a database's checkpoint after the database moved on, moving it back; with exactly-once the newer owner fences it. Or use \"table\", whose lease fences it",
            ));
        }
        if self.fleet_on_event_hubs() && !EVENT_HUBS_SESSION.contains(&self.fleet.session_timeout) {
            return Err(invalid(
                "fleet.session_timeout_ms",
                "must be from 6000 to 300000 on Event Hubs, which refuses a consumer group's session time-out outside that range",
            ));
        }
        if self
            .fleet
            .topic
            .as_ref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err(invalid(
                "fleet.topic",
                "must name a topic, or be left unset for mssql-ces-fleet.<group_id>",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(fleet: &str, checkpoint: &str, databases: &str) -> Result<Config, ConfigError> {
        // Exactly-once goes with the Kafka store (and only with it).
        let exactly_once = checkpoint.contains("kafka");
        Config::from_parts(
            &format!(
                "[source]\nkind = \"synthetic\"\n{databases}\n[source.synthetic]\ndatabases = 3\n\
                 [sink]\nkind = \"kafka\"\nbootstrap_servers = \"b:9092\"\nexactly_once = {exactly_once}\n\
                 [checkpoint]\n{checkpoint}\n[fleet]\n{fleet}\n"
            ),
            &[],
            &[],
        )
    }

    const MANY: &str = "databases = [\"tenant*\"]";
    const KAFKA: &str = "store = \"kafka\"";

    #[test]
    fn a_fleet_has_defaults_and_needs_databases_a_kafka_sink_and_a_shared_store() {
        let c = load("group_id = \"g\"", KAFKA, MANY).expect("valid");
        assert!(c.fleet.enabled());
        assert_eq!(c.fleet.control_topic(), "mssql-ces-fleet.g");
        assert_eq!(c.fleet.slots(false), 60);
        assert_eq!(c.fleet.slots(true), 32);
        assert_eq!(c.fleet.session_timeout, Duration::from_secs(10));
        assert_eq!(c.fleet.group_protocol, GroupProtocol::Classic);
        let c = load(
            "group_id = \"g\"\ngroup_protocol = \"consumer\"",
            KAFKA,
            MANY,
        )
        .expect("valid");
        assert_eq!(c.fleet.group_protocol, GroupProtocol::Consumer);
        assert!(load("group_id = \"g\"\ngroup_protocol = \"eager\"", KAFKA, MANY).is_err());
        let c = load("group_id = \"g\"\ntopic = \"t\"", "store = \"table\"", MANY)
            .expect("table store");
        assert_eq!(c.fleet.control_topic(), "t");
        assert!(!load("", KAFKA, MANY).expect("no fleet").fleet.enabled());
        let refused = [
            ("group_id = \" \"", KAFKA, MANY, "fleet.group_id"),
            ("group_id = \"g\"", KAFKA, "", "source.databases"),
            ("group_id = \"g\"", "", MANY, "checkpoint.store"),
            ("group_id = \"g\"\nslots = 0", KAFKA, MANY, "fleet.slots"),
            (
                "group_id = \"g\"\nslots = 10001",
                KAFKA,
                MANY,
                "fleet.slots",
            ),
            ("group_id = \"g\"\ntopic = \"\"", KAFKA, MANY, "fleet.topic"),
            (
                "group_id = \"g\"\nsession_timeout_ms = 999",
                KAFKA,
                MANY,
                "fleet.session_timeout_ms",
            ),
        ];
        for (fleet, checkpoint, databases, setting) in refused {
            let error = load(fleet, checkpoint, databases)
                .expect_err(setting)
                .to_string();
            assert!(error.contains(setting), "{fleet}: {error}");
        }
        // The Kafka store without exactly-once has nothing to fence a paused member's
        // writes: refused, naming the way out.
        let unfenced = Config::from_parts(
            "[source]\nkind = \"synthetic\"\ndatabases = [\"tenant*\"]\n[source.synthetic]\ndatabases = 2\n\
             [sink]\nkind = \"kafka\"\nbootstrap_servers = \"b:9092\"\n[checkpoint]\nstore = \"kafka\"\n[fleet]\ngroup_id = \"g\"\n",
            &[],
            &[],
        )
        .expect_err("unfenced")
        .to_string();
        assert!(
            unfenced.contains("sink.exactly_once") && unfenced.contains("\"table\""),
            "{unfenced}"
        );
        let stdout = Config::from_parts(
            "[source]\nkind = \"synthetic\"\ndatabases = [\"tenant*\"]\n[source.synthetic]\ndatabases = 2\n\
             [sink]\nkind = \"stdout\"\n[checkpoint]\nstore = \"table\"\n[fleet]\ngroup_id = \"g\"\n",
            &[],
            &[],
        )
        .expect_err("stdout")
        .to_string();
        assert!(
            stdout.contains("fleet.group_id") && stdout.contains("sink.kind"),
            "{stdout}"
        );
    }

    fn connection_of(config: &Config) -> std::collections::BTreeMap<String, String> {
        config
            .sink
            .kind
            .kafka_connection(&config.sink.routing)
            .expect("a Kafka endpoint")
            .expect("its properties")
            .into_iter()
            .collect()
    }

    /// Events over AMQP, the fleet through the same namespace's Kafka endpoint with
    /// the same connection string; refused with an Entra credential.
    #[test]
    fn an_amqp_sink_s_fleet_goes_through_the_namespace_s_kafka_endpoint() {
        let dir = std::env::temp_dir().join(format!("mssql-ces-fleet-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let secret = dir.join("cs");
        std::fs::write(
            &secret,
            "Endpoint=sb://ns1.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=abc=;EntityPath=hub",
        )
        .expect("secret");
        let load = |sink: &str| {
            Config::from_parts(
                &format!(
                    "[source]\nkind = \"synthetic\"\ndatabases = [\"tenant*\"]\n[source.synthetic]\ndatabases = 2\n\
                     [sink]\nkind = \"event_hubs_amqp\"\n{sink}\n[checkpoint]\nstore = \"table\"\n[fleet]\ngroup_id = \"g\"\n"
                ),
                &[],
                &[],
            )
        };
        let config = load(&format!(
            "connection_string = {{ file = {:?} }}",
            secret.display().to_string()
        ))
        .expect("valid");
        let connection = connection_of(&config);
        assert_eq!(
            connection.get("bootstrap.servers").map(String::as_str),
            Some("ns1.servicebus.windows.net:9093")
        );
        assert_eq!(
            connection.get("sasl.username").map(String::as_str),
            Some("$ConnectionString")
        );
        assert!(
            connection
                .get("security.protocol")
                .is_some_and(|p| p.eq_ignore_ascii_case("sasl_ssl")),
            "{:?}",
            connection.get("security.protocol")
        );
        // The same endpoint when events go through it too (the Kafka checkpoint
        // store and the fleet both connect with these properties).
        let through_kafka = Config::from_parts(
            &format!(
                "[source]\nkind = \"synthetic\"\n[sink]\nkind = \"event_hubs_kafka\"\nconnection_string = {{ file = {:?} }}\n[checkpoint]\nstore = \"kafka\"\n",
                secret.display().to_string()
            ),
            &[],
            &[],
        )
        .expect("valid");
        let same = connection_of(&through_kafka);
        assert_eq!(same, connection);
        let entra = load("namespace = \"ns1.servicebus.windows.net\"\nentra_credential = \"managed_identity\"\ntopic = \"hub\"")
            .expect_err("entra")
            .to_string();
        assert!(
            entra.contains("fleet.group_id") && entra.contains("Entra"),
            "{entra}"
        );
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_fleet_on_event_hubs_fits_event_hubs() {
        let on_event_hubs = |fleet: &str| {
            Config::from_parts(
                &format!(
                    "[source]\nkind = \"sqlserver\"\nconnection_string = {{ env = \"CS\" }}\ndatabases = [\"tenant*\"]\n\
                     [sink]\nkind = \"event_hubs_kafka\"\nconnection_string = {{ env = \"EH\" }}\n\
                     [checkpoint]\nstore = \"table\"\n[fleet]\ngroup_id = \"g\"\n{fleet}\n"
                ),
                &[],
                &[],
            )
        };
        let c = on_event_hubs("").expect("valid");
        assert_eq!(
            c.fleet.slots(c.fleet_on_event_hubs()),
            32,
            "Standard's most"
        );
        let said = c.fleet_advisories();
        assert!(
            said.len() == 1 && said[0].contains("create it before the first member starts"),
            "{said:?}"
        );
        let c = on_event_hubs("slots = 40").expect("valid: Premium has more");
        let said = c.fleet_advisories();
        assert!(
            said.iter().any(|s| s.contains("Premium or Dedicated")),
            "{said:?}"
        );
        for timeout in ["5999", "300001"] {
            let error = on_event_hubs(&format!("session_timeout_ms = {timeout}"))
                .expect_err(timeout)
                .to_string();
            assert!(
                error.contains("fleet.session_timeout_ms") && error.contains("6000 to 300000"),
                "{error}"
            );
        }
        // On Kafka, nothing of this is said.
        let kafka = load("group_id = \"g\"", KAFKA, MANY).expect("valid");
        assert!(kafka.fleet_advisories().is_empty());
        assert!(load("group_id = \"g\"\nsession_timeout_ms = 5000", KAFKA, MANY).is_ok());
    }
}

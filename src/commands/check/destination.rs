//! The destination checks: each sink reached with its own client, the topics the
//! stream writes to, and their limits against the largest segment.

use super::*;
use crate::error::Chain;

/// Which Kafka a Kafka sink writes to (Event Hubs' Kafka endpoint has its own
/// rules).
fn kafka_flavour(config: &Config) -> KafkaFlavour {
    match &config.sink.kind {
        SinkConfig::EventHubsKafka(_) => KafkaFlavour::EventHubs,
        _ => KafkaFlavour::Kafka,
    }
}

/// With the Kafka checkpoint store: why the sink's brokers, which hold the
/// checkpoint topic, cannot be asked anything — they refused this client, or did
/// not answer within `check.timeout_ms` — or `None` when they answered. Asked once
/// per configuration before the checkpoint checks: each of those would otherwise
/// wait out the time-out and report the cause as something else, for every
/// database. `Kafka: brokers` reports the cause itself.
pub(super) async fn kafka_store_unreachable(config: &Config) -> Option<String> {
    if config.checkpoint.store != crate::config::CheckpointStoreKind::Kafka {
        return None;
    }
    let (SinkConfig::Kafka(c) | SinkConfig::EventHubsKafka(c)) = &config.sink.kind else {
        return None;
    };
    let largest = config.sink.kind.largest_message(&config.event);
    let (settings, _) = c
        .settings(kafka_flavour(config), &config.sink.routing, largest.bytes)
        .ok()?;
    match kafka::describe_destination(&settings, &[], config.check.timeout).await {
        Ok(_) => None,
        Err(crate::sink::SinkError::Definite { .. }) => {
            Some("the sink's brokers refused this client (see Kafka: brokers)".to_owned())
        }
        Err(_) => Some(format!(
            "no answer from the sink's brokers within {} s (see Kafka: brokers)",
            config.check.timeout.as_secs_f64()
        )),
    }
}

/// `states`: each readable database's, for the topics its tables map to; `resume`:
/// what the checkpoint says of the output file, when it could be read.
pub(super) async fn check_destination(
    report: &mut Report,
    config: &Config,
    states: &[SourceState],
    resume: Option<Resume>,
) {
    let routing = &config.sink.routing;
    let largest = config.sink.kind.largest_message(&config.event);
    match &config.sink.kind {
        SinkConfig::Kafka(c) | SinkConfig::EventHubsKafka(c) => {
            let flavour = kafka_flavour(config);
            let (settings, template) = match c.settings(flavour, routing, largest.bytes) {
                Ok(found) => found,
                Err(e) => {
                    report.fail(
                        "destination",
                        Chain(&e).to_string(),
                        "see the setting it names",
                    );
                    return;
                }
            };
            let topics = written_topics(config, &template, states);
            collision_findings(report, &data_template(config, &template), states);
            match kafka::describe_destination(&settings, &topics, config.check.timeout).await {
            Ok(facts) => {
                kafka_findings(
                    report,
                    &facts,
                    match flavour {
                        KafkaFlavour::Kafka => c.bootstrap_servers.as_deref(),
                        KafkaFlavour::EventHubs => None,
                    },
                    crate::sink::LargestMessage {
                        bytes: settings.largest_record_batch(largest.bytes),
                        setting: largest.setting,
                    },
                    settings.check_topic_limits,
                );
                kafka_rights_finding(report, &facts, config);
            }
                Err(e @ crate::sink::SinkError::Definite { .. }) => report.fail(
                    "Kafka: brokers",
                    e.reason(),
                    "correct the setting the message names",
                ),
                Err(e) => report.fail(
                    "Kafka: brokers",
                    format!("no answer from sink.bootstrap_servers within {} s: {chain}", config.check.timeout.as_secs_f64(), chain = Chain(&e)),
                    "check sink.bootstrap_servers, that the brokers run and are reachable from here, and the security settings (sink.security_protocol, sink.sasl_mechanism, sink.sasl_username, sink.sasl_password, sink.ssl_*; sink.connection_string for Event Hubs)",
                ),
            }
        }
        SinkConfig::EventHubsAmqp(c) => {
            check_event_hubs(report, c, routing, config.check.timeout * 3).await
        }
        SinkConfig::File(c) => {
            let dir = match c.path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => std::path::PathBuf::from("."),
            };
            if let Err(e) = crate::checkpoint::file::probe_writable(&dir) {
                report.fail(
                    "destination",
                    format!(
                        "cannot write in {}: {chain}",
                        dir.display(),
                        chain = Chain(&e)
                    ),
                    "make the directory writable by this user, or set sink.path elsewhere",
                );
                return;
            }
            // What the file holds must be what the checkpoint says, as a run checks.
            let found = std::fs::metadata(&c.path)
                .ok()
                .filter(std::fs::Metadata::is_file)
                .map(|m| m.len());
            match (found, resume) {
                (Some(found), Some(resume)) => {
                    match crate::sink::stream::kept_length(&c.path, found, &resume) {
                        Ok(_) => report.pass("destination", format!("file {} ({found} bytes, as the checkpoint says)", c.path.display())),
                        Err(e) => report.fail(
                            "destination",
                            Chain(&e).to_string(),
                            "move the file or the checkpoint away as the message says; a run refuses it",
                        ),
                    }
                }
                _ => report.pass("destination", format!("file {}", c.path.display())),
            }
        }
        SinkConfig::Stdout(_) => report.pass("destination", "stdout"),
    }
}

/// `[sink.schema_registry]`: answers, and takes this login.
pub(super) async fn check_registry(
    report: &mut Report,
    settings: &crate::sink::registry::SchemaRegistrySettings,
) {
    let check = "schema registry";
    let mut registry = match crate::sink::registry::SchemaRegistry::new(settings) {
        Ok(registry) => registry,
        Err(e) => {
            report.fail(
                check,
                Chain(&e).to_string(),
                "correct the setting the message names",
            );
            return;
        }
    };
    match registry.probe().await {
        Ok(subjects) => report.pass(
            check,
            format!("{} answers ({subjects} subjects)", settings.url),
        ),
        Err(e) if e.is_transient() => report.fail(
            check,
            Chain(&e).to_string(),
            "check sink.schema_registry.url, that the registry runs and is reachable from here (ca_location for a private CA)",
        ),
        Err(e) => report.fail(check, Chain(&e).to_string(), "check sink.schema_registry.username and password"),
    }
}

/// Event Hubs over AMQP: connects as a run would and reads the hub's partitions.
async fn check_event_hubs(
    report: &mut Report,
    c: &crate::sink::event_hubs_amqp::config::EventHubsAmqpSinkConfig,
    routing: &crate::sink::settings::RoutingSettings,
    timeout: Duration,
) {
    let built = tokio::time::timeout(timeout, c.build(routing, SinkHealth::new(false))).await;
    match built {
        Ok(Ok(built)) => {
            let partitions = match &built.sink {
                crate::sink::Sink::EventHubsAmqp(s) => s.partition_count(),
                _ => None,
            };
            match partitions {
                Some(n) => report.pass(
                    format!("Event Hubs: {}", built.topic),
                    format!("connected; the hub exists with {n} partitions"),
                ),
                None => report.fail(
                    format!("Event Hubs: {}", built.topic),
                    "connected, but the hub's properties are not readable: every key would go through the gateway, slowly",
                    "give the credential the Listen or Manage right (or the Azure Event Hubs Data Owner role), so it can read the hub's partitions",
                ),
            }
            if let Err(e) = built.sink.close().await {
            tracing::debug!(error = %Chain(&e), "closing the check's Event Hubs connection");
        }
        }
        Ok(Err(e)) => report.fail(
            "Event Hubs",
            Chain(&e).to_string(),
            "check sink.connection_string (or sink.namespace and sink.entra_credential) and sink.topic",
        ),
        Err(_) => report.fail(
            "Event Hubs",
            format!("no connection within {} s", timeout.as_secs_f64()),
            "check the namespace, that AMQP (port 5671) is reachable from here, and sink.custom_endpoint",
        ),
    }
}

/// The topics the stream writes: data events' (`template`), with
/// `sink.schema_changes = "topic"` schema-change events', and with heartbeats on
/// theirs.
fn written_topics(config: &Config, template: &str, states: &[SourceState]) -> Vec<String> {
    let routing = &config.sink.routing;
    let debezium = (config.event.format == crate::event::settings::EventFormat::Debezium)
        .then_some(&config.event.debezium);
    let mut all = topics(&data_template(config, template), states);
    if routing.schema_changes == crate::sink::settings::SchemaChangePlacement::Topic {
        let schema_topic = match (debezium, &routing.schema_topic) {
            (Some(d), None) => d.topic_prefix.clone(),
            _ => routing.schema_topic(),
        };
        all.extend(topics(&schema_topic, states));
    }
    if !routing.heartbeat_interval.is_zero() {
        all.extend(topics(&routing.heartbeat_topic(), states));
    }
    if let Some(d) = debezium {
        if d.provide_transaction_metadata {
            all.push(d.transaction_topic());
        }
        all = all
            .iter()
            .map(|t| crate::event::sanitize_topic(t))
            .collect();
    }
    all.sort();
    all.dedup();
    all
}

/// The template data events' topics come from: Debezium's names where `sink.topic`
/// leaves them.
fn data_template(config: &Config, template: &str) -> String {
    match (config.event.format, &config.sink.routing.topic) {
        (crate::event::settings::EventFormat::Debezium, None) => {
            config.event.debezium.topic_template()
        }
        _ => template.to_owned(),
    }
}

/// Included tables whose events meet in one topic only because their names were
/// made safe for Kafka (`order details` and `order_details` both give
/// `order_details`): a warning naming them.
fn collision_findings(report: &mut Report, template: &str, states: &[SourceState]) {
    let tables = states.iter().flat_map(|state| {
        state.included.iter().map(move |i| {
            (
                state.catalog.database.as_str(),
                i.schema.as_str(),
                i.table.as_str(),
            )
        })
    });
    for (topic, names) in crate::event::topic_collisions(template, tables) {
        report.warn(
            format!("topic {topic}"),
            format!(
                "tables meet in this topic once their names are made safe for Kafka (only A-Z, a-z, 0-9, '.', '_' and '-'): {}",
                names.join(", ")
            ),
            "a consumer tells them apart by the event's table (data.eventsource); to keep them apart by topic, exclude one with source.exclude or rename a table",
        );
    }
}

/// The topics the stream writes to: the template for each included table of every
/// database read.
pub(super) fn topics(template: &str, states: &[SourceState]) -> Vec<String> {
    let mut topics: Vec<String> = if states.is_empty() {
        if template.contains('{') {
            Vec::new()
        } else {
            vec![template.to_owned()]
        }
    } else {
        states
            .iter()
            .flat_map(|state| {
                state
                    .included
                    .iter()
                    .map(|i| expand_topic(template, &state.catalog.database, &i.schema, &i.table))
            })
            .collect()
    };
    topics.sort();
    topics.dedup();
    topics
}

/// What `check` can and cannot tell of the login's rights on a Kafka destination:
/// seeing a topic's metadata needs a right on it (WRITE implies DESCRIBE), but
/// whether it may write, or use its transactional id, only a write would tell, and
/// `check` writes nothing.
/// What `check` verified of the rights the book's ACL table lists for this
/// configuration, and what only a run shows (check writes nothing and joins no
/// group).
pub(super) fn kafka_rights_finding(report: &mut Report, facts: &DestinationFacts, config: &Config) {
    let seen: Vec<&str> = facts
        .topics
        .iter()
        .filter(|t| t.partitions.is_some())
        .map(|t| t.name.as_str())
        .collect();
    let mut verified = vec![if seen.is_empty() {
        "the login sees no topic yet".to_owned()
    } else {
        format!(
            "the login sees topic {} (some right on each)",
            seen.join(", ")
        )
    }];
    let mut unverified = vec!["WRITE on the topics".to_owned()];
    if config.checkpoint.store == crate::config::CheckpointStoreKind::Kafka {
        let topic = &config.checkpoint.topic;
        let read = report
            .findings
            .iter()
            .any(|f| f.check == "checkpoint: readable" && f.status == Status::Pass);
        if read {
            verified.push(format!("READ on topic {topic} (the checkpoint was read)"));
        } else {
            unverified.push(format!("READ on topic {topic}"));
        }
        unverified.push(format!("WRITE on topic {topic}"));
    }
    if let SinkConfig::Kafka(c) = &config.sink.kind
        && c.exactly_once
    {
        let id = crate::commands::run::transactional_id(c, &config.checkpoint.stream_name);
        unverified.push(format!("WRITE on transactional id {id}"));
    }
    if let Some(group) = &config.fleet.group_id {
        unverified.push(format!(
            "READ on group {group} and on the fleet's control topic"
        ));
    }
    report.skip(
        "Kafka: rights",
        format!(
            "verified: {}; not verified, since check writes nothing and joins no group: {} (a run stops at once, naming a missing one)",
            verified.join("; "),
            unverified.join(", ")
        ),
    );
}

/// The verdicts on a Kafka destination's facts. `bootstrap`: the brokers a
/// command that creates a missing topic should name (none on Event Hubs, where the
/// event hub is created instead).
pub fn kafka_findings(
    report: &mut Report,
    facts: &DestinationFacts,
    bootstrap: Option<&str>,
    largest: crate::sink::LargestMessage,
    check_limits: bool,
) {
    let crate::sink::LargestMessage {
        bytes: largest,
        setting: sized_by,
    } = largest;
    let create = |topic: &str| match bootstrap {
        Some(brokers) => format!(
            "create it, with as many partitions as consumers should share it: kafka-topics.sh --bootstrap-server '{brokers}' --create --topic '{topic}' --partitions 6"
        ),
        None => format!("create an event hub named {topic}"),
    };
    report.pass(
        "Kafka: brokers",
        match &facts.login {
            Some(login) => format!("{} reachable; credentials accepted ({login})", facts.brokers),
            None => format!(
                "{} reachable; no login configured (sink.security_protocol without SASL or a client certificate)",
                facts.brokers
            ),
        },
    );
    for topic in &facts.topics {
        let check = format!("topic {}", topic.name);
        if topic.refused {
            report.fail(
                check,
                "Kafka refused the login this topic's metadata (TOPIC_AUTHORIZATION_FAILED): it may exist, and the login has no right on it",
                format!("grant the login WRITE on topic {} (the book's ACL table lists what each mode needs)", topic.name),
            );
            continue;
        }
        let Some(partitions) = topic.partitions else {
            match &facts.auto_create {
                Ok(true) => report.pass(
                    check,
                    "does not exist yet; the broker creates it on first use (auto.create.topics.enable), with its num.partitions",
                ),
                Ok(false) => report.fail(
                    check,
                    "does not exist, and the broker does not create topics (auto.create.topics.enable = false)",
                    create(&topic.name),
                ),
                Err(why) => report.fail(
                    check,
                    format!("does not exist (whether the broker would create it: {why})"),
                    create(&topic.name),
                ),
            }
            continue;
        };
        if !check_limits {
            report.pass(check, format!("{partitions} partitions"));
            continue;
        }
        match &topic.max_message_bytes {
            Ok(limit) => match kafka::check_topic_limit(&topic.name, *limit, largest, sized_by) {
                Ok(()) => report.pass(
                    check,
                    format!("{partitions} partitions; max.message.bytes {limit} takes this producer's record batches (up to {largest} bytes)"),
                ),
                Err(e) => report.fail(
                    check,
                    format!("{partitions} partitions; {chain}", chain = Chain(&e)),
                    format!(
                        "kafka-configs.sh --alter --entity-type topics --entity-name {} --add-config max.message.bytes={}, or lower {sized_by}",
                        topic.name, largest
                    ),
                ),
            },
            Err(why) => report.skip(
                check,
                format!("{partitions} partitions; max.message.bytes {why}: make sure it takes the largest message ({sized_by})"),
            ),
        }
    }
}

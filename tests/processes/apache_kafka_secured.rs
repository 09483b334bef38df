//! Sign-in and permissions as a secured Apache Kafka has them: SCRAM-SHA-256 and
//! -512 users created when the cluster is formatted, and the `StandardAuthorizer`
//! allowing only what an ACL grants. For each delivery mode the exact ACLs the book
//! lists are granted and the run streams; then each one is left out in turn, and
//! the run stops with a definite error that names what is missing.

use crate::harness;
use crate::support;

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use support::apache_kafka::{Cluster, NodeOptions};
use support::temp_dir;

const PASSWORD: &str = "Right-Passw0rd";
const TOPIC: &str = "ces-secured";
const CHECKPOINTS: &str = "checkpoints-secured";
const FLEET_GROUP: &str = "fleet-secured";
const FLEET_TOPIC: &str = "fleet-control-secured";

/// A delivery mode and the ACLs it needs.
#[derive(Clone, Copy, Debug)]
enum Mode {
    AtLeastOnce,
    KafkaStore,
    ExactlyOnce,
}

const MODES: [Mode; 3] = [Mode::AtLeastOnce, Mode::KafkaStore, Mode::ExactlyOnce];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::AtLeastOnce => "alo",
            Mode::KafkaStore => "store",
            Mode::ExactlyOnce => "eo",
        }
    }

    /// The ACLs `user` needs in this mode: (resource type, name, operation), as the
    /// book's table lists them.
    fn acls(self, user: &str) -> Vec<(&'static str, String, &'static str)> {
        let mut acls = vec![("TOPIC", TOPIC.to_owned(), "WRITE")];
        if matches!(self, Mode::KafkaStore | Mode::ExactlyOnce) {
            acls.push(("TOPIC", CHECKPOINTS.to_owned(), "READ"));
            acls.push(("TOPIC", CHECKPOINTS.to_owned(), "WRITE"));
        }
        if matches!(self, Mode::ExactlyOnce) {
            acls.push(("TRANSACTIONAL_ID", format!("tx-{user}"), "WRITE"));
        }
        acls
    }

    fn config(
        self,
        dir: &Path,
        bootstrap: &str,
        user: &str,
        mechanism: &str,
    ) -> std::path::PathBuf {
        let checkpoint = match self {
            Mode::AtLeastOnce => {
                format!("path = \"{}\"", dir.join(format!("{user}.json")).display())
            }
            _ => format!("store = \"kafka\"\ntopic = \"{CHECKPOINTS}\"\nstream_name = \"{user}\""),
        };
        let exactly_once = matches!(self, Mode::ExactlyOnce);
        let path = dir.join(format!("{user}.toml"));
        std::fs::write(
            &path,
            format!(
                r#"
[source]
kind = "synthetic"
[source.synthetic]
transactions = 20
seed = 3
[sink]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "{TOPIC}"
security_protocol = "sasl_plaintext"
sasl_mechanism = "{mechanism}"
sasl_username = "{user}"
delivery_timeout_ms = 10000
exactly_once = {exactly_once}
transactional_id = "tx-{user}"
[checkpoint]
{checkpoint}
"#
            ),
        )
        .expect("config");
        path
    }
}

/// The users of every case: `<mode>-all` with every ACL of its mode, `<mode>-no<i>`
/// without the i-th, and two for the sign-in tests.
fn users() -> Vec<(String, String)> {
    let mut users = vec![
        ("SCRAM-SHA-256".to_owned(), "w256".to_owned()),
        ("SCRAM-SHA-512".to_owned(), "w512".to_owned()),
    ];
    for user in ["fleet-all", "fleet-no-group", "fleet-no-topic"] {
        users.push(("SCRAM-SHA-512".into(), user.to_owned()));
    }
    for mode in MODES {
        users.push(("SCRAM-SHA-512".into(), format!("{}-all", mode.name())));
        for i in 0..mode.acls("").len() {
            users.push(("SCRAM-SHA-256".into(), format!("{}-no{i}", mode.name())));
        }
    }
    users
}

/// One secured broker for these tests, its topics created and the checkpoint topic
/// holding a record (so that a read of it goes through the consumer group).
fn secured() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let users = users();
        let credentials: Vec<(&str, &str, &str)> = users
            .iter()
            .map(|(m, u)| (m.as_str(), u.as_str(), PASSWORD))
            .collect();
        let cluster = Cluster::start("secured", 1, NodeOptions::secured(&credentials));
        cluster.create_topic(TOPIC, 2, 1, &[]);
        cluster.create_topic(CHECKPOINTS, 1, 1, &[("cleanup.policy", "compact")]);
        cluster.create_topic(FLEET_TOPIC, 4, 1, &[]);
        seed_checkpoint_topic(&cluster);
        let mut acls = Vec::new();
        for (_, user) in &users {
            if let Some(fleet) = user.strip_prefix("fleet-") {
                let principal = format!("User:{user}");
                let mut grants = Mode::KafkaStore.acls(user);
                // A fleet on the Kafka store is exactly-once: each database's
                // transactional id (the default, from its stream name).
                for database in ["tenant001", "tenant002"] {
                    grants.push((
                        "TRANSACTIONAL_ID",
                        format!("mssql-ces.{user}-{database}"),
                        "WRITE",
                    ));
                }
                if fleet != "no-group" {
                    grants.push(("GROUP", FLEET_GROUP.to_owned(), "READ"));
                }
                if fleet != "no-topic" {
                    grants.push(("TOPIC", FLEET_TOPIC.to_owned(), "READ"));
                }
                acls.extend(
                    grants
                        .into_iter()
                        .map(|(t, n, o)| (principal.clone(), t, n, o)),
                );
                continue;
            }
            let Some((mode, which)) = MODES.iter().find_map(|m| {
                let rest = user.strip_prefix(m.name())?.strip_prefix('-')?;
                Some((
                    *m,
                    rest.strip_prefix("no")
                        .and_then(|i| i.parse::<usize>().ok()),
                ))
            }) else {
                // The sign-in users write at least once.
                acls.extend(
                    Mode::AtLeastOnce
                        .acls(user)
                        .into_iter()
                        .map(|(t, n, o)| (format!("User:{user}"), t, n, o)),
                );
                continue;
            };
            for (i, (t, n, o)) in mode.acls(user).into_iter().enumerate() {
                if Some(i) != which {
                    acls.push((format!("User:{user}"), t, n, o));
                }
            }
        }
        cluster.grant(&acls);
        cluster
    })
}

fn seed_checkpoint_topic(cluster: &Cluster) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", cluster.bootstrap());
    for (k, v) in cluster.admin_properties() {
        config.set(k, v);
    }
    let producer: FutureProducer = config.create().expect("producer");
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(
            producer.send(
                FutureRecord::to(CHECKPOINTS)
                    .key("another-stream")
                    .payload("{}"),
                Duration::from_secs(30),
            ),
        )
        .map_err(|(e, _)| e)
        .expect("a record in the checkpoint topic");
}

/// Runs the binary to the end with `password` (none if empty), bounded.
fn run(config: &Path, password: &str) -> (std::process::Output, Duration) {
    let started = Instant::now();
    let mut command = harness::command(&["run", "--until-idle"], config);
    if !password.is_empty() {
        command.env("MSSQL_CES__SINK__SASL_PASSWORD", password);
    }
    let output = harness::output(&mut command, "a run on the secured cluster");
    (output, started.elapsed())
}

/// Each mode with exactly its ACLs streams; without any one of them it stops at
/// once with a definite error naming the operation and the resource.
#[test]
fn each_mode_needs_exactly_the_acls_the_book_lists_and_names_the_one_missing() {
    let cluster = secured();
    let dir = temp_dir("secured-acls");
    let mut table = Vec::new();
    for mode in MODES {
        let user = format!("{}-all", mode.name());
        let config = mode.config(&dir, &cluster.bootstrap(), &user, "SCRAM-SHA-512");
        let (output, _) = run(&config, PASSWORD);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{mode:?} with its ACLs: {stderr}");
        // Run again: the checkpoint it wrote is read back (no right on any group).
        let (output, _) = run(&config, PASSWORD);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{mode:?} again: {stderr}");
        assert!(
            stderr.contains("resuming from the checkpoint"),
            "{mode:?} reads its checkpoint back: {stderr}"
        );
        for (i, (kind, name, operation)) in mode.acls("").into_iter().enumerate() {
            let user = format!("{}-no{i}", mode.name());
            let name = if kind == "TRANSACTIONAL_ID" {
                format!("tx-{user}")
            } else {
                name
            };
            let config = mode.config(&dir, &cluster.bootstrap(), &user, "SCRAM-SHA-256");
            let (output, took) = run(&config, PASSWORD);
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            let last = stderr
                .lines()
                .rfind(|l| l.starts_with("error:"))
                .unwrap_or_default()
                .to_owned();
            table.push(format!(
                "{mode:?} without {operation} on {kind} {name}: exit {:?} after {:.1} s: {last}",
                output.status.code(),
                took.as_secs_f64()
            ));
            assert_eq!(
                output.status.code(),
                Some(1),
                "{mode:?} without {operation} on {kind} {name}: {stderr}"
            );
            assert!(
                took < Duration::from_secs(30),
                "{mode:?} without {operation} on {kind} {name}: stopped only after {took:?}"
            );
            assert!(!stderr.contains(PASSWORD), "no secret in the log: {stderr}");
            let resource = match kind {
                "TOPIC" => format!("topic {name}"),
                "GROUP" => format!("group {name}"),
                _ => format!("transactional id {name}"),
            };
            let error = match kind {
                "TOPIC" => "TOPIC_AUTHORIZATION_FAILED",
                "GROUP" => "GROUP_AUTHORIZATION_FAILED",
                _ => "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            };
            let names_it =
                last.contains(error) && last.contains(operation) && last.contains(&resource);
            // Without WRITE on any topic the login lacks the idempotent producer's
            // IDEMPOTENT_WRITE too: Kafka may refuse the producer its id before it
            // refuses a write, and that refusal says to grant WRITE on the topic.
            let id_refused = kind == "TOPIC"
                && operation == "WRITE"
                && last.contains("ClusterAuthorizationFailed")
                && last.contains("grant it WRITE on the sink's topic");
            assert!(
                names_it || id_refused,
                "{mode:?} without {operation} on {resource}: the error names Kafka's refusal and the right to grant: {last}"
            );
            assert!(last.contains("a restart repeats it"), "definite: {last}");
        }
    }
    for row in &table {
        println!("{row}");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// SCRAM-SHA-256 and -512 logins stream with the right password; a wrong one is
/// refused at once, naming the settings to check and never the password.
#[test]
fn scram_256_and_512_logins_stream_and_a_wrong_password_is_refused_at_once() {
    let cluster = secured();
    let dir = temp_dir("secured-scram");
    for (mechanism, user) in [("SCRAM-SHA-256", "w256"), ("SCRAM-SHA-512", "w512")] {
        let config = Mode::AtLeastOnce.config(&dir, &cluster.bootstrap(), user, mechanism);
        let (output, _) = run(&config, PASSWORD);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{mechanism}: {stderr}");
        assert!(!stderr.contains(PASSWORD), "{stderr}");
        std::fs::remove_file(dir.join(format!("{user}.json"))).ok();
        let (output, took) = run(&config, "Wrong-Passw0rd");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{mechanism}: {stderr}");
        assert!(
            took < Duration::from_secs(20),
            "{mechanism}: refused after {took:?}"
        );
        assert!(
            stderr.contains("sink.sasl_mechanism") && stderr.contains("sink.sasl_password"),
            "{mechanism}: names the settings: {stderr}"
        );
        assert!(
            stderr.contains("a restart repeats it"),
            "definite: {stderr}"
        );
        assert!(!stderr.contains("Wrong-Passw0rd"), "{stderr}");
    }
    let records = cluster.read(TOPIC, "read_uncommitted", &[]);
    assert!(!records.is_empty(), "the logins wrote");
    std::fs::remove_dir_all(dir).ok();
}

/// TLS with a test CA, and mutual TLS: the binary verifies the broker's certificate
/// against `sink.ssl_ca_location` and streams; where the broker requires a client
/// certificate, it streams with `sink.ssl_certificate_location` and
/// `ssl_key_location`, and without them it stops with a definite error.
#[test]
fn tls_and_mutual_tls_stream_and_a_client_without_its_certificate_is_refused() {
    use support::apache_kafka::TestCa;
    let dir = temp_dir("secured-tls");
    let ca = TestCa::new(&dir.join("ca"));
    for mutual in [false, true] {
        let name = if mutual { "mtls" } else { "tls" };
        let cluster = Cluster::start(name, 1, NodeOptions::tls(&ca, mutual));
        cluster.create_topic(TOPIC, 2, 1, &[]);
        let write = |with_certificate: bool, round: &str| {
            let client = if with_certificate {
                format!(
                    "ssl_certificate_location = \"{}\"\nssl_key_location = \"{}\"\n",
                    ca.client_certificate.display(),
                    ca.client_key.display()
                )
            } else {
                String::new()
            };
            let path = dir.join(format!("{name}-{round}.toml"));
            std::fs::write(
                &path,
                format!(
                    "[source]\nkind = \"synthetic\"\n[source.synthetic]\ntransactions = 20\nseed = 3\n\
                     [sink]\nkind = \"kafka\"\nbootstrap_servers = \"{}\"\ntopic = \"{TOPIC}\"\n\
                     delivery_timeout_ms = 10000\nsecurity_protocol = \"ssl\"\nssl_ca_location = \"{}\"\n{client}\
                     [checkpoint]\npath = \"{}\"\n",
                    cluster.bootstrap(),
                    ca.ca.display(),
                    dir.join(format!("{name}-{round}.json")).display()
                ),
            )
            .expect("config");
            path
        };
        let (output, _) = run(&write(mutual, "right"), "");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{name}: {stderr}");
        if mutual {
            let (output, took) = run(&write(false, "no-certificate"), "");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(1),
                "{name} without a client certificate: {stderr}"
            );
            assert!(
                took < Duration::from_secs(8),
                "refused at once, not at the delivery time-out: {took:?}: {stderr}"
            );
            assert!(
                stderr.contains("sink.ssl_certificate_location")
                    && stderr.contains("a restart repeats it"),
                "definite, naming the settings: {stderr}"
            );
            println!(
                "mutual TLS without a client certificate: {}",
                stderr
                    .lines()
                    .rfind(|l| l.starts_with("error:"))
                    .unwrap_or_default()
            );
        }
        let records = cluster.read(TOPIC, "read_uncommitted", &[]);
        assert_eq!(records.len(), 72, "{name}: the run's events");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A fleet member needs READ on its group and on its control topic (with
/// the Kafka store's rights): with them it is assigned slots and streams; without
/// either it stops within seconds, naming the right, instead of retrying.
#[test]
fn a_fleet_member_needs_read_on_its_group_and_on_its_control_topic() {
    let cluster = secured();
    let dir = temp_dir("secured-fleet");
    let config = |user: &str| {
        let path = dir.join(format!("{user}.toml"));
        std::fs::write(
            &path,
            format!(
                r#"
[source]
kind = "synthetic"
databases = ["tenant*"]
poll_interval_ms = 50
[source.synthetic]
databases = 2
transactions = 20
seed = 5
[sink]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "{TOPIC}"
security_protocol = "sasl_plaintext"
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "{user}"
delivery_timeout_ms = 10000
exactly_once = true
[checkpoint]
store = "kafka"
topic = "{CHECKPOINTS}"
stream_name = "{user}-{{db}}"
[fleet]
group_id = "{FLEET_GROUP}"
topic = "{FLEET_TOPIC}"
session_timeout_ms = 6000
"#,
                bootstrap = cluster.bootstrap()
            ),
        )
        .expect("config");
        path
    };
    let spawn = |user: &str| {
        let mut command = harness::command(&["run"], &config(user));
        command.env("MSSQL_CES__SINK__SASL_PASSWORD", PASSWORD);
        harness::spawn_logged(command, &dir, user)
    };
    let log =
        |user: &str| std::fs::read_to_string(dir.join(format!("{user}.log"))).unwrap_or_default();

    let mut member = spawn("fleet-all");
    harness::wait_for_line(
        &dir.join("fleet-all.log"),
        "slots assigned",
        Duration::from_secs(60),
    );
    let status = harness::stop(&mut member, &dir, "the member with its rights");
    assert!(
        status.success(),
        "it leaves cleanly ({status:?}): {}",
        log("fleet-all")
    );

    for (user, grant) in [
        ("fleet-no-group", format!("READ on group {FLEET_GROUP}")),
        ("fleet-no-topic", format!("READ on topic {FLEET_TOPIC}")),
    ] {
        let started = Instant::now();
        let mut member = spawn(user);
        let status = support::tools::wait_within(&mut member, Duration::from_secs(60));
        let text = log(user);
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(1),
            "{user} stops: {text}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{user} stopped only after {:?}",
            started.elapsed()
        );
        assert!(
            text.contains(&grant) && text.contains("AUTHORIZATION_FAILED"),
            "{user}: names {grant}: {text}"
        );
        assert!(!text.contains(PASSWORD), "no secret in the log");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// `check` on the secured cluster: a login with no right on the sink's topic is told
/// so (not that the topic does not exist), a login with its rights is told what
/// check could verify and what only a run can, and a SASL mechanism the brokers do
/// not offer is a refusal.
#[test]
fn check_tells_a_topic_the_login_may_not_see_from_a_missing_one_and_says_what_it_verified() {
    let cluster = secured();
    let dir = temp_dir("secured-check");
    let check = |user: &str, mechanism: &str| {
        let config = Mode::ExactlyOnce.config(&dir, &cluster.bootstrap(), user, mechanism);
        let output = harness::output(
            harness::command(&["check"], &config).env("MSSQL_CES__SINK__SASL_PASSWORD", PASSWORD),
            "check on the secured cluster",
        );
        harness::printed(&output)
    };
    let refused = check("alo-no0", "SCRAM-SHA-256");
    assert!(
        refused.contains("TOPIC_AUTHORIZATION_FAILED")
            && refused.contains(&format!("WRITE on topic {TOPIC}")),
        "{refused}"
    );
    assert!(
        !refused.contains("does not exist"),
        "not told it is missing: {refused}"
    );
    let granted = check("eo-all", "SCRAM-SHA-512");
    assert!(granted.contains("Kafka: rights"), "{granted}");
    assert!(
        granted.contains("credentials accepted (SASL SCRAM-SHA-512)"),
        "{granted}"
    );
    assert!(
        granted.contains(&format!("topic {TOPIC}"))
            && granted.contains(&format!(
                "READ on topic {CHECKPOINTS} (the checkpoint was read)"
            ))
            && granted.contains(&format!("WRITE on topic {CHECKPOINTS}"))
            && granted.contains("WRITE on transactional id tx-eo-all"),
        "what it verified and what it could not: {granted}"
    );
    // The checkpoint topic's WRITE is not claimed on a lookup alone.
    let writable = granted
        .lines()
        .find(|l| l.contains("checkpoint: writable"))
        .unwrap_or_default();
    assert!(
        !writable.starts_with('✔') && writable.contains("not verified"),
        "{writable}"
    );
    println!("{granted}");
    // A mechanism the brokers do not offer is a refusal naming the setting, not "no
    // answer".
    let plain = check("eo-all", "PLAIN");
    let brokers = plain
        .lines()
        .find(|l| l.starts_with("✘ Kafka: brokers"))
        .unwrap_or_else(|| panic!("{plain}"));
    assert!(
        brokers.contains("refused this client")
            && brokers.contains("Unsupported SASL mechanism")
            && brokers.contains("sink.sasl_mechanism")
            && !brokers.contains("no answer"),
        "{plain}"
    );
    // The checkpoint topic is on those brokers: its checks say why they were not
    // made, rather than each waiting out check.timeout_ms and naming another cause.
    for check in [
        "checkpoint: readable",
        "checkpoint: writable",
        "checkpoint: kept",
    ] {
        let line = plain
            .lines()
            .find(|l| l.contains(check))
            .unwrap_or_else(|| panic!("{check}: {plain}"));
        assert!(
            line.starts_with('–') && line.contains("refused this client"),
            "{line}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

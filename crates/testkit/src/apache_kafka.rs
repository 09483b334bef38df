//! Apache Kafka 4.4.0 itself, for the tests of promises that are Kafka's behaviour
//! (transactions and `read_committed`, fencing, replication, sign-in): brokers in
//! KRaft mode started on loopback from the jars `bash tests/setup` assembles, and
//! Kafka's own Java client to read back what was written.
//!
//! - [`shared`] is one combined broker and controller for a whole test binary,
//!   started on first use; each test uses topics, transactional ids and groups of
//!   its own, so tests run on it in parallel.
//! - [`Cluster::start`] starts nodes of a test's own (three for replication); they
//!   stop when the value is dropped, and a node can be killed, frozen and restarted.
//!
//! A broker's JVM never outlives the test process: each has a watchdog (`sh`) that
//! kills it once the pipe from this process closes, however this process ends.
//! Every wait has a deadline, and a failure names the broker's log file.

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;

use crate::kafka::Consumed;
use crate::tools;

/// How long a node may take from its start to "Kafka Server started".
const STARTUP: Duration = Duration::from_secs(90);

/// One node's settings beyond the defaults every node has: extra lines of its
/// `server.properties`, and extra arguments of `kafka-storage format` (SCRAM users).
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    pub properties: Vec<String>,
    pub format_args: Vec<String>,
    /// How the kit's own clients (admin, the Java reader) connect: librdkafka's
    /// properties, and the same as Kafka's Java client spells them.
    pub client: Vec<(String, String)>,
    pub java_client: Vec<(String, String)>,
}

/// The super user of a [`NodeOptions::secured`] cluster (SCRAM-SHA-512).
pub const ADMIN: (&str, &str) = ("admin", "admin-secret");

impl NodeOptions {
    /// A cluster whose clients sign in with SCRAM (SHA-256 and SHA-512, over
    /// SASL_PLAINTEXT) and whose `StandardAuthorizer` allows only what an ACL
    /// grants. `users` are (mechanism, name, password), created at format time, as
    /// is the super user [`ADMIN`] the brokers use among themselves.
    pub fn secured(users: &[(&str, &str, &str)]) -> NodeOptions {
        let jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required";
        let mut format_args = vec![
            "--add-scram".to_owned(),
            format!("SCRAM-SHA-512=[name={},password={}]", ADMIN.0, ADMIN.1),
        ];
        for (mechanism, name, password) in users {
            format_args.push("--add-scram".to_owned());
            format_args.push(format!("{mechanism}=[name={name},password={password}]"));
        }
        NodeOptions {
            properties: vec![
                "listeners=SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}".into(),
                "advertised.listeners=SASL_PLAINTEXT://127.0.0.1:{port}".into(),
                "listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT".into(),
                "inter.broker.listener.name=SASL_PLAINTEXT".into(),
                "sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512".into(),
                "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512".into(),
                format!(
                    "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config={jaas} username=\"{}\" password=\"{}\";",
                    ADMIN.0, ADMIN.1
                ),
                format!("listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config={jaas};"),
                "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer".into(),
                // The controller listener is plaintext inside the node: its anonymous
                // principal is the node itself.
                format!("super.users=User:{};User:ANONYMOUS", ADMIN.0),
                "allow.everyone.if.no.acl.found=false".into(),
            ],
            format_args,
            client: vec![
                ("security.protocol".into(), "SASL_PLAINTEXT".into()),
                ("sasl.mechanism".into(), "SCRAM-SHA-512".into()),
                ("sasl.username".into(), ADMIN.0.into()),
                ("sasl.password".into(), ADMIN.1.into()),
            ],
            java_client: vec![
                ("security.protocol".into(), "SASL_PLAINTEXT".into()),
                ("sasl.mechanism".into(), "SCRAM-SHA-512".into()),
                (
                    "sasl.jaas.config".into(),
                    format!("{jaas} username=\"{}\" password=\"{}\";", ADMIN.0, ADMIN.1),
                ),
            ],
        }
    }
}

/// The files of a test certificate authority, a broker certificate it signed (for
/// 127.0.0.1 and localhost) and a client certificate it signed, all PEM.
#[derive(Debug, Clone)]
pub struct TestCa {
    /// The CA's certificate: what a client trusts.
    pub ca: PathBuf,
    /// The broker's key (PKCS#8) followed by its certificate: its PEM keystore.
    pub broker_keystore: PathBuf,
    /// A client's certificate and key, for mutual TLS.
    pub client_certificate: PathBuf,
    pub client_key: PathBuf,
    /// The client's key followed by its certificate (a Java client's PEM keystore).
    pub client_keystore: PathBuf,
}

impl TestCa {
    /// Makes a new CA and its certificates in `dir`.
    pub fn new(dir: &Path) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        std::fs::create_dir_all(dir).expect("CA directory");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "mssql-ces test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let signed = |names: Vec<String>, common_name: &str| {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(names).expect("params");
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
            let cert = params.signed_by(&key, &issuer).expect("certificate");
            (key.serialize_pem(), cert.pem())
        };
        let (broker_key, broker_cert) =
            signed(vec!["127.0.0.1".into(), "localhost".into()], "broker");
        let (client_key, client_cert) = signed(Vec::new(), "mssql-ces-client");
        let ca = TestCa {
            ca: dir.join("ca.pem"),
            broker_keystore: dir.join("broker-keystore.pem"),
            client_certificate: dir.join("client.pem"),
            client_key: dir.join("client-key.pem"),
            client_keystore: dir.join("client-keystore.pem"),
        };
        std::fs::write(&ca.ca, ca_cert.pem()).expect("ca.pem");
        std::fs::write(&ca.broker_keystore, format!("{broker_key}{broker_cert}"))
            .expect("keystore");
        std::fs::write(&ca.client_keystore, format!("{client_key}{client_cert}"))
            .expect("client keystore");
        std::fs::write(&ca.client_certificate, client_cert).expect("client.pem");
        std::fs::write(&ca.client_key, client_key).expect("client-key.pem");
        ca
    }
}

impl NodeOptions {
    /// A cluster whose clients connect over TLS, the brokers' certificate signed by
    /// `ca`; with `mutual`, clients must present a certificate `ca` signed.
    pub fn tls(ca: &TestCa, mutual: bool) -> NodeOptions {
        NodeOptions {
            properties: vec![
                "listeners=SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}".into(),
                "advertised.listeners=SSL://localhost:{port}".into(),
                "listener.security.protocol.map=SSL:SSL,CONTROLLER:PLAINTEXT".into(),
                "inter.broker.listener.name=SSL".into(),
                "ssl.keystore.type=PEM".into(),
                format!("ssl.keystore.location={}", ca.broker_keystore.display()),
                "ssl.truststore.type=PEM".into(),
                format!("ssl.truststore.location={}", ca.ca.display()),
                format!(
                    "ssl.client.auth={}",
                    if mutual { "required" } else { "none" }
                ),
            ],
            format_args: Vec::new(),
            client: vec![
                ("security.protocol".into(), "ssl".into()),
                ("ssl.ca.location".into(), ca.ca.display().to_string()),
                (
                    "ssl.certificate.location".into(),
                    ca.client_certificate.display().to_string(),
                ),
                (
                    "ssl.key.location".into(),
                    ca.client_key.display().to_string(),
                ),
            ],
            java_client: vec![
                ("security.protocol".into(), "SSL".into()),
                ("ssl.truststore.type".into(), "PEM".into()),
                (
                    "ssl.truststore.location".into(),
                    ca.ca.display().to_string(),
                ),
                ("ssl.keystore.type".into(), "PEM".into()),
                (
                    "ssl.keystore.location".into(),
                    ca.client_keystore.display().to_string(),
                ),
            ],
        }
    }
}

/// A node of a cluster: a JVM running `kafka.Kafka`, broker and controller at once.
pub struct Node {
    pub id: u32,
    pub port: u16,
    controller_port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// The length of the log when the node was last started.
    log_start: usize,
    watchdog: Option<(Child, ChildStdin)>,
}

/// Brokers of a test (or the binary's shared one).
pub struct Cluster {
    pub nodes: Vec<Node>,
    cluster_id: String,
    options: NodeOptions,
    /// The nodes' directories (properties, data, logs): removed with the cluster,
    /// kept when a test failed, for its logs.
    root: PathBuf,
}

static SHARED: OnceLock<Cluster> = OnceLock::new();

/// The test binary's one broker, started on first use.
pub fn shared() -> &'static Cluster {
    SHARED.get_or_init(|| Cluster::start("shared", 1, NodeOptions::default()))
}

/// A free loopback port for a node, below Linux's ephemeral range (32768–60999),
/// where the ports of `MockCluster` brokers and of every client come from. A port
/// taken from that range could be one a test's `MockCluster` broker just released
/// (`broker_down`): its client would then reconnect to a Kafka node of another test
/// and find it up.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let start = std::process::id() % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port from {LOW} to {}", LOW + SPAN)
}

/// A Java command on Kafka's class path. The JVMs the tests start are short-lived
/// or lightly loaded, so they compile with the quick compiler only and collect on
/// one thread: on a two-core machine that runs the tests beside them, most of a
/// JVM's start-up CPU is the optimising compiler's and the collector's threads.
/// They map Kafka's classes from the set-up's class-data archive where it is
/// there (a JVM that cannot use it loads them as usual), and the JVM's own
/// warnings go to standard error, where they cannot mix with a reader's output.
fn java() -> Command {
    let mut command = Command::new("java");
    command.args([
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-Xshare:auto",
        "-Xlog:disable",
        "-Xlog:all=warning:stderr",
    ]);
    if let Some(archive) = tools::kafka_class_archive() {
        command.arg(format!("-XX:SharedArchiveFile={}", archive.display()));
    }
    command.arg("-cp").arg(tools::kafka_classpath());
    command
}

/// A new cluster id as `kafka-storage random-uuid` prints one (16 random bytes in
/// URL-safe base64 without padding, never starting with `-`, which the tools would
/// read as an option), made here rather than by a JVM started for it.
fn cluster_id() -> String {
    use base64::Engine;
    loop {
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(uuid::Uuid::new_v4().as_bytes());
        if !id.starts_with('-') {
            return id;
        }
    }
}

impl Cluster {
    /// Starts `size` nodes (all of them voters) and waits until each has started.
    pub fn start(name: &str, size: u32, options: NodeOptions) -> Cluster {
        let root = crate::temp_dir(&format!("kafka-{name}"));
        let started = Instant::now();
        let cluster_id = cluster_id();
        let mut nodes: Vec<Node> = (1..=size)
            .map(|id| Node {
                id,
                port: free_port(),
                controller_port: free_port(),
                dir: root.join(format!("node{id}")),
                child: None,
                log_start: 0,
                watchdog: None,
            })
            .collect();
        let voters = nodes
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
            .collect::<Vec<_>>()
            .join(",");
        for node in &nodes {
            node.write_properties(&voters, size, &options);
            node.format(&cluster_id, &options);
        }
        for node in &mut nodes {
            node.spawn();
        }
        for node in &mut nodes {
            node.wait_started();
        }
        eprintln!(
            "Apache Kafka: {size} node(s) started in {:.1} s ({})",
            started.elapsed().as_secs_f64(),
            root.display()
        );
        Cluster {
            nodes,
            cluster_id,
            options,
            root,
        }
    }

    /// How the kit's clients connect (the super user of a secured cluster; none for
    /// a plaintext one).
    pub fn admin_properties(&self) -> Vec<(String, String)> {
        self.options.client.clone()
    }

    fn java_admin_properties(&self) -> Vec<(String, String)> {
        self.options.java_client.clone()
    }

    /// Grants the ACLs `(principal, resource type, name, operation)` (e.g.
    /// `("User:w", "TOPIC", "ces", "WRITE")`), allowed from any host, in one client.
    pub fn grant(&self, acls: &[(String, &str, String, &str)]) {
        let props = self.nodes[0]
            .dir
            .join(format!("admin-{}.properties", uuid::Uuid::new_v4()));
        let text: String = self
            .java_admin_properties()
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect();
        std::fs::write(&props, text).expect("admin properties");
        let input: String = acls
            .iter()
            .map(|(p, t, n, o)| format!("{p} {t} {n} {o}\n"))
            .collect();
        let mut command = java();
        command.arg("Acls").arg(self.bootstrap()).arg(&props);
        let output = tools::output_with_input_within(
            &mut command,
            input.as_bytes(),
            Duration::from_secs(90),
            "granting ACLs",
        );
        assert!(
            output.status.success(),
            "granting ACLs failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `bootstrap.servers` for a client.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The node with this id.
    pub fn node(&mut self, id: u32) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// The cluster's id (as formatted).
    pub fn id(&self) -> &str {
        &self.cluster_id
    }

    /// The options every node was started with.
    pub fn options(&self) -> &NodeOptions {
        &self.options
    }

    /// The last lines of every node's log, for a failure message.
    pub fn log_tails(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.log_tail(30))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Creates a topic with `partitions` and `replicas`, and `configs`; fails the test
    /// with Kafka's answer if it cannot.
    pub fn create_topic(
        &self,
        topic: &str,
        partitions: i32,
        replicas: i32,
        configs: &[(&str, &str)],
    ) {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let mut config = rdkafka::ClientConfig::new();
        config.set("bootstrap.servers", self.bootstrap());
        for (k, v) in self.admin_properties() {
            config.set(k, v);
        }
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            config.create().expect("admin client");
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replicas));
        for (k, v) in configs {
            new = new.set(k, v);
        }
        let options = AdminOptions::new()
            .request_timeout(Some(Duration::from_secs(30)))
            .operation_timeout(Some(Duration::from_secs(30)));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let result = runtime
            .block_on(admin.create_topics([&new], &options))
            .unwrap_or_else(|e| panic!("create topic {topic}: {e}"));
        for r in result {
            if let Err((name, code)) = r {
                panic!("create topic {name}: {code}");
            }
        }
        self.wait_until_known(topic, partitions);
    }

    /// Waits until every node's metadata lists `topic` with its `partitions`, each
    /// led: the controller acknowledges a creation before the brokers have applied
    /// it, and a client's first request right after (the binary's DescribeConfigs
    /// of a topic's limits, for one) could otherwise be told there is no such topic
    /// on a loaded machine.
    fn wait_until_known(&self, topic: &str, partitions: i32) {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let deadline = Instant::now() + Duration::from_secs(60);
        for node in &self.nodes {
            let mut config = rdkafka::ClientConfig::new();
            config.set("bootstrap.servers", format!("127.0.0.1:{}", node.port));
            for (k, v) in self.admin_properties() {
                config.set(k, v);
            }
            let client: BaseConsumer = config.create().expect("metadata client");
            loop {
                let known = client
                    .fetch_metadata(Some(topic), Duration::from_secs(5))
                    .is_ok_and(|metadata| {
                        metadata.topics().iter().any(|t| {
                            t.name() == topic
                                && t.error().is_none()
                                && t.partitions().len() == partitions as usize
                                && t.partitions().iter().all(|p| p.leader() >= 0)
                        })
                    });
                if known {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "topic {topic} not known to node {} within 60 s",
                    node.id
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Kills every node, then starts them all again (the controllers need a quorum
    /// to start, so they are started together) and waits until each has started.
    pub fn restart_all(&mut self, down_for: Duration) {
        for node in &mut self.nodes {
            node.kill();
        }
        std::thread::sleep(down_for);
        for node in &mut self.nodes {
            node.spawn();
        }
        for node in &mut self.nodes {
            node.wait_started();
        }
    }

    /// The node that leads `partition` of `topic` now.
    pub fn leader_of(&self, topic: &str, partition: i32) -> u32 {
        self.wait_for_partition(topic, partition, "a leader", |p| {
            u32::try_from(p.leader()).ok()
        })
    }

    /// Waits (at most 60 s) until `node` is out of the in-sync replicas of
    /// `topic`/`partition`, as the brokers' metadata says: a leader drops a replica
    /// that stopped fetching only after `replica.lag.time.max.ms`, later on a loaded
    /// machine.
    pub fn wait_out_of_sync(&self, topic: &str, partition: i32, node: u32) {
        let what = format!("node {node} left out of the in-sync replicas");
        self.wait_for_partition(topic, partition, &what, |p| {
            (!p.isr().contains(&(node as i32))).then_some(())
        });
    }

    /// Polls the brokers' metadata of `topic`/`partition` until `pick` finds what
    /// it waits for (`what`, named in the failure after 60 s).
    fn wait_for_partition<T>(
        &self,
        topic: &str,
        partition: i32,
        what: &str,
        pick: impl Fn(&rdkafka::metadata::MetadataPartition) -> Option<T>,
    ) -> T {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let mut config = rdkafka::ClientConfig::new();
        config.set("bootstrap.servers", self.bootstrap());
        for (k, v) in self.admin_properties() {
            config.set(k, v);
        }
        let consumer: BaseConsumer = config.create().expect("metadata client");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(10))
                .ok()
                .and_then(|m| {
                    m.topics().iter().find(|t| t.name() == topic).and_then(|t| {
                        t.partitions()
                            .iter()
                            .find(|p| p.id() == partition)
                            .and_then(&pick)
                    })
                });
            if let Some(found) = found {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "{what} of {topic}/{partition} not seen within 60 s:\n{}",
                self.log_tails()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Every record of `topic` as Kafka's Java client reads it with `isolation`
    /// (`read_committed` or `read_uncommitted`), from the beginning to the end that
    /// level sees when the reader starts. `client_properties` are extra client
    /// settings (security).
    /// A secured cluster is read as its super user.
    pub fn read(
        &self,
        topic: &str,
        isolation: &str,
        client_properties: &[(&str, &str)],
    ) -> Vec<Consumed> {
        let admin = self.java_admin_properties();
        let mut properties: Vec<(&str, &str)> = admin
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        properties.extend_from_slice(client_properties);
        read_with_java(&self.bootstrap(), topic, isolation, &properties)
    }
}

/// What [`Cluster::read`] does, for brokers given by address.
pub fn read_with_java(
    bootstrap: &str,
    topic: &str,
    isolation: &str,
    client_properties: &[(&str, &str)],
) -> Vec<Consumed> {
    let mut command = java();
    command.args(["Reader", bootstrap, topic, isolation, "60000"]);
    let props = std::env::temp_dir().join(format!(
        "mssql-ces-reader-{}.properties",
        uuid::Uuid::new_v4()
    ));
    if !client_properties.is_empty() {
        let text: String = client_properties
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect();
        std::fs::write(&props, text).expect("reader properties");
        command.arg(&props);
    }
    let output = tools::output_within(&mut command, Duration::from_secs(90), "the Java reader");
    let _ = std::fs::remove_file(&props);
    assert!(
        output.status.success(),
        "the Java reader of {topic} ({isolation}) failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            let v: serde_json::Value =
                serde_json::from_str(line).expect("a JSON line from the reader");
            let bytes = |v: &serde_json::Value| v.as_str().map(|s| b64.decode(s).expect("base64"));
            let payload = bytes(&v["value"]);
            Consumed {
                partition: v["partition"].as_i64().expect("partition") as i32,
                offset: v["offset"].as_i64().expect("offset"),
                key: bytes(&v["key"]),
                headers: v["headers"]
                    .as_array()
                    .expect("headers")
                    .iter()
                    .map(|h| {
                        (
                            h[0].as_str().expect("header name").to_owned(),
                            bytes(&h[1]).unwrap_or_default(),
                        )
                    })
                    .collect(),
                null_payload: payload.is_none(),
                payload: payload.unwrap_or_default(),
            }
        })
        .collect()
}

impl Node {
    fn properties_path(&self) -> PathBuf {
        self.dir.join("server.properties")
    }

    /// Where this node logs.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("kafka.log")
    }

    fn write_properties(&self, voters: &str, size: u32, options: &NodeOptions) {
        std::fs::create_dir_all(&self.dir).expect("node directory");
        let replication = size.min(3);
        let min_isr = if replication >= 3 { 2 } else { 1 };
        // The active controller writes no idle no-op records to the metadata log
        // (every 500 ms by default, so that the log's end moves when nothing
        // happens): they are two fifths of an idle node's CPU, and the tests watch
        // no metadata lag.
        let mut text = format!(
            "process.roles=broker,controller
node.id={id}
controller.quorum.voters={voters}
controller.listener.names=CONTROLLER
log.dirs={data}
num.partitions=1
default.replication.factor={replication}
offsets.topic.replication.factor={replication}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={replication}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor={replication}
share.coordinator.state.topic.min.isr={min_isr}
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
metadata.max.idle.interval.ms=0
",
            id = self.id,
            data = self.dir.join("data").display(),
        );
        let custom_listeners = options
            .properties
            .iter()
            .any(|p| p.starts_with("listeners="));
        if !custom_listeners {
            text.push_str(&format!(
                "listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
",
                port = self.port,
                controller = self.controller_port,
            ));
        }
        for line in &options.properties {
            let line = line
                .replace("{port}", &self.port.to_string())
                .replace("{controller_port}", &self.controller_port.to_string());
            text.push_str(&line);
            text.push('\n');
        }
        std::fs::write(self.properties_path(), text).expect("server.properties");
    }

    fn format(&self, cluster_id: &str, options: &NodeOptions) {
        let output = tools::output_within(
            java()
                .args(["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c"])
                .arg(self.properties_path())
                .args(&options.format_args),
            Duration::from_secs(60),
            "kafka-storage format",
        );
        assert!(
            output.status.success(),
            "kafka-storage format of node {}: {}{}",
            self.id,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn spawn(&mut self) {
        self.log_start = std::fs::metadata(self.log_path()).map_or(0, |m| m.len() as usize);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("broker log");
        let child = java()
            .args(["-Xms128m", "-Xmx512m"])
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                tools::kafka_log_config().display()
            ))
            .arg("kafka.Kafka")
            .arg(self.properties_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start java (Apache Kafka)");
        // The watchdog: kills the broker once this process's end of the pipe closes.
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "cat >/dev/null; kill -9 {} 2>/dev/null",
                child.id()
            ))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the broker's watchdog");
        let stdin = watchdog.stdin.take().expect("watchdog stdin");
        self.child = Some(child);
        self.watchdog = Some((watchdog, stdin));
    }

    fn wait_started(&mut self) {
        let deadline = Instant::now() + STARTUP;
        loop {
            let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
            // A restarted node appends to its log: only what it wrote since counts.
            if text
                .get(self.log_start..)
                .is_some_and(|t| t.contains("Kafka Server started"))
            {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "Kafka node {} exited ({status}) while starting:\n{}",
                    self.id,
                    self.log_tail(40)
                );
            }
            assert!(
                Instant::now() < deadline,
                "Kafka node {} did not start within {STARTUP:?}:\n{}",
                self.id,
                self.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The node's process id, for signals.
    pub fn pid(&self) -> i32 {
        self.child
            .as_ref()
            .map(|c| c.id() as i32)
            .expect("node is running")
    }

    /// Kills the node (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some((mut watchdog, stdin)) = self.watchdog.take() {
            drop(stdin);
            let _ = watchdog.wait();
        }
    }

    /// Freezes the node (SIGSTOP).
    pub fn freeze(&self) {
        // SAFETY: kill sends a signal to a child of this process.
        unsafe { libc::kill(self.pid(), libc::SIGSTOP) };
    }

    /// Thaws a frozen node (SIGCONT).
    pub fn thaw(&self) {
        // SAFETY: kill sends a signal to a child of this process.
        unsafe { libc::kill(self.pid(), libc::SIGCONT) };
    }

    /// Starts a killed node again on the same ports and data, and waits until it has
    /// started.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "node {} is still running", self.id);
        self.spawn();
        self.wait_started();
    }

    /// The last `lines` of the node's log, headed by its path.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let tail = all[all.len().saturating_sub(lines)..].join("\n");
        format!(
            "--- {} (last {lines} lines)\n{tail}",
            self.log_path().display()
        )
    }

    /// The node's directory (its properties, data and log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

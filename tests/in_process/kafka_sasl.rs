//! Kafka behind a login: the SASL front (`support::kafka_sasl`, a test double that
//! authenticates before a `MockCluster` broker) accepts the right password with
//! each mechanism and refuses a wrong one.

use crate::support;

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};

fn producer(
    front: &str,
    mechanism: &str,
    user: &str,
    password: &str,
    timeout_ms: u32,
) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", front)
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", mechanism)
        .set("sasl.username", user)
        .set("sasl.password", password)
        .set("message.timeout.ms", timeout_ms.to_string())
        .create()
        .expect("producer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_lets_the_right_password_in_with_each_mechanism() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("t", 1, 1).expect("topic");
    let front = support::kafka_sasl::start(&cluster.bootstrap_servers(), &[("ces", "s3cret")]);
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let p = producer(&front.address, mechanism, "ces", "s3cret", 5000);
        let sent = p
            .send(
                FutureRecord::<(), _>::to("t").payload("x"),
                Duration::from_secs(5),
            )
            .await;
        assert!(sent.is_ok(), "{mechanism}: {sent:?}");
        let wrong = producer(&front.address, mechanism, "ces", "wrong", 1500);
        let refused = wrong
            .send(
                FutureRecord::<(), _>::to("t").payload("x"),
                Duration::from_secs(5),
            )
            .await;
        assert!(refused.is_err(), "{mechanism}: a wrong password delivered");
    }
    assert!(*front.refused.lock().unwrap() >= 3);
}

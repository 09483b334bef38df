use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    for transactional in [false, true, false, true] {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("t", 4, 1).unwrap();
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("compression.type", "lz4")
            .set("queue.buffering.max.kbytes", "65536")
            .set("enable.gapless.guarantee", "true")
            .set("partitioner", "murmur2_random")
            .set("message.max.bytes", "327680");
        if transactional {
            config
                .set("transactional.id", "x")
                .set("message.timeout.ms", "300000")
                .set("transaction.timeout.ms", "305000");
        } else {
            config.set("message.timeout.ms", "0");
        }
        let producer: FutureProducer = config.create().unwrap();
        if transactional {
            producer.init_transactions(Duration::from_secs(10)).unwrap();
            producer.begin_transaction().unwrap();
        }
        let payload = vec![b'x'; 1000];
        let started = Instant::now();
        let mut futures = Vec::new();
        let mut n = 0u64;
        while started.elapsed() < Duration::from_secs(4) {
            let key = format!("k{}", n % 1000);
            loop {
                match producer
                    .send_result(FutureRecord::to("t").key(key.as_bytes()).payload(&payload))
                {
                    Ok(f) => {
                        futures.push(f);
                        break;
                    }
                    Err((_, _)) => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            }
            n += 1;
            if futures.len() > 100_000 {
                for f in futures.drain(..) {
                    let _ = f.await;
                }
            }
        }
        for f in futures.drain(..) {
            let _ = f.await;
        }
        let flushed = started.elapsed();
        if transactional {
            let c = Instant::now();
            producer
                .commit_transaction(Duration::from_secs(60))
                .unwrap();
            println!("commit of {n} messages took {:?}", c.elapsed());
        }
        let took = started.elapsed();
        println!("delivered by {:?}", flushed);
        println!(
            "transactional={transactional}: {:.0} msgs/s",
            n as f64 / took.as_secs_f64()
        );
    }
}

//! Failover under a producer (issue 11 item 4): three `strand start` nodes; the SDK produces
//! to a one-partition topic through the suite's rotating client while the metadata primary
//! (found on `/metrics`) is SIGKILLed mid-stream. Every acknowledged message is then read back
//! in acknowledgment order (a send that failed at the kill may appear twice: at least once,
//! client-plane.md §2.3), messages acknowledged after the kill exist, the client ends on the
//! new primary, and the killed node restarts from its directory and catches up.
//!
//! What the SDK does on its own is shown too: a plain `IggyClient` on the primary (the
//! builder's defaults: no auto-login, unlimited reconnection retries) fails its next call
//! once the node is gone, and its `connect()` keeps dialing the dead address (no success
//! within 5 s); it never moves to a live node by itself.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iggy::prelude::*;
use strand_sdk_tests::start::StartCluster;
use strand_sdk_tests::{
    REPLICAS, RotatingClient, init_client_log, sample, scrape_all, single_primary, step,
};

/// Messages the producer sends in all; the primary is killed after [`KILL_AFTER`] acks.
const TOTAL: usize = 60;
const KILL_AFTER: usize = 20;

fn message(payload: &str) -> IggyMessage {
    IggyMessage::builder()
        .payload(payload.as_bytes().to_vec().into())
        .build()
        .expect("a valid message")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_survives_sigkill_of_the_metadata_primary() {
    init_client_log();
    let mut cluster =
        StartCluster::start(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("failover"));
    let all_nodes: Vec<usize> = (0..REPLICAS).collect();
    let all = cluster.wait_metrics(
        "exactly one metadata primary, all nodes normal",
        &all_nodes,
        |all| single_primary(all).is_some() && all.iter().all(|m| m.get("status") == 0),
    );
    let primary = single_primary(&all).expect("checked above");
    eprintln!("metadata primary: node {primary}");

    // The roster, primary first: the rotating client starts there.
    let addresses: Vec<String> = (0..REPLICAS)
        .map(|i| cluster.nodes[(primary + i) % REPLICAS].client.clone())
        .collect();
    let mut rotating = RotatingClient::new(addresses, "iggy", "iggy");
    let stream = rotating
        .call("create stream", |c| Box::pin(c.create_stream("failover")))
        .await;
    let stream_id = Identifier::numeric(stream.id).unwrap();
    let topic = rotating
        .call("create topic", |c| {
            let stream_id = stream_id.clone();
            Box::pin(async move {
                c.create_topic(
                    &stream_id,
                    "events",
                    &TopicCreateOptions {
                        partitions_count: Some(1),
                        ..TopicCreateOptions::default()
                    },
                )
                .await
            })
        })
        .await;
    let topic_id = Identifier::numeric(topic.id).unwrap();

    // The SDK on its own, on the primary.
    let bare = IggyClient::builder()
        .with_tcp()
        .with_server_address(cluster.nodes[primary].client.clone())
        .build()
        .expect("building the SDK client");
    step("plain SDK client: connect to the primary", bare.connect()).await;
    step("plain SDK client: login", bare.login_user("iggy", "iggy")).await;

    // The producer: one message per send, each acknowledged before the next.
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let producer = {
        let acked = acked.clone();
        let (stream_id, topic_id) = (stream_id.clone(), topic_id.clone());
        tokio::spawn(async move {
            for i in 0..TOTAL {
                let payload = format!("m-{i}");
                rotating
                    .call(&format!("send {payload}"), |c| {
                        let (stream_id, topic_id, payload) =
                            (stream_id.clone(), topic_id.clone(), payload.clone());
                        Box::pin(async move {
                            c.send_messages(
                                &stream_id,
                                &topic_id,
                                &Partitioning::partition_id(0),
                                &mut [message(&payload)],
                            )
                            .await
                        })
                    })
                    .await;
                acked.lock().unwrap().push(payload);
            }
            rotating
        })
    };
    // Mid-stream: the kill.
    let deadline = std::time::Instant::now() + strand_sdk_tests::CLUSTER_BOUND;
    while acked.lock().unwrap().len() < KILL_AFTER {
        assert!(
            std::time::Instant::now() < deadline && !producer.is_finished(),
            "the producer did not reach {KILL_AFTER} acks"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.kill(primary);
    let acked_at_kill = acked.lock().unwrap().len();
    eprintln!("SIGKILLed node {primary} after {acked_at_kill} acknowledged messages");

    // What the SDK itself does: the next call fails, and connect() dials the dead address.
    match tokio::time::timeout(Duration::from_secs(20), bare.ping()).await {
        Ok(Ok(())) => panic!("a ping to the killed primary succeeded"),
        Ok(Err(e)) => eprintln!("plain SDK client after the kill: ping failed {e:?}"),
        Err(_) => eprintln!("plain SDK client after the kill: ping did not return in 20 s"),
    }
    match tokio::time::timeout(Duration::from_secs(5), bare.connect()).await {
        Ok(Ok(())) => panic!("the plain SDK client connected to the killed primary"),
        Ok(Err(e)) => eprintln!("plain SDK client: connect() failed {e:?}"),
        Err(_) => eprintln!("plain SDK client: connect() still dialing the dead address after 5 s"),
    }
    let on = bare.get_connection_info().await.server_address;
    assert_eq!(
        on, cluster.nodes[primary].client,
        "the plain SDK client moved by itself"
    );
    drop(bare);

    let mut rotating = tokio::time::timeout(Duration::from_secs(120), producer)
        .await
        .expect("the producer finished within 120 s")
        .expect("the producer task panicked");
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), TOTAL);
    assert!(
        acked_at_kill < TOTAL,
        "every message was acknowledged before the kill: nothing was produced after it"
    );
    eprintln!(
        "rotating client: {} reconnects; failures {:?}",
        rotating.reconnects, rotating.failures
    );
    assert!(
        rotating.reconnects >= 1,
        "the producer never noticed the kill"
    );

    // A new primary among the survivors, and the producer's client on it.
    let survivors: Vec<usize> = (0..REPLICAS).filter(|&n| n != primary).collect();
    let after = cluster.wait_metrics(
        "a new metadata primary among the survivors",
        &survivors,
        |all| single_primary(all).is_some() && all.iter().all(|m| m.get("status") == 0),
    );
    let new_primary = survivors[single_primary(&after).expect("checked above")];
    assert_ne!(new_primary, primary);

    // Every acknowledged message, in order.
    let polled = rotating
        .call("poll everything", |c| {
            let (stream_id, topic_id) = (stream_id.clone(), topic_id.clone());
            Box::pin(async move {
                c.poll_messages(
                    &stream_id,
                    &topic_id,
                    Some(0),
                    &Consumer::new(Identifier::numeric(3).unwrap()),
                    &PollingStrategy::offset(0),
                    1000,
                    false,
                )
                .await
            })
        })
        .await;
    let payloads: Vec<String> = polled
        .messages
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    let offsets: Vec<u64> = polled.messages.iter().map(|m| m.header.offset).collect();
    assert_eq!(
        offsets,
        (0..offsets.len() as u64).collect::<Vec<_>>(),
        "offsets not consecutive from 0"
    );
    let mut deduplicated = payloads.clone();
    deduplicated.dedup();
    assert_eq!(
        deduplicated, acked,
        "the partition does not hold every acknowledged message in order (only a resent \
         message may repeat, next to itself); polled {payloads:?}"
    );
    assert!(
        payloads.len() - acked.len() <= rotating.failures.len(),
        "more duplicates ({}) than failed sends ({})",
        payloads.len() - acked.len(),
        rotating.failures.len()
    );
    let on = rotating.address().await.expect("connected");
    assert_eq!(
        on, cluster.nodes[new_primary].client,
        "the rotating client is not on the new primary"
    );

    // The killed node restarts from its directory and catches up.
    cluster.spawn(primary);
    let target = after[survivors.iter().position(|&n| n == new_primary).unwrap()].get("commit_max");
    cluster.wait_metrics(
        &format!("node {primary} restarted, normal, metadata commit_max >= {target}"),
        &all_nodes,
        |all| {
            single_primary(all).is_some()
                && all.iter().all(|m| m.get("status") == 0)
                && all[primary].get("commit_max") >= target
        },
    );
    let partition_commit = "strand_partition_commit{plane=\"partition\",shard=\"0\"}";
    let want = sample(
        &scrape_all(&cluster.nodes[new_primary].http).expect("/metrics"),
        partition_commit,
    );
    let deadline = std::time::Instant::now() + strand_sdk_tests::CLUSTER_BOUND;
    loop {
        let got = scrape_all(&cluster.nodes[primary].http).map(|m| sample(&m, partition_commit));
        if got.is_some_and(|g| g >= want) {
            break;
        }
        if std::time::Instant::now() >= deadline {
            cluster.fail(&format!(
                "restarted node {primary}: partition commit {got:?}, the primary's {want}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.pass();
}

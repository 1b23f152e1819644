//! The published Iggy Rust SDK (0.11.0-edge.4) against a real `strand dev --replicas 3`
//! (issue 10, "Done when"): one metadata primary, then with the SDK on the primary's client
//! port: log in as the root user, create a stream and a 2-partition topic, send to explicit
//! partitions, poll back by offset, store and read a consumer offset, log out; and the commit
//! points those requests made reach every node.

use std::path::PathBuf;

use iggy::prelude::*;
use strand_sdk_tests::{DevCluster, Metrics, REPLICAS, init_client_log, single_primary, step};

fn scratch(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

fn message(payload: &str) -> IggyMessage {
    IggyMessage::builder()
        .payload(payload.as_bytes().to_vec().into())
        .build()
        .expect("a valid message")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_smoke_on_the_primary() {
    init_client_log();
    let mut cluster = DevCluster::start(&scratch("smoke"));

    // One primary, every node in normal status.
    let before = cluster.wait_metrics("exactly one metadata primary, all nodes normal", |all| {
        all.len() == REPLICAS
            && single_primary(all).is_some()
            && all.iter().all(|m| m.get("status") == 0)
    });
    let primary = single_primary(&before).expect("checked above");
    let commit_before = before[primary].get("commit_max");
    let address = cluster.nodes[primary].client.clone();
    eprintln!(
        "primary is node {primary} (clients on {address}); commit_max before the SDK: {}",
        before
            .iter()
            .map(|m| m.get("commit_max").to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(address.clone())
        .with_reconnection_max_retries(Some(0))
        .build()
        .expect("building the SDK client");
    step("connect", client.connect()).await;
    step("login iggy/iggy", client.login_user("iggy", "iggy")).await;
    // Login asks GetClusterMetadata for the leader and follows it; on the primary it stays.
    let info = client.get_connection_info().await;
    assert_eq!(
        info.server_address, address,
        "after login on the primary the SDK moved to {} (GetClusterMetadata named another \
         leader)",
        info.server_address
    );

    let stream = step("create stream", client.create_stream("sdk-smoke")).await;
    assert_eq!(stream.name, "sdk-smoke");
    let stream_id = Identifier::numeric(stream.id).unwrap();
    let topic = step(
        "create topic (2 partitions)",
        client.create_topic(
            &stream_id,
            "orders",
            &TopicCreateOptions {
                partitions_count: Some(2),
                ..TopicCreateOptions::default()
            },
        ),
    )
    .await;
    assert_eq!(topic.name, "orders");
    assert_eq!(topic.partitions_count, 2, "CreateTopic's reply: {topic:?}");
    let topic_id = Identifier::numeric(topic.id).unwrap();

    // Explicit partitions: three messages to partition 1, two to partition 0.
    let sent: [(u32, Vec<&str>); 2] =
        [(1, vec!["p1-a", "p1-b", "p1-c"]), (0, vec!["p0-a", "p0-b"])];
    for (partition, payloads) in &sent {
        let mut messages: Vec<IggyMessage> = payloads.iter().map(|p| message(p)).collect();
        step(
            &format!("send {} messages to partition {partition}", payloads.len()),
            client.send_messages(
                &stream_id,
                &topic_id,
                &Partitioning::partition_id(*partition),
                &mut messages,
            ),
        )
        .await;
    }

    let consumer = Consumer::new(Identifier::numeric(7).unwrap());
    for (partition, payloads) in &sent {
        let polled = step(
            &format!("poll partition {partition} from offset 0"),
            client.poll_messages(
                &stream_id,
                &topic_id,
                Some(*partition),
                &consumer,
                &PollingStrategy::offset(0),
                10,
                false,
            ),
        )
        .await;
        assert_eq!(polled.partition_id, *partition, "poll reply: {polled:?}");
        let got: Vec<(u64, String)> = polled
            .messages
            .iter()
            .map(|m| {
                (
                    m.header.offset,
                    String::from_utf8_lossy(&m.payload).into_owned(),
                )
            })
            .collect();
        let want: Vec<(u64, String)> = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u64, (*p).to_owned()))
            .collect();
        assert_eq!(
            got, want,
            "partition {partition}: polled (offset, payload) pairs differ from what was sent"
        );
        assert_eq!(polled.count as usize, payloads.len());
        assert_eq!(polled.current_offset, payloads.len() as u64 - 1);
    }

    // A poll from an offset in the middle returns the rest, in order.
    let polled = step(
        "poll partition 1 from offset 1",
        client.poll_messages(
            &stream_id,
            &topic_id,
            Some(1),
            &consumer,
            &PollingStrategy::offset(1),
            10,
            false,
        ),
    )
    .await;
    let got: Vec<&[u8]> = polled.messages.iter().map(|m| &m.payload[..]).collect();
    assert_eq!(got, [&b"p1-b"[..], &b"p1-c"[..]]);

    step("get consumer offset before any store", async {
        match client
            .get_consumer_offset(&consumer, &stream_id, &topic_id, Some(1))
            .await?
        {
            None => Ok::<(), IggyError>(()),
            Some(info) => panic!("an offset is stored before any store: {info:?}"),
        }
    })
    .await;
    step(
        "store consumer offset 1 on partition 1",
        client.store_consumer_offset(&consumer, &stream_id, &topic_id, Some(1), 1),
    )
    .await;
    let offset = step(
        "get consumer offset",
        client.get_consumer_offset(&consumer, &stream_id, &topic_id, Some(1)),
    )
    .await
    .expect("an offset was stored");
    assert_eq!(offset.partition_id, 1, "{offset:?}");
    assert_eq!(offset.stored_offset, 1, "{offset:?}");
    assert_eq!(offset.current_offset, 2, "{offset:?}");

    step("logout", client.logout_user()).await;

    // The SDK's metadata requests (Register, CreateStream, CreateTopic, Logout) committed: the
    // primary's commit point moved by at least that many, and every node learns it.
    let target = {
        let all: Vec<Metrics> = cluster
            .metrics()
            .into_iter()
            .map(|m| m.unwrap_or_else(|| cluster.fail("a node stopped answering /metrics")))
            .collect();
        let now = all[primary].get("commit_max");
        assert!(
            now >= commit_before + 4,
            "primary commit_max {commit_before} -> {now}: the SDK's 4 metadata requests did \
             not all commit"
        );
        now
    };
    cluster.wait_metrics(
        &format!("every node's commit_max reaches the primary's {target}"),
        |all| {
            single_primary(all) == Some(primary)
                && all.iter().all(|m| m.get("commit_max") >= target)
        },
    );
    cluster.pass();
}

//! Stream and topic lifecycle with the published Iggy SDK (0.11.0-edge.4) against a real
//! `strand dev --replicas 3` (issue 11; decisions 340-346): update a stream and a topic and see
//! the changes in GetStream/GetTopic, add partitions and send to them with balanced and key
//! partitioning, delete the highest partition, purge the topic and the stream (decision 346),
//! delete the topic and the stream.

use std::path::PathBuf;

use iggy::prelude::*;
use strand_sdk_tests::{DevCluster, REPLICAS, init_client_log, single_primary, step};

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
async fn sdk_updates_and_deletes_streams_topics_and_partitions() {
    init_client_log();
    let mut cluster = DevCluster::start(&scratch("lifecycle"));
    let ready = cluster.wait_metrics("exactly one metadata primary, all nodes normal", |all| {
        all.len() == REPLICAS
            && single_primary(all).is_some()
            && all.iter().all(|m| m.get("status") == 0)
    });
    let primary = single_primary(&ready).expect("checked above");
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(cluster.nodes[primary].client.clone())
        .with_reconnection_max_retries(Some(0))
        .build()
        .expect("building the SDK client");
    step("connect", client.connect()).await;
    step("login", client.login_user("iggy", "iggy")).await;

    let stream = step("create stream", client.create_stream("life")).await;
    let stream_id = Identifier::numeric(stream.id).unwrap();
    let topic = step(
        "create topic",
        client.create_topic(
            &stream_id,
            "t",
            &TopicCreateOptions {
                partitions_count: Some(1),
                ..TopicCreateOptions::default()
            },
        ),
    )
    .await;
    let topic_id = Identifier::numeric(topic.id).unwrap();

    // UpdateStream: the new name, found by name.
    step(
        "update stream",
        client.update_stream(&stream_id, "life-2", &StreamUpdateOptions::default()),
    )
    .await;
    let by_name = Identifier::named("life-2").unwrap();
    let found = step("get stream", client.get_stream(&by_name))
        .await
        .expect("the renamed stream");
    assert_eq!((found.id, found.name.as_str()), (stream.id, "life-2"));

    // UpdateTopic: name, expiry and compression as the SDK sends them.
    let expiry = IggyExpiry::ExpireDuration(IggyDuration::from(60_000_000u64));
    let update = TopicUpdateOptions {
        compression_algorithm: Some(CompressionAlgorithm::Gzip),
        message_expiry: Some(expiry),
        ..TopicUpdateOptions::default()
    };
    step(
        "update topic",
        client.update_topic(&stream_id, &topic_id, "t-2", &update),
    )
    .await;
    let details = step("get topic", client.get_topic(&stream_id, &topic_id))
        .await
        .expect("the topic");
    assert_eq!(details.name, "t-2");
    assert_eq!(details.message_expiry, expiry);
    assert_eq!(details.compression_algorithm, CompressionAlgorithm::Gzip);

    // CreatePartitions: GetTopic sees three; balanced sends reach all of them.
    step(
        "create 2 partitions",
        client.create_partitions(&stream_id, &topic_id, 2),
    )
    .await;
    let details = step("get topic", client.get_topic(&stream_id, &topic_id))
        .await
        .expect("the topic");
    assert_eq!(details.partitions_count, 3, "{details:?}");
    for i in 0..6 {
        let mut messages = vec![message(&format!("balanced-{i}"))];
        step(
            "send balanced",
            client.send_messages(
                &stream_id,
                &topic_id,
                &Partitioning::balanced(),
                &mut messages,
            ),
        )
        .await;
    }
    let consumer = Consumer::new(Identifier::numeric(7).unwrap());
    let mut counts = Vec::new();
    for partition in 0..3 {
        let polled = step(
            "poll",
            client.poll_messages(
                &stream_id,
                &topic_id,
                Some(partition),
                &consumer,
                &PollingStrategy::offset(0),
                100,
                false,
            ),
        )
        .await;
        counts.push(polled.messages.len());
    }
    assert_eq!(counts.iter().sum::<usize>(), 6, "{counts:?}");
    assert!(
        counts.iter().all(|c| *c > 0),
        "every partition took sends: {counts:?}"
    );

    // DeletePartitions: the highest goes; a poll of it is refused, the others keep theirs.
    step(
        "delete 1 partition",
        client.delete_partitions(&stream_id, &topic_id, 1),
    )
    .await;
    let details = step("get topic", client.get_topic(&stream_id, &topic_id))
        .await
        .expect("the topic");
    assert_eq!(details.partitions_count, 2);
    let gone = client
        .poll_messages(
            &stream_id,
            &topic_id,
            Some(2),
            &consumer,
            &PollingStrategy::offset(0),
            10,
            false,
        )
        .await;
    assert!(gone.is_err(), "partition 2 was deleted: {gone:?}");

    // PurgeTopic (decision 346): both partitions come back empty, the stored consumer offset
    // goes with them, and sends start at offset 0 again.
    step(
        "store consumer offset",
        client.store_consumer_offset(&consumer, &stream_id, &topic_id, Some(0), 0),
    )
    .await;
    step("purge topic", client.purge_topic(&stream_id, &topic_id)).await;
    let from_zero = PollingStrategy::offset(0);
    let poll_all = |partition: u32| {
        client.poll_messages(
            &stream_id,
            &topic_id,
            Some(partition),
            &consumer,
            &from_zero,
            100,
            false,
        )
    };
    for partition in 0..2 {
        let polled = step("poll after the purge", poll_all(partition)).await;
        assert!(
            polled.messages.is_empty(),
            "partition {partition} kept {} messages",
            polled.messages.len()
        );
    }
    let stored = step(
        "get consumer offset after the purge",
        client.get_consumer_offset(&consumer, &stream_id, &topic_id, Some(0)),
    )
    .await;
    assert!(
        stored.is_none(),
        "the offset survived the purge: {stored:?}"
    );
    let mut again = vec![message("after-purge-0"), message("after-purge-1")];
    step(
        "send after the purge",
        client.send_messages(
            &stream_id,
            &topic_id,
            &Partitioning::partition_id(0),
            &mut again,
        ),
    )
    .await;
    let polled = step("poll the new messages", poll_all(0)).await;
    let offsets: Vec<u64> = polled.messages.iter().map(|m| m.header.offset).collect();
    assert_eq!(offsets, vec![0, 1]);

    // PurgeStream empties every topic of the stream.
    step("purge stream", client.purge_stream(&stream_id)).await;
    let polled = step("poll after the stream purge", poll_all(0)).await;
    assert!(
        polled.messages.is_empty(),
        "the stream purge left {} messages",
        polled.messages.len()
    );

    // DeleteTopic, then DeleteStream.
    step("delete topic", client.delete_topic(&stream_id, &topic_id)).await;
    let none = step("get topic", client.get_topic(&stream_id, &topic_id)).await;
    assert!(none.is_none(), "{none:?}");
    let mut late = vec![message("late")];
    let refused = client
        .send_messages(
            &stream_id,
            &topic_id,
            &Partitioning::partition_id(0),
            &mut late,
        )
        .await;
    assert!(refused.is_err(), "a send to a deleted topic: {refused:?}");
    step("delete stream", client.delete_stream(&stream_id)).await;
    let none = step("get stream", client.get_stream(&stream_id)).await;
    assert!(none.is_none());
    cluster.pass();
}

//! The SDK's produce/consume surface against `strand dev --replicas 3` (issue 11 item 4, the
//! parts without users and groups), one cluster for all steps (each step names itself):
//! explicit, balanced and key partitioning (where each message landed, read back by
//! partition); polls by offset, first, last, next with auto-commit and timestamp; consumer
//! offsets stored and read; the high-level `IggyProducer` and a single `IggyConsumer` on one
//! partition; GetStats counts.

use std::collections::BTreeMap;
use std::path::PathBuf;

use futures_util::StreamExt;
use iggy::prelude::*;
use strand_sdk_tests::{DevCluster, REPLICAS, init_client_log, single_primary, step};

fn message(payload: &str) -> IggyMessage {
    IggyMessage::builder()
        .payload(payload.as_bytes().to_vec().into())
        .build()
        .expect("a valid message")
}

/// Every message of `partition` from offset 0, as (offset, payload).
async fn read_all(
    client: &IggyClient,
    stream: &Identifier,
    topic: &Identifier,
    partition: u32,
) -> Vec<(u64, String)> {
    let consumer = Consumer::new(Identifier::numeric(99).unwrap());
    let polled = step(
        &format!("poll all of partition {partition}"),
        client.poll_messages(
            stream,
            topic,
            Some(partition),
            &consumer,
            &PollingStrategy::offset(0),
            1000,
            false,
        ),
    )
    .await;
    polled
        .messages
        .iter()
        .map(|m| {
            (
                m.header.offset,
                String::from_utf8_lossy(&m.payload).into_owned(),
            )
        })
        .collect()
}

fn payloads(polled: &PolledMessages) -> Vec<String> {
    polled
        .messages
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_partitioning_polling_offsets_producer_consumer_stats() {
    init_client_log();
    let mut cluster =
        DevCluster::start(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("interop"));
    let all = cluster.wait_metrics("exactly one metadata primary, all nodes normal", |all| {
        all.len() == REPLICAS
            && single_primary(all).is_some()
            && all.iter().all(|m| m.get("status") == 0)
    });
    let primary = single_primary(&all).expect("checked above");
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(cluster.nodes[primary].client.clone())
        .with_reconnection_max_retries(Some(0))
        .build()
        .expect("building the SDK client");
    step("connect", client.connect()).await;
    step("login iggy/iggy", client.login_user("iggy", "iggy")).await;

    let stream = step("create stream", client.create_stream("interop")).await;
    let stream_id = Identifier::numeric(stream.id).unwrap();
    let options = TopicCreateOptions {
        partitions_count: Some(3),
        ..TopicCreateOptions::default()
    };
    let topic = step(
        "create topic `routing` (3 partitions)",
        client.create_topic(&stream_id, "routing", &options),
    )
    .await;
    let topic_id = Identifier::numeric(topic.id).unwrap();

    // --- Partitioning ----------------------------------------------------------------------
    // Explicit: one message to each partition, in reverse order.
    for partition in [2u32, 1, 0] {
        step(
            &format!("send explicit to partition {partition}"),
            client.send_messages(
                &stream_id,
                &topic_id,
                &Partitioning::partition_id(partition),
                &mut [message(&format!("explicit-{partition}"))],
            ),
        )
        .await;
    }
    // Balanced: the SDK resolves it with GetTopic and a round-robin cursor per topic, so six
    // single sends land on partitions 0, 1, 2, 0, 1, 2.
    for i in 0..6 {
        step(
            &format!("send balanced #{i}"),
            client.send_messages(
                &stream_id,
                &topic_id,
                &Partitioning::balanced(),
                &mut [message(&format!("balanced-{i}"))],
            ),
        )
        .await;
    }
    // Key: every message with one key lands on one partition, in send order.
    let keys = ["alpha", "beta", "gamma", "delta"];
    for round in 0..3 {
        for key in keys {
            step(
                &format!("send key {key} round {round}"),
                client.send_messages(
                    &stream_id,
                    &topic_id,
                    &Partitioning::messages_key_str(key).unwrap(),
                    &mut [message(&format!("key-{key}-{round}"))],
                ),
            )
            .await;
        }
    }
    let mut by_partition = BTreeMap::new();
    for partition in 0..3u32 {
        by_partition.insert(
            partition,
            read_all(&client, &stream_id, &topic_id, partition).await,
        );
    }
    for (partition, messages) in &by_partition {
        let offsets: Vec<u64> = messages.iter().map(|(o, _)| *o).collect();
        assert_eq!(
            offsets,
            (0..messages.len() as u64).collect::<Vec<_>>(),
            "partition {partition}: offsets not consecutive from 0: {messages:?}"
        );
        let texts: Vec<&str> = messages.iter().map(|(_, p)| p.as_str()).collect();
        assert_eq!(
            texts.first().copied(),
            Some(format!("explicit-{partition}").as_str()),
            "partition {partition}: the explicit send is not first: {texts:?}"
        );
        let balanced: Vec<&str> = texts
            .iter()
            .copied()
            .filter(|t| t.starts_with("balanced-"))
            .collect();
        let want = [
            format!("balanced-{partition}"),
            format!("balanced-{}", partition + 3),
        ];
        assert_eq!(
            balanced, want,
            "partition {partition}: balanced sends landed elsewhere"
        );
    }
    for key in keys {
        let holders: Vec<(u32, Vec<&str>)> = by_partition
            .iter()
            .map(|(p, messages)| {
                (
                    *p,
                    messages
                        .iter()
                        .map(|(_, t)| t.as_str())
                        .filter(|t| t.starts_with(&format!("key-{key}-")))
                        .collect::<Vec<_>>(),
                )
            })
            .filter(|(_, found)| !found.is_empty())
            .collect();
        assert_eq!(
            holders.len(),
            1,
            "key {key}: messages on several partitions: {holders:?}"
        );
        let want: Vec<String> = (0..3).map(|r| format!("key-{key}-{r}")).collect();
        assert_eq!(holders[0].1, want, "key {key}: not all there in order");
    }
    let total_routing: usize = by_partition.values().map(Vec::len).sum();
    assert_eq!(total_routing, 3 + 6 + 12);

    // --- Polling strategies on one partition ----------------------------------------------
    let topic2 = step(
        "create topic `polls` (1 partition)",
        client.create_topic(
            &stream_id,
            "polls",
            &TopicCreateOptions {
                partitions_count: Some(1),
                ..TopicCreateOptions::default()
            },
        ),
    )
    .await;
    let polls_id = Identifier::numeric(topic2.id).unwrap();
    // Three batches of three, sent apart so their timestamps differ.
    for batch in 0..3 {
        let mut messages: Vec<IggyMessage> = (0..3)
            .map(|i| message(&format!("m{}", batch * 3 + i)))
            .collect();
        step(
            &format!("send batch {batch} to `polls`"),
            client.send_messages(
                &stream_id,
                &polls_id,
                &Partitioning::partition_id(0),
                &mut messages,
            ),
        )
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let all9: Vec<String> = (0..9).map(|i| format!("m{i}")).collect();
    let consumer = Consumer::new(Identifier::numeric(5).unwrap());
    let poll = |strategy: PollingStrategy, count: u32, auto_commit: bool| {
        let (client, stream_id, polls_id, consumer) = (&client, &stream_id, &polls_id, &consumer);
        async move {
            client
                .poll_messages(
                    stream_id,
                    polls_id,
                    Some(0),
                    consumer,
                    &strategy,
                    count,
                    auto_commit,
                )
                .await
        }
    };
    let first = step("poll first 4", poll(PollingStrategy::first(), 4, false)).await;
    assert_eq!(payloads(&first), all9[..4], "first: {first:?}");
    let offset = step("poll offset 7", poll(PollingStrategy::offset(7), 10, false)).await;
    assert_eq!(payloads(&offset), all9[7..], "offset 7: {offset:?}");
    let last = step("poll last 2", poll(PollingStrategy::last(), 2, false)).await;
    assert_eq!(payloads(&last), all9[7..], "last 2: {last:?}");
    // Timestamp: from the first message of the second batch on.
    let ts = first.messages[3].header.timestamp;
    let by_time = step(
        "poll by timestamp of m3",
        poll(PollingStrategy::timestamp(ts.into()), 100, false),
    )
    .await;
    assert_eq!(
        by_time.messages.first().map(|m| m.header.timestamp),
        Some(ts),
        "timestamp poll: {by_time:?}"
    );
    assert!(
        by_time.messages.iter().all(|m| m.header.timestamp >= ts),
        "timestamp poll returned older messages: {by_time:?}"
    );
    let tail = payloads(&by_time);
    assert!(
        all9.ends_with(&tail) && tail.len() >= 6,
        "timestamp poll from m3's time: {tail:?}"
    );
    // Next with auto-commit: 4, then the next 4, then the last one; the stored offset follows.
    step("no offset stored for the consumer yet", async {
        match client
            .get_consumer_offset(&consumer, &stream_id, &polls_id, Some(0))
            .await?
        {
            None => Ok::<(), IggyError>(()),
            Some(o) => panic!("stored before any poll: {o:?}"),
        }
    })
    .await;
    let mut seen = Vec::new();
    for (round, want_stored) in [(0, 3u64), (1, 7), (2, 8)] {
        let next = step(
            &format!("poll next 4 with auto-commit, round {round}"),
            poll(PollingStrategy::next(), 4, true),
        )
        .await;
        seen.extend(payloads(&next));
        let stored = step(
            &format!("get consumer offset after round {round}"),
            client.get_consumer_offset(&consumer, &stream_id, &polls_id, Some(0)),
        )
        .await
        .expect("auto-commit stored an offset");
        assert_eq!(
            stored.stored_offset, want_stored,
            "round {round}: {stored:?}"
        );
        assert_eq!(stored.current_offset, 8, "round {round}: {stored:?}");
    }
    assert_eq!(seen, all9, "next polls with auto-commit");
    let empty = step(
        "poll next past the end",
        poll(PollingStrategy::next(), 4, true),
    )
    .await;
    assert!(empty.messages.is_empty(), "past the end: {empty:?}");
    // Explicit store moves the cursor back; next continues from there.
    step(
        "store consumer offset 4",
        client.store_consumer_offset(&consumer, &stream_id, &polls_id, Some(0), 4),
    )
    .await;
    let next = step(
        "poll next after the store",
        poll(PollingStrategy::next(), 2, false),
    )
    .await;
    assert_eq!(payloads(&next), all9[5..7], "next after storing 4");

    // --- High-level producer and consumer ------------------------------------------------
    let producer = client
        .producer("interop", "hl")
        .expect("producer builder")
        .create_topic_if_not_exists(1, IggyExpiry::NeverExpire, MaxTopicSize::Unlimited)
        .partitioning(Partitioning::partition_id(0))
        .direct(DirectConfig::builder().build())
        .build();
    step("IggyProducer init (creates topic `hl`)", producer.init()).await;
    let sent: Vec<String> = (0..50).map(|i| format!("hl-{i}")).collect();
    for chunk in sent.chunks(10) {
        step(
            "IggyProducer send 10",
            producer.send(chunk.iter().map(|p| message(p)).collect()),
        )
        .await;
    }
    let mut consumer = client
        .consumer("hl-reader", "interop", "hl", 0)
        .expect("consumer builder")
        .polling_strategy(PollingStrategy::next())
        .auto_commit(AutoCommit::When(AutoCommitWhen::PollingMessages))
        .batch_length(7)
        .poll_interval(IggyDuration::from(10_000))
        .build();
    step("IggyConsumer init", consumer.init()).await;
    let mut got = Vec::new();
    while got.len() < sent.len() {
        let item = step("IggyConsumer next message", async {
            Ok::<_, IggyError>(consumer.next().await)
        })
        .await;
        let received = item
            .expect("the consumer stream ended")
            .expect("the consumer reported an error");
        assert_eq!(received.partition_id, 0);
        assert_eq!(received.message.header.offset, got.len() as u64);
        got.push(String::from_utf8_lossy(&received.message.payload).into_owned());
    }
    assert_eq!(got, sent, "IggyConsumer read back what IggyProducer sent");
    drop(consumer);
    drop(producer);

    // --- GetStats ------------------------------------------------------------------------
    let stats = step("get stats", client.get_stats()).await;
    assert_eq!(stats.streams_count, 1, "{stats:?}");
    assert_eq!(stats.topics_count, 3, "{stats:?}");
    assert_eq!(stats.partitions_count, 3 + 1 + 1, "{stats:?}");
    assert_eq!(stats.messages_count, 21 + 9 + 50, "{stats:?}");
    // This node's replicas' committed batches (decision 380): headers on top of the payloads.
    let payload: usize = sent.iter().map(String::len).sum();
    assert!(
        stats.messages_size_bytes.as_bytes_u64() > payload as u64,
        "{stats:?}"
    );
    assert!(stats.segments_count >= 1, "{stats:?}");
    assert!(stats.clients_count >= 1, "{stats:?}");

    step("logout", client.logout_user()).await;
    cluster.pass();
}

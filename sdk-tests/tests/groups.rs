//! Consumer groups with the SDK's high-level `IggyConsumer` (issue 11 item 4; decisions
//! 315-322): two members, each on a client (a session) of its own, share the partitions of a
//! 4-partition topic: every message is consumed by exactly one member and each member gets a
//! non-empty share of whole partitions. Then one member shuts down (LeaveConsumerGroup) and the
//! other consumes everything sent after, from every partition. Then a member whose connection
//! closes without leaving is removed (the node proposes its session's Logout), GetTopics lists
//! the topic, and DeleteConsumerOffset removes a consumer's and the group's stored offsets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use iggy::prelude::*;
use strand_sdk_tests::{
    CLUSTER_BOUND, DevCluster, REPLICAS, init_client_log, single_primary, step,
};
use tokio::sync::mpsc;

const STREAM: &str = "cg-stream";
const TOPIC: &str = "cg-topic";
const GROUP: &str = "cg-group";
const PARTITIONS: u32 = 4;
const PER_PARTITION: u32 = 12;

fn scratch(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

async fn client_on(address: &str) -> IggyClient {
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(address.to_owned())
        .with_reconnection_max_retries(Some(0))
        .build()
        .expect("building the SDK client");
    step("connect", client.connect()).await;
    step("login iggy/iggy", client.login_user("iggy", "iggy")).await;
    client
}

/// Sends `PER_PARTITION` messages to each partition, payload `"{round}-{partition}-{i}"`.
async fn send_round(client: &IggyClient, round: &str) -> BTreeSet<String> {
    let mut sent = BTreeSet::new();
    for partition in 0..PARTITIONS {
        let mut messages: Vec<IggyMessage> = (0..PER_PARTITION)
            .map(|i| {
                let payload = format!("{round}-{partition}-{i}");
                sent.insert(payload.clone());
                IggyMessage::builder()
                    .payload(payload.into_bytes().into())
                    .build()
                    .expect("a valid message")
            })
            .collect();
        step(
            &format!("send round {round} to partition {partition}"),
            client.send_messages(
                &STREAM.try_into().unwrap(),
                &TOPIC.try_into().unwrap(),
                &Partitioning::partition_id(partition),
                &mut messages,
            ),
        )
        .await;
    }
    sent
}

/// One received message: (member, partition, offset, payload).
type Got = (usize, u32, u64, String);

/// Runs `consumer` until `stop`, sending what it receives; hands the consumer back.
fn run(
    member: usize,
    mut consumer: IggyConsumer,
    stop: Arc<AtomicBool>,
    out: mpsc::UnboundedSender<Got>,
) -> tokio::task::JoinHandle<IggyConsumer> {
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            match tokio::time::timeout(Duration::from_millis(200), consumer.next()).await {
                Ok(Some(Ok(received))) => {
                    let payload = String::from_utf8_lossy(&received.message.payload).into_owned();
                    let _ = out.send((
                        member,
                        received.partition_id,
                        received.message.header.offset,
                        payload,
                    ));
                }
                Ok(Some(Err(error))) => eprintln!("member {member}: {error}"),
                Ok(None) => break,
                Err(_) => {}
            }
        }
        consumer
    })
}

/// Collects until every payload of `want` arrived (or the cluster bound passes), then a
/// little longer so that a duplicate has the time to show up.
async fn collect(rx: &mut mpsc::UnboundedReceiver<Got>, want: &BTreeSet<String>) -> Vec<Got> {
    let mut got = Vec::new();
    let deadline = Instant::now() + CLUSTER_BOUND;
    let mut seen = BTreeSet::new();
    while !want.is_subset(&seen) && Instant::now() < deadline {
        if let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
            seen.insert(item.3.clone());
            got.push(item);
        }
    }
    let settle = Instant::now() + Duration::from_secs(2);
    while Instant::now() < settle {
        if let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            got.push(item);
        }
    }
    got
}

fn group_consumer(client: &IggyClient) -> IggyConsumer {
    client
        .consumer_group(GROUP, STREAM, TOPIC)
        .expect("consumer group builder")
        .auto_commit(AutoCommit::When(AutoCommitWhen::PollingMessages))
        .create_consumer_group_if_not_exists()
        .auto_join_consumer_group()
        .polling_strategy(PollingStrategy::next())
        .poll_interval(IggyDuration::from(Duration::from_millis(10)))
        .batch_length(5)
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_members_share_then_one_takes_all() {
    init_client_log();
    let mut cluster = DevCluster::start(&scratch("groups"));
    let all = cluster.wait_metrics("exactly one metadata primary, all nodes normal", |all| {
        all.len() == REPLICAS
            && single_primary(all).is_some()
            && all.iter().all(|m| m.get("status") == 0)
    });
    let address = cluster.nodes[single_primary(&all).expect("checked")]
        .client
        .clone();

    let admin = client_on(&address).await;
    step("create stream", admin.create_stream(STREAM)).await;
    let stream_id: Identifier = STREAM.try_into().unwrap();
    let topic_id: Identifier = TOPIC.try_into().unwrap();
    step(
        "create topic (4 partitions)",
        admin.create_topic(
            &stream_id,
            TOPIC,
            &TopicCreateOptions {
                partitions_count: Some(PARTITIONS),
                ..TopicCreateOptions::default()
            },
        ),
    )
    .await;

    // GetTopics (301) in the SDK's layout.
    let topics = step("get topics", admin.get_topics(&stream_id)).await;
    assert_eq!(topics.len(), 1, "{topics:?}");
    assert_eq!(topics[0].name, TOPIC);
    assert_eq!(topics[0].partitions_count, PARTITIONS);

    let first = send_round(&admin, "a").await;

    // Two members, each on a session of its own; both join before either polls.
    let client_a = client_on(&address).await;
    let client_b = client_on(&address).await;
    let mut consumer_a = group_consumer(&client_a);
    let mut consumer_b = group_consumer(&client_b);
    step("init member a (creates and joins)", consumer_a.init()).await;
    step("init member b (joins)", consumer_b.init()).await;
    let details = step(
        "get consumer group",
        admin.get_consumer_group(&stream_id, &topic_id, &GROUP.try_into().unwrap()),
    )
    .await
    .expect("the group exists");
    assert_eq!(details.members_count, 2, "{details:?}");
    let mut assigned: Vec<u32> = details
        .members
        .iter()
        .flat_map(|m| m.partitions.iter().copied())
        .collect();
    assigned.sort_unstable();
    assert_eq!(assigned, (0..PARTITIONS).collect::<Vec<_>>(), "{details:?}");
    let groups = step(
        "get consumer groups",
        admin.get_consumer_groups(&stream_id, &topic_id),
    )
    .await;
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].name, GROUP);

    let stop = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let task_a = run(0, consumer_a, stop.clone(), tx.clone());
    let task_b = run(1, consumer_b, stop.clone(), tx.clone());
    let got = collect(&mut rx, &first).await;
    stop.store(true, Ordering::SeqCst);
    let consumer_a = task_a.await.expect("member a's task");
    let mut consumer_b = task_b.await.expect("member b's task");

    // Every message exactly once, by one member; each member a non-empty share of whole
    // partitions.
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for g in &got {
        *count.entry(g.3.as_str()).or_default() += 1;
    }
    let dups: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dups.is_empty(), "consumed more than once: {dups:?}");
    let payloads: BTreeSet<String> = got.iter().map(|g| g.3.clone()).collect();
    assert_eq!(payloads, first, "not every message was consumed");
    let mut partitions_of: [BTreeSet<u32>; 2] = Default::default();
    for (member, partition, offset, payload) in &got {
        partitions_of[*member].insert(*partition);
        assert!(
            payload.starts_with(&format!("a-{partition}-{offset}")),
            "(partition {partition}, offset {offset}) carried {payload}"
        );
    }
    eprintln!(
        "member a consumed partitions {:?}, member b {:?}",
        partitions_of[0], partitions_of[1]
    );
    assert!(
        !partitions_of[0].is_empty() && !partitions_of[1].is_empty(),
        "a member got nothing: {partitions_of:?}"
    );
    assert!(
        partitions_of[0].is_disjoint(&partitions_of[1]),
        "a partition was consumed by both members: {partitions_of:?}"
    );

    // Member b leaves (IggyConsumer::shutdown sends LeaveConsumerGroup): a takes every
    // partition and consumes all of the next round.
    step("member b shuts down (leaves)", consumer_b.shutdown()).await;
    drop(consumer_b);
    let details = step(
        "get consumer group after the leave",
        admin.get_consumer_group(&stream_id, &topic_id, &GROUP.try_into().unwrap()),
    )
    .await
    .expect("the group exists");
    assert_eq!(details.members_count, 1, "{details:?}");
    assert_eq!(
        details.members[0].partitions,
        (0..PARTITIONS).collect::<Vec<_>>()
    );

    let second = send_round(&admin, "b").await;
    let stop = Arc::new(AtomicBool::new(false));
    let task_a = run(0, consumer_a, stop.clone(), tx.clone());
    let got = collect(&mut rx, &second).await;
    stop.store(true, Ordering::SeqCst);
    let mut consumer_a = task_a.await.expect("member a's task");
    let payloads: Vec<&str> = got.iter().map(|g| g.3.as_str()).collect();
    let unique: BTreeSet<String> = payloads.iter().map(|p| (*p).to_owned()).collect();
    assert_eq!(payloads.len(), unique.len(), "duplicates after the leave");
    assert_eq!(
        unique, second,
        "member a did not consume every partition after b left"
    );
    assert!(got.iter().all(|g| g.0 == 0));

    // A member whose connection closes without leaving: its node ends the session.
    let client_c = client_on(&address).await;
    step(
        "member c joins",
        client_c.join_consumer_group(&stream_id, &topic_id, &GROUP.try_into().unwrap()),
    )
    .await;
    let details = step(
        "get consumer group with c",
        admin.get_consumer_group(&stream_id, &topic_id, &GROUP.try_into().unwrap()),
    )
    .await
    .expect("the group exists");
    assert_eq!(details.members_count, 2, "{details:?}");
    step("member c disconnects", client_c.disconnect()).await;
    drop(client_c);
    let deadline = Instant::now() + CLUSTER_BOUND;
    loop {
        let details = step(
            "get consumer group after c's connection closed",
            admin.get_consumer_group(&stream_id, &topic_id, &GROUP.try_into().unwrap()),
        )
        .await
        .expect("the group exists");
        if details.members_count == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "c's membership outlived its connection: {details:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // DeleteConsumerOffset: a plain consumer's, then the group's (stored by auto-commit).
    let plain = Consumer::new(Identifier::numeric(9).unwrap());
    step(
        "store consumer offset",
        admin.store_consumer_offset(&plain, &stream_id, &topic_id, Some(2), 3),
    )
    .await;
    step(
        "delete consumer offset",
        admin.delete_consumer_offset(&plain, &stream_id, &topic_id, Some(2)),
    )
    .await;
    let after = step(
        "get consumer offset after the delete",
        admin.get_consumer_offset(&plain, &stream_id, &topic_id, Some(2)),
    )
    .await;
    assert!(after.is_none(), "deleted offset still there: {after:?}");
    let group = Consumer::group(GROUP.try_into().unwrap());
    let stored = step(
        "get the group's offset",
        admin.get_consumer_offset(&group, &stream_id, &topic_id, Some(1)),
    )
    .await
    .expect("auto-commit stored the group's offset");
    assert_eq!(
        stored.stored_offset,
        u64::from(2 * PER_PARTITION - 1),
        "{stored:?}"
    );
    step(
        "delete the group's offset",
        admin.delete_consumer_offset(&group, &stream_id, &topic_id, Some(1)),
    )
    .await;
    let after = step(
        "get the group's offset after the delete",
        admin.get_consumer_offset(&group, &stream_id, &topic_id, Some(1)),
    )
    .await;
    assert!(
        after.is_none(),
        "deleted group offset still there: {after:?}"
    );
    match admin
        .delete_consumer_offset(&plain, &stream_id, &topic_id, Some(2))
        .await
    {
        Err(IggyError::ConsumerOffsetNotFound(..)) => {}
        other => panic!("deleting a missing offset: {other:?}"),
    }

    step("member a shuts down", consumer_a.shutdown()).await;
    step(
        "delete consumer group",
        admin.delete_consumer_group(&stream_id, &topic_id, &GROUP.try_into().unwrap()),
    )
    .await;
    let gone = step(
        "get deleted group",
        admin.get_consumer_group(&stream_id, &topic_id, &GROUP.try_into().unwrap()),
    )
    .await;
    assert!(gone.is_none(), "{gone:?}");
    cluster.pass();
}

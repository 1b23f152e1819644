//! A consumer-group member on a killed node is replaced (issue 11; decisions 370-374), with the
//! SDK: three `strand start` nodes with `cluster.dead_node_session_timeout = "2s"`, a
//! 4-partition topic and a group of two members.
//!
//! Where an SDK member's session lives: a group member is a session (decision 315) and its
//! JoinConsumerGroup is a metadata write, which a backup refuses 58; the SDK answers both a
//! login and a 58 with its leader check and moves to the primary under a new session. So an
//! SDK member always ends with its session (and its connection) on the metadata primary, even
//! when it dialed a backup; a member on a backup is reachable with raw frames only
//! (`server/tests/groups_e2e.rs`). The node whose death an SDK member sees is therefore the
//! metadata primary, and the test kills it, failover included:
//!
//! - member A, a high-level `IggyConsumer`, dials a backup: its login is forwarded to the
//!   primary, the SDK's leader check moves it there, and it joins (member 0, partitions 0, 2);
//! - member B, a plain SDK client driven by the suite's `RotatingClient` (the SDK itself would
//!   redial the dead address forever), dials the other backup, moves to the primary too, joins
//!   after every login (member 1, partitions 1, 3) and polls the group with auto-commit;
//! - round `a` is consumed by both; A stops polling (still a member); round `b` is produced;
//!   the metadata primary is SIGKILLed. A's client keeps its dead connection (as an SDK
//!   consumer does until its node returns); B's poll fails, it logs in through a survivor
//!   (a new session) and joins again (member 2); round `c` is produced after the failover.
//!
//! Shown: the new primary ends the sessions of the dead node once it has been down 2 s, so
//! GetConsumerGroup shows exactly one member, B's new session, with all 4 partitions; B then
//! consumes every message of rounds `b` and `c`, those of A's partitions included: every
//! produced message is consumed by the group at least once. A message consumed twice (the
//! same partition and offset) is reported, not failed: group consumption is at least once.
//! With the rule off (`"0"`) the dead sessions stay members and the wait for one member
//! fails naming the group it saw.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use iggy::prelude::*;
use strand_sdk_tests::start::StartCluster;
use strand_sdk_tests::{
    CLUSTER_BOUND, Call, REPLICAS, RotatingClient, init_client_log, single_primary, step,
};
use tokio::sync::mpsc;

const STREAM: &str = "dead-member";
const TOPIC: &str = "events";
const GROUP: &str = "workers";
const PARTITIONS: u32 = 4;
const PER_PARTITION: u32 = 8;

/// The bound under test: short, so the test waits about 2 s for it after the kill.
const DEAD_NODE_SESSION_TIMEOUT: &str = "2s";

fn id(name: &str) -> Identifier {
    name.try_into().expect("a valid name")
}

/// One message consumed: (who, partition, offset, payload). Who: 0 member A, then `1 + n`
/// for member B after `n` reconnections (1: its session before the kill, 2: the one after).
type Got = (usize, u32, u64, String);

/// Sends `PER_PARTITION` messages to each partition, payload `"{round}-{partition}-{i}"`.
async fn send_round(admin: &mut RotatingClient, round: &str) -> BTreeSet<String> {
    let mut sent = BTreeSet::new();
    for partition in 0..PARTITIONS {
        let payloads: Vec<String> = (0..PER_PARTITION)
            .map(|i| format!("{round}-{partition}-{i}"))
            .collect();
        sent.extend(payloads.iter().cloned());
        admin
            .call(
                &format!("send round {round} to partition {partition}"),
                |c| {
                    let payloads = payloads.clone();
                    Box::pin(async move {
                        let mut messages: Vec<IggyMessage> = payloads
                            .iter()
                            .map(|p| {
                                IggyMessage::builder()
                                    .payload(p.clone().into_bytes().into())
                                    .build()
                                    .expect("a valid message")
                            })
                            .collect();
                        c.send_messages(
                            &id(STREAM),
                            &id(TOPIC),
                            &Partitioning::partition_id(partition),
                            &mut messages,
                        )
                        .await
                    })
                },
            )
            .await;
    }
    sent
}

/// Member B's step after every login: join the group (a no-op for a member already in).
fn join(client: &IggyClient) -> Call<'_, ()> {
    Box::pin(async move {
        client
            .join_consumer_group(&id(STREAM), &id(TOPIC), &id(GROUP))
            .await
    })
}

/// Member A: polls until `stop`, then hands the consumer back (still a member).
fn run_a(
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
                        0,
                        received.partition_id,
                        received.message.header.offset,
                        payload,
                    ));
                }
                Ok(Some(Err(error))) => eprintln!("member a: {error}"),
                Ok(None) => break,
                Err(_) => {}
            }
        }
        consumer
    })
}

/// Member B: polls the group (Next, auto-commit, the SDK picking among its assigned
/// partitions) until `stop`; every failure reconnects, logs in and joins again.
fn run_b(
    mut member: RotatingClient,
    stop: Arc<AtomicBool>,
    out: mpsc::UnboundedSender<Got>,
) -> tokio::task::JoinHandle<RotatingClient> {
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            let polled = member
                .call("member b polls the group", |c| {
                    Box::pin(async move {
                        c.poll_messages(
                            &id(STREAM),
                            &id(TOPIC),
                            None,
                            &Consumer::group(id(GROUP)),
                            &PollingStrategy::next(),
                            5,
                            true,
                        )
                        .await
                    })
                })
                .await;
            let who = 1 + member.reconnects as usize;
            for message in &polled.messages {
                let payload = String::from_utf8_lossy(&message.payload).into_owned();
                let _ = out.send((who, polled.partition_id, message.header.offset, payload));
            }
            if polled.messages.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        member
    })
}

/// Receives into `got` until every payload of `want` is among them (failing after
/// [`CLUSTER_BOUND`] with what is missing), then 1 s more so that a duplicate can show.
async fn collect(
    rx: &mut mpsc::UnboundedReceiver<Got>,
    got: &mut Vec<Got>,
    want: &BTreeSet<String>,
    what: &str,
) {
    let deadline = Instant::now() + CLUSTER_BOUND;
    loop {
        let seen: BTreeSet<&str> = got.iter().map(|g| g.3.as_str()).collect();
        let missing: Vec<&String> = want.iter().filter(|p| !seen.contains(p.as_str())).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not consumed within {CLUSTER_BOUND:?}: {missing:?}"
        );
        if let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            got.push(item);
        }
    }
    let settle = Instant::now() + Duration::from_secs(1);
    while Instant::now() < settle {
        if let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
            got.push(item);
        }
    }
}

async fn group(admin: &mut RotatingClient, what: &str) -> ConsumerGroupDetails {
    admin
        .call(what, |c| {
            Box::pin(async move {
                match c
                    .get_consumer_group(&id(STREAM), &id(TOPIC), &id(GROUP))
                    .await?
                {
                    Some(details) => Ok(details),
                    // Not known on this node (yet): retried like a failure, on another node.
                    None => Err(IggyError::ConsumerGroupNameNotFound(
                        GROUP.into(),
                        id(TOPIC),
                    )),
                }
            })
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_on_the_killed_node_is_replaced_and_the_survivor_consumes_everything() {
    init_client_log();
    let mut cluster = StartCluster::start_with(
        &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dead-member"),
        &format!("dead_node_session_timeout = \"{DEAD_NODE_SESSION_TIMEOUT}\"\n"),
    );
    let all_nodes: Vec<usize> = (0..REPLICAS).collect();
    let all = cluster.wait_metrics(
        "exactly one metadata primary, all nodes normal",
        &all_nodes,
        |all| single_primary(all).is_some() && all.iter().all(|m| m.get("status") == 0),
    );
    let primary = single_primary(&all).expect("checked above");
    let (backup_a, backup_b) = ((primary + 1) % REPLICAS, (primary + 2) % REPLICAS);
    let address = |n: usize| cluster.nodes[n].client.clone();
    eprintln!("metadata primary: node {primary}; member a dials {backup_a}, b dials {backup_b}");

    let mut admin = RotatingClient::new(
        vec![address(primary), address(backup_a), address(backup_b)],
        "iggy",
        "iggy",
    );
    admin
        .call("create stream", |c| Box::pin(c.create_stream(STREAM)))
        .await;
    admin
        .call("create topic (4 partitions)", |c| {
            Box::pin(async move {
                c.create_topic(
                    &id(STREAM),
                    TOPIC,
                    &TopicCreateOptions {
                        partitions_count: Some(PARTITIONS),
                        ..TopicCreateOptions::default()
                    },
                )
                .await
            })
        })
        .await;
    admin
        .call("create consumer group", |c| {
            Box::pin(async move {
                c.create_consumer_group(&id(STREAM), &id(TOPIC), GROUP)
                    .await
            })
        })
        .await;

    // Member A: an IggyConsumer whose client dialed a backup; the SDK moves it to the primary.
    let client_a = IggyClient::builder()
        .with_tcp()
        .with_server_address(address(backup_a))
        .with_reconnection_max_retries(Some(0))
        .build()
        .expect("building the SDK client");
    step("member a: connect to a backup", client_a.connect()).await;
    step(
        "member a: login on the backup (forwarded, then the leader check)",
        client_a.login_user("iggy", "iggy"),
    )
    .await;
    let on = client_a.get_connection_info().await.server_address;
    assert_eq!(
        on,
        address(primary),
        "the SDK stayed on the backup after login"
    );
    let mut consumer_a = client_a
        .consumer_group(GROUP, STREAM, TOPIC)
        .expect("consumer group builder")
        .auto_commit(AutoCommit::When(AutoCommitWhen::PollingMessages))
        .auto_join_consumer_group()
        .polling_strategy(PollingStrategy::next())
        .poll_interval(IggyDuration::from(Duration::from_millis(10)))
        .batch_length(5)
        .build();
    step("member a: init (joins)", consumer_a.init()).await;

    // Member B: joins at its first login (through the other backup), polls from then on.
    let mut member_b = RotatingClient::new(
        vec![address(backup_b), address(backup_a), address(primary)],
        "iggy",
        "iggy",
    )
    .after_login(Box::new(join));
    member_b
        .call("member b: ping after the join", |c| Box::pin(c.ping()))
        .await;
    let on = member_b.address().await.expect("connected");
    assert_eq!(on, address(primary), "member b is not on the primary");

    let before = group(&mut admin, "get consumer group before the kill").await;
    eprintln!("before the kill: {before:?}");
    assert_eq!(before.members_count, 2, "{before:?}");
    let mut assigned: Vec<u32> = before
        .members
        .iter()
        .flat_map(|m| m.partitions.iter().copied())
        .collect();
    assigned.sort_unstable();
    assert_eq!(assigned, (0..PARTITIONS).collect::<Vec<_>>(), "{before:?}");
    let old_members: BTreeSet<u32> = before.members.iter().map(|m| m.id).collect();
    // Member A joined first (member 0): `p mod 2` gives it the even partitions.
    let first = before
        .members
        .iter()
        .min_by_key(|m| m.id)
        .expect("two members");
    let a_partitions: BTreeSet<u32> = first.partitions.iter().copied().collect();

    // Round a, consumed by both members.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stop_a = Arc::new(AtomicBool::new(false));
    let stop_b = Arc::new(AtomicBool::new(false));
    let task_a = run_a(consumer_a, stop_a.clone(), tx.clone());
    let task_b = run_b(member_b, stop_b.clone(), tx.clone());
    let round_a = send_round(&mut admin, "a").await;
    let mut got = Vec::new();
    collect(&mut rx, &mut got, &round_a, "round a, both members polling").await;
    let by: BTreeMap<usize, BTreeSet<u32>> = got.iter().fold(BTreeMap::new(), |mut m, g| {
        m.entry(g.0).or_default().insert(g.1);
        m
    });
    eprintln!("round a: partitions consumed per member {by:?}");
    assert_eq!(
        by.get(&0),
        Some(&a_partitions),
        "member a did not consume exactly its partitions"
    );
    assert!(by.contains_key(&1), "member b consumed nothing: {by:?}");

    // Member A stops polling but stays a member; round b is produced; the primary dies.
    stop_a.store(true, Ordering::SeqCst);
    let consumer_a = task_a.await.expect("member a's task");
    let round_b = send_round(&mut admin, "b").await;
    cluster.kill(primary);
    eprintln!("SIGKILLed metadata primary node {primary} (member a's node)");

    // Round c, after the failover (the admin client rotates to the new primary).
    let round_c = send_round(&mut admin, "c").await;

    // The dead node's sessions end: one member left, B's new session, with every partition.
    let deadline = Instant::now() + CLUSTER_BOUND;
    let after = loop {
        let now = group(&mut admin, "get consumer group after the kill").await;
        if now.members_count == 1
            && !old_members.contains(&now.members[0].id)
            && now.members[0].partitions == (0..PARTITIONS).collect::<Vec<_>>()
        {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the killed node's members were not removed within {CLUSTER_BOUND:?} \
             (cluster.dead_node_session_timeout = {DEAD_NODE_SESSION_TIMEOUT}): the group still \
             has {now:?}; members before the kill {old_members:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("after the kill: {after:?}");

    // B consumes everything left: rounds b and c, A's partitions included.
    let mut rest = round_b.clone();
    rest.extend(round_c.iter().cloned());
    collect(&mut rx, &mut got, &rest, "rounds b and c after the kill").await;
    stop_b.store(true, Ordering::SeqCst);
    let member_b = task_b.await.expect("member b's task");
    eprintln!(
        "member b: {} reconnects; failures {:?}",
        member_b.reconnects, member_b.failures
    );
    assert!(member_b.reconnects >= 1, "member b never saw the kill");

    let mut everything = round_a.clone();
    everything.extend(rest.iter().cloned());
    let consumed: BTreeSet<&str> = got.iter().map(|g| g.3.as_str()).collect();
    let lost: Vec<&String> = everything
        .iter()
        .filter(|p| !consumed.contains(p.as_str()))
        .collect();
    assert!(lost.is_empty(), "produced but never consumed: {lost:?}");
    // A's partitions after the kill: consumed by B's new session(s).
    let taken_over: BTreeSet<&str> = got
        .iter()
        .filter(|g| g.0 >= 2 && a_partitions.contains(&g.1))
        .map(|g| g.3.as_str())
        .collect();
    for payload in round_c.iter().filter(|p| {
        let partition: u32 = p.split('-').nth(1).and_then(|n| n.parse().ok()).unwrap();
        a_partitions.contains(&partition)
    }) {
        assert!(
            taken_over.contains(payload.as_str()),
            "{payload} of dead member a's partitions was not consumed by the survivor"
        );
    }
    let mut times: BTreeMap<(u32, u64), Vec<usize>> = BTreeMap::new();
    for (who, partition, offset, _) in &got {
        times.entry((*partition, *offset)).or_default().push(*who);
    }
    let twice: Vec<_> = times.iter().filter(|(_, w)| w.len() > 1).collect();
    eprintln!(
        "consumed {} messages for {} produced; consumed more than once ((partition, offset): \
         by whom): {twice:?}",
        got.len(),
        everything.len()
    );

    let ended = cluster.log_lines("ending a session whose node is gone");
    assert!(
        ended
            .iter()
            .any(|l| l.contains(&format!("PeerDown({primary})"))),
        "no session ended for the dead node {primary}: {ended:?}"
    );
    drop(consumer_a);
    drop(client_a);
    cluster.pass();
}

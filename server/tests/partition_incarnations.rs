//! Two incarnations of one partition key on the replica plane (decisions 375-377): three
//! nodes' partition hosts on one glommio executor, real disks, an in-process network, and a
//! committed metadata view per node, so one node can lag behind a purge the others applied.
//!
//! The lagging node still runs the old incarnation as its primary; the other two run the new
//! one. Its frames must not reach the new incarnation (nor theirs the old one): a send it takes
//! after the purge must never be acknowledged, and the new incarnation must never hold the old
//! one's messages. When its metadata catches up, the send in flight is answered 57, once.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use consensus::{ClientRequest, Frame, RawConfig, ReplicaId, Status};
use journal::FileStorage;
use journal::wal::WalConfig;
use server::client::codec::{Consumer, Identifier, Name, Options, PollingStrategy};
use server::client::reply::{PollHead, decode_send_reply, read_result};
use server::client::request::PollMessages;
use server::groups::{Partitions, ReplySink};
use server::metadata::state::{Partition, State, Stream, Topic};
use server::metadata::topic::{TopicSettings, derive};
use server::metadata::view::{MetadataHandle, MetadataReader, MetadataView};
use server::partition_group::{
    self as pg, Event, Host, Outcome, PartitionGauges, Pump, ReclaimLimits, ShardDisk, Transport,
};
use wire::{GroupId, Operation};

const LANES: u16 = 16;
const CLUSTER: u128 = 0x1C;
const NODES: u8 = 3;

#[derive(Default)]
struct Net {
    hosts: RefCell<Vec<Option<Rc<Host>>>>,
}

struct Link {
    net: Rc<Net>,
    me: u8,
}

impl Transport for Link {
    fn send(&self, peer: u8, group: GroupId, frame: &Bytes) {
        let host = self.net.hosts.borrow()[peer as usize].clone();
        if let Some(host) = host {
            // The receiving node's routing goes by the key (server::routing).
            host.inbox.push(Event::Frame {
                from: self.me,
                group: group.key().0,
                bytes: frame.clone(),
            });
        }
    }
    fn connected(&self, peer: u8, _: GroupId) -> bool {
        self.net.hosts.borrow()[peer as usize].is_some()
    }
}

#[derive(Default)]
struct Replies(RefCell<Vec<(u128, Frame)>>);

impl ReplySink for Replies {
    fn reply(&self, client: u128, frame: Frame) {
        self.0.borrow_mut().push((client, frame));
    }
}

struct Node {
    host: Rc<Host>,
    stop: Rc<std::cell::Cell<bool>>,
    task: glommio::task::JoinHandle<Outcome>,
    replies: Rc<Replies>,
    metadata: Arc<MetadataHandle>,
}

struct Cluster {
    dirs: Vec<PathBuf>,
    nodes: Vec<Node>,
    net: Rc<Net>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn group() -> GroupId {
    GroupId::partition(wire::PartitionKey {
        stream: 0,
        topic: 0,
        partition: 0,
    })
    .unwrap()
}

/// The committed view of one stream, one topic and one partition at `incarnation`.
fn view(op: u64, incarnation: u64) -> MetadataView {
    let explicit = Options::default();
    let derived = derive(&explicit);
    let topic = Topic {
        id: 0,
        name: Name::new("t").unwrap(),
        created_at: 1,
        explicit,
        derived,
        settings: TopicSettings::DEFAULT,
        partitions: vec![Partition {
            id: 0,
            created_at: 1,
            consensus_group_id: incarnation,
        }],
    };
    let stream = Stream {
        id: 0,
        name: Name::new("s").unwrap(),
        created_at: 1,
        topics: [(0, topic)].into_iter().collect(),
    };
    MetadataView {
        op,
        state: State {
            streams: [(0, stream)].into_iter().collect(),
            next_consensus_group_id: incarnation + 1,
            ..State::default()
        },
    }
}

/// Starts node `r`'s partition pump on `dir` with `handle` as its committed metadata.
fn start(net: &Rc<Net>, dir: &Path, r: u8, metadata: Arc<MetadataHandle>) -> Node {
    let host = Host::new(0, 1, LANES, Arc::new(PartitionGauges::default()));
    let stop = Rc::new(std::cell::Cell::new(false));
    let replies = Rc::new(Replies::default());
    let flag = stop.clone();
    let task = glommio::spawn_local(pg::run(Pump {
        host: host.clone(),
        core: RawConfig::new(CLUSTER, ReplicaId(r), NODES, group()),
        identity: journal::Identity {
            cluster: CLUSTER,
            replica_id: r,
            replica_count: NODES,
        },
        disk: ShardDisk {
            partitions: storage(dir, "partitions"),
            wal: storage(dir, "wal"),
        },
        wal: WalConfig {
            file_size_max: 64 * 1024,
            window_bytes_max: 16 * 1024,
            window_us_max: 500,
        },
        metadata: MetadataReader::new(metadata.clone()),
        transport: Rc::new(Link {
            net: net.clone(),
            me: r,
        }),
        replies: replies.clone(),
        stop: Box::new(move || flag.get()),
        limits: ReclaimLimits::default(),
        ack_overrides: Default::default(),
        rejoin: false,
    }))
    .detach();
    net.hosts.borrow_mut()[r as usize] = Some(host.clone());
    Node {
        host,
        stop,
        task,
        replies,
        metadata,
    }
}

fn storage(dir: &Path, sub: &str) -> FileStorage {
    let dir = dir.join(sub);
    std::fs::create_dir_all(&dir).unwrap();
    FileStorage::new(&dir, false).unwrap()
}

impl Cluster {
    fn new(name: &str) -> Cluster {
        let net = Rc::new(Net::default());
        *net.hosts.borrow_mut() = vec![None; NODES as usize];
        let mut c = Cluster {
            dirs: Vec::new(),
            nodes: Vec::new(),
            net,
        };
        for r in 0..NODES {
            let dir = std::env::temp_dir().join(format!(
                "strand-incarnations-{}-{name}-{r}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let handle = Arc::new(MetadataHandle::default());
            handle.publish(view(7, 1));
            let node = start(&c.net, &dir, r, handle);
            c.dirs.push(dir);
            c.nodes.push(node);
        }
        c
    }

    /// Stops node `r` (its pump flushes and ends; peers see it gone) and starts it again on
    /// the same disk with `handle` as its committed metadata.
    async fn restart(&mut self, r: u8, handle: Arc<MetadataHandle>) {
        self.net.hosts.borrow_mut()[r as usize] = None;
        let node = &self.nodes[r as usize];
        node.stop.set(true);
        let fresh = start(&self.net, &self.dirs[r as usize], r, handle);
        let old = std::mem::replace(&mut self.nodes[r as usize], fresh);
        assert_eq!(old.task.await, Some(Outcome::Stopped));
    }

    fn host(&self, r: u8) -> &Rc<Host> {
        &self.nodes[r as usize].host
    }

    async fn stop(mut self) {
        for node in &self.nodes {
            node.stop.set(true);
        }
        for node in std::mem::take(&mut self.nodes) {
            let _ = node.task.await;
        }
    }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if f() {
            return;
        }
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

fn payload(tag: u8, i: usize) -> Vec<u8> {
    let mut p = vec![tag; 100];
    p[..8].copy_from_slice(&(i as u64).to_le_bytes());
    p
}

fn send(client: u128, number: u64, payload: &[u8]) -> ClientRequest {
    let batch = consensus::build_batch(&[payload]);
    let body = consensus::build_send_messages_request(&batch, 0);
    ClientRequest::new(client, Operation::SendMessages, 0, number, body)
}

fn status(frame: &Frame) -> u32 {
    u32::from_le_bytes(frame.bytes()[216..220].try_into().unwrap())
}

fn replies_to(node: &Node, client: u128) -> Vec<Frame> {
    node.replies
        .0
        .borrow()
        .iter()
        .filter(|(c, _)| *c == client)
        .map(|(_, f)| f.clone())
        .collect()
}

/// Sends one message to the group's primary on node `r` until it commits (a fresh group
/// refuses until its first superblock is durable; a view change may be under way).
async fn send_committed(c: &Cluster, client: u128, payload: &[u8]) {
    for number in 1..=1000u64 {
        let Some(r) = (0..NODES).find(|&r| {
            c.host(r)
                .group_state(group())
                .is_some_and(|s| s.1 == Status::Normal && s.0 % u32::from(NODES) == u32::from(r))
        }) else {
            glommio::timer::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let node = &c.nodes[r as usize];
        if c.host(r)
            .submit(group(), send(client, number, payload))
            .is_ok()
        {
            for _ in 0..200 {
                if let Some(frame) = replies_to(node, client)
                    .into_iter()
                    .find(|f| u64::from_le_bytes(f.bytes()[200..208].try_into().unwrap()) == number)
                {
                    if status(&frame) == 0 {
                        let sent =
                            decode_send_reply(read_result(&frame.bytes()[256..]).unwrap().unwrap())
                                .unwrap();
                        assert_eq!(sent.len(), 1);
                        return;
                    }
                    break;
                }
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    panic!("client {client:#x}: no send committed");
}

/// Every message the partition holds on node `r`, as payloads.
fn poll_all(host: &Host) -> (u64, Vec<u8>) {
    let request = PollMessages {
        consumer: Consumer {
            group: false,
            id: Identifier::Numeric(7),
        },
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        partition: Some(0),
        strategy: PollingStrategy::First(0),
        count: 100_000,
        auto_commit: false,
    };
    let server::partition::PollAnswer::Ready(p) = host.poll(group(), 0, &request).unwrap() else {
        panic!("a poll left the tail")
    };
    let (head, _) = PollHead::decode(&p.body()).unwrap();
    (head.current_offset, p.body())
}

fn holds(body: &[u8], tag: u8) -> bool {
    body.windows(16).any(|w| w.iter().all(|&b| b == tag))
}

/// Node 0 lags a purge its peers applied and stays the old incarnation's primary. Its send is
/// never acknowledged (no peer of the new incarnation acks the old one's prepares), the new
/// incarnation never takes the old one's log (the purged messages stay gone, and nothing of
/// node 0's old view or commits reaches it), and when node 0's metadata catches up its send in
/// flight is answered 57 exactly once; sends then commit in the new incarnation from offset 0
/// on every node.
#[test]
fn a_node_lagging_a_purge_cannot_commit_into_or_from_the_new_incarnation() {
    run(|| async {
        let c = Cluster::new("lag");
        // Incarnation 1: node 0 is the primary of view 0.
        for i in 0..3 {
            send_committed(&c, 0xA0 + i as u128, &payload(0xAA, i)).await;
        }
        until("node 0 leads incarnation 1", || {
            c.host(0)
                .group_state(group())
                .is_some_and(|s| s.0 == 0 && s.1 == Status::Normal && s.4 >= 3)
        })
        .await;
        // The purge commits; nodes 1 and 2 apply it, node 0 lags.
        for r in 1..NODES {
            c.nodes[r as usize].metadata.publish(view(8, 2));
        }
        until(
            "nodes 1 and 2 removed incarnation 1 and boot incarnation 2",
            || {
                (1..NODES).all(|r| {
                    c.host(r)
                        .gauges
                        .groups_removed
                        .load(std::sync::atomic::Ordering::Relaxed)
                        == 1
                        && c.host(r).hosts(group().0)
                })
            },
        )
        .await;
        // Node 0 still takes a send in incarnation 1.
        let lagging: u128 = 0xB0;
        c.host(0)
            .submit(group(), send(lagging, 1, &payload(0xBB, 0)))
            .expect("node 0's incarnation 1 still admits");
        // Plenty of heartbeats and prepare retransmits.
        glommio::timer::sleep(Duration::from_millis(1500)).await;
        let early = replies_to(&c.nodes[0], lagging);
        assert!(
            early.iter().all(|f| status(f) != 0),
            "node 0's old incarnation acknowledged a send after the purge committed"
        );
        for r in 1..NODES {
            let (_, body) = poll_all(c.host(r));
            assert!(
                !holds(&body, 0xAA) && !holds(&body, 0xBB),
                "node {r}'s new incarnation holds the old incarnation's messages"
            );
        }
        let fenced: u64 = (0..NODES)
            .map(|r| {
                c.host(r)
                    .gauges
                    .fenced
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .sum();
        assert!(fenced > 0, "no frame of the other incarnation was fenced");
        // Node 0 catches up: its send in flight is answered 57, once.
        c.nodes[0].metadata.publish(view(8, 2));
        until("node 0 answers its send in flight", || {
            !replies_to(&c.nodes[0], lagging).is_empty()
        })
        .await;
        until("node 0 boots incarnation 2", || {
            c.host(0)
                .gauges
                .groups_removed
                .load(std::sync::atomic::Ordering::Relaxed)
                == 1
                && c.host(0).hosts(group().0)
        })
        .await;
        // Incarnation 2 takes sends, from offset 0, on every node.
        send_committed(&c, 0xC0, &payload(0xCC, 0)).await;
        until("every node holds the new send alone", || {
            (0..NODES).all(|r| {
                let (current, body) = poll_all(c.host(r));
                current == 0 && holds(&body, 0xCC) && !holds(&body, 0xAA) && !holds(&body, 0xBB)
            })
        })
        .await;
        let answered = replies_to(&c.nodes[0], lagging);
        assert_eq!(
            answered.len(),
            1,
            "the send in flight was answered more than once"
        );
        assert_eq!(
            status(&answered[0]),
            consensus::codes::TRANSIENT_NOT_COMMITTED
        );
        assert_eq!(
            c.host(0)
                .gauges
                .dropped_answered
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        c.stop().await;
    });
}

/// Why a purge's reply waits for `n - Q_rep + 1` appliers (decision 395), and not fewer: with
/// one node of three applied (the metadata primary at the purge's commit, before any backup
/// applied it), the two lagging nodes are still a replication quorum of the old incarnation,
/// so node 0 (its primary) acknowledges a send, and the message goes with the old incarnation
/// when they catch up. With two of three applied, the test above shows it is never
/// acknowledged; `metadata_replicated::a_purge_is_answered_only_once_enough_replicas_applied_it`
/// shows the reply waits for the second.
#[test]
fn with_a_lagging_majority_the_old_incarnation_still_acknowledges() {
    run(|| async {
        let c = Cluster::new("majority");
        send_committed(&c, 0xA0, &payload(0xAA, 0)).await;
        until("node 0 leads incarnation 1", || {
            c.host(0)
                .group_state(group())
                .is_some_and(|s| s.0 == 0 && s.1 == Status::Normal)
        })
        .await;
        // Only node 2 applies the purge.
        c.nodes[2].metadata.publish(view(8, 2));
        until(
            "node 2 removed incarnation 1 and boots incarnation 2",
            || {
                c.host(2)
                    .gauges
                    .groups_removed
                    .load(std::sync::atomic::Ordering::Relaxed)
                    == 1
                    && c.host(2).hosts(group().0)
            },
        )
        .await;
        let lagging: u128 = 0xB0;
        c.host(0)
            .submit(group(), send(lagging, 1, &payload(0xBB, 0)))
            .expect("node 0's incarnation 1 still admits");
        until("node 0's old incarnation acknowledges the send", || {
            replies_to(&c.nodes[0], lagging)
                .iter()
                .any(|f| status(f) == 0)
        })
        .await;
        // Nodes 0 and 1 catch up: the acknowledged message goes with incarnation 1.
        for r in 0..2 {
            c.nodes[r].metadata.publish(view(8, 2));
        }
        until("nodes 0 and 1 boot incarnation 2", || {
            (0..2).all(|r| {
                c.host(r)
                    .gauges
                    .groups_removed
                    .load(std::sync::atomic::Ordering::Relaxed)
                    == 1
                    && c.host(r).hosts(group().0)
            })
        })
        .await;
        send_committed(&c, 0xC0, &payload(0xCC, 0)).await;
        until(
            "every node holds the later send and not the acknowledged one",
            || {
                (0..NODES).all(|r| {
                    let (_, body) = poll_all(c.host(r));
                    holds(&body, 0xCC) && !holds(&body, 0xBB)
                })
            },
        )
        .await;
        c.stop().await;
    });
}

/// The committed view after DeletePartitions removed the topic's only partition at
/// `incarnation`: the key retired (decision 342).
fn deleted(op: u64, incarnation: u64) -> MetadataView {
    let mut v = view(op, incarnation);
    let topic = v
        .state
        .streams
        .get_mut(&0)
        .unwrap()
        .topics
        .get_mut(&0)
        .unwrap();
    topic.partitions.clear();
    v.state.retired.insert(group().0, incarnation);
    v
}

/// A send in flight in a group whose partition is deleted is answered 57 when the group is
/// dropped, once, and no other request of it stays unanswered. Nodes 1 and 2 apply the delete
/// first, so node 0's send cannot commit and is in flight when node 0 applies it.
#[test]
fn a_send_in_flight_when_its_partition_is_deleted_is_answered_once() {
    run(|| async {
        let c = Cluster::new("delete");
        send_committed(&c, 0xA0, &payload(0xAA, 0)).await;
        until("node 0 leads", || {
            c.host(0)
                .group_state(group())
                .is_some_and(|s| s.0 == 0 && s.1 == Status::Normal)
        })
        .await;
        for r in 1..NODES {
            c.nodes[r as usize].metadata.publish(deleted(8, 1));
        }
        until("nodes 1 and 2 removed the group", || {
            (1..NODES).all(|r| !c.host(r).hosts(group().0))
        })
        .await;
        let client: u128 = 0xD0;
        c.host(0)
            .submit(group(), send(client, 1, &payload(0xDD, 0)))
            .expect("node 0 still admits");
        glommio::timer::sleep(Duration::from_millis(300)).await;
        assert!(
            replies_to(&c.nodes[0], client).is_empty(),
            "the send was answered before its group was dropped"
        );
        c.nodes[0].metadata.publish(deleted(8, 1));
        until("node 0 answers the send in flight", || {
            !replies_to(&c.nodes[0], client).is_empty()
        })
        .await;
        until("node 0 removed the group", || !c.host(0).hosts(group().0)).await;
        // Later ticks answer nothing more.
        glommio::timer::sleep(Duration::from_millis(300)).await;
        let answered = replies_to(&c.nodes[0], client);
        assert_eq!(answered.len(), 1, "answered more than once");
        assert_eq!(
            status(&answered[0]),
            consensus::codes::TRANSIENT_NOT_COMMITTED
        );
        c.stop().await;
    });
}

/// Decision 397: node 0 applied the purge (it and node 2 make the `n - Q_rep + 1` appliers
/// decision 395's gate waits for, node 1 still lags), then crashed before its pump's tick
/// removed incarnation 1, and restarts with a metadata view from before the purge (its
/// checkpoint). Booting from that view would run incarnation 1 again beside node 1's: a
/// quorum of the dead incarnation. The restarted pump boots nothing until its metadata
/// replica caught up; then incarnation 1 is proven dead at boot, removed, and incarnation 2
/// boots empty.
#[test]
fn a_restarted_node_boots_no_group_before_its_metadata_caught_up() {
    run(|| async {
        let mut c = Cluster::new("reboot");
        send_committed(&c, 0xA0, &payload(0xAA, 0)).await;
        c.nodes[2].metadata.publish(view(8, 2));
        until(
            "node 2 removed incarnation 1 and hosts incarnation 2",
            || {
                c.host(2)
                    .gauges
                    .groups_removed
                    .load(std::sync::atomic::Ordering::Relaxed)
                    == 1
                    && c.host(2).hosts(group().0)
            },
        )
        .await;
        // Node 0's restart: its metadata replica recovered only up to before the purge.
        let behind = Arc::new(MetadataHandle::default());
        behind.publish(view(7, 1));
        behind.await_catch_up();
        c.restart(0, behind.clone()).await;
        // Its pump runs (peers' frames reach it and are dropped: no group is hosted) for at
        // least a hundred ticks; without the wait it boots incarnation 1 from its disk at once.
        let dropped = || {
            c.host(0)
                .gauges
                .dropped_unknown
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        for i in 0.. {
            assert!(
                !c.host(0).hosts(group().0),
                "node 0 booted a partition group from a metadata view that had not caught up"
            );
            if i >= 100 && dropped() > 0 {
                break;
            }
            assert!(i < 3000, "node 0's pump dropped no peer frame");
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        // Its metadata replica catches up: the purge is applied again, then the flag.
        behind.publish(view(8, 2));
        behind.set_caught_up();
        until(
            "node 0 removed incarnation 1 and hosts incarnation 2",
            || {
                c.host(0)
                    .gauges
                    .groups_removed
                    .load(std::sync::atomic::Ordering::Relaxed)
                    == 1
                    && c.host(0).hosts(group().0)
            },
        )
        .await;
        c.nodes[1].metadata.publish(view(8, 2));
        send_committed(&c, 0xC0, &payload(0xCC, 0)).await;
        until(
            "every node holds the later send and not the purged one",
            || {
                (0..NODES).all(|r| {
                    let (_, body) = poll_all(c.host(r));
                    holds(&body, 0xCC) && !holds(&body, 0xAA)
                })
            },
        )
        .await;
        c.stop().await;
    });
}

//! Primary affinity on the node (decision 221, spec README decision 3): three nodes' partition
//! hosts on one glommio executor (real temporary directories, an in-process network, as in
//! `partition_replicated.rs`). Each host reads its node's metadata lead through
//! `Host::set_metadata_lead`; here a cell stands for the metadata pump's gauges. When the lead
//! moves to another node, every partition group's primary follows it there, and that node's
//! host accepts and commits a SendMessages on every partition.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use consensus::{ClientRequest, Frame, RawConfig, ReplicaId, Status};
use journal::FileStorage;
use journal::wal::WalConfig;
use server::client::codec::{Name, Options};
use server::client::reply::{decode_send_reply, read_result};
use server::groups::{Partitions, ReplySink};
use server::metadata::state::{Partition, State, Stream, Topic};
use server::metadata::topic::{TopicSettings, derive};
use server::metadata::view::{MetadataHandle, MetadataReader, MetadataView};
use server::partition_group::{
    self as pg, Event, Host, Outcome, PartitionGauges, Pump, ReclaimLimits, ShardDisk, Transport,
};
use wire::{GroupId, Operation};

const LANES: u16 = 16;
const CLUSTER: u128 = 0xC1;
const N: u8 = 3;
const PARTITIONS: u32 = 4;

/// The in-process network: frames go straight into the peer's inbox; a cut node neither
/// sends nor receives.
#[derive(Default)]
struct Net {
    hosts: RefCell<Vec<Option<Rc<Host>>>>,
    cut: RefCell<BTreeSet<u8>>,
}

struct Link {
    net: Rc<Net>,
    me: u8,
}

impl Transport for Link {
    fn send(&self, peer: u8, group: GroupId, frame: &Bytes) {
        if !self.connected(peer, group) {
            return;
        }
        let host = self.net.hosts.borrow()[peer as usize].clone();
        if let Some(host) = host {
            host.inbox.push(Event::Frame {
                from: self.me,
                group: group.0,
                bytes: frame.clone(),
            });
        }
    }
    fn connected(&self, peer: u8, _: GroupId) -> bool {
        let cut = self.net.cut.borrow();
        !cut.contains(&self.me)
            && !cut.contains(&peer)
            && self.net.hosts.borrow()[peer as usize].is_some()
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
    replies: Rc<Replies>,
    _task: glommio::task::JoinHandle<Outcome>,
}

struct Cluster {
    net: Rc<Net>,
    dirs: Vec<PathBuf>,
    nodes: Vec<Node>,
    /// What each node's metadata replica leads (its gauges, in a node).
    leads: Vec<Rc<Cell<Option<u64>>>>,
}

fn group(partition: u32) -> GroupId {
    GroupId::partition(wire::PartitionKey {
        stream: 0,
        topic: 0,
        partition,
    })
    .unwrap()
}

/// A committed view with one stream and one topic of `partitions` partitions whose segments
/// flush every `flush_messages` messages.
fn view(partitions: u32, flush_messages: u32) -> MetadataView {
    let explicit = Options::default();
    let derived = derive(&explicit);
    let settings = TopicSettings {
        messages_required_to_save: flush_messages,
        ..TopicSettings::DEFAULT
    };
    let topic = Topic {
        id: 0,
        name: Name::new("t").unwrap(),
        created_at: 1,
        explicit,
        derived,
        settings,
        partitions: (0..partitions)
            .map(|id| Partition {
                id,
                created_at: 1,
                consensus_group_id: u64::from(id) + 1,
            })
            .collect(),
    };
    let stream = Stream {
        id: 0,
        name: Name::new("s").unwrap(),
        created_at: 1,
        topics: [(0, topic)].into_iter().collect(),
    };
    MetadataView {
        op: 7,
        state: State {
            streams: [(0, stream)].into_iter().collect(),
            ..State::default()
        },
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strand-partitions-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn storage(dir: &Path, sub: &str) -> FileStorage {
    let dir = dir.join(sub);
    std::fs::create_dir_all(&dir).unwrap();
    FileStorage::new(&dir, false).unwrap()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Cluster {
    fn new(name: &str) -> Cluster {
        let handle = Arc::new(MetadataHandle::default());
        handle.publish(view(PARTITIONS, 8));
        let reader = MetadataReader::new(handle);
        let net = Rc::new(Net::default());
        *net.hosts.borrow_mut() = vec![None; N as usize];
        let mut c = Cluster {
            net,
            dirs: (0..N).map(|r| temp_dir(&format!("{name}-{r}"))).collect(),
            nodes: Vec::new(),
            leads: (0..N).map(|_| Rc::new(Cell::new(None))).collect(),
        };
        for r in 0..N {
            let host = Host::new(0, 1, LANES, Arc::new(PartitionGauges::default()));
            let lead = c.leads[r as usize].clone();
            host.set_metadata_lead(Rc::new(move || lead.get()));
            let mut core = RawConfig::new(CLUSTER, ReplicaId(r), N, group(0));
            core.checkpoint_interval_ops = 8;
            let replies = Rc::new(Replies::default());
            let dir = &c.dirs[r as usize];
            let task = glommio::spawn_local(pg::run(Pump {
                host: host.clone(),
                core,
                identity: journal::Identity {
                    cluster: CLUSTER,
                    replica_id: r,
                    replica_count: N,
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
                metadata: reader.clone(),
                transport: Rc::new(Link {
                    net: c.net.clone(),
                    me: r,
                }),
                replies: replies.clone(),
                stop: Box::new(|| false),
                limits: ReclaimLimits::default(),
                ack_overrides: Default::default(),
                rejoin: false,
            }))
            .detach();
            c.net.hosts.borrow_mut()[r as usize] = Some(host.clone());
            c.nodes.push(Node {
                host,
                replies,
                _task: task,
            });
        }
        c
    }

    /// Whether every group on every node is Normal with its primary on node `r`.
    fn all_led_by(&self, r: u8) -> bool {
        self.nodes.iter().all(|node| {
            (0..PARTITIONS).all(|p| {
                node.host
                    .group_state(group(p))
                    .is_some_and(|(view, status, ..)| {
                        status == Status::Normal && view % u32::from(N) == u32::from(r)
                    })
            })
        })
    }

    fn takeovers(&self, r: u8) -> u64 {
        self.nodes[r as usize]
            .host
            .gauges
            .takeovers
            .load(Ordering::Relaxed)
    }

    /// Sends one SendMessages to every partition at node `r` and waits until each commits
    /// (a request refused or answered with a transient status is sent again).
    async fn send_everywhere(&self, r: u8, round: u64) {
        let node = &self.nodes[r as usize];
        for p in 0..PARTITIONS {
            let payload = format!("round {round} partition {p}").into_bytes();
            let client = 0x5E_0000 + u128::from(p);
            let mut committed = false;
            for attempt in 0..300u64 {
                let before = node.replies.0.borrow().len();
                let number = round * 1000 + attempt + 1;
                if node
                    .host
                    .submit(group(p), send(client, number, p, &[&payload]))
                    .is_ok()
                {
                    until("a SendMessages reply", || {
                        node.replies.0.borrow().len() > before
                    })
                    .await;
                    let (_, frame) = node.replies.0.borrow().last().cloned().unwrap();
                    let status = u32::from_le_bytes(frame.bytes()[216..220].try_into().unwrap());
                    if status == 0 {
                        let body = &frame.bytes()[256..];
                        let sent = decode_send_reply(read_result(body).unwrap().unwrap()).unwrap();
                        assert_eq!(sent.len(), 1);
                        committed = true;
                        break;
                    }
                }
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
            assert!(committed, "partition {p} never committed at node {r}");
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

fn send(client: u128, number: u64, partition: u32, payloads: &[&[u8]]) -> ClientRequest {
    let batch = consensus::build_batch(payloads);
    let body = consensus::build_send_messages_request(&batch, partition);
    ClientRequest::new(client, Operation::SendMessages, 0, number, body)
}

/// With no metadata lead anywhere the groups stay with replica 0 (view 0); when node 1's
/// metadata replica leads, every group's primary moves to node 1 and node 1 commits on every
/// partition; when the lead moves on to node 2, the primaries follow again. Only the leading
/// node takes over.
#[test]
fn partition_primaries_follow_the_metadata_primary() {
    run(|| async {
        let c = Cluster::new("affinity");
        until("every group normal under replica 0", || c.all_led_by(0)).await;
        c.send_everywhere(0, 1).await;
        assert_eq!((0..N).map(|r| c.takeovers(r)).sum::<u64>(), 0);

        c.leads[1].set(Some(4));
        until("every group led by node 1", || c.all_led_by(1)).await;
        c.send_everywhere(1, 2).await;
        assert!(
            c.takeovers(1) >= u64::from(PARTITIONS),
            "node 1 took the groups over"
        );
        assert_eq!(
            c.takeovers(0) + c.takeovers(2),
            0,
            "only the leading node takes over"
        );

        c.leads[1].set(None);
        c.leads[2].set(Some(8));
        until("every group led by node 2", || c.all_led_by(2)).await;
        c.send_everywhere(2, 3).await;
        assert!(c.takeovers(2) >= u64::from(PARTITIONS));
    });
}

//! The in-process partition cluster shared by `partition_replicated.rs` and
//! `partition_affinity.rs`: `n` nodes' partition hosts (`server::partition_group`) on one
//! glommio executor, each with its own temporary data directory (WAL and group files through
//! `journal::FileStorage`), joined by an in-process network that can cut nodes off. Groups
//! come from a committed metadata view published into a `MetadataHandle`; each host reads its
//! node's metadata lead from a cell (`Cluster::leads`) that stands for the metadata pump's
//! gauges.

#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use consensus::{ClientRequest, Frame, RawConfig, ReplicaId};
use journal::FileStorage;
use journal::wal::WalConfig;
use server::client::codec::{Name, Options};
use server::groups::ReplySink;
use server::metadata::state::{Partition, State, Stream, Topic};
use server::metadata::topic::{TopicSettings, derive};
use server::metadata::view::{MetadataHandle, MetadataReader, MetadataView};
use server::partition_group::{
    self as pg, Event, Host, Outcome, PartitionGauges, Pump, ReclaimLimits, ShardDisk, Transport,
};
use wire::{GroupId, Operation};

pub const LANES: u16 = 16;
pub const CLUSTER: u128 = 0xC1;

/// The in-process network: frames go straight into the peer's inbox; a cut node neither
/// sends nor receives.
#[derive(Default)]
pub struct Net {
    pub hosts: RefCell<Vec<Option<Rc<Host>>>>,
    pub cut: RefCell<BTreeSet<u8>>,
}

pub struct Link {
    pub net: Rc<Net>,
    pub me: u8,
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
pub struct Replies(pub RefCell<Vec<(u128, Frame)>>);

impl ReplySink for Replies {
    fn reply(&self, client: u128, frame: Frame) {
        self.0.borrow_mut().push((client, frame));
    }
}

pub struct Node {
    pub host: Rc<Host>,
    pub stop: Rc<Cell<bool>>,
    pub task: glommio::task::JoinHandle<Outcome>,
    pub replies: Rc<Replies>,
}

pub struct Cluster {
    pub n: u8,
    pub net: Rc<Net>,
    pub dirs: Vec<PathBuf>,
    pub handle: Arc<MetadataHandle>,
    pub reader: MetadataReader,
    pub nodes: Vec<Option<Node>>,
    pub wal: WalConfig,
    pub limits: ReclaimLimits,
    pub checkpoint_interval: u64,
    /// Replicas whose data directory's stamp records a rejoin (decision 240).
    pub rejoined: BTreeSet<u8>,
    /// What each node's metadata replica leads (its gauges, in a node): `None` everywhere
    /// until a test sets one.
    pub leads: Vec<Rc<Cell<Option<u64>>>>,
}

pub fn group(partition: u32) -> GroupId {
    GroupId::partition(wire::PartitionKey {
        stream: 0,
        topic: 0,
        partition,
    })
    .unwrap()
}

/// A committed view with one stream and one topic of `partitions` partitions whose segments
/// flush every `flush_messages` messages.
pub fn view(partitions: u32, flush_messages: u32) -> MetadataView {
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

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strand-partitions-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn storage(dir: &Path, sub: &str) -> FileStorage {
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
    pub fn new(name: &str, n: u8, view: MetadataView) -> Cluster {
        Cluster::new_with(name, n, view, 8)
    }

    pub fn new_with(name: &str, n: u8, view: MetadataView, checkpoint_interval: u64) -> Cluster {
        let mut c =
            Cluster::unstarted(name, n, view, checkpoint_interval, ReclaimLimits::default());
        for r in 0..n {
            c.start(r);
        }
        c
    }

    /// A cluster of `n` nodes with nothing started yet: WAL files of 64 KiB, windows of
    /// 16 KiB or 500 us.
    pub fn unstarted(
        name: &str,
        n: u8,
        view: MetadataView,
        checkpoint_interval: u64,
        limits: ReclaimLimits,
    ) -> Cluster {
        let handle = Arc::new(MetadataHandle::default());
        handle.publish(view);
        let net = Rc::new(Net::default());
        *net.hosts.borrow_mut() = vec![None; n as usize];
        Cluster {
            n,
            net,
            dirs: (0..n).map(|r| temp_dir(&format!("{name}-{r}"))).collect(),
            reader: MetadataReader::new(handle.clone()),
            handle,
            nodes: (0..n).map(|_| None).collect(),
            wal: WalConfig {
                file_size_max: 64 * 1024,
                window_bytes_max: 16 * 1024,
                window_us_max: 500,
            },
            limits,
            checkpoint_interval,
            rejoined: BTreeSet::new(),
            leads: (0..n).map(|_| Rc::new(Cell::new(None))).collect(),
        }
    }

    pub fn start(&mut self, r: u8) {
        let gauges = Arc::new(PartitionGauges::default());
        let host = Host::new(0, 1, LANES, gauges);
        let lead = self.leads[r as usize].clone();
        host.set_metadata_lead(Rc::new(move || lead.get()));
        let mut core = RawConfig::new(CLUSTER, ReplicaId(r), self.n, group(0));
        core.checkpoint_interval_ops = self.checkpoint_interval;
        let stop = Rc::new(Cell::new(false));
        let replies = Rc::new(Replies::default());
        let dir = &self.dirs[r as usize];
        let flag = stop.clone();
        let task = glommio::spawn_local(pg::run(Pump {
            host: host.clone(),
            core,
            identity: journal::Identity {
                cluster: CLUSTER,
                replica_id: r,
                replica_count: self.n,
            },
            disk: ShardDisk {
                partitions: storage(dir, "partitions"),
                wal: storage(dir, "wal"),
            },
            wal: self.wal,
            metadata: self.reader.clone(),
            transport: Rc::new(Link {
                net: self.net.clone(),
                me: r,
            }),
            replies: replies.clone(),
            stop: Box::new(move || flag.get()),
            limits: self.limits,
            ack_overrides: Default::default(),
            rejoin: self.rejoined.contains(&r),
        }))
        .detach();
        self.net.hosts.borrow_mut()[r as usize] = Some(host.clone());
        self.nodes[r as usize] = Some(Node {
            host,
            stop,
            task,
            replies,
        });
    }

    pub async fn stop(&mut self, r: u8) -> Outcome {
        self.net.hosts.borrow_mut()[r as usize] = None;
        let node = self.nodes[r as usize].take().expect("running");
        node.stop.set(true);
        node.task.await.expect("the pump ends")
    }

    /// Ends `r`'s pump and storage task wherever they are (no shutdown flush): what its disk
    /// holds is what the next start recovers.
    pub async fn crash(&mut self, r: u8) {
        self.net.hosts.borrow_mut()[r as usize] = None;
        let node = self.nodes[r as usize].take().expect("running");
        node.task.cancel();
        let _ = node.task.await;
    }

    pub fn host(&self, r: u8) -> &Rc<Host> {
        &self.nodes[r as usize].as_ref().expect("running").host
    }

    pub fn gauges(&self, r: u8) -> &PartitionGauges {
        &self.host(r).gauges
    }

    /// Reports every lane's connections to `r` up again (the sink does it in a node).
    pub fn reconnect(&self, r: u8, groups: &[GroupId]) {
        for peer in (0..self.n).filter(|&p| p != r) {
            for g in groups {
                for (a, b) in [(r, peer), (peer, r)] {
                    self.host(a).inbox.push(Event::Peer {
                        peer: b,
                        lane: shard::mapping::lane(*g, LANES),
                        connected: true,
                    });
                }
            }
        }
    }
}

pub async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if f() {
            return;
        }
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

pub fn run<F, Fut>(f: F)
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

pub fn send(client: u128, number: u64, partition: u32, payloads: &[&[u8]]) -> ClientRequest {
    let batch = consensus::build_batch(payloads);
    let body = consensus::build_send_messages_request(&batch, partition);
    ClientRequest::new(client, Operation::SendMessages, 0, number, body)
}

/// Every message of `partition` at `host` from offset 0, answered from the in-memory tail
/// (these tests stay far below the read cache): (count, current offset, the poll body).
pub fn poll_all(host: &Host, partition: u32) -> (u32, u64, Vec<u8>) {
    use server::client::codec::{Consumer, Identifier, PollingStrategy};
    use server::client::reply::PollHead;
    use server::client::request::PollMessages;
    use server::groups::Partitions;
    let request = PollMessages {
        consumer: Consumer {
            group: false,
            id: Identifier::Numeric(7),
        },
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        partition: Some(partition),
        strategy: PollingStrategy::First(0),
        count: 100_000,
        auto_commit: false,
    };
    let server::partition::PollAnswer::Ready(p) =
        host.poll(group(partition), partition, &request).unwrap()
    else {
        panic!("a poll of partition {partition} left the tail")
    };
    let (head, _) = PollHead::decode(&p.body()).unwrap();
    (p.messages_count, head.current_offset, p.body())
}

//! The client core: the listener on the node's `tcp` port on every shard (client-plane.md),
//! issue 10 item 4.
//!
//! Each shard binds the client port with `SO_REUSEPORT` (glommio's listener sets it), so the
//! kernel spreads connections over the shards; a connection stays on the shard that accepted
//! it. Per connection, lockstep (§1): read one frame, answer it with exactly one Reply or
//! Eviction, then read the next; nothing is ever written unsolicited.
//!
//! What a request becomes is `client::route` (decision 129), decided on the receiving shard
//! from the lock-free read handle on committed metadata and sessions (decision 126):
//! - answered here: Ping, the metadata reads (GetStream(s), GetTopic, GetStats,
//!   GetClusterMetadata), every refusal and eviction; Register's Argon2id check runs here too;
//! - the metadata group (Register, Logout, CreateStream, DeleteStream, CreateTopic): on shard 0
//!   straight into the pump's inbox, from other shards over the mesh to shard 0; the reply
//!   comes back through the shard's [`Registry`] (the pumps' `ReplySink`) and, for a request
//!   from another shard, the mesh's reply lane;
//! - partition work: the group's shard (`shard::mapping::shard_of`) runs it through that
//!   shard's [`Partitions`]; other shards forward it over the mesh.
//!
//! Every path ends in an answer: a request whose reply does not come within
//! [`REQUEST_DEADLINE`] (lost in a view change, a full mesh lane) is answered
//! TransientNotCommitted (57), which makes the SDK resend the same request number; the
//! metadata client table then answers a committed one from its cache.

pub mod addresses;
mod conn;
pub mod frames;
pub mod registry;
mod users;

#[cfg(test)]
mod tests;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use consensus::codes::{TRANSIENT_NOT_ACCEPTED, TRANSIENT_NOT_COMMITTED};
use consensus::{ClientRequest, Frame};
use shard::Lane;
use wire::GroupId;
use wire::header::RequestHeader;

use crate::client::answers;
use crate::client::codec::Consumer;
use crate::client::request::PollMessages;
use crate::client::status;
use crate::config::Config;
use crate::groups::{Partitions, Refused, ReplySink};
use crate::metadata::view::MetadataReader;
use crate::metrics::Gauges;
use crate::partition::PollAnswer;
use crate::shard_msg::ShardMsg;
use frames::Answer;
pub use registry::Registry;

/// How long a connection waits for a group's reply before it answers TransientNotCommitted
/// (57) itself. Well under the SDK's 30 s read timeout (client-plane.md §1), so the client
/// hears the transient answer and resends instead of dropping the connection; well above a
/// metadata commit (a few fdatasyncs and a round trip) and a view change under the default
/// timeouts, so a healthy cluster never reaches it.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// Logins (Registers past the password check, waiting for their commit) in flight per shard;
/// past it a Register is answered TransientNotAccepted (58) before its Argon2id check. Each
/// check costs the shard tens of milliseconds of CPU (OWASP parameters, decision 124) during
/// which its other connections and groups wait; the bound caps what a burst of logins can
/// take from one shard to 8 checks per metadata commit round, about 160 ms at the default
/// cost, and the SDK retries a 58.
pub const LOGINS_IN_FLIGHT_MAX: usize = 8;

/// The client plane's counters, one set per node (every shard adds to it).
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    /// Requests read.
    pub requests: AtomicU64,
    /// Connections closed for a framing violation (size out of bounds, command byte).
    pub closed_framing: AtomicU64,
    /// Sessions of closed connections that were consumer-group members, ended by a Logout
    /// this node proposed (decision 317).
    pub group_sessions_ended: AtomicU64,
    /// Connections closed because a replica command (anything but Request) arrived.
    pub closed_replica_command: AtomicU64,
    /// Connections closed for a Request header that cannot be answered (client id 0).
    pub closed_undecodable: AtomicU64,
    /// Replies no connection waited for (dropped, never written unsolicited).
    pub undeliverable: AtomicU64,
    /// Requests answered 57 by the deadline.
    pub deadline: AtomicU64,
    /// Replies for a request number the client no longer waits for (a request answered at
    /// the deadline that committed later); dropped, never delivered to the next request.
    pub stale: AtomicU64,
    /// Mesh sends refused (full or closed lane).
    pub mesh_refused: AtomicU64,
    /// Registers refused because [`LOGINS_IN_FLIGHT_MAX`] were in flight.
    pub logins_refused: AtomicU64,
    /// Partition hosts that named another shard than the mapping (answered 57).
    pub shard_disagreement: AtomicU64,
    /// Remote-client entries dropped at the registry's bound.
    pub remote_forgotten: AtomicU64,
    /// Auto-commit polls answered without their offset stored (decision 213).
    pub auto_commits_failed: AtomicU64,
    /// Polls answered 1 (Error) because their segment read failed (decision 281).
    pub poll_read_errors: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What every shard's client core shares with the node (Send + Sync).
#[derive(Clone)]
pub struct NodeInfo {
    /// The node's config (roster, ports, limits).
    pub config: Arc<Config>,
    /// The read handle on committed metadata and sessions.
    pub reader: MetadataReader,
    /// The metadata group's state as this node's pump publishes it (the primary, peers).
    pub gauges: Arc<Gauges>,
    /// The client plane's counters.
    pub counters: Arc<Counters>,
    /// When the node started (GetStats).
    pub started: SystemTime,
    /// The partition groups' gauges of every shard (GetStats' message count).
    pub partitions: Arc<Vec<Arc<crate::partition_group::PartitionGauges>>>,
    /// The peer addresses of this node's client connections (GetClient(s), decision 384).
    pub addresses: Arc<addresses::ClientAddresses>,
}

/// A partition read travelling to the group's shard.
#[derive(Debug, Clone)]
pub enum PartitionRead {
    /// PollMessages.
    Poll {
        /// The group.
        group: GroupId,
        /// The partition id.
        partition: u32,
        /// The request.
        request: PollMessages,
    },
    /// GetConsumerOffset.
    Offset {
        /// The group.
        group: GroupId,
        /// The partition id.
        partition: u32,
        /// Whose.
        consumer: Consumer,
    },
}

/// Sends a mesh message to a shard; gives it back when the lane refuses it.
pub type MeshSend = Box<dyn Fn(u16, Lane, ShardMsg) -> Result<(), ShardMsg>>;

/// Submits a request into shard 0's metadata pump.
pub type MetadataSubmit = Box<dyn Fn(ClientRequest)>;

/// One shard's client core.
pub struct ClientCore {
    shard: u16,
    shards: u16,
    lanes: u16,
    node: NodeInfo,
    max_message_size: usize,
    registry: Rc<Registry>,
    partitions: RefCell<Rc<dyn Partitions>>,
    mesh: MeshSend,
    metadata: RefCell<Option<MetadataSubmit>>,
    logins: Cell<usize>,
    round_robin: Cell<u64>,
    next_conn: Cell<u64>,
    /// Per connection, the submit and reply instants of its last partition write (decision
    /// 350), taken when its reply is written.
    partition_calls:
        RefCell<std::collections::HashMap<u64, (std::time::Instant, std::time::Instant)>>,
    /// Per connection, the stamps of its last poll (decision 420), taken when its reply is
    /// written.
    poll_calls: RefCell<std::collections::HashMap<u64, crate::timeline::PollCall>>,
}

impl ClientCore {
    /// The client core of shard `shard` of `shards`. `mesh` reaches the other shards;
    /// `partitions` is this shard's partition host. The registry's reply lane is wired here.
    pub fn new(
        shard: u16,
        shards: u16,
        node: NodeInfo,
        partitions: Rc<dyn Partitions>,
        mesh: MeshSend,
    ) -> Rc<ClientCore> {
        let registry = Rc::new(Registry::new(node.counters.clone()));
        let max_message_size =
            usize::try_from(node.config.message_bus.max_message_size).unwrap_or(usize::MAX);
        let core = Rc::new(ClientCore {
            shard,
            shards,
            lanes: node.config.cluster.replica_lanes,
            node,
            max_message_size,
            registry,
            partitions: RefCell::new(partitions),
            mesh,
            metadata: RefCell::new(None),
            logins: Cell::new(0),
            round_robin: Cell::new(0),
            next_conn: Cell::new(0),
            partition_calls: RefCell::default(),
            poll_calls: RefCell::default(),
        });
        let weak = Rc::downgrade(&core);
        core.registry
            .set_reply_lane(Box::new(move |to, client, frame| match weak.upgrade() {
                Some(core) => {
                    (core.mesh)(to, Lane::Reply, ShardMsg::Reply { client, frame }).is_ok()
                }
                None => false,
            }));
        core
    }

    /// The shard's reply registry (the `ReplySink` of its group pumps).
    pub fn registry(&self) -> Rc<Registry> {
        self.registry.clone()
    }

    /// The sink the group pumps of this shard deliver replies to.
    pub fn reply_sink(&self) -> Rc<dyn ReplySink> {
        self.registry.clone()
    }

    /// Replaces the shard's partition host (one built after the core, since it needs the
    /// core's [`ClientCore::reply_sink`]).
    pub fn set_partitions(&self, partitions: Rc<dyn Partitions>) {
        *self.partitions.borrow_mut() = partitions;
    }

    /// The shard's partition host.
    fn partitions(&self) -> Rc<dyn Partitions> {
        self.partitions.borrow().clone()
    }

    /// Shard 0: how requests reach the metadata pump (set once the pump runs).
    pub fn set_metadata(&self, submit: MetadataSubmit) {
        *self.metadata.borrow_mut() = Some(submit);
    }

    /// Serves `listener` until the task is dropped with the executor; each connection runs as
    /// a task of this shard.
    pub fn serve(self: &Rc<Self>, listener: glommio::net::TcpListener, stop: shard::StopSignal) {
        let core = self.clone();
        glommio::spawn_local(async move {
            loop {
                let accepted =
                    futures_lite::future::or(async { Some(listener.accept().await) }, async {
                        while !stop.is_set() {
                            glommio::timer::sleep(Duration::from_millis(50)).await;
                        }
                        None
                    })
                    .await;
                match accepted {
                    None => break,
                    Some(Ok(stream)) => {
                        let _ = stream.set_nodelay(true);
                        Counters::add(&core.node.counters.accepted);
                        glommio::spawn_local(conn::serve(core.clone(), stream)).detach();
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "client accept failed");
                        glommio::timer::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        })
        .detach();
    }

    /// Handles a mesh message other than a handed replica connection or a forwarded replica
    /// frame (the replica plane's).
    pub fn on_mesh(self: &Rc<Self>, message: ShardMsg) {
        match message {
            ShardMsg::Handed(_) | ShardMsg::Replica { .. } => {
                tracing::error!("a replica-plane message reached the client core; dropped");
            }
            ShardMsg::Reply { client, frame } => self.registry.deliver_local(client, frame),
            ShardMsg::Metadata { origin, request } => {
                let client = request.header.client.get();
                self.registry.remember_remote(client, origin);
                match self.metadata.borrow().as_ref() {
                    Some(submit) => submit(*request),
                    None => self.registry.reply(
                        client,
                        frames::refused(&request.header, TRANSIENT_NOT_ACCEPTED),
                    ),
                }
            }
            ShardMsg::Partition {
                origin,
                group,
                request,
            } => {
                let client = request.header.client.get();
                self.registry.remember_remote(client, origin);
                let header = request.header;
                if let Err(refused) = self.partitions().submit(group, *request) {
                    let frame = self.partition_refusal(&header, refused);
                    self.registry.reply(client, frame);
                }
            }
            ShardMsg::Read {
                origin,
                request,
                read,
            } => {
                let client = request.client.get();
                let core = self.clone();
                glommio::spawn_local(async move {
                    let (answer, times) = core.answer_read(&request, &read).await;
                    // This shard's stages of a poll answered for another one (decision 420).
                    if matches!(*read, PartitionRead::Poll { .. }) {
                        times.record();
                    }
                    let frame = answer.into_frame();
                    if (core.mesh)(origin, Lane::Reply, ShardMsg::Reply { client, frame }).is_err()
                    {
                        Counters::add(&core.node.counters.mesh_refused);
                    }
                })
                .detach();
            }
        }
    }

    fn partition_refusal(&self, header: &RequestHeader, refused: Refused) -> Frame {
        let code = match refused {
            // The partition resolved in this node's committed metadata (`route`), so a group
            // the shard does not run yet is one its pump has not booted: transient, the SDK
            // resends the same request (decision 214).
            Refused::Unknown => TRANSIENT_NOT_COMMITTED,
            // A backup: the SDK retries, then asks for the leader again (§4.1).
            Refused::NotPrimary { .. } => TRANSIENT_NOT_ACCEPTED,
            Refused::Busy => TRANSIENT_NOT_COMMITTED,
            Refused::OtherShard(_) => {
                Counters::add(&self.node.counters.shard_disagreement);
                TRANSIENT_NOT_COMMITTED
            }
        };
        frames::refused(header, code)
    }

    /// Answers a partition read on this shard, with its stages when it is a poll (decision
    /// 420).
    async fn answer_read(
        &self,
        header: &RequestHeader,
        read: &PartitionRead,
    ) -> (Answer, crate::timeline::ReadTimes) {
        let mut times = crate::timeline::ReadTimes::default();
        let answer = match read {
            PartitionRead::Poll {
                group,
                partition,
                request,
            } => {
                let started = std::time::Instant::now();
                let answer = self.partitions().poll(*group, *partition, request);
                let planned = std::time::Instant::now();
                times.machine = planned - started;
                let poll = match answer {
                    Ok(PollAnswer::Ready(poll)) => Ok(poll),
                    // Below the tail: read the segments on this shard (decision 281).
                    Ok(PollAnswer::Disk(read)) => {
                        let (poll, disk) = read.read_timed().await;
                        times.disk = disk.io;
                        times.reads = disk.reads;
                        times.kept = disk.kept;
                        times.ahead = disk.ahead;
                        // Reads ahead run on the shard beside the reply (decision 421).
                        for read_ahead in disk.started {
                            glommio::spawn_local(read_ahead).detach();
                        }
                        times.verified = planned.elapsed().saturating_sub(disk.io);
                        poll.map_err(|error| {
                            tracing::warn!(group = group.0, %error, "a poll's segment read failed");
                            Counters::add(&self.node.counters.poll_read_errors);
                            status::ERROR
                        })
                    }
                    Err(code) => Err(code),
                };
                let building = std::time::Instant::now();
                let answer = match poll {
                    Ok(poll) => {
                        let mut answer = frames::reply_parts(header, 0, &poll.head, poll.batches);
                        answer.last_offset = Some(poll.last_offset);
                        answer
                    }
                    Err(code) => frames::refused(header, code).into(),
                };
                times.built = building.elapsed();
                answer
            }
            PartitionRead::Offset {
                group,
                partition,
                consumer,
            } => match self
                .partitions()
                .consumer_offset(*group, *partition, consumer)
            {
                Ok(Some(offset)) => {
                    let mut body = Vec::with_capacity(20);
                    offset.encode(&mut body);
                    frames::reply(header, 0, &body).into()
                }
                Ok(None) => frames::reply(header, 0, &[]).into(),
                Err(code) => frames::refused(header, code).into(),
            },
        };
        (answer, times)
    }

    fn group_shard(&self, group: GroupId) -> u16 {
        shard::mapping::shard_of(group, self.lanes, self.shards)
    }

    fn cluster_metadata(&self) -> Vec<u8> {
        let config = &self.node.config;
        let n = config.cluster.nodes.len() as u8;
        let gauges = &self.node.gauges;
        let mut out = Vec::new();
        answers::cluster_metadata(config, gauges.metadata_primary(n), |peer| {
            !gauges.peer_down(peer)
        })
        .encode(&mut out);
        out
    }

    fn stats(&self) -> Vec<u8> {
        let view = self.node.reader.view();
        let mut stats = answers::stats(&view);
        let now = SystemTime::now();
        let micros = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        };
        stats.process_id = std::process::id();
        stats.start_time = micros(self.node.started);
        stats.run_time = micros(now).saturating_sub(stats.start_time);
        stats.clients_count =
            u32::try_from(self.node.counters.open.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
        stats.threads_count = u32::from(self.shards);
        stats.messages_count = self
            .node
            .partitions
            .iter()
            .map(|g| g.messages.load(Ordering::Relaxed))
            .sum();
        // This node's replicas (decision 380), as the reference reports its own partitions.
        let partitions = &self.node.partitions;
        stats.messages_size_bytes = partitions
            .iter()
            .map(|g| g.stored_bytes.load(Ordering::Relaxed))
            .sum();
        stats.segments_count = u32::try_from(
            partitions
                .iter()
                .map(|g| g.segments.load(Ordering::Relaxed))
                .sum::<u64>(),
        )
        .unwrap_or(u32::MAX);
        stats.os_name = std::env::consts::OS.to_owned();
        let mut out = Vec::new();
        stats.encode(&mut out);
        out
    }
}

/// The partition host of a shard that runs no partition groups: every partition request is
/// answered as for a partition this node does not know (client-plane.md §2.4: 20 for a
/// replicated op, 3007 for a read), never left without an answer.
#[derive(Debug, Default)]
pub struct NoPartitions;

impl Partitions for NoPartitions {
    fn submit(&self, _: GroupId, _: ClientRequest) -> Result<(), Refused> {
        Err(Refused::Unknown)
    }
    fn poll(&self, _: GroupId, _: u32, _: &PollMessages) -> Result<PollAnswer, u32> {
        Err(status::PARTITION_NOT_FOUND)
    }
    fn consumer_offset(
        &self,
        _: GroupId,
        _: u32,
        _: &Consumer,
    ) -> Result<Option<crate::client::reply::ConsumerOffsetReply>, u32> {
        Err(status::PARTITION_NOT_FOUND)
    }
}

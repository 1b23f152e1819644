//! The partition groups of one shard (issue 10 items 1 and 3 for partitions; journal.md §4,
//! §6; consensus.md §14; decisions 160-169).
//!
//! Two local tasks on the shard's executor, as for the metadata group (decisions 130-131), but
//! one of each for *all* the shard's groups:
//!
//! - the **pump** owns one [`consensus::Replica`] per partition group hosted here. It serves, in
//!   order: the stop flag, a fatal report, the 10 ms tick (re-armed after it fires; every group
//!   ticks, and the committed metadata is looked at once per tick), then at most
//!   [`TURN_EVENTS_MAX`] inbox events (replica-plane frames, storage completions, connection
//!   reports, client requests, booted groups) before it yields. Effects become peer sends
//!   (one `Bytes` per frame, shared by every peer queue), replies through the shard's
//!   [`ReplySink`], or [`PartitionStorageOp`]s queued per group;
//! - the **storage task** owns the shard's partition WAL and every group's superblock,
//!   segments and offsets file. Each group's queue runs in emission order; across groups the
//!   leading appends of every queue go into one WAL window, committed with one durable
//!   (`O_DSYNC`) write (group commit; decision 496), and only then does each get its `Appended`. A group's other
//!   operations (superblock writes, truncations, reads, segment batches, offsets, checkpoints)
//!   run after the window that held its earlier appends, one at a time.
//!
//! On disk (`DIR/shard-N/`, decision 161): `wal/` holds the WAL (`journal::wal`), its
//! durable-end record and `wal-faults.{0,1}` (`journal::boot::boot_shard`); `partitions/`
//! holds every group's files under the prefix `p{group:016x}-`: its superblock (four copies:
//! view, log view, checkpoint op, offset frontier, ...), its segments and sparse indexes
//! (`{prefix}{base:020}.log` / `.index`) and its consumer-offset ping-pong. A partition group
//! has no snapshot file: its checkpoint *is* its segments (synced), its offsets file (synced)
//! and the superblock naming the checkpoint op and offset frontier.
//!
//! Modules (files under `partition/`): `storage_task` (the storage task and each group's disk),
//! `away` (segment work apart from the WAL window), `seals` and `retire` (segment seals and
//! removed groups), `gauges` (the counters and their `/metrics` text); this file keeps the
//! pump, the hosted groups and the routing of client requests.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::{Future, poll_fn};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use consensus::{
    ClientRequest, Completion, Effect, Frame, Input, Now, Outbox, RawConfig, Recovered, Replica,
    ReplicaId, Status,
};
use journal::artifact::{OffsetStore, OffsetTable, build_manifest, install_partition};
use journal::boot::{FaultRecord, ReclaimGuard, boot_shard};
use journal::segment::{FlushPolicy, PartitionLog};
use journal::storage::Storage;
use journal::superblock::Superblock;
use journal::wal::{BodyRef, GroupReplay, PartitionWal, WalConfig, WalError};
use shard::mapping::{lane, shard_of};
use shard::pump::TICK;
use tracing::{debug, error, info, warn};
use wire::GroupId;
use wire::manifest::ArtifactKind;

use crate::boot::{core_state, incarnation, persisted_state};
use crate::client::codec::Consumer;
use crate::client::reply::ConsumerOffsetReply;
use crate::client::request::PollMessages;
use crate::client::status;
use crate::groups::{Partitions, Refused, ReplySink};
use crate::inbox_bound::InboxBound;
use crate::metadata::view::MetadataReader;
use crate::partition::PollAnswer;
use crate::partition::machine::{PartitionStateMachine, StorageWork};
use crate::partition::reader::{self, SegmentFiles, SegmentMap, SharedMap, StorageFiles};
use crate::timeline::Timeline;

/// Events one pump turn handles before it yields. One `Replica::step` costs microseconds to
/// tens of microseconds; 64 keep a turn well inside the 10 ms tick however many groups the
/// shard hosts (every group's tick is handled apart from the event budget), and keep the
/// connection readers and the storage task running during a burst.
pub const TURN_EVENTS_MAX: usize = 64;

/// Replica-plane frames (and client requests) waiting in the inbox at most; beyond, or beyond
/// [`INBOX_BYTES_MAX`](crate::inbox_bound::INBOX_BYTES_MAX) of them, a frame is dropped and
/// counted (VSR retransmits heal it) and a request is refused `Busy`.
pub const INBOX_FRAMES_MAX: usize = 8192;

/// Bytes of prepares the shard's partition groups may together have asked to append and not
/// seen complete before each of them takes a new append only into an empty backlog (decision
/// 505): the per-group bound (`appending_bytes_max`, 64 MiB) alone lets a shard of many
/// lagging groups hold that much per group. The default of
/// `partition.appending_shard_bytes_max` (decision 510); 0 there is no bound.
pub const SHARD_APPENDING_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// WAL lsns a group may hold below the WAL's durable end before the reclaim it blocks is
/// counted (`strand_reclaim_blocked_total`), the shard forces its segments synced and copies
/// the group's held entries forward. About 4096 records of a busy shard: a few WAL files.
pub const RECLAIM_LAG_WARN_LSNS: u64 = 4096;

/// WAL lsns a group may hold before its own submissions are refused `Busy` (the WAL of the
/// whole shard must not grow without bound behind one group; the others keep going).
pub const RECLAIM_LAG_BUSY_LSNS: u64 = 16_384;

/// A holding group's entries are copied forward only when the lsns that frees are at least this
/// many times the entries copied.
const COPY_FORWARD_RATIO: u64 = 8;

/// A SendMessages body at least this long is written once, ahead of its commit, at its
/// segment's tail, and the WAL holds only a reference to it (decision 414); a shorter one
/// rides whole in the WAL as before, so that a window of small prepares still costs one
/// `fdatasync` (the segment copy of a short body is written in the window but not synced:
/// the WAL holds it). 64 KiB: below it the second copy costs less than a second flush.
pub const REF_BODY_MIN: usize = 64 * 1024;

/// Durable lsns between two reclaim passes when no checkpoint asks for one.
const RECLAIM_EVERY_LSNS: u64 = 256;

/// How long the storage task must find no work before it vouches for the last window with a
/// durable-end record (decision 90 "idle", decision 351): a producer waiting for its reply leaves
/// the WAL idle between two of its batches, and an end record written in that gap is a write and
/// an `fdatasync` the next batch's window waits behind.
const END_IDLE: std::time::Duration = std::time::Duration::from_millis(20);

/// When a group holding the WAL back is acted on (decision 164).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimLimits {
    /// Counted, segments synced, entries copied forward beyond this many lsns.
    pub warn_lsns: u64,
    /// Refused `Busy` beyond this many.
    pub busy_lsns: u64,
    /// Copy a holding group's entries forward (off only in tests that watch a hold).
    pub copy_forward: bool,
}

impl Default for ReclaimLimits {
    fn default() -> Self {
        ReclaimLimits {
            warn_lsns: RECLAIM_LAG_WARN_LSNS,
            busy_lsns: RECLAIM_LAG_BUSY_LSNS,
            copy_forward: true,
        }
    }
}

/// The prefix of a group's files in the shard's partition directory.
pub fn group_prefix(group: u64) -> String {
    format!("p{group:016x}-")
}

fn group_of_prefix(name: &str) -> Option<u64> {
    let hex = name.strip_prefix('p')?.get(..16)?;
    (name.as_bytes().get(17) == Some(&b'-'))
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

#[path = "partition/gauges.rs"]
mod gauges;
pub use gauges::{PartitionGauges, render_metrics};
use gauges::{add, mark_superblock};

/// One input for the pump.
#[derive(Debug)]
pub enum Event {
    /// A replica-plane frame of `group`.
    Frame {
        /// The peer.
        from: u8,
        /// Its group.
        group: u64,
        /// The whole frame.
        bytes: Bytes,
    },
    /// A storage completion of `group`.
    Done {
        /// The group.
        group: u64,
        /// The completion.
        completion: Completion,
    },
    /// A peer's connection on `lane` came up or went down.
    Peer {
        /// The peer.
        peer: u8,
        /// The lane.
        lane: u8,
        /// Whether connected now.
        connected: bool,
    },
    /// A client request admitted by [`Partitions::submit`].
    Request {
        /// The group.
        group: u64,
        /// The request.
        request: Box<ClientRequest>,
    },
    /// A group's disk is booted: create its replica.
    Booted(Box<BootedGroup>),
    /// A group's files are removed (its deletion committed, decision 342): forget it.
    Removed {
        /// The group.
        group: u64,
    },
}

/// A group the storage task booted.
#[derive(Debug)]
pub struct BootedGroup {
    group: u64,
    recovered: Recovered,
    machine: PartitionStateMachine,
    /// The incarnation its directory records (decision 342).
    incarnation: Option<u64>,
}

/// The pump's inbox, filled by the replica plane's sink, the mesh, the client core and the
/// storage task on the same shard.
pub struct Inbox {
    events: RefCell<VecDeque<(Instant, Event)>>,
    bound: InboxBound,
    waker: Cell<Option<Waker>>,
    gauges: Arc<PartitionGauges>,
}

impl Inbox {
    /// An empty inbox counting into `gauges`.
    pub fn new(gauges: Arc<PartitionGauges>) -> Inbox {
        Inbox {
            events: RefCell::default(),
            bound: InboxBound::new(INBOX_FRAMES_MAX),
            waker: Cell::new(None),
            gauges,
        }
    }

    /// Queues an event; a frame or request beyond [`INBOX_FRAMES_MAX`] or the inbox's byte
    /// bound is refused (`false`).
    pub fn push(&self, event: Event) -> bool {
        if let Some(len) = bounded_len(&event)
            && !self.bound.admit(len)
        {
            if matches!(event, Event::Frame { .. }) {
                add(&self.gauges.dropped_full, 1);
            }
            return false;
        }
        self.events.borrow_mut().push_back((Instant::now(), event));
        self.wake();
        true
    }

    /// The oldest event and when it was pushed.
    fn pop(&self) -> Option<(Instant, Event)> {
        let (at, event) = self.events.borrow_mut().pop_front()?;
        if let Some(len) = bounded_len(&event) {
            self.bound.release(len);
        }
        Some((at, event))
    }

    fn wake(&self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// The bytes an event counts against the inbox's bounds: frames and requests (a request's
/// body), `None` for what is never refused.
fn bounded_len(event: &Event) -> Option<usize> {
    match event {
        Event::Frame { bytes, .. } => Some(bytes.len()),
        Event::Request { request, .. } => Some(request.body.len()),
        _ => None,
    }
}

/// How the pump reaches peers: the replica plane in a node, an in-process network in tests.
pub trait Transport {
    /// Queues `frame` of `group` for `peer` (a full queue or a missing connection is counted by
    /// the implementation; VSR retransmits heal it).
    fn send(&self, peer: u8, group: GroupId, frame: &Bytes);
    /// Whether `peer` is reachable on `group`'s lane now.
    fn connected(&self, peer: u8, group: GroupId) -> bool;
}

/// The replica plane as a [`Transport`].
pub struct PlaneTransport {
    /// The shard's plane.
    pub plane: Rc<shard::net::Plane>,
    /// `cluster.replica_lanes`.
    pub lanes: u16,
}

impl Transport for PlaneTransport {
    fn send(&self, peer: u8, group: GroupId, frame: &Bytes) {
        let _ = self.plane.send(peer, group, frame);
    }
    fn connected(&self, peer: u8, group: GroupId) -> bool {
        self.plane.is_connected(peer, lane(group, self.lanes))
    }
}

/// A storage effect of one group, in its queue (its checkpoint and machine work differ from
/// the metadata plane's [`crate::metadata_group::MetadataStorageOp`]).
#[derive(Debug)]
pub enum PartitionStorageOp {
    /// `Effect::Append`.
    Append {
        /// The op.
        op: u64,
        /// The prepare.
        frame: Frame,
    },
    /// `Effect::Truncate`.
    Truncate {
        /// First op removed.
        from_op: u64,
    },
    /// `Effect::PersistVsrState`.
    Persist(consensus::VsrState),
    /// `Effect::Read`.
    Read {
        /// The op.
        op: u64,
        /// Its expected identity.
        checksum: u128,
    },
    /// Work the state machine recorded at apply or install.
    Machine(StorageWork),
    /// `Effect::Checkpoint`, with what the checkpoint records, taken at emission.
    Checkpoint {
        /// The op.
        op: u64,
        /// `(checksum, timestamp)` of the prepare at `op` (decision 52).
        prepare: (u128, u64),
        /// The offsets table at `op`.
        offsets: OffsetTable,
        /// The next offset at `op` (the superblock's `offset_frontier`).
        frontier: u64,
        /// Whether the replica was in lost state at emission.
        lost_state: bool,
    },
}

#[derive(Default)]
struct Queues {
    groups: RefCell<BTreeMap<u64, VecDeque<PartitionStorageOp>>>,
    boots: RefCell<VecDeque<(u64, FlushPolicy)>>,
    /// Groups whose deletion committed, to remove before the next boots (decision 342).
    removals: RefCell<VecDeque<u64>>,
    /// A submission was refused `Busy`: run a reclaim pass even without new WAL records (the
    /// refused group cannot write, so nothing else would).
    recheck: Cell<bool>,
    /// Segment seals finished apart from the task (decision 355), to apply.
    seals: RefCell<Vec<(u64, journal::segment::SealDone)>>,
    /// Groups whose disk is away running a window's segment work (decision 440): their queues
    /// wait and are not work.
    away: RefCell<BTreeSet<u64>>,
    /// Groups back from their segment work, not taken in yet.
    back: Cell<usize>,
    /// Groups whose leading append's body went to its segment while a WAL window was being
    /// committed, ahead of the append's own window (decision 480): the append's op and the
    /// reference its WAL record carries. That append may be taken into a window while its
    /// group is still away, so such a queue is work.
    early: RefCell<BTreeMap<u64, (u64, Option<BodyRef>)>>,
    waker: Cell<Option<Waker>>,
    closed: Cell<bool>,
}

impl Queues {
    fn push(&self, group: u64, op: PartitionStorageOp) {
        self.groups
            .borrow_mut()
            .entry(group)
            .or_default()
            .push_back(op);
        self.wake();
    }

    fn boot(&self, group: u64, policy: FlushPolicy) {
        self.boots.borrow_mut().push_back((group, policy));
        self.wake();
    }

    fn wake(&self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    /// Queues the removal of a group whose replica the pump dropped; its queued storage work
    /// goes (nothing of a dead incarnation may reach a later one's files).
    fn remove(&self, group: u64) {
        self.groups.borrow_mut().remove(&group);
        self.removals.borrow_mut().push_back(group);
        self.wake();
    }

    fn is_idle(&self) -> bool {
        let away = self.away.borrow();
        let early = self.early.borrow();
        !self.recheck.get()
            && self.back.get() == 0
            && self.seals.borrow().is_empty()
            && self.removals.borrow().is_empty()
            && self.boots.borrow().is_empty()
            && self
                .groups
                .borrow()
                .iter()
                .all(|(g, q)| q.is_empty() || (away.contains(g) && !early.contains_key(g)))
    }

    /// Resolves when there is work, or `false` once closed and drained.
    fn ready(&self) -> impl Future<Output = bool> + '_ {
        poll_fn(|cx| {
            if !self.is_idle() {
                return Poll::Ready(true);
            }
            if self.closed.get() && self.away.borrow().is_empty() {
                return Poll::Ready(false);
            }
            self.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        })
    }
}

#[path = "partition/storage_task.rs"]
mod storage_task;
pub use storage_task::ShardDisk;
use storage_task::*;

/// One hosted group in the pump.
struct Hosted {
    replica: Replica<PartitionStateMachine>,
    lane: u8,
    /// The incarnation its directory records (decision 342).
    incarnation: Option<u64>,
    /// The client requests submitted to it and not answered yet, by client id (one each: a
    /// client waits for one request at a time). Answered 57 if the group is dropped
    /// (decision 377).
    waiting: BTreeMap<u128, wire::header::RequestHeader>,
}

/// The partition groups of one shard, as the pump, the sink and the client core see them.
pub struct Host {
    shard: u16,
    shards: u16,
    lanes: u16,
    /// The inbox the sink, the mesh and the storage task fill.
    pub inbox: Rc<Inbox>,
    groups: RefCell<BTreeMap<u64, Hosted>>,
    busy: Rc<RefCell<BTreeSet<u64>>>,
    /// The storage task's queues, once the pump runs.
    queues: RefCell<Option<Rc<Queues>>>,
    /// This shard's counters.
    pub gauges: Arc<PartitionGauges>,
    /// Primary affinity's source (decision 221): the view in which this node's metadata
    /// replica is the primary of a normal view, `None` otherwise. Unset: no affinity.
    metadata_lead: RefCell<Option<MetadataLead>>,
    /// Each group's in-memory tail budget (`partition.read_cache_bytes`, decision 280).
    read_cache_bytes: Cell<usize>,
    /// Every group's tails on this shard together (`partition.read_cache_shard_bytes`,
    /// decision 424).
    read_cache_shard_bytes: Cell<usize>,
    /// The shard's bound on its groups' incomplete appends together
    /// (`partition.appending_shard_bytes_max`, decision 510); 0 is none.
    appending_shard_bytes_max: Cell<u64>,
    /// What each group's tail may hold now: the per-group budget, or the shard's split over
    /// the hosted groups when that is less (decision 424). Every machine of the shard reads
    /// it when it evicts; the pump sets it at every tick.
    tail_share: Rc<Cell<usize>>,
    /// The committed metadata, once the pump runs: a hosted incarnation it proves dead (a
    /// purge or delete applied, the pump's tick not yet) serves no client (decision 346).
    metadata: RefCell<Option<MetadataReader>>,
    /// Where each op's time goes (decision 350).
    pub timeline: Rc<Timeline>,
}

/// Reads, lock-free, the view in which this node's metadata replica is the Normal primary
/// (`None` while it is not); the node reads the metadata pump's gauges.
pub type MetadataLead = Rc<dyn Fn() -> Option<u64>>;

/// Primary affinity in the partition pump (decision 221, spec README decision 3): once this
/// node's metadata replica has led one normal view for `heartbeat_timeout` ticks, each hosted
/// group whose primary is elsewhere is asked to take over, at most once per
/// `heartbeat_timeout` per group (`Replica::take_over` itself backs off after setbacks).
#[derive(Debug, Default)]
struct Affinity {
    /// The led view and the tick it was first seen.
    lead: Option<(u64, u64)>,
    /// The tick of each group's last call.
    tried: BTreeMap<u64, u64>,
}

impl Affinity {
    /// The groups to call `take_over` for at tick `tick`, given the lead read now.
    fn due(
        &mut self,
        tick: u64,
        lead: Option<u64>,
        heartbeat_timeout: u64,
        backups: impl Iterator<Item = u64>,
    ) -> Vec<u64> {
        self.lead = match (lead, self.lead) {
            (Some(view), Some((led, since))) if view == led => Some((led, since)),
            (Some(view), _) => Some((view, tick)),
            (None, _) => None,
        };
        let Some((_, since)) = self.lead else {
            return Vec::new();
        };
        if tick < since + heartbeat_timeout {
            return Vec::new();
        }
        backups
            .filter(|group| {
                let due = self
                    .tried
                    .get(group)
                    .is_none_or(|last| tick >= last + heartbeat_timeout);
                if due {
                    self.tried.insert(*group, tick);
                }
                due
            })
            .collect()
    }
}

impl Host {
    /// Makes the pump pull its groups' primaries to this node while `lead` says this node's
    /// metadata replica leads (decision 221).
    pub fn set_metadata_lead(&self, lead: MetadataLead) {
        *self.metadata_lead.borrow_mut() = Some(lead);
    }

    /// The shard-wide tail budget (decision 424).
    pub fn set_read_cache_shard_bytes(&self, bytes: usize) {
        self.read_cache_shard_bytes.set(bytes);
    }

    /// Sets each group's in-memory tail budget (decision 280); takes effect for groups booted
    /// after the call (the node sets it before the pump runs).
    pub fn set_read_cache_bytes(&self, bytes: usize) {
        self.read_cache_bytes.set(bytes);
    }

    /// Sets the shard's bound on its groups' incomplete appends together (decision 510; 0 is
    /// none); the pump reads it at every tick.
    pub fn set_appending_shard_bytes_max(&self, bytes: u64) {
        self.appending_shard_bytes_max.set(bytes);
    }

    /// Bytes of committed batches the shard's groups hold in memory.
    pub fn cache_bytes(&self) -> usize {
        self.groups
            .borrow()
            .values()
            .map(|h| h.replica.state_machine().cache_bytes())
            .sum()
    }

    /// The host of shard `shard` of `shards` with `lanes` replica lanes.
    pub fn new(shard: u16, shards: u16, lanes: u16, gauges: Arc<PartitionGauges>) -> Rc<Host> {
        Rc::new(Host {
            shard,
            shards,
            lanes,
            inbox: Rc::new(Inbox::new(gauges.clone())),
            groups: RefCell::default(),
            busy: Rc::default(),
            queues: RefCell::default(),
            read_cache_bytes: Cell::new(crate::partition::machine::READ_CACHE_BYTES),
            read_cache_shard_bytes: Cell::new(crate::partition::machine::READ_CACHE_SHARD_BYTES),
            appending_shard_bytes_max: Cell::new(SHARD_APPENDING_BYTES_MAX),
            tail_share: Rc::new(Cell::new(crate::partition::machine::READ_CACHE_BYTES)),
            gauges,
            metadata_lead: RefCell::default(),
            metadata: RefCell::default(),
            timeline: Rc::default(),
        })
    }

    /// Whether `group` is hosted here now.
    pub fn hosts(&self, group: u64) -> bool {
        self.groups.borrow().contains_key(&group)
    }

    /// The shard of this node that owns `group`.
    pub fn shard_of(&self, group: GroupId) -> u16 {
        shard_of(group, self.lanes, self.shards)
    }

    /// `(view, status, commit_min, op, next_offset)` of a hosted group (tests, metrics).
    pub fn group_state(&self, group: GroupId) -> Option<(u32, Status, u64, u64, u64)> {
        self.groups.borrow().get(&group.0).map(|h| {
            let r = &h.replica;
            (
                r.view(),
                r.status(),
                r.commit_min(),
                r.op(),
                r.next_offset(),
            )
        })
    }

    /// Whether a hosted group runs in lost state (it may have acknowledged prepares its disk no
    /// longer holds; decision 73).
    pub fn is_lost_state(&self, group: GroupId) -> Option<bool> {
        self.groups
            .borrow()
            .get(&group.0)
            .map(|h| h.replica.is_lost_state())
    }

    /// State transfers a hosted group installed since it booted.
    pub fn transfers_installed(&self, group: GroupId) -> Option<u64> {
        self.groups
            .borrow()
            .get(&group.0)
            .map(|h| h.replica.transfers_installed())
    }

    fn with_group<T>(
        &self,
        group: GroupId,
        f: impl FnOnce(&Replica<PartitionStateMachine>) -> T,
    ) -> Result<T, Refused> {
        let owner = self.shard_of(group);
        if owner != self.shard {
            return Err(Refused::OtherShard(owner));
        }
        let groups = self.groups.borrow();
        let hosted = groups.get(&group.0).ok_or(Refused::Unknown)?;
        // Not booted yet, as far as the client may tell: its next incarnation comes.
        if self.is_dead(group.0, hosted.incarnation) {
            return Err(Refused::Unknown);
        }
        Ok(f(&hosted.replica))
    }

    /// Whether the committed metadata proves incarnation `incarnation` of `group` dead
    /// (decisions 342, 347): it then serves no client and takes no step (decision 376).
    fn is_dead(&self, group: u64, incarnation: Option<u64>) -> bool {
        self.metadata.borrow().as_ref().is_some_and(|metadata| {
            crate::partition::lifecycle::verdict(&metadata.view().state, group, incarnation)
                == crate::partition::lifecycle::Verdict::Dead
        })
    }
}

/// The status of a read refused by the host. The client core asks only for partitions its
/// committed metadata names, so a group of this shard not running is one the pump has not
/// booted yet: transient, the SDK resends (decision 214).
fn refused_code(refused: Refused) -> u32 {
    match refused {
        Refused::Unknown => consensus::codes::TRANSIENT_NOT_COMMITTED,
        Refused::OtherShard(_) => status::PARTITION_NOT_FOUND,
        _ => status::ERROR,
    }
}

impl Partitions for Host {
    fn submit(&self, group: GroupId, request: ClientRequest) -> Result<(), Refused> {
        self.with_group(group, |r| {
            if !r.is_primary() || r.status() != Status::Normal {
                let view = r.view();
                return Err(Refused::NotPrimary {
                    view,
                    primary: r.primary_index(view).0,
                });
            }
            Ok(())
        })??;
        if self.busy.borrow().contains(&group.0) {
            if let Some(queues) = self.queues.borrow().as_ref() {
                queues.recheck.set(true);
                queues.wake();
            }
            return Err(Refused::Busy);
        }
        let header = request.header;
        if !self.inbox.push(Event::Request {
            group: group.0,
            request: Box::new(request),
        }) {
            return Err(Refused::Busy);
        }
        if let Some(hosted) = self.groups.borrow_mut().get_mut(&group.0) {
            hosted.waiting.insert(header.client.get(), header);
        }
        Ok(())
    }

    fn poll(
        &self,
        group: GroupId,
        partition: u32,
        request: &PollMessages,
    ) -> Result<PollAnswer, u32> {
        self.with_group(group, |r| r.state_machine().poll(partition, request))
            .map_err(refused_code)?
    }

    fn consumer_offset(
        &self,
        group: GroupId,
        partition: u32,
        consumer: &Consumer,
    ) -> Result<Option<ConsumerOffsetReply>, u32> {
        self.with_group(group, |r| {
            r.state_machine().consumer_offset(partition, consumer)
        })
        .map_err(refused_code)
    }
}

/// What the committed metadata says about one partition group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSpec {
    /// Its topic's flush policy.
    pub policy: FlushPolicy,
    /// Its topic's `[[partition.topic]]` ack override (`true`: memory), if any.
    pub memory_ack: Option<bool>,
}

/// Per-topic ack overrides, `(stream name, topic name) -> memory ack`.
pub type AckOverrides = BTreeMap<(String, String), bool>;

/// The partition groups this shard must run according to the committed metadata, with each
/// topic's flush policy and ack override.
pub fn wanted_groups(
    reader: &MetadataReader,
    shard: u16,
    lanes: u16,
    shards: u16,
    overrides: &AckOverrides,
) -> BTreeMap<u64, GroupSpec> {
    let view = reader.view();
    let mut out = BTreeMap::new();
    for stream in view.state.streams.values() {
        for topic in stream.topics.values() {
            let s = &topic.settings;
            let policy = FlushPolicy {
                enforce_fsync: s.enforce_fsync,
                messages_required_to_save: u64::from(s.messages_required_to_save).max(1),
                size_of_messages_required_to_save: s.size_of_messages_required_to_save.max(1),
                segment_size: s.segment_size.max(1),
            };
            let key = (
                stream.name.as_str().to_owned(),
                topic.name.as_str().to_owned(),
            );
            let memory_ack = overrides.get(&key).copied();
            for partition in &topic.partitions {
                let Some(group) = topic.group(stream.id, partition.id) else {
                    continue;
                };
                if shard_of(group, lanes, shards) == shard {
                    out.insert(group.0, GroupSpec { policy, memory_ack });
                }
            }
        }
    }
    out
}

/// How the pump ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Stopped; committed data flushed.
    Stopped,
    /// A fatal failure; the node must exit with [`crate::EXIT_FATAL`].
    Fatal(String),
}

/// Everything the shard's partition pump needs.
pub struct Pump<S: Storage> {
    /// The shard's host (shared with the sink and the client core).
    pub host: Rc<Host>,
    /// The core's config template (its `group` is replaced per group).
    pub core: RawConfig,
    /// The durable identity of this replica.
    pub identity: journal::Identity,
    /// The shard's disks.
    pub disk: ShardDisk<S>,
    /// WAL sizing.
    pub wal: WalConfig,
    /// Committed metadata: which groups to run.
    pub metadata: MetadataReader,
    /// Peers.
    pub transport: Rc<dyn Transport>,
    /// Client replies.
    pub replies: Rc<dyn ReplySink>,
    /// The node's stop flag (`StopSignal::is_set` in a node).
    pub stop: Box<dyn Fn() -> bool>,
    /// When a group holding the WAL is acted on.
    pub limits: ReclaimLimits,
    /// `[[partition.topic]]` ack overrides.
    pub ack_overrides: AckOverrides,
    /// The data directory's stamp records a rejoin (decision 240): a group that boots without
    /// a superblock state boots in lost state.
    pub rejoin: bool,
}

/// Opens the shard's WAL and the groups with state on disk, then runs every partition group of
/// the shard until the stop flag (committed data flushed) or a fatal failure.
pub async fn run<S: Storage + Clone + 'static>(pump: Pump<S>) -> Outcome {
    let Pump {
        host,
        core,
        identity,
        disk,
        wal,
        metadata,
        transport,
        replies,
        stop,
        limits,
        ack_overrides,
        rejoin,
    } = pump;
    *host.metadata.borrow_mut() = Some(metadata.clone());
    // Groups with a superblock here, and their checkpoint op (durable outside the WAL).
    let mut on_disk: BTreeMap<u64, u64> = BTreeMap::new();
    match disk.partitions.list().await {
        Ok(names) => {
            for group in names.iter().filter_map(|n| group_of_prefix(n)) {
                on_disk.entry(group).or_insert(0);
            }
        }
        Err(e) => return Outcome::Fatal(format!("listing the partition directory: {e}")),
    }
    for (group, floor) in on_disk.iter_mut() {
        match Superblock::open(disk.partitions.clone(), &group_prefix(*group), identity).await {
            Ok(sb) => *floor = sb.state().map_or(0, |s| s.checkpoint_op),
            Err(e) => {
                error!(group, error = %e, "partition superblock unreadable; the group stays down");
            }
        }
    }
    let booted = match boot_shard(disk.wal.clone(), wal, &on_disk).await {
        Ok(b) => b,
        Err(e) => return Outcome::Fatal(format!("the shard's partition WAL: {e}")),
    };
    info!(
        shard = host.shard,
        floor = booted.wal.floor(),
        durable = booted.wal.durable_lsn(),
        groups = on_disk.len(),
        faulty = booted.faults.faulty().len(),
        "partition WAL recovered"
    );
    let queues = Rc::new(Queues::default());
    *host.queues.borrow_mut() = Some(queues.clone());
    let fatal: Rc<RefCell<Option<String>>> = Rc::new(RefCell::new(None));
    let mut wanted = wanted_groups(
        &metadata,
        host.shard,
        host.lanes,
        host.shards,
        &ack_overrides,
    );
    let mut seen_op = metadata.view().op;
    // A group was removed: the next tick looks at the metadata again even if its op did not
    // move (a purge's new incarnation of the key boots then, whichever read saw it first).
    let mut rescan = false;
    // Groups with state on disk boot now (their topic's policy when the metadata knows it).
    // A group removed after its deletion replays to nothing (decision 342): not booted for that.
    let replayed: Vec<u64> = booted
        .replay
        .groups
        .iter()
        .filter(|(_, ops)| !ops.is_empty())
        .map(|(group, _)| *group)
        .collect();
    let mut requested: BTreeSet<u64> = BTreeSet::new();
    // Decision 397: nothing boots before the metadata caught up in this process life (a view
    // behind a purge or delete this node applied before a crash would boot the dead
    // incarnation); until then the tick retries, and frames for groups not hosted are dropped.
    let mut waiting: Option<Vec<u64>> =
        Some(on_disk.keys().chain(replayed.iter()).copied().collect());
    if metadata.caught_up() {
        boot_initial(
            &queues,
            &mut requested,
            &mut waiting,
            &metadata,
            &host,
            &ack_overrides,
            &mut wanted,
            &mut seen_op,
        );
    } else {
        info!(
            shard = host.shard,
            "partition groups wait for the metadata replica to catch up"
        );
    }
    let task = StorageTask {
        partitions: disk.partitions,
        identity,
        wal: booted.wal,
        guard: ReclaimGuard::default(),
        faults: booted.faults,
        replay: booted.replay,
        groups: BTreeMap::new(),
        queues: queues.clone(),
        inbox: host.inbox.clone(),
        fatal: fatal.clone(),
        gauges: host.gauges.clone(),
        busy: host.busy.clone(),
        started: Instant::now(),
        limits,
        last_reclaim_at: 0,
        rejoin,
        metadata: metadata.clone(),
        read_cache_bytes: host.read_cache_bytes.get(),
        tail_share: host.tail_share.clone(),
        timeline: host.timeline.clone(),
        retiring: Rc::default(),
        away: away::AwayShared::new(
            queues.clone(),
            host.inbox.clone(),
            host.timeline.clone(),
            fatal.clone(),
        ),
        late: BTreeMap::new(),
        late_open: false,
    };
    let storage = glommio::spawn_local(task.run());
    let mut out = Outbox::new();
    let mut ticks = 0u64;
    let mut affinity = Affinity::default();
    let mut next_tick = Instant::now() + TICK;
    let mut exec = Executor {
        transport,
        replies,
        queues: queues.clone(),
        fatal: fatal.clone(),
        pending_replies: Vec::new(),
        timeline: host.timeline.clone(),
    };
    let outcome = loop {
        if stop() {
            break Outcome::Stopped;
        }
        if let Some(cause) = fatal.borrow().clone() {
            break Outcome::Fatal(cause);
        }
        if Instant::now() >= next_tick {
            ticks += 1;
            let at = now(ticks);
            {
                let mut groups = host.groups.borrow_mut();
                let (appending, pressed) = consensus::apply_storage_pressure(
                    groups.values_mut().map(|h| &mut h.replica),
                    host.appending_shard_bytes_max.get(),
                );
                host.gauges
                    .appending_bytes
                    .store(appending, Ordering::Relaxed);
                if pressed {
                    add(&host.gauges.pressure_ticks, 1);
                }
                for (group, hosted) in groups.iter_mut() {
                    let _ = hosted.replica.step(at, Input::Tick, &mut out);
                    exec.run(*group, &hosted.replica, &mut out);
                }
                let lead = host.metadata_lead.borrow().as_ref().and_then(|lead| lead());
                let backups = groups
                    .iter()
                    .filter(|(_, h)| {
                        h.replica.status() == Status::Normal && !h.replica.is_primary()
                    })
                    .map(|(group, _)| *group);
                for group in affinity.due(ticks, lead, core.heartbeat_timeout_ticks, backups) {
                    let Some(hosted) = groups.get_mut(&group) else {
                        continue;
                    };
                    match hosted.replica.take_over(at, &mut out) {
                        Ok(view) => {
                            add(&host.gauges.takeovers, 1);
                            info!(group, view, "taking over the primary (affinity)");
                        }
                        Err(why) => debug!(group, ?why, "take-over refused"),
                    }
                    exec.run(group, &hosted.replica, &mut out);
                }
            }
            exec.deliver(&host);
            // Hosted groups whose incarnation the committed metadata deleted stop now and
            // leave the disk (decision 342).
            for group in dead_groups(&host, &metadata) {
                let removed = host.groups.borrow_mut().remove(&group);
                // Its requests in flight are answered now, once (decision 377).
                if let Some(hosted) = removed {
                    exec.answer_dropped(&host.gauges, hosted.waiting);
                }
                requested.remove(&group);
                queues.remove(group);
                host.timeline.forget(group, 0);
                info!(
                    group = format!("{group:#x}"),
                    "partition group deleted; removing it"
                );
            }
            if waiting.is_some() && metadata.caught_up() {
                boot_initial(
                    &queues,
                    &mut requested,
                    &mut waiting,
                    &metadata,
                    &host,
                    &ack_overrides,
                    &mut wanted,
                    &mut seen_op,
                );
            }
            // The committed metadata, once per tick: new groups of this shard boot.
            let op = metadata.view().op;
            if waiting.is_none() && (op != seen_op || std::mem::take(&mut rescan)) {
                seen_op = op;
                wanted = wanted_groups(
                    &metadata,
                    host.shard,
                    host.lanes,
                    host.shards,
                    &ack_overrides,
                );
                for (group, spec) in &wanted {
                    if requested.insert(*group) {
                        queues.boot(*group, spec.policy);
                    }
                }
            }
            observe(&host);
            next_tick = Instant::now() + TICK;
            continue;
        }
        let mut handled = 0;
        while handled < TURN_EVENTS_MAX {
            let Some((arrived, event)) = host.inbox.pop() else {
                break;
            };
            handled += 1;
            if let Event::Removed { group } = event {
                // Booted again if the metadata wants this key (a later incarnation).
                requested.remove(&group);
                rescan = true;
                continue;
            }
            host.timeline.stepping(arrived, is_prepare(&event));
            handle(
                &host,
                &core,
                &wanted,
                &mut exec,
                event,
                now(ticks),
                &mut out,
            );
            host.timeline.stepped();
            exec.deliver(&host);
            if fatal.borrow().is_some() {
                break;
            }
        }
        if handled > 0 {
            observe(&host);
            glommio::executor().yield_now().await;
            continue;
        }
        // Nothing is waiting: the running log hashes this turn's commits left owing are paid
        // now, one batch per turn, so a reply never waits behind a hash (decision 493).
        if host
            .groups
            .borrow()
            .values()
            .any(|hosted| hosted.replica.state_machine().hash_owed())
        {
            glommio::executor().yield_now().await;
            continue;
        }
        let wait = next_tick.saturating_duration_since(Instant::now());
        let mut timer = std::pin::pin!(glommio::timer::Timer::new(wait));
        let inbox = &host.inbox;
        poll_fn(|cx| {
            if !inbox.events.borrow().is_empty() || fatal.borrow().is_some() {
                return Poll::Ready(());
            }
            inbox.waker.set(Some(cx.waker().clone()));
            timer.as_mut().poll(cx).map(|_| ())
        })
        .await;
    };
    // Queued storage finishes, then the committed data is synced (SIGTERM flush).
    queues.closed.set(true);
    queues.wake();
    storage.await;
    observe(&host);
    match fatal.borrow().clone() {
        Some(cause) => Outcome::Fatal(cause),
        None => outcome,
    }
}

/// The boot of the groups found on the disk and of those the metadata wants, once the
/// metadata caught up (decision 397): the storage task proves each against this view before
/// it boots it, so an incarnation the node's metadata had retired before a crash is removed,
/// not run.
#[allow(clippy::too_many_arguments)]
fn boot_initial(
    queues: &Queues,
    requested: &mut BTreeSet<u64>,
    waiting: &mut Option<Vec<u64>>,
    metadata: &MetadataReader,
    host: &Host,
    overrides: &AckOverrides,
    wanted: &mut BTreeMap<u64, GroupSpec>,
    seen_op: &mut u64,
) {
    let Some(found) = waiting.take() else {
        return;
    };
    *seen_op = metadata.view().op;
    *wanted = wanted_groups(metadata, host.shard, host.lanes, host.shards, overrides);
    for group in found.iter().chain(wanted.keys()) {
        if requested.insert(*group) {
            let policy = wanted.get(group).map(|s| s.policy).unwrap_or_default();
            queues.boot(*group, policy);
        }
    }
}

/// Steps the group an event belongs to (a frame of a group not hosted is counted and dropped).
fn handle(
    host: &Host,
    core: &RawConfig,
    wanted: &BTreeMap<u64, GroupSpec>,
    exec: &mut Executor,
    event: Event,
    at: Now,
    out: &mut Outbox,
) {
    let mut groups = host.groups.borrow_mut();
    // An incarnation the committed metadata proves dead (a purge or delete applied here, the
    // tick's removal not yet) takes nothing more: no frame, request or completion moves it,
    // so it neither acknowledges a peer's prepare nor commits a send (decision 376).
    let dead = |group: u64, h: &Hosted| host.is_dead(group, h.incarnation);
    match event {
        Event::Frame { group, .. } | Event::Request { group, .. } | Event::Done { group, .. }
            if groups.get(&group).is_some_and(|h| dead(group, h)) =>
        {
            if matches!(event, Event::Frame { .. }) {
                add(&host.gauges.fenced, 1);
            }
        }
        Event::Frame { from, group, bytes } => {
            if let Some(h) = groups.get_mut(&group) {
                let command = bytes.get(60).copied().unwrap_or(0);
                // Shared, not borrowed: a prepare is journaled, queued to the next hop and
                // applied from these bytes without a copy (decision 264).
                let input = Input::SharedFrame {
                    from: ReplicaId(from),
                    frame: Frame::new(bytes),
                };
                let skipped = h.replica.prepares_skipped_behind();
                match h.replica.step(at, input, out) {
                    // Another incarnation of this key (decision 375).
                    Err(consensus::Ignored::Group) => add(&host.gauges.fenced, 1),
                    Err(reason) => debug!(group, from, command, ?reason, "replica frame ignored"),
                    Ok(()) => {}
                }
                // Counted by the core: a step that skips a prepare may also commit, and
                // report that (decision 504).
                add(
                    &host.gauges.appending_behind,
                    h.replica.prepares_skipped_behind() - skipped,
                );
                exec.run(group, &h.replica, out);
            } else {
                add(&host.gauges.dropped_unknown, 1);
            }
        }
        Event::Done { group, completion } => {
            if let Completion::Appended { op, .. } = completion {
                host.timeline.fed(group, op);
            }
            if let Some(h) = groups.get_mut(&group) {
                let _ = h.replica.step(at, Input::Done(completion), out);
                exec.run(group, &h.replica, out);
            }
        }
        Event::Request { group, request } => {
            if let Some(h) = groups.get_mut(&group) {
                let result = h.replica.step(at, Input::Request(*request), out);
                if let Err(e) = result {
                    debug!(group, ?e, "partition request not admitted");
                }
                exec.run(group, &h.replica, out);
            }
        }
        Event::Peer {
            peer,
            lane: l,
            connected,
        } => {
            for (group, h) in groups.iter_mut().filter(|(_, h)| h.lane == l) {
                let input = Input::PeerConnection {
                    peer: ReplicaId(peer),
                    connected,
                };
                let _ = h.replica.step(at, input, out);
                exec.run(*group, &h.replica, out);
            }
        }
        Event::Removed { .. } => {}
        Event::Booted(b) => {
            let BootedGroup {
                group,
                recovered,
                machine,
                incarnation,
            } = *b;
            let mut raw = core.clone();
            // The group's identity on the wire carries its incarnation: frames of another
            // incarnation of the key are ignored by the core (decision 375).
            raw.group = match incarnation {
                Some(id) => {
                    GroupId(group).with_tag(crate::partition::lifecycle::incarnation_tag(id))
                }
                None => GroupId(group),
            };
            // The topic's ack override (spec README decision 4); memory ack needs 3 replicas.
            if let Some(memory) = wanted.get(&group).and_then(|s| s.memory_ack) {
                raw.memory_ack = memory && raw.replica_count >= 3;
            }
            let config = match raw.validate() {
                Ok(c) => c,
                Err(e) => {
                    error!(group, error = %e, "partition group config refused");
                    return;
                }
            };
            let replica = Replica::new(config, recovered, machine, out);
            exec.run(group, &replica, out);
            let gid = GroupId(group);
            let mut hosted = Hosted {
                replica,
                lane: lane(gid, host.lanes),
                incarnation,
                waiting: BTreeMap::new(),
            };
            // Down peers are reported now; the sink reports later changes.
            for peer in 0..core.replica_count {
                if peer != core.replica.0 && !exec.transport.connected(peer, gid) {
                    let input = Input::PeerConnection {
                        peer: ReplicaId(peer),
                        connected: false,
                    };
                    let _ = hosted.replica.step(at, input, out);
                    exec.run(group, &hosted.replica, out);
                }
            }
            groups.insert(group, hosted);
        }
    }
}

/// A replica Prepare (a backup's op starts with it, decision 350).
fn is_prepare(event: &Event) -> bool {
    matches!(event, Event::Frame { bytes, .. } if bytes.get(60) == Some(&wire::Command::Prepare.byte()))
}

/// The committed op a reply frame names (its header's `op`, 0 on a denial).
fn reply_op(frame: &[u8]) -> Option<u64> {
    let op = u64::from_le_bytes(frame.get(176..184)?.try_into().ok()?);
    (op != 0).then_some(op)
}

fn now(ticks: u64) -> Now {
    Now {
        tick: ticks,
        realtime_us: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
    }
}

/// The request number of a Reply frame (`None` for any other frame).
fn reply_request(frame: &Frame) -> Option<u64> {
    use wire::header::{Layout, ReplyHeader};
    if frame.command() != Some(wire::Command::Reply) {
        return None;
    }
    Some(ReplyHeader::view(frame.header_bytes()?)?.request.get())
}

/// Hosted groups whose incarnation the committed metadata proves deleted.
fn dead_groups(host: &Host, metadata: &MetadataReader) -> Vec<u64> {
    let view = metadata.view();
    host.groups
        .borrow()
        .iter()
        .filter(|(group, h)| {
            crate::partition::lifecycle::verdict(&view.state, **group, h.incarnation)
                == crate::partition::lifecycle::Verdict::Dead
        })
        .map(|(group, _)| *group)
        .collect()
}

fn observe(host: &Host) {
    let groups = host.groups.borrow();
    let hosted = groups.len().max(1);
    host.tail_share.set(
        host.read_cache_bytes
            .get()
            .min(host.read_cache_shard_bytes.get() / hosted),
    );
    let g = &host.gauges;
    g.groups.store(groups.len() as u64, Ordering::Relaxed);
    let primaries = groups
        .values()
        .filter(|h| h.replica.is_primary() && h.replica.status() == Status::Normal)
        .count();
    g.primaries.store(primaries as u64, Ordering::Relaxed);
    let commit: u64 = groups.values().map(|h| h.replica.commit_min()).sum();
    g.commit.store(commit, Ordering::Relaxed);
    let messages: u64 = groups
        .values()
        .map(|h| consensus::StateMachine::next_offset(h.replica.state_machine()))
        .sum();
    g.messages.store(messages, Ordering::Relaxed);
    let stored: u64 = groups
        .values()
        .map(|h| h.replica.state_machine().stored_bytes())
        .sum();
    g.stored_bytes.store(stored, Ordering::Relaxed);
    let segments: usize = groups
        .values()
        .map(|h| h.replica.state_machine().segments_count())
        .sum();
    g.segments.store(segments as u64, Ordering::Relaxed);
    let lost = groups
        .values()
        .filter(|h| h.replica.is_lost_state())
        .count();
    g.lost.store(lost as u64, Ordering::Relaxed);
    let transfers: u64 = groups
        .values()
        .map(|h| h.replica.transfers_installed())
        .sum();
    g.transfers.store(transfers, Ordering::Relaxed);
    let cached: usize = groups
        .values()
        .map(|h| h.replica.state_machine().cache_bytes())
        .sum();
    g.cache_bytes.store(cached as u64, Ordering::Relaxed);
    let owed: usize = groups
        .values()
        .map(|h| h.replica.state_machine().hash_owed_bytes())
        .sum();
    g.hash_owed_bytes.store(owed as u64, Ordering::Relaxed);
}

/// Frame bytes shared with every peer queue without a copy.
struct Shared(Frame);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Turns a group's effects into I/O.
struct Executor {
    transport: Rc<dyn Transport>,
    replies: Rc<dyn ReplySink>,
    queues: Rc<Queues>,
    fatal: Rc<RefCell<Option<String>>>,
    /// Replies are delivered after the groups' borrow ends (the sink may call back in), with
    /// the group that sent them.
    pending_replies: Vec<(u64, u128, Frame)>,
    timeline: Rc<Timeline>,
}

impl Executor {
    fn run(&mut self, group: u64, replica: &Replica<PartitionStateMachine>, out: &mut Outbox) {
        // What the applies and installs of this step recorded comes first: a checkpoint
        // emitted in the same step covers them.
        for work in replica.state_machine().take_storage() {
            self.queues.push(group, PartitionStorageOp::Machine(work));
        }
        let gid = GroupId(group);
        for effect in out.drain() {
            if self.fatal.borrow().is_some() {
                continue;
            }
            match effect {
                Effect::Send { to, frame } => {
                    let bytes = Bytes::from_owner(Shared(frame));
                    self.transport.send(to.0, gid, &bytes);
                }
                Effect::Append { op, frame } => {
                    self.timeline.appending(group, op);
                    self.queues
                        .push(group, PartitionStorageOp::Append { op, frame });
                }
                Effect::Truncate { from_op } => {
                    self.timeline.forget(group, from_op);
                    self.queues
                        .push(group, PartitionStorageOp::Truncate { from_op });
                }
                Effect::PersistVsrState(state) => {
                    self.queues.push(group, PartitionStorageOp::Persist(state));
                }
                Effect::Read { op, checksum } => {
                    self.queues
                        .push(group, PartitionStorageOp::Read { op, checksum });
                }
                Effect::Checkpoint { op } => {
                    let m = replica.state_machine();
                    self.queues.push(
                        group,
                        PartitionStorageOp::Checkpoint {
                            op,
                            prepare: replica.snapshot_identity(op),
                            offsets: m.offsets().clone(),
                            frontier: m.committed_offset_end(),
                            lost_state: replica.is_lost_state(),
                        },
                    );
                }
                Effect::Reply { client, frame } => {
                    if let Some(op) = reply_op(frame.bytes()) {
                        self.timeline.committed(group, op);
                    }
                    self.pending_replies.push((group, client.0, frame));
                }
                Effect::Fatal(reason) => {
                    error!(group, %reason, "consensus fatal in a partition group; stopping the node");
                    self.fatal
                        .borrow_mut()
                        .get_or_insert(format!("consensus (group {group:#x}): {reason}"));
                }
            }
        }
    }

    fn deliver(&mut self, host: &Host) {
        let delivered = !self.pending_replies.is_empty();
        for (group, client, frame) in self.pending_replies.drain(..) {
            if let Some(hosted) = host.groups.borrow_mut().get_mut(&group)
                && let Some(waiting) = hosted.waiting.get(&client)
                && reply_request(&frame).is_some_and(|r| r >= waiting.request.get())
            {
                hosted.waiting.remove(&client);
            }
            self.replies.reply(client, frame);
        }
        if delivered {
            self.timeline.delivered();
        }
    }

    /// Answers the requests a dropped group held with TransientNotCommitted (57, decision
    /// 377): the SDK resends the same request, which reaches the key's next incarnation or is
    /// refused as its partition, topic or stream no longer resolves. Each request is answered
    /// once: the entry leaves with the group, and the client's registry delivers a reply only
    /// to the request number it waits for.
    fn answer_dropped(
        &mut self,
        gauges: &PartitionGauges,
        waiting: BTreeMap<u128, wire::header::RequestHeader>,
    ) {
        for (client, header) in waiting {
            let frame = crate::client_core::frames::refused(
                &header,
                consensus::codes::TRANSIENT_NOT_COMMITTED,
            );
            add(&gauges.dropped_answered, 1);
            self.replies.reply(client, frame);
        }
    }
}

#[cfg(test)]
#[path = "partition/removal_tests.rs"]
mod removal_tests;

#[path = "partition/away.rs"]
mod away;
#[path = "partition/retire.rs"]
mod retire;
#[path = "partition/seals.rs"]
mod seals;

#[cfg(test)]
#[path = "partition/group_tests.rs"]
mod tests;

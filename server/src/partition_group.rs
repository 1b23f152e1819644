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
/// lagging groups hold that much per group.
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

/// Counters and gauges of one shard's partition groups (relaxed atomics; read by `/metrics`).
#[derive(Debug, Default)]
pub struct PartitionGauges {
    /// Groups hosted.
    pub groups: AtomicU64,
    /// `Replica::take_over` calls that started a view change toward this node (primary
    /// affinity, decision 221).
    pub takeovers: AtomicU64,
    /// Of them, primary in a normal view.
    pub primaries: AtomicU64,
    /// Sum of the groups' `commit_min`.
    pub commit: AtomicU64,
    /// Of them, in lost state (decisions 73, 240): they neither ack nor vote.
    pub lost: AtomicU64,
    /// Appends made durable.
    pub appends: AtomicU64,
    /// WAL windows committed (one durable write each, decision 496).
    pub wal_commits: AtomicU64,
    /// Nanoseconds spent in WAL commits (the durable write).
    pub wal_commit_ns: AtomicU64,
    /// Bytes submitted to the WAL.
    pub wal_bytes: AtomicU64,
    /// SendMessages bodies written once at their segment's tail and referenced from the WAL
    /// (decision 414), and their bytes.
    pub bodies_ahead: AtomicU64,
    /// Bytes of those bodies.
    pub bodies_ahead_bytes: AtomicU64,
    /// Segment tails cut back after a view change truncated prepares (decision 414).
    pub segment_rewinds: AtomicU64,
    /// WAL lsns held below the durable end (what reclaim cannot free yet).
    pub wal_lag: AtomicU64,
    /// Reclaims held back by a group lagging over [`ReclaimLimits::warn_lsns`].
    pub reclaim_blocked: AtomicU64,
    /// Held entries copied forward to the WAL's head.
    pub copied_forward: AtomicU64,
    /// WAL files reclaimed (out of the WAL; removed apart, decision 400).
    pub wal_files_reclaimed: AtomicU64,
    /// Reclaimed WAL files not removed yet (decision 400).
    pub wal_files_retiring: AtomicU64,
    /// The lowest lsn the WAL holds.
    pub wal_floor: AtomicU64,
    /// Groups refused `Busy` right now for holding the WAL.
    pub busy_groups: AtomicU64,
    /// Checkpoints durable.
    pub checkpoints: AtomicU64,
    /// The hosted groups whose own superblock is durable on this shard (published by the
    /// storage task; read by the rejoin mark's clearing, decision 290).
    pub marked: arc_swap::ArcSwap<BTreeSet<u64>>,
    /// The stamp's rejoin mark was cleared in this process (decision 290): a group that boots
    /// without a superblock from now on boots fresh.
    pub rejoin_cleared: std::sync::atomic::AtomicBool,
    /// Sum of the hosted groups' installed state transfers.
    pub transfers: AtomicU64,
    /// Replica-plane frames forwarded to the shard that owns their group.
    pub forwarded: AtomicU64,
    /// Frames for no group this node knows (dropped).
    pub dropped_unknown: AtomicU64,
    /// Frames dropped on a full inbox.
    pub dropped_full: AtomicU64,
    /// Frames a hosted group ignored because they carry another incarnation of its key
    /// (decision 375).
    pub fenced: AtomicU64,
    /// Prepares a hosted group forwarded but did not journal because its appends that have
    /// not completed reached `appending_bytes_max` (decision 504); repair fetches them later.
    pub appending_behind: AtomicU64,
    /// Bytes of prepares the shard's groups asked to append and have not seen complete, as of
    /// the last tick (decision 505).
    pub appending_bytes: AtomicU64,
    /// Ticks on which that reached [`SHARD_APPENDING_BYTES_MAX`].
    pub pressure_ticks: AtomicU64,
    /// Pending requests answered 57 because their group was dropped (decision 377).
    pub dropped_answered: AtomicU64,
    /// Messages the shard's partitions hold: the sum of their applied next offsets (offsets
    /// start at 0 and nothing is deleted yet). GetStats' `messages_count` sums it over shards.
    pub messages: AtomicU64,
    /// Bytes of committed batches the shard's partitions hold (GetStats'
    /// `messages_size_bytes`, decision 380).
    pub stored_bytes: AtomicU64,
    /// Segment files of the shard's partitions (GetStats' `segments_count`, decision 380).
    pub segments: AtomicU64,
    /// Groups removed because the committed metadata deleted them (decision 342).
    pub groups_removed: AtomicU64,
    /// Bytes of committed batches the groups' tails hold in memory (decision 280).
    pub cache_bytes: AtomicU64,
    /// Bytes of committed batches the groups' running log hashes have still to take: paid
    /// while the pump is idle, so 0 on a quiet node (decision 493).
    pub hash_owed_bytes: AtomicU64,
    /// Segment syncs (a seal, a forced sync, an `enforce_fsync` flush), their total time and
    /// their count per bucket of [`seals::SYNC_BUCKETS`] (decision 355).
    pub segment_syncs: AtomicU64,
    /// Nanoseconds in segment syncs.
    pub segment_sync_ns: AtomicU64,
    /// Segment syncs per upper bound of [`seals::SYNC_BUCKETS`] (not cumulative).
    pub segment_sync_buckets: [AtomicU64; seals::SYNC_BUCKETS.len()],
}

/// Publishes that `group`'s own superblock is durable on this shard (decision 290).
fn mark_superblock(gauges: &PartitionGauges, group: u64) {
    if !gauges.marked.load().contains(&group) {
        gauges.marked.rcu(|marked| {
            let mut marked = BTreeSet::clone(marked);
            marked.insert(group);
            marked
        });
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Appends the partition groups' metrics of every shard (decision 167), labelled
/// `plane="partition"` and `shard`: gauges `strand_partition_groups`,
/// `strand_partition_primaries`, `strand_partition_commit` (sum of the groups' `commit_min`),
/// `strand_partition_lost_groups`, `strand_partition_cache_bytes`,
/// `strand_partition_hash_owed_bytes`,
/// `strand_wal_lag_lsns`, `strand_wal_floor_lsn`, `strand_partition_busy_groups`; counters
/// `strand_partition_appends_total`, `strand_wal_commits_total` (one durable write each),
/// `strand_wal_commit_seconds_total`, `strand_wal_bytes_total`,
/// `strand_partition_bodies_ahead_total`, `strand_partition_bodies_ahead_bytes_total`,
/// `strand_segment_rewinds_total`,
/// `strand_partition_checkpoints_total`, `strand_partition_transfers_total`,
/// `strand_reclaim_blocked_total`, `strand_wal_copied_forward_total`,
/// `strand_wal_files_reclaimed_total`, `strand_wal_files_retiring`,
/// `strand_frames_forwarded_total`,
/// `strand_partition_inbox_dropped_total` by `reason` (`unknown_group`, `full`). Names differ
/// from the metadata group's where a family would otherwise be split (Prometheus text wants
/// one group of lines per family).
pub fn render_metrics(out: &mut String, shards: &[Arc<PartitionGauges>]) {
    use std::fmt::Write as _;
    type Pick = fn(&PartitionGauges) -> &AtomicU64;
    let rows: [(&str, &str, &str, Pick); 30] = [
        (
            "partition_cache_bytes",
            "gauge",
            "bytes of committed batches the partition groups hold in memory",
            |g| &g.cache_bytes,
        ),
        (
            "partition_hash_owed_bytes",
            "gauge",
            "bytes of committed batches the running log hashes have still to take",
            |g| &g.hash_owed_bytes,
        ),
        (
            "partition_groups",
            "gauge",
            "partition groups hosted",
            |g| &g.groups,
        ),
        (
            "partition_primaries",
            "gauge",
            "partition groups this node leads in a normal view",
            |g| &g.primaries,
        ),
        (
            "partition_commit",
            "gauge",
            "sum of the partition groups' applied ops",
            |g| &g.commit,
        ),
        (
            "partition_lost_groups",
            "gauge",
            "partition groups in lost state (they neither ack nor vote)",
            |g| &g.lost,
        ),
        (
            "wal_lag_lsns",
            "gauge",
            "WAL records held below the durable end",
            |g| &g.wal_lag,
        ),
        (
            "wal_floor_lsn",
            "gauge",
            "the lowest lsn the WAL holds",
            |g| &g.wal_floor,
        ),
        (
            "partition_busy_groups",
            "gauge",
            "groups refused Busy for holding the WAL",
            |g| &g.busy_groups,
        ),
        (
            "partition_appends_total",
            "counter",
            "prepares journaled durably",
            |g| &g.appends,
        ),
        (
            "wal_commits_total",
            "counter",
            "WAL windows committed (one durable write each)",
            |g| &g.wal_commits,
        ),
        (
            "wal_commit_seconds_total",
            "counter",
            "time in WAL window durable writes",
            |g| &g.wal_commit_ns,
        ),
        (
            "wal_bytes_total",
            "counter",
            "bytes appended to the WAL",
            |g| &g.wal_bytes,
        ),
        (
            "partition_bodies_ahead_total",
            "counter",
            "message batches written once at their segment's tail, referenced from the WAL",
            |g| &g.bodies_ahead,
        ),
        (
            "partition_bodies_ahead_bytes_total",
            "counter",
            "bytes of the batches written once at their segment's tail",
            |g| &g.bodies_ahead_bytes,
        ),
        (
            "segment_rewinds_total",
            "counter",
            "segment tails cut back after a view change truncated prepares",
            |g| &g.segment_rewinds,
        ),
        (
            "partition_checkpoints_total",
            "counter",
            "checkpoints made durable",
            |g| &g.checkpoints,
        ),
        (
            "partition_transfers_total",
            "counter",
            "state transfers the hosted groups installed",
            |g| &g.transfers,
        ),
        (
            "reclaim_blocked_total",
            "counter",
            "reclaims held back by a lagging group",
            |g| &g.reclaim_blocked,
        ),
        (
            "wal_copied_forward_total",
            "counter",
            "held entries copied to the WAL's head",
            |g| &g.copied_forward,
        ),
        (
            "wal_files_reclaimed_total",
            "counter",
            "WAL files reclaimed",
            |g| &g.wal_files_reclaimed,
        ),
        (
            "wal_files_retiring",
            "gauge",
            "reclaimed WAL files not removed yet",
            |g| &g.wal_files_retiring,
        ),
        (
            "frames_forwarded_total",
            "counter",
            "replica frames forwarded to the owning shard",
            |g| &g.forwarded,
        ),
        (
            "partition_groups_removed_total",
            "counter",
            "partition groups removed after their deletion committed",
            |g| &g.groups_removed,
        ),
        (
            "partition_inbox_dropped_total",
            "counter",
            "replica frames dropped before the partition pump",
            |g| &g.dropped_unknown,
        ),
        (
            "partition_frames_fenced_total",
            "counter",
            "replica frames of another incarnation of the group's key, ignored",
            |g| &g.fenced,
        ),
        (
            "partition_appending_bytes",
            "gauge",
            "bytes of prepares the shard's groups asked to append and have not seen complete \
             (decision 505)",
            |g| &g.appending_bytes,
        ),
        (
            "partition_storage_pressure_ticks_total",
            "counter",
            "ticks on which the shard's incomplete appends reached their bound, so each group \
             took new appends only into an empty backlog (decision 505)",
            |g| &g.pressure_ticks,
        ),
        (
            "partition_prepares_appending_behind_total",
            "counter",
            "prepares forwarded but not journaled: the group's incomplete appends were at \
             their bound (decision 504); repair fetches them later",
            |g| &g.appending_behind,
        ),
        (
            "partition_dropped_requests_answered_total",
            "counter",
            "requests of a dropped incarnation answered 57",
            |g| &g.dropped_answered,
        ),
    ];
    for (name, kind, help, pick) in rows {
        if !help.is_empty() {
            let _ = writeln!(out, "# HELP strand_{name} {help}.");
            let _ = writeln!(out, "# TYPE strand_{name} {kind}");
        }
        for (shard, g) in shards.iter().enumerate() {
            let v = pick(g).load(Ordering::Relaxed);
            let labels = format!("plane=\"partition\",shard=\"{shard}\"");
            match name {
                "wal_commit_seconds_total" => {
                    let _ = writeln!(out, "strand_{name}{{{labels}}} {}", v as f64 / 1e9);
                }
                "partition_inbox_dropped_total" => {
                    let full = g.dropped_full.load(Ordering::Relaxed);
                    let _ = writeln!(
                        out,
                        "strand_{name}{{reason=\"unknown_group\",{labels}}} {v}\n\
                         strand_{name}{{reason=\"full\",{labels}}} {full}"
                    );
                }
                _ => {
                    let _ = writeln!(out, "strand_{name}{{{labels}}} {v}");
                }
            }
        }
    }
    seals::render_metrics(out, shards);
}

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

/// An append in the open window: group, op, lsn, the frame, and its body's reference when
/// the WAL record carries one (decision 414).
type WindowEntry = (u64, u64, u64, Frame, Option<BodyRef>);

/// The frame a group holds for a journaled prepare (decision 443): its header alone, copied
/// out of the whole frame so the batch's buffer is freed, when its body is in the segments
/// (`body`); the whole frame otherwise.
fn held_frame(frame: Frame, body: Option<&BodyRef>) -> Frame {
    match (body, frame.header_bytes()) {
        (Some(_), Some(header)) => Frame::new(Bytes::copy_from_slice(header)),
        _ => frame,
    }
}

/// A held prepare made whole again for a `Read` (decision 443): the header and the `len`
/// bytes `at` names in the segments, when they have its length and hash; `None` otherwise
/// (a read error, or segments an install replaced), which the core takes as not held here.
async fn whole_frame<S: Storage>(
    log: &PartitionLog<S>,
    header: &Frame,
    at: &BodyRef,
) -> Option<Frame> {
    let body = match log.read_span(at.segment, at.position, at.len).await {
        Ok(Some(body)) => body,
        Ok(None) => return None,
        Err(e) => {
            warn!(error = %e, "reading a held prepare's body from the segments failed");
            return None;
        }
    };
    // `read_span` answers exactly `at.len` bytes; the hash tells whether they are the body.
    if !at.names(&body) {
        warn!(
            segment = at.segment,
            position = at.position,
            "a held prepare's body does not match its reference"
        );
        return None;
    }
    let mut whole = Vec::with_capacity(wire::HEADER_SIZE + body.len());
    whole.extend_from_slice(header.header_bytes()?);
    whole.extend_from_slice(&body);
    Some(Frame::new(whole))
}

/// The base offset of the SendMessages batch a whole prepare frame carries.
fn send_messages_base(frame: &[u8]) -> Option<u64> {
    if frame.get(208) != Some(&wire::Operation::SendMessages.byte()) {
        return None;
    }
    journal::batch::peek(frame.get(wire::HEADER_SIZE..)?).map(|i| i.base_offset)
}

/// Reserves a SendMessages body at `disk`'s segment tail when it can go there now: its base
/// offset, whether it is [`REF_BODY_MIN`] bytes or more (its segment must be written and synced
/// before its append is acknowledged), and the reference its WAL record then carries.
fn reserve_body<S: Storage>(
    disk: &mut GroupDisk<S>,
    gauges: &PartitionGauges,
    frame: &Frame,
) -> Option<(u64, bool, Option<BodyRef>)> {
    if frame.bytes().get(208) != Some(&wire::Operation::SendMessages.byte()) {
        return None;
    }
    let body = frame.shared().slice(wire::HEADER_SIZE..);
    let info = journal::batch::peek(&body)?;
    let (segment, position) = disk.log.reserve(body.clone())?;
    let referenced = body.len() >= REF_BODY_MIN;
    if referenced {
        add(&gauges.bodies_ahead, 1);
        add(&gauges.bodies_ahead_bytes, body.len() as u64);
    }
    let reference = referenced
        .then(|| BodyRef::of(segment, position, &body))
        .flatten();
    Some((info.base_offset, referenced, reference))
}

/// One group's disk state in the storage task.
struct GroupDisk<S: Storage> {
    prefix: String,
    policy: FlushPolicy,
    superblock: Superblock<S>,
    log: PartitionLog<S>,
    offset_store: OffsetStore<S>,
    /// Journaled prepares at or above the checkpoint op, with their lsn (0: replayed at boot,
    /// held at the WAL floor). A prepare whose body is in `bodies` is held by its header alone
    /// (`held_frame`): its batch is in the segments, and a `Read` takes it from there
    /// (decision 443), so a group never holds up to a checkpoint interval of whole batches.
    frames: BTreeMap<u64, (u64, Frame)>,
    /// Where the bodies of the `frames` journaled as references are in the segments
    /// (decision 414): a copy forward copies the reference, not the body.
    bodies: BTreeMap<u64, BodyRef>,
    checkpoint_op: u64,
    /// The end offset of the batches committed here (the checkpoint's frontier at boot): a
    /// rewind never goes below it.
    committed_end: u64,
    last_persist_failed: bool,
    /// Where the read path finds the written batches (decision 280), refreshed after every
    /// flush and install.
    map: SharedMap,
}

impl<S: Storage> GroupDisk<S> {
    /// The lowest lsn this group still needs: its entries from the checkpoint op up (the
    /// entry at the checkpoint op itself stays, journal.md §6).
    fn hold(&self, floor: u64) -> Option<u64> {
        self.frames
            .values()
            .map(|(lsn, _)| if *lsn == 0 { floor } else { *lsn })
            .min()
    }
}

/// The shard's disks: the WAL and every group's files.
pub struct ShardDisk<S: Storage> {
    /// The shard's partition directory (every group's files, prefixed).
    pub partitions: S,
    /// The WAL's directory.
    pub wal: S,
}

/// The storage task's state.
struct StorageTask<S: Storage> {
    partitions: S,
    identity: journal::Identity,
    wal: PartitionWal<S>,
    guard: ReclaimGuard,
    faults: FaultRecord<S>,
    /// Replayed prepares of groups not booted yet.
    replay: GroupReplay,
    groups: BTreeMap<u64, GroupDisk<S>>,
    queues: Rc<Queues>,
    inbox: Rc<Inbox>,
    fatal: Rc<RefCell<Option<String>>>,
    gauges: Arc<PartitionGauges>,
    busy: Rc<RefCell<BTreeSet<u64>>>,
    started: Instant,
    limits: ReclaimLimits,
    /// The durable lsn at the last reclaim.
    last_reclaim_at: u64,
    /// The stamp records a rejoin (decision 240).
    rejoin: bool,
    /// Committed metadata: whether a group's incarnation is dead (decision 342).
    metadata: MetadataReader,
    /// Each group's in-memory tail budget (decision 280).
    read_cache_bytes: usize,
    /// [`Host::tail_share`], handed to every machine booted here.
    tail_share: Rc<Cell<usize>>,
    /// Where each op's time goes (decision 350).
    timeline: Rc<Timeline>,
    /// Reclaimed WAL files being removed apart (decision 400).
    retiring: Rc<retire::Retiring<S::File>>,
    /// Groups away running a window's segment work (decision 440).
    away: Rc<away::AwayShared<S>>,
    /// Appends taken into a window while their group was away with their body (decision
    /// 480): acknowledged once the group is back and their window committed.
    late: BTreeMap<u64, Vec<WindowEntry>>,
    /// A late entry is in the open WAL window: it must be committed.
    late_open: bool,
}

fn identity_of(frame: &[u8]) -> u128 {
    frame
        .get(..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u128::from_le_bytes)
}

impl<S: Storage + Clone + 'static> StorageTask<S> {
    fn fail(&self, cause: String) {
        error!(cause = %cause, "partition storage failed; stopping the node");
        self.fatal.borrow_mut().get_or_insert(cause);
        self.inbox.wake();
    }

    fn done(&self, group: u64, completion: Completion) {
        self.inbox.push(Event::Done { group, completion });
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    async fn commit_window(&mut self) -> Result<u64, WalError> {
        let started = Instant::now();
        let lsn = self.wal.commit().await?;
        self.committed(started);
        Ok(lsn)
    }

    /// [`StorageTask::commit_window`] that, while the window's write and `fdatasync` are in
    /// flight, sends the large bodies of appends that arrive to their segments ahead of their
    /// own window (decision 480, [`away::dispatch_early`]).
    /// The groups of `staying` have entries in this window and are not sent away.
    async fn commit_window_dispatching(
        &mut self,
        staying: &BTreeSet<u64>,
    ) -> Result<u64, WalError> {
        let started = Instant::now();
        let StorageTask {
            wal,
            groups,
            queues,
            away,
            gauges,
            ..
        } = self;
        let lsn = futures_lite::future::or(wal.commit(), async {
            match away::dispatch_early(groups, queues, away, gauges, staying).await {}
        })
        .await?;
        self.committed(started);
        Ok(lsn)
    }

    fn committed(&mut self, started: Instant) {
        self.away
            .durable(self.wal.durable_lsn(), self.wal.last_written_at());
        add(&self.gauges.wal_commits, 1);
        add(
            &self.gauges.wal_commit_ns,
            u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
        );
    }

    async fn run(mut self) {
        while self.queues.ready().await {
            self.take_back();
            if self.fatal.borrow().is_some() {
                // The node is stopping: write nothing more.
                self.queues.groups.borrow_mut().clear();
                self.queues.boots.borrow_mut().clear();
                self.queues.removals.borrow_mut().clear();
                self.queues.early.borrow_mut().clear();
                continue;
            }
            if !self.queues.seals.borrow().is_empty()
                || !self.queues.removals.borrow().is_empty()
                || !self.queues.boots.borrow().is_empty()
            {
                // These passes need every group's disk here (decision 440).
                self.settle_away().await;
            }
            self.apply_seals().await;
            let removals: Vec<_> = self.queues.removals.borrow_mut().drain(..).collect();
            for group in removals {
                self.remove_group(group).await;
            }
            let boots: Vec<_> = self.queues.boots.borrow_mut().drain(..).collect();
            for (group, policy) in boots {
                self.boot_group(group, policy).await;
            }
            self.append_window().await;
            let mut checkpointed = false;
            let groups: Vec<u64> = self.queues.groups.borrow().keys().copied().collect();
            for group in groups {
                if self.queues.away.borrow().contains(&group) {
                    continue; // its work waits until it is back
                }
                loop {
                    let op = {
                        let mut queues = self.queues.groups.borrow_mut();
                        let Some(q) = queues.get_mut(&group) else {
                            break;
                        };
                        if matches!(q.front(), None | Some(PartitionStorageOp::Append { .. })) {
                            break;
                        }
                        q.pop_front().expect("non-empty")
                    };
                    checkpointed |= matches!(op, PartitionStorageOp::Checkpoint { .. });
                    self.execute(group, op).await;
                    if self.fatal.borrow().is_some() {
                        break;
                    }
                }
            }
            self.queues.groups.borrow_mut().retain(|_, q| !q.is_empty());
            self.spawn_seals();
            if self.queues.recheck.replace(false)
                || checkpointed
                || self.wal.durable_lsn() >= self.last_reclaim_at + RECLAIM_EVERY_LSNS
            {
                // Reclaim weighs every group's holds and synced segments.
                self.settle_away().await;
                self.reclaim().await;
            }
            if self.queues.is_idle() && self.wal.end_lag() > 0 && self.stays_idle().await {
                // Idle: vouch for the last window (decision 90).
                if let Err(e) = self.wal.record_end().await {
                    warn!(error = %e, "recording the WAL's durable end failed");
                }
            }
        }
        self.settle_away().await;
        self.shutdown().await;
    }

    /// Whether no work came for [`END_IDLE`] (`false` at once when work comes or the queues
    /// close).
    async fn stays_idle(&self) -> bool {
        let queues = self.queues.clone();
        futures_lite::future::or(
            async move {
                queues.ready().await;
                false
            },
            async {
                glommio::timer::sleep(END_IDLE).await;
                true
            },
        )
        .await
    }

    /// The leading appends of every group's queue, in one WAL window (group commit); each
    /// group's `Appended` only after the window's `fdatasync` returned. Committed batches for
    /// the segments met among those leading appends are taken too (segments and WAL are apart:
    /// a committed batch and an uncommitted prepare commute), and the segment writes they make
    /// due run while the window's write and `fdatasync` are in flight instead of after them
    /// (decision 270: a segment write is off the critical path of the next window).
    async fn append_window(&mut self) {
        let mut window: Vec<WindowEntry> = Vec::new();
        let mut flush: BTreeSet<u64> = BTreeSet::new();
        // Groups whose segment takes a referenced body in this window (decision 441).
        let mut ahead: BTreeSet<u64> = BTreeSet::new();
        loop {
            let next = {
                let away = self.queues.away.borrow();
                let early = self.queues.early.borrow();
                let mut queues = self.queues.groups.borrow_mut();
                queues.iter_mut().find_map(|(group, q)| {
                    let here = !away.contains(group);
                    let takes = match q.front()? {
                        // An append whose body went ahead is taken while its group is away.
                        PartitionStorageOp::Append { op, .. } => {
                            here || early.get(group).is_some_and(|(o, _)| o == op)
                        }
                        PartitionStorageOp::Machine(StorageWork::Batch(_)) => here,
                        _ => false,
                    };
                    takes
                        .then(|| q.pop_front())
                        .flatten()
                        .map(|op| (*group, op))
                })
            };
            let Some((group, next)) = next else {
                break;
            };
            let (op, frame) = match next {
                PartitionStorageOp::Append { op, frame } => (op, frame),
                PartitionStorageOp::Machine(StorageWork::Batch(bytes)) => {
                    match self.hold_batch(group, bytes) {
                        Ok(true) => {
                            flush.insert(group);
                        }
                        Ok(false) => {}
                        Err(e) => {
                            self.fail(e);
                            return;
                        }
                    }
                    continue;
                }
                _ => unreachable!("only appends and batches are taken"),
            };
            let early = self
                .queues
                .early
                .borrow_mut()
                .remove(&group)
                .filter(|(o, _)| *o == op);
            if let Some((_, body)) = early {
                // Its body is in the segment or on its way there (decision 480): only its WAL
                // record remains.
                if !self
                    .submit_early(group, op, frame, body, &mut window, &mut ahead)
                    .await
                {
                    return;
                }
                continue;
            }
            let Some(disk) = self.groups.get(&group) else {
                self.done(
                    group,
                    Completion::AppendFailed {
                        op,
                        checksum: identity_of(frame.bytes()),
                    },
                );
                continue;
            };
            if op < disk.checkpoint_op {
                // A checkpoint landed above it (a transfer install): durable in the segments.
                self.done(
                    group,
                    Completion::Appended {
                        op,
                        checksum: identity_of(frame.bytes()),
                    },
                );
                continue;
            }
            let now = self.now_us();
            let reserved = self.reserve_ahead(group, &frame, &mut ahead);
            let body = reserved.and_then(|(_, body)| body);
            let mut submitted = self.submit(group, &frame, body.as_ref(), now);
            if matches!(submitted, Err(WalError::WindowFull { .. })) {
                if let Err(e) = self
                    .finish_window_flushing(&mut window, &BTreeSet::new(), &mut ahead)
                    .await
                {
                    self.fail(e);
                    return;
                }
                submitted = self.submit(group, &frame, body.as_ref(), now);
            }
            match submitted {
                Ok((lsn, bytes)) => {
                    add(&self.gauges.wal_bytes, bytes);
                    self.timeline.windowed(group, op, Instant::now());
                    window.push((group, op, lsn, frame, body));
                }
                Err(e) => {
                    warn!(group, op, error = %e, "partition append refused by the WAL");
                    // Its batch must not reach the segment: nothing journals it.
                    if let Some((base, _)) = reserved
                        && !self
                            .groups
                            .get_mut(&group)
                            .is_some_and(|d| d.log.unreserve(base))
                    {
                        self.fail(format!(
                            "group {group:#x}: op {op}: its batch was taken for the segment and \
                             cannot be given back"
                        ));
                        return;
                    }
                    self.done(
                        group,
                        Completion::AppendFailed {
                            op,
                            checksum: identity_of(frame.bytes()),
                        },
                    );
                }
            }
        }
        if let Err(e) = self
            .finish_window_flushing(&mut window, &flush, &mut ahead)
            .await
        {
            self.fail(e);
        }
    }

    /// Reserves a SendMessages body at its segment's tail when it can go there now
    /// (`PartitionLog::reserve`: it starts at the next offset): its base offset, and the
    /// reference the WAL record carries instead of it when it is [`REF_BODY_MIN`] bytes or
    /// more. `ahead` notes the group of a referenced body: its segment is written and synced in
    /// this window (a shorter body waits for the next flush: decision 441).
    fn reserve_ahead(
        &mut self,
        group: u64,
        frame: &Frame,
        ahead: &mut BTreeSet<u64>,
    ) -> Option<(u64, Option<BodyRef>)> {
        let disk = self.groups.get_mut(&group)?;
        let (base, referenced, body) = reserve_body(disk, &self.gauges, frame)?;
        if referenced {
            // Written and synced beside the window. A shorter body waits in the log's pending
            // batches for the next flush (the policy's, or a referenced body's): its WAL record
            // holds it whole, and one device request fewer per window (decision 441).
            ahead.insert(group);
        }
        Some((base, body))
    }

    /// Puts the WAL record of an append whose body went to its segment ahead of this window
    /// (decision 480) in the window: with the window's entries when its group is back (its
    /// segment is durable), otherwise with the group's late entries, acknowledged when it is
    /// back. `false` when the task failed: the batch is in the segment's tail already, so an
    /// append the WAL refuses cannot be given back.
    async fn submit_early(
        &mut self,
        group: u64,
        op: u64,
        frame: Frame,
        body: Option<BodyRef>,
        window: &mut Vec<WindowEntry>,
        ahead: &mut BTreeSet<u64>,
    ) -> bool {
        let now = self.now_us();
        let mut submitted = self.submit(group, &frame, body.as_ref(), now);
        if matches!(submitted, Err(WalError::WindowFull { .. })) {
            if let Err(e) = self
                .finish_window_flushing(window, &BTreeSet::new(), ahead)
                .await
            {
                self.fail(e);
                return false;
            }
            submitted = self.submit(group, &frame, body.as_ref(), now);
        }
        match submitted {
            Ok((lsn, bytes)) => {
                add(&self.gauges.wal_bytes, bytes);
                self.timeline.windowed(group, op, Instant::now());
                let entry = (group, op, lsn, frame, body);
                if self.queues.away.borrow().contains(&group) {
                    self.late.entry(group).or_default().push(entry);
                    self.late_open = true;
                } else {
                    window.push(entry);
                }
                true
            }
            Err(e) => {
                self.fail(format!(
                    "group {group:#x}: op {op}: the WAL refused an append whose batch went to \
                     the segment ahead of its window: {e}"
                ));
                false
            }
        }
    }

    /// Submits an append's WAL record, a reference to its body when it has one: its lsn and
    /// the record's payload bytes.
    fn submit(
        &mut self,
        group: u64,
        frame: &Frame,
        body: Option<&BodyRef>,
        now: u64,
    ) -> Result<(u64, u64), WalError> {
        match (body, frame.header_bytes()) {
            (Some(body), Some(header)) => self
                .wal
                .submit_ref(group, header, body, now)
                .map(|lsn| (lsn, (wire::HEADER_SIZE + BodyRef::LEN) as u64)),
            _ => self
                .wal
                .submit(group, frame.bytes(), now)
                .map(|lsn| (lsn, frame.bytes().len() as u64)),
        }
    }

    /// A committed batch into its group's segments (held in memory until a flush): whether a
    /// flush is due.
    fn hold_batch(&mut self, group: u64, bytes: Bytes) -> Result<bool, String> {
        let Some(disk) = self.groups.get_mut(&group) else {
            return Ok(false);
        };
        let end = journal::batch::peek(&bytes).map_or(0, |i| i.end_offset());
        disk.committed_end = disk.committed_end.max(end);
        if end <= disk.log.next_offset() {
            // Held already: reserved at the tail (a short body waits there for a flush,
            // decision 441), or in the segments since before a restart.
            return Ok(disk.log.should_flush(0, 0));
        }
        disk.log
            .commit_verified_batch(bytes)
            .map_err(|e| format!("group {group:#x}: segments: {e}"))?;
        Ok(disk.log.should_flush(0, 0))
    }

    /// Writes the window durably: the WAL's one durable write while the segments of
    /// `ahead` take their referenced bodies and are synced (decision 414) and the due
    /// segment flushes of `flush` run (decision 270: a segment write is off the critical path
    /// of the next window). Each `Appended` is sent once the WAL and every synced segment are
    /// durable.
    ///
    /// The groups with segment work go away to run it (decision 440, `away`): this waits only
    /// for the WAL commit, and their entries are acknowledged when they come back.
    async fn finish_window_flushing(
        &mut self,
        window: &mut Vec<WindowEntry>,
        flush: &BTreeSet<u64>,
        ahead: &mut BTreeSet<u64>,
    ) -> Result<(), String> {
        if window.is_empty() && flush.is_empty() && ahead.is_empty() && !self.late_open {
            return Ok(());
        }
        let leaving: BTreeSet<u64> = flush
            .iter()
            .chain(ahead.iter())
            .copied()
            .filter(|g| self.groups.contains_key(g))
            .collect();
        let mut parked: BTreeMap<u64, Vec<WindowEntry>> = BTreeMap::new();
        let mut staying = Vec::with_capacity(window.len());
        for entry in window.drain(..) {
            if leaving.contains(&entry.0) {
                parked.entry(entry.0).or_default().push(entry);
            } else {
                staying.push(entry);
            }
        }
        let has_records = !parked.is_empty() || !staying.is_empty() || self.late_open;
        for group in leaving {
            let disk = self.groups.remove(&group).expect("filtered on presence");
            let synced = ahead.contains(&group);
            let entries = parked.remove(&group).unwrap_or_default();
            self.send_away(group, disk, synced, entries);
        }
        ahead.clear();
        if has_records {
            // One durable write for every group's appends; meanwhile the large
            // bodies that come in go to their segments (decision 480).
            self.late_open = false;
            // A group with entries here stays until they are accounted: its disk takes them.
            let staying_groups: BTreeSet<u64> = staying.iter().map(|e| e.0).collect();
            self.commit_window_dispatching(&staying_groups)
                .await
                .map_err(|e| format!("partition WAL commit: {e}"))?;
            self.ack_late();
        }
        let synced = Instant::now();
        let written = self.wal.last_written_at().unwrap_or(synced);
        self.account(staying, true, written, synced);
        Ok(())
    }

    /// Cuts `group`'s segments back to `offset` (the first body of prepares a view change
    /// truncated; decision 414). Never below a batch this node committed: that would be a
    /// truncation of committed ops, which the core never asks for.
    async fn rewind(&mut self, group: u64, offset: u64) -> Result<(), String> {
        let Some(disk) = self.groups.get_mut(&group) else {
            return Ok(());
        };
        if offset >= disk.log.next_offset() {
            return Ok(());
        }
        if offset < disk.committed_end {
            return Err(format!(
                "the segments would be cut to offset {offset}, below the committed offset {}",
                disk.committed_end
            ));
        }
        let rewound = disk.log.rewind(offset).await;
        disk.map.borrow_mut().refresh(&disk.log);
        add(&self.gauges.segment_rewinds, 1);
        debug!(
            group = format!("{group:#x}"),
            offset, "segment tail rewound"
        );
        rewound.map_err(|e| format!("segments: {e}"))
    }

    /// The due segment flushes of `groups`, one after the other.
    async fn flush_segments(&mut self, groups: &BTreeSet<u64>) -> Result<(), String> {
        for (group, disk) in self.groups.iter_mut().filter(|(g, _)| groups.contains(g)) {
            let flushed = disk.log.flush().await;
            // Readers learn what is written (decision 280), also after a failed flush.
            disk.map.borrow_mut().refresh(&disk.log);
            flushed.map_err(|e| format!("group {group:#x}: segments: {e}"))?;
        }
        Ok(())
    }

    async fn execute(&mut self, group: u64, op: PartitionStorageOp) {
        let identity = self.identity;
        let Some(disk) = self.groups.get_mut(&group) else {
            return;
        };
        match op {
            PartitionStorageOp::Append { .. } => unreachable!("appends run in windows"),
            PartitionStorageOp::Truncate { from_op } => {
                if disk.last_persist_failed {
                    self.fail(format!(
                        "group {group:#x}: truncate from op {from_op} refused: the superblock \
                         write before it failed"
                    ));
                    return;
                }
                let truncated = disk.frames.split_off(&from_op);
                let referenced = disk.bodies.split_off(&from_op);
                // Bodies of the truncated prepares written ahead at the segment's tail go once
                // the truncation is durable (decision 414); a referenced one is held by its
                // header alone (decision 443), its reference names where it starts.
                let rewind_to = truncated
                    .values()
                    .filter_map(|(_, f)| send_messages_base(f.bytes()))
                    .chain(referenced.values().map(|b| b.base_offset))
                    .min();
                let now = self.now_us();
                let lsn = match self.wal.submit_truncate(group, from_op, now) {
                    Ok(lsn) => lsn,
                    Err(e) => {
                        self.fail(format!("group {group:#x}: truncate from op {from_op}: {e}"));
                        return;
                    }
                };
                if let Err(e) = self.commit_window().await {
                    self.fail(format!("group {group:#x}: truncate from op {from_op}: {e}"));
                    return;
                }
                self.guard.note(lsn, group, &[]);
                if let Some(offset) = rewind_to
                    && let Err(e) = self.rewind(group, offset).await
                {
                    self.fail(format!("group {group:#x}: truncate from op {from_op}: {e}"));
                }
            }
            PartitionStorageOp::Persist(state) => {
                let op_head = disk.frames.keys().next_back().copied().unwrap_or(0);
                let (written, headers) =
                    persisted_state(disk.superblock.state(), identity, &state, op_head);
                let done = match disk
                    .superblock
                    .write_with_view_headers(&written, &headers)
                    .await
                {
                    Ok(()) => {
                        disk.last_persist_failed = false;
                        mark_superblock(&self.gauges, group);
                        Completion::VsrStatePersisted {
                            view: state.view,
                            log_view: state.log_view,
                        }
                    }
                    Err(e) => {
                        warn!(group, view = state.view, error = %e, "group superblock write failed");
                        disk.last_persist_failed = true;
                        Completion::VsrStatePersistFailed {
                            view: state.view,
                            log_view: state.log_view,
                        }
                    }
                };
                self.done(group, done);
            }
            PartitionStorageOp::Read { op, checksum } => {
                let held = disk
                    .frames
                    .get(&op)
                    .filter(|(_, f)| identity_of(f.bytes()) == checksum)
                    .map(|(_, f)| f.clone());
                let frame = match (held, disk.bodies.get(&op)) {
                    (Some(header), Some(at)) => whole_frame(&disk.log, &header, at).await,
                    (held, _) => held,
                };
                self.done(group, Completion::Read { op, frame });
            }
            PartitionStorageOp::Machine(StorageWork::Batch(bytes)) => {
                let flushed = match self.hold_batch(group, bytes) {
                    Ok(true) => self.flush_segments(&BTreeSet::from([group])).await,
                    Ok(false) => Ok(()),
                    Err(e) => Err(e),
                };
                if let Err(e) = flushed {
                    self.fail(e);
                }
            }
            PartitionStorageOp::Machine(StorageWork::Offsets(table)) => {
                if let Err(e) = disk
                    .offset_store
                    .write(&table, disk.policy.enforce_fsync)
                    .await
                {
                    self.fail(format!("group {group:#x}: offsets: {e}"));
                }
            }
            PartitionStorageOp::Machine(StorageWork::Install {
                offsets,
                staged: Some(staged),
                ..
            }) => {
                if let Err(e) = self.install_staged(group, &staged, &offsets).await {
                    self.fail(format!("group {group:#x}: installing a transfer: {e}"));
                }
            }
            PartitionStorageOp::Machine(StorageWork::Install {
                batches, offsets, ..
            }) => {
                if let Err(e) = self.install(group, &batches, &offsets).await {
                    self.fail(format!("group {group:#x}: installing a transfer: {e}"));
                }
            }
            PartitionStorageOp::Checkpoint {
                op,
                prepare,
                offsets,
                frontier,
                lost_state,
            } => {
                if let Err(e) = self
                    .checkpoint(group, op, prepare, &offsets, frontier, lost_state)
                    .await
                {
                    self.fail(format!("group {group:#x}: checkpoint at op {op}: {e}"));
                    return;
                }
                add(&self.gauges.checkpoints, 1);
                self.done(group, Completion::Checkpointed { op });
            }
        }
    }

    /// Segments synced, offsets synced, then the superblock naming the checkpoint and the
    /// offset frontier; entries below the checkpoint op leave the WAL's hold.
    async fn checkpoint(
        &mut self,
        group: u64,
        op: u64,
        prepare: (u128, u64),
        offsets: &OffsetTable,
        frontier: u64,
        lost_state: bool,
    ) -> Result<(), String> {
        let identity = self.identity;
        let disk = self.groups.get_mut(&group).ok_or("not hosted")?;
        disk.log.sync().await.map_err(|e| e.to_string())?;
        disk.offset_store
            .write(offsets, true)
            .await
            .map_err(|e| e.to_string())?;
        let base = disk
            .superblock
            .state()
            .copied()
            .unwrap_or_else(|| journal::recover::formatted_state(identity));
        let op_head = disk.frames.keys().next_back().copied().unwrap_or(op);
        let state = journal::VsrState {
            checkpoint_op: op,
            checkpoint_prepare_checksum: prepare.0,
            checkpoint_timestamp: prepare.1,
            offset_frontier: frontier.max(base.offset_frontier),
            op_head: op_head.max(base.op_head),
            commit_max: base.commit_max.max(op),
            ..base
        };
        disk.superblock
            .write(&state)
            .await
            .map_err(|e| e.to_string())?;
        mark_superblock(&self.gauges, group);
        disk.checkpoint_op = op;
        disk.frames = disk.frames.split_off(&op);
        disk.bodies = disk.bodies.split_off(&op);
        // Faulty ops up to the checkpoint are durable in it. A loss of unknown end (decision
        // 162: the group rejoined in lost state) is repaired once the replica left lost state,
        // i.e. holds the view's log durably again, and no bounded range remains above the
        // checkpoint: `repaired(.., u64::MAX - 1)` leaves it as `u64::MAX..`, which names no op.
        self.faults
            .repaired(group, op)
            .await
            .map_err(|e| e.to_string())?;
        let only_open = self
            .faults
            .faulty()
            .get(&group)
            .is_some_and(|ranges| ranges.iter().all(|r| r.last.is_none()));
        if only_open && !lost_state {
            self.faults
                .repaired(group, u64::MAX - 1)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    async fn install(
        &mut self,
        group: u64,
        batches: &[Bytes],
        offsets: &OffsetTable,
    ) -> Result<(), String> {
        let storage = self.partitions.clone();
        let disk = self.groups.get_mut(&group).ok_or("not hosted")?;
        let mut artifacts = Vec::new();
        let mut kinds = Vec::new();
        if let Some(first) = batches.first().and_then(|b| journal::batch::peek(b)) {
            artifacts.push(batches.concat());
            kinds.push((ArtifactKind::SEGMENT_LOG, first.base_offset));
        }
        artifacts.push(offsets.encode());
        kinds.push((ArtifactKind::CONSUMER_OFFSETS, 0));
        let listed: Vec<(ArtifactKind, u64, &[u8])> = kinds
            .iter()
            .zip(&artifacts)
            .map(|((k, f), b)| (*k, *f, b.as_slice()))
            .collect();
        let manifest = build_manifest(&listed).map_err(|e| e.to_string())?;
        let (log, _, table) =
            install_partition(storage, &disk.prefix, disk.policy, &manifest, &artifacts)
                .await
                .map_err(|e| e.to_string())?;
        disk.log = log;
        // What a transfer installs is committed. The segments it replaced held the bodies
        // references named: later copies forward copy the prepares whole.
        disk.committed_end = disk.committed_end.max(disk.log.next_offset());
        disk.bodies.clear();
        seals::apart(&mut disk.log);
        disk.map.borrow_mut().refresh(&disk.log);
        disk.offset_store
            .write(&table, true)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Writes a transfer's staged SEGMENT_LOG into the group's segments by chunk (decision 284)
    /// and the offsets table, then maps the new segments for the read path.
    async fn install_staged(
        &mut self,
        group: u64,
        staged: &crate::partition::machine::StagedLog,
        offsets: &OffsetTable,
    ) -> Result<(), String> {
        let storage = self.partitions.clone();
        let disk = self.groups.get_mut(&group).ok_or("not hosted")?;
        let (log, _) = journal::segment::install_from_file(
            storage,
            &disk.prefix,
            disk.policy,
            &staged.name,
            staged.frontier,
            staged.len,
            offsets.next_offset,
        )
        .await
        .map_err(|e| e.to_string())?;
        disk.log = log;
        // What a transfer installs is committed. The segments it replaced held the bodies
        // references named: later copies forward copy the prepares whole.
        disk.committed_end = disk.committed_end.max(disk.log.next_offset());
        disk.bodies.clear();
        seals::apart(&mut disk.log);
        disk.map.borrow_mut().refresh(&disk.log);
        disk.offset_store
            .write(offsets, true)
            .await
            .map_err(|e| e.to_string())
    }

    /// Reclaims the WAL up to what every group no longer needs: below the first record whose
    /// batch its group's segments have not synced (`ReclaimGuard`), and below every group's
    /// entries from its checkpoint op up (decision 164). The group holding the WAL back by
    /// more than `limits.warn_lsns` is counted (`reclaim_blocked`), the segments are forced
    /// synced, and that group's held entries are copied forward to the WAL's head (the same
    /// frames again: replay keeps the newest record of an op), which releases the old files.
    /// A group still holding more than `limits.busy_lsns` after that is refused `Busy` until
    /// it releases.
    async fn reclaim(&mut self) {
        self.last_reclaim_at = self.wal.durable_lsn();
        let floor = self.wal.floor();
        let durable = self.wal.durable_lsn();
        let holder = self.holds(floor).first().copied();
        if let Some((lsn, group)) = holder
            && durable.saturating_sub(lsn) > self.limits.warn_lsns
        {
            add(&self.gauges.reclaim_blocked, 1);
            debug!(
                group,
                lsn, durable, "a lagging group holds the WAL's reclaim"
            );
            if let Err(e) = self.sync_segments().await {
                self.fail(e);
                return;
            }
            // Copying pays only when it frees much more than it writes (a busy group far
            // from its checkpoint would otherwise be copied again every pass).
            let held = self.groups.get(&group).map_or(0, |d| d.frames.len() as u64);
            let cheap = held.saturating_mul(COPY_FORWARD_RATIO) <= durable.saturating_sub(lsn);
            if self.limits.copy_forward
                && cheap
                && let Err(e) = self.copy_forward(group).await
            {
                self.fail(format!(
                    "group {group:#x}: copying held entries forward: {e}"
                ));
                return;
            }
        }
        let durable = self.wal.durable_lsn();
        let holds = self.holds(floor);
        let synced: BTreeMap<u64, u64> = self
            .groups
            .iter()
            .map(|(g, d)| (*g, d.log.synced_offset()))
            .collect();
        let guarded = self
            .guard
            .limit(|g| synced.get(&g).copied().unwrap_or(u64::MAX));
        let limit = holds
            .first()
            .map_or(durable + 1, |(lsn, _)| *lsn)
            .min(guarded);
        self.gauges.wal_lag.store(
            durable.saturating_sub(limit.saturating_sub(1)),
            Ordering::Relaxed,
        );
        let busy: BTreeSet<u64> = holds
            .iter()
            .filter(|(lsn, _)| durable.saturating_sub(*lsn) > self.limits.busy_lsns)
            .map(|(_, group)| *group)
            .collect();
        self.gauges
            .busy_groups
            .store(busy.len() as u64, Ordering::Relaxed);
        *self.busy.borrow_mut() = busy;
        if limit > floor {
            // The files go apart from this task (decision 400): removed here, one after the
            // other, they held every group's windows for about 50 ms each.
            match self.wal.release(limit).await {
                Ok(released) => {
                    add(&self.gauges.wal_files_reclaimed, released.len() as u64);
                    self.retire(released);
                }
                Err(e) => warn!(error = %e, "WAL reclaim failed"),
            }
        }
        self.gauges
            .wal_floor
            .store(self.wal.floor(), Ordering::Relaxed);
    }

    /// The lowest lsn each group still needs, lowest first (groups replayed but not booted
    /// keep their records at the floor).
    fn holds(&self, floor: u64) -> Vec<(u64, u64)> {
        let mut holds: Vec<(u64, u64)> = self
            .groups
            .iter()
            .filter_map(|(g, d)| d.hold(floor).map(|lsn| (lsn, *g)))
            .collect();
        holds.extend(
            self.replay
                .groups
                .iter()
                .filter(|(_, ops)| !ops.is_empty())
                .map(|(g, _)| (floor, *g)),
        );
        holds.sort_unstable();
        holds
    }

    /// Syncs every group's segments that hold unsynced batches (a forced flush point, journal.md
    /// §4: WAL reclamation).
    async fn sync_segments(&mut self) -> Result<(), String> {
        for (group, disk) in self.groups.iter_mut() {
            // A group whose seal runs apart is synced when it is done (decision 355); its
            // synced offset holds the WAL meanwhile.
            if disk.log.synced_offset() < disk.log.next_offset() && !disk.log.is_sealing() {
                disk.log
                    .sync()
                    .await
                    .map_err(|e| format!("group {group:#x}: segments: {e}"))?;
            }
        }
        Ok(())
    }

    /// Appends `group`'s held entries again at the WAL's head, in op order, in one window.
    async fn copy_forward(&mut self, group: u64) -> Result<(), WalError> {
        let Some(disk) = self.groups.get(&group) else {
            return Ok(());
        };
        let frames: Vec<(u64, Frame, Option<BodyRef>)> = disk
            .frames
            .iter()
            .map(|(op, (_, f))| (*op, f.clone(), disk.bodies.get(op).copied()))
            .collect();
        let mut moved = Vec::with_capacity(frames.len());
        for (op, frame, body) in frames {
            let now = self.now_us();
            let mut lsn = self.submit(group, &frame, body.as_ref(), now);
            if matches!(lsn, Err(WalError::WindowFull { .. })) {
                self.commit_window().await?;
                lsn = self.submit(group, &frame, body.as_ref(), now);
            }
            moved.push((op, lsn?.0, frame));
        }
        self.commit_window().await?;
        add(&self.gauges.copied_forward, moved.len() as u64);
        let disk = self.groups.get_mut(&group).expect("checked above");
        for (op, lsn, frame) in moved {
            self.guard.note(lsn, group, frame.bytes());
            disk.frames.insert(op, (lsn, frame));
        }
        Ok(())
    }

    /// Boots one group's disk and hands the pump what the core recovers from.
    async fn boot_group(&mut self, group: u64, policy: FlushPolicy) {
        if self.groups.contains_key(&group) {
            return;
        }
        let prefix = group_prefix(group);
        let marker = match self.check_incarnation(group, &prefix).await {
            Ok(Some(marker)) => marker,
            Ok(None) => return, // removed
            Err(e) => {
                error!(group, error = %e, "partition incarnation marker unusable; the group stays down");
                return;
            }
        };
        let (replayed, bodies) = self.replay.take(group);
        let mut boot = match journal::recover_partition(
            self.partitions.clone(),
            &prefix,
            self.identity,
            policy,
            replayed,
            &bodies,
        )
        .await
        {
            Ok(boot) => boot,
            Err(e) => {
                // The partition is tombstoned; the rest of the node runs (journal.md §4.1).
                error!(group, error = %e, "partition group cannot boot; it stays down");
                return;
            }
        };
        // Referenced bodies not found intact: their prepares may have been acknowledged, so
        // they are faulty (repaired from peers, never nacked), durably before the group
        // journals anything (decision 414).
        for op in std::mem::take(&mut boot.unresolved) {
            warn!(
                group = format!("{group:#x}"),
                op, "a referenced message batch is not intact in the segments; the op is faulty"
            );
            let ops = journal::boot::FaultyOps {
                first: op,
                last: Some(op),
            };
            if let Err(e) = self.faults.add(group, ops).await {
                error!(group, error = %e, "recording faulty ops failed; the group stays down");
                return;
            }
        }
        if boot.tail_cut > 0 {
            info!(
                group = format!("{group:#x}"),
                bytes = boot.tail_cut,
                "segment tail that no journaled prepare names was cut"
            );
        }
        // Each replayed prepare becomes one shared frame: the core's recovery and the group's
        // held entries (a referenced one by its header, decision 443) take it without a copy.
        let replayed: BTreeMap<u64, Frame> = std::mem::take(&mut boot.frames)
            .into_iter()
            .map(|(op, f)| (op, Frame::new(f)))
            .collect();
        let checkpoint_op = boot.state.map_or(0, |s| s.checkpoint_op);
        let frontier = boot.state.map_or(0, |s| s.offset_frontier);
        // One pass over the segments by chunk rebuilds the tail and the log's checksum; the
        // older batches stay on disk (decision 283). The machine is restored at the checkpoint
        // exactly: batches flushed after it come back through the replay (a store judged
        // against a later offset could differ).
        let files: Rc<dyn SegmentFiles> = Rc::new(StorageFiles(self.partitions.clone()));
        let map = SegmentMap {
            files: Some(files.clone()),
            dir: self.partitions.local_dir().map(ToOwned::to_owned),
            ..SegmentMap::default()
        };
        let map = Rc::new(RefCell::new(map));
        map.borrow_mut().refresh(&boot.log);
        let mapped = map.borrow().clone();
        let keep = self.read_cache_bytes.min(self.tail_share.get());
        let scanned = reader::scan(&mapped, &*files, frontier, keep).await;
        let scanned = match scanned {
            Ok(scan) => scan,
            Err(e) => {
                error!(group, error = %e, "partition segments unreadable; the group stays down");
                return;
            }
        };
        let mut offsets = boot.offsets.clone();
        offsets.next_offset = frontier;
        let machine = PartitionStateMachine::from_scan(
            GroupId(group),
            scanned,
            offsets,
            map.clone(),
            self.read_cache_bytes,
        )
        // The shard's budget bounds every tail beside its own (decision 424).
        .map(|m| m.with_tail_share(self.tail_share.clone()));
        let machine = match machine {
            // A received transfer stages in this directory (decision 220).
            Ok(m) => m.with_staging_dir(self.partitions.local_dir().map(ToOwned::to_owned)),
            Err(e) => {
                error!(group, error = %e, "partition segments inconsistent; the group stays down");
                return;
            }
        };
        let mut superblock = boot.state.and_then(|_| core_state(&boot.superblock));
        let faults = self
            .faults
            .faulty()
            .get(&group)
            .cloned()
            .unwrap_or_default();
        let mut lost_state = false;
        for range in &faults {
            match range.last {
                Some(last) => {
                    if let Some(sb) = superblock.as_mut() {
                        sb.held_ceiling = sb.held_ceiling.max(last);
                    }
                }
                // `u64::MAX..` is a repaired loss (see `checkpoint`).
                None if range.first == u64::MAX => {}
                None => lost_state = true,
            }
        }
        // Decision 240: in a rejoined directory a group without a superblock state may have
        // acknowledged prepares in the life before the wipe; it boots lost, and the core
        // persists the mark before it sends anything (its sends wait for the superblock).
        let rejoin = self.rejoin && !self.gauges.rejoin_cleared.load(Ordering::Acquire);
        let rejoin_lost = crate::boot::boots_lost_by_stamp(rejoin, superblock.as_ref());
        if superblock.is_some() {
            mark_superblock(&self.gauges, group);
        }
        lost_state |= rejoin_lost;
        let frames: Vec<Frame> = replayed
            .range(checkpoint_op..)
            .map(|(_, f)| f.clone())
            .collect();
        let recovered = Recovered {
            snapshot_op: checkpoint_op,
            snapshot_checksum: boot.state.map_or(0, |s| s.checkpoint_prepare_checksum),
            snapshot_timestamp: boot.state.map_or(0, |s| s.checkpoint_timestamp),
            frames,
            offset_frontier: frontier,
            lost_state,
            superblock,
            incarnation: incarnation(),
            ..Recovered::default()
        };
        info!(
            group = format!("{group:#x}"),
            checkpoint_op,
            replayed = recovered.frames.len(),
            next_offset = boot.next_offset,
            lost_state =
                recovered.lost_state || recovered.superblock.as_ref().is_some_and(|s| s.lost_state),
            rejoin_lost,
            "partition group recovered"
        );
        let mut log = boot.log;
        seals::apart(&mut log);
        let disk = GroupDisk {
            prefix,
            policy,
            superblock: boot.superblock,
            log,
            offset_store: boot.offset_store,
            bodies: bodies
                .range(checkpoint_op..)
                .filter(|(op, _)| replayed.contains_key(op))
                .map(|(op, b)| (*op, *b))
                .collect(),
            frames: replayed
                .range(checkpoint_op..)
                .map(|(op, f)| (*op, (0, held_frame(f.clone(), bodies.get(op)))))
                .collect(),
            checkpoint_op,
            committed_end: frontier,
            last_persist_failed: false,
            map,
        };
        self.groups.insert(group, disk);
        self.inbox.push(Event::Booted(Box::new(BootedGroup {
            group,
            recovered,
            machine,
            incarnation: marker,
        })));
    }

    /// Before a group boots: its directory's incarnation against the committed metadata
    /// (decision 342). A dead one is removed (`Ok(None)`); a live key without a marker gets
    /// one, durably, before the group journals anything. `Ok(Some(marker))` otherwise.
    async fn check_incarnation(
        &mut self,
        group: u64,
        prefix: &str,
    ) -> Result<Option<Option<u64>>, String> {
        let (mut store, marker) =
            crate::partition::lifecycle::open_marker(self.partitions.clone(), prefix)
                .await
                .map_err(|e| e.to_string())?;
        let state = self.metadata.view().state.clone();
        match crate::partition::lifecycle::verdict(&state, group, marker) {
            crate::partition::lifecycle::Verdict::Dead => {
                drop(store);
                self.remove_group(group).await;
                Ok(None)
            }
            crate::partition::lifecycle::Verdict::Live(live) if marker.is_none() => {
                crate::partition::lifecycle::write_marker(&mut store, live)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Some(Some(live)))
            }
            _ => Ok(Some(marker)),
        }
    }

    /// Removes a group whose deletion committed (decision 342; the order and why a crash at
    /// any step is safe: `partition::lifecycle`): its state here (and so its hold on the WAL),
    /// a WAL truncate from op 0, then its files, the marker last.
    async fn remove_group(&mut self, group: u64) {
        self.groups.remove(&group);
        self.queues.early.borrow_mut().remove(&group);
        self.late.remove(&group);
        self.replay.take(group);
        self.queues.groups.borrow_mut().remove(&group);
        let now = self.now_us();
        let truncated = match self.wal.submit_truncate(group, 0, now) {
            Ok(lsn) => match self.commit_window().await {
                Ok(_) => {
                    self.guard.note(lsn, group, &[]);
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = truncated {
            self.fail(format!("group {group:#x}: removal: WAL truncate: {e}"));
            return;
        }
        match crate::partition::lifecycle::remove_files(&self.partitions, &group_prefix(group))
            .await
        {
            Ok(files) => {
                add(&self.gauges.groups_removed, 1);
                info!(
                    group = format!("{group:#x}"),
                    files, "partition group removed"
                );
            }
            Err(e) => {
                // The marker stays while anything else does: the next boot finishes.
                warn!(group, error = %e, "removing a deleted group's files failed");
            }
        }
        self.inbox.push(Event::Removed { group });
    }

    /// SIGTERM: the committed partition data reaches disk (segments and offsets synced), and
    /// the WAL's durable end is recorded.
    async fn shutdown(&mut self) {
        if self.fatal.borrow().is_some() {
            return;
        }
        for (group, disk) in self.groups.iter_mut() {
            if let Err(e) = disk.log.sync().await {
                warn!(group, error = %e, "syncing segments at shutdown failed");
            }
        }
        if let Err(e) = self.wal.record_end().await {
            warn!(error = %e, "recording the WAL's durable end at shutdown failed");
        }
    }
}

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

    /// Sets each group's in-memory tail budget (decision 280); takes effect for groups booted
    /// after the call (the node sets it before the pump runs).
    /// The shard-wide tail budget (decision 424).
    pub fn set_read_cache_shard_bytes(&self, bytes: usize) {
        self.read_cache_shard_bytes.set(bytes);
    }

    pub fn set_read_cache_bytes(&self, bytes: usize) {
        self.read_cache_bytes.set(bytes);
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
                let (appending, pressed) = apply_storage_pressure(
                    groups.values_mut().map(|h| &mut h.replica),
                    SHARD_APPENDING_BYTES_MAX,
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

/// Sets every replica's storage pressure from the total of their incomplete appends against
/// `bound` (decision 505), once per tick: between ticks the total may pass the bound by what
/// one tick brings in. Returns the total and whether it reached the bound.
fn apply_storage_pressure<'a, S: consensus::StateMachine + 'a>(
    replicas: impl Iterator<Item = &'a mut consensus::Replica<S>>,
    bound: u64,
) -> (u64, bool) {
    let mut replicas: Vec<_> = replicas.collect();
    let total: u64 = replicas.iter().map(|r| r.appending_bytes()).sum();
    let pressed = total >= bound;
    for r in &mut replicas {
        r.set_storage_pressure(pressed);
    }
    (total, pressed)
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
mod affinity_tests {
    use super::Affinity;

    /// Nothing is due until the lead has held one view for a heartbeat timeout; then each
    /// backup group once per heartbeat timeout; a new view or a lost lead starts over.
    #[test]
    fn takeovers_wait_for_a_steady_lead_and_repeat_once_per_timeout() {
        let mut a = Affinity::default();
        let groups = || [1u64, 2].into_iter();
        assert!(a.due(0, None, 10, groups()).is_empty());
        assert!(a.due(1, Some(3), 10, groups()).is_empty(), "lead just seen");
        assert!(a.due(10, Some(3), 10, groups()).is_empty());
        assert_eq!(a.due(11, Some(3), 10, groups()), vec![1, 2]);
        assert!(
            a.due(12, Some(3), 10, groups()).is_empty(),
            "once per timeout"
        );
        assert_eq!(
            a.due(20, Some(3), 10, [2u64].into_iter()),
            Vec::<u64>::new()
        );
        assert_eq!(a.due(21, Some(3), 10, groups()), vec![1, 2]);
        assert!(
            a.due(40, Some(4), 10, groups()).is_empty(),
            "a new view starts over"
        );
        assert!(a.due(45, None, 10, groups()).is_empty());
        assert!(
            a.due(60, Some(4), 10, groups()).is_empty(),
            "the lead was lost"
        );
        assert_eq!(a.due(70, Some(4), 10, groups()), vec![1, 2]);
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
#[path = "partition/pressure_tests.rs"]
mod pressure_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use journal::MemStorage;
    use journal::mem::FailOp;
    use wire::header::{FrameHeader, Layout, PrepareHeader};
    use wire::{Command, Operation, PartitionKey, Sender};

    /// The inbox holds at most `INBOX_BYTES_MAX` of frames however few they are (decision 503):
    /// a shard whose pump did not run took in 8,192 one-megabyte prepares before. Beyond the
    /// bound a frame is dropped and counted, and room comes back as the pump takes frames out.
    #[test]
    fn the_inbox_holds_a_bounded_number_of_bytes() {
        use crate::inbox_bound::INBOX_BYTES_MAX;
        let gauges = Arc::new(PartitionGauges::default());
        let inbox = Inbox::new(gauges.clone());
        let frame = || Event::Frame {
            from: 1,
            group: 7,
            bytes: Bytes::from(vec![0u8; 1 << 20]),
        };
        let fits = INBOX_BYTES_MAX >> 20;
        assert!(
            fits < INBOX_FRAMES_MAX,
            "the byte bound is the one that bites here"
        );
        for _ in 0..fits {
            assert!(inbox.push(frame()));
        }
        assert!(!inbox.push(frame()), "one megabyte more is over the bound");
        assert_eq!(gauges.dropped_full.load(Ordering::Relaxed), 1);
        // Events the pump must see are never refused.
        assert!(inbox.push(Event::Removed { group: 7 }));
        assert!(inbox.pop().is_some());
        assert!(inbox.push(frame()), "room again once the pump took one out");
        assert!(!inbox.push(frame()));
        assert_eq!(gauges.dropped_full.load(Ordering::Relaxed), 2);
    }

    /// A storage task over in-memory disks as a test drives it (replica 0 of 3, default WAL and
    /// limits, a fresh boot of `wal`), with the handles the test reads back.
    pub(super) struct TestTask {
        pub task: StorageTask<MemStorage>,
        pub queues: Rc<Queues>,
        pub inbox: Rc<Inbox>,
        pub fatal: Rc<RefCell<Option<String>>>,
        pub gauges: Arc<PartitionGauges>,
    }

    /// Runs `body` on a fresh executor (256 KiB of io memory) with a WAL disk, a partition
    /// disk and [`test_task`] over them (no metadata), and returns what it returns.
    pub(super) fn with_test_task<T, F>(
        body: impl FnOnce(MemStorage, MemStorage, TestTask) -> F + Send + 'static,
    ) -> T
    where
        T: Send + 'static,
        F: std::future::Future<Output = T> + 'static,
    {
        with_test_task_wal(WalConfig::default(), body)
    }

    /// [`with_test_task`] with a WAL of `config`.
    pub(super) fn with_test_task_wal<T, F>(
        config: WalConfig,
        body: impl FnOnce(MemStorage, MemStorage, TestTask) -> F + Send + 'static,
    ) -> T
    where
        T: Send + 'static,
        F: std::future::Future<Output = T> + 'static,
    {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(256 << 10)
            .spawn(move || async move {
                let (wal, parts) = (MemStorage::new(), MemStorage::new());
                let task = test_task_wal(&wal, &parts, MetadataReader::default(), config).await;
                body(wal, parts, task).await
            })
            .unwrap()
            .join()
            .unwrap()
    }

    pub(super) async fn test_task(
        wal: &MemStorage,
        parts: &MemStorage,
        metadata: MetadataReader,
    ) -> TestTask {
        test_task_wal(wal, parts, metadata, WalConfig::default()).await
    }

    async fn test_task_wal(
        wal: &MemStorage,
        parts: &MemStorage,
        metadata: MetadataReader,
        config: WalConfig,
    ) -> TestTask {
        let identity = journal::Identity {
            cluster: 42,
            replica_id: 0,
            replica_count: 3,
        };
        let booted = boot_shard(wal.clone(), config, &BTreeMap::new())
            .await
            .unwrap();
        let gauges = Arc::new(PartitionGauges::default());
        let inbox = Rc::new(Inbox::new(gauges.clone()));
        let queues = Rc::new(Queues::default());
        let fatal = Rc::new(RefCell::new(None));
        let timeline: Rc<Timeline> = Rc::default();
        let task = StorageTask {
            partitions: parts.clone(),
            identity,
            wal: booted.wal,
            guard: ReclaimGuard::default(),
            faults: booted.faults,
            replay: booted.replay,
            groups: BTreeMap::new(),
            queues: queues.clone(),
            inbox: inbox.clone(),
            fatal: fatal.clone(),
            gauges: gauges.clone(),
            busy: Rc::default(),
            started: Instant::now(),
            limits: ReclaimLimits::default(),
            last_reclaim_at: 0,
            rejoin: false,
            metadata,
            read_cache_bytes: crate::partition::machine::READ_CACHE_BYTES,
            tail_share: Rc::new(Cell::new(crate::partition::machine::READ_CACHE_BYTES)),
            timeline: timeline.clone(),
            retiring: Rc::default(),
            away: away::AwayShared::new(queues.clone(), inbox.clone(), timeline, fatal.clone()),
            late: BTreeMap::new(),
            late_open: false,
        };
        TestTask {
            task,
            queues,
            inbox,
            fatal,
            gauges,
        }
    }

    /// The `Appended` completions in `inbox`, as `(group, op)`, into `into`.
    pub(super) fn appended_into(inbox: &Inbox, into: &mut BTreeSet<(u64, u64)>) {
        while let Some((_, e)) = inbox.pop() {
            if let Event::Done {
                group,
                completion: Completion::Appended { op, .. },
            } = e
            {
                into.insert((group, op));
            }
        }
    }

    /// Yields until `into` holds `want` appends or the other tasks made no progress in many
    /// turns (the in-memory disk answers at once, so a stuck task stays stuck however long it
    /// runs).
    /// Closes the storage task's queues, waits for the task to stop, and checks that it never
    /// failed.
    pub(super) async fn stop(
        queues: &Queues,
        running: glommio::Task<()>,
        fatal: &RefCell<Option<String>>,
    ) {
        queues.closed.set(true);
        queues.wake();
        running.await;
        assert_eq!(*fatal.borrow(), None);
    }

    pub(super) async fn settle(inbox: &Inbox, into: &mut BTreeSet<(u64, u64)>, want: usize) {
        for _ in 0..10_000 {
            appended_into(inbox, into);
            if into.len() >= want {
                return;
            }
            glommio::executor().yield_now().await;
        }
    }

    pub(super) fn group(partition: u32) -> u64 {
        GroupId::partition(PartitionKey {
            stream: 1,
            topic: 1,
            partition,
        })
        .unwrap()
        .0
    }

    /// A sealed partition prepare of `op` in `group` (a StoreConsumerOffset body).
    pub(super) fn prepare(group: u64, op: u64) -> Frame {
        prepare_of(group, op, Operation::StoreConsumerOffset, &[op as u8; 64])
    }

    /// Messages in a [`send_messages`] batch.
    pub(super) const SEND_BATCH: u64 = 80;

    /// A sealed SendMessages prepare of `op` in `group` whose batch of [`SEND_BATCH`] 1000-byte
    /// messages starts at `base_offset`: more than [`REF_BODY_MIN`](super::REF_BODY_MIN), so
    /// it is written once at its segment's tail and referenced from the WAL (decision 414).
    pub(super) fn send_messages(group: u64, op: u64, base_offset: u64) -> Frame {
        let (frame, body) = send_batch(group, op, base_offset, SEND_BATCH);
        assert!(body.len() >= super::REF_BODY_MIN);
        frame
    }

    /// A sealed SendMessages prepare of `op` in `group` whose batch of `messages` 1000-byte
    /// messages starts at `base_offset`, and the batch.
    pub(super) fn send_batch(
        group: u64,
        op: u64,
        base_offset: u64,
        messages: u64,
    ) -> (Frame, Vec<u8>) {
        let payload = vec![op as u8; 1000];
        let payloads: Vec<&[u8]> = (0..messages).map(|_| &payload[..]).collect();
        let body = journal::batch::build(0, base_offset, 1_000 + op, &payloads);
        (prepare_of(group, op, Operation::SendMessages, &body), body)
    }

    fn prepare_of(group: u64, op: u64, operation: Operation, body: &[u8]) -> Frame {
        let mut header = PrepareHeader::zeroed();
        header.frame = FrameHeader::new(
            Command::Prepare,
            Sender {
                cluster: 42,
                replica: 0,
                view: 1,
            },
        );
        header.op.set(op);
        header.commit.set(op - 1);
        header.timestamp.set(1_000 + op);
        header.operation = operation.byte();
        header.group.set(group);
        wire::encode::finish_header(&mut header, body).unwrap();
        let mut frame = header.bytes().to_vec();
        frame.extend_from_slice(body);
        Frame::new(frame)
    }

    /// Runs the storage task over `groups` groups with `appends` appends each, queued at once,
    /// after `before` ran on the WAL's storage. Returns the events it sent back, the fatal
    /// cause, the WAL's fdatasyncs during the run, and the gauges.
    /// `(group, op)` of every `Appended`, the fatal cause, the WAL's fdatasyncs, the gauges.
    type AppendRun = (Vec<(u64, u64)>, Option<String>, u64, Arc<PartitionGauges>);
    /// [`AppendRun`] and each group's segment end offset after the run.
    type AppendRunWithEnds = (
        Vec<(u64, u64)>,
        Option<String>,
        u64,
        Arc<PartitionGauges>,
        Vec<u64>,
    );

    fn run_appends(
        groups: u32,
        appends: u64,
        before: impl FnOnce(&MemStorage) + Send + 'static,
    ) -> AppendRun {
        let (events, fatal, syncs, gauges, _) = run_appends_with(groups, appends, false, before);
        (events, fatal, syncs, gauges)
    }

    /// [`run_appends`]; with `batches`, each append is followed in its group's queue by a
    /// committed batch of 1024 messages for the segments (a flush due after each), as the pump
    /// queues them when ops commit while later ones are being appended. Also returns the
    /// next offset of each group's segments as reopened from the partition directory after it.
    fn run_appends_with(
        groups: u32,
        appends: u64,
        batches: bool,
        before: impl FnOnce(&MemStorage) + Send + 'static,
    ) -> AppendRunWithEnds {
        with_test_task(move |wal_disk, parts, t| async move {
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                gauges,
            } = t;
            for p in 0..groups {
                queues.boot(group(p), FlushPolicy::default());
            }
            let payloads: Vec<&[u8]> = (0..1024).map(|_| &b"12345678"[..]).collect();
            for op in 1..=appends {
                for p in 0..groups {
                    let frame = prepare(group(p), op);
                    queues.push(group(p), PartitionStorageOp::Append { op, frame });
                    if batches {
                        let base = (op - 1) * 1024;
                        let batch = journal::batch::build(u64::from(p), base, op, &payloads);
                        let work = StorageWork::Batch(Bytes::from(batch));
                        queues.push(group(p), PartitionStorageOp::Machine(work));
                    }
                }
            }
            before(&wal_disk);
            let syncs = wal_disk.counts().1;
            queues.closed.set(true);
            task.run().await;
            let syncs = wal_disk.counts().1 - syncs;
            let mut ends = Vec::new();
            for p in 0..groups {
                let prefix = group_prefix(group(p));
                let policy = FlushPolicy::default();
                let (log, _) = PartitionLog::open(parts.clone(), &prefix, policy, 0)
                    .await
                    .unwrap();
                ends.push(log.next_offset());
            }
            let mut events = Vec::new();
            while let Some((_, e)) = inbox.pop() {
                events.push(e);
            }
            // A booted group's machine shares its segment map (`Rc`): the events stay
            // on the executor's thread, their appends leave.
            let events = appended(&events);
            let fatal = fatal.borrow().clone();
            (events, fatal, syncs, gauges, ends)
        })
    }

    fn appended(events: &[Event]) -> Vec<(u64, u64)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Done {
                    group,
                    completion: Completion::Appended { op, .. },
                } => Some((*group, *op)),
                _ => None,
            })
            .collect()
    }

    /// Appends of several groups queued together go into one WAL window: one write, one
    /// `fdatasync` for all of them (plus the durable-end record written when the WAL goes
    /// idle and at shutdown), and each group's completions come back in its op order.
    #[test]
    fn appends_of_many_groups_share_one_window_and_one_fdatasync() {
        let (events, fatal, syncs, gauges) = run_appends(3, 10, |_| {});
        assert_eq!(fatal, None);
        let done = events;
        assert_eq!(done.len(), 30);
        for p in 0..3 {
            let ops: Vec<u64> = done
                .iter()
                .filter(|(g, _)| *g == group(p))
                .map(|(_, op)| *op)
                .collect();
            assert_eq!(ops, (1..=10).collect::<Vec<_>>(), "group {p} in op order");
        }
        assert_eq!(gauges.wal_commits.load(Ordering::Relaxed), 1);
        assert_eq!(gauges.appends.load(Ordering::Relaxed), 30);
        assert!(
            syncs <= 3,
            "{syncs} WAL fdatasyncs for 30 appends: one window, the durable-end records"
        );
    }

    /// A window whose `fdatasync` fails acknowledges none of its appends, and the node stops.
    #[test]
    fn a_failed_window_sync_acknowledges_nothing() {
        let (events, fatal, _, _) = run_appends(2, 5, |wal| wal.fail_next(FailOp::Sync));
        assert!(fatal.is_some_and(|f| f.contains("partition WAL commit")));
        assert_eq!(events, Vec::new(), "no Appended before the sync returned");
    }

    /// Committed batches for the segments queued between a group's appends neither split the
    /// window (every append in one write and one `fdatasync`) nor wait for it: their segment
    /// writes are done in the same pass (every batch is in the segments after it), and every
    /// append is acknowledged.
    #[test]
    fn segment_batches_between_appends_share_the_window_pass() {
        let (events, fatal, syncs, gauges, ends) = run_appends_with(2, 4, true, |_| {});
        assert_eq!(fatal, None);
        assert_eq!(events.len(), 8);
        assert_eq!(gauges.wal_commits.load(Ordering::Relaxed), 1, "one window");
        assert!(syncs <= 3, "{syncs} WAL fdatasyncs");
        assert_eq!(
            ends,
            vec![4 * 1024, 4 * 1024],
            "every batch in the segments"
        );
    }

    /// With segment flushes running beside the window's `fdatasync`, a failed sync still
    /// acknowledges nothing.
    #[test]
    fn a_failed_window_sync_beside_segment_flushes_acknowledges_nothing() {
        let (events, fatal, _, _, _) =
            run_appends_with(2, 4, true, |wal| wal.fail_next(FailOp::Sync));
        assert!(fatal.is_some_and(|f| f.contains("partition WAL commit")));
        assert_eq!(events, Vec::new(), "no Appended before the sync");
    }

    /// The durable-end record of an idle WAL (decision 90) waits until no work came for
    /// [`END_IDLE`] (decision 351): the window's `fdatasync` is the only one while its producer
    /// turns around, a next append within that time finds no end record before its window,
    /// and a WAL left idle is vouched for.
    #[test]
    fn the_idle_end_record_waits_for_a_quiet_wal() {
        let (syncs, quiet, fatal) = with_test_task(|wal_disk, _parts, t| async move {
            let TestTask {
                task,
                queues,
                inbox,
                fatal,
                ..
            } = t;
            queues.boot(group(0), FlushPolicy::default());
            let storage = glommio::spawn_local(task.run());
            let appended = |inbox: &Inbox| {
                let mut n = 0;
                while let Some((_, e)) = inbox.pop() {
                    n += appended(&[e]).len();
                }
                n
            };
            let mut syncs = Vec::new();
            for op in 1..=2 {
                let before = wal_disk.counts().1;
                queues.push(
                    group(0),
                    PartitionStorageOp::Append {
                        op,
                        frame: prepare(group(0), op),
                    },
                );
                let mut seen = 0;
                while seen == 0 {
                    glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                    seen = appended(&inbox);
                }
                // Turned around well inside END_IDLE: the next append comes now.
                syncs.push(wal_disk.counts().1 - before);
            }
            let before = wal_disk.counts().1;
            glommio::timer::sleep(END_IDLE * 3).await;
            let quiet = wal_disk.counts().1 - before;
            queues.closed.set(true);
            queues.wake();
            storage.await;
            let fatal = fatal.borrow().clone();
            (syncs, quiet, fatal)
        });
        assert_eq!(fatal, None);
        assert_eq!(
            syncs,
            vec![1, 1],
            "one fdatasync per append while appends keep coming (no end record between them)"
        );
        assert_eq!(
            quiet, 1,
            "the quiet WAL's end record: one write and fdatasync"
        );
    }
}

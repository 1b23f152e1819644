//! The metadata group's pump and effect executor on shard 0 (issue 10 item 1; the ordering rules
//! are `consensus::io`'s module docs).
//!
//! Two local tasks on shard 0's executor:
//!
//! - the **pump** owns the [`consensus::Replica`]: it serves, in order, the stop flag, a fatal
//!   report, the 10 ms tick (re-armed after it fires), then at most [`TURN_EVENTS_MAX`] events
//!   from the [`Inbox`] (replica-plane frames from the [`MetadataSink`], storage completions,
//!   connection reports) before yielding; it turns every effect into a peer send on the
//!   replica plane, or a [`MetadataStorageOp`] queued for
//! - the **storage task**, which owns the journal, superblock and snapshot store and executes
//!   the queue strictly one operation at a time in emission order. That one rule gives every
//!   ordering the core demands: completions come back in emission order, a `Truncate` lands
//!   after the appends queued before it and before those queued after, and `Appended` is
//!   pushed only after `MetadataJournal::append` returned, which is after its `fdatasync`.
//!   A checkpoint is the snapshot write, then the superblock, then the journal's floor
//!   (`journal::recover::checkpoint`), then `Checkpointed`.
//!
//! Only this module and [`crate::boot`] touch the consensus and journal interfaces.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use consensus::{
    Completion, Effect, Frame, Input, Now, Outbox, Replica, ReplicaId, StateMachine, Status,
    WholeArtifacts,
};
use journal::artifact::Snapshot;
use journal::metadata::JournalError;
use journal::storage::Storage;
use shard::net::{Origin, Plane, Sink};
use shard::pump::TICK;
use shard::runtime::StopSignal;
use tracing::{debug, error, info, warn};
use wire::GroupId;

use crate::boot::{MetadataDisk, encode_snapshot, persisted_state};
use crate::inbox_bound::InboxBound;
use crate::metrics::Gauges;

/// A state machine the node can checkpoint through the shared reference the core hands out
/// (`Replica::state_machine`), at the op the core names in `Effect::Checkpoint`, and restore
/// at boot from the snapshot it wrote.
pub trait Checkpointable: StateMachine {
    /// The artifacts [`Checkpointable::restore`] restores this exact state from.
    fn checkpoint_artifacts(&self, commit_op: u64) -> Vec<consensus::Artifact>;

    /// Replaces the whole state with a checkpoint's artifacts (boot); leaves it untouched on
    /// error.
    fn restore(
        &mut self,
        commit_op: u64,
        artifacts: &[consensus::Artifact],
    ) -> Result<(), consensus::InstallError>;

    /// The origin replica of `client`'s committed session (decision 370); `None` for a
    /// machine that records none.
    fn session_origin(&self, client: u128) -> Option<u8> {
        let _ = client;
        None
    }
}

impl Checkpointable for consensus::DigestStateMachine {
    fn checkpoint_artifacts(&self, commit_op: u64) -> Vec<consensus::Artifact> {
        // 16 bytes of state: a clone costs nothing.
        self.machine.clone().artifacts(commit_op)
    }

    fn restore(
        &mut self,
        commit_op: u64,
        artifacts: &[consensus::Artifact],
    ) -> Result<(), consensus::InstallError> {
        self.machine.install(commit_op, artifacts)
    }
}

/// Events one pump turn handles before it yields to the shard's other tasks (connection
/// readers and writers, the storage task). One `Replica::step` costs microseconds to tens of
/// microseconds (the consensus bench), so 64 steps stay well inside one 10 ms tick, keep the
/// tick on time, and keep the readers draining sockets while a burst is handled.
pub const TURN_EVENTS_MAX: usize = 64;

/// Replica-plane frames waiting in the inbox at most; beyond it, or beyond
/// [`INBOX_BYTES_MAX`](crate::inbox_bound::INBOX_BYTES_MAX) of them, a frame is dropped and
/// counted (VSR retransmits heal drops; completions and connection reports are never dropped).
pub const INBOX_FRAMES_MAX: usize = 4096;

/// One input for the pump.
#[derive(Debug)]
pub enum Event {
    /// A frame from the replica plane that passed the receive checks.
    Frame {
        /// The connection's peer.
        from: u8,
        /// The whole frame.
        bytes: Vec<u8>,
    },
    /// A storage completion.
    Done(Completion),
    /// A client request for the metadata group (the client core of this shard or, over the
    /// mesh, of another). Bounded by the node's connections: each has one request in flight.
    Request(Box<consensus::ClientRequest>),
    /// A peer's lane-0 connection came up or went down.
    Peer {
        /// The peer.
        peer: u8,
        /// Whether connected now.
        connected: bool,
    },
}

/// The pump's inbox: filled by the sink and the storage task on the same shard.
pub struct Inbox {
    events: RefCell<VecDeque<Event>>,
    bound: InboxBound,
    waker: Cell<Option<Waker>>,
    gauges: Arc<Gauges>,
}

impl Inbox {
    /// An empty inbox counting its drops into `gauges`.
    pub fn new(gauges: Arc<Gauges>) -> Inbox {
        Inbox {
            events: RefCell::default(),
            bound: InboxBound::new(INBOX_FRAMES_MAX),
            waker: Cell::new(None),
            gauges,
        }
    }

    fn push(&self, event: Event) {
        if let Event::Frame { bytes, .. } = &event
            && !self.bound.admit(bytes.len())
        {
            self.gauges
                .inbox_dropped_full
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        self.events.borrow_mut().push_back(event);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    /// Queues a client request for the pump.
    pub fn push_request(&self, request: consensus::ClientRequest) {
        self.push(Event::Request(Box::new(request)));
    }

    fn pop(&self) -> Option<Event> {
        let event = self.events.borrow_mut().pop_front()?;
        if let Event::Frame { bytes, .. } = &event {
            self.bound.release(bytes.len());
        }
        Some(event)
    }

    fn wake(&self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// The replica plane's sink on shard 0: metadata frames (lane 0) into the pump's inbox.
pub struct MetadataSink {
    /// The pump's inbox.
    pub inbox: Rc<Inbox>,
}

impl Sink for MetadataSink {
    fn frame(&self, origin: Origin, message: &wire::Message<'_>, frame: &[u8]) {
        if message.group() != GroupId::METADATA {
            // Partition groups are not hosted yet.
            self.inbox
                .gauges
                .inbox_dropped_foreign
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        self.inbox.push(Event::Frame {
            from: origin.peer,
            bytes: frame.to_vec(),
        });
    }

    fn connected(&self, origin: Origin) {
        if origin.lane == 0 {
            self.inbox.push(Event::Peer {
                peer: origin.peer,
                connected: true,
            });
        }
    }

    fn disconnected(&self, origin: Origin) {
        if origin.lane == 0 {
            self.inbox.push(Event::Peer {
                peer: origin.peer,
                connected: false,
            });
        }
    }
}

/// A storage effect, in the storage task's queue.
///
/// Not the partition plane's [`crate::partition_group::PartitionStorageOp`]: both carry the core's
/// `Append`, `Truncate`, `PersistVsrState` and `Read` alike, but a metadata checkpoint writes a
/// state-machine [`Snapshot`] and later records the prepare identity it lacked
/// (`CheckpointIdentity`), where a partition checkpoint records its offsets table and frontier
/// in the group's superblock and the group also queues its machine's segment work.
#[derive(Debug)]
pub enum MetadataStorageOp {
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
    /// `Effect::Checkpoint`, with the snapshot taken when it was emitted and the identity and
    /// timestamp of the prepare at its op as the replica knew them then
    /// (`Replica::snapshot_identity`, 0 when unknown; decision 52).
    Checkpoint {
        /// The snapshot.
        snapshot: Snapshot,
        /// `(checksum, timestamp)` of the prepare at `snapshot.op`.
        prepare: (u128, u64),
    },
    /// The prepare identity of checkpoint `op` as the replica knows it when the checkpoint
    /// completed (decision 52: asked again then): recorded if the superblock's checkpoint is
    /// still `op` and was written without one (the replica learned it meanwhile).
    CheckpointIdentity {
        /// The checkpoint op.
        op: u64,
        /// `(checksum, timestamp)` of the prepare at `op`.
        prepare: (u128, u64),
    },
}

#[derive(Default)]
struct StorageQueue {
    ops: RefCell<VecDeque<MetadataStorageOp>>,
    waker: Cell<Option<Waker>>,
    closed: Cell<bool>,
}

impl StorageQueue {
    fn push(&self, op: MetadataStorageOp) {
        self.ops.borrow_mut().push_back(op);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    fn close(&self) {
        self.closed.set(true);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    fn next(&self) -> impl Future<Output = Option<MetadataStorageOp>> + '_ {
        poll_fn(|cx| {
            if let Some(op) = self.ops.borrow_mut().pop_front() {
                return Poll::Ready(Some(op));
            }
            if self.closed.get() {
                return Poll::Ready(None);
            }
            self.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        })
    }
}

/// How the metadata pump ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The stop flag was set; storage drained.
    Stopped,
    /// The core's `Effect::Fatal` or an unrecoverable storage failure; the node must exit with
    /// [`crate::EXIT_FATAL`].
    Fatal(String),
}

fn identity_of(frame: &[u8]) -> u128 {
    frame
        .get(..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u128::from_le_bytes)
}

/// Executes the storage queue one operation at a time, in order, until the queue closes.
async fn storage_task<S: Storage>(
    mut disk: MetadataDisk<S>,
    queue: Rc<StorageQueue>,
    inbox: Rc<Inbox>,
    fatal: Rc<RefCell<Option<String>>>,
    gauges: Arc<Gauges>,
    wedged_after: Option<Duration>,
) {
    // Since when every superblock write has failed (the core retries with backoff; after
    // `cluster.superblock_wedged_fatal_timeout` of failures the node stops, consensus.md
    // section 16 timers table).
    let mut failing_since: Option<Instant> = None;
    // Whether the latest superblock write failed: a truncate must not run then (the core emits
    // a superblock write right before each truncation and relies on it being durable first).
    let mut last_persist_failed = false;
    let fail = |cause: String| {
        error!(cause = %cause, "metadata storage failed; stopping the node");
        fatal.borrow_mut().get_or_insert(cause);
        inbox.wake();
    };
    while let Some(op) = queue.next().await {
        if fatal.borrow().is_some() {
            continue; // the node is stopping: write nothing more
        }
        match op {
            MetadataStorageOp::Append { op, frame } => {
                let started = Instant::now();
                let checksum = identity_of(frame.bytes());
                let done = match disk.journal.append(frame.bytes()).await {
                    // A checkpoint landed above it (a transfer install): its effect is durable
                    // in the snapshot.
                    Ok(()) | Err(JournalError::BelowCheckpoint { .. }) => {
                        gauges.record_append(started.elapsed());
                        Completion::Appended { op, checksum }
                    }
                    Err(e) => {
                        warn!(op, error = %e, "metadata append failed");
                        Completion::AppendFailed { op, checksum }
                    }
                };
                inbox.push(Event::Done(done));
            }
            MetadataStorageOp::Truncate { from_op } => {
                if last_persist_failed {
                    fail(format!(
                        "metadata journal truncate from op {from_op} refused: the superblock \
                         write before it failed"
                    ));
                    continue;
                }
                if let Err(e) = disk.journal.truncate_from(from_op).await {
                    fail(format!("metadata journal truncate from op {from_op}: {e}"));
                }
            }
            MetadataStorageOp::Persist(state) => {
                // Exactly what the core carries (decisions 50-52): the view headers replace the
                // superblock's in the same generation as `log_view`.
                let (written, headers) = persisted_state(
                    disk.superblock.state(),
                    disk.identity,
                    &state,
                    disk.journal.op_head(),
                );
                let done = match disk
                    .superblock
                    .write_with_view_headers(&written, &headers)
                    .await
                {
                    Ok(()) => {
                        failing_since = None;
                        last_persist_failed = false;
                        Completion::VsrStatePersisted {
                            view: state.view,
                            log_view: state.log_view,
                        }
                    }
                    Err(e) => {
                        warn!(view = state.view, error = %e, "superblock write failed");
                        last_persist_failed = true;
                        // One clock reading: the first failure has failed for exactly zero,
                        // however long the thread is descheduled here.
                        let now = Instant::now();
                        let failing_for = now - *failing_since.get_or_insert(now);
                        if let Some(bound) = wedged_after
                            && failing_for >= bound
                        {
                            fail(format!(
                                "superblock writes failing for {failing_for:?} \
                                 (cluster.superblock_wedged_fatal_timeout {bound:?}): {e}"
                            ));
                        }
                        Completion::VsrStatePersistFailed {
                            view: state.view,
                            log_view: state.log_view,
                        }
                    }
                };
                inbox.push(Event::Done(done));
            }
            MetadataStorageOp::Read { op, checksum } => {
                let frame = match disk.journal.read(op).await {
                    Ok(bytes) if identity_of(&bytes) == checksum => Some(Frame::new(bytes)),
                    Ok(_) => None,
                    Err(e) => {
                        debug!(op, error = %e, "metadata journal read");
                        None
                    }
                };
                inbox.push(Event::Done(Completion::Read { op, frame }));
            }
            MetadataStorageOp::CheckpointIdentity { op, prepare } => {
                let Some(base) = disk.superblock.state().copied() else {
                    continue;
                };
                if base.checkpoint_op != op || base.checkpoint_prepare_checksum != 0 {
                    continue;
                }
                let state = journal::VsrState {
                    checkpoint_prepare_checksum: prepare.0,
                    checkpoint_timestamp: prepare.1,
                    ..base
                };
                // Not fatal: without it a restart boots this checkpoint without its identity,
                // as before it was learned; the core's next PersistVsrState records it too.
                if let Err(e) = disk.superblock.write(&state).await {
                    warn!(op, error = %e, "recording the checkpoint's prepare identity failed");
                }
            }
            MetadataStorageOp::Checkpoint { snapshot, prepare } => {
                let op = snapshot.op;
                let base = disk
                    .superblock
                    .state()
                    .copied()
                    .unwrap_or_else(|| journal::recover::formatted_state(disk.identity));
                // The superblock records the prepare identity with the checkpoint; the next
                // boot takes it from there only (decision 52).
                let base = journal::VsrState {
                    checkpoint_prepare_checksum: prepare.0,
                    checkpoint_timestamp: prepare.1,
                    ..base
                };
                match journal::recover::checkpoint(
                    &mut disk.snapshots,
                    &mut disk.superblock,
                    &mut disk.journal,
                    &snapshot,
                    base,
                )
                .await
                {
                    Ok(_) => {
                        gauges
                            .checkpoints
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        inbox.push(Event::Done(Completion::Checkpointed { op }));
                    }
                    Err(e) => fail(format!("metadata checkpoint at op {op}: {e}")),
                }
            }
        }
    }
}

/// Everything the pump needs.
pub struct Pump<S: Storage, M: StateMachine> {
    /// The core's config for the metadata group.
    pub config: consensus::Config,
    /// What boot recovered.
    pub boot: crate::boot::MetadataBoot<S, M>,
    /// Shard 0's replica plane.
    pub plane: Rc<Plane>,
    /// The inbox the plane's sink fills.
    pub inbox: Rc<Inbox>,
    /// The node's stop flag.
    pub stop: StopSignal,
    /// Where the metrics endpoint reads the group's state.
    pub gauges: Arc<Gauges>,
    /// Test-only ([`TEST_REGISTER_ENV`]): while this node is the normal primary, submit a
    /// Register request of its own every this many ticks, so ops commit without a client
    /// plane. `None` in production.
    pub test_register_ticks: Option<u64>,
    /// `cluster.superblock_wedged_fatal_timeout` (`None`: disabled).
    pub superblock_wedged: Option<Duration>,
    /// Where `Effect::Reply` frames go (the shard's client registry); `None`: dropped.
    pub replies: Option<Rc<dyn crate::groups::ReplySink>>,
    /// Where the committed sessions are published for every shard's session check (decision
    /// 126), whenever they change at a commit, and where the replica's catch-up is published
    /// once (decision 397).
    pub sessions: Option<Arc<crate::metadata::view::MetadataHandle>>,
    /// `cluster.dead_node_session_timeout`: the sessions of a peer down this long are ended
    /// by the primary, and this node's stale own sessions always (decision 372); `None`: off.
    pub dead_node_sessions: Option<Duration>,
}

/// Ticks between two scans of the session reaper (100 ms).
const REAP_EVERY_TICKS: u64 = 10;

/// The environment variable that turns on [`Pump::test_register_ticks`] (milliseconds). Only
/// the end-to-end tests set it: there is no client plane yet, and the core proposes no op of
/// its own after a view change, so without it nothing would ever commit.
pub const TEST_REGISTER_ENV: &str = "STRAND_TEST_REGISTER_INTERVAL_MS";

/// Frame bytes shared with the plane's queues without a copy.
struct Shared(Frame);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

fn now(start: Instant, ticks: u64) -> Now {
    let _ = start;
    Now {
        tick: ticks,
        realtime_us: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
    }
}

/// Runs the metadata replica until the stop flag or a fatal failure.
pub async fn run<S, M>(pump: Pump<S, M>) -> Outcome
where
    S: Storage + 'static,
    M: Checkpointable,
{
    let Pump {
        config,
        boot,
        plane,
        inbox,
        stop,
        gauges,
        test_register_ticks,
        superblock_wedged,
        replies,
        sessions,
        dead_node_sessions,
    } = pump;
    let self_id = config.raw().replica;
    let replica_count = config.raw().replica_count;
    let queue = Rc::new(StorageQueue::default());
    let fatal: Rc<RefCell<Option<String>>> = Rc::new(RefCell::new(None));
    let storage = glommio::spawn_local(storage_task(
        boot.disk,
        queue.clone(),
        inbox.clone(),
        fatal.clone(),
        gauges.clone(),
        superblock_wedged,
    ));
    let mut exec = Executor {
        deferred: crate::forward_metrics::Deferred::default(),
        forward_timeout: TICK
            * u32::try_from(config.raw().forward_timeout_ticks).unwrap_or(u32::MAX),
        gauges: gauges.clone(),
        plane,
        queue: queue.clone(),
        fatal: fatal.clone(),
        replies,
        sessions,
        published: None,
        gate: crate::reply_gate::ReplyGate::new(self_id.0, replica_count),
    };
    let mut out = Outbox::new();
    let start = Instant::now();
    let mut ticks = 0u64;
    let mut replica = Replica::new(config, boot.recovered, boot.state_machine, &mut out);
    exec.run(&replica, &mut out);
    let mut reaper = dead_node_sessions
        .map(|bound| crate::session_reaper::Reaper::new(self_id.0, replica_count, bound, start));
    // Down peers are reported at boot; the sink reports each later change.
    for peer in (0..replica_count).filter(|&p| p != self_id.0) {
        if let Some(reaper) = &mut reaper {
            reaper.peer(peer, exec.plane.is_connected(peer, 0), Instant::now());
        }
        if !exec.plane.is_connected(peer, 0) {
            gauges.set_peer(peer, false);
            let input = Input::PeerConnection {
                peer: ReplicaId(peer),
                connected: false,
            };
            let _ = replica.step(now(start, ticks), input, &mut out);
            exec.run(&replica, &mut out);
        }
    }
    // Decision 397: partition pumps wait until this replica caught up in this process life.
    let mut catch_up = crate::catch_up::CatchUp::default();
    caught_up(&mut catch_up, &replica, exec.sessions.as_deref());
    gauges.observe(&replica);
    info!(
        replica = self_id.0,
        view = replica.view(),
        op = replica.op(),
        commit = replica.commit_min(),
        status = ?replica.status(),
        "metadata replica running on shard 0"
    );
    let mut next_tick = Instant::now() + TICK;
    let outcome = loop {
        if stop.is_set() {
            break Outcome::Stopped;
        }
        if let Some(cause) = fatal.borrow().clone() {
            break Outcome::Fatal(cause);
        }
        if Instant::now() >= next_tick {
            ticks += 1;
            let _ = replica.step(now(start, ticks), Input::Tick, &mut out);
            exec.run(&replica, &mut out);
            caught_up(&mut catch_up, &replica, exec.sessions.as_deref());
            if exec.gate.is_holding() {
                // Decision 395: a purge's or a delete's reply waits for the backups' applied
                // points; ask for them each tick, or answer 57 once this node leads no more.
                if replica.is_primary() {
                    replica.solicit_applied(&mut out);
                    exec.run(&replica, &mut out);
                } else {
                    for (client, frame) in exec.gate.abandon() {
                        exec.deliver(client, frame);
                    }
                }
            }
            if let Some(every) = test_register_ticks
                && ticks.is_multiple_of(every)
                && replica.is_primary()
                && replica.status() == Status::Normal
            {
                let client = 0x7e57_0000_u128 + u128::from(self_id.0);
                if let Some(reaper) = &mut reaper {
                    reaper.registered(client, Instant::now());
                }
                let request = consensus::ClientRequest::new(
                    client,
                    wire::Operation::Register,
                    0,
                    0,
                    Vec::new(),
                );
                let result = replica.step(now(start, ticks), Input::Request(request), &mut out);
                debug!(?result, op = replica.op(), "test hook: Register submitted");
                exec.run(&replica, &mut out);
            }
            if let Some(reaper) = &mut reaper
                && ticks.is_multiple_of(REAP_EVERY_TICKS)
            {
                end_dead_sessions(reaper, &mut replica, now(start, ticks), &mut out);
                exec.run(&replica, &mut out);
            }
            gauges.observe(&replica);
            next_tick = Instant::now() + TICK;
            continue;
        }
        let mut handled = 0;
        while handled < TURN_EVENTS_MAX {
            let Some(event) = inbox.pop() else { break };
            handled += 1;
            let at = now(start, ticks);
            let _ = match event {
                Event::Frame { from, bytes } => {
                    gauges
                        .forwards
                        .observe(crate::forward_metrics::Direction::Received, &bytes);
                    exec.gate.observe(from, &bytes);
                    let stepped = replica.step(
                        at,
                        Input::Frame {
                            from: ReplicaId(from),
                            frame: &bytes,
                        },
                        &mut out,
                    );
                    let view = replica.view();
                    catch_up.heard(from, &bytes, view, replica.primary_index(view).0);
                    stepped
                }
                Event::Done(done) => {
                    if let Completion::Checkpointed { op } = done {
                        let prepare = replica.snapshot_identity(op);
                        if prepare.0 != 0 {
                            exec.queue
                                .push(MetadataStorageOp::CheckpointIdentity { op, prepare });
                        }
                    }
                    replica.step(at, Input::Done(done), &mut out)
                }
                Event::Request(request) => {
                    let client = request.header.client.get();
                    let header = request.header;
                    if let Some(reaper) = &mut reaper
                        && header.operation == wire::Operation::Register.byte()
                    {
                        reaper.registered(client, Instant::now());
                    }
                    let result = replica.step(at, Input::Request(*request), &mut out);
                    // Every request gets an answer: when the core neither took it nor
                    // answered it, the client hears why (decision 154): a full request queue
                    // is transient (57, the SDK resends); a request the client table drops (the
                    // same number with another body) or a malformed one is refused for good
                    // (4, InvalidFormat), or the SDK would resend it forever.
                    let answered = out
                        .effects()
                        .iter()
                        .any(|e| matches!(e, Effect::Reply { client: c, .. } if c.0 == client));
                    if let (Err(ignored), false) = (&result, answered)
                        && let Some(sink) = &exec.replies
                    {
                        debug!(
                            client,
                            ?ignored,
                            "metadata request neither taken nor answered"
                        );
                        let code = match ignored {
                            consensus::Ignored::Refused | consensus::Ignored::Malformed => {
                                crate::client::status::INVALID_FORMAT
                            }
                            _ => consensus::codes::TRANSIENT_NOT_COMMITTED,
                        };
                        sink.reply(client, crate::client_core::frames::refused(&header, code));
                    }
                    result
                }
                Event::Peer { peer, connected } => {
                    gauges.set_peer(peer, connected);
                    if !connected {
                        exec.gate.forget(peer);
                    }
                    if let Some(reaper) = &mut reaper {
                        reaper.peer(peer, connected, Instant::now());
                    }
                    replica.step(
                        at,
                        Input::PeerConnection {
                            peer: ReplicaId(peer),
                            connected,
                        },
                        &mut out,
                    )
                }
            };
            exec.run(&replica, &mut out);
            caught_up(&mut catch_up, &replica, exec.sessions.as_deref());
            if fatal.borrow().is_some() {
                break;
            }
        }
        if handled > 0 {
            gauges.observe(&replica);
            glommio::executor().yield_now().await;
            continue;
        }
        // Idle: wait for an event or the tick.
        let wait = next_tick.saturating_duration_since(Instant::now());
        let mut timer = std::pin::pin!(glommio::timer::Timer::new(wait));
        poll_fn(|cx| {
            if !inbox.events.borrow().is_empty() || fatal.borrow().is_some() {
                return Poll::Ready(());
            }
            inbox.waker.set(Some(cx.waker().clone()));
            timer.as_mut().poll(cx).map(|_| ())
        })
        .await;
    };
    // Let queued storage finish (completions no one reads any more), then stop the task.
    queue.close();
    storage.await;
    gauges.observe(&replica);
    match fatal.borrow().clone() {
        Some(cause) => Outcome::Fatal(cause),
        None => outcome,
    }
}

/// Publishes, once, that the replica caught up (decision 397). Called after the effects of a
/// step ran, so the view its applies published is in the handle before the flag.
fn caught_up<M: Checkpointable>(
    tracker: &mut crate::catch_up::CatchUp,
    replica: &Replica<M>,
    handle: Option<&crate::metadata::view::MetadataHandle>,
) {
    let state = crate::catch_up::ReplicaState {
        status: replica.status(),
        is_primary: replica.is_primary(),
        view: replica.view(),
        commit_min: replica.commit_min(),
        commit_max: replica.commit_max(),
    };
    if tracker.check(state) {
        info!(
            view = state.view,
            commit = state.commit_min,
            "metadata replica caught up in this process life; partition groups may boot"
        );
        if let Some(handle) = handle {
            handle.set_caught_up();
        }
    }
}

/// One scan of the session reaper (decision 372): a Logout for each session it picks,
/// submitted to the core as a client's would be (a backup forwards it to the primary).
fn end_dead_sessions<M: Checkpointable>(
    reaper: &mut crate::session_reaper::Reaper,
    replica: &mut Replica<M>,
    at: Now,
    out: &mut Outbox,
) {
    let primary = replica.is_primary();
    let normal = replica.status() == Status::Normal;
    let sessions: Vec<crate::session_reaper::Session> = replica
        .sessions()
        .map(|(client, epoch, user)| crate::session_reaper::Session {
            client: client.0,
            epoch,
            user,
            origin: replica.state_machine().session_origin(client.0),
        })
        .collect();
    for (session, reason) in reaper.due(Instant::now(), primary && normal, normal, sessions) {
        info!(
            client = session.client,
            session = session.epoch,
            ?reason,
            "ending a session whose node is gone"
        );
        // Numbered past any request the session may have made: the table check takes it as
        // new; the Logout's reply finds no connection and is dropped.
        let mut request = consensus::ClientRequest::new(
            session.client,
            wire::Operation::Logout,
            session.epoch,
            u64::MAX,
            Vec::new(),
        );
        request
            .header
            .request_checksum
            .set(u128::from(xxhash_rust::xxh3::xxh3_64(&[])));
        request.header.user_id.set(session.user);
        let result = replica.step(at, Input::Request(request), out);
        debug!(
            ?result,
            client = session.client,
            "session-ending Logout submitted"
        );
    }
}

/// Turns effects into I/O.
struct Executor {
    /// Forward frames sent are counted into its `forwards` (decision 330).
    gauges: Arc<Gauges>,
    /// Forward frames held for a deferred first send (decision 331).
    deferred: crate::forward_metrics::Deferred,
    /// The core's forward timeout: how long a held forward frame is offered again.
    forward_timeout: Duration,
    plane: Rc<Plane>,
    queue: Rc<StorageQueue>,
    fatal: Rc<RefCell<Option<String>>>,
    replies: Option<Rc<dyn crate::groups::ReplySink>>,
    sessions: Option<Arc<crate::metadata::view::MetadataHandle>>,
    /// The commit point the sessions were last published at.
    published: Option<u64>,
    /// Purges' and deletes' replies held until enough replicas applied them (decision 395).
    gate: crate::reply_gate::ReplyGate,
}

impl Executor {
    /// Publishes the committed sessions when the commit point moved, before
    /// the step's replies go out: a client that reads its Register's reply finds its session
    /// on every shard.
    fn publish_sessions<M: Checkpointable>(&mut self, replica: &Replica<M>) {
        let Some(handle) = &self.sessions else {
            return;
        };
        let commit = replica.commit_min();
        if self.published == Some(commit) {
            return;
        }
        // Published at every commit (metadata commits are rare): `Sessions::op` tells the
        // session check how far this node's table reaches (decision 153).
        handle.publish_sessions(crate::metadata::view::Sessions::from_table(
            commit,
            replica
                .sessions()
                .map(|(client, session, user)| (client.0, session, user)),
        ));
        self.published = Some(commit);
    }

    fn run<M: Checkpointable>(&mut self, replica: &Replica<M>, out: &mut Outbox) {
        self.publish_sessions(replica);
        if !self.deferred.is_empty() {
            let plane = &self.plane;
            let dropped = self.deferred.retry(Instant::now(), |peer, frame| {
                plane.send(peer, GroupId::METADATA, frame).is_ok()
            });
            self.gauges
                .forwards
                .deferred_dropped
                .fetch_add(dropped as u64, std::sync::atomic::Ordering::Relaxed);
        }
        for effect in out.drain() {
            if self.fatal.borrow().is_some() {
                // Nothing after a fatal effect runs.
                continue;
            }
            match effect {
                Effect::Send { to, frame } => {
                    self.gauges
                        .forwards
                        .observe(crate::forward_metrics::Direction::Sent, frame.bytes());
                    let forward = crate::forward_metrics::is_forward(frame.bytes());
                    let bytes = Bytes::from_owner(Shared(frame));
                    // A full queue or a missing connection is counted by the plane; VSR
                    // retransmits heal it. Forward frames have no retransmission: one that
                    // found no connection is held and offered again (decision 331).
                    let sent = self.plane.send(to.0, GroupId::METADATA, &bytes);
                    if forward && sent == Err(shard::net::SendError::NotConnected) {
                        self.gauges
                            .forwards
                            .deferred
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        self.deferred
                            .hold(to.0, bytes, Instant::now() + self.forward_timeout);
                    }
                }
                Effect::Append { op, frame } => {
                    self.queue.push(MetadataStorageOp::Append { op, frame })
                }
                Effect::Truncate { from_op } => {
                    self.queue.push(MetadataStorageOp::Truncate { from_op })
                }
                Effect::PersistVsrState(state) => {
                    self.queue.push(MetadataStorageOp::Persist(state))
                }
                Effect::Read { op, checksum } => {
                    self.queue.push(MetadataStorageOp::Read { op, checksum })
                }
                Effect::Checkpoint { op } => {
                    // Only what the replica itself knows (decision 52): its journal, the
                    // view's headers, the described head, or the parent of the op above.
                    let prepare = replica.snapshot_identity(op);
                    if prepare.0 == 0 {
                        warn!(
                            op,
                            "checkpoint op's prepare identity unknown yet; recorded as 0"
                        );
                    }
                    let payload = encode_snapshot(
                        prepare.0,
                        prepare.1,
                        &replica.client_table_encoded(),
                        &replica.state_machine().checkpoint_artifacts(op),
                    );
                    self.queue.push(MetadataStorageOp::Checkpoint {
                        snapshot: Snapshot { op, payload },
                        prepare,
                    });
                }
                Effect::Reply { client, frame } => {
                    if let Some(frame) = self.gate.admit(client.0, frame) {
                        self.deliver(client.0, frame);
                    } else {
                        debug!(
                            client = client.0,
                            "reply held until enough replicas applied its op"
                        );
                    }
                }
                Effect::Fatal(reason) => {
                    error!(%reason, "consensus fatal; stopping the node");
                    self.fatal
                        .borrow_mut()
                        .get_or_insert(format!("consensus: {reason}"));
                }
            }
        }
        for (client, frame) in self.gate.release() {
            self.deliver(client, frame);
        }
    }

    fn deliver(&self, client: u128, frame: Frame) {
        match &self.replies {
            Some(sink) => sink.reply(client, frame),
            None => debug!(client, "reply dropped: no client plane"),
        }
    }
}

/// `strand_status`: 0 normal, 1 view change, 2 recovering, 3 transferring.
pub fn status_code(status: Status, transferring: bool) -> u8 {
    if transferring {
        return 3;
    }
    match status {
        Status::Normal => 0,
        Status::ViewChange => 1,
        Status::Recovering => 2,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod wedged_tests {
    use super::*;
    use consensus::DigestStateMachine;
    use journal::mem::FailOp;
    use journal::{JournalConfig, MemStorage};

    fn persist() -> MetadataStorageOp {
        MetadataStorageOp::Persist(consensus::VsrState {
            view: 1,
            log_view: 1,
            commit_max: 0,
            lost_state: false,
            ..consensus::VsrState::default()
        })
    }

    /// Runs the storage task over `ops` (each after a failure injected into the next write when
    /// flagged) and returns what it sent back and the fatal cause, if any.
    fn run(
        wedged_after: Option<Duration>,
        ops: Vec<(bool, MetadataStorageOp)>,
    ) -> (Vec<Event>, Option<String>) {
        let result = std::sync::Arc::new(std::sync::Mutex::new(None));
        let out = result.clone();
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(256 << 10)
            .spawn(move || async move {
                let disk = MemStorage::new();
                let booted = crate::boot::recover(
                    disk.clone(),
                    std::path::Path::new("mem"),
                    journal::Identity {
                        cluster: 42,
                        replica_id: 0,
                        replica_count: 3,
                    },
                    JournalConfig {
                        slot_count: 64,
                        slot_size: 4096,
                    },
                    DigestStateMachine::default(),
                )
                .await
                .unwrap();
                let gauges = Arc::new(Gauges::default());
                let queue = Rc::new(StorageQueue::default());
                let inbox = Rc::new(Inbox::new(gauges.clone()));
                let fatal = Rc::new(RefCell::new(None));
                let task = glommio::spawn_local(storage_task(
                    booted.disk,
                    queue.clone(),
                    inbox.clone(),
                    fatal.clone(),
                    gauges,
                    wedged_after,
                ));
                for (fails, op) in ops {
                    if fails {
                        disk.fail_next(FailOp::Write);
                    }
                    queue.push(op);
                    glommio::timer::Timer::new(Duration::from_millis(5)).await;
                }
                queue.close();
                task.await;
                let mut events = Vec::new();
                while let Some(e) = inbox.pop() {
                    events.push(e);
                }
                *out.lock().unwrap() = Some((events, fatal.borrow().clone()));
            })
            .unwrap()
            .join()
            .unwrap();
        result.lock().unwrap().take().unwrap()
    }

    /// A failed superblock write goes back to the core (which retries); once writes have failed
    /// for `superblock_wedged_fatal_timeout` the node stops. A success resets the clock.
    /// Deterministic: the ops are at least 5 ms apart (a timer never fires early), and a first
    /// failure counts as failing for zero however late the task runs (one clock reading).
    #[test]
    fn failing_superblock_writes_stop_the_node_after_the_timeout() {
        let (events, fatal) = run(None, vec![(true, persist()), (true, persist())]);
        assert_eq!(fatal, None, "disabled: never fatal");
        assert!(events.iter().all(|e| matches!(
            e,
            Event::Done(Completion::VsrStatePersistFailed {
                view: 1,
                log_view: 1
            })
        )));
        let (_, fatal) = run(
            Some(Duration::from_millis(1)),
            vec![(true, persist()), (true, persist())],
        );
        let cause = fatal.expect("fatal after the timeout");
        assert!(cause.contains("superblock_wedged_fatal_timeout"), "{cause}");
        // A success between failures resets the clock.
        let (events, fatal) = run(
            Some(Duration::from_millis(8)),
            vec![(true, persist()), (false, persist()), (true, persist())],
        );
        assert_eq!(fatal, None, "{events:?}");
    }

    /// A truncate never runs after a failed superblock write (the core's write right before a
    /// truncation carries what makes the truncation safe): the node stops instead.
    #[test]
    fn a_truncate_after_a_failed_superblock_write_stops_the_node() {
        let truncate = || MetadataStorageOp::Truncate { from_op: 1 };
        let (_, fatal) = run(None, vec![(false, persist()), (false, truncate())]);
        assert_eq!(fatal, None);
        let (_, fatal) = run(None, vec![(true, persist()), (false, truncate())]);
        let cause = fatal.expect("fatal");
        assert!(
            cause.contains("superblock write before it failed"),
            "{cause}"
        );
        let (_, fatal) = run(
            None,
            vec![(true, persist()), (false, persist()), (false, truncate())],
        );
        assert_eq!(
            fatal, None,
            "a later durable write supersedes the failed one"
        );
    }
}

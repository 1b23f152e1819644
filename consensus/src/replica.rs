//! The replica: state of one VSR group on one node, `new` (recovery), `step` (dispatch) and the
//! read-only accessors the driver and the simulator's checkers use.

use std::collections::{BTreeMap, VecDeque};

use wire::Message;
use wire::header::{Layout, PrepareHeader};

use crate::client_table::ClientTable;
use crate::config::Config;
use crate::forward::Forwards;
use crate::ignored::Ignored;
use crate::io::{ClientRequest, Completion, Effect, Input, Outbox, Recovered};
use crate::journal::{Entry, Journal};
use crate::pipeline::Pipeline;
use crate::repair::{RecentMax, Repair};
use crate::state_machine::StateMachine;
use crate::timer::{Prng, Timer};
use crate::transfer::Transfer;
use crate::types::{ClientId, Frame, GroupId, Now, Plane, ReplicaId, Status, VsrState};
use crate::view_change::ViewChangeState;

/// Every timer of a replica (§6).
#[derive(Debug, Clone, Default)]
pub(crate) struct Timers {
    pub prepare: Timer,
    pub commit_message: Timer,
    pub normal_heartbeat: Timer,
    pub start_view_change: Timer,
    pub do_view_change: Timer,
    pub view_change_status: Timer,
    pub request_start_view: Timer,
    pub repair: Timer,
    /// Superblock write retry after a failure (10 ms doubling to 1 s, §6).
    pub persist_retry: Timer,
}

/// The status moves the core makes (§2, §8, §9): into a view change from any status (a newer
/// view, including from Recovering after its probes), into Recovering only from Normal (a
/// silent primary or a newer view observed), into Normal from any status (a started or
/// adopted view; Normal to Normal is a newer view's StartView, or boot). A view change never
/// falls back to Recovering, and Recovering is never re-entered.
const STATUS_MOVES: &[(Status, Status)] = &[
    (Status::Normal, Status::ViewChange),
    (Status::ViewChange, Status::ViewChange),
    (Status::Recovering, Status::ViewChange),
    (Status::Normal, Status::Recovering),
    (Status::Normal, Status::Normal),
    (Status::ViewChange, Status::Normal),
    (Status::Recovering, Status::Normal),
];

impl<S: StateMachine> Replica<S> {
    /// The one place the status changes: checks the move against [`STATUS_MOVES`], then stops
    /// and starts the timers the new status owns. Set `view` first (the view change's timers
    /// depend on whether this replica is the new view's primary). Timers outside these lists
    /// are the callers' (a new primary's prepare and commit timers, a backup's heartbeat).
    pub(crate) fn set_status(&mut self, to: Status) {
        assert!(
            STATUS_MOVES.contains(&(self.status, to)),
            "status move {:?} -> {to:?}",
            self.status
        );
        self.status = to;
        let primary = self.primary_index(self.view) == self.id;
        let status_ticks = self.config.view_change_status_timeout_ticks;
        let t = &mut self.timers;
        match to {
            Status::Normal => {
                t.start_view_change.stop();
                t.do_view_change.stop();
                t.view_change_status.stop();
                t.request_start_view.stop();
            }
            Status::ViewChange => {
                t.normal_heartbeat.stop();
                t.commit_message.stop();
                t.prepare.stop();
                t.do_view_change.stop();
                t.start_view_change
                    .start(self.config.view_change_retransmit_ticks);
                let jitter = self.prng.up_to(status_ticks / 4);
                t.view_change_status.start(status_ticks + jitter);
                if !primary {
                    t.request_start_view
                        .start(self.config.request_start_view_ticks);
                } else {
                    t.request_start_view.stop();
                }
            }
            Status::Recovering => {
                t.normal_heartbeat.stop();
                t.commit_message.stop();
                t.prepare.stop();
                t.start_view_change.stop();
                t.do_view_change.stop();
                t.view_change_status.stop();
                t.request_start_view
                    .start(self.config.request_start_view_ticks);
            }
        }
    }
}

impl Timers {
    /// Counts one tick on every timer; the caller then fires the expired ones.
    pub fn tick(&mut self) {
        for timer in [
            &mut self.prepare,
            &mut self.commit_message,
            &mut self.normal_heartbeat,
            &mut self.start_view_change,
            &mut self.do_view_change,
            &mut self.view_change_status,
            &mut self.request_start_view,
            &mut self.repair,
            &mut self.persist_retry,
        ] {
            timer.tick();
        }
    }
}

/// One VSR group on one node: a synchronous, sans-IO state machine.
///
/// Feed it [`Input`]s with [`Replica::step`]; drain the [`Outbox`] after every step and execute
/// the effects in order. `S` is the replicated state machine the core applies committed ops to.
pub struct Replica<S: StateMachine> {
    pub(crate) config: Config,
    pub(crate) sm: S,
    pub(crate) id: ReplicaId,
    pub(crate) n: usize,
    pub(crate) group: GroupId,

    pub(crate) view: u32,
    pub(crate) log_view: u32,
    /// The pair the superblock records (§8.10).
    pub(crate) durable: (u32, u32),
    /// The last superblock write requested, if its completion is outstanding.
    pub(crate) persisting: Option<(u32, u32, bool)>,
    /// Superblock writes in flight, oldest first: `(view, log_view, lost_state)`.
    pub(crate) writes: VecDeque<(u32, u32, bool)>,
    /// The `lost_state` flag the superblock records.
    pub(crate) lost_state_durable: bool,
    pub(crate) status: Status,
    pub(crate) ceded: bool,
    pub(crate) observed_newer_view: u32,
    pub(crate) incarnation: u128,

    pub(crate) journal: Journal,
    /// The sequencer: highest op of the log head.
    pub(crate) op: u64,
    pub(crate) commit_min: u64,
    pub(crate) commit_max: u64,
    /// Identity of the head prepare (`parent` of the next one).
    pub(crate) last_checksum: u128,
    pub(crate) last_timestamp: u64,
    /// Ops at or below were installed from a snapshot, not journaled here.
    pub(crate) snapshot_op: u64,
    /// The adopted or decided view's headers (StartView body / merged log) not yet journaled
    /// here; bodies arriving by repair or retransmission are verified against them.
    pub(crate) view_headers: BTreeMap<u64, PrepareHeader>,
    /// The highest op whose prepare this replica's journal may have held and no longer holds
    /// (truncated in this incarnation, or dropped at boot). A described op above it that the
    /// journal lacks was never journaled here, so never acked: a DVC nacks it (decision 33).
    pub(crate) held_ceiling: u64,
    /// The header of the log head as the view described it, kept for when the journal does
    /// not hold the head (installed by transfer, or never fetched because already committed):
    /// DVCs and StartViews still describe the head's identity (decision 32). Only meaningful
    /// while it matches `(op, last_checksum)`; see `described_head`.
    pub(crate) head_header: Option<PrepareHeader>,
    /// The highest held-but-faulty op recovered at boot (decision 62), 0 if none: the disk
    /// still names it, so a view whose log ends below it truncates it there too.
    pub(crate) faulty_top: u64,
    /// Recovery barrier (§9.5): no admission until `commit_max >= barrier`.
    pub(crate) recovery_barrier: u64,

    pub(crate) pipeline: Pipeline,
    pub(crate) requests: VecDeque<ClientRequest>,
    pub(crate) prepare_attempts: u32,

    /// The heartbeat counter this group sends (never reset, raised to accepted values).
    pub(crate) heartbeat_counter: u64,
    /// `(view, counter)` of the last accepted Commit heartbeat (freshness is per view).
    pub(crate) heartbeat_accepted: (u32, u64),

    pub(crate) timers: Timers,
    pub(crate) prng: Prng,
    /// Bit `r`: peer `r` has a live connection (chain replication skips the others).
    pub(crate) connected: u32,

    pub(crate) vc: ViewChangeState,
    pub(crate) probe_attempts: u32,
    pub(crate) repair: Repair,
    pub(crate) transfer: Transfer,
    pub(crate) clients: ClientTable,
    pub(crate) forwards: Forwards,
    /// Partition plane: the next message offset to mint (§5.6).
    pub(crate) next_offset: u64,
    /// Partition plane: the offset after the last applied SendMessages batch.
    pub(crate) applied_offset_end: u64,
    /// Scratch buffer for apply output.
    pub(crate) reply_buf: Vec<u8>,
    /// The frame of the [`Input::SharedFrame`] being handled (only during that step): a
    /// prepare journaled from it shares its bytes instead of copying them (decision 264).
    pub(crate) incoming: Option<Frame>,
    /// Frames below this op were dropped from the cache.
    pub(crate) frame_cache_floor: u64,
    /// Consecutive failed superblock writes.
    pub(crate) persist_failures: u32,
    /// Primary: ticks since `commit_max` last advanced while the pipeline was non-empty.
    pub(crate) pipeline_stalled_ticks: u64,
    /// Appends in flight whose entries were truncated: their completions prove nothing.
    pub(crate) stale_appends: Vec<(u64, u128)>,
    /// Prepares forwarded but not journaled while the appends were behind (decision 504),
    /// since boot. A step may both skip one and commit, so its result alone does not tell.
    pub(crate) prepares_skipped_behind: u64,
    /// Set by the driver while the appends of every group it hosts together reach its own
    /// bound (decision 505): this replica then takes a new append only into an empty backlog.
    pub(crate) storage_pressure: bool,
    /// Set by the driver with the pressure: this replica's share of the room left under the
    /// driver's bound (decision 518; `u64::MAX` with no bound). A repair window asks for no
    /// more bytes than this, at least one op.
    pub(crate) storage_room: u64,
    /// The largest of the prepare frames this replica saw last (`size` of their headers,
    /// decisions 506 and 517): sizes its repair windows.
    pub(crate) prepare_size_recent: RecentMax,
    /// A superblock for this group exists on disk. A fresh group writes one before it sends
    /// anything, so a restart after any send is a restart with a prior life (§9.1).
    pub(crate) superblock_written: bool,
    /// Identity of the prepare at `snapshot_op` (0 for op 0, or unknown after a transfer).
    pub(crate) snapshot_checksum: u128,
    /// Timestamp of the prepare at `snapshot_op` (0 when unknown).
    pub(crate) snapshot_timestamp: u64,
    /// The node lost acknowledged state (see `VsrState::lost_state`): it never sends a
    /// DoViewChange nor takes the election fallback until it durably holds the log up to
    /// `lost_until`, the head of the latest view it adopted.
    pub(crate) lost_state: bool,
    pub(crate) lost_until: u64,
    /// While `lost_state`: per peer, the highest view its view-carrying frames (Prepare,
    /// PrepareOk, Commit, StartViewChange, DoViewChange, StartView) showed in this life. Once
    /// `quorum::view_learning(n)` peers reported, their highest view is the lowest view a
    /// lost-state replica may adopt (decision 61).
    pub(crate) view_reports: BTreeMap<u8, u32>,
    /// Highest op such that every op above the snapshot up to it is durably journaled.
    pub(crate) durable_prefix: u64,
    /// The snapshot op the driver confirmed durable (`Completion::Checkpointed`).
    pub(crate) checkpoint_durable: u64,
    /// Highest checkpoint op emitted whose `Completion::Checkpointed` has not arrived.
    pub(crate) checkpoint_pending: Option<u64>,
    /// A state transfer installed: checkpoint at `commit_min` at the end of this step.
    pub(crate) checkpoint_forced: bool,
    /// State transfers installed in this life (observability).
    pub(crate) transfers_installed: u64,
    /// View changes started by `take_over` in this life (observability).
    pub(crate) takeovers: u64,
    /// Primary affinity setbacks in this life (an abdication as primary, or a `take_over` that
    /// did not leave this replica primary) and the tick of the last one: `take_over` backs off
    /// exponentially after them (decision 171).
    pub(crate) setbacks: u32,
    pub(crate) setback_at: u64,
    /// The view the last `take_over` aimed at, until it is judged.
    pub(crate) takeover_view: Option<u32>,
}

impl<S: StateMachine> Replica<S> {
    /// Builds the replica from what the driver recovered (journal.md §3.5 step 8, §9.1).
    ///
    /// `state_machine` must already be restored at `recovered.snapshot_op`. The core replays the
    /// recovered frames up to the commit watermark (the highest `commit` any journaled header
    /// carries; n == 1: the head) into it, rebuilds the client table, and chooses the join
    /// mode: a fresh group or a solo cluster starts Normal; a group with a prior life in a
    /// multi-replica cluster starts Recovering and probes with RequestStartView. Frames that do
    /// not decode or do not chain are dropped from the first bad one on (and a `Truncate`
    /// is emitted for them into `out`).
    pub fn new(config: Config, recovered: Recovered, state_machine: S, out: &mut Outbox) -> Self {
        let n = config.n();
        let id = config.replica;
        let group = config.group;
        let plane = config.plane();
        let prior_life = recovered.has_prior_life();
        let incarnation = if plane == Plane::Metadata {
            recovered.incarnation
        } else {
            0
        };
        let prng = Prng::new(config.cluster, id.0, group.0, recovered.incarnation);
        let clients = ClientTable::decode(&recovered.client_table, config.clients_table_max)
            .unwrap_or_else(|| ClientTable::new(config.clients_table_max));
        let mut replica = Replica {
            sm: state_machine,
            id,
            n,
            group,
            view: 0,
            log_view: 0,
            durable: (0, 0),
            persisting: None,
            writes: VecDeque::new(),
            lost_state_durable: false,
            status: Status::Normal,
            ceded: false,
            observed_newer_view: 0,
            incarnation,
            journal: Journal::new(recovered.snapshot_op + 1),
            op: recovered.snapshot_op,
            commit_min: recovered.snapshot_op,
            commit_max: recovered.snapshot_op,
            last_checksum: recovered.snapshot_checksum,
            last_timestamp: recovered.snapshot_timestamp,
            snapshot_op: recovered.snapshot_op,
            view_headers: BTreeMap::new(),
            held_ceiling: 0,
            head_header: None,
            faulty_top: 0,
            recovery_barrier: 0,
            pipeline: Pipeline::default(),
            requests: VecDeque::new(),
            prepare_attempts: 0,
            heartbeat_counter: 0,
            heartbeat_accepted: (0, 0),
            timers: Timers::default(),
            prng,
            connected: if n >= 32 { u32::MAX } else { (1u32 << n) - 1 },
            vc: ViewChangeState::default(),
            probe_attempts: 0,
            repair: Repair::default(),
            transfer: Transfer::default(),
            clients,
            forwards: Forwards::default(),
            next_offset: recovered.offset_frontier,
            applied_offset_end: recovered.offset_frontier,
            reply_buf: Vec::new(),
            incoming: None,
            frame_cache_floor: 0,
            persist_failures: 0,
            pipeline_stalled_ticks: 0,
            stale_appends: Vec::new(),
            prepares_skipped_behind: 0,
            storage_pressure: false,
            storage_room: u64::MAX,
            prepare_size_recent: RecentMax::default(),
            superblock_written: recovered.superblock.is_some(),
            snapshot_checksum: recovered.snapshot_checksum,
            snapshot_timestamp: recovered.snapshot_timestamp,
            // A memory-ack group acknowledged prepares its disk may not hold: after any prior
            // life it rejoins as lost state and never votes until it holds the view's log
            // durably again (decision 73).
            lost_state: recovered.lost_state
                || recovered
                    .superblock
                    .as_ref()
                    .is_some_and(|sb| sb.lost_state)
                || (config.memory_ack && prior_life),
            lost_until: 0,
            view_reports: BTreeMap::new(),
            durable_prefix: recovered.snapshot_op,
            checkpoint_durable: recovered.snapshot_op,
            checkpoint_pending: None,
            checkpoint_forced: false,
            transfers_installed: 0,
            takeovers: 0,
            setbacks: 0,
            setback_at: 0,
            takeover_view: None,
            config,
        };

        // Journal: every recovered prepare, holes included. Entries above a hole were acked
        // (a backup that adopted a view journals live prepares above ops it still repairs), so
        // dropping them would roll an ack back; the view change verifies them later. Only a
        // chain break between adjacent entries (corruption) or a bad frame ends the journal.
        let mut watermark = recovered.snapshot_op;
        let mut chain_end = recovered.snapshot_op;
        let mut last_view = 0u32;
        let mut kept = 0usize;
        // The entry at the snapshot op itself, which compaction keeps (journal.md G4): indexed
        // for its header only (a StartView or DoViewChange suffix may need it), never applied
        // nor served by repair.
        if let Some(header) = recovered.frames.first().and_then(|f| f.prepare_header())
            && recovered.snapshot_op > 0
            && header.op.get() == recovered.snapshot_op
        {
            kept = 1;
            if recovered.snapshot_checksum != 0
                && header.frame.checksum.get() == recovered.snapshot_checksum
                && header.group.get() == group.0
                && wire::integrity::verify_prepare_identity(header.bytes())
            {
                replica.journal = Journal::new(recovered.snapshot_op);
                replica.journal.insert(Entry {
                    header: *header,
                    frame: None,
                    durable: true,
                    verified: true,
                });
                replica.last_timestamp = replica.last_timestamp.max(header.timestamp.get());
            }
        }
        for frame in recovered.frames.iter().skip(kept) {
            let Some(header) = frame.prepare_header().copied() else {
                break;
            };
            let op = header.op.get();
            if op <= replica.op
                || !replica.journal.fits(op)
                || op > replica.journal_op_max()
                || header.group.get() != group.0
                || !wire::integrity::verify_prepare_identity(header.bytes())
            {
                break;
            }
            // A snapshot installed by state transfer may not know its own identity (0).
            let unknown_anchor = op == recovered.snapshot_op + 1
                && recovered.snapshot_op > 0
                && recovered.snapshot_checksum == 0;
            let adjacent = op == replica.op + 1;
            if adjacent && header.parent.get() != replica.last_checksum && !unknown_anchor {
                break;
            }
            // A solo replica acks nothing but its own appends: nothing above a hole committed.
            if n == 1 && !adjacent {
                break;
            }
            replica.journal.insert(Entry {
                header,
                frame: Some(frame.clone()),
                durable: true,
                verified: true,
            });
            kept += 1;
            replica.op = op;
            replica.last_checksum = header.frame.checksum.get();
            replica.last_timestamp = replica.last_timestamp.max(header.timestamp.get());
            last_view = last_view.max(header.frame.view.get());
            if adjacent && chain_end + 1 == op {
                // Still the unbroken chain from the snapshot: its commit fields are evidence.
                chain_end = op;
                watermark = watermark.max(header.commit.get());
            }
            if plane == Plane::Partition {
                replica.note_recovered_offsets(&header, frame.body());
            }
        }
        // The durable truncation ceiling of earlier lives (decision 51).
        replica.held_ceiling = recovered
            .superblock
            .as_ref()
            .map_or(0, |sb| sb.held_ceiling);
        let mut boot_cut = None;
        // Held-but-faulty entries above the journal (decision 62): durably written here, maybe
        // acked, bodies damaged. Kept as the head, described by their ring headers and never
        // nacked (`held_ceiling`); repair fetches the bodies once a view is adopted. Above a
        // dropped frame, or off the chain, they are only never nacked, and cut. A solo replica
        // has no peer to repair from: they are cut (one disk is all it has).
        let mut faulty_ok = kept == recovered.frames.len() && n > 1;
        let mut faulty_dropped = false;
        for header in &recovered.faulty {
            let op = header.op.get();
            if op <= replica.op {
                continue;
            }
            if !(replica.journal.fits(op)
                && op <= replica.journal_op_max()
                && header.group.get() == group.0
                && wire::integrity::verify_prepare_identity(header.bytes()))
            {
                faulty_dropped = true;
                continue;
            }
            replica.held_ceiling = replica.held_ceiling.max(op);
            let unknown_anchor = replica.op == recovered.snapshot_op
                && recovered.snapshot_op > 0
                && recovered.snapshot_checksum == 0;
            let chains = op > replica.op + 1
                || header.parent.get() == replica.last_checksum
                || unknown_anchor;
            faulty_ok &= chains;
            if !faulty_ok {
                faulty_dropped = true;
                continue;
            }
            replica.op = op;
            replica.last_checksum = header.frame.checksum.get();
            replica.last_timestamp = replica.last_timestamp.max(header.timestamp.get());
            last_view = last_view.max(header.frame.view.get());
            replica.view_headers.insert(op, *header);
            replica.head_header = Some(*header);
            replica.faulty_top = op;
        }
        if faulty_dropped {
            // The disk still names them: cut them there (they stay never nacked), behind the
            // durable ceiling like every boot cut (decision 51).
            boot_cut = Some(replica.op + 1);
        }
        if kept < recovered.frames.len() {
            // Dropped frames may have been acked: never nack their ops (decision 33).
            let dropped = recovered.frames[kept..]
                .iter()
                .map(|f| f.prepare_header().map_or(u64::MAX, |h| h.op.get()))
                .max()
                .unwrap_or(0);
            replica.held_ceiling = replica.held_ceiling.max(dropped);
            boot_cut = Some(replica.op + 1);
        }
        if n == 1 {
            watermark = chain_end;
        }
        replica.advance_durable_prefix(out);
        if replica.op == recovered.snapshot_op && replica.checksum_at(replica.op).is_none() {
            // Restored from a transferred snapshot whose identity nobody recorded.
            replica.transfer.anchor_unknown = true;
        }
        if plane == Plane::Partition {
            // Offsets minted at or below the snapshot are no longer in the journal: the
            // restored state machine knows where they end (journal.md G8).
            let end = replica.sm.next_offset();
            replica.applied_offset_end = replica.applied_offset_end.max(end);
            replica.next_offset = replica.next_offset.max(end);
        }
        // Replay only along the unbroken chain: an op below a hole could be a stale entry.
        let watermark = watermark.min(chain_end);
        while replica.commit_min < watermark {
            let op = replica.commit_min + 1;
            replica.apply_op(op, false, out);
        }
        replica.commit_max = replica.commit_min;
        if let Some(sb) = recovered.superblock.as_ref() {
            replica.view = sb.view;
            replica.log_view = sb.log_view;
            replica.restore_view_headers(&sb.view_headers);
            replica.commit_max = replica.commit_max.max(sb.commit_max.min(replica.op));
        } else {
            replica.view = last_view;
            replica.log_view = 0;
        }
        debug_assert!(replica.log_view <= replica.view);
        replica.durable = (replica.view, replica.log_view);
        replica.lost_state_durable = recovered
            .superblock
            .as_ref()
            .is_some_and(|sb| sb.lost_state);
        if let Some(from_op) = boot_cut {
            // The ceiling is durable before the cut takes effect (decision 51).
            replica.persist_vsr_state_barrier(out);
            out.push(Effect::Truncate { from_op });
        }
        if !replica.superblock_written {
            // Nothing leaves before the group's superblock exists (see `superblock_written`).
            replica.persist_vsr_state(out);
        }
        if replica.commit_min < replica.op && plane == Plane::Metadata {
            replica.recovery_barrier = replica.op;
        }
        replica.trim_frame_cache();

        if n == 1 || !prior_life {
            replica.set_status(Status::Normal);
            if replica.primary_index(replica.view) == id {
                replica.start_view_as_recovered_primary(out);
            } else {
                let ticks = replica.heartbeat_ticks_with_jitter();
                replica.timers.normal_heartbeat.start(ticks);
            }
        } else {
            replica.ceded = true;
            replica.enter_recovering();
        }
        #[cfg(any(debug_assertions, feature = "invariants"))]
        replica.check_invariants();
        replica
    }

    /// Feeds one input. Returns `Err(reason)` when the input was dropped (the outbox may still
    /// hold a client-facing refusal); effects are appended to `out` in execution order.
    pub fn step(&mut self, now: Now, input: Input<'_>, out: &mut Outbox) -> Result<(), Ignored> {
        let result = match input {
            Input::Tick => {
                self.on_tick(now, out);
                Ok(())
            }
            Input::Message { from, message } => self.on_message(now, from, message, out),
            Input::Frame { from, frame } => {
                match wire::decode_replica(frame, self.config.max_message_size) {
                    Ok(message) => self.on_message(now, from, message, out),
                    Err(error) => Err(Ignored::Decode(error)),
                }
            }
            Input::SharedFrame { from, frame } => {
                match wire::decode_replica(frame.bytes(), self.config.max_message_size) {
                    Ok(message) => {
                        self.incoming = Some(frame.clone());
                        let result = self.on_message(now, from, message, out);
                        self.incoming = None;
                        result
                    }
                    Err(error) => Err(Ignored::Decode(error)),
                }
            }
            Input::Request(request) => self.on_request(now, request, out),
            Input::Done(completion) => self.on_completion(now, completion, out),
            Input::PeerConnection { peer, connected } => {
                if usize::from(peer.0) < self.n && peer != self.id {
                    if connected {
                        self.connected |= 1 << peer.0;
                    } else {
                        self.connected &= !(1 << peer.0);
                    }
                    Ok(())
                } else {
                    Err(Ignored::Sender(wire::decode::SenderError::OutsideRoster {
                        replica: peer.0,
                        replica_count: self.config.replica_count,
                    }))
                }
            }
        };
        // At the end of the step the state machine is exactly at `commit_min`: the driver
        // snapshots it when it executes the effect, before the next step.
        self.maybe_checkpoint(out);
        #[cfg(any(debug_assertions, feature = "invariants"))]
        self.check_invariants();
        result
    }

    /// Primary affinity (spec README decision 3, decision 171): asks this replica to become
    /// the group's primary. When it is a Normal backup (its view's primary is another replica),
    /// no state transfer is running and it has not abdicated as primary recently, it starts a view change toward the smallest view
    /// `v' > view` with `v' mod n == self`; the normal view-change protocol decides whether it
    /// succeeds (a quorum's DoViewChanges, the merge, StartView), so safety is the protocol's.
    /// Otherwise nothing happens and the reason comes back. The driver decides when to call it
    /// (the node: for its partition groups once it has been the metadata primary, Normal, for
    /// at least `heartbeat_timeout`). Like [`Replica::step`], drain `out` afterwards.
    pub fn take_over(&mut self, now: Now, out: &mut Outbox) -> Result<u32, Ignored> {
        let result = if self.status != Status::Normal || self.lost_state {
            Err(Ignored::Status)
        } else if self.primary_index(self.view) == self.id {
            Err(Ignored::NotBackup)
        } else if self.transfer.is_active() {
            Err(Ignored::Transferring)
        } else if self.affinity_backing_off(now) {
            // It abdicated as primary (its pipeline could not reach a quorum, e.g. backups
            // whose clocks refuse its timestamps) or its last takeover did not hold (it could
            // not complete the view change): trying again at once would stall the group
            // again. Back off 2x, 4x, ... 64x the heartbeat timeout after the last setback.
            Err(Ignored::Abdicated)
        } else {
            let n = self.n as u32;
            let id = u32::from(self.id.0);
            let target = (self.view - self.view % n).checked_add(id).and_then(|v| {
                if v > self.view {
                    Some(v)
                } else {
                    v.checked_add(n)
                }
            });
            match target {
                Some(target) => {
                    self.start_view_change_to(now, target, out);
                    self.takeovers += 1;
                    self.takeover_view = Some(target);
                    Ok(target)
                }
                None => Err(Ignored::ViewNew),
            }
        };
        self.maybe_checkpoint(out);
        #[cfg(any(debug_assertions, feature = "invariants"))]
        self.check_invariants();
        result
    }

    /// Records a primary-affinity setback at `now` (decision 171).
    pub(crate) fn affinity_setback(&mut self, now: Now) {
        self.setbacks = self.setbacks.saturating_add(1);
        self.setback_at = now.tick;
    }

    /// Whether `take_over` must wait: a backup again after its last takeover (that one did not
    /// hold, a setback), or within `heartbeat_timeout << min(setbacks, 6)` ticks of the last
    /// setback.
    fn affinity_backing_off(&mut self, now: Now) -> bool {
        if self.takeover_view.take().is_some() {
            self.affinity_setback(now);
        }
        self.setbacks > 0
            && now.tick
                < self
                    .setback_at
                    .saturating_add(self.config.heartbeat_timeout_ticks << self.setbacks.min(6))
    }

    /// View changes this replica started through [`Replica::take_over`] in this life.
    pub fn takeovers(&self) -> u64 {
        self.takeovers
    }

    fn on_message(
        &mut self,
        now: Now,
        from: ReplicaId,
        message: Message<'_>,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        wire::decode::check_sender(&message, self.config.replica_count, self.id.0)
            .map_err(Ignored::Sender)?;
        if message.frame().cluster.get() != self.config.cluster {
            return Err(Ignored::Cluster);
        }
        if message.group() != self.group {
            return Err(Ignored::Group);
        }
        if self.lost_state {
            self.note_view_report(from, &message);
        }
        match message {
            Message::Request { .. } => Err(Ignored::Command),
            Message::Prepare { header, body } => self.on_prepare(now, header, body, out),
            Message::PrepareOk(h) => self.on_prepare_ok(now, h, out),
            Message::Commit(h) => self.on_commit(now, h, out),
            Message::StartViewChange(h) => self.on_start_view_change(now, h, out),
            Message::DoViewChange { header, suffix } => {
                self.on_do_view_change(now, header, &suffix, out)
            }
            Message::StartView { header, suffix } => {
                self.on_start_view(now, header, suffix.ok().as_ref(), out)
            }
            Message::RequestStartView(h) => self.on_request_start_view(now, h, out),
            Message::RequestPrepares(h) => self.on_request_prepares(h, out),
            Message::RepairPrepare { header, body } => {
                self.on_repair_prepare(now, from, header, body, out)
            }
            Message::RepairDone(h) => self.on_repair_done(now, h, out),
            Message::RangeEvicted(h) => self.on_range_evicted(h, out),
            Message::RequestStateTransfer(h) => self.on_request_state_transfer(h, out),
            Message::StateTransferTarget { header, body } => {
                self.on_state_transfer_target(now, header, body, out)
            }
            Message::RequestStateChunk(h) => self.on_request_state_chunk(h, out),
            Message::StateChunk { header, body } => self.on_state_chunk(now, header, body, out),
            Message::ForwardRegister(h) => self.on_forward_register(now, h, out),
            Message::ForwardRegisterResult(h) => self.on_forward_register_result(h, out),
            Message::ForwardLogout(h) => self.on_forward_logout(now, h, out),
            Message::ForwardLogoutResult(h) => self.on_forward_logout_result(h, out),
        }
    }

    fn on_completion(
        &mut self,
        now: Now,
        completion: Completion,
        out: &mut Outbox,
    ) -> Result<(), Ignored> {
        match completion {
            Completion::Appended { op, checksum } => self.on_appended(now, op, checksum, out),
            Completion::AppendFailed { op, checksum } => self.on_append_failed(op, checksum, out),
            Completion::VsrStatePersisted { view, log_view } => {
                self.on_vsr_persisted(now, view, log_view, out)
            }
            Completion::VsrStatePersistFailed { view, log_view } => {
                let Some(write) = self.take_write(view, log_view) else {
                    return Err(Ignored::StaleCompletion);
                };
                if self.persisting == Some(write) {
                    self.persisting = None;
                    // Retry with backoff; the withheld sends follow the eventual success.
                    self.persist_failures = self.persist_failures.saturating_add(1);
                    let ticks = 1u64 << self.persist_failures.min(7);
                    self.timers.persist_retry.start(ticks.min(100));
                    Ok(())
                } else {
                    Err(Ignored::StaleCompletion)
                }
            }
            Completion::Read { op, frame } => self.on_read(op, frame, out),
            Completion::Checkpointed { op } => self.on_checkpointed(now, op, out),
        }
    }

    // ---- read-only accessors -------------------------------------------------------------

    /// This replica's id.
    pub fn replica(&self) -> ReplicaId {
        self.id
    }
    /// The group this replica runs.
    pub fn group(&self) -> GroupId {
        self.group
    }
    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }
    /// Current view.
    pub fn view(&self) -> u32 {
        self.view
    }
    /// View in which the log was last (re)based.
    pub fn log_view(&self) -> u32 {
        self.log_view
    }
    /// The `(view, log_view)` the superblock records as far as the core knows.
    pub fn vsr_state_durable(&self) -> (u32, u32) {
        self.durable
    }
    /// Current status.
    pub fn status(&self) -> Status {
        self.status
    }
    /// Head op of the log (the sequencer).
    pub fn op(&self) -> u64 {
        self.op
    }
    /// Highest op applied locally.
    pub fn commit_min(&self) -> u64 {
        self.commit_min
    }
    /// Highest op known committed.
    pub fn commit_max(&self) -> u64 {
        self.commit_max
    }
    /// Primary index of `view` (`view mod n`).
    pub fn primary_index(&self, view: u32) -> ReplicaId {
        ReplicaId((view as usize % self.n) as u8)
    }
    /// Whether this replica is the acting primary: primary by index, not ceded, Normal.
    pub fn is_primary(&self) -> bool {
        self.status == Status::Normal && !self.ceded && self.primary_index(self.view) == self.id
    }
    /// The journaled header at `op` (held locally, durable or appending).
    pub fn header(&self, op: u64) -> Option<&PrepareHeader> {
        self.journal.header(op)
    }
    /// Whether the journal holds `op` durably (its `Appended` completion arrived).
    pub fn is_durable(&self, op: u64) -> bool {
        self.journal.get(op).is_some_and(|e| e.durable)
    }
    /// The replicated state machine.
    pub fn state_machine(&self) -> &S {
        &self.sm
    }
    /// The client table (metadata plane; empty on partitions), in its canonical encoding, for
    /// equivalence checks between replicas.
    pub fn client_table_encoded(&self) -> Vec<u8> {
        self.clients.encode()
    }
    /// The committed sessions of the client table (metadata plane; none on partitions), as
    /// `(client, session, user_id)` in client order: what the client listeners of every shard
    /// check requests against (published by the driver, never read across shards directly).
    pub fn sessions(&self) -> impl Iterator<Item = (ClientId, u64, u32)> + '_ {
        self.clients
            .sessions
            .iter()
            .map(|(client, s)| (ClientId(*client), s.epoch, s.user_id))
    }
    /// Partition plane: the next message offset this replica would mint.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }
    /// The DoViewChange this replica recorded for itself as primary-elect of the current view
    /// (it counts in the merge without leaving the node): `(log_view, op, nacked ops)`. For
    /// checkers; `None` when none is recorded.
    pub fn own_do_view_change(&self) -> Option<(u32, u64, Vec<u64>)> {
        use crate::merge::Slot;
        let d = self.vc.dvcs.get(&self.id.0)?;
        let nacked = d
            .slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Blank { nack: true } | Slot::HeldNack { .. }))
            .map(|(op, _)| *op)
            .collect();
        Some((d.log_view, d.op, nacked))
    }

    /// State transfers installed in this life.
    pub fn transfers_installed(&self) -> u64 {
        self.transfers_installed
    }
    /// Most state-machine artifact bytes the core held at once for state transfer in this
    /// life (bounded by [`crate::constants::TRANSFER_BYTES_HELD_MAX`], decision 170).
    pub fn transfer_bytes_peak(&self) -> usize {
        self.transfer.held_peak
    }

    /// The snapshot floor: ops at or below it live only in the snapshot.
    pub fn snapshot_op(&self) -> u64 {
        self.snapshot_op
    }

    /// Frame bytes of the prepares whose appends this replica requested and has not seen
    /// complete (decision 504).
    pub fn appending_bytes(&self) -> u64 {
        self.journal.appending_bytes()
    }

    /// The driver's storage is behind across the groups it hosts (decision 505): while set,
    /// this replica counts as behind (decision 504) whenever any append of its own is
    /// incomplete, so a shard of many lagging groups holds about one prepare per group beyond
    /// its bound instead of `appending_bytes_max` each.
    pub fn set_storage_pressure(&mut self, on: bool) {
        self.storage_pressure = on;
    }

    /// The driver's room for this replica's repair windows (decision 518): its share of what
    /// is left under the driver's bound on every group's incomplete appends
    /// ([`apply_storage_pressure`]). A repaired
    /// prepare is journaled whole when it arrives, so a window asked for with room to spare
    /// would otherwise land past the bound however full the driver is by then.
    pub fn set_storage_room(&mut self, bytes: u64) {
        self.storage_room = bytes;
    }

    /// Prepares this replica forwarded but did not journal because its appends that have not
    /// completed reached `appending_bytes_max` (decision 504), since boot.
    pub fn prepares_skipped_behind(&self) -> u64 {
        self.prepares_skipped_behind
    }

    /// The highest op the local journal accepts now (decision 34): below `checkpoint_durable +
    /// journal_slot_count`, so no append lands in a slot whose op is above the journal's floor
    /// and the entry at the checkpoint op itself stays (journal.md G4). `u64::MAX` if unbounded.
    pub fn journal_op_max(&self) -> u64 {
        match self.config.journal_slot_count {
            0 => u64::MAX,
            slots => self.checkpoint_durable.saturating_add(slots - 1),
        }
    }

    /// Whether a repair session is open (§10).
    pub fn is_repairing(&self) -> bool {
        self.repair.session.is_some()
    }
    /// Whether a state transfer is in progress.
    pub fn is_transferring(&self) -> bool {
        self.transfer.is_active()
    }
    /// The receiver-side state-transfer stage.
    pub fn transfer_stage(&self) -> crate::TransferStage {
        self.transfer.stage
    }
    /// Whether this replica ceded the primary role its recovered view gives it (§3).
    pub fn is_ceded(&self) -> bool {
        self.ceded
    }
    /// Highest view seen on traffic dropped for being ahead of ours (§9.4).
    pub fn observed_newer_view(&self) -> u32 {
        self.observed_newer_view
    }
    /// Number of prepares in the primary's pipeline.
    pub fn pipeline_len(&self) -> usize {
        self.pipeline.len()
    }
    /// Number of requests parked in the request queue.
    pub fn request_queue_len(&self) -> usize {
        self.requests.len()
    }
    /// Whether the replica lost acknowledged state and must not vote yet (decision 28; a
    /// memory-ack group after every restart, decision 73).
    pub fn is_lost_state(&self) -> bool {
        self.lost_state
    }
    /// This boot's incarnation (0 on partition groups).
    pub fn incarnation(&self) -> u128 {
        self.incarnation
    }

    /// The view a lost-state replica learned from a quorum of peers (decision 61): the highest
    /// view reported once `quorum::view_learning(n)` distinct peers reported, else `None`.
    pub fn learned_view(&self) -> Option<u32> {
        (self.view_reports.len() >= crate::quorum::view_learning(self.n))
            .then(|| self.view_reports.values().copied().max().unwrap_or(0))
    }

    /// Records the view a peer's frame carries, for [`Self::learned_view`]. Counted: frames a
    /// peer stamps with its own current view and sends only once that view is durable
    /// (§8.10): Prepare, PrepareOk, Commit, StartViewChange, DoViewChange, StartView, and the
    /// RepairDone / RangeEvicted answers to `probe_peer_views`. Not counted: the requester
    /// side (RequestStartView, RequestPrepares, transfer requests), which leaves before the
    /// sender's view is durable, and a lost peer's probes carry a view it may have forgotten.
    /// The peer is the connection's (`from`), not a prepare's author: a forwarded prepare
    /// carries the forwarder's view.
    fn note_view_report(&mut self, from: ReplicaId, message: &Message<'_>) {
        use wire::Command::*;
        if from == self.id || usize::from(from.0) >= self.n {
            return;
        }
        if !matches!(
            message.command(),
            Prepare
                | PrepareOk
                | Commit
                | StartViewChange
                | DoViewChange
                | StartView
                | RepairDone
                | RangeEvicted
        ) {
            return;
        }
        let bytes = message.header_bytes();
        let view = u32::from_le_bytes(bytes[52..56].try_into().expect("4 bytes"));
        let seen = self.view_reports.entry(from.0).or_insert(view);
        *seen = (*seen).max(view);
    }

    // ---- helpers shared by the handler modules --------------------------------------------

    pub(crate) fn plane(&self) -> Plane {
        self.config.plane()
    }

    pub(crate) fn sender(&self) -> wire::Sender {
        wire::Sender {
            cluster: self.config.cluster,
            replica: self.id.0,
            view: self.view,
        }
    }

    /// The view-described header of the log head when the journal lacks it (decision 32):
    /// only while it is exactly the head this replica chains onto.
    pub(crate) fn described_head(&self) -> Option<PrepareHeader> {
        let h = self.head_header?;
        (h.op.get() == self.op
            && self.op > 0
            && h.frame.checksum.get() == self.last_checksum
            && !self.transfer.anchor_unknown
            && self.journal.get(self.op).is_none())
        .then_some(h)
    }

    /// Whether `head_header` describes the head at `op` (the journal may still hold it).
    pub(crate) fn described_head_at_trim(&self, op: u64) -> bool {
        self.head_header.is_some_and(|h| {
            h.op.get() == op && op == self.op && h.frame.checksum.get() == self.last_checksum
        })
    }

    /// The identity of the prepare at `op` as far as the log knows it: journaled, or the
    /// snapshot's (0 at op 0). `None` when unknown.
    pub(crate) fn checksum_at(&self, op: u64) -> Option<u128> {
        if let Some(entry) = self.journal.get(op) {
            return Some(entry.checksum());
        }
        // After a state transfer the snapshot's identity is unknown (0); at op 0 it is 0.
        if op == self.snapshot_op && (op == 0 || self.snapshot_checksum != 0) {
            return Some(self.snapshot_checksum);
        }
        None
    }

    /// Whether view-scoped frames may leave (§8.10).
    pub(crate) fn is_vsr_durable(&self) -> bool {
        #[cfg(feature = "bug-knobs")]
        if self.config.bug_knobs.skip_durable_before_send {
            return true;
        }
        self.is_vsr_durable_strict()
    }

    /// The superblock records exactly the in-memory pair (never bypassed by bug knobs).
    pub(crate) fn is_vsr_durable_strict(&self) -> bool {
        self.superblock_written && self.durable == (self.view, self.log_view)
    }

    /// Boot (decision 50): the headers the superblock wrote with `log_view` describe the log
    /// this replica vouched for. Ops above the replayed commit point the journal lacks are
    /// held again (described, body to be repaired), and the head is never below the highest
    /// of them, so the restarted replica claims `log_view` only with the log it vouched for.
    /// A DVC nacks such an op only above the durable truncation ceiling (decision 51): every
    /// prepare this replica ever journaled durably is still in its journal or at or below
    /// that ceiling, so an op above it that the journal lacks was never acknowledged here.
    fn restore_view_headers(&mut self, headers: &[PrepareHeader]) {
        let snapshot_op = self.snapshot_op;
        for h in headers {
            let op = h.op.get();
            if h.group.get() != self.group.0 || !wire::integrity::verify_prepare_identity(h.bytes())
            {
                continue;
            }
            if op == snapshot_op && op > 0 && self.snapshot_checksum == 0 {
                // The described head at the snapshot op (decision 32): its identity.
                self.snapshot_checksum = h.frame.checksum.get();
                self.snapshot_timestamp = h.timestamp.get();
                if self.op == op {
                    self.last_checksum = self.snapshot_checksum;
                    self.head_header = Some(*h);
                    self.transfer.anchor_unknown = false;
                }
            }
            // The journal's own entries win, held-but-faulty ones included (decision 62: at
            // boot `view_headers` holds only their ring headers), as for present entries.
            if op <= self.commit_min
                || self.journal.get(op).is_some()
                || self.view_headers.contains_key(&op)
            {
                continue;
            }
            self.view_headers.insert(op, *h);
            if op > self.op {
                self.op = op;
                self.last_checksum = h.frame.checksum.get();
                self.head_header = Some(*h);
                self.transfer.anchor_unknown = false;
            }
            self.last_timestamp = self.last_timestamp.max(h.timestamp.get());
        }
    }

    /// Requests a superblock write of the in-memory state unless it is durable or in flight.
    pub(crate) fn persist_vsr_state(&mut self, out: &mut Outbox) {
        let want = (self.view, self.log_view, self.lost_state);
        let durable = (self.durable.0, self.durable.1, self.lost_state_durable);
        if (self.superblock_written && durable == want) || self.persisting == Some(want) {
            return;
        }
        self.persisting = Some(want);
        self.writes.push_back(want);
        out.push(Effect::PersistVsrState(self.vsr_state()));
    }

    /// Requests a superblock write of the in-memory state even if `(view, log_view)` is
    /// durable: the barrier before a truncation (decision 51). The driver makes it durable
    /// before the `Truncate` that follows it takes effect.
    pub(crate) fn persist_vsr_state_barrier(&mut self, out: &mut Outbox) {
        let want = (self.view, self.log_view, self.lost_state);
        self.persisting = Some(want);
        self.writes.push_back(want);
        out.push(Effect::PersistVsrState(self.vsr_state()));
    }

    /// The state a superblock write records: the view pair, and the log `log_view` vouches
    /// for above the commit point (decision 50): verified journal entries, the view's
    /// headers, the described head; the 128 highest ops.
    pub(crate) fn vsr_state(&self) -> VsrState {
        let mut headers: BTreeMap<u64, PrepareHeader> = self
            .view_headers
            .range(self.commit_min + 1..)
            .map(|(op, h)| (*op, *h))
            .collect();
        for entry in self.journal.iter_from(self.commit_min + 1) {
            if entry.verified {
                headers.insert(entry.header.op.get(), entry.header);
            }
        }
        if let Some(h) = self.described_head() {
            headers.insert(h.op.get(), h);
        }
        let skip = headers
            .len()
            .saturating_sub(crate::constants::SUFFIX_ENTRIES_MAX);
        let (snapshot_checksum, snapshot_timestamp) = self.snapshot_identity(self.snapshot_op);
        VsrState {
            view: self.view,
            log_view: self.log_view,
            commit_max: self.commit_max,
            lost_state: self.lost_state,
            view_headers: headers.into_values().skip(skip).collect(),
            held_ceiling: self.held_ceiling,
            snapshot_op: self.snapshot_op,
            snapshot_checksum,
            snapshot_timestamp,
        }
    }

    /// The identity and timestamp of the prepare at `op` as this replica knows them (its
    /// journal, the view's headers, the described head, the snapshot's recorded identity, or
    /// the `parent` of the verified entry above); `(0, 0)` when unknown (decision 52).
    pub fn snapshot_identity(&self, op: u64) -> (u128, u64) {
        if op == 0 {
            return (0, 0);
        }
        let header = self
            .journal
            .get(op)
            .map(|e| e.header)
            .or_else(|| self.view_headers.get(&op).copied())
            .or_else(|| self.head_header.filter(|h| h.op.get() == op));
        if let Some(h) = header {
            return (h.frame.checksum.get(), h.timestamp.get());
        }
        if op == self.snapshot_op && self.snapshot_checksum != 0 {
            return (self.snapshot_checksum, self.snapshot_timestamp);
        }
        if let Some(above) = self.journal.get(op + 1).filter(|e| e.verified) {
            return (above.header.parent.get(), 0);
        }
        (0, 0)
    }

    /// Removes the oldest in-flight write of `(view, log_view)` (completions arrive in order).
    pub(crate) fn take_write(&mut self, view: u32, log_view: u32) -> Option<(u32, u32, bool)> {
        let i = self
            .writes
            .iter()
            .position(|w| (w.0, w.1) == (view, log_view))?;
        let write = self.writes.remove(i)?;
        // Writes before it completed or failed without a completion we can match: drop them.
        self.writes.drain(..i);
        Some(write)
    }

    /// Whether `frame` may leave now: while `(view, log_view)` is not durable only the frames
    /// that ask and advertise nothing leave (RequestStartView, and the requester side of
    /// repair and state transfer), §8.10 \[design\].
    fn may_send(&self, frame: &Frame) -> bool {
        use wire::Command::*;
        self.is_vsr_durable()
            || matches!(
                frame.command(),
                Some(RequestStartView | RequestPrepares | RequestStateTransfer | RequestStateChunk)
            )
    }

    /// Sends `frame` to a peer, behind the durable-before-send gate (a withheld frame is not
    /// queued: timers regenerate it).
    pub(crate) fn send(&self, out: &mut Outbox, to: ReplicaId, frame: Frame) {
        debug_assert_ne!(to, self.id);
        if self.may_send(&frame) {
            out.push(Effect::Send { to, frame });
        }
    }

    /// Sends `frame` to every peer, behind the same gate.
    pub(crate) fn broadcast(&self, out: &mut Outbox, frame: &Frame) {
        if !self.may_send(frame) {
            return;
        }
        for r in 0..self.n as u8 {
            if r != self.id.0 {
                out.push(Effect::Send {
                    to: ReplicaId(r),
                    frame: frame.clone(),
                });
            }
        }
    }

    pub(crate) fn is_connected(&self, peer: ReplicaId) -> bool {
        self.connected & (1 << peer.0) != 0
    }

    pub(crate) fn heartbeat_ticks_with_jitter(&mut self) -> u64 {
        let base = self.config.heartbeat_timeout_ticks;
        base + self.prng.up_to(base / 4)
    }

    /// Drops cached frames of committed ops far enough below `commit_min` (more than
    /// `frame_cache_committed` ops below it, then oldest first while the cached frames exceed
    /// `frame_cache_committed_bytes`), and keeps the header index bounded. Amortized O(1) per
    /// applied op (a cursor walks forward).
    pub(crate) fn trim_frame_cache(&mut self) {
        let below = self
            .commit_min
            .saturating_sub(self.config.frame_cache_committed);
        let mut op = self.frame_cache_floor.max(self.journal.base());
        while op < below {
            self.journal.evict_frame(op);
            op += 1;
        }
        self.frame_cache_floor = self.frame_cache_floor.max(below);
        while self.journal.cached_bytes() > self.config.frame_cache_committed_bytes {
            let op = self.frame_cache_floor.max(self.journal.base());
            if op >= self.commit_min {
                break;
            }
            self.journal.evict_frame(op);
            self.frame_cache_floor = op + 1;
        }
        // Far below the commit point only repair cares, and it reads through the journal.
        let trim = self.commit_min.saturating_sub(self.config.headers_retained);
        if trim > self.journal.base() {
            self.journal.trim_below(trim);
        }
    }

    /// Sweep of the invariants of §1 after every step: debug builds, and release builds with
    /// the `invariants` feature (the simulator's). A breach panics: it is a core bug.
    #[cfg(any(debug_assertions, feature = "invariants"))]
    pub(crate) fn check_invariants(&self) {
        assert!(
            self.commit_min <= self.commit_max,
            "commit_min <= commit_max"
        );
        assert!(self.log_view <= self.view, "log_view <= view");
        assert_eq!(
            self.journal.cached_bytes(),
            self.journal
                .iter_from(0)
                .filter_map(|e| e.frame.as_ref())
                .map(|f| f.bytes().len() as u64)
                .sum::<u64>(),
            "the journal index's cached bytes are the sum of its frames"
        );
        assert_eq!(
            self.journal.appending_bytes(),
            self.journal
                .iter_from(0)
                .filter(|e| !e.durable)
                .map(|e| u64::from(e.header.frame.size.get()))
                .sum::<u64>(),
            "the journal index's appending bytes are the sizes of its incomplete appends"
        );
        assert!(
            (self.durable.0, self.durable.1) <= (self.view, self.log_view),
            "the durable pair never exceeds the in-memory pair"
        );
        self.pipeline.verify();
        if let Some(tail) = self.pipeline.tail() {
            assert_eq!(tail.op(), self.op, "pipeline tail is the head");
            assert!(self.pipeline.head().expect("non-empty").op() > self.commit_min);
        }
        assert!(self.commit_min <= self.op, "applied ops are in the log");
        assert!(
            self.view_headers.keys().all(|op| *op > self.commit_min),
            "view headers describe only unapplied ops"
        );
        if self.status == Status::Recovering {
            assert!(
                self.timers.request_start_view.is_running(),
                "a Recovering replica keeps probing"
            );
        }
        // Journaled ops above the commit point form one hash chain (bounded sweep).
        let mut below: Option<&crate::journal::Entry> = None;
        for entry in self.journal.iter_from(self.commit_min + 1).take(1024) {
            if let Some(b) = below
                && b.header.op.get() + 1 == entry.header.op.get()
            {
                assert_eq!(
                    entry.header.parent.get(),
                    b.checksum(),
                    "journal chain at op {}",
                    entry.header.op.get()
                );
            }
            below = Some(entry);
        }
    }
}

/// Sets the storage pressure of every replica a driver hosts (decision 505) from the total of
/// their incomplete appends against `bound` (0: no bound), as the driver does once per tick:
/// between ticks the total may pass the bound by what one tick brings in. The room left under
/// the bound is shared among the replicas repairing and one more that may start before the
/// next tick, as the most bytes each may ask for in a repair window (decision 518): the
/// windows asked for together then fit it, and a lone lagging group among many idle ones
/// still asks for whole windows. Returns the total and whether it reached the bound. The
/// shard's pump and the simulator's nodes share it.
pub fn apply_storage_pressure<'a, S: StateMachine + 'a>(
    replicas: impl Iterator<Item = &'a mut Replica<S>>,
    bound: u64,
) -> (u64, bool) {
    let mut replicas: Vec<_> = replicas.collect();
    let total: u64 = replicas.iter().map(|r| r.appending_bytes()).sum();
    let pressed = bound != 0 && total >= bound;
    let asking = replicas.iter().filter(|r| r.is_repairing()).count() as u64 + 1;
    let room = match bound {
        0 => u64::MAX,
        _ => bound.saturating_sub(total) / asking,
    };
    for r in &mut replicas {
        r.set_storage_pressure(pressed);
        r.set_storage_room(room);
    }
    (total, pressed)
}

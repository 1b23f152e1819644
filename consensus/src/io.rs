//! The sans-IO boundary: what the driver tells the core ([`Input`], [`Completion`]) and what the
//! core asks the driver to do ([`Effect`], collected in a caller-owned [`Outbox`]).
//!
//! # Durability model
//!
//! - The core never assumes anything is on disk until a [`Completion`] says so.
//!   [`Completion::Appended`] is the *only* proof that a prepare is durable; a PrepareOk for an
//!   op is emitted only after it (journal.md G1).
//! - `(view, log_view)` is durable only once [`Completion::VsrStatePersisted`] reports a write
//!   carrying exactly that pair; view-scoped frames (StartViewChange, DoViewChange, StartView,
//!   PrepareOk, Commit, and every other frame except RequestStartView and the requester side of
//!   repair/transfer) are emitted only while the in-memory pair equals the durable pair
//!   (consensus.md §8.10). A failed write emits nothing; timers regenerate the sends later.
//! - Storage effects ([`Effect::Append`], [`Effect::Truncate`], [`Effect::PersistVsrState`],
//!   [`Effect::Read`], [`Effect::Checkpoint`]) of one group must be executed **in emission
//!   order**; their completions may arrive later, in any order relative to network input, but
//!   completions of appends arrive in op order.
//! - A fresh group (no superblock) first asks for a superblock write of `(0, 0)` and sends
//!   nothing before it completes, so a replica that ever sent a frame restarts with a prior
//!   life.
//! - After a restart the driver hands back [`Recovered`]: the superblock fields and every
//!   journaled prepare above the snapshot the state machine was restored from, in op order
//!   (holes allowed: entries above a hole may have been acknowledged and must be kept). The
//!   core rebuilds everything else from them; it replays only the unbroken chain.

use wire::header::RequestHeader;

use crate::types::{ClientId, Frame, ReplicaId, VsrState};

/// One input to [`crate::Replica::step`].
// A request carries its 256-byte header by value: inputs are moved once into `step`, and a box
// would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Input<'a> {
    /// One driver tick (10 ms in production). All timers count these.
    Tick,
    /// A replica-plane frame that already passed `wire::decode_replica` (the stateless checks).
    /// The core runs `wire::decode::check_sender` and everything stateful.
    Message {
        /// The peer whose connection delivered the frame (may differ from the header's
        /// `replica` for forwarded prepares).
        from: ReplicaId,
        /// The decoded frame.
        message: wire::Message<'a>,
    },
    /// Raw frame bytes; the core runs `wire::decode_replica` itself (convenient for the
    /// simulator). A frame that fails decoding is ignored with [`crate::Ignored::Decode`].
    Frame {
        /// The peer whose connection delivered the frame.
        from: ReplicaId,
        /// One whole frame.
        frame: &'a [u8],
    },
    /// [`Input::Frame`] with the frame's bytes owned and shared: a prepare the core journals
    /// from it keeps these bytes instead of a copy (decision 264). Handled exactly like
    /// `Frame` otherwise.
    SharedFrame {
        /// The peer whose connection delivered the frame.
        from: ReplicaId,
        /// One whole frame.
        frame: Frame,
    },
    /// A client request routed to this group by a client listener.
    Request(ClientRequest),
    /// A storage completion for an effect this replica emitted.
    Done(Completion),
    /// The bus's view of a peer connection changed; chain replication skips peers that are
    /// not connected (§5.4). All peers start connected.
    PeerConnection {
        /// The peer.
        peer: ReplicaId,
        /// Whether a live connection exists.
        connected: bool,
    },
}

/// A client request after the client listener decoded it (`wire::decode::decode_request`),
/// authenticated the connection and resolved the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRequest {
    /// The client's header; `user_id` already overwritten with the authenticated user.
    pub header: RequestHeader,
    /// The request body (client bytes; metadata bodies may be re-projected by the state
    /// machine, partition SendMessages bodies are stamped by the core).
    pub body: Vec<u8>,
}

impl ClientRequest {
    /// A request as a client would send it (cluster, view, replica and timestamp zero).
    pub fn new(
        client: u128,
        operation: wire::Operation,
        session: u64,
        request: u64,
        body: Vec<u8>,
    ) -> ClientRequest {
        use wire::header::{FrameHeader, Layout};
        let mut header = RequestHeader::zeroed();
        header.frame = FrameHeader::new(
            wire::Command::Request,
            wire::Sender {
                cluster: 0,
                replica: 0,
                view: 0,
            },
        );
        header.client.set(client);
        header.request.set(request);
        header.session.set(session);
        header.operation = operation.byte();
        ClientRequest { header, body }
    }
}

/// A storage completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// The prepare `op` with identity `checksum` is durably journaled (fdatasync'ed). The only
    /// proof of durability the core accepts.
    Appended {
        /// The op.
        op: u64,
        /// The identity of the appended prepare (header `checksum`).
        checksum: u128,
    },
    /// The append failed. The core fail-stops ([`Effect::Fatal`]) unless it can roll back the
    /// pre-advance (§5.2).
    AppendFailed {
        /// The op.
        op: u64,
        /// The identity.
        checksum: u128,
    },
    /// A superblock write carrying exactly this pair completed.
    VsrStatePersisted {
        /// The view written.
        view: u32,
        /// The log_view written.
        log_view: u32,
    },
    /// A superblock write failed; nothing becomes durable.
    VsrStatePersistFailed {
        /// The view that was to be written.
        view: u32,
        /// The log_view that was to be written.
        log_view: u32,
    },
    /// Answer to [`Effect::Read`]: the journaled frame at `op`, or `None` if the journal no
    /// longer holds it (compacted, or a read/checksum failure).
    Read {
        /// The op asked for.
        op: u64,
        /// The whole prepare frame as journaled (command Prepare).
        frame: Option<Frame>,
    },
    /// Answer to [`Effect::Checkpoint`]: the snapshot at `op` is durable and the journal was
    /// compacted below `op`.
    Checkpointed {
        /// The checkpoint op.
        op: u64,
    },
}

/// Why the core asks the driver to stop the process (STYLE.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FatalReason {
    /// A journal append failed and the pre-advance cannot be rolled back.
    #[error("journal append failed for op {op}")]
    AppendFailed {
        /// The op.
        op: u64,
    },
    /// A committed op is missing from the primary's own journal (§5.8): divergence.
    #[error("committed op {op} missing from the primary's journal")]
    CommittedOpMissing {
        /// The op.
        op: u64,
    },
}

/// One thing the driver must do. Variants that touch storage are executed in emission order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Enqueue `frame` to peer `to` (never this replica). Best effort: a full queue or a
    /// missing connection drops it silently; retransmission heals. The frame is complete and
    /// sealed.
    Send {
        /// Destination replica.
        to: ReplicaId,
        /// The frame.
        frame: Frame,
    },
    /// Durably journal this prepare frame (command Prepare, identity in `checksum`) at `op`,
    /// replacing nothing: the core never appends an op the journal already holds unless a
    /// [`Effect::Truncate`] removed it first. Complete with [`Completion::Appended`] (or
    /// `AppendFailed`). For partition SendMessages the body is already stamped.
    Append {
        /// The op (same as the frame header's).
        op: u64,
        /// The prepare frame.
        frame: Frame,
    },
    /// Remove every journal entry with op `>= from_op` (view-change reconciliation). Must take
    /// effect before any later `Append`, and only once every [`Effect::PersistVsrState`]
    /// emitted before it is durable: the core emits one right before each truncation, carrying
    /// the raised truncation ceiling and the view's headers, so no later life nacks an op this
    /// one acknowledged (decision 51). If that write fails the driver must fail-stop instead
    /// of truncating. No completion.
    Truncate {
        /// First op removed.
        from_op: u64,
    },
    /// Write the superblock with this state, every field in one atomic generation (the view
    /// headers with the `log_view` they belong to, decision 50); complete with
    /// [`Completion::VsrStatePersisted`] carrying the same `(view, log_view)`, or
    /// `VsrStatePersistFailed`. `snapshot_checksum`/`snapshot_timestamp` name the prepare at
    /// `snapshot_op`: the driver records them with its checkpoint when `snapshot_op` is the
    /// checkpoint its superblock names and it does not know them yet (decision 52).
    PersistVsrState(VsrState),
    /// Read the journaled prepare at `op` (expected identity `checksum`) and answer with
    /// [`Completion::Read`]. Used for committed bodies the core no longer caches, and on the
    /// partition plane for repair below the checkpoint, where the WAL may still retain ops the
    /// core no longer indexes (decision 71).
    Read {
        /// The op.
        op: u64,
        /// Its expected identity; 0 when the core does not know it (partition ops below its
        /// index): the driver answers with whatever prepare it holds at `op`, or `None`.
        checksum: u128,
    },
    /// A reply (command Reply) or eviction (command Eviction) frame for a client connection.
    Reply {
        /// The client.
        client: ClientId,
        /// The frame.
        frame: Frame,
    },
    /// Checkpoint at `op` (journal.md §3.4, G4): the state machine and client table are exactly
    /// at `op` (the core emits this last in a step, at `commit_min`). Make that state durable as
    /// the snapshot at `op`, then set the journal's snapshot floor to `op` and drop the entries
    /// below it (keep the entry at `op` itself). Emitted periodically (every
    /// `checkpoint_interval_ops` applied ops, node-local) and after a state transfer installed
    /// (the installed state must become durable). Complete with [`Completion::Checkpointed`];
    /// only then does the core stop serving ops at or below `op`.
    Checkpoint {
        /// The snapshot op.
        op: u64,
    },
    /// Stop the process (not the shard): an environmental failure the core cannot survive.
    Fatal(FatalReason),
}

/// The effects of one or more steps. Owned and reused by the caller; drain it in order after
/// every step.
#[derive(Debug, Default)]
pub struct Outbox {
    effects: Vec<Effect>,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Outbox {
        Outbox::default()
    }

    /// Appends an effect (the core's only way to act).
    pub fn push(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    /// Takes the effects in emission order, leaving the allocation for reuse.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Effect> {
        self.effects.drain(..)
    }

    /// The pending effects.
    pub fn effects(&self) -> &[Effect] {
        &self.effects
    }

    /// Number of pending effects.
    pub fn len(&self) -> usize {
        self.effects.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.effects.is_empty()
    }

    /// Drops every pending effect.
    pub fn clear(&mut self) {
        self.effects.clear();
    }
}

/// What the driver recovered from disk for this group (journal.md §3.5, §6). A fresh group is
/// [`Recovered::fresh`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The superblock's state, `None` if no superblock existed (fresh group).
    pub superblock: Option<VsrState>,
    /// The op the state machine (and client table) was restored at; 0 = no snapshot.
    pub snapshot_op: u64,
    /// Identity of the prepare at `snapshot_op` (the `parent` of `snapshot_op + 1`); 0 if none.
    /// Only what the node's own disk recorded with the checkpoint (decision 52), never a value
    /// learned elsewhere.
    pub snapshot_checksum: u128,
    /// Timestamp of the prepare at `snapshot_op` (floor for later prepares); 0 if none.
    pub snapshot_timestamp: u64,
    /// Journaled prepare frames above `snapshot_op`, in op order, each sealed, optionally
    /// preceded by the entry at `snapshot_op` itself (compaction keeps it, journal.md G4; the
    /// core indexes its header when its identity is `snapshot_checksum`). Holes are
    /// allowed and must not be truncated (the core keeps entries above a hole); the core
    /// stops at a chain break between adjacent entries and asks for a `Truncate` there.
    pub frames: Vec<Frame>,
    /// Headers of ops above every entry of `frames` that the journal knows were durably
    /// written (its header ring holds them) but whose stored prepare is damaged: held but
    /// faulty. The core keeps them as its log head, neither present nor nacked in a
    /// DoViewChange, and repairs their bodies from peers (decision 62). In op order.
    pub faulty: Vec<wire::header::PrepareHeader>,
    /// Serialized client table of the snapshot (metadata plane; empty = none).
    pub client_table: Vec<u8>,
    /// Partition plane: the persisted `offset_frontier` (next offset to mint, at least).
    pub offset_frontier: u64,
    /// The node lost this group's state after having run it (its data directory was wiped
    /// after a refused boot, journal.md G3). It may have acknowledged prepares it no longer
    /// holds, so it must not vote before it has adopted a view: it joins Recovering and never
    /// takes the probe-exhausted election fallback (§9.3) until a StartView arrives.
    pub lost_state: bool,
    /// Fresh random non-zero value per boot, supplied by the caller. The metadata group uses
    /// it as its incarnation (§9.3); every group seeds its PRNG with it.
    pub incarnation: u128,
}

impl Recovered {
    /// A group that never existed on this node.
    pub fn fresh(incarnation: u128) -> Recovered {
        Recovered {
            incarnation,
            ..Recovered::default()
        }
    }

    /// Whether the group has a prior life (superblock or journal entries, §9.1).
    pub fn has_prior_life(&self) -> bool {
        self.superblock.is_some()
            || !self.frames.is_empty()
            || self.snapshot_op > 0
            || self.lost_state
    }

    /// A node whose data directory was wiped and that rejoins (see `lost_state`).
    pub fn wiped(incarnation: u128) -> Recovered {
        Recovered {
            lost_state: true,
            incarnation,
            ..Recovered::default()
        }
    }
}

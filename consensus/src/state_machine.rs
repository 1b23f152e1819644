//! The interface between the core and the replicated state it drives.
//!
//! The core owns the log, the client table (metadata plane) and the partition offset counter;
//! everything else (streams, topics, users, segments, consumer offsets) lives behind
//! [`StateMachine`]. Every method is deterministic: it must depend only on its arguments and
//! previously applied ops, never on clocks, randomness or local events.

use std::collections::BTreeMap;

use wire::header::PrepareHeader;
use wire::manifest::{self, ArtifactKind, ManifestEntry};

use crate::types::{Frame, ReplicaId};

/// Result of projecting a client request into a prepare body (§5.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    /// The operation the prepare carries (e.g. CreateTopic → CreateTopicWithAssignments).
    pub operation: wire::Operation,
    /// The server-prepared body every replica applies.
    pub body: Vec<u8>,
}

/// One state-transfer artifact (state-transfer.md §2, consensus.md §11.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Kind (the core adds [`ArtifactKind::CLIENT_TABLE`] itself on the metadata plane).
    pub kind: ArtifactKind,
    /// The kind's frontier (snapshot op, segment base offset, ...).
    pub frontier: u64,
    /// The artifact's bytes, opaque to the core.
    pub bytes: Vec<u8>,
}

/// Why a state machine refused an install.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InstallError {
    /// An artifact's magic/version/content does not decode.
    #[error("artifact {index} does not decode")]
    Decode {
        /// Index in the manifest.
        index: usize,
    },
    /// A required artifact is missing.
    #[error("artifact missing")]
    Missing,
}

/// Why a state machine could not serve or stage a transfer chunk (an IO failure on the node's
/// disk, or a chunk outside the staged manifest). The core drops the chunk (serving side: the
/// requester's stall timer asks again) or discards the session (receiving side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// No offer under this key, or the artifact/range lies outside it.
    #[error("no such offer or range")]
    NoOffer,
    /// Reading or writing the artifact's bytes failed.
    #[error("artifact io failed")]
    Io,
}

/// The replicated state machine of one group.
///
/// State transfer is streamed (decision 170): the core never holds an artifact whole. The
/// serving side describes a frozen image of the state ([`StateMachine::offer`]) and reads it
/// chunk by chunk ([`StateMachine::read_chunk`]); the receiving side hands each in-order chunk,
/// after the core checked its place, to [`StateMachine::stage_chunk`], verifies each artifact's
/// length and XXH3-64 incrementally, and only then calls [`StateMachine::install_staged`].
/// Machines whose state is small build their artifacts whole in memory instead
/// ([`WholeArtifacts`] behind the [`Buffered`] adapter).
pub trait StateMachine {
    /// Projects a client request into the prepare the primary replicates. The default keeps the
    /// client's operation and body. Only the primary calls this, and only at admission.
    fn project(&mut self, operation: wire::Operation, body: &[u8]) -> Projection {
        Projection {
            operation,
            body: body.to_vec(),
        }
    }

    /// Primary-only check before replication (§5.1): `Err(code)` refuses the request with that
    /// client-plane error code (e.g. a consumer-offset delete of an offset that does not exist),
    /// nothing enters the pipeline. Called after the core's own preflight. Default: accept.
    fn preflight(&self, operation: wire::Operation, body: &[u8]) -> Result<(), u32> {
        let _ = (operation, body);
        Ok(())
    }

    /// Applies committed `op` (the prepare `header` and its body) and writes the reply body
    /// into `reply` (cleared by the caller). Business rejections are deterministic no-ops whose
    /// result rides the reply. Register/Logout never reach this (the core's client table
    /// handles them); partition SendMessages bodies arrive stamped.
    fn apply(&mut self, header: &PrepareHeader, body: &[u8], reply: &mut Vec<u8>);

    /// Metadata plane: the session of `client` ended at a committed op (its Logout, a new
    /// Register under the same client id, or the client table evicting it to make room), in
    /// the same step as the client table's change, on every replica alike. The machine drops
    /// whatever it keys by the session (consumer-group memberships). Must be idempotent: a
    /// client with nothing to drop is a no-op. Default: nothing is keyed by sessions.
    fn end_session(&mut self, client: u128) {
        let _ = client;
    }

    /// Metadata plane, primary only: the body of the Register prepare for a session whose
    /// client connection is on replica `origin` (this replica, or the backup that forwarded
    /// it, §13). A machine that records where sessions come from writes `origin` into the body
    /// it returns. Default: the request's body unchanged.
    fn project_register(&mut self, origin: ReplicaId, body: &[u8]) -> Vec<u8> {
        let _ = origin;
        body.to_vec()
    }

    /// Metadata plane: the Register of `header.client` committed (after the session it
    /// replaces ended, [`StateMachine::end_session`]), in the same step as the client table's
    /// change, on every replica alike; `body` is the prepare's, as
    /// [`StateMachine::project_register`] wrote it. Untrusted like every body. Default:
    /// nothing is keyed by sessions.
    fn begin_session(&mut self, header: &PrepareHeader, body: &[u8]) {
        let _ = (header, body);
    }

    /// [`StateMachine::apply`] with the whole journaled frame: a machine that keeps the body
    /// can share the frame's bytes (`frame.shared().slice(HEADER_SIZE..)`) instead of copying
    /// them. The core calls this one; the default applies `frame.body()`.
    fn apply_frame(&mut self, header: &PrepareHeader, frame: &Frame, reply: &mut Vec<u8>) {
        self.apply(header, frame.body(), reply);
    }

    /// Serving side: freezes the state at the current applied op (`commit_op`) as an offer for
    /// `requester` and describes its artifacts in manifest order (kind, frontier, length,
    /// XXH3-64 of the bytes). The image must stay readable, byte for byte, while later ops are
    /// applied, until [`StateMachine::release_offer`] for `requester` or the next `offer` for
    /// it (which replaces it). The core adds the CLIENT_TABLE artifact itself on the metadata
    /// plane.
    fn offer(
        &mut self,
        requester: ReplicaId,
        commit_op: u64,
    ) -> Result<Vec<ManifestEntry>, TransferError>;

    /// Serving side: appends bytes `[offset, offset + len)` of artifact `index` of
    /// `requester`'s offer to `buf` (the core checked the range against the offer's manifest;
    /// `len` is at most one chunk).
    fn read_chunk(
        &mut self,
        requester: ReplicaId,
        index: usize,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), TransferError>;

    /// Serving side: the offer for `requester` expired; drop its image.
    fn release_offer(&mut self, requester: ReplicaId);

    /// Receiving side: a new session accepted this manifest (the state machine's artifacts
    /// only, in manifest order; the core keeps the CLIENT_TABLE itself). Discards anything
    /// staged before.
    fn stage_begin(&mut self, entries: &[ManifestEntry]) -> Result<(), TransferError>;

    /// Receiving side: the next bytes of artifact `index` (of the entries given to
    /// [`StateMachine::stage_begin`]), at `offset` = the bytes staged so far for it. Chunks
    /// arrive in manifest order; the core verifies each artifact's length and checksum as its
    /// last chunk lands and discards the session on a mismatch.
    fn stage_chunk(&mut self, index: usize, offset: u64, bytes: &[u8])
    -> Result<(), TransferError>;

    /// Receiving side: every staged artifact is complete and verified; replace the whole state
    /// with it, at `commit_op`. Must leave the state untouched on error (validate first, then
    /// mutate). The staged data is consumed either way.
    fn install_staged(&mut self, commit_op: u64) -> Result<(), InstallError>;

    /// Partition plane: the next message offset after everything applied (after an install,
    /// the offered frontier). The default 0 leaves the core's own counter in charge.
    fn next_offset(&self) -> u64 {
        0
    }
}

/// A state machine whose transfer artifacts are small enough to build whole in memory (the
/// metadata snapshot, the test machines). Wrap it in [`Buffered`] to run it in a replica.
pub trait WholeArtifacts {
    /// See [`StateMachine::project`].
    fn project(&mut self, operation: wire::Operation, body: &[u8]) -> Projection {
        Projection {
            operation,
            body: body.to_vec(),
        }
    }

    /// See [`StateMachine::preflight`].
    fn preflight(&self, operation: wire::Operation, body: &[u8]) -> Result<(), u32> {
        let _ = (operation, body);
        Ok(())
    }

    /// See [`StateMachine::apply`].
    fn apply(&mut self, header: &PrepareHeader, body: &[u8], reply: &mut Vec<u8>);

    /// See [`StateMachine::end_session`].
    fn end_session(&mut self, client: u128) {
        let _ = client;
    }

    /// See [`StateMachine::project_register`].
    fn project_register(&mut self, origin: ReplicaId, body: &[u8]) -> Vec<u8> {
        let _ = origin;
        body.to_vec()
    }

    /// See [`StateMachine::begin_session`].
    fn begin_session(&mut self, header: &PrepareHeader, body: &[u8]) {
        let _ = (header, body);
    }

    /// The state as artifacts at the current applied op (`commit_op`).
    fn artifacts(&mut self, commit_op: u64) -> Vec<Artifact>;

    /// Replaces the whole state with the given artifacts (all verified against the manifest).
    /// Must leave the state untouched on error (validate first, then mutate).
    fn install(&mut self, commit_op: u64, artifacts: &[Artifact]) -> Result<(), InstallError>;

    /// See [`StateMachine::next_offset`].
    fn next_offset(&self) -> u64 {
        0
    }
}

/// The adapter that runs a [`WholeArtifacts`] machine as a [`StateMachine`]: offers are built
/// whole and kept in memory until released, staged chunks are appended to in-memory buffers.
/// Memory is the machine's own affair (the core still holds at most a chunk); meant for small
/// states. Dereferences to the machine.
#[derive(Debug, Clone, Default)]
pub struct Buffered<M> {
    /// The wrapped machine.
    pub machine: M,
    offers: BTreeMap<u8, Vec<Artifact>>,
    staged: Vec<Artifact>,
}

impl<M> Buffered<M> {
    /// Wraps `machine`.
    pub fn new(machine: M) -> Buffered<M> {
        Buffered {
            machine,
            offers: BTreeMap::new(),
            staged: Vec::new(),
        }
    }

    /// Offers currently held (observability and tests).
    pub fn offers_held(&self) -> usize {
        self.offers.len()
    }
}

/// Two adapters are equal when their machines are (offers and staging are transient).
impl<M: PartialEq> PartialEq for Buffered<M> {
    fn eq(&self, other: &Self) -> bool {
        self.machine == other.machine
    }
}

impl<M: Eq> Eq for Buffered<M> {}

impl<M> std::ops::Deref for Buffered<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.machine
    }
}

impl<M> std::ops::DerefMut for Buffered<M> {
    fn deref_mut(&mut self) -> &mut M {
        &mut self.machine
    }
}

impl<M: WholeArtifacts> StateMachine for Buffered<M> {
    fn project(&mut self, operation: wire::Operation, body: &[u8]) -> Projection {
        self.machine.project(operation, body)
    }

    fn preflight(&self, operation: wire::Operation, body: &[u8]) -> Result<(), u32> {
        self.machine.preflight(operation, body)
    }

    fn apply(&mut self, header: &PrepareHeader, body: &[u8], reply: &mut Vec<u8>) {
        self.machine.apply(header, body, reply);
    }

    fn end_session(&mut self, client: u128) {
        self.machine.end_session(client);
    }

    fn project_register(&mut self, origin: ReplicaId, body: &[u8]) -> Vec<u8> {
        self.machine.project_register(origin, body)
    }

    fn begin_session(&mut self, header: &PrepareHeader, body: &[u8]) {
        self.machine.begin_session(header, body);
    }

    fn offer(
        &mut self,
        requester: ReplicaId,
        commit_op: u64,
    ) -> Result<Vec<ManifestEntry>, TransferError> {
        let artifacts = self.machine.artifacts(commit_op);
        let entries = artifacts
            .iter()
            .map(|a| ManifestEntry {
                kind: a.kind,
                frontier: a.frontier,
                len: a.bytes.len() as u64,
                checksum: manifest::artifact_checksum(&a.bytes),
            })
            .collect();
        self.offers.insert(requester.0, artifacts);
        Ok(entries)
    }

    fn read_chunk(
        &mut self,
        requester: ReplicaId,
        index: usize,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), TransferError> {
        let bytes = &self
            .offers
            .get(&requester.0)
            .and_then(|o| o.get(index))
            .ok_or(TransferError::NoOffer)?
            .bytes;
        let start = usize::try_from(offset).map_err(|_| TransferError::NoOffer)?;
        let chunk = start
            .checked_add(len)
            .and_then(|end| bytes.get(start..end))
            .ok_or(TransferError::NoOffer)?;
        buf.extend_from_slice(chunk);
        Ok(())
    }

    fn release_offer(&mut self, requester: ReplicaId) {
        self.offers.remove(&requester.0);
    }

    fn stage_begin(&mut self, entries: &[ManifestEntry]) -> Result<(), TransferError> {
        self.staged = entries
            .iter()
            .map(|e| Artifact {
                kind: e.kind,
                frontier: e.frontier,
                bytes: Vec::new(),
            })
            .collect();
        Ok(())
    }

    fn stage_chunk(
        &mut self,
        index: usize,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), TransferError> {
        let artifact = self.staged.get_mut(index).ok_or(TransferError::NoOffer)?;
        if artifact.bytes.len() as u64 != offset {
            return Err(TransferError::NoOffer);
        }
        artifact.bytes.extend_from_slice(bytes);
        Ok(())
    }

    fn install_staged(&mut self, commit_op: u64) -> Result<(), InstallError> {
        let staged = std::mem::take(&mut self.staged);
        self.machine.install(commit_op, &staged)
    }

    fn next_offset(&self) -> u64 {
        self.machine.next_offset()
    }
}

/// A tiny deterministic state machine for tests and the simulator: it folds every applied body
/// into a running XXH3 digest and replies with `(op, digest)` (16 bytes). Its single artifact
/// (kind METADATA_SNAPSHOT, or SEGMENT_LOG with `partition`) is the 16-byte `(op, digest)`, so
/// an installed copy equals the original.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DigestMachine {
    /// Last applied op.
    pub op: u64,
    /// Running digest of everything applied.
    pub digest: u64,
    /// Emit and accept the artifact as a partition (SEGMENT_LOG) instead of a metadata
    /// snapshot.
    pub partition: bool,
}

/// [`DigestMachine`] as a replica runs it.
pub type DigestStateMachine = Buffered<DigestMachine>;

impl DigestMachine {
    /// The machine's state as its single artifact's bytes: `(op, digest)`.
    pub fn state_bytes(&self) -> [u8; 16] {
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&self.op.to_le_bytes());
        bytes[8..].copy_from_slice(&self.digest.to_le_bytes());
        bytes
    }

    /// Restores `(op, digest)` from [`DigestMachine::state_bytes`], refusing a state beyond
    /// `commit_op`.
    pub fn restore(
        &mut self,
        commit_op: u64,
        bytes: &[u8],
        index: usize,
    ) -> Result<(), InstallError> {
        let bytes: [u8; 16] = bytes
            .try_into()
            .map_err(|_| InstallError::Decode { index })?;
        let op = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        if op > commit_op {
            return Err(InstallError::Decode { index });
        }
        self.op = op;
        self.digest = u64::from_le_bytes(bytes[8..].try_into().expect("8 bytes"));
        Ok(())
    }

    /// The kind of the machine's artifact.
    pub fn kind(&self) -> ArtifactKind {
        if self.partition {
            ArtifactKind::SEGMENT_LOG
        } else {
            ArtifactKind::METADATA_SNAPSHOT
        }
    }
}

impl WholeArtifacts for DigestMachine {
    fn apply(&mut self, header: &PrepareHeader, body: &[u8], reply: &mut Vec<u8>) {
        let mut input = Vec::with_capacity(16 + body.len());
        input.extend_from_slice(&self.digest.to_le_bytes());
        input.extend_from_slice(&header.op.get().to_le_bytes());
        input.extend_from_slice(body);
        self.digest = xxhash_rust::xxh3::xxh3_64(&input);
        self.op = header.op.get();
        reply.extend_from_slice(&self.op.to_le_bytes());
        reply.extend_from_slice(&self.digest.to_le_bytes());
    }

    fn artifacts(&mut self, commit_op: u64) -> Vec<Artifact> {
        // Register/Logout never reach `apply`, so `self.op` (the last op applied here) may lag
        // `commit_op`; the artifact carries it so an install reproduces this exact state.
        debug_assert!(self.op <= commit_op);
        vec![Artifact {
            kind: self.kind(),
            frontier: commit_op,
            bytes: self.state_bytes().to_vec(),
        }]
    }

    fn install(&mut self, commit_op: u64, artifacts: &[Artifact]) -> Result<(), InstallError> {
        let (index, artifact) = artifacts
            .iter()
            .enumerate()
            .find(|(_, a)| {
                a.kind == ArtifactKind::METADATA_SNAPSHOT || a.kind == ArtifactKind::SEGMENT_LOG
            })
            .ok_or(InstallError::Missing)?;
        self.restore(commit_op, &artifact.bytes, index)
    }
}

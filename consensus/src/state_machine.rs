//! The interface between the core and the replicated state it drives.
//!
//! The core owns the log, the client table (metadata plane) and the partition offset counter;
//! everything else (streams, topics, users, segments, consumer offsets) lives behind
//! [`StateMachine`]. Every method is deterministic: it must depend only on its arguments and
//! previously applied ops, never on clocks, randomness or local events.

use wire::header::PrepareHeader;
use wire::manifest::ArtifactKind;

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

/// The replicated state machine of one group.
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

    /// The state as artifacts at the current applied op (`commit_op`), for a state transfer.
    fn artifacts(&mut self, commit_op: u64) -> Vec<Artifact>;

    /// Replaces the whole state with the given artifacts (all verified against the manifest).
    /// Must leave the state untouched on error (validate first, then mutate).
    fn install(&mut self, commit_op: u64, artifacts: &[Artifact]) -> Result<(), InstallError>;

    /// Partition plane: the next message offset after everything applied (after an install,
    /// the offered frontier). The default 0 leaves the core's own counter in charge.
    fn next_offset(&self) -> u64 {
        0
    }
}

/// A tiny deterministic state machine for tests and the simulator: it folds every applied body
/// into a running XXH3 digest and replies with `(op, digest)` (16 bytes). Its single artifact
/// (kind METADATA_SNAPSHOT, or SEGMENT_LOG with `partition`) is the 16-byte `(op, digest)`, so
/// an installed copy equals the original.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DigestStateMachine {
    /// Last applied op.
    pub op: u64,
    /// Running digest of everything applied.
    pub digest: u64,
    /// Emit and accept the artifact as a partition (SEGMENT_LOG) instead of a metadata
    /// snapshot.
    pub partition: bool,
}

impl StateMachine for DigestStateMachine {
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
        let mut bytes = Vec::with_capacity(16);
        bytes.extend_from_slice(&self.op.to_le_bytes());
        bytes.extend_from_slice(&self.digest.to_le_bytes());
        vec![Artifact {
            kind: if self.partition {
                ArtifactKind::SEGMENT_LOG
            } else {
                ArtifactKind::METADATA_SNAPSHOT
            },
            frontier: commit_op,
            bytes,
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
        let bytes: [u8; 16] = artifact
            .bytes
            .as_slice()
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
}

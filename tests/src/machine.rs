//! The replicated state machine the simulator runs: the core's `DigestStateMachine` (a running
//! digest of everything applied, replying `(op, digest)`), plus a log of what was applied so the
//! checkers can compare bodies, not only header identities (a partition prepare's identity does
//! not cover its stamped body, wire.md §7).

use consensus::{Artifact, DigestStateMachine, InstallError, Projection, StateMachine};
use wire::header::PrepareHeader;

/// One applied op: its number, its header and the XXH3 of the body as applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppliedBody {
    /// Op number.
    pub op: u64,
    /// The prepare header the state machine was handed.
    pub header: PrepareHeader,
    /// XXH3-64 of the applied body.
    pub body_digest: u64,
}

/// `DigestStateMachine` with an applied log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimMachine {
    /// The digest machine doing the actual work.
    pub inner: DigestStateMachine,
    /// Every op applied in this life, in order (the simulator reads it with a cursor).
    pub applied: Vec<AppliedBody>,
    /// Partition plane: the end (`base_offset + message_count`) of the highest committed
    /// SendMessages batch applied; the offset counter must never mint below it (journal.md G8).
    pub offset_end: u64,
}

impl StateMachine for SimMachine {
    fn project(&mut self, operation: wire::Operation, body: &[u8]) -> Projection {
        self.inner.project(operation, body)
    }

    fn apply(&mut self, header: &PrepareHeader, body: &[u8], reply: &mut Vec<u8>) {
        self.applied.push(AppliedBody {
            op: header.op.get(),
            header: *header,
            body_digest: wire::integrity::xxh3(body),
        });
        if header.operation == wire::Operation::SendMessages.byte()
            && let Some(batch) = wire::batch::peek(body)
        {
            // The stamped batch (client-plane.md §8.1).
            self.offset_end = self.offset_end.max(batch.end_offset());
        }
        self.inner.apply(header, body, reply);
    }

    fn artifacts(&mut self, commit_op: u64) -> Vec<Artifact> {
        let mut artifacts = self.inner.artifacts(commit_op);
        if self.inner.partition {
            // The offset frontier travels with the segment log so an install (and a snapshot
            // of the installed state) resumes minting after it.
            artifacts.push(Artifact {
                kind: wire::manifest::ArtifactKind::CONSUMER_OFFSETS,
                frontier: commit_op,
                bytes: self.offset_end.to_le_bytes().to_vec(),
            });
        }
        artifacts
    }

    fn install(&mut self, commit_op: u64, artifacts: &[Artifact]) -> Result<(), InstallError> {
        let offset_end = artifacts
            .iter()
            .find(|a| a.kind == wire::manifest::ArtifactKind::CONSUMER_OFFSETS)
            .and_then(|a| <[u8; 8]>::try_from(a.bytes.as_slice()).ok())
            .map(u64::from_le_bytes);
        self.inner.install(commit_op, artifacts)?;
        if let Some(end) = offset_end {
            self.offset_end = end;
        }
        Ok(())
    }

    fn next_offset(&self) -> u64 {
        self.offset_end
    }
}

/// A SendMessages batch as a producer builds it (client-plane.md §8.1): `count` messages with
/// the given payload seed; partition id, base offset and base timestamp zero (the server stamps
/// them), checksums computed over those zeros.
pub fn send_messages_batch(count: u32, payload_seed: u64, origin_timestamp: u64) -> Vec<u8> {
    let payloads: Vec<[u8; 8]> = (0..count)
        .map(|i| (payload_seed ^ u64::from(i)).to_le_bytes())
        .collect();
    let messages: Vec<(u128, &[u8])> = (0..count)
        .zip(&payloads)
        .map(|(i, payload)| {
            let id = (u128::from(payload_seed) << 32) | u128::from(i) | 1;
            (id, payload.as_slice())
        })
        .collect();
    wire::batch::build_messages(0, 0, 0, origin_timestamp, &messages)
}

/// A SendMessages request body (client-plane.md §8.1): the envelope (`metadata_length`, stream
/// and topic as numeric Identifiers, Partitioning kind 2 with the partition id, messages_count)
/// followed by `batch`.
pub fn send_messages_request(stream: u32, topic: u32, partition: u32, batch: &[u8]) -> Vec<u8> {
    let mut meta = Vec::new();
    for id in [stream, topic] {
        meta.extend_from_slice(&[1, 4]);
        meta.extend_from_slice(&id.to_le_bytes());
    }
    meta.extend_from_slice(&[2, 4]);
    meta.extend_from_slice(&partition.to_le_bytes());
    let count = wire::batch::peek(batch).map_or(0, |header| header.message_count);
    meta.extend_from_slice(&count.to_le_bytes());
    let mut body = (meta.len() as u32).to_le_bytes().to_vec();
    body.extend_from_slice(&meta);
    body.extend_from_slice(batch);
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_tiles_exactly() {
        let b = send_messages_batch(3, 9, 1_000);
        let header = wire::batch::verify(&b).unwrap();
        assert_eq!(header.length as usize, b.len());
        assert_eq!(header.origin_timestamp, 1_000);
        assert_eq!(b.len(), 256 + 3 * (48 + 8));
    }
}

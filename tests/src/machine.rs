//! The replicated state machine the simulator runs: the core's `DigestStateMachine` (a running
//! digest of everything applied, replying `(op, digest)`), plus a log of what was applied so the
//! checkers can compare bodies, not only header identities (a partition prepare's identity does
//! not cover its stamped body, wire.md §7).

use std::collections::BTreeMap;

use consensus::{
    DigestMachine, InstallError, Projection, ReplicaId, StateMachine, TransferError, WholeArtifacts,
};
use wire::header::PrepareHeader;
use wire::manifest::{ArtifactKind, ManifestEntry};

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

/// `DigestMachine` with an applied log, serving and staging its artifacts by chunk (decision
/// 170) without ever holding one whole: the SEGMENT_LOG (or METADATA_SNAPSHOT) artifact is the
/// 16-byte `(op, digest)` followed by `artifact_pad` bytes generated from it, so a seed can
/// transfer artifacts many chunks long while the machine keeps O(1) bytes per offer and per
/// staging session. The receiver checks every padding byte against the generator as it
/// arrives (a decode check; the core checks length and checksum).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimMachine {
    /// The digest machine doing the actual work.
    pub inner: DigestMachine,
    /// Every op applied in this life, in order (the simulator reads it with a cursor).
    pub applied: Vec<AppliedBody>,
    /// Partition plane: the end (`base_offset + message_count`) of the highest committed
    /// SendMessages batch applied; the offset counter must never mint below it (journal.md G8).
    pub offset_end: u64,
    /// Padding bytes after the 16-byte state in the main artifact (per seed; 0 = none).
    pub artifact_pad: u64,
    /// Frozen images by requester.
    pub(crate) offers: BTreeMap<u8, Image>,
    /// The receiving session's staged data.
    pub(crate) staging: Option<Staging>,
}

/// A frozen offer: everything its artifacts are generated from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Image {
    state: [u8; 16],
    offset_end: u64,
    pad: u64,
    kind: ArtifactKind,
    partition: bool,
}

/// What a receiver staged so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Staging {
    entries: Vec<ManifestEntry>,
    received: Vec<u64>,
    /// The main artifact's first 16 bytes.
    state: Vec<u8>,
    /// The CONSUMER_OFFSETS artifact (8 bytes).
    offsets: Vec<u8>,
    /// A padding byte differed from the generator, or an artifact was longer than its shape.
    damaged: bool,
}

/// Padding byte `i` for the state `state`: a cheap keyed stream (splitmix64 per 8-byte word).
fn pad_words(state: &[u8; 16], from: u64, len: usize, out: &mut Vec<u8>) {
    let key = wire::integrity::xxh3(state);
    let mut i = from;
    let end = from + len as u64;
    while i < end {
        let word = i / 8;
        let mut z = key ^ word.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let bytes = z.to_le_bytes();
        let lo = (i % 8) as usize;
        let take = (8 - lo).min((end - i) as usize);
        out.extend_from_slice(&bytes[lo..lo + take]);
        i += take as u64;
    }
}

impl Image {
    fn main_len(&self) -> u64 {
        16 + self.pad
    }

    /// Appends bytes `[offset, offset + len)` of artifact `index`.
    fn read(&self, index: usize, offset: u64, len: usize, out: &mut Vec<u8>) -> Option<()> {
        let total = match index {
            0 => self.main_len(),
            1 if self.partition => 8,
            _ => return None,
        };
        if offset.checked_add(len as u64)? > total {
            return None;
        }
        if index == 1 {
            let bytes = self.offset_end.to_le_bytes();
            out.extend_from_slice(&bytes[offset as usize..offset as usize + len]);
            return Some(());
        }
        let mut at = offset;
        let end = offset + len as u64;
        if at < 16 {
            let upto = end.min(16);
            out.extend_from_slice(&self.state[at as usize..upto as usize]);
            at = upto;
        }
        if at < end {
            pad_words(&self.state, at - 16, (end - at) as usize, out);
        }
        Some(())
    }
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

    fn offer(
        &mut self,
        requester: ReplicaId,
        commit_op: u64,
    ) -> Result<Vec<ManifestEntry>, TransferError> {
        // Register/Logout never reach `apply`, so the machine's op may lag `commit_op`.
        debug_assert!(self.inner.op <= commit_op);
        let image = Image {
            state: self.inner.state_bytes(),
            offset_end: self.offset_end,
            pad: self.artifact_pad,
            kind: self.inner.kind(),
            partition: self.inner.partition,
        };
        let mut entries = Vec::new();
        let count = if image.partition { 2 } else { 1 };
        let mut chunk = Vec::new();
        for index in 0..count {
            let len = if index == 0 { image.main_len() } else { 8 };
            // The checksum is computed streaming over the generated bytes, as a node would
            // over a file.
            let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
            let mut at = 0;
            while at < len {
                let take = (len - at).min(1 << 16) as usize;
                chunk.clear();
                image.read(index, at, take, &mut chunk).expect("in range");
                hasher.update(&chunk);
                at += take as u64;
            }
            entries.push(ManifestEntry {
                kind: if index == 0 {
                    image.kind
                } else {
                    ArtifactKind::CONSUMER_OFFSETS
                },
                frontier: commit_op,
                len,
                checksum: hasher.digest(),
            });
        }
        self.offers.insert(requester.0, image);
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
        self.offers
            .get(&requester.0)
            .and_then(|image| image.read(index, offset, len, buf))
            .ok_or(TransferError::NoOffer)
    }

    fn release_offer(&mut self, requester: ReplicaId) {
        self.offers.remove(&requester.0);
    }

    fn stage_begin(&mut self, entries: &[ManifestEntry]) -> Result<(), TransferError> {
        self.staging = Some(Staging {
            entries: entries.to_vec(),
            received: vec![0; entries.len()],
            state: Vec::with_capacity(16),
            offsets: Vec::with_capacity(8),
            damaged: false,
        });
        Ok(())
    }

    fn stage_chunk(
        &mut self,
        index: usize,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), TransferError> {
        let staging = self.staging.as_mut().ok_or(TransferError::NoOffer)?;
        let entry = *staging.entries.get(index).ok_or(TransferError::NoOffer)?;
        if staging.received[index] != offset {
            return Err(TransferError::NoOffer);
        }
        staging.received[index] += bytes.len() as u64;
        match entry.kind {
            ArtifactKind::CONSUMER_OFFSETS => {
                staging.offsets.extend_from_slice(bytes);
                staging.damaged |= staging.offsets.len() > 8;
            }
            ArtifactKind::SEGMENT_LOG | ArtifactKind::METADATA_SNAPSHOT => {
                let head = (16 - offset.min(16)) as usize;
                let (state, pad) = bytes.split_at(head.min(bytes.len()));
                staging.state.extend_from_slice(state);
                if !pad.is_empty() {
                    let Ok(key) = <[u8; 16]>::try_from(staging.state.as_slice()) else {
                        staging.damaged = true;
                        return Ok(());
                    };
                    let mut expected = Vec::with_capacity(pad.len());
                    let pad_at = (offset + state.len() as u64) - 16;
                    pad_words(&key, pad_at, pad.len(), &mut expected);
                    staging.damaged |= expected != pad;
                }
            }
            _ => staging.damaged = true,
        }
        Ok(())
    }

    fn install_staged(&mut self, commit_op: u64) -> Result<(), InstallError> {
        let staging = self.staging.take().ok_or(InstallError::Missing)?;
        let index = staging
            .entries
            .iter()
            .position(|e| e.kind == self.inner.kind())
            .ok_or(InstallError::Missing)?;
        if staging.damaged {
            return Err(InstallError::Decode { index });
        }
        let offset_end = if self.inner.partition {
            let offsets = <[u8; 8]>::try_from(staging.offsets.as_slice())
                .map_err(|_| InstallError::Missing)?;
            Some(u64::from_le_bytes(offsets))
        } else {
            None
        };
        // Validated: now mutate.
        self.inner.restore(commit_op, &staging.state, index)?;
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

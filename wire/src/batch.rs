//! The SendMessages batch (client-plane.md §8.1): a 256-byte batch header and `message_count`
//! message frames tiling the rest. The one reader and writer of this layout: the consensus core
//! checks and stamps batches with it, the journal verifies stored batches with it.

use xxhash_rust::xxh3::Xxh3Default;

use crate::integrity::xxh3;

/// Size of the batch header.
pub const HEADER_SIZE: usize = 256;
/// Size of a message frame's fixed head (payload and user headers follow it).
pub const FRAME_HEADER_SIZE: usize = 48;

const PARTITION_ID: usize = 0;
const BASE_OFFSET: usize = 8;
const BASE_TIMESTAMP: usize = 16;
const ORIGIN_TIMESTAMP: usize = 24;
const LENGTH: usize = 32;
const CHECKSUM: usize = 40;
const MESSAGE_COUNT: usize = 48;
const RESERVED: usize = 52;

const FRAME_CHECKSUM: usize = 0;
const FRAME_ID: usize = 8;
const FRAME_OFFSET_DELTA: usize = 24;
const FRAME_HEADERS_LENGTH: usize = 32;
const FRAME_PAYLOAD_LENGTH: usize = 36;
const FRAME_RESERVED: usize = 40;

/// The batch header's fields, as read (not verified).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// Resolved partition id (0 from a producer).
    pub partition_id: u64,
    /// Offset of the first message (0 from a producer).
    pub base_offset: u64,
    /// Server append time, µs (0 from a producer).
    pub base_timestamp: u64,
    /// Minimum of the messages' origin timestamps, µs.
    pub origin_timestamp: u64,
    /// `batch_length`: bytes of the whole batch, header included.
    pub length: u64,
    /// `batch_checksum`.
    pub checksum: u64,
    /// Messages in the batch.
    pub message_count: u32,
}

impl BatchHeader {
    /// The offset after the batch's last message.
    pub fn end_offset(&self) -> u64 {
        self.base_offset + self.message_count as u64
    }
}

/// Why bytes are not an intact batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BatchFault {
    /// Fewer bytes than the header or than `batch_length`.
    #[error("batch truncated")]
    Truncated,
    /// `batch_length`, `message_count` or the frame tiling is inconsistent.
    #[error("batch layout is inconsistent")]
    Layout,
    /// Reserved bytes (of the batch header or of a frame) are not zero.
    #[error("batch reserved bytes are not zero")]
    Reserved,
    /// A message frame checksum does not match.
    #[error("message {0} checksum mismatch")]
    Message(u32),
    /// The batch checksum does not match.
    #[error("batch checksum mismatch")]
    Checksum,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Reads the header fields without verifying anything: `None` if `bytes` is shorter than the
/// header.
pub fn peek(bytes: &[u8]) -> Option<BatchHeader> {
    let head = bytes.get(..HEADER_SIZE)?;
    Some(BatchHeader {
        partition_id: u64_at(head, PARTITION_ID),
        base_offset: u64_at(head, BASE_OFFSET),
        base_timestamp: u64_at(head, BASE_TIMESTAMP),
        origin_timestamp: u64_at(head, ORIGIN_TIMESTAMP),
        length: u64_at(head, LENGTH),
        checksum: u64_at(head, CHECKSUM),
        message_count: u32_at(head, MESSAGE_COUNT),
    })
}

/// The `batch_checksum` of a batch whose frames have the checksums `frame_checksums`: XXH3
/// over the header's fields before the checksum, `message_count`, then every frame checksum
/// (little endian). Hashed streaming, no buffer is allocated (decision 263).
pub fn checksum(batch: &[u8], frame_checksums: impl IntoIterator<Item = u64>) -> u64 {
    let mut hasher = BatchHasher::new(batch);
    for c in frame_checksums {
        hasher.push(c);
    }
    hasher.finish()
}

/// The `batch_checksum` computed as frame checksums arrive.
struct BatchHasher {
    hasher: Xxh3Default,
    /// Checksums are fed in blocks: one `update` per 8 bytes costs more than the hashing.
    block: [u8; 8 * 64],
    filled: usize,
}

impl BatchHasher {
    fn new(batch: &[u8]) -> BatchHasher {
        let mut hasher = Xxh3Default::new();
        hasher.update(&batch[PARTITION_ID..CHECKSUM]);
        hasher.update(&batch[MESSAGE_COUNT..RESERVED]);
        BatchHasher {
            hasher,
            block: [0; 8 * 64],
            filled: 0,
        }
    }

    fn push(&mut self, frame_checksum: u64) {
        self.block[self.filled..self.filled + 8].copy_from_slice(&frame_checksum.to_le_bytes());
        self.filled += 8;
        if self.filled == self.block.len() {
            self.hasher.update(&self.block);
            self.filled = 0;
        }
    }

    fn finish(mut self) -> u64 {
        self.hasher.update(&self.block[..self.filled]);
        self.hasher.digest()
    }
}

/// Verifies the batch at the start of `bytes` (bytes past `batch_length` are not looked at):
/// header, tiling, reserved bytes, every frame checksum in order, then the batch checksum.
pub fn verify(bytes: &[u8]) -> Result<BatchHeader, BatchFault> {
    let header = peek(bytes).ok_or(BatchFault::Truncated)?;
    if header.length < HEADER_SIZE as u64 {
        return Err(BatchFault::Truncated);
    }
    let len = usize::try_from(header.length).map_err(|_| BatchFault::Layout)?;
    let batch = bytes.get(..len).ok_or(BatchFault::Truncated)?;
    if header.message_count == 0 {
        return Err(BatchFault::Layout);
    }
    if batch[RESERVED..HEADER_SIZE].iter().any(|b| *b != 0) {
        return Err(BatchFault::Reserved);
    }
    let mut checksums = BatchHasher::new(batch);
    let mut at = HEADER_SIZE;
    for i in 0..header.message_count {
        let head = batch
            .get(at..at + FRAME_HEADER_SIZE)
            .ok_or(BatchFault::Layout)?;
        let end = at
            .checked_add(FRAME_HEADER_SIZE + u32_at(head, FRAME_PAYLOAD_LENGTH) as usize)
            .and_then(|e| e.checked_add(u32_at(head, FRAME_HEADERS_LENGTH) as usize))
            .ok_or(BatchFault::Layout)?;
        let frame = batch.get(at..end).ok_or(BatchFault::Layout)?;
        if frame[FRAME_RESERVED..FRAME_HEADER_SIZE]
            .iter()
            .any(|b| *b != 0)
        {
            return Err(BatchFault::Reserved);
        }
        let frame_checksum = u64_at(frame, FRAME_CHECKSUM);
        if frame_checksum != xxh3(&frame[FRAME_ID..]) {
            return Err(BatchFault::Message(i));
        }
        checksums.push(frame_checksum);
        at = end;
    }
    if at != len {
        return Err(BatchFault::Layout);
    }
    if header.checksum != checksums.finish() {
        return Err(BatchFault::Checksum);
    }
    Ok(header)
}

/// Stamps a verified batch in place (client-plane.md §8.1 "Server sets"): partition id, base
/// offset, base timestamp, then the batch checksum. Frames are not touched.
pub fn stamp(batch: &mut [u8], partition_id: u64, base_offset: u64, base_timestamp: u64) {
    batch[PARTITION_ID..PARTITION_ID + 8].copy_from_slice(&partition_id.to_le_bytes());
    batch[BASE_OFFSET..BASE_OFFSET + 8].copy_from_slice(&base_offset.to_le_bytes());
    batch[BASE_TIMESTAMP..BASE_TIMESTAMP + 8].copy_from_slice(&base_timestamp.to_le_bytes());
    let sum = checksum(
        batch,
        FrameChecksums {
            batch,
            at: HEADER_SIZE,
        },
    );
    batch[CHECKSUM..CHECKSUM + 8].copy_from_slice(&sum.to_le_bytes());
}

/// The frame checksums of a batch read in place (its frames tile it: it was verified).
struct FrameChecksums<'a> {
    batch: &'a [u8],
    at: usize,
}

impl Iterator for FrameChecksums<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let frame = self.batch.get(self.at..)?;
        if frame.len() < FRAME_HEADER_SIZE {
            return None;
        }
        self.at += FRAME_HEADER_SIZE
            + u32_at(frame, FRAME_HEADERS_LENGTH) as usize
            + u32_at(frame, FRAME_PAYLOAD_LENGTH) as usize;
        Some(u64_at(frame, FRAME_CHECKSUM))
    }
}

/// Builds a valid batch (tests, benches and the simulator): one message per payload, no user
/// headers, message ids 1, 2, ..., the given header fields.
pub fn build(
    partition_id: u64,
    base_offset: u64,
    base_timestamp: u64,
    origin_timestamp: u64,
    payloads: &[&[u8]],
) -> Vec<u8> {
    let messages: Vec<(u128, &[u8])> = (1..).zip(payloads.iter().copied()).collect();
    build_messages(
        partition_id,
        base_offset,
        base_timestamp,
        origin_timestamp,
        &messages,
    )
}

/// Builds a valid batch of `(id, payload)` messages: no user headers, timestamp deltas zero.
pub fn build_messages(
    partition_id: u64,
    base_offset: u64,
    base_timestamp: u64,
    origin_timestamp: u64,
    messages: &[(u128, &[u8])],
) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_SIZE];
    let mut checksums = Vec::with_capacity(messages.len());
    for (i, (id, payload)) in messages.iter().enumerate() {
        let start = out.len();
        out.extend_from_slice(&[0u8; FRAME_HEADER_SIZE]);
        out.extend_from_slice(payload);
        let frame = &mut out[start..];
        frame[FRAME_ID..FRAME_ID + 16].copy_from_slice(&id.to_le_bytes());
        frame[FRAME_OFFSET_DELTA..FRAME_OFFSET_DELTA + 4]
            .copy_from_slice(&(i as u32).to_le_bytes());
        frame[FRAME_PAYLOAD_LENGTH..FRAME_PAYLOAD_LENGTH + 4]
            .copy_from_slice(&(payload.len() as u32).to_le_bytes());
        let frame_checksum = xxh3(&frame[FRAME_ID..]);
        frame[FRAME_CHECKSUM..FRAME_CHECKSUM + 8].copy_from_slice(&frame_checksum.to_le_bytes());
        checksums.push(frame_checksum);
    }
    let len = out.len() as u64;
    out[PARTITION_ID..PARTITION_ID + 8].copy_from_slice(&partition_id.to_le_bytes());
    out[BASE_OFFSET..BASE_OFFSET + 8].copy_from_slice(&base_offset.to_le_bytes());
    out[BASE_TIMESTAMP..BASE_TIMESTAMP + 8].copy_from_slice(&base_timestamp.to_le_bytes());
    out[ORIGIN_TIMESTAMP..ORIGIN_TIMESTAMP + 8].copy_from_slice(&origin_timestamp.to_le_bytes());
    out[LENGTH..LENGTH + 8].copy_from_slice(&len.to_le_bytes());
    out[MESSAGE_COUNT..MESSAGE_COUNT + 4].copy_from_slice(&(messages.len() as u32).to_le_bytes());
    let sum = checksum(&out, checksums);
    out[CHECKSUM..CHECKSUM + 8].copy_from_slice(&sum.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_verify_stamp_roundtrip() {
        let mut batch = build(0, 0, 0, 0, &[b"hello", b"", b"world!!"]);
        let header = verify(&batch).unwrap();
        assert_eq!(
            (header.message_count, header.length),
            (3, batch.len() as u64)
        );
        stamp(&mut batch, 7, 100, 555);
        let header = verify(&batch).unwrap();
        assert_eq!(
            (
                header.partition_id,
                header.base_offset,
                header.base_timestamp
            ),
            (7, 100, 555)
        );
        assert_eq!(header.end_offset(), 103);
        assert_eq!(batch, build(7, 100, 555, 0, &[b"hello", b"", b"world!!"]));
    }

    #[test]
    fn the_streamed_checksum_is_xxh3_of_the_spelled_out_input() {
        // Counts around the 64-checksum block the hasher feeds at once.
        for count in [0usize, 1, 2, 63, 64, 65, 128, 200, 1000] {
            let batch = build(9, 77, 5, 4, &vec![&b"payload"[..]; count.max(1)]);
            let sums: Vec<u64> = (0..count as u64)
                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .collect();
            let mut input = Vec::new();
            input.extend_from_slice(&batch[PARTITION_ID..CHECKSUM]);
            input.extend_from_slice(&batch[MESSAGE_COUNT..RESERVED]);
            for c in &sums {
                input.extend_from_slice(&c.to_le_bytes());
            }
            assert_eq!(
                checksum(&batch, sums.iter().copied()),
                xxh3(&input),
                "{count}"
            );
        }
    }

    #[test]
    fn any_flip_is_caught_and_faults_are_named() {
        let batch = build(3, 100, 5_000, 5_000, &[b"hello", b"", b"world!!"]);
        for at in 0..batch.len() {
            let mut bad = batch.clone();
            bad[at] ^= 0x10;
            assert!(verify(&bad).is_err(), "byte {at}");
        }
        for cut in 0..batch.len() {
            assert!(verify(&batch[..cut]).is_err(), "cut {cut}");
        }
        let mut bad = batch.clone();
        bad[HEADER_SIZE + 50] ^= 1;
        assert_eq!(verify(&bad), Err(BatchFault::Message(0)));
        let mut bad = batch.clone();
        bad[BASE_TIMESTAMP] ^= 1;
        assert_eq!(verify(&bad), Err(BatchFault::Checksum));
        let mut bad = batch.clone();
        bad[100] = 1;
        assert_eq!(verify(&bad), Err(BatchFault::Reserved));
        let mut bad = batch.clone();
        bad[HEADER_SIZE + FRAME_RESERVED] = 1;
        assert_eq!(verify(&bad), Err(BatchFault::Reserved));
        let mut bad = batch.clone();
        bad[MESSAGE_COUNT..MESSAGE_COUNT + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(verify(&bad), Err(BatchFault::Layout));
        let mut bad = batch.clone();
        bad[HEADER_SIZE + 32..HEADER_SIZE + 36].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(verify(&bad), Err(BatchFault::Layout));
    }
}

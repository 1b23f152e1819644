//! The stamped SendMessages batch as segments store it (client-plane.md §8.1): a 256-byte batch
//! header and `message_count` message frames. Every batch read back from a segment is verified
//! (frame checksums, then the batch checksum) before it is served.

pub use wire::batch::BatchFault;
use wire::batch::{self, BatchHeader};

/// The batch header size.
pub const BATCH_HEADER: usize = batch::HEADER_SIZE;

/// The fields of a verified batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchInfo {
    /// Offset of the first message.
    pub base_offset: u64,
    /// Server append time, µs (the timestamp consumers see).
    pub base_timestamp: u64,
    /// Messages in the batch.
    pub message_count: u32,
    /// Bytes of the whole batch.
    pub len: u64,
}

impl BatchInfo {
    /// The offset after the batch's last message.
    pub fn end_offset(&self) -> u64 {
        self.base_offset + self.message_count as u64
    }
}

impl From<BatchHeader> for BatchInfo {
    fn from(header: BatchHeader) -> Self {
        Self {
            base_offset: header.base_offset,
            base_timestamp: header.base_timestamp,
            message_count: header.message_count,
            len: header.length,
        }
    }
}

/// Reads the header fields without verifying the messages: `None` if the header is shorter
/// than 256 bytes or `batch_length` is below it.
pub fn peek(bytes: &[u8]) -> Option<BatchInfo> {
    peek_header(bytes).map(BatchInfo::from)
}

/// [`peek`]'s header whole, its checksum included (a body reference names its batch by it,
/// decision 498).
pub fn peek_header(bytes: &[u8]) -> Option<BatchHeader> {
    batch::peek(bytes).filter(|header| header.length >= BATCH_HEADER as u64)
}

/// Verifies the batch at the start of `bytes` (`wire::batch::verify`).
pub fn verify(bytes: &[u8]) -> Result<BatchInfo, BatchFault> {
    batch::verify(bytes).map(BatchInfo::from)
}

/// Builds a stamped batch (for tests, benches and the simulator): one message per payload,
/// no user headers, the origin timestamp equal to the base timestamp.
pub fn build(
    partition_id: u64,
    base_offset: u64,
    base_timestamp: u64,
    payloads: &[&[u8]],
) -> Vec<u8> {
    batch::build(
        partition_id,
        base_offset,
        base_timestamp,
        base_timestamp,
        payloads,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_batches_verify_and_any_flip_is_caught() {
        let batch = build(3, 100, 5_000, &[b"hello", b"", b"world!!"]);
        let info = verify(&batch).unwrap();
        assert_eq!(info.base_offset, 100);
        assert_eq!(info.message_count, 3);
        assert_eq!(info.end_offset(), 103);
        for at in 0..batch.len() {
            let mut bad = batch.clone();
            bad[at] ^= 0x10;
            assert!(verify(&bad).is_err(), "byte {at}");
        }
        assert_eq!(verify(&batch[..200]), Err(BatchFault::Truncated));
    }

    /// A header whose `batch_length` is below the header itself is not a batch to peek: a
    /// scan that stepped by that length would not move (bytes from disk are untrusted).
    #[test]
    fn a_batch_length_below_the_header_is_not_peeked() {
        let mut batch = build(3, 100, 5_000, &[b"hello"]);
        assert_eq!(
            peek_header(&batch).map(|h| h.length),
            Some(batch.len() as u64)
        );
        assert_eq!(peek(&batch).map(|i| i.len), Some(batch.len() as u64));
        for length in [0, 1, BATCH_HEADER as u64 - 1] {
            batch[32..40].copy_from_slice(&length.to_le_bytes());
            assert_eq!(peek_header(&batch), None, "batch_length {length}");
            assert_eq!(peek(&batch), None, "batch_length {length}");
            assert_eq!(crate::wal::BodyRef::of(0, 0, &batch), None);
        }
        batch[32..40].copy_from_slice(&(BATCH_HEADER as u64).to_le_bytes());
        assert!(
            peek_header(&batch).is_some(),
            "a header alone is a batch of no messages"
        );
        assert_eq!(
            peek_header(&batch[..BATCH_HEADER - 1]),
            None,
            "a short header"
        );
    }

    #[test]
    fn a_hostile_message_count_is_a_layout_fault() {
        let mut batch = build(3, 100, 5_000, &[b"hello"]);
        batch[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(verify(&batch), Err(BatchFault::Layout));
    }
}

//! Partition plane specifics (§5.3, §5.6, client-plane.md §8.1): the SendMessages batch, its
//! stamp at the primary and its re-derivation on backups.

use wire::batch::{self, BatchFault};

/// The decoded fields of a batch that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batch {
    pub partition_id: u64,
    pub base_offset: u64,
    pub base_timestamp: u64,
    pub message_count: u32,
}

/// Why a batch is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchError {
    /// Length, tiling, reserved bytes or message count.
    Shape,
    /// A message frame checksum.
    MessageChecksum,
    /// The batch checksum.
    BatchChecksum,
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

/// Checks shape, message checksums and the batch checksum (§5.6 rules 1-3): `batch` must be
/// exactly one batch.
pub(crate) fn check(batch: &[u8]) -> Result<Batch, BatchError> {
    match batch::peek(batch) {
        Some(header) if header.length == batch.len() as u64 => {}
        _ => return Err(BatchError::Shape),
    }
    let header = batch::verify(batch).map_err(|fault| match fault {
        BatchFault::Truncated | BatchFault::Layout | BatchFault::Reserved => BatchError::Shape,
        BatchFault::Message(_) => BatchError::MessageChecksum,
        BatchFault::Checksum => BatchError::BatchChecksum,
    })?;
    Ok(Batch {
        partition_id: header.partition_id,
        base_offset: header.base_offset,
        base_timestamp: header.base_timestamp,
        message_count: header.message_count,
    })
}

/// The fields of a batch this replica already checked with [`check`] (a journaled prepare, a
/// committed op): the header read back and its length matched, no hash recomputed. `None` for
/// bytes that are not even shaped like one batch. Every frame the core journals passed
/// [`check`] on its way in (admission, `check_stamp`, repair, recovery), so this equals
/// `check(..).ok()` there at a fraction of the cost (decision 262).
pub(crate) fn checked(batch: &[u8]) -> Option<Batch> {
    let header = batch::peek(batch).filter(|h| h.length == batch.len() as u64)?;
    Some(Batch {
        partition_id: header.partition_id,
        base_offset: header.base_offset,
        base_timestamp: header.base_timestamp,
        message_count: header.message_count,
    })
}

/// Stamps a checked batch in place: partition id, base offset, base timestamp, then the batch
/// checksum (§5.3). Returns the batch's message count.
pub(crate) fn stamp(
    batch: &mut [u8],
    partition_id: u64,
    base_offset: u64,
    base_timestamp: u64,
) -> u32 {
    batch::stamp(batch, partition_id, base_offset, base_timestamp);
    batch::peek(batch).map_or(0, |h| h.message_count)
}

/// The batch inside a SendMessages request body (client-plane.md §8.1): the envelope is
/// `metadata_length u32` followed by that many bytes.
pub(crate) fn batch_of_request(body: &[u8]) -> Option<&[u8]> {
    body.get(batch_start(body)?..)
}

/// Where the batch starts inside a SendMessages request body (see [`batch_of_request`]).
pub(crate) fn batch_start(body: &[u8]) -> Option<usize> {
    let len = u32_at(body.get(0..4)?, 0) as usize;
    4usize.checked_add(len).filter(|start| *start <= body.len())
}

/// Builds a valid batch of `payloads` (tests, simulator and benches), producer-stamped (zeros).
pub fn build_batch(payloads: &[&[u8]]) -> Vec<u8> {
    batch::build(0, 0, 0, 0, payloads)
}

/// Wraps a batch in a minimal SendMessages envelope (stream 1, topic 1, partition kind 2).
pub fn build_send_messages_request(batch: &[u8], partition: u32) -> Vec<u8> {
    let mut envelope = Vec::new();
    envelope.extend_from_slice(&[1, 4]);
    envelope.extend_from_slice(&1u32.to_le_bytes());
    envelope.extend_from_slice(&[1, 4]);
    envelope.extend_from_slice(&1u32.to_le_bytes());
    envelope.extend_from_slice(&[2, 4]);
    envelope.extend_from_slice(&partition.to_le_bytes());
    let count = batch::peek(batch).map_or(0, |header| header.message_count);
    envelope.extend_from_slice(&count.to_le_bytes());
    let mut body = (envelope.len() as u32).to_le_bytes().to_vec();
    body.extend_from_slice(&envelope);
    body.extend_from_slice(batch);
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_check_stamp_roundtrip() {
        let mut batch = build_batch(&[b"hello", b"world!"]);
        let b = check(&batch).unwrap();
        assert_eq!(b.message_count, 2);
        assert_eq!(b.base_offset, 0);
        stamp(&mut batch, 7, 100, 555);
        let b = check(&batch).unwrap();
        assert_eq!(
            (b.partition_id, b.base_offset, b.base_timestamp),
            (7, 100, 555)
        );
        let request = build_send_messages_request(&batch, 7);
        assert_eq!(batch_of_request(&request), Some(batch.as_slice()));
    }

    #[test]
    fn damage_is_refused_never_panics() {
        let batch = build_batch(&[b"abc"]);
        let mut bad = batch.clone();
        bad[batch::HEADER_SIZE + 50] ^= 1;
        assert_eq!(check(&bad), Err(BatchError::MessageChecksum));
        let mut bad = batch.clone();
        bad[24] ^= 1;
        assert_eq!(check(&bad), Err(BatchError::BatchChecksum));
        let mut bad = batch.clone();
        bad[100] = 1;
        assert_eq!(check(&bad), Err(BatchError::Shape));
        for cut in 0..batch.len() {
            let _ = check(&batch[..cut]);
        }
        let mut huge = batch.clone();
        huge[batch::HEADER_SIZE + 32..batch::HEADER_SIZE + 36]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(check(&huge).is_err());
    }
}

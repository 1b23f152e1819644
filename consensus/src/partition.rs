//! Partition plane specifics (§5.3, §5.6, client-plane.md §8.1): the SendMessages batch, its
//! stamp at the primary and its re-derivation on backups.

use xxhash_rust::xxh3::xxh3_64;

/// Size of the batch header.
pub(crate) const BATCH_HEADER_SIZE: usize = 256;
const FRAME_HEADER_SIZE: usize = 48;

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

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}
fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

/// The batch checksum over the header fields and the frame checksums.
fn batch_checksum(batch: &[u8], frame_checksums: &[u64]) -> u64 {
    let mut input = Vec::with_capacity(44 + 8 * frame_checksums.len());
    input.extend_from_slice(&batch[0..40]);
    input.extend_from_slice(&batch[48..52]);
    for c in frame_checksums {
        input.extend_from_slice(&c.to_le_bytes());
    }
    xxh3_64(&input)
}

/// Checks shape, message checksums and the batch checksum (§5.6 rules 1-3).
pub(crate) fn check(batch: &[u8]) -> Result<Batch, BatchError> {
    if batch.len() < BATCH_HEADER_SIZE {
        return Err(BatchError::Shape);
    }
    let batch_length = u64_at(batch, 32);
    let message_count = u32_at(batch, 48);
    if batch_length != batch.len() as u64 || message_count == 0 {
        return Err(BatchError::Shape);
    }
    if batch[52..BATCH_HEADER_SIZE].iter().any(|b| *b != 0) {
        return Err(BatchError::Shape);
    }
    let mut checksums = Vec::with_capacity(message_count as usize);
    let mut at = BATCH_HEADER_SIZE;
    while at < batch.len() {
        if checksums.len() == message_count as usize || batch.len() - at < FRAME_HEADER_SIZE {
            return Err(BatchError::Shape);
        }
        let frame = &batch[at..];
        let headers = u64::from(u32_at(frame, 32));
        let payload = u64::from(u32_at(frame, 36));
        let len = FRAME_HEADER_SIZE as u64 + headers + payload;
        if len > frame.len() as u64 || frame[40..48].iter().any(|b| *b != 0) {
            return Err(BatchError::Shape);
        }
        let len = len as usize;
        let checksum = u64_at(frame, 0);
        if checksum != xxh3_64(&frame[8..len]) {
            return Err(BatchError::MessageChecksum);
        }
        checksums.push(checksum);
        at += len;
    }
    if checksums.len() != message_count as usize {
        return Err(BatchError::Shape);
    }
    if u64_at(batch, 40) != batch_checksum(batch, &checksums) {
        return Err(BatchError::BatchChecksum);
    }
    Ok(Batch {
        partition_id: u64_at(batch, 0),
        base_offset: u64_at(batch, 8),
        base_timestamp: u64_at(batch, 16),
        message_count,
    })
}

/// Stamps a checked batch in place: partition id, base offset, base timestamp, then the batch
/// checksum (§5.3).
pub(crate) fn stamp(batch: &mut [u8], partition_id: u64, base_offset: u64, base_timestamp: u64) {
    batch[0..8].copy_from_slice(&partition_id.to_le_bytes());
    batch[8..16].copy_from_slice(&base_offset.to_le_bytes());
    batch[16..24].copy_from_slice(&base_timestamp.to_le_bytes());
    let mut checksums = Vec::new();
    let mut at = BATCH_HEADER_SIZE;
    while at < batch.len() {
        let frame = &batch[at..];
        let len = FRAME_HEADER_SIZE + u32_at(frame, 32) as usize + u32_at(frame, 36) as usize;
        checksums.push(u64_at(frame, 0));
        at += len;
    }
    let checksum = batch_checksum(batch, &checksums);
    batch[40..48].copy_from_slice(&checksum.to_le_bytes());
}

/// The batch inside a SendMessages request body (client-plane.md §8.1): the envelope is
/// `metadata_length u32` followed by that many bytes.
pub(crate) fn batch_of_request(body: &[u8]) -> Option<&[u8]> {
    let len = u32_at(body.get(0..4)?, 0) as usize;
    body.get(4usize.checked_add(len)?..)
}

/// Builds a valid batch of `payloads` (tests, simulator and benches), producer-stamped (zeros).
pub fn build_batch(payloads: &[&[u8]]) -> Vec<u8> {
    let mut batch = vec![0u8; BATCH_HEADER_SIZE];
    let mut checksums = Vec::new();
    for (i, payload) in payloads.iter().enumerate() {
        let mut frame = vec![0u8; FRAME_HEADER_SIZE];
        frame[8..24].copy_from_slice(&(i as u128 + 1).to_le_bytes());
        frame[24..28].copy_from_slice(&(i as u32).to_le_bytes());
        frame[36..40].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(payload);
        let checksum = xxh3_64(&frame[8..]);
        frame[0..8].copy_from_slice(&checksum.to_le_bytes());
        checksums.push(checksum);
        batch.extend_from_slice(&frame);
    }
    let len = batch.len() as u64;
    batch[32..40].copy_from_slice(&len.to_le_bytes());
    batch[48..52].copy_from_slice(&(payloads.len() as u32).to_le_bytes());
    let checksum = batch_checksum(&batch, &checksums);
    batch[40..48].copy_from_slice(&checksum.to_le_bytes());
    batch
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
    envelope.extend_from_slice(&u32_at(batch, 48).to_le_bytes());
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
        bad[BATCH_HEADER_SIZE + 50] ^= 1;
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
        huge[BATCH_HEADER_SIZE + 32..BATCH_HEADER_SIZE + 36]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(check(&huge).is_err());
    }
}

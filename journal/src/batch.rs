//! The stamped SendMessages batch as segments store it (client-plane.md §8.1): a 256-byte batch
//! header and `message_count` message frames. Every batch read back from a segment is verified
//! (frame checksums, then the batch checksum) before it is served.

use wire::integrity::xxh3;

/// The batch header size.
pub const BATCH_HEADER: usize = 256;
const FRAME_HEAD: usize = 48;

/// Why bytes are not an intact batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BatchFault {
    /// Fewer bytes than the header or than `batch_length`.
    #[error("batch truncated")]
    Truncated,
    /// `batch_length`, `message_count` or the frame tiling is inconsistent.
    #[error("batch layout is inconsistent")]
    Layout,
    /// Reserved bytes are not zero.
    #[error("batch reserved bytes are not zero")]
    Reserved,
    /// A message frame checksum does not match.
    #[error("message {0} checksum mismatch")]
    Message(u32),
    /// The batch checksum does not match.
    #[error("batch checksum mismatch")]
    Checksum,
}

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

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4"))
}

/// Reads the header fields without verifying the messages: `None` if the header is shorter
/// than 256 bytes or `batch_length` is below it.
pub fn peek(bytes: &[u8]) -> Option<BatchInfo> {
    let head = bytes.get(..BATCH_HEADER)?;
    let len = u64_at(head, 32);
    (len >= BATCH_HEADER as u64).then_some(BatchInfo {
        base_offset: u64_at(head, 8),
        base_timestamp: u64_at(head, 16),
        message_count: u32_at(head, 48),
        len,
    })
}

/// Verifies the batch at the start of `bytes`.
pub fn verify(bytes: &[u8]) -> Result<BatchInfo, BatchFault> {
    let info = peek(bytes).ok_or(BatchFault::Truncated)?;
    let len = usize::try_from(info.len).map_err(|_| BatchFault::Layout)?;
    let batch = bytes.get(..len).ok_or(BatchFault::Truncated)?;
    if info.message_count == 0 {
        return Err(BatchFault::Layout);
    }
    if batch[52..BATCH_HEADER].iter().any(|b| *b != 0) {
        return Err(BatchFault::Reserved);
    }
    // The count is read from disk: reserve for no more messages than the bytes can hold.
    let messages_max = (len - BATCH_HEADER) / FRAME_HEAD;
    let mut digest_input =
        Vec::with_capacity(44 + 8 * (info.message_count as usize).min(messages_max));
    digest_input.extend_from_slice(&batch[0..40]);
    digest_input.extend_from_slice(&batch[48..52]);
    let mut at = BATCH_HEADER;
    for i in 0..info.message_count {
        let head = batch.get(at..at + FRAME_HEAD).ok_or(BatchFault::Layout)?;
        let payload = u32_at(head, 36) as usize;
        let headers = u32_at(head, 32) as usize;
        let end = at
            .checked_add(FRAME_HEAD + payload)
            .and_then(|e| e.checked_add(headers))
            .ok_or(BatchFault::Layout)?;
        let frame = batch.get(at..end).ok_or(BatchFault::Layout)?;
        let checksum = u64_at(frame, 0);
        if checksum != xxh3(&frame[8..]) {
            return Err(BatchFault::Message(i));
        }
        digest_input.extend_from_slice(&checksum.to_le_bytes());
        at = end;
    }
    if at != len {
        return Err(BatchFault::Layout);
    }
    if u64_at(batch, 40) != xxh3(&digest_input) {
        return Err(BatchFault::Checksum);
    }
    Ok(info)
}

/// Builds a stamped batch (for tests, benches and the simulator): one message per payload,
/// no user headers.
pub fn build(
    partition_id: u64,
    base_offset: u64,
    base_timestamp: u64,
    payloads: &[&[u8]],
) -> Vec<u8> {
    let mut out = vec![0u8; BATCH_HEADER];
    let mut checksums = Vec::new();
    for (i, payload) in payloads.iter().enumerate() {
        let start = out.len();
        out.extend_from_slice(&[0u8; FRAME_HEAD]);
        out.extend_from_slice(payload);
        let frame = &mut out[start..];
        frame[8..24].copy_from_slice(&(i as u128 + 1).to_le_bytes());
        frame[24..28].copy_from_slice(&(i as u32).to_le_bytes());
        frame[36..40].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        let checksum = xxh3(&frame[8..]);
        frame[0..8].copy_from_slice(&checksum.to_le_bytes());
        checksums.push(checksum);
    }
    let len = out.len() as u64;
    out[0..8].copy_from_slice(&partition_id.to_le_bytes());
    out[8..16].copy_from_slice(&base_offset.to_le_bytes());
    out[16..24].copy_from_slice(&base_timestamp.to_le_bytes());
    out[24..32].copy_from_slice(&base_timestamp.to_le_bytes());
    out[32..40].copy_from_slice(&len.to_le_bytes());
    out[48..52].copy_from_slice(&(payloads.len() as u32).to_le_bytes());
    let mut digest_input = out[0..40].to_vec();
    digest_input.extend_from_slice(&out[48..52]);
    for c in checksums {
        digest_input.extend_from_slice(&c.to_le_bytes());
    }
    let checksum = xxh3(&digest_input);
    out[40..48].copy_from_slice(&checksum.to_le_bytes());
    out
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

    #[test]
    fn a_hostile_message_count_is_a_layout_fault() {
        let mut batch = build(3, 100, 5_000, &[b"hello"]);
        batch[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(verify(&batch), Err(BatchFault::Layout));
    }
}

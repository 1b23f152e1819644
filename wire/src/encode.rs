//! Building frames: the common region and the last step that stamps size, body digest and
//! checksum according to the command's rules (wire.md §7).
//!
//! Fill a typed header (for example `CommitHeader { frame: FrameHeader::new(..), .. }` or
//! `Layout::zeroed()` and field writes), then call [`finish`] with the body: it is the one place
//! that knows which commands carry a body digest and which checksum each command uses.

use crate::header::{FrameHeader, Layout};
use crate::integrity::{body_digest, seal, set_prepare_identity, widen};
use crate::{Command, GroupId, HEADER_SIZE, Integrity};

/// The sender fields of the common region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender {
    /// Cluster id (wire.md §8).
    pub cluster: u128,
    /// Sender's replica id.
    pub replica: u8,
    /// Sender's view (meaning per command).
    pub view: u32,
}

impl FrameHeader {
    /// A header-only common region for `command`: checksums zero, `size` 256, `release` 0.
    pub fn new(command: Command, sender: Sender) -> FrameHeader {
        let mut frame = <FrameHeader as zerocopy::FromZeros>::new_zeroed();
        frame.cluster.set(sender.cluster);
        frame.size.set(HEADER_SIZE as u32);
        frame.view.set(sender.view);
        frame.command = command.byte();
        frame.replica = sender.replica;
        frame
    }
}

/// Why a header cannot be finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// Byte 60 is not a command.
    #[error("command byte {0} is not a command")]
    Command(u8),
    /// The frame would exceed `u32::MAX` bytes.
    #[error("body of {0} bytes does not fit a frame")]
    BodyTooLarge(usize),
}

/// Stamps `size`, `checksum_body` and `checksum` of a header for the given body, per the
/// command's rules: a metadata prepare commits to its body, a partition prepare does not;
/// DoViewChange and StartView carry a digest only for a non-empty body; every other body is
/// covered elsewhere (per artifact, per batch) and carries 0. Sealed commands are sealed,
/// prepares get their identity, the rest keep checksum 0.
pub fn finish(header: &mut [u8; HEADER_SIZE], body: &[u8]) -> Result<(), EncodeError> {
    finish_parts(header, &[body])
}

/// [`finish`] for a body held in several parts, in order (a reply written with a vectored
/// write: the parts are never joined). Size and digest are those of the concatenation.
pub fn finish_parts(header: &mut [u8; HEADER_SIZE], parts: &[&[u8]]) -> Result<(), EncodeError> {
    let command = Command::from_byte(header[60]).ok_or(EncodeError::Command(header[60]))?;
    let body_len: usize = parts.iter().map(|p| p.len()).sum();
    let size =
        u32::try_from(HEADER_SIZE + body_len).map_err(|_| EncodeError::BodyTooLarge(body_len))?;
    header[48..52].copy_from_slice(&size.to_le_bytes());
    let digest = || match parts {
        [one] => body_digest(one),
        _ => {
            let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
            for part in parts {
                hasher.update(part);
            }
            widen(hasher.digest())
        }
    };
    let checksum_body = match command {
        Command::Prepare | Command::RepairPrepare => {
            let group = u64::from_le_bytes(header[216..224].try_into().expect("8 bytes"));
            if GroupId(group).is_metadata() {
                digest()
            } else {
                0
            }
        }
        Command::DoViewChange | Command::StartView if body_len > 0 => digest(),
        _ => 0,
    };
    header[16..32].copy_from_slice(&checksum_body.to_le_bytes());
    header[0..16].fill(0);
    match command.integrity() {
        Integrity::FrameSeal => seal(header),
        Integrity::PrepareIdentity => set_prepare_identity(header),
        Integrity::None | Integrity::HandshakeMac => {}
    }
    Ok(())
}

/// [`finish`] on a typed header.
pub fn finish_header<H: Layout>(header: &mut H, body: &[u8]) -> Result<(), EncodeError> {
    finish_header_parts(header, &[body])
}

/// [`finish_parts`] on a typed header.
pub fn finish_header_parts<H: Layout>(header: &mut H, parts: &[&[u8]]) -> Result<(), EncodeError> {
    let bytes: &mut [u8; HEADER_SIZE] = header
        .as_mut_bytes()
        .try_into()
        .expect("layout is 256 bytes");
    finish_parts(bytes, parts)
}

/// Writes a whole frame (header then body) into `out`.
pub fn write_frame<H: Layout>(header: &H, body: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(header.bytes());
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Message, decode_replica};
    use crate::header::{CommitHeader, DoViewChangeHeader, PrepareHeader};
    use crate::{MAX_MESSAGE_SIZE_DEFAULT, Operation};

    const SENDER: Sender = Sender {
        cluster: 7,
        replica: 1,
        view: 3,
    };

    #[test]
    fn a_body_in_parts_finishes_as_the_joined_body() {
        // A metadata prepare (digest over the body), a StartView (digest when non-empty) and a
        // Reply (size only): every header equals the one finished over the joined bytes.
        let body: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let splits: [&[&[u8]]; 3] = [
            &[&body[..16], &body[16..4000], &body[4000..]],
            &[&[], &body[..], &[]],
            &[&body[..1], &body[1..]],
        ];
        for command in [Command::Prepare, Command::StartView, Command::Reply] {
            let mut whole = [0u8; HEADER_SIZE];
            whole[60] = command.byte();
            whole[216..224].copy_from_slice(&GroupId::METADATA.0.to_le_bytes());
            let mut parts = whole;
            finish(&mut whole, &body).unwrap();
            for split in splits {
                finish_parts(&mut parts, split).unwrap();
                assert_eq!(parts, whole, "{command:?}");
            }
        }
    }

    #[test]
    fn a_finished_commit_decodes() {
        let mut commit = CommitHeader::zeroed();
        commit.frame = FrameHeader::new(Command::Commit, SENDER);
        commit.commit.set(41);
        commit.group.set(GroupId::METADATA.0);
        finish_header(&mut commit, &[]).unwrap();
        let Message::Commit(decoded) =
            decode_replica(commit.bytes(), MAX_MESSAGE_SIZE_DEFAULT).unwrap()
        else {
            panic!("not a commit");
        };
        assert_eq!(decoded, &commit);
    }

    #[test]
    fn metadata_prepares_commit_to_their_body_partition_prepares_do_not() {
        let mut prepare = PrepareHeader::zeroed();
        prepare.frame = FrameHeader::new(Command::Prepare, SENDER);
        prepare.op.set(1);
        prepare.operation = Operation::CreateStream.byte();
        prepare.group.set(GroupId::METADATA.0);
        finish_header(&mut prepare, b"body").unwrap();
        assert_eq!(prepare.frame.checksum_body.get(), body_digest(b"body"));
        prepare.group.set(5);
        finish_header(&mut prepare, b"body").unwrap();
        assert_eq!(prepare.frame.checksum_body.get(), 0);
        assert_eq!(prepare.frame.size.get(), 260);
    }

    #[test]
    fn empty_view_change_body_carries_no_digest() {
        let mut dvc = DoViewChangeHeader::zeroed();
        dvc.frame = FrameHeader::new(Command::DoViewChange, SENDER);
        finish_header(&mut dvc, &[]).unwrap();
        assert_eq!(dvc.frame.checksum_body.get(), 0);
        assert!(decode_replica(dvc.bytes(), MAX_MESSAGE_SIZE_DEFAULT).is_ok());
    }
}

//! The receive checks of one framed replica-plane frame (wire.md section 6), as a pure function.
//!
//! The framer has already applied steps 1-2 (a violation closes the connection before a frame
//! exists). [`screen`] runs the stateless steps 3-7 through `wire::decode_replica`, then Strand's
//! roster-aware drops (`wire::decode::check_sender`), then drops a client Request (consensus.md
//! section 16.1) and a `group` that names nothing (wire.md section 9). Every refusal names its
//! counter and its disposition; only framing closes a connection.

use wire::decode::{SenderError, check_sender};
use wire::framer::FramingError;
use wire::{DecodeError, Disposition, GroupKind, Message, Stage, decode_replica};

use super::counters::{Closed, Dropped};

/// What happens to a refused frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Close the connection (framing, wire.md section 6 steps 1-2).
    Close(Closed),
    /// Drop the frame, keep the connection.
    Drop(Dropped),
}

/// The connection-close reason of a framing violation.
pub fn closed_for(error: FramingError) -> Closed {
    match error {
        FramingError::SizeTooSmall { .. } => Closed::SizeTooSmall,
        FramingError::SizeTooLarge { .. } => Closed::SizeTooLarge,
        FramingError::UnknownCommand(_) => Closed::CommandByte,
        // The framer hands out whole frames; a partial one is a local fault, not the peer's.
        FramingError::Incomplete { .. } => Closed::Local,
    }
}

fn refusal_for(error: DecodeError) -> Refusal {
    if let DecodeError::Framing(framing) = error {
        return Refusal::Close(closed_for(framing));
    }
    debug_assert_eq!(error.disposition(), Disposition::DropFrame);
    Refusal::Drop(match error.stage() {
        Stage::Framing => unreachable!("handled above"),
        Stage::UnsupportedCommand => Dropped::NoHandler,
        Stage::ClientBound => Dropped::ClientBound,
        Stage::BitPattern => Dropped::BitPattern,
        Stage::Seal => Dropped::Seal,
        Stage::Validate => Dropped::Validate,
        Stage::PrepareIntegrity => Dropped::PrepareIntegrity,
        Stage::ControlBody => Dropped::ControlBody,
        Stage::SuffixDecode => Dropped::SuffixDecode,
    })
}

/// Screens one whole frame from a peer: the typed message a handler may act on, or the refusal.
pub fn screen(
    frame: &[u8],
    max_message_size: usize,
    replica_count: u8,
    own_id: u8,
) -> Result<Message<'_>, Refusal> {
    let message = decode_replica(frame, max_message_size).map_err(refusal_for)?;
    check_sender(&message, replica_count, own_id).map_err(|error| {
        Refusal::Drop(match error {
            SenderError::OutsideRoster { .. } => Dropped::OutsideRoster,
            SenderError::OwnId(_) => Dropped::OwnId,
            SenderError::ZeroIdentity => Dropped::ZeroIdentity,
        })
    })?;
    if matches!(message, Message::Request { .. }) {
        return Err(Refusal::Drop(Dropped::ClientRequest));
    }
    if message.group().kind() == GroupKind::Invalid {
        return Err(Refusal::Drop(Dropped::InvalidGroup));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use wire::encode::{Sender, finish_header};
    use wire::header::{CommitHeader, FrameHeader, Layout, ReplyHeader};
    use wire::{Command, GroupId, MAX_MESSAGE_SIZE_DEFAULT};

    use super::*;

    const MAX: usize = MAX_MESSAGE_SIZE_DEFAULT;

    fn commit(replica: u8, group: u64) -> Vec<u8> {
        let mut header = CommitHeader::zeroed();
        header.frame = FrameHeader::new(
            Command::Commit,
            Sender {
                cluster: 9,
                replica,
                view: 2,
            },
        );
        header.group.set(group);
        finish_header(&mut header, &[]).unwrap();
        header.bytes().to_vec()
    }

    #[test]
    fn a_sealed_commit_from_a_peer_passes() {
        let frame = commit(1, 3);
        let message = screen(&frame, MAX, 3, 0).unwrap();
        assert_eq!(message.command(), Command::Commit);
        assert_eq!(message.group(), GroupId(3));
    }

    #[test]
    fn every_refusal_has_its_reason_and_disposition() {
        let mut sealed = commit(1, 3);
        sealed[200] ^= 1;
        assert_eq!(
            screen(&sealed, MAX, 3, 0).err(),
            Some(Refusal::Drop(Dropped::Seal))
        );
        assert_eq!(
            screen(&commit(3, 0), MAX, 3, 0).err(),
            Some(Refusal::Drop(Dropped::OutsideRoster))
        );
        assert_eq!(
            screen(&commit(0, 0), MAX, 3, 0).err(),
            Some(Refusal::Drop(Dropped::OwnId))
        );
        assert_eq!(
            screen(&commit(1, (1 << 63) | 1), MAX, 3, 0).err(),
            Some(Refusal::Drop(Dropped::InvalidGroup))
        );
        let mut reply = ReplyHeader::zeroed();
        reply.frame = FrameHeader::new(
            Command::Reply,
            Sender {
                cluster: 9,
                replica: 1,
                view: 0,
            },
        );
        assert_eq!(
            screen(reply.bytes(), MAX, 3, 0).err(),
            Some(Refusal::Drop(Dropped::ClientBound))
        );
        let mut hello = commit(1, 0);
        hello[60] = Command::ReplicaHello.byte();
        assert_eq!(
            screen(&hello, MAX, 3, 0).err(),
            Some(Refusal::Drop(Dropped::NoHandler))
        );
        let mut command = commit(1, 0);
        command[60] = 30;
        assert_eq!(
            screen(&command, MAX, 3, 0).err(),
            Some(Refusal::Close(Closed::CommandByte))
        );
    }
}

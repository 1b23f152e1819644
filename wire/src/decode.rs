//! The stateless receive checks (wire.md §6) for the replica plane, and the client-plane
//! decoders of Request, Reply and Eviction.
//!
//! [`decode_replica`] runs steps 1 to 7 in the spec's order and answers a typed [`Message`] or a
//! [`DecodeError`] whose [`DecodeError::stage`] and [`DecodeError::disposition`] say where and
//! how the frame was refused. Roster-aware drops (a replica id outside the roster, our own id, a
//! prepare without identity) need replica state and live in [`check_sender`], after the verdict.

use thiserror::Error;

use crate::framer::{FramingError, frame_size, whole_frame};
use crate::header::{
    CommitHeader, DoViewChangeHeader, EvictionHeader, ForwardLogoutHeader,
    ForwardLogoutResultHeader, ForwardRegisterHeader, ForwardRegisterResultHeader, Layout,
    PrepareHeader, PrepareOkHeader, RepairRangeReplyHeader, ReplyHeader, RequestHeader,
    RequestPreparesHeader, RequestStartViewHeader, RequestStateChunkHeader,
    RequestStateTransferHeader, RoutedRequestHeader, StartViewChangeHeader, StartViewHeader,
    StateChunkHeader, StateTransferTargetHeader,
};
use crate::integrity::{body_digest, prepare_identity, verify_seal};
use crate::suffix::{self, Suffix, SuffixError, prepare_fields_valid};
use crate::{Command, GroupId, HEADER_SIZE, Operation};

/// Where in the receive pipeline a frame was refused (wire.md §6; the vectors' `stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Steps 1-2: size out of range or command byte above 29.
    Framing,
    /// Step 3: a command with no replica-plane handler (0-4, 14-16).
    UnsupportedCommand,
    /// Step 3: Reply or Eviction on the replica port.
    ClientBound,
    /// Step 4: an undefined enum byte.
    BitPattern,
    /// Step 5: frame seal mismatch.
    Seal,
    /// Step 6: per-command validation.
    Validate,
    /// Step 7: prepare identity or body digest.
    PrepareIntegrity,
    /// Step 7: DoViewChange / StartView body digest.
    ControlBody,
    /// Step 7: DoViewChange suffix decode.
    SuffixDecode,
}

/// What the receiver does with the connection after a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// The stream can no longer be trusted to be in frame: close it.
    CloseConnection,
    /// Drop this frame and keep the connection.
    DropFrame,
}

/// Why a frame was refused. Every variant maps to one [`Stage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Steps 1-2: the frame reader refuses the frame; the connection closes.
    #[error("framing: {0}")]
    Framing(#[from] FramingError),
    /// A command the replica plane has no handler for.
    #[error("no replica-plane handler for {0}")]
    NoHandler(Command),
    /// A client-bound command on the replica plane.
    #[error("{0} is client-bound")]
    ClientBound(Command),
    /// The frame's command is not the one the decoder expects.
    #[error("expected {expected}, found {found}")]
    WrongCommand {
        /// Command the decoder handles.
        expected: Command,
        /// Command in the frame.
        found: Command,
    },
    /// Undefined operation byte.
    #[error("undefined operation byte {0}")]
    UnknownOperation(u8),
    /// Undefined outcome byte of a forwarding result.
    #[error("undefined outcome byte {0}")]
    UnknownOutcome(u8),
    /// Undefined eviction reason byte.
    #[error("undefined eviction reason byte {0}")]
    UnknownReason(u8),
    /// Frame seal mismatch.
    #[error("frame seal mismatch")]
    Seal,
    /// `release` is not zero where it is checked.
    #[error("release is not zero")]
    ReleaseNonZero,
    /// A reserved region that is checked is not zero.
    #[error("reserved byte at offset {offset} is not zero")]
    ReservedNonZero {
        /// Offset of the first non-zero byte.
        offset: usize,
    },
    /// A header-only command carries a body.
    #[error("{command} must be header-only, size is {size}")]
    NotHeaderOnly {
        /// The command.
        command: Command,
        /// Declared size.
        size: u32,
    },
    /// A field that must be non-zero is zero.
    #[error("field {field} must not be zero")]
    ZeroField {
        /// The field's spec name.
        field: &'static str,
    },
    /// A field that must be zero in this case is not.
    #[error("field {field} must be zero here")]
    NonZeroField {
        /// The field's spec name.
        field: &'static str,
    },
    /// Two fields violate their required order (`lower <= upper`).
    #[error("{lower} must not exceed {upper}")]
    Order {
        /// The field that must be smaller or equal.
        lower: &'static str,
        /// The field that bounds it.
        upper: &'static str,
    },
    /// A flag byte is outside 0..=1, or both flags are set.
    #[error("invalid flag combination in {field}")]
    Flag {
        /// The field's spec name.
        field: &'static str,
    },
    /// Eviction protocol-version fields are inconsistent with the reason.
    #[error("eviction protocol version fields do not fit the reason")]
    VersionWindow,
    /// The suffix body's shape (length, count, bitsets) is invalid.
    #[error("suffix shape: {0}")]
    SuffixShape(SuffixError),
    /// The prepare's checksum is not its identity.
    #[error("prepare identity mismatch")]
    IdentityMismatch,
    /// The prepare body does not match `checksum_body`.
    #[error("prepare body digest mismatch")]
    BodyDigestMismatch,
    /// The DoViewChange / StartView body does not match `checksum_body`.
    #[error("control body digest mismatch")]
    ControlBodyDigestMismatch,
    /// The DoViewChange suffix does not decode.
    #[error("suffix: {0}")]
    Suffix(SuffixError),
}

impl DecodeError {
    /// The pipeline stage of this refusal.
    pub const fn stage(&self) -> Stage {
        use DecodeError::*;
        match self {
            Framing(_) => Stage::Framing,
            NoHandler(_) | WrongCommand { .. } => Stage::UnsupportedCommand,
            ClientBound(_) => Stage::ClientBound,
            UnknownOperation(_) | UnknownOutcome(_) | UnknownReason(_) => Stage::BitPattern,
            Seal => Stage::Seal,
            ReleaseNonZero
            | ReservedNonZero { .. }
            | NotHeaderOnly { .. }
            | ZeroField { .. }
            | NonZeroField { .. }
            | Order { .. }
            | Flag { .. }
            | VersionWindow
            | SuffixShape(_) => Stage::Validate,
            IdentityMismatch | BodyDigestMismatch => Stage::PrepareIntegrity,
            ControlBodyDigestMismatch => Stage::ControlBody,
            Suffix(_) => Stage::SuffixDecode,
        }
    }

    /// What happens to the connection.
    pub const fn disposition(&self) -> Disposition {
        match self.stage() {
            Stage::Framing => Disposition::CloseConnection,
            _ => Disposition::DropFrame,
        }
    }
}

/// A replica-plane frame that passed every stateless check, as typed zero-copy views.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)] // one variant per command, named as in wire.md §5
pub enum Message<'a> {
    /// A Request in its routed shape. Strand's handler drops these (consensus.md §16.1).
    Request {
        header: &'a RoutedRequestHeader,
        body: &'a [u8],
    },
    Prepare {
        header: &'a PrepareHeader,
        body: &'a [u8],
    },
    /// Carries the journaled Prepare bytes; `header.frame.command` is still 19.
    RepairPrepare {
        header: &'a PrepareHeader,
        body: &'a [u8],
    },
    PrepareOk(&'a PrepareOkHeader),
    Commit(&'a CommitHeader),
    StartViewChange(&'a StartViewChangeHeader),
    DoViewChange {
        header: &'a DoViewChangeHeader,
        suffix: Suffix<'a>,
    },
    /// A suffix that fails to decode is not fatal here: the receiver ignores it and trusts `op`.
    StartView {
        header: &'a StartViewHeader,
        suffix: Result<Suffix<'a>, SuffixError>,
    },
    RequestStartView(&'a RequestStartViewHeader),
    RequestPrepares(&'a RequestPreparesHeader),
    RepairDone(&'a RepairRangeReplyHeader),
    RangeEvicted(&'a RepairRangeReplyHeader),
    RequestStateTransfer(&'a RequestStateTransferHeader),
    /// The manifest body is decoded by the handler, once the nonce matches a session.
    StateTransferTarget {
        header: &'a StateTransferTargetHeader,
        body: &'a [u8],
    },
    RequestStateChunk(&'a RequestStateChunkHeader),
    StateChunk {
        header: &'a StateChunkHeader,
        body: &'a [u8],
    },
    ForwardRegister(&'a ForwardRegisterHeader),
    ForwardRegisterResult(&'a ForwardRegisterResultHeader),
    ForwardLogout(&'a ForwardLogoutHeader),
    ForwardLogoutResult(&'a ForwardLogoutResultHeader),
}

impl<'a> Message<'a> {
    /// The frame's command.
    pub fn command(&self) -> Command {
        match self {
            Message::Request { .. } => Command::Request,
            Message::Prepare { .. } => Command::Prepare,
            Message::RepairPrepare { .. } => Command::RepairPrepare,
            Message::PrepareOk(_) => Command::PrepareOk,
            Message::Commit(_) => Command::Commit,
            Message::StartViewChange(_) => Command::StartViewChange,
            Message::DoViewChange { .. } => Command::DoViewChange,
            Message::StartView { .. } => Command::StartView,
            Message::RequestStartView(_) => Command::RequestStartView,
            Message::RequestPrepares(_) => Command::RequestPrepares,
            Message::RepairDone(_) => Command::RepairDone,
            Message::RangeEvicted(_) => Command::RangeEvicted,
            Message::RequestStateTransfer(_) => Command::RequestStateTransfer,
            Message::StateTransferTarget { .. } => Command::StateTransferTarget,
            Message::RequestStateChunk(_) => Command::RequestStateChunk,
            Message::StateChunk { .. } => Command::StateChunk,
            Message::ForwardRegister(_) => Command::ForwardRegister,
            Message::ForwardRegisterResult(_) => Command::ForwardRegisterResult,
            Message::ForwardLogout(_) => Command::ForwardLogout,
            Message::ForwardLogoutResult(_) => Command::ForwardLogoutResult,
        }
    }

    /// The consensus group the frame belongs to; forwarding frames are always metadata.
    pub fn group(&self) -> GroupId {
        let raw = match self {
            Message::Request { header, .. } => header.group.get(),
            Message::Prepare { header, .. } | Message::RepairPrepare { header, .. } => {
                header.group.get()
            }
            Message::PrepareOk(h) => h.group.get(),
            Message::Commit(h) => h.group.get(),
            Message::StartViewChange(h) => h.group.get(),
            Message::DoViewChange { header, .. } => header.group.get(),
            Message::StartView { header, .. } => header.group.get(),
            Message::RequestStartView(h) => h.group.get(),
            Message::RequestPrepares(h) => h.group.get(),
            Message::RepairDone(h) | Message::RangeEvicted(h) => h.group.get(),
            Message::RequestStateTransfer(h) => h.group.get(),
            Message::StateTransferTarget { header, .. } => header.group.get(),
            Message::RequestStateChunk(h) => h.group.get(),
            Message::StateChunk { header, .. } => header.group.get(),
            Message::ForwardRegister(_)
            | Message::ForwardRegisterResult(_)
            | Message::ForwardLogout(_)
            | Message::ForwardLogoutResult(_) => return GroupId::METADATA,
        };
        GroupId(raw)
    }

    /// The sender's replica id (byte 61); for prepares, the primary that built them.
    pub fn replica(&self) -> u8 {
        self.frame().replica
    }

    /// Bytes 0..128 of the frame's header, common to every command (wire.md §4).
    pub fn frame(&self) -> &'a crate::header::FrameHeader {
        &crate::header::GenericHeader::view(self.header_bytes())
            .expect("a header is 256 bytes")
            .frame
    }

    /// The frame's 256 header bytes, as received.
    pub fn header_bytes(&self) -> &'a [u8; HEADER_SIZE] {
        match *self {
            Message::Request { header, .. } => header.bytes(),
            Message::Prepare { header, .. } | Message::RepairPrepare { header, .. } => {
                header.bytes()
            }
            Message::PrepareOk(h) => h.bytes(),
            Message::Commit(h) => h.bytes(),
            Message::StartViewChange(h) => h.bytes(),
            Message::DoViewChange { header, .. } => header.bytes(),
            Message::StartView { header, .. } => header.bytes(),
            Message::RequestStartView(h) => h.bytes(),
            Message::RequestPrepares(h) => h.bytes(),
            Message::RepairDone(h) | Message::RangeEvicted(h) => h.bytes(),
            Message::RequestStateTransfer(h) => h.bytes(),
            Message::StateTransferTarget { header, .. } => header.bytes(),
            Message::RequestStateChunk(h) => h.bytes(),
            Message::StateChunk { header, .. } => header.bytes(),
            Message::ForwardRegister(h) => h.bytes(),
            Message::ForwardRegisterResult(h) => h.bytes(),
            Message::ForwardLogout(h) => h.bytes(),
            Message::ForwardLogoutResult(h) => h.bytes(),
        }
    }
}

/// Splits a whole frame into header and body after the framing checks.
fn split(
    frame: &[u8],
    max_message_size: usize,
) -> Result<(&[u8; HEADER_SIZE], &[u8], Command), DecodeError> {
    let (header, command) = whole_frame(frame, max_message_size)?;
    Ok((header, &frame[HEADER_SIZE..], command))
}

fn view<H: Layout>(header: &[u8; HEADER_SIZE]) -> &H {
    H::view(header).expect("every layout is 256 bytes of alignment 1")
}

fn operation(byte: u8) -> Result<Operation, DecodeError> {
    Operation::from_byte(byte).ok_or(DecodeError::UnknownOperation(byte))
}

fn sealed(header: &[u8; HEADER_SIZE]) -> Result<(), DecodeError> {
    if verify_seal(header) {
        Ok(())
    } else {
        Err(DecodeError::Seal)
    }
}

fn zero(bytes: &[u8], offset: usize) -> Result<(), DecodeError> {
    match bytes.iter().position(|b| *b != 0) {
        None => Ok(()),
        Some(i) => Err(DecodeError::ReservedNonZero { offset: offset + i }),
    }
}

fn release_zero(header: &[u8; HEADER_SIZE]) -> Result<(), DecodeError> {
    if header[56..60] == [0; 4] {
        Ok(())
    } else {
        Err(DecodeError::ReleaseNonZero)
    }
}

fn header_only(command: Command, body: &[u8]) -> Result<(), DecodeError> {
    if body.is_empty() {
        Ok(())
    } else {
        Err(DecodeError::NotHeaderOnly {
            command,
            size: (HEADER_SIZE + body.len()) as u32,
        })
    }
}

fn non_zero(value: u128, field: &'static str) -> Result<(), DecodeError> {
    if value != 0 {
        Ok(())
    } else {
        Err(DecodeError::ZeroField { field })
    }
}

fn ordered(lower: (u64, &'static str), upper: (u64, &'static str)) -> Result<(), DecodeError> {
    if lower.0 <= upper.0 {
        Ok(())
    } else {
        Err(DecodeError::Order {
            lower: lower.1,
            upper: upper.1,
        })
    }
}

/// Decodes one whole replica-plane frame (exactly `size` bytes) through every stateless check
/// of wire.md §6, in order. The default limit is [`crate::MAX_MESSAGE_SIZE_DEFAULT`].
pub fn decode_replica(frame: &[u8], max_message_size: usize) -> Result<Message<'_>, DecodeError> {
    let (header, body, command) = split(frame, max_message_size)?;
    use Command::*;
    match command {
        Reserved | Ping | Pong | PingClient | PongClient | ReplicaHello | ReplicaChallenge
        | ReplicaFinish => Err(DecodeError::NoHandler(command)),
        Reply | Eviction => Err(DecodeError::ClientBound(command)),
        Request => {
            let request = view::<RoutedRequestHeader>(header);
            validate_request(
                request.client.get(),
                request.operation,
                request.session.get(),
                request.request.get(),
            )?;
            Ok(Message::Request {
                header: request,
                body,
            })
        }
        Prepare | RepairPrepare => {
            let prepare = decode_prepare(header, body)?;
            Ok(if command == Prepare {
                Message::Prepare {
                    header: prepare,
                    body,
                }
            } else {
                Message::RepairPrepare {
                    header: prepare,
                    body,
                }
            })
        }
        PrepareOk => {
            let h = view::<PrepareOkHeader>(header);
            operation(h.operation)?;
            sealed(header)?;
            Ok(Message::PrepareOk(h))
        }
        Commit => {
            sealed(header)?;
            header_only(command, body)?;
            Ok(Message::Commit(view(header)))
        }
        StartViewChange => {
            sealed(header)?;
            release_zero(header)?;
            Ok(Message::StartViewChange(view(header)))
        }
        DoViewChange => decode_do_view_change(header, body),
        StartView => decode_start_view(header, body),
        RequestStartView => {
            sealed(header)?;
            release_zero(header)?;
            Ok(Message::RequestStartView(view(header)))
        }
        RequestPrepares => {
            sealed(header)?;
            let h = view::<RequestPreparesHeader>(header);
            if h.from_op.get() == 0 {
                return Err(DecodeError::ZeroField { field: "from_op" });
            }
            ordered((h.from_op.get(), "from_op"), (h.to_op.get(), "to_op"))?;
            Ok(Message::RequestPrepares(h))
        }
        RepairDone => {
            sealed(header)?;
            Ok(Message::RepairDone(view(header)))
        }
        RangeEvicted => {
            sealed(header)?;
            Ok(Message::RangeEvicted(view(header)))
        }
        RequestStateTransfer => {
            sealed(header)?;
            header_only(command, body)?;
            Ok(Message::RequestStateTransfer(view(header)))
        }
        StateTransferTarget => {
            sealed(header)?;
            let h = view::<StateTransferTargetHeader>(header);
            if h.available > 1 {
                return Err(DecodeError::Flag { field: "available" });
            }
            if h.unavailable_transient > 1 || (h.available == 1 && h.unavailable_transient == 1) {
                return Err(DecodeError::Flag {
                    field: "unavailable_transient",
                });
            }
            if h.available == 0 {
                header_only(command, body)?;
            }
            Ok(Message::StateTransferTarget { header: h, body })
        }
        RequestStateChunk => {
            sealed(header)?;
            let h = view::<RequestStateChunkHeader>(header);
            non_zero(h.len.get().into(), "len")?;
            header_only(command, body)?;
            Ok(Message::RequestStateChunk(h))
        }
        StateChunk => {
            sealed(header)?;
            Ok(Message::StateChunk {
                header: view(header),
                body,
            })
        }
        ForwardRegister => {
            sealed(header)?;
            let h = view::<ForwardRegisterHeader>(header);
            forwarding(
                command,
                body,
                h.client.get(),
                h.nonce.get(),
                &h.reserved,
                164,
            )?;
            Ok(Message::ForwardRegister(h))
        }
        ForwardRegisterResult => {
            let h = view::<ForwardRegisterResultHeader>(header);
            let outcome = RegisterOutcome::from_byte(h.outcome)
                .ok_or(DecodeError::UnknownOutcome(h.outcome))?;
            sealed(header)?;
            forwarding(
                command,
                body,
                h.client.get(),
                h.nonce.get(),
                &h.reserved,
                176,
            )?;
            if outcome != RegisterOutcome::Ok {
                if h.epoch.get() != 0 {
                    return Err(DecodeError::NonZeroField { field: "epoch" });
                }
                if h.watermark.get() != 0 {
                    return Err(DecodeError::NonZeroField { field: "watermark" });
                }
            }
            Ok(Message::ForwardRegisterResult(h))
        }
        ForwardLogout => {
            sealed(header)?;
            let h = view::<ForwardLogoutHeader>(header);
            forwarding(
                command,
                body,
                h.client.get(),
                h.nonce.get(),
                &h.reserved,
                176,
            )?;
            non_zero(h.session.get().into(), "session")?;
            non_zero(h.request.get().into(), "request")?;
            Ok(Message::ForwardLogout(h))
        }
        ForwardLogoutResult => {
            let h = view::<ForwardLogoutResultHeader>(header);
            let outcome = LogoutOutcome::from_byte(h.outcome)
                .ok_or(DecodeError::UnknownOutcome(h.outcome))?;
            sealed(header)?;
            forwarding(
                command,
                body,
                h.client.get(),
                h.nonce.get(),
                &h.reserved,
                168,
            )?;
            if outcome != LogoutOutcome::Ok && h.commit.get() != 0 {
                return Err(DecodeError::NonZeroField { field: "commit" });
            }
            Ok(Message::ForwardLogoutResult(h))
        }
    }
}

/// Request validation shared by both planes (wire.md §11.5).
fn validate_request(
    client: u128,
    operation_byte: u8,
    session: u64,
    request: u64,
) -> Result<(), DecodeError> {
    let op = operation(operation_byte)?;
    non_zero(client, "client")?;
    match op {
        Operation::Reserved => Err(DecodeError::ZeroField { field: "operation" }),
        Operation::Register => {
            if session != 0 {
                return Err(DecodeError::NonZeroField { field: "session" });
            }
            if request != 0 {
                return Err(DecodeError::NonZeroField { field: "request" });
            }
            Ok(())
        }
        Operation::NonReplicated => Ok(()),
        _ => {
            non_zero(session.into(), "session")?;
            non_zero(request.into(), "request")
        }
    }
}

/// Prepare and RepairPrepare: validation, then identity and body digest (wire.md §7.2). The
/// identity is checked only when non-zero here; Strand's handler refuses zero in
/// [`check_sender`].
fn decode_prepare<'a>(
    header: &'a [u8; HEADER_SIZE],
    body: &[u8],
) -> Result<&'a PrepareHeader, DecodeError> {
    let h = view::<PrepareHeader>(header);
    operation(h.operation)?;
    zero(&h.frame.reserved_frame, 62)?;
    zero(&h.reserved, 228)?;
    debug_assert!(prepare_fields_valid(h));
    let checksum = h.frame.checksum.get();
    if checksum != 0 && checksum != prepare_identity(header) {
        return Err(DecodeError::IdentityMismatch);
    }
    let checksum_body = h.frame.checksum_body.get();
    if checksum_body != 0 && checksum_body != body_digest(body) {
        return Err(DecodeError::BodyDigestMismatch);
    }
    Ok(h)
}

/// DoViewChange and StartView body digest: an empty body ignores the field; a non-empty body
/// must match and 0 is not an opt-out (wire.md §7.3).
fn control_body(checksum_body: u128, body: &[u8]) -> Result<(), DecodeError> {
    if body.is_empty() || checksum_body == body_digest(body) {
        Ok(())
    } else {
        Err(DecodeError::ControlBodyDigestMismatch)
    }
}

fn decode_do_view_change<'a>(
    header: &'a [u8; HEADER_SIZE],
    body: &'a [u8],
) -> Result<Message<'a>, DecodeError> {
    sealed(header)?;
    release_zero(header)?;
    let h = view::<DoViewChangeHeader>(header);
    ordered(
        (u64::from(h.log_view.get()), "log_view"),
        (u64::from(h.frame.view.get()), "view"),
    )?;
    ordered((h.commit.get(), "commit"), (h.op.get(), "op"))?;
    suffix::check_shape(body.len(), &[h.nack_bitset.get(), h.present_bitset.get()])
        .map_err(DecodeError::SuffixShape)?;
    control_body(h.frame.checksum_body.get(), body)?;
    let suffix = Suffix::decode(h.op.get(), body).map_err(DecodeError::Suffix)?;
    Ok(Message::DoViewChange { header: h, suffix })
}

fn decode_start_view<'a>(
    header: &'a [u8; HEADER_SIZE],
    body: &'a [u8],
) -> Result<Message<'a>, DecodeError> {
    sealed(header)?;
    release_zero(header)?;
    let h = view::<StartViewHeader>(header);
    ordered((h.commit.get(), "commit"), (h.op.get(), "op"))?;
    suffix::check_shape(body.len(), &[]).map_err(DecodeError::SuffixShape)?;
    control_body(h.frame.checksum_body.get(), body)?;
    Ok(Message::StartView {
        header: h,
        suffix: Suffix::decode(h.op.get(), body),
    })
}

/// Session-forwarding validation (wire.md §11.16).
fn forwarding(
    command: Command,
    body: &[u8],
    client: u128,
    nonce: u128,
    reserved: &[u8],
    reserved_offset: usize,
) -> Result<(), DecodeError> {
    header_only(command, body)?;
    non_zero(client, "client")?;
    non_zero(nonce, "nonce")?;
    zero(reserved, reserved_offset)
}

/// Declares a one-byte enum of the wire with its decoder; undefined bytes decode to `None`.
macro_rules! byte_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[allow(missing_docs)] // the names are the spec's
        pub enum $name {
            $($(#[$vmeta])* $variant = $value),+
        }

        impl $name {
            /// Decodes the byte; `None` for a value the spec does not define.
            pub const fn from_byte(byte: u8) -> Option<Self> {
                match byte {
                    $($value => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

byte_enum! {
    /// ForwardRegisterResult outcome (wire.md §11.16).
    RegisterOutcome {
        Ok = 0,
        NotPrimary = 1,
        /// Reserved, never produced.
        NotCaughtUp = 2,
        PipelineFull = 3,
        InProgress = 4,
        Canceled = 5,
        ClientIdOwnedByAnotherUser = 6,
    }
}

byte_enum! {
    /// ForwardLogoutResult outcome (wire.md §11.16).
    LogoutOutcome {
        Ok = 0,
        NotPrimary = 1,
        PipelineFull = 2,
        InProgress = 3,
        Canceled = 4,
    }
}

byte_enum! {
    /// Eviction reasons (wire.md §11.7); 0 (Reserved) is not a valid reason.
    EvictionReason {
        NoSession = 1,
        ClientReleaseTooLow = 2,
        ClientReleaseTooHigh = 3,
        InvalidRequestOperation = 4,
        InvalidRequestBody = 5,
        InvalidRequestBodySize = 6,
        SessionTooLow = 7,
        SessionReleaseMismatch = 8,
        InvalidCredentials = 9,
        InvalidToken = 10,
        UserInactive = 11,
        SessionError = 12,
        StaleClient = 13,
        IncompatibleProtocol = 14,
        MalformedLogin = 15,
    }
}

fn expect_command(found: Command, expected: Command) -> Result<(), DecodeError> {
    if found == expected {
        Ok(())
    } else {
        Err(DecodeError::WrongCommand { expected, found })
    }
}

/// Client plane: a Request as a client listener types it (wire.md §11.5). Any other command is
/// refused.
pub fn decode_request(
    frame: &[u8],
    max_message_size: usize,
) -> Result<(&RequestHeader, &[u8]), DecodeError> {
    let (header, body, command) = split(frame, max_message_size)?;
    expect_command(command, Command::Request)?;
    Ok((request_header(header)?, body))
}

/// Client plane: [`decode_request`] of a frame read as two buffers, its header and its body
/// (the body read straight into the buffer the request keeps, decision 366). The same checks,
/// in the same order, as on the frame the two would make.
pub fn decode_request_parts<'a>(
    header: &'a [u8; HEADER_SIZE],
    body: &[u8],
    max_message_size: usize,
) -> Result<&'a RequestHeader, DecodeError> {
    let len = HEADER_SIZE.saturating_add(body.len());
    let size = frame_size(header, max_message_size)?.expect("a whole header is in");
    if size != len {
        return Err(FramingError::Incomplete { len, size }.into());
    }
    let command = Command::from_byte(view::<RequestHeader>(header).frame.command)
        .expect("frame_size checked the command");
    expect_command(command, Command::Request)?;
    request_header(header)
}

fn request_header(header: &[u8; HEADER_SIZE]) -> Result<&RequestHeader, DecodeError> {
    let h = view::<RequestHeader>(header);
    validate_request(
        h.client.get(),
        h.operation,
        h.session.get(),
        h.request.get(),
    )?;
    Ok(h)
}

/// Client plane: a Reply as the SDK reads it (command and operation only).
pub fn decode_reply(
    frame: &[u8],
    max_message_size: usize,
) -> Result<(&ReplyHeader, &[u8]), DecodeError> {
    let (header, body, command) = split(frame, max_message_size)?;
    expect_command(command, Command::Reply)?;
    let h = view::<ReplyHeader>(header);
    operation(h.operation)?;
    Ok((h, body))
}

/// Client plane: an Eviction with the client-side checks of wire.md §11.7.
pub fn decode_eviction(
    frame: &[u8],
    max_message_size: usize,
) -> Result<&EvictionHeader, DecodeError> {
    let (header, body, command) = split(frame, max_message_size)?;
    expect_command(command, Command::Eviction)?;
    let h = view::<EvictionHeader>(header);
    let reason = EvictionReason::from_byte(h.reason).ok_or(DecodeError::UnknownReason(h.reason))?;
    header_only(command, body)?;
    non_zero(h.client.get(), "client")?;
    zero(&h.frame.reserved_frame, 62)?;
    zero(&h.reserved, 152)?;
    let (version, min) = (
        h.server_protocol_version.get(),
        h.server_protocol_version_min.get(),
    );
    let window_ok = match reason {
        EvictionReason::IncompatibleProtocol => 1 <= min && min <= version,
        _ => version == 0 && min == 0,
    };
    if !window_ok {
        return Err(DecodeError::VersionWindow);
    }
    Ok(h)
}

/// Roster-aware drops that need replica state (wire.md §4 and §7.2 **\[ref-gap\]**/**\[design\]**).
/// They come after the stateless verdict and never change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SenderError {
    /// `replica` is not a roster member.
    #[error("replica id {replica} is outside a roster of {replica_count}")]
    OutsideRoster {
        /// The frame's replica id.
        replica: u8,
        /// Roster size.
        replica_count: u8,
    },
    /// A frame other than a prepare claims to come from the receiver itself.
    #[error("frame claims the receiver's own replica id {0}")]
    OwnId(u8),
    /// A prepare without identity (Strand has no legacy journals).
    #[error("prepare carries no identity")]
    ZeroIdentity,
}

/// Strand's handler-level drops for a decoded message: `replica >= replica_count`, the
/// receiver's own id on anything but a prepare, and a prepare whose checksum is 0.
pub fn check_sender(
    message: &Message<'_>,
    replica_count: u8,
    own_id: u8,
) -> Result<(), SenderError> {
    let replica = message.replica();
    if replica >= replica_count {
        return Err(SenderError::OutsideRoster {
            replica,
            replica_count,
        });
    }
    match message {
        Message::Prepare { header, .. } | Message::RepairPrepare { header, .. }
            if header.frame.checksum.get() == 0 =>
        {
            return Err(SenderError::ZeroIdentity);
        }
        Message::Prepare { .. } | Message::RepairPrepare { .. } => {}
        _ if replica == own_id => return Err(SenderError::OwnId(replica)),
        _ => {}
    }
    Ok(())
}

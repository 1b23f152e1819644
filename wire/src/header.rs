//! Typed, zero-copy views of the 256-byte header (wire.md §4 and §11).
//!
//! Every view is a `#[repr(C)]` struct of alignment 1 (little-endian field types from
//! `zerocopy`), so it can be taken at any offset of any buffer without a copy. Field offsets are
//! asserted at compile time against the spec's tables, and each view also exposes its layout as
//! data ([`Layout::FIELDS`]) for generic tooling (the golden-vector tests, `strand inspect`).

use zerocopy::little_endian::{U32, U64, U128};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::HEADER_SIZE;

/// The representation of one header field, as the layout tables of the spec name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// A single byte.
    U8,
    /// Little-endian `u32`.
    U32,
    /// Little-endian `u64`.
    U64,
    /// Little-endian `u128`.
    U128,
    /// Opaque bytes (reserved regions, padding, nonces, MACs).
    Bytes,
}

/// One field of a header layout: where it sits and how it is represented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// The field's name as in the spec.
    pub name: &'static str,
    /// Absolute offset from byte 0 of the frame.
    pub offset: usize,
    /// Width in bytes.
    pub size: usize,
    /// Representation.
    pub kind: FieldKind,
}

impl Field {
    /// Reads this field from a header as an integer (`None` for [`FieldKind::Bytes`]).
    pub fn read_uint(&self, header: &[u8; HEADER_SIZE]) -> Option<u128> {
        let bytes = &header[self.offset..self.offset + self.size];
        match self.kind {
            FieldKind::Bytes => None,
            _ => Some(
                bytes
                    .iter()
                    .rev()
                    .fold(0u128, |acc, b| (acc << 8) | u128::from(*b)),
            ),
        }
    }

    /// Writes an integer into this field; `false` if the kind is bytes or the value does not fit.
    pub fn write_uint(&self, header: &mut [u8; HEADER_SIZE], value: u128) -> bool {
        if self.kind == FieldKind::Bytes || (self.size < 16 && value >> (self.size * 8) != 0) {
            return false;
        }
        let le = value.to_le_bytes();
        header[self.offset..self.offset + self.size].copy_from_slice(&le[..self.size]);
        true
    }

    /// The raw bytes of this field.
    pub fn bytes<'a>(&self, header: &'a [u8; HEADER_SIZE]) -> &'a [u8] {
        &header[self.offset..self.offset + self.size]
    }
}

/// Maps a field's Rust type to its [`FieldKind`].
pub trait FieldType {
    /// The kind of this type.
    const KIND: FieldKind;
}
impl FieldType for u8 {
    const KIND: FieldKind = FieldKind::U8;
}
impl FieldType for U32 {
    const KIND: FieldKind = FieldKind::U32;
}
impl FieldType for U64 {
    const KIND: FieldKind = FieldKind::U64;
}
impl FieldType for U128 {
    const KIND: FieldKind = FieldKind::U128;
}
impl<const N: usize> FieldType for [u8; N] {
    const KIND: FieldKind = FieldKind::Bytes;
}

/// A header view whose layout is known as data.
pub trait Layout: FromBytes + IntoBytes + KnownLayout + Immutable + Unaligned + Sized {
    /// The spec's (and the vectors') name of this layout.
    const NAME: &'static str;
    /// The fields of bytes 128..256, in offset order. Bytes 0..128 are [`FRAME_FIELDS`].
    const FIELDS: &'static [Field];

    /// Views the first 256 bytes of `bytes` as this header, without copying.
    fn view(bytes: &[u8]) -> Option<&Self> {
        Self::ref_from_prefix(bytes).ok().map(|(header, _)| header)
    }

    /// Views the first 256 bytes of `bytes` mutably.
    fn view_mut(bytes: &mut [u8]) -> Option<&mut Self> {
        Self::mut_from_prefix(bytes).ok().map(|(header, _)| header)
    }

    /// An all-zero header of this layout.
    fn zeroed() -> Self {
        Self::new_zeroed()
    }

    /// The header as its 256 wire bytes.
    fn bytes(&self) -> &[u8; HEADER_SIZE] {
        // The size is asserted to be HEADER_SIZE for every layout, so this cannot fail.
        self.as_bytes().try_into().expect("layout is 256 bytes")
    }
}

/// Bytes 0..128, common to every command (wire.md §4).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct FrameHeader {
    /// Frame seal, prepare identity, or 0 (wire.md §7).
    pub checksum: U128,
    /// Body digest or 0 (wire.md §7.3).
    pub checksum_body: U128,
    /// Cluster id (wire.md §8).
    pub cluster: U128,
    /// Total frame length including the header.
    pub size: U32,
    /// Sender's view; meaning per command.
    pub view: U32,
    /// Always 0.
    pub release: U32,
    /// Command discriminant.
    pub command: u8,
    /// Sender's replica id (for prepares: the building primary).
    pub replica: u8,
    /// Zero.
    pub reserved_frame: [u8; 66],
}

const _: () = assert!(size_of::<FrameHeader>() == 128);
const _: () = assert!(core::mem::offset_of!(FrameHeader, checksum_body) == 16);
const _: () = assert!(core::mem::offset_of!(FrameHeader, cluster) == 32);
const _: () = assert!(core::mem::offset_of!(FrameHeader, size) == 48);
const _: () = assert!(core::mem::offset_of!(FrameHeader, view) == 52);
const _: () = assert!(core::mem::offset_of!(FrameHeader, release) == 56);
const _: () = assert!(core::mem::offset_of!(FrameHeader, command) == 60);
const _: () = assert!(core::mem::offset_of!(FrameHeader, replica) == 61);
const _: () = assert!(core::mem::offset_of!(FrameHeader, reserved_frame) == 62);

/// The fields of bytes 0..128, shared by every layout.
pub const FRAME_FIELDS: &[Field] = &[
    field("checksum", 0, 16, FieldKind::U128),
    field("checksum_body", 16, 16, FieldKind::U128),
    field("cluster", 32, 16, FieldKind::U128),
    field("size", 48, 4, FieldKind::U32),
    field("view", 52, 4, FieldKind::U32),
    field("release", 56, 4, FieldKind::U32),
    field("command", 60, 1, FieldKind::U8),
    field("replica", 61, 1, FieldKind::U8),
    field("reserved_frame", 62, 66, FieldKind::Bytes),
];

const fn field(name: &'static str, offset: usize, size: usize, kind: FieldKind) -> Field {
    Field {
        name,
        offset,
        size,
        kind,
    }
}

/// Declares a header layout: the struct, its compile-time offset checks and its field table.
/// Offsets are absolute (from byte 0 of the frame) so they read exactly like the spec's tables.
macro_rules! layout {
    ($(#[$meta:meta])* $name:ident = $lname:literal {
        $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $offset:literal ),+ $(,)?
    }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
        pub struct $name {
            /// Bytes 0..128 (wire.md §4).
            pub frame: FrameHeader,
            $( $(#[$fmeta])* pub $field: $ty, )+
        }

        const _: () = {
            assert!(size_of::<$name>() == HEADER_SIZE);
            $( assert!(core::mem::offset_of!($name, $field) == $offset); )+
        };

        impl Layout for $name {
            const NAME: &'static str = $lname;
            const FIELDS: &'static [Field] = &[
                $( field(stringify!($field), $offset, size_of::<$ty>(), <$ty as FieldType>::KIND), )+
            ];
        }
    };
}

layout! {
    /// Any header, with bytes 128..256 uninterpreted (commands 0..4 and type-erased access).
    GenericHeader = "GenericHeader" {
        /// Per-command region.
        reserved_command: [u8; 128] = 128,
    }
}

layout! {
    /// Request (5) as a client sends it (wire.md §11.5).
    RequestHeader = "RequestHeader" {
        /// Client id, non-zero.
        client: U128 = 128,
        /// `XXH3(payload)` widened for metadata operations, else 0.
        request_checksum: U128 = 144,
        /// Client timestamp.
        timestamp: U64 = 160,
        /// Request number.
        request: U64 = 168,
        /// Operation code (wire.md §10).
        operation: u8 = 176,
        /// Zero.
        operation_padding: [u8; 7] = 177,
        /// Session epoch.
        session: U64 = 184,
        /// Ignored from clients.
        user_id: U32 = 192,
        /// Bytes 196..200: legacy command code for NonReplicated; rest zero.
        reserved: [u8; 60] = 196,
    }
}

layout! {
    /// Request (5) after the receiving server resolved its group (wire.md §11.5).
    RoutedRequestHeader = "RoutedRequestHeader" {
        /// Client id, non-zero.
        client: U128 = 128,
        /// Copied from the client header.
        request_checksum: U128 = 144,
        /// Client timestamp.
        timestamp: U64 = 160,
        /// Request number.
        request: U64 = 168,
        /// Operation code.
        operation: u8 = 176,
        /// Zero.
        operation_padding: [u8; 7] = 177,
        /// Session epoch.
        session: U64 = 184,
        /// Stamped by the primary.
        user_id: U32 = 192,
        /// First 52 bytes of the client shape's `reserved`.
        reserved: [u8; 52] = 196,
        /// Resolved consensus group.
        group: U64 = 248,
    }
}

layout! {
    /// Reply (8), client plane only (wire.md §11.6).
    ReplyHeader = "ReplyHeader" {
        /// Echo of the request's stamp.
        request_checksum: U128 = 128,
        /// Always 0.
        context: U128 = 144,
        /// The request's client.
        client: U128 = 160,
        /// Committed op, or 0 on a denial.
        op: U64 = 176,
        /// The op again, or the responder's `commit_max` outside the pipeline.
        commit: U64 = 184,
        /// Prepare timestamp, or echo of the request's.
        timestamp: U64 = 192,
        /// The request's number.
        request: U64 = 200,
        /// The request's operation.
        operation: u8 = 208,
        /// Zero.
        operation_padding: [u8; 7] = 209,
        /// 0 = ok, else an error code.
        status: U32 = 216,
        /// Zero.
        reserved: [u8; 36] = 220,
    }
}

layout! {
    /// Eviction (13), client plane only (wire.md §11.7).
    EvictionHeader = "EvictionHeader" {
        /// Non-zero.
        client: U128 = 128,
        /// Only with reason 14.
        server_protocol_version: U32 = 144,
        /// Only with reason 14.
        server_protocol_version_min: U32 = 148,
        /// Zero.
        reserved: [u8; 103] = 152,
        /// Eviction reason (1..=15).
        reason: u8 = 255,
    }
}

layout! {
    /// Prepare (6) and RepairPrepare (19) (wire.md §11.2).
    PrepareHeader = "PrepareHeader" {
        /// Originating client, 0 for server-originated ops.
        client: U128 = 128,
        /// Identity of the previous prepare of this group.
        parent: U128 = 144,
        /// Copied from the admitted request.
        request_checksum: U128 = 160,
        /// Op number, 1-based.
        op: U64 = 176,
        /// Primary's `commit_max` when built.
        commit: U64 = 184,
        /// Primary's clock, microseconds since the epoch.
        timestamp: U64 = 192,
        /// Client request number.
        request: U64 = 200,
        /// Operation code.
        operation: u8 = 208,
        /// Zero (not checked).
        operation_padding: [u8; 7] = 209,
        /// Group key.
        group: U64 = 216,
        /// Acting user.
        user_id: U32 = 224,
        /// Zero.
        reserved: [u8; 28] = 228,
    }
}

layout! {
    /// PrepareOk (7) (wire.md §11.3).
    PrepareOkHeader = "PrepareOkHeader" {
        /// Echo of the prepare's parent.
        parent: U128 = 128,
        /// Echo of the prepare's identity.
        prepare_checksum: U128 = 144,
        /// Echo.
        op: U64 = 160,
        /// The acker's own `commit_max`.
        commit: U64 = 168,
        /// Echo.
        timestamp: U64 = 176,
        /// Echo.
        request: U64 = 184,
        /// Echo.
        operation: u8 = 192,
        /// Zero.
        operation_padding: [u8; 7] = 193,
        /// Echo.
        group: U64 = 200,
        /// Zero.
        reserved: [u8; 48] = 208,
    }
}

layout! {
    /// Commit (9) (wire.md §11.4).
    CommitHeader = "CommitHeader" {
        /// Declared, unused: 0.
        commit_checksum: U128 = 128,
        /// Liveness token, +1 per broadcast.
        timestamp_monotonic: U64 = 144,
        /// The primary's `commit_min`.
        commit: U64 = 152,
        /// Declared, unused: 0.
        checkpoint_op: U64 = 160,
        /// Group key.
        group: U64 = 168,
        /// Zero.
        reserved: [u8; 80] = 176,
    }
}

layout! {
    /// StartViewChange (10) (wire.md §11.8).
    StartViewChangeHeader = "StartViewChangeHeader" {
        /// Group key.
        group: U64 = 128,
        /// Zero.
        reserved: [u8; 120] = 136,
    }
}

layout! {
    /// DoViewChange (11) (wire.md §11.9).
    DoViewChangeHeader = "DoViewChangeHeader" {
        /// Sender's head op; op of suffix entry 0.
        op: U64 = 128,
        /// `min(commit_max, op)`.
        commit: U64 = 136,
        /// Group key.
        group: U64 = 144,
        /// Sender's `log_view`.
        log_view: U32 = 152,
        /// Zero.
        reserved: [u8; 68] = 156,
        /// Bit i: the sender never prepared suffix entry i.
        nack_bitset: U128 = 224,
        /// Bit i: the sender can serve the body of suffix entry i.
        present_bitset: U128 = 240,
    }
}

layout! {
    /// StartView (12) (wire.md §11.10).
    StartViewHeader = "StartViewHeader" {
        /// Highest op of the primary's log.
        op: U64 = 128,
        /// Merged or current `commit_max`.
        commit: U64 = 136,
        /// Group key.
        group: U64 = 144,
        /// Zero.
        reserved: [u8; 88] = 152,
        /// Echo of a probe's incarnation, else 0.
        incarnation: U128 = 240,
    }
}

layout! {
    /// RequestStartView (17) (wire.md §11.12).
    RequestStartViewHeader = "RequestStartViewHeader" {
        /// Group key.
        group: U64 = 128,
        /// Zero.
        reserved: [u8; 104] = 136,
        /// Prober's per-boot incarnation.
        incarnation: U128 = 240,
    }
}

layout! {
    /// RequestPrepares (18) (wire.md §11.13).
    RequestPreparesHeader = "RequestPreparesHeader" {
        /// Correlates the repair stream.
        nonce: U128 = 128,
        /// First op wanted.
        from_op: U64 = 144,
        /// Last op wanted, inclusive.
        to_op: U64 = 152,
        /// Group key.
        group: U64 = 160,
        /// Zero.
        reserved: [u8; 88] = 168,
    }
}

layout! {
    /// RepairDone (20) and RangeEvicted (21) (wire.md §11.14).
    RepairRangeReplyHeader = "RepairRangeReplyHeader" {
        /// Echo of the request's nonce.
        nonce: U128 = 128,
        /// Last op served, or oldest op retained.
        op: U64 = 144,
        /// Group key.
        group: U64 = 152,
        /// Zero.
        reserved: [u8; 96] = 160,
    }
}

layout! {
    /// RequestStateTransfer (22) (wire.md §11.15).
    RequestStateTransferHeader = "RequestStateTransferHeader" {
        /// Transfer session id.
        nonce: U128 = 128,
        /// Group key.
        group: U64 = 144,
        /// Zero.
        reserved: [u8; 104] = 152,
    }
}

layout! {
    /// StateTransferTarget (23) (wire.md §11.15).
    StateTransferTargetHeader = "StateTransferTargetHeader" {
        /// Echo of the session id.
        nonce: U128 = 128,
        /// The applied frontier the offer reflects.
        commit_op: U64 = 144,
        /// Group key.
        group: U64 = 152,
        /// 1 = offer with a manifest body, 0 = refusal.
        available: u8 = 160,
        /// On a refusal: 1 = retry soon.
        unavailable_transient: u8 = 161,
        /// Zero (not checked).
        reserved_alignment: [u8; 6] = 162,
        /// Server's `commit_max`.
        commit_max: U64 = 168,
        /// Zero.
        reserved: [u8; 80] = 176,
    }
}

layout! {
    /// RequestStateChunk (24) (wire.md §11.15).
    RequestStateChunkHeader = "RequestStateChunkHeader" {
        /// Session id.
        nonce: U128 = 128,
        /// Byte offset within the artifact.
        offset: U64 = 144,
        /// Group key.
        group: U64 = 152,
        /// Bytes wanted, non-zero.
        len: U32 = 160,
        /// Index into the accepted manifest.
        artifact: U32 = 164,
        /// Zero.
        reserved: [u8; 88] = 168,
    }
}

layout! {
    /// StateChunk (25) (wire.md §11.15).
    StateChunkHeader = "StateChunkHeader" {
        /// Echo of the session id.
        nonce: U128 = 128,
        /// Where the body starts in the artifact.
        offset: U64 = 144,
        /// Group key.
        group: U64 = 152,
        /// Echo of the artifact index.
        artifact: U32 = 160,
        /// Zero.
        reserved: [u8; 92] = 164,
    }
}

layout! {
    /// ForwardRegister (26) (wire.md §11.16).
    ForwardRegisterHeader = "ForwardRegisterHeader" {
        /// Consensus client id of the login.
        client: U128 = 128,
        /// Correlation minted by the backup.
        nonce: U128 = 144,
        /// Verified user id.
        user_id: U32 = 160,
        /// Zero (checked).
        reserved: [u8; 92] = 164,
    }
}

layout! {
    /// ForwardRegisterResult (27) (wire.md §11.16).
    ForwardRegisterResultHeader = "ForwardRegisterResultHeader" {
        /// Echo.
        nonce: U128 = 128,
        /// Echo.
        client: U128 = 144,
        /// Committed Register op.
        epoch: U64 = 160,
        /// Highest committed request number.
        watermark: U64 = 168,
        /// Zero (checked).
        reserved: [u8; 79] = 176,
        /// The register outcome byte (client-plane.md, ForwardRegister).
        outcome: u8 = 255,
    }
}

layout! {
    /// ForwardLogout (28) (wire.md §11.16).
    ForwardLogoutHeader = "ForwardLogoutHeader" {
        /// Client whose table entry is removed.
        client: U128 = 128,
        /// Correlation.
        nonce: U128 = 144,
        /// Register epoch being logged out, non-zero.
        session: U64 = 160,
        /// Request number or synthetic disconnect id, non-zero.
        request: U64 = 168,
        /// Zero (checked).
        reserved: [u8; 80] = 176,
    }
}

layout! {
    /// ForwardLogoutResult (29) (wire.md §11.16).
    ForwardLogoutResultHeader = "ForwardLogoutResultHeader" {
        /// Echo.
        nonce: U128 = 128,
        /// Echo.
        client: U128 = 144,
        /// Committed Logout op, or the current commit for a no-op.
        commit: U64 = 160,
        /// Zero (checked).
        reserved: [u8; 87] = 168,
        /// The logout outcome byte (client-plane.md, ForwardLogout).
        outcome: u8 = 255,
    }
}

layout! {
    /// ReplicaHello (14) (handshake.md §2).
    ReplicaHello = "ReplicaHello" {
        /// Dialer nonce; all zero when auth is disabled.
        nonce: [u8; 32] = 128,
        /// Zero, except byte 224: the dialer's lane index (spec README, decision 2).
        reserved: [u8; 96] = 160,
    }
}

layout! {
    /// ReplicaChallenge (15) (handshake.md §2).
    ReplicaChallenge = "ReplicaChallenge" {
        /// Acceptor nonce; zero on a reject.
        nonce: [u8; 32] = 128,
        /// Acceptor MAC; zero on a reject.
        mac: [u8; 32] = 160,
        /// Handshake status, 0 on success.
        status: u8 = 192,
        /// Zero.
        reserved: [u8; 63] = 193,
    }
}

layout! {
    /// ReplicaFinish (16) (handshake.md §2).
    ReplicaFinish = "ReplicaFinish" {
        /// Zero.
        unused_nonce_slot: [u8; 32] = 128,
        /// Dialer MAC.
        mac: [u8; 32] = 160,
        /// Zero.
        reserved: [u8; 64] = 192,
    }
}

/// Byte offset of the dialer's lane index inside a ReplicaHello (spec README, decision 2).
pub const HELLO_LANE_OFFSET: usize = 224;

/// Every layout's name with its field table (bytes 128..256), for generic tooling.
pub const LAYOUTS: &[(&str, &[Field])] = &[
    (GenericHeader::NAME, GenericHeader::FIELDS),
    (RequestHeader::NAME, RequestHeader::FIELDS),
    (RoutedRequestHeader::NAME, RoutedRequestHeader::FIELDS),
    (ReplyHeader::NAME, ReplyHeader::FIELDS),
    (EvictionHeader::NAME, EvictionHeader::FIELDS),
    (PrepareHeader::NAME, PrepareHeader::FIELDS),
    (PrepareOkHeader::NAME, PrepareOkHeader::FIELDS),
    (CommitHeader::NAME, CommitHeader::FIELDS),
    (StartViewChangeHeader::NAME, StartViewChangeHeader::FIELDS),
    (DoViewChangeHeader::NAME, DoViewChangeHeader::FIELDS),
    (StartViewHeader::NAME, StartViewHeader::FIELDS),
    (RequestStartViewHeader::NAME, RequestStartViewHeader::FIELDS),
    (RequestPreparesHeader::NAME, RequestPreparesHeader::FIELDS),
    (RepairRangeReplyHeader::NAME, RepairRangeReplyHeader::FIELDS),
    (
        RequestStateTransferHeader::NAME,
        RequestStateTransferHeader::FIELDS,
    ),
    (
        StateTransferTargetHeader::NAME,
        StateTransferTargetHeader::FIELDS,
    ),
    (
        RequestStateChunkHeader::NAME,
        RequestStateChunkHeader::FIELDS,
    ),
    (StateChunkHeader::NAME, StateChunkHeader::FIELDS),
    (ForwardRegisterHeader::NAME, ForwardRegisterHeader::FIELDS),
    (
        ForwardRegisterResultHeader::NAME,
        ForwardRegisterResultHeader::FIELDS,
    ),
    (ForwardLogoutHeader::NAME, ForwardLogoutHeader::FIELDS),
    (
        ForwardLogoutResultHeader::NAME,
        ForwardLogoutResultHeader::FIELDS,
    ),
    (ReplicaHello::NAME, ReplicaHello::FIELDS),
    (ReplicaChallenge::NAME, ReplicaChallenge::FIELDS),
    (ReplicaFinish::NAME, ReplicaFinish::FIELDS),
];

/// The field table of a layout by name: bytes 0..128 followed by the layout's own fields.
pub fn layout_fields(name: &str) -> Option<impl Iterator<Item = &'static Field>> {
    LAYOUTS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, fields)| FRAME_FIELDS.iter().chain(fields.iter()))
}

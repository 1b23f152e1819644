//! The command byte registry (wire.md §5).

/// Command discriminant at byte 60. Values above 29 are not commands: the framer refuses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)] // the names are the spec's; wire.md §5 describes each
pub enum Command {
    Reserved = 0,
    Ping = 1,
    Pong = 2,
    PingClient = 3,
    PongClient = 4,
    Request = 5,
    Prepare = 6,
    PrepareOk = 7,
    Reply = 8,
    Commit = 9,
    StartViewChange = 10,
    DoViewChange = 11,
    StartView = 12,
    Eviction = 13,
    ReplicaHello = 14,
    ReplicaChallenge = 15,
    ReplicaFinish = 16,
    RequestStartView = 17,
    RequestPrepares = 18,
    RepairPrepare = 19,
    RepairDone = 20,
    RangeEvicted = 21,
    RequestStateTransfer = 22,
    StateTransferTarget = 23,
    RequestStateChunk = 24,
    StateChunk = 25,
    ForwardRegister = 26,
    ForwardRegisterResult = 27,
    ForwardLogout = 28,
    ForwardLogoutResult = 29,
}

/// How the `checksum` field (bytes 0..16) of a command is used (wire.md §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// XXH3 over bytes 16..256 (§7.1).
    FrameSeal,
    /// XXH3 over the header with checksum, view zeroed and command 6 (§7.2).
    PrepareIdentity,
    /// Checksum 0 and not verified.
    None,
    /// Checksum 0; authenticity comes from the MAC inside (handshake.md).
    HandshakeMac,
}

impl Command {
    /// The highest defined command byte.
    pub const MAX: u8 = 29;

    /// Every command, in byte order.
    pub const ALL: [Command; 30] = {
        let mut all = [Command::Reserved; 30];
        let mut i = 0;
        while i < 30 {
            all[i] = match Command::from_byte(i as u8) {
                Some(c) => c,
                None => panic!("every byte up to MAX is a command"),
            };
            i += 1;
        }
        all
    };

    /// Decodes a command byte; `None` above [`Command::MAX`].
    pub const fn from_byte(byte: u8) -> Option<Command> {
        use Command::*;
        Some(match byte {
            0 => Reserved,
            1 => Ping,
            2 => Pong,
            3 => PingClient,
            4 => PongClient,
            5 => Request,
            6 => Prepare,
            7 => PrepareOk,
            8 => Reply,
            9 => Commit,
            10 => StartViewChange,
            11 => DoViewChange,
            12 => StartView,
            13 => Eviction,
            14 => ReplicaHello,
            15 => ReplicaChallenge,
            16 => ReplicaFinish,
            17 => RequestStartView,
            18 => RequestPrepares,
            19 => RepairPrepare,
            20 => RepairDone,
            21 => RangeEvicted,
            22 => RequestStateTransfer,
            23 => StateTransferTarget,
            24 => RequestStateChunk,
            25 => StateChunk,
            26 => ForwardRegister,
            27 => ForwardRegisterResult,
            28 => ForwardLogout,
            29 => ForwardLogoutResult,
            _ => return None,
        })
    }

    /// The command byte.
    pub const fn byte(self) -> u8 {
        self as u8
    }

    /// The spec's name of the command.
    pub const fn name(self) -> &'static str {
        use Command::*;
        match self {
            Reserved => "Reserved",
            Ping => "Ping",
            Pong => "Pong",
            PingClient => "PingClient",
            PongClient => "PongClient",
            Request => "Request",
            Prepare => "Prepare",
            PrepareOk => "PrepareOk",
            Reply => "Reply",
            Commit => "Commit",
            StartViewChange => "StartViewChange",
            DoViewChange => "DoViewChange",
            StartView => "StartView",
            Eviction => "Eviction",
            ReplicaHello => "ReplicaHello",
            ReplicaChallenge => "ReplicaChallenge",
            ReplicaFinish => "ReplicaFinish",
            RequestStartView => "RequestStartView",
            RequestPrepares => "RequestPrepares",
            RepairPrepare => "RepairPrepare",
            RepairDone => "RepairDone",
            RangeEvicted => "RangeEvicted",
            RequestStateTransfer => "RequestStateTransfer",
            StateTransferTarget => "StateTransferTarget",
            RequestStateChunk => "RequestStateChunk",
            StateChunk => "StateChunk",
            ForwardRegister => "ForwardRegister",
            ForwardRegisterResult => "ForwardRegisterResult",
            ForwardLogout => "ForwardLogout",
            ForwardLogoutResult => "ForwardLogoutResult",
        }
    }

    /// How this command uses the checksum field.
    pub const fn integrity(self) -> Integrity {
        use Command::*;
        match self {
            Prepare | RepairPrepare => Integrity::PrepareIdentity,
            ReplicaHello | ReplicaChallenge | ReplicaFinish => Integrity::HandshakeMac,
            Reserved | Ping | Pong | PingClient | PongClient | Request | Reply | Eviction => {
                Integrity::None
            }
            PrepareOk
            | Commit
            | StartViewChange
            | DoViewChange
            | StartView
            | RequestStartView
            | RequestPrepares
            | RepairDone
            | RangeEvicted
            | RequestStateTransfer
            | StateTransferTarget
            | RequestStateChunk
            | StateChunk
            | ForwardRegister
            | ForwardRegisterResult
            | ForwardLogout
            | ForwardLogoutResult => Integrity::FrameSeal,
        }
    }

    /// Whether the frame seal of wire.md §7.1 applies.
    pub const fn is_sealed(self) -> bool {
        matches!(self.integrity(), Integrity::FrameSeal)
    }

    /// The name of the header layout of this command (`header::LAYOUTS`). A Request is named by
    /// its client shape; the replica plane reads it as `RoutedRequestHeader`.
    pub const fn layout_name(self) -> &'static str {
        use Command::*;
        match self {
            Reserved | Ping | Pong | PingClient | PongClient => "GenericHeader",
            Request => "RequestHeader",
            Prepare | RepairPrepare => "PrepareHeader",
            PrepareOk => "PrepareOkHeader",
            Reply => "ReplyHeader",
            Commit => "CommitHeader",
            StartViewChange => "StartViewChangeHeader",
            DoViewChange => "DoViewChangeHeader",
            StartView => "StartViewHeader",
            Eviction => "EvictionHeader",
            ReplicaHello => "ReplicaHello",
            ReplicaChallenge => "ReplicaChallenge",
            ReplicaFinish => "ReplicaFinish",
            RequestStartView => "RequestStartViewHeader",
            RequestPrepares => "RequestPreparesHeader",
            RepairDone | RangeEvicted => "RepairRangeReplyHeader",
            RequestStateTransfer => "RequestStateTransferHeader",
            StateTransferTarget => "StateTransferTargetHeader",
            RequestStateChunk => "RequestStateChunkHeader",
            StateChunk => "StateChunkHeader",
            ForwardRegister => "ForwardRegisterHeader",
            ForwardRegisterResult => "ForwardRegisterResultHeader",
            ForwardLogout => "ForwardLogoutHeader",
            ForwardLogoutResult => "ForwardLogoutResultHeader",
        }
    }

    /// Offset of the `group` field (wire.md §5); `None` for commands without one. A Request has
    /// a group only in its routed shape (offset 248).
    pub const fn group_offset(self) -> Option<usize> {
        use Command::*;
        Some(match self {
            Request => 248,
            Prepare | RepairPrepare => 216,
            PrepareOk => 200,
            Commit => 168,
            StartViewChange | RequestStartView => 128,
            DoViewChange | StartView | RequestStateTransfer => 144,
            RequestPrepares => 160,
            RepairDone | RangeEvicted | StateTransferTarget | RequestStateChunk | StateChunk => 152,
            _ => return None,
        })
    }

    /// Whether a receiver rejects `size != 256` for this command regardless of other fields
    /// (wire.md §5 "none (enforced)"). StateTransferTarget's rule depends on `available`.
    pub const fn is_header_only_enforced(self) -> bool {
        use Command::*;
        matches!(
            self,
            Commit
                | Eviction
                | RequestStateTransfer
                | RequestStateChunk
                | ForwardRegister
                | ForwardRegisterResult
                | ForwardLogout
                | ForwardLogoutResult
        )
    }
}

impl TryFrom<u8> for Command {
    type Error = u8;

    fn try_from(byte: u8) -> Result<Self, u8> {
        Command::from_byte(byte).ok_or(byte)
    }
}

impl core::fmt::Display for Command {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_stop_at_max() {
        for byte in 0..=255u8 {
            match Command::from_byte(byte) {
                Some(c) => assert_eq!(c.byte(), byte),
                None => assert!(byte > Command::MAX),
            }
        }
        assert_eq!(Command::ALL.len(), usize::from(Command::MAX) + 1);
    }

    #[test]
    fn sealed_set_matches_spec_table() {
        let sealed: Vec<u8> = Command::ALL
            .iter()
            .filter(|c| c.is_sealed())
            .map(|c| c.byte())
            .collect();
        let expected: Vec<u8> = [7, 9, 10, 11, 12, 17, 18]
            .into_iter()
            .chain(20..=29)
            .collect();
        assert_eq!(sealed, expected);
    }
}

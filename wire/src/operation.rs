//! The operation byte (wire.md §10).

/// Operation code carried by Request (176), Prepare/RepairPrepare (208), PrepareOk (192) and
/// Reply (208). Values not listed are invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)] // names and classes are the spec's (wire.md §10)
pub enum Operation {
    Reserved = 0,
    Register = 1,
    NonReplicated = 2,
    Logout = 3,
    CreateTopicWithAssignments = 64,
    CreatePartitionsWithAssignments = 65,
    RemoveConsumerGroupMember = 66,
    CompleteConsumerGroupRevocation = 67,
    TruncatePartition = 68,
    CreateStream = 128,
    UpdateStream = 129,
    DeleteStream = 130,
    PurgeStream = 131,
    CreateTopic = 132,
    UpdateTopic = 133,
    DeleteTopic = 134,
    PurgeTopic = 135,
    CreatePartitions = 136,
    DeletePartitions = 137,
    DeleteSegments = 138,
    CreateConsumerGroup = 139,
    DeleteConsumerGroup = 140,
    CreateUser = 141,
    UpdateUser = 142,
    DeleteUser = 143,
    ChangePassword = 144,
    UpdatePermissions = 145,
    CreatePersonalAccessToken = 146,
    DeletePersonalAccessToken = 147,
    JoinConsumerGroup = 148,
    LeaveConsumerGroup = 149,
    SendMessages = 160,
    StoreConsumerOffset = 161,
    DeleteConsumerOffset = 162,
}

impl Operation {
    /// Every defined operation, in byte order.
    pub const ALL: [Operation; 34] = {
        use Operation::*;
        [
            Reserved,
            Register,
            NonReplicated,
            Logout,
            CreateTopicWithAssignments,
            CreatePartitionsWithAssignments,
            RemoveConsumerGroupMember,
            CompleteConsumerGroupRevocation,
            TruncatePartition,
            CreateStream,
            UpdateStream,
            DeleteStream,
            PurgeStream,
            CreateTopic,
            UpdateTopic,
            DeleteTopic,
            PurgeTopic,
            CreatePartitions,
            DeletePartitions,
            DeleteSegments,
            CreateConsumerGroup,
            DeleteConsumerGroup,
            CreateUser,
            UpdateUser,
            DeleteUser,
            ChangePassword,
            UpdatePermissions,
            CreatePersonalAccessToken,
            DeletePersonalAccessToken,
            JoinConsumerGroup,
            LeaveConsumerGroup,
            SendMessages,
            StoreConsumerOffset,
            DeleteConsumerOffset,
        ]
    };

    /// Decodes an operation byte; `None` for an undefined value.
    pub const fn from_byte(byte: u8) -> Option<Operation> {
        let mut i = 0;
        while i < Self::ALL.len() {
            if Self::ALL[i] as u8 == byte {
                return Some(Self::ALL[i]);
            }
            i += 1;
        }
        None
    }

    /// The operation byte.
    pub const fn byte(self) -> u8 {
        self as u8
    }

    /// Server-internal operations (64..=127); never accepted from clients.
    pub const fn is_internal(self) -> bool {
        matches!(self as u8, 64..=127)
    }

    /// The *metadata* class: internal operations plus 128..=137 and 139..=149.
    pub const fn is_metadata(self) -> bool {
        self.is_internal() || matches!(self as u8, 128..=137 | 139..=149)
    }

    /// The *partition* class: values from 160.
    pub const fn is_partition(self) -> bool {
        self as u8 >= 160
    }

    /// Operations replicated on the metadata plane: the metadata class plus Register and Logout.
    pub const fn is_metadata_plane(self) -> bool {
        self.is_metadata() || matches!(self, Operation::Register | Operation::Logout)
    }

    /// Whether this is one of the VSR-reserved values 0..=3.
    pub const fn is_vsr_reserved(self) -> bool {
        (self as u8) < 4
    }

    /// The legacy client command code this operation is reached from, if any.
    pub const fn client_code(self) -> Option<u32> {
        use Operation::*;
        Some(match self {
            CreateStream => 202,
            UpdateStream => 204,
            DeleteStream => 203,
            PurgeStream => 205,
            CreateTopic => 302,
            UpdateTopic => 304,
            DeleteTopic => 303,
            PurgeTopic => 305,
            CreatePartitions => 402,
            DeletePartitions => 403,
            DeleteSegments => 503,
            CreateConsumerGroup => 602,
            DeleteConsumerGroup => 603,
            CreateUser => 33,
            UpdateUser => 35,
            DeleteUser => 34,
            ChangePassword => 37,
            UpdatePermissions => 36,
            CreatePersonalAccessToken => 42,
            DeletePersonalAccessToken => 43,
            JoinConsumerGroup => 604,
            LeaveConsumerGroup => 605,
            SendMessages => 101,
            StoreConsumerOffset => 121,
            DeleteConsumerOffset => 122,
            _ => return None,
        })
    }

    /// The operation a legacy client command code maps to.
    pub fn from_client_code(code: u32) -> Option<Operation> {
        Self::ALL
            .into_iter()
            .find(|op| op.client_code() == Some(code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        for byte in 0..=255u8 {
            if let Some(op) = Operation::from_byte(byte) {
                assert_eq!(op.byte(), byte);
            }
        }
        assert_eq!(Operation::from_byte(4), None);
        assert_eq!(Operation::from_byte(0xEE), None);
    }

    #[test]
    fn classes_follow_the_spec() {
        use Operation::*;
        assert!(TruncatePartition.is_internal() && TruncatePartition.is_metadata());
        assert!(!DeleteSegments.is_metadata() && !DeleteSegments.is_partition());
        assert!(Register.is_metadata_plane() && Logout.is_metadata_plane());
        assert!(!NonReplicated.is_metadata_plane());
        assert!(SendMessages.is_partition() && !SendMessages.is_metadata_plane());
        assert_eq!(Operation::from_client_code(101), Some(SendMessages));
    }
}

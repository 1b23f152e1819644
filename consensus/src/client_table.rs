//! The client table (§12, metadata plane): sessions, request watermarks and cached replies,
//! rebuilt identically on every replica from the committed log. Nothing here looks at clocks,
//! pipeline state or slots: eviction ties break by the lowest client id (\[design\], §12).

use std::collections::BTreeMap;

use xxhash_rust::xxh3::xxh3_64;

use crate::constants::CLIENT_REPLIES_MAX;

const MAGIC: &[u8; 4] = b"ICT2";

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
    /// Latest replies, oldest first.
    pub replies: Vec<CachedReply>,
}

impl Session {
    /// The commit op eviction orders by: the latest cached reply, else the epoch.
    fn recency(&self) -> u64 {
        self.replies
            .last()
            .map_or(self.epoch, |r| r.op.max(self.epoch))
    }
}

/// A cached reply frame with the fields the checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CachedReply {
    pub request: u64,
    pub request_checksum: u128,
    pub op: u64,
    pub frame: Vec<u8>,
}

impl CachedReply {
    fn from_frame(frame: Vec<u8>) -> Option<CachedReply> {
        let h = <wire::header::ReplyHeader as wire::header::Layout>::view(&frame)?;
        Some(CachedReply {
            request_checksum: h.request_checksum.get(),
            op: h.op.get(),
            request: h.request.get(),
            frame,
        })
    }
}

/// What the primary does with a request, from the table alone (§12 request check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A new request: propose it.
    New,
    /// Replay this cached reply.
    Replay(Vec<u8>),
    /// Applied, reply aged out: terminal `RequestAlreadyApplied`.
    AlreadyApplied,
    /// No session: Eviction NoSession.
    NoSession,
    /// `session < epoch`: Eviction SessionTooLow.
    Fenced,
    /// Client bug or conflicting reuse: drop silently.
    Drop,
}

fn conflicting(a: u128, b: u128) -> bool {
    a != 0 && b != 0 && a != b
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

    /// The §12 request check for a non-Register request.
    pub fn check(&self, client: u128, session: u64, request: u64, checksum: u128) -> Verdict {
        let Some(entry) = self.sessions.get(&client) else {
            return Verdict::NoSession;
        };
        if session < entry.epoch {
            return Verdict::Fenced;
        }
        if session > entry.epoch {
            return Verdict::Drop;
        }
        if request > entry.watermark {
            return Verdict::New;
        }
        if request == entry.watermark && conflicting(checksum, entry.watermark_checksum) {
            return Verdict::Drop;
        }
        match entry.replies.iter().find(|r| r.request == request) {
            Some(r) if conflicting(r.request_checksum, checksum) => Verdict::Drop,
            Some(r) => Verdict::Replay(r.frame.clone()),
            None => Verdict::AlreadyApplied,
        }
    }

    /// The owner of an entry, for the Register ownership gate.
    pub fn owner(&self, client: u128) -> Option<u32> {
        self.sessions.get(&client).map(|s| s.user_id)
    }

    /// Committed Register at `op`: create or rebind (epoch = op), evicting if full. Returns
    /// the client whose session was evicted to make room, if any.
    pub fn register(&mut self, client: u128, user_id: u32, op: u64) -> Option<u128> {
        if let Some(entry) = self.sessions.get_mut(&client) {
            entry.epoch = op;
            entry.user_id = user_id;
            return None;
        }
        let mut evicted = None;
        if self.sessions.len() >= self.capacity {
            let victim = self
                .sessions
                .iter()
                .min_by_key(|(id, s)| (s.recency(), **id))
                .map(|(id, _)| *id);
            if let Some(victim) = victim {
                self.sessions.remove(&victim);
                evicted = Some(victim);
            }
        }
        self.sessions.insert(
            client,
            Session {
                epoch: op,
                user_id,
                watermark: 0,
                watermark_checksum: 0,
                replies: Vec::new(),
            },
        );
        evicted
    }

    /// Committed Logout: the entry goes away everywhere.
    pub fn logout(&mut self, client: u128) {
        self.sessions.remove(&client);
    }

    /// Committed normal op: cache its reply and advance the watermark (§12). Never panics.
    pub fn commit(&mut self, client: u128, request: u64, checksum: u128, op: u64, frame: &[u8]) {
        let Some(entry) = self.sessions.get_mut(&client) else {
            return;
        };
        if request < entry.watermark {
            return;
        }
        let cached = CachedReply {
            request,
            request_checksum: checksum,
            op,
            frame: frame.to_vec(),
        };
        if request == entry.watermark
            && let Some(slot) = entry.replies.iter_mut().find(|r| r.request == request)
        {
            if slot.op <= op {
                *slot = cached;
            }
            return;
        }
        entry.watermark = request;
        entry.watermark_checksum = checksum;
        entry.replies.push(cached);
        if entry.replies.len() > CLIENT_REPLIES_MAX {
            entry.replies.remove(0);
        }
    }

    /// Decodes the transfer/snapshot encoding; `None` if empty or malformed.
    pub fn decode(bytes: &[u8], capacity: usize) -> Option<ClientTable> {
        let (content, trailer) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
        if xxh3_64(content).to_le_bytes() != trailer {
            return None;
        }
        let mut r = Reader(content);
        if r.take(4)? != MAGIC {
            return None;
        }
        let count = r.u32()?;
        let mut table = ClientTable::new(capacity);
        for _ in 0..count {
            let client = r.u128()?;
            let epoch = r.u64()?;
            let user_id = r.u32()?;
            let watermark = r.u64()?;
            let watermark_checksum = r.u128()?;
            let ring = r.u8()?;
            let mut replies = Vec::new();
            for _ in 0..ring {
                let len = r.u32()? as usize;
                replies.push(CachedReply::from_frame(r.take(len)?.to_vec())?);
            }
            table.sessions.insert(
                client,
                Session {
                    epoch,
                    user_id,
                    watermark,
                    watermark_checksum,
                    replies,
                },
            );
        }
        if !r.0.is_empty() || table.sessions.len() > capacity {
            return None;
        }
        Some(table)
    }

    /// The canonical encoding ("ICT2", consensus.md §11.3): snapshots, transfers, equivalence.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.sessions.len() as u32).to_le_bytes());
        for (client, s) in &self.sessions {
            out.extend_from_slice(&client.to_le_bytes());
            out.extend_from_slice(&s.epoch.to_le_bytes());
            out.extend_from_slice(&s.user_id.to_le_bytes());
            out.extend_from_slice(&s.watermark.to_le_bytes());
            out.extend_from_slice(&s.watermark_checksum.to_le_bytes());
            out.push(s.replies.len() as u8);
            for r in &s.replies {
                out.extend_from_slice(&(r.frame.len() as u32).to_le_bytes());
                out.extend_from_slice(&r.frame);
            }
        }
        let trailer = xxh3_64(&out);
        out.extend_from_slice(&trailer.to_le_bytes());
        out
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = self.0.split_at_checked(n)?;
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn u128(&mut self) -> Option<u128> {
        Some(u128::from_le_bytes(self.take(16)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(request: u64, checksum: u128, op: u64) -> Vec<u8> {
        use wire::header::{Layout, ReplyHeader};
        let mut h = ReplyHeader::zeroed();
        h.request_checksum.set(checksum);
        h.op.set(op);
        h.request.set(request);
        h.bytes().to_vec()
    }

    #[test]
    fn request_checks_in_order() {
        let mut t = ClientTable::new(4);
        assert_eq!(t.check(9, 1, 1, 0), Verdict::NoSession);
        t.register(9, 7, 5);
        assert_eq!(t.check(9, 4, 1, 0), Verdict::Fenced);
        assert_eq!(t.check(9, 6, 1, 0), Verdict::Drop);
        assert_eq!(t.check(9, 5, 1, 0), Verdict::New);
        t.commit(9, 1, 11, 6, &reply(1, 11, 6));
        assert_eq!(t.check(9, 5, 1, 11), Verdict::Replay(reply(1, 11, 6)));
        assert_eq!(t.check(9, 5, 1, 12), Verdict::Drop, "conflicting checksum");
        assert_eq!(t.check(9, 5, 1, 0), Verdict::Replay(reply(1, 11, 6)));
        for r in 2..=7 {
            t.commit(9, r, 0, 6 + r, &reply(r, 0, 6 + r));
        }
        assert_eq!(
            t.check(9, 5, 1, 0),
            Verdict::AlreadyApplied,
            "aged out of the ring"
        );
        assert_eq!(t.sessions[&9].replies.len(), CLIENT_REPLIES_MAX);
        t.logout(9);
        assert_eq!(t.check(9, 5, 8, 0), Verdict::NoSession);
    }

    #[test]
    fn eviction_is_deterministic_oldest_then_lowest_id() {
        let mut t = ClientTable::new(2);
        t.register(5, 0, 1);
        t.register(3, 0, 1);
        t.register(8, 0, 2);
        assert!(
            !t.sessions.contains_key(&3),
            "tie at op 1 evicts the lowest id"
        );
        assert!(t.sessions.contains_key(&5));
        t.commit(5, 1, 0, 3, &reply(1, 0, 3));
        t.register(9, 0, 4);
        assert!(!t.sessions.contains_key(&8));
    }

    #[test]
    fn encoding_roundtrips_and_refuses_damage() {
        let mut t = ClientTable::new(8);
        t.register(1, 2, 3);
        t.commit(1, 1, 77, 4, &reply(1, 77, 4));
        t.register(2, 0, 5);
        let bytes = t.encode();
        assert_eq!(ClientTable::decode(&bytes, 8), Some(t.clone()));
        let mut bad = bytes.clone();
        bad[10] ^= 1;
        assert_eq!(ClientTable::decode(&bad, 8), None);
        for cut in 0..bytes.len() {
            assert_eq!(ClientTable::decode(&bytes[..cut], 8), None);
        }
        assert_eq!(ClientTable::decode(&bytes, 1), None, "over capacity");
    }
}

//! The replicated metadata: users, streams, topics, partitions and the partition group-id
//! counter, held in `BTreeMap`s so that iteration, encoding and id choice are deterministic.
//! Its canonical encoding is the METADATA_SNAPSHOT artifact (Strand's own format,
//! state-transfer.md §3): two replicas hold the same state exactly when their encodings are
//! byte-identical.

use std::collections::{BTreeMap, BTreeSet};

use wire::GroupId;
use wire::group::{PartitionKey, STREAM_MAX, TOPIC_MAX};
use xxhash_rust::xxh3::xxh3_64;

use super::password::{HASH_LEN, HashParams, PasswordHash, SALT_LEN};
use super::topic::{self, TopicSettings};
use super::users::Account;
use crate::client::codec::{BodyError, Name, Options, Reader};

/// Partitions a topic may have. The reference caps a topic at 1000 partitions; the group key
/// would admit up to 1 000 000 (wire.md §9).
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 1000;

/// A user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Id (root is 0).
    pub id: u32,
    /// Username.
    pub username: Name,
    /// The stored password.
    pub password: PasswordHash,
}

/// A partition of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Id, 0-based.
    pub id: u32,
    /// Creation time, µs (the prepare's timestamp).
    pub created_at: u64,
    /// The reference's `consensus_group_id` (client-plane.md §7.4), unique and increasing.
    pub consensus_group_id: u64,
}

/// A topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    /// Id, 0-based within its stream.
    pub id: u32,
    /// Name, unique within its stream.
    pub name: Name,
    /// Creation time, µs.
    pub created_at: u64,
    /// Options the client set (canonical order).
    pub explicit: Options,
    /// Defaults for the keys it did not set, as the primary resolved them.
    pub derived: Options,
    /// Resolved from `explicit` and `derived` (not encoded: recomputed on decode).
    pub settings: TopicSettings,
    /// Partitions `0..n`.
    pub partitions: Vec<Partition>,
}

/// A stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    /// Id, 0-based.
    pub id: u32,
    /// Name, unique.
    pub name: Name,
    /// Creation time, µs.
    pub created_at: u64,
    /// Topics by id.
    pub topics: BTreeMap<u32, Topic>,
}

/// The whole replicated metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// Users by id.
    pub users: BTreeMap<u32, User>,
    /// Streams by id.
    pub streams: BTreeMap<u32, Stream>,
    /// The next `consensus_group_id` to hand out.
    pub next_consensus_group_id: u64,
    /// Consumer groups by (stream id, topic id); a topic without groups has no entry.
    pub consumer_groups: BTreeMap<(u32, u32), super::groups::TopicGroups>,
    /// How many consumer-group offset keys the counter has issued (decision 390): the next
    /// is `GROUP_KEY_BASE + this`. Moves only at the apply of a tagged CreateConsumerGroup.
    pub group_keys_issued: u32,
    /// Status, permissions and tokens by user id (issue 11); a user without an entry has
    /// the defaults of [`Account`].
    pub accounts: BTreeMap<u32, Account>,
    /// Partition group keys whose partition was deleted and not created again, with the
    /// `consensus_group_id` (the incarnation) that was deleted (decision 342): a node removes
    /// a group's files only when this state proves that incarnation dead.
    pub retired: BTreeMap<u64, u64>,
    /// Each live session's origin replica by client id (decision 370); a session of an older
    /// build's Register has no entry.
    pub session_origins: super::sessions::Origins,
}

impl Stream {
    /// The topic named by `name`.
    pub fn topic_by_name(&self, name: &str) -> Option<&Topic> {
        self.topics.values().find(|t| t.name.as_str() == name)
    }
}

impl Topic {
    /// The partition group key of partition `partition` of this topic in `stream`.
    pub fn group(&self, stream: u32, partition: u32) -> Option<GroupId> {
        GroupId::partition(PartitionKey {
            stream,
            topic: self.id,
            partition,
        })
        .ok()
    }
}

impl State {
    /// The stream named by `name`.
    pub fn stream_by_name(&self, name: &str) -> Option<&Stream> {
        self.streams.values().find(|s| s.name.as_str() == name)
    }

    /// The user named by `username`.
    pub fn user_by_name(&self, username: &str) -> Option<&User> {
        self.users
            .values()
            .find(|u| u.username.as_str() == username)
    }

    /// The live partition whose group key is `group`: its `consensus_group_id`.
    pub fn live_incarnation(&self, group: u64) -> Option<u64> {
        let key = GroupId(group).fields();
        let topic = self.streams.get(&key.stream)?.topics.get(&key.topic)?;
        let partition = topic.partitions.get(key.partition as usize)?;
        (topic.group(key.stream, key.partition)?.0 == group).then_some(partition.consensus_group_id)
    }

    /// Records the partitions of `topic` in `stream` from index `from` up as retired.
    pub fn retire(&mut self, stream: u32, topic: &Topic, from: usize) {
        for partition in topic.partitions.iter().skip(from) {
            if let Some(group) = topic.group(stream, partition.id) {
                self.retired.insert(group.0, partition.consensus_group_id);
            }
        }
    }

    /// The lowest stream id not in use, if any is left under the group key's limit.
    pub fn free_stream_id(&self) -> Option<u32> {
        lowest_free(self.streams.keys(), STREAM_MAX)
    }
}

/// The lowest id in `0..=max` missing from the ascending `used`.
pub fn lowest_free<'a>(used: impl Iterator<Item = &'a u32>, max: u32) -> Option<u32> {
    let mut candidate = 0u32;
    for id in used {
        if *id != candidate {
            break;
        }
        candidate = candidate.checked_add(1)?;
    }
    (candidate <= max).then_some(candidate)
}

/// The lowest topic id free in `stream`.
pub fn free_topic_id(stream: &Stream) -> Option<u32> {
    lowest_free(stream.topics.keys(), TOPIC_MAX)
}

// ---- the METADATA_SNAPSHOT encoding -------------------------------------------------------

/// Magic of the snapshot encoding.
pub const MAGIC: [u8; 4] = *b"SMD1";
/// Version byte after the magic (2 adds the retired groups after the streams; 3 appends the
/// session origins after the accounts, decision 371; 4 adds the consumer groups' offset keys
/// and their counter, decision 392; 1 to 3 are still read, with none).
pub const VERSION: u8 = 4;

/// Why a snapshot does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Shorter than a trailer.
    #[error("snapshot shorter than its trailer")]
    Short,
    /// The XXH3-64 trailer does not match.
    #[error("snapshot trailer mismatch")]
    Trailer,
    /// Unknown magic or version.
    #[error("snapshot magic or version unknown")]
    Magic,
    /// A field does not decode.
    #[error("snapshot body: {0}")]
    Body(#[from] BodyError),
    /// The content breaks a rule of the state (duplicate name, ids out of order or range,
    /// topic options that do not resolve, a duplicate group id or a counter behind one).
    #[error("snapshot content: {0}")]
    Content(&'static str),
}

impl State {
    /// The canonical encoding, XXH3-64 trailer included.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(VERSION)
    }

    /// The version-3 encoding (no offset keys, no key counter), as an older build wrote it:
    /// for the tests that load older snapshots.
    #[cfg(test)]
    pub fn encode_v3(&self) -> Vec<u8> {
        self.encode_as(3)
    }

    fn encode_as(&self, version: u8) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.push(version);
        out.extend_from_slice(&self.next_consensus_group_id.to_le_bytes());
        out.extend_from_slice(&(self.users.len() as u32).to_le_bytes());
        for user in self.users.values() {
            out.extend_from_slice(&user.id.to_le_bytes());
            user.username.write(&mut out);
            let p = &user.password;
            for v in [
                p.params.memory_kib,
                p.params.iterations,
                p.params.parallelism,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&p.salt);
            out.extend_from_slice(&p.hash);
        }
        out.extend_from_slice(&(self.streams.len() as u32).to_le_bytes());
        for stream in self.streams.values() {
            out.extend_from_slice(&stream.id.to_le_bytes());
            out.extend_from_slice(&stream.created_at.to_le_bytes());
            stream.name.write(&mut out);
            out.extend_from_slice(&(stream.topics.len() as u32).to_le_bytes());
            for topic in stream.topics.values() {
                out.extend_from_slice(&topic.id.to_le_bytes());
                out.extend_from_slice(&topic.created_at.to_le_bytes());
                topic.name.write(&mut out);
                topic.explicit.write_prefixed(&mut out);
                topic.derived.write_prefixed(&mut out);
                out.extend_from_slice(&(topic.partitions.len() as u32).to_le_bytes());
                for p in &topic.partitions {
                    out.extend_from_slice(&p.created_at.to_le_bytes());
                    out.extend_from_slice(&p.consensus_group_id.to_le_bytes());
                }
            }
        }
        out.extend_from_slice(&(self.retired.len() as u32).to_le_bytes());
        for (group, incarnation) in &self.retired {
            out.extend_from_slice(&group.to_le_bytes());
            out.extend_from_slice(&incarnation.to_le_bytes());
        }
        // Appended section (decision 318): consumer groups.
        super::groups::encode_section(self, &mut out, version);
        // The accounts section (issue 11), appended after the original sections.
        out.extend_from_slice(&(self.accounts.len() as u32).to_le_bytes());
        for (id, account) in &self.accounts {
            out.extend_from_slice(&id.to_le_bytes());
            account.write(&mut out);
        }
        // Version 3 (decision 371): the session origins, after the accounts.
        super::sessions::encode_section(self, &mut out);
        let trailer = xxh3_64(&out);
        out.extend_from_slice(&trailer.to_le_bytes());
        out
    }

    /// Decodes and validates a snapshot. Nothing is trusted: every rule `apply` keeps is
    /// checked again, so an installed state is one `apply` could have built.
    pub fn decode(bytes: &[u8]) -> Result<State, SnapshotError> {
        let (content, trailer) = bytes
            .split_at_checked(bytes.len().checked_sub(8).ok_or(SnapshotError::Short)?)
            .ok_or(SnapshotError::Short)?;
        if xxh3_64(content).to_le_bytes() != trailer {
            return Err(SnapshotError::Trailer);
        }
        let mut r = Reader::new(content);
        if r.array::<4>("magic")? != MAGIC {
            return Err(SnapshotError::Magic);
        }
        let version = r.u8("version")?;
        if !(1..=VERSION).contains(&version) {
            return Err(SnapshotError::Magic);
        }
        let mut state = State {
            next_consensus_group_id: r.u64("next_consensus_group_id")?,
            ..State::default()
        };
        let users = r.u32("user count")?;
        for _ in 0..users {
            let id = r.u32("user id")?;
            let username = Name::read(&mut r, "username")?;
            let params = HashParams {
                memory_kib: r.u32("memory_kib")?,
                iterations: r.u32("iterations")?,
                parallelism: r.u32("parallelism")?,
            };
            if !params.is_valid() {
                return Err(SnapshotError::Content(
                    "password hash parameters out of range",
                ));
            }
            let salt = r.array::<SALT_LEN>("salt")?;
            let hash = r.array::<HASH_LEN>("hash")?;
            if state
                .users
                .keys()
                .next_back()
                .is_some_and(|last| *last >= id)
            {
                return Err(SnapshotError::Content("user ids not ascending"));
            }
            if state.user_by_name(username.as_str()).is_some() {
                return Err(SnapshotError::Content("duplicate username"));
            }
            state.users.insert(
                id,
                User {
                    id,
                    username,
                    password: PasswordHash { params, salt, hash },
                },
            );
        }
        let streams = r.u32("stream count")?;
        let mut group_ids = BTreeSet::new();
        for _ in 0..streams {
            let id = r.u32("stream id")?;
            let created_at = r.u64("created_at")?;
            let name = Name::read(&mut r, "stream name")?;
            if id > STREAM_MAX
                || state
                    .streams
                    .keys()
                    .next_back()
                    .is_some_and(|last| *last >= id)
            {
                return Err(SnapshotError::Content(
                    "stream ids not ascending or too large",
                ));
            }
            if state.stream_by_name(name.as_str()).is_some() {
                return Err(SnapshotError::Content("duplicate stream name"));
            }
            let mut stream = Stream {
                id,
                name,
                created_at,
                topics: BTreeMap::new(),
            };
            let topics = r.u32("topic count")?;
            for _ in 0..topics {
                let topic = decode_topic(&mut r, &mut group_ids)?;
                if topic.id > TOPIC_MAX
                    || stream
                        .topics
                        .keys()
                        .next_back()
                        .is_some_and(|last| *last >= topic.id)
                {
                    return Err(SnapshotError::Content(
                        "topic ids not ascending or too large",
                    ));
                }
                if stream.topic_by_name(topic.name.as_str()).is_some() {
                    return Err(SnapshotError::Content("duplicate topic name"));
                }
                stream.topics.insert(topic.id, topic);
            }
            state.streams.insert(id, stream);
        }
        if version >= 2 {
            let count = r.u32("retired count")?;
            for _ in 0..count {
                let group = r.u64("retired group")?;
                let incarnation = r.u64("retired incarnation")?;
                let live = state.live_incarnation(group).is_some();
                if !matches!(GroupId(group).kind(), wire::group::GroupKind::Partition(_))
                    || live
                    || incarnation >= state.next_consensus_group_id
                    || state
                        .retired
                        .keys()
                        .next_back()
                        .is_some_and(|l| *l >= group)
                {
                    return Err(SnapshotError::Content(
                        "retired groups not ascending, live, or ahead of the counter",
                    ));
                }
                state.retired.insert(group, incarnation);
            }
        }
        // A snapshot written before the consumer-group section ends here: no groups.
        if version >= 4 || r.remaining() > 0 {
            super::groups::decode_section(&mut r, &mut state, version)?;
        }
        // A snapshot written before the accounts section ends here.
        if r.remaining() > 0 {
            let count = r.u32("account count")?;
            for _ in 0..count {
                let id = r.u32("account user id")?;
                let account = Account::read(&mut r)?;
                if !state.users.contains_key(&id) {
                    return Err(SnapshotError::Content("account of an unknown user"));
                }
                if state
                    .accounts
                    .keys()
                    .next_back()
                    .is_some_and(|last| *last >= id)
                {
                    return Err(SnapshotError::Content("account ids not ascending"));
                }
                state.accounts.insert(id, account);
            }
        }
        // Older versions end before the origins: their sessions have none.
        if version >= 3 {
            super::sessions::decode_section(&mut r, &mut state)?;
        }
        r.finish()?;
        if group_ids
            .last()
            .is_some_and(|max| state.next_consensus_group_id <= *max)
        {
            return Err(SnapshotError::Content(
                "group id counter behind its partitions",
            ));
        }
        Ok(state)
    }
}

fn decode_topic(r: &mut Reader<'_>, group_ids: &mut BTreeSet<u64>) -> Result<Topic, SnapshotError> {
    let id = r.u32("topic id")?;
    let created_at = r.u64("created_at")?;
    let name = Name::read(r, "topic name")?;
    let explicit = Options::read_prefixed(r)?;
    let derived = Options::read_prefixed(r)?;
    let settings = topic::resolve(&explicit, &derived)
        .map_err(|_| SnapshotError::Content("topic options do not resolve"))?;
    let count = r.u32("partition count")?;
    if count > PARTITIONS_PER_TOPIC_MAX {
        return Err(SnapshotError::Content("too many partitions"));
    }
    let mut partitions = Vec::with_capacity(count as usize);
    for id in 0..count {
        let created_at = r.u64("partition created_at")?;
        let consensus_group_id = r.u64("consensus_group_id")?;
        if !group_ids.insert(consensus_group_id) {
            return Err(SnapshotError::Content("duplicate group id"));
        }
        partitions.push(Partition {
            id,
            created_at,
            consensus_group_id,
        });
    }
    Ok(Topic {
        id,
        name,
        created_at,
        explicit,
        derived,
        settings,
        partitions,
    })
}

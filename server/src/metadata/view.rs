//! The read handle on committed metadata, for every shard without a lock.
//!
//! The metadata state machine runs on shard 0 and is the only writer. After every applied op
//! that changed something it publishes an immutable [`MetadataView`] (an `Arc` of the whole
//! state) into an `ArcSwap`; readers on any shard `load()` the current `Arc` (a few atomic
//! operations, no lock, never blocked by the writer) and keep reading that version for as
//! long as they hold it. A reader therefore always sees one committed state as a whole, never
//! half of an op, and possibly an older one than shard 0 has applied: answers from the view
//! are "as of some committed op", which is what a non-replicated read may give.
//!
//! Sessions live in the consensus core's client table (consensus.md §12), not in this state
//! machine (Register and Logout never reach `apply`). The driver of the metadata replica
//! publishes them beside the view with [`MetadataHandle::publish_sessions`] whenever a
//! Register or Logout commits, from the same committed table on every replica.
//!
//! Copying the whole state per publish costs O(metadata) per metadata op; metadata ops are
//! rare (streams, topics, users), reads are per request, so the trade favours readers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::{ArcSwap, Guard};
use wire::GroupId;

use super::state::{State, Stream, Topic, User};
use crate::client::codec::{Identifier, Partitioning};
use crate::client::reply::{
    PartitionRecord, StreamDetails, StreamRecord, TopicDetails, TopicRecord,
};
use crate::client::status;

/// One committed version of the metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataView {
    /// The last op applied into this version.
    pub op: u64,
    /// The state.
    pub state: State,
}

/// A login known to the committed client table: the session number and its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// The session (the Register's commit op).
    pub session: u64,
    /// The user it authenticated.
    pub user_id: u32,
}

/// Committed sessions by client id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sessions {
    /// The metadata op these sessions are current at.
    pub op: u64,
    /// Sessions by client id.
    pub by_client: BTreeMap<u128, Session>,
}

impl Sessions {
    /// The sessions of a committed client table at `op`, from
    /// `consensus::Replica::sessions()`: `(client, session, user_id)`.
    pub fn from_table(op: u64, table: impl IntoIterator<Item = (u128, u64, u32)>) -> Sessions {
        Sessions {
            op,
            by_client: table
                .into_iter()
                .map(|(client, session, user_id)| (client, Session { session, user_id }))
                .collect(),
        }
    }

    /// The user of a request that carries `(client, session)`, if that login is current.
    pub fn user(&self, client: u128, session: u64) -> Option<u32> {
        self.by_client
            .get(&client)
            .filter(|s| s.session == session && session != 0)
            .map(|s| s.user_id)
    }
}

/// The shared cell readers load from and the metadata shard publishes into.
#[derive(Debug, Default)]
pub struct MetadataHandle {
    view: ArcSwap<MetadataView>,
    sessions: ArcSwap<Sessions>,
    /// Set while the view may lag what this node applied in an earlier process life
    /// (decision 397): a node's handle starts so ([`MetadataHandle::await_catch_up`]) and its
    /// metadata pump clears it once the replica caught up with a primary it heard from in this
    /// life. A handle no metadata replica feeds (tests that publish views by hand) never waits.
    awaiting_catch_up: AtomicBool,
}

/// A cheap, cloneable reader of the committed metadata, for any shard.
#[derive(Debug, Clone, Default)]
pub struct MetadataReader(Arc<MetadataHandle>);

impl MetadataReader {
    /// A reader of `handle`.
    pub fn new(handle: Arc<MetadataHandle>) -> MetadataReader {
        MetadataReader(handle)
    }
    /// The current committed view (lock-free; hold the guard only for one request).
    pub fn view(&self) -> Guard<Arc<MetadataView>> {
        self.0.view.load()
    }
    /// The current committed sessions.
    pub fn sessions(&self) -> Guard<Arc<Sessions>> {
        self.0.sessions.load()
    }
    /// Whether the view has caught up in this process life (decision 397): partition pumps
    /// boot no group before, since a view behind a purge or delete this node applied before
    /// a crash would boot the dead incarnation from the disk.
    pub fn caught_up(&self) -> bool {
        !self.0.awaiting_catch_up.load(Ordering::Acquire)
    }
}

impl MetadataHandle {
    /// Replaces the published view (the state machine calls this after an apply).
    pub fn publish(&self, view: MetadataView) {
        self.view.store(Arc::new(view));
    }
    /// Replaces the published sessions (the metadata replica's driver calls this when a
    /// Register or Logout commits).
    pub fn publish_sessions(&self, sessions: Sessions) {
        self.sessions.store(Arc::new(sessions));
    }
    /// Marks the view as not caught up yet (a node does this before its shards start).
    pub fn await_catch_up(&self) {
        self.awaiting_catch_up.store(true, Ordering::Release);
    }
    /// The metadata replica caught up (published after the view it caught up to, so a reader
    /// that sees this sees that view or a later one).
    pub fn set_caught_up(&self) {
        self.awaiting_catch_up.store(false, Ordering::Release);
    }
}

/// A resolved topic: its stream and itself.
#[derive(Debug, Clone, Copy)]
pub struct TopicRef<'a> {
    /// The stream.
    pub stream: &'a Stream,
    /// The topic.
    pub topic: &'a Topic,
}

impl MetadataView {
    /// The stream named by `id`, or the not-found code of its kind (1009 / 1010).
    pub fn stream(&self, id: &Identifier) -> Result<&Stream, u32> {
        match id {
            Identifier::Numeric(n) => self.state.streams.get(n).ok_or(status::STREAM_ID_NOT_FOUND),
            Identifier::Named(name) => self
                .state
                .stream_by_name(name.as_str())
                .ok_or(status::STREAM_NAME_NOT_FOUND),
        }
    }

    /// The topic named by `stream` and `topic`, or the first not-found code (1009/1010,
    /// 2010/2011).
    pub fn topic(&self, stream: &Identifier, topic: &Identifier) -> Result<TopicRef<'_>, u32> {
        let stream = self.stream(stream)?;
        let topic = match topic {
            Identifier::Numeric(n) => stream.topics.get(n).ok_or(status::TOPIC_ID_NOT_FOUND),
            Identifier::Named(name) => stream
                .topic_by_name(name.as_str())
                .ok_or(status::TOPIC_NAME_NOT_FOUND),
        }?;
        Ok(TopicRef { stream, topic })
    }

    /// The user named `username`.
    pub fn user(&self, username: &str) -> Option<&User> {
        self.state.user_by_name(username)
    }

    /// Checks a username and password against the committed users: the user id, or `None`
    /// for an unknown user or a wrong password (the caller evicts with reason 9 either way,
    /// so the answer does not tell which). Costs one Argon2id evaluation even for an unknown
    /// user only when the caller pays it; callers on a hot shard should rate-limit logins.
    pub fn authenticate(&self, username: &str, password: &str) -> Option<u32> {
        let user = self.user(username)?;
        user.password.verify(password).then_some(user.id)
    }

    /// Streams, topics and partitions in the state (for GetStats).
    pub fn counts(&self) -> (u32, u32, u32) {
        let mut topics = 0u32;
        let mut partitions = 0u32;
        for s in self.state.streams.values() {
            topics += s.topics.len() as u32;
            for t in s.topics.values() {
                partitions += t.partitions.len() as u32;
            }
        }
        (self.state.streams.len() as u32, topics, partitions)
    }

    /// Every stream record (GetStreams), in id order. Sizes and counts are the metadata's
    /// own (zero): the partition planes hold the message figures.
    pub fn stream_records(&self) -> Vec<StreamRecord> {
        self.state.streams.values().map(stream_record).collect()
    }

    /// The GetStream payload of a stream.
    pub fn stream_details(&self, stream: &Stream) -> StreamDetails {
        StreamDetails {
            stream: stream_record(stream),
            topics: stream.topics.values().map(topic_record).collect(),
        }
    }
}

/// The GetTopic payload of a topic (partition figures zero: see [`MetadataView::stream_records`]).
pub fn topic_details(topic: &Topic) -> TopicDetails {
    TopicDetails {
        topic: topic_record(topic),
        partitions: topic
            .partitions
            .iter()
            .map(|p| PartitionRecord {
                id: p.id,
                created_at: p.created_at,
                segments_count: 0,
                current_offset: 0,
                size_bytes: 0,
                messages_count: 0,
            })
            .collect(),
    }
}

/// The record of a stream.
pub fn stream_record(stream: &Stream) -> StreamRecord {
    StreamRecord {
        id: stream.id,
        created_at: stream.created_at,
        topics_count: stream.topics.len() as u32,
        size_bytes: 0,
        messages_count: 0,
        name: stream.name.clone(),
        options: Default::default(),
    }
}

/// The record of a topic.
pub fn topic_record(topic: &Topic) -> TopicRecord {
    TopicRecord {
        id: topic.id,
        created_at: topic.created_at,
        partitions_count: topic.partitions.len() as u32,
        message_expiry: topic.settings.message_expiry,
        compression_algorithm: topic.settings.compression_algorithm,
        max_topic_size: topic.settings.max_topic_size,
        size_bytes: 0,
        messages_count: 0,
        name: topic.name.clone(),
        explicit: topic.explicit.clone(),
        derived: topic.derived.clone(),
    }
}

impl TopicRef<'_> {
    /// The partition a SendMessages goes to (client-plane.md §5): an explicit id must exist
    /// (3007); a key picks `XXH32(key, seed 0) mod partitions`; balanced takes `round_robin
    /// mod partitions`, where `round_robin` is the caller's per-topic counter (not replicated:
    /// any spread is correct). A topic without partitions has none to give (3007).
    pub fn partition_for(&self, partitioning: &Partitioning, round_robin: u64) -> Result<u32, u32> {
        let count = self.topic.partitions.len() as u32;
        if count == 0 {
            return Err(status::PARTITION_NOT_FOUND);
        }
        match partitioning {
            Partitioning::Partition(id) if *id < count => Ok(*id),
            Partitioning::Partition(_) => Err(status::PARTITION_NOT_FOUND),
            Partitioning::Key(key) => Ok(xxhash_rust::xxh32::xxh32(key, 0) % count),
            Partitioning::Balanced => Ok((round_robin % u64::from(count)) as u32),
        }
    }

    /// The consensus group of partition `partition`, or 3007.
    pub fn group(&self, partition: u32) -> Result<GroupId, u32> {
        if partition >= self.topic.partitions.len() as u32 {
            return Err(status::PARTITION_NOT_FOUND);
        }
        self.topic
            .group(self.stream.id, partition)
            .ok_or(status::PARTITION_NOT_FOUND)
    }

    /// The shard of this node that runs partition `partition`'s group (`shard::mapping`:
    /// `lane(group) mod shards`); the answer depends on the node's shard count, which is
    /// why it is computed on lookup and never stored in the replicated state.
    pub fn shard(&self, partition: u32, lanes: u16, shards: u16) -> Result<u16, u32> {
        Ok(shard::mapping::shard_of(
            self.group(partition)?,
            lanes,
            shards,
        ))
    }
}

//! Consumer groups (client-plane.md §10; decisions 315-321): the replicated groups of each
//! topic, their members, the partition assignment and the generation, and the snapshot
//! section that carries them.
//!
//! Members are keyed by the client id of the session that joined (the prepare's `client`):
//! the client table holds one session per client id, and the SDK draws a new id for every
//! login and every reconnect, so a client id names exactly one session. Everything here is
//! a function of committed prepares: a member's id is its group's counter at the join, the
//! generation moves by one at every change of the member set, and the assignment is computed
//! from the member set and the topic's partition count whenever it is read, so every replica
//! (and every shard reading the published view) computes the same one.

use std::collections::BTreeMap;

#[cfg(test)]
#[path = "groups_tests.rs"]
mod tests;

use super::state::{SnapshotError, State};
use super::view::MetadataView;
use crate::client::codec::{Identifier, Name, Reader};
use crate::client::request::OffsetTarget;

/// ConsumerGroupIdNotFound.
pub const GROUP_ID_NOT_FOUND: u32 = 5000;
/// ConsumerGroupNameNotFound.
pub const GROUP_NAME_NOT_FOUND: u32 = 5003;
/// ConsumerGroupNameAlreadyExists.
pub const GROUP_NAME_ALREADY_EXISTS: u32 = 5004;
/// ConsumerGroupMemberNotFound.
pub const MEMBER_NOT_FOUND: u32 = 5006;
/// ConsumerGroupPartitionNotOwned: a member polled a partition assigned to another member.
pub const PARTITION_NOT_OWNED: u32 = 5009;

/// Groups per topic, the highest id a group may take.
pub const GROUP_ID_MAX: u32 = u32::MAX - 1;

/// The first offset key the replicated counter hands out (decision 390). Keys below it are
/// legacy keys, equal to the group's id: groups of snapshots before version 4 and of
/// CreateConsumerGroup prepares without [`KEY_TAG`] (an older build's primary). Ids are the
/// lowest free, so a legacy key stays far below this unless 2^31 groups of one topic lived
/// at once; the two ranges never meet.
pub const GROUP_KEY_BASE: u32 = 1 << 31;

/// The prefix the primary writes before a CreateConsumerGroup prepare's body (decision 391):
/// the group's offset key comes from the replicated counter.
pub const KEY_TAG: [u8; 4] = *b"SGK1";

/// A consumer group of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroup {
    /// Id, 0-based within its topic (the lowest free at creation); reused after a delete.
    pub id: u32,
    /// The key its consumer offsets are stored under in the partitions (decision 390):
    /// never reused, unlike the id.
    pub key: u32,
    /// Name, unique within its topic.
    pub name: Name,
    /// Moves by one at every change of the member set (join, leave, session end).
    pub generation: u64,
    /// The id the next member gets.
    pub next_member_id: u32,
    /// Member id → the client id of its session, in join order.
    pub members: BTreeMap<u32, u128>,
}

/// The groups of one topic by id.
pub type TopicGroups = BTreeMap<u32, ConsumerGroup>;

impl ConsumerGroup {
    /// A new group with no members.
    pub fn new(id: u32, key: u32, name: Name) -> ConsumerGroup {
        ConsumerGroup {
            id,
            key,
            name,
            generation: 0,
            next_member_id: 0,
            members: BTreeMap::new(),
        }
    }

    /// The member id of `client`'s session.
    pub fn member_of(&self, client: u128) -> Option<u32> {
        self.members
            .iter()
            .find(|(_, c)| **c == client)
            .map(|(id, _)| *id)
    }

    /// Adds `client` (a no-op for a member already in). Returns whether the set changed.
    pub fn join(&mut self, client: u128) -> bool {
        if self.member_of(client).is_some() {
            return false;
        }
        let id = self.next_member_id;
        self.next_member_id = self.next_member_id.wrapping_add(1);
        self.members.insert(id, client);
        self.generation += 1;
        true
    }

    /// Removes `client`. Returns whether the set changed.
    pub fn leave(&mut self, client: u128) -> bool {
        match self.member_of(client) {
            Some(id) => {
                self.members.remove(&id);
                self.generation += 1;
                true
            }
            None => false,
        }
    }

    /// The partitions of each member, in member-id order: partition `p` goes to the member at
    /// index `p mod members` (so shares differ by at most one and a change of the member set
    /// moves as few partitions as the round robin allows).
    pub fn assignment(&self, partitions: u32) -> Vec<(u32, Vec<u32>)> {
        let n = self.members.len();
        let mut out: Vec<(u32, Vec<u32>)> =
            self.members.keys().map(|id| (*id, Vec::new())).collect();
        if n == 0 {
            return out;
        }
        for p in 0..partitions {
            out[p as usize % n].1.push(p);
        }
        out
    }

    /// The partitions assigned to `client`, or `None` when it is not a member.
    pub fn partitions_of(&self, client: u128, partitions: u32) -> Option<Vec<u32>> {
        let member = self.member_of(client)?;
        self.assignment(partitions)
            .into_iter()
            .find(|(id, _)| *id == member)
            .map(|(_, p)| p)
    }

    /// The group record (GetConsumerGroups, one per group): `id u32, partitions_count u32,
    /// members_count u32, name`.
    pub fn encode_record(&self, partitions: u32, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&partitions.to_le_bytes());
        out.extend_from_slice(&(self.members.len() as u32).to_le_bytes());
        self.name.write(out);
    }

    /// The group details (Create, GetConsumerGroup): the record, then per member `id u32,
    /// n u32, n × partition u32`.
    pub fn encode_details(&self, partitions: u32, out: &mut Vec<u8>) {
        self.encode_record(partitions, out);
        for (id, assigned) in self.assignment(partitions) {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&(assigned.len() as u32).to_le_bytes());
            for p in assigned {
                out.extend_from_slice(&p.to_le_bytes());
            }
        }
    }

    /// The SyncConsumerGroup answer for `client`: `generation u64, n u32, n × partition u32`,
    /// or `None` (an empty body) when it is not a member.
    pub fn encode_sync(&self, client: u128, partitions: u32) -> Option<Vec<u8>> {
        let assigned = self.partitions_of(client, partitions)?;
        let mut out = Vec::with_capacity(12 + 4 * assigned.len());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&(assigned.len() as u32).to_le_bytes());
        for p in assigned {
            out.extend_from_slice(&p.to_le_bytes());
        }
        Some(out)
    }
}

/// The group named by `id` among `groups`, or the not-found code of its kind.
pub fn find<'a>(
    groups: Option<&'a TopicGroups>,
    id: &Identifier,
) -> Result<&'a ConsumerGroup, u32> {
    match id {
        Identifier::Numeric(n) => groups.and_then(|g| g.get(n)).ok_or(GROUP_ID_NOT_FOUND),
        Identifier::Named(name) => groups
            .and_then(|g| g.values().find(|g| g.name == *name))
            .ok_or(GROUP_NAME_NOT_FOUND),
    }
}

/// A topic's groups resolved against committed metadata.
#[derive(Debug, Clone, Copy)]
pub struct TopicGroupsRef<'a> {
    /// (stream id, topic id).
    pub key: (u32, u32),
    /// The topic's partition count.
    pub partitions: u32,
    /// Its groups, if it has any.
    pub groups: Option<&'a TopicGroups>,
}

/// A group resolved against committed metadata.
#[derive(Debug, Clone, Copy)]
pub struct GroupRef<'a> {
    /// The stream id.
    pub stream: u32,
    /// The topic id.
    pub topic: u32,
    /// The topic's partition count.
    pub partitions: u32,
    /// The group.
    pub group: &'a ConsumerGroup,
}

impl MetadataView {
    /// The groups of a topic, with its (stream, topic) ids and partition count, or the
    /// stream's or topic's not-found code.
    pub fn topic_groups(
        &self,
        stream: &Identifier,
        topic: &Identifier,
    ) -> Result<TopicGroupsRef<'_>, u32> {
        let found = self.topic(stream, topic)?;
        let key = (found.stream.id, found.topic.id);
        Ok(TopicGroupsRef {
            key,
            partitions: found.topic.partitions.len() as u32,
            groups: self.state.consumer_groups.get(&key),
        })
    }

    /// The group named by stream, topic and group identifiers, or the first not-found code.
    pub fn consumer_group(
        &self,
        stream: &Identifier,
        topic: &Identifier,
        group: &Identifier,
    ) -> Result<GroupRef<'_>, u32> {
        let found = self.topic_groups(stream, topic)?;
        Ok(GroupRef {
            stream: found.key.0,
            topic: found.key.1,
            partitions: found.partitions,
            group: find(found.groups, group)?,
        })
    }
}

impl State {
    /// Removes `client` from every group it is a member of. Returns whether anything changed.
    pub fn remove_member_everywhere(&mut self, client: u128) -> bool {
        let mut changed = false;
        for groups in self.consumer_groups.values_mut() {
            for group in groups.values_mut() {
                changed |= group.leave(client);
            }
        }
        changed
    }

    /// Drops the groups of topics that no longer exist (after a stream or topic is deleted).
    pub fn retain_live_groups(&mut self) {
        let streams = &self.streams;
        self.consumer_groups.retain(|(s, t), groups| {
            !groups.is_empty() && streams.get(s).is_some_and(|s| s.topics.contains_key(t))
        });
    }
}

/// Resolves a consumer-group offset target's group and names it by its offset key from then
/// on (decisions 319, 390), so a group's offsets have one key whether the client names it by
/// id or name, and a later group that reuses the id starts with none. `Err` is the first
/// not-found code.
pub fn consumer_of_group(view: &MetadataView, target: &mut OffsetTarget) -> Result<(), u32> {
    let found = view.consumer_group(&target.stream, &target.topic, &target.consumer.id)?;
    target.consumer.id = Identifier::Numeric(found.group.key);
    Ok(())
}

/// The group of a topic whose offset key is `key` (5000 when none: the group was deleted
/// since the request was routed).
pub fn find_by_key(groups: Option<&TopicGroups>, key: u32) -> Result<&ConsumerGroup, u32> {
    groups
        .and_then(|g| g.values().find(|g| g.key == key))
        .ok_or(GROUP_ID_NOT_FOUND)
}

/// The member fence of a consumer-group poll (decision 320): `client` must be a member of
/// the group (named by its offset key after [`consumer_of_group`]) and `partition` one of
/// its assigned partitions; otherwise 5006 (the SDK's consumer rejoins) or 5009 (the SDK
/// re-syncs its assignment and polls again).
pub fn poll_fence(
    view: &MetadataView,
    stream: &Identifier,
    topic: &Identifier,
    key: u32,
    client: u128,
    partition: u32,
) -> Result<(), u32> {
    let found = view.topic_groups(stream, topic)?;
    let assigned = find_by_key(found.groups, key)?
        .partitions_of(client, found.partitions)
        .ok_or(MEMBER_NOT_FOUND)?;
    if !assigned.contains(&partition) {
        return Err(PARTITION_NOT_OWNED);
    }
    Ok(())
}

/// The SyncConsumerGroup answer for `client`: empty when the group does not exist or the
/// client is not a member (§10).
pub fn sync_answer(
    view: &MetadataView,
    target: &crate::client::groups::GroupTarget,
    client: u128,
) -> Vec<u8> {
    view.consumer_group(&target.stream, &target.topic, &target.group)
        .ok()
        .and_then(|found| found.group.encode_sync(client, found.partitions))
        .unwrap_or_default()
}

impl State {
    /// The offset key the next counter-keyed group gets, if the counter is not exhausted.
    pub fn next_group_key(&self) -> Option<u32> {
        (self.group_keys_issued < GROUP_KEY_BASE).then(|| GROUP_KEY_BASE + self.group_keys_issued)
    }
}

/// A CreateConsumerGroup prepare body with [`KEY_TAG`] (what the primary replicates).
pub fn keyed_create_body(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(KEY_TAG.len() + body.len());
    out.extend_from_slice(&KEY_TAG);
    out.extend_from_slice(body);
    out
}

/// Splits a committed CreateConsumerGroup body: whether it carries [`KEY_TAG`], and the
/// client's body. A client body starts with an Identifier's kind byte (1 or 2), so it never
/// starts with the tag.
pub fn split_create_body(body: &[u8]) -> (bool, &[u8]) {
    match body.strip_prefix(&KEY_TAG) {
        Some(rest) => (true, rest),
        None => (false, body),
    }
}

/// The lowest group id free among `groups`.
pub fn free_group_id(groups: Option<&TopicGroups>) -> Option<u32> {
    match groups {
        Some(g) => super::state::lowest_free(g.keys(), GROUP_ID_MAX),
        None => Some(0),
    }
}

// ---- the snapshot section ---------------------------------------------------------------

/// Appends the consumer-group section: `u32 keys_issued` (version 4), `u32 topics`, then per
/// topic `stream u32, topic u32, u32 groups`, per group `id u32, key u32` (version 4),
/// `name, generation u64, next_member_id u32, u32 members`, per member `id u32, client
/// u128`. Everything in key order.
pub fn encode_section(state: &State, out: &mut Vec<u8>, version: u8) {
    let keyed = version >= 4;
    if keyed {
        out.extend_from_slice(&state.group_keys_issued.to_le_bytes());
    }
    out.extend_from_slice(&(state.consumer_groups.len() as u32).to_le_bytes());
    for ((stream, topic), groups) in &state.consumer_groups {
        out.extend_from_slice(&stream.to_le_bytes());
        out.extend_from_slice(&topic.to_le_bytes());
        out.extend_from_slice(&(groups.len() as u32).to_le_bytes());
        for group in groups.values() {
            out.extend_from_slice(&group.id.to_le_bytes());
            if keyed {
                out.extend_from_slice(&group.key.to_le_bytes());
            }
            group.name.write(out);
            out.extend_from_slice(&group.generation.to_le_bytes());
            out.extend_from_slice(&group.next_member_id.to_le_bytes());
            out.extend_from_slice(&(group.members.len() as u32).to_le_bytes());
            for (id, client) in &group.members {
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&client.to_le_bytes());
            }
        }
    }
}

fn ascending<K: Ord + Copy, V>(map: &BTreeMap<K, V>, key: K) -> bool {
    map.keys().next_back().is_none_or(|last| *last < key)
}

/// Reads the consumer-group section of a snapshot of `version` into `state` (streams and
/// topics already decoded), checking what `apply` keeps: keys ascending, topics that exist,
/// names unique per topic, member ids below the group's counter, client ids unique and
/// non-zero per group, and offset keys unique per topic, each either its group's id below
/// [`GROUP_KEY_BASE`] (legacy) or one the counter issued. Before version 4 there are no keys
/// in the section: every group's key is its id and the counter has issued none.
pub fn decode_section(
    r: &mut Reader<'_>,
    state: &mut State,
    version: u8,
) -> Result<(), SnapshotError> {
    let keyed = version >= 4;
    if keyed {
        state.group_keys_issued = r.u32("group keys issued")?;
        if state.group_keys_issued > GROUP_KEY_BASE {
            return Err(SnapshotError::Content("group key counter out of range"));
        }
    }
    let topics = r.u32("group topic count")?;
    for _ in 0..topics {
        let stream = r.u32("group stream")?;
        let topic = r.u32("group topic")?;
        if !ascending(&state.consumer_groups, (stream, topic)) {
            return Err(SnapshotError::Content("group topics not ascending"));
        }
        if !state
            .streams
            .get(&stream)
            .is_some_and(|s| s.topics.contains_key(&topic))
        {
            return Err(SnapshotError::Content(
                "groups of a topic that does not exist",
            ));
        }
        let count = r.u32("group count")?;
        if count == 0 {
            return Err(SnapshotError::Content("empty group list"));
        }
        let mut groups = TopicGroups::new();
        // Offsets live per partition, so keys must differ within a topic (issued ones are
        // unique everywhere; legacy ones, the ids, only per topic).
        let mut keys = std::collections::BTreeSet::new();
        for _ in 0..count {
            let id = r.u32("group id")?;
            let key = if keyed { r.u32("group key")? } else { id };
            let issued = key >= GROUP_KEY_BASE && key - GROUP_KEY_BASE < state.group_keys_issued;
            if !(issued || key == id && key < GROUP_KEY_BASE) || !keys.insert(key) {
                return Err(SnapshotError::Content(
                    "group key reused, not issued, or a legacy key not its id",
                ));
            }
            let name = Name::read(r, "group name")?;
            let generation = r.u64("generation")?;
            let next_member_id = r.u32("next_member_id")?;
            if id > GROUP_ID_MAX || !ascending(&groups, id) {
                return Err(SnapshotError::Content("group ids not ascending"));
            }
            if groups.values().any(|g| g.name == name) {
                return Err(SnapshotError::Content("duplicate group name"));
            }
            let mut group = ConsumerGroup {
                id,
                key,
                name,
                generation,
                next_member_id,
                members: BTreeMap::new(),
            };
            let members = r.u32("member count")?;
            for _ in 0..members {
                let member = r.u32("member id")?;
                let client = u128::from_le_bytes(r.array::<16>("member client")?);
                if !ascending(&group.members, member) || member >= next_member_id {
                    return Err(SnapshotError::Content("member ids out of order"));
                }
                if client == 0 || group.member_of(client).is_some() {
                    return Err(SnapshotError::Content("member client zero or twice"));
                }
                group.members.insert(member, client);
            }
            groups.insert(id, group);
        }
        state.consumer_groups.insert((stream, topic), groups);
    }
    Ok(())
}

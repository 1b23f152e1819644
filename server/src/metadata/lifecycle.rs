//! Stream and topic lifecycle in the metadata state machine (decisions 340-343): UpdateStream,
//! UpdateTopic, DeleteTopic, CreatePartitions, DeletePartitions. Every rule is checked twice,
//! by the primary's preflight and by every replica's apply, against the applied state; a
//! rejection is a deterministic no-op whose code rides the reply's result section.
//!
//! PurgeStream and PurgeTopic re-incarnate every partition they cover (decision 346): each
//! keeps its id, key and creation time and takes a new `consensus_group_id`, so every node
//! removes the old incarnation's group and files (decision 342) and boots the key again empty.

use crate::client::codec::Options;
use crate::client::lifecycle::Lifecycle;
use crate::client::reply::RESULT_OK;
use crate::client::status;
use wire::header::PrepareHeader;

use super::MetadataStateMachine;
use super::state::{PARTITIONS_PER_TOPIC_MAX, Partition};
use super::topic;
use crate::partition::lifecycle::incarnation_tag;

/// The topic option keys UpdateTopic may patch (the SDK's updatable catalogue).
pub const UPDATABLE_TOPIC_KEYS: [&str; 3] =
    ["compression_algorithm", "max_topic_size", "message_expiry"];

/// A topic's options after an update: `patch`'s keys replace their explicit value (and leave
/// the derived defaults); every other key keeps its value. Returns `(explicit, derived)`.
pub fn patch_options(
    explicit: &Options,
    derived: &Options,
    patch: &Options,
) -> Result<(Options, Options), u32> {
    if patch
        .0
        .keys()
        .any(|k| !UPDATABLE_TOPIC_KEYS.contains(&k.as_str()))
    {
        return Err(status::UNSUPPORTED_OPTION_KEY);
    }
    let mut explicit = explicit.clone();
    let mut derived = derived.clone();
    for (key, value) in &patch.0 {
        derived.0.remove(key);
        explicit.0.insert(key.clone(), value.clone());
    }
    topic::resolve(&explicit, &derived)?;
    Ok((explicit, derived))
}

/// The new incarnation of a partition whose incarnation is `old`, from the counter `next`:
/// `next`, or `next + 1` when `next`'s wire tag would repeat `old`'s, so a node that lags one
/// purge never takes the new incarnation's frames for its own (decision 375); a create that
/// reuses a retired key does the same with the retired incarnation (decision 396). 1 (error)
/// past `u64::MAX`.
pub(super) fn next_incarnation(old: u64, next: u64) -> Result<u64, u32> {
    if incarnation_tag(next) == incarnation_tag(old) {
        next.checked_add(1).ok_or(status::ERROR)
    } else {
        Ok(next)
    }
}

/// The counter after new incarnations of `partitions` (in order) from `next`; 1 (error) if it
/// would overflow, checked before anything changes so a refused purge is a no-op.
fn reincarnation_ids<'a>(
    next: u64,
    partitions: impl IntoIterator<Item = &'a Partition>,
) -> Result<u64, u32> {
    let mut next = next;
    for partition in partitions {
        let id = next_incarnation(partition.consensus_group_id, next)?;
        next = id.checked_add(1).ok_or(status::ERROR)?;
    }
    Ok(next)
}

/// A purge (decision 346): every partition keeps its id, key and creation time and takes the
/// next incarnation. The key stays live, so it is not retired: "live with a later
/// incarnation" is what proves the old one dead to every node (`partition::lifecycle`).
/// Returns the counter after them.
fn reincarnate(partitions: &mut [Partition], next: u64) -> Result<u64, u32> {
    let after = reincarnation_ids(next, partitions.iter())?;
    let mut next = next;
    for partition in partitions.iter_mut() {
        let id = next_incarnation(partition.consensus_group_id, next)?;
        partition.consensus_group_id = id;
        next = id + 1;
    }
    debug_assert_eq!(next, after);
    Ok(after)
}

impl MetadataStateMachine {
    /// The business checks of a lifecycle command against the applied state.
    pub(super) fn check_lifecycle(&self, request: &Lifecycle) -> Result<(), u32> {
        let view = &self.view;
        match request {
            Lifecycle::UpdateStream {
                stream,
                name,
                options,
            } => {
                let found = view.stream(stream)?;
                if !options.is_empty() {
                    return Err(status::UNSUPPORTED_OPTION_KEY);
                }
                if view
                    .state
                    .stream_by_name(name.as_str())
                    .is_some_and(|s| s.id != found.id)
                {
                    return Err(status::STREAM_NAME_ALREADY_EXISTS);
                }
            }
            Lifecycle::UpdateTopic {
                stream,
                topic,
                name,
                options,
            } => {
                let found = view.topic(stream, topic)?;
                if found
                    .stream
                    .topic_by_name(name.as_str())
                    .is_some_and(|t| t.id != found.topic.id)
                {
                    return Err(status::TOPIC_NAME_ALREADY_EXISTS);
                }
                patch_options(&found.topic.explicit, &found.topic.derived, options)?;
            }
            Lifecycle::DeleteTopic { stream, topic } => {
                view.topic(stream, topic)?;
            }
            Lifecycle::CreatePartitions {
                stream,
                topic,
                count,
            } => {
                let found = view.topic(stream, topic)?;
                if *count == 0 {
                    return Err(status::INVALID_PARTITIONS_COUNT);
                }
                let total = (found.topic.partitions.len() as u64).saturating_add(u64::from(*count));
                if total > u64::from(PARTITIONS_PER_TOPIC_MAX) {
                    return Err(status::TOO_MANY_PARTITIONS);
                }
            }
            Lifecycle::DeletePartitions {
                stream,
                topic,
                count,
            } => {
                let found = view.topic(stream, topic)?;
                if *count == 0 || *count as usize > found.topic.partitions.len() {
                    return Err(status::INVALID_PARTITIONS_COUNT);
                }
            }
            Lifecycle::PurgeStream(stream) => {
                let found = view.stream(stream)?;
                let partitions = found.topics.values().flat_map(|t| t.partitions.iter());
                reincarnation_ids(view.state.next_consensus_group_id, partitions)?;
            }
            Lifecycle::PurgeTopic { stream, topic } => {
                let found = view.topic(stream, topic)?;
                reincarnation_ids(
                    view.state.next_consensus_group_id,
                    found.topic.partitions.iter(),
                )?;
            }
        }
        Ok(())
    }

    /// Applies a checked lifecycle command: the reply's result section (success, empty
    /// payload) or the refusal code.
    pub(super) fn apply_lifecycle(
        &mut self,
        header: &PrepareHeader,
        request: Lifecycle,
    ) -> Result<Vec<u8>, u32> {
        self.check(
            &crate::client::request::Request::Lifecycle(request.clone()),
            header.user_id.get(),
        )?;
        let (stream_id, topic_id) = match &request {
            Lifecycle::UpdateStream { stream, .. } | Lifecycle::PurgeStream(stream) => {
                (self.view.stream(stream)?.id, None)
            }
            Lifecycle::UpdateTopic { stream, topic, .. }
            | Lifecycle::DeleteTopic { stream, topic }
            | Lifecycle::PurgeTopic { stream, topic }
            | Lifecycle::CreatePartitions { stream, topic, .. }
            | Lifecycle::DeletePartitions { stream, topic, .. } => {
                let found = self.view.topic(stream, topic)?;
                (found.stream.id, Some(found.topic.id))
            }
        };
        let state = &mut self.view.state;
        let stream = state.streams.get_mut(&stream_id).expect("resolved above");
        match request {
            Lifecycle::UpdateStream { name, .. } => stream.name = name,
            Lifecycle::DeleteTopic { .. } => {
                if let Some(topic) = stream.topics.remove(&topic_id.expect("a topic command")) {
                    state.retire(stream_id, &topic, 0);
                }
                // The topic's consumer groups go with it (decision 345).
                state.retain_live_groups();
            }
            Lifecycle::UpdateTopic { name, options, .. } => {
                let topic = stream
                    .topics
                    .get_mut(&topic_id.expect("a topic command"))
                    .expect("resolved above");
                let (explicit, derived) = patch_options(&topic.explicit, &topic.derived, &options)?;
                topic.settings = topic::resolve(&explicit, &derived)?;
                topic.explicit = explicit;
                topic.derived = derived;
                topic.name = name;
            }
            Lifecycle::CreatePartitions { count, .. } => {
                let topic = stream
                    .topics
                    .get_mut(&topic_id.expect("a topic command"))
                    .expect("resolved above");
                let mut next = state.next_consensus_group_id;
                let first = topic.partitions.len() as u32;
                let mut added = Vec::with_capacity(count as usize);
                let mut reused = Vec::new();
                for id in first..first + count {
                    // A retired key used again never takes its last incarnation's wire tag
                    // (decision 396).
                    let key = topic.group(stream_id, id).map(|g| g.0);
                    let group = match key.and_then(|k| state.retired.get(&k)) {
                        Some(&old) => next_incarnation(old, next)?,
                        None => next,
                    };
                    reused.extend(key);
                    added.push(Partition {
                        id,
                        created_at: header.timestamp.get(),
                        consensus_group_id: group,
                    });
                    next = group.checked_add(1).ok_or(status::ERROR)?;
                }
                for key in reused {
                    state.retired.remove(&key);
                }
                topic.partitions.extend(added);
                state.next_consensus_group_id = next;
            }
            Lifecycle::DeletePartitions { count, .. } => {
                let topic = stream
                    .topics
                    .get_mut(&topic_id.expect("a topic command"))
                    .expect("resolved above");
                let keep = topic.partitions.len() - count as usize;
                let topic = topic.clone();
                state.retire(stream_id, &topic, keep);
                let live = state
                    .streams
                    .get_mut(&stream_id)
                    .and_then(|s| s.topics.get_mut(&topic.id))
                    .expect("resolved above");
                live.partitions.truncate(keep);
            }
            Lifecycle::PurgeStream(_) => {
                let mut next = state.next_consensus_group_id;
                for topic in stream.topics.values_mut() {
                    next = reincarnate(&mut topic.partitions, next)?;
                }
                state.next_consensus_group_id = next;
            }
            Lifecycle::PurgeTopic { .. } => {
                let topic = stream
                    .topics
                    .get_mut(&topic_id.expect("a topic command"))
                    .expect("resolved above");
                state.next_consensus_group_id =
                    reincarnate(&mut topic.partitions, state.next_consensus_group_id)?;
            }
        }
        Ok(RESULT_OK.to_vec())
    }
}

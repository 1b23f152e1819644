//! The metadata state machine (consensus.md §5.8, §14; client-plane.md §7): users, streams,
//! topics and their partitions, applied from committed metadata prepares on every replica.
//!
//! Determinism: `apply` reads only the prepare (its body, `op`, `timestamp`, `user_id`) and
//! the state built by earlier applies. Ids are the lowest free slot, creation times are the
//! prepare's timestamp, and the partition group-id counter moves only in `apply`. Business
//! rejections (a duplicate name, a missing stream) are deterministic no-ops whose code rides
//! the reply's result section, so every replica computes the same state and the same reply.
//!
//! What never reaches this machine: Register and Logout (the core's client table holds
//! sessions), and consumer offsets, which are partition-plane ops (StoreConsumerOffset 161 is
//! a partition operation, consensus.md §14; CONSUMER_OFFSETS is a partition artifact).
//!
//! Map: [`state`] (the replicated state and its snapshot encoding), [`topic`] (topic
//! options), [`password`] (Argon2id hashes), [`view`] (the lock-free read handle).

pub mod groups;
pub mod lifecycle;
pub mod password;
pub mod sessions;
pub mod state;
pub mod topic;
pub mod users;
pub mod view;

mod user_ops;

#[cfg(test)]
mod lifecycle_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use consensus::{Artifact, InstallError, Projection, WholeArtifacts};
use wire::Operation;
use wire::header::PrepareHeader;
use wire::manifest::ArtifactKind;

use crate::client::codec::{BodyError, Name, Options, Reader};
use crate::client::reply::{RESULT_OK, result_rejected};
use crate::client::request::{self, Request};
use crate::client::status;
use password::{HashParams, PasswordError, PasswordHash, SALT_LEN};
use state::{PARTITIONS_PER_TOPIC_MAX, Partition, State, Stream, Topic, User, free_topic_id};
use view::{MetadataHandle, MetadataReader, MetadataView, topic_details};

/// The root user's id.
pub const ROOT_USER_ID: u32 = 0;
/// Default root username and password (client-plane.md, issue 10).
pub const ROOT_DEFAULT: &str = "iggy";
/// Environment variable that overrides the root username.
pub const ENV_ROOT_USERNAME: &str = "IGGY_ROOT_USERNAME";
/// Environment variable that overrides the root password.
pub const ENV_ROOT_PASSWORD: &str = "IGGY_ROOT_PASSWORD";

/// The root user's credentials as configured. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RootCredentials {
    /// Username (3..=50 bytes, as the SDK enforces).
    pub username: String,
    /// Password (3..=100 bytes).
    password: String,
}

impl std::fmt::Debug for RootCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootCredentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Why the configured root credentials are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootError {
    /// A username outside 3..=50 bytes; `origin` names the config key or variable.
    #[error("{origin}: the root username must be 3 to 50 bytes, found {len}")]
    Username {
        /// Where it came from.
        origin: &'static str,
        /// Its length.
        len: usize,
    },
    /// A password outside 3..=100 bytes (its value is never shown).
    #[error("{origin}: the root password must be 3 to 100 bytes, found {len}")]
    Password {
        /// Where it came from.
        origin: &'static str,
        /// Its length.
        len: usize,
    },
}

impl RootCredentials {
    /// Resolves the root credentials: `IGGY_ROOT_USERNAME` / `IGGY_ROOT_PASSWORD` (read
    /// through `env`) override the config's values, which default to `iggy` / `iggy`.
    /// `config_keys` names where the config values came from, for the errors.
    pub fn resolve(
        config_username: Option<&str>,
        config_password: Option<&str>,
        config_keys: (&'static str, &'static str),
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<RootCredentials, RootError> {
        let (username, user_source) = match env(ENV_ROOT_USERNAME) {
            Some(v) => (v, ENV_ROOT_USERNAME),
            None => (
                config_username.unwrap_or(ROOT_DEFAULT).to_owned(),
                config_keys.0,
            ),
        };
        let (password, password_source) = match env(ENV_ROOT_PASSWORD) {
            Some(v) => (v, ENV_ROOT_PASSWORD),
            None => (
                config_password.unwrap_or(ROOT_DEFAULT).to_owned(),
                config_keys.1,
            ),
        };
        if !(3..=50).contains(&username.len()) {
            return Err(RootError::Username {
                origin: user_source,
                len: username.len(),
            });
        }
        if !(3..=100).contains(&password.len()) {
            return Err(RootError::Password {
                origin: password_source,
                len: password.len(),
            });
        }
        Ok(RootCredentials { username, password })
    }
}

/// What every replica's initial state is made of. **\[cluster\]**: identical on every node
/// (same cluster, same root credentials), or the replicas start from different states.
#[derive(Debug, Clone)]
pub struct Genesis {
    /// The cluster id (wire.md §8).
    pub cluster_id: u128,
    /// The root user.
    pub root: RootCredentials,
    /// The Argon2id cost of the root user's hash.
    pub params: HashParams,
}

/// The root user's salt: derived from the cluster id and username, so every replica computes
/// the same initial state without a replicated op, while two clusters (or two usernames)
/// never share a salt.
pub fn root_salt(cluster_id: u128, username: &str) -> [u8; SALT_LEN] {
    let mut hasher = blake3::Hasher::new_derive_key("strand 2026 root password salt");
    hasher.update(&cluster_id.to_le_bytes());
    hasher.update(username.as_bytes());
    let mut salt = [0; SALT_LEN];
    salt.copy_from_slice(&hasher.finalize().as_bytes()[..SALT_LEN]);
    salt
}

/// The metadata group's state machine, with the read handle it publishes into.
#[derive(Debug)]
pub struct MetadataStateMachine {
    view: MetadataView,
    handle: Arc<MetadataHandle>,
    /// Primary-only: the next group id handed out by `project`, ahead of the applied counter
    /// while CreateTopics are in the pipeline. Not replicated, not in snapshots.
    projected_group_id: u64,
}

impl MetadataStateMachine {
    /// The initial state: the root user and nothing else.
    pub fn new(genesis: &Genesis) -> Result<MetadataStateMachine, PasswordError> {
        let username = Name::new(&genesis.root.username).expect("validated to 3..=50 bytes");
        let password = PasswordHash::new(
            &genesis.root.password,
            root_salt(genesis.cluster_id, &genesis.root.username),
            genesis.params,
        )?;
        let mut state = State::default();
        state.users.insert(
            ROOT_USER_ID,
            User {
                id: ROOT_USER_ID,
                username,
                password,
            },
        );
        let sm = MetadataStateMachine {
            view: MetadataView { op: 0, state },
            handle: Arc::new(MetadataHandle::default()),
            projected_group_id: 0,
        };
        sm.publish();
        Ok(sm)
    }

    /// A reader for other shards.
    pub fn reader(&self) -> MetadataReader {
        MetadataReader::new(self.handle.clone())
    }

    /// The handle (the driver publishes sessions through it).
    pub fn handle(&self) -> &Arc<MetadataHandle> {
        &self.handle
    }

    /// The applied state.
    pub fn state(&self) -> &State {
        &self.view.state
    }

    /// The canonical encoding of the applied state (the METADATA_SNAPSHOT artifact).
    pub fn snapshot(&self) -> Vec<u8> {
        self.view.state.encode()
    }

    fn publish(&self) {
        self.handle.publish(self.view.clone());
    }

    /// The origin replica of `client`'s session (decision 370), from the applied state.
    pub fn session_origin(&self, client: u128) -> Option<u8> {
        self.view.state.session_origins.get(&client).copied()
    }

    /// Business checks of a decoded request against the applied state, shared by the
    /// primary's preflight and every replica's apply. `Ok` carries nothing: apply mutates.
    fn check(&self, request: &Request<'_>, user_id: u32) -> Result<(), u32> {
        if !self.view.state.users.contains_key(&user_id) {
            return Err(status::UNAUTHORIZED);
        }
        // The acting user's status and permissions, again at apply (decision 302).
        self.actor(user_id)?;
        crate::client::permit::authorize(request, user_id, &self.view)?;
        let state = &self.view.state;
        match request {
            Request::CreateStream { name, options } => {
                if !options.is_empty() {
                    return Err(status::UNSUPPORTED_OPTION_KEY);
                }
                if state.stream_by_name(name.as_str()).is_some() {
                    return Err(status::STREAM_NAME_ALREADY_EXISTS);
                }
                state.free_stream_id().ok_or(status::ERROR)?;
            }
            Request::DeleteStream(id) => {
                self.view.stream(id)?;
            }
            Request::CreateTopic(t) => {
                let stream = self.view.stream(&t.stream)?;
                check_topic(stream, &t.name, t.partitions_count)?;
                topic::resolve(&t.options, &topic::derive(&t.options))?;
            }
            Request::CreateConsumerGroup {
                stream,
                topic,
                name,
            } => {
                let found = self.view.topic_groups(stream, topic)?.groups;
                if found.is_some_and(|g| g.values().any(|g| g.name == *name)) {
                    return Err(groups::GROUP_NAME_ALREADY_EXISTS);
                }
                groups::free_group_id(found).ok_or(status::ERROR)?;
                state.next_group_key().ok_or(status::ERROR)?;
            }
            Request::DeleteConsumerGroup(g)
            | Request::JoinConsumerGroup(g)
            | Request::LeaveConsumerGroup(g) => {
                self.view.consumer_group(&g.stream, &g.topic, &g.group)?;
            }
            Request::Lifecycle(l) => self.check_lifecycle(l)?,
            _ => return Err(status::FEATURE_UNAVAILABLE),
        }
        Ok(())
    }

    fn apply_create_stream(&mut self, header: &PrepareHeader, body: &[u8]) -> Result<Vec<u8>, u32> {
        let request = decode(Operation::CreateStream, body)?;
        self.check(&request, header.user_id.get())?;
        let Request::CreateStream { name, .. } = request else {
            unreachable!("decoded as CreateStream")
        };
        let state = &mut self.view.state;
        let id = state.free_stream_id().ok_or(status::ERROR)?;
        let stream = Stream {
            id,
            name,
            created_at: header.timestamp.get(),
            topics: BTreeMap::new(),
        };
        let mut reply = RESULT_OK.to_vec();
        self.view.stream_details(&stream).encode(&mut reply);
        self.view.state.streams.insert(id, stream);
        Ok(reply)
    }

    fn apply_delete_stream(&mut self, header: &PrepareHeader, body: &[u8]) -> Result<Vec<u8>, u32> {
        let request = decode(Operation::DeleteStream, body)?;
        self.check(&request, header.user_id.get())?;
        let Request::DeleteStream(id) = request else {
            unreachable!("decoded as DeleteStream")
        };
        let stream_id = self.view.stream(&id)?.id;
        if let Some(stream) = self.view.state.streams.remove(&stream_id) {
            for topic in stream.topics.values() {
                self.view.state.retire(stream_id, topic, 0);
            }
        }
        self.view.state.retain_live_groups();
        Ok(RESULT_OK.to_vec())
    }

    /// Create, Delete, Join and LeaveConsumerGroup (decision 316): checked again against
    /// the applied state; Join and Leave act for the prepare's client (its session).
    fn apply_group(
        &mut self,
        operation: Operation,
        header: &PrepareHeader,
        body: &[u8],
    ) -> Result<Vec<u8>, u32> {
        // A CreateConsumerGroup of this build's primary carries the key tag (decision 391).
        let (keyed, body) = if operation == Operation::CreateConsumerGroup {
            groups::split_create_body(body)
        } else {
            (false, body)
        };
        let request = decode(operation, body)?;
        self.check(&request, header.user_id.get())?;
        let client = header.client.get();
        let state_groups = |view: &MetadataView, g: &crate::client::groups::GroupTarget| {
            view.consumer_group(&g.stream, &g.topic, &g.group)
                .map(|r| ((r.stream, r.topic), r.group.id))
        };
        match request {
            Request::CreateConsumerGroup {
                stream,
                topic,
                name,
            } => {
                let found = self.view.topic_groups(&stream, &topic)?;
                let (key, partitions) = (found.key, found.partitions);
                let id = groups::free_group_id(found.groups).ok_or(status::ERROR)?;
                // Tagged: the counter's next key, never used before. Untagged (an older
                // build's primary): the legacy key, the id, as that build stores offsets.
                let offset_key = if keyed {
                    self.view.state.next_group_key().ok_or(status::ERROR)?
                } else if id < groups::GROUP_KEY_BASE {
                    id
                } else {
                    return Err(status::ERROR);
                };
                let group = groups::ConsumerGroup::new(id, offset_key, name);
                let mut reply = RESULT_OK.to_vec();
                group.encode_details(partitions, &mut reply);
                let state = &mut self.view.state;
                if keyed {
                    state.group_keys_issued += 1;
                }
                state
                    .consumer_groups
                    .entry(key)
                    .or_default()
                    .insert(id, group);
                Ok(reply)
            }
            Request::DeleteConsumerGroup(g) => {
                let (key, id) = state_groups(&self.view, &g)?;
                let state = &mut self.view.state;
                if let Some(topic_groups) = state.consumer_groups.get_mut(&key) {
                    topic_groups.remove(&id);
                }
                state.retain_live_groups();
                Ok(RESULT_OK.to_vec())
            }
            Request::JoinConsumerGroup(g) | Request::LeaveConsumerGroup(g) => {
                let (key, id) = state_groups(&self.view, &g)?;
                let group = self
                    .view
                    .state
                    .consumer_groups
                    .get_mut(&key)
                    .and_then(|t| t.get_mut(&id))
                    .expect("resolved above");
                if operation == Operation::JoinConsumerGroup {
                    if client == 0 {
                        return Err(status::INVALID_COMMAND);
                    }
                    group.join(client);
                } else if !group.leave(client) {
                    return Err(groups::MEMBER_NOT_FOUND);
                }
                Ok(RESULT_OK.to_vec())
            }
            _ => Err(status::INVALID_COMMAND),
        }
    }

    fn apply_create_topic(
        &mut self,
        header: &PrepareHeader,
        assigned: Assigned,
    ) -> Result<Vec<u8>, u32> {
        let Assigned {
            create,
            derived,
            group_ids,
        } = assigned;
        self.check(&Request::CreateTopic(create.clone()), header.user_id.get())?;
        let settings = topic::resolve(&create.options, &derived)?;
        let stream_id = self.view.stream(&create.stream)?.id;
        let state = &mut self.view.state;
        let stream = state.streams.get_mut(&stream_id).expect("resolved above");
        let id = free_topic_id(stream).ok_or(status::ERROR)?;
        let created_at = header.timestamp.get();
        // The primary's ids are taken as is unless an id it could not know about (another
        // CreateTopic projected before a view change) got there first; then the next free
        // one, so ids stay unique on every replica alike.
        let mut partitions = Vec::with_capacity(group_ids.len());
        let mut next = state.next_consensus_group_id;
        for (index, hint) in group_ids.into_iter().enumerate() {
            let mut group = hint.max(next);
            // A retired key used again never takes its last incarnation's wire tag (decision
            // 396): decided here, at apply, from the applied state, alike on every replica.
            let key = wire::GroupId::partition(wire::PartitionKey {
                stream: stream_id,
                topic: id,
                partition: index as u32,
            });
            if let Some(&old) = key.ok().and_then(|k| state.retired.get(&k.0)) {
                group = lifecycle::next_incarnation(old, group)?;
            }
            next = group.checked_add(1).ok_or(status::ERROR)?;
            partitions.push(Partition {
                id: index as u32,
                created_at,
                consensus_group_id: group,
            });
        }
        let topic = Topic {
            id,
            name: create.name,
            created_at,
            explicit: create.options,
            derived,
            settings,
            partitions,
        };
        let mut reply = RESULT_OK.to_vec();
        topic_details(&topic).encode(&mut reply);
        for p in &topic.partitions {
            if let Some(group) = topic.group(stream_id, p.id) {
                state.retired.remove(&group.0);
            }
        }
        stream.topics.insert(id, topic);
        state.next_consensus_group_id = next;
        Ok(reply)
    }
}

fn check_topic(stream: &Stream, name: &Name, partitions_count: u32) -> Result<(), u32> {
    if stream.topic_by_name(name.as_str()).is_some() {
        return Err(status::TOPIC_NAME_ALREADY_EXISTS);
    }
    if partitions_count == 0 {
        return Err(status::INVALID_PARTITIONS_COUNT);
    }
    if partitions_count > PARTITIONS_PER_TOPIC_MAX {
        return Err(status::TOO_MANY_PARTITIONS);
    }
    free_topic_id(stream).ok_or(status::ERROR)?;
    Ok(())
}

/// Decodes a client body the primary admitted. A body that does not decode here was never
/// admitted by a correct primary; every replica refuses it alike.
fn decode(operation: Operation, body: &[u8]) -> Result<Request<'_>, u32> {
    Request::decode(operation, 0, body).map_err(|e| match e.answer() {
        request::Answer::Status(code) => code,
        request::Answer::Evict(_) => status::INVALID_COMMAND,
    })
}

/// A CreateTopicWithAssignments body (client-plane.md §7.4), decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// The client's CreateTopic, options in canonical order.
    pub create: request::CreateTopic,
    /// The derived options the primary resolved.
    pub derived: Options,
    /// `consensus_group_id` per partition `0..n`.
    pub group_ids: Vec<u64>,
}

impl Assigned {
    /// Encodes the §7.4 body.
    pub fn encode(&self) -> Vec<u8> {
        let mut inner = Vec::new();
        Request::CreateTopic(self.create.clone()).encode(&mut inner);
        let mut out = Vec::with_capacity(inner.len() + 64 + 12 * self.group_ids.len());
        out.extend_from_slice(&(inner.len() as u32).to_le_bytes());
        out.extend_from_slice(&inner);
        self.derived.write_prefixed(&mut out);
        out.extend_from_slice(&(self.group_ids.len() as u32).to_le_bytes());
        for (id, group) in self.group_ids.iter().enumerate() {
            out.extend_from_slice(&(id as u32).to_le_bytes());
            out.extend_from_slice(&group.to_le_bytes());
        }
        out
    }

    /// Decodes a §7.4 body: partition ids must be `0..n` in order and `n` must equal the
    /// inner request's `partitions_count`.
    pub fn decode(body: &[u8]) -> Result<Assigned, BodyError> {
        let mut r = Reader::new(body);
        let inner_len = r.u32("inner_len")?;
        let inner = r.take(
            usize::try_from(inner_len).unwrap_or(usize::MAX),
            "inner CreateTopic",
        )?;
        let create = match Request::decode(Operation::CreateTopic, 0, inner) {
            Ok(Request::CreateTopic(create)) => create,
            Err(request::RequestError::Body { error, .. }) => return Err(error),
            _ => {
                return Err(BodyError::Length {
                    field: "inner CreateTopic",
                    len: u64::from(inner_len),
                });
            }
        };
        let derived = Options::read_prefixed(&mut r)?;
        let count = r.u32("partition count")?;
        if count != create.partitions_count {
            return Err(BodyError::Length {
                field: "partition count",
                len: u64::from(count),
            });
        }
        let mut group_ids = Vec::with_capacity((count as usize).min(r.remaining() / 12));
        for expected in 0..count {
            let id = r.u32("partition id")?;
            if id != expected {
                return Err(BodyError::Length {
                    field: "partition id",
                    len: u64::from(id),
                });
            }
            group_ids.push(r.u64("consensus_group_id")?);
        }
        r.finish()?;
        Ok(Assigned {
            create,
            derived,
            group_ids,
        })
    }
}

/// Runs in a replica behind `consensus::Buffered` (decision 170): the metadata snapshot is
/// small enough to build whole and serve from memory.
impl WholeArtifacts for MetadataStateMachine {
    /// Refuses, before replication, every metadata operation this machine does not serve
    /// (status 5) and every body that does not decode or breaks a rule against the applied
    /// state. Apply checks the same rules again: the applied state may move between the two.
    fn preflight(&self, operation: Operation, body: &[u8]) -> Result<(), u32> {
        match operation {
            Operation::Register | Operation::Logout => Ok(()),
            op if user_ops::serves(op) => user_ops::preflight(op, body),
            Operation::CreateStream
            | Operation::DeleteStream
            | Operation::CreateTopic
            | Operation::CreateConsumerGroup
            | Operation::DeleteConsumerGroup
            | Operation::JoinConsumerGroup
            | Operation::LeaveConsumerGroup => {
                let request = decode(operation, body)?;
                // The acting user is checked at apply (the header's user_id is stamped by the
                // receiving shard after authentication); root is enough to pass here.
                self.check(&request, ROOT_USER_ID)
            }
            op if crate::client::lifecycle::Lifecycle::serves(op) => {
                let request = decode(operation, body)?;
                // The acting user is checked at apply (the header's user_id is stamped by the
                // receiving shard after authentication); root is enough to pass here.
                self.check(&request, ROOT_USER_ID)
            }
            _ => Err(status::FEATURE_UNAVAILABLE),
        }
    }

    /// CreateTopic becomes CreateTopicWithAssignments: canonical options, the derived
    /// options, and a group id per partition from the primary's counter. CreateConsumerGroup
    /// gets the key tag: its group's offset key comes from the applied counter (decision 391).
    fn project(&mut self, operation: Operation, body: &[u8]) -> Projection {
        if operation == Operation::CreateConsumerGroup {
            return Projection {
                operation,
                body: groups::keyed_create_body(body),
            };
        }
        if operation == Operation::CreateTopic
            && let Ok(Request::CreateTopic(create)) = Request::decode(operation, 0, body)
        {
            let mut next = self
                .projected_group_id
                .max(self.view.state.next_consensus_group_id);
            let group_ids: Vec<u64> = (0..create.partitions_count)
                .map(|_| {
                    let id = next;
                    next = next.saturating_add(1);
                    id
                })
                .collect();
            self.projected_group_id = next;
            let assigned = Assigned {
                derived: topic::derive(&create.options),
                create,
                group_ids,
            };
            return Projection {
                operation: Operation::CreateTopicWithAssignments,
                body: assigned.encode(),
            };
        }
        Projection {
            operation,
            body: body.to_vec(),
        }
    }

    fn apply(&mut self, header: &PrepareHeader, body: &[u8], reply: &mut Vec<u8>) {
        let operation = Operation::from_byte(header.operation).unwrap_or(Operation::Reserved);
        let outcome = match operation {
            Operation::CreateStream => self.apply_create_stream(header, body),
            Operation::DeleteStream => self.apply_delete_stream(header, body),
            Operation::CreateConsumerGroup
            | Operation::DeleteConsumerGroup
            | Operation::JoinConsumerGroup
            | Operation::LeaveConsumerGroup => self.apply_group(operation, header, body),
            op if crate::client::lifecycle::Lifecycle::serves(op) => match decode(op, body) {
                Ok(Request::Lifecycle(l)) => self.apply_lifecycle(header, l),
                Ok(_) => Err(status::INVALID_COMMAND),
                Err(code) => Err(code),
            },
            Operation::CreateTopicWithAssignments => match Assigned::decode(body) {
                Ok(assigned) => self.apply_create_topic(header, assigned),
                Err(_) => Err(status::INVALID_COMMAND),
            },
            // A CreateTopic that was not projected (a primary of another build): the same
            // apply with the group ids from the applied counter.
            Operation::CreateTopic => match decode(operation, body) {
                Ok(Request::CreateTopic(create)) => {
                    let group_ids =
                        vec![0; create.partitions_count.min(PARTITIONS_PER_TOPIC_MAX) as usize];
                    let assigned = Assigned {
                        derived: topic::derive(&create.options),
                        create,
                        group_ids,
                    };
                    self.apply_create_topic(header, assigned)
                }
                Ok(_) => Err(status::INVALID_COMMAND),
                Err(code) => Err(code),
            },
            op if user_ops::serves(op) => self.apply_user_op(op, header, body),
            _ => Err(status::FEATURE_UNAVAILABLE),
        };
        self.view.op = header.op.get();
        match outcome {
            Ok(bytes) => {
                reply.extend_from_slice(&bytes);
                self.projected_group_id = self
                    .projected_group_id
                    .max(self.view.state.next_consensus_group_id);
            }
            Err(code) => reply.extend_from_slice(&result_rejected(code)),
        }
        self.publish();
    }

    /// A session ended (Logout, a new Register under its client id, an eviction from the
    /// client table): its memberships end in the same step, on every replica (decision 317).
    fn end_session(&mut self, client: u128) {
        // The origins are read on shard 0 from this machine (the session reaper), so they
        // change without a publish of their own: the next one carries them.
        self.view.state.session_origins.remove(&client);
        if self.view.state.remove_member_everywhere(client) {
            self.publish();
        }
    }

    /// The Register prepare carries the session's origin replica (decision 370).
    fn project_register(&mut self, origin: consensus::ReplicaId, body: &[u8]) -> Vec<u8> {
        sessions::register_body(origin.0, body)
    }

    /// A session began at a committed Register: record its origin, when its body names one.
    fn begin_session(&mut self, header: &PrepareHeader, body: &[u8]) {
        let client = header.client.get();
        match sessions::origin_of(body) {
            Some(origin) if client != 0 => {
                self.view.state.session_origins.insert(client, origin);
            }
            _ => tracing::debug!(client, "a Register without a session origin"),
        }
    }

    fn artifacts(&mut self, commit_op: u64) -> Vec<Artifact> {
        vec![Artifact {
            kind: ArtifactKind::METADATA_SNAPSHOT,
            frontier: commit_op,
            bytes: self.snapshot(),
        }]
    }

    /// Decodes and validates the METADATA_SNAPSHOT artifact completely before touching the
    /// applied state; a refused install leaves it as it was.
    fn install(&mut self, commit_op: u64, artifacts: &[Artifact]) -> Result<(), InstallError> {
        let (index, artifact) = artifacts
            .iter()
            .enumerate()
            .find(|(_, a)| a.kind == ArtifactKind::METADATA_SNAPSHOT)
            .ok_or(InstallError::Missing)?;
        if artifact.frontier > commit_op {
            return Err(InstallError::Decode { index });
        }
        let state = State::decode(&artifact.bytes).map_err(|error| {
            tracing::warn!(%error, index, "metadata snapshot refused");
            InstallError::Decode { index }
        })?;
        self.view = MetadataView {
            op: commit_op,
            state,
        };
        self.projected_group_id = self.view.state.next_consensus_group_id;
        self.publish();
        Ok(())
    }
}

impl crate::metadata_group::Checkpointable for consensus::Buffered<MetadataStateMachine> {
    /// The applied state as the METADATA_SNAPSHOT artifact (the core emits a checkpoint at
    /// `commit_min`, when this state is exactly at `commit_op`).
    fn checkpoint_artifacts(&self, commit_op: u64) -> Vec<Artifact> {
        vec![Artifact {
            kind: ArtifactKind::METADATA_SNAPSHOT,
            frontier: commit_op,
            bytes: self.machine.snapshot(),
        }]
    }

    /// The snapshot `checkpoint_artifacts` wrote, installed as a transfer would.
    fn restore(&mut self, commit_op: u64, artifacts: &[Artifact]) -> Result<(), InstallError> {
        self.machine.install(commit_op, artifacts)
    }

    fn session_origin(&self, client: u128) -> Option<u8> {
        self.machine.session_origin(client)
    }
}

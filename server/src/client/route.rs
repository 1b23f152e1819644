//! What the shard that receives a client Request does with it (client-plane.md §2, §2.4,
//! §6-§9), decided from the request and the committed metadata alone: answer it locally,
//! evict, authenticate and register, or hand it to the metadata group or a partition group.
//! Pure: the connection loop supplies the session check's result and acts on the [`Route`].

use wire::decode::EvictionReason;
use wire::{GroupId, Operation};

use super::codec::Consumer;
use super::groups::GroupTarget;
use super::reply::{Refusal, refusal};
use super::request::{
    Answer, Credentials, PollMessages, Request, check_protocol_version, code, register_prepare_body,
};
use super::status;
use super::users;
use crate::metadata::groups::consumer_of_group;
use crate::metadata::users::{STATUS_ACTIVE, token_hash};
use crate::metadata::view::{MetadataView, TopicRef, stream_record, topic_details, topic_record};

/// The decision for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Reply now with this status and body.
    Reply(Refusal),
    /// Send an Eviction with this reason; for reason 14 the version window `(version, min)`.
    Evict(EvictionReason, Option<(u32, u32)>),
    /// The credentials are good: submit a Register for `user_id` to the metadata group with
    /// this body (the password removed, decision 124).
    Register {
        /// The authenticated user (goes into the header's `user_id`).
        user_id: u32,
        /// The body to replicate.
        body: Vec<u8>,
    },
    /// Submit to the metadata group as is (Logout, CreateStream, DeleteStream, CreateTopic).
    Metadata(Operation),
    /// Submit to a partition group (SendMessages, StoreConsumerOffset with `ack = 1`).
    Partition {
        /// The group.
        group: GroupId,
        /// The partition id within its topic.
        partition: u32,
        /// The operation.
        operation: Operation,
    },
    /// Read a partition's messages (the partition's state answers, decision 127).
    Poll {
        /// The group.
        group: GroupId,
        /// The partition id.
        partition: u32,
        /// The request.
        request: PollMessages,
    },
    /// Read a stored consumer offset.
    ConsumerOffset {
        /// The group.
        group: GroupId,
        /// The partition id.
        partition: u32,
        /// Whose.
        consumer: Consumer,
    },
    /// A node-level answer the caller builds from its config, roster and process.
    Node(NodeQuery),
    /// Submit to a partition group with this body in place of the client's: a consumer-group
    /// offset op whose group was named by name, rewritten to the group's numeric id so its
    /// offsets have one key (decision 319).
    PartitionRewritten {
        /// The group.
        group: GroupId,
        /// The operation.
        operation: Operation,
        /// The body to submit.
        body: Vec<u8>,
    },
    /// SyncConsumerGroup: answered from committed metadata for the request's client
    /// (its session), which only the connection knows.
    SyncGroup(GroupTarget),
    /// Submit to the metadata group once the receiving shard has replaced the secret in the
    /// body (decision 304): hash a new user's password, check and hash a changed one, mint
    /// a token.
    Prepare(Prepare),
    /// A client-information answer the caller builds from the committed sessions (GetMe,
    /// GetClient, GetClients).
    Clients(ClientsQuery),
}

/// What the receiving shard prepares before submitting (decision 304).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepare {
    /// CreateUser: hash the password.
    User(users::CreateUser),
    /// ChangePassword of `user_id`: verify `current` against `stored`, hash `new`.
    Password {
        /// Whose.
        user_id: u32,
        /// The stored hash.
        stored: crate::metadata::password::PasswordHash,
        /// The request.
        request: users::ChangePassword,
    },
    /// CreatePersonalAccessToken: mint the token, replicate its hash.
    Token {
        /// Name.
        name: super::codec::Name,
        /// Expiry as sent.
        expiry: u64,
    },
}

/// The client-information questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientsQuery {
    /// GetMe: the asking client.
    Me,
    /// GetClient by the SDK's u32 client id.
    One(u32),
    /// GetClients.
    All,
}

/// The node-level questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeQuery {
    /// GetClusterMetadata (§6.4).
    ClusterMetadata,
    /// GetStats (§6.5).
    Stats,
}

fn reply_ok(body: Vec<u8>) -> Route {
    Route::Reply(Refusal { status: 0, body })
}

fn refuse(operation: Operation, code: u32) -> Route {
    Route::Reply(refusal(operation, code))
}

/// Decides what to do with a request. `operation`, `code` and `body` come from a Request
/// that passed `wire::decode::decode_request`; `user` is the authenticated user of the
/// request's `(client, session)` (`None` before login or for a stale session); `view` is the
/// committed metadata; `round_robin` is the caller's counter for balanced partitioning.
pub fn route(
    operation: Operation,
    legacy_code: u32,
    body: &[u8],
    user: Option<u32>,
    view: &MetadataView,
    round_robin: u64,
) -> Route {
    // Before login only Ping and Register pass (§2.4).
    if user.is_none() {
        if operation == Operation::NonReplicated && legacy_code != code::PING {
            return Route::Reply(Refusal {
                status: status::UNAUTHENTICATED,
                body: Vec::new(),
            });
        }
        if !matches!(operation, Operation::NonReplicated | Operation::Register) {
            return Route::Evict(EvictionReason::NoSession, None);
        }
    }
    // A session whose user was deleted or deactivated since it logged in has ended
    // (decision 303): refused as if it never existed.
    if let Some(user_id) = user
        && !matches!(operation, Operation::Register)
        && view.state.users.get(&user_id).is_none_or(|_| {
            view.state
                .accounts
                .get(&user_id)
                .is_some_and(|a| a.status != STATUS_ACTIVE)
        })
    {
        if operation == Operation::NonReplicated {
            return Route::Reply(Refusal {
                status: status::UNAUTHENTICATED,
                body: Vec::new(),
            });
        }
        return Route::Evict(EvictionReason::SessionError, None);
    }
    let request = match Request::decode(operation, legacy_code, body) {
        Ok(request) => request,
        Err(error) => {
            return match error.answer() {
                Answer::Status(code) => refuse(operation, code),
                Answer::Evict(reason) => Route::Evict(reason, None),
            };
        }
    };
    if let Some(user_id) = user
        && let Err(code) = super::permit::authorize(&request, user_id, view)
    {
        return refuse(operation, code);
    }
    match request {
        Request::Ping => reply_ok(Vec::new()),
        Request::Register(login) => {
            if let Err(window) = check_protocol_version(login.version.protocol_version) {
                return Route::Evict(EvictionReason::IncompatibleProtocol, Some(window));
            }
            let user_id = match &login.credentials {
                Credentials::Token(token) => {
                    match view.token_owner(&token_hash(token), now_micros()) {
                        Some(user_id) => user_id,
                        None => return Route::Evict(EvictionReason::InvalidToken, None),
                    }
                }
                Credentials::Password { username, password } => {
                    match view.authenticate(username.as_str(), password) {
                        Some(user_id) => user_id,
                        None => return Route::Evict(EvictionReason::InvalidCredentials, None),
                    }
                }
            };
            if view
                .state
                .accounts
                .get(&user_id)
                .is_some_and(|a| a.status != STATUS_ACTIVE)
            {
                return Route::Evict(EvictionReason::UserInactive, None);
            }
            Route::Register {
                user_id,
                body: register_prepare_body(&login),
            }
        }
        Request::GetUser(id) => reply_ok(super::user_answers::user_details(view, &id)),
        Request::GetUsers => reply_ok(super::user_answers::users(view)),
        Request::GetPersonalAccessTokens => {
            reply_ok(super::user_answers::tokens(view, user.unwrap_or(u32::MAX)))
        }
        Request::GetMe => Route::Clients(ClientsQuery::Me),
        Request::GetClient(id) => Route::Clients(ClientsQuery::One(id)),
        Request::GetClients => Route::Clients(ClientsQuery::All),
        Request::CreateUser(create) => match create.validate() {
            Ok(()) if view.user(create.username.as_str()).is_some() => {
                refuse(operation, users::status::USER_ALREADY_EXISTS)
            }
            Ok(()) => Route::Prepare(Prepare::User(create)),
            Err(code) => refuse(operation, code),
        },
        Request::ChangePassword(change) => {
            if !users::valid_password(&change.new) {
                return refuse(operation, users::status::INVALID_PASSWORD);
            }
            match super::user_answers::find_user(view, &change.user) {
                Some(found) => Route::Prepare(Prepare::Password {
                    user_id: found.id,
                    stored: found.password.clone(),
                    request: change,
                }),
                None => refuse(operation, users::status::USER_NOT_FOUND),
            }
        }
        Request::CreatePersonalAccessToken { name, expiry } => {
            if !users::valid_token_name(name.as_str()) {
                return refuse(operation, users::status::INVALID_PERSONAL_ACCESS_TOKEN_NAME);
            }
            Route::Prepare(Prepare::Token { name, expiry })
        }
        Request::UpdateUser(_)
        | Request::DeleteUser(_)
        | Request::UpdatePermissions(_)
        | Request::DeletePersonalAccessToken(_) => Route::Metadata(operation),
        Request::Logout
        | Request::CreateConsumerGroup { .. }
        | Request::DeleteConsumerGroup(_)
        | Request::JoinConsumerGroup(_)
        | Request::LeaveConsumerGroup(_)
        | Request::CreateStream { .. }
        | Request::DeleteStream(_)
        | Request::CreateTopic(_)
        | Request::Lifecycle(_) => Route::Metadata(operation),
        Request::GetStream(id) => reply_ok(match view.stream(&id) {
            Ok(stream) => {
                let mut out = Vec::new();
                view.stream_details(stream).encode(&mut out);
                out
            }
            Err(_) => Vec::new(), // empty = not found (§3)
        }),
        Request::GetStreams => {
            let mut out = Vec::new();
            for stream in view.state.streams.values() {
                stream_record(stream).encode(&mut out);
            }
            reply_ok(out)
        }
        Request::GetTopic { stream, topic } => reply_ok(match view.topic(&stream, &topic) {
            Ok(found) => {
                let mut out = Vec::new();
                topic_details(found.topic).encode(&mut out);
                out
            }
            Err(_) => Vec::new(),
        }),
        Request::GetClusterMetadata => Route::Node(NodeQuery::ClusterMetadata),
        Request::GetStats => Route::Node(NodeQuery::Stats),
        Request::SendMessages(send) => {
            let found = match view.topic(&send.stream, &send.topic) {
                Ok(found) => found,
                Err(_) => return refuse(operation, status::RESOURCE_NOT_FOUND),
            };
            match found
                .partition_for(&send.partitioning, round_robin)
                .and_then(|p| Ok((p, found.group(p)?)))
            {
                Ok((partition, group)) => Route::Partition {
                    group,
                    partition,
                    operation,
                },
                Err(_) => refuse(operation, status::RESOURCE_NOT_FOUND),
            }
        }
        Request::StoreConsumerOffset(mut store) => {
            // NoAck stores come with the Iggy-compatibility issue.
            if !store.quorum {
                return refuse(operation, status::FEATURE_UNAVAILABLE);
            }
            if store.target.consumer.group {
                return match consumer_of_group(view, &mut store.target).and_then(|()| {
                    resolve(
                        view,
                        &store.target.stream,
                        &store.target.topic,
                        store.target.partition,
                    )
                }) {
                    Ok((_, group)) => {
                        let mut body = Vec::new();
                        Request::StoreConsumerOffset(store).encode(&mut body);
                        Route::PartitionRewritten {
                            group,
                            operation,
                            body,
                        }
                    }
                    Err(code) => refuse(operation, code),
                };
            }
            match resolve(
                view,
                &store.target.stream,
                &store.target.topic,
                store.target.partition,
            ) {
                Ok((partition, group)) => Route::Partition {
                    group,
                    partition,
                    operation,
                },
                Err(_) => refuse(operation, status::RESOURCE_NOT_FOUND),
            }
        }
        Request::PollMessages(mut poll) => {
            if poll.consumer.group {
                // The member's fence (its session, its partitions) is checked by the
                // connection, which knows the client; the group is named by id from here on.
                let mut target = super::request::OffsetTarget {
                    consumer: poll.consumer.clone(),
                    stream: poll.stream.clone(),
                    topic: poll.topic.clone(),
                    partition: poll.partition,
                };
                if let Err(code) = consumer_of_group(view, &mut target) {
                    return refuse(operation, code);
                }
                poll.consumer = target.consumer;
            }
            match resolve(view, &poll.stream, &poll.topic, poll.partition) {
                Ok((partition, group)) => Route::Poll {
                    group,
                    partition,
                    request: poll,
                },
                Err(code) => refuse(operation, code),
            }
        }
        Request::GetConsumerOffset(mut target) => {
            if target.consumer.group
                && let Err(code) = consumer_of_group(view, &mut target)
            {
                return refuse(operation, code);
            }
            match resolve(view, &target.stream, &target.topic, target.partition) {
                Ok((partition, group)) => Route::ConsumerOffset {
                    group,
                    partition,
                    consumer: target.consumer,
                },
                Err(code) => refuse(operation, code),
            }
        }
        Request::DeleteConsumerOffset(mut delete) => {
            if !delete.quorum {
                return refuse(operation, status::FEATURE_UNAVAILABLE);
            }
            let rewrite = delete.target.consumer.group;
            if rewrite && let Err(code) = consumer_of_group(view, &mut delete.target) {
                return refuse(operation, code);
            }
            match resolve(
                view,
                &delete.target.stream,
                &delete.target.topic,
                delete.target.partition,
            ) {
                Ok((_, group)) if rewrite => {
                    let mut body = Vec::new();
                    Request::DeleteConsumerOffset(delete).encode(&mut body);
                    Route::PartitionRewritten {
                        group,
                        operation,
                        body,
                    }
                }
                Ok((partition, group)) => Route::Partition {
                    group,
                    partition,
                    operation,
                },
                Err(_) => refuse(operation, status::RESOURCE_NOT_FOUND),
            }
        }
        Request::GetTopics(stream) => match view.stream(&stream) {
            Ok(stream) => {
                let mut out = (stream.topics.len() as u32).to_le_bytes().to_vec();
                for topic in stream.topics.values() {
                    topic_record(topic).encode(&mut out);
                }
                reply_ok(out)
            }
            Err(code) => refuse(operation, code),
        },
        Request::GetConsumerGroup(g) => {
            reply_ok(match view.consumer_group(&g.stream, &g.topic, &g.group) {
                Ok(found) => {
                    let mut out = Vec::new();
                    found.group.encode_details(found.partitions, &mut out);
                    out
                }
                Err(_) => Vec::new(), // empty = not found (§10)
            })
        }
        Request::GetConsumerGroups { stream, topic } => match view.topic_groups(&stream, &topic) {
            Ok(found) => {
                let mut out = Vec::new();
                for group in found.groups.into_iter().flat_map(|g| g.values()) {
                    group.encode_record(found.partitions, &mut out);
                }
                reply_ok(out)
            }
            Err(code) => refuse(operation, code),
        },
        Request::SyncConsumerGroup(g) => Route::SyncGroup(g),
    }
}

/// A partition of a named topic (absent partition = 0, §8.2), or the not-found code.
fn resolve(
    view: &MetadataView,
    stream: &super::codec::Identifier,
    topic: &super::codec::Identifier,
    partition: Option<u32>,
) -> Result<(u32, GroupId), u32> {
    let found: TopicRef<'_> = view.topic(stream, topic)?;
    let partition = partition.unwrap_or(0);
    Ok((partition, found.group(partition)?))
}

/// Now, µs since the Unix epoch (token expiry is checked against the receiving node's clock,
/// decision 307).
fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

//! What the shard that receives a client Request does with it (client-plane.md §2, §2.4,
//! §6-§9), decided from the request and the committed metadata alone: answer it locally,
//! evict, authenticate and register, or hand it to the metadata group or a partition group.
//! Pure: the connection loop supplies the session check's result and acts on the [`Route`].

use wire::decode::EvictionReason;
use wire::{GroupId, Operation};

use super::codec::Consumer;
use super::reply::{Refusal, refusal};
use super::request::{
    Answer, Credentials, PollMessages, Request, check_protocol_version, code, register_prepare_body,
};
use super::status;
use crate::metadata::view::{MetadataView, TopicRef, stream_record, topic_details};

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
    let request = match Request::decode(operation, legacy_code, body) {
        Ok(request) => request,
        Err(error) => {
            return match error.answer() {
                Answer::Status(code) => refuse(operation, code),
                Answer::Evict(reason) => Route::Evict(reason, None),
            };
        }
    };
    match request {
        Request::Ping => reply_ok(Vec::new()),
        Request::Register(login) => {
            if let Err(window) = check_protocol_version(login.version.protocol_version) {
                return Route::Evict(EvictionReason::IncompatibleProtocol, Some(window));
            }
            match &login.credentials {
                // Personal access tokens come with the Iggy-compatibility issue.
                Credentials::Token(_) => refuse(operation, status::FEATURE_UNAVAILABLE),
                Credentials::Password { username, password } => {
                    match view.authenticate(username.as_str(), password) {
                        Some(user_id) => Route::Register {
                            user_id,
                            body: register_prepare_body(&login),
                        },
                        None => Route::Evict(EvictionReason::InvalidCredentials, None),
                    }
                }
            }
        }
        Request::Logout
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
        Request::StoreConsumerOffset(store) => {
            // Consumer groups and NoAck stores come with the Iggy-compatibility issue.
            if store.target.consumer.group || !store.quorum {
                return refuse(operation, status::FEATURE_UNAVAILABLE);
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
        Request::PollMessages(poll) => {
            if poll.consumer.group {
                return refuse(operation, status::FEATURE_UNAVAILABLE);
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
        Request::GetConsumerOffset(target) => {
            if target.consumer.group {
                return refuse(operation, status::FEATURE_UNAVAILABLE);
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

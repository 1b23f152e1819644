//! One client connection: read a frame, answer it, read the next (lockstep, §1).

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use consensus::ClientRequest;
use consensus::Frame;
use consensus::codes::{TRANSIENT_NOT_ACCEPTED, TRANSIENT_NOT_COMMITTED};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use shard::Lane;
use wire::decode::{DecodeError, EvictionReason};
use wire::header::{Layout, RequestHeader};
use wire::{Command, HEADER_SIZE, Operation};

use super::frames::Answer;
use super::{
    ClientCore, Counters, LOGINS_IN_FLIGHT_MAX, PartitionRead, REQUEST_DEADLINE, frames, registry,
};
use crate::client::reply::read_result;
use crate::client::request::{OffsetTarget, Request, StoreConsumerOffset};
use crate::client::route::{NodeQuery, Route, route};
use crate::client::status;
use crate::shard_msg::ShardMsg;
use crate::timeline;

/// Decrements a count when dropped (open connections, logins in flight).
struct Open<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Login<'a>(&'a ClientCore);

impl Drop for Login<'_> {
    fn drop(&mut self) {
        self.0.logins.set(self.0.logins.get() - 1);
    }
}

/// Serves one connection until the peer closes it or breaks the framing.
pub(super) async fn serve(core: Rc<ClientCore>, mut stream: TcpStream) {
    let counters = core.node.counters.clone();
    counters.open.fetch_add(1, Ordering::Relaxed);
    let _open = Open(&counters.open);
    let conn = core.next_conn.get();
    core.next_conn.set(conn + 1);
    let mut header = [0u8; HEADER_SIZE];
    let mut seen = Seen::default();
    // Decision 384: the client id this connection carries, with its peer address.
    let addresses = core.node.addresses.clone();
    let (token, peer) = (addresses.connection(), stream.peer_addr().ok());
    let mut carried: Option<u128> = None;
    // The previous reply's write, for a poll's `idle` stage (decision 420).
    let mut previous: Option<Instant> = None;
    loop {
        if stream.read_exact(&mut header).await.is_err() {
            break; // closed by the peer (or reset)
        }
        let header_at = Instant::now();
        let size = match wire::framer::frame_size(&header, core.max_message_size) {
            Ok(Some(size)) => size,
            Ok(None) => unreachable!("a whole header is in"),
            Err(error) => {
                Counters::add(&counters.closed_framing);
                tracing::debug!(%error, "client frame refused; closing the connection");
                break;
            }
        };
        if header[60] != Command::Request.byte() {
            Counters::add(&counters.closed_replica_command);
            tracing::debug!(
                command = header[60],
                "a non-Request command on the client port; closing the connection"
            );
            break;
        }
        // The body is read straight into the buffer a replicated request keeps (decision 366):
        // no copy of it between the socket and the consensus core.
        let mut body = body_buffer(size - HEADER_SIZE);
        if stream.read_exact(&mut body).await.is_err() {
            break;
        }
        let stamps = timeline::RequestStamps {
            header: header_at,
            read: Instant::now(),
        };
        Counters::add(&counters.requests);
        seen.note(&header);
        let client = header
            .get(128..144)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u128::from_le_bytes);
        if let Some(peer) = peer
            && client != 0
            && carried != Some(client)
        {
            if let Some(old) = carried {
                addresses.forget(old, token);
            }
            addresses.note(client, token, peer);
            carried = Some(client);
        }
        let Some(answer) = core.handle(conn, &header, body).await else {
            Counters::add(&counters.closed_undecodable);
            break;
        };
        // A poll's batches follow its header unjoined: one vectored write (decision 405).
        let written = if answer.more.is_empty() {
            stream.write_all(answer.frame.bytes()).await
        } else {
            shard::net::io::write_vectored_all(&mut stream, &answer.parts()).await
        };
        if written.is_err() {
            break;
        }
        let written_at = Instant::now();
        if let Some((submitted, replied)) = core.partition_calls.borrow_mut().remove(&conn) {
            timeline::request_done(stamps, Some(submitted), Some(replied), written_at);
        }
        if let Some(call) = core.poll_calls.borrow_mut().remove(&conn) {
            timeline::poll_done(stamps, call, written_at, previous);
        }
        previous = Some(written_at);
    }
    if let Some(client) = carried {
        addresses.forget(client, token);
    }
    core.end_group_session(conn, &seen).await;
}

/// A zeroed buffer of `len` bytes for a request body, with a frame header's room spare: a
/// SendMessages batch becomes its prepare in this allocation, moved into place by the core
/// instead of copied into a fresh one (decision 460). Allocated zeroed (the allocator's fresh
/// pages need no fill pass), then cut to the body.
pub(super) fn body_buffer(len: usize) -> Vec<u8> {
    let mut body = vec![0u8; len + HEADER_SIZE];
    body.truncate(len);
    body
}

/// What a connection saw of its client's session, for ending its consumer-group
/// memberships when it closes (decision 317).
#[derive(Debug, Default)]
struct Seen {
    /// The client id and session of the last request with a session.
    session: Option<(u128, u64)>,
    /// The highest request number seen under that session.
    request: u64,
    /// A JoinConsumerGroup was sent under that session.
    joined: bool,
}

impl Seen {
    fn note(&mut self, frame: &[u8]) {
        let Some(header) = frame
            .first_chunk::<HEADER_SIZE>()
            .and_then(|h| RequestHeader::view(h))
        else {
            return;
        };
        let (client, session) = (header.client.get(), header.session.get());
        if session == 0 || client == 0 {
            return;
        }
        if self.session != Some((client, session)) {
            *self = Seen {
                session: Some((client, session)),
                ..Seen::default()
            };
        }
        self.request = self.request.max(header.request.get());
        self.joined |= header.operation == Operation::JoinConsumerGroup.byte();
    }
}

impl ClientCore {
    /// A connection whose session joined a consumer group closed: the session is over (the
    /// SDK draws a new client id for every connection), so this node proposes its Logout,
    /// numbered after every request the connection carried; at its commit every replica
    /// drops the session's memberships and the group rebalances. Only while the session is
    /// still live and still a member; a refused or lost Logout is logged (the membership
    /// then ends with the session's eviction from the client table, or a Leave).
    async fn end_group_session(&self, conn: u64, seen: &Seen) {
        let Some((client, session)) = seen.session.filter(|_| seen.joined) else {
            return;
        };
        let (user, member) = {
            let user = self.node.reader.sessions().user(client, session);
            let view = self.node.reader.view();
            let member = view
                .state
                .consumer_groups
                .values()
                .flat_map(|g| g.values())
                .any(|g| g.member_of(client).is_some());
            (user, member)
        };
        let (Some(user), true) = (user, member) else {
            return;
        };
        let mut request = ClientRequest::new(
            client,
            Operation::Logout,
            session,
            seen.request.saturating_add(1),
            Vec::new(),
        );
        request
            .header
            .request_checksum
            .set(u128::from(xxhash_rust::xxh3::xxh3_64(&[])));
        request.header.user_id.set(user);
        let reply = self.metadata_call(conn, request).await;
        let ended = reply.command() == Some(Command::Reply)
            && <wire::header::ReplyHeader as Layout>::view(&reply.bytes()[..HEADER_SIZE])
                .is_some_and(|h| h.status.get() == 0);
        if ended {
            Counters::add(&self.node.counters.group_sessions_ended);
        } else {
            tracing::warn!(
                client,
                session,
                "the Logout of a closed consumer-group member's session did not commit"
            );
        }
    }
}

impl ClientCore {
    /// The answer to one Request frame; `None` closes the connection (nothing can be
    /// addressed to a client id 0).
    pub(super) async fn handle(
        &self,
        conn: u64,
        raw_header: &[u8; HEADER_SIZE],
        mut owned_body: Vec<u8>,
    ) -> Option<Answer> {
        let header = match wire::decode::decode_request_parts(
            raw_header,
            &owned_body,
            self.max_message_size,
        ) {
            Ok(header) => *header,
            Err(error) => return refuse_undecodable(raw_header, error).map(Answer::from),
        };
        let body = owned_body.as_slice();
        let operation = Operation::from_byte(header.operation)?;
        let client = header.client.get();
        let session = header.session.get();
        // A stamped request checksum must match the body (client-plane.md §2.3).
        let stamped = header.request_checksum.get();
        if stamped != 0 && stamped != u128::from(xxhash_rust::xxh3::xxh3_64(body)) {
            return Some(Answer::from(frames::refused(
                &header,
                status::INVALID_FORMAT,
            )));
        }
        let user = {
            let sessions = self.node.reader.sessions();
            let user = sessions.user(client, session);
            // A session number is the commit op of its Register: one above what this node has
            // committed is a login this node has not applied yet (a Register answered by
            // another replica). Transient, not an eviction: the SDK resends (decision 153).
            if user.is_none()
                && session != 0
                && operation != Operation::Register
                && session > sessions.op
            {
                return Some(Answer::from(frames::refused(
                    &header,
                    TRANSIENT_NOT_COMMITTED,
                )));
            }
            user
        };
        if operation == Operation::Register && self.logins.get() >= LOGINS_IN_FLIGHT_MAX {
            Counters::add(&self.node.counters.logins_refused);
            return Some(Answer::from(frames::refused(
                &header,
                TRANSIENT_NOT_ACCEPTED,
            )));
        }
        let legacy_code = u32::from_le_bytes(
            header.reserved[..4]
                .try_into()
                .expect("the reserved region is 60 bytes"),
        );
        let round_robin = self.round_robin.get();
        self.round_robin.set(round_robin.wrapping_add(1));
        let decided = {
            let view = self.node.reader.view();
            route(operation, legacy_code, body, user, &view, round_robin)
        };
        let frame = match decided {
            Route::Reply(refusal) => Some(frames::from_refusal(&header, &refusal)),
            Route::Evict(reason, window) => Some(frames::eviction(client, reason, window)),
            Route::Register { user_id, body } => {
                self.logins.set(self.logins.get() + 1);
                let _login = Login(self);
                let mut request = ClientRequest { header, body };
                request.header.user_id.set(user_id);
                // The Argon2id check just ran on this executor: let the shard's other tasks in.
                glommio::executor().yield_now().await;
                Some(self.metadata_call(conn, request).await)
            }
            Route::Metadata(_) => {
                let mut request = ClientRequest {
                    header,
                    body: std::mem::take(&mut owned_body),
                };
                // `route` evicts every replicated op without a session.
                request.header.user_id.set(user?);
                Some(self.metadata_call(conn, request).await)
            }
            Route::Partition { group, .. } => {
                let mut request = ClientRequest {
                    header,
                    body: std::mem::take(&mut owned_body),
                };
                request.header.user_id.set(user?);
                Some(self.partition_call(conn, group, request).await)
            }
            Route::PartitionRewritten {
                group,
                body: rewritten,
                ..
            } => {
                let mut request = ClientRequest {
                    header,
                    body: rewritten,
                };
                request.header.user_id.set(user?);
                Some(self.partition_call(conn, group, request).await)
            }
            Route::SyncGroup(target) => {
                let answer = {
                    let view = self.node.reader.view();
                    crate::metadata::groups::sync_answer(&view, &target, client)
                };
                Some(frames::reply(&header, 0, &answer))
            }
            Route::Poll {
                group,
                partition,
                request,
            } => {
                if request.consumer.group {
                    // The route named the group by its offset key (decision 390).
                    let fenced = match request.consumer.id {
                        crate::client::codec::Identifier::Numeric(key) => {
                            let view = self.node.reader.view();
                            crate::metadata::groups::poll_fence(
                                &view,
                                &request.stream,
                                &request.topic,
                                key,
                                client,
                                partition,
                            )
                        }
                        crate::client::codec::Identifier::Named(_) => {
                            Err(crate::metadata::groups::GROUP_NAME_NOT_FOUND)
                        }
                    };
                    if let Err(code) = fenced {
                        return Some(Answer::from(frames::refused(&header, code)));
                    }
                }
                let target = request.auto_commit.then(|| OffsetTarget {
                    consumer: request.consumer.clone(),
                    stream: request.stream.clone(),
                    topic: request.topic.clone(),
                    partition: Some(partition),
                });
                let started = Instant::now();
                let (answer, times) = self
                    .read_call(
                        conn,
                        &header,
                        group,
                        PartitionRead::Poll {
                            group,
                            partition,
                            request,
                        },
                    )
                    .await;
                let answered = Instant::now();
                if let Some(target) = target
                    && let Some(user) = user
                    && answer.command() == Some(Command::Reply)
                    && let Some(offset) = answer.polled_last_offset()
                {
                    self.auto_commit(conn, &header, group, target, offset, user)
                        .await;
                }
                self.poll_calls.borrow_mut().insert(
                    conn,
                    timeline::PollCall {
                        started,
                        answered,
                        committed: Instant::now(),
                        times,
                    },
                );
                return Some(answer);
            }
            Route::ConsumerOffset {
                group,
                partition,
                consumer,
            } => {
                return Some(
                    self.read_call(
                        conn,
                        &header,
                        group,
                        PartitionRead::Offset {
                            group,
                            partition,
                            consumer,
                        },
                    )
                    .await
                    .0,
                );
            }
            Route::Node(NodeQuery::ClusterMetadata) => {
                Some(frames::reply(&header, 0, &self.cluster_metadata()))
            }
            Route::Node(NodeQuery::Stats) => Some(frames::reply(&header, 0, &self.stats())),
            Route::Prepare(prepare) => Some(self.prepare(conn, header, user?, prepare).await),
            Route::Clients(query) => Some(self.clients(&header, query)),
        };
        frame.map(Answer::from)
    }

    /// Submits to the metadata group (shard 0's pump, directly or over the mesh) and waits.
    pub(super) async fn metadata_call(&self, conn: u64, request: ClientRequest) -> Frame {
        let header = request.header;
        let client = header.client.get();
        let Some(slot) = self.registry.wait_for(client, conn, header.request.get()) else {
            return frames::refused(&header, TRANSIENT_NOT_ACCEPTED);
        };
        let sent = if self.shard == 0 {
            match self.metadata.borrow().as_ref() {
                Some(submit) => {
                    submit(request);
                    true
                }
                None => false,
            }
        } else {
            let message = ShardMsg::Metadata {
                origin: self.shard,
                request: Box::new(request),
            };
            (self.mesh)(0, Lane::Main, message).is_ok()
        };
        if !sent {
            self.registry.forget(client, conn);
            Counters::add(&self.node.counters.mesh_refused);
            return frames::refused(&header, TRANSIENT_NOT_ACCEPTED);
        }
        self.await_reply(conn, &header, &slot).await
    }

    /// Submits to the partition group's shard and waits.
    async fn partition_call(
        &self,
        conn: u64,
        group: wire::GroupId,
        request: ClientRequest,
    ) -> Frame {
        let header = request.header;
        let client = header.client.get();
        let Some(slot) = self.registry.wait_for(client, conn, header.request.get()) else {
            return frames::refused(&header, TRANSIENT_NOT_ACCEPTED);
        };
        let target = self.group_shard(group);
        if target == self.shard {
            if let Err(refused) = self.partitions().submit(group, request) {
                self.registry.forget(client, conn);
                return self.partition_refusal(&header, refused);
            }
        } else {
            let message = ShardMsg::Partition {
                origin: self.shard,
                group,
                request: Box::new(request),
            };
            if (self.mesh)(target, Lane::Main, message).is_err() {
                self.registry.forget(client, conn);
                Counters::add(&self.node.counters.mesh_refused);
                return frames::refused(&header, TRANSIENT_NOT_ACCEPTED);
            }
        }
        let submitted = Instant::now();
        let reply = self.await_reply(conn, &header, &slot).await;
        self.partition_calls
            .borrow_mut()
            .insert(conn, (submitted, Instant::now()));
        reply
    }

    /// Auto-commit of a poll (client-plane.md §8.2; decision 213): stores `offset`, the last
    /// message returned, for the poll's consumer through the partition group, as a
    /// StoreConsumerOffset of the client would, and waits for its commit so that the
    /// consumer's next `Next` poll starts after it. The poll is answered either way; a store
    /// that does not commit (not the group's primary, deadline) is counted and logged.
    async fn auto_commit(
        &self,
        conn: u64,
        poll: &RequestHeader,
        group: wire::GroupId,
        target: OffsetTarget,
        offset: u64,
        user: u32,
    ) {
        let mut body = Vec::new();
        Request::StoreConsumerOffset(StoreConsumerOffset {
            target,
            offset,
            quorum: true,
        })
        .encode(&mut body);
        // Under a client id of its own: a store that misses the deadline and commits later
        // must not answer whatever this client asks next (the registry delivers by client
        // id); partition groups keep no client table, so the id is only the reply's address.
        let client = poll.client.get() ^ (1 << 127);
        let mut request = ClientRequest::new(
            client,
            Operation::StoreConsumerOffset,
            poll.session.get(),
            poll.request.get(),
            body,
        );
        request.header.user_id.set(user);
        let reply = self.partition_call(conn, group, request).await;
        let stored = reply.command() == Some(Command::Reply)
            && <wire::header::ReplyHeader as Layout>::view(&reply.bytes()[..HEADER_SIZE])
                .is_some_and(|h| h.status.get() == 0)
            && matches!(read_result(reply.body()), Ok(Ok(_)));
        if !stored {
            Counters::add(&self.node.counters.auto_commits_failed);
            tracing::warn!(
                client = poll.client.get(),
                group = group.0,
                offset,
                "auto-commit of a poll did not commit; the poll is answered without it"
            );
        }
    }

    /// Answers a partition read here, or on the group's shard over the mesh; with the read's
    /// stages when it ran here (decision 420).
    async fn read_call(
        &self,
        conn: u64,
        header: &RequestHeader,
        group: wire::GroupId,
        read: PartitionRead,
    ) -> (Answer, Option<timeline::ReadTimes>) {
        let target = self.group_shard(group);
        if target == self.shard {
            let (answer, times) = self.answer_read(header, &read).await;
            return (answer, Some(times));
        }
        (self.read_remote(conn, header, target, read).await, None)
    }

    async fn read_remote(
        &self,
        conn: u64,
        header: &RequestHeader,
        target: u16,
        read: PartitionRead,
    ) -> Answer {
        let client = header.client.get();
        let Some(slot) = self.registry.wait_for(client, conn, header.request.get()) else {
            return frames::refused(header, TRANSIENT_NOT_ACCEPTED).into();
        };
        let message = ShardMsg::Read {
            origin: self.shard,
            request: Box::new(*header),
            read: Box::new(read),
        };
        if (self.mesh)(target, Lane::Main, message).is_err() {
            self.registry.forget(client, conn);
            Counters::add(&self.node.counters.mesh_refused);
            return frames::refused(header, TRANSIENT_NOT_ACCEPTED).into();
        }
        self.await_reply(conn, header, &slot).await.into()
    }

    async fn await_reply(&self, conn: u64, header: &RequestHeader, slot: &registry::Slot) -> Frame {
        let reply = futures_lite::future::or(async { Some(slot.wait().await) }, async {
            glommio::timer::sleep(REQUEST_DEADLINE).await;
            None
        })
        .await;
        match reply {
            Some(frame) => echo_operation(frame, header.operation),
            None => {
                self.registry.forget(header.client.get(), conn);
                Counters::add(&self.node.counters.deadline);
                frames::refused(header, TRANSIENT_NOT_COMMITTED)
            }
        }
    }
}

/// Offset of the operation byte in a Reply header (client-plane.md §1.3).
const REPLY_OPERATION_AT: usize = 208;

/// A reply as the client must see it: echoing the operation of its request (client-plane.md
/// §1.3; the SDK picks the body framing by it). The core's reply carries the prepare's operation,
/// which differs where the primary projected the request (CreateTopic is replicated as
/// CreateTopicWithAssignments, 64); only then is the frame copied, with byte 208 rewritten (the
/// client plane carries no frame checksum to reseal).
fn echo_operation(frame: Frame, operation: u8) -> Frame {
    match frame.bytes().get(REPLY_OPERATION_AT) {
        Some(&sent) if sent != operation => {
            let mut bytes = frame.bytes().to_vec();
            bytes[REPLY_OPERATION_AT] = operation;
            Frame::new(bytes)
        }
        _ => frame,
    }
}

/// A Request whose header does not validate (wire.md §11.5): an operation byte the protocol
/// does not define is evicted with InvalidRequestOperation, a replicated op without a session
/// with NoSession (client-plane.md §2.4), anything else malformed with InvalidRequestBody;
/// a client id 0 cannot be addressed and closes the connection.
fn refuse_undecodable(frame: &[u8], error: DecodeError) -> Option<Frame> {
    let header = RequestHeader::view(frame.first_chunk::<HEADER_SIZE>()?)?;
    let client = header.client.get();
    if client == 0 {
        tracing::debug!(%error, "client request with client id 0; closing");
        return None;
    }
    let reason = match error {
        DecodeError::UnknownOperation(_) | DecodeError::ZeroField { field: "operation" } => {
            EvictionReason::InvalidRequestOperation
        }
        DecodeError::ZeroField { field: "session" } => EvictionReason::NoSession,
        _ => EvictionReason::InvalidRequestBody,
    };
    tracing::debug!(%error, client, "client request refused");
    Some(frames::eviction(client, reason, None))
}

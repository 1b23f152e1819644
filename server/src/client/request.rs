//! Client request bodies (client-plane.md §2.2, §6-§9): which command a Request carries, and
//! its decoded body. Anything outside the supported set is classified, never dropped: the
//! answer of every [`RequestError`] is a status code or an Eviction reason.

use wire::Operation;
use wire::decode::EvictionReason;

use super::codec::{
    BodyError, Consumer, Identifier, Name, Options, Partitioning, PollingStrategy, Reader,
    put_str_u8, put_str_u32, read_optional_partition, write_optional_partition,
};
use super::groups::{DeleteConsumerOffset, GroupTarget};
use super::status;
use super::users::{self, code as user_code};

/// Legacy command codes of the NonReplicated operation (client-plane.md §2.2).
pub mod code {
    /// Ping.
    pub const PING: u32 = 1;
    /// GetStats.
    pub const GET_STATS: u32 = 10;
    /// GetClusterMetadata.
    pub const GET_CLUSTER_METADATA: u32 = 12;
    /// Legacy LoginUser (never sent by 0.11 SDKs).
    pub const LEGACY_LOGIN_USER: u32 = 38;
    /// Legacy LoginWithPersonalAccessToken.
    pub const LEGACY_LOGIN_PAT: u32 = 44;
    /// PollMessages.
    pub const POLL_MESSAGES: u32 = 100;
    /// GetConsumerOffset.
    pub const GET_CONSUMER_OFFSET: u32 = 120;
    /// GetStream.
    pub const GET_STREAM: u32 = 200;
    /// GetStreams.
    pub const GET_STREAMS: u32 = 201;
    /// GetTopic.
    pub const GET_TOPIC: u32 = 300;
    /// GetTopics.
    pub const GET_TOPICS: u32 = 301;
    /// GetConsumerGroup.
    pub const GET_CONSUMER_GROUP: u32 = 600;
    /// GetConsumerGroups.
    pub const GET_CONSUMER_GROUPS: u32 = 601;
    /// SyncConsumerGroup.
    pub const SYNC_CONSUMER_GROUP: u32 = 606;
    /// NonReplicated codes the SDK knows and this server does not serve yet (status 5).
    pub const KNOWN_UNSERVED: [u32; 3] = [11, 13, 102];
}

/// The protocol version this server speaks: 0.11.0 packed as `major<<20 | minor<<10 | patch`.
pub const PROTOCOL_VERSION: u32 = 0x2C00;

/// The protocol-version gate of Register (client-plane.md §6.2): any 0.11.x client passes.
/// `Err` carries the window for the Eviction (reason 14, `version` and `min` both 0x2C00).
pub fn check_protocol_version(client: u32) -> Result<(), (u32, u32)> {
    if client >= PROTOCOL_VERSION && client >> 10 <= PROTOCOL_VERSION >> 10 {
        Ok(())
    } else {
        Err((PROTOCOL_VERSION, PROTOCOL_VERSION))
    }
}

/// The ClientVersionInfo prefix of a Register body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientVersion {
    /// Packed semver of the client's protocol.
    pub protocol_version: u32,
    /// SDK name (`rust-sdk`).
    pub sdk_name: Name,
    /// SDK version.
    pub sdk_version: Name,
}

/// What a Register body authenticates with.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// LoginRegister (legacy code 40).
    Password {
        /// Username, 1..=255 bytes.
        username: Name,
        /// Password, 0..=255 bytes. Never logged: `Debug` redacts it.
        password: String,
    },
    /// LoginRegisterWithPat (legacy code 45). Never logged.
    Token(String),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Password { username, .. } => f
                .debug_struct("Password")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
            Credentials::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// A Register body (client-plane.md §6.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    /// The version prefix.
    pub version: ClientVersion,
    /// Username/password or token.
    pub credentials: Credentials,
    /// The client context string (the SDK sends none).
    pub context: String,
}

/// A CreateTopic body (§7.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTopic {
    /// The stream.
    pub stream: Identifier,
    /// Partitions to create.
    pub partitions_count: u32,
    /// The topic's name.
    pub name: Name,
    /// Options as sent (validated by the metadata state machine).
    pub options: Options,
}

/// A SendMessages envelope and its batch (§8.1). The batch is borrowed, not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendMessages<'a> {
    /// The stream.
    pub stream: Identifier,
    /// The topic.
    pub topic: Identifier,
    /// How to pick the partition.
    pub partitioning: Partitioning,
    /// The envelope's message count (equals the batch header's).
    pub messages_count: u32,
    /// The batch: 256-byte header and frames (checked by the partition plane at admission).
    pub batch: &'a [u8],
}

/// A PollMessages body (§8.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollMessages {
    /// Who polls.
    pub consumer: Consumer,
    /// The stream.
    pub stream: Identifier,
    /// The topic.
    pub topic: Identifier,
    /// The partition; absent means 0 for a plain consumer.
    pub partition: Option<u32>,
    /// Where to start.
    pub strategy: PollingStrategy,
    /// At most this many messages.
    pub count: u32,
    /// Store the last returned offset for this consumer.
    pub auto_commit: bool,
}

/// Where a consumer offset lives (§9): consumer, stream, topic, partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetTarget {
    /// Whose offset.
    pub consumer: Consumer,
    /// The stream.
    pub stream: Identifier,
    /// The topic.
    pub topic: Identifier,
    /// The partition; absent means 0.
    pub partition: Option<u32>,
}

/// A StoreConsumerOffset body (§9.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConsumerOffset {
    /// Where.
    pub target: OffsetTarget,
    /// The offset of the last consumed message.
    pub offset: u64,
    /// Replicate before answering (1, Quorum) or not (0, NoAck).
    pub quorum: bool,
}

/// A decoded client request of the supported set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// NonReplicated 1.
    Ping,
    /// NonReplicated 10.
    GetStats,
    /// NonReplicated 12.
    GetClusterMetadata,
    /// Operation 1.
    Register(Login),
    /// Operation 3.
    Logout,
    /// Operation 128: name and options (which must be empty, §7.1).
    CreateStream {
        /// The name.
        name: Name,
        /// Options as sent.
        options: Options,
    },
    /// NonReplicated 200.
    GetStream(Identifier),
    /// NonReplicated 201.
    GetStreams,
    /// Operation 130.
    DeleteStream(Identifier),
    /// Operation 132.
    CreateTopic(CreateTopic),
    /// NonReplicated 300.
    GetTopic {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
    },
    /// Operation 160.
    SendMessages(SendMessages<'a>),
    /// NonReplicated 100.
    PollMessages(PollMessages),
    /// Operation 161.
    StoreConsumerOffset(StoreConsumerOffset),
    /// NonReplicated 120.
    GetConsumerOffset(OffsetTarget),
    /// Operation 162.
    DeleteConsumerOffset(DeleteConsumerOffset),
    /// NonReplicated 301.
    GetTopics(Identifier),
    /// Operation 139.
    CreateConsumerGroup {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
        /// The group's name.
        name: Name,
    },
    /// Operation 140.
    DeleteConsumerGroup(GroupTarget),
    /// Operation 148.
    JoinConsumerGroup(GroupTarget),
    /// Operation 149.
    LeaveConsumerGroup(GroupTarget),
    /// NonReplicated 600.
    GetConsumerGroup(GroupTarget),
    /// NonReplicated 601.
    GetConsumerGroups {
        /// The stream.
        stream: Identifier,
        /// The topic.
        topic: Identifier,
    },
    /// NonReplicated 606.
    SyncConsumerGroup(GroupTarget),
    /// Operation 141.
    CreateUser(users::CreateUser),
    /// NonReplicated 31.
    GetUser(Identifier),
    /// NonReplicated 32.
    GetUsers,
    /// Operation 142.
    UpdateUser(users::UpdateUser),
    /// Operation 143.
    DeleteUser(Identifier),
    /// Operation 144.
    ChangePassword(users::ChangePassword),
    /// Operation 145.
    UpdatePermissions(users::UpdatePermissions),
    /// Operation 146: token name and expiry (µs; 0 server default, `u64::MAX` never).
    CreatePersonalAccessToken {
        /// Name.
        name: Name,
        /// Expiry.
        expiry: u64,
    },
    /// NonReplicated 41.
    GetPersonalAccessTokens,
    /// Operation 147.
    DeletePersonalAccessToken(Name),
    /// NonReplicated 20.
    GetMe,
    /// NonReplicated 21: the client id as the SDK numbers clients (u32).
    GetClient(u32),
    /// NonReplicated 22.
    GetClients,
    /// Operations 129, 131, 133-137: stream and topic lifecycle ([`super::lifecycle`]).
    Lifecycle(super::lifecycle::Lifecycle),
}

/// How to answer a request that is not served: a status (Reply) or an Eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A Reply with this error code (the channel follows the operation, see
    /// [`super::reply::refusal`]).
    Status(u32),
    /// An Eviction with this reason.
    Evict(EvictionReason),
}

/// Why a request is not one of the supported set, or its body does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Operation 0 or a server-internal operation (64..=68) on the client wire.
    #[error("operation {0:?} is never valid from a client")]
    InvalidOperation(Operation),
    /// A command the protocol has and this server does not serve yet.
    #[error("operation {operation:?} (code {code}) is not available")]
    Unavailable {
        /// The wire operation.
        operation: Operation,
        /// The legacy code (NonReplicated only, else 0).
        code: u32,
    },
    /// A NonReplicated code nobody knows.
    #[error("unknown command code {0}")]
    UnknownCode(u32),
    /// Legacy login codes 38/44 (§2.4).
    #[error("legacy login code {0}")]
    LegacyLogin(u32),
    /// The body does not decode for its command.
    #[error("{operation:?} (code {code}) body: {error}")]
    Body {
        /// The wire operation.
        operation: Operation,
        /// The legacy code (NonReplicated only, else 0).
        code: u32,
        /// What is wrong.
        error: BodyError,
    },
}

impl RequestError {
    /// The answer the client gets (§2.4, §4).
    pub fn answer(&self) -> Answer {
        match *self {
            RequestError::InvalidOperation(_) => {
                Answer::Evict(EvictionReason::InvalidRequestOperation)
            }
            RequestError::Unavailable { .. } => Answer::Status(status::FEATURE_UNAVAILABLE),
            RequestError::UnknownCode(_) => Answer::Status(status::INVALID_COMMAND),
            RequestError::LegacyLogin(_) => Answer::Evict(EvictionReason::MalformedLogin),
            RequestError::Body {
                operation: Operation::Register,
                ..
            } => Answer::Evict(EvictionReason::MalformedLogin),
            RequestError::Body {
                error: BodyError::IdentifierKind(_) | BodyError::IdentifierLength { .. },
                ..
            } => Answer::Status(status::INVALID_IDENTIFIER),
            RequestError::Body { .. } => Answer::Status(status::INVALID_COMMAND),
        }
    }
}

impl<'a> Request<'a> {
    /// Classifies and decodes a request from its header's `operation`, its legacy `code`
    /// (read only for NonReplicated) and its body.
    pub fn decode(
        operation: Operation,
        code: u32,
        body: &'a [u8],
    ) -> Result<Request<'a>, RequestError> {
        let code = if operation == Operation::NonReplicated {
            code
        } else {
            0
        };
        let body_error = |error| RequestError::Body {
            operation,
            code,
            error,
        };
        decode_body(operation, code, body).map_err(|e| match e {
            Decode::Body(error) => body_error(error),
            Decode::Other(e) => e,
        })
    }

    /// The wire operation and legacy code this request travels with.
    pub fn operation(&self) -> (Operation, u32) {
        use Request::*;
        let nr = |code| (Operation::NonReplicated, code);
        match self {
            Ping => nr(code::PING),
            GetStats => nr(code::GET_STATS),
            GetClusterMetadata => nr(code::GET_CLUSTER_METADATA),
            Register(_) => (Operation::Register, 0),
            Logout => (Operation::Logout, 0),
            CreateStream { .. } => (Operation::CreateStream, 0),
            GetStream(_) => nr(code::GET_STREAM),
            GetStreams => nr(code::GET_STREAMS),
            DeleteStream(_) => (Operation::DeleteStream, 0),
            CreateTopic(_) => (Operation::CreateTopic, 0),
            GetTopic { .. } => nr(code::GET_TOPIC),
            SendMessages(_) => (Operation::SendMessages, 0),
            PollMessages(_) => nr(code::POLL_MESSAGES),
            StoreConsumerOffset(_) => (Operation::StoreConsumerOffset, 0),
            GetConsumerOffset(_) => nr(code::GET_CONSUMER_OFFSET),
            DeleteConsumerOffset(_) => (Operation::DeleteConsumerOffset, 0),
            GetTopics(_) => nr(code::GET_TOPICS),
            CreateConsumerGroup { .. } => (Operation::CreateConsumerGroup, 0),
            DeleteConsumerGroup(_) => (Operation::DeleteConsumerGroup, 0),
            JoinConsumerGroup(_) => (Operation::JoinConsumerGroup, 0),
            LeaveConsumerGroup(_) => (Operation::LeaveConsumerGroup, 0),
            GetConsumerGroup(_) => nr(code::GET_CONSUMER_GROUP),
            GetConsumerGroups { .. } => nr(code::GET_CONSUMER_GROUPS),
            SyncConsumerGroup(_) => nr(code::SYNC_CONSUMER_GROUP),
            CreateUser(_) => (Operation::CreateUser, 0),
            GetUser(_) => nr(user_code::GET_USER),
            GetUsers => nr(user_code::GET_USERS),
            UpdateUser(_) => (Operation::UpdateUser, 0),
            DeleteUser(_) => (Operation::DeleteUser, 0),
            ChangePassword(_) => (Operation::ChangePassword, 0),
            UpdatePermissions(_) => (Operation::UpdatePermissions, 0),
            CreatePersonalAccessToken { .. } => (Operation::CreatePersonalAccessToken, 0),
            GetPersonalAccessTokens => nr(user_code::GET_PERSONAL_ACCESS_TOKENS),
            DeletePersonalAccessToken(_) => (Operation::DeletePersonalAccessToken, 0),
            GetMe => nr(user_code::GET_ME),
            GetClient(_) => nr(user_code::GET_CLIENT),
            GetClients => nr(user_code::GET_CLIENTS),
            Lifecycle(l) => (l.operation(), 0),
        }
    }

    /// Encodes the body (what a client sends); `decode` of it gives back `self`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        use Request::*;
        match self {
            Ping
            | GetStats
            | GetClusterMetadata
            | Logout
            | GetStreams
            | GetUsers
            | GetPersonalAccessTokens
            | GetMe
            | GetClients => {}
            CreateUser(c) => c.write(out),
            GetUser(id) | DeleteUser(id) => id.write(out),
            UpdateUser(u) => u.write(out),
            ChangePassword(c) => c.write(out),
            UpdatePermissions(u) => u.write(out),
            CreatePersonalAccessToken { name, expiry } => {
                name.write(out);
                out.extend_from_slice(&expiry.to_le_bytes());
            }
            DeletePersonalAccessToken(name) => name.write(out),
            GetClient(id) => out.extend_from_slice(&id.to_le_bytes()),
            Register(login) => {
                out.extend_from_slice(&login.version.protocol_version.to_le_bytes());
                login.version.sdk_name.write(out);
                login.version.sdk_version.write(out);
                match &login.credentials {
                    Credentials::Password { username, password } => {
                        username.write(out);
                        put_str_u8(out, password);
                    }
                    Credentials::Token(token) => put_str_u8(out, token),
                }
                put_str_u32(out, &login.context);
            }
            CreateStream { name, options } => {
                name.write(out);
                options.encode(out);
            }
            GetStream(id) | DeleteStream(id) => id.write(out),
            CreateTopic(t) => {
                t.stream.write(out);
                out.extend_from_slice(&t.partitions_count.to_le_bytes());
                t.name.write(out);
                t.options.encode(out);
            }
            GetTopic { stream, topic } => {
                stream.write(out);
                topic.write(out);
            }
            SendMessages(s) => {
                let at = out.len();
                out.extend_from_slice(&[0; 4]);
                s.stream.write(out);
                s.topic.write(out);
                s.partitioning.write(out);
                out.extend_from_slice(&s.messages_count.to_le_bytes());
                let len = u32::try_from(out.len() - at - 4).expect("envelope fits");
                out[at..at + 4].copy_from_slice(&len.to_le_bytes());
                out.extend_from_slice(s.batch);
            }
            PollMessages(p) => {
                p.consumer.write(out);
                p.stream.write(out);
                p.topic.write(out);
                write_optional_partition(out, p.partition);
                p.strategy.write(out);
                out.extend_from_slice(&p.count.to_le_bytes());
                out.push(u8::from(p.auto_commit));
            }
            StoreConsumerOffset(s) => {
                write_target(out, &s.target);
                out.extend_from_slice(&s.offset.to_le_bytes());
                out.push(u8::from(s.quorum));
            }
            GetConsumerOffset(target) => write_target(out, target),
            DeleteConsumerOffset(d) => {
                write_target(out, &d.target);
                out.push(u8::from(d.quorum));
            }
            GetTopics(stream) => stream.write(out),
            CreateConsumerGroup {
                stream,
                topic,
                name,
            } => {
                stream.write(out);
                topic.write(out);
                name.write(out);
            }
            DeleteConsumerGroup(g)
            | JoinConsumerGroup(g)
            | LeaveConsumerGroup(g)
            | GetConsumerGroup(g)
            | SyncConsumerGroup(g) => g.write(out),
            GetConsumerGroups { stream, topic } => {
                stream.write(out);
                topic.write(out);
            }
            Lifecycle(l) => l.encode(out),
        }
    }
}

enum Decode {
    Body(BodyError),
    Other(RequestError),
}

impl From<BodyError> for Decode {
    fn from(e: BodyError) -> Decode {
        Decode::Body(e)
    }
}

fn decode_body(operation: Operation, code: u32, body: &[u8]) -> Result<Request<'_>, Decode> {
    let mut r = Reader::new(body);
    let request = match operation {
        Operation::NonReplicated => match code {
            code::PING => Request::Ping,
            code::GET_STATS => Request::GetStats,
            code::GET_CLUSTER_METADATA => Request::GetClusterMetadata,
            code::GET_STREAM => Request::GetStream(Identifier::read(&mut r, "stream id")?),
            code::GET_STREAMS => Request::GetStreams,
            code::GET_TOPIC => Request::GetTopic {
                stream: Identifier::read(&mut r, "stream id")?,
                topic: Identifier::read(&mut r, "topic id")?,
            },
            code::POLL_MESSAGES => Request::PollMessages(PollMessages {
                consumer: Consumer::read(&mut r)?,
                stream: Identifier::read(&mut r, "stream id")?,
                topic: Identifier::read(&mut r, "topic id")?,
                partition: read_optional_partition(&mut r)?,
                strategy: PollingStrategy::read(&mut r)?,
                count: r.u32("count")?,
                auto_commit: r.u8("auto_commit")? != 0,
            }),
            code::GET_CONSUMER_OFFSET => Request::GetConsumerOffset(read_target(&mut r)?),
            code::GET_TOPICS => Request::GetTopics(Identifier::read(&mut r, "stream id")?),
            code::GET_CONSUMER_GROUP => Request::GetConsumerGroup(GroupTarget::read(&mut r)?),
            code::GET_CONSUMER_GROUPS => Request::GetConsumerGroups {
                stream: Identifier::read(&mut r, "stream id")?,
                topic: Identifier::read(&mut r, "topic id")?,
            },
            code::SYNC_CONSUMER_GROUP => Request::SyncConsumerGroup(GroupTarget::read(&mut r)?),
            user_code::GET_USER => Request::GetUser(Identifier::read(&mut r, "user id")?),
            user_code::GET_USERS => Request::GetUsers,
            user_code::GET_PERSONAL_ACCESS_TOKENS => Request::GetPersonalAccessTokens,
            user_code::GET_ME => Request::GetMe,
            user_code::GET_CLIENT => Request::GetClient(r.u32("client id")?),
            user_code::GET_CLIENTS => Request::GetClients,
            code::LEGACY_LOGIN_USER | code::LEGACY_LOGIN_PAT => {
                return Err(Decode::Other(RequestError::LegacyLogin(code)));
            }
            c if code::KNOWN_UNSERVED.contains(&c) || Operation::from_client_code(c).is_some() => {
                return Err(Decode::Other(RequestError::Unavailable { operation, code }));
            }
            // Register and Logout codes carried as NonReplicated: their operation is the only
            // way to reach them (§2.2), so the code alone names an unavailable route.
            39 | 40 | 45 => {
                return Err(Decode::Other(RequestError::Unavailable { operation, code }));
            }
            c => return Err(Decode::Other(RequestError::UnknownCode(c))),
        },
        Operation::Register => return Ok(Request::Register(decode_login(body)?)),
        Operation::Logout => Request::Logout,
        Operation::CreateStream => {
            let name = Name::read(&mut r, "stream name")?;
            Request::CreateStream {
                name,
                options: Options::decode(r.rest())?,
            }
        }
        Operation::DeleteStream => Request::DeleteStream(Identifier::read(&mut r, "stream id")?),
        Operation::CreateTopic => {
            let stream = Identifier::read(&mut r, "stream id")?;
            let partitions_count = r.u32("partitions_count")?;
            let name = Name::read(&mut r, "topic name")?;
            Request::CreateTopic(CreateTopic {
                stream,
                partitions_count,
                name,
                options: Options::decode(r.rest())?,
            })
        }
        Operation::SendMessages => Request::SendMessages(decode_send(&mut r)?),
        Operation::CreateUser => Request::CreateUser(users::CreateUser::read(&mut r)?),
        Operation::UpdateUser => Request::UpdateUser(users::UpdateUser::read(&mut r)?),
        Operation::DeleteUser => Request::DeleteUser(Identifier::read(&mut r, "user id")?),
        Operation::ChangePassword => Request::ChangePassword(users::ChangePassword::read(&mut r)?),
        Operation::UpdatePermissions => {
            Request::UpdatePermissions(users::UpdatePermissions::read(&mut r)?)
        }
        Operation::CreatePersonalAccessToken => Request::CreatePersonalAccessToken {
            name: Name::read(&mut r, "token name")?,
            expiry: r.u64("expiry")?,
        },
        Operation::DeletePersonalAccessToken => {
            Request::DeletePersonalAccessToken(Name::read(&mut r, "token name")?)
        }
        Operation::StoreConsumerOffset => {
            let target = read_target(&mut r)?;
            let offset = r.u64("offset")?;
            let quorum = r.bool("ack")?;
            Request::StoreConsumerOffset(StoreConsumerOffset {
                target,
                offset,
                quorum,
            })
        }
        Operation::DeleteConsumerOffset => {
            let target = read_target(&mut r)?;
            let quorum = r.bool("ack")?;
            Request::DeleteConsumerOffset(DeleteConsumerOffset { target, quorum })
        }
        Operation::CreateConsumerGroup => Request::CreateConsumerGroup {
            stream: Identifier::read(&mut r, "stream id")?,
            topic: Identifier::read(&mut r, "topic id")?,
            name: Name::read(&mut r, "group name")?,
        },
        Operation::DeleteConsumerGroup => Request::DeleteConsumerGroup(GroupTarget::read(&mut r)?),
        Operation::JoinConsumerGroup => Request::JoinConsumerGroup(GroupTarget::read(&mut r)?),
        Operation::LeaveConsumerGroup => Request::LeaveConsumerGroup(GroupTarget::read(&mut r)?),
        op if super::lifecycle::Lifecycle::serves(op) => {
            match super::lifecycle::Lifecycle::read(op, &mut r) {
                Some(decoded) => Request::Lifecycle(decoded?),
                None => return Err(Decode::Other(RequestError::Unavailable { operation, code })),
            }
        }
        Operation::Reserved => {
            return Err(Decode::Other(RequestError::InvalidOperation(operation)));
        }
        op if op.is_internal() => {
            return Err(Decode::Other(RequestError::InvalidOperation(operation)));
        }
        _ => return Err(Decode::Other(RequestError::Unavailable { operation, code })),
    };
    r.finish()?;
    Ok(request)
}

fn read_target(r: &mut Reader<'_>) -> Result<OffsetTarget, BodyError> {
    Ok(OffsetTarget {
        consumer: Consumer::read(r)?,
        stream: Identifier::read(r, "stream id")?,
        topic: Identifier::read(r, "topic id")?,
        partition: read_optional_partition(r)?,
    })
}

fn write_target(out: &mut Vec<u8>, target: &OffsetTarget) {
    target.consumer.write(out);
    target.stream.write(out);
    target.topic.write(out);
    write_optional_partition(out, target.partition);
}

/// Offset of `message_count` (u32) in the batch header (§8.1).
const BATCH_MESSAGE_COUNT_AT: usize = 48;
/// Size of the batch header.
pub const BATCH_HEADER_SIZE: usize = 256;

fn decode_send<'a>(r: &mut Reader<'a>) -> Result<SendMessages<'a>, BodyError> {
    let declared = r.u32("metadata_length")?;
    let before = r.remaining();
    let stream = Identifier::read(r, "stream id")?;
    let topic = Identifier::read(r, "topic id")?;
    let partitioning = Partitioning::read(r)?;
    let messages_count = r.u32("messages_count")?;
    let actual = (before - r.remaining()) as u32;
    if declared != actual {
        return Err(BodyError::MetadataLength { declared, actual });
    }
    let batch = r.rest();
    let header = batch.get(..BATCH_HEADER_SIZE).ok_or(BodyError::Truncated {
        field: "batch header",
    })?;
    let in_batch = u32::from_le_bytes(
        header[BATCH_MESSAGE_COUNT_AT..BATCH_MESSAGE_COUNT_AT + 4]
            .try_into()
            .expect("4 bytes"),
    );
    if in_batch != messages_count {
        return Err(BodyError::MessagesCount {
            envelope: messages_count,
            batch: in_batch,
        });
    }
    Ok(SendMessages {
        stream,
        topic,
        partitioning,
        messages_count,
        batch,
    })
}

/// Decodes a Register body: the username/password shape first, then the token shape (as the
/// reference does, §6.2).
pub fn decode_login(body: &[u8]) -> Result<Login, BodyError> {
    let mut r = Reader::new(body);
    let version = ClientVersion {
        protocol_version: r.u32("protocol_version")?,
        sdk_name: Name::read(&mut r, "sdk_name")?,
        sdk_version: Name::read(&mut r, "sdk_version")?,
    };
    let after_version = r;
    let password_shape = (|| {
        let username = Name::read(&mut r, "username")?;
        let password = r.str_u8(0, "password")?.to_owned();
        let context = r.str_u32("client_context")?.to_owned();
        r.finish()?;
        Ok::<_, BodyError>((Credentials::Password { username, password }, context))
    })();
    let (credentials, context) = match password_shape {
        Ok(found) => found,
        Err(first) => {
            let mut r = after_version;
            let token = (|| {
                let token = r.str_u8(1, "token")?.to_owned();
                let context = r.str_u32("client_context")?.to_owned();
                r.finish()?;
                Ok::<_, BodyError>((Credentials::Token(token), context))
            })();
            token.map_err(|_| first)?
        }
    };
    Ok(Login {
        version,
        credentials,
        context,
    })
}

/// The Register body the receiving shard hands to consensus after it authenticated the
/// client: the version prefix and the username, without the password or token and without
/// the client context. A prepare body is journaled and replicated to every node, so a secret
/// left in it would be on every disk in the cluster; the core reads nothing of a Register
/// body (the authenticated user travels in the header's `user_id`).
pub fn register_prepare_body(login: &Login) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&login.version.protocol_version.to_le_bytes());
    login.version.sdk_name.write(&mut out);
    login.version.sdk_version.write(&mut out);
    if let Credentials::Password { username, .. } = &login.credentials {
        username.write(&mut out);
    }
    out
}

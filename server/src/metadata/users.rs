//! Users beyond their name and password (issue 11, decisions 300-314): status, creation
//! time, permissions and personal access tokens, and the permission rules every command is
//! checked against.
//!
//! These live beside [`super::state::User`] in [`super::state::State::accounts`] (one entry
//! per user id; a user without one is active, created at 0, without permissions or tokens),
//! so the user record and its snapshot section stay as they were and this part is appended.
//!
//! Permissions follow the reference's model (client-plane.md §2.2; the SDK's permission
//! layout): ten global flags, six per stream and four per topic within a stream. A manage
//! flag implies its read flag; reading a stream or topic implies polling its messages and
//! managing it implies sending (decision 302). The root user (id 0) holds every permission
//! whatever is stored.

use std::collections::BTreeMap;

use super::ROOT_USER_ID;
use crate::client::codec::{BodyError, Name, Reader};

/// User status as the SDK codes it: active.
pub const STATUS_ACTIVE: u8 = 1;
/// User status as the SDK codes it: inactive.
pub const STATUS_INACTIVE: u8 = 2;

/// Personal access tokens one user may hold (the reference's default limit).
pub const TOKENS_PER_USER_MAX: usize = 100;
/// Users the state holds at most (root included): the state is copied per publish.
pub const USERS_MAX: usize = 10_000;

/// The ten global permissions, in the SDK's wire order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)]
pub struct GlobalPermissions {
    /// Manage the server (implies read).
    pub manage_servers: bool,
    /// Read server information: stats, clients.
    pub read_servers: bool,
    /// Create, update, delete users and their permissions (implies read).
    pub manage_users: bool,
    /// Read users.
    pub read_users: bool,
    /// Create, update, delete any stream (implies everything below it).
    pub manage_streams: bool,
    /// Read any stream and its topics; poll their messages.
    pub read_streams: bool,
    /// Create, update, delete topics in any stream.
    pub manage_topics: bool,
    /// Read topics in any stream.
    pub read_topics: bool,
    /// Poll messages from any topic.
    pub poll_messages: bool,
    /// Send messages to any topic.
    pub send_messages: bool,
}

/// The permissions on one stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)]
pub struct StreamPermissions {
    /// Update or delete this stream; manage its topics and send to them.
    pub manage_stream: bool,
    /// Read this stream and its topics; poll their messages.
    pub read_stream: bool,
    /// Create, update, delete topics of this stream.
    pub manage_topics: bool,
    /// Read topics of this stream.
    pub read_topics: bool,
    /// Poll messages from this stream's topics.
    pub poll_messages: bool,
    /// Send messages to this stream's topics.
    pub send_messages: bool,
    /// Per-topic permissions, by topic id.
    pub topics: BTreeMap<u32, TopicPermissions>,
}

/// The permissions on one topic within a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)]
pub struct TopicPermissions {
    /// Update, delete, purge this topic; send to it.
    pub manage_topic: bool,
    /// Read this topic; poll its messages.
    pub read_topic: bool,
    /// Poll messages from this topic.
    pub poll_messages: bool,
    /// Send messages to this topic.
    pub send_messages: bool,
}

/// A user's permissions: global and per stream (by stream id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    /// Global flags.
    pub global: GlobalPermissions,
    /// Per-stream permissions.
    pub streams: BTreeMap<u32, StreamPermissions>,
}

/// The most streams one permission set may name, and topics per stream: bounds what a
/// client body can make the state hold.
pub const PERMISSION_ENTRIES_MAX: usize = 10_000;

fn flag(r: &mut Reader<'_>, field: &'static str) -> Result<bool, BodyError> {
    // The SDK reads any non-zero byte as true; so do we.
    Ok(r.u8(field)? != 0)
}

impl Permissions {
    /// Every global permission (what root holds).
    pub fn all() -> Permissions {
        Permissions {
            global: GlobalPermissions {
                manage_servers: true,
                read_servers: true,
                manage_users: true,
                read_users: true,
                manage_streams: true,
                read_streams: true,
                manage_topics: true,
                read_topics: true,
                poll_messages: true,
                send_messages: true,
            },
            streams: BTreeMap::new(),
        }
    }

    /// Encodes in the SDK's layout: ten global bytes, then a has-next chained list of
    /// streams (id, six flags, a has-next chained list of topics: id, four flags).
    pub fn write(&self, out: &mut Vec<u8>) {
        let g = &self.global;
        for f in [
            g.manage_servers,
            g.read_servers,
            g.manage_users,
            g.read_users,
            g.manage_streams,
            g.read_streams,
            g.manage_topics,
            g.read_topics,
            g.poll_messages,
            g.send_messages,
        ] {
            out.push(u8::from(f));
        }
        out.push(u8::from(!self.streams.is_empty()));
        let last_stream = self.streams.len().saturating_sub(1);
        for (i, (id, s)) in self.streams.iter().enumerate() {
            out.extend_from_slice(&id.to_le_bytes());
            for f in [
                s.manage_stream,
                s.read_stream,
                s.manage_topics,
                s.read_topics,
                s.poll_messages,
                s.send_messages,
            ] {
                out.push(u8::from(f));
            }
            out.push(u8::from(!s.topics.is_empty()));
            let last_topic = s.topics.len().saturating_sub(1);
            for (j, (topic, t)) in s.topics.iter().enumerate() {
                out.extend_from_slice(&topic.to_le_bytes());
                for f in [
                    t.manage_topic,
                    t.read_topic,
                    t.poll_messages,
                    t.send_messages,
                ] {
                    out.push(u8::from(f));
                }
                out.push(u8::from(j != last_topic));
            }
            out.push(u8::from(i != last_stream));
        }
    }

    /// The encoding as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }

    /// Decodes the SDK's layout. A stream or topic named twice, or more than
    /// [`PERMISSION_ENTRIES_MAX`] of either, is refused.
    pub fn read(r: &mut Reader<'_>) -> Result<Permissions, BodyError> {
        let global = GlobalPermissions {
            manage_servers: flag(r, "manage_servers")?,
            read_servers: flag(r, "read_servers")?,
            manage_users: flag(r, "manage_users")?,
            read_users: flag(r, "read_users")?,
            manage_streams: flag(r, "manage_streams")?,
            read_streams: flag(r, "read_streams")?,
            manage_topics: flag(r, "manage_topics")?,
            read_topics: flag(r, "read_topics")?,
            poll_messages: flag(r, "poll_messages")?,
            send_messages: flag(r, "send_messages")?,
        };
        let mut streams = BTreeMap::new();
        let mut more = flag(r, "has_streams")?;
        while more {
            let id = r.u32("permission stream id")?;
            let mut s = StreamPermissions {
                manage_stream: flag(r, "manage_stream")?,
                read_stream: flag(r, "read_stream")?,
                manage_topics: flag(r, "manage_topics")?,
                read_topics: flag(r, "read_topics")?,
                poll_messages: flag(r, "poll_messages")?,
                send_messages: flag(r, "send_messages")?,
                topics: BTreeMap::new(),
            };
            let mut more_topics = flag(r, "has_topics")?;
            while more_topics {
                let topic = r.u32("permission topic id")?;
                let t = TopicPermissions {
                    manage_topic: flag(r, "manage_topic")?,
                    read_topic: flag(r, "read_topic")?,
                    poll_messages: flag(r, "poll_messages")?,
                    send_messages: flag(r, "send_messages")?,
                };
                if s.topics.len() == PERMISSION_ENTRIES_MAX || s.topics.insert(topic, t).is_some() {
                    return Err(BodyError::Length {
                        field: "topic permissions",
                        len: u64::from(topic),
                    });
                }
                more_topics = flag(r, "has_next_topic")?;
            }
            if streams.len() == PERMISSION_ENTRIES_MAX || streams.insert(id, s).is_some() {
                return Err(BodyError::Length {
                    field: "stream permissions",
                    len: u64::from(id),
                });
            }
            more = flag(r, "has_next_stream")?;
        }
        Ok(Permissions { global, streams })
    }

    /// Decodes an optional permission block as CreateUser, UpdatePermissions and the user
    /// details reply carry it: `u8 has` then, when 1, `u32 len` and exactly `len` bytes.
    pub fn read_optional(r: &mut Reader<'_>) -> Result<Option<Permissions>, BodyError> {
        if r.u8("has_permissions")? != 1 {
            return Ok(None);
        }
        let len = r.u32("permissions length")?;
        let bytes = r.take(usize::try_from(len).unwrap_or(usize::MAX), "permissions")?;
        let mut inner = Reader::new(bytes);
        let permissions = Permissions::read(&mut inner)?;
        inner.finish()?;
        Ok(Some(permissions))
    }

    /// Encodes an optional block as [`Permissions::read_optional`] reads it.
    pub fn write_optional(permissions: Option<&Permissions>, out: &mut Vec<u8>) {
        match permissions {
            Some(p) => {
                out.push(1);
                let bytes = p.to_bytes();
                out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                out.extend_from_slice(&bytes);
            }
            None => out.push(0),
        }
    }
}

/// A stored personal access token: its name, expiry and the BLAKE3 hash of its secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// When it stops working, µs since the epoch; `None` never.
    pub expiry_at: Option<u64>,
    /// BLAKE3 of the token text (the token is 32 random bytes: a fast hash is enough,
    /// decision 306).
    pub hash: [u8; 32],
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("expiry_at", &self.expiry_at)
            .finish_non_exhaustive()
    }
}

/// The hash a token is stored and looked up by.
pub fn token_hash(token: &str) -> [u8; 32] {
    *blake3::Hasher::new_derive_key("strand 2026 personal access token")
        .update(token.as_bytes())
        .finalize()
        .as_bytes()
}

/// What a user has beyond name and password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// [`STATUS_ACTIVE`] or [`STATUS_INACTIVE`].
    pub status: u8,
    /// Creation time, µs (the prepare's timestamp).
    pub created_at: u64,
    /// Permissions, if any were given.
    pub permissions: Option<Permissions>,
    /// Personal access tokens by name.
    pub tokens: BTreeMap<Name, Token>,
}

impl Default for Account {
    fn default() -> Account {
        Account {
            status: STATUS_ACTIVE,
            created_at: 0,
            permissions: None,
            tokens: BTreeMap::new(),
        }
    }
}

impl Account {
    /// Encodes for the snapshot section.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(self.status);
        out.extend_from_slice(&self.created_at.to_le_bytes());
        Permissions::write_optional(self.permissions.as_ref(), out);
        out.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        for (name, token) in &self.tokens {
            name.write(out);
            out.extend_from_slice(&token.expiry_at.unwrap_or(0).to_le_bytes());
            out.extend_from_slice(&token.hash);
        }
    }

    /// Decodes the snapshot section's entry.
    pub fn read(r: &mut Reader<'_>) -> Result<Account, BodyError> {
        let status = r.u8("user status")?;
        if status != STATUS_ACTIVE && status != STATUS_INACTIVE {
            return Err(BodyError::Length {
                field: "user status",
                len: u64::from(status),
            });
        }
        let created_at = r.u64("user created_at")?;
        let permissions = Permissions::read_optional(r)?;
        let count = r.u32("token count")?;
        if count as usize > TOKENS_PER_USER_MAX {
            return Err(BodyError::Length {
                field: "token count",
                len: u64::from(count),
            });
        }
        let mut tokens = BTreeMap::new();
        for _ in 0..count {
            let name = Name::read(r, "token name")?;
            let expiry = r.u64("token expiry")?;
            let hash = r.array::<32>("token hash")?;
            let token = Token {
                expiry_at: (expiry != 0).then_some(expiry),
                hash,
            };
            if tokens.insert(name, token).is_some() {
                return Err(BodyError::Length {
                    field: "duplicate token name",
                    len: 0,
                });
            }
        }
        Ok(Account {
            status,
            created_at,
            permissions,
            tokens,
        })
    }
}

/// What a command needs (decision 302). Every client command maps to one of these (or to
/// none: Ping, login, logout, GetMe, GetClusterMetadata and the caller's own tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// GetStats, GetClients, GetClient.
    ReadServers,
    /// GetUser of another user, GetUsers.
    ReadUsers,
    /// CreateUser, UpdateUser, DeleteUser, UpdatePermissions, another user's password.
    ManageUsers,
    /// GetStreams.
    ReadStreams,
    /// CreateStream.
    CreateStream,
    /// GetStream.
    ReadStream(u32),
    /// DeleteStream, UpdateStream, PurgeStream.
    ManageStream(u32),
    /// CreateTopic in a stream.
    CreateTopic(u32),
    /// GetTopic, GetTopics (stream, topic).
    ReadTopic(u32, u32),
    /// UpdateTopic, DeleteTopic, PurgeTopic, partitions.
    ManageTopic(u32, u32),
    /// PollMessages, Get/Store/DeleteConsumerOffset, consumer groups.
    Poll(u32, u32),
    /// SendMessages.
    Send(u32, u32),
}

impl Permissions {
    /// Whether these permissions allow `action`.
    pub fn allows(&self, action: Action) -> bool {
        let g = &self.global;
        let stream = |id: u32| self.streams.get(&id);
        let topic = |s: u32, t: u32| stream(s).and_then(|s| s.topics.get(&t));
        match action {
            Action::ReadServers => g.manage_servers || g.read_servers,
            Action::ReadUsers => g.manage_users || g.read_users,
            Action::ManageUsers => g.manage_users,
            Action::ReadStreams => g.manage_streams || g.read_streams,
            Action::CreateStream => g.manage_streams,
            Action::ReadStream(s) => {
                g.manage_streams
                    || g.read_streams
                    || stream(s).is_some_and(|p| p.manage_stream || p.read_stream)
            }
            Action::ManageStream(s) => {
                g.manage_streams || stream(s).is_some_and(|p| p.manage_stream)
            }
            Action::CreateTopic(s) => {
                g.manage_streams
                    || g.manage_topics
                    || stream(s).is_some_and(|p| p.manage_stream || p.manage_topics)
            }
            Action::ReadTopic(s, t) => {
                g.manage_streams
                    || g.read_streams
                    || g.manage_topics
                    || g.read_topics
                    || stream(s).is_some_and(|p| {
                        p.manage_stream || p.read_stream || p.manage_topics || p.read_topics
                    })
                    || topic(s, t).is_some_and(|p| p.manage_topic || p.read_topic)
            }
            Action::ManageTopic(s, t) => {
                g.manage_streams
                    || g.manage_topics
                    || stream(s).is_some_and(|p| p.manage_stream || p.manage_topics)
                    || topic(s, t).is_some_and(|p| p.manage_topic)
            }
            Action::Poll(s, t) => {
                g.manage_streams
                    || g.read_streams
                    || g.poll_messages
                    || stream(s)
                        .is_some_and(|p| p.manage_stream || p.read_stream || p.poll_messages)
                    || topic(s, t)
                        .is_some_and(|p| p.manage_topic || p.read_topic || p.poll_messages)
            }
            Action::Send(s, t) => {
                g.manage_streams
                    || g.send_messages
                    || stream(s).is_some_and(|p| p.manage_stream || p.send_messages)
                    || topic(s, t).is_some_and(|p| p.manage_topic || p.send_messages)
            }
        }
    }
}

/// Whether `user_id` may do `action` given its account (`None`: no permissions). Root may
/// do everything.
pub fn allowed(user_id: u32, account: Option<&Account>, action: Action) -> bool {
    user_id == ROOT_USER_ID
        || account
            .and_then(|a| a.permissions.as_ref())
            .is_some_and(|p| p.allows(action))
}

/// Fills `buf` from the kernel's CSPRNG.
pub fn random_bytes(buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes for the call's
        // duration; getrandom writes at most that many bytes and returns how many it wrote.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        filled += n as usize;
    }
    Ok(())
}

impl super::view::MetadataView {
    /// The user a personal access token logs in as: the token's hash is known and it has not
    /// expired at `now` (µs since the epoch). Unknown and expired answer alike (`None`).
    pub fn token_owner(&self, hash: &[u8; 32], now: u64) -> Option<u32> {
        self.state.accounts.iter().find_map(|(user_id, account)| {
            account
                .tokens
                .values()
                .any(|t| &t.hash == hash && t.expiry_at.is_none_or(|at| now < at))
                .then_some(*user_id)
        })
    }
}

//! Users, permissions, personal access tokens and client information on the client plane
//! (issue 11, decisions 300-314): the request bodies as the SDK encodes them, the bodies the
//! receiving shard replicates in their place (no password or token ever reaches a prepare),
//! and the reply layouts the SDK decodes (user info, user info details, tokens, clients).

use super::codec::{BodyError, Identifier, Name, Options, Reader, put_str_u8};
use crate::metadata::password::{HASH_LEN, HashParams, PasswordHash, SALT_LEN};
use crate::metadata::users::{Permissions, STATUS_ACTIVE, STATUS_INACTIVE};

/// Legacy codes of the NonReplicated commands served here.
pub mod code {
    /// GetMe.
    pub const GET_ME: u32 = 20;
    /// GetClient.
    pub const GET_CLIENT: u32 = 21;
    /// GetClients.
    pub const GET_CLIENTS: u32 = 22;
    /// GetUser.
    pub const GET_USER: u32 = 31;
    /// GetUsers.
    pub const GET_USERS: u32 = 32;
    /// GetPersonalAccessTokens.
    pub const GET_PERSONAL_ACCESS_TOKENS: u32 = 41;
}

/// Error codes of this area (the shared code space, client-plane.md §4.1).
pub mod status {
    /// A username outside 3..=50 bytes.
    pub const INVALID_USERNAME: u32 = 43;
    /// A password outside 3..=100 bytes, or a wrong current password.
    pub const INVALID_PASSWORD: u32 = 44;
    /// A status other than 1 (active) or 2 (inactive).
    pub const INVALID_USER_STATUS: u32 = 45;
    /// The username is taken.
    pub const USER_ALREADY_EXISTS: u32 = 46;
    /// The user is inactive.
    pub const USER_INACTIVE: u32 = 47;
    /// Root cannot be deleted (or deactivated).
    pub const CANNOT_DELETE_USER: u32 = 48;
    /// A token name outside 3..=30 bytes.
    pub const INVALID_PERSONAL_ACCESS_TOKEN_NAME: u32 = 50;
    /// The user already has a token of that name.
    pub const PERSONAL_ACCESS_TOKEN_ALREADY_EXISTS: u32 = 51;
    /// The user holds the most tokens allowed.
    pub const PERSONAL_ACCESS_TOKENS_LIMIT_REACHED: u32 = 52;
    /// An unknown token.
    pub const INVALID_PERSONAL_ACCESS_TOKEN: u32 = 53;
    /// More users than the state holds.
    pub const USERS_LIMIT_REACHED: u32 = 55;
    /// An expiry that overflows the clock.
    pub const INVALID_PERSONAL_ACCESS_TOKEN_EXPIRY: u32 = 56;
    /// The user named does not exist (ResourceNotFound).
    pub const USER_NOT_FOUND: u32 = 20;
}

/// A text of 3..=`max` bytes, as the SDK validates usernames (50) and passwords (100).
fn bounded(text: &str, max: usize) -> bool {
    (3..=max).contains(&text.len())
}

/// Whether `name` is a valid username.
pub fn valid_username(name: &str) -> bool {
    bounded(name, 50)
}

/// Whether `password` is a valid password.
pub fn valid_password(password: &str) -> bool {
    bounded(password, 100)
}

/// Whether `name` is a valid token name (the reference allows 3..=30 bytes).
pub fn valid_token_name(name: &str) -> bool {
    bounded(name, 30)
}

/// A CreateUser body (operation 141). `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct CreateUser {
    /// Username.
    pub username: Name,
    /// Password, in clear (never replicated: see [`PreparedUser`]).
    pub password: String,
    /// 1 active, 2 inactive.
    pub status: u8,
    /// Permissions, if any.
    pub permissions: Option<Permissions>,
    /// Options (none are known: must be empty).
    pub options: Options,
}

impl std::fmt::Debug for CreateUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateUser")
            .field("username", &self.username)
            .field("status", &self.status)
            .field("permissions", &self.permissions)
            .finish_non_exhaustive()
    }
}

impl CreateUser {
    /// Decodes the SDK's layout: username, `u8`-prefixed password, status, optional
    /// permissions, options filling the rest.
    pub fn read(r: &mut Reader<'_>) -> Result<CreateUser, BodyError> {
        Ok(CreateUser {
            username: Name::read(r, "username")?,
            password: r.str_u8(0, "password")?.to_owned(),
            status: r.u8("status")?,
            permissions: Permissions::read_optional(r)?,
            options: Options::decode(r.rest())?,
        })
    }

    /// Encodes as the SDK does.
    pub fn write(&self, out: &mut Vec<u8>) {
        self.username.write(out);
        put_str_u8(out, &self.password);
        out.push(self.status);
        Permissions::write_optional(self.permissions.as_ref(), out);
        self.options.encode(out);
    }

    /// The rules the receiving shard checks before hashing: username, password, status and
    /// options.
    pub fn validate(&self) -> Result<(), u32> {
        if !valid_username(self.username.as_str()) {
            return Err(status::INVALID_USERNAME);
        }
        if !valid_password(&self.password) {
            return Err(status::INVALID_PASSWORD);
        }
        valid_status(self.status)?;
        if !self.options.is_empty() {
            return Err(super::status::UNSUPPORTED_OPTION_KEY);
        }
        Ok(())
    }
}

/// A status code the SDK sends: 1 or 2.
pub fn valid_status(status: u8) -> Result<(), u32> {
    if status == STATUS_ACTIVE || status == STATUS_INACTIVE {
        Ok(())
    } else {
        Err(status::INVALID_USER_STATUS)
    }
}

fn write_hash(hash: &PasswordHash, out: &mut Vec<u8>) {
    for v in [
        hash.params.memory_kib,
        hash.params.iterations,
        hash.params.parallelism,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&hash.salt);
    out.extend_from_slice(&hash.hash);
}

fn read_hash(r: &mut Reader<'_>) -> Result<PasswordHash, BodyError> {
    let params = HashParams {
        memory_kib: r.u32("memory_kib")?,
        iterations: r.u32("iterations")?,
        parallelism: r.u32("parallelism")?,
    };
    if !params.is_valid() {
        return Err(BodyError::Length {
            field: "password hash parameters",
            len: u64::from(params.memory_kib),
        });
    }
    Ok(PasswordHash {
        params,
        salt: r.array::<SALT_LEN>("salt")?,
        hash: r.array::<HASH_LEN>("hash")?,
    })
}

/// The CreateUser body the metadata group replicates: the SDK's request with the password
/// replaced by its Argon2id hash, computed on the receiving shard (decision 304).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedUser {
    /// Username.
    pub username: Name,
    /// Status.
    pub status: u8,
    /// Permissions.
    pub permissions: Option<Permissions>,
    /// The password's hash.
    pub password: PasswordHash,
}

impl PreparedUser {
    /// Encodes the replicated body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.username.write(&mut out);
        out.push(self.status);
        Permissions::write_optional(self.permissions.as_ref(), &mut out);
        write_hash(&self.password, &mut out);
        out
    }

    /// Decodes the replicated body exactly.
    pub fn decode(body: &[u8]) -> Result<PreparedUser, BodyError> {
        let mut r = Reader::new(body);
        let prepared = PreparedUser {
            username: Name::read(&mut r, "username")?,
            status: r.u8("status")?,
            permissions: Permissions::read_optional(&mut r)?,
            password: read_hash(&mut r)?,
        };
        r.finish()?;
        Ok(prepared)
    }
}

/// An UpdateUser body (operation 142), replicated as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateUser {
    /// Which user.
    pub user: Identifier,
    /// A new username.
    pub username: Option<Name>,
    /// A new status.
    pub status: Option<u8>,
    /// Options (must be empty).
    pub options: Options,
}

impl UpdateUser {
    /// Decodes the SDK's layout.
    pub fn read(r: &mut Reader<'_>) -> Result<UpdateUser, BodyError> {
        let user = Identifier::read(r, "user id")?;
        let username = if r.u8("has_username")? == 1 {
            Some(Name::read(r, "username")?)
        } else {
            None
        };
        let status = if r.u8("has_status")? == 1 {
            Some(r.u8("status")?)
        } else {
            None
        };
        Ok(UpdateUser {
            user,
            username,
            status,
            options: Options::decode(r.rest())?,
        })
    }

    /// Encodes as the SDK does.
    pub fn write(&self, out: &mut Vec<u8>) {
        self.user.write(out);
        match &self.username {
            Some(name) => {
                out.push(1);
                name.write(out);
            }
            None => out.push(0),
        }
        match self.status {
            Some(s) => out.extend_from_slice(&[1, s]),
            None => out.push(0),
        }
        self.options.encode(out);
    }
}

/// A ChangePassword body (operation 144). `Debug` never shows the passwords.
#[derive(Clone, PartialEq, Eq)]
pub struct ChangePassword {
    /// Whose password.
    pub user: Identifier,
    /// The current password (checked on the receiving shard).
    pub current: String,
    /// The new one.
    pub new: String,
}

impl std::fmt::Debug for ChangePassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangePassword")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl ChangePassword {
    /// Decodes the SDK's layout.
    pub fn read(r: &mut Reader<'_>) -> Result<ChangePassword, BodyError> {
        Ok(ChangePassword {
            user: Identifier::read(r, "user id")?,
            current: r.str_u8(0, "current password")?.to_owned(),
            new: r.str_u8(0, "new password")?.to_owned(),
        })
    }

    /// Encodes as the SDK does.
    pub fn write(&self, out: &mut Vec<u8>) {
        self.user.write(out);
        put_str_u8(out, &self.current);
        put_str_u8(out, &self.new);
    }
}

/// The ChangePassword body the metadata group replicates: the user, the stored hash the
/// receiving shard verified the current password against, and the new password's hash.
/// Apply changes the password only if the stored hash is still `verified` (decision 305).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedPassword {
    /// The user's id.
    pub user_id: u32,
    /// The stored hash the current password matched.
    pub verified: PasswordHash,
    /// The new hash.
    pub new: PasswordHash,
}

impl PreparedPassword {
    /// Encodes the replicated body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.user_id.to_le_bytes().to_vec();
        write_hash(&self.verified, &mut out);
        write_hash(&self.new, &mut out);
        out
    }

    /// Decodes the replicated body exactly.
    pub fn decode(body: &[u8]) -> Result<PreparedPassword, BodyError> {
        let mut r = Reader::new(body);
        let prepared = PreparedPassword {
            user_id: r.u32("user id")?,
            verified: read_hash(&mut r)?,
            new: read_hash(&mut r)?,
        };
        r.finish()?;
        Ok(prepared)
    }
}

/// An UpdatePermissions body (operation 145), replicated as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdatePermissions {
    /// Whose.
    pub user: Identifier,
    /// The new permissions (`None` clears them).
    pub permissions: Option<Permissions>,
}

impl UpdatePermissions {
    /// Decodes the SDK's layout.
    pub fn read(r: &mut Reader<'_>) -> Result<UpdatePermissions, BodyError> {
        Ok(UpdatePermissions {
            user: Identifier::read(r, "user id")?,
            permissions: Permissions::read_optional(r)?,
        })
    }

    /// Encodes as the SDK does.
    pub fn write(&self, out: &mut Vec<u8>) {
        self.user.write(out);
        Permissions::write_optional(self.permissions.as_ref(), out);
    }
}

/// The CreatePersonalAccessToken body the metadata group replicates: the name, the client's
/// expiry (µs from the prepare's timestamp; 0 or `u64::MAX` never) and the token's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedToken {
    /// Token name.
    pub name: Name,
    /// Expiry as the client sent it.
    pub expiry: u64,
    /// BLAKE3 of the token.
    pub hash: [u8; 32],
}

impl PreparedToken {
    /// Encodes the replicated body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.name.write(&mut out);
        out.extend_from_slice(&self.expiry.to_le_bytes());
        out.extend_from_slice(&self.hash);
        out
    }

    /// Decodes the replicated body exactly.
    pub fn decode(body: &[u8]) -> Result<PreparedToken, BodyError> {
        let mut r = Reader::new(body);
        let prepared = PreparedToken {
            name: Name::read(&mut r, "token name")?,
            expiry: r.u64("expiry")?,
            hash: r.array::<32>("token hash")?,
        };
        r.finish()?;
        Ok(prepared)
    }
}

/// A user record as GetUsers lists it and the details start with: id, created_at, status,
/// username, and a `u32`-prefixed options block (empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    /// Id.
    pub id: u32,
    /// Creation time, µs.
    pub created_at: u64,
    /// 1 active, 2 inactive.
    pub status: u8,
    /// Username.
    pub username: Name,
}

impl UserRecord {
    /// Encodes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.created_at.to_le_bytes());
        out.push(self.status);
        self.username.write(out);
        Options::default().write_prefixed(out);
    }

    /// Decodes one record.
    pub fn read(r: &mut Reader<'_>) -> Result<UserRecord, BodyError> {
        let record = UserRecord {
            id: r.u32("user id")?,
            created_at: r.u64("created_at")?,
            status: r.u8("status")?,
            username: Name::read(r, "username")?,
        };
        Options::read_prefixed(r)?;
        Ok(record)
    }
}

/// The GetUser / CreateUser payload: the record and the permissions (absent: `u32 0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserDetails {
    /// The record.
    pub user: UserRecord,
    /// Permissions.
    pub permissions: Option<Permissions>,
}

impl UserDetails {
    /// Encodes as the SDK decodes it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.user.encode(out);
        match &self.permissions {
            Some(p) => Permissions::write_optional(Some(p), out),
            None => out.extend_from_slice(&0u32.to_le_bytes()),
        }
    }

    /// Decodes a whole payload.
    pub fn decode(payload: &[u8]) -> Result<UserDetails, BodyError> {
        let mut r = Reader::new(payload);
        let user = UserRecord::read(&mut r)?;
        let permissions = if r.u8("has_permissions")? == 0 {
            r.take(3, "permissions padding")?;
            None
        } else {
            let len = r.u32("permissions length")?;
            let bytes = r.take(len as usize, "permissions")?;
            let mut inner = Reader::new(bytes);
            let p = Permissions::read(&mut inner)?;
            inner.finish()?;
            Some(p)
        };
        r.finish()?;
        Ok(UserDetails { user, permissions })
    }
}

/// Decodes a GetUsers payload.
pub fn decode_users(payload: &[u8]) -> Result<Vec<UserRecord>, BodyError> {
    let mut r = Reader::new(payload);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        out.push(UserRecord::read(&mut r)?);
    }
    Ok(out)
}

/// One entry of GetPersonalAccessTokens: name and expiry (µs; 0 never).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// Name.
    pub name: Name,
    /// Expiry, µs since the epoch, 0 for never.
    pub expiry_at: u64,
}

impl TokenRecord {
    /// Encodes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.name.write(out);
        out.extend_from_slice(&self.expiry_at.to_le_bytes());
    }
}

/// Decodes a GetPersonalAccessTokens payload.
pub fn decode_tokens(payload: &[u8]) -> Result<Vec<TokenRecord>, BodyError> {
    let mut r = Reader::new(payload);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        out.push(TokenRecord {
            name: Name::read(&mut r, "token name")?,
            expiry_at: r.u64("expiry_at")?,
        });
    }
    Ok(out)
}

/// The transport code of TCP in client info.
pub const TRANSPORT_TCP: u8 = 1;

/// A client record (GetClients) and the head of client details (GetMe, GetClient).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRecord {
    /// The client id as the SDK reads it (u32): the low 32 bits of the VSR client id
    /// (decision 309).
    pub client_id: u32,
    /// The logged-in user.
    pub user_id: u32,
    /// [`TRANSPORT_TCP`].
    pub transport: u8,
    /// The peer address when this node holds the connection, else empty (decision 309).
    pub address: String,
    /// Consumer groups joined (0: memberships are not on the session table).
    pub consumer_groups_count: u32,
}

impl ClientRecord {
    /// Encodes (GetClients entry; GetMe/GetClient with no groups following).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.client_id.to_le_bytes());
        out.extend_from_slice(&self.user_id.to_le_bytes());
        out.push(self.transport);
        super::codec::put_str_u32(out, &self.address);
        out.extend_from_slice(&self.consumer_groups_count.to_le_bytes());
    }

    /// Decodes one record.
    pub fn read(r: &mut Reader<'_>) -> Result<ClientRecord, BodyError> {
        Ok(ClientRecord {
            client_id: r.u32("client id")?,
            user_id: r.u32("user id")?,
            transport: r.u8("transport")?,
            address: r.str_u32("address")?.to_owned(),
            consumer_groups_count: r.u32("consumer groups count")?,
        })
    }
}

/// Decodes a GetClients payload.
pub fn decode_clients(payload: &[u8]) -> Result<Vec<ClientRecord>, BodyError> {
    let mut r = Reader::new(payload);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        out.push(ClientRecord::read(&mut r)?);
    }
    Ok(out)
}

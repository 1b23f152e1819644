//! Apply of the user operations (issue 11, decisions 300-308): CreateUser, UpdateUser,
//! DeleteUser, ChangePassword, UpdatePermissions, CreatePersonalAccessToken and
//! DeletePersonalAccessToken. Every rule is checked from the prepare and the applied state
//! alone (the acting user is the header's `user_id`), so every replica applies alike; a
//! broken rule is a deterministic no-op whose code rides the result section.

use wire::Operation;
use wire::header::PrepareHeader;

use super::state::{User, lowest_free};
use super::users::{
    Account, Action, STATUS_ACTIVE, TOKENS_PER_USER_MAX, Token, USERS_MAX, allowed,
};
use super::{MetadataStateMachine, ROOT_USER_ID};
use crate::client::codec::{BodyError, Identifier, Name, Reader};
use crate::client::reply::RESULT_OK;
use crate::client::status as common;
use crate::client::user_answers;
use crate::client::users::{
    PreparedPassword, PreparedToken, PreparedUser, UpdatePermissions, UpdateUser, status,
    valid_status, valid_token_name, valid_username,
};

/// Whether `operation` is one of the user operations applied here.
pub(super) fn serves(operation: Operation) -> bool {
    matches!(
        operation,
        Operation::CreateUser
            | Operation::UpdateUser
            | Operation::DeleteUser
            | Operation::ChangePassword
            | Operation::UpdatePermissions
            | Operation::CreatePersonalAccessToken
            | Operation::DeletePersonalAccessToken
    )
}

/// The replicated body of `operation`, decoded.
enum UserOp {
    Create(PreparedUser),
    Update(UpdateUser),
    Delete(Identifier),
    Password(PreparedPassword),
    Permissions(UpdatePermissions),
    CreateToken(PreparedToken),
    DeleteToken(Name),
}

fn decode(operation: Operation, body: &[u8]) -> Result<UserOp, BodyError> {
    let whole = |body: &[u8], f: &dyn Fn(&mut Reader<'_>) -> Result<UserOp, BodyError>| {
        let mut r = Reader::new(body);
        let op = f(&mut r)?;
        r.finish()?;
        Ok(op)
    };
    match operation {
        Operation::CreateUser => PreparedUser::decode(body).map(UserOp::Create),
        Operation::ChangePassword => PreparedPassword::decode(body).map(UserOp::Password),
        Operation::CreatePersonalAccessToken => {
            PreparedToken::decode(body).map(UserOp::CreateToken)
        }
        Operation::UpdateUser => whole(body, &|r| UpdateUser::read(r).map(UserOp::Update)),
        Operation::DeleteUser => whole(body, &|r| {
            Identifier::read(r, "user id").map(UserOp::Delete)
        }),
        Operation::UpdatePermissions => whole(body, &|r| {
            UpdatePermissions::read(r).map(UserOp::Permissions)
        }),
        _ => whole(body, &|r| {
            Name::read(r, "token name").map(UserOp::DeleteToken)
        }),
    }
}

/// The primary's check before replication: the body decodes (the acting user is checked at
/// the receiving shard and again at apply).
pub(super) fn preflight(operation: Operation, body: &[u8]) -> Result<(), u32> {
    decode(operation, body)
        .map(|_| ())
        .map_err(|_| common::INVALID_COMMAND)
}

impl MetadataStateMachine {
    /// The acting user, if it exists and is active.
    pub(super) fn actor(&self, user_id: u32) -> Result<(), u32> {
        let state = &self.view.state;
        if !state.users.contains_key(&user_id) {
            return Err(common::UNAUTHORIZED);
        }
        if state
            .accounts
            .get(&user_id)
            .is_some_and(|a| a.status != STATUS_ACTIVE)
        {
            return Err(status::USER_INACTIVE);
        }
        Ok(())
    }

    fn permit(&self, user_id: u32, action: Action) -> Result<(), u32> {
        self.actor(user_id)?;
        if allowed(user_id, self.view.state.accounts.get(&user_id), action) {
            Ok(())
        } else {
            Err(common::UNAUTHORIZED)
        }
    }

    fn target(&self, id: &Identifier) -> Result<u32, u32> {
        user_answers::find_user(&self.view, id)
            .map(|u| u.id)
            .ok_or(status::USER_NOT_FOUND)
    }

    pub(super) fn apply_user_op(
        &mut self,
        operation: Operation,
        header: &PrepareHeader,
        body: &[u8],
    ) -> Result<Vec<u8>, u32> {
        let op = decode(operation, body).map_err(|_| common::INVALID_COMMAND)?;
        let actor = header.user_id.get();
        let now = header.timestamp.get();
        match op {
            UserOp::Create(user) => self.create_user(actor, now, user),
            UserOp::Update(update) => self.update_user(actor, update),
            UserOp::Delete(id) => {
                self.permit(actor, Action::ManageUsers)?;
                let id = self.target(&id)?;
                if id == ROOT_USER_ID {
                    return Err(status::CANNOT_DELETE_USER);
                }
                let state = &mut self.view.state;
                state.users.remove(&id);
                state.accounts.remove(&id);
                Ok(RESULT_OK.to_vec())
            }
            UserOp::Password(change) => {
                self.actor(actor)?;
                if change.user_id != actor {
                    self.permit(actor, Action::ManageUsers)?;
                }
                let user = self
                    .view
                    .state
                    .users
                    .get_mut(&change.user_id)
                    .ok_or(status::USER_NOT_FOUND)?;
                // The current password was verified against this hash on the receiving shard:
                // if it changed since, that check no longer holds.
                if user.password != change.verified {
                    return Err(status::INVALID_PASSWORD);
                }
                user.password = change.new;
                Ok(RESULT_OK.to_vec())
            }
            UserOp::Permissions(update) => {
                self.permit(actor, Action::ManageUsers)?;
                let id = self.target(&update.user)?;
                if id == ROOT_USER_ID {
                    return Err(common::UNAUTHORIZED);
                }
                self.view.state.accounts.entry(id).or_default().permissions = update.permissions;
                Ok(RESULT_OK.to_vec())
            }
            UserOp::CreateToken(token) => {
                self.actor(actor)?;
                if !valid_token_name(token.name.as_str()) {
                    return Err(status::INVALID_PERSONAL_ACCESS_TOKEN_NAME);
                }
                let expiry_at = match token.expiry {
                    0 | u64::MAX => None,
                    after => Some(
                        now.checked_add(after)
                            .ok_or(status::INVALID_PERSONAL_ACCESS_TOKEN_EXPIRY)?,
                    ),
                };
                let account = self.view.state.accounts.entry(actor).or_default();
                if account.tokens.contains_key(&token.name) {
                    return Err(status::PERSONAL_ACCESS_TOKEN_ALREADY_EXISTS);
                }
                if account.tokens.len() >= TOKENS_PER_USER_MAX {
                    return Err(status::PERSONAL_ACCESS_TOKENS_LIMIT_REACHED);
                }
                account.tokens.insert(
                    token.name,
                    Token {
                        expiry_at,
                        hash: token.hash,
                    },
                );
                // The payload is the hash: the receiving shard checks it is the one of the
                // token it minted and answers the token in its place (decision 306).
                let mut reply = RESULT_OK.to_vec();
                reply.extend_from_slice(&token.hash);
                Ok(reply)
            }
            UserOp::DeleteToken(name) => {
                self.actor(actor)?;
                let removed = self
                    .view
                    .state
                    .accounts
                    .get_mut(&actor)
                    .and_then(|a| a.tokens.remove(&name));
                match removed {
                    Some(_) => Ok(RESULT_OK.to_vec()),
                    None => Err(common::RESOURCE_NOT_FOUND),
                }
            }
        }
    }

    fn create_user(&mut self, actor: u32, now: u64, user: PreparedUser) -> Result<Vec<u8>, u32> {
        self.permit(actor, Action::ManageUsers)?;
        if !valid_username(user.username.as_str()) {
            return Err(status::INVALID_USERNAME);
        }
        valid_status(user.status)?;
        let state = &mut self.view.state;
        if state.user_by_name(user.username.as_str()).is_some() {
            return Err(status::USER_ALREADY_EXISTS);
        }
        if state.users.len() >= USERS_MAX {
            return Err(status::USERS_LIMIT_REACHED);
        }
        let id =
            lowest_free(state.users.keys(), u32::MAX - 1).ok_or(status::USERS_LIMIT_REACHED)?;
        let record = User {
            id,
            username: user.username,
            password: user.password,
        };
        state.accounts.insert(
            id,
            Account {
                status: user.status,
                created_at: now,
                permissions: user.permissions,
                tokens: Default::default(),
            },
        );
        let mut reply = RESULT_OK.to_vec();
        user_answers::details(state, &record).encode(&mut reply);
        state.users.insert(id, record);
        Ok(reply)
    }

    fn update_user(&mut self, actor: u32, update: UpdateUser) -> Result<Vec<u8>, u32> {
        self.permit(actor, Action::ManageUsers)?;
        let id = self.target(&update.user)?;
        if !update.options.is_empty() {
            return Err(common::UNSUPPORTED_OPTION_KEY);
        }
        if let Some(name) = &update.username {
            if !valid_username(name.as_str()) {
                return Err(status::INVALID_USERNAME);
            }
            if self
                .view
                .state
                .user_by_name(name.as_str())
                .is_some_and(|u| u.id != id)
            {
                return Err(status::USER_ALREADY_EXISTS);
            }
        }
        if let Some(s) = update.status {
            valid_status(s)?;
            // Root stays active: deactivating it would lock every operator out.
            if id == ROOT_USER_ID && s != STATUS_ACTIVE {
                return Err(status::CANNOT_DELETE_USER);
            }
        }
        let state = &mut self.view.state;
        if let Some(name) = update.username {
            state.users.get_mut(&id).expect("resolved above").username = name;
        }
        if let Some(s) = update.status {
            state.accounts.entry(id).or_default().status = s;
        }
        Ok(RESULT_OK.to_vec())
    }
}

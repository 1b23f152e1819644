//! The user answers the receiving shard builds from the committed metadata: GetUser,
//! GetUsers, GetPersonalAccessTokens (issue 11).

use super::codec::Identifier;
use super::users::{TokenRecord, UserDetails, UserRecord};
use crate::metadata::ROOT_USER_ID;
use crate::metadata::state::{State, User};
use crate::metadata::users::{Account, Permissions};
use crate::metadata::view::MetadataView;

/// The user named by `id`.
pub fn find_user<'a>(view: &'a MetadataView, id: &Identifier) -> Option<&'a User> {
    match id {
        Identifier::Numeric(n) => view.state.users.get(n),
        Identifier::Named(name) => view.user(name.as_str()),
    }
}

/// The record of `user`.
pub fn user_record(state: &State, user: &User) -> UserRecord {
    let account = state.accounts.get(&user.id).cloned().unwrap_or_default();
    UserRecord {
        id: user.id,
        created_at: account.created_at,
        status: account.status,
        username: user.username.clone(),
    }
}

/// The details of `user`: root shows every permission (it holds them whatever is stored).
pub fn details(state: &State, user: &User) -> UserDetails {
    let permissions = if user.id == ROOT_USER_ID {
        Some(Permissions::all())
    } else {
        state
            .accounts
            .get(&user.id)
            .and_then(|a: &Account| a.permissions.clone())
    };
    UserDetails {
        user: user_record(state, user),
        permissions,
    }
}

/// The GetUser payload (empty: not found).
pub fn user_details(view: &MetadataView, id: &Identifier) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(user) = find_user(view, id) {
        details(&view.state, user).encode(&mut out);
    }
    out
}

/// The GetUsers payload, in id order.
pub fn users(view: &MetadataView) -> Vec<u8> {
    let mut out = Vec::new();
    for user in view.state.users.values() {
        user_record(&view.state, user).encode(&mut out);
    }
    out
}

/// The GetPersonalAccessTokens payload of `user_id`, in name order (expiry 0: never).
pub fn tokens(view: &MetadataView, user_id: u32) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(account) = view.state.accounts.get(&user_id) {
        for (name, token) in &account.tokens {
            TokenRecord {
                name: name.clone(),
                expiry_at: token.expiry_at.unwrap_or(0),
            }
            .encode(&mut out);
        }
    }
    out
}

//! The user operations in the state machine: apply with their replies and rules, the
//! acting user's permission checked again at apply, determinism across instances, the
//! accounts section of the snapshot and its install, and an older snapshot without it.

use super::*;
use crate::client::users::{
    PreparedPassword, PreparedToken, PreparedUser, UpdatePermissions, UpdateUser, UserDetails,
};
use crate::metadata::state::State;
use crate::metadata::users::{Permissions, STATUS_INACTIVE};

fn prepared(username: &str, permissions: Option<Permissions>) -> Vec<u8> {
    PreparedUser {
        username: name(username),
        status: 1,
        permissions,
        password: PasswordHash::new("pw-of-user", [5; 16], HashParams::TEST).unwrap(),
    }
    .encode()
}

fn encoded(request: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    request.encode(&mut out);
    out
}

/// Creates `bob` (id 1, no permissions) and a token for root; returns the driver.
fn populated() -> Driver {
    let mut d = Driver::new();
    let reply = d.apply(Operation::CreateUser, &prepared("bob", None));
    let details = UserDetails::decode(payload(&reply)).unwrap();
    assert_eq!((details.user.id, details.user.created_at), (1, 1000));
    let token = PreparedToken {
        name: name("ci-token"),
        expiry: 500,
        hash: [7; 32],
    };
    let reply = d.apply(Operation::CreatePersonalAccessToken, &token.encode());
    assert_eq!(payload(&reply), &[7; 32]);
    d
}

#[test]
fn user_ops_apply_with_their_rules() {
    let mut d = populated();
    let state = d.sm.state();
    assert_eq!(state.users[&1].username.as_str(), "bob");
    let token = &state.accounts[&ROOT_USER_ID].tokens[&name("ci-token")];
    // Expiry: the prepare's timestamp (op 2 -> 2000 µs) plus the client's 500 µs.
    assert_eq!(token.expiry_at, Some(2500));
    // Duplicates and bad names are deterministic rejections.
    assert_eq!(
        rejected(&d.apply(Operation::CreateUser, &prepared("bob", None))),
        46
    );
    assert_eq!(
        rejected(&d.apply(Operation::CreateUser, &prepared("b", None))),
        43
    );
    let again = PreparedToken {
        name: name("ci-token"),
        expiry: 0,
        hash: [8; 32],
    };
    assert_eq!(
        rejected(&d.apply(Operation::CreatePersonalAccessToken, &again.encode())),
        51
    );
    // A client CreateUser body (with its password) never applies.
    let client_body = encoded(&Request::CreateUser(crate::client::users::CreateUser {
        username: name("carol"),
        password: "carol-pw".into(),
        status: 1,
        permissions: None,
        options: Options::default(),
    }));
    assert_eq!(rejected(&d.apply(Operation::CreateUser, &client_body)), 3);

    // Bob acts: without manage_users every user op is refused at apply (41), even when the
    // receiving shard's check was passed against an older state.
    d.user_id = 1;
    assert_eq!(
        rejected(&d.apply(Operation::CreateUser, &prepared("carol", None))),
        41
    );
    let delete_root = encoded(&Request::DeleteUser(Identifier::Numeric(0)));
    assert_eq!(rejected(&d.apply(Operation::DeleteUser, &delete_root)), 41);
    assert_eq!(
        rejected(&d.submit(&create_stream("bobs")).unwrap()),
        status::UNAUTHORIZED
    );
    // Granted manage_users and manage_streams: now both apply.
    d.user_id = ROOT_USER_ID;
    let mut grant = Permissions::default();
    grant.global.manage_users = true;
    grant.global.manage_streams = true;
    let update = encoded(&Request::UpdatePermissions(UpdatePermissions {
        user: Identifier::Numeric(1),
        permissions: Some(grant),
    }));
    assert_eq!(
        payload(&d.apply(Operation::UpdatePermissions, &update)),
        &[] as &[u8]
    );
    d.user_id = 1;
    assert!(
        read_result(&d.apply(Operation::CreateUser, &prepared("carol", None)))
            .unwrap()
            .is_ok()
    );
    assert!(
        read_result(&d.submit(&create_stream("bobs")).unwrap())
            .unwrap()
            .is_ok()
    );
    // Root cannot be deleted, even by a user manager.
    assert_eq!(rejected(&d.apply(Operation::DeleteUser, &delete_root)), 48);

    // ChangePassword applies only against the hash the receiving shard verified.
    let stored = d.sm.state().users[&2].password.clone();
    let new = PasswordHash::new("carol-new", [6; 16], HashParams::TEST).unwrap();
    let stale = PreparedPassword {
        user_id: 2,
        verified: PasswordHash::new("guess", [5; 16], HashParams::TEST).unwrap(),
        new: new.clone(),
    };
    assert_eq!(
        rejected(&d.apply(Operation::ChangePassword, &stale.encode())),
        44
    );
    let good = PreparedPassword {
        user_id: 2,
        verified: stored,
        new: new.clone(),
    };
    assert!(
        read_result(&d.apply(Operation::ChangePassword, &good.encode()))
            .unwrap()
            .is_ok()
    );
    assert_eq!(d.sm.state().users[&2].password, new);

    // Deactivated: the user's own ops are refused at apply (47).
    d.user_id = ROOT_USER_ID;
    let off = encoded(&Request::UpdateUser(UpdateUser {
        user: Identifier::Numeric(1),
        username: None,
        status: Some(STATUS_INACTIVE),
        options: Options::default(),
    }));
    assert!(
        read_result(&d.apply(Operation::UpdateUser, &off))
            .unwrap()
            .is_ok()
    );
    d.user_id = 1;
    assert_eq!(
        rejected(&d.apply(Operation::CreateUser, &prepared("dan", None))),
        47
    );
    // Deleted: its account goes with it.
    d.user_id = ROOT_USER_ID;
    let delete_bob = encoded(&Request::DeleteUser(Identifier::Named(name("bob"))));
    assert!(
        read_result(&d.apply(Operation::DeleteUser, &delete_bob))
            .unwrap()
            .is_ok()
    );
    assert!(!d.sm.state().users.contains_key(&1));
    assert!(!d.sm.state().accounts.contains_key(&1));
}

#[test]
fn accounts_are_in_the_snapshot_and_installed_byte_for_byte() {
    let d = populated();
    let bytes = d.sm.snapshot();
    let decoded = State::decode(&bytes).unwrap();
    assert_eq!(&decoded, d.sm.state());
    assert_eq!(decoded.encode(), bytes);
    // A second machine replaying the same prepares holds the same bytes.
    assert_eq!(populated().sm.snapshot(), bytes);
    // Installed as a transfer would: the accounts, the tokens and the passwords are there.
    let mut other = machine();
    other
        .install(
            d.op,
            &[Artifact {
                kind: ArtifactKind::METADATA_SNAPSHOT,
                frontier: d.op,
                bytes: bytes.clone(),
            }],
        )
        .unwrap();
    assert_eq!(other.snapshot(), bytes);
    assert!(other.reader().view().token_owner(&[7; 32], 2499).is_some());
    assert!(other.reader().view().token_owner(&[7; 32], 2500).is_none());
    assert_eq!(
        other.reader().view().authenticate("bob", "pw-of-user"),
        Some(1)
    );
}

#[test]
fn a_snapshot_without_the_accounts_section_still_decodes() {
    // The encoding before issue 11: the same sections without the trailing accounts count.
    let state = machine().state().clone();
    let mut bytes = state.encode_v3();
    // (A version-2 encoding: without version 3's origins section either, decision 371.)
    bytes.truncate(bytes.len() - 8 - 4 - 4);
    bytes[4] = 2;
    let trailer = xxhash_rust::xxh3::xxh3_64(&bytes);
    bytes.extend_from_slice(&trailer.to_le_bytes());
    assert_eq!(State::decode(&bytes).unwrap(), state);
    // An account of a user that does not exist is refused.
    let mut bad = populated().sm.state().clone();
    bad.accounts.insert(99, Default::default());
    assert!(State::decode(&bad.encode()).is_err());
}

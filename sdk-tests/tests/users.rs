//! Users, permissions and personal access tokens through the published Iggy Rust SDK
//! (0.11.0-edge.4) against `strand dev --replicas 3` (issue 11): root creates a user, the
//! user logs in with its password, is refused a read it lacks the permission for and
//! allowed once root grants it, changes its password, mints a token and logs in with it;
//! GetMe, GetUser(s), GetClients decode; the deleted user can no longer log in.

use std::collections::BTreeMap;
use std::path::PathBuf;

use iggy::prelude::*;
use strand_sdk_tests::{
    DevCluster, REPLICAS, client_on, init_client_log, refused, single_primary, step,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_permissions_and_tokens_through_the_sdk() {
    init_client_log();
    let mut cluster = DevCluster::start(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("users"));
    let all = cluster.wait_metrics("exactly one metadata primary, all nodes normal", |all| {
        all.len() == REPLICAS
            && single_primary(all).is_some()
            && all.iter().all(|m| m.get("status") == 0)
    });
    let address = cluster.nodes[single_primary(&all).expect("checked above")]
        .client
        .clone();

    let root = client_on(&address).await;
    step("root login", root.login_user("iggy", "iggy")).await;
    let stream = step("create stream", root.create_stream("users-s")).await;

    // A user without permissions.
    let created = step(
        "create user alice",
        root.create_user("alice", "alice-pw", UserStatus::Active, None),
    )
    .await;
    assert_eq!(created.username, "alice");
    assert_eq!(created.status, UserStatus::Active);
    assert_eq!(created.permissions, None);
    let alice_id = Identifier::numeric(created.id).unwrap();
    let users = step("get users", root.get_users()).await;
    let names: Vec<&str> = users.iter().map(|u| u.username.as_str()).collect();
    assert_eq!(names, ["iggy", "alice"]);
    let fetched = step("get user alice", root.get_user(&alice_id))
        .await
        .expect("alice exists");
    assert_eq!(
        (fetched.id, fetched.username.as_str()),
        (created.id, "alice")
    );
    let root_details = step(
        "get user root",
        root.get_user(&Identifier::numeric(0).unwrap()),
    )
    .await
    .expect("root exists");
    assert!(
        root_details
            .permissions
            .expect("root's")
            .global
            .manage_users
    );

    // Alice logs in with her password and is refused what she lacks.
    let alice = client_on(&address).await;
    let identity = step("alice login", alice.login_user("alice", "alice-pw")).await;
    assert_eq!(identity.user_id, created.id);
    let denied = refused(
        "alice get streams without read_streams",
        alice.get_streams(),
    )
    .await;
    assert_eq!(denied.as_code(), 41, "{denied:?}");
    let denied = refused("alice create stream", alice.create_stream("alice-s")).await;
    assert_eq!(denied.as_code(), 41, "{denied:?}");

    // Granted: global read_streams, and manage on the one stream.
    let mut streams = BTreeMap::new();
    streams.insert(
        stream.id as usize,
        StreamPermissions {
            manage_stream: true,
            ..StreamPermissions::default()
        },
    );
    let permissions = Permissions {
        global: GlobalPermissions {
            read_streams: true,
            ..GlobalPermissions::default()
        },
        streams: Some(streams),
    };
    step(
        "grant alice read_streams",
        root.update_permissions(&alice_id, Some(permissions.clone())),
    )
    .await;
    let seen = step("alice get streams with read_streams", alice.get_streams()).await;
    assert!(seen.iter().any(|s| s.name == "users-s"), "{seen:?}");
    let details = step("get user alice again", root.get_user(&alice_id))
        .await
        .expect("alice exists");
    assert_eq!(details.permissions, Some(permissions));

    // GetMe as alice; GetClients as root lists both.
    let me = step("alice get me", alice.get_me()).await;
    assert_eq!(me.user_id, Some(created.id));
    let clients = step("root get clients", root.get_clients()).await;
    assert!(
        clients.iter().any(|c| c.user_id == Some(created.id)),
        "{clients:?}"
    );
    assert!(clients.iter().any(|c| c.user_id == Some(0)), "{clients:?}");
    let one = step("root get client", root.get_client(me.client_id)).await;
    assert_eq!(one.map(|c| c.user_id), Some(Some(created.id)));

    // Password change: the wrong current password is refused, the right one works.
    refused(
        "change password with a wrong current one",
        alice.change_password(&alice_id, "not-her-pw", "alice-pw-2"),
    )
    .await;
    step(
        "alice changes her password",
        alice.change_password(&alice_id, "alice-pw", "alice-pw-2"),
    )
    .await;
    let again = client_on(&address).await;
    refused(
        "login with the old password",
        again.login_user("alice", "alice-pw"),
    )
    .await;
    let again = client_on(&address).await;
    step(
        "login with the new password",
        again.login_user("alice", "alice-pw-2"),
    )
    .await;

    // A token: shown once, listed by name, logs in as alice.
    let raw = step(
        "alice creates a token",
        alice.create_personal_access_token("alice-ci", PersonalAccessTokenExpiry::NeverExpire),
    )
    .await;
    let tokens = step("alice lists her tokens", alice.get_personal_access_tokens()).await;
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0].name, "alice-ci");
    assert_eq!(tokens[0].expiry_at, None);
    let by_token = client_on(&address).await;
    let identity = step(
        "login with the token",
        by_token.login_with_personal_access_token(&raw.token),
    )
    .await;
    assert_eq!(identity.user_id, created.id);
    let seen = step("get streams as the token's user", by_token.get_streams()).await;
    assert!(seen.iter().any(|s| s.name == "users-s"));
    step(
        "alice deletes the token",
        alice.delete_personal_access_token("alice-ci"),
    )
    .await;
    let by_token = client_on(&address).await;
    refused(
        "login with a deleted token",
        by_token.login_with_personal_access_token(&raw.token),
    )
    .await;

    // Deleted: the user can no longer log in; root cannot be deleted.
    step("root deletes alice", root.delete_user(&alice_id)).await;
    let gone = client_on(&address).await;
    refused(
        "login as a deleted user",
        gone.login_user("alice", "alice-pw-2"),
    )
    .await;
    refused(
        "delete root",
        root.delete_user(&Identifier::numeric(0).unwrap()),
    )
    .await;
    step("root logout", root.logout_user()).await;
    cluster.pass();
}

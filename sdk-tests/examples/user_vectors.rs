//! Prints the SDK's own encodings of the user, permission, token and client bodies and
//! replies as hex, for the server's codec tests (`server/src/client/users_tests.rs`). Run:
//! `cargo run --manifest-path sdk-tests/Cargo.toml --example user_vectors`.

use iggy_binary_protocol::requests::personal_access_tokens::create_personal_access_token::CreatePersonalAccessTokenRequest;
use iggy_binary_protocol::requests::users::{
    ChangePasswordRequest, CreateUserRequest, UpdatePermissionsRequest, UpdateUserRequest,
};
use iggy_binary_protocol::responses::clients::client_response::ClientResponse;
use iggy_binary_protocol::responses::personal_access_tokens::get_personal_access_tokens::PersonalAccessTokenResponse;
use iggy_binary_protocol::responses::users::get_user::UserDetailsResponse;
use iggy_binary_protocol::responses::users::user_response::UserResponse;
use iggy_binary_protocol::{
    WireEncode, WireGlobalPermissions, WireIdentifier, WireName, WireOptions, WirePermissions,
    WireStreamPermissions, WireTopicPermissions,
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn permissions() -> WirePermissions {
    WirePermissions {
        global: WireGlobalPermissions {
            manage_servers: false,
            read_servers: true,
            manage_users: false,
            read_users: true,
            manage_streams: false,
            read_streams: false,
            manage_topics: false,
            read_topics: true,
            poll_messages: false,
            send_messages: true,
        },
        streams: vec![
            WireStreamPermissions {
                stream_id: 3,
                manage_stream: true,
                read_stream: false,
                manage_topics: false,
                read_topics: true,
                poll_messages: true,
                send_messages: false,
                topics: vec![
                    WireTopicPermissions {
                        topic_id: 1,
                        manage_topic: false,
                        read_topic: true,
                        poll_messages: false,
                        send_messages: true,
                    },
                    WireTopicPermissions {
                        topic_id: 9,
                        manage_topic: true,
                        read_topic: false,
                        poll_messages: true,
                        send_messages: false,
                    },
                ],
            },
            WireStreamPermissions {
                stream_id: 7,
                manage_stream: false,
                read_stream: true,
                manage_topics: true,
                read_topics: false,
                poll_messages: false,
                send_messages: true,
                topics: vec![],
            },
        ],
    }
}

fn main() {
    let create = CreateUserRequest {
        username: WireName::new("alice").unwrap(),
        password: "secret".into(),
        status: 1,
        permissions: Some(permissions()),
        options: WireOptions::empty(),
    };
    println!("create_user {}", hex(&create.to_bytes()));
    let update = UpdateUserRequest {
        user_id: WireIdentifier::named("alice").unwrap(),
        username: Some(WireName::new("alicia").unwrap()),
        status: Some(2),
        options: WireOptions::empty(),
    };
    println!("update_user {}", hex(&update.to_bytes()));
    let change = ChangePasswordRequest {
        user_id: WireIdentifier::numeric(1),
        current_password: "old-pw".into(),
        new_password: "new-pw-1".into(),
    };
    println!("change_password {}", hex(&change.to_bytes()));
    let perms = UpdatePermissionsRequest {
        user_id: WireIdentifier::numeric(4),
        permissions: None,
    };
    println!("update_permissions_none {}", hex(&perms.to_bytes()));
    let pat = CreatePersonalAccessTokenRequest {
        name: WireName::new("ci-token").unwrap(),
        expiry: 1_000_000,
    };
    println!("create_pat {}", hex(&pat.to_bytes()));
    let user = UserResponse {
        id: 1,
        created_at: 1_700_000_000_000_000,
        status: 1,
        username: WireName::new("alice").unwrap(),
        options: WireOptions::empty(),
    };
    let details = UserDetailsResponse {
        user: user.clone(),
        permissions: Some(permissions()),
    };
    println!("user_details {}", hex(&details.to_bytes()));
    let bare = UserDetailsResponse {
        user,
        permissions: None,
    };
    println!("user_details_none {}", hex(&bare.to_bytes()));
    let token = PersonalAccessTokenResponse {
        name: WireName::new("ci-token").unwrap(),
        expiry_at: 42,
    };
    println!("token_info {}", hex(&token.to_bytes()));
    let client = ClientResponse {
        client_id: 0xdead_beef,
        user_id: 1,
        transport: 1,
        address: "10.0.0.1:5555".into(),
        consumer_groups_count: 0,
    };
    println!("client {}", hex(&client.to_bytes()));
}

//! Codec round trips of the user area against bytes the SDK's own serializers produced
//! (`cargo run --manifest-path sdk-tests/Cargo.toml --example user_vectors`): each decodes to
//! the expected value and re-encodes to the same bytes.

use std::collections::BTreeMap;

use wire::Operation;

use super::codec::{Identifier, Name, Options, Reader};
use super::request::Request;
use super::users::{
    ChangePassword, ClientRecord, CreateUser, PreparedPassword, PreparedToken, PreparedUser,
    TokenRecord, UpdatePermissions, UpdateUser, UserDetails, UserRecord, decode_tokens,
};
use crate::metadata::password::{HashParams, PasswordHash};
use crate::metadata::users::{GlobalPermissions, Permissions, StreamPermissions, TopicPermissions};

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn name(text: &str) -> Name {
    Name::new(text).unwrap()
}

const CREATE_USER: &str = "05616c696365067365637265740101350000000001000100000001000101030000000100000101000101000000000100010109000000010001000001070000000001010000010000";
const UPDATE_USER: &str = "0205616c6963650106616c696369610102";
const CHANGE_PASSWORD: &str = "010401000000066f6c642d7077086e65772d70772d31";
const UPDATE_PERMISSIONS_NONE: &str = "01040400000000";
const CREATE_PAT: &str = "0863692d746f6b656e40420f0000000000";
const USER_DETAILS: &str = "0100000000401e18240a06000105616c6963650000000001350000000001000100000001000101030000000100000101000101000000000100010109000000010001000001070000000001010000010000";
const USER_DETAILS_NONE: &str = "0100000000401e18240a06000105616c6963650000000000000000";
const TOKEN_INFO: &str = "0863692d746f6b656e2a00000000000000";
const CLIENT: &str = "efbeadde01000000010d00000031302e302e302e313a3535353500000000";

/// The permission set the generator encodes.
fn permissions() -> Permissions {
    let mut topics = BTreeMap::new();
    topics.insert(
        1,
        TopicPermissions {
            manage_topic: false,
            read_topic: true,
            poll_messages: false,
            send_messages: true,
        },
    );
    topics.insert(
        9,
        TopicPermissions {
            manage_topic: true,
            read_topic: false,
            poll_messages: true,
            send_messages: false,
        },
    );
    let mut streams = BTreeMap::new();
    streams.insert(
        3,
        StreamPermissions {
            manage_stream: true,
            read_stream: false,
            manage_topics: false,
            read_topics: true,
            poll_messages: true,
            send_messages: false,
            topics,
        },
    );
    streams.insert(
        7,
        StreamPermissions {
            manage_stream: false,
            read_stream: true,
            manage_topics: true,
            read_topics: false,
            poll_messages: false,
            send_messages: true,
            topics: BTreeMap::new(),
        },
    );
    Permissions {
        global: GlobalPermissions {
            read_servers: true,
            read_users: true,
            read_topics: true,
            send_messages: true,
            ..GlobalPermissions::default()
        },
        streams,
    }
}

/// Decodes `bytes` as `operation`/`code`, checks the value, re-encodes to the same bytes.
fn round_trip(operation: Operation, code: u32, bytes: &[u8], expected: Request<'_>) {
    let decoded = Request::decode(operation, code, bytes).unwrap();
    assert_eq!(decoded, expected);
    let mut out = Vec::new();
    decoded.encode(&mut out);
    assert_eq!(out, bytes);
}

#[test]
fn request_bodies_round_trip_the_sdk_bytes() {
    round_trip(
        Operation::CreateUser,
        0,
        &hex(CREATE_USER),
        Request::CreateUser(CreateUser {
            username: name("alice"),
            password: "secret".into(),
            status: 1,
            permissions: Some(permissions()),
            options: Options::default(),
        }),
    );
    round_trip(
        Operation::UpdateUser,
        0,
        &hex(UPDATE_USER),
        Request::UpdateUser(UpdateUser {
            user: Identifier::Named(name("alice")),
            username: Some(name("alicia")),
            status: Some(2),
            options: Options::default(),
        }),
    );
    round_trip(
        Operation::ChangePassword,
        0,
        &hex(CHANGE_PASSWORD),
        Request::ChangePassword(ChangePassword {
            user: Identifier::Numeric(1),
            current: "old-pw".into(),
            new: "new-pw-1".into(),
        }),
    );
    round_trip(
        Operation::UpdatePermissions,
        0,
        &hex(UPDATE_PERMISSIONS_NONE),
        Request::UpdatePermissions(UpdatePermissions {
            user: Identifier::Numeric(4),
            permissions: None,
        }),
    );
    round_trip(
        Operation::CreatePersonalAccessToken,
        0,
        &hex(CREATE_PAT),
        Request::CreatePersonalAccessToken {
            name: name("ci-token"),
            expiry: 1_000_000,
        },
    );
    round_trip(
        Operation::NonReplicated,
        21,
        &[1, 0, 0, 0],
        Request::GetClient(1),
    );
    for (code, request) in [
        (20, Request::GetMe),
        (22, Request::GetClients),
        (32, Request::GetUsers),
        (41, Request::GetPersonalAccessTokens),
    ] {
        round_trip(Operation::NonReplicated, code, &[], request);
    }
    // Secrets never show in Debug.
    let debug = format!(
        "{:?}",
        Request::decode(Operation::CreateUser, 0, &hex(CREATE_USER))
    );
    assert!(!debug.contains("secret"), "{debug}");
    let debug = format!(
        "{:?}",
        Request::decode(Operation::ChangePassword, 0, &hex(CHANGE_PASSWORD))
    );
    assert!(
        !debug.contains("old-pw") && !debug.contains("new-pw"),
        "{debug}"
    );
}

#[test]
fn replies_encode_exactly_as_the_sdk_does() {
    let record = UserRecord {
        id: 1,
        created_at: 1_700_000_000_000_000,
        status: 1,
        username: name("alice"),
    };
    let details = UserDetails {
        user: record.clone(),
        permissions: Some(permissions()),
    };
    let mut out = Vec::new();
    details.encode(&mut out);
    assert_eq!(out, hex(USER_DETAILS));
    assert_eq!(UserDetails::decode(&out).unwrap(), details);
    let bare = UserDetails {
        user: record,
        permissions: None,
    };
    out.clear();
    bare.encode(&mut out);
    assert_eq!(out, hex(USER_DETAILS_NONE));
    assert_eq!(UserDetails::decode(&out).unwrap(), bare);
    out.clear();
    TokenRecord {
        name: name("ci-token"),
        expiry_at: 42,
    }
    .encode(&mut out);
    assert_eq!(out, hex(TOKEN_INFO));
    assert_eq!(decode_tokens(&out).unwrap()[0].expiry_at, 42);
    let client = ClientRecord {
        client_id: 0xdead_beef,
        user_id: 1,
        transport: 1,
        address: "10.0.0.1:5555".into(),
        consumer_groups_count: 0,
    };
    out.clear();
    client.encode(&mut out);
    assert_eq!(out, hex(CLIENT));
    assert_eq!(ClientRecord::read(&mut Reader::new(&out)).unwrap(), client);
}

#[test]
fn truncated_or_inconsistent_bodies_are_typed_errors() {
    let create = hex(CREATE_USER);
    // Every strict prefix ends inside the permission block (the options block is empty).
    for cut in 0..create.len() {
        let decoded = Request::decode(Operation::CreateUser, 0, &create[..cut]);
        assert!(
            decoded.is_err(),
            "prefix of {cut} bytes decoded: {decoded:?}"
        );
    }
    // A permissions length (offset 15) that disagrees with the block.
    let mut bad = create.clone();
    assert_eq!(bad[15], 0x35);
    bad[15] = 0x34;
    assert!(Request::decode(Operation::CreateUser, 0, &bad).is_err());
    // A stream named twice.
    let mut twice = Permissions::default();
    twice.streams.insert(1, StreamPermissions::default());
    let mut bytes = twice.to_bytes();
    let entry = bytes[11..].to_vec();
    let last = bytes.len() - 1;
    bytes[last] = 1;
    bytes.extend_from_slice(&entry);
    assert!(Permissions::read(&mut Reader::new(&bytes)).is_err());
}

#[test]
fn prepared_bodies_round_trip_and_carry_no_secret() {
    let hash = PasswordHash::new("pw-secret", [3; 16], HashParams::TEST).unwrap();
    let user = PreparedUser {
        username: name("alice"),
        status: 2,
        permissions: Some(permissions()),
        password: hash.clone(),
    };
    let bytes = user.encode();
    assert_eq!(PreparedUser::decode(&bytes).unwrap(), user);
    assert!(!bytes.windows(9).any(|w| w == b"pw-secret"));
    let other = PasswordHash::new("pw-2", [4; 16], HashParams::TEST).unwrap();
    let change = PreparedPassword {
        user_id: 5,
        verified: hash,
        new: other,
    };
    assert_eq!(PreparedPassword::decode(&change.encode()).unwrap(), change);
    let token = PreparedToken {
        name: name("ci-token"),
        expiry: 7,
        hash: [9; 32],
    };
    let bytes = token.encode();
    assert_eq!(PreparedToken::decode(&bytes).unwrap(), token);
    assert!(PreparedToken::decode(&bytes[..bytes.len() - 1]).is_err());
    // A client body is not a prepared one: apply refuses it.
    assert!(PreparedUser::decode(&hex(CREATE_USER)).is_err());
}

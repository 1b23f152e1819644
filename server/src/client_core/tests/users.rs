//! Users, permissions, tokens and client information over the wire (issue 11): a user
//! without a permission is refused 41 and succeeds once granted, for every command class;
//! the user lifecycle; personal access tokens; GetMe / GetClient / GetClients.

use super::*;
use crate::client::codec::{Identifier, Name, Options};
use crate::client::request::Request;
use crate::client::users::{
    ChangePassword, ClientRecord, CreateUser, UpdatePermissions, UpdateUser, UserDetails,
    decode_clients, decode_tokens, decode_users,
};
use crate::metadata::users::{GlobalPermissions, Permissions, StreamPermissions, TopicPermissions};

fn body(request: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    request.encode(&mut out);
    out
}

fn id(n: u32) -> Identifier {
    Identifier::Numeric(n)
}

fn nm(text: &str) -> Name {
    Name::new(text).unwrap()
}

/// The code of a metadata reply's result section (0 for success).
fn result_code(answer: &Answer) -> u32 {
    assert_eq!(
        answer.status(),
        0,
        "metadata replies use the result section"
    );
    match read_result(answer.body()).unwrap() {
        Ok(_) => 0,
        Err(code) => code,
    }
}

fn create_user(
    c: &mut Client,
    username: &str,
    password: &str,
    permissions: Option<Permissions>,
) -> Answer {
    c.call(
        Operation::CreateUser,
        0,
        &body(&Request::CreateUser(CreateUser {
            username: nm(username),
            password: password.to_owned(),
            status: 1,
            permissions,
            options: Options::default(),
        })),
    )
}

fn set_permissions(c: &mut Client, user: &str, permissions: Option<Permissions>) {
    let answer = c.call(
        Operation::UpdatePermissions,
        0,
        &body(&Request::UpdatePermissions(UpdatePermissions {
            user: Identifier::Named(nm(user)),
            permissions,
        })),
    );
    assert_eq!(result_code(&answer), 0);
}

/// A client on shard `shard` with its own client id `n`, logged in as `username`.
fn login_as(node: &Node, shard: usize, n: u128, username: &str, password: &str) -> Client {
    let mut c = node.connect(shard);
    c.client = 0x0005_e700_0000_0000_0000_0000_0000_0000 + n;
    let answer = c.login(username, password);
    assert!(answer.is_reply(), "{username} logs in");
    assert_eq!(answer.status(), 0);
    c
}

fn send_body(stream: u32, topic: u32) -> Vec<u8> {
    // Envelope: metadata_length, stream, topic, partitioning (partition id 0), count 0; then
    // a zero batch header (message_count 0 at offset 48).
    let mut envelope = vec![1, 4];
    envelope.extend_from_slice(&stream.to_le_bytes());
    envelope.extend_from_slice(&[1, 4]);
    envelope.extend_from_slice(&topic.to_le_bytes());
    envelope.extend_from_slice(&[2, 4, 0, 0, 0, 0]);
    envelope.extend_from_slice(&0u32.to_le_bytes());
    let mut out = (envelope.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&envelope);
    out.extend_from_slice(&[0u8; 256]);
    out
}

fn offset_target(stream: u32, topic: u32) -> Vec<u8> {
    let mut body = vec![1, 1, 4, 1, 0, 0, 0, 1, 4];
    body.extend_from_slice(&stream.to_le_bytes());
    body.extend_from_slice(&[1, 4]);
    body.extend_from_slice(&topic.to_le_bytes());
    body.extend_from_slice(&[1, 0, 0, 0, 0]);
    body
}

fn poll_body(stream: u32, topic: u32) -> Vec<u8> {
    let mut body = offset_target(stream, topic);
    body.push(1);
    body.extend_from_slice(&0u64.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    body.push(0);
    body
}

fn store_body(stream: u32, topic: u32) -> Vec<u8> {
    let mut body = offset_target(stream, topic);
    body.extend_from_slice(&0u64.to_le_bytes());
    body.push(1);
    body
}

/// Every command class: refused 41 without the permission, allowed with it (decision 302).
#[test]
fn every_command_class_is_refused_without_its_permission_and_allowed_with_it() {
    let node = Node::start();
    let mut root = login_as(&node, 0, 1, "iggy", "iggy");
    for stream in ["s0", "s1"] {
        let answer = root.call(Operation::CreateStream, 0, &create_stream_body(stream));
        assert_eq!(result_code(&answer), 0);
    }
    for (stream, topic) in [(0, "t0"), (0, "t1"), (1, "t0")] {
        let answer = root.call(
            Operation::CreateTopic,
            0,
            &create_topic_body(stream, 1, topic),
        );
        assert_eq!(result_code(&answer), 0);
    }
    assert_eq!(
        result_code(&create_user(&mut root, "bob", "bobpass", None)),
        0
    );
    let mut bob = login_as(&node, 1, 2, "bob", "bobpass");

    // (command, how bob calls it, the permissions that allow it). NonReplicated and
    // partition refusals come in the header status, metadata ones in the result section.
    type Call = Box<dyn Fn(&mut Client) -> u32>;
    let nr = |code: u32, body: Vec<u8>| -> Call {
        Box::new(move |c: &mut Client| c.call(Operation::NonReplicated, code, &body).status())
    };
    let md = |op: Operation, body: Vec<u8>| -> Call {
        Box::new(move |c: &mut Client| result_code(&c.call(op, 0, &body)))
    };
    // A partition refusal: the header status, or the result section of StoreConsumerOffset.
    let part = |op: Operation, body: Vec<u8>| -> Call {
        Box::new(move |c: &mut Client| {
            let answer = c.call(op, 0, &body);
            match (answer.status(), read_result(answer.body())) {
                (0, Ok(Err(code))) if answer.body().len() == 12 => code,
                (status, _) => status,
            }
        })
    };
    let global = |f: fn(&mut GlobalPermissions)| {
        let mut p = Permissions::default();
        f(&mut p.global);
        p
    };
    let on_stream = |s: u32, f: fn(&mut StreamPermissions)| {
        let mut p = Permissions::default();
        let mut sp = StreamPermissions::default();
        f(&mut sp);
        p.streams.insert(s, sp);
        p
    };
    let on_topic = |s: u32, t: u32, f: fn(&mut TopicPermissions)| {
        let mut p = Permissions::default();
        let mut tp = TopicPermissions::default();
        f(&mut tp);
        let mut sp = StreamPermissions::default();
        sp.topics.insert(t, tp);
        p.streams.insert(s, sp);
        p
    };
    let cases: Vec<(&str, Call, Permissions)> = vec![
        (
            "GetStats",
            nr(10, vec![]),
            global(|g| g.read_servers = true),
        ),
        (
            "GetClients",
            nr(22, vec![]),
            global(|g| g.read_servers = true),
        ),
        ("GetUsers", nr(32, vec![]), global(|g| g.read_users = true)),
        (
            "GetUser (another user)",
            nr(31, body(&Request::GetUser(id(0)))),
            global(|g| g.manage_users = true),
        ),
        (
            "GetStreams",
            nr(201, vec![]),
            global(|g| g.read_streams = true),
        ),
        (
            "GetStream",
            nr(200, body(&Request::GetStream(id(0)))),
            on_stream(0, |s| s.read_stream = true),
        ),
        (
            "GetTopic",
            nr(
                300,
                body(&Request::GetTopic {
                    stream: id(0),
                    topic: id(1),
                }),
            ),
            on_topic(0, 1, |t| t.read_topic = true),
        ),
        (
            "PollMessages",
            nr(100, poll_body(0, 0)),
            on_topic(0, 0, |t| t.poll_messages = true),
        ),
        (
            "GetConsumerOffset",
            nr(120, offset_target(1, 0)),
            on_stream(1, |s| s.poll_messages = true),
        ),
        (
            "SendMessages",
            part(Operation::SendMessages, send_body(0, 1)),
            on_topic(0, 1, |t| t.send_messages = true),
        ),
        (
            "StoreConsumerOffset",
            part(Operation::StoreConsumerOffset, store_body(0, 0)),
            global(|g| g.poll_messages = true),
        ),
        (
            "CreateTopic",
            md(Operation::CreateTopic, create_topic_body(1, 1, "bobs")),
            on_stream(1, |s| s.manage_topics = true),
        ),
        (
            "CreateStream",
            md(Operation::CreateStream, create_stream_body("bobs")),
            global(|g| g.manage_streams = true),
        ),
        (
            "DeleteStream",
            md(Operation::DeleteStream, body(&Request::DeleteStream(id(1)))),
            on_stream(1, |s| s.manage_stream = true),
        ),
        (
            "CreateUser",
            md(
                Operation::CreateUser,
                body(&Request::CreateUser(CreateUser {
                    username: nm("carol"),
                    password: "carolpass".into(),
                    status: 1,
                    permissions: None,
                    options: Options::default(),
                })),
            ),
            global(|g| g.manage_users = true),
        ),
        (
            "UpdateUser",
            md(
                Operation::UpdateUser,
                body(&Request::UpdateUser(UpdateUser {
                    user: Identifier::Named(nm("carol")),
                    username: Some(nm("carola")),
                    status: None,
                    options: Options::default(),
                })),
            ),
            global(|g| g.manage_users = true),
        ),
    ];
    for (what, call, permissions) in &cases {
        set_permissions(&mut root, "bob", None);
        assert_eq!(call(&mut bob), 41, "{what} without its permission");
        // Another stream's or topic's permission does not allow it either.
        set_permissions(
            &mut root,
            "bob",
            Some(on_topic(7, 7, |t| {
                *t = TopicPermissions {
                    manage_topic: true,
                    read_topic: true,
                    poll_messages: true,
                    send_messages: true,
                }
            })),
        );
        assert_eq!(call(&mut bob), 41, "{what} with permissions elsewhere");
        set_permissions(&mut root, "bob", Some(permissions.clone()));
        assert_ne!(call(&mut bob), 41, "{what} with its permission");
    }
    // Root holds everything whatever is stored.
    assert_eq!(root.call(Operation::NonReplicated, 32, &[]).status(), 0);
    // Partition ops reached the host only when allowed: bob's refused ones never did.
    assert!(node.seen.lock().unwrap().submits.len() >= 2);
}

#[test]
fn user_lifecycle_login_password_change_deactivation_and_delete() {
    let node = Node::start();
    let mut root = login_as(&node, 0, 1, "iggy", "iggy");
    let mut perms = Permissions::default();
    perms.global.read_streams = true;
    let answer = create_user(&mut root, "alice", "alicepw", Some(perms.clone()));
    let details = UserDetails::decode(read_result(answer.body()).unwrap().unwrap()).unwrap();
    assert_eq!(details.user.id, 1);
    assert_eq!(details.user.username.as_str(), "alice");
    assert_eq!(details.user.status, 1);
    assert!(details.user.created_at > 0);
    assert_eq!(details.permissions, Some(perms.clone()));
    // A duplicate name: 46.
    assert_eq!(
        result_code(&create_user(&mut root, "alice", "other1", None)),
        46
    );
    // GetUser by id and by name, GetUsers.
    let a = root.call(
        Operation::NonReplicated,
        31,
        &body(&Request::GetUser(id(1))),
    );
    assert_eq!(UserDetails::decode(a.body()).unwrap(), details);
    let a = root.call(
        Operation::NonReplicated,
        31,
        &body(&Request::GetUser(Identifier::Named(nm("alice")))),
    );
    assert_eq!(UserDetails::decode(a.body()).unwrap(), details);
    let a = root.call(
        Operation::NonReplicated,
        31,
        &body(&Request::GetUser(id(9))),
    );
    assert!(a.body().is_empty(), "an unknown user is an empty body");
    let a = root.call(Operation::NonReplicated, 32, &[]);
    let names: Vec<String> = decode_users(a.body())
        .unwrap()
        .into_iter()
        .map(|u| u.username.as_str().to_owned())
        .collect();
    assert_eq!(names, ["iggy", "alice"]);
    // The password is stored only as its hash: nowhere in the snapshot.
    let snapshot = node.reader.view().state.encode();
    assert!(!snapshot.windows(7).any(|w| w == b"alicepw"));

    let mut alice = login_as(&node, 1, 2, "alice", "alicepw");
    // Her own user without read_users; her password with a wrong current one: 44.
    let a = alice.call(
        Operation::NonReplicated,
        31,
        &body(&Request::GetUser(id(1))),
    );
    assert_eq!(UserDetails::decode(a.body()).unwrap().user.id, 1);
    let change = |current: &str, new: &str| {
        body(&Request::ChangePassword(ChangePassword {
            user: id(1),
            current: current.into(),
            new: new.into(),
        }))
    };
    let a = alice.call(Operation::ChangePassword, 0, &change("wrong1", "alicepw2"));
    assert_eq!(result_code(&a), 44);
    let a = alice.call(Operation::ChangePassword, 0, &change("alicepw", "alicepw2"));
    assert_eq!(result_code(&a), 0);
    let mut again = node.connect(0);
    again.client = 0x77;
    assert_eq!(again.login("alice", "alicepw").reason(), 9);
    let mut again = login_as(&node, 0, 3, "alice", "alicepw2");
    assert_eq!(again.ping().status(), 0);

    // Deactivated: her sessions end (NonReplicated 40, replicated evicted 12), login 11.
    let deactivate = body(&Request::UpdateUser(UpdateUser {
        user: id(1),
        username: None,
        status: Some(2),
        options: Options::default(),
    }));
    assert_eq!(
        result_code(&root.call(Operation::UpdateUser, 0, &deactivate)),
        0
    );
    assert_eq!(alice.call(Operation::NonReplicated, 201, &[]).status(), 40);
    assert_eq!(
        alice
            .call(Operation::CreateStream, 0, &create_stream_body("x"))
            .reason(),
        12
    );
    let mut again = node.connect(1);
    again.client = 0x78;
    assert_eq!(again.login("alice", "alicepw2").reason(), 11);
    // Root cannot be deactivated or deleted: 48.
    let root_off = body(&Request::UpdateUser(UpdateUser {
        user: id(0),
        username: None,
        status: Some(2),
        options: Options::default(),
    }));
    assert_eq!(
        result_code(&root.call(Operation::UpdateUser, 0, &root_off)),
        48
    );
    let a = root.call(Operation::DeleteUser, 0, &body(&Request::DeleteUser(id(0))));
    assert_eq!(result_code(&a), 48);
    // Deleted: gone from GetUsers, login refused 9.
    let a = root.call(Operation::DeleteUser, 0, &body(&Request::DeleteUser(id(1))));
    assert_eq!(result_code(&a), 0);
    assert_eq!(
        decode_users(root.call(Operation::NonReplicated, 32, &[]).body())
            .unwrap()
            .len(),
        1
    );
    let mut again = node.connect(1);
    again.client = 0x79;
    assert_eq!(again.login("alice", "alicepw2").reason(), 9);
}

fn pat_login(node: &Node, n: u128, token: &str) -> Answer {
    let mut c = node.connect(1);
    c.client = 0x0070_0000 + n;
    c.exchange(&pat_login_frame(c.client, token))
}

fn pat_login_frame(client: u128, token: &str) -> Vec<u8> {
    let mut login = 0x2C00u32.to_le_bytes().to_vec();
    for text in ["rust-sdk", "0.11.0-edge.4", token] {
        login.push(text.len() as u8);
        login.extend_from_slice(text.as_bytes());
    }
    login.extend_from_slice(&0u32.to_le_bytes());
    request_frame(client, Operation::Register, 0, 0, 0, &login)
}

/// A login resent with the same request number (the SDK's resend after a lost reply, on
/// another connection) is a new login, with a token as with a password: a Register always
/// opens a new session (its reply names the new session, never a refusal such as 51). Only
/// CreatePersonalAccessToken's resend is refused 51 (decision 306; see decision 381).
#[test]
fn a_resent_login_is_a_new_session_with_a_token_as_with_a_password() {
    let node = Node::start();
    let mut root = login_as(&node, 0, 1, "iggy", "iggy");
    let a = root.call(
        Operation::CreatePersonalAccessToken,
        0,
        &body(&Request::CreatePersonalAccessToken {
            name: nm("resend"),
            expiry: 0,
        }),
    );
    let payload = read_result(a.body()).unwrap().unwrap();
    let token = std::str::from_utf8(&payload[1..]).unwrap().to_owned();
    let password = request_frame(
        0x0071_0001,
        Operation::Register,
        0,
        0,
        0,
        &login_body(0x2C00, "iggy", "iggy"),
    );
    let pat = pat_login_frame(0x0071_0002, &token);
    for (what, frame) in [("token", pat), ("password", password)] {
        let session = |answer: &Answer| {
            assert_eq!((answer.is_reply(), answer.status()), (true, 0), "{what}");
            let reply = read_result(answer.body()).unwrap().unwrap();
            let login = crate::client::reply::LoginReply::decode(reply).unwrap();
            assert_eq!(login.user_id, 0, "{what}");
            u64::from_le_bytes(reply[4..12].try_into().unwrap())
        };
        let first = session(&node.connect(0).exchange(&frame));
        let again = session(&node.connect(1).exchange(&frame));
        assert!(
            again > first,
            "{what}: a new session, {again} after {first}"
        );
    }
}

/// A CreatePersonalAccessToken resent with the same request number (after a lost reply, on
/// another connection) is answered from the client table with the original token, not 51:
/// the token is derived from the request under the node's key (decision 381). A new request
/// of the same name is still 51, and the token logs in.
#[test]
fn a_resent_token_creation_gets_the_original_token() {
    let node = Node::start();
    let mut root = login_as(&node, 0, 1, "iggy", "iggy");
    let create = body(&Request::CreatePersonalAccessToken {
        name: nm("resent"),
        expiry: 0,
    });
    let number = root.request;
    let first = root.call(Operation::CreatePersonalAccessToken, 0, &create);
    assert_eq!(result_code(&first), 0);
    let mut again = node.connect(1);
    again.client = root.client;
    again.session = root.session;
    again.request = number;
    let second = again.call(Operation::CreatePersonalAccessToken, 0, &create);
    assert_eq!(second.body(), first.body(), "the original token");
    assert_eq!(
        decode_tokens(root.call(Operation::NonReplicated, 41, &[]).body())
            .unwrap()
            .len(),
        1,
        "committed once"
    );
    assert_eq!(
        result_code(&root.call(Operation::CreatePersonalAccessToken, 0, &create)),
        51
    );
    let token = std::str::from_utf8(&read_result(first.body()).unwrap().unwrap()[1..])
        .unwrap()
        .to_owned();
    assert_eq!(result_code(&pat_login(&node, 9, &token)), 0);
}

#[test]
fn personal_access_tokens_are_shown_once_stored_hashed_and_log_in() {
    let node = Node::start();
    let mut root = login_as(&node, 0, 1, "iggy", "iggy");
    let create = |name: &str, expiry: u64| {
        body(&Request::CreatePersonalAccessToken {
            name: nm(name),
            expiry,
        })
    };
    let a = root.call(
        Operation::CreatePersonalAccessToken,
        0,
        &create("ci-token", 0),
    );
    let payload = read_result(a.body()).unwrap().unwrap();
    let token = std::str::from_utf8(&payload[1..]).unwrap().to_owned();
    assert_eq!((payload[0] as usize, token.len()), (64, 64));
    // Stored hashed: the token text is nowhere in the committed state.
    let snapshot = node.reader.view().state.encode();
    assert!(!snapshot.windows(64).any(|w| w == token.as_bytes()));
    // A second of the same name: 51. Listed once, never expiring (0).
    let a = root.call(
        Operation::CreatePersonalAccessToken,
        0,
        &create("ci-token", 0),
    );
    assert_eq!(result_code(&a), 51);
    let listed = decode_tokens(root.call(Operation::NonReplicated, 41, &[]).body()).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].name.as_str(), listed[0].expiry_at),
        ("ci-token", 0)
    );

    // Login with it as root; an unknown token is evicted 10.
    let a = pat_login(&node, 1, &token);
    let login =
        crate::client::reply::LoginReply::decode(read_result(a.body()).unwrap().unwrap()).unwrap();
    assert_eq!(login.user_id, 0);
    assert_eq!(pat_login(&node, 2, &"0".repeat(64)).reason(), 10);
    // Expired (1 µs after its commit): refused like an unknown one.
    let a = root.call(Operation::CreatePersonalAccessToken, 0, &create("short", 1));
    let short = std::str::from_utf8(&read_result(a.body()).unwrap().unwrap()[1..])
        .unwrap()
        .to_owned();
    let listed = decode_tokens(root.call(Operation::NonReplicated, 41, &[]).body()).unwrap();
    assert!(
        listed
            .iter()
            .any(|t| t.name.as_str() == "short" && t.expiry_at > 0)
    );
    assert_eq!(pat_login(&node, 3, &short).reason(), 10);
    // Deleted: login refused; deleting it again is 20.
    let delete = body(&Request::DeletePersonalAccessToken(nm("ci-token")));
    assert_eq!(
        result_code(&root.call(Operation::DeletePersonalAccessToken, 0, &delete)),
        0
    );
    assert_eq!(pat_login(&node, 4, &token).reason(), 10);
    assert_eq!(
        result_code(&root.call(Operation::DeletePersonalAccessToken, 0, &delete)),
        20
    );
}

#[test]
fn get_me_get_client_and_get_clients_answer_from_the_sessions() {
    let node = Node::start();
    let mut root = login_as(&node, 0, 1, "iggy", "iggy");
    assert_eq!(
        result_code(&create_user(&mut root, "dave", "davepw", None)),
        0
    );
    let mut dave = login_as(&node, 1, 2, "dave", "davepw");
    let me = dave.call(Operation::NonReplicated, 20, &[]);
    let mut r = crate::client::codec::Reader::new(me.body());
    let record = ClientRecord::read(&mut r).unwrap();
    assert_eq!(record.client_id, dave.client as u32);
    assert_eq!((record.user_id, record.transport), (1, 1));
    assert_eq!(record.consumer_groups_count, 0);
    // The peer address of dave's connection (decision 384).
    assert_eq!(
        record.address,
        dave.stream.local_addr().unwrap().to_string()
    );
    r.finish().unwrap();
    // Dave may not list clients; root may, and finds both.
    assert_eq!(dave.call(Operation::NonReplicated, 22, &[]).status(), 41);
    let all = decode_clients(root.call(Operation::NonReplicated, 22, &[]).body()).unwrap();
    let mut ids: Vec<(u32, u32)> = all.iter().map(|c| (c.client_id, c.user_id)).collect();
    ids.sort();
    assert_eq!(ids, [(root.client as u32, 0), (dave.client as u32, 1)]);
    let root_address = root.stream.local_addr().unwrap().to_string();
    assert!(
        all.iter()
            .any(|c| c.client_id == root.client as u32 && c.address == root_address),
        "{all:?}"
    );
    let one = root.call(
        Operation::NonReplicated,
        21,
        &(dave.client as u32).to_le_bytes(),
    );
    assert_eq!(
        ClientRecord::read(&mut crate::client::codec::Reader::new(one.body()))
            .unwrap()
            .user_id,
        1
    );
    let none = root.call(Operation::NonReplicated, 21, &12345u32.to_le_bytes());
    assert_eq!((none.status(), none.body().len()), (0, 0));
    // Dave's connection closes: his session stays (no Logout), his address goes with it.
    drop(dave);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let all = decode_clients(root.call(Operation::NonReplicated, 22, &[]).body()).unwrap();
        let dave = all.iter().find(|c| c.user_id == 1).expect("dave's session");
        if dave.address.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{all:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

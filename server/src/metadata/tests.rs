//! Metadata state machine tests: replies of apply sequences, determinism across instances,
//! snapshot/install, malformed prepares, the read handle, root credentials.

use consensus::{Artifact, InstallError, WholeArtifacts};
use proptest::prelude::*;
use wire::Operation;
use wire::header::{Layout, PrepareHeader};
use wire::manifest::ArtifactKind;

use super::*;
use crate::client::codec::{Identifier, Name, OptionValue, Options, kind};
use crate::client::reply::{StreamDetails, TopicDetails, read_result};
use crate::client::request::{CreateTopic, Request};

pub(super) fn genesis() -> Genesis {
    Genesis {
        cluster_id: 0xC1,
        root: RootCredentials::resolve(None, None, ("a", "b"), |_| None).unwrap(),
        params: HashParams::TEST,
    }
}

pub(super) fn machine() -> MetadataStateMachine {
    MetadataStateMachine::new(&genesis()).unwrap()
}

/// Drives one machine as every replica does: the primary's preflight and projection, then
/// apply at the next op with a timestamp of `op * 1000`.
pub(super) struct Driver {
    pub(super) sm: MetadataStateMachine,
    pub(super) op: u64,
    pub(super) user_id: u32,
}

impl Driver {
    pub(super) fn new() -> Driver {
        Driver {
            sm: machine(),
            op: 0,
            user_id: ROOT_USER_ID,
        }
    }

    /// Submits a client request; `Err(code)` if preflight refuses it, else the reply body.
    pub(super) fn submit(&mut self, request: &Request<'_>) -> Result<Vec<u8>, u32> {
        let (operation, _) = request.operation();
        let mut body = Vec::new();
        request.encode(&mut body);
        self.sm.preflight(operation, &body)?;
        let projection = self.sm.project(operation, &body);
        Ok(self.apply(projection.operation, &projection.body))
    }

    /// Applies a prepare as committed.
    pub(super) fn apply(&mut self, operation: Operation, body: &[u8]) -> Vec<u8> {
        self.op += 1;
        let mut reply = Vec::new();
        self.sm
            .apply(&header(self.op, operation, self.user_id), body, &mut reply);
        reply
    }
}

pub(super) fn header(op: u64, operation: Operation, user_id: u32) -> PrepareHeader {
    let mut h = PrepareHeader::zeroed();
    h.op.set(op);
    h.timestamp.set(op * 1000);
    h.operation = operation.byte();
    h.user_id.set(user_id);
    h
}

pub(super) fn name(text: &str) -> Name {
    Name::new(text).unwrap()
}

pub(super) fn create_stream(text: &str) -> Request<'static> {
    Request::CreateStream {
        name: name(text),
        options: Options::default(),
    }
}

pub(super) fn create_topic(
    stream: Identifier,
    text: &str,
    partitions_count: u32,
) -> Request<'static> {
    Request::CreateTopic(CreateTopic {
        stream,
        partitions_count,
        name: name(text),
        options: Options::default(),
    })
}

pub(super) fn payload(reply: &[u8]) -> &[u8] {
    read_result(reply).unwrap().expect("success")
}

pub(super) fn rejected(reply: &[u8]) -> u32 {
    read_result(reply).unwrap().expect_err("rejection")
}

#[test]
fn streams_and_topics_apply_with_their_replies() {
    let mut d = Driver::new();
    let reply = d.submit(&create_stream("s1")).unwrap();
    let s1 = StreamDetails::decode(payload(&reply)).unwrap();
    assert_eq!(
        (s1.stream.id, s1.stream.name.as_str(), s1.stream.created_at),
        (0, "s1", 1000)
    );
    assert_eq!((s1.stream.topics_count, s1.topics.len()), (0, 0));
    let s2 = StreamDetails::decode(payload(&d.submit(&create_stream("s2")).unwrap())).unwrap();
    assert_eq!(s2.stream.id, 1);

    // A duplicate refused before replication, and also when it reaches apply (another
    // CreateStream of the same name committed in between).
    assert_eq!(
        d.submit(&create_stream("s1")),
        Err(status::STREAM_NAME_ALREADY_EXISTS)
    );
    let body = [2, b's', b'1'];
    assert_eq!(
        rejected(&d.apply(Operation::CreateStream, &body)),
        status::STREAM_NAME_ALREADY_EXISTS
    );

    let reply = d
        .submit(&create_topic(Identifier::Named(name("s2")), "t1", 3))
        .unwrap();
    let t1 = TopicDetails::decode(payload(&reply)).unwrap();
    assert_eq!((t1.topic.id, t1.topic.name.as_str()), (0, "t1"));
    assert_eq!(t1.topic.partitions_count, 3);
    assert_eq!(
        t1.partitions.iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // Defaults for every key the client left out (§7.3): none, never, unlimited.
    assert_eq!(t1.topic.compression_algorithm, 1);
    assert_eq!(t1.topic.message_expiry, u64::MAX);
    assert_eq!(t1.topic.max_topic_size, u64::MAX);
    assert!(t1.topic.explicit.is_empty());
    assert_eq!(t1.topic.derived.0.len(), topic::KEYS.len());
    let topic = &d.sm.state().streams[&1].topics[&0];
    assert_eq!(
        topic
            .partitions
            .iter()
            .map(|p| p.consensus_group_id)
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );

    // The stream now lists the topic.
    let view = d.sm.reader().view();
    let s2 = view.stream(&Identifier::Numeric(1)).unwrap();
    let details = view.stream_details(s2);
    assert_eq!((details.stream.topics_count, details.topics.len()), (1, 1));
    drop(view);

    // Business refusals.
    let cases = [
        (
            create_topic(Identifier::Numeric(9), "t", 1),
            status::STREAM_ID_NOT_FOUND,
        ),
        (
            create_topic(Identifier::Named(name("nope")), "t", 1),
            status::STREAM_NAME_NOT_FOUND,
        ),
        (
            create_topic(Identifier::Numeric(1), "t1", 1),
            status::TOPIC_NAME_ALREADY_EXISTS,
        ),
        (
            create_topic(Identifier::Numeric(1), "t2", 0),
            status::INVALID_PARTITIONS_COUNT,
        ),
        (
            create_topic(Identifier::Numeric(1), "t2", PARTITIONS_PER_TOPIC_MAX + 1),
            status::TOO_MANY_PARTITIONS,
        ),
        (
            Request::DeleteStream(Identifier::Numeric(7)),
            status::STREAM_ID_NOT_FOUND,
        ),
    ];
    for (request, code) in cases {
        assert_eq!(d.submit(&request), Err(code), "{request:?}");
    }
    let mut stream_with_options = Options::default();
    stream_with_options.0.insert(
        "x".into(),
        OptionValue {
            kind: kind::BOOL,
            bytes: vec![1],
        },
    );
    assert_eq!(
        d.submit(&Request::CreateStream {
            name: name("s3"),
            options: stream_with_options.clone()
        }),
        Err(status::UNSUPPORTED_OPTION_KEY)
    );
    assert_eq!(
        d.submit(&Request::CreateTopic(CreateTopic {
            stream: Identifier::Numeric(1),
            partitions_count: 1,
            name: name("t2"),
            options: stream_with_options,
        })),
        Err(status::UNSUPPORTED_OPTION_KEY)
    );

    // Delete frees the lowest slot, which the next stream takes.
    assert_eq!(
        payload(
            &d.submit(&Request::DeleteStream(Identifier::Numeric(0)))
                .unwrap()
        ),
        &[] as &[u8]
    );
    let s3 = StreamDetails::decode(payload(&d.submit(&create_stream("s3")).unwrap())).unwrap();
    assert_eq!(s3.stream.id, 0);
}

#[test]
fn other_operations_and_unknown_users_are_refused_deterministically() {
    let mut d = Driver::new();
    let op = Operation::DeleteSegments;
    assert_eq!(d.sm.preflight(op, &[]), Err(status::FEATURE_UNAVAILABLE));
    assert_eq!(rejected(&d.apply(op, &[])), status::FEATURE_UNAVAILABLE);
    assert_eq!(d.sm.preflight(Operation::Register, &[]), Ok(()));
    d.user_id = 77;
    assert_eq!(
        rejected(&d.submit(&create_stream("s")).unwrap()),
        status::UNAUTHORIZED
    );
    assert!(d.sm.state().streams.is_empty());
}

#[test]
fn malformed_prepares_are_refused_alike() {
    let mut d = Driver::new();
    let before = d.sm.snapshot();
    assert_eq!(
        rejected(&d.apply(Operation::CreateStream, &[0])),
        status::INVALID_COMMAND
    );
    assert_eq!(
        rejected(&d.apply(Operation::DeleteStream, &[3, 4, 0, 0, 0, 0])),
        status::INVALID_IDENTIFIER
    );
    assert_eq!(
        rejected(&d.apply(Operation::CreateTopicWithAssignments, &[1, 2, 3])),
        status::INVALID_COMMAND
    );
    // A §7.4 body whose partition list disagrees with its count.
    d.submit(&create_stream("s")).unwrap();
    let mut body = Assigned {
        create: CreateTopic {
            stream: Identifier::Numeric(0),
            partitions_count: 2,
            name: name("t"),
            options: Options::default(),
        },
        derived: topic::derive(&Options::default()),
        group_ids: vec![5, 6],
    }
    .encode();
    let last = body.len() - 12;
    body[last] = 7; // partition id 1 -> 7
    assert_eq!(
        rejected(&d.apply(Operation::CreateTopicWithAssignments, &body)),
        status::INVALID_COMMAND
    );
    assert_eq!(d.sm.state().streams[&0].topics.len(), 0);
    assert_ne!(d.sm.snapshot(), before);
    // Group ids that would overflow the counter: refused, and nothing moved.
    let before = d.sm.snapshot();
    let overflowing = Assigned {
        create: CreateTopic {
            stream: Identifier::Numeric(0),
            partitions_count: 2,
            name: name("t"),
            options: Options::default(),
        },
        derived: topic::derive(&Options::default()),
        group_ids: vec![u64::MAX - 1, 0],
    }
    .encode();
    assert_eq!(
        rejected(&d.apply(Operation::CreateTopicWithAssignments, &overflowing)),
        status::ERROR
    );
    assert_eq!(d.sm.snapshot(), before);
}

#[test]
fn group_ids_stay_unique_when_projections_overlap() {
    // Two CreateTopics projected before either applies (both in the pipeline) carry the same
    // hints only if the primary's counter forgot the first; a new primary after a view change
    // can do that. Apply moves past ids already taken.
    let mut a = Driver::new();
    a.submit(&create_stream("s")).unwrap();
    let mut bodies = Vec::new();
    for t in ["t1", "t2"] {
        let mut body = Vec::new();
        create_topic(Identifier::Numeric(0), t, 2).encode(&mut body);
        a.sm.preflight(Operation::CreateTopic, &body).unwrap();
        let projection = a.sm.project(Operation::CreateTopic, &body);
        assert_eq!(projection.operation, Operation::CreateTopicWithAssignments);
        bodies.push(projection.body);
        // A fresh primary's projection counter: forget what was projected.
        a.sm.projected_group_id = 0;
    }
    for body in &bodies {
        payload(&a.apply(Operation::CreateTopicWithAssignments, body));
    }
    let ids: Vec<u64> = a.sm.state().streams[&0]
        .topics
        .values()
        .flat_map(|t| t.partitions.iter().map(|p| p.consensus_group_id))
        .collect();
    assert_eq!(ids, vec![0, 1, 2, 3]);
    assert_eq!(a.sm.state().next_consensus_group_id, 4);
}

/// A mixed sequence of client requests.
pub(super) fn script() -> Vec<Request<'static>> {
    let mut expiry = Options::default();
    expiry.0.insert(
        "message_expiry".into(),
        OptionValue {
            kind: kind::U64,
            bytes: 60_000_000u64.to_le_bytes().to_vec(),
        },
    );
    vec![
        create_stream("orders"),
        create_stream("audit"),
        create_topic(Identifier::Named(name("orders")), "eu", 4),
        Request::CreateTopic(CreateTopic {
            stream: Identifier::Numeric(1),
            partitions_count: 1,
            name: name("log"),
            options: expiry,
        }),
        create_stream("orders"),
        Request::DeleteStream(Identifier::Numeric(0)),
        create_stream("orders-2"),
        create_topic(Identifier::Numeric(0), "us", 2),
    ]
}

#[test]
fn two_instances_fed_the_same_ops_end_identical() {
    let mut prepares = Vec::new();
    let mut primary = Driver::new();
    let mut replies = Vec::new();
    for request in script() {
        let (operation, _) = request.operation();
        let mut body = Vec::new();
        request.encode(&mut body);
        if primary.sm.preflight(operation, &body).is_err() {
            continue;
        }
        let projection = primary.sm.project(operation, &body);
        replies.push(primary.apply(projection.operation, &projection.body));
        prepares.push(projection);
    }
    let mut backup = Driver::new();
    let backup_replies: Vec<_> = prepares
        .iter()
        .map(|p| backup.apply(p.operation, &p.body))
        .collect();
    assert_eq!(backup_replies, replies);
    assert_eq!(backup.sm.snapshot(), primary.sm.snapshot());
    assert_eq!(backup.sm.state(), primary.sm.state());
    // The script did something.
    assert_eq!(primary.sm.state().streams.len(), 2);
    assert_eq!(
        primary.sm.state().streams[&1].topics[&0]
            .settings
            .message_expiry,
        60_000_000
    );
}

#[test]
fn snapshot_install_round_trip_and_refusals() {
    let mut d = Driver::new();
    for request in script() {
        let _ = d.submit(&request);
    }
    let artifacts = d.sm.artifacts(d.op);
    assert_eq!(artifacts.len(), 1);
    assert_eq!(artifacts[0].kind, ArtifactKind::METADATA_SNAPSHOT);

    let mut fresh = machine();
    let reader = fresh.reader();
    fresh.install(d.op, &artifacts).unwrap();
    assert_eq!(fresh.state(), d.sm.state());
    assert_eq!(fresh.snapshot(), d.sm.snapshot());
    assert_eq!(reader.view().state, *d.sm.state());
    assert_eq!(reader.view().op, d.op);
    // The installed copy goes on like the original.
    let mut twin = Driver {
        sm: fresh,
        op: d.op,
        user_id: 0,
    };
    let request = create_topic(Identifier::Numeric(1), "more", 2);
    assert_eq!(twin.submit(&request), d.submit(&request));
    assert_eq!(twin.sm.snapshot(), d.sm.snapshot());

    // Refusals leave the state untouched.
    let mut target = machine();
    target.install(0, &[]).unwrap_err();
    let original = target.snapshot();
    let mut flipped = artifacts[0].clone();
    let at = flipped.bytes.len() / 2;
    flipped.bytes[at] ^= 1;
    assert_eq!(
        target.install(d.op, &[flipped]),
        Err(InstallError::Decode { index: 0 })
    );
    assert_eq!(
        target.install(
            d.op - 1,
            &[Artifact {
                frontier: d.op,
                ..artifacts[0].clone()
            }]
        ),
        Err(InstallError::Decode { index: 0 })
    );
    let client_table_only = Artifact {
        kind: ArtifactKind::CLIENT_TABLE,
        ..artifacts[0].clone()
    };
    assert_eq!(
        target.install(d.op, &[client_table_only]),
        Err(InstallError::Missing)
    );
    assert_eq!(target.snapshot(), original);
}

#[test]
fn snapshots_with_broken_rules_are_refused() {
    use state::{SnapshotError, State};
    let mut d = Driver::new();
    d.submit(&create_stream("a")).unwrap();
    d.submit(&create_stream("b")).unwrap();
    d.submit(&create_topic(Identifier::Numeric(0), "t", 2))
        .unwrap();
    let good = d.sm.state().clone();
    let reseal = |state: &State, edit: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = state.encode();
        bytes.truncate(bytes.len() - 8);
        edit(&mut bytes);
        let trailer = xxhash_rust::xxh3::xxh3_64(&bytes);
        bytes.extend_from_slice(&trailer.to_le_bytes());
        State::decode(&bytes)
    };
    assert_eq!(reseal(&good, &|_| {}).unwrap(), good);
    assert_eq!(reseal(&good, &|b| b[0] = b'X'), Err(SnapshotError::Magic));
    assert!(matches!(
        reseal(&good, &|b| b.push(0)),
        Err(SnapshotError::Body(_))
    ));
    let mut renamed = good.clone();
    renamed.streams.get_mut(&1).unwrap().name = name("a");
    assert!(matches!(
        reseal(&renamed, &|_| {}),
        Err(SnapshotError::Content(_))
    ));
    let mut behind = good.clone();
    behind.next_consensus_group_id = 1;
    assert!(matches!(
        reseal(&behind, &|_| {}),
        Err(SnapshotError::Content(_))
    ));
    assert_eq!(State::decode(&[1, 2, 3]), Err(SnapshotError::Short));
    // A peer's snapshot cannot make a login allocate without bound.
    let mut greedy = good.clone();
    greedy.users.get_mut(&0).unwrap().password.params.memory_kib = u32::MAX;
    assert!(matches!(
        reseal(&greedy, &|_| {}),
        Err(SnapshotError::Content(_))
    ));
}

#[test]
fn the_reader_sees_committed_versions_whole() {
    let mut d = Driver::new();
    let reader = d.sm.reader();
    let before = reader.view();
    d.submit(&create_stream("s")).unwrap();
    // A guard taken before keeps its version; a new load sees the commit.
    assert!(before.state.streams.is_empty());
    assert_eq!(reader.view().state.streams.len(), 1);
    assert_eq!(reader.view().op, 1);
    // Readers on other threads load without a lock.
    let other = reader.clone();
    let seen = std::thread::spawn(move || other.view().state.streams.len())
        .join()
        .unwrap();
    assert_eq!(seen, 1);

    // Authentication against committed users: the root from the genesis.
    let view = reader.view();
    assert_eq!(view.authenticate("iggy", "iggy"), Some(ROOT_USER_ID));
    assert_eq!(view.authenticate("iggy", "wrong"), None);
    assert_eq!(view.authenticate("nobody", "iggy"), None);

    // Partition routing from the view.
    d.submit(&create_topic(Identifier::Numeric(0), "t", 3))
        .unwrap();
    let view = reader.view();
    let t = view
        .topic(&Identifier::Numeric(0), &Identifier::Named(name("t")))
        .unwrap();
    use crate::client::codec::Partitioning;
    assert_eq!(t.partition_for(&Partitioning::Partition(2), 0), Ok(2));
    assert_eq!(
        t.partition_for(&Partitioning::Partition(3), 0),
        Err(status::PARTITION_NOT_FOUND)
    );
    assert_eq!(t.partition_for(&Partitioning::Balanced, 7), Ok(1));
    let key = Partitioning::Key(b"user-42".to_vec());
    assert_eq!(
        t.partition_for(&key, 0),
        Ok(xxhash_rust::xxh32::xxh32(b"user-42", 0) % 3)
    );
    assert_eq!(
        t.group(1).unwrap(),
        wire::GroupId::partition(wire::PartitionKey {
            stream: 0,
            topic: 0,
            partition: 1
        })
        .unwrap()
    );
    assert_eq!(t.group(3), Err(status::PARTITION_NOT_FOUND));
    let stats = crate::client::answers::stats(&view);
    assert_eq!(
        (
            stats.streams_count,
            stats.topics_count,
            stats.partitions_count
        ),
        (1, 1, 3)
    );
    assert_eq!(t.shard(1, 16, 1), Ok(0));
    assert!(t.shard(1, 16, 4).unwrap() < 4);
    assert_eq!(
        view.topic(&Identifier::Numeric(0), &Identifier::Numeric(5))
            .err(),
        Some(status::TOPIC_ID_NOT_FOUND)
    );

    // Sessions come from the core's client table, published beside the view.
    let mut sessions = view::Sessions::default();
    sessions.by_client.insert(
        9,
        view::Session {
            session: 4,
            user_id: 0,
        },
    );
    d.sm.handle().publish_sessions(sessions);
    assert_eq!(reader.sessions().user(9, 4), Some(0));
    assert_eq!(reader.sessions().user(9, 3), None);
    assert_eq!(reader.sessions().user(8, 4), None);
}

#[test]
fn root_credentials_resolve_from_env_then_config_then_default() {
    let none = |_: &str| None;
    let root = RootCredentials::resolve(None, None, ("k.user", "k.pass"), none).unwrap();
    assert_eq!(root.username, "iggy");
    let root = RootCredentials::resolve(Some("admin"), Some("s3cret"), ("k.user", "k.pass"), none)
        .unwrap();
    assert_eq!(root.username, "admin");
    assert!(!format!("{root:?}").contains("s3cret"));
    let env = |key: &str| match key {
        ENV_ROOT_USERNAME => Some("envuser".to_owned()),
        ENV_ROOT_PASSWORD => Some("envpass".to_owned()),
        _ => None,
    };
    let root =
        RootCredentials::resolve(Some("admin"), Some("s3cret"), ("k.user", "k.pass"), env).unwrap();
    assert_eq!(root.username, "envuser");
    let sm = MetadataStateMachine::new(&Genesis { root, ..genesis() }).unwrap();
    assert_eq!(
        sm.reader().view().authenticate("envuser", "envpass"),
        Some(0)
    );
    assert_eq!(sm.reader().view().authenticate("envuser", "s3cret"), None);

    let short = |key: &str| (key == ENV_ROOT_PASSWORD).then(|| "ab".to_owned());
    let error = RootCredentials::resolve(None, None, ("k.user", "k.pass"), short).unwrap_err();
    assert_eq!(
        error,
        RootError::Password {
            origin: ENV_ROOT_PASSWORD,
            len: 2
        }
    );
    assert!(!error.to_string().contains("ab\""));
    let error = RootCredentials::resolve(Some("x"), None, ("k.user", "k.pass"), none).unwrap_err();
    assert!(error.to_string().starts_with("k.user:"), "{error}");

    // Same cluster and credentials: the same genesis on every replica; another cluster: a
    // different salt.
    assert_eq!(machine().snapshot(), machine().snapshot());
    let other = MetadataStateMachine::new(&Genesis {
        cluster_id: 0xC2,
        ..genesis()
    })
    .unwrap();
    assert_ne!(other.snapshot(), machine().snapshot());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary prepare bodies of every operation: apply answers a result section and never
    /// panics; two instances given the same garbage stay identical.
    #[test]
    fn arbitrary_prepares_apply_deterministically(
        ops in proptest::collection::vec(
            (prop::sample::select(Operation::ALL.to_vec()), proptest::collection::vec(any::<u8>(), 0..80)),
            1..12,
        ),
    ) {
        let mut a = Driver::new();
        let mut b = Driver::new();
        a.submit(&create_stream("s")).unwrap();
        b.submit(&create_stream("s")).unwrap();
        for (op, body) in &ops {
            let ra = a.apply(*op, body);
            let rb = b.apply(*op, body);
            prop_assert!(read_result(&ra).is_ok());
            prop_assert_eq!(ra, rb);
        }
        prop_assert_eq!(a.sm.snapshot(), b.sm.snapshot());
    }

    #[test]
    fn arbitrary_snapshots_and_assignments_fail_typed(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = state::State::decode(&bytes);
        let _ = Assigned::decode(&bytes);
        let mut sm = machine();
        let before = sm.snapshot();
        let artifact = Artifact { kind: ArtifactKind::METADATA_SNAPSHOT, frontier: 0, bytes: bytes.clone() };
        if sm.install(1, &[artifact]).is_err() {
            prop_assert_eq!(sm.snapshot(), before);
        }
    }
}

#[test]
fn the_receiving_shard_routes_every_request() {
    use crate::client::codec::{Consumer, Partitioning, PollingStrategy};
    use crate::client::reply::{Refusal, decode_streams};
    use crate::client::request::{
        ClientVersion, Credentials, Login, OffsetTarget, PollMessages, SendMessages,
        StoreConsumerOffset,
    };
    use crate::client::route::{NodeQuery, Route, route};
    use wire::decode::EvictionReason;

    let mut d = Driver::new();
    d.submit(&create_stream("s")).unwrap();
    d.submit(&create_topic(Identifier::Numeric(0), "t", 2))
        .unwrap();
    let view = d.sm.reader().view();
    let encode = |r: &Request<'_>| {
        let mut out = Vec::new();
        r.encode(&mut out);
        out
    };
    let go = |r: &Request<'_>, user: Option<u32>| {
        let (op, code) = r.operation();
        route(op, code, &encode(r), user, &view, 5)
    };
    let ok = |body: Vec<u8>| Route::Reply(Refusal { status: 0, body });

    // Before login: Ping answers, any other read is 40, any write evicts NoSession.
    assert_eq!(go(&Request::Ping, None), ok(Vec::new()));
    assert_eq!(
        go(&Request::GetStreams, None),
        Route::Reply(Refusal {
            status: status::UNAUTHENTICATED,
            body: Vec::new()
        })
    );
    assert_eq!(
        go(&create_stream("x"), None),
        Route::Evict(EvictionReason::NoSession, None)
    );

    // Login: the version gate, wrong and right credentials; the password stays behind.
    let login = |version: u32, password: &str| {
        Request::Register(Login {
            version: ClientVersion {
                protocol_version: version,
                sdk_name: name("rust-sdk"),
                sdk_version: name("0.11.0-edge.4"),
            },
            credentials: Credentials::Password {
                username: name("iggy"),
                password: password.into(),
            },
            context: String::new(),
        })
    };
    assert_eq!(
        go(&login(0x2800, "iggy"), None),
        Route::Evict(EvictionReason::IncompatibleProtocol, Some((0x2C00, 0x2C00)))
    );
    assert_eq!(
        go(&login(0x2C00, "nope"), None),
        Route::Evict(EvictionReason::InvalidCredentials, None)
    );
    let Route::Register { user_id, body } = go(&login(0x2C00, "iggy"), None) else {
        panic!("login refused")
    };
    assert_eq!(user_id, ROOT_USER_ID);
    assert!(!body.ends_with(b"iggy\x00\x00\x00\x00"));

    let user = Some(ROOT_USER_ID);
    // Metadata writes go to the metadata group; reads answer from the view.
    assert_eq!(
        go(&create_stream("x"), user),
        Route::Metadata(Operation::CreateStream)
    );
    let Route::Reply(Refusal { status: 0, body }) = go(&Request::GetStreams, user) else {
        panic!()
    };
    assert_eq!(decode_streams(&body).unwrap().len(), 1);
    let Route::Reply(Refusal { status: 0, body }) = go(
        &Request::GetTopic {
            stream: Identifier::Numeric(0),
            topic: Identifier::Named(name("t")),
        },
        user,
    ) else {
        panic!()
    };
    assert_eq!(TopicDetails::decode(&body).unwrap().partitions.len(), 2);
    assert_eq!(
        go(&Request::GetStream(Identifier::Numeric(4)), user),
        ok(Vec::new())
    );
    assert_eq!(go(&Request::GetStats, user), Route::Node(NodeQuery::Stats));

    // Partition writes and reads resolve to the partition's group.
    let mut batch = vec![0u8; 256];
    batch[48] = 1;
    let send = |partitioning| {
        Request::SendMessages(SendMessages {
            stream: Identifier::Numeric(0),
            topic: Identifier::Numeric(0),
            partitioning,
            messages_count: 1,
            batch: &batch,
        })
    };
    let group = |partition| {
        wire::GroupId::partition(wire::PartitionKey {
            stream: 0,
            topic: 0,
            partition,
        })
        .unwrap()
    };
    assert_eq!(
        go(&send(Partitioning::Balanced), user),
        Route::Partition {
            group: group(1),
            partition: 1,
            operation: Operation::SendMessages
        }
    );
    assert_eq!(
        go(&send(Partitioning::Partition(2)), user),
        Route::Reply(Refusal {
            status: status::RESOURCE_NOT_FOUND,
            body: Vec::new()
        })
    );
    let target = |partition| OffsetTarget {
        consumer: Consumer {
            group: false,
            id: Identifier::Numeric(1),
        },
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        partition,
    };
    let poll = PollMessages {
        consumer: target(None).consumer,
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        partition: None,
        strategy: PollingStrategy::Next(0),
        count: 10,
        auto_commit: true,
    };
    assert_eq!(
        go(&Request::PollMessages(poll.clone()), user),
        Route::Poll {
            group: group(0),
            partition: 0,
            request: poll.clone()
        }
    );
    assert_eq!(
        go(
            &Request::PollMessages(PollMessages {
                topic: Identifier::Numeric(3),
                ..poll
            }),
            user
        ),
        Route::Reply(Refusal {
            status: status::TOPIC_ID_NOT_FOUND,
            body: Vec::new()
        })
    );
    assert_eq!(
        go(
            &Request::StoreConsumerOffset(StoreConsumerOffset {
                target: target(Some(1)),
                offset: 3,
                quorum: true
            }),
            user
        ),
        Route::Partition {
            group: group(1),
            partition: 1,
            operation: Operation::StoreConsumerOffset
        }
    );
    assert!(matches!(
        go(&Request::GetConsumerOffset(target(Some(1))), user),
        Route::ConsumerOffset { partition: 1, .. }
    ));
    // Unsupported and malformed: answered, never dropped.
    let (op, code) = (Operation::NonReplicated, 13);
    assert_eq!(
        route(op, code, &[], user, &view, 0),
        Route::Reply(Refusal {
            status: status::FEATURE_UNAVAILABLE,
            body: Vec::new()
        })
    );
    assert_eq!(
        route(Operation::DeleteSegments, 0, &[], user, &view, 0),
        Route::Reply(Refusal {
            status: status::FEATURE_UNAVAILABLE,
            body: Vec::new()
        })
    );
}

mod users;

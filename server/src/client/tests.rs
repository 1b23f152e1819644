//! Client-plane codec tests: the bytes captured from SDK 0.11.0-edge.4 (client-plane.md
//! Appendix A) in both directions, the classification of every other command, round trips of
//! generated values, and arbitrary bytes that must decode to a value or a typed error.

use proptest::prelude::*;
use wire::Operation;
use wire::decode::EvictionReason;

use super::codec::*;
use super::reply::*;
use super::request::*;
use super::status;

fn hex(text: &str) -> Vec<u8> {
    let digits: String = text.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

fn ascii(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Decodes `body` and checks that encoding the result gives the same bytes back.
fn decode_both_ways(operation: Operation, code: u32, body: &[u8]) -> Request<'_> {
    let request = Request::decode(operation, code, body).expect("decodes");
    assert_eq!(request.operation(), (operation, code));
    let mut again = Vec::new();
    request.encode(&mut again);
    assert_eq!(again, body, "re-encoding changes the bytes");
    request
}

#[test]
fn appendix_register_body() {
    let body = hex(&format!(
        "002c0000 08{} 0d{} 04{} 04{} 00000000",
        ascii("rust-sdk"),
        ascii("0.11.0-edge.4"),
        ascii("iggy"),
        ascii("iggy")
    ));
    assert_eq!(body.len(), 41);
    let Request::Register(login) = decode_both_ways(Operation::Register, 0, &body) else {
        panic!("not a register")
    };
    assert_eq!(login.version.protocol_version, PROTOCOL_VERSION);
    assert_eq!(login.version.sdk_name.as_str(), "rust-sdk");
    assert_eq!(login.version.sdk_version.as_str(), "0.11.0-edge.4");
    assert_eq!(
        login.credentials,
        Credentials::Password {
            username: Name::new("iggy").unwrap(),
            password: "iggy".into()
        }
    );
    assert_eq!(login.context, "");
    // The password never reaches a log through Debug.
    let secret = Credentials::Password {
        username: Name::new("iggy").unwrap(),
        password: "hunter22".into(),
    };
    assert!(!format!("{secret:?}").contains("hunter22"));
    assert!(format!("{login:?}").contains("<redacted>"));

    // What reaches the journal: no password.
    let login = Login {
        credentials: secret,
        ..login
    };
    let prepared = register_prepare_body(&login);
    assert!(!prepared.windows(8).any(|w| w == b"hunter22"));
    assert_eq!(prepared, body[..body.len() - 9]);
}

#[test]
fn appendix_create_stream_and_topic_bodies() {
    let Request::CreateStream { name, options } =
        decode_both_ways(Operation::CreateStream, 0, &hex("027331"))
    else {
        panic!()
    };
    assert_eq!((name.as_str(), options.is_empty()), ("s1", true));

    let body = hex(&format!(
        "01 04 00000000 01000000 02 7431 \
         02 0d000000 {} 03 01000000 01 \
         02 0e000000 {} 0c 08000000 ffffffffffffffff \
         02 0e000000 {} 0c 08000000 ffffffffffffffff",
        ascii("enforce_fsync"),
        ascii("max_topic_size"),
        ascii("message_expiry")
    ));
    let Request::CreateTopic(t) = decode_both_ways(Operation::CreateTopic, 0, &body) else {
        panic!()
    };
    assert_eq!(t.stream, Identifier::Numeric(0));
    assert_eq!(t.partitions_count, 1);
    assert_eq!(t.name.as_str(), "t1");
    assert_eq!(t.options.0.len(), 3);
    assert_eq!(
        t.options.0["enforce_fsync"],
        OptionValue {
            kind: kind::BOOL,
            bytes: vec![1]
        }
    );
    assert_eq!(t.options.0["max_topic_size"].bytes, vec![0xff; 8]);
}

fn appendix_send_body() -> Vec<u8> {
    hex(&format!(
        "16000000 0104 00000000 0104 00000000 0204 00000000 01000000 \
         0000000000000000 0000000000000000 0000000000000000 e2d58acd70610600 \
         3201000000000000 efc742913f40f04b 01000000 {} \
         dc8e00ca420b92a9 01000000000000000000000000000000 00000000 00000000 \
         00000000 02000000 0000000000000000 6869",
        "00".repeat(204)
    ))
}

#[test]
fn appendix_send_messages_body() {
    let body = appendix_send_body();
    assert_eq!(body.len(), 332);
    let Request::SendMessages(s) = decode_both_ways(Operation::SendMessages, 0, &body) else {
        panic!()
    };
    assert_eq!(s.stream, Identifier::Numeric(0));
    assert_eq!(s.topic, Identifier::Numeric(0));
    assert_eq!(s.partitioning, Partitioning::Partition(0));
    assert_eq!(s.messages_count, 1);
    assert_eq!(s.batch.len(), 306);
    assert_eq!(s.batch, &body[26..]);
    // The frame checksum is XXH3-64 of the frame from byte 8 (a check of the layout read).
    let frame = &s.batch[256..];
    assert_eq!(
        xxhash_rust::xxh3::xxh3_64(&frame[8..]).to_le_bytes(),
        frame[..8]
    );

    // The envelope must agree with itself and with the batch.
    let mut wrong_length = body.clone();
    wrong_length[0] = 21;
    assert!(matches!(
        Request::decode(Operation::SendMessages, 0, &wrong_length),
        Err(RequestError::Body {
            error: BodyError::MetadataLength {
                declared: 21,
                actual: 22
            },
            ..
        })
    ));
    let mut wrong_count = body.clone();
    wrong_count[22] = 2;
    assert!(matches!(
        Request::decode(Operation::SendMessages, 0, &wrong_count),
        Err(RequestError::Body {
            error: BodyError::MessagesCount {
                envelope: 2,
                batch: 1
            },
            ..
        })
    ));
    assert!(matches!(
        Request::decode(Operation::SendMessages, 0, &body[..26 + 255]),
        Err(RequestError::Body {
            error: BodyError::Truncated {
                field: "batch header"
            },
            ..
        })
    ));
}

#[test]
fn appendix_poll_and_offset_bodies() {
    let poll = hex(
        "01 0104 01000000 0104 00000000 0104 00000000 01 00000000 01 0000000000000000 01000000 00",
    );
    let Request::PollMessages(p) = decode_both_ways(Operation::NonReplicated, 100, &poll) else {
        panic!()
    };
    assert_eq!(
        p,
        PollMessages {
            consumer: Consumer {
                group: false,
                id: Identifier::Numeric(1)
            },
            stream: Identifier::Numeric(0),
            topic: Identifier::Numeric(0),
            partition: Some(0),
            strategy: PollingStrategy::Offset(0),
            count: 1,
            auto_commit: false,
        }
    );
    let store = hex("01 0104 01000000 0104 00000000 0104 00000000 01 00000000 0000000000000000 01");
    let Request::StoreConsumerOffset(s) =
        decode_both_ways(Operation::StoreConsumerOffset, 0, &store)
    else {
        panic!()
    };
    assert_eq!((s.offset, s.quorum, s.target.partition), (0, true, Some(0)));
    let get = &store[..store.len() - 9];
    let Request::GetConsumerOffset(target) = decode_both_ways(Operation::NonReplicated, 120, get)
    else {
        panic!()
    };
    assert_eq!(target, s.target);
}

#[test]
fn every_other_command_is_answered() {
    let answer =
        |operation, code, body: &[u8]| Request::decode(operation, code, body).unwrap_err().answer();
    // Known non-replicated codes not served, and replicated codes carried as NonReplicated.
    for code in code::KNOWN_UNSERVED
        .into_iter()
        .chain([101, 121, 202, 302, 602, 40])
    {
        assert_eq!(
            answer(Operation::NonReplicated, code, &[]),
            Answer::Status(status::FEATURE_UNAVAILABLE),
            "code {code}"
        );
    }
    assert_eq!(
        answer(Operation::NonReplicated, 9999, &[]),
        Answer::Status(status::INVALID_COMMAND)
    );
    for code in [38, 44] {
        assert_eq!(
            answer(Operation::NonReplicated, code, &[]),
            Answer::Evict(EvictionReason::MalformedLogin)
        );
    }
    // Every replicated operation outside the supported set: status 5, whatever the body.
    let supported = [
        Operation::Register,
        Operation::Logout,
        Operation::NonReplicated,
        Operation::CreateStream,
        Operation::DeleteStream,
        Operation::CreateTopic,
        Operation::SendMessages,
        Operation::StoreConsumerOffset,
        Operation::DeleteConsumerOffset,
        Operation::CreateConsumerGroup,
        Operation::DeleteConsumerGroup,
        Operation::JoinConsumerGroup,
        Operation::LeaveConsumerGroup,
        Operation::CreateUser,
        Operation::UpdateUser,
        Operation::DeleteUser,
        Operation::ChangePassword,
        Operation::UpdatePermissions,
        Operation::CreatePersonalAccessToken,
        Operation::DeletePersonalAccessToken,
    ];
    for op in Operation::ALL {
        if supported.contains(&op) || crate::client::lifecycle::Lifecycle::serves(op) {
            continue;
        }
        let expected = if op == Operation::Reserved || op.is_internal() {
            Answer::Evict(EvictionReason::InvalidRequestOperation)
        } else {
            Answer::Status(status::FEATURE_UNAVAILABLE)
        };
        assert_eq!(answer(op, 0, b"anything"), expected, "{op:?}");
    }
    // Malformed bodies: a bad login evicts, a bad identifier is 6, anything else 3.
    assert_eq!(
        answer(Operation::Register, 0, &[0, 0x2c]),
        Answer::Evict(EvictionReason::MalformedLogin)
    );
    assert_eq!(
        answer(Operation::NonReplicated, 200, &[1, 3, 0, 0, 0]),
        Answer::Status(status::INVALID_IDENTIFIER)
    );
    assert_eq!(
        answer(Operation::NonReplicated, 200, &[1, 4, 0, 0, 0, 0, 9]),
        Answer::Status(status::INVALID_COMMAND)
    );
    assert_eq!(
        answer(Operation::CreateStream, 0, &[0]),
        Answer::Status(status::INVALID_COMMAND)
    );
}

#[test]
fn the_protocol_version_gate_takes_any_0_11_x() {
    assert_eq!(check_protocol_version(0x2C00), Ok(()));
    assert_eq!(check_protocol_version(0x2C00 + 7), Ok(()));
    assert_eq!(check_protocol_version(0x2C00 + 1023), Ok(()));
    for refused in [0, 0x2BFF, 0x2C00 + 1024, 1 << 20] {
        assert_eq!(check_protocol_version(refused), Err((0x2C00, 0x2C00)));
    }
}

#[test]
fn token_login_is_the_fallback_shape() {
    let mut body = hex("002c0000 01 61 01 62");
    body.extend_from_slice(&hex(&format!("05{} 00000000", ascii("tok3n"))));
    let Request::Register(login) = decode_both_ways(Operation::Register, 0, &body) else {
        panic!()
    };
    assert_eq!(login.credentials, Credentials::Token("tok3n".into()));
    assert!(!format!("{login:?}").contains("tok3n"));
}

#[test]
fn options_are_checked() {
    let entry = |kind: u8, bytes: &[u8]| {
        let mut e = vec![kind];
        e.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        e.extend_from_slice(bytes);
        e
    };
    let key = entry(kind::STRING, b"k");
    assert_eq!(Options::decode(&key), Err(BodyError::OptionWithoutValue));
    let pair = [key.clone(), entry(kind::U64, &[0; 8])].concat();
    assert!(Options::decode(&pair).is_ok());
    assert_eq!(
        Options::decode(&[pair.clone(), pair.clone()].concat()),
        Err(BodyError::OptionDuplicateKey)
    );
    assert_eq!(
        Options::decode(&[key.clone(), entry(kind::U64, &[0; 4])].concat()),
        Err(BodyError::OptionWidth { kind: 12, len: 4 })
    );
    assert_eq!(
        Options::decode(&[entry(kind::U32, &[0; 4]), entry(kind::U64, &[0; 8])].concat()),
        Err(BodyError::OptionKeyKind(11))
    );
    assert_eq!(
        Options::decode(&[key.clone(), entry(0, &[1])].concat()),
        Err(BodyError::OptionKind(0))
    );
    assert_eq!(
        Options::decode(&[key, entry(kind::RAW, &[])].concat()),
        Err(BodyError::Length {
            field: "option value",
            len: 0
        })
    );
    let too_many: Vec<u8> = (0..=OPTIONS_PAIRS_MAX)
        .flat_map(|i| {
            [
                entry(kind::STRING, format!("{i:05}").as_bytes()),
                entry(kind::BOOL, &[1]),
            ]
            .concat()
        })
        .collect();
    assert_eq!(Options::decode(&too_many), Err(BodyError::OptionsTooMany));
    assert_eq!(
        Options::decode(&vec![0; OPTIONS_BYTES_MAX + 1]),
        Err(BodyError::OptionsTooLarge(OPTIONS_BYTES_MAX + 1))
    );
}

#[test]
fn refusals_take_the_channel_of_their_operation() {
    assert_eq!(
        refusal(Operation::CreateStream, 1012),
        Refusal {
            status: 0,
            body: vec![1, 0, 0, 0, 0, 0, 0, 0, 0xf4, 3, 0, 0]
        }
    );
    assert_eq!(refusal(Operation::StoreConsumerOffset, 4100).status, 0);
    for op in [
        Operation::SendMessages,
        Operation::NonReplicated,
        Operation::Logout,
    ] {
        assert_eq!(
            refusal(op, 20),
            Refusal {
                status: 20,
                body: Vec::new()
            }
        );
    }
    assert_eq!(
        read_result(&refusal(Operation::CreateTopic, 2013).body),
        Ok(Err(2013))
    );
    assert_eq!(read_result(&RESULT_OK), Ok(Ok(&[][..])));
    assert!(read_result(&[]).is_err());
    assert!(read_result(&[2, 0, 0, 0]).is_err());
}

// ---- generated values -------------------------------------------------------------------

fn name() -> impl Strategy<Value = Name> {
    "[a-z0-9._-]{1,24}".prop_map(|s| Name::new(&s).unwrap())
}

fn identifier() -> impl Strategy<Value = Identifier> {
    prop_oneof![
        any::<u32>().prop_map(Identifier::Numeric),
        name().prop_map(Identifier::Named)
    ]
}

fn consumer() -> impl Strategy<Value = Consumer> {
    (any::<bool>(), identifier()).prop_map(|(group, id)| Consumer { group, id })
}

fn partitioning() -> impl Strategy<Value = Partitioning> {
    prop_oneof![
        Just(Partitioning::Balanced),
        any::<u32>().prop_map(Partitioning::Partition),
        proptest::collection::vec(any::<u8>(), 1..=255).prop_map(Partitioning::Key),
    ]
}

fn strategy() -> impl Strategy<Value = PollingStrategy> {
    (1u8..=5, any::<u64>()).prop_map(|(k, v)| match k {
        1 => PollingStrategy::Offset(v),
        2 => PollingStrategy::Timestamp(v),
        3 => PollingStrategy::First(v),
        4 => PollingStrategy::Last(v),
        _ => PollingStrategy::Next(v),
    })
}

fn option_value() -> impl Strategy<Value = OptionValue> {
    prop_oneof![
        "[a-z ]{1,12}".prop_map(|s| OptionValue {
            kind: kind::STRING,
            bytes: s.into_bytes()
        }),
        any::<u64>().prop_map(|v| OptionValue {
            kind: kind::U64,
            bytes: v.to_le_bytes().to_vec()
        }),
        any::<bool>().prop_map(|v| OptionValue {
            kind: kind::BOOL,
            bytes: vec![u8::from(v)]
        }),
        proptest::collection::vec(any::<u8>(), 1..40).prop_map(|bytes| OptionValue {
            kind: kind::RAW,
            bytes
        }),
    ]
}

fn options() -> impl Strategy<Value = Options> {
    proptest::collection::btree_map("[a-z_]{1,20}", option_value(), 0..5).prop_map(Options)
}

fn target() -> impl Strategy<Value = OffsetTarget> {
    (
        consumer(),
        identifier(),
        identifier(),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(|(consumer, stream, topic, partition)| OffsetTarget {
            consumer,
            stream,
            topic,
            partition,
        })
}

fn group_target() -> impl Strategy<Value = crate::client::groups::GroupTarget> {
    (identifier(), identifier(), identifier()).prop_map(|(stream, topic, group)| {
        crate::client::groups::GroupTarget {
            stream,
            topic,
            group,
        }
    })
}

/// The consumer-group, GetTopics and DeleteConsumerOffset bodies as the SDK's
/// `iggy_binary_protocol` 0.11.0-edge.4 writes them (its request encoders, read field by
/// field): identifiers `kind, len, value`, a name `len, bytes`, DeleteConsumerOffset's
/// optional partition (5 bytes) and ack byte.
#[test]
fn group_requests_decode_from_the_sdk_layouts() {
    use crate::client::groups::{DeleteConsumerOffset, GroupTarget};
    let named = |text: &str| Identifier::Named(Name::new(text).unwrap());
    // stream numeric 1, topic named "t", group numeric 7.
    let ids = [
        &[1u8, 4, 1, 0, 0, 0][..],
        &[2, 1, b't'],
        &[1, 4, 7, 0, 0, 0],
    ]
    .concat();
    let target = GroupTarget {
        stream: Identifier::Numeric(1),
        topic: named("t"),
        group: Identifier::Numeric(7),
    };
    let cases: Vec<(Operation, u32, Vec<u8>, Request<'static>)> = vec![
        (
            Operation::CreateConsumerGroup,
            0,
            [&ids[..9], &[2, b'g', b'1'][..]].concat(),
            Request::CreateConsumerGroup {
                stream: Identifier::Numeric(1),
                topic: named("t"),
                name: Name::new("g1").unwrap(),
            },
        ),
        (
            Operation::DeleteConsumerGroup,
            0,
            ids.clone(),
            Request::DeleteConsumerGroup(target.clone()),
        ),
        (
            Operation::JoinConsumerGroup,
            0,
            ids.clone(),
            Request::JoinConsumerGroup(target.clone()),
        ),
        (
            Operation::LeaveConsumerGroup,
            0,
            ids.clone(),
            Request::LeaveConsumerGroup(target.clone()),
        ),
        (
            Operation::NonReplicated,
            600,
            ids.clone(),
            Request::GetConsumerGroup(target.clone()),
        ),
        (
            Operation::NonReplicated,
            606,
            ids.clone(),
            Request::SyncConsumerGroup(target.clone()),
        ),
        (
            Operation::NonReplicated,
            601,
            ids[..9].to_vec(),
            Request::GetConsumerGroups {
                stream: Identifier::Numeric(1),
                topic: named("t"),
            },
        ),
        (
            Operation::NonReplicated,
            301,
            ids[..6].to_vec(),
            Request::GetTopics(Identifier::Numeric(1)),
        ),
        (
            Operation::DeleteConsumerOffset,
            0,
            [&[2u8][..], &ids[..], &[1, 3, 0, 0, 0, 1][..]].concat(),
            Request::DeleteConsumerOffset(DeleteConsumerOffset {
                target: OffsetTarget {
                    consumer: Consumer {
                        group: true,
                        id: Identifier::Numeric(1),
                    },
                    stream: named("t"),
                    topic: Identifier::Numeric(7),
                    partition: Some(3),
                },
                quorum: true,
            }),
        ),
    ];
    for (operation, code, body, want) in cases {
        let got = Request::decode(operation, code, &body).unwrap();
        assert_eq!(got, want, "{operation:?} {code}");
        assert_eq!(got.operation(), (operation, code));
        let mut again = Vec::new();
        got.encode(&mut again);
        assert_eq!(
            again, body,
            "{operation:?} {code} re-encodes to the SDK's bytes"
        );
        // Truncated anywhere: a typed error, never a panic.
        for cut in 0..body.len() {
            assert!(Request::decode(operation, code, &body[..cut]).is_err());
        }
    }
}

/// Owned parts of a request; SendMessages borrows its batch from the generated bytes.
#[derive(Debug, Clone)]
enum Generated {
    Plain(Request<'static>),
    Send {
        stream: Identifier,
        topic: Identifier,
        partitioning: Partitioning,
        messages_count: u32,
        batch: Vec<u8>,
    },
}

fn request() -> impl Strategy<Value = Generated> {
    let plain = prop_oneof![
        Just(Request::Ping),
        Just(Request::GetStats),
        Just(Request::GetClusterMetadata),
        Just(Request::Logout),
        Just(Request::GetStreams),
        (
            any::<u32>(),
            name(),
            name(),
            name(),
            "[ -~]{0,100}",
            "[a-z]{0,10}"
        )
            .prop_map(
                |(protocol_version, sdk_name, sdk_version, username, password, context)| {
                    Request::Register(Login {
                        version: ClientVersion {
                            protocol_version,
                            sdk_name,
                            sdk_version,
                        },
                        credentials: Credentials::Password { username, password },
                        context,
                    })
                }
            ),
        (name(), options()).prop_map(|(name, options)| Request::CreateStream { name, options }),
        identifier().prop_map(Request::GetStream),
        identifier().prop_map(Request::DeleteStream),
        (identifier(), any::<u32>(), name(), options()).prop_map(
            |(stream, partitions_count, name, options)| Request::CreateTopic(CreateTopic {
                stream,
                partitions_count,
                name,
                options
            })
        ),
        (identifier(), identifier())
            .prop_map(|(stream, topic)| Request::GetTopic { stream, topic }),
        (target(), strategy(), any::<u32>(), any::<bool>()).prop_map(
            |(t, strategy, count, auto_commit)| Request::PollMessages(PollMessages {
                consumer: t.consumer,
                stream: t.stream,
                topic: t.topic,
                partition: t.partition,
                strategy,
                count,
                auto_commit,
            })
        ),
        (target(), any::<u64>(), any::<bool>()).prop_map(|(target, offset, quorum)| {
            Request::StoreConsumerOffset(StoreConsumerOffset {
                target,
                offset,
                quorum,
            })
        }),
        target().prop_map(Request::GetConsumerOffset),
        (target(), any::<bool>()).prop_map(|(target, quorum)| {
            Request::DeleteConsumerOffset(crate::client::groups::DeleteConsumerOffset {
                target,
                quorum,
            })
        }),
        identifier().prop_map(Request::GetTopics),
        (identifier(), identifier(), name()).prop_map(|(stream, topic, name)| {
            Request::CreateConsumerGroup {
                stream,
                topic,
                name,
            }
        }),
        group_target().prop_map(Request::DeleteConsumerGroup),
        group_target().prop_map(Request::JoinConsumerGroup),
        group_target().prop_map(Request::LeaveConsumerGroup),
        group_target().prop_map(Request::GetConsumerGroup),
        group_target().prop_map(Request::SyncConsumerGroup),
        (identifier(), identifier())
            .prop_map(|(stream, topic)| Request::GetConsumerGroups { stream, topic }),
    ]
    .prop_map(Generated::Plain);
    let send = (
        identifier(),
        identifier(),
        partitioning(),
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 256..400),
    )
        .prop_map(|(stream, topic, partitioning, messages_count, mut batch)| {
            batch[48..52].copy_from_slice(&messages_count.to_le_bytes());
            Generated::Send {
                stream,
                topic,
                partitioning,
                messages_count,
                batch,
            }
        });
    prop_oneof![4 => plain, 1 => send]
}

fn stats() -> impl Strategy<Value = Stats> {
    (
        any::<u32>(),
        -1e6f32..1e6,
        proptest::collection::vec(any::<u64>(), 12),
        proptest::collection::vec(any::<u32>(), 8),
        proptest::collection::vec("[ -~]{0,16}", 5),
        proptest::collection::vec(
            (
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                0f32..1.0,
            ),
            0..4,
        ),
    )
        .prop_map(|(pid, cpu, u64s, u32s, texts, cache)| Stats {
            process_id: pid,
            cpu_usage: cpu,
            total_cpu_usage: cpu / 2.0,
            memory_usage: u64s[0],
            total_memory: u64s[1],
            available_memory: u64s[2],
            run_time: u64s[3],
            start_time: u64s[4],
            read_bytes: u64s[5],
            written_bytes: u64s[6],
            messages_size_bytes: u64s[7],
            streams_count: u32s[0],
            topics_count: u32s[1],
            partitions_count: u32s[2],
            segments_count: u32s[3],
            messages_count: u64s[8],
            clients_count: u32s[4],
            consumer_groups_count: u32s[5],
            hostname: texts[0].clone(),
            os_name: texts[1].clone(),
            os_version: texts[2].clone(),
            kernel_version: texts[3].clone(),
            server_version: texts[4].clone(),
            server_semver: u32s[6],
            cache_metrics: cache
                .into_iter()
                .map(
                    |(stream, topic, partition, hits, misses, hit_ratio)| CacheMetric {
                        stream,
                        topic,
                        partition,
                        hits,
                        misses,
                        hit_ratio,
                    },
                )
                .collect(),
            threads_count: u32s[7],
            free_disk_space: u64s[9],
            total_disk_space: u64s[10],
        })
}

fn topic_record() -> impl Strategy<Value = TopicRecord> {
    (
        any::<(u32, u64, u64, u64, u64, u64)>(),
        1u8..=2,
        name(),
        options(),
        options(),
        0u32..4,
    )
        .prop_map(
            |((id, created_at, expiry, max, size, count), c, name, explicit, derived, n)| {
                TopicRecord {
                    id,
                    created_at,
                    partitions_count: n,
                    message_expiry: expiry,
                    compression_algorithm: c,
                    max_topic_size: max,
                    size_bytes: size,
                    messages_count: count,
                    name,
                    explicit,
                    derived,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn requests_round_trip(generated in request()) {
        let mut body = Vec::new();
        match &generated {
            Generated::Plain(request) => {
                request.encode(&mut body);
                let (operation, code) = request.operation();
                prop_assert_eq!(&Request::decode(operation, code, &body).unwrap(), request);
            }
            Generated::Send { stream, topic, partitioning, messages_count, batch } => {
                let request = Request::SendMessages(SendMessages {
                    stream: stream.clone(),
                    topic: topic.clone(),
                    partitioning: partitioning.clone(),
                    messages_count: *messages_count,
                    batch,
                });
                request.encode(&mut body);
                prop_assert_eq!(Request::decode(Operation::SendMessages, 0, &body).unwrap(), request);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_decode_or_fail_typed(
        op in prop::sample::select(Operation::ALL.to_vec()),
        code in prop_oneof![
            prop::sample::select(vec![1u32, 10, 12, 38, 44, 100, 120, 200, 201, 300, 301, 606]),
            any::<u32>()
        ],
        body in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        // Either outcome is fine; a panic fails the test. The answer is always defined.
        if let Err(error) = Request::decode(op, code, &body) {
            let _ = error.answer();
        }
        let _ = decode_login(&body);
        let _ = Options::decode(&body);
        let _ = read_result(&body);
        let _ = LoginReply::decode(&body);
        let _ = StreamDetails::decode(&body);
        let _ = TopicDetails::decode(&body);
        let _ = decode_streams(&body);
        let _ = ClusterMetadata::decode(&body);
        let _ = Stats::decode(&body);
        let _ = decode_send_reply(&body);
        let _ = PollHead::decode(&body);
        let _ = ConsumerOffsetReply::decode(&body);
    }

    #[test]
    fn replies_round_trip(
        topic in topic_record(),
        partitions in proptest::collection::vec(any::<(u32, u64, u32, u64, u64, u64)>(), 4),
        stream_name in name(),
        stats in stats(),
        nodes in proptest::collection::vec(("[a-z0-9-]{0,10}", "[0-9.]{0,15}", any::<[u16; 4]>(), 0u8..=1, 0u8..=5), 0..5),
        confirmations in proptest::collection::vec(any::<(u32, u32, u32, u64)>(), 0..3),
        session in 1u64..,
    ) {
        let details = TopicDetails {
            partitions: partitions[..topic.partitions_count as usize]
                .iter()
                .map(|&(id, created_at, segments_count, current_offset, size_bytes, messages_count)| PartitionRecord {
                    id, created_at, segments_count, current_offset, size_bytes, messages_count,
                })
                .collect(),
            topic: topic.clone(),
        };
        let mut out = Vec::new();
        details.encode(&mut out);
        prop_assert_eq!(TopicDetails::decode(&out).unwrap(), details);

        let stream = StreamDetails {
            stream: StreamRecord {
                id: 3, created_at: 9, topics_count: 1, size_bytes: 0, messages_count: 0,
                name: stream_name, options: Options::default(),
            },
            topics: vec![topic],
        };
        let mut out = Vec::new();
        stream.encode(&mut out);
        prop_assert_eq!(StreamDetails::decode(&out).unwrap(), stream.clone());
        let mut two = Vec::new();
        stream.stream.encode(&mut two);
        stream.stream.encode(&mut two);
        prop_assert_eq!(decode_streams(&two).unwrap(), vec![stream.stream.clone(), stream.stream]);

        let mut out = Vec::new();
        stats.encode(&mut out);
        prop_assert_eq!(Stats::decode(&out).unwrap(), stats);

        let metadata = ClusterMetadata {
            name: "iggy-cluster".into(),
            nodes: nodes.into_iter().map(|(name, ip, ports, role, status)| ClusterNode {
                name, ip, tcp: ports[0], quic: ports[1], http: ports[2], websocket: ports[3], role, status,
            }).collect(),
        };
        let mut out = Vec::new();
        metadata.encode(&mut out);
        prop_assert_eq!(ClusterMetadata::decode(&out).unwrap(), metadata);

        let confirmations: Vec<_> = confirmations.into_iter().map(|(stream, topic, partition, base_offset)| {
            SendConfirmation { stream, topic, partition, base_offset }
        }).collect();
        let mut out = Vec::new();
        encode_send_reply(&confirmations, &mut out);
        prop_assert_eq!(out.len(), 4 + 20 * confirmations.len());
        prop_assert_eq!(decode_send_reply(&out).unwrap(), confirmations);

        let login = LoginReply {
            user_id: 0, session, server_protocol_version: PROTOCOL_VERSION,
            server_version: Name::new("0.11.0").unwrap(),
        };
        let mut out = Vec::new();
        login.encode(&mut out);
        let payload = read_result(&out).unwrap().unwrap();
        prop_assert_eq!(LoginReply::decode(payload).unwrap(), login);
    }
}

#[test]
fn poll_and_offset_replies_have_their_sizes() {
    let mut out = Vec::new();
    PollHead {
        partition_id: 2,
        current_offset: 7,
        messages_count: 0,
    }
    .encode(&mut out);
    assert_eq!(out.len(), POLL_HEAD_SIZE);
    let (head, rest) = PollHead::decode(&out).unwrap();
    assert_eq!(
        (head.partition_id, head.current_offset, rest.len()),
        (2, 7, 0)
    );

    let mut out = Vec::new();
    ConsumerOffsetReply {
        partition_id: 1,
        current_offset: 9,
        stored_offset: 4,
    }
    .encode(&mut out);
    assert_eq!(out.len(), 20);
    assert_eq!(
        ConsumerOffsetReply::decode(&out)
            .unwrap()
            .unwrap()
            .stored_offset,
        4
    );
    assert_eq!(ConsumerOffsetReply::decode(&[]), Ok(None));
    // A role outside the table fails the decode, as it does in the SDK.
    let mut out = Vec::new();
    ClusterMetadata {
        name: "c".into(),
        nodes: vec![ClusterNode {
            name: "n".into(),
            ip: "127.0.0.1".into(),
            tcp: 8090,
            quic: 0,
            http: 3000,
            websocket: 0,
            role: 2,
            status: 0,
        }],
    }
    .encode(&mut out);
    assert!(ClusterMetadata::decode(&out).is_err());
}

//! A test per permission rule through the published Iggy Rust SDK (0.11.0-edge.4) against one
//! `strand dev --replicas 3` (issue 11 Done-when; decisions 302, 310 and 345). Root creates a
//! stream and topic (plus a decoy of each), a consumer group and one subject user. For every
//! case of the table root first gives the subject the case's permission *elsewhere* (nothing
//! for a global flag, the same flag on the decoy stream or decoy topic for a scoped one): the
//! command is refused with Unauthorized (41). Then root gives it exactly that one flag on the
//! target: the same command succeeds. Each failure names its case.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use iggy::prelude::*;
use strand_sdk_tests::{
    DevCluster, REPLICAS, STEP_BOUND, client_on, init_client_log, single_primary, step,
};

const GROUP: &str = "perm-group";

/// The one flag a case grants, and at which level.
#[derive(Clone, Copy)]
enum Grant {
    Global(fn(&mut GlobalPermissions)),
    Stream(fn(&mut StreamPermissions)),
    Topic(fn(&mut TopicPermissions)),
}

/// The command a case runs as the subject.
#[derive(Clone, Copy, Debug)]
enum Op {
    GetStats,
    GetClients,
    GetClient,
    CreateUser,
    GetUsers,
    GetUser,
    UpdateUser,
    UpdatePermissions,
    DeleteUser,
    CreateStream,
    GetStreams,
    GetStream,
    GetTopics,
    UpdateStream,
    PurgeStream,
    DeleteStream,
    CreateTopic,
    GetTopic,
    UpdateTopic,
    PurgeTopic,
    DeleteTopic,
    CreatePartitions,
    DeletePartitions,
    Send,
    Poll,
    StoreOffset,
    GetOffset,
    DeleteOffset,
    CreateGroup,
    GetGroups,
    GetGroup,
    JoinGroup,
    LeaveGroup,
    DeleteGroup,
}

struct Case {
    name: &'static str,
    grant: Grant,
    op: Op,
}

const fn case(name: &'static str, grant: Grant, op: Op) -> Case {
    Case { name, grant, op }
}

/// Every rule of decisions 302, 310 and 345 with the narrowest flag that allows it.
fn table() -> Vec<Case> {
    use Grant::{Global as G, Stream as S, Topic as T};
    use Op::*;
    vec![
        // Global flags.
        case(
            "global manage_servers: GetStats",
            G(|g| g.manage_servers = true),
            GetStats,
        ),
        case(
            "global read_servers: GetStats",
            G(|g| g.read_servers = true),
            GetStats,
        ),
        case(
            "global read_servers: GetClients",
            G(|g| g.read_servers = true),
            GetClients,
        ),
        case(
            "global read_servers: GetClient",
            G(|g| g.read_servers = true),
            GetClient,
        ),
        case(
            "global manage_users: CreateUser",
            G(|g| g.manage_users = true),
            CreateUser,
        ),
        case(
            "global manage_users: GetUsers",
            G(|g| g.manage_users = true),
            GetUsers,
        ),
        case(
            "global read_users: GetUsers",
            G(|g| g.read_users = true),
            GetUsers,
        ),
        case(
            "global read_users: GetUser (another)",
            G(|g| g.read_users = true),
            GetUser,
        ),
        case(
            "global manage_users: UpdateUser (another)",
            G(|g| g.manage_users = true),
            UpdateUser,
        ),
        case(
            "global manage_users: UpdatePermissions (another)",
            G(|g| g.manage_users = true),
            UpdatePermissions,
        ),
        case(
            "global manage_users: DeleteUser",
            G(|g| g.manage_users = true),
            DeleteUser,
        ),
        case(
            "global manage_streams: CreateStream",
            G(|g| g.manage_streams = true),
            CreateStream,
        ),
        case(
            "global read_streams: GetStreams",
            G(|g| g.read_streams = true),
            GetStreams,
        ),
        case(
            "global read_streams: GetStream",
            G(|g| g.read_streams = true),
            GetStream,
        ),
        case(
            "global manage_topics: CreateTopic",
            G(|g| g.manage_topics = true),
            CreateTopic,
        ),
        case(
            "global read_topics: GetTopic",
            G(|g| g.read_topics = true),
            GetTopic,
        ),
        case(
            "global poll_messages: PollMessages",
            G(|g| g.poll_messages = true),
            Poll,
        ),
        case(
            "global send_messages: SendMessages",
            G(|g| g.send_messages = true),
            Send,
        ),
        // Stream flags (decoy: the same flag on another stream).
        case(
            "stream manage_stream: DeleteStream",
            S(|s| s.manage_stream = true),
            DeleteStream,
        ),
        case(
            "stream read_stream: GetStream",
            S(|s| s.read_stream = true),
            GetStream,
        ),
        case(
            "stream read_stream: GetTopics",
            S(|s| s.read_stream = true),
            GetTopics,
        ),
        case(
            "stream manage_topics: CreateTopic",
            S(|s| s.manage_topics = true),
            CreateTopic,
        ),
        case(
            "stream read_topics: GetTopic",
            S(|s| s.read_topics = true),
            GetTopic,
        ),
        case(
            "stream poll_messages: PollMessages",
            S(|s| s.poll_messages = true),
            Poll,
        ),
        case(
            "stream send_messages: SendMessages",
            S(|s| s.send_messages = true),
            Send,
        ),
        // Topic flags (decoy: the same flag on another topic of the stream).
        case(
            "topic read_topic: GetTopic",
            T(|t| t.read_topic = true),
            GetTopic,
        ),
        case(
            "topic poll_messages: PollMessages",
            T(|t| t.poll_messages = true),
            Poll,
        ),
        case(
            "topic send_messages: SendMessages",
            T(|t| t.send_messages = true),
            Send,
        ),
        // Consumer offsets need poll (302, 310).
        case(
            "topic poll_messages: StoreConsumerOffset",
            T(|t| t.poll_messages = true),
            StoreOffset,
        ),
        case(
            "topic poll_messages: GetConsumerOffset",
            T(|t| t.poll_messages = true),
            GetOffset,
        ),
        case(
            "topic poll_messages: DeleteConsumerOffset",
            T(|t| t.poll_messages = true),
            DeleteOffset,
        ),
        // Consumer groups need read_topic (310).
        case(
            "topic read_topic: CreateConsumerGroup",
            T(|t| t.read_topic = true),
            CreateGroup,
        ),
        case(
            "topic read_topic: GetConsumerGroups",
            T(|t| t.read_topic = true),
            GetGroups,
        ),
        case(
            "topic read_topic: GetConsumerGroup",
            T(|t| t.read_topic = true),
            GetGroup,
        ),
        case(
            "topic read_topic: JoinConsumerGroup",
            T(|t| t.read_topic = true),
            JoinGroup,
        ),
        case(
            "topic read_topic: LeaveConsumerGroup",
            T(|t| t.read_topic = true),
            LeaveGroup,
        ),
        case(
            "topic read_topic: DeleteConsumerGroup",
            T(|t| t.read_topic = true),
            DeleteGroup,
        ),
        // Lifecycle commands (345): manage_topic, then manage_stream.
        case(
            "topic manage_topic: UpdateTopic",
            T(|t| t.manage_topic = true),
            UpdateTopic,
        ),
        case(
            "topic manage_topic: CreatePartitions",
            T(|t| t.manage_topic = true),
            CreatePartitions,
        ),
        case(
            "topic manage_topic: DeletePartitions",
            T(|t| t.manage_topic = true),
            DeletePartitions,
        ),
        case(
            "topic manage_topic: PurgeTopic",
            T(|t| t.manage_topic = true),
            PurgeTopic,
        ),
        case(
            "topic manage_topic: DeleteTopic",
            T(|t| t.manage_topic = true),
            DeleteTopic,
        ),
        case(
            "stream manage_stream: UpdateStream",
            S(|s| s.manage_stream = true),
            UpdateStream,
        ),
        case(
            "stream manage_stream: PurgeStream",
            S(|s| s.manage_stream = true),
            PurgeStream,
        ),
        // Implied flags (302): manage implies read, read implies poll, manage implies send;
        // a wider level covers the narrower commands.
        case(
            "global manage_servers: GetClients",
            G(|g| g.manage_servers = true),
            GetClients,
        ),
        case(
            "global manage_streams: GetStreams",
            G(|g| g.manage_streams = true),
            GetStreams,
        ),
        case(
            "global manage_streams: CreateTopic",
            G(|g| g.manage_streams = true),
            CreateTopic,
        ),
        case(
            "global read_streams: PollMessages",
            G(|g| g.read_streams = true),
            Poll,
        ),
        case(
            "global manage_streams: SendMessages",
            G(|g| g.manage_streams = true),
            Send,
        ),
        case(
            "global manage_topics: GetTopic",
            G(|g| g.manage_topics = true),
            GetTopic,
        ),
        case(
            "global manage_topics: UpdateTopic",
            G(|g| g.manage_topics = true),
            UpdateTopic,
        ),
        case(
            "global read_topics: GetConsumerGroups",
            G(|g| g.read_topics = true),
            GetGroups,
        ),
        case(
            "global poll_messages: GetConsumerOffset",
            G(|g| g.poll_messages = true),
            GetOffset,
        ),
        case(
            "stream manage_stream: GetStream",
            S(|s| s.manage_stream = true),
            GetStream,
        ),
        case(
            "stream manage_stream: SendMessages",
            S(|s| s.manage_stream = true),
            Send,
        ),
        case(
            "stream read_stream: PollMessages",
            S(|s| s.read_stream = true),
            Poll,
        ),
        case(
            "stream manage_topics: DeleteTopic",
            S(|s| s.manage_topics = true),
            DeleteTopic,
        ),
        case(
            "stream read_topics: JoinConsumerGroup",
            S(|s| s.read_topics = true),
            JoinGroup,
        ),
        case(
            "topic manage_topic: GetTopic",
            T(|t| t.manage_topic = true),
            GetTopic,
        ),
        case(
            "topic manage_topic: SendMessages",
            T(|t| t.manage_topic = true),
            Send,
        ),
        case(
            "topic read_topic: PollMessages",
            T(|t| t.read_topic = true),
            Poll,
        ),
    ]
}

/// What root set up once, and a counter for fresh names.
struct Fixture {
    root: IggyClient,
    stream: u32,
    topic: u32,
    decoy_stream: u32,
    decoy_topic: u32,
    other_user: u32,
    root_client: u32,
    serial: AtomicU32,
}

/// The resources one case's command acts on.
#[derive(Clone, Copy)]
struct Target {
    stream: u32,
    topic: u32,
    group: u32,
    user: u32,
}

fn id(n: u32) -> Identifier {
    Identifier::numeric(n).expect("a numeric identifier")
}

impl Fixture {
    fn fresh(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.serial.fetch_add(1, Ordering::Relaxed))
    }

    async fn create_topic(&self, stream: u32, name: &str) -> u32 {
        step(
            &format!("root creates topic {name}"),
            self.root.create_topic(
                &id(stream),
                name,
                &TopicCreateOptions {
                    partitions_count: Some(1),
                    ..TopicCreateOptions::default()
                },
            ),
        )
        .await
        .id
    }

    /// Root creates what the command destroys (a stream, a topic, a group); the rest act on
    /// the fixed stream and topic.
    async fn target(&self, op: Op) -> Target {
        let mut target = Target {
            stream: self.stream,
            topic: self.topic,
            group: 0,
            user: self.other_user,
        };
        match op {
            Op::DeleteStream => {
                let name = self.fresh("perm-doomed-stream");
                target.stream = step(
                    &format!("root creates stream {name}"),
                    self.root.create_stream(&name),
                )
                .await
                .id;
            }
            Op::DeleteTopic => {
                target.topic = self
                    .create_topic(self.stream, &self.fresh("perm-doomed-topic"))
                    .await;
            }
            Op::DeleteUser => {
                let name = self.fresh("perm-doomed-user");
                target.user = step(
                    &format!("root creates user {name}"),
                    self.root
                        .create_user(&name, "perm-pw-1", UserStatus::Active, None),
                )
                .await
                .id;
            }
            Op::DeleteGroup => {
                let name = self.fresh("perm-doomed-group");
                target.group = step(
                    &format!("root creates group {name}"),
                    self.root
                        .create_consumer_group(&id(self.stream), &id(self.topic), &name),
                )
                .await
                .id;
            }
            _ => {}
        }
        target
    }

    /// The case's flag on `target` (`decoy`: on the decoy stream or topic; for a global flag,
    /// no permissions at all).
    fn permissions(&self, grant: Grant, target: Target, decoy: bool) -> Option<Permissions> {
        let (stream, topic) = if decoy {
            (self.decoy_stream, self.decoy_topic)
        } else {
            (target.stream, target.topic)
        };
        let scoped = |p: StreamPermissions, s: u32| Permissions {
            global: GlobalPermissions::default(),
            streams: Some(BTreeMap::from([(s as usize, p)])),
        };
        match grant {
            Grant::Global(_) if decoy => None,
            Grant::Global(set) => {
                let mut global = GlobalPermissions::default();
                set(&mut global);
                Some(Permissions {
                    global,
                    streams: None,
                })
            }
            Grant::Stream(set) => {
                let mut p = StreamPermissions::default();
                set(&mut p);
                Some(scoped(p, stream))
            }
            Grant::Topic(set) => {
                let mut t = TopicPermissions::default();
                set(&mut t);
                let p = StreamPermissions {
                    topics: Some(BTreeMap::from([(topic as usize, t)])),
                    ..StreamPermissions::default()
                };
                // The decoy topic lives in the target's stream.
                Some(scoped(p, target.stream))
            }
        }
    }

    /// Runs `op` on `target` as `client`; the same call for the refused and the allowed try.
    async fn run(&self, op: Op, client: &IggyClient, target: Target) -> Result<(), IggyError> {
        let (s, t) = (id(target.stream), id(target.topic));
        let group = Identifier::named(GROUP).expect("a group name");
        let consumer = Consumer::new(id(1));
        match op {
            Op::GetStats => client.get_stats().await.map(drop),
            Op::GetClients => client.get_clients().await.map(drop),
            Op::GetClient => client.get_client(self.root_client).await.map(drop),
            Op::CreateUser => {
                let name = self.fresh("perm-made-user");
                let made = client.create_user(&name, "perm-pw-1", UserStatus::Active, None);
                made.await.map(drop)
            }
            Op::GetUsers => client.get_users().await.map(drop),
            Op::GetUser => client.get_user(&id(self.other_user)).await.map(drop),
            Op::UpdateUser => {
                let name = self.fresh("perm-renamed-user");
                let options = UserUpdateOptions::default();
                client
                    .update_user(&id(target.user), Some(&name), None, &options)
                    .await
            }
            Op::UpdatePermissions => client.update_permissions(&id(target.user), None).await,
            Op::DeleteUser => client.delete_user(&id(target.user)).await,
            Op::CreateStream => client
                .create_stream(&self.fresh("perm-made-stream"))
                .await
                .map(drop),
            Op::GetStreams => client.get_streams().await.map(drop),
            Op::GetStream => client.get_stream(&s).await.map(drop),
            Op::GetTopics => client.get_topics(&s).await.map(drop),
            Op::UpdateStream => {
                let name = self.fresh("perm-renamed-stream");
                let options = StreamUpdateOptions::default();
                client.update_stream(&s, &name, &options).await
            }
            Op::PurgeStream => client.purge_stream(&s).await,
            Op::DeleteStream => client.delete_stream(&s).await,
            Op::CreateTopic => {
                let options = TopicCreateOptions {
                    partitions_count: Some(1),
                    ..TopicCreateOptions::default()
                };
                let name = self.fresh("perm-made-topic");
                client.create_topic(&s, &name, &options).await.map(drop)
            }
            Op::GetTopic => client.get_topic(&s, &t).await.map(drop),
            Op::UpdateTopic => {
                let name = self.fresh("perm-renamed-topic");
                let options = TopicUpdateOptions::default();
                client.update_topic(&s, &t, &name, &options).await
            }
            Op::PurgeTopic => client.purge_topic(&s, &t).await,
            Op::DeleteTopic => client.delete_topic(&s, &t).await,
            Op::CreatePartitions => client.create_partitions(&s, &t, 1).await,
            Op::DeletePartitions => client.delete_partitions(&s, &t, 1).await,
            Op::Send => {
                let mut messages = vec![
                    IggyMessage::builder()
                        .payload(b"perm".to_vec().into())
                        .build()
                        .expect("a valid message"),
                ];
                let partition = Partitioning::partition_id(0);
                client
                    .send_messages(&s, &t, &partition, &mut messages)
                    .await
                    .map(drop)
            }
            Op::Poll => {
                let from = PollingStrategy::offset(0);
                let polled = client.poll_messages(&s, &t, Some(0), &consumer, &from, 10, false);
                polled.await.map(drop)
            }
            Op::StoreOffset => {
                client
                    .store_consumer_offset(&consumer, &s, &t, Some(0), 0)
                    .await
            }
            Op::GetOffset => client
                .get_consumer_offset(&consumer, &s, &t, Some(0))
                .await
                .map(drop),
            Op::DeleteOffset => {
                // Something to delete when allowed; when refused, the delete's own answer
                // is the one reported.
                let stored = client.store_consumer_offset(&consumer, &s, &t, Some(0), 0);
                let stored = stored.await;
                client
                    .delete_consumer_offset(&consumer, &s, &t, Some(0))
                    .await?;
                stored
            }
            Op::CreateGroup => {
                let name = self.fresh("perm-made-group");
                client.create_consumer_group(&s, &t, &name).await.map(drop)
            }
            Op::GetGroups => client.get_consumer_groups(&s, &t).await.map(drop),
            Op::GetGroup => client.get_consumer_group(&s, &t, &group).await.map(drop),
            Op::JoinGroup => {
                client.join_consumer_group(&s, &t, &group).await?;
                client.leave_consumer_group(&s, &t, &group).await
            }
            Op::LeaveGroup => {
                // A member to leave when allowed; when refused, the leave's own answer is
                // the one reported.
                let joined = client.join_consumer_group(&s, &t, &group).await;
                client.leave_consumer_group(&s, &t, &group).await?;
                joined
            }
            Op::DeleteGroup => {
                client
                    .delete_consumer_group(&s, &t, &id(target.group))
                    .await
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_permission_rule_refuses_without_and_allows_with_through_the_sdk() {
    init_client_log();
    let mut cluster =
        DevCluster::start(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("permissions"));
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
    let root_client = step("root get me", root.get_me()).await.client_id;
    let stream = step("create stream", root.create_stream("perm-stream"))
        .await
        .id;
    let decoy_stream = step("create decoy stream", root.create_stream("perm-decoy"))
        .await
        .id;
    let other_user = step(
        "create another user",
        root.create_user("perm-other", "perm-pw-1", UserStatus::Active, None),
    )
    .await
    .id;
    let subject = step(
        "create the subject",
        root.create_user("perm-subject", "perm-pw-1", UserStatus::Active, None),
    )
    .await
    .id;
    let mut fixture = Fixture {
        root,
        stream,
        topic: 0,
        decoy_stream,
        decoy_topic: 0,
        other_user,
        root_client,
        serial: AtomicU32::new(0),
    };
    fixture.topic = fixture.create_topic(stream, "perm-topic").await;
    fixture.decoy_topic = fixture.create_topic(stream, "perm-decoy-topic").await;
    step(
        "create the group",
        fixture
            .root
            .create_consumer_group(&id(stream), &id(fixture.topic), GROUP),
    )
    .await;
    fixture
        .run(Op::Send, &fixture.root, fixture.target(Op::Send).await)
        .await
        .expect("root sends the first message");

    let client = client_on(&address).await;
    step(
        "subject login",
        client.login_user("perm-subject", "perm-pw-1"),
    )
    .await;
    let cases = table();
    for case in &cases {
        let name = case.name;
        let target = fixture.target(case.op).await;
        let decoy = fixture.permissions(case.grant, target, true);
        step(
            &format!("{name}: grant the decoy {decoy:?}"),
            fixture.root.update_permissions(&id(subject), decoy),
        )
        .await;
        match tokio::time::timeout(STEP_BOUND, fixture.run(case.op, &client, target)).await {
            Ok(Err(IggyError::Unauthorized)) => {}
            Ok(Err(e)) => panic!(
                "{name}: without the permission: {e:?} (code {}), not Unauthorized (41)",
                e.as_code()
            ),
            Ok(Ok(())) => panic!("{name}: allowed without the permission"),
            Err(_) => panic!("{name}: without the permission: no answer within the bound"),
        }
        let exact = fixture.permissions(case.grant, target, false);
        step(
            &format!("{name}: grant exactly {exact:?}"),
            fixture.root.update_permissions(&id(subject), exact),
        )
        .await;
        step(
            &format!("{name}: with the permission"),
            fixture.run(case.op, &client, target),
        )
        .await;
    }
    eprintln!("{} permission cases passed", cases.len());
    cluster.pass();
}

//! The metadata state machine inside the real consensus core: three `Replica`s of the metadata
//! group over a FIFO in-memory network with immediate storage. The primary's preflight and
//! projection, every replica's apply, and the replies travel exactly as in a node.

use std::collections::VecDeque;

use consensus::{
    Buffered, ClientId, ClientRequest, Completion, Effect, Frame, GroupId, Input, Now, Outbox,
    RawConfig, Recovered, Replica, ReplicaId,
};
use server::client::codec::{Identifier, Name, Options};
use server::client::reply::{LoginReply, StreamDetails, TopicDetails, read_result};
use server::client::request::PROTOCOL_VERSION;
use server::client::request::{CreateTopic, Request};
use server::client::status;
use server::metadata::password::HashParams;
use server::metadata::view::Sessions;
use server::metadata::{Genesis, MetadataStateMachine, RootCredentials};
use server::reply_gate::ReplyGate;
use wire::Operation;

struct Cluster {
    replicas: Vec<Replica<Buffered<MetadataStateMachine>>>,
    network: VecDeque<(ReplicaId, ReplicaId, Frame)>,
    completions: VecDeque<(ReplicaId, Completion)>,
    replies: Vec<(ClientId, Frame)>,
    now: Now,
    outbox: Outbox,
}

fn machine() -> Buffered<MetadataStateMachine> {
    Buffered::new(
        MetadataStateMachine::new(&Genesis {
            cluster_id: 0xC1,
            root: RootCredentials::resolve(None, None, ("u", "p"), |_| None).unwrap(),
            params: HashParams::TEST,
        })
        .unwrap(),
    )
}

impl Cluster {
    fn new(n: u8) -> Cluster {
        let mut c = Cluster {
            replicas: Vec::new(),
            network: VecDeque::new(),
            completions: VecDeque::new(),
            replies: Vec::new(),
            now: Now {
                tick: 0,
                realtime_us: 1_000_000,
            },
            outbox: Outbox::new(),
        };
        for r in 0..n {
            let mut raw = RawConfig::new(0xC1, ReplicaId(r), n, GroupId::METADATA);
            // As in a node (decision 395): acks say how far their sender applied.
            raw.acks_carry_applied = true;
            let config = raw.validate().unwrap();
            let replica = Replica::new(
                config,
                Recovered::fresh(u128::from(r) + 1),
                machine(),
                &mut c.outbox,
            );
            c.replicas.push(replica);
            c.execute(ReplicaId(r));
        }
        c.run();
        c
    }

    fn execute(&mut self, r: ReplicaId) {
        let effects: Vec<Effect> = self.outbox.drain().collect();
        for effect in effects {
            match effect {
                Effect::Send { to, frame } => self.network.push_back((r, to, frame)),
                Effect::Append { op, frame } => {
                    let checksum = frame.prepare_header().unwrap().frame.checksum.get();
                    self.completions
                        .push_back((r, Completion::Appended { op, checksum }));
                }
                Effect::PersistVsrState(state) => self.completions.push_back((
                    r,
                    Completion::VsrStatePersisted {
                        view: state.view,
                        log_view: state.log_view,
                    },
                )),
                Effect::Checkpoint { op } => self
                    .completions
                    .push_back((r, Completion::Checkpointed { op })),
                Effect::Reply { client, frame } => self.replies.push((client, frame)),
                Effect::Truncate { .. } => {}
                other => panic!("unexpected effect {other:?}"),
            }
        }
    }

    fn step(&mut self, r: ReplicaId, input: Input<'_>) {
        let _ = self.replicas[r.0 as usize].step(self.now, input, &mut self.outbox);
        self.execute(r);
    }

    fn run(&mut self) {
        for _ in 0..100_000 {
            if let Some((r, completion)) = self.completions.pop_front() {
                self.step(r, Input::Done(completion));
            } else if let Some((from, to, frame)) = self.network.pop_front() {
                self.step(
                    to,
                    Input::Frame {
                        from,
                        frame: &frame,
                    },
                );
            } else {
                return;
            }
        }
        panic!("did not quiesce");
    }

    fn ticks(&mut self, k: u64) {
        for _ in 0..k {
            self.now.tick += 1;
            self.now.realtime_us += 10_000;
            for r in 0..self.replicas.len() as u8 {
                self.step(ReplicaId(r), Input::Tick);
            }
            self.run();
        }
    }

    /// Like [`Cluster::run`], but only frames `keep` passes are delivered, and those that
    /// reach replica 0 are shown to its reply gate first (as the node's metadata pump does).
    fn run_gated(
        &mut self,
        gate: &mut ReplyGate,
        keep: impl Fn(ReplicaId, ReplicaId, &Frame) -> bool,
    ) {
        for _ in 0..100_000 {
            if let Some((r, completion)) = self.completions.pop_front() {
                self.step(r, Input::Done(completion));
            } else if let Some((from, to, frame)) = self.network.pop_front() {
                if !keep(from, to, &frame) {
                    continue;
                }
                if to == ReplicaId(0) {
                    gate.observe(from.0, frame.bytes());
                }
                self.step(
                    to,
                    Input::Frame {
                        from,
                        frame: &frame,
                    },
                );
            } else {
                return;
            }
        }
        panic!("did not quiesce");
    }

    /// Submits at the primary (replica 0) and returns the reply's status and body.
    fn submit(&mut self, request: ClientRequest) -> (u32, Vec<u8>) {
        let client = request.header.client.get();
        self.replies.clear();
        self.step(ReplicaId(0), Input::Request(request));
        self.run();
        let (_, frame) = self
            .replies
            .iter()
            .find(|(id, _)| id.0 == client)
            .expect("every request is answered");
        let bytes = frame.bytes();
        let status = u32::from_le_bytes(bytes[216..220].try_into().unwrap());
        (status, bytes[256..].to_vec())
    }
}

fn request(session: u64, number: u64, request: &Request<'_>) -> ClientRequest {
    let (operation, _) = request.operation();
    let mut body = Vec::new();
    request.encode(&mut body);
    let mut r = ClientRequest::new(7, operation, session, number, body);
    r.header.user_id.set(0); // the receiving shard stamps the authenticated user
    r
}

#[test]
fn three_replicas_apply_metadata_identically() {
    let mut c = Cluster::new(3);
    let (_, login) = c.submit(ClientRequest::new(7, Operation::Register, 0, 0, Vec::new()));
    // The core builds the Register reply; the client codec reads it as the SDK does.
    let login = LoginReply::decode(read_result(&login).unwrap().unwrap()).unwrap();
    let session = login.session;
    assert_eq!((session, login.user_id), (1, 0));
    assert_eq!(login.server_protocol_version, PROTOCOL_VERSION);

    let name = |s: &str| Name::new(s).unwrap();
    let (status, body) = c.submit(request(
        session,
        1,
        &Request::CreateStream {
            name: name("orders"),
            options: Options::default(),
        },
    ));
    assert_eq!(status, 0);
    let stream = StreamDetails::decode(read_result(&body).unwrap().unwrap()).unwrap();
    assert_eq!(
        (stream.stream.id, stream.stream.name.as_str()),
        (0, "orders")
    );
    // created_at is the prepare's timestamp: the primary's clock, replicated.
    assert_eq!(
        stream.stream.created_at,
        c.replicas[1].header(2).unwrap().timestamp.get()
    );

    let (_, body) = c.submit(request(
        session,
        2,
        &Request::CreateTopic(CreateTopic {
            stream: Identifier::Named(name("orders")),
            partitions_count: 3,
            name: name("eu"),
            options: Options::default(),
        }),
    ));
    let topic = TopicDetails::decode(read_result(&body).unwrap().unwrap()).unwrap();
    assert_eq!(topic.partitions.len(), 3);

    // A duplicate is refused before it enters the log; a body that does not decode too.
    let (_, body) = c.submit(request(
        session,
        3,
        &Request::CreateStream {
            name: name("orders"),
            options: Options::default(),
        },
    ));
    assert_eq!(
        read_result(&body).unwrap(),
        Err(status::STREAM_NAME_ALREADY_EXISTS)
    );
    let mut unsupported = ClientRequest::new(7, Operation::UpdateStream, session, 4, vec![1]);
    unsupported.header.user_id.set(0);
    let (_, body) = c.submit(unsupported);
    assert_eq!(read_result(&body).unwrap(), Err(status::INVALID_COMMAND));

    c.ticks(60);
    let ops = c.replicas[0].commit_min();
    assert_eq!(ops, 3, "register, stream, topic");
    let snapshot = c.replicas[0].state_machine().snapshot();
    for r in &c.replicas {
        assert_eq!(r.commit_min(), ops);
        assert_eq!(r.state_machine().snapshot(), snapshot);
        // The prepare carried CreateTopicWithAssignments: every replica holds the same ids.
        let topic = &r.state_machine().state().streams[&0].topics[&0];
        assert_eq!(
            topic
                .partitions
                .iter()
                .map(|p| p.consensus_group_id)
                .collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
    }
    assert_eq!(
        c.replicas[1].header(3).unwrap().operation,
        Operation::CreateTopicWithAssignments.byte()
    );

    // Sessions: the driver publishes the committed client table beside the view; any
    // replica's table gives the same answer, and a Logout removes the session.
    let publish = |c: &Cluster, r: usize| {
        let replica = &c.replicas[r];
        let sm = replica.state_machine();
        sm.handle().publish_sessions(Sessions::from_table(
            replica.commit_min(),
            replica.sessions().map(|(client, s, u)| (client.0, s, u)),
        ));
        sm.reader()
    };
    for r in 0..3 {
        let reader = publish(&c, r);
        assert_eq!(reader.sessions().user(7, session), Some(0), "replica {r}");
        assert_eq!(reader.sessions().user(7, session + 1), None);
    }
    let (_, body) = c.submit(ClientRequest::new(
        7,
        Operation::Logout,
        session,
        5,
        Vec::new(),
    ));
    assert!(body.is_empty());
    c.ticks(60);
    for r in 0..3 {
        assert_eq!(
            publish(&c, r).sessions().user(7, session),
            None,
            "replica {r}"
        );
    }
}

/// Decision 317 inside the real core: consumer-group memberships end at the commit of the
/// member's Logout and of a new Register under its client id, on every replica alike.
#[test]
fn group_memberships_end_with_their_sessions_on_every_replica() {
    use server::client::groups::GroupTarget;
    let mut c = Cluster::new(3);
    let name = |s: &str| Name::new(s).unwrap();
    let target = GroupTarget {
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        group: Identifier::Named(name("g")),
    };
    let as_client = |client: u128, session: u64, number: u64, r: &Request<'_>| {
        let mut req = request(session, number, r);
        req.header.client.set(client);
        req
    };
    let login = |c: &mut Cluster, client: u128| {
        let (_, body) = c.submit(ClientRequest::new(
            client,
            Operation::Register,
            0,
            0,
            Vec::new(),
        ));
        LoginReply::decode(read_result(&body).unwrap().unwrap())
            .unwrap()
            .session
    };
    let s7 = login(&mut c, 7);
    let s8 = login(&mut c, 8);
    let ok = |c: &mut Cluster, req: ClientRequest| {
        let (status, body) = c.submit(req);
        assert_eq!(status, 0);
        read_result(&body).unwrap().unwrap().to_vec()
    };
    ok(
        &mut c,
        as_client(
            7,
            s7,
            1,
            &Request::CreateStream {
                name: name("s"),
                options: Options::default(),
            },
        ),
    );
    ok(
        &mut c,
        as_client(
            7,
            s7,
            2,
            &Request::CreateTopic(CreateTopic {
                stream: Identifier::Numeric(0),
                partitions_count: 4,
                name: name("t"),
                options: Options::default(),
            }),
        ),
    );
    ok(
        &mut c,
        as_client(
            7,
            s7,
            3,
            &Request::CreateConsumerGroup {
                stream: Identifier::Numeric(0),
                topic: Identifier::Numeric(0),
                name: name("g"),
            },
        ),
    );
    ok(
        &mut c,
        as_client(7, s7, 4, &Request::JoinConsumerGroup(target.clone())),
    );
    ok(
        &mut c,
        as_client(8, s8, 1, &Request::JoinConsumerGroup(target.clone())),
    );
    let members = |c: &Cluster, r: usize| -> Vec<u128> {
        let state = c.replicas[r].state_machine().state();
        state.consumer_groups[&(0, 0)][&0]
            .members
            .values()
            .copied()
            .collect()
    };
    c.ticks(60);
    for r in 0..3 {
        assert_eq!(members(&c, r), vec![7, 8], "replica {r}");
    }
    // Client 7 logs out: its membership ends at that commit everywhere.
    c.submit(as_client(7, s7, 5, &Request::Logout));
    c.ticks(60);
    for r in 0..3 {
        assert_eq!(members(&c, r), vec![8], "replica {r} after 7's Logout");
    }
    // Client 8 logs in again under the same id: its old session's membership ends too.
    login(&mut c, 8);
    c.ticks(60);
    let snapshot = c.replicas[0].state_machine().snapshot();
    for r in 0..3 {
        assert!(members(&c, r).is_empty(), "replica {r} after 8's re-login");
        assert_eq!(c.replicas[r].state_machine().snapshot(), snapshot);
    }
    assert_eq!(
        c.replicas[0].state_machine().state().consumer_groups[&(0, 0)][&0].generation,
        4,
        "join, join, Logout, re-login"
    );
}

/// Decision 395 inside the real core: a purge commits while both backups lag it (they acked
/// its prepare but have not applied it), and its reply waits in the primary's gate until a
/// backup's PrepareOk shows the purge applied, which the primary asks for
/// (`solicit_applied`). Then `n - Q_rep + 1 = 2` of 3 replicas stopped the old incarnation,
/// so the one still lagging cannot commit a send in it with any other (decision 376). A
/// delete waits the same way; other replies do not wait.
#[test]
fn a_purge_is_answered_only_once_enough_replicas_applied_it() {
    let mut c = Cluster::new(3);
    let (_, login) = c.submit(ClientRequest::new(7, Operation::Register, 0, 0, Vec::new()));
    let session = LoginReply::decode(read_result(&login).unwrap().unwrap())
        .unwrap()
        .session;
    let name = |s: &str| Name::new(s).unwrap();
    let (status, _) = c.submit(request(
        session,
        1,
        &Request::CreateStream {
            name: name("s"),
            options: Options::default(),
        },
    ));
    assert_eq!(status, 0);
    let (_, body) = c.submit(request(
        session,
        2,
        &Request::CreateTopic(CreateTopic {
            stream: Identifier::Numeric(0),
            partitions_count: 2,
            name: name("t"),
            options: Options::default(),
        }),
    ));
    assert!(read_result(&body).unwrap().is_ok());
    c.ticks(60);
    let incarnations = |c: &Cluster, r: usize| -> Vec<u64> {
        c.replicas[r].state_machine().state().streams[&0].topics[&0]
            .partitions
            .iter()
            .map(|p| p.consensus_group_id)
            .collect()
    };
    let before = incarnations(&c, 0);

    let mut gate = ReplyGate::new(0, 3);
    // Replica 2 hears nothing from here on; replica 1 gets and acks the purge's prepare.
    let cut = |from: ReplicaId, to: ReplicaId, _: &Frame| from.0 != 2 && to.0 != 2;
    c.replies.clear();
    c.step(
        ReplicaId(0),
        Input::Request(request(
            session,
            3,
            &Request::Lifecycle(server::client::lifecycle::Lifecycle::PurgeTopic {
                stream: Identifier::Numeric(0),
                topic: Identifier::Numeric(0),
            }),
        )),
    );
    c.run_gated(&mut gate, cut);
    let purge_op = c.replicas[0].commit_min();
    assert_eq!(
        c.replicas[0].header(purge_op).unwrap().operation,
        Operation::PurgeTopic.byte()
    );
    assert_ne!(incarnations(&c, 0), before, "the primary applied the purge");
    for r in 1..3 {
        assert!(
            c.replicas[r].commit_min() < purge_op,
            "replica {r} should still lag the purge"
        );
    }
    let replies: Vec<(ClientId, Frame)> = std::mem::take(&mut c.replies);
    assert_eq!(
        replies.len(),
        1,
        "the core answered the purge at its commit"
    );
    for (client, frame) in replies {
        assert!(
            gate.admit(client.0, frame).is_none(),
            "the purge was answered while 2 of 3 replicas had not applied it"
        );
    }
    assert!(gate.release().is_empty());

    // The primary asks; replica 1 applies the purge and says so in its ack.
    c.replicas[0].solicit_applied(&mut c.outbox);
    c.execute(ReplicaId(0));
    c.run_gated(&mut gate, cut);
    assert_eq!(c.replicas[1].commit_min(), purge_op);
    assert_eq!(incarnations(&c, 1), incarnations(&c, 0));
    assert!(
        c.replicas[2].commit_min() < purge_op,
        "replica 2 still lags"
    );
    let released = gate.release();
    assert_eq!(
        released.len(),
        1,
        "the purge's reply goes once 2 of 3 applied it"
    );
    let (client, frame) = &released[0];
    assert_eq!(*client, 7);
    assert_eq!(
        u32::from_le_bytes(frame.bytes()[216..220].try_into().unwrap()),
        0
    );
    assert!(read_result(&frame.bytes()[256..]).unwrap().is_ok());

    // A delete waits the same way while its appliers are short; a create does not wait.
    c.step(
        ReplicaId(0),
        Input::Request(request(
            session,
            4,
            &Request::Lifecycle(server::client::lifecycle::Lifecycle::DeleteTopic {
                stream: Identifier::Numeric(0),
                topic: Identifier::Numeric(0),
            }),
        )),
    );
    c.run_gated(&mut gate, cut);
    let delete_op = c.replicas[0].commit_min();
    assert_eq!(delete_op, purge_op + 1);
    let replies: Vec<(ClientId, Frame)> = std::mem::take(&mut c.replies);
    assert_eq!(replies.len(), 1);
    for (client, frame) in replies {
        assert!(
            gate.admit(client.0, frame).is_none(),
            "a delete's reply went early"
        );
    }
    c.replicas[0].solicit_applied(&mut c.outbox);
    c.execute(ReplicaId(0));
    c.run_gated(&mut gate, cut);
    assert_eq!(gate.release().len(), 1);
    c.step(
        ReplicaId(0),
        Input::Request(request(
            session,
            5,
            &Request::CreateStream {
                name: name("u"),
                options: Options::default(),
            },
        )),
    );
    c.run_gated(&mut gate, cut);
    let replies: Vec<(ClientId, Frame)> = std::mem::take(&mut c.replies);
    assert_eq!(replies.len(), 1);
    for (client, frame) in replies {
        let frame = gate
            .admit(client.0, frame)
            .expect("a create's reply goes at once");
        assert!(read_result(&frame.bytes()[256..]).unwrap().is_ok());
    }
}

//! Errors like a server, not like a crash (issue 11 item 3), on one `strand dev` cluster: with
//! the SDK, an unknown stream, an unknown topic, an unknown partition, a duplicate stream name,
//! a duplicate topic name and a wrong password each get the spec's code (client-plane.md §4,
//! §7) and leave the connection and its session working (a wrong password or unknown user is
//! Eviction 9, which ends the attempt, not the connection: the client registers again on it); with raw frames, a malformed body, a bad identifier, an unknown code, a
//! replicated command's code on the NonReplicated path and FlushUnsavedBuffer get their
//! status on a connection that stays open, every answer echoes its request and comes once (no
//! second answer, nothing unsolicited); a frame larger than `message_bus.max_message_size`
//! closes that connection only (§1, counted as `framing`), and the node serves the next one.

use std::path::PathBuf;
use std::time::Duration;

use iggy::prelude::*;
use strand_sdk_tests::raw::{self, RawClient};
use strand_sdk_tests::{
    DevCluster, REPLICAS, init_client_log, sample, scrape_all, single_primary, step,
};

fn message(payload: &str) -> IggyMessage {
    IggyMessage::builder()
        .payload(payload.as_bytes().to_vec().into())
        .build()
        .expect("a valid message")
}

/// Runs `call`, which must fail with `code`; then a Ping and GetStats on the same client show
/// the connection and session still serve.
async fn refused<T: std::fmt::Debug>(
    client: &IggyClient,
    what: &str,
    code: u32,
    call: impl std::future::Future<Output = Result<T, IggyError>>,
) {
    match tokio::time::timeout(strand_sdk_tests::STEP_BOUND, call).await {
        Ok(Err(e)) => assert_eq!(e.as_code(), code, "{what}: refused with {e:?}, not {code}"),
        Ok(Ok(v)) => panic!("{what}: succeeded ({v:?}), expected code {code}"),
        Err(_) => panic!("{what}: no answer within the step bound"),
    }
    eprintln!("step ok: {what} refused with {code}");
    step(&format!("ping after `{what}`"), client.ping()).await;
    step(&format!("get stats after `{what}`"), client.get_stats()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_gets_its_code_and_only_evictions_close() {
    init_client_log();
    let mut cluster = DevCluster::start(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("errors"));
    let all = cluster.wait_metrics("exactly one metadata primary, all nodes normal", |all| {
        all.len() == REPLICAS
            && single_primary(all).is_some()
            && all.iter().all(|m| m.get("status") == 0)
    });
    let primary = single_primary(&all).expect("checked above");
    let address = cluster.nodes[primary].client.clone();
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(address.clone())
        .with_reconnection_max_retries(Some(0))
        .build()
        .expect("building the SDK client");
    step("connect", client.connect()).await;
    step("login iggy/iggy", client.login_user("iggy", "iggy")).await;
    let stream = step("create stream `errors`", client.create_stream("errors")).await;
    let stream_id = Identifier::numeric(stream.id).unwrap();
    let topic = step(
        "create topic `t` (1 partition)",
        client.create_topic(
            &stream_id,
            "t",
            &TopicCreateOptions {
                partitions_count: Some(1),
                ..TopicCreateOptions::default()
            },
        ),
    )
    .await;
    let topic_id = Identifier::numeric(topic.id).unwrap();
    let unknown = Identifier::numeric(77).unwrap();

    // Unknown stream and topic: the reads answer "not found" (empty body: None), the writes
    // their codes.
    let none = step("get unknown stream", client.get_stream(&unknown)).await;
    assert!(none.is_none(), "{none:?}");
    let none = step("get unknown topic", client.get_topic(&stream_id, &unknown)).await;
    assert!(none.is_none(), "{none:?}");
    refused(
        &client,
        "create topic in an unknown stream",
        1009,
        client.create_topic(&unknown, "x", &TopicCreateOptions::default()),
    )
    .await;
    refused(
        &client,
        "delete an unknown stream",
        1009,
        client.delete_stream(&unknown),
    )
    .await;
    refused(
        &client,
        "send to an unknown stream",
        20,
        client.send_messages(
            &unknown,
            &topic_id,
            &Partitioning::partition_id(0),
            &mut [message("lost")],
        ),
    )
    .await;
    refused(
        &client,
        "send to an unknown topic",
        20,
        client.send_messages(
            &stream_id,
            &unknown,
            &Partitioning::partition_id(0),
            &mut [message("lost")],
        ),
    )
    .await;
    refused(
        &client,
        "send to an unknown partition",
        20,
        client.send_messages(
            &stream_id,
            &topic_id,
            &Partitioning::partition_id(5),
            &mut [message("lost")],
        ),
    )
    .await;
    let consumer = Consumer::new(Identifier::numeric(1).unwrap());
    refused(
        &client,
        "poll an unknown topic (TopicIdNotFound, §4.1)",
        2010,
        client.poll_messages(
            &stream_id,
            &unknown,
            Some(0),
            &consumer,
            &PollingStrategy::offset(0),
            10,
            false,
        ),
    )
    .await;
    // A StoreConsumerOffset past the partition's data is a partition denial: its code in the
    // header status (client-plane.md §4.1, decision 383), not a status-0 result section the
    // SDK would read as success.
    refused(
        &client,
        "store an offset past the data (InvalidOffset, §4.1)",
        4100,
        client.store_consumer_offset(&consumer, &stream_id, &topic_id, Some(0), 1_000),
    )
    .await;

    // Duplicate names.
    refused(
        &client,
        "create a duplicate stream",
        1012,
        client.create_stream("errors"),
    )
    .await;
    refused(
        &client,
        "create a duplicate topic",
        2013,
        client.create_topic(&stream_id, "t", &TopicCreateOptions::default()),
    )
    .await;
    // Nothing was created by the refused requests.
    let streams = step("get streams", client.get_streams()).await;
    assert_eq!(streams.len(), 1, "{streams:?}");
    assert_eq!(streams[0].topics_count, 1, "{streams:?}");
    let polled = step(
        "nothing was appended by the refused sends",
        client.poll_messages(
            &stream_id,
            &topic_id,
            Some(0),
            &consumer,
            &PollingStrategy::offset(0),
            10,
            false,
        ),
    )
    .await;
    assert!(polled.messages.is_empty(), "{polled:?}");

    // Wrong password: InvalidCredentials (Eviction 9) on that client only.
    let intruder = IggyClient::builder()
        .with_tcp()
        .with_server_address(address.clone())
        .with_reconnection_max_retries(Some(0))
        .build()
        .expect("building the SDK client");
    step("connect the second client", intruder.connect()).await;
    match tokio::time::timeout(
        strand_sdk_tests::STEP_BOUND,
        intruder.login_user("iggy", "wrong"),
    )
    .await
    {
        Ok(Err(e)) => assert_eq!(e.as_code(), 42, "wrong password: {e:?}"),
        other => panic!("wrong password: {other:?}"),
    }
    step("ping on the first client", client.ping()).await;

    // Raw frames: the answers the SDK cannot provoke, all on one connection.
    let mut raw_client = RawClient::connect(&address, 0xE0_0001);
    let before_login = raw_client.read("GetStreams before login", 201, &[]);
    assert_eq!(before_login.status(), 40, "{before_login:?}");
    let mut wrong = RawClient::connect(&address, 0xE0_0002);
    let evicted = wrong.register("nobody", "x");
    assert_eq!(evicted.eviction(), Some(9), "unknown user: {evicted:?}");
    // An eviction ends the session, not the connection: a client may register again on it
    // (client-plane.md §1.4).
    wrong.login();
    raw_client.login();
    let session = raw_client.session;
    // (what, operation, code, body, expected code, result-framed)
    type Case = (&'static str, u8, u32, Vec<u8>, u32, bool);
    let cases: Vec<Case> = vec![
        (
            "CreateStream with a name longer than the body",
            raw::CREATE_STREAM,
            0,
            vec![200, b'a', b'b'],
            3,
            true,
        ),
        (
            "GetStream with identifier kind 9",
            raw::NON_REPLICATED,
            200,
            vec![9, 4, 0, 0, 0, 0],
            6,
            false,
        ),
        (
            "an unknown code",
            raw::NON_REPLICATED,
            9999,
            Vec::new(),
            3,
            false,
        ),
        (
            "CreateStream's code on the NonReplicated path",
            raw::NON_REPLICATED,
            202,
            raw::name("x"),
            5,
            false,
        ),
        (
            "FlushUnsavedBuffer",
            raw::NON_REPLICATED,
            102,
            Vec::new(),
            5,
            false,
        ),
        (
            "SendMessages with a truncated body",
            raw::SEND_MESSAGES,
            0,
            vec![1, 4, 0, 0],
            3,
            false,
        ),
        (
            "GetStats, fine",
            raw::NON_REPLICATED,
            10,
            Vec::new(),
            0,
            false,
        ),
    ];
    for (what, operation, code, body, want, result_framed) in cases {
        let request = if operation == raw::CREATE_STREAM {
            let r = raw_client.request;
            raw_client.request += 1;
            r
        } else {
            raw_client.request
        };
        let f = raw::frame(raw_client.client, operation, code, session, request, &body);
        let answer = raw_client.exchange_once(what, &f);
        assert_eq!(answer.command(), raw::REPLY, "{what}: {answer:?}");
        assert_eq!(answer.code(result_framed), want, "{what}: {answer:?}");
        assert_eq!(
            answer.request(),
            request,
            "{what}: the reply echoes the request"
        );
        assert_eq!(
            answer.operation(),
            operation,
            "{what}: the reply echoes the operation"
        );
        assert!(
            raw_client.silent_for(Duration::from_millis(200)),
            "{what}: a second answer or an unsolicited frame"
        );
    }

    // A frame larger than the limit (64 MiB): that connection is closed, counted as framing;
    // the raw client's own connection and a new one still serve.
    let http = cluster.nodes[primary].http.clone();
    let framing = "strand_client_closed_total{reason=\"framing\"}";
    let before = sample(&scrape_all(&http).expect("/metrics"), framing);
    let mut big = RawClient::connect(&address, 0xE0_0003);
    let mut header = raw::frame(big.client, raw::NON_REPLICATED, 1, 0, 1, &[]);
    header[48..52].copy_from_slice(&((64u32 << 20) + 1).to_le_bytes());
    big.write_raw(&header);
    assert!(
        big.closed_within(strand_sdk_tests::STEP_BOUND),
        "an oversized frame did not close its connection"
    );
    let after = sample(&scrape_all(&http).expect("/metrics"), framing);
    assert_eq!(after, before + 1, "the close is counted as framing");
    let ok = raw_client.read("GetStats after the oversized frame", 10, &[]);
    assert_eq!(ok.status(), 0);
    let mut fresh = RawClient::connect(&address, 0xE0_0004);
    fresh.login();
    step("SDK ping after everything", client.ping()).await;
    // DeleteStream of a stream that exists succeeds, and a second one is refused 1009.
    step("delete stream `errors`", client.delete_stream(&stream_id)).await;
    let streams = step("get streams after the delete", client.get_streams()).await;
    assert!(streams.is_empty(), "{streams:?}");
    refused(
        &client,
        "delete the deleted stream",
        1009,
        client.delete_stream(&stream_id),
    )
    .await;
    step("logout", client.logout_user()).await;
    cluster.pass();
}

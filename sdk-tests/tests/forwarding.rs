//! Session forwarding across three real processes (consensus.md section 13, issue 11 item 2):
//! a raw client that stays on a metadata backup logs in there, and the Register travels to
//! the primary as ForwardRegister (counted on both nodes' `/metrics` with outcome `ok`); on
//! the backup its requests get the spec's answers, never a hang: reads are served, a metadata
//! write is refused TransientNotAccepted (58) in the result section, GetClusterMetadata names
//! the primary as the leader; Logout travels as ForwardLogout (counted the same way) and the
//! session is then gone on the backup (40). Then the SDK itself, dialing the backup, logs in
//! (a forwarded Register again) and follows GetClusterMetadata to the primary.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use iggy::prelude::*;
use strand_sdk_tests::raw::{self, RawClient};
use strand_sdk_tests::{
    CLUSTER_BOUND, DevCluster, REPLICAS, init_client_log, sample, scrape_all, single_primary, step,
};

fn forwards(kind: &str, role: &str) -> String {
    format!("strand_forwards_total{{kind=\"{kind}\",role=\"{role}\"}}")
}

fn results(kind: &str, outcome: &str, role: &str) -> String {
    format!("strand_forward_results_total{{kind=\"{kind}\",outcome=\"{outcome}\",role=\"{role}\"}}")
}

/// The results of `kind` in `role` over every outcome.
fn all_results(all: &BTreeMap<String, u64>, kind: &str, role: &str) -> u64 {
    let prefix = format!("strand_forward_results_total{{kind=\"{kind}\",");
    let suffix = format!("role=\"{role}\"}}");
    all.iter()
        .filter(|(name, _)| name.starts_with(&prefix) && name.ends_with(&suffix))
        .map(|(_, v)| v)
        .sum()
}

/// Waits until `done` holds for the full metrics of `http`, within [`CLUSTER_BOUND`].
fn wait_sample(
    cluster: &DevCluster,
    http: &str,
    what: &str,
    done: impl Fn(&BTreeMap<String, u64>) -> bool,
) -> BTreeMap<String, u64> {
    let deadline = Instant::now() + CLUSTER_BOUND;
    loop {
        if let Some(all) = scrape_all(http)
            && done(&all)
        {
            return all;
        }
        if Instant::now() >= deadline {
            cluster.fail(&format!("{what}: not within {CLUSTER_BOUND:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// (tcp port, role, status) of every node in a GetClusterMetadata body (client-plane.md
/// §6.4: u32-length strings, four u16 ports, role and status bytes).
fn roster(body: &[u8]) -> Vec<(u16, u8, u8)> {
    let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().unwrap()) as usize;
    let mut at = 4 + u32_at(0);
    let count = u32_at(at);
    at += 4;
    let mut out = Vec::new();
    for _ in 0..count {
        at += 4 + u32_at(at); // name
        at += 4 + u32_at(at); // ip
        let tcp = u16::from_le_bytes(body[at..at + 2].try_into().unwrap());
        at += 8;
        out.push((tcp, body[at], body[at + 1]));
        at += 2;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_and_logout_at_a_backup_are_forwarded_and_answered() {
    init_client_log();
    let mut cluster =
        DevCluster::start(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("forwarding"));
    let all = cluster.wait_metrics("exactly one metadata primary, all nodes normal", |all| {
        all.len() == REPLICAS
            && single_primary(all).is_some()
            && all.iter().all(|m| m.get("status") == 0)
    });
    let primary = single_primary(&all).expect("checked above");
    let backup = (primary + 1) % REPLICAS;
    let (p_http, b_http) = (
        cluster.nodes[primary].http.clone(),
        cluster.nodes[backup].http.clone(),
    );
    let before_p = scrape_all(&p_http).expect("primary /metrics");
    let before_b = scrape_all(&b_http).expect("backup /metrics");

    // Login at the backup: one forwarded Register, answered ok.
    let mut client = RawClient::connect(&cluster.nodes[backup].client, 0xB0_0001);
    client.login();
    let session = client.session;
    let after_b = wait_sample(&cluster, &b_http, "the backup counts its forward", |m| {
        sample(m, &results("register", "ok", "origin"))
            > sample(&before_b, &results("register", "ok", "origin"))
    });
    // A forward answered transiently (a primary not caught up yet: InProgress) makes the
    // client resend, which forwards again: every forward got a result, exactly one `ok`.
    let after_p = scrape_all(&p_http).expect("primary /metrics");
    let delta = |after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>, name: &str| {
        sample(after, name) - sample(before, name)
    };
    let sent = delta(&after_b, &before_b, &forwards("register", "origin"));
    assert!(sent >= 1, "no ForwardRegister sent by the backup");
    assert_eq!(
        all_results(&after_b, "register", "origin") - all_results(&before_b, "register", "origin"),
        sent,
        "every ForwardRegister got a result at the backup; its metrics: {:?}",
        after_b
            .iter()
            .filter(|(k, v)| (k.contains("forward") || k.contains("dropped")) && **v != 0)
            .collect::<Vec<_>>()
    );
    eprintln!(
        "forward frames held until the backup connected to the primary: {}",
        sample(&after_b, "strand_forwards_deferred_total{outcome=\"held\"}")
    );
    assert_eq!(
        sample(
            &after_b,
            "strand_forwards_deferred_total{outcome=\"dropped\"}"
        ),
        0,
        "a forward frame was dropped unsent"
    );
    assert_eq!(
        delta(&after_b, &before_b, &results("register", "ok", "origin")),
        1
    );
    assert_eq!(
        delta(&after_p, &before_p, &forwards("register", "primary")),
        sent,
        "the primary received each ForwardRegister the backup sent"
    );
    assert_eq!(
        delta(&after_p, &before_p, &results("register", "ok", "primary")),
        1,
        "one ok result sent by the primary"
    );
    assert_eq!(
        sample(&after_p, &forwards("register", "origin")),
        sample(&before_p, &forwards("register", "origin")),
        "the primary forwarded nothing itself"
    );

    // Requests on the backup: reads served, writes refused with 58, the leader named.
    let streams = client.read("GetStreams on the backup", 201, &[]);
    assert_eq!(streams.status(), 0, "GetStreams on the backup: {streams:?}");
    let stats = client.read("GetStats on the backup", 10, &[]);
    assert_eq!(stats.status(), 0, "GetStats on the backup: {stats:?}");
    let create = raw::name("on-backup");
    let refused = client.metadata(
        "CreateStream on the backup",
        raw::CREATE_STREAM,
        &create,
        false,
    );
    assert_eq!(refused.command(), raw::REPLY, "{refused:?}");
    assert_eq!(
        refused.code(true),
        58,
        "a metadata write on a backup: TransientNotAccepted in the result section"
    );
    assert_eq!(
        refused.operation(),
        raw::CREATE_STREAM,
        "the reply echoes the operation"
    );
    let meta = client.read("GetClusterMetadata on the backup", 12, &[]);
    assert_eq!(meta.status(), 0);
    let nodes = roster(meta.body());
    let primary_port: u16 = cluster.nodes[primary]
        .client
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let leaders: Vec<u16> = nodes
        .iter()
        .filter(|(_, role, status)| *role == 0 && *status == 0)
        .map(|(port, _, _)| *port)
        .collect();
    assert_eq!(
        leaders,
        [primary_port],
        "GetClusterMetadata on the backup names the primary as the one healthy leader: {nodes:?}"
    );

    // Logout at the backup: one forwarded Logout, answered ok with an empty body.
    let logout = client.logout();
    assert_eq!(logout.status(), 0, "logout at the backup: {logout:?}");
    assert_eq!(logout.operation(), raw::LOGOUT);
    assert!(logout.body().is_empty(), "{logout:?}");
    let after_b2 = wait_sample(&cluster, &b_http, "the backup counts its logout", |m| {
        sample(m, &results("logout", "ok", "origin"))
            > sample(&after_b, &results("logout", "ok", "origin"))
    });
    let sent = delta(&after_b2, &after_b, &forwards("logout", "origin"));
    assert!(sent >= 1, "no ForwardLogout sent by the backup");
    assert_eq!(
        all_results(&after_b2, "logout", "origin") - all_results(&after_b, "logout", "origin"),
        sent,
        "every ForwardLogout got a result at the backup"
    );
    let after_p2 = scrape_all(&p_http).expect("primary /metrics");
    assert_eq!(
        delta(&after_p2, &after_p, &forwards("logout", "primary")),
        sent,
        "the primary received each ForwardLogout the backup sent"
    );
    assert_eq!(
        delta(&after_p2, &after_p, &results("logout", "ok", "primary")),
        1
    );
    // The session is gone on the backup once it applied the Logout: 40, never a hang.
    let deadline = Instant::now() + CLUSTER_BOUND;
    loop {
        client.session = session;
        let answer = client.read("GetStreams after logout", 201, &[]);
        if answer.command() == raw::REPLY && answer.status() == 40 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the logged-out session still served on the backup: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        client.silent_for(Duration::from_millis(300)),
        "an answer beyond one per request"
    );

    // The SDK at the backup: its login is forwarded too, then it follows the leader.
    let sdk = IggyClient::builder()
        .with_tcp()
        .with_server_address(cluster.nodes[backup].client.clone())
        .with_reconnection_max_retries(Some(0))
        .build()
        .expect("building the SDK client");
    step("SDK connect to the backup", sdk.connect()).await;
    step("SDK login at the backup", sdk.login_user("iggy", "iggy")).await;
    assert_eq!(
        sdk.get_connection_info().await.server_address,
        cluster.nodes[primary].client,
        "the SDK followed GetClusterMetadata to the primary"
    );
    let last_b = scrape_all(&b_http).expect("backup /metrics");
    assert!(
        sample(&last_b, &results("register", "ok", "origin"))
            > sample(&after_b2, &results("register", "ok", "origin")),
        "the SDK's login at the backup was forwarded"
    );
    step("SDK logout on the primary", sdk.logout_user()).await;
    cluster.pass();
}

//! The SDK pointed at a backup's client port (issue 10: a client on a backup gets a clear
//! answer, never a hang). What the SDK does there: it logs in on the node it dialed, asks
//! GetClusterMetadata for the leader, and when the healthy leader's `ip:tcp` is another
//! address it disconnects, dials the leader and logs in again (`IggyClient::login_user`).
//! So the login must complete within the step bound and leave the SDK on the primary, where a
//! metadata write then succeeds.

use std::path::PathBuf;

use iggy::prelude::*;
use strand_sdk_tests::{DevCluster, REPLICAS, init_client_log, single_primary, step};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_pointed_at_a_backup_ends_on_the_primary() {
    init_client_log();
    let mut cluster = DevCluster::start(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("backup"));
    let all = cluster.wait_metrics("exactly one metadata primary, all nodes normal", |all| {
        all.len() == REPLICAS
            && single_primary(all).is_some()
            && all.iter().all(|m| m.get("status") == 0)
    });
    let primary = single_primary(&all).expect("checked above");
    let backup = (primary + 1) % REPLICAS;
    let backup_address = cluster.nodes[backup].client.clone();
    let primary_address = cluster.nodes[primary].client.clone();
    eprintln!(
        "primary node {primary} ({primary_address}); dialing backup node {backup} ({backup_address})"
    );

    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(backup_address.clone())
        .with_reconnection_max_retries(Some(0))
        .build()
        .expect("building the SDK client");
    step("connect to the backup", client.connect()).await;
    step(
        "login iggy/iggy on the backup (the SDK then follows GetClusterMetadata)",
        client.login_user("iggy", "iggy"),
    )
    .await;
    let info = client.get_connection_info().await;
    if info.server_address != primary_address {
        // Still on the backup: show the roster it answers, which is what kept the SDK there.
        let roster =
            tokio::time::timeout(strand_sdk_tests::STEP_BOUND, client.get_cluster_metadata()).await;
        panic!(
            "after login on backup {backup_address} the SDK is on {}, not on the primary \
             {primary_address}; GetClusterMetadata on it answers {roster:?}",
            info.server_address
        );
    }
    let stream = step(
        "create stream after the redirect",
        client.create_stream("sdk-backup"),
    )
    .await;
    assert_eq!(stream.name, "sdk-backup");
    let streams = step("get streams", client.get_streams()).await;
    assert!(
        streams.iter().any(|s| s.name == "sdk-backup"),
        "GetStreams after CreateStream: {streams:?}"
    );
    step("logout", client.logout_user()).await;
    cluster.pass();
}

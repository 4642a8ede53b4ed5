//! Certificates rotated without a restart: new credentials put in place on a running endpoint
//! (by hand, and by the watch of its certificates directory) serve every handshake from then
//! on, in both directions, while connections already up go on; credentials that do not load
//! change nothing.

mod common;

use std::time::Duration;

use cohort_transport::reload::{reload, watch_credentials};
use cohort_transport::{ClusterCa, ConnectError, NodeCredentials, TransportConfig};
use common::*;

/// A client of `ca` (a fresh endpoint `worker/<index>`) asks the server for a reply.
async fn served_to(
    ca: &ClusterCa,
    server: &cohort_transport::Endpoint,
    index: u32,
) -> Result<(), ConnectError> {
    let client = bind(ca, &node("worker", index), TransportConfig::for_tests());
    let conn = client
        .connect(server.local_addr().unwrap(), &node("ps", 0))
        .await?;
    let (reply, _) = conn
        .request_msg::<_, TestMsg>(&TestMsg::Ping { seq: 1 }, vec![])
        .await
        .expect("a request over a new connection");
    assert_eq!(reply, TestMsg::Pong { seq: 1 });
    Ok(())
}

#[tokio::test]
async fn rotated_credentials_serve_new_handshakes_and_old_connections_go_on() {
    bounded(30, async {
        let (old_ca, new_ca) = (
            ClusterCa::generate("old").unwrap(),
            ClusterCa::generate("new").unwrap(),
        );
        let server_id = node("ps", 0);
        let server = bind(&old_ca, &server_id, TransportConfig::for_tests());
        let _seen = spawn_echo_server(server.clone());
        let client = bind(&old_ca, &node("worker", 1), TransportConfig::for_tests());
        let up = client
            .connect(server.local_addr().unwrap(), &server_id)
            .await
            .expect("connects under the old CA");

        server
            .rotate_credentials(new_ca.issue(&server_id).unwrap())
            .expect("new credentials for the same node");
        // The connection made before goes on.
        let (reply, _) = up
            .request_msg::<_, TestMsg>(&TestMsg::Ping { seq: 7 }, vec![])
            .await
            .expect("the old connection still answers");
        assert_eq!(reply, TestMsg::Pong { seq: 7 });
        // New handshakes present the new certificate and check against the new CA only.
        let refused = served_to(&old_ca, &server, 2).await.unwrap_err();
        assert!(
            matches!(refused, ConnectError::CertificateRejected { .. }),
            "{refused:?}"
        );
        served_to(&new_ca, &server, 3)
            .await
            .expect("a client of the new CA is served");
        // The dialing side too: the server's own dials present the new certificate.
        let other = bind(&new_ca, &node("ps", 1), TransportConfig::for_tests());
        let _other_seen = spawn_echo_server(other.clone());
        server
            .connect(other.local_addr().unwrap(), &node("ps", 1))
            .await
            .expect("its dials present the new certificate");
        // Another node's credentials are refused and change nothing.
        let wrong = server.rotate_credentials(new_ca.issue(&node("ps", 9)).unwrap());
        assert!(wrong.is_err());
        served_to(&new_ca, &server, 4).await.expect("still served");
    })
    .await;
}

#[tokio::test]
async fn the_watch_of_a_certificates_directory_reloads_what_changed_there() {
    bounded(30, async {
        let dir = std::env::temp_dir().join(format!("cohort-rotation-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (old_ca, new_ca) = (
            ClusterCa::generate("old").unwrap(),
            ClusterCa::generate("new").unwrap(),
        );
        let server_id = node("ps", 0);
        old_ca.issue(&server_id).unwrap().save(&dir).unwrap();
        let server = cohort_transport::Endpoint::bind(
            loopback(),
            NodeCredentials::load(&dir, &server_id).unwrap(),
            TransportConfig::for_tests(),
        )
        .unwrap();
        let _seen = spawn_echo_server(server.clone());
        let watch = watch_credentials(&server, dir.clone(), Duration::from_millis(50));
        served_to(&old_ca, &server, 1)
            .await
            .expect("served under the old CA");

        // A certificate of another node written there is not put in place.
        new_ca.issue(&node("ps", 1)).unwrap().save(&dir).unwrap();
        std::fs::rename(dir.join("ps-1.pem"), dir.join("ps-0.pem")).unwrap();
        std::fs::rename(dir.join("ps-1.key"), dir.join("ps-0.key")).unwrap();
        assert!(reload(&server, &dir).is_err());
        tokio::time::sleep(Duration::from_millis(200)).await;
        served_to(&old_ca, &server, 2)
            .await
            .expect("the credentials in place stay");

        // The node's new credentials are, within a few checks.
        new_ca.issue(&server_id).unwrap().save(&dir).unwrap();
        let mut served = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if served_to(&new_ca, &server, 3).await.is_ok() {
                served = true;
                break;
            }
        }
        assert!(served, "the new credentials were never put in place");
        assert!(served_to(&old_ca, &server, 4).await.is_err());
        watch.abort();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

//! Receive memory over real QUIC (SEC-1, SEC-2): a frame's declared length is never allocated
//! before its bytes arrive, and the bytes of incoming frames in flight are bounded per
//! connection and per node; a frame that finds no room waits a bounded time and is refused
//! with a typed error. Assertions are on the transport's own counters, never on RSS or speed.

mod common;

use std::time::Duration;

use cohort_transport::{
    Bytes, Connection, InFlightStats, LinkError, RejectReason, TransportConfig,
};
use common::*;

const MIB: u64 = 1024 * 1024;

/// A frame's prefix: header length, blob count, blob lengths (little-endian).
fn prefix(header_len: u32, blob_lens: &[u64]) -> Vec<u8> {
    let mut out = header_len.to_le_bytes().to_vec();
    out.extend_from_slice(&(blob_lens.len() as u32).to_le_bytes());
    for len in blob_lens {
        out.extend_from_slice(&len.to_le_bytes());
    }
    out
}

/// Polls `stats` until `done` holds, within `secs` seconds.
async fn wait_for(
    what: &str,
    secs: u64,
    stats: impl Fn() -> InFlightStats,
    done: impl Fn(&InFlightStats) -> bool,
) -> InFlightStats {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let now = stats();
        if done(&now) {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not reached within {secs} s; last {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends a `Put` with `blobs` and checks the echo: same blobs, same checksum.
async fn put_echoed(conn: &Connection, blobs: Vec<Bytes>) -> Result<(), LinkError> {
    let sum = checksum(&blobs);
    let msg = TestMsg::Put {
        name: "t".into(),
        checksum: sum,
    };
    let (reply, echoed) = conn.request_msg::<_, TestMsg>(&msg, blobs.clone()).await?;
    assert_eq!(
        reply,
        TestMsg::Ack {
            checksum: sum,
            bytes: blobs.iter().map(|b| b.len() as u64).sum(),
        }
    );
    assert!(echoed == blobs, "echoed blobs differ from those sent");
    Ok(())
}

/// The test limits with room for multi-MiB transfers on one test thread of a loaded machine,
/// which can hold keep-alives past the 800 ms test budget.
fn base() -> TransportConfig {
    TransportConfig {
        request_timeout: Duration::from_secs(20),
        idle_timeout: Duration::from_secs(5),
        ..TransportConfig::for_tests()
    }
}

/// Budgets far above anything claimed, so that only allocation is under test.
fn roomy() -> TransportConfig {
    TransportConfig {
        connection_in_flight_bytes_max: 64 * 1024 * MIB,
        node_in_flight_bytes_max: 64 * 1024 * MIB,
        ..base()
    }
}

fn budgets(connection: u64, node: u64, wait: Duration) -> TransportConfig {
    TransportConfig {
        connection_in_flight_bytes_max: connection,
        node_in_flight_bytes_max: node,
        in_flight_wait_timeout: wait,
        ..base()
    }
}

#[tokio::test]
async fn sec1_streams_claiming_huge_blobs_hold_only_the_bytes_they_sent() {
    bounded(60, async {
        const STREAMS: u64 = 128;
        const CLAIM: u64 = 200 * MIB;
        let mut s = EchoSetup::new("claims", 0, roomy());
        let conn = s.connect().await;
        let server_side = s.accepted().await;

        // Each stream: 18 bytes that claim a 200 MiB blob (the report's attack), then silence.
        let mut sent = 0u64;
        let mut streams = Vec::new();
        for _ in 0..STREAMS {
            let mut raw = conn.raw_open().await.expect("open a stream");
            let mut bytes = prefix(1, &[CLAIM]);
            bytes.extend_from_slice(&[0, 7]);
            sent += bytes.len() as u64;
            raw.write(Bytes::from(bytes)).await.expect("write");
            streams.push(raw);
        }
        assert_eq!(sent, STREAMS * 18);

        // Every claim is accepted and reserved, and each stream's two body bytes arrive...
        let claimed = STREAMS * (1 + CLAIM);
        let stats = wait_for(
            "all claims reserved, all body bytes read",
            30,
            || server_side.in_flight(),
            |s| s.bytes_reserved == claimed && s.bytes_held == STREAMS * 2,
        )
        .await;
        // ...but at no moment did the receiver hold more than it was sent (25 GiB claimed).
        println!("after {STREAMS} claims of {CLAIM} bytes: {stats:?}");
        assert!(stats.bytes_held_peak <= sent, "{stats:?}");
        let node = s.server.in_flight();
        assert!(node.bytes_held_peak <= sent, "{node:?}");

        // The streams end truncated: refused, and everything they held is given back.
        drop(streams);
        let after = wait_for(
            "budget given back",
            30,
            || server_side.in_flight(),
            |s| s.bytes_reserved == 0 && s.bytes_held == 0,
        )
        .await;
        assert_eq!(after.frames_over_budget, 0);
        assert_eq!(server_side.rejected_frames(), STREAMS);
        s.assert_still_serving(0).await;
    })
    .await;
}

#[tokio::test]
async fn sec2_budget_bounds_concurrent_frames_and_all_arrive_intact() {
    bounded(90, async {
        const FRAMES: u64 = 8;
        const BLOB: u64 = 3 * MIB;
        const BUDGET: u64 = 4 * MIB;
        let config = budgets(BUDGET, 2 * BUDGET, Duration::from_secs(15));
        let mut s = EchoSetup::new("bounded", 0, config);
        let conn = s.connect().await;
        let server_side = s.accepted().await;

        // Eight 3 MiB frames at once against a 4 MiB budget: they pass one at a time.
        let mut puts = Vec::new();
        for seed in 0..FRAMES {
            let conn = conn.clone();
            let blob = random_bytes(seed, BLOB as usize);
            puts.push(tokio::spawn(
                async move { put_echoed(&conn, vec![blob]).await },
            ));
        }
        for put in puts {
            put.await.unwrap().expect("every frame passes, in turn");
        }

        for (side, stats) in [
            ("server", server_side.in_flight()),
            ("client", conn.in_flight()),
        ] {
            println!("{side}: {stats:?}");
            assert!(stats.bytes_reserved_peak <= BUDGET, "{side}: {stats:?}");
            assert!(stats.bytes_reserved_peak >= BLOB, "{side}: {stats:?}");
            // One frame at a time: its length, plus half of it for the moment its chunks move
            // into its buffer. Unbounded, the eight streams would progress side by side.
            assert!(stats.bytes_held_peak < 2 * BLOB, "{side}: {stats:?}");
            assert_eq!(stats.frames_over_budget, 0, "{side}: {stats:?}");
        }
        let idle = wait_for(
            "server budget given back",
            10,
            || server_side.in_flight(),
            |s| s.bytes_reserved == 0 && s.bytes_held == 0,
        )
        .await;
        assert_eq!(idle.bytes_max, BUDGET);
    })
    .await;
}

/// Holds `claim` bytes of `conn`'s peer's budget with a frame that never completes.
async fn hold_claim(conn: &Connection, claim: u64) -> cohort_transport::connection::RawRequest {
    let mut raw = conn.raw_open().await.expect("open a stream");
    let mut bytes = prefix(1, &[claim - 1]);
    bytes.extend_from_slice(&[0, 1, 2, 3]);
    raw.write(Bytes::from(bytes)).await.expect("write");
    raw
}

#[tokio::test]
async fn sec2_a_frame_over_the_connection_budget_is_refused_busy_within_its_bound() {
    bounded(60, async {
        let wait = Duration::from_millis(300);
        let config = budgets(4 * MIB, 64 * MIB, wait);
        let request_timeout = config.request_timeout;
        let mut s = EchoSetup::new("busy", 0, config);
        let conn = s.connect().await;
        let server_side = s.accepted().await;

        let held = hold_claim(&conn, 3 * MIB).await;
        wait_for(
            "claim reserved",
            10,
            || server_side.in_flight(),
            |s| s.bytes_reserved == 3 * MIB,
        )
        .await;

        let started = tokio::time::Instant::now();
        let err = put_echoed(&conn, vec![random_bytes(1, 2 * MIB as usize)])
            .await
            .unwrap_err();
        let waited = started.elapsed();
        println!("refused after {waited:?}: {err}");
        assert!(
            matches!(
                err,
                LinkError::Rejected {
                    reason: RejectReason::Busy,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(waited < request_timeout, "{waited:?}");
        assert_eq!(server_side.in_flight().frames_over_budget, 1);
        assert_eq!(s.server.in_flight().frames_over_budget, 0);

        // The half-sent frame ends truncated: refused as malformed, its claim given back...
        let err = held.finish_and_reply().await.unwrap_err();
        assert!(
            matches!(
                err,
                LinkError::Rejected {
                    reason: RejectReason::MalformedFrame,
                    ..
                }
            ),
            "{err:?}"
        );
        wait_for(
            "claim given back",
            10,
            || server_side.in_flight(),
            |s| s.bytes_reserved == 0,
        )
        .await;
        // ...and the same message now passes.
        put_echoed(&conn, vec![random_bytes(1, 2 * MIB as usize)])
            .await
            .expect("passes once there is room");
    })
    .await;
}

#[tokio::test]
async fn sec2_the_node_budget_bounds_the_sum_over_connections() {
    bounded(60, async {
        let config = budgets(4 * MIB, 4 * MIB, Duration::from_millis(300));
        let mut s = EchoSetup::new("node-budget", 0, config.clone());
        let first = s.connect().await;
        let first_server_side = s.accepted().await;
        let _held = hold_claim(&first, 3 * MIB).await;
        wait_for(
            "node budget reserved",
            10,
            || s.server.in_flight(),
            |n| n.bytes_reserved == 3 * MIB,
        )
        .await;

        // Another client, another connection, with its own budget untouched: the node's is not.
        let other = bind(&s.ca, &node("worker", 1), config);
        let second = other
            .connect(s.server_addr(), &s.server_id)
            .await
            .expect("connect");
        let err = put_echoed(&second, vec![random_bytes(2, 2 * MIB as usize)])
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                LinkError::Rejected {
                    reason: RejectReason::Busy,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(s.server.in_flight().frames_over_budget, 1);
        assert_eq!(first_server_side.in_flight().frames_over_budget, 0);
        // Small messages that fit in the remaining room still pass.
        let (reply, _) = second
            .request_msg::<_, TestMsg>(&TestMsg::Ping { seq: 1 }, vec![])
            .await
            .expect("a ping fits");
        assert_eq!(reply, TestMsg::Pong { seq: 1 });
    })
    .await;
}

#[tokio::test]
async fn sec2_a_response_without_room_fails_over_budget() {
    bounded(60, async {
        let config = budgets(4 * MIB, 64 * MIB, Duration::from_millis(300));
        let mut s = EchoSetup::new("response-budget", 0, config);
        let conn = s.connect().await;
        let server_side = s.accepted().await;

        // The server half-sends a frame to the client, taking 3 MiB of the client's budget...
        let _held = hold_claim(&server_side, 3 * MIB).await;
        wait_for(
            "client budget reserved",
            10,
            || conn.in_flight(),
            |c| c.bytes_reserved == 3 * MIB,
        )
        .await;
        // ...so the echo of a 2 MiB request finds no room on the way back.
        let err = put_echoed(&conn, vec![random_bytes(3, 2 * MIB as usize)])
            .await
            .unwrap_err();
        assert!(
            matches!(err, LinkError::OverBudget { .. }),
            "{err:?}: {:?}",
            conn.in_flight()
        );
        assert!(
            err.to_string().contains("connection receive budget"),
            "{err}"
        );
        assert_eq!(conn.in_flight().frames_over_budget, 1);
    })
    .await;
}

#[tokio::test]
async fn sec2_a_frame_larger_than_the_budget_passes_alone() {
    bounded(60, async {
        let config = budgets(MIB, MIB, Duration::from_secs(5));
        let mut s = EchoSetup::new("larger", 0, config);
        let conn = s.connect().await;
        let server_side = s.accepted().await;
        put_echoed(&conn, vec![random_bytes(4, 3 * MIB as usize)])
            .await
            .expect("a frame over the budget passes alone");
        let stats = server_side.in_flight();
        assert_eq!(stats.bytes_reserved_peak, MIB, "{stats:?}");
    })
    .await;
}

#[tokio::test]
async fn frames_of_16_mib_round_trip_intact_under_the_default_budgets() {
    bounded(90, async {
        // The default budgets: only timeouts differ from production.
        let mut s = EchoSetup::new("default-budgets", 0, base());
        let conn = s.connect().await;
        let server_side = s.accepted().await;
        let blobs = vec![
            random_bytes(5, 16 * MIB as usize),
            random_bytes(6, 1000),
            random_bytes(7, 20 * 1024),
        ];
        put_echoed(&conn, blobs).await.expect("16 MiB round trip");
        let stats = server_side.in_flight();
        assert!(stats.bytes_reserved_peak >= 16 * MIB, "{stats:?}");
        assert_eq!(stats.frames_over_budget, 0);
        wait_for(
            "budget given back",
            10,
            || server_side.in_flight(),
            |s| s.bytes_reserved == 0 && s.bytes_held == 0,
        )
        .await;
        assert_eq!(conn.in_flight().bytes_held, 0);
    })
    .await;
}

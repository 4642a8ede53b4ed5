use super::*;
use crate::collective::plain::LinkOwner;
use cohort_transport::TransportConfig;

/// Two members of generation 1 over QUIC on loopback, with their endpoints.
async fn pair() -> (Vec<Endpoint>, Vec<ProcessGroup>) {
    let formed = loopback_group(2, TransportConfig::for_tests(), GroupConfig::for_tests());
    tokio::time::timeout(Duration::from_secs(30), formed)
        .await
        .expect("formed in time")
        .unwrap()
}

/// The description of an f32 call of `op` over a tensor of `dims`.
fn f32_call(op: crate::collective::wire::CallOp, dims: Vec<u64>) -> Call {
    Call {
        op,
        element: crate::collective::element::Element::F32,
        dims,
        parts: 0,
        chunk_bytes: 1024,
        small_bytes_max: 1024,
    }
}

/// Delivers a 4-byte chunk `tag` of call `seq` from rank 1 to `shared` as the plaintext
/// plane's reader would, with a read credit of `credits`.
fn deliver_from_rank_1(
    shared: &Shared,
    seq: u64,
    tag: u64,
    call: Call,
    credits: &Arc<tokio::sync::Semaphore>,
) {
    let credit = credits.clone().try_acquire_owned().unwrap();
    let blob = Blob::Bytes(Bytes::from_static(&[0; 4]));
    shared.deliver_plain(1, seq, tag, call, blob, credit);
}

/// A chunk that arrives twice while the first copy still waits to be taken fails the group
/// with a link error naming the sender, for this member and the others alike (the check
/// is on the inbox's key, whatever the chunk carries: on the plaintext plane the first copy
/// may lie in its region of the result, which the second would otherwise have claimed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_sent_twice_fails_the_group_naming_its_sender() {
    let (_endpoints, groups) = pair().await;
    let shared = &groups[0].shared;
    let call = f32_call(crate::collective::wire::CallOp::AllGather, vec![1]);
    let credits = Arc::new(tokio::sync::Semaphore::new(2));
    for _ in 0..2 {
        deliver_from_rank_1(shared, 0, 7, call.clone(), &credits);
    }
    let expected = |err: &CollectiveError| {
        matches!(err, CollectiveError::Link { node, generation: 1, reason }
            if *node == NodeId::new("worker", 1) && reason.contains("twice"))
    };
    let broken = groups[0].broken().expect("broken");
    assert!(expected(&broken), "{broken}");
    // Both copies' credits came back: the link's reader is not held up.
    assert_eq!(credits.available_permits(), 2);
    // The sender hears it too.
    let deadline = Instant::now() + Duration::from_secs(10);
    while groups[1].broken().is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let told = groups[1].broken().expect("the other member was told");
    assert!(expected(&told), "{told}");
}

/// A chunk of a call that ended here (every chunk it was sent taken) fails the group with a
/// link error naming the sender, instead of waiting in the inbox for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_of_a_call_that_ended_fails_the_group_naming_its_sender() {
    let (_endpoints, groups) = pair().await;
    let t = candle_core::Tensor::ones(1000, candle_core::DType::F32, &candle_core::Device::Cpu)
        .unwrap();
    let sums = futures::future::join_all(
        groups
            .iter()
            .map(|g| g.all_reduce(crate::collective::Reduction::Sum, &t)),
    );
    for sum in tokio::time::timeout(Duration::from_secs(30), sums)
        .await
        .expect("summed in time")
    {
        sum.unwrap();
    }
    assert!(groups[0].broken().is_none());
    let sum = crate::collective::wire::CallOp::AllReduce(crate::collective::Reduction::Sum);
    let credits = Arc::new(tokio::sync::Semaphore::new(1));
    deliver_from_rank_1(&groups[0].shared, 0, 0, f32_call(sum, vec![1000]), &credits);
    let broken = groups[0].broken().expect("broken");
    assert!(
        matches!(&broken, CollectiveError::Link { node, reason, .. }
            if *node == NodeId::new("worker", 1) && reason.contains("ended")),
        "{broken}"
    );
    assert_eq!(credits.available_permits(), 1);
}

/// A member knows which process of each peer it formed its group with: an ask to join
/// from that very process (sent before it formed the group, delivered however late) is
/// ignored and the group goes on; one from another process of that peer is its restart,
/// which fails the group at once and leaves the new process pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enter_from_a_members_own_process_is_stale_and_from_another_is_its_restart() {
    let (_endpoints, groups) = pair().await;
    let peer = NodeId::new("worker", 1);
    let addr = groups[1].mesh.local_addr().unwrap().to_string();
    let own = groups[1].mesh.incarnation();
    let inner = &groups[0].mesh.inner;
    assert_eq!(inner.lock().membership.processes.get(&peer), Some(&own));
    // Later than any time window would have allowed.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let reply = inner.entered(&peer, &addr, own);
    assert!(
        matches!(
            reply,
            Reply::Entered {
                generation: 1,
                formed: true,
                ..
            }
        ),
        "{reply:?}"
    );
    assert!(groups[0].broken().is_none(), "a stale ask broke the group");
    assert!(!inner.lock().membership.pending.contains_key(&peer));

    let restarted = Incarnation::random();
    let reply = inner.entered(&peer, &addr, restarted);
    assert!(
        matches!(
            reply,
            Reply::Entered {
                generation: 1,
                formed: true,
                ..
            }
        ),
        "{reply:?}"
    );
    let broken = groups[0]
        .broken()
        .expect("a new process of a member breaks the group");
    assert!(
        matches!(&broken, CollectiveError::MemberLost { node, generation: 1, reason }
            if *node == peer && reason.contains(&restarted.to_string())),
        "{broken}"
    );
    let state = inner.lock();
    let pending = state
        .membership
        .pending
        .get(&peer)
        .expect("the new process is pending");
    assert_eq!(pending.incarnation, restarted);
}

/// A re-forming whose forming began and failed (here the other survivor never forms the
/// generation) hands back that generation's group, broken, with its members: the re-forming's
/// later attempts need a quorum of them too (`Reforming::forming_failed`). One refused before
/// it began (a survivor that is no member) hands back none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_forming_that_began_and_failed_hands_back_the_generation_it_tried() {
    let config = GroupConfig {
        form_timeout: Duration::from_millis(800),
        ..GroupConfig::for_tests()
    };
    let formed = loopback_group(2, TransportConfig::for_tests(), config);
    let (_endpoints, groups) = tokio::time::timeout(Duration::from_secs(30), formed)
        .await
        .expect("formed in time")
        .unwrap();
    let survivors = [NodeId::new("worker", 0), NodeId::new("worker", 1)];
    let attempt = groups[0].reform_attempt(&survivors);
    let failed = tokio::time::timeout(Duration::from_secs(30), attempt)
        .await
        .expect("ended in time")
        .expect_err("worker 1 never forms generation 2");
    let attempted = failed.attempted.expect("the forming had begun");
    assert_eq!(
        (attempted.generation(), attempted.members()),
        (2, &survivors[..])
    );
    assert!(attempted.broken().is_some());
    let stranger = [NodeId::new("worker", 0), NodeId::new("worker", 7)];
    let refused = groups[0]
        .reform_attempt(&stranger)
        .await
        .expect_err("no member");
    assert!(refused.attempted.is_none(), "{}", refused.error);
}

//! The process group over real QUIC on 127.0.0.1 (one endpoint per member, in this process):
//! every operation against a reference computed here, with 2, 3 and 4 members, sizes that do
//! not divide by the member count, zero-length tensors, both algorithms (direct and ring);
//! disagreeing members; a lost member; two members lost at once (the survivors' probes agree);
//! a member's application abort; EPOCH-1; a member's new process that began forming the
//! first generation the others formed with its old one (no survivor: admitted later); a member
//! lost while the first generation formed, its link with one member up and with another not (both
//! re-form together); two processes of a member joining one generation (the later is linked); a
//! member that re-forms alone right after a call while the other leaves (its last messages of
//! the call still reach the leaver); an admission lost on a link cut between the leader
//! and the joiner (told again once it heals; given up, the group goes on without it); a new
//! process refusing at once a generation the survivors formed with its old one. The
//! operations, disagreeing members, a lost member, an
//! abort and the member going on alone also over the plaintext data plane (TCP links set up
//! over QUIC), whose members here pass their chunks through shared memory (all on one host);
//! the operations also with that off (TCP alone), and with members that choose differently.

use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use cohort::collective::{
    loopback_group, CollectiveError, GroupConfig, GroupMember, Joiner, Mesh, ProcessGroup,
    Reduction,
};
use cohort_transport::{ClusterCa, Endpoint, NodeId, TransportConfig};
use futures::future::join_all;

/// Bound on any one scenario: a hang fails the test instead of stalling it.
const SCENARIO_MAX: Duration = Duration::from_secs(60);

struct Cluster {
    endpoints: Vec<Endpoint>,
    groups: Vec<ProcessGroup>,
}

/// `n` members (worker/0 .. worker/n-1), each on its own endpoint, formed at generation 1.
async fn cluster(n: u32, config: GroupConfig) -> Cluster {
    let (endpoints, groups) = loopback_group(n, TransportConfig::for_tests(), config)
        .await
        .unwrap();
    Cluster { endpoints, groups }
}

/// One mesh per config (worker/0, worker/1, ...), each on its own endpoint, and the members
/// to form a group of, unformed: for members whose configs differ.
fn meshes_of(
    name: &str,
    configs: impl IntoIterator<Item = GroupConfig>,
) -> (Vec<Mesh>, Vec<GroupMember>) {
    let ca = ClusterCa::generate(name).unwrap();
    let mut meshes = Vec::new();
    let mut members = Vec::new();
    for (i, config) in configs.into_iter().enumerate() {
        let node = NodeId::new("worker", i as u32);
        let endpoint = Endpoint::bind(
            "127.0.0.1:0".parse().unwrap(),
            ca.issue(&node).unwrap(),
            TransportConfig::for_tests(),
        )
        .unwrap();
        let mesh = Mesh::new(endpoint, config);
        members.push(GroupMember {
            node,
            addr: mesh.local_addr().unwrap(),
        });
        meshes.push(mesh);
    }
    (meshes, members)
}

/// Member `rank`'s input: `len` f32 with fractional bits, so that the order of a sum shows.
fn input(rank: usize, len: usize, salt: u32) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let h = (i as u32 ^ (rank as u32 + 1).wrapping_mul(0x9e37_79b9) ^ salt)
                .wrapping_mul(0x85eb_ca6b);
            ((h >> 8) as f32 / (1 << 24) as f32 - 0.5) * 3.0 + (rank as f32) * 0.001
        })
        .collect()
}

/// The documented segments: `len/n` elements each, one more for the first `len%n`.
fn segment(len: usize, n: usize, k: usize) -> std::ops::Range<usize> {
    let (base, extra) = (len / n, len % n);
    let start = k * base + k.min(extra);
    start..start + base + usize::from(k < extra)
}

/// The reference reduction, in the documented order: element of segment k is
/// `((x[k+1] op x[k+2]) op ...) op x[k]`.
fn reference(inputs: &[Vec<f32>], op: Reduction) -> Vec<f32> {
    let n = inputs.len();
    let len = inputs[0].len();
    let f = |a: f32, b: f32| match op {
        Reduction::Sum | Reduction::Mean => a + b,
        Reduction::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
        Reduction::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
    };
    let mut out = vec![0f32; len];
    for k in 0..n {
        for i in segment(len, n, k) {
            let mut acc = inputs[(k + 1) % n][i];
            for j in 2..=n {
                acc = f(acc, inputs[(k + j) % n][i]);
            }
            out[i] = if op == Reduction::Mean {
                acc / n as f32
            } else {
                acc
            };
        }
    }
    out
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(SCENARIO_MAX, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result within {SCENARIO_MAX:?}"))
}

/// Small chunks, so that the ring runs many pipelined chunks on modest tensors.
fn ring_config() -> GroupConfig {
    ring_config_with(false)
}

/// As [`ring_config`], over the plaintext data plane (TCP) or QUIC.
fn ring_config_with(plaintext: bool) -> GroupConfig {
    GroupConfig {
        small_bytes_max: 4096,
        chunk_bytes: 4096,
        window: 4,
        plaintext,
        ..GroupConfig::for_tests()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_matches_the_reference_with_2_3_and_4_members() {
    every_operation_matches_the_reference_with_2_3_and_4_members_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_matches_the_reference_with_2_3_and_4_members_over_the_plaintext_plane() {
    every_operation_matches_the_reference_with_2_3_and_4_members_case(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_matches_the_reference_with_2_3_and_4_members_over_tcp_alone() {
    every_operation_matches_the_reference_with_2_3_and_4_members_with(tcp_alone()).await;
}

/// The plaintext plane with every chunk on TCP (no shared memory between members).
fn tcp_alone() -> GroupConfig {
    GroupConfig {
        shared_memory: false,
        ..ring_config_with(true)
    }
}

/// Which peers each member passes chunks to through shared memory on the plaintext plane (one
/// host, and the tests' chunks are worth a slot): those it sent chunks to, every other member
/// where `every_peer` (a direct exchange ran) or else its ring successor; none otherwise.
fn assert_shared_memory_links(groups: &[ProcessGroup], config: &GroupConfig, every_peer: bool) {
    for g in groups {
        let (n, rank) = (g.size(), g.rank());
        let mut expected: Vec<NodeId> = g.members().to_vec();
        expected.remove(rank);
        let peers = g.shared_memory_peers();
        if !(config.plaintext && config.shared_memory) {
            assert!(peers.is_empty(), "rank {rank}: {peers:?}");
        } else if every_peer {
            assert_eq!(peers, expected, "rank {rank}");
        } else {
            let next = &g.members()[(rank + 1) % n];
            assert!(peers.contains(next), "rank {rank}: {peers:?}");
        }
    }
}

async fn every_operation_matches_the_reference_with_2_3_and_4_members_case(plaintext: bool) {
    every_operation_matches_the_reference_with_2_3_and_4_members_with(ring_config_with(plaintext))
        .await;
}

async fn every_operation_matches_the_reference_with_2_3_and_4_members_with(config: GroupConfig) {
    for n in [2usize, 3, 4] {
        let c = cluster(n as u32, config.clone()).await;
        // 0: zero-length; 1, 7, 1001: direct (below 4 KiB) and uneven; 5003, 20011: ring,
        // uneven segments and a last chunk shorter than the others.
        for (salt, len) in [0usize, 1, 7, 1001, 5003, 20011].into_iter().enumerate() {
            let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, len, salt as u32)).collect();
            let tensors: Vec<Tensor> = inputs
                .iter()
                .map(|v| Tensor::from_vec(v.clone(), len, &Device::Cpu).unwrap())
                .collect();
            let what = format!("{n} members, {len} elements");
            for op in [
                Reduction::Sum,
                Reduction::Mean,
                Reduction::Max,
                Reduction::Min,
            ] {
                let outs = bounded(
                    &what,
                    join_all(
                        c.groups
                            .iter()
                            .zip(&tensors)
                            .map(|(g, t)| g.all_reduce(op, t)),
                    ),
                )
                .await;
                let expected = bits_of(&reference(&inputs, op));
                for (rank, out) in outs.into_iter().enumerate() {
                    let out = out.unwrap_or_else(|e| panic!("{what} all_reduce({op}): {e}"));
                    assert_eq!(out.dims(), &[len]);
                    assert_eq!(
                        bits(&out),
                        expected,
                        "{what}, all_reduce({op}), rank {rank}"
                    );
                }
            }
            let outs = bounded(
                &what,
                join_all(
                    c.groups
                        .iter()
                        .zip(&tensors)
                        .map(|(g, t)| g.reduce_scatter(Reduction::Sum, t)),
                ),
            )
            .await;
            let sum = reference(&inputs, Reduction::Sum);
            for (rank, out) in outs.into_iter().enumerate() {
                let out = out.unwrap_or_else(|e| panic!("{what} reduce_scatter: {e}"));
                assert_eq!(
                    bits(&out),
                    bits_of(&sum[segment(len, n, rank)]),
                    "{what}, reduce_scatter, rank {rank}"
                );
            }
            let outs = bounded(
                &what,
                join_all(c.groups.iter().zip(&tensors).map(|(g, t)| g.all_gather(t))),
            )
            .await;
            let gathered: Vec<f32> = inputs.concat();
            for (rank, out) in outs.into_iter().enumerate() {
                let out = out.unwrap_or_else(|e| panic!("{what} all_gather: {e}"));
                assert_eq!(out.dims(), &[len * n]);
                assert_eq!(
                    bits(&out),
                    bits_of(&gathered),
                    "{what}, all_gather, rank {rank}"
                );
            }
            let root = n - 1;
            let outs = bounded(
                &what,
                join_all(
                    c.groups
                        .iter()
                        .zip(&tensors)
                        .map(|(g, t)| g.broadcast(root, t)),
                ),
            )
            .await;
            for (rank, out) in outs.into_iter().enumerate() {
                let out = out.unwrap_or_else(|e| panic!("{what} broadcast: {e}"));
                assert_eq!(
                    bits(&out),
                    bits_of(&inputs[root]),
                    "{what}, broadcast, rank {rank}"
                );
            }
        }
        assert_shared_memory_links(&c.groups, &config, true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_element_type_goes_around_the_ring_like_the_reference() {
    every_element_type_goes_around_the_ring_like_the_reference_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_element_type_goes_around_the_ring_like_the_reference_over_the_plaintext_plane() {
    every_element_type_goes_around_the_ring_like_the_reference_case(true).await;
}

/// The ring's results are written in place, each element type through its own vector: small
/// whole numbers (exact in every type, whatever the order) of 1- to 8-byte types, a length
/// that divides neither by the members nor by the chunk, a chunk that holds no whole number of
/// most types' elements (cut at whole elements all the same); every ring operation, the
/// all-gather's input not contiguous (a transposed matrix, read through a copy) and the
/// broadcast's root not rank 0 (its chain wraps around).
async fn every_element_type_goes_around_the_ring_like_the_reference_case(plaintext: bool) {
    every_element_type_goes_around_the_ring_like_the_reference_with(ring_config_with(plaintext))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_element_type_goes_around_the_ring_like_the_reference_over_tcp_alone() {
    every_element_type_goes_around_the_ring_like_the_reference_with(tcp_alone()).await;
}

async fn every_element_type_goes_around_the_ring_like_the_reference_with(config: GroupConfig) {
    let config = GroupConfig {
        chunk_bytes: 4094,
        ..config
    };
    let c = cluster(3, config.clone()).await;
    let len = 5003;
    let values: Vec<Vec<f64>> = (0..3)
        .map(|rank| {
            (0..len)
                .map(|i| ((i * 7 + rank * 13) % 50) as f64)
                .collect()
        })
        .collect();
    for dtype in [
        DType::U8,
        DType::U32,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::BF16,
        DType::F16,
        DType::F64,
    ] {
        let inputs: Vec<Tensor> = (0..3)
            .map(|r| {
                Tensor::from_vec(values[r].clone(), len, &Device::Cpu)
                    .and_then(|t| t.to_dtype(dtype))
                    .unwrap()
            })
            .collect();
        for op in [Reduction::Sum, Reduction::Max, Reduction::Min] {
            let want: Vec<f64> = (0..len)
                .map(|i| {
                    let column = values.iter().map(|v| v[i]);
                    match op {
                        Reduction::Max => column.fold(f64::MIN, f64::max),
                        Reduction::Min => column.fold(f64::MAX, f64::min),
                        _ => column.sum(),
                    }
                })
                .collect();
            let outs = bounded(
                "ring of every type",
                join_all(
                    c.groups
                        .iter()
                        .zip(&inputs)
                        .map(|(g, t)| g.all_reduce(op, t)),
                ),
            )
            .await;
            for (rank, out) in outs.into_iter().enumerate() {
                let out = out.unwrap_or_else(|e| panic!("{dtype:?} {op} rank {rank}: {e}"));
                assert_eq!(out.dtype(), dtype);
                let got = out.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap();
                assert!(got == want, "{dtype:?} {op} rank {rank}");
            }
        }
        let as_f64 = |t: &Tensor| {
            t.flatten_all()
                .and_then(|t| t.to_dtype(DType::F64))
                .and_then(|t| t.to_vec1::<f64>())
                .unwrap()
        };
        let sum: Vec<f64> = (0..len)
            .map(|i| values.iter().map(|v| v[i]).sum())
            .collect();
        let outs = bounded(
            "reduce-scatter of every type",
            join_all(
                c.groups
                    .iter()
                    .zip(&inputs)
                    .map(|(g, t)| g.reduce_scatter(Reduction::Sum, t)),
            ),
        )
        .await;
        for (rank, out) in outs.into_iter().enumerate() {
            let out = out.unwrap_or_else(|e| panic!("{dtype:?} reduce_scatter rank {rank}: {e}"));
            assert_eq!(out.dtype(), dtype);
            assert!(
                as_f64(&out) == sum[segment(len, 3, rank)],
                "{dtype:?} rank {rank}"
            );
        }
        // Each member's block: the transpose of its first 5000 values as a 40 × 125 matrix.
        let blocks: Vec<Tensor> = inputs
            .iter()
            .map(|t| {
                t.narrow(0, 0, 5000)
                    .and_then(|t| t.reshape((40, 125)))
                    .and_then(|t| t.t())
                    .unwrap()
            })
            .collect();
        let outs = bounded(
            "all-gather of every type",
            join_all(c.groups.iter().zip(&blocks).map(|(g, t)| g.all_gather(t))),
        )
        .await;
        let gathered: Vec<f64> = blocks.iter().flat_map(as_f64).collect();
        for (rank, out) in outs.into_iter().enumerate() {
            let out = out.unwrap_or_else(|e| panic!("{dtype:?} all_gather rank {rank}: {e}"));
            assert_eq!((out.dtype(), out.dims()), (dtype, &[3 * 125, 40][..]));
            assert!(as_f64(&out) == gathered, "{dtype:?} all_gather rank {rank}");
        }
        let outs = bounded(
            "broadcast of every type",
            join_all(c.groups.iter().zip(&inputs).map(|(g, t)| g.broadcast(1, t))),
        )
        .await;
        for (rank, out) in outs.into_iter().enumerate() {
            let out = out.unwrap_or_else(|e| panic!("{dtype:?} broadcast rank {rank}: {e}"));
            assert_eq!(out.dtype(), dtype);
            assert!(as_f64(&out) == values[1], "{dtype:?} broadcast rank {rank}");
        }
    }
    assert_shared_memory_links(&c.groups, &config, false);
}

/// Shared memory is chosen per link: a member that has it off gets every chunk over TCP and
/// sends every chunk there, while the others still pass theirs through shared memory. With 4
/// members, member 0's intermediate sums of the ring (their partials from member 3 in slots)
/// go to member 1 over TCP, member 3's to member 0 through a slot. Each size runs twice: the
/// second time every shared link was set up before the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_shared_memory_gets_its_chunks_over_tcp_while_the_others_share() {
    for n in [3, 4] {
        let (meshes, members) = meshes_of(
            &format!("collective-shared-memory-{n}"),
            (0..n).map(|i| GroupConfig {
                shared_memory: i != 1,
                ..ring_config_with(true)
            }),
        );
        let groups: Vec<ProcessGroup> = bounded(
            "forming",
            join_all(meshes.iter().map(|m| m.form(1, members.clone()))),
        )
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
        // Direct (every member to every other) and ring.
        for len in [1001, 20011, 1001, 20011] {
            let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, len, n as u32)).collect();
            let outs = bounded(
                "all-reduce",
                join_all(groups.iter().zip(&inputs).map(|(g, v)| {
                    let t = Tensor::from_vec(v.clone(), len, &Device::Cpu).unwrap();
                    async move { g.all_reduce(Reduction::Sum, &t).await }
                })),
            )
            .await;
            let expected = bits_of(&reference(&inputs, Reduction::Sum));
            for (rank, out) in outs.into_iter().enumerate() {
                assert_eq!(
                    bits(&out.unwrap()),
                    expected,
                    "{n} members, {len} elements, rank {rank}"
                );
            }
        }
        // Every member but 1 passes chunks to every other member but 1 (the direct exchange
        // reached them all).
        for (rank, g) in groups.iter().enumerate() {
            let want: Vec<NodeId> = (0..n)
                .filter(|&o| rank != 1 && o != 1 && o != rank)
                .map(|o| NodeId::new("worker", o as u32))
                .collect();
            assert_eq!(g.shared_memory_peers(), want, "{n} members, rank {rank}");
        }
        drop(meshes);
    }
}

/// A call its caller gives up (the future dropped, here by a timeout around it) takes its
/// member out of the group at once, as a member that stops: its next call fails at once with
/// `Stopped`, and the other's call fails with `MemberLost` naming it long before the operation
/// timeout (its chunks would never come); both then form the next generation together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_takes_its_member_out_until_the_next_epoch() {
    a_call_given_up_takes_its_member_out_until_the_next_epoch_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_takes_its_member_out_until_the_next_epoch_over_the_plaintext_plane() {
    a_call_given_up_takes_its_member_out_until_the_next_epoch_case(true).await;
}

async fn a_call_given_up_takes_its_member_out_until_the_next_epoch_case(plaintext: bool) {
    let config = GroupConfig {
        op_timeout: Duration::from_secs(120),
        ..ring_config_with(plaintext)
    };
    let c = cluster(2, config).await;
    let big = Tensor::ones(100_000, DType::F32, &Device::Cpu).unwrap();
    // Member 0 calls alone: its call cannot end (member 1 has not called) and is given up.
    let given_up = tokio::time::timeout(
        Duration::from_millis(200),
        c.groups[0].all_reduce(Reduction::Sum, &big),
    )
    .await;
    assert!(given_up.is_err(), "the call ended alone: {given_up:?}");
    let started = std::time::Instant::now();
    let other = bounded(
        "the other's call",
        c.groups[1].all_reduce(Reduction::Sum, &big),
    )
    .await;
    match other {
        Err(CollectiveError::MemberLost {
            node,
            generation: 1,
            ..
        }) => {
            assert_eq!(node, NodeId::new("worker", 0));
        }
        other => panic!("the other member's call: {other:?}"),
    }
    // Not the operation timeout (120 s): the member that gave up was seen gone.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    let next = bounded(
        "the next call",
        c.groups[0].all_reduce(Reduction::Sum, &big),
    )
    .await;
    assert!(
        matches!(next, Err(CollectiveError::Stopped { generation: 1 })),
        "{next:?}"
    );
    let both = [NodeId::new("worker", 0), NodeId::new("worker", 1)];
    let reformed = bounded("reform", join_all(c.groups.iter().map(|g| g.reform(&both)))).await;
    let reformed: Vec<ProcessGroup> = reformed.into_iter().map(Result::unwrap).collect();
    let outs = bounded(
        "a call of the next generation",
        join_all(reformed.iter().map(|g| g.all_reduce(Reduction::Sum, &big))),
    )
    .await;
    for (g, out) in reformed.iter().zip(outs) {
        assert_eq!((g.generation(), g.size()), (2, 2));
        let out = out.unwrap().to_vec1::<f32>().unwrap();
        assert!(out.iter().all(|v| *v == 2.0));
    }
}

/// The others hear at once that a member gave up a call, even one that needs nothing more
/// from it: here member 1 has member 0's chunk and waits for member 2's (member 2 never
/// calls), and fails with `MemberLost` naming member 0, not after the operation timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_others_hear_at_once_that_a_member_gave_up_a_call() {
    the_others_hear_at_once_that_a_member_gave_up_a_call_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_others_hear_at_once_that_a_member_gave_up_a_call_over_the_plaintext_plane() {
    the_others_hear_at_once_that_a_member_gave_up_a_call_case(true).await;
}

async fn the_others_hear_at_once_that_a_member_gave_up_a_call_case(plaintext: bool) {
    let config = GroupConfig {
        op_timeout: Duration::from_secs(120),
        ..ring_config_with(plaintext)
    };
    let c = cluster(3, config).await;
    // Small: a direct exchange; member 0 takes member 1's chunk, then waits for member 2's.
    let small = Tensor::ones(100, DType::F32, &Device::Cpu).unwrap();
    let other = {
        let (group, small) = (c.groups[1].clone(), small.clone());
        tokio::spawn(async move { group.all_reduce(Reduction::Sum, &small).await })
    };
    let given_up = tokio::time::timeout(
        Duration::from_millis(300),
        c.groups[0].all_reduce(Reduction::Sum, &small),
    )
    .await;
    assert!(given_up.is_err(), "the call ended: {given_up:?}");
    let started = std::time::Instant::now();
    match bounded("the other member's call", other).await.unwrap() {
        Err(CollectiveError::MemberLost {
            node,
            generation: 1,
            ..
        }) => {
            assert_eq!(node, NodeId::new("worker", 0));
        }
        other => panic!("the other member's call: {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

/// A call dropped on a thread where no runtime runs (its future polled on the runtime, then
/// moved away and dropped) leaves the group the same way, without a panic: the answer to the
/// chunk it held and its `Abort` go out on the group's own runtime.
#[test]
fn a_call_dropped_where_no_runtime_runs_leaves_the_group_without_a_panic() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let c = runtime.block_on(cluster(3, ring_config()));
    // Small: a direct exchange, every member sending to every other.
    let small = Tensor::ones(100, DType::F32, &Device::Cpu).unwrap();
    // Members 0 and 2 call, member 1 does not: neither call can end, and member 0 (taking
    // the others' chunks in rank order) waits for member 1's, member 2's held unanswered.
    let other = {
        let (group, small) = (c.groups[2].clone(), small.clone());
        runtime.spawn(async move { group.all_reduce(Reduction::Sum, &small).await })
    };
    let mut call = Box::pin(c.groups[0].all_reduce(Reduction::Sum, &small));
    runtime.block_on(async {
        // Long enough for member 2's chunk to wait in member 0's inbox.
        let polled = tokio::time::timeout(Duration::from_millis(300), call.as_mut()).await;
        assert!(polled.is_err(), "the call ended: {polled:?}");
    });
    std::thread::scope(|scope| {
        scope.spawn(move || drop(call)).join().unwrap();
    });
    let next = runtime.block_on(c.groups[0].all_reduce(Reduction::Sum, &small));
    assert!(
        matches!(next, Err(CollectiveError::Stopped { generation: 1 })),
        "{next:?}"
    );
    let other = runtime
        .block_on(bounded("the other member's call", other))
        .unwrap();
    match other {
        Err(CollectiveError::MemberLost {
            node,
            generation: 1,
            ..
        }) => {
            assert_eq!(node, NodeId::new("worker", 0));
        }
        other => panic!("the other member's call: {other:?}"),
    }
    runtime.block_on(async move { drop(c) });
}

/// The root's broadcast result is a value of its own: writing the root's variable in place
/// afterwards (a candle `Var`) changes no member's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_result_does_not_follow_the_roots_variable() {
    let c = cluster(2, ring_config()).await;
    for len in [7, 20011] {
        let values = input(0, len, 3);
        let var = candle_core::Var::from_vec(values.clone(), len, &Device::Cpu).unwrap();
        let other = Tensor::zeros(len, DType::F32, &Device::Cpu).unwrap();
        let outs = bounded(
            "broadcast",
            join_all([
                c.groups[0].broadcast(0, var.as_tensor()),
                c.groups[1].broadcast(0, &other),
            ]),
        )
        .await;
        var.set(&Tensor::ones(len, DType::F32, &Device::Cpu).unwrap())
            .unwrap();
        for (rank, out) in outs.into_iter().enumerate() {
            let out = out.unwrap();
            assert!(!out.is_variable(), "rank {rank}");
            assert_eq!(bits(&out), bits_of(&values), "{len} elements, rank {rank}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integer_and_f64_tensors_reduce_like_the_local_group() {
    let c = cluster(3, GroupConfig::for_tests()).await;
    let ints: Vec<Tensor> = (0..3i64)
        .map(|r| Tensor::new(&[[r, 10 * r, -r], [7, 8, 9]], &Device::Cpu).unwrap())
        .collect();
    let sums = join_all(
        c.groups
            .iter()
            .zip(&ints)
            .map(|(g, t)| g.all_reduce(Reduction::Sum, t)),
    )
    .await;
    let means = join_all(
        c.groups
            .iter()
            .zip(&ints)
            .map(|(g, t)| g.all_reduce(Reduction::Mean, t)),
    )
    .await;
    for (sum, mean) in sums.into_iter().zip(means) {
        let sum = sum.unwrap();
        assert_eq!(sum.dtype(), DType::I64);
        assert_eq!(
            sum.to_vec2::<i64>().unwrap(),
            vec![vec![3, 30, -3], vec![21, 24, 27]]
        );
        // As LocalGroup and TensorFlow: an integer mean is f64.
        let mean = mean.unwrap();
        assert_eq!(mean.dtype(), DType::F64);
        assert_eq!(
            mean.to_vec2::<f64>().unwrap(),
            vec![vec![1.0, 10.0, -1.0], vec![7.0, 8.0, 9.0]]
        );
    }
    let floats: Vec<Tensor> = (0..3)
        .map(|r| Tensor::new(&[r as f64, -(r as f64)], &Device::Cpu).unwrap())
        .collect();
    let maxes = join_all(
        c.groups
            .iter()
            .zip(&floats)
            .map(|(g, t)| g.all_reduce(Reduction::Max, t)),
    )
    .await;
    for max in maxes {
        assert_eq!(max.unwrap().to_vec1::<f64>().unwrap(), vec![2.0, 0.0]);
    }
    // A scalar gathers into a vector of one element per member.
    let scalars: Vec<Tensor> = (0..3u32)
        .map(|r| Tensor::new(r, &Device::Cpu).unwrap())
        .collect();
    for out in join_all(c.groups.iter().zip(&scalars).map(|(g, t)| g.all_gather(t))).await {
        assert_eq!(out.unwrap().to_vec1::<u32>().unwrap(), vec![0, 1, 2]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucketed_all_reduce_equals_one_all_reduce_per_tensor() {
    let c = cluster(3, ring_config()).await;
    let shapes: [&[usize]; 5] = [&[3, 5], &[2000], &[1], &[0], &[40, 30]];
    let lists: Vec<Vec<Tensor>> = (0..3)
        .map(|r| {
            shapes
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let len = s.iter().product();
                    Tensor::from_vec(input(r, len, 100 + i as u32), *s, &Device::Cpu).unwrap()
                })
                .collect()
        })
        .collect();
    let fused = bounded(
        "bucketed",
        join_all(
            c.groups
                .iter()
                .zip(&lists)
                .map(|(g, l)| g.all_reduce_bucketed(Reduction::Mean, l, 8192)),
        ),
    )
    .await;
    for (rank, out) in fused.into_iter().enumerate() {
        let out = out.unwrap();
        assert_eq!(out.len(), shapes.len());
        for (i, t) in out.iter().enumerate() {
            assert_eq!(t.dims(), shapes[i], "rank {rank} tensor {i}");
            let each: Vec<Vec<f32>> = lists
                .iter()
                .map(|l| l[i].flatten_all().unwrap().to_vec1::<f32>().unwrap())
                .collect();
            // A bucket's sum is close to the per-tensor sum (its segments differ), and exact
            // across members.
            let expected = reference(&each, Reduction::Mean);
            let got = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (a, b) in got.iter().zip(&expected) {
                assert!((a - b).abs() <= 1e-5, "rank {rank} tensor {i}: {a} vs {b}");
            }
        }
    }
    let again = join_all(
        c.groups
            .iter()
            .zip(&lists)
            .map(|(g, l)| g.all_reduce_bucketed(Reduction::Mean, l, 8192)),
    )
    .await;
    let first: Vec<Vec<u32>> = again[0].as_ref().unwrap().iter().map(bits).collect();
    for out in &again {
        let these: Vec<Vec<u32>> = out.as_ref().unwrap().iter().map(bits).collect();
        assert_eq!(these, first, "DATA-1: every member holds the same bits");
    }
}

/// Runs one call per member where member 2 calls `odd` and the others `call`; every member
/// must fail with a mismatch naming worker/2 (no hang).
async fn expect_mismatch(c: &Cluster, what: &str, call: impl Fn(usize) -> bool) {
    let outs = bounded(
        what,
        join_all(c.groups.iter().enumerate().map(|(rank, g)| {
            let odd = call(rank);
            async move {
                let shape: &[usize] = if odd && what.contains("shape") {
                    &[2, 9000]
                } else {
                    &[9000, 2]
                };
                let dtype = if odd && what.contains("dtype") {
                    DType::F64
                } else {
                    DType::F32
                };
                let len = if what.contains("small") { 10 } else { 18000 };
                let shape: Vec<usize> = if what.contains("small") {
                    if odd && what.contains("shape") {
                        vec![11]
                    } else {
                        vec![len]
                    }
                } else {
                    shape.to_vec()
                };
                let t = Tensor::ones(shape, dtype, &Device::Cpu).unwrap();
                if odd && what.contains("op") {
                    g.all_gather(&t).await.map(|_| ())
                } else {
                    g.all_reduce(Reduction::Sum, &t).await.map(|_| ())
                }
            }
        })),
    )
    .await;
    for (rank, out) in outs.into_iter().enumerate() {
        match out {
            Err(CollectiveError::Mismatch { node, calls, .. }) => {
                assert!(
                    node == NodeId::new("worker", 2) || calls.contains("worker/2 called"),
                    "{what}, rank {rank}: the mismatch names worker/2"
                );
            }
            other => panic!("{what}, rank {rank}: expected a mismatch, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_disagree_all_fail_with_a_mismatch() {
    members_that_disagree_all_fail_with_a_mismatch_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_disagree_all_fail_with_a_mismatch_over_the_plaintext_plane() {
    members_that_disagree_all_fail_with_a_mismatch_case(true).await;
}

async fn members_that_disagree_all_fail_with_a_mismatch_case(plaintext: bool) {
    for what in [
        "small shape",
        "small dtype",
        "small op",
        "ring shape",
        "ring dtype",
        "ring op",
    ] {
        let c = cluster(3, ring_config_with(plaintext)).await;
        expect_mismatch(&c, what, |rank| rank == 2).await;
        // The group stays broken: the next call fails at once with the same error.
        let t = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
        let err = c.groups[0]
            .all_reduce(Reduction::Sum, &t)
            .await
            .unwrap_err();
        assert!(
            matches!(err, CollectiveError::Mismatch { .. }),
            "{what}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_member_fails_every_survivor_who_then_reform_at_the_next_epoch() {
    a_lost_member_fails_every_survivor_who_then_reform_at_the_next_epoch_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_member_fails_every_survivor_who_then_reform_at_the_next_epoch_over_the_plaintext_plane(
) {
    a_lost_member_fails_every_survivor_who_then_reform_at_the_next_epoch_case(true).await;
}

async fn a_lost_member_fails_every_survivor_who_then_reform_at_the_next_epoch_case(
    plaintext: bool,
) {
    let c = cluster(3, ring_config_with(plaintext)).await;
    let big = Tensor::ones(200_000, DType::F32, &Device::Cpu).unwrap();
    // Members 0 and 1 start an all-reduce member 2 never joins; member 2's endpoint closes.
    let pending = join_all(
        c.groups[..2]
            .iter()
            .map(|g| g.all_reduce(Reduction::Sum, &big)),
    );
    let closer = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.endpoints[2].close();
    };
    let (outs, ()) = bounded("lost member", futures::future::join(pending, closer)).await;
    // Every survivor names the member that was really lost, never another survivor.
    for (rank, out) in outs.into_iter().enumerate() {
        match out {
            Err(CollectiveError::MemberLost {
                node,
                generation: 1,
                reason,
            }) => assert_eq!(node, NodeId::new("worker", 2), "rank {rank}: {reason}"),
            other => panic!("rank {rank}: expected worker/2 lost, got {other:?}"),
        }
    }
    let survivors = [NodeId::new("worker", 0), NodeId::new("worker", 1)];
    let reformed = bounded(
        "reform",
        join_all(c.groups[..2].iter().map(|g| g.reform(&survivors))),
    )
    .await;
    let reformed: Vec<ProcessGroup> = reformed.into_iter().map(Result::unwrap).collect();
    let outs = join_all(reformed.iter().map(|g| g.all_reduce(Reduction::Sum, &big))).await;
    for (g, out) in reformed.iter().zip(outs) {
        assert_eq!(g.generation(), 2);
        assert_eq!(g.size(), 2);
        let out = out.unwrap().to_vec1::<f32>().unwrap();
        assert!(out.iter().all(|v| *v == 2.0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_goes_on_alone_right_after_a_call_still_delivers_its_part_of_it() {
    a_member_that_goes_on_alone_right_after_a_call_still_delivers_its_part_of_it_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_goes_on_alone_right_after_a_call_still_delivers_its_part_of_it_over_the_plaintext_plane(
) {
    a_member_that_goes_on_alone_right_after_a_call_still_delivers_its_part_of_it_case(true).await;
}

/// A preemption at a step boundary: the leaver (rank 0) broadcasts whether it saved, and the
/// stayer, its part of the call done, re-forms alone at once and drops the old group. The
/// stayer's last message of the call (the broadcast's "done", or the ring's last chunks) may
/// still be queued then: superseding the group must not lose it, or the leaver waits for it
/// until the operation timeout instead of leaving.
async fn a_member_that_goes_on_alone_right_after_a_call_still_delivers_its_part_of_it_case(
    plaintext: bool,
) {
    let len = 10_000;
    let ops = [
        "small broadcast",
        "large broadcast",
        "all-reduce",
        "all-gather",
    ];
    for op in ops {
        for round in 0..3 {
            let Cluster {
                endpoints: _endpoints,
                mut groups,
            } = cluster(2, ring_config_with(plaintext)).await;
            let stays = groups.pop().unwrap();
            let goes = groups.pop().unwrap();
            // Well under the operation timeout (20 s): a lost message shows as a wait for it.
            let within = Duration::from_secs(10);
            let call = |g: ProcessGroup, rank: usize| async move {
                let t = match op {
                    "small broadcast" => Tensor::new(&[rank as u8], &Device::Cpu).unwrap(),
                    _ => Tensor::from_vec(input(rank, len, 3), len, &Device::Cpu).unwrap(),
                };
                let out = match op {
                    "small broadcast" | "large broadcast" => g.broadcast(0, &t).await,
                    "all-reduce" => g.all_reduce(Reduction::Sum, &t).await,
                    _ => g.all_gather(&t).await,
                };
                (g, out)
            };
            // The leaver flushes after its call, as a member about to go away does, and is
            // kept until the end (its process would exit).
            let leaving = async {
                let (goes, out) = call(goes, 0).await;
                goes.flush(within).await;
                (goes, out)
            };
            let staying = async {
                let (old, out) = call(stays, 1).await;
                out.unwrap_or_else(|e| panic!("{op}: the stayer's call failed: {e}"));
                let alone = old.reform(&[NodeId::new("worker", 1)]).await.unwrap();
                drop(old);
                alone
            };
            let ((_goes, left), alone) =
                tokio::time::timeout(within, futures::future::join(leaving, staying))
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "{op} (round {round}): the leaver's call did not end within {within:?}"
                        )
                    });
            left.unwrap_or_else(|e| panic!("{op} (round {round}): the leaver's call failed: {e}"));
            assert_eq!(alone.generation(), 2);
        }
    }
}

/// On the plaintext plane a member that finished its call and went away (flushed, endpoint
/// closed, group dropped) has closed its QUIC connection before its peer read the chunks it
/// left on their TCP link: the peer still takes them and finishes, the QUIC close telling
/// nothing about them (only the TCP link's end does, after its last byte).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_gone_after_its_last_call_leaves_its_tcp_chunks_to_be_taken() {
    let config = GroupConfig {
        window: 1,
        ..ring_config_with(true)
    };
    let c = cluster(2, config).await;
    let len = 20_000;
    let inputs: Vec<Tensor> = (0..2)
        .map(|r| Tensor::from_vec(input(r, len, 7), len, &Device::Cpu).unwrap())
        .collect();
    let Cluster {
        endpoints,
        mut groups,
    } = c;
    let stays = groups.pop().unwrap();
    let goes = groups.pop().unwrap();
    // The member that stays starts first and is then left unpolled: its chunks for the other
    // go out (the link's tasks send them), but it reads at most one chunk of the other's.
    let staying = stays.reduce_scatter(Reduction::Sum, &inputs[1]);
    tokio::pin!(staying);
    assert!(futures::poll!(staying.as_mut()).is_pending());
    // Reduce-scatter needs nothing the stayer has to read: the other finishes, flushes its
    // chunks into TCP and goes away.
    let gone = bounded(
        "the leaver's call",
        goes.reduce_scatter(Reduction::Sum, &inputs[0]),
    )
    .await
    .unwrap();
    assert!(
        goes.flush(Duration::from_secs(10)).await,
        "its chunks were written"
    );
    endpoints[0].close();
    drop(goes);
    // Long enough for the QUIC close to reach the stayer.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stayed = bounded("the stayer's call", staying)
        .await
        .unwrap_or_else(|e| panic!("the stayer lost the chunks left on TCP: {e}"));
    let want = reference(&[input(0, len, 7), input(1, len, 7)], Reduction::Sum);
    assert_eq!(bits(&gone), bits_of(&want[segment(len, 2, 0)]));
    assert_eq!(bits(&stayed), bits_of(&want[segment(len, 2, 1)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivors_of_two_members_lost_at_once_agree_on_who_is_left_and_reform() {
    let c = cluster(4, ring_config()).await;
    let big = Tensor::ones(200_000, DType::F32, &Device::Cpu).unwrap();
    let survivors = [&c.groups[0], &c.groups[2]];
    let pending = join_all(survivors.iter().map(|g| g.all_reduce(Reduction::Sum, &big)));
    let closer = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.endpoints[1].close();
        c.endpoints[3].close();
    };
    let (outs, ()) = bounded("two lost", futures::future::join(pending, closer)).await;
    for out in outs {
        assert!(
            matches!(out, Err(CollectiveError::MemberLost { .. })),
            "{out:?}"
        );
    }
    // Each survivor probes every member: both leave out the same two.
    let alive = bounded(
        "probe",
        join_all(
            survivors
                .iter()
                .map(|g| g.reachable(Duration::from_secs(2))),
        ),
    )
    .await;
    let expected = vec![NodeId::new("worker", 0), NodeId::new("worker", 2)];
    let alive: Vec<Vec<NodeId>> = alive.into_iter().map(Result::unwrap).collect();
    for view in &alive {
        assert_eq!(view, &expected);
    }
    let reformed = bounded(
        "reform",
        join_all(survivors.iter().zip(&alive).map(|(g, view)| g.reform(view))),
    )
    .await;
    let reformed: Vec<ProcessGroup> = reformed.into_iter().map(Result::unwrap).collect();
    let outs = join_all(reformed.iter().map(|g| g.all_reduce(Reduction::Sum, &big))).await;
    for (g, out) in reformed.iter().zip(outs) {
        assert_eq!((g.generation(), g.size()), (2, 2));
        assert!(out
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .all(|v| *v == 2.0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_aborts_fails_every_pending_call_with_its_message() {
    a_member_that_aborts_fails_every_pending_call_with_its_message_case(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_aborts_fails_every_pending_call_with_its_message_over_the_plaintext_plane() {
    a_member_that_aborts_fails_every_pending_call_with_its_message_case(true).await;
}

async fn a_member_that_aborts_fails_every_pending_call_with_its_message_case(plaintext: bool) {
    let c = cluster(3, ring_config_with(plaintext)).await;
    let big = Tensor::ones(200_000, DType::F32, &Device::Cpu).unwrap();
    // Members 0 and 2 wait in an all-reduce that member 1 gives up with an application error.
    let pending = join_all(
        [&c.groups[0], &c.groups[2]]
            .into_iter()
            .map(|g| g.all_reduce(Reduction::Sum, &big)),
    );
    let abort = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.groups[1].abort("loss is not finite").await
    };
    let (outs, own) = bounded("abort", futures::future::join(pending, abort)).await;
    let expected = CollectiveError::Application {
        node: NodeId::new("worker", 1),
        generation: 1,
        message: "loss is not finite".into(),
    };
    assert_eq!(own, expected);
    for out in outs {
        assert_eq!(out.unwrap_err(), expected);
    }
    // And every later call of the group fails with it too.
    let later = c.groups[0].all_reduce(Reduction::Sum, &big).await;
    assert_eq!(later.unwrap_err(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epoch_1_messages_are_refused_by_members_at_epoch_2_and_never_mixed_in() {
    let c = cluster(3, ring_config()).await;
    let survivors = [NodeId::new("worker", 0), NodeId::new("worker", 1)];
    let reformed: Vec<ProcessGroup> = join_all(c.groups[..2].iter().map(|g| g.reform(&survivors)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // The superseded handles refuse to run.
    let t = Tensor::ones(8, DType::F32, &Device::Cpu).unwrap();
    let err = c.groups[0]
        .all_reduce(Reduction::Sum, &t)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        CollectiveError::Superseded {
            generation: 1,
            current: 2
        }
    );
    // Member 2, still at generation 1 over live connections, sends its chunks: refused (EPOCH-1),
    // while the generation-2 members reduce only their own values.
    let late = c.groups[2].all_reduce(Reduction::Sum, &t);
    let current = join_all(reformed.iter().map(|g| g.all_reduce(Reduction::Sum, &t)));
    let (late, current) = bounded("generations", futures::future::join(late, current)).await;
    match late {
        Err(CollectiveError::GenerationRefused {
            generation: 1,
            current: 2,
            ..
        }) => {}
        other => panic!(
            "expected the generation-1 message refused by a generation-2 member, got {other:?}"
        ),
    }
    for out in current {
        assert_eq!(out.unwrap().to_vec1::<f32>().unwrap(), vec![2.0; 8]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forming_refuses_bad_membership_by_name() {
    let c = cluster(2, GroupConfig::for_tests()).await;
    let err = c.groups[0]
        .reform(&[NodeId::new("worker", 0), NodeId::new("worker", 7)])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("worker/7"), "{err}");
    let err = c.groups[0]
        .broadcast(5, &Tensor::ones(1, DType::F32, &Device::Cpu).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, CollectiveError::InvalidArgument(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_on_different_data_planes_both_fail_forming_naming_the_planes() {
    let (meshes, members) = meshes_of(
        "collective-planes",
        [false, true].map(|plaintext| GroupConfig {
            plaintext,
            form_timeout: Duration::from_secs(5),
            ..GroupConfig::for_tests()
        }),
    );
    let formed = bounded(
        "forming",
        join_all(meshes.iter().map(|m| m.form(1, members.clone()))),
    )
    .await;
    for (rank, result) in formed.into_iter().enumerate() {
        let err = result.expect_err("forming across data planes must fail");
        let text = err.to_string();
        assert!(
            text.contains("data plane") && text.contains("plaintext") && text.contains("QUIC"),
            "rank {rank}: {text}"
        );
    }
}

/// The joiners pending at `leader`, once there is one (bounded).
async fn joiners_pending_at(leader: &ProcessGroup) -> Vec<Joiner> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let joiners = leader.pending_joiners();
        if !joiners.is_empty() {
            return joiners;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no joiner asked the leader within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the leader of `groups` (rank 0) has the joiner of `joining` pending, admits it
/// on every member, and returns the grown group's handles: the members' and the joiner's.
async fn admit_the_joiner(
    groups: &[ProcessGroup],
    joining: tokio::task::JoinHandle<Result<ProcessGroup, CollectiveError>>,
) -> Vec<ProcessGroup> {
    let joiners = joiners_pending_at(&groups[0]).await;
    let admitted = bounded(
        "admitting",
        join_all(groups.iter().map(|g| g.admit(&joiners))),
    )
    .await;
    let mut grown: Vec<ProcessGroup> = admitted
        .into_iter()
        .map(|r| r.unwrap().expect("the leader told the joiner"))
        .collect();
    grown.push(bounded("joining", joining).await.unwrap().unwrap());
    grown
}

/// An endpoint of `worker/i` (a certificate from `ca`) bound at `addr`.
fn bind_worker(
    ca: &ClusterCa,
    i: u32,
    addr: std::net::SocketAddr,
) -> Result<Endpoint, cohort_transport::BindError> {
    Endpoint::bind(
        addr,
        ca.issue(&NodeId::new("worker", i)).unwrap(),
        TransportConfig::for_tests(),
    )
}

/// worker/1's new process (its old one gone), at its address in `members`, forming generation 1
/// with them: its mesh, and the forming.
async fn restart_forming(
    ca: &ClusterCa,
    config: &GroupConfig,
    members: &[GroupMember],
) -> (
    Mesh,
    tokio::task::JoinHandle<Result<ProcessGroup, CollectiveError>>,
) {
    let endpoint = rebind_worker(ca, 1, members[1].addr).await;
    let again = Mesh::new(endpoint, config.clone());
    let forming = tokio::spawn({
        let (again, members) = (again.clone(), members.to_vec());
        async move { again.form(1, members).await }
    });
    (again, forming)
}

/// worker/0, 1 and 2 formed at generation 1 (`three_formed`), then worker/1's process dies and
/// the others' first collective fails: the endpoints and meshes of worker/0 and worker/2 (to
/// keep alive), the three members, and the two survivors' groups, broken before any collective
/// completed.
async fn worker_1_lost_before_any_collective(
    ca: &ClusterCa,
    config: &GroupConfig,
) -> (
    (Vec<Endpoint>, Vec<Mesh>),
    Vec<GroupMember>,
    [ProcessGroup; 2],
) {
    let (mut endpoints, mut meshes, members, mut groups) = three_formed(ca, config).await;
    let (old, old_mesh, old_endpoint) = (groups.remove(1), meshes.remove(1), endpoints.remove(1));
    old_endpoint.close();
    drop((old, old_mesh, old_endpoint));
    let (a, d) = (groups.remove(0), groups.remove(0));
    let one = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    let broken = bounded(
        "the first collective",
        join_all([&a, &d].map(|g| g.all_reduce(Reduction::Sum, &one))),
    )
    .await;
    assert!(broken.iter().all(Result::is_err), "{broken:?}");
    ((endpoints, meshes), members, [a, d])
}

/// worker/0, 1 and 2 (certificates from `ca`), each on its own endpoint, formed at generation 1:
/// their endpoints, meshes, members and groups, in order.
async fn three_formed(
    ca: &ClusterCa,
    config: &GroupConfig,
) -> (
    Vec<Endpoint>,
    Vec<Mesh>,
    Vec<GroupMember>,
    Vec<ProcessGroup>,
) {
    let bind = |i: u32| bind_worker(ca, i, "127.0.0.1:0".parse().unwrap()).unwrap();
    let endpoints: Vec<Endpoint> = (0..3).map(bind).collect();
    let (meshes, members) = meshes_over(&endpoints, config);
    let formed = bounded(
        "forming generation 1",
        join_all(meshes.iter().map(|m| m.form(1, members.clone()))),
    )
    .await;
    let groups = formed.into_iter().map(Result::unwrap).collect();
    (endpoints, meshes, members, groups)
}

/// A mesh over each of `endpoints` with `config`, and the members they make, in order.
fn meshes_over(endpoints: &[Endpoint], config: &GroupConfig) -> (Vec<Mesh>, Vec<GroupMember>) {
    let meshes: Vec<Mesh> = endpoints
        .iter()
        .map(|e| Mesh::new(e.clone(), config.clone()))
        .collect();
    let members = meshes
        .iter()
        .map(|m| GroupMember {
            node: m.node().clone(),
            addr: m.local_addr().unwrap(),
        })
        .collect();
    (meshes, members)
}

/// `worker/i`'s endpoint bound again at `addr`, the address of its closed one (a restarted
/// process), retried until the old socket is released (at most 10 s).
async fn rebind_worker(ca: &ClusterCa, i: u32, addr: std::net::SocketAddr) -> Endpoint {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match bind_worker(ca, i, addr) {
            Ok(endpoint) => return endpoint,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("binding worker/{i}'s address again: {e}"),
        }
    }
}

/// A member's new process that started forming generation 1 after the others had formed it with
/// its old process (the old one killed right after its links were up, the new one asking
/// before the others' groups were whole): the survivors' probes find it alive but no survivor,
/// so they re-form without it at once; its forming ends at their probe (not at its form
/// timeout), and it enters as a joiner and is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_forming_an_epoch_the_others_formed_with_its_old_one_is_admitted_later() {
    let config = GroupConfig::for_tests();
    let ca = ClusterCa::generate("second-incarnation").unwrap();
    // worker/1's process dies; a new one binds its address and forms generation 1 anew.
    let (_kept, members, [a, d]) = worker_1_lost_before_any_collective(&ca, &config).await;
    let one = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    let addr = members[1].addr;
    let (again, forming) = restart_forming(&ca, &config, &members).await;
    // Its form has begun (the first generation is set before any link).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while again.generation() != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the new process never began forming"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The survivors probe: the new process answers, but as no survivor.
    let alive = bounded(
        "probe",
        join_all([&a, &d].map(|g| g.reachable(Duration::from_secs(2)))),
    )
    .await;
    let expected = vec![NodeId::new("worker", 0), NodeId::new("worker", 2)];
    for view in alive {
        assert_eq!(view.unwrap(), expected);
    }
    let started = std::time::Instant::now();
    let failed = bounded("the new process's forming", forming).await.unwrap();
    let err = failed.expect_err("the new process formed a generation the others left");
    assert!(
        started.elapsed() < config.form_timeout / 2,
        "its forming waited {:?} for the form timeout: {err}",
        started.elapsed()
    );
    let reformed = bounded(
        "re-forming",
        join_all([&a, &d].map(|g| g.reform(&expected))),
    )
    .await;
    let reformed: Vec<ProcessGroup> = reformed.into_iter().map(Result::unwrap).collect();
    // It enters, finds a live group and waits to be admitted; the leader admits it.
    let peers = [members[0].clone(), members[2].clone()];
    let entry = bounded(
        "entering",
        again.enter(addr, &peers, Duration::from_secs(2)),
    )
    .await;
    assert!(
        matches!(entry, cohort::collective::Entry::Join),
        "{entry:?}"
    );
    let joining = tokio::spawn({
        let again = again.clone();
        async move { again.join_live(addr, &peers, Duration::from_secs(20)).await }
    });
    let grown = admit_the_joiner(&reformed, joining).await;
    let sums = join_all(grown.iter().map(|g| g.all_reduce(Reduction::Sum, &one))).await;
    for (g, sum) in grown.iter().zip(sums) {
        assert_eq!((g.generation(), g.size()), (3, 3));
        assert_eq!(sum.unwrap().to_vec1::<f32>().unwrap(), vec![3.0; 4]);
    }
}

/// A first generation that broke before any collective completed is no job to wait for: a
/// member's new process asking to enter hears "no group" from the survivors, and starts the
/// job again (a process told "a group lives" there would wait to be admitted and refuse the
/// others' fresh start: the membership simulator found that livelock). Once the survivors
/// re-formed, it hears that a group lives, and waits to be admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_generation_broken_before_any_collective_tells_an_entering_process_to_start() {
    let config = GroupConfig::for_tests();
    let ca = ClusterCa::generate("untrained-first-generation").unwrap();
    let (_kept, members, [a, d]) = worker_1_lost_before_any_collective(&ca, &config).await;
    let addr = members[1].addr;
    let again = Mesh::new(rebind_worker(&ca, 1, addr).await, config.clone());
    let peers = [members[0].clone(), members[2].clone()];
    let entry = bounded(
        "entering",
        again.enter(addr, &peers, Duration::from_secs(5)),
    )
    .await;
    assert!(
        matches!(entry, cohort::collective::Entry::Start),
        "{entry:?}"
    );
    let survivors = vec![NodeId::new("worker", 0), NodeId::new("worker", 2)];
    let reformed = bounded(
        "re-forming",
        join_all([&a, &d].map(|g| g.reform(&survivors))),
    )
    .await;
    let reformed: Vec<ProcessGroup> = reformed.into_iter().map(Result::unwrap).collect();
    assert!(reformed.iter().all(|g| g.generation() == 2));
    let entry = bounded(
        "entering again",
        again.enter(addr, &peers, Duration::from_secs(5)),
    )
    .await;
    assert!(
        matches!(entry, cohort::collective::Entry::Join),
        "{entry:?}"
    );
}

/// Two processes of one member joined the first generation before the other member began forming
/// it (the first killed after sending its join, the second its restart): the other member
/// links with the later one, so the group they form works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_processes_of_a_member_joining_one_epoch_the_later_is_linked() {
    // Far longer than a join takes to arrive over loopback, even on a busy machine.
    const ARRIVE: Duration = Duration::from_secs(1);
    let config = GroupConfig::for_tests();
    let ca = ClusterCa::generate("two-joins").unwrap();
    let bind = |i: u32| bind_worker(&ca, i, "127.0.0.1:0".parse().unwrap()).unwrap();
    let accepting = Mesh::new(bind(0), config.clone());
    let first_endpoint = bind(1);
    let first = Mesh::new(first_endpoint.clone(), config.clone());
    let members = vec![
        GroupMember {
            node: accepting.node().clone(),
            addr: accepting.local_addr().unwrap(),
        },
        GroupMember {
            node: first.node().clone(),
            addr: first.local_addr().unwrap(),
        },
    ];
    // worker/1 dials worker/0, which waits to form before it answers the join.
    let first_forming = tokio::spawn({
        let (first, members) = (first.clone(), members.clone());
        async move { first.form(1, members).await }
    });
    tokio::time::sleep(ARRIVE).await;
    first_forming.abort();
    first_endpoint.close();
    drop((first, first_endpoint, first_forming));
    let (_again, again_forming) = restart_forming(&ca, &config, &members).await;
    tokio::time::sleep(ARRIVE).await;
    let formed = bounded("forming", accepting.form(1, members.clone()))
        .await
        .unwrap();
    let joined = bounded("the later process's forming", again_forming)
        .await
        .unwrap()
        .unwrap();
    let one = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    let sums = bounded(
        "a sum",
        join_all([&formed, &joined].map(|g| g.all_reduce(Reduction::Sum, &one))),
    )
    .await;
    for sum in sums {
        assert_eq!(sum.unwrap().to_vec1::<f32>().unwrap(), vec![2.0; 4]);
    }
}

/// A member lost while the first generation forms, after its link with one member is up and
/// before its link with another is (the network between those two cut): the one that formed
/// finds it lost and probes; the other, still forming, answers as a survivor and gets its
/// group broken at once (not at its form timeout), so both re-form the next generation together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lost_before_its_links_were_all_up_leaves_the_others_re_forming_together() {
    let config = GroupConfig::for_tests();
    let ca = ClusterCa::generate("cut-short").unwrap();
    let transport = TransportConfig::for_tests();
    let mut endpoints: Vec<Endpoint> = (0..2)
        .map(|i| bind_worker(&ca, i, "127.0.0.1:0".parse().unwrap()).unwrap())
        .collect();
    // worker/2 reaches worker/0 only: its link with worker/1 never comes up.
    let faults = cohort_chaos::plan::FaultControl::new(cohort_chaos::plan::FaultPlan::none(1));
    let socket = cohort_chaos::socket::ChaosSocket::bind(
        "127.0.0.1:0".parse().unwrap(),
        &transport,
        faults.clone(),
    )
    .unwrap();
    endpoints.push(
        Endpoint::bind_with_socket(
            socket,
            ca.issue(&NodeId::new("worker", 2)).unwrap(),
            transport,
        )
        .unwrap(),
    );
    let (meshes, members) = meshes_over(&endpoints, &config);
    faults.partition(members[1].addr, members[2].addr);
    let forming: Vec<_> = meshes
        .iter()
        .map(|m| {
            let (m, members) = (m.clone(), members.clone());
            tokio::spawn(async move { m.form(1, members).await })
        })
        .collect();
    let mut forming = forming.into_iter();
    let (first, second, lost) = (
        forming.next().unwrap(),
        forming.next().unwrap(),
        forming.next().unwrap(),
    );
    let first = bounded("worker/0 forming", first).await.unwrap().unwrap();
    // worker/2's process dies, its link with worker/1 never up.
    lost.abort();
    endpoints[2].close();
    let one = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    let err = bounded("the loss", first.all_reduce(Reduction::Sum, &one))
        .await
        .expect_err("a sum with a lost member");
    assert!(matches!(err, CollectiveError::MemberLost { .. }), "{err}");
    let started = std::time::Instant::now();
    let alive = bounded("worker/0's probe", first.reachable(Duration::from_secs(2)))
        .await
        .unwrap();
    let expected = vec![NodeId::new("worker", 0), NodeId::new("worker", 1)];
    assert_eq!(alive, expected, "worker/1, still forming, is a survivor");
    let second = bounded("worker/1 forming", second)
        .await
        .unwrap()
        .expect("worker/1 gets its group, broken, to re-form");
    assert!(
        started.elapsed() < config.form_timeout / 2,
        "worker/1's forming waited {:?} for the form timeout",
        started.elapsed()
    );
    let err = bounded("worker/1's call", second.all_reduce(Reduction::Sum, &one))
        .await
        .expect_err("a call on a group whose forming was cut short");
    // worker/0's abort (the loss) or its probe (re-forming) broke it, whichever came first.
    assert!(
        matches!(
            err,
            CollectiveError::MemberLost { generation: 1, .. }
                | CollectiveError::Form { generation: 1, .. }
        ),
        "{err}"
    );
    let view = bounded("worker/1's probe", second.reachable(Duration::from_secs(2)))
        .await
        .unwrap();
    assert_eq!(view, expected);
    let reformed = bounded(
        "re-forming",
        join_all([&first, &second].map(|g| g.reform(&expected))),
    )
    .await;
    for sum in join_all(
        reformed
            .iter()
            .map(|g| g.as_ref().unwrap().all_reduce(Reduction::Sum, &one)),
    )
    .await
    {
        assert_eq!(sum.unwrap().to_vec1::<f32>().unwrap(), vec![2.0; 4]);
    }
    assert!(reformed
        .iter()
        .all(|g| g.as_ref().unwrap().generation() == 2));
}

/// A member whose list names peers that formed the generation without it (their view of who is
/// alive left it out, and they never dial it) learns so from them within seconds, not at
/// the form timeout: it asks the peers whose joins it awaits whether they still form it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_the_others_left_out_of_their_list_fails_its_forming_at_once() {
    let config = GroupConfig {
        form_timeout: Duration::from_secs(40),
        ..GroupConfig::for_tests()
    };
    let (meshes, members) = meshes_of("left-out-of-list", vec![config; 3]);
    let started = std::time::Instant::now();
    let (left_out, others) = bounded(
        "forming with different lists",
        futures::future::join(
            meshes[0].form(1, members.clone()),
            join_all(meshes[1..].iter().map(|m| m.form(1, members[1..].to_vec()))),
        ),
    )
    .await;
    for g in others {
        assert_eq!(g.unwrap().size(), 2);
    }
    match left_out {
        Err(err @ CollectiveError::GenerationRefused { .. }) => {
            assert!(err.to_string().contains("with members"), "{err}")
        }
        other => panic!("expected worker/0 refused by a member of the other list, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "worker/0 failed after {:?}: it waited out the form timeout",
        started.elapsed()
    );
}

/// A member lost while the survivors re-form (it answered their probes, then died) fails
/// their forming within about the detection budget, not at the form timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lost_while_the_others_re_form_with_it_fails_their_forming_soon() {
    let config = GroupConfig {
        form_timeout: Duration::from_secs(40),
        ..GroupConfig::for_tests()
    };
    let c = cluster(3, config).await;
    let all: Vec<NodeId> = (0..3).map(|i| NodeId::new("worker", i)).collect();
    c.endpoints[2].close();
    let started = std::time::Instant::now();
    let outs = bounded(
        "re-forming with a lost member",
        join_all(c.groups[..2].iter().map(|g| g.reform(&all))),
    )
    .await;
    for (rank, out) in outs.into_iter().enumerate() {
        match out {
            Err(err) => assert!(
                !err.to_string().contains("form timeout"),
                "rank {rank}: {err}"
            ),
            Ok(g) => panic!("rank {rank}: formed {g:?} with a lost member"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the survivors failed after {:?}: they waited out the form timeout",
        started.elapsed()
    );
}

/// A live group of worker/1 and worker/2 (leader: worker/1), and a joiner, worker/0, whose
/// endpoint runs under fault rules (so that its link with the leader can be cut while its
/// links with worker/2 stay up), asking to be admitted. Returns the group, the fault control,
/// the joiner's and the leader's addresses, the joiner's pending join, the joiners the
/// leader would offer, the cluster's CA and the group's members.
async fn live_group_and_a_joiner() -> (
    Vec<ProcessGroup>,
    cohort_chaos::plan::FaultControl,
    (std::net::SocketAddr, std::net::SocketAddr),
    tokio::task::JoinHandle<Result<ProcessGroup, CollectiveError>>,
    Vec<Joiner>,
    ClusterCa,
    Vec<GroupMember>,
) {
    let config = GroupConfig::for_tests();
    let ca = ClusterCa::generate("admission").unwrap();
    let transport = TransportConfig::for_tests();
    let faults = cohort_chaos::plan::FaultControl::new(cohort_chaos::plan::FaultPlan::none(1));
    let socket = cohort_chaos::socket::ChaosSocket::bind(
        "127.0.0.1:0".parse().unwrap(),
        &transport,
        faults.clone(),
    )
    .unwrap();
    let joiner_endpoint = Endpoint::bind_with_socket(
        socket,
        ca.issue(&NodeId::new("worker", 0)).unwrap(),
        transport,
    )
    .unwrap();
    let endpoints: Vec<Endpoint> = (1..3)
        .map(|i| bind_worker(&ca, i, "127.0.0.1:0".parse().unwrap()).unwrap())
        .collect();
    let (meshes, members) = meshes_over(&endpoints, &config);
    let groups: Vec<ProcessGroup> = bounded(
        "forming",
        join_all(meshes.iter().map(|m| m.form(1, members.clone()))),
    )
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let joiner = Mesh::new(joiner_endpoint, config);
    let addr = joiner.local_addr().unwrap();
    let joining = tokio::spawn({
        let peers = members.clone();
        async move {
            joiner
                .join_live(addr, &peers, Duration::from_secs(40))
                .await
        }
    });
    let joiners = joiners_pending_at(&groups[0]).await;
    let leader = members[0].addr;
    (
        groups,
        faults,
        (addr, leader),
        joining,
        joiners,
        ca,
        members,
    )
}

/// The leader's admission of a joiner is lost on a link cut between them (only between
/// them): the leader tells it again once the link heals, and the joiner forms the generation with
/// the members, who were waiting for it. Before, the admission was sent once: the joiner
/// never formed, and the members waited for it until their form timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_lost_on_a_cut_link_is_told_again_once_it_heals() {
    let (groups, faults, (joiner, leader), joining, joiners, ..) = live_group_and_a_joiner().await;
    faults.partition(joiner, leader);
    let admitting = tokio::spawn({
        let (groups, joiners) = (groups.clone(), joiners.clone());
        async move { join_all(groups.iter().map(|g| g.admit(&joiners))).await }
    });
    // Past the idle timeout (800 ms): the admission's link is lost; healed well within the
    // leader's telling again (twice the idle timeout out of reach).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    faults.heal();
    let healed = std::time::Instant::now();
    let admitted = bounded("admitting", admitting).await.unwrap();
    let mut grown: Vec<ProcessGroup> = admitted
        .into_iter()
        .map(|r| {
            r.expect("the members admit the joiner once the link heals")
                .expect("the joiner was told")
        })
        .collect();
    grown.push(bounded("joining", joining).await.unwrap().unwrap());
    assert!(
        healed.elapsed() < GroupConfig::for_tests().form_timeout / 2,
        "admitted {:?} after the link healed",
        healed.elapsed()
    );
    let one = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    let sums = join_all(grown.iter().map(|g| g.all_reduce(Reduction::Sum, &one))).await;
    for (g, sum) in grown.iter().zip(sums) {
        assert_eq!((g.generation(), g.size()), (2, 3));
        assert_eq!(sum.unwrap().to_vec1::<f32>().unwrap(), vec![3.0; 4]);
    }
}

/// Two joiners admitted to the same generation, one of whom hears of its admission late (its link
/// with the leader cut for a while, its link with the other joiner up): the other joiner,
/// told at once, dials it to form the generation before its admission arrives. It waits for its
/// own admission instead of refusing the join as one meaning its old process, and all four
/// form the generation. Before, it refused at once: the other joiner's forming failed, the
/// admission with it, and the survivors re-formed without both (seen in the chaos test of two
/// workers killed at once, where the chief then trained alone to the end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_dialed_by_another_before_its_own_admission_arrives_waits_for_it() {
    let (groups, faults, (late, leader), late_joining, _, ca, peers) =
        live_group_and_a_joiner().await;
    // The second joiner, worker/3: its node is above worker/0's, so it dials worker/0 when
    // they form the generation.
    let endpoint = bind_worker(&ca, 3, "127.0.0.1:0".parse().unwrap()).unwrap();
    let second = Mesh::new(endpoint, GroupConfig::for_tests());
    let second_addr = second.local_addr().unwrap();
    let second_joining = tokio::spawn({
        let peers = peers.clone();
        async move {
            second
                .join_live(second_addr, &peers, Duration::from_secs(40))
                .await
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let joiners = loop {
        let joiners = groups[0].pending_joiners();
        if joiners.len() == 2 {
            break joiners;
        }
        assert!(std::time::Instant::now() < deadline, "both joiners ask");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // worker/0's admission is held up; worker/3's goes through at once.
    faults.partition(late, leader);
    let admitting = tokio::spawn({
        let (groups, joiners) = (groups.clone(), joiners.clone());
        async move { join_all(groups.iter().map(|g| g.admit(&joiners))).await }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    faults.heal();
    let admitted = bounded("admitting", admitting).await.unwrap();
    let mut grown: Vec<ProcessGroup> = admitted
        .into_iter()
        .map(|r| {
            r.expect("the members admit both joiners")
                .expect("the leader told both")
        })
        .collect();
    grown.push(
        bounded("worker/0 joining", late_joining)
            .await
            .unwrap()
            .unwrap(),
    );
    grown.push(
        bounded("worker/3 joining", second_joining)
            .await
            .unwrap()
            .expect("worker/0 waited for its admission instead of refusing worker/3's join"),
    );
    let one = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    let sums = join_all(grown.iter().map(|g| g.all_reduce(Reduction::Sum, &one))).await;
    for (g, sum) in grown.iter().zip(sums) {
        assert_eq!((g.generation(), g.size()), (2, 4));
        assert_eq!(sum.unwrap().to_vec1::<f32>().unwrap(), vec![4.0; 4]);
    }
}

/// The link between the leader and a joiner stays cut: the leader gives up telling it,
/// within a few idle timeouts, and says so to the members, who then skip that generation and go
/// on with the group as it was (nobody waits for the joiner until the form timeout); once
/// the link heals, the joiner, still asking, is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_the_leader_cannot_tell_is_left_for_later_and_the_group_goes_on() {
    let (groups, faults, (joiner, leader), joining, joiners, ..) = live_group_and_a_joiner().await;
    faults.partition(joiner, leader);
    let started = std::time::Instant::now();
    let admitted = bounded(
        "admitting",
        join_all(groups.iter().map(|g| g.admit(&joiners))),
    )
    .await;
    for (rank, result) in admitted.into_iter().enumerate() {
        let none = result.unwrap_or_else(|e| panic!("rank {rank}: the group broke: {e}"));
        assert!(none.is_none(), "rank {rank}: admitted a joiner nobody told");
    }
    assert!(
        started.elapsed() < GroupConfig::for_tests().form_timeout / 2,
        "the members went on {:?} after the admission began",
        started.elapsed()
    );
    // The group goes on as it was.
    let one = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    for sum in join_all(groups.iter().map(|g| g.all_reduce(Reduction::Sum, &one))).await {
        assert_eq!(sum.unwrap().to_vec1::<f32>().unwrap(), vec![2.0; 4]);
    }
    faults.heal();
    let grown = admit_the_joiner(&groups, joining).await;
    for g in &grown {
        assert_eq!(g.size(), 3);
        // Generation 2 was skipped.
        assert_eq!(g.generation(), 3);
    }
}

/// The survivors re-form with a member they took for alive (its old process answered their
/// probes, then died), whose new process already waits to be admitted: it refuses their
/// joins at once (it was admitted to no such generation), so their forming fails now, not at the
/// form timeout, and they re-form without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_refuses_at_once_an_epoch_its_old_one_was_taken_into() {
    let config = GroupConfig::for_tests();
    let ca = ClusterCa::generate("old-one-taken").unwrap();
    let mut endpoints: Vec<Endpoint> = (0..3)
        .map(|i| bind_worker(&ca, i, "127.0.0.1:0".parse().unwrap()).unwrap())
        .collect();
    let (meshes, members) = meshes_over(&endpoints, &config);
    let mut groups: Vec<ProcessGroup> = bounded(
        "forming",
        join_all(meshes.iter().map(|m| m.form(1, members.clone()))),
    )
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    // worker/2's process dies; its new one waits to be admitted.
    endpoints[2].close();
    drop((groups.pop(), meshes, endpoints.pop()));
    let endpoint = rebind_worker(&ca, 2, members[2].addr).await;
    let again = Mesh::new(endpoint, config.clone());
    let joining = tokio::spawn({
        let (again, peers, addr) = (again.clone(), members[..2].to_vec(), members[2].addr);
        async move { again.join_live(addr, &peers, Duration::from_secs(20)).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // Its ask to join breaks their group (a member asking to enter is a new process).
    while groups.iter().any(|g| g.broken().is_none()) {
        assert!(
            std::time::Instant::now() < deadline,
            "it never asked to join"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The survivors had found worker/2 alive (its old process) and re-form with it.
    let everyone: Vec<NodeId> = members.iter().map(|m| m.node.clone()).collect();
    let started = std::time::Instant::now();
    let reformed = bounded(
        "re-forming",
        join_all(groups.iter().map(|g| g.reform(&everyone))),
    )
    .await;
    for (rank, result) in reformed.into_iter().enumerate() {
        let err = result.expect_err("worker/2's old process is gone");
        assert!(
            started.elapsed() < config.form_timeout / 2,
            "rank {rank} failed {:?} after it began: {err}",
            started.elapsed()
        );
    }
    // Probed again, it answers as a joiner: the survivors re-form without it, then admit it.
    let alive = bounded(
        "probe",
        join_all(groups.iter().map(|g| g.reachable(Duration::from_secs(2)))),
    )
    .await;
    let survivors = everyone[..2].to_vec();
    for view in alive {
        assert_eq!(view.unwrap(), survivors);
    }
    let reformed: Vec<ProcessGroup> = bounded(
        "re-forming without it",
        join_all(groups.iter().map(|g| g.reform(&survivors))),
    )
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let grown = admit_the_joiner(&reformed, joining).await;
    let one = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    for sum in join_all(grown.iter().map(|g| g.all_reduce(Reduction::Sum, &one))).await {
        assert_eq!(sum.unwrap().to_vec1::<f32>().unwrap(), vec![3.0; 4]);
    }
}

/// A link between a joiner and one member stays cut after the leader told the joiner its
/// admission: the leader forms the admission's generation (its links all up), the cut member and
/// the joiner do not. The cut member still gets the admission's group, broken, naming every
/// member of it, the joiner among them: re-forming measures its quorum on those members, as
/// the leader, which formed them, does from then on. Both then re-form together, counting the
/// joiner (still waiting, so a new process) as on no side. Before, the cut member got an
/// error, measured on its old group, and could go on alone beside the admission's generation (a
/// split brain the membership simulator found).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_admission_failed_to_form_measures_its_quorum_on_the_admissions_members() {
    let (groups, faults, (joiner, _), joining, joiners, _, members) =
        live_group_and_a_joiner().await;
    faults.partition(joiner, members[1].addr);
    let admitted = bounded(
        "admitting",
        join_all(groups.iter().map(|g| g.admit(&joiners))),
    )
    .await;
    let attempted: Vec<ProcessGroup> = admitted
        .into_iter()
        .map(|r| {
            r.expect("an admission's failed forming is no error")
                .expect("the leader told the joiner")
        })
        .collect();
    let everyone: Vec<NodeId> = (0..3).map(|i| NodeId::new("worker", i)).collect();
    for g in &attempted {
        assert_eq!(g.generation(), 2);
        assert_eq!(g.members(), &everyone[..]);
    }
    let cut = &attempted[1];
    assert!(
        cut.broken().is_some(),
        "the member cut off from the joiner formed the admission's generation"
    );
    // The leader's first call of the admission's generation fails: the others did not form it.
    let one = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    let leader = &attempted[0];
    assert!(
        bounded("the leader's call", leader.all_reduce(Reduction::Sum, &one))
            .await
            .is_err()
    );
    let within = Duration::from_secs(2);
    let probed = bounded(
        "probing",
        join_all(attempted.iter().take(2).map(|g| g.probe_members(within))),
    )
    .await;
    let survivors = &everyone[1..];
    for (rank, probed) in probed.into_iter().enumerate() {
        let probed = probed.unwrap();
        assert_eq!(probed.alive, survivors, "rank {rank}");
        assert!(!probed.joining.contains(&everyone[1]), "rank {rank}");
    }
    let reformed = bounded(
        "re-forming",
        join_all(attempted.iter().take(2).map(|g| g.reform(survivors))),
    )
    .await;
    for g in reformed {
        let g = g.expect("the two members re-form together");
        assert_eq!((g.generation(), g.members()), (3, survivors));
    }
    joining.abort();
}

/// A member that the later generations left out (worker/0, say paused: the others re-formed
/// without it), whose peer (worker/1) then died and came back, probes its old group. The
/// peer's new process heard, when it asked to enter, that a member (worker/2) was in a group
/// later than the prober's, one its old process may have been in: it answers as unsettled,
/// so that the prober counts it as a member that did not answer, not as a replaced one. The
/// group that left the prober out (worker/2, probing its own generation) does count it as
/// replaced. Before, both counted it out, and each could go on alone beside the other (a
/// split brain the membership simulator found).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_is_counted_out_only_by_probers_of_its_old_processs_latest_generation() {
    let config = GroupConfig::for_tests();
    let ca = ClusterCa::generate("replaced").unwrap();
    let (mut endpoints, mut meshes, members, mut groups) = three_formed(&ca, &config).await;
    // worker/1 and worker/2 re-form without worker/0.
    let later: Vec<NodeId> = members[1..].iter().map(|m| m.node.clone()).collect();
    let reformed = bounded(
        "re-forming without worker/0",
        join_all(groups[1..].iter().map(|g| g.reform(&later))),
    )
    .await;
    let mut reformed: Vec<ProcessGroup> = reformed.into_iter().map(Result::unwrap).collect();
    assert!(reformed.iter().all(|g| g.generation() == 2));
    // worker/1's process dies; a new one binds its address and asks to enter.
    let old = (reformed.remove(0), groups.remove(1), meshes.remove(1));
    let old_endpoint = endpoints.remove(1);
    old_endpoint.close();
    drop((old, old_endpoint));
    let (stale, left_out_by) = (groups.remove(0), reformed.remove(0));
    let addr = members[1].addr;
    let again = Mesh::new(rebind_worker(&ca, 1, addr).await, config.clone());
    let joining = tokio::spawn({
        let (again, peers) = (again.clone(), members.clone());
        async move { again.join_live(addr, &peers, Duration::from_secs(30)).await }
    });
    let restarted = NodeId::new("worker", 1);
    // The group of the later generation counts the new process out once it heard every peer.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let probed = bounded(
            "probing generation 2",
            left_out_by.probe_members(Duration::from_secs(2)),
        )
        .await
        .unwrap();
        if probed.joining == [restarted.clone()] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the group of generation 2 never counted worker/1's new process out: {probed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The member left out does not.
    let probed = bounded(
        "probing generation 1",
        stale.probe_members(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    assert!(
        !probed.joining.contains(&restarted) && !probed.alive.contains(&restarted),
        "the member left out counted worker/1's new process out: {probed:?}"
    );
    joining.abort();
}

//! Decoders never panic (SEC-1): for every message and reply type of parameter-server training
//! (`cohort::roles::protocol`) and the gateway's own headers (`cohort_actors::wire`), property
//! tests feed the decoder what a peer could send, through the same bounded codec the gateway
//! uses:
//!
//! - a valid value round-trips (decode of its encoding re-encodes to the same bytes);
//! - a valid encoding cut short is an `Err` (never a value, never a panic);
//! - a valid encoding with bytes appended is an `Err` (trailing bytes are refused);
//! - a valid encoding with one bit flipped, and random bytes, decode to an `Err` or to a value
//!   that is itself stable under re-encoding, never a panic and never an allocation past the
//!   limit (a length prefix claiming gigabytes fails on the limit).
//!
//! Case counts are bounded so that the file runs in a few seconds.

use std::fmt::Debug;

use bincode::{Decode, Encode};
use cohort::layout::{Dtype, Layout, Shard};
use cohort::optim::OptimError;
use cohort::roles::coordinator::ClosureId;
use cohort::roles::protocol::{
    BeginRestore, BlobError, CreateVariable, DatasetPositions, DrainRefusal, Draining, Element,
    FenceWorker, FinishedBelow, InitProblem, InitSpec, JoinRefusal, Joining, LearningRate,
    LeaveAnswer, Leaving, PositionsError, PsRefusal, PsStats, PsStatsReply, PsUnavailable, Pull,
    PullRows, Push, PushOrigin, PushOutcome, RestoreVariable, Retire, RewindWorker, RollBack,
    RunClosure, RunClosureError, SetupError, SetupWorker, ShardState, Shutdown, Snapshot,
    WireGradient, WorkerRefusal,
};
use cohort::roles::ps::PsError;
use cohort_actors::wire::{Envelope, WireMsg, WireReply};
use cohort_actors::{Incarnation, IncarnationId, RefusedReason};
use cohort_transport::{codec, NodeId};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

/// The decode limit: large enough for every generated value, small next to what a forged
/// length prefix claims.
const LIMIT: usize = 1 << 20;
/// Cases per type and property.
const CASES: u32 = 256;

/// Checks every property for one valid `value`, using `noise` as random input, `cut` and
/// `bit` to pick where to truncate and which bit to flip, and `extra` as trailing bytes.
fn check<T: Encode + Decode<()> + Debug>(
    value: &T,
    noise: &[u8],
    cut: Index,
    bit: Index,
    extra: &[u8],
) -> Result<(), TestCaseError> {
    let bytes = codec::encode(value, LIMIT).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back: T = codec::decode(&bytes, LIMIT)
        .map_err(|e| TestCaseError::fail(format!("{value:?} does not decode: {e}")))?;
    prop_assert_eq!(&codec::encode(&back, LIMIT).unwrap()[..], &bytes[..]);

    if !bytes.is_empty() {
        let short = &bytes[..cut.index(bytes.len())];
        let decoded = codec::decode::<T>(short, LIMIT);
        prop_assert!(
            decoded.is_err(),
            "a cut-short encoding decoded: {:?}",
            decoded
        );

        let mut flipped = bytes.to_vec();
        let at = bit.index(flipped.len() * 8);
        flipped[at / 8] ^= 1 << (at % 8);
        stable_if_decoded::<T>(&flipped)?;
    }

    let mut longer = bytes.to_vec();
    longer.extend_from_slice(extra);
    let decoded = codec::decode::<T>(&longer, LIMIT);
    prop_assert!(
        decoded.is_err(),
        "trailing bytes were accepted: {:?}",
        decoded
    );

    stable_if_decoded::<T>(noise)?;
    // Random bytes behind a valid prefix reach deeper into the decoder than noise alone.
    let mut tail = bytes[..cut.index(bytes.len().max(1)).min(bytes.len())].to_vec();
    tail.extend_from_slice(noise);
    stable_if_decoded::<T>(&tail)
}

/// Whatever `bytes` are, decoding gives an `Err` or a value whose encoding decodes to the same
/// encoding again.
fn stable_if_decoded<T: Encode + Decode<()> + Debug>(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(value) = codec::decode::<T>(bytes, LIMIT) {
        let again = codec::encode(&value, LIMIT).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let twice: T = codec::decode(&again, LIMIT).map_err(|e| {
            TestCaseError::fail(format!("{value:?} re-encoded does not decode: {e}"))
        })?;
        prop_assert_eq!(&codec::encode(&twice, LIMIT).unwrap()[..], &again[..]);
    }
    Ok(())
}

/// Properties for each listed type, each from its strategy of valid values.
macro_rules! decode_props {
    ($($name:ident: $ty:ty = $strategy:expr;)*) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]
            $(
                #[test]
                fn $name(
                    value in $strategy,
                    noise in vec(any::<u8>(), 0..96),
                    cut in any::<Index>(),
                    bit in any::<Index>(),
                    extra in vec(any::<u8>(), 1..9),
                ) {
                    check::<$ty>(&value, &noise, cut, bit, &extra)?;
                }
            )*
        }
    };
}

// ---- strategies of valid values ----

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_./-]{0,16}",
        ".{0,8}", // any Unicode
    ]
}

/// Finite floats: a NaN compares unequal to itself, and round trips compare encodings anyway.
fn float() -> impl Strategy<Value = f32> {
    -1.0e6f32..1.0e6f32
}

fn init_spec() -> impl Strategy<Value = InitSpec> {
    prop_oneof![
        Just(InitSpec::Zeros),
        float().prop_map(InitSpec::Constant),
        (float(), float(), any::<u64>()).prop_map(|(min, max, seed)| InitSpec::Uniform {
            min,
            max,
            seed
        }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(seed, fan_in, fan_out)| {
            InitSpec::GlorotUniform {
                seed,
                fan_in,
                fan_out,
            }
        }),
        vec(any::<u8>(), 0..32).prop_map(InitSpec::Values),
    ]
}

fn shape() -> impl Strategy<Value = Vec<u64>> {
    vec(any::<u64>(), 0..4)
}

fn learning_rate() -> impl Strategy<Value = Option<LearningRate>> {
    proptest::option::of(float()).prop_map(|rate| rate.and_then(LearningRate::new))
}

fn wire_gradient() -> impl Strategy<Value = WireGradient> {
    prop_oneof![Just(WireGradient::Dense), Just(WireGradient::Rows)]
}

fn push_outcome() -> impl Strategy<Value = PushOutcome> {
    prop_oneof![
        Just(PushOutcome::Applied),
        Just(PushOutcome::Duplicate),
        Just(PushOutcome::Stale),
        Just(PushOutcome::SkippedNonFinite),
    ]
}

fn shard_state() -> impl Strategy<Value = ShardState> {
    (shape(), vec(text(), 0..3), any::<u64>()).prop_map(|(shape, slots, steps)| ShardState {
        shape,
        slots,
        steps,
    })
}

fn ps_stats_reply() -> impl Strategy<Value = PsStatsReply> {
    (vec(any::<u64>(), 10), any::<bool>(), any::<bool>()).prop_map(|(n, serving, restoring)| {
        PsStatsReply {
            applied: n[0],
            rejected_duplicate: n[1],
            rejected_stale: n[2],
            skipped_non_finite: n[3],
            rejected_invalid: n[4],
            next_free_closure_id: n[5],
            applied_ids_held: n[6],
            finished_below: n[7],
            serving,
            generation: n[8],
            restoring,
            rejected_old_generation: n[9],
        }
    })
}

fn worker_refusal() -> impl Strategy<Value = WorkerRefusal> {
    prop_oneof![
        any::<u32>().prop_map(|queued| WorkerRefusal::Busy { queued }),
        Just(WorkerRefusal::ComputeStopped),
        Just(WorkerRefusal::JobDropped),
        Just(WorkerRefusal::NotSetUp),
        Just(WorkerRefusal::Retired),
        (any::<u64>(), any::<u64>())
            .prop_map(|(chief, current)| WorkerRefusal::FromOldChief { chief, current }),
        (any::<u64>(), any::<u64>()).prop_map(|(generation, current)| {
            WorkerRefusal::FromOldGeneration {
                generation,
                current,
            }
        }),
    ]
}

fn setup_error() -> impl Strategy<Value = SetupError> {
    prop_oneof![
        text().prop_map(SetupError::Layouts),
        (any::<u64>(), any::<u64>())
            .prop_map(|(version, taken)| SetupError::Outdated { version, taken }),
        (text(), any::<u64>(), any::<u64>())
            .prop_map(|(dataset, skip, max)| SetupError::SkipTooFar { dataset, skip, max }),
        text().prop_map(SetupError::UnknownDataset),
        (text(), text()).prop_map(|(dataset, reason)| SetupError::Build { dataset, reason }),
        (text(), any::<u64>(), text()).prop_map(|(dataset, skip, reason)| SetupError::Resume {
            dataset,
            skip,
            reason
        }),
        worker_refusal().prop_map(SetupError::Refused),
    ]
}

fn run_closure_error() -> impl Strategy<Value = RunClosureError> {
    prop_oneof![
        text().prop_map(RunClosureError::Step),
        worker_refusal().prop_map(RunClosureError::Refused),
        (any::<u32>(), text())
            .prop_map(|(ps, reason)| RunClosureError::PsUnavailable(PsUnavailable { ps, reason })),
    ]
}

fn dtype() -> impl Strategy<Value = Dtype> {
    prop_oneof![
        Just(Dtype::F32),
        Just(Dtype::F64),
        Just(Dtype::I64),
        Just(Dtype::Bool),
        Just(Dtype::BF16),
    ]
}

/// Any layout the encoder can carry (valid or not: the decoder must not care, the worker
/// validates).
fn layout() -> impl Strategy<Value = Layout> {
    (
        text(),
        dtype(),
        vec(any::<usize>(), 0..3),
        vec((any::<u32>(), any::<usize>(), any::<usize>()), 0..3),
    )
        .prop_map(|(name, dtype, shape, shards)| Layout {
            name,
            dtype,
            shape,
            shards: shards
                .into_iter()
                .map(|(ps, start, end)| Shard {
                    ps,
                    rows: start..end,
                })
                .collect(),
        })
}

fn setup_worker() -> impl Strategy<Value = SetupWorker> {
    (
        any::<u32>(),
        vec(layout(), 0..3),
        vec((text(), any::<u64>()), 0..3),
        any::<u64>(),
        vec((any::<u32>(), text()), 0..3),
        any::<u64>(),
    )
        .prop_map(
            |(num_workers, layouts, datasets, version, servers, generation)| SetupWorker {
                num_workers,
                layouts,
                servers,
                datasets,
                version,
                generation,
            },
        )
}

fn optim_error() -> impl Strategy<Value = OptimError> {
    prop_oneof![
        (text(), any::<usize>(), any::<usize>()).prop_map(|(variable, expected, got)| {
            OptimError::GradientLength {
                variable,
                expected,
                got,
            }
        }),
        (text(), any::<u64>(), any::<usize>()).prop_map(|(variable, row, rows)| {
            OptimError::RowOutOfRange {
                variable,
                row,
                rows,
            }
        }),
        (text(), any::<usize>(), float()).prop_map(|(variable, index, value)| {
            OptimError::NonFinite {
                variable,
                index,
                value,
            }
        }),
        (text(), float(), text()).prop_map(|(name, value, reason)| {
            OptimError::Hyperparameter {
                name,
                value,
                reason,
            }
        }),
        (text(), text()).prop_map(|(variable, slot)| OptimError::MissingSlot { variable, slot }),
    ]
}

fn ps_error() -> impl Strategy<Value = PsError> {
    let dims = || vec(any::<usize>(), 0..3);
    prop_oneof![
        text().prop_map(PsError::UnknownVariable),
        (text(), dims(), any::<usize>(), any::<usize>()).prop_map(
            |(name, shape, expected, got)| PsError::InitialValueLength {
                name,
                shape,
                expected,
                got,
            }
        ),
        (text(), any::<u64>(), any::<usize>())
            .prop_map(|(name, row, rows)| PsError::RowOutOfRange { name, row, rows }),
        text().prop_map(|name| PsError::NotRestoring { name }),
        optim_error().prop_map(PsError::Optim),
    ]
}

fn blob_error() -> impl Strategy<Value = BlobError> {
    let element = || prop_oneof![Just(Element::F32), Just(Element::U64)];
    prop_oneof![
        (text(), any::<u64>(), any::<u64>()).prop_map(|(what, index, carried)| {
            BlobError::Missing {
                what,
                index,
                carried,
            }
        }),
        (text(), any::<u64>(), element()).prop_map(|(what, bytes, element)| BlobError::Ragged {
            what,
            bytes,
            element
        }),
        (text(), any::<u64>(), any::<u64>(), element()).prop_map(
            |(what, bytes, expected, element)| BlobError::Length {
                what,
                bytes,
                expected,
                element,
            }
        ),
    ]
}

fn ps_refusal() -> impl Strategy<Value = PsRefusal> {
    let problem = prop_oneof![
        float().prop_map(InitProblem::NonFiniteConstant),
        (float(), float()).prop_map(|(min, max)| InitProblem::BadUniformRange { min, max }),
        text().prop_map(InitProblem::Draw),
    ];
    prop_oneof![
        ps_error().prop_map(PsRefusal::Store),
        blob_error().prop_map(PsRefusal::Blob),
        (shape(), any::<u64>()).prop_map(|(shape, elements_max)| PsRefusal::ShapeTooLarge {
            shape,
            elements_max
        }),
        (text(), problem).prop_map(|(name, problem)| PsRefusal::Initializer { name, problem }),
        (any::<u64>(), any::<u64>()).prop_map(|(got, max)| PsRefusal::TooManyNames { got, max }),
        (any::<u32>(), any::<u64>(), text(), any::<u64>()).prop_map(
            |(worker, incarnation, from, from_incarnation)| PsRefusal::NotTheSender {
                worker,
                incarnation,
                from,
                from_incarnation,
            }
        ),
    ]
}

fn refusal_result<T: Debug>(
    ok: impl Strategy<Value = T>,
) -> impl Strategy<Value = Result<T, PsRefusal>> {
    prop_oneof![ok.prop_map(Ok), ps_refusal().prop_map(Err)]
}

fn incarnation() -> impl Strategy<Value = Incarnation<NodeId>> {
    ("[a-z][a-z0-9-]{0,8}", any::<u32>(), any::<u64>()).prop_map(|(role, index, incarnation)| {
        Incarnation::new(NodeId::new(role, index), IncarnationId(incarnation))
    })
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (incarnation(), any::<u64>(), text(), text(), any::<u64>()).prop_map(
        |(from, to_incarnation, actor, tag, reply_within_ms)| Envelope {
            from,
            to_incarnation: IncarnationId(to_incarnation),
            actor,
            tag,
            reply_within_ms,
        },
    )
}

fn refused_reason() -> impl Strategy<Value = RefusedReason> {
    prop_oneof![
        text().prop_map(RefusedReason::NoSuchActor),
        (text(), text()).prop_map(|(actor, tag)| RefusedReason::UnknownMessage { actor, tag }),
        text().prop_map(RefusedReason::NotAuthenticated),
        text().prop_map(RefusedReason::BadMessage),
        text().prop_map(RefusedReason::ActorUnavailable),
        Just(RefusedReason::TooManyPeers),
        (text(), text()).prop_map(|(tag, role)| RefusedReason::SenderNotAllowed { tag, role }),
    ]
}

fn wire_msg() -> impl Strategy<Value = WireMsg> {
    prop_oneof![
        incarnation().prop_map(|from| WireMsg::Hello { from }),
        incarnation().prop_map(|from| WireMsg::Heartbeat { from }),
        envelope().prop_map(WireMsg::Call),
        envelope().prop_map(WireMsg::Tell),
    ]
}

fn wire_reply() -> impl Strategy<Value = WireReply> {
    prop_oneof![
        incarnation().prop_map(|me| WireReply::Hello { me }),
        Just(WireReply::Reply),
        refused_reason().prop_map(WireReply::Refused),
        text().prop_map(WireReply::Stale),
        (any::<u64>(), text()).prop_map(|(known, reason)| WireReply::Outdated {
            known: IncarnationId(known),
            reason
        }),
    ]
}

decode_props! {
    // Messages.
    create_variable: CreateVariable = (text(), shape(), init_spec())
        .prop_map(|(name, shape, init)| CreateVariable { name, shape, init });
    restore_variable: RestoreVariable = (text(), shape(), vec(text(), 0..3), any::<u64>())
        .prop_map(|(name, shape, slots, steps)| RestoreVariable { name, shape, slots, steps });
    pull: Pull = vec(text(), 0..4).prop_map(|names| Pull { names });
    pull_rows: PullRows = text().prop_map(|name| PullRows { name });
    push: Push = (
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u64>(),
        vec((text(), wire_gradient()), 0..4),
        learning_rate(),
    )
        .prop_map(|(worker, incarnation, closure, attempt, generation, gradients, learning_rate)| Push {
            origin: PushOrigin {
                worker,
                incarnation,
                closure: ClosureId(closure),
                attempt,
                part: attempt.wrapping_mul(3),
                generation,
                learning_rate,
                server: incarnation.rotate_left(7),
            },
            gradients,
        });
    fence_worker: FenceWorker = (any::<u32>(), any::<u64>())
        .prop_map(|(worker, incarnation)| FenceWorker { worker, incarnation });
    finished_below: FinishedBelow = (any::<u64>(), any::<u64>())
        .prop_map(|(closure, generation)| FinishedBelow { closure, generation });
    snapshot: Snapshot = text().prop_map(|name| Snapshot { name });
    ps_stats: PsStats = Just(PsStats);
    run_closure: RunClosure = (any::<u64>(), any::<u32>(), any::<u64>(), text(), vec(any::<u8>(), 0..32), vec(any::<u64>(), 0..4), learning_rate())
        .prop_map(|(closure, attempt, generation, function, args, servers, learning_rate)| RunClosure {
            closure,
            attempt,
            generation,
            function,
            args,
            servers,
            learning_rate,
        });
    retire: Retire = any::<u64>().prop_map(|incarnation| Retire { incarnation });
    shutdown: Shutdown = Just(Shutdown);
    leaving: Leaving = any::<u64>().prop_map(|incarnation| Leaving { incarnation });
    joining: Joining = (any::<u64>(), text()).prop_map(|(incarnation, addr)| Joining { incarnation, addr });
    draining: Draining = any::<u64>().prop_map(|incarnation| Draining { incarnation });
    setup: SetupWorker = setup_worker();
    layout_value: Layout = layout();
    dataset_positions: DatasetPositions = Just(DatasetPositions);
    begin_restore: BeginRestore =
        (any::<u64>(), vec((any::<u32>(), any::<u64>()), 0..4), any::<bool>())
            .prop_map(|(generation, fences, afresh)| BeginRestore { generation, fences, afresh });
    roll_back: RollBack = (any::<u64>(), any::<u64>())
        .prop_map(|(finished_below, generation)| RollBack { finished_below, generation });
    rewind: RewindWorker = setup_worker().prop_map(|setup| RewindWorker { setup });

    // Replies.
    unit_or_refusal: Result<(), PsRefusal> = refusal_result(Just(()));
    push_result: Result<PushOutcome, PsRefusal> = refusal_result(push_outcome());
    shard_state_result: Result<ShardState, PsRefusal> = refusal_result(shard_state());
    ps_stats_reply_value: PsStatsReply = ps_stats_reply();
    leave_answer: LeaveAnswer = prop_oneof![Just(LeaveAnswer::Go), Just(LeaveAnswer::Stay)];
    join_result: Result<(), JoinRefusal> = prop_oneof![
        Just(Ok(())),
        (any::<u32>(), any::<u32>())
            .prop_map(|(worker, workers_max)| Err(JoinRefusal::BeyondMax { worker, workers_max })),
        (text(), text()).prop_map(|(task, addr)| Err(JoinRefusal::BadAddress { task, addr })),
        (any::<u32>(), any::<u32>())
            .prop_map(|(ps, servers_max)| Err(JoinRefusal::PsBeyondMax { ps, servers_max })),
        any::<u32>().prop_map(|ps| Err(JoinRefusal::PsNoCheckpointDir { ps })),
    ];
    drain_result: Result<(), DrainRefusal> = prop_oneof![
        Just(Ok(())),
        any::<u32>().prop_map(|ps| Err(DrainRefusal::LastServer { ps })),
        any::<u32>().prop_map(|ps| Err(DrainRefusal::NoCheckpointDir { ps })),
        (any::<u32>(), text()).prop_map(|(ps, reason)| Err(DrainRefusal::Failed { ps, reason })),
    ];
    run_closure_result: Result<Vec<u8>, RunClosureError> = prop_oneof![
        vec(any::<u8>(), 0..32).prop_map(Ok),
        run_closure_error().prop_map(Err),
    ];
    setup_result: Result<(), SetupError> = prop_oneof![Just(Ok(())), setup_error().prop_map(Err)];
    positions_result: Result<Vec<(String, u64)>, PositionsError> = prop_oneof![
        vec((text(), any::<u64>()), 0..4).prop_map(Ok),
        worker_refusal().prop_map(|r| Err(PositionsError::Refused(r))),
    ];

    // The gateway's own headers.
    gateway_wire_msg: WireMsg = wire_msg();
    gateway_envelope: Envelope = envelope();
    gateway_wire_reply: WireReply = wire_reply();
    gateway_refused_reason: RefusedReason = refused_reason();
}

/// A length prefix that claims far more than the input holds fails on the limit, at once,
/// for every type that holds a length-prefixed field (SEC-1: no allocation beyond the limits).
#[test]
fn a_forged_length_prefix_is_an_error_not_an_allocation() {
    // bincode's varint for u64::MAX: the marker 253 and eight bytes.
    let mut huge = vec![253u8];
    huge.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(codec::decode::<Pull>(&huge, LIMIT).is_err());
    assert!(codec::decode::<PullRows>(&huge, LIMIT).is_err());
    assert!(codec::decode::<Snapshot>(&huge, LIMIT).is_err());
    assert!(codec::decode::<Result<Vec<u8>, RunClosureError>>(
        &[[0u8].as_slice(), &huge].concat(),
        LIMIT
    )
    .is_err());
    // A Call header whose actor name claims 2^64 - 1 bytes.
    let from = codec::encode(
        &Incarnation::new(NodeId::new("worker", 0), IncarnationId(1)),
        LIMIT,
    )
    .unwrap();
    let forged = [&[2u8][..], &from, &[1u8], &huge].concat();
    assert!(codec::decode::<WireMsg>(&forged, LIMIT).is_err());
}

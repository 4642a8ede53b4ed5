//! The one error type of every collective: the in-process group's rounds and the process
//! group's operations over the transport. A process group's variants name the member and the
//! membership generation, so that a caller can re-form the group without the member that failed.

use cohort_transport::NodeId;

/// Why a collective call failed.
/// Carried between members (a failure seen by one is reported to all), hence Encode/Decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, bincode::Encode, bincode::Decode)]
pub enum CollectiveError {
    /// A round did not gather every member within the group's timeout.
    #[error("collective round {round} timed out after {timeout_ms} ms waiting for replica(s) {missing:?}")]
    Timeout {
        /// The round (0-based count of collective calls) that timed out.
        round: u64,
        /// The group's timeout.
        timeout_ms: u64,
        /// The ranks that had not arrived.
        missing: Vec<usize>,
    },
    /// A peer finished its step without joining this round, so the round can never complete.
    #[error("collective round {round} cannot complete: replica {rank} left the step after {calls} collective call(s)")]
    PeerLeft {
        /// The round that cannot complete.
        round: u64,
        /// The member that left.
        rank: usize,
        /// How many collective calls that member made before leaving.
        calls: u64,
    },
    /// Members of one round asked for different operations.
    #[error("collective round {round}: replicas disagree on the operation ({first} vs {other})")]
    OpMismatch {
        /// The round.
        round: u64,
        /// The first operation seen in the round.
        first: String,
        /// A different operation asked for by another member.
        other: String,
    },
    /// Members of one round contributed tensors of different shapes or dtypes.
    #[error("collective round {round}: replica {rank} contributed {got}, expected {expected}")]
    TensorMismatch {
        /// The round.
        round: u64,
        /// The member whose tensor differs from replica 0's.
        rank: usize,
        /// Replica 0's shape and dtype.
        expected: String,
        /// This member's shape and dtype.
        got: String,
    },
    /// The member already left the group and cannot take part in more rounds.
    #[error("replica {rank} already left this step's collective group")]
    AlreadyLeft {
        /// The member.
        rank: usize,
    },
    /// A member of a process group was lost (its connection closed, or went silent past the
    /// transport's idle timeout, the detection budget): every pending and later operation of
    /// this group fails; re-form the group with the survivors at a new generation.
    #[error("collective group generation {generation}: member {node} lost ({reason})")]
    MemberLost {
        /// The member that was lost.
        node: NodeId,
        /// The group's membership generation.
        generation: u64,
        /// What the transport saw.
        reason: String,
    },
    /// A member refused a message of this group's generation: it belongs to another generation (the
    /// survivors re-formed without us, or we are at a later generation than the sender). EPOCH-1.
    #[error("collective group generation {generation}: {node} refused our message, it is at generation {current}{detail}")]
    GenerationRefused {
        /// The member that refused.
        node: NodeId,
        /// The generation of the refused message (ours).
        generation: u64,
        /// The refusing member's generation.
        current: u64,
        /// Why, when the generations are equal (the group of that generation has other members).
        detail: String,
    },
    /// This group was replaced by one of a later generation in the same process.
    #[error("collective group generation {generation} was superseded by generation {current}")]
    Superseded {
        /// This group's generation.
        generation: u64,
        /// The generation that replaced it.
        current: u64,
    },
    /// Members of a process group called different operations, or with tensors of different
    /// shapes or dtypes, as their `seq`-th call. Every member gets this error.
    #[error("collective call {seq}: {calls}")]
    Mismatch {
        /// The call (0-based count of this group's operations).
        seq: u64,
        /// The member whose call differs from that of the member that found it.
        node: NodeId,
        /// What each of the two called, in words (both named).
        calls: String,
    },
    /// A member's message of the current operation did not arrive within the group's
    /// operation timeout, though its connection lives (a member that does not call the
    /// operation at all).
    #[error(
        "collective group generation {generation}, call {seq}: nothing from {node} within {timeout_ms} ms"
    )]
    PeerTimeout {
        /// The group's membership generation.
        generation: u64,
        /// The call.
        seq: u64,
        /// The member waited for.
        node: NodeId,
        /// The group's operation timeout.
        timeout_ms: u64,
    },
    /// A member's step failed in the application (its replica function returned an error or
    /// panicked): the member aborted the group so that every member's pending and later call
    /// fails at once with its message, instead of waiting for it until the operation timeout.
    /// Not a lost member: re-forming does not recover from it.
    #[error("collective group generation {generation}: the step failed on {node}: {message}")]
    Application {
        /// The member whose step failed.
        node: NodeId,
        /// The group's membership generation.
        generation: u64,
        /// The application's error, in words.
        message: String,
    },
    /// A link to a member failed other than by loss (a refused or malformed message).
    #[error("collective group generation {generation}: link to {node} failed: {reason}")]
    Link {
        /// The member.
        node: NodeId,
        /// The group's membership generation.
        generation: u64,
        /// What failed.
        reason: String,
    },
    /// The group could not be formed (bad membership, a member unreachable within the
    /// formation timeout, a generation not above the one already formed here).
    #[error("collective group generation {generation}: cannot form: {reason}")]
    Form {
        /// The generation being formed.
        generation: u64,
        /// What was wrong.
        reason: String,
    },
    /// A call's arguments are invalid (a root outside the group, a bucket limit of zero).
    #[error("collective call: {0}")]
    InvalidArgument(String),
    /// The tensor's dtype cannot be carried by a process group.
    #[error("collective: dtype {dtype} is not supported (U8, U32, I16, I32, I64, BF16, F16, F32, F64 are)")]
    UnsupportedDType {
        /// The dtype.
        dtype: String,
    },
    /// The reduction itself failed in the tensor library.
    #[error("collective reduction failed: {0}")]
    Tensor(String),
    /// This member stopped before the call ended: its endpoint was closed, the runtime
    /// driving the group stopped (its owner is shutting down), or a call of this group was
    /// given up before it ended (its future dropped, as by a timeout around it). A peer told
    /// so takes this member for lost; a group of a new generation takes it back.
    #[error("collective group generation {generation}: this member stopped before the call ended")]
    Stopped {
        /// The group's membership generation.
        generation: u64,
    },
    /// The group's NCCL communicator failed without naming a member (NCCL's own wait timed
    /// out, or it reported a remote error) while every member still answered a probe: the
    /// group's links stand, the communicator does not. Re-forming makes a new one.
    #[error(
        "collective group generation {generation}: the NCCL communicator failed on {node}: {reason}"
    )]
    Communicator {
        /// The member whose call saw it.
        node: NodeId,
        /// The group's membership generation.
        generation: u64,
        /// NCCL's error.
        reason: String,
    },
}

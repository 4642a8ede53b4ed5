//! Typed steps: a [`Step<A, R>`] names a registered step function once, with the type of its
//! argument `A` and of its value `R`. The program registers the function under the handle
//! ([`crate::program::Program::step`]); the chief schedules it by the same handle
//! ([`crate::program::ClusterCoordinator::schedule`]) and fetches an `R`. Code never travels:
//! the handle is a name both sides agree on because they are the same program, and only the
//! argument and the value cross the network, encoded here (bincode over serde).
//!
//! Per-worker datasets get the same kind of handle ([`WorkerData<T>`]): a registered name and
//! the type a step reads each element as.
//!
//! This module owns the handles and the encoding; the registry keeps the functions and the
//! coordinator the closures.
//!
//! ```
//! use cohort::program::Step;
//!
//! // A step taking a learning-rate scale and returning the loss it computed.
//! static TRAIN: Step<f32, f64> = Step::new("train");
//! assert_eq!(TRAIN.name(), "train");
//! ```

use std::fmt;
use std::marker::PhantomData;

use candle_core::Tensor;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::data::{DataError, Dataset, Element, InputContext};

/// Builds a worker's dataset for its input pipeline.
pub type DatasetFn =
    std::sync::Arc<dyn Fn(&InputContext) -> Result<Dataset, DataError> + Send + Sync>;

/// A step function's handle: its registered name, with the type of its argument `A` and of
/// its value `R` (any serde types). Declare it once, as a `static` or `const` both the
/// registration and the scheduling use.
pub struct Step<A, R> {
    name: &'static str,
    // `fn(A) -> R`: the handle owns neither, and is `Send`/`Sync`/`Copy` whatever they are.
    types: PhantomData<fn(A) -> R>,
}

impl<A, R> Step<A, R> {
    /// The handle of the step registered as `name`.
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            types: PhantomData,
        }
    }

    /// The name the step is registered and scheduled by.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<A, R> Clone for Step<A, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A, R> Copy for Step<A, R> {}

impl<A, R> fmt::Debug for Step<A, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Step<{}, {}>({:?})",
            std::any::type_name::<A>(),
            std::any::type_name::<R>(),
            self.name
        )
    }
}

/// A per-worker dataset's handle: the name its function is registered under
/// ([`crate::program::Program::dataset`]), created on the workers by
/// ([`crate::program::ClusterCoordinator::create_per_worker_dataset`]) and read by
/// ([`crate::program::StepContext::next`]), with the type `T` a step reads each element as
/// (a tensor, a tuple of tensors, or the element's tensors as they are: [`FromElement`]).
/// Declare it once, as a `static` that the registration, the chief and the steps use.
///
/// ```
/// use cohort::candle::Tensor;
/// use cohort::program::WorkerData;
///
/// // Batches of features and labels.
/// static TRAIN: WorkerData<(Tensor, Tensor)> = WorkerData::new("train");
/// assert_eq!(TRAIN.name(), "train");
/// ```
pub struct WorkerData<T> {
    name: &'static str,
    types: PhantomData<fn() -> T>,
}

impl<T> WorkerData<T> {
    /// The handle of the dataset function registered as `name`.
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            types: PhantomData,
        }
    }

    /// The name the dataset function is registered and read by.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<T> Clone for WorkerData<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for WorkerData<T> {}

impl<T> fmt::Debug for WorkerData<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "WorkerData<{}>({:?})",
            std::any::type_name::<T>(),
            self.name
        )
    }
}

/// Why a per-worker dataset's element is not what a typed handle reads it as.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElementError {
    /// The element holds another number of tensors than the handle's type.
    #[error("the element holds {got} tensor(s), the handle reads {reads}")]
    Tensors {
        /// Tensors in the element.
        got: usize,
        /// Tensors the handle's type holds.
        reads: usize,
    },
}

/// What a per-worker dataset's element (its tensors, in the order the dataset gives them)
/// becomes when a step reads it through a [`WorkerData`] handle. An element of another
/// structure is refused, saying what it holds.
pub trait FromElement: Sized {
    /// The element as `Self`, or why it is not one.
    fn from_element(element: Element) -> Result<Self, ElementError>;
}

impl FromElement for Element {
    fn from_element(element: Element) -> Result<Self, ElementError> {
        Ok(element)
    }
}

/// The element's tensors, `N` of them, or why not.
fn exactly<const N: usize>(element: Element) -> Result<[Tensor; N], ElementError> {
    let got = element.len();
    <[Tensor; N]>::try_from(element).map_err(|_| ElementError::Tensors { got, reads: N })
}

impl FromElement for Tensor {
    fn from_element(element: Element) -> Result<Self, ElementError> {
        let [t] = exactly::<1>(element)?;
        Ok(t)
    }
}

impl FromElement for (Tensor, Tensor) {
    fn from_element(element: Element) -> Result<Self, ElementError> {
        let [a, b] = exactly::<2>(element)?;
        Ok((a, b))
    }
}

impl FromElement for (Tensor, Tensor, Tensor) {
    fn from_element(element: Element) -> Result<Self, ElementError> {
        let [a, b, c] = exactly::<3>(element)?;
        Ok((a, b, c))
    }
}

/// What names a per-worker dataset where it is registered, created and read: its name (a read
/// gives the element's tensors as they are) or a typed [`WorkerData`] handle (a read gives the
/// element as its type).
pub trait DatasetHandle {
    /// What a read gives.
    type Element;
    /// The registered name.
    fn dataset_name(&self) -> &str;
    /// The element read, as [`DatasetHandle::Element`].
    fn element(&self, element: Element) -> Result<Self::Element, ElementError>;
}

impl DatasetHandle for &str {
    type Element = Element;
    fn dataset_name(&self) -> &str {
        self
    }
    fn element(&self, element: Element) -> Result<Element, ElementError> {
        Ok(element)
    }
}

impl DatasetHandle for &String {
    type Element = Element;
    fn dataset_name(&self) -> &str {
        self
    }
    fn element(&self, element: Element) -> Result<Element, ElementError> {
        Ok(element)
    }
}

impl<T: FromElement> DatasetHandle for &WorkerData<T> {
    type Element = T;
    fn dataset_name(&self) -> &str {
        self.name
    }
    fn element(&self, element: Element) -> Result<T, ElementError> {
        T::from_element(element)
    }
}

/// The most a decoded argument or value may claim to hold: a corrupt length is refused before
/// anything is allocated for it.
const DECODED_MAX: usize = 1 << 30;

/// The encoding of steps' arguments and values on the wire.
fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODED_MAX>()
}

/// Why a step's argument or value could not cross the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueCodecError {
    /// The value could not be encoded (a serde `Serialize` error).
    #[error("encoding a {type_name}: {reason}")]
    Encode {
        /// The value's type.
        type_name: &'static str,
        /// The encoder's error.
        reason: String,
    },
    /// The bytes are no value of the expected type.
    #[error("{reason} (expected a {expected})")]
    Decode {
        /// The type the bytes were read as.
        expected: &'static str,
        /// The decoder's error.
        reason: String,
    },
    /// The bytes hold more than one value of the expected type: the two sides disagree on
    /// the type.
    #[error("{left_over} bytes left over after a {expected} ({read} bytes): the value is of another type")]
    LeftOver {
        /// The type the bytes were read as.
        expected: &'static str,
        /// Bytes that value took.
        read: usize,
        /// Bytes after it.
        left_over: usize,
    },
}

/// `value` encoded for the wire.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, ValueCodecError> {
    bincode::serde::encode_to_vec(value, config()).map_err(|e| ValueCodecError::Encode {
        type_name: std::any::type_name::<T>(),
        reason: e.to_string(),
    })
}

/// A `T` decoded from `bytes`, which must hold exactly one (trailing bytes mean the two sides
/// disagree on the type, and are refused rather than ignored).
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ValueCodecError> {
    let expected = std::any::type_name::<T>();
    let (value, read) =
        bincode::serde::decode_from_slice::<T, _>(bytes, config()).map_err(|e| {
            ValueCodecError::Decode {
                expected,
                reason: e.to_string(),
            }
        })?;
    if read != bytes.len() {
        return Err(ValueCodecError::LeftOver {
            expected,
            read,
            left_over: bytes.len() - read,
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Batch {
        ids: Vec<u64>,
        scale: f32,
        tag: Option<String>,
    }

    #[test]
    fn a_typed_handle_reads_an_element_of_its_structure_and_refuses_another() {
        static PAIRS: WorkerData<(Tensor, Tensor)> = WorkerData::new("pairs");
        let t = |v: f32| Tensor::new(&[v], &candle_core::Device::Cpu).unwrap();
        let (x, y) = (&PAIRS).element(vec![t(1.0), t(2.0)]).unwrap();
        assert_eq!(
            (x.to_vec1::<f32>().unwrap(), y.to_vec1::<f32>().unwrap()),
            (vec![1.0], vec![2.0])
        );
        assert_eq!((&PAIRS).dataset_name(), "pairs");
        let refused = (&PAIRS).element(vec![t(1.0), t(2.0), t(3.0)]).unwrap_err();
        assert_eq!(refused, ElementError::Tensors { got: 3, reads: 2 });
        assert!(refused.to_string().contains("3 tensor(s)"), "{refused}");
        // By name, the element's tensors as they are.
        assert_eq!("pairs".element(vec![t(1.0)]).unwrap().len(), 1);
        let one: WorkerData<Tensor> = WorkerData::new("one");
        assert!((&one).element(Vec::new()).is_err());
    }

    #[test]
    fn a_value_round_trips_and_another_type_is_refused_naming_the_expected_one() {
        let batch = Batch {
            ids: vec![1, 2, 300_000],
            scale: 0.5,
            tag: Some("x".into()),
        };
        let bytes = encode(&batch).unwrap();
        assert_eq!(decode::<Batch>(&bytes).unwrap(), batch);
        let wrong = decode::<(u64, u64, u64, u64, u64, u64, u64, u64)>(&bytes)
            .unwrap_err()
            .to_string();
        assert!(wrong.contains("(u64, u64"), "{wrong}");
        let left_over = decode::<u8>(&encode(&(1u8, 2u8)).unwrap()).unwrap_err();
        assert!(
            matches!(
                left_over,
                ValueCodecError::LeftOver {
                    read: 1,
                    left_over: 1,
                    ..
                }
            ),
            "{left_over}"
        );
        assert!(decode::<Batch>(&[]).is_err());
    }

    #[test]
    fn a_handle_is_copy_and_names_its_types() {
        const STEP: Step<Vec<f32>, ()> = Step::new("s");
        let copy = STEP;
        assert_eq!(copy.name(), "s");
        assert!(format!("{STEP:?}").contains("Vec<f32>"));
    }
}

/// Why a step failed. Any error a step returns is non-retryable: it surfaces at the chief's
/// `join`/`fetch` as that error, except [`StepError::PsUnavailable`], which is the server's
/// failure: the coordinator runs the closure again once the server is back (and restored).
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The step named a variable the chief did not create.
    #[error("unknown variable {0:?}")]
    UnknownVariable(String),
    /// The step named a dataset the chief did not create on this worker.
    #[error("unknown dataset {0:?}")]
    UnknownDataset(String),
    /// A dataset's element is not what the step's handle reads it as.
    #[error("dataset {dataset:?}: {reason}")]
    Element {
        /// The dataset.
        dataset: String,
        /// What the element holds, against what was asked.
        reason: ElementError,
    },
    /// The worker's dataset is exhausted (TensorFlow's OutOfRangeError).
    #[error("dataset {0:?} is exhausted")]
    EndOfData(String),
    /// Reading the dataset failed.
    #[error("dataset: {0}")]
    Data(#[from] DataError),
    /// A parameter server refused a request, or answered with a reply the step cannot use
    /// (not a lost server: that is [`StepError::PsUnavailable`]).
    #[error("parameter server: {0}")]
    Ps(Box<PsFailure>),
    /// The chief scheduled a step this program does not register.
    #[error("no step {0:?} is registered in this program")]
    UnknownStep(String),
    /// The scheduled argument does not decode as the step's argument type.
    #[error("step {step:?}: its argument does not decode: {reason}")]
    Arguments {
        /// The step.
        step: String,
        /// What the decoder found.
        reason: ValueCodecError,
    },
    /// The step's value could not be encoded.
    #[error("step {step:?}: its value does not encode: {reason}")]
    Value {
        /// The step.
        step: String,
        /// What the encoder found.
        reason: ValueCodecError,
    },
    /// Bad arguments or any other failure of the step itself.
    #[error("{0}")]
    Step(String),
    /// A parameter server could not be reached, had lost its state (restarted, not restored
    /// yet), or refused the closure's push as stale (a restore began since the closure was
    /// dispatched, or this incarnation was fenced). Retryable: a step should pass it on with
    /// `?`.
    #[error(transparent)]
    PsUnavailable(#[from] crate::roles::protocol::PsUnavailable),
    /// This worker's gateway declared dead the very incarnation of parameter server `ps` that
    /// the chief names serving (it was silent here past the detection budget: a partition
    /// between the two alone), and FENCE-1 keeps a declared-dead incarnation out for good: this
    /// incarnation can no longer run closures. It exits to come back as a new one, which
    /// reaches the server again; the chief runs the closure elsewhere.
    #[error("cut off from parameter server {ps}: {reason}")]
    CutOff {
        /// The parameter server's index.
        ps: u32,
        /// Why, in words.
        reason: String,
    },
}

impl StepError {
    /// A parameter server's refusal, or a reply that is not what was asked for (a missing or
    /// malformed blob), as the step reads it.
    pub fn ps(failure: impl Into<PsFailure>) -> Self {
        Self::Ps(Box::new(failure.into()))
    }

    /// What a failed remote call to parameter server `ps` means for a step: the server
    /// unreachable, busy (a full receive budget), gone, or restarted without its state is
    /// [`StepError::PsUnavailable`];
    /// anything else (a message that failed to encode, a refusal for another reason) is
    /// [`StepError::Ps`].
    pub fn from_ps_call(ps: u32, error: cohort_actors::RemoteError) -> Self {
        use cohort_actors::{RefusedReason, RemoteError};
        match &error {
            RemoteError::Timeout { .. }
            | RemoteError::Busy { .. }
            | RemoteError::PeerLost { .. }
            | RemoteError::Stale { .. }
            | RemoteError::Outdated { .. }
            | RemoteError::Refused {
                reason: RefusedReason::ActorUnavailable(_) | RefusedReason::NoSuchActor(_),
                ..
            } => StepError::PsUnavailable(crate::roles::protocol::PsUnavailable {
                ps,
                reason: error.to_string(),
            }),
            _ => StepError::ps(PsFailure::Call(error)),
        }
    }
}

/// Why a parameter server's answer to a step's request cannot be used, when the server itself
/// is not lost ([`StepError::PsUnavailable`] is that): the step fails with it.
#[derive(Debug, thiserror::Error)]
pub enum PsFailure {
    /// The server refused the request (an unknown variable, a shape that does not fit...).
    #[error(transparent)]
    Refused(#[from] crate::roles::protocol::PsRefusal),
    /// A blob of the reply is missing or malformed.
    #[error(transparent)]
    Reply(#[from] crate::roles::blob::BlobError),
    /// A shard's reply does not hold the values asked for.
    #[error("{shard}: {bytes} bytes where {expected} f32 values were expected")]
    ShardLength {
        /// The shard (`name/part`).
        shard: String,
        /// Bytes received.
        bytes: u64,
        /// Values asked for.
        expected: u64,
    },
    /// A shard the request asked for got no reply.
    #[error("{0}: no reply")]
    NoReply(String),
    /// The cluster names no such parameter server.
    #[error("no parameter server ps/{0} in the cluster")]
    NoSuchServer(u32),
    /// The call failed for another reason than the server being unavailable (a message that
    /// could not be encoded, a refusal of the transport's).
    #[error(transparent)]
    Call(cohort_actors::RemoteError),
    /// The calls were abandoned before they settled (the worker's runtime is shutting down).
    #[error("parameter-server calls did not finish: {0}")]
    Abandoned(#[source] tokio::task::JoinError),
}

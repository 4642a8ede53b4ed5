//! Typed steps: a [`Step<A, R>`] names a registered step function once, with the type of its
//! argument `A` and of its value `R`. The program registers the function under the handle
//! ([`crate::program::Program::step`]); the chief schedules it by the same handle
//! ([`crate::program::ClusterCoordinator::schedule`]) and fetches an `R`. Code never travels:
//! the handle is a name both sides agree on because they are the same program, and only the
//! argument and the value cross the network, encoded here (bincode over serde).
//!
//! This module owns the handle and the encoding; the registry keeps the functions and the
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

use serde::de::DeserializeOwned;
use serde::Serialize;

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

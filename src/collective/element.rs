//! The element types the process group moves and reduces, as little-endian bytes.
//!
//! This module owns the bridge between a candle [`Tensor`] and the raw blob a collective
//! message carries (the transport's "tensors as little-endian elements"), and the element-wise
//! reductions on such blobs. It never allocates by a length it did not check: every blob is
//! checked against the element size before it is read.

use bytes::Bytes;
use candle_core::{DType, Device, Tensor};
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

/// The elements of `tensor` in row-major order as little-endian bytes (one copy).
pub(crate) fn tensor_bytes(tensor: &Tensor) -> Result<(Element, Bytes), CollectiveError> {
    let element = Element::of(tensor.dtype())?;
    let flat = tensor.flatten_all().map_err(tensor_error)?;
    let bytes = match element {
        Element::U8 => pod_bytes(flat.to_vec1::<u8>().map_err(tensor_error)?),
        Element::U32 => pod_bytes(flat.to_vec1::<u32>().map_err(tensor_error)?),
        Element::I16 => pod_bytes(flat.to_vec1::<i16>().map_err(tensor_error)?),
        Element::I32 => pod_bytes(flat.to_vec1::<i32>().map_err(tensor_error)?),
        Element::I64 => pod_bytes(flat.to_vec1::<i64>().map_err(tensor_error)?),
        Element::BF16 => pod_bytes(flat.to_vec1::<bf16>().map_err(tensor_error)?),
        Element::F16 => pod_bytes(flat.to_vec1::<f16>().map_err(tensor_error)?),
        Element::F32 => pod_bytes(flat.to_vec1::<f32>().map_err(tensor_error)?),
        Element::F64 => pod_bytes(flat.to_vec1::<f64>().map_err(tensor_error)?),
    };
    Ok((element, bytes))
}

/// A CPU tensor of `dims` from little-endian `bytes` of `element` (checked: exactly as many
/// bytes as the shape holds).
pub(crate) fn bytes_tensor(
    element: Element,
    dims: &[usize],
    bytes: &[u8],
) -> Result<Tensor, CollectiveError> {
    let count: usize = dims.iter().product();
    if bytes.len() != count * element.size() {
        return Err(CollectiveError::Tensor(format!(
            "{} bytes cannot hold {count} {element:?} elements of shape {dims:?}",
            bytes.len()
        )));
    }
    let device = &Device::Cpu;
    let tensor = match element {
        Element::U8 => Tensor::from_vec(values::<u8>(bytes), dims, device),
        Element::U32 => Tensor::from_vec(values::<u32>(bytes), dims, device),
        Element::I16 => Tensor::from_vec(values::<i16>(bytes), dims, device),
        Element::I32 => Tensor::from_vec(values::<i32>(bytes), dims, device),
        Element::I64 => Tensor::from_vec(values::<i64>(bytes), dims, device),
        Element::BF16 => Tensor::from_vec(values::<bf16>(bytes), dims, device),
        Element::F16 => Tensor::from_vec(values::<f16>(bytes), dims, device),
        Element::F32 => Tensor::from_vec(values::<f32>(bytes), dims, device),
        Element::F64 => Tensor::from_vec(values::<f64>(bytes), dims, device),
    };
    tensor.map_err(tensor_error)
}

/// A tensor's elements in a buffer of their own type (so aligned), seen as little-endian
/// bytes: what an all-reduce reduces in place and hands back to candle without another copy
/// (a 64 MiB all-reduce otherwise pays a zeroed output buffer and a copy into an aligned one).
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

impl Elements {
    /// The elements of `tensor` in row-major order (one copy), little-endian in memory.
    pub(crate) fn of(tensor: &Tensor) -> Result<(Element, Self), CollectiveError> {
        let element = Element::of(tensor.dtype())?;
        let flat = tensor.flatten_all().map_err(tensor_error)?;
        let mut elements = match element {
            Element::U8 => Elements::U8(flat.to_vec1().map_err(tensor_error)?),
            Element::U32 => Elements::U32(flat.to_vec1().map_err(tensor_error)?),
            Element::I16 => Elements::I16(flat.to_vec1().map_err(tensor_error)?),
            Element::I32 => Elements::I32(flat.to_vec1().map_err(tensor_error)?),
            Element::I64 => Elements::I64(flat.to_vec1().map_err(tensor_error)?),
            Element::BF16 => Elements::BF16(flat.to_vec1().map_err(tensor_error)?),
            Element::F16 => Elements::F16(flat.to_vec1().map_err(tensor_error)?),
            Element::F32 => Elements::F32(flat.to_vec1().map_err(tensor_error)?),
            Element::F64 => Elements::F64(flat.to_vec1().map_err(tensor_error)?),
        };
        elements.swap_if_big_endian();
        Ok((element, elements))
    }

    /// The elements as little-endian bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        with_vec!(self, v => bytemuck::cast_slice(v.as_slice()))
    }

    /// The elements as little-endian bytes, to reduce or overwrite in place.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        with_vec!(self, v => bytemuck::cast_slice_mut(v.as_mut_slice()))
    }

    /// A CPU tensor of `dims` over the buffer itself (no copy on little-endian machines).
    pub(crate) fn into_tensor(mut self, dims: &[usize]) -> Result<Tensor, CollectiveError> {
        let count: usize = dims.iter().product();
        let held = with_vec!(&self, v => v.len());
        if held != count {
            return Err(CollectiveError::Tensor(format!(
                "{held} elements cannot have the shape {dims:?}"
            )));
        }
        self.swap_if_big_endian();
        with_vec!(self, v => Tensor::from_vec(v, dims, &Device::Cpu)).map_err(tensor_error)
    }

    /// Native order to little-endian and back (nothing on little-endian machines).
    fn swap_if_big_endian(&mut self) {
        if cfg!(target_endian = "big") {
            let size = with_vec!(&*self, v => value_size(v.as_slice()));
            for value in self.bytes_mut().chunks_exact_mut(size) {
                value.reverse();
            }
        }
    }
}

fn value_size<T>(_: &[T]) -> usize {
    std::mem::size_of::<T>()
}

/// `acc = acc (op) x`, element-wise over little-endian blobs of `element` of the
/// same length. `Mean` reduces as `Sum`: the division happens once, after the whole reduction.
pub(crate) fn reduce_assign(element: Element, op: Reduction, acc: &mut [u8], x: &[u8]) {
    reduce_typed(element, op, acc, x, false);
}

/// `acc = x (op) acc`: [`reduce_assign`] with the operands the other way round, so that a
/// result reduced into this member's own buffer keeps the group's reduction order (max and
/// min of +0 and -0 depend on it).
pub(crate) fn reduce_into(element: Element, op: Reduction, x: &[u8], acc: &mut [u8]) {
    reduce_typed(element, op, acc, x, true);
}

fn reduce_typed(element: Element, op: Reduction, acc: &mut [u8], x: &[u8], x_first: bool) {
    match element {
        Element::U8 => assign_typed::<u8>(op, acc, x, x_first),
        Element::U32 => assign_typed::<u32>(op, acc, x, x_first),
        Element::I16 => assign_typed::<i16>(op, acc, x, x_first),
        Element::I32 => assign_typed::<i32>(op, acc, x, x_first),
        Element::I64 => assign_typed::<i64>(op, acc, x, x_first),
        Element::BF16 => assign_typed::<bf16>(op, acc, x, x_first),
        Element::F16 => assign_typed::<f16>(op, acc, x, x_first),
        Element::F32 => assign_typed::<f32>(op, acc, x, x_first),
        Element::F64 => assign_typed::<f64>(op, acc, x, x_first),
    }
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

fn assign_typed<T: Arith>(op: Reduction, acc: &mut [u8], x: &[u8], x_first: bool) {
    if cfg!(target_endian = "little") {
        if let (Ok(acc), Ok(x)) = (
            bytemuck::try_cast_slice_mut::<u8, T>(acc),
            bytemuck::try_cast_slice::<u8, T>(x),
        ) {
            // One loop per operation and order, so that each inlines and vectorizes (a
            // function pointer per element costs more than the memory it reads).
            let pairs = acc.iter_mut().zip(x);
            match (op, x_first) {
                (Reduction::Sum | Reduction::Mean, false) => {
                    pairs.for_each(|(a, b)| *a = a.add(*b))
                }
                (Reduction::Sum | Reduction::Mean, true) => pairs.for_each(|(a, b)| *a = b.add(*a)),
                (Reduction::Max, false) => pairs.for_each(|(a, b)| *a = a.max(*b)),
                (Reduction::Max, true) => pairs.for_each(|(a, b)| *a = b.max(*a)),
                (Reduction::Min, false) => pairs.for_each(|(a, b)| *a = a.min(*b)),
                (Reduction::Min, true) => pairs.for_each(|(a, b)| *a = b.min(*a)),
            }
            return;
        }
    }
    let f = function::<T>(op);
    let size = std::mem::size_of::<T>();
    for (a, b) in acc.chunks_exact_mut(size).zip(x.chunks_exact(size)) {
        let (a_value, b_value) = (read_le::<T>(a), read_le::<T>(b));
        let r = if x_first {
            f(b_value, a_value)
        } else {
            f(a_value, b_value)
        };
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
fn pod_bytes<T: bytemuck::Pod + Send + Sync>(mut values: Vec<T>) -> Bytes {
    if cfg!(target_endian = "big") {
        for v in &mut values {
            bytemuck::bytes_of_mut(v).reverse();
        }
    }
    Bytes::from_owner(PodOwner(values))
}

/// Little-endian `bytes` as values (one copy: the blob need not be aligned).
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
            let back = bytes_tensor(element, &[2, 2], &bytes).unwrap();
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
    fn elements_hold_every_dtype_as_bytes_and_become_the_tensor_again() {
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
            let (element, mut elements) = Elements::of(&t).unwrap();
            let (_, wire) = tensor_bytes(&t).unwrap();
            assert_eq!(
                elements.bytes(),
                &wire[..],
                "{dtype:?}: the same bytes as the wire's"
            );
            // Reduced in place through the byte view: x + x.
            let copy = elements.bytes().to_vec();
            reduce_assign(element, Reduction::Sum, elements.bytes_mut(), &copy);
            let back = elements.into_tensor(&[3, 2]).unwrap();
            assert_eq!(back.dtype(), dtype);
            let want = (t.to_dtype(DType::F64).unwrap() * 2.0).unwrap();
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
        let (_, elements) = Elements::of(&t).unwrap();
        let err = elements.into_tensor(&[4, 2]).unwrap_err();
        assert!(err.to_string().contains("6 elements"), "{err}");
    }

    #[test]
    fn reduce_into_puts_the_other_operand_first() {
        // max(+0, -0) is the first operand: the order is visible in the sign bit.
        let plus = pod_bytes(vec![0f32, 1.0]);
        let minus = pod_bytes(vec![-0f32, 2.0]);
        for op in [Reduction::Sum, Reduction::Max, Reduction::Min] {
            let mut first_then_acc = minus.to_vec();
            reduce_into(Element::F32, op, &plus, &mut first_then_acc);
            let mut acc_then_x = plus.to_vec();
            reduce_assign(Element::F32, op, &mut acc_then_x, &minus);
            assert_eq!(first_then_acc, acc_then_x, "{op}");
        }
        let mut out = minus.to_vec();
        reduce_into(Element::F32, Reduction::Max, &plus, &mut out);
        assert_eq!(
            bytemuck::cast_slice::<u8, f32>(&out)[0].to_bits(),
            0f32.to_bits()
        );
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

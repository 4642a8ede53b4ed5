//! A float tensor's elements read and written where candle stores them, without a copy: what
//! the optimizer needs to read the all-reduced gradients and to write a live variable's new
//! value on the CPU. Anything else (another dtype or device, a strided layout) gets `None` or
//! [`writable_f32`]'s `false`, and the caller takes its copying path.

use candle_core::{CpuStorage, DType, InplaceOp1, Layout, Storage, Tensor};

/// `f` of `tensor`'s elements, read where they are stored: `None` unless it is a contiguous
/// f32 tensor on the CPU.
pub(crate) fn read_f32<R>(tensor: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    let (storage, layout) = tensor.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(elements)), Some((start, end))) => {
            elements.get(start..end).map(f)
        }
        _ => None,
    }
}

/// Whether [`write_f32`] can write `tensor`'s elements in place.
pub(crate) fn writable_f32(tensor: &Tensor) -> bool {
    tensor.dtype() == DType::F32 && tensor.device().is_cpu() && tensor.is_contiguous()
}

/// Runs `f` over `tensor`'s elements where they are stored (every tensor sharing its storage
/// sees the change, as after `candle_core::Var::set`). Fails, changing nothing, unless
/// [`writable_f32`]; fails with `f`'s error after whatever `f` wrote.
pub(crate) fn write_f32(
    tensor: &Tensor,
    f: &dyn Fn(&mut [f32]) -> candle_core::Result<()>,
) -> candle_core::Result<()> {
    tensor.inplace_op1(&WriteF32(f))
}

/// [`write_f32`]'s op.
struct WriteF32<'a>(&'a dyn Fn(&mut [f32]) -> candle_core::Result<()>);

impl InplaceOp1 for WriteF32<'_> {
    fn name(&self) -> &'static str {
        "write-f32-in-place"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let elements = match (storage, layout.contiguous_offsets()) {
            (CpuStorage::F32(elements), Some((start, end))) => elements.get_mut(start..end),
            _ => None,
        };
        match elements {
            Some(elements) => (self.0)(elements),
            None => candle_core::bail!("written in place: not a contiguous f32 CPU tensor"),
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    #[test]
    fn a_contiguous_f32_tensor_is_read_and_written_where_it_is_stored() {
        let t = Tensor::arange(0f32, 6., &Device::Cpu).unwrap();
        let view = t.narrow(0, 2, 3).unwrap();
        assert_eq!(read_f32(&view, <[f32]>::to_vec), Some(vec![2., 3., 4.]));
        assert!(writable_f32(&view));
        write_f32(&view, &|e: &mut [f32]| {
            e.iter_mut().for_each(|x| *x *= 10.);
            Ok(())
        })
        .unwrap();
        // Only the view's elements changed, in the storage every holder shares.
        assert_eq!(t.to_vec1::<f32>().unwrap(), [0., 1., 20., 30., 40., 5.]);
    }

    #[test]
    fn anything_else_is_left_to_the_copying_path() {
        let ints = Tensor::arange(0i64, 4, &Device::Cpu).unwrap();
        assert_eq!(read_f32(&ints, <[f32]>::len), None);
        assert!(!writable_f32(&ints));
        let strided = Tensor::zeros((2, 3), DType::F32, &Device::Cpu)
            .unwrap()
            .t()
            .unwrap();
        assert_eq!(read_f32(&strided, <[f32]>::len), None);
        assert!(!writable_f32(&strided));
        let refused = write_f32(&strided, &|_: &mut [f32]| Ok(()));
        assert!(refused.is_err());
    }
}

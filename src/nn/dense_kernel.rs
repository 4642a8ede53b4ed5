//! The dense layer's affine map as one autograd node on the CPU: `act(x · kernel + bias)` for
//! f32 with a linear or relu activation, the shapes every MLP step spends its time in.
//!
//! Through candle's generic ops the same layer is three graph nodes (matmul, broadcast add,
//! relu), and candle's matmul backward computes the gradient of both operands whether or not
//! the left one needs it: for a model's first layer that is a `[batch, units] · [units,
//! inputs]` product thrown away every step (a third of the backward pass of the MLP
//! 784-256-256-10). [`dense`] makes one node instead. Its forward is candle's own gemm call
//! (same kernel, same blocking, same threads: bit-identical products) followed by one pass
//! that adds the bias and applies the activation; its backward masks the incoming gradient
//! once, takes `xᵀ · dz` and the bias's column sums (in candle's order, by rows), and takes `dz · kernelᵀ` only when `x`
//! is itself differentiable (it comes from a variable), as TensorFlow's graph pruning does.
//!
//! The matrix comes in either layout ([`KernelLayout`]): Keras' `[inputs, units]` kernel or
//! candle-nn's `[units, inputs]` weight, read transposed in place by gemm's strides, with its
//! gradient computed in that same layout (`dzᵀ · x`). Feeding the node `weight.t()` instead
//! would add a transpose node whose backward sums a strided gradient: measured on `bench
//! mwms`, about 10 % of the step.
//!
//! Anything else (another dtype or device, another activation, no bias) goes through the
//! generic ops, which stay the reference this node is tested against.
//!
//! The one `unsafe` block is the gemm call (a raw-pointer API); the operands' extents are
//! checked against their storages just before it.
#![allow(unsafe_code)]

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Device, Layout, Shape, Tensor,
};

use super::Activation;

/// How a dense map's matrix is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelLayout {
    /// `[inputs, units]`: Keras' `kernel`, `x · kernel` (the parameter-server workloads).
    InputsByUnits,
    /// `[units, inputs]`: candle-nn's `weight`, `x · weightᵀ` (`nn::Dense`). The node reads
    /// it transposed in place and gives its gradient in this layout, so that no transpose
    /// node (and no strided copy of the gradient) enters the graph.
    UnitsByInputs,
}

/// `activation(x · K + bias)` for a 2-D `x`, where `K` is `matrix` read by `layout`,
/// differentiable: the fused node where it applies, else candle's generic ops. Every dense
/// map of the crate goes through here (the [`super::Dense`] layer, the parameter-server
/// workloads' MLPs).
pub(crate) fn affine(
    x: &Tensor,
    matrix: &Tensor,
    layout: KernelLayout,
    bias: Option<&Tensor>,
    activation: Activation,
) -> candle_core::Result<Tensor> {
    if let Some(bias) = bias {
        if let Some(y) = dense(x, matrix, layout, bias, activation)? {
            return Ok(y);
        }
    }
    let mut y = match layout {
        KernelLayout::InputsByUnits => x.matmul(matrix)?,
        KernelLayout::UnitsByInputs => x.matmul(&matrix.t()?)?,
    };
    if let Some(bias) = bias {
        y = y.broadcast_add(bias)?;
    }
    activation.apply(&y)
}

/// `activation(x · K + bias)` as one differentiable node where [`applies`] holds, else
/// `None` (the caller builds it from generic ops).
pub(crate) fn dense(
    x: &Tensor,
    matrix: &Tensor,
    layout: KernelLayout,
    bias: &Tensor,
    activation: Activation,
) -> candle_core::Result<Option<Tensor>> {
    if !applies(x, matrix, layout, bias, activation) {
        return Ok(None);
    }
    let relu = activation == Activation::Relu;
    x.apply_op3(matrix, bias, DenseNode { relu, layout })
        .map(Some)
}

/// Whether the fused node computes this layer: f32 on the CPU, `x` `[batch, inputs]`, the
/// matrix `[inputs, units]` or `[units, inputs]` as `layout` says, `bias` `[units]`, a linear
/// or relu activation.
fn applies(
    x: &Tensor,
    matrix: &Tensor,
    layout: KernelLayout,
    bias: &Tensor,
    activation: Activation,
) -> bool {
    let on_cpu = |t: &Tensor| matches!(t.device(), Device::Cpu) && t.dtype() == DType::F32;
    let (inputs_axis, units_axis) = match layout {
        KernelLayout::InputsByUnits => (0, 1),
        KernelLayout::UnitsByInputs => (1, 0),
    };
    matches!(activation, Activation::Linear | Activation::Relu)
        && on_cpu(x)
        && on_cpu(matrix)
        && on_cpu(bias)
        && x.rank() == 2
        && matrix.rank() == 2
        && bias.rank() == 1
        && x.dims()[1] == matrix.dims()[inputs_axis]
        && matrix.dims()[units_axis] == bias.dims()[0]
}

/// The graph node: inputs `x`, the matrix (read by `layout`), `bias`; output
/// `[batch, units]`.
struct DenseNode {
    relu: bool,
    layout: KernelLayout,
}

/// A 2-D operand as gemm reads it: its elements from `offset` with row and column strides.
struct Operand<'a> {
    data: &'a [f32],
    offset: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Operand<'a> {
    /// The operand of `layout` over `storage`, after checking that every element it names
    /// lies inside the storage (what makes the unchecked gemm read below sound).
    fn new(storage: &'a CpuStorage, layout: &Layout) -> candle_core::Result<Self> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("dense: expected an f32 storage");
        };
        let (dims, stride) = (layout.dims(), layout.stride());
        let (rows, cols) = match dims {
            [rows, cols] => (*rows, *cols),
            [cols] => (1, *cols),
            _ => candle_core::bail!("dense: expected a 1-D or 2-D operand, got {dims:?}"),
        };
        let (row_stride, col_stride) = match stride {
            [r, c] => (*r, *c),
            [c] => (0, *c),
            _ => candle_core::bail!("dense: unexpected strides {stride:?}"),
        };
        let offset = layout.start_offset();
        if rows > 0 && cols > 0 {
            let last = offset + (rows - 1) * row_stride + (cols - 1) * col_stride;
            if last >= data.len() {
                candle_core::bail!(
                    "dense: a {rows}x{cols} operand reaches element {last} of a storage of {}",
                    data.len()
                );
            }
        }
        Ok(Self {
            data,
            offset,
            row_stride,
            col_stride,
        })
    }

    fn at(&self, row: usize, col: usize) -> f32 {
        self.data[self.offset + row * self.row_stride + col * self.col_stride]
    }
}

impl CustomOp3 for DenseNode {
    fn name(&self) -> &'static str {
        "dense"
    }

    fn cpu_fwd(
        &self,
        x_storage: &CpuStorage,
        x_layout: &Layout,
        kernel_storage: &CpuStorage,
        kernel_layout: &Layout,
        bias_storage: &CpuStorage,
        bias_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = Operand::new(x_storage, x_layout)?;
        let mut kernel = Operand::new(kernel_storage, kernel_layout)?;
        let bias = Operand::new(bias_storage, bias_layout)?;
        let (batch, inputs) = x_layout.shape().dims2()?;
        let units = match self.layout {
            KernelLayout::InputsByUnits => kernel_layout.shape().dims2()?.1,
            KernelLayout::UnitsByInputs => {
                // `[units, inputs]` read as its transpose: the same elements, strides swapped.
                std::mem::swap(&mut kernel.row_stride, &mut kernel.col_stride);
                kernel_layout.shape().dims2()?.0
            }
        };
        let mut out = vec![0f32; batch * units];
        if batch > 0 && units > 0 && inputs > 0 {
            let threads = candle_core::utils::get_num_threads();
            let parallelism = if threads > 1 {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            };
            // SAFETY: `out` holds `batch × units` elements written row-major (strides `units`,
            // 1); `Operand::new` checked that the last element of `x` (`batch × inputs`) and of
            // `kernel` (`inputs × units`) at their strides lies inside their storages, and gemm
            // reads no other elements. The arguments are those of candle's own matmul
            // (`dst = 0·dst + 1·lhs·rhs`), so the products are the same bits.
            unsafe {
                gemm::gemm(
                    batch,
                    units,
                    inputs,
                    out.as_mut_ptr(),
                    1,
                    units as isize,
                    false,
                    x.data.as_ptr().add(x.offset),
                    x.col_stride as isize,
                    x.row_stride as isize,
                    kernel.data.as_ptr().add(kernel.offset),
                    kernel.col_stride as isize,
                    kernel.row_stride as isize,
                    0f32,
                    1f32,
                    false,
                    false,
                    false,
                    parallelism,
                );
            }
        }
        let bias_row: Vec<f32> = (0..units).map(|unit| bias.at(0, unit)).collect();
        for row in out.chunks_exact_mut(units.max(1)) {
            if self.relu {
                for (value, b) in row.iter_mut().zip(&bias_row) {
                    *value = (*value + b).max(0.0);
                }
            } else {
                for (value, b) in row.iter_mut().zip(&bias_row) {
                    *value += b;
                }
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((batch, units))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        kernel: &Tensor,
        _bias: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // relu: the gradient passes where the output is positive (TensorFlow's ReluGrad).
        let dz = if self.relu {
            // Both contiguous (a no-op for what the graph hands back here).
            grad.contiguous()?
                .apply_op2_no_bwd(&out.contiguous()?, &ReluMask)?
        } else {
            grad.clone()
        };
        // Each gradient in its operand's own layout.
        let (kernel_grad, x_grad) = match self.layout {
            KernelLayout::InputsByUnits => (
                x.t()?.matmul(&dz)?,
                x.track_op().then(|| dz.matmul(&kernel.t()?)).transpose()?,
            ),
            KernelLayout::UnitsByInputs => (
                dz.t()?.matmul(x)?,
                x.track_op().then(|| dz.matmul(kernel)).transpose()?,
            ),
        };
        let bias_grad = dz.contiguous()?.apply_op1_no_bwd(&ColumnSums)?;
        Ok((x_grad, Some(kernel_grad), Some(bias_grad)))
    }
}

/// The column sums of a contiguous `[rows, columns]` matrix (the bias's gradient), added row
/// after row from zero: the order of candle's `sum(0)`, so the same bits, without its index
/// arithmetic per element (two divisions each: measured on `bench mwms`, 7 % of all CPU).
struct ColumnSums;

impl CustomOp1 for ColumnSums {
    fn name(&self) -> &'static str {
        "column-sums"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(values) = storage else {
            candle_core::bail!("column-sums: expected an f32 storage");
        };
        let (&[rows, columns], Some((start, end))) = (layout.dims(), layout.contiguous_offsets())
        else {
            candle_core::bail!("column-sums: expected a contiguous matrix");
        };
        let mut sums = vec![0.0f32; columns];
        if columns > 0 {
            for row in values[start..end].chunks_exact(columns).take(rows) {
                for (sum, v) in sums.iter_mut().zip(row) {
                    *sum += v;
                }
            }
        }
        Ok((CpuStorage::F32(sums), Shape::from(columns)))
    }
}

/// `grad` where `out > 0`, else 0, in one pass over contiguous operands.
struct ReluMask;

impl CustomOp2 for ReluMask {
    fn name(&self) -> &'static str {
        "relu-mask"
    }

    fn cpu_fwd(
        &self,
        grad_storage: &CpuStorage,
        grad_layout: &Layout,
        out_storage: &CpuStorage,
        out_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(grad), CpuStorage::F32(out)) = (grad_storage, out_storage) else {
            candle_core::bail!("relu-mask: expected f32 storages");
        };
        if grad_layout.shape() != out_layout.shape() {
            candle_core::bail!(
                "relu-mask: gradient {:?} and output {:?} differ in shape",
                grad_layout.dims(),
                out_layout.dims()
            );
        }
        let (Some((g0, g1)), Some((o0, o1))) = (
            grad_layout.contiguous_offsets(),
            out_layout.contiguous_offsets(),
        ) else {
            candle_core::bail!("relu-mask: expected contiguous operands");
        };
        let masked: Vec<f32> = grad[g0..g1]
            .iter()
            .zip(&out[o0..o1])
            .map(|(g, o)| if *o > 0.0 { *g } else { 0.0 })
            .collect();
        Ok((CpuStorage::F32(masked), grad_layout.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bias's gradient is bit for bit candle's `sum(0)`, whose order it keeps (DATA-1
    /// holds either way, since every member runs the same code; this keeps old results too).
    #[test]
    fn column_sums_are_candles_sums_to_the_bit() {
        for (rows, columns) in [(256, 256), (7, 3), (1, 10), (0, 4), (5, 0)] {
            let values: Vec<f32> = (0..rows * columns)
                .map(|i| ((i as u32).wrapping_mul(0x9e37_79b9) >> 8) as f32 / 65536.0 - 128.0)
                .collect();
            let m = Tensor::from_vec(values, (rows, columns), &Device::Cpu).unwrap();
            let ours = m.apply_op1_no_bwd(&ColumnSums).unwrap();
            let candle = m.sum(0).unwrap();
            assert_eq!(ours.dims(), candle.dims(), "{rows}x{columns}");
            let bits = |t: &Tensor| -> Vec<u32> {
                t.to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            assert_eq!(bits(&ours), bits(&candle), "{rows}x{columns}");
        }
    }
}

//! Unit tests of losses (hand-computed values), layers and the tape's gradients.

use candle_core::{Device, Tensor};

use super::*;

fn t2(rows: &[&[f32]]) -> Tensor {
    let cols = rows[0].len();
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_vec(flat, (rows.len(), cols), &Device::Cpu).unwrap()
}

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
    }
}

#[test]
fn binary_cross_entropy_from_logits_matches_hand_values() {
    let logits = t2(&[&[0.0], &[2.0], &[-3.0]]);
    let labels = t2(&[&[1.0], &[0.0], &[1.0]]);
    let loss = losses::binary_cross_entropy_from_logits(&logits, &labels).unwrap();
    // ln 2; 2 + ln(1 + e^-2); 3 + ln(1 + e^-3).
    close(
        &loss.to_vec1::<f32>().unwrap(),
        &[std::f32::consts::LN_2, 2.126_928, 3.048_587],
    );
    // Large logits stay finite.
    let big = t2(&[&[500.0], &[-500.0]]);
    let loss = losses::binary_cross_entropy_from_logits(&big, &t2(&[&[0.0], &[1.0]])).unwrap();
    close(&loss.to_vec1::<f32>().unwrap(), &[500.0, 500.0]);
}

#[test]
fn binary_cross_entropy_gradient_is_sigmoid_minus_label() {
    use candle_core::Module;
    let w = candle_core::Var::from_tensor(&t2(&[&[1.0]])).unwrap();
    let layer = Dense::new(w.as_tensor().clone(), None, Activation::Linear);
    let x = t2(&[&[0.0], &[2.0], &[-3.0]]);
    let y = t2(&[&[1.0], &[0.0], &[1.0]]);
    let logits = layer.forward(&x).unwrap();
    let loss = losses::binary_cross_entropy_from_logits(&logits, &y)
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    // d/dw = Σ x·(σ(w·x) - y) with w = 1: 0·(-0.5) + 2·0.880797 + -3·(0.047426 - 1).
    let want = 2.0 * 0.880_797_1 + -3.0 * (0.047_425_87 - 1.0);
    close(
        &grads
            .get(w.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap(),
        &[want],
    );
}

#[test]
fn sparse_softmax_cross_entropy_matches_hand_values_and_checks_labels() {
    let logits = t2(&[&[1.0, 2.0, 3.0], &[0.0, 0.0, 0.0]]);
    let labels = Tensor::new(&[2i64, 0], &Device::Cpu).unwrap();
    let loss = losses::sparse_softmax_cross_entropy(&logits, &labels).unwrap();
    close(&loss.to_vec1::<f32>().unwrap(), &[0.407_606, 3f32.ln()]);

    let out_of_range = Tensor::new(&[3i64, 0], &Device::Cpu).unwrap();
    let err = losses::sparse_softmax_cross_entropy(&logits, &out_of_range).unwrap_err();
    assert!(
        matches!(
            err,
            NnError::IndexOutOfRange {
                value: 3,
                limit: 3,
                ..
            }
        ),
        "{err:?}"
    );
    let float_labels = Tensor::new(&[2f32, 0.], &Device::Cpu).unwrap();
    let err = losses::sparse_softmax_cross_entropy(&logits, &float_labels).unwrap_err();
    assert!(matches!(err, NnError::IndexDType { .. }), "{err:?}");
    let wrong_count = Tensor::new(&[1i64], &Device::Cpu).unwrap();
    let err = losses::sparse_softmax_cross_entropy(&logits, &wrong_count).unwrap_err();
    assert!(matches!(err, NnError::LossShape { .. }), "{err:?}");
}

#[test]
fn mean_squared_error_averages_the_last_axis() {
    let p = t2(&[&[1.0, 2.0], &[3.0, 5.0]]);
    let t = t2(&[&[1.0, 1.0], &[1.0, 1.0]]);
    let loss = losses::mean_squared_error(&p, &t).unwrap();
    close(&loss.to_vec1::<f32>().unwrap(), &[0.5, 10.0]);
    let err = losses::mean_squared_error(&p, &t2(&[&[1.0, 1.0]])).unwrap_err();
    assert!(matches!(err, NnError::LossShape { .. }), "{err:?}");
}

#[test]
fn seeded_initializers_are_reproducible_and_in_range() {
    let a = Initializer::GlorotUniform { seed: 9 }
        .init(&[4, 3])
        .unwrap();
    let b = Initializer::GlorotUniform { seed: 9 }
        .init(&[4, 3])
        .unwrap();
    let c = Initializer::GlorotUniform { seed: 10 }
        .init(&[4, 3])
        .unwrap();
    let (a, b, c) = (
        a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        c.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    let limit = (6.0f32 / 7.0).sqrt();
    assert!(a.iter().all(|v| v.abs() <= limit), "{a:?}");
    let normal = Initializer::RandomNormal {
        mean: 1.0,
        stddev: 0.1,
        seed: 1,
    }
    .init(&[1000])
    .unwrap()
    .to_vec1::<f32>()
    .unwrap();
    let mean = normal.iter().sum::<f32>() / 1000.0;
    assert!((mean - 1.0).abs() < 0.02, "{mean}");
}

/// A variable declared (or placed on parameter servers) has no local copy: its initial value
/// is never drawn, local reads and updates are refused naming it.
#[test]
fn a_variable_without_a_local_copy_is_never_drawn_and_refuses_local_use() {
    use crate::variable::{DeclaredPlacement, VariableBuilder, VariableError};
    let _scope = DeclaredPlacement.scope().unwrap();
    // 10^9 values would not fit in memory if drawn.
    let table = VariableBuilder::deferred(
        "big/embeddings",
        vec![1_000_000_000, 1],
        candle_core::DType::F32,
        |_| panic!("a declared variable's value is never drawn"),
    )
    .build()
    .unwrap();
    assert_eq!(table.num_components(), 0);
    assert_eq!(table.read_value().dims(), &[1_000_000_000, 1]);
    let err = table.try_read_value().unwrap_err();
    assert!(err.to_string().contains("big/embeddings"), "{err}");
    let delta = Tensor::zeros((1, 1), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        table.assign_add(&delta),
        Err(VariableError::NoLocalCopy { .. })
    ));
}

#[test]
fn placement_on_parameter_servers_refuses_unknown_or_reshaped_variables() {
    use crate::layout::{Dtype, Layout};
    use crate::variable::{ParameterServerPlacement, VariableBuilder};
    let layout = Layout::unsharded("d.weight", Dtype::F32, vec![1, 3], 1);
    let _scope = ParameterServerPlacement::new([layout]).scope().unwrap();
    let build = |name: &str, shape: Vec<usize>| {
        VariableBuilder::deferred(name, shape, candle_core::DType::F32, |shape| {
            Tensor::zeros(shape, candle_core::DType::F32, &Device::Cpu)
        })
        .build()
    };
    let placed = build("d.weight", vec![1, 3]).unwrap();
    assert!(placed.ps_layout().is_some() && !placed.has_local_copy());
    let err = build("d.weight", vec![1, 2]).unwrap_err();
    assert!(err.to_string().contains("shape [1, 3]"), "{err}");
    let err = build("e.weight", vec![1, 3]).unwrap_err();
    assert!(err.to_string().contains("e.weight"), "{err}");
}

/// `linear` is candle-nn's `linear`: the same variable names, shapes and initial values, and
/// the same outputs and gradients (the fused node against candle-nn's matmul and add), on 2-D
/// and 3-D inputs.
#[test]
fn linear_is_candle_nns_linear_computed_by_the_fused_node() {
    use candle_core::Module;
    let ours_vars = ModelVariables::new(5);
    let theirs_vars = ModelVariables::new(5);
    let ours = linear(6, 4, ours_vars.var_builder(0).pp("proj")).unwrap();
    let theirs = candle_nn::linear(6, 4, theirs_vars.var_builder(0).pp("proj")).unwrap();
    assert_eq!(ours_vars.names(), ["proj.weight", "proj.bias"]);
    assert_eq!(ours_vars.names(), theirs_vars.names());
    for name in ours_vars.names() {
        let a = ours_vars.get(&name).unwrap().read_value();
        let b = theirs_vars.get(&name).unwrap().read_value();
        assert_eq!(a.dims(), b.dims(), "{name}");
        assert_eq!(
            a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            "{name}"
        );
    }
    for shape in [vec![5, 6], vec![2, 3, 6]] {
        let len = shape.iter().product::<usize>();
        let x = Tensor::from_vec(
            (0..len)
                .map(|i| (i % 7) as f32 / 3.0 - 1.0)
                .collect::<Vec<_>>(),
            shape.clone(),
            &Device::Cpu,
        )
        .unwrap();
        let (y_ours, y_theirs) = (ours.forward(&x).unwrap(), theirs.forward(&x).unwrap());
        assert_eq!(y_ours.dims(), y_theirs.dims(), "{shape:?}");
        close(
            &y_ours.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            &y_theirs.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        let g_ours = y_ours.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        let g_theirs = y_theirs
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for (a, b) in ours_vars
            .trainable_variables()
            .iter()
            .zip(theirs_vars.trainable_variables())
        {
            let a = g_ours
                .get(&a.live_component(0).unwrap())
                .expect("a gradient");
            let b = g_theirs
                .get(&b.live_component(0).unwrap())
                .expect("a gradient");
            close(
                &a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                &b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
        }
    }
    let err = ours
        .forward(&Tensor::new(1f32, &Device::Cpu).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("scalar"), "{err}");
}

/// `dense` starts as Keras' `Dense`: a Glorot-uniform weight within its bound, a zero bias,
/// and applies its activation.
#[test]
fn dense_has_keras_initializers_and_applies_its_activation() {
    use candle_core::Module;
    let vars = ModelVariables::new(3);
    let layer = dense(4, 3, Activation::Relu, vars.var_builder(0).pp("d")).unwrap();
    let weight = layer
        .weight()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let bound = (6.0f32 / 7.0).sqrt();
    assert!(weight.iter().all(|w| w.abs() <= bound), "{weight:?}");
    assert!(weight.iter().any(|w| *w != 0.0));
    let bias = layer.bias().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(bias, [0.0; 3]);
    let y = layer
        .forward(&Tensor::new(&[[1f32, -2., 3., -4.]], &Device::Cpu).unwrap())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert!(y.iter().all(|v| *v >= 0.0), "relu: {y:?}");
}

/// The fused dense node against candle's generic ops (matmul, broadcast add, relu) on the
/// same leaves: outputs and every gradient, for both activations, an input that is itself
/// differentiable and one that is not (no gradient then), a transposed (strided) input, sizes
/// that fit no kernel block, and an empty batch.
#[test]
fn fused_dense_node_matches_the_generic_ops() {
    use candle_core::Var;

    fn values(len: usize, salt: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i + salt) * 7919 + 13) % 2003) as f32 / 1001.5 - 1.0)
            .collect()
    }
    for (batch, inputs, units) in [(5, 3, 7), (33, 70, 19), (256, 784, 20), (0, 4, 3)] {
        for activation in [Activation::Linear, Activation::Relu] {
            for (x_tracked, x_transposed, layout) in [
                (false, false, KernelLayout::InputsByUnits),
                (true, false, KernelLayout::InputsByUnits),
                (false, true, KernelLayout::InputsByUnits),
                (false, false, KernelLayout::UnitsByInputs),
                (true, false, KernelLayout::UnitsByInputs),
                (false, true, KernelLayout::UnitsByInputs),
            ] {
                let case = format!(
                    "{batch}x{inputs}x{units} {activation:?} tracked={x_tracked} transposed={x_transposed} {layout:?}"
                );
                let x_plain = if x_transposed {
                    Tensor::from_vec(values(batch * inputs, 1), (inputs, batch), &Device::Cpu)
                        .unwrap()
                        .t()
                        .unwrap()
                } else {
                    Tensor::from_vec(values(batch * inputs, 1), (batch, inputs), &Device::Cpu)
                        .unwrap()
                };
                let x_var = Var::from_tensor(&x_plain).unwrap();
                let shape = match layout {
                    KernelLayout::InputsByUnits => (inputs, units),
                    KernelLayout::UnitsByInputs => (units, inputs),
                };
                let kernel = Var::from_tensor(
                    &Tensor::from_vec(values(inputs * units, 2), shape, &Device::Cpu).unwrap(),
                )
                .unwrap();
                let bias = Var::from_tensor(
                    &Tensor::from_vec(values(units, 3), units, &Device::Cpu).unwrap(),
                )
                .unwrap();
                let x = if x_tracked {
                    x_var.as_tensor().clone()
                } else {
                    x_plain.clone()
                };
                let fused = dense_kernel::dense(
                    &x,
                    kernel.as_tensor(),
                    layout,
                    bias.as_tensor(),
                    activation,
                )
                .unwrap()
                .expect("the fused node applies to f32 on the CPU");
                let product = match layout {
                    KernelLayout::InputsByUnits => x.matmul(kernel.as_tensor()),
                    KernelLayout::UnitsByInputs => x.matmul(&kernel.as_tensor().t().unwrap()),
                };
                let generic = activation
                    .apply(&product.unwrap().broadcast_add(bias.as_tensor()).unwrap())
                    .unwrap();
                assert_eq!(fused.dims(), &[batch, units], "{case}");
                close(
                    &fused.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    &generic.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                );
                // A loss whose gradient differs per output element.
                let weights =
                    Tensor::from_vec(values(batch * units, 4), (batch, units), &Device::Cpu)
                        .unwrap();
                let fused_grads = (fused * &weights)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let generic_grads = (generic * &weights)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                if batch == 0 {
                    // candle's generic ops give no gradient for an empty batch; the node's
                    // gradients, where it gives them, are zeros.
                    for leaf in [kernel.as_tensor(), bias.as_tensor()] {
                        if let Some(got) = fused_grads.get(leaf) {
                            let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                            assert!(got.iter().all(|g| *g == 0.0), "{case}: {got:?}");
                        }
                    }
                    continue;
                }
                for leaf in [kernel.as_tensor(), bias.as_tensor()] {
                    let got = fused_grads.get(leaf).expect(&case);
                    let want = generic_grads.get(leaf).expect(&case);
                    close(
                        &got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        &want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    );
                }
                match fused_grads.get(x_var.as_tensor()) {
                    Some(got) => {
                        assert!(x_tracked, "{case}: a gradient for an input that needs none");
                        let want = generic_grads.get(x_var.as_tensor()).unwrap();
                        close(
                            &got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                            &want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        );
                    }
                    None => assert!(!x_tracked, "{case}: no gradient for a differentiable input"),
                }
            }
        }
    }
    // Outside its shapes the node declines and the generic ops run.
    let x = Tensor::zeros((2, 3), candle_core::DType::F64, &Device::Cpu).unwrap();
    let kernel = Tensor::zeros((3, 1), candle_core::DType::F64, &Device::Cpu).unwrap();
    let bias = Tensor::zeros(1, candle_core::DType::F64, &Device::Cpu).unwrap();
    let layout = KernelLayout::InputsByUnits;
    assert!(
        dense_kernel::dense(&x, &kernel, layout, &bias, Activation::Relu)
            .unwrap()
            .is_none()
    );
    let x = x.to_dtype(candle_core::DType::F32).unwrap();
    let kernel = kernel.to_dtype(candle_core::DType::F32).unwrap();
    let bias = bias.to_dtype(candle_core::DType::F32).unwrap();
    assert!(
        dense_kernel::dense(&x, &kernel, layout, &bias, Activation::Tanh)
            .unwrap()
            .is_none()
    );
}

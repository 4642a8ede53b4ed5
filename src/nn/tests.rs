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
    let tape = GradientTape::new();
    let dense = Dense::builder("d", 1, 1)
        .kernel_initializer(Initializer::Constant(1.0))
        .use_bias(false)
        .build()
        .unwrap();
    let x = t2(&[&[0.0], &[2.0], &[-3.0]]);
    let y = t2(&[&[1.0], &[0.0], &[1.0]]);
    let logits = dense.forward(&tape, &x).unwrap();
    let loss = losses::binary_cross_entropy_from_logits(&logits, &y)
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = tape.gradient(&loss, &dense.trainable_variables()).unwrap();
    // d/dw = Σ x·(σ(w·x) - y) with w = 1: 0·(-0.5) + 2·0.880797 + -3·(0.047426 - 1).
    let want = 2.0 * 0.880_797_1 + -3.0 * (0.047_425_87 - 1.0);
    close(
        &grads[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
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
fn embedding_gradient_lands_on_the_looked_up_rows() {
    let emb = Embedding::new("emb", 4, 2, Initializer::Constant(0.5)).unwrap();
    let tape = GradientTape::new();
    let ids = Tensor::new(&[1u32, 1, 3], &Device::Cpu).unwrap();
    let rows = emb.forward(&tape, &ids).unwrap();
    assert_eq!(rows.dims(), &[3, 2]);
    let grads = tape
        .gradient(&rows.sum_all().unwrap(), &emb.trainable_variables())
        .unwrap();
    assert_eq!(
        grads[0].to_vec2::<f32>().unwrap(),
        [[0.0, 0.0], [2.0, 2.0], [0.0, 0.0], [1.0, 1.0]]
    );
    let bad = Tensor::new(&[4i64], &Device::Cpu).unwrap();
    let err = emb.forward(&tape, &bad).unwrap_err();
    assert!(
        matches!(
            err,
            NnError::IndexOutOfRange {
                value: 4,
                limit: 4,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn dense_checks_its_input_and_config() {
    let dense = Dense::builder("d", 3, 2).build().unwrap();
    let err = dense
        .forward(&GradientTape::new(), &t2(&[&[1.0, 2.0]]))
        .unwrap_err();
    assert!(matches!(err, NnError::InputShape { .. }), "{err:?}");
    assert!(err.to_string().contains("`d`"), "{err}");
    assert!(matches!(
        Dense::builder("z", 0, 2).build(),
        Err(NnError::Config { .. })
    ));
    assert!(matches!(
        Dense::builder("r", 1, 1).kernel_l2(-1.0).build(),
        Err(NnError::Config { .. })
    ));
    assert_eq!(dense.kernel().name(), "d/kernel");
    assert_eq!(dense.bias().unwrap().name(), "d/bias");
}

#[test]
fn tape_gives_zeros_for_variables_it_did_not_read() {
    let used = Dense::builder("used", 1, 1).build().unwrap();
    let unused = Dense::builder("unused", 1, 1)
        .use_bias(false)
        .build()
        .unwrap();
    let tape = GradientTape::new();
    let y = used
        .forward(&tape, &t2(&[&[1.0]]))
        .unwrap()
        .sum_all()
        .unwrap();
    assert!(!tape.watches(unused.kernel()));
    let grads = tape.gradient(&y, &[unused.kernel().clone()]).unwrap();
    assert_eq!(grads[0].to_vec2::<f32>().unwrap(), [[0.0]]);
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

/// A source over in-memory tables that counts what it was asked for (the worker's view of
/// parameter servers, without the network).
#[derive(Debug, Default)]
struct FakeSource {
    values: std::collections::BTreeMap<String, Tensor>,
    asked: std::sync::Mutex<Vec<(String, Option<Vec<u64>>)>>,
}

impl VariableSource for FakeSource {
    fn read(&self, variable: &crate::variable::Variable) -> Result<Tensor, NnError> {
        self.asked
            .lock()
            .unwrap()
            .push((variable.name().to_string(), None));
        Ok(self.values[variable.name()].clone())
    }

    fn read_rows(
        &self,
        variable: &crate::variable::Variable,
        ids: &[u64],
    ) -> Result<Tensor, NnError> {
        self.asked
            .lock()
            .unwrap()
            .push((variable.name().to_string(), Some(ids.to_vec())));
        let at: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        let at = Tensor::new(at.as_slice(), &Device::Cpu).unwrap();
        Ok(self.values[variable.name()].embedding(&at)?)
    }
}

/// Builds `build` with its variables on (fake) parameter servers, one shard on PS 0 each.
fn on_ps<T>(specs_of: impl Fn() -> Result<T, NnError>, layer: impl Fn(&T) -> Vec<WeightSpec>) -> T {
    use crate::layout::{Dtype, Layout, Shard};
    use crate::variable::ParameterServerPlacement;
    let specs = layer(&declare(&specs_of).unwrap());
    let layouts = specs.iter().map(|s| Layout {
        name: s.name.clone(),
        dtype: Dtype::F32,
        shape: s.shape.clone(),
        shards: vec![Shard {
            ps: 0,
            rows: 0..s.shape[0],
        }],
    });
    let _scope = ParameterServerPlacement::new(layouts).scope().unwrap();
    specs_of().unwrap()
}

#[test]
fn a_table_on_parameter_servers_fetches_only_the_batch_rows_and_gets_row_gradients() {
    let build = || {
        Ok(Sequential::new("m")
            .push(Embedding::new("emb", 1000, 2, Initializer::Constant(0.0))?)
            .push(
                Dense::builder("head", 2, 1)
                    .kernel_initializer(Initializer::Constant(1.0))
                    .build()?,
            ))
    };
    let remote = on_ps(build, |m: &Sequential| m.weight_specs());
    let local = build().unwrap();
    let vars = remote.trainable_variables();
    assert!(vars
        .iter()
        .all(|v| !v.has_local_copy() && v.ps_layout().is_some()));
    // The servers' values: row r of the table is [r, -r].
    let table: Vec<f32> = (0..1000).flat_map(|r| [r as f32, -(r as f32)]).collect();
    let table = Tensor::from_vec(table, (1000, 2), &Device::Cpu).unwrap();
    local.trainable_variables()[0].assign(&table).unwrap();
    let source = std::sync::Arc::new(FakeSource {
        values: [
            ("emb/embeddings".to_string(), table),
            ("head/kernel".to_string(), t2(&[&[1.0], &[1.0]])),
            (
                "head/bias".to_string(),
                Tensor::zeros(1, candle_core::DType::F32, &Device::Cpu).unwrap(),
            ),
        ]
        .into(),
        asked: Default::default(),
    });
    let ids = Tensor::new(&[7i64, 3, 7, 999], &Device::Cpu).unwrap();
    let tape = GradientTape::with_source(source.clone());
    let out = remote.forward(&tape, &ids).unwrap();
    let loss = out.sqr().unwrap().sum_all().unwrap();
    let grads = tape.sparse_gradient(&loss, &vars).unwrap();
    // Only the distinct ids travelled, in ascending order; dense variables whole.
    let asked = source.asked.lock().unwrap().clone();
    assert_eq!(asked[0], ("emb/embeddings".into(), Some(vec![3, 7, 999])));
    assert_eq!(asked[1], ("head/kernel".into(), None));
    let Some(Gradient::Rows {
        ids: grad_ids,
        values,
    }) = &grads[0]
    else {
        panic!("table gradient is not row-sparse: {:?}", grads[0]);
    };
    assert_eq!(grad_ids, &[3, 7, 999]);
    // The same numbers as the in-process (dense) computation, on those rows.
    let local_tape = GradientTape::new();
    let local_out = local.forward(&local_tape, &ids).unwrap();
    close(
        &out.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        &local_out.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    let local_loss = local_out.sqr().unwrap().sum_all().unwrap();
    let dense = local_tape
        .gradient(&local_loss, &local.trainable_variables())
        .unwrap();
    let picked = dense[0]
        .embedding(&Tensor::new(&[3u32, 7, 999], &Device::Cpu).unwrap())
        .unwrap();
    close(
        &values.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        &picked.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    let Some(Gradient::Dense(kernel)) = &grads[1] else {
        panic!("kernel gradient is not dense");
    };
    close(
        &kernel.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        &dense[1].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    // The dense form of the row gradient is the in-process gradient.
    let tape = GradientTape::with_source(source);
    let loss = remote
        .forward(&tape, &ids)
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap();
    let as_dense = tape.gradient(&loss, &vars).unwrap();
    close(
        &as_dense[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        &dense[0].flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
}

#[test]
fn a_variable_without_a_local_copy_is_never_drawn_and_refuses_local_use() {
    // 10^9 values would not fit in memory if drawn.
    let emb = declare(|| Embedding::with_seed("big", 1_000_000_000, 1, 3)).unwrap();
    let table = emb.table();
    assert_eq!(table.num_components(), 0);
    assert_eq!(table.read_value().dims(), &[1_000_000_000, 1]);
    let err = table.try_read_value().unwrap_err();
    assert!(err.to_string().contains("big/embeddings"), "{err}");
    let delta = Tensor::zeros((1, 1), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(
        table.assign_add(&delta),
        Err(crate::variable::VariableError::NoLocalCopy { .. })
    ));
    // A tape without a source names the variable.
    let err = emb
        .forward(
            &GradientTape::new(),
            &Tensor::new(&[1u32], &Device::Cpu).unwrap(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, NnError::NoSource { variable } if variable == "big/embeddings"),
        "{err}"
    );
    assert_eq!(
        emb.weight_specs(),
        [WeightSpec::new(
            "big/embeddings",
            vec![1_000_000_000, 1],
            Initializer::RandomUniform {
                min: -0.05,
                max: 0.05,
                seed: 3
            }
        )
        .by_rows()]
    );
}

#[test]
fn placement_on_parameter_servers_refuses_unknown_or_reshaped_variables() {
    use crate::layout::{Dtype, Layout};
    use crate::variable::ParameterServerPlacement;
    let layout = Layout::unsharded("d/kernel", Dtype::F32, vec![3, 1], 1);
    let _scope = ParameterServerPlacement::new([layout]).scope().unwrap();
    let err = Dense::builder("d", 2, 1).build().unwrap_err();
    assert!(err.to_string().contains("shape [3, 1]"), "{err}");
    let err = Dense::builder("e", 3, 1).build().unwrap_err();
    assert!(err.to_string().contains("e/kernel"), "{err}");
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
            for (x_tracked, x_transposed) in [(false, false), (true, false), (false, true)] {
                let case = format!(
                    "{batch}x{inputs}x{units} {activation:?} tracked={x_tracked} transposed={x_transposed}"
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
                let kernel = Var::from_tensor(
                    &Tensor::from_vec(values(inputs * units, 2), (inputs, units), &Device::Cpu)
                        .unwrap(),
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
                let fused =
                    dense_kernel::dense(&x, kernel.as_tensor(), bias.as_tensor(), activation)
                        .unwrap()
                        .expect("the fused node applies to f32 on the CPU");
                let generic = activation
                    .apply(
                        &x.matmul(kernel.as_tensor())
                            .unwrap()
                            .broadcast_add(bias.as_tensor())
                            .unwrap(),
                    )
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
    assert!(dense_kernel::dense(&x, &kernel, &bias, Activation::Relu)
        .unwrap()
        .is_none());
    let x = x.to_dtype(candle_core::DType::F32).unwrap();
    let kernel = kernel.to_dtype(candle_core::DType::F32).unwrap();
    let bias = bias.to_dtype(candle_core::DType::F32).unwrap();
    assert!(dense_kernel::dense(&x, &kernel, &bias, Activation::Tanh)
        .unwrap()
        .is_none());
}

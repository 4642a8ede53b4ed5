//! Unit tests of the optimizer kernels against values computed by hand (two steps each), the
//! dense/sparse equivalence, the non-finite policy and the checks made before any write.

use super::*;

fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "element {i}: got {g}, want {w} (all: {got:?})"
        );
    }
}

fn run_dense(opt: &Optimizer, params: &mut [f32], grads: &[&[f32]]) -> Slots {
    let mut slots = opt.new_slots("w", params.len());
    for (k, g) in grads.iter().enumerate() {
        let outcome = opt
            .apply_dense(params, g, &mut slots, k as u64 + 1)
            .unwrap();
        assert_eq!(outcome, UpdateOutcome::Applied);
    }
    slots
}

#[test]
fn sgd_two_steps() {
    let opt = Optimizer::sgd(0.1);
    let mut p = vec![1.0, 2.0];
    let slots = run_dense(&opt, &mut p, &[&[0.5, -1.0], &[0.5, -1.0]]);
    assert_close(&p, &[0.9, 2.2], 1e-6);
    assert_eq!(slots.iter().count(), 0);
}

#[test]
fn momentum_two_steps() {
    // v1 = -0.1, p1 = 0.9; v2 = 0.9 * -0.1 - 0.1 = -0.19, p2 = 0.71.
    let opt = Optimizer::momentum(0.1, 0.9);
    let mut p = vec![1.0];
    let slots = run_dense(&opt, &mut p, &[&[1.0], &[1.0]]);
    assert_close(&p, &[0.71], 1e-6);
    assert_close(slots.get("momentum").unwrap(), &[-0.19], 1e-6);
}

#[test]
fn nesterov_two_steps() {
    // p1 = 1 + 0.9 * -0.1 - 0.1 = 0.81; p2 = 0.81 + 0.9 * -0.19 - 0.1 = 0.539.
    let opt = Optimizer::nesterov(0.1, 0.9);
    let mut p = vec![1.0];
    run_dense(&opt, &mut p, &[&[1.0], &[1.0]]);
    assert_close(&p, &[0.539], 1e-6);
}

#[test]
fn adagrad_two_steps() {
    // acc = 0.1 + 1 = 1.1, p1 = 1 - 0.1 / sqrt(1.1); acc = 2.1, p2 = p1 - 0.1 / sqrt(2.1).
    let opt = Optimizer::adagrad(0.1);
    let mut p = vec![1.0];
    let slots = run_dense(&opt, &mut p, &[&[1.0], &[1.0]]);
    assert_close(&p, &[0.835_647_2], 1e-6);
    assert_close(slots.get("accumulator").unwrap(), &[2.1], 1e-6);
}

#[test]
fn adam_two_steps() {
    // Step 1: m = 0.1, v = 0.001, p = 1 - 0.1·sqrt(0.001)/0.1 · 0.1/(sqrt(0.001)+1e-7).
    // Step 2 (g = 0.5): m = 0.14, v = 0.001249, p ≈ 0.8067826.
    let opt = Optimizer::adam(0.1);
    let mut p = vec![1.0];
    let mut slots = opt.new_slots("w", 1);
    opt.apply_dense(&mut p, &[1.0], &mut slots, 1).unwrap();
    assert_close(&p, &[0.900_000_3], 1e-6);
    opt.apply_dense(&mut p, &[0.5], &mut slots, 2).unwrap();
    assert_close(&p, &[0.806_782_6], 1e-6);
    assert_close(slots.get("m").unwrap(), &[0.14], 1e-6);
    assert_close(slots.get("v").unwrap(), &[0.001_249], 1e-7);
}

fn every_optimizer() -> Vec<Optimizer> {
    vec![
        Optimizer::sgd(0.1),
        Optimizer::momentum(0.1, 0.9),
        Optimizer::nesterov(0.1, 0.9),
        Optimizer::adagrad(0.1),
        Optimizer::adam(0.1),
        Optimizer::rmsprop(0.1),
        rmsprop(0.5, true),
        Optimizer::ftrl(0.1, 0.05, 0.1),
    ]
}

/// RMSprop at rate 0.1 with Keras' other defaults, a `momentum` and `centered`.
fn rmsprop(momentum: f32, centered: bool) -> Optimizer {
    Optimizer::new(OptimizerKind::RmsProp {
        learning_rate: 0.1,
        rho: 0.9,
        momentum,
        epsilon: 1e-7,
        centered,
    })
}

#[test]
fn rmsprop_two_steps_plain_with_momentum_and_centered() {
    // v1 = 0.1, p1 = 1 - 0.1 / sqrt(0.1 + ε); v2 = 0.19, p2 = p1 - 0.1 / sqrt(0.19 + ε).
    let mut p = vec![1.0];
    let slots = run_dense(&Optimizer::rmsprop(0.1), &mut p, &[&[1.0], &[1.0]]);
    assert_close(&p, &[0.454_356_7], 1e-6);
    assert_close(slots.get("velocity").unwrap(), &[0.19], 1e-6);
    assert_eq!(slots.iter().count(), 1);
    // With momentum 0.5: m1 = s1, m2 = 0.5·m1 + s2, p = 1 - m1 - m2.
    let mut p = vec![1.0];
    let slots = run_dense(&rmsprop(0.5, false), &mut p, &[&[1.0], &[1.0]]);
    assert_close(&p, &[0.296_242_9], 1e-6);
    assert_close(slots.get("momentum").unwrap(), &[0.387_529_5], 1e-6);
    // Centered, g = 2: a1 = 0.2, v1 = 0.4, denominator 0.4 - 0.04; a2 = 0.38, v2 = 0.76.
    let mut p = vec![1.0];
    let slots = run_dense(&rmsprop(0.0, true), &mut p, &[&[2.0], &[2.0]]);
    assert_close(&p, &[0.411_760_4], 1e-6);
    assert_close(slots.get("average_gradient").unwrap(), &[0.38], 1e-6);
    assert_close(slots.get("velocity").unwrap(), &[0.76], 1e-6);
}

#[test]
fn ftrl_two_steps_with_and_without_regularization() {
    // n1 = 1.1, z1 = 1 - (sqrt(1.1) - sqrt(0.1)) / 0.1 · 1, p1 = -z1 / (sqrt(1.1) / 0.1); and
    // again with n2 = 2.1.
    let mut p = vec![1.0];
    let slots = run_dense(&Optimizer::ftrl(0.1, 0.0, 0.0), &mut p, &[&[1.0], &[1.0]]);
    assert_close(&p, &[0.534_135_8], 1e-5);
    assert_close(slots.get("accumulator").unwrap(), &[2.1], 1e-6);
    assert_close(slots.get("linear").unwrap(), &[-7.740_364], 1e-4);
    let mut p = vec![1.0];
    let slots = run_dense(&Optimizer::ftrl(0.1, 0.05, 0.1), &mut p, &[&[1.0], &[-0.5]]);
    assert_close(&p, &[0.629_483], 1e-5);
    assert_close(slots.get("accumulator").unwrap(), &[1.35], 1e-6);
    // An L1 strength above |z| holds the weight at zero.
    let mut p = vec![0.0];
    run_dense(&Optimizer::ftrl(0.1, 5.0, 0.0), &mut p, &[&[1.0], &[-0.5]]);
    assert_eq!(p, [0.0]);
}

#[test]
fn rows_naming_every_row_equal_dense_update() {
    let width = 3;
    let init: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    let grads: [Vec<f32>; 2] = [
        (0..12).map(|i| ((i * 7) % 5) as f32 * 0.1 - 0.2).collect(),
        (0..12).map(|i| ((i * 3) % 4) as f32 * 0.2 - 0.3).collect(),
    ];
    for opt in every_optimizer() {
        let mut dense = init.clone();
        let mut dense_slots = opt.new_slots("emb", dense.len());
        let mut sparse = init.clone();
        let mut sparse_slots = opt.new_slots("emb", sparse.len());
        for (k, g) in grads.iter().enumerate() {
            let step = k as u64 + 1;
            opt.apply_dense(&mut dense, g, &mut dense_slots, step)
                .unwrap();
            // Rows pushed out of order: the result must not depend on it.
            let ids = [2_u64, 0, 3, 1];
            let mut row_grads = Vec::new();
            for &id in &ids {
                let r = id as usize * width;
                row_grads.extend_from_slice(&g[r..r + width]);
            }
            opt.apply_rows(
                &mut sparse,
                width,
                &ids,
                &row_grads,
                &mut sparse_slots,
                step,
            )
            .unwrap();
        }
        assert_close(&sparse, &dense, 1e-6);
        for ((name_d, d), (name_s, s)) in dense_slots.iter().zip(sparse_slots.iter()) {
            assert_eq!(name_d, name_s);
            assert_close(s, d, 1e-6);
        }
    }
}

#[test]
fn rows_update_only_named_rows_and_their_slots() {
    for opt in every_optimizer() {
        let mut p = vec![1.0_f32; 8];
        let mut slots = opt.new_slots("emb", 8);
        let before_slots = slots.clone();
        opt.apply_rows(&mut p, 2, &[2], &[0.5, 0.5], &mut slots, 1)
            .unwrap();
        for row in [0, 1, 3] {
            assert_eq!(&p[row * 2..row * 2 + 2], &[1.0, 1.0], "{opt:?} row {row}");
            for ((_, now), (_, was)) in slots.iter().zip(before_slots.iter()) {
                assert_eq!(&now[row * 2..row * 2 + 2], &was[row * 2..row * 2 + 2]);
            }
        }
        assert!(p[4] < 1.0 && p[5] < 1.0, "{opt:?}: row 2 unchanged: {p:?}");
    }
}

#[test]
fn duplicate_row_ids_are_summed_before_the_update() {
    // Adagrad is not linear in the gradient, so summing first differs from two updates.
    for opt in every_optimizer() {
        let mut with_dups = vec![0.5_f32; 4];
        let mut slots_dups = opt.new_slots("emb", 4);
        opt.apply_rows(
            &mut with_dups,
            2,
            &[1, 0, 1],
            &[0.25, -0.5, 1.0, 1.0, 0.75, 0.25],
            &mut slots_dups,
            1,
        )
        .unwrap();
        let mut summed = vec![0.5_f32; 4];
        let mut slots_summed = opt.new_slots("emb", 4);
        opt.apply_rows(
            &mut summed,
            2,
            &[1, 0],
            &[1.0, -0.25, 1.0, 1.0],
            &mut slots_summed,
            1,
        )
        .unwrap();
        assert_close(&with_dups, &summed, 1e-6);
    }
}

#[test]
fn non_finite_gradient_is_skipped_and_counted_by_default() {
    for opt in every_optimizer() {
        assert_eq!(opt.non_finite_policy(), NonFinitePolicy::Skip);
        let mut p = vec![1.0_f32, 2.0];
        let mut slots = opt.new_slots("w", 2);
        let before = slots.clone();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let outcome = opt.apply_dense(&mut p, &[0.1, bad], &mut slots, 1).unwrap();
            assert_eq!(outcome, UpdateOutcome::SkippedNonFinite);
        }
        let outcome = opt
            .apply_rows(&mut p, 1, &[1], &[f32::NAN], &mut slots, 1)
            .unwrap();
        assert_eq!(outcome, UpdateOutcome::SkippedNonFinite);
        assert_eq!(p, [1.0, 2.0]);
        assert_eq!(slots.skipped_non_finite(), 4);
        for ((_, now), (_, was)) in slots.iter().zip(before.iter()) {
            assert_eq!(now, was);
        }
    }
}

#[test]
fn finite_row_gradients_that_sum_to_infinity_are_screened() {
    let opt = Optimizer::sgd(1.0);
    let mut p = vec![0.0_f32; 2];
    let mut slots = opt.new_slots("emb", 2);
    let outcome = opt
        .apply_rows(&mut p, 1, &[0, 0], &[f32::MAX, f32::MAX], &mut slots, 1)
        .unwrap();
    assert_eq!(outcome, UpdateOutcome::SkippedNonFinite);
    assert_eq!(p, [0.0, 0.0]);
}

#[test]
fn non_finite_gradient_is_an_error_under_the_error_policy() {
    let opt = Optimizer::adam(0.1).with_non_finite_policy(NonFinitePolicy::Error);
    let mut p = vec![1.0_f32, 2.0];
    let mut slots = opt.new_slots("dense/kernel", 2);
    let err = opt
        .apply_dense(&mut p, &[0.1, f32::NAN], &mut slots, 1)
        .unwrap_err();
    assert!(
        matches!(err, OptimError::NonFinite { index: 1, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("dense/kernel"), "{err}");
    assert_eq!(p, [1.0, 2.0]);
    assert_eq!(slots.get("m").unwrap(), [0.0, 0.0]);
    assert_eq!(slots.skipped_non_finite(), 0);
}

#[test]
fn mismatches_are_errors_naming_the_variable_before_any_change() {
    let opt = Optimizer::momentum(0.1, 0.9);
    let mut p = vec![1.0_f32; 6];
    let mut slots = opt.new_slots("layer/kernel", 6);
    let before = slots.clone();
    let errors = [
        opt.apply_dense(&mut p, &[1.0; 5], &mut slots, 1)
            .unwrap_err(),
        opt.apply_dense(&mut p[..4], &[1.0; 4], &mut slots, 1)
            .unwrap_err(),
        opt.apply_dense(&mut p, &[1.0; 6], &mut slots, 0)
            .unwrap_err(),
        opt.apply_rows(&mut p, 4, &[0], &[1.0; 4], &mut slots, 1)
            .unwrap_err(),
        opt.apply_rows(&mut p, 0, &[], &[], &mut slots, 1)
            .unwrap_err(),
        opt.apply_rows(&mut p, 2, &[0, 1], &[1.0; 3], &mut slots, 1)
            .unwrap_err(),
        opt.apply_rows(&mut p, 2, &[0, 3], &[1.0; 4], &mut slots, 1)
            .unwrap_err(),
    ];
    assert!(matches!(
        errors[0],
        OptimError::GradientLength {
            expected: 6,
            got: 5,
            ..
        }
    ));
    assert!(matches!(
        errors[1],
        OptimError::ParamsLength {
            expected: 6,
            got: 4,
            ..
        }
    ));
    assert!(matches!(errors[2], OptimError::ZeroStep { .. }));
    assert!(matches!(
        errors[3],
        OptimError::RowWidth { row_width: 4, .. }
    ));
    assert!(matches!(
        errors[4],
        OptimError::RowWidth { row_width: 0, .. }
    ));
    assert!(matches!(
        errors[5],
        OptimError::RowGradientLength { got: 3, .. }
    ));
    assert!(matches!(
        errors[6],
        OptimError::RowOutOfRange {
            row: 3,
            rows: 3,
            ..
        }
    ));
    for err in &errors {
        assert!(err.to_string().contains("layer/kernel"), "{err}");
    }
    assert_eq!(p, [1.0; 6]);
    assert_eq!(slots, before);
}

#[test]
fn slots_of_another_optimizer_are_refused() {
    let adam = Optimizer::adam(0.1);
    let mut slots = Optimizer::sgd(0.1).new_slots("w", 1);
    let err = adam
        .apply_dense(&mut [1.0], &[1.0], &mut slots, 1)
        .unwrap_err();
    assert!(
        matches!(&err, OptimError::MissingSlot { slot, .. } if slot == "m"),
        "{err:?}"
    );
}

#[test]
fn invalid_hyperparameters_are_refused() {
    let cases = [
        Optimizer::sgd(-0.1),
        Optimizer::sgd(f32::NAN),
        Optimizer::momentum(0.1, 1.0),
        Optimizer::new(OptimizerKind::Adam {
            learning_rate: 0.1,
            beta_1: 0.9,
            beta_2: 1.5,
            epsilon: 1e-7,
        }),
        Optimizer::new(OptimizerKind::RmsProp {
            learning_rate: 0.1,
            rho: 1.0,
            momentum: 0.0,
            epsilon: 1e-7,
            centered: false,
        }),
        // FTRL divides by its rate: zero is refused, as are a positive power and a negative L1.
        Optimizer::ftrl(0.0, 0.0, 0.0),
        Optimizer::ftrl(0.1, -1.0, 0.0),
        Optimizer::new(OptimizerKind::Ftrl {
            learning_rate: 0.1,
            learning_rate_power: 0.5,
            initial_accumulator_value: 0.1,
            l1: 0.0,
            l2: 0.0,
            l2_shrinkage: 0.0,
            beta: 0.0,
        }),
    ];
    for opt in cases {
        let mut slots = opt.new_slots("w", 1);
        let mut p = [1.0_f32];
        let err = opt.apply_dense(&mut p, &[1.0], &mut slots, 1).unwrap_err();
        assert!(matches!(err, OptimError::Hyperparameter { .. }), "{err:?}");
        assert_eq!(p, [1.0]);
    }
}

#[test]
fn slots_export_and_restore_by_name() {
    let opt = Optimizer::adam(0.05);
    let mut p = vec![0.5_f32, -0.5, 0.25];
    let mut slots = opt.new_slots("w", 3);
    opt.apply_dense(&mut p, &[0.1, 0.2, f32::NAN], &mut slots, 1)
        .unwrap();
    opt.apply_dense(&mut p, &[0.1, 0.2, 0.3], &mut slots, 1)
        .unwrap();
    let exported: Vec<(String, Vec<f32>)> = slots
        .iter()
        .map(|(name, values)| (name.to_owned(), values.to_vec()))
        .collect();
    // Restore in reverse order: names, not positions, matter.
    let restored = Slots::restore(
        &opt,
        "w",
        3,
        exported.iter().rev().cloned(),
        slots.skipped_non_finite(),
    )
    .unwrap();
    assert_eq!(restored, slots);

    // Continuing from the restored slots gives the same bits as continuing from the originals.
    let mut p2 = p.clone();
    let mut restored = restored;
    opt.apply_dense(&mut p, &[0.3, 0.2, 0.1], &mut slots, 2)
        .unwrap();
    opt.apply_dense(&mut p2, &[0.3, 0.2, 0.1], &mut restored, 2)
        .unwrap();
    assert_eq!(p, p2);
}

#[test]
fn restore_refuses_unknown_missing_and_short_slots() {
    let opt = Optimizer::adam(0.1);
    let unknown = Slots::restore(&opt, "w", 1, [("m", vec![0.0]), ("velocity", vec![0.0])], 0);
    assert!(matches!(unknown, Err(OptimError::UnknownSlot { .. })));
    let missing = Slots::restore(&opt, "w", 1, [("m", vec![0.0])], 0);
    assert!(matches!(
        missing,
        Err(OptimError::MissingSlot { ref slot, .. }) if slot == "v"
    ));
    let short = Slots::restore(&opt, "w", 2, [("m", vec![0.0]), ("v", vec![0.0, 0.0])], 0);
    let err = short.unwrap_err();
    assert!(matches!(
        err,
        OptimError::SlotLength {
            expected: 2,
            got: 1,
            ..
        }
    ));
    assert!(err.to_string().contains("`m`"), "{err}");
}

#[test]
fn adamw_decays_each_parameter_by_lr_times_weight_decay_before_adam() {
    let adamw = Optimizer::adamw(0.1, 0.5);
    let mut params = vec![2.0_f32, -4.0];
    let mut slots = adamw.new_slots("w", 2);
    // A zero gradient: Adam's step is zero, only the decay moves the parameters.
    adamw
        .apply_dense(&mut params, &[0.0, 0.0], &mut slots, 1)
        .unwrap();
    assert_eq!(params, [2.0 * 0.95, -4.0 * 0.95]);
    // Rows: only the pushed row decays.
    let mut table = vec![1.0_f32; 4];
    let mut slots = adamw.new_slots("t", 4);
    adamw
        .apply_rows(&mut table, 2, &[1], &[0.0, 0.0], &mut slots, 1)
        .unwrap();
    assert_eq!(table, [1.0, 1.0, 0.95, 0.95]);
    assert!(Optimizer::adamw(0.1, -1.0).validate().is_err());
    assert_eq!(
        Optimizer::adamw(0.1, 0.5)
            .with_learning_rate(0.3)
            .learning_rate(),
        0.3
    );
}

//! `[eval]`: the papers' evaluation points and selection rules as options
//! of every run, on the bundled digits.

use crate::digits::run;

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().expect("a number")
}

#[test]
fn scoring_before_training_too_changes_no_training() {
    let o = ["algorithm.name=pfedgraph", "rounds=5"];
    let (plain, r0) = run(&o);
    let (both, r1) = run(&[o[0], o[1], "eval.when=before_and_after"]);
    for (a, b) in r0.iter().zip(&r1) {
        // Evaluation draws no randomness: training and graphs are the same.
        assert_eq!(a["graph"], b["graph"]);
        assert_eq!(a["mean_test_acc"], b["mean_test_acc"]);
        assert!(a.get("mean_test_acc_before").is_none());
        let before = f(&b["mean_test_acc_before"]);
        assert!((0.0..=1.0).contains(&before));
    }
    // Round 1's "before" models are the common init: chance level.
    assert!(f(&r1[0]["mean_test_acc_before"]) < 0.3);
    // Each client's best round is still a round of the run.
    for (i, b) in both.per_client_best_round.iter().enumerate() {
        assert!(b.is_some_and(|r| (1..=5).contains(&r)), "client {i}");
    }
    assert_ne!(plain.mean_test_acc, None);
}

/// FedAvg-FT reports the global model fine-tuned: the model it holds
/// before training (the global one, not fine-tuned) is never scored, as in
/// pFedGraph's `fedavg_ft.py`, so `before_and_after` leaves its whole
/// summary as it is; plain FedAvg's global model is scored at both points.
#[test]
fn fedavg_ft_is_scored_after_fine_tuning_only() {
    let o = ["algorithm.name=fedavg-ft", "rounds=4"];
    let (after, r0) = run(&o);
    let (both, r1) = run(&[o[0], o[1], "eval.when=before_and_after"]);
    let untimed = |rounds: Vec<serde_json::Value>| -> Vec<serde_json::Value> {
        rounds
            .into_iter()
            .map(|mut r| {
                r.as_object_mut().unwrap().remove("seconds");
                r
            })
            .collect()
    };
    let r1 = untimed(r1);
    assert_eq!(untimed(r0), r1);
    assert!(r1.iter().all(|r| r.get("mean_test_acc_before").is_none()));
    assert_eq!(after.mean_test_acc, both.mean_test_acc);
    assert_eq!(after.per_client_best_round, both.per_client_best_round);
    let (_, r2) = run(&["algorithm.name=fedavg", o[1], "eval.when=before_and_after"]);
    assert!(r2.iter().all(|r| r.get("mean_test_acc_before").is_some()));
}

#[test]
fn every_selection_rule_is_reported_and_the_chosen_one_is_selected() {
    let mut figures = Vec::new();
    for rule in [
        "per_client_best_val",
        "best_round_mean_val",
        "max_round_mean",
        "last",
    ] {
        let (s, rounds) = run(&[
            "algorithm.name=fedavg-ft",
            "rounds=4",
            "participation=0.5",
            &format!("eval.select={rule}"),
        ]);
        assert_eq!(s.selection_rule, rule);
        let want = match rule {
            "per_client_best_val" => s.mean_test_acc,
            "best_round_mean_val" => s.best_round_mean_val_test_acc,
            "max_round_mean" => s.max_round_participant_test_acc,
            _ => s.last_round_mean_test_acc,
        };
        assert_eq!(s.selected_test_acc, want, "{rule}");
        // The best-validation round: its mean validation is the max, and
        // the figure is that round's mean test accuracy.
        let k = s.best_round_mean_val_round.unwrap();
        let best_val = rounds
            .iter()
            .map(|r| f(&r["mean_val_acc"]))
            .fold(0.0, f64::max);
        assert_eq!(f(&rounds[k - 1]["mean_val_acc"]), best_val);
        assert_eq!(
            s.best_round_mean_val_test_acc,
            Some(f(&rounds[k - 1]["mean_test_acc"]))
        );
        // Half the clients take part: the participants' figure is its own.
        let part: Vec<f64> = rounds
            .iter()
            .map(|r| f(&r["participant_test_acc"]))
            .collect();
        assert_eq!(
            s.max_round_participant_test_acc,
            part.iter().copied().reduce(f64::max)
        );
        assert!(
            rounds
                .iter()
                .any(|r| r["participant_test_acc"] != r["mean_test_acc"])
        );
        figures.push(s.selected_test_acc.unwrap());
    }
    // Same runs, different rules: the figures are not all the same number.
    assert!(figures.iter().any(|x| *x != figures[0]), "{figures:?}");
}

#[test]
fn unknown_eval_options_are_clear_errors() {
    let base = crate::digits::BASE;
    for (o, needle) in [
        ("eval.when=sometimes", "sometimes"),
        ("eval.select=best", "best"),
        ("eval.every=2", "every"),
    ] {
        let err = fedweave_sim::ExperimentConfig::from_toml_str(base, &[o.to_string()])
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{o}: {err}");
    }
}

/// SFL's best and worst 5 %: with 21 clients, 3 of them sign-flip
/// attackers, ⌈5 % · 18⌉ = 1 benign client on each side; with all 21
/// benign, ⌈1.05⌉ = 2. Both figures are means of the same per-client
/// best-validation accuracies as the headline, malicious clients excluded.
#[test]
fn best_and_worst_five_percent_come_from_the_benign_per_client_figures() {
    for (attack, k) in [
        (&["attack.kind=sign_flip", "attack.ratio=0.15"][..], 1),
        (&[][..], 2),
    ] {
        let o = [
            &["clients=21", "rounds=2", "algorithm.name=local"][..],
            attack,
        ]
        .concat();
        let (s, _) = run(&o);
        let mut per: Vec<f64> = s.per_client_test_acc.iter().flatten().copied().collect();
        assert_eq!(per.len(), 21 - s.malicious.len());
        assert_eq!(s.malicious.len(), if k == 1 { 3 } else { 0 });
        per.sort_by(f64::total_cmp);
        let n = per.len();
        let top: f64 = per[n - k..].iter().sum::<f64>() / k as f64;
        let bottom: f64 = per[..k].iter().sum::<f64>() / k as f64;
        assert_eq!(s.top5pct_test_acc, Some(top));
        assert_eq!(s.bottom5pct_test_acc, Some(bottom));
        if k == 1 {
            assert_eq!(s.bottom5pct_test_acc, s.min_test_acc);
        }
        assert!(top > bottom, "{top} vs {bottom}");
    }
}

//! Robust aggregation against model poisoning, end to end on IID digits:
//! with 30 % sign-flip or Gaussian attackers plain FedAvg collapses while
//! FedAvg behind a median, a trimmed mean or Krum keeps its clean accuracy.
//! Accuracies are the last round's: the best-validation headline would
//! remember the rounds before a collapse.

use crate::digits::run;
use fedweave_sim::Summary;

fn acc(s: &Summary) -> f64 {
    s.last_round_mean_test_acc.unwrap()
}

#[test]
fn median_trimmed_mean_and_krum_keep_fedavg_clean_under_attack() {
    let base = ["algorithm.name=fedavg", "partition.kind=iid"];
    let (clean, _) = run(&base);
    // Krum returns one client's model per round, so even without attackers
    // it gives up some of averaging's accuracy (Blanchard et al., §5): it is
    // held to its own clean accuracy, and to 10 points of FedAvg's.
    let (krum_clean, _) = run(&[&base[..], &["aggregator.kind=krum"]].concat());
    assert!(
        acc(&krum_clean) > acc(&clean) - 0.10,
        "clean Krum {}",
        acc(&krum_clean)
    );
    for attack in ["sign_flip", "gaussian"] {
        let kind = format!("attack.kind={attack}");
        let attacked = [&base[..], &[&kind, "attack.ratio=0.3"]].concat();
        let (plain, _) = run(&attacked);
        assert!(acc(&plain) < 0.5, "{attack}: plain FedAvg {}", acc(&plain));
        for defence in [
            &["aggregator.kind=median"][..],
            &["aggregator.kind=trimmed_mean", "aggregator.trim=0.3"],
            &["aggregator.kind=krum"],
            &["aggregator.kind=multi_krum"],
        ] {
            let (s, rounds) = run(&[&attacked[..], defence].concat());
            let reference = if defence[0] == "aggregator.kind=krum" {
                &krum_clean
            } else {
                &clean
            };
            assert!(
                acc(&s) > acc(reference) - 0.05,
                "{attack} + {defence:?}: {} vs clean {}",
                acc(&s),
                acc(reference)
            );
            if defence[0].ends_with("krum") {
                // Krum's drops are the attackers' uploads.
                for r in &rounds {
                    let dropped: Vec<usize> =
                        serde_json::from_value(r["rejected"].clone()).unwrap();
                    for m in &s.malicious {
                        assert!(dropped.contains(m), "{attack}: attacker {m} kept");
                    }
                }
            }
        }
    }
}

#[test]
fn norm_clipping_bounds_the_damage_of_a_flipped_update() {
    let attacked = [
        "algorithm.name=fedavg",
        "partition.kind=iid",
        "attack.kind=sign_flip",
        "attack.ratio=0.3",
    ];
    let (plain, _) = run(&attacked);
    let (clipped, _) = run(&[
        &attacked[..],
        &["aggregator.kind=norm_clip", "aggregator.clip=1.0"],
    ]
    .concat());
    assert!(
        acc(&clipped) > acc(&plain) + 0.2,
        "clipped {} vs plain {}",
        acc(&clipped),
        acc(&plain)
    );
}

#[test]
fn robust_aggregation_is_a_server_option_with_checked_settings() {
    let base = crate::digits::BASE;
    let cfg = |o: &[&str]| {
        let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
        fedweave_sim::ExperimentConfig::from_toml_str(base, &o)
    };
    let err = cfg(&["aggregator.kind=trimmed_mean", "aggregator.trim=0.6"]).unwrap_err();
    assert!(err.to_string().contains("aggregator.trim"), "{err}");
    let err = cfg(&["aggregator.kind=geomedian"]).unwrap_err();
    assert!(err.to_string().contains("geomedian"), "{err}");
    // DPFL has no server: a clear error, not a silently ignored option.
    let c = cfg(&["algorithm.name=dpfl", "aggregator.kind=median"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = fedweave_sim::run_experiment(&c, dir.path(), &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("aggregator.kind"), "{err}");
}

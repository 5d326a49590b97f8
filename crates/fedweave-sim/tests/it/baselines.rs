//! The baselines the seed papers compare against, end to end on the bundled
//! digits (ten clients, two classes each, MLP, ten rounds): personalised
//! methods must beat FedAvg clearly on the pathological split (last round)
//! and not lose to Local (best-validation headline); on IID data the
//! shared-body methods must keep FedAvg-FT's accuracy; every method's results must not depend on the thread count.
//! Checkpoint/resume equality and partial participation are checked for
//! every catalogue name in `resume.rs` and `fedweave-sim`'s unit tests.

use crate::digits::{acc, run};
use fedweave_sim::Summary;

/// Personalised baselines (issues 11 and 12), each held to "FedAvg + 10 points and
/// at least Local − 3 points" on pathological digits.
const PERSONALIZED: &[&str] = &[
    "ditto",
    "apfl",
    "fedala",
    "fedrep",
    "fedper",
    "lg-fedavg",
    "fedbabu",
    "fedpac",
    "fedcp",
    "fedrod",
    "fedproto",
    "knn-per",
    "fedphp",
    "fedfomo",
    "l2c",
    "apple",
    "pfedhn",
    "pfedla",
];

/// Methods that share a body or a global model and must stay within 3
/// points of FedAvg-FT on IID digits.
const IID_LIKE_FEDAVG_FT: &[&str] = &["ditto", "apfl", "fedala", "fedrep", "fedper"];

/// Every baseline of issues 11 and 12 (determinism across thread counts).
const ALL: &[&str] = &[
    "ditto",
    "apfl",
    "fedala",
    "fedrep",
    "fedper",
    "lg-fedavg",
    "fedbabu",
    "fedbn",
    "fedpac",
    "fedcp",
    "fedrod",
    "fedproto",
    "knn-per",
    "fedphp",
    "fedfomo",
    "l2c",
    "apple",
    "pfedhn",
    "pfedla",
];

/// The last round's mean test accuracy. The per-client best-validation
/// headline flatters FedAvg on two-class clients: its global model swings
/// from round to round between the classes it favours, and each client's
/// best round is one where it favoured that client's two (FedAvg: 0.94
/// headline, 0.84 last round); personalised models do not swing.
fn last(s: &Summary) -> f64 {
    s.last_round_mean_test_acc.unwrap()
}

#[test]
fn personalized_baselines_beat_fedavg_and_keep_up_with_local_on_two_class_clients() {
    let (fedavg, _) = run(&["algorithm.name=fedavg"]);
    let (local, _) = run(&["algorithm.name=local"]);
    let mut failures = Vec::new();
    for name in PERSONALIZED {
        let (s, _) = run(&[&format!("algorithm.name={name}")]);
        if last(&s) < last(&fedavg) + 0.10 || acc(&s) < acc(&local) - 0.03 {
            failures.push(format!(
                "{name}: last round {:.4} (FedAvg {:.4}), best-validation {:.4} (Local {:.4})",
                last(&s),
                last(&fedavg),
                acc(&s),
                acc(&local)
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn shared_body_baselines_match_fedavg_ft_on_iid_data() {
    let (ft, _) = run(&["algorithm.name=fedavg-ft", "partition.kind=iid"]);
    let mut failures = Vec::new();
    for name in IID_LIKE_FEDAVG_FT {
        let (s, _) = run(&[&format!("algorithm.name={name}"), "partition.kind=iid"]);
        if (acc(&s) - acc(&ft)).abs() > 0.03 {
            failures.push(format!(
                "{name}: {:.4} vs FedAvg-FT {:.4}",
                acc(&s),
                acc(&ft)
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn baselines_do_not_depend_on_the_thread_count() {
    let strip = |s: &Summary| {
        let mut v = serde_json::to_value(s).unwrap();
        let o = v.as_object_mut().unwrap();
        for k in ["wall_seconds", "seconds_per_round_median", "threads"] {
            o.remove(k);
        }
        v
    };
    for name in ALL {
        let algo = format!("algorithm.name={name}");
        let (one, r1) = run(&[&algo, "threads=1", "rounds=3"]);
        let (two, r2) = run(&[&algo, "threads=2", "rounds=3"]);
        assert_eq!(strip(&one), strip(&two), "{name}");
        for (a, b) in r1.iter().zip(&r2) {
            assert_eq!(a["graph"], b["graph"], "{name}");
            assert_eq!(a["graph_layers"], b["graph_layers"], "{name}");
        }
    }
}

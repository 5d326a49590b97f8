//! What a round accepts from a client, checked once for every runtime.
//!
//! The simulator and the networked runtimes (`fedweave-net`'s server and
//! peers) call these same functions on what arrives: a hello (sizes and
//! shapes, against what the receiver derives from its own config), an
//! upload (only from a participant, once, with a sound training loss and,
//! where the defence needs one, a sound origin), a score (finite, in its
//! range), and, on the client's side, a download (the algorithm's
//! [`Algorithm::check_download`]: a hostile server cannot crash or poison
//! a client with a wrong-shaped or non-finite message). In a simulation everything passes — the checks hold for
//! every honest value by construction, so a simulated run is unchanged —
//! and a networked run refuses exactly what a simulation could never
//! produce.

use crate::protocol::Score;
use crate::runtime::ClientInfo;
use fedweave_algos::{Algorithm, Env, Message};

/// The largest number of samples a client may claim in any split when the
/// receiver cannot derive its data (`data.dataset = "csv"`, natural
/// clients whose files only they hold), unless the server is told
/// otherwise (`fedweave serve --max-client-samples`).
pub const DEFAULT_MAX_CLIENT_SAMPLES: usize = 1_000_000;

/// Client `client`'s download of round `round` if it passes the
/// algorithm's check; a refused one is logged and dropped (the client
/// keeps its state, as if nothing had been sent).
pub fn admit_download<A: Algorithm>(
    algo: &A,
    env: &Env,
    client: usize,
    round: usize,
    down: A::Down,
) -> Option<A::Down> {
    match algo.check_download(env, &down) {
        Ok(()) => Some(down),
        Err(why) => {
            tracing::warn!(
                client,
                round,
                "download refused ({why}); the client keeps its state"
            );
            None
        }
    }
}

/// Whether `score` is a score an honest client can compute: every figure
/// finite; accuracies in [0, 1]; errors (MAE, RMSE, MAPE) non-negative;
/// the figure selection compares equal to the one reported (accuracy) or
/// its negation (regression's MAE).
pub fn check_score(score: &Score, regression: bool) -> Result<(), String> {
    let t = &score.test;
    let figures = [
        ("val_score", score.val_score),
        ("val_reported", score.val_reported),
        ("test accuracy", t.acc),
        ("test MAE", t.mae),
        ("test RMSE", t.rmse),
        ("test MAPE", t.mape),
    ];
    if let Some((name, v)) = figures.iter().find(|(_, v)| !v.is_finite()) {
        return Err(format!("{name} is {v}, not a finite number"));
    }
    if let Some((name, v)) = figures[2..].iter().find(|(_, v)| *v < 0.0) {
        return Err(format!("{name} is {v}, below 0"));
    }
    if t.acc > 1.0 {
        return Err(format!("test accuracy {} is above 1", t.acc));
    }
    if regression {
        if score.val_reported < 0.0 || score.val_score != -score.val_reported {
            return Err(format!(
                "validation MAE {} and its selection figure {} disagree",
                score.val_reported, score.val_score
            ));
        }
    } else if !(0.0..=1.0).contains(&score.val_reported) || score.val_score != score.val_reported {
        return Err(format!(
            "validation accuracy {} (selection figure {}) is not in [0, 1]",
            score.val_reported, score.val_score
        ));
    }
    Ok(())
}

/// Whether an upload's mean training loss is a number (a hostile `NaN`
/// would make the round's mean training loss `NaN`).
pub fn check_loss(loss: f64) -> Result<(), String> {
    if loss.is_finite() {
        Ok(())
    } else {
        Err(format!("training loss {loss} is not a finite number"))
    }
}

/// Whether an upload's origin (the model its training started from, which
/// norm clipping measures the update from) is sound: present when the
/// defence `wanted` it and the upload carries a model, as long as the
/// whole model (`model_len`) or the upload's model vector, and finite. An
/// empty or `NaN` origin would let an update skip the clipping.
pub fn check_origin<U: Message>(
    up: &U,
    origin: Option<&[f32]>,
    wanted: bool,
    model_len: usize,
) -> Result<(), String> {
    let vectors = up.vectors();
    let Some(model) = vectors.first() else {
        return Ok(());
    };
    let Some(origin) = origin else {
        return if wanted {
            Err("no origin: the defence needs where training started".into())
        } else {
            Ok(())
        };
    };
    if origin.len() != model_len && origin.len() != model.len() {
        return Err(format!(
            "origin has {} values, the model {model_len} (the upload's model {})",
            origin.len(),
            model.len()
        ));
    }
    if let Some(k) = origin.iter().position(|x| !x.is_finite()) {
        return Err(format!("origin value {k} is {}", origin[k]));
    }
    Ok(())
}

/// Whether client `i`'s hello agrees with what the receiver derived from
/// its own config: `expected` is the full hello where the receiver derives
/// the client's data (every partition of a dataset it reads: the hello
/// must equal it), else the shape fields alone (`csv`: the sizes are the
/// client's own, then bounded by `max_samples` per split and checked for
/// consistency with the label counts).
pub fn check_hello(
    expected: &ClientInfo,
    derived_sizes: bool,
    got: &ClientInfo,
    max_samples: usize,
) -> Result<(), String> {
    let shape = |c: &ClientInfo| {
        (
            c.dataset.clone(),
            c.num_classes,
            c.feature_shape.clone(),
            c.outputs,
            c.regression,
        )
    };
    if shape(got) != shape(expected) {
        return Err(format!(
            "the client runs dataset `{}` ({} classes, samples of shape {:?}, {} outputs{}), \
             the server's config gives `{}` ({} classes, shape {:?}, {} outputs{}): \
             start it with the server's config",
            got.dataset,
            got.num_classes,
            got.feature_shape,
            got.outputs,
            if got.regression { ", regression" } else { "" },
            expected.dataset,
            expected.num_classes,
            expected.feature_shape,
            expected.outputs,
            if expected.regression {
                ", regression"
            } else {
                ""
            },
        ));
    }
    if derived_sizes {
        if got != expected {
            return Err(format!(
                "the client reports {} training and {} test samples (per class {:?}), \
                 the server's config gives it {} and {} (per class {:?}): \
                 start it with the server's config",
                got.size,
                got.test_size,
                got.counts.train,
                expected.size,
                expected.test_size,
                expected.counts.train
            ));
        }
        return Ok(());
    }
    let [train, val, test] = got.counts.samples;
    if let Some(n) = [train, val, test].into_iter().find(|&n| n > max_samples) {
        return Err(format!(
            "the client claims {n} samples in one split, more than the limit of {max_samples} \
             (fedweave serve --max-client-samples)"
        ));
    }
    if train == 0 {
        return Err("the client claims no training samples".into());
    }
    if train.checked_add(val) != Some(got.size) || got.test_size != test {
        return Err(format!(
            "sizes disagree: {} training and {} test samples, but {train} + {val} and {test} \
             in its splits",
            got.size, got.test_size
        ));
    }
    let per_class = [
        (&got.counts.train, train),
        (&got.counts.val, val),
        (&got.counts.test, test),
    ];
    let classes = if got.regression { 0 } else { got.num_classes };
    for (counts, total) in per_class {
        if counts.len() != classes
            || counts
                .iter()
                .try_fold(0usize, |s, &c| s.checked_add(c))
                .is_none_or(|s| classes > 0 && s != total)
        {
            return Err(format!(
                "per-class counts {counts:?} do not add up to {total} over {classes} classes"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::TestMetrics;
    use fedweave_data::ClientLabelCounts;

    fn score(val: f64, acc: f64) -> Score {
        Score {
            val_score: val,
            val_reported: val,
            test: TestMetrics {
                acc,
                ..Default::default()
            },
        }
    }

    #[test]
    fn scores_must_be_finite_and_in_range() {
        assert!(check_score(&score(0.5, 0.75), false).is_ok());
        assert!(check_score(&score(0.0, 1.0), false).is_ok());
        assert!(check_score(&Score::default(), false).is_ok());
        for bad in [
            score(f64::NAN, 0.5),
            score(0.5, f64::NAN),
            score(0.5, 7.0),
            score(1.5, 0.5),
            score(-0.1, 0.5),
            score(0.5, f64::INFINITY),
            Score {
                val_score: 1.0,
                ..score(0.5, 0.5)
            },
        ] {
            assert!(check_score(&bad, false).is_err(), "{bad:?}");
        }
        let reg = Score {
            val_score: -2.0,
            val_reported: 2.0,
            test: TestMetrics {
                acc: 0.0,
                mae: 2.5,
                rmse: 3.0,
                mape: 12.0,
            },
        };
        assert!(check_score(&reg, true).is_ok());
        assert!(check_score(&reg, false).is_err());
        let mut bad = reg;
        bad.test.mae = -1.0;
        assert!(check_score(&bad, true).is_err());
        bad = reg;
        bad.val_score = 2.0;
        assert!(check_score(&bad, true).is_err());
    }

    #[test]
    fn origins_are_checked_like_uploads() {
        let up = vec![1.0f32; 4];
        assert!(check_origin(&up, None, false, 4).is_ok());
        assert!(check_origin(&up, None, true, 4).is_err());
        assert!(check_origin(&up, Some(&[0.0; 4]), true, 4).is_ok());
        assert!(check_origin(&up, Some(&[0.0; 6]), true, 6).is_ok());
        assert!(check_origin(&up, Some(&[]), true, 4).is_err());
        assert!(check_origin(&up, Some(&[0.0, f32::NAN, 0.0, 0.0]), true, 4).is_err());
        // An upload without a model vector has nothing to clip.
        assert!(check_origin(&(), None, true, 4).is_ok());
        assert!(check_loss(0.3).is_ok() && check_loss(-0.3).is_ok());
        assert!(check_loss(f64::NAN).is_err() && check_loss(f64::INFINITY).is_err());
    }

    fn info(train: [usize; 2], val: [usize; 2], test: [usize; 2]) -> ClientInfo {
        let s = |c: [usize; 2]| c[0] + c[1];
        ClientInfo {
            size: s(train) + s(val),
            test_size: s(test),
            counts: ClientLabelCounts {
                train: train.to_vec(),
                val: val.to_vec(),
                test: test.to_vec(),
                samples: [s(train), s(val), s(test)],
            },
            num_classes: 2,
            dataset: "csv".into(),
            feature_shape: vec![3],
            outputs: 2,
            regression: false,
        }
    }

    #[test]
    fn hellos_must_match_the_config_and_claimed_sizes_are_bounded_and_consistent() {
        let expected = info([0, 0], [0, 0], [0, 0]);
        let honest = info([40, 50], [5, 5], [20, 20]);
        assert!(check_hello(&expected, false, &honest, 1000).is_ok());
        // Derived sizes: the hello must be exactly the derived one.
        assert!(check_hello(&honest, true, &honest, 1000).is_ok());
        assert!(check_hello(&honest, true, &info([41, 50], [5, 5], [20, 20]), 1000).is_err());
        let mut other = honest.clone();
        other.feature_shape = vec![4];
        assert!(check_hello(&expected, false, &other, 1000).is_err());
        other = honest.clone();
        other.dataset = "digits".into();
        assert!(check_hello(&expected, false, &other, 1000).is_err());
        // Absurd or inconsistent sizes.
        assert!(check_hello(&expected, false, &info([600, 500], [0, 0], [1, 1]), 1000).is_err());
        other = honest.clone();
        other.size = usize::MAX;
        assert!(check_hello(&expected, false, &other, usize::MAX).is_err());
        other = honest.clone();
        other.counts.train = vec![usize::MAX, 2];
        assert!(check_hello(&expected, false, &other, usize::MAX).is_err());
        other = honest.clone();
        other.counts.test = vec![40];
        assert!(check_hello(&expected, false, &other, 1000).is_err());
        assert!(check_hello(&expected, false, &info([0, 0], [1, 1], [2, 2]), 1000).is_err());
    }
}

//! Model-poisoning and label-flip attacks (pFedGraph §1.8, DPFL §3.5), for
//! every algorithm.
//!
//! Malicious clients are drawn once from the seed. Model attacks overwrite a
//! malicious client's upload after local training; `label_flip` maps
//! y → C−1−y on its training and validation data.

use fedweave_core::{Purpose, rng_stream};
use rand::Rng;
use rand::seq::SliceRandom;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

/// The attack kinds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttackKind {
    /// No attack.
    #[default]
    None,
    /// Random permutation of the flat parameter vector.
    Shuffle,
    /// Every parameter set to 1.0.
    SameValue,
    /// θ ← −θ.
    SignFlip,
    /// Every parameter drawn from N(0, 1) (the code), or U(0, 1) (the paper)
    /// with `uniform = true`.
    Gaussian,
    /// θ ← θ_start − (θ_trained − θ_start): the update reversed.
    InvGrad,
    /// Labels y → C−1−y on the malicious clients' train and validation data.
    LabelFlip,
}

impl AttackKind {
    /// Names and descriptions for `fedweave list`.
    pub fn catalogue() -> &'static [(&'static str, &'static str)] {
        &[
            ("none", "no attack"),
            (
                "shuffle",
                "upload a random permutation of the trained parameters",
            ),
            ("same_value", "upload every parameter = 1.0"),
            ("sign_flip", "upload −θ"),
            (
                "gaussian",
                "upload N(0,1) noise (uniform = true: U(0,1), the paper's wording)",
            ),
            (
                "inv_grad",
                "upload θ_start − (θ − θ_start), the reversed update",
            ),
            ("label_flip", "train and validate on labels y → C−1−y"),
        ]
    }

    /// True for attacks that rewrite the uploaded model.
    pub fn poisons_models(self) -> bool {
        !matches!(self, Self::None | Self::LabelFlip)
    }
}

/// The malicious clients: round(ratio·N) of them, chosen from the seed, sorted.
pub fn choose_malicious(seed: u64, clients: usize, ratio: f64) -> Vec<usize> {
    let count = ((ratio * clients as f64).round() as usize).min(clients);
    let mut ids: Vec<usize> = (0..clients).collect();
    ids.shuffle(&mut rng_stream(seed, 0, u64::MAX, Purpose::Attack));
    let mut chosen = ids[..count].to_vec();
    chosen.sort_unstable();
    chosen
}

/// Overwrites `upload` (trained from `start`) according to `kind`.
pub fn poison(
    kind: AttackKind,
    uniform: bool,
    upload: &mut [f32],
    start: &[f32],
    seed: u64,
    round: usize,
    client: usize,
) {
    let mut rng = rng_stream(seed, round as u64, client as u64, Purpose::Attack);
    match kind {
        AttackKind::None | AttackKind::LabelFlip => {}
        AttackKind::Shuffle => upload.shuffle(&mut rng),
        AttackKind::SameValue => upload.fill(1.0),
        AttackKind::SignFlip => upload.iter_mut().for_each(|x| *x = -*x),
        AttackKind::Gaussian => {
            for x in upload.iter_mut() {
                *x = if uniform {
                    rng.random::<f32>()
                } else {
                    StandardNormal.sample(&mut rng)
                };
            }
        }
        AttackKind::InvGrad => {
            for (x, s) in upload.iter_mut().zip(start) {
                *x = s - (*x - s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malicious_set_is_seeded_and_sized() {
        let a = choose_malicious(7, 10, 0.4);
        assert_eq!(a.len(), 4);
        assert_eq!(a, choose_malicious(7, 10, 0.4));
        assert_eq!(choose_malicious(7, 10, 0.0), Vec::<usize>::new());
        assert_eq!(choose_malicious(7, 5, 0.5).len(), 3, "⌊r·N⌉ rounds half up");
    }

    #[test]
    fn attacks_do_what_they_say() {
        let start = [1.0f32, 1.0, 1.0, 1.0];
        let trained = [2.0f32, 0.0, 3.0, 1.0];
        let run = |k| {
            let mut u = trained;
            poison(k, false, &mut u, &start, 1, 1, 0);
            u
        };
        assert_eq!(run(AttackKind::SignFlip), [-2.0, 0.0, -3.0, -1.0]);
        assert_eq!(run(AttackKind::SameValue), [1.0; 4]);
        assert_eq!(run(AttackKind::InvGrad), [0.0, 2.0, -1.0, 1.0]);
        let mut s = run(AttackKind::Shuffle).to_vec();
        s.sort_by(f32::total_cmp);
        assert_eq!(s, [0.0, 1.0, 2.0, 3.0]);
        let mut u = [0.0f32; 1000];
        poison(AttackKind::Gaussian, true, &mut u, &[0.0; 1000], 1, 1, 0);
        assert!(u.iter().all(|x| (0.0..1.0).contains(x)));
        poison(AttackKind::Gaussian, false, &mut u, &[0.0; 1000], 1, 1, 0);
        assert!(u.iter().any(|x| *x < 0.0));
    }
}

//! DPFL's collaborator selection: GGC, the randomized double greedy of
//! Buchbinder et al. for non-monotone set functions, and BGGC, the same
//! decisions computed while streaming candidate models in batches.
//!
//! Client k maximises R(S) = −(its validation loss on the data-size-weighted
//! average of the models in S), S ∋ k. Starting from X = {k} and
//! Y = candidates ∪ {k}, each candidate j (in a seeded shuffle) is examined
//! once: a = max(R(X∪j) − R(X), 0), b = max(R(Y∖j) − R(Y), 0); j joins X
//! with probability a/(a+b) (1 when a = b = 0), else leaves Y. The search
//! stops as soon as the budget of collaborators is full.
//!
//! Rewards are only ever needed on weighted averages, so both sets are kept
//! as running f64 sums (Σ p_i w_i, Σ p_i) and each evaluation writes the
//! average into one reused buffer: a step costs at most two evaluations and
//! no allocation. GGC and BGGC share one decision core and perform exactly
//! the same arithmetic in the same order, so with the same seed they return
//! bit-identical results (the paper's Theorem 1), tested as a property.
//!
//! Random draws: first the shuffle of the candidates, then one uniform per
//! examined candidate, drawn even when the probability is 0 or 1, so the
//! stream's position never depends on the rewards.
//!
//! **Remark 3 does not hold as stated.** The paper says the chosen set is
//! never worse than the client alone. When a = b = 0 the candidate is added
//! with probability 1 although its marginal gain R(X∪j) − R(X) may be
//! negative (a = 0 only says the gain is not positive, and b = 0 says removing
//! j from Y does not help either). So R(X) can fall below R({k}); the tests
//! build such a case, and fedweave logs both rewards every round
//! (`selection` in `rounds.jsonl`) so runs show how often it happens.
//! [`SelectionRule::skip_when_no_gain`] drops such candidates instead, which makes
//! R(X) non-decreasing and Remark 3 true.

use rand::Rng;
use rand::seq::SliceRandom;

/// Scores an averaged model for one client (DPFL: minus the client's
/// validation loss on it). Higher is better.
pub trait AverageReward {
    /// The reward of `averaged_model`.
    fn reward(&mut self, averaged_model: &[f32]) -> f64;
}

impl<F: FnMut(&[f32]) -> f64> AverageReward for F {
    fn reward(&mut self, averaged_model: &[f32]) -> f64 {
        self(averaged_model)
    }
}

/// A model that may join the average: its owner, its data-size weight p_i
/// and its parameters.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    /// The owning client.
    pub id: usize,
    /// Data-size weight p_i (> 0).
    pub weight: f64,
    /// Its parameters.
    pub model: &'a [f32],
}

/// How many collaborators a client may choose, and what a candidate with
/// no gain either way (a = b = 0) gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelectionRule {
    /// B_c; `None` = no limit.
    pub limit: Option<usize>,
    /// Count the client itself in B_c (the authors' code) rather than only
    /// its collaborators (the paper).
    pub includes_self: bool,
    /// When a = b = 0, drop the candidate instead of adding it (the paper
    /// adds it). Then X only ever grows by candidates that raise R(X), so
    /// the chosen set is never worse than the client alone (Remark 3 holds).
    pub skip_when_no_gain: bool,
}

impl SelectionRule {
    /// Collaborators (excluding the client) the budget allows; `None` =
    /// unlimited.
    pub fn collaborators(&self) -> Option<usize> {
        self.limit.map(|b| {
            if self.includes_self {
                b.saturating_sub(1)
            } else {
                b
            }
        })
    }
}

/// What a selection returned.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// Chosen collaborators (the client excluded), in the order added.
    pub chosen: Vec<usize>,
    /// Reward evaluations spent.
    pub evaluations: usize,
    /// R({k}): the client alone.
    pub reward_alone: f64,
    /// R(X): the chosen set with the client.
    pub reward_chosen: f64,
}

/// A weighted sum of models, Σ p_i w_i and Σ p_i, in f64.
struct RunningSum {
    sum: Vec<f64>,
    weight: f64,
}

impl RunningSum {
    fn of(c: &Candidate) -> Self {
        let mut s = Self {
            sum: vec![0.0; c.model.len()],
            weight: 0.0,
        };
        s.add(c, 1.0);
        s
    }

    /// Adds `sign`·p_c·w_c.
    fn add(&mut self, c: &Candidate, sign: f64) {
        let p = sign * c.weight;
        for (s, &x) in self.sum.iter_mut().zip(c.model) {
            *s += p * f64::from(x);
        }
        self.weight += p;
    }

    /// Writes (sum + sign·p_c·w_c) / (weight + sign·p_c) into `out` without
    /// changing the sum; `c = None` writes the current average.
    fn average_with(&self, c: Option<&Candidate>, sign: f64, out: &mut [f32]) {
        match c {
            Some(c) => {
                let p = sign * c.weight;
                let total = self.weight + p;
                for ((o, &s), &x) in out.iter_mut().zip(&self.sum).zip(c.model) {
                    *o = ((s + p * f64::from(x)) / total) as f32;
                }
            }
            None => {
                for (o, &s) in out.iter_mut().zip(&self.sum) {
                    *o = (s / self.weight) as f32;
                }
            }
        }
    }
}

/// The decision state both GGC and BGGC drive: X and Y as running sums,
/// their cached rewards, and one scratch buffer for averages.
struct DoubleGreedy<'r, R: AverageReward> {
    own: usize,
    x: RunningSum,
    y: RunningSum,
    y_size: usize,
    reward_x: f64,
    reward_y: f64,
    reward_alone: f64,
    chosen: Vec<usize>,
    scratch: Vec<f32>,
    evaluations: usize,
    collaborators: Option<usize>,
    skip_when_no_gain: bool,
    reward: &'r mut R,
}

impl<'r, R: AverageReward> DoubleGreedy<'r, R> {
    /// X = {k}; Y = {k} until candidates are added with [`Self::add_to_y`].
    fn new(own: &Candidate, rule: SelectionRule, reward: &'r mut R) -> Self {
        let mut scratch = vec![0.0f32; own.model.len()];
        let x = RunningSum::of(own);
        x.average_with(None, 1.0, &mut scratch);
        let reward_x = sane(reward.reward(&scratch));
        Self {
            own: own.id,
            y: RunningSum::of(own),
            x,
            y_size: 1,
            reward_x,
            reward_y: reward_x,
            reward_alone: reward_x,
            chosen: Vec::new(),
            scratch,
            evaluations: 1,
            collaborators: rule.collaborators(),
            skip_when_no_gain: rule.skip_when_no_gain,
            reward,
        }
    }

    fn add_to_y(&mut self, c: &Candidate) {
        self.y.add(c, 1.0);
        self.y_size += 1;
    }

    /// R(Y) once Y holds every candidate.
    fn start(&mut self) {
        if self.y_size > 1 {
            self.y.average_with(None, 1.0, &mut self.scratch);
            self.reward_y = sane(self.reward.reward(&self.scratch));
            self.evaluations += 1;
        }
    }

    fn full(&self) -> bool {
        self.collaborators.is_some_and(|b| self.chosen.len() >= b)
    }

    /// Examines candidate `c` with the uniform draw `u`.
    fn examine(&mut self, c: &Candidate, u: f64) {
        debug_assert_ne!(c.id, self.own, "the client is not its own candidate");
        self.x.average_with(Some(c), 1.0, &mut self.scratch);
        let r_x_plus = sane(self.reward.reward(&self.scratch));
        // Y ∖ j is never empty (it keeps k); with Y = {k, j} it is {k}.
        self.y.average_with(Some(c), -1.0, &mut self.scratch);
        let r_y_minus = sane(self.reward.reward(&self.scratch));
        self.evaluations += 2;
        let a = (r_x_plus - self.reward_x).max(0.0);
        let b = (r_y_minus - self.reward_y).max(0.0);
        // A diverged average must not slip in through the a = b = 0 rule
        // (a NaN model also poisons Y's running sum, making b meaningless).
        let p = if r_x_plus == f64::NEG_INFINITY {
            0.0
        } else if a + b > 0.0 {
            a / (a + b)
        } else if self.skip_when_no_gain {
            0.0
        } else {
            1.0
        };
        if u < p {
            self.x.add(c, 1.0);
            self.reward_x = r_x_plus;
            self.chosen.push(c.id);
        } else {
            self.y.add(c, -1.0);
            self.y_size -= 1;
            self.reward_y = r_y_minus;
        }
    }

    fn finish(self) -> Selection {
        Selection {
            chosen: self.chosen,
            evaluations: self.evaluations,
            reward_alone: self.reward_alone,
            reward_chosen: self.reward_x,
        }
    }
}

/// A NaN reward (a diverged average) counts as −∞. A candidate whose
/// addition scores −∞ is never added (see `examine`); the engine already
/// refuses non-finite uploads, so this only guards rewards that overflow.
fn sane(r: f64) -> f64 {
    if r.is_nan() { f64::NEG_INFINITY } else { r }
}

/// The examination order and the uniforms: a shuffle of `0..n`, then one
/// draw per position (all drawn up front, so the stream never depends on
/// the rewards or on when the budget fills).
fn plan(n: usize, rng: &mut impl Rng) -> (Vec<usize>, Vec<f64>) {
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(rng);
    let draws = (0..n).map(|_| rng.random::<f64>()).collect();
    (order, draws)
}

/// GGC over candidates held in memory.
pub fn ggc(
    own: Candidate,
    candidates: &[Candidate],
    rule: SelectionRule,
    rng: &mut impl Rng,
    reward: &mut impl AverageReward,
) -> Selection {
    let (order, draws) = plan(candidates.len(), rng);
    let mut g = DoubleGreedy::new(&own, rule, reward);
    for c in candidates {
        g.add_to_y(c);
    }
    g.start();
    for (&pos, &u) in order.iter().zip(&draws) {
        if g.full() {
            break;
        }
        g.examine(&candidates[pos], u);
    }
    g.finish()
}

/// BGGC: the same decisions as [`ggc`] on the candidates `ids` (weights
/// `weights`), whose models are brought `batch` at a time by `fetch` — once
/// to build Y's running sum, once more in the shuffled order to decide — so
/// the client never holds more than `batch` peer models plus two sums.
#[allow(clippy::too_many_arguments)]
pub fn bggc<'m>(
    own: Candidate,
    ids: &[usize],
    weights: &[f64],
    batch: usize,
    mut fetch: impl FnMut(&[usize]) -> Vec<&'m [f32]>,
    rule: SelectionRule,
    rng: &mut impl Rng,
    reward: &mut impl AverageReward,
) -> Selection {
    let batch = batch.max(1);
    let (order, draws) = plan(ids.len(), rng);
    let mut g = DoubleGreedy::new(&own, rule, reward);
    // Pass 1, in candidate order as GGC adds them to Y.
    for (chunk, w) in ids.chunks(batch).zip(weights.chunks(batch)) {
        for ((&id, &weight), model) in chunk.iter().zip(w).zip(fetch(chunk)) {
            g.add_to_y(&Candidate { id, weight, model });
        }
    }
    g.start();
    // Pass 2, in the shuffled order.
    'batches: for (positions, us) in order.chunks(batch).zip(draws.chunks(batch)) {
        if g.full() {
            break;
        }
        let chunk: Vec<usize> = positions.iter().map(|&p| ids[p]).collect();
        let models = fetch(&chunk);
        for ((&pos, &u), model) in positions.iter().zip(us).zip(models) {
            if g.full() {
                break 'batches;
            }
            g.examine(
                &Candidate {
                    id: ids[pos],
                    weight: weights[pos],
                    model,
                },
                u,
            );
        }
    }
    g.finish()
}

/// The ablation: `size` peers drawn uniformly from `peers` (order kept as
/// drawn).
pub fn random_selection(peers: &[usize], size: usize, rng: &mut impl Rng) -> Vec<usize> {
    let mut pool = peers.to_vec();
    pool.shuffle(rng);
    pool.truncate(size.min(peers.len()));
    pool
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedweave_core::{Purpose, rng_stream};
    use proptest::prelude::*;

    /// R = −(avg − target)² on 1-D models.
    fn quadratic(target: f32) -> impl FnMut(&[f32]) -> f64 {
        move |m: &[f32]| -f64::from((m[0] - target).powi(2))
    }

    fn cands<'a>(models: &'a [Vec<f32>], weights: &[f64]) -> Vec<Candidate<'a>> {
        models
            .iter()
            .zip(weights)
            .enumerate()
            .map(|(i, (m, &w))| Candidate {
                id: i + 1,
                weight: w,
                model: m,
            })
            .collect()
    }

    #[test]
    fn forced_decisions_by_hand() {
        // Client 0 holds 0.0, the target is 1.0, equal weights.
        // Candidates: 1 → 2.0, 2 → 1.0, 3 → 9.0. Whatever the order:
        // - adding 2.0 or 1.0 to X moves the mean toward 1 (a > 0), and
        //   removing it from Y moves Y's mean (3.0, or higher) away (b = 0):
        //   p = 1, added.
        // - 9.0 always pulls X's mean above 1 too far or Y's removal helps:
        //   e.g. X = {0}: mean 4.5, R = −12.25 < −1 (a = 0); Y = {0,2,1,9}
        //   mean 3 → without 9 mean 1 (b > 0): p = 0, dropped.
        // The order changes X's history, so check every case through seeds.
        let own_m = [0.0f32];
        let models = vec![vec![2.0f32], vec![1.0], vec![9.0]];
        let c = cands(&models, &[1.0, 1.0, 1.0]);
        for seed in 0..20 {
            let mut rng = rng_stream(seed, 1, 0, Purpose::Selection);
            let own = Candidate {
                id: 0,
                weight: 1.0,
                model: &own_m,
            };
            let sel = ggc(
                own,
                &c,
                SelectionRule::default(),
                &mut rng,
                &mut quadratic(1.0),
            );
            let mut chosen = sel.chosen.clone();
            chosen.sort();
            assert_eq!(chosen, vec![1, 2], "seed {seed}: {:?}", sel.chosen);
            // R({0}) = −1; X = {0, 2.0, 1.0}: mean 1 → R = 0.
            assert_eq!(sel.reward_alone, -1.0);
            assert_eq!(sel.reward_chosen, 0.0);
            // 1 (alone) + 1 (Y) + 2 per candidate.
            assert_eq!(sel.evaluations, 2 + 2 * 3);
        }
    }

    #[test]
    fn remark_3_fails_when_a_and_b_are_both_zero() {
        // Client 0 holds 0 with target 0: alone it is perfect, R({0}) = 0.
        // One candidate at 2: a = max(R({0,2}) − 0, 0) = max(−1, 0) = 0 and
        // Y = {0, 2} → Y∖2 = {0}: b = max(0 − (−1), 0) = 1 → p = 0, fine.
        // But with two candidates at +2 and −2, Y = {0, 2, −2} has mean 0:
        // R(Y) = 0 and removing either gives mean ±1 (b = 0); adding either
        // to X = {0} gives ±1 (a = 0). Both are zero, p = 1: the first is
        // added and R(X) drops to −1 < R({0}).
        let own_m = [0.0f32];
        let models = vec![vec![2.0f32], vec![-2.0]];
        let c = cands(&models, &[1.0, 1.0]);
        let own = Candidate {
            id: 0,
            weight: 1.0,
            model: &own_m,
        };
        let mut rng = rng_stream(1, 1, 0, Purpose::Selection);
        let sel = ggc(
            own,
            &c,
            SelectionRule {
                limit: Some(1),
                ..SelectionRule::default()
            },
            &mut rng,
            &mut quadratic(0.0),
        );
        assert_eq!(sel.chosen.len(), 1);
        assert_eq!(sel.reward_alone, 0.0);
        assert_eq!(
            sel.reward_chosen, -1.0,
            "the chosen set is worse than alone"
        );
        // Skipping no-gain candidates keeps the client alone here.
        let strict = SelectionRule {
            limit: Some(1),
            skip_when_no_gain: true,
            ..SelectionRule::default()
        };
        let sel = ggc(
            own,
            &c,
            strict,
            &mut rng_stream(1, 1, 0, Purpose::Selection),
            &mut quadratic(0.0),
        );
        assert!(sel.chosen.is_empty());
        assert_eq!(sel.reward_chosen, sel.reward_alone);
    }

    #[test]
    fn a_candidate_whose_average_diverges_is_never_chosen() {
        // Candidate 1 is a good model, candidate 2 has diverged (NaN). Any
        // average containing candidate 2 scores NaN.
        let own_m = [0.0f32];
        let models = vec![vec![1.0f32], vec![f32::NAN]];
        let c = cands(&models, &[1.0, 1.0]);
        let own = Candidate {
            id: 0,
            weight: 1.0,
            model: &own_m,
        };
        for seed in 0..20 {
            let mut rng = rng_stream(seed, 1, 0, Purpose::Selection);
            let sel = ggc(
                own,
                &c,
                SelectionRule::default(),
                &mut rng,
                &mut quadratic(1.0),
            );
            assert!(!sel.chosen.contains(&2), "seed {seed}: {:?}", sel.chosen);
            assert!(sel.reward_chosen.is_finite());
        }
    }

    #[test]
    fn budget_semantics() {
        let b = SelectionRule {
            limit: Some(3),
            ..SelectionRule::default()
        };
        assert_eq!(b.collaborators(), Some(3));
        let code = SelectionRule {
            limit: Some(3),
            includes_self: true,
            ..SelectionRule::default()
        };
        assert_eq!(code.collaborators(), Some(2));
        assert_eq!(SelectionRule::default().collaborators(), None);
    }

    #[test]
    fn random_selection_is_a_seeded_subset() {
        let peers: Vec<usize> = (1..20).collect();
        let a = random_selection(&peers, 5, &mut rng_stream(3, 1, 0, Purpose::Selection));
        let b = random_selection(&peers, 5, &mut rng_stream(3, 1, 0, Purpose::Selection));
        assert_eq!(a, b);
        let mut s = a.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 5);
        assert!(a.iter().all(|p| peers.contains(p)));
        assert_eq!(
            random_selection(&peers, 50, &mut rng_stream(3, 1, 0, Purpose::Selection)).len(),
            19
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Theorem 1: BGGC streams the candidates in batches and returns
        /// exactly what GGC returns with the same seed; the budget holds and
        /// a step costs at most two evaluations.
        #[test]
        fn bggc_equals_ggc(
            n in 1usize..25,
            dim in 1usize..6,
            batch in 1usize..8,
            limit in 0usize..8,
            includes_self in any::<bool>(),
            skip_when_no_gain in any::<bool>(),
            seed in 0u64..1000,
            values in proptest::collection::vec(-3.0f32..3.0, 200),
            weights in proptest::collection::vec(1.0f64..50.0, 25),
        ) {
            let models: Vec<Vec<f32>> = (0..n).map(|i| values[i * dim % 150..][..dim].to_vec()).collect();
            let own_m: Vec<f32> = values[190..190 + dim.min(10)].iter().copied().chain(std::iter::repeat(0.0)).take(dim).collect();
            let target: Vec<f32> = values[150..150 + dim].to_vec();
            let budget = SelectionRule { limit: (limit > 0).then_some(limit), includes_self, skip_when_no_gain };
            // A non-monotone reward: distance of the average to a target.
            let mut reward = |m: &[f32]| -> f64 {
                -m.iter().zip(&target).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>()
            };
            let c = cands(&models, &weights[..n]);
            let own = Candidate { id: 0, weight: 7.0, model: &own_m };
            let a = ggc(own, &c, budget, &mut rng_stream(seed, 1, 0, Purpose::Selection), &mut reward);
            let ids: Vec<usize> = (1..=n).collect();
            let mut fetched_at_once = 0usize;
            let b = bggc(
                own,
                &ids,
                &weights[..n],
                batch,
                |chunk: &[usize]| {
                    fetched_at_once = fetched_at_once.max(chunk.len());
                    chunk.iter().map(|&id| models[id - 1].as_slice()).collect()
                },
                budget,
                &mut rng_stream(seed, 1, 0, Purpose::Selection),
                &mut reward,
            );
            prop_assert_eq!(&a, &b);
            prop_assert!(fetched_at_once <= batch);
            if let Some(cap) = budget.collaborators() {
                prop_assert!(a.chosen.len() <= cap);
            }
            prop_assert!(a.evaluations <= 2 * n + 2);
            let mut uniq = a.chosen.clone();
            uniq.sort();
            uniq.dedup();
            prop_assert_eq!(uniq.len(), a.chosen.len());
            prop_assert!(!a.chosen.contains(&0));
            if skip_when_no_gain {
                prop_assert!(a.reward_chosen >= a.reward_alone);
            }
        }
    }
}

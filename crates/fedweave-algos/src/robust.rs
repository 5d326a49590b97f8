//! Robust aggregation: the standard defences against poisoned uploads,
//! composable with every server method because they wrap the uploads
//! instead of living in the algorithms (Flower's "strategy wrappers").
//!
//! The runtime applies the configured defence ([`AggregatorConfig`]) to the round's sound uploads
//! (their first vector, the model) before the algorithm aggregates:
//!
//! - `median` (Yin et al., ICML 2018) and `trimmed_mean` (β-trimmed mean,
//!   same paper): every participant's model is replaced by the
//!   coordinate-wise robust centre, so an averaging server (FedAvg, FedProx,
//!   Ditto's global copy, the shared part of a split model) returns exactly
//!   that centre. A graph method then sees identical models: pair it with
//!   `krum` or `norm_clip`, which keep models distinct;
//! - `krum` / `multi_krum` (Blanchard et al., NeurIPS 2017): each upload is
//!   scored by the sum of squared distances to its n − f − 2 nearest
//!   others; Krum keeps the single best-scored upload, Multi-Krum the `m`
//!   best (default n − f); the others are dropped from the round like
//!   rejected uploads;
//! - `norm_clip` (Sun et al., 2019, "Can you really backdoor FL?"): each
//!   update θ − θ_start is scaled to norm at most `clip`.
//!
//! Weights are the algorithm's business: the defences change which models
//! arrive, not how the server weighs them.

use crate::params::ParamError;
use fedweave_core::pairwise::{Kernels, View};
use fedweave_core::vecmath::sq_dist;
use serde::{Deserialize, Serialize};

/// `[aggregator]`: which defence runs on the uploads.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AggregatorConfig {
    /// The defence.
    pub kind: AggregatorKind,
    /// `trimmed_mean`: fraction β of the values trimmed at *each* end per
    /// coordinate (0 ≤ β < ½).
    pub trim: f64,
    /// `krum` / `multi_krum`: the number f of Byzantine uploads tolerated
    /// (unset: ⌊(n − 3)/2⌋, the most Krum's guarantee allows).
    pub f: Option<usize>,
    /// `multi_krum`: uploads kept (unset: n − f).
    pub m: Option<usize>,
    /// `norm_clip`: the largest update norm let through.
    pub clip: f64,
}

impl Default for AggregatorConfig {
    fn default() -> Self {
        Self {
            kind: AggregatorKind::Mean,
            trim: 0.1,
            f: None,
            m: None,
            clip: 10.0,
        }
    }
}

/// The defences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AggregatorKind {
    /// No defence: the algorithm's own aggregation.
    #[default]
    Mean,
    /// Coordinate-wise median.
    Median,
    /// Coordinate-wise β-trimmed mean.
    TrimmedMean,
    /// Krum: the one upload closest to its neighbours.
    Krum,
    /// Multi-Krum: the `m` uploads closest to their neighbours.
    MultiKrum,
    /// Update-norm clipping.
    NormClip,
}

impl AggregatorKind {
    /// Names and descriptions for `fedweave list`.
    pub fn catalogue() -> &'static [(&'static str, &'static str)] {
        &[
            ("mean", "no defence: the algorithm's own aggregation"),
            ("median", "coordinate-wise median of the uploaded models"),
            (
                "trimmed_mean",
                "coordinate-wise mean without the `trim` fraction at each end",
            ),
            (
                "krum",
                "the one upload nearest its n − f − 2 neighbours (`f`)",
            ),
            (
                "multi_krum",
                "the `m` uploads nearest their neighbours (`f`, `m`)",
            ),
            ("norm_clip", "updates scaled to norm ≤ `clip`"),
        ]
    }
}

impl AggregatorConfig {
    /// `Err` naming the key when a value is impossible.
    pub fn validate(&self) -> Result<(), ParamError> {
        if !(0.0..0.5).contains(&self.trim) {
            return Err(ParamError::new(
                "trim",
                format!("must be in [0, 0.5), got {}", self.trim),
            ));
        }
        if !(self.clip > 0.0 && self.clip.is_finite()) {
            return Err(ParamError::new(
                "clip",
                format!("must be a finite number > 0, got {}", self.clip),
            ));
        }
        if self.m == Some(0) {
            return Err(ParamError::new("m", "must be ≥ 1"));
        }
        Ok(())
    }

    /// Whether the uploads pass untouched.
    pub fn is_mean(&self) -> bool {
        self.kind == AggregatorKind::Mean
    }

    /// `mean`, or e.g. `trimmed_mean β=0.1`.
    pub fn describe(&self) -> String {
        match self.kind {
            AggregatorKind::Mean => "mean".into(),
            AggregatorKind::Median => "median".into(),
            AggregatorKind::TrimmedMean => format!("trimmed_mean β={}", self.trim),
            AggregatorKind::Krum => {
                format!("krum f={}", self.f.map_or("auto".into(), |f| f.to_string()))
            }
            AggregatorKind::MultiKrum => format!(
                "multi_krum f={} m={}",
                self.f.map_or("auto".into(), |f| f.to_string()),
                self.m.map_or("auto".into(), |m| m.to_string())
            ),
            AggregatorKind::NormClip => format!("norm_clip {}", self.clip),
        }
    }

    /// Applies the defence to `models` (the uploads' model vectors, all of
    /// one length) in place; `starts[k]` is the model upload k's training
    /// started from (for `norm_clip`). Returns the positions of the uploads
    /// to keep (all of them except for Krum). Krum's distances run on
    /// `kernels`.
    pub fn apply(
        &self,
        kernels: &Kernels,
        models: &mut [&mut [f32]],
        starts: &[&[f32]],
    ) -> Vec<usize> {
        let n = models.len();
        let all: Vec<usize> = (0..n).collect();
        if n == 0 {
            return all;
        }
        match self.kind {
            AggregatorKind::Mean => all,
            AggregatorKind::Median | AggregatorKind::TrimmedMean => {
                let trim = if self.kind == AggregatorKind::Median {
                    None
                } else {
                    Some(self.trim)
                };
                let centre = coordinatewise(models, trim);
                for m in models.iter_mut() {
                    m.copy_from_slice(&centre);
                }
                all
            }
            AggregatorKind::Krum | AggregatorKind::MultiKrum => {
                let f = self.f.unwrap_or(n.saturating_sub(3) / 2);
                let keep = if self.kind == AggregatorKind::Krum {
                    1
                } else {
                    self.m.unwrap_or(n.saturating_sub(f)).clamp(1, n)
                };
                let views: Vec<&[f32]> = models.iter().map(|m| &**m).collect();
                let mut ranked = krum_ranking(kernels, &views, f);
                ranked.truncate(keep);
                ranked.sort_unstable();
                ranked
            }
            AggregatorKind::NormClip => {
                for (m, s) in models.iter_mut().zip(starts) {
                    clip_update(m, s, self.clip);
                }
                all
            }
        }
    }
}

/// The coordinate-wise median (`trim = None`; the mean of the two middle
/// values for an even count) or β-trimmed mean (⌊β·n⌋ values dropped at
/// each end; at least one value kept).
pub fn coordinatewise(models: &[&mut [f32]], trim: Option<f64>) -> Vec<f32> {
    let n = models.len();
    let d = models.first().map_or(0, |m| m.len());
    let mut column = vec![0.0f32; n];
    (0..d)
        .map(|c| {
            for (x, m) in column.iter_mut().zip(models) {
                *x = m[c];
            }
            column.sort_unstable_by(f32::total_cmp);
            match trim {
                None if n % 2 == 1 => column[n / 2],
                None => ((column[n / 2 - 1] as f64 + column[n / 2] as f64) / 2.0) as f32,
                Some(beta) => {
                    let k = ((beta * n as f64).floor() as usize).min((n - 1) / 2);
                    let kept = &column[k..n - k];
                    (kept.iter().map(|&x| x as f64).sum::<f64>() / kept.len() as f64) as f32
                }
            }
        })
        .collect()
}

/// Upload positions ordered by Krum score (best first; ties by position):
/// score(k) = Σ of the squared distances from k to its n − f − 2 nearest
/// other uploads (at least one).
pub fn krum_ranking(kernels: &Kernels, models: &[&[f32]], f: usize) -> Vec<usize> {
    let n = models.len();
    let neighbours = n.saturating_sub(f + 2).max(1).min(n.saturating_sub(1));
    let dist = kernels.sq_dist_matrix_sym(models, &View::all()).into_rows();
    let scores: Vec<f64> = (0..n)
        .map(|i| {
            let mut row: Vec<f64> = (0..n).filter(|&j| j != i).map(|j| dist[i][j]).collect();
            row.sort_unstable_by(f64::total_cmp);
            row.iter().take(neighbours).sum()
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)));
    order
}

/// Scales the update `model − start` to norm at most `clip`, in place.
pub fn clip_update(model: &mut [f32], start: &[f32], clip: f64) {
    let norm = sq_dist(model, start).sqrt();
    if norm > clip {
        let scale = (clip / norm) as f32;
        for (m, s) in model.iter_mut().zip(start) {
            *m = s + (*m - s) * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(rows: &[&[f32]]) -> Vec<Vec<f32>> {
        rows.iter().map(|r| r.to_vec()).collect()
    }

    fn views(rows: &mut [Vec<f32>]) -> Vec<&mut [f32]> {
        rows.iter_mut().map(|r| r.as_mut_slice()).collect()
    }

    #[test]
    fn median_and_trimmed_mean_by_hand() {
        let mut rows = owned(&[&[1.0, 5.0], &[2.0, -1.0], &[100.0, 0.0], &[3.0, 2.0]]);
        let v = views(&mut rows);
        // Even count: mean of the middle two. Column 0: 1 2 3 100 → 2.5;
        // column 1: −1 0 2 5 → 1.
        assert_eq!(coordinatewise(&v, None), vec![2.5, 1.0]);
        // β = 0.25 of 4 drops one value at each end: (2 + 3)/2, (0 + 2)/2.
        assert_eq!(coordinatewise(&v, Some(0.25)), vec![2.5, 1.0]);
        // β = 0.1 of 4 drops nothing: the mean.
        assert_eq!(coordinatewise(&v, Some(0.1)), vec![26.5, 1.5]);
        let mut odd = owned(&[&[3.0], &[-7.0], &[1.0]]);
        assert_eq!(coordinatewise(&views(&mut odd), None), vec![1.0]);
    }

    #[test]
    fn median_replaces_every_upload_by_the_centre() {
        let cfg = AggregatorConfig {
            kind: AggregatorKind::Median,
            ..AggregatorConfig::default()
        };
        let mut rows = owned(&[&[1.0], &[2.0], &[-50.0]]);
        let kept = cfg.apply(Kernels::cpu(), &mut views(&mut rows), &[]);
        assert_eq!(kept, vec![0, 1, 2]);
        assert_eq!(rows, vec![vec![1.0]; 3]);
    }

    #[test]
    fn krum_scores_by_hand_and_drops_the_outlier() {
        // Points on a line: 0, 1, 2 and 10. f = 0 → n − f − 2 = 2
        // neighbours. Scores: 0 → 1 + 4 = 5; 1 → 1 + 1 = 2; 2 → 1 + 4 = 5;
        // 10 → 64 + 81 = 145.
        let rows = owned(&[&[0.0], &[1.0], &[2.0], &[10.0]]);
        let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
        assert_eq!(krum_ranking(Kernels::cpu(), &refs, 0), vec![1, 0, 2, 3]);
        let mut rows2 = rows.clone();
        let krum = AggregatorConfig {
            kind: AggregatorKind::Krum,
            f: Some(0),
            ..AggregatorConfig::default()
        };
        assert_eq!(
            krum.apply(Kernels::cpu(), &mut views(&mut rows2), &[]),
            vec![1]
        );
        let multi = AggregatorConfig {
            kind: AggregatorKind::MultiKrum,
            f: Some(1),
            ..AggregatorConfig::default()
        };
        // f = 1: one neighbour each; 0 → 1, 1 → 1, 2 → 1, 10 → 64; keep
        // n − f = 3, returned in position order.
        assert_eq!(
            multi.apply(Kernels::cpu(), &mut views(&mut rows2), &[]),
            vec![0, 1, 2]
        );
        assert_eq!(rows2, rows, "Krum never rewrites a model");
    }

    #[test]
    fn norm_clip_scales_long_updates_only() {
        let start = [1.0f32, 1.0];
        let mut long = [4.0f32, 5.0]; // update (3, 4): norm 5
        clip_update(&mut long, &start, 2.5);
        assert_eq!(long, [2.5, 3.0]); // (1.5, 2): norm 2.5
        let mut short = [1.3f32, 1.4];
        clip_update(&mut short, &start, 2.5);
        assert_eq!(short, [1.3, 1.4]);
    }

    #[test]
    fn the_catalogue_names_every_kind_as_configs_spell_it() {
        let names: Vec<&str> = AggregatorKind::catalogue().iter().map(|c| c.0).collect();
        assert_eq!(names.len(), 6);
        for name in names {
            let kind: AggregatorKind = toml::Value::String(name.into()).try_into().unwrap();
            assert_eq!(toml::Value::try_from(kind).unwrap().as_str(), Some(name));
        }
    }

    #[test]
    fn impossible_settings_name_their_key() {
        let bad = |c: AggregatorConfig| c.validate().unwrap_err().key;
        let d = AggregatorConfig::default();
        assert_eq!(bad(AggregatorConfig { trim: 0.5, ..d }), "trim");
        assert_eq!(bad(AggregatorConfig { clip: 0.0, ..d }), "clip");
        assert_eq!(
            bad(AggregatorConfig {
                clip: f64::NAN,
                ..d
            }),
            "clip"
        );
        assert_eq!(bad(AggregatorConfig { m: Some(0), ..d }), "m");
        assert!(d.validate().is_ok());
    }
}

//! Server-step kernels: the pair-by-pair `vecmath` loops the algorithms run
//! today against the blocked GEMM kernels of `fedweave_core::pairwise`.
//!
//! `cargo bench -p fedweave-core --bench pairwise` runs N = 100 at
//! d = 44k and 582k. `FEDWEAVE_BENCH_LARGE=1` adds N = 1000 (1000 × 582k is
//! 2.3 GB of models); `FEDWEAVE_BENCH_CASES=1000x44000,100x582000` picks
//! cases explicitly. For N ≥ 500 the naive loops run on every 10th row and
//! are scaled to the whole matrix (marked `~`).
//!
//! Reported: seconds per full matrix, and effective GFLOP/s (2 flops per
//! useful multiply-add) as a fraction of a plain 1024³ dgemm of the same
//! crate on all threads.
//!
//! One run on a shared 2-core AMD EPYC (Zen 4) dev box, 2 rayon threads
//! (dgemm 1024³: 26 GFLOP/s on 1 thread, 31 on 2: the box gave us ~1.2
//! cores), seconds:
//!
//! | N × d | kernel | naive | new |
//! |---|---|---:|---:|
//! | 100 × 44k | cosine (sym) / sq-dist (sym) / sq-dist (cross) / mix | 0.148 / 0.611 / 0.646 / 0.173 | 0.037 / 0.036 / 0.060 / 0.044 |
//! | 100 × 582k | same | 1.66 / 7.25 / 7.55 / 2.76 | 0.53 / 0.56 / 0.78 / 0.83 |
//! | 1000 × 44k | same (naive scaled from 1/10 of the rows) | ~19.2 / ~56.6 / ~60.2 / ~31.0 | 2.31 / 2.35 / 3.96 / 3.56 |
//!
//! At N = 1000 the kernels run at 60–80% of that dgemm rate (counting only
//! useful flops); at N = 100 one tile cannot amortise the extra passes
//! (centre, norms, conversions) as well: 35–65%.

use std::hint::black_box;
use std::time::Instant;

use fedweave_core::pairwise::{Kernels, View, gemm_throughput};
use fedweave_core::vecmath::{dot, sq_dist, weighted_sum};
use rayon::prelude::*;

/// xorshift64*: fast, seeded, good enough for benchmark data.
struct Gen(u64);

impl Gen {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }
}

/// n models near a common point (like clients of one federation).
fn models(n: usize, d: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut g = Gen(seed | 1);
    let base: Vec<f32> = (0..d).map(|_| g.next_f32()).collect();
    (0..n)
        .into_par_iter()
        .map(|i| {
            let mut g = Gen((seed + 1 + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            base.iter().map(|b| b + 0.05 * g.next_f32()).collect()
        })
        .collect()
}

fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        black_box(f());
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// Rows the naive loops run on, and the factor that scales them to all rows.
fn sample(n: usize, cost: impl Fn(usize) -> usize) -> (Vec<usize>, f64) {
    let rows: Vec<usize> = if n >= 500 {
        (0..n).step_by(10).collect()
    } else {
        (0..n).collect()
    };
    let all: usize = (0..n).map(&cost).sum();
    let some: usize = rows.iter().map(|&i| cost(i)).sum();
    (rows, all as f64 / some as f64)
}

struct Row {
    what: &'static str,
    naive: f64,
    scaled: bool,
    new: f64,
    flops: f64,
}

fn bench_case(n: usize, d: usize, peak_all: f64) {
    let theta = models(n, d, 7);
    let init = models(1, d, 99).remove(0);
    // FedDWA: guidance models one small step from the trained ones.
    let guidance: Vec<Vec<f32>> = theta
        .par_iter()
        .enumerate()
        .map(|(i, m)| {
            let mut g = Gen(1000 + i as u64);
            m.iter().map(|x| x + 1e-3 * g.next_f32()).collect()
        })
        .collect();
    let mut rows_out = Vec::new();
    let only = std::env::var("FEDWEAVE_BENCH_KERNELS").ok();
    let want = |k: &str| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == k));
    let (rows, scale_full) = sample(n, |_| n);
    let reps = if n * d > 100_000_000 { 1 } else { 2 };
    // Dense, distinct weight rows.
    let w: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            let mut g = Gen(5000 + i as u64);
            let r: Vec<f64> = (0..n).map(|_| 1.0 + f64::from(g.next_f32())).collect();
            let s: f64 = r.iter().sum();
            r.iter().map(|x| x / s).collect()
        })
        .collect();
    let refs: Vec<&[f32]> = theta.iter().map(Vec::as_slice).collect();

    // pFedGraph: cosines of θ_j − θ_init, upper triangle, pair by pair.
    if want("cos") {
        let (rows, scale) = sample(n, |i| n - i);
        let naive = time(1, || {
            let deltas: Vec<Vec<f32>> = theta
                .par_iter()
                .map(|t| t.iter().zip(&init).map(|(a, b)| a - b).collect())
                .collect();
            let norms: Vec<f64> = deltas.par_iter().map(|x| dot(x, x).sqrt()).collect();
            rows.par_iter()
                .map(|&i| {
                    (i..n)
                        .map(|j| dot(&deltas[i], &deltas[j]) / (norms[i] * norms[j]))
                        .sum::<f64>()
                })
                .sum::<f64>()
        });
        let new = time(reps, || {
            Kernels::cpu().cosine_matrix_sym(&theta, &View::all().with_shift(&init))
        });
        rows_out.push(Row {
            what: "cosine matrix (sym, shifted)",
            naive: naive * scale,
            scaled: scale > 1.0,
            new,
            flops: (n * n * d) as f64,
        });
    }

    // SFL: all pairwise squared distances, row by row.
    if want("dist") {
        let (rows, scale) = sample(n, |_| n);
        let naive = time(1, || {
            rows.par_iter()
                .map(|&i| {
                    (0..n)
                        .filter(|&j| j != i)
                        .map(|j| sq_dist(&theta[i], &theta[j]))
                        .sum::<f64>()
                })
                .sum::<f64>()
        });
        let new = time(reps, || {
            Kernels::cpu().sq_dist_matrix_sym(&theta, &View::all())
        });
        rows_out.push(Row {
            what: "sq-distance matrix (sym)",
            naive: naive * scale,
            scaled: scale > 1.0,
            new,
            flops: (n * n * d) as f64,
        });
    }

    // FedDWA: guidance × models squared distances.
    if want("dwa") {
        let naive = time(1, || {
            rows.par_iter()
                .map(|&i| {
                    (0..n)
                        .map(|j| sq_dist(&guidance[i], &theta[j]))
                        .sum::<f64>()
                })
                .sum::<f64>()
        });
        let new = time(reps, || {
            Kernels::cpu().sq_dist_matrix(&guidance, &theta, &View::all())
        });
        rows_out.push(Row {
            what: "sq-distance matrix (guidance × models)",
            naive: naive * scale_full,
            scaled: scale_full > 1.0,
            new,
            flops: (2 * n * n * d) as f64,
        });
    }

    // mix_rows: dense distinct rows, one weighted_sum per row.
    if want("mix") {
        let naive = time(1, || {
            rows.par_iter()
                .map(|&i| {
                    let mut out = vec![0.0f32; d];
                    weighted_sum(&w[i], &refs, &mut out);
                    out[0]
                })
                .sum::<f32>()
        });
        let new = time(reps, || Kernels::cpu().mix(&w, &theta));
        rows_out.push(Row {
            what: "mixing W·Θ (all rows distinct)",
            naive: naive * scale_full,
            scaled: scale_full > 1.0,
            new,
            flops: (2 * n * n * d) as f64,
        });
    }

    // FedAvg: one broadcast row.
    if want("avg") {
        let p = &w[0];
        let naive = time(5 * reps, || {
            let mut out = vec![0.0f32; d];
            weighted_sum(p, &refs, &mut out);
            out[0]
        });
        let wb = vec![p.clone(); n];
        let new = time(5 * reps, || Kernels::cpu().mix(&wb, &theta));
        rows_out.push(Row {
            what: "mixing, one distinct row (FedAvg)",
            naive,
            scaled: false,
            new,
            flops: (2 * n * d) as f64,
        });
    }

    println!("\nN = {n}, d = {d}");
    println!(
        "| kernel | naive s | new s | speed-up | new GFLOP/s | % of dgemm peak |\n|---|---:|---:|---:|---:|---:|"
    );
    for r in rows_out {
        let gf = r.flops / r.new / 1e9;
        println!(
            "| {} | {}{:.3} | {:.3} | {:.1}× | {:.1} | {:.0}% |",
            r.what,
            if r.scaled { "~" } else { "" },
            r.naive,
            r.new,
            r.naive / r.new,
            gf,
            100.0 * gf / peak_all
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let peak = gemm_throughput(1024, 3);
    println!(
        "matrixmultiply 1024³: dgemm {:.1} GFLOP/s on 1 thread, {:.1} on {}; sgemm {:.1} on {}",
        peak.dgemm_one, peak.dgemm_all, peak.threads, peak.sgemm_all, peak.threads
    );
    let all = peak.dgemm_all;
    let cases: Vec<(usize, usize)> = match std::env::var("FEDWEAVE_BENCH_CASES") {
        Ok(list) => list
            .split(',')
            .map(|c| {
                let (n, d) = c.split_once('x').expect("cases look like 100x44000");
                (n.parse().expect("N"), d.parse().expect("d"))
            })
            .collect(),
        Err(_) => {
            let mut v = vec![(100, 44_000), (100, 582_000)];
            if std::env::var("FEDWEAVE_BENCH_LARGE").is_ok_and(|v| v == "1") {
                v.extend([(1000, 44_000), (1000, 582_000)]);
            }
            v
        }
    };
    for (n, d) in cases {
        bench_case(n, d, all);
    }
}

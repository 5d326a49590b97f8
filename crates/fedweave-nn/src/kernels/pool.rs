//! k×k max pooling on `f32` slices, forward and backward, in one pass that
//! keeps each window's winner (its index in the plane) for the backward
//! pass. The seed models' 2×2 windows of stride 2 take a loop of their own.
//!
//! Layout `[batch, channels, h, w]`, floor mode, padding never wins. Ties go
//! to the first maximum in row-major order; a window holding NaN yields NaN,
//! so a diverged run stays visibly diverged.

use super::relu_keeps;

/// The shape of one pooling: square windows, stride and padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolGeom {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub oh: usize,
    pub ow: usize,
}

impl PoolGeom {
    /// `planes` planes of `h × w` under k×k windows, or `None` when the
    /// window does not fit, the output is empty, or padding would fill a
    /// whole window (2·pad ≥ k + 1, which burn also refuses).
    pub fn new(
        planes: usize,
        h: usize,
        w: usize,
        k: usize,
        stride: usize,
        pad: usize,
    ) -> Option<Self> {
        if k == 0 || stride == 0 || 2 * pad > k {
            return None;
        }
        let out = |n: usize| (n + 2 * pad).checked_sub(k).map(|d| d / stride + 1);
        let (oh, ow) = (out(h)?, out(w)?);
        (planes * oh * ow > 0).then_some(Self {
            planes,
            h,
            w,
            k,
            stride,
            pad,
            oh,
            ow,
        })
    }

    /// Output elements.
    pub fn out_len(&self) -> usize {
        self.planes * self.oh * self.ow
    }

    /// Input rows (or columns) of window `o`: the part inside `0..n`.
    fn span(&self, o: usize, n: usize) -> std::ops::Range<usize> {
        let start = o * self.stride;
        start.saturating_sub(self.pad)..(start + self.k).saturating_sub(self.pad).min(n)
    }
}

/// The maxima, `[planes, oh, ow]` (through burn's ReLU when `relu`), and
/// each one's index in its input plane.
pub(crate) fn forward(g: &PoolGeom, x: &[f32], relu: bool) -> (Vec<f32>, Vec<u32>) {
    let mut out = vec![0.0f32; g.out_len()];
    let mut arg = vec![0u32; g.out_len()];
    let (hw, ohw) = (g.h * g.w, g.oh * g.ow);
    let pairs = out.chunks_exact_mut(ohw).zip(arg.chunks_exact_mut(ohw));
    for ((out, arg), plane) in pairs.zip(x.chunks_exact(hw)) {
        if (g.k, g.stride, g.pad) == (2, 2, 0) {
            pool2x2(g, plane, out, arg);
        } else {
            pool_any(g, plane, out, arg);
        }
    }
    if relu {
        for v in &mut out {
            if !relu_keeps(*v) {
                *v = 0.0;
            }
        }
    }
    (out, arg)
}

/// One plane through 2×2 windows of stride 2.
fn pool2x2(g: &PoolGeom, plane: &[f32], out: &mut [f32], arg: &mut [u32]) {
    let w = g.w;
    for r in 0..g.oh {
        let top = &plane[2 * r * w..][..2 * g.ow];
        let bottom = &plane[(2 * r + 1) * w..][..2 * g.ow];
        let out = &mut out[r * g.ow..][..g.ow];
        let arg = &mut arg[r * g.ow..][..g.ow];
        let at = (2 * r * w) as u32;
        for c in 0..g.ow {
            let v = [top[2 * c], top[2 * c + 1], bottom[2 * c], bottom[2 * c + 1]];
            let offsets = [0, 1, w as u32, w as u32 + 1];
            let (mut best, mut k) = (v[0], 0);
            for (i, &x) in v.iter().enumerate().skip(1) {
                if x > best {
                    (best, k) = (x, i);
                }
            }
            if let Some(i) = v.iter().position(|x| x.is_nan()) {
                (best, k) = (f32::NAN, i);
            }
            out[c] = best;
            arg[c] = at + 2 * c as u32 + offsets[k];
        }
    }
}

/// One plane through any window, stride and padding. Windows of 3×3 that
/// lie inside the plane (`resnet8`'s and `resnet18`'s stem pool) take
/// [`window3`]; the rest, and any window holding NaN, the general scan.
fn pool_any(g: &PoolGeom, plane: &[f32], out: &mut [f32], arg: &mut [u32]) {
    for r in 0..g.oh {
        let rows = g.span(r, g.h);
        for c in 0..g.ow {
            let cols = g.span(c, g.w);
            let fast = (g.k == 3 && rows.len() == 3 && cols.len() == 3)
                .then(|| window3(plane, g.w, rows.start, cols.start))
                .flatten();
            let (best, at) = fast.unwrap_or_else(|| scan_window(plane, g.w, &rows, &cols));
            out[r * g.ow + c] = best;
            arg[r * g.ow + c] = at as u32;
        }
    }
}

/// The winner of the window of rows `rows` and columns `cols`, in row-major
/// order: the first NaN, else the first maximum.
fn scan_window(
    plane: &[f32],
    w: usize,
    rows: &std::ops::Range<usize>,
    cols: &std::ops::Range<usize>,
) -> (f32, usize) {
    let (mut best, mut at) = (f32::NEG_INFINITY, rows.start * w + cols.start);
    for i in rows.clone() {
        for j in cols.clone() {
            let v = plane[i * w + j];
            if v.is_nan() {
                return (v, i * w + j);
            }
            if v > best {
                (best, at) = (v, i * w + j);
            }
        }
    }
    (best, at)
}

/// The first maximum of the 3×3 window from (`i0`, `j0`), whose rows are
/// read as arrays (no per-element bounds checks or NaN branches), or `None`
/// when the window holds NaN (which no `>` selects), for the general scan.
#[inline]
fn window3(plane: &[f32], w: usize, i0: usize, j0: usize) -> Option<(f32, usize)> {
    let (mut best, mut at) = (f32::NEG_INFINITY, i0 * w + j0);
    let mut nan = false;
    for i in i0..i0 + 3 {
        let row: &[f32; 3] = plane[i * w + j0..][..3].try_into().expect("3 columns");
        for (j, &v) in row.iter().enumerate() {
            nan |= v.is_nan();
            if v > best {
                (best, at) = (v, i * w + j0 + j);
            }
        }
    }
    (!nan).then_some((best, at))
}

/// Routes each output gradient to its window's winner (windows that
/// overlap add up): `dx` of `[planes, h, w]`. With `relu_out` (the output
/// of [`forward`] with ReLU), burn's ReLU step first: a gradient passes
/// where that output is positive or NaN, else +0 is routed.
pub(crate) fn backward(
    g: &PoolGeom,
    dout: &[f32],
    arg: &[u32],
    relu_out: Option<&[f32]>,
) -> Vec<f32> {
    let (hw, ohw) = (g.h * g.w, g.oh * g.ow);
    let mut dx = vec![0.0f32; g.planes * hw];
    let planes = dx.chunks_exact_mut(hw).zip(dout.chunks_exact(ohw));
    for (p, ((dx, dout), arg)) in planes.zip(arg.chunks_exact(ohw)).enumerate() {
        match relu_out {
            None => {
                for (&d, &a) in dout.iter().zip(arg) {
                    dx[a as usize] += d;
                }
            }
            Some(out) => {
                for ((&d, &a), &o) in dout.iter().zip(arg).zip(&out[p * ohw..][..ohw]) {
                    dx[a as usize] += if relu_keeps(o) { d } else { 0.0 };
                }
            }
        }
    }
    dx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maxima_and_their_gradient_by_hand() {
        // One 3×4 plane (the odd last row is dropped):
        //  1 5 | 2 2
        //  3 0 | 2 7
        //  9 9   9 9
        let x = [1.0, 5.0, 2.0, 2.0, 3.0, 0.0, 2.0, 7.0, 9.0, 9.0, 9.0, 9.0];
        let g = PoolGeom::new(1, 3, 4, 2, 2, 0).unwrap();
        let (out, arg) = forward(&g, &x, false);
        assert_eq!(out, [5.0, 7.0]);
        assert_eq!(arg, [1, 7]);
        let dx = backward(&g, &[10.0, 20.0], &arg, None);
        assert_eq!(
            dx,
            [0.0, 10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 20.0, 0.0, 0.0, 0.0, 0.0]
        );
    }

    #[test]
    fn ties_go_to_the_first_and_nan_wins() {
        let x = [4.0, 4.0, 4.0, 4.0, 1.0, f32::NAN, 2.0, f32::NAN];
        let g = PoolGeom::new(2, 2, 2, 2, 2, 0).unwrap();
        let (out, arg) = forward(&g, &x, false);
        assert_eq!((out[0], arg[0]), (4.0, 0));
        assert!(out[1].is_nan());
        assert_eq!(arg[1], 1);
        let any = PoolGeom::new(2, 2, 2, 2, 1, 0).unwrap();
        let (out, arg) = forward(&any, &x, false);
        assert_eq!((out[0], arg[0]), (4.0, 0));
        assert!(out[1].is_nan());
        assert_eq!(arg[1], 1);
    }

    /// 3×3 windows, stride 2, padding 1 (FedDWA's ResNet-8) on a 4×5 plane,
    /// by hand: windows are rows {0,1}, {1,2,3} × columns {0,1}, {1,2,3},
    /// {3,4}; overlapping windows that pick the same input add gradients.
    #[test]
    fn padded_overlapping_windows_by_hand() {
        #[rustfmt::skip]
        let x = [
            0.0, 1.0, 2.0, 3.0, 4.0,
            5.0, 6.0, 7.0, 9.0, 8.0,
            1.0, 1.0, 1.0, 1.0, 1.0,
            0.0, 0.0, 0.0, 0.0, 0.0,
        ];
        let g = PoolGeom::new(1, 4, 5, 3, 2, 1).unwrap();
        assert_eq!((g.oh, g.ow), (2, 3));
        let (out, arg) = forward(&g, &x, false);
        assert_eq!(out, [6.0, 9.0, 9.0, 6.0, 9.0, 9.0]);
        assert_eq!(arg, [6, 8, 8, 6, 8, 8]);
        let dx = backward(&g, &[1.0; 6], &arg, None);
        assert_eq!(dx[6], 2.0);
        assert_eq!(dx[8], 4.0);
        assert_eq!(dx.iter().sum::<f32>(), 6.0);
    }

    #[test]
    fn the_two_loops_agree_and_planes_are_independent() {
        let x: Vec<f32> = (0..2 * 6 * 7).map(|v| ((v * 7) % 11) as f32).collect();
        let g = PoolGeom::new(2, 6, 7, 2, 2, 0).unwrap();
        let (out, arg) = forward(&g, &x, false);
        let (mut out_any, mut arg_any) = (vec![0.0; out.len()], vec![0; arg.len()]);
        for p in 0..2 {
            let n = g.oh * g.ow;
            pool_any(
                &g,
                &x[p * 42..][..42],
                &mut out_any[p * n..][..n],
                &mut arg_any[p * n..][..n],
            );
        }
        assert_eq!((out, arg), (out_any, arg_any));
    }

    /// The definition, one window at a time in row-major order: the first
    /// NaN, else the first maximum (padding never wins).
    fn scan(g: &PoolGeom, plane: &[f32]) -> Vec<(u32, u32)> {
        let mut found = Vec::new();
        for r in 0..g.oh {
            for c in 0..g.ow {
                let mut best: Option<(f32, usize)> = None;
                'window: for i in g.span(r, g.h) {
                    for j in g.span(c, g.w) {
                        let v = plane[i * g.w + j];
                        match best {
                            _ if v.is_nan() => {
                                best = Some((v, i * g.w + j));
                                break 'window;
                            }
                            Some((b, _)) if v <= b => {}
                            _ => best = Some((v, i * g.w + j)),
                        }
                    }
                }
                let (v, at) = best.unwrap();
                found.push((v.to_bits(), at as u32));
            }
        }
        found
    }

    /// The general loop equals the window scan on planes full of ties,
    /// −∞ and NaN, for windows 1–4, strides 1–3 and paddings up to k/2.
    #[test]
    fn the_general_loop_is_the_window_scan() {
        let values = [1.0, 2.0, 2.0, -1.0, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0];
        for (h, w) in [(5, 7), (8, 8), (3, 4)] {
            for k in 1..=4 {
                for stride in 1..=3 {
                    for pad in 0..=k / 2 {
                        let Some(g) = PoolGeom::new(1, h, w, k, stride, pad) else {
                            continue;
                        };
                        for seed in 0..6usize {
                            let plane: Vec<f32> = (0..h * w)
                                .map(|i| {
                                    let pick = (i * 7 + seed * 13 + i * i * seed) % 23;
                                    values[if seed % 2 == 0 { pick % 5 } else { pick % 8 }]
                                })
                                .collect();
                            let (mut out, mut arg) = (vec![0.0; g.out_len()], vec![0; g.out_len()]);
                            pool_any(&g, &plane, &mut out, &mut arg);
                            let got: Vec<(u32, u32)> =
                                out.iter().map(|v| v.to_bits()).zip(arg).collect();
                            assert_eq!(got, scan(&g, &plane), "{g:?} seed {seed}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn windows_that_do_not_fit_have_no_geometry() {
        assert_eq!(PoolGeom::new(1, 1, 4, 2, 2, 0), None);
        assert_eq!(PoolGeom::new(1, 4, 4, 2, 2, 2), None);
        assert_eq!(PoolGeom::new(1, 4, 4, 2, 0, 0), None);
        assert!(PoolGeom::new(1, 2, 2, 3, 2, 1).is_some());
    }
}

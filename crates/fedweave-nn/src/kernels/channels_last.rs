//! Convolutions over many channels and small planes (the ResNets' 3×3 of
//! stride 2, and their 3×3 on 4×4 planes) through a column matrix built
//! channels-last. The channels-first im2col of [`super::conv`] copies runs
//! of one output row read at the stride (8 or 4 values at the ResNets'
//! widths) or of one small plane, and it reads the planes of a block's
//! images interleaved; here each image is first transposed to `[h, w, c]`
//! in one sequential pass, and each entry of the column matrix is then a
//! run of `c_in` contiguous values (16–64). The matrix is `n × K` with K
//! ordered (i, j, c), so the weight is permuted to match.
//!
//! Every product is a `gemm` of the same block of images as the
//! channels-first path, on the calling thread; results are a function of
//! the shapes only. They differ from the channels-first path's in the
//! order of each K-long sum, so no model takes both: the choice is made by
//! shape ([`applies`]).

use super::conv::{ConvGeom, ConvGrads, copy_run, forward_by_blocks, gemm_f32, row_stride};

/// Whether a convolution takes this path: a window of several taps whose
/// channel runs (`c_in` values) are longer than the runs the channels-first
/// im2col copies: an output row (`ow`) for a strided convolution, a whole
/// plane for a stride-1 "same" one, when that plane fits one 64-byte line
/// (h·w ≤ 16). Measured (docs/results.md): `resnet8`'s strided 3×3 and its
/// 4×4 planes of 64 channels gain; 8×8 planes lose at 32 channels and
/// break even at 256 (`resnet9`), 16×16 planes lose. Valid stride-1
/// convolutions (the seed CNNs') stay channels-first.
pub(super) fn applies(g: &ConvGeom) -> bool {
    let runs_longer = if g.stride > 1 {
        g.c_in >= g.ow
    } else {
        g.same_shape() && g.h * g.w <= 16 && g.c_in > g.h * g.w
    };
    g.kh * g.kw > 1 && runs_longer
}

/// Each `rows × cols` matrix of `src` (row-major, one after another)
/// transposed into the same place of `dst`: how the weight goes to and
/// from the (tap, channel) order and an image to and from `[h, w, c]`.
pub(super) fn transpose_each(src: &[f32], dst: &mut [f32], rows: usize, cols: usize) {
    for (src, dst) in src
        .chunks_exact(rows * cols)
        .zip(dst.chunks_exact_mut(rows * cols))
    {
        for (r, row) in src.chunks_exact(cols).enumerate() {
            for (q, &v) in row.iter().enumerate() {
                dst[q * rows + r] = v;
            }
        }
    }
}

/// `[o, c, i, j]` → `[o, (i, j, c)]`: the weight in the column order here.
fn permuted(g: &ConvGeom, weight: &[f32]) -> Vec<f32> {
    let mut wp = vec![0.0f32; weight.len()];
    transpose_each(weight, &mut wp, g.c_in, g.kh * g.kw);
    wp
}

/// The images of `images` as `[image, h, w, c]` into `xt`.
fn transpose_in(g: &ConvGeom, x: &[f32], images: std::ops::Range<usize>, xt: &mut Vec<f32>) {
    let image = g.c_in * g.h * g.w;
    xt.resize(images.len() * image, 0.0);
    let src = &x[images.start * image..images.end * image];
    transpose_each(src, xt, g.c_in, g.h * g.w);
}

/// Visits every (output position, tap) of a block of `images` images: `f(row
/// offset in the column matrix, input offset in the transposed block or
/// None for padding)`, rows `ld` apart, each entry `c_in` long.
fn entries(g: &ConvGeom, images: usize, ld: usize, mut f: impl FnMut(usize, Option<usize>)) {
    let (s, p) = (g.stride, g.pad);
    let mut row = 0;
    for b in 0..images {
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                for i in 0..g.kh {
                    let iy = (oy * s + i).checked_sub(p).filter(|&iy| iy < g.h);
                    for j in 0..g.kw {
                        let ix = (ox * s + j).checked_sub(p).filter(|&ix| ix < g.w);
                        let at = row + (i * g.kw + j) * g.c_in;
                        let from = iy
                            .zip(ix)
                            .map(|(iy, ix)| ((b * g.h + iy) * g.w + ix) * g.c_in);
                        f(at, from);
                    }
                }
                row += ld;
            }
        }
    }
}

/// The channels-last column matrix (`n × K`, rows `row_stride(K)` apart)
/// of a transposed block into `cols`; returns the row stride.
fn im2col(g: &ConvGeom, xt: &[f32], images: usize, cols: &mut Vec<f32>) -> usize {
    let ld = row_stride(g.k());
    cols.resize(images * g.ohw() * ld, 0.0);
    entries(g, images, ld, |at, from| {
        let dst = &mut cols[at..][..g.c_in];
        match from {
            Some(from) => copy_run(dst, &xt[from..][..g.c_in]),
            None => dst.fill(0.0),
        }
    });
    ld
}

/// The forward pass: `[batch, c_out, oh, ow]`.
pub(super) fn forward(g: &ConvGeom, x: &[f32], weight: &[f32], bias: &[f32]) -> Vec<f32> {
    let mut xt = Vec::new();
    forward_by_blocks(g, &permuted(g, weight), bias, |images, cols| {
        transpose_in(g, x, images.clone(), &mut xt);
        (1, im2col(g, &xt, images.len(), cols))
    })
}

/// The backward pass from the output's gradient `dout`.
pub(super) fn backward(
    g: &ConvGeom,
    x: &[f32],
    weight: &[f32],
    dout: &[f32],
    want_x: bool,
) -> ConvGrads {
    let (k, ohw, hw) = (g.k(), g.ohw(), g.h * g.w);
    let wp = permuted(g, weight);
    let mut dwp = vec![0.0f32; g.c_out * k];
    let mut db = vec![0.0f32; g.c_out];
    let mut dx = want_x.then(|| vec![0.0f32; x.len()]);
    let (mut xt, mut cols, mut dmat, mut dxt) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (block, images) in g.blocks().enumerate() {
        let n = images.len() * ohw;
        // dout of the block as c_out × n, rows `ld` apart.
        let ld = g.gather_dout(dout, images.clone(), &mut dmat, &mut db);
        // dW (permuted) += dout · cols.
        transpose_in(g, x, images.clone(), &mut xt);
        let ld_cols = im2col(g, &xt, images.len(), &mut cols);
        gemm_f32(
            g.c_out,
            k,
            n,
            (&mut dwp, k),
            block > 0,
            &dmat,
            (ld, 1),
            &cols,
            (ld_cols, 1),
        );
        let Some(dx) = dx.as_mut() else { continue };
        // dcols = doutᵀ · W (permuted), folded back onto the transposed
        // block, then transposed to `[image, c, h, w]`.
        gemm_f32(
            n,
            k,
            g.c_out,
            (&mut cols, ld_cols),
            false,
            &dmat,
            (1, ld),
            &wp,
            (k, 1),
        );
        dxt.clear();
        dxt.resize(images.len() * hw * g.c_in, 0.0);
        entries(g, images.len(), ld_cols, |at, from| {
            if let Some(from) = from {
                let src = &cols[at..][..g.c_in];
                for (d, v) in dxt[from..][..g.c_in].iter_mut().zip(src) {
                    *d += v;
                }
            }
        });
        let image = hw * g.c_in;
        let dst = &mut dx[images.start * image..images.end * image];
        transpose_each(&dxt, dst, hw, g.c_in);
    }
    let mut dw = vec![0.0f32; dwp.len()];
    transpose_each(&dwp, &mut dw, g.kh * g.kw, g.c_in);
    ConvGrads {
        x: dx,
        weight: dw,
        bias: db,
    }
}

#[cfg(test)]
mod tests {
    use super::super::conv::tests::check_against_definition;
    use super::*;

    /// Forward and all three gradients against the definition, for strided
    /// shapes with padding 0–2, partial windows at the edges, blocks of one
    /// image and of several.
    #[test]
    fn strided_convolutions_match_the_definition() {
        for (x, w, s, p) in [
            ([3, 8, 7, 6], [5, 8, 3, 3], 2, 1),
            ([2, 6, 9, 9], [4, 6, 3, 3], 3, 0),
            ([2, 5, 8, 8], [3, 5, 5, 5], 2, 2),
            ([40, 16, 8, 8], [8, 16, 3, 3], 2, 1),
            ([3, 40, 2, 3], [6, 40, 3, 3], 1, 1),
            ([2, 20, 4, 3], [4, 20, 5, 5], 1, 2),
        ] {
            let g = ConvGeom::new(x, w, s, p).unwrap();
            assert!(applies(&g), "{g:?}");
            check_against_definition(&g, forward, backward);
        }
    }

    /// Which shapes take the path: `resnet8`'s strided 3×3 and its 3×3 on
    /// 4×4 planes; not its 1×1 shortcuts, its larger planes, `resnet9`'s
    /// 8×8 planes, `resnet18`'s stem or the seed CNNs' valid convolutions.
    #[test]
    fn only_windows_over_many_channels_and_short_runs_apply() {
        let geom = |x, w, s, p| ConvGeom::new(x, w, s, p).unwrap();
        assert!(applies(&geom([64, 16, 16, 16], [32, 16, 3, 3], 2, 1)));
        assert!(applies(&geom([64, 32, 8, 8], [64, 32, 3, 3], 2, 1)));
        assert!(applies(&geom([64, 64, 4, 4], [64, 64, 3, 3], 1, 1)));
        assert!(!applies(&geom([64, 32, 8, 8], [32, 32, 3, 3], 1, 1)));
        assert!(!applies(&geom([64, 256, 8, 8], [256, 256, 3, 3], 1, 1)));
        assert!(!applies(&geom([64, 16, 16, 16], [16, 16, 3, 3], 1, 1)));
        assert!(!applies(&geom([64, 16, 16, 16], [32, 16, 1, 1], 2, 0)));
        assert!(!applies(&geom([64, 3, 224, 224], [64, 3, 7, 7], 2, 3)));
        assert!(!applies(&geom([64, 32, 12, 12], [64, 32, 5, 5], 1, 0)));
        assert!(!applies(&geom([64, 1, 28, 28], [6, 1, 5, 5], 1, 0)));
    }
}

//! Which hand-written vector paths this CPU runs. Most kernels are plain
//! loops compiled by `wide!` for the CPU's widest vectors; the few whose
//! shuffles the compiler will not find (transposes, the deinterleaving of
//! pairs) have intrinsics paths, chosen once per call from this.

/// The widest vector path of a kernel with intrinsics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Vectors {
    /// 16 lanes (x86-64-v4: AVX-512 F, BW, CD, DQ, VL).
    Avx512,
    /// 8 lanes (AVX2).
    Avx2,
    /// Plain loops.
    Scalar,
}

impl Vectors {
    /// The widest this CPU runs (cached feature flags). Always inlined:
    /// called out of line from Winograd's patch gathering, it cost the
    /// input transform around it its vectorisation (4.5 → 10 % of a
    /// `resnet9` step).
    #[inline(always)]
    pub(super) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if fedweave_core::simd::has_x86_64_v4() {
                return Self::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Self::Avx2;
            }
        }
        Self::Scalar
    }

    /// Every path this CPU runs: the detected one and those below it, for
    /// tests that hold each to the plain loops.
    #[cfg(test)]
    pub(super) fn runnable() -> &'static [Self] {
        match Self::detect() {
            Self::Avx512 => &[Self::Scalar, Self::Avx2, Self::Avx512],
            Self::Avx2 => &[Self::Scalar, Self::Avx2],
            Self::Scalar => &[Self::Scalar],
        }
    }
}

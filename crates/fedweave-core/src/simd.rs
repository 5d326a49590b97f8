//! Run-time dispatch of element-wise loops to the CPU's widest vectors.
//!
//! The default x86-64 target compiles loops for SSE2: 2 `f64` or 4 `f32`
//! lanes, and none where a loop selects. [`wide!`](crate::wide) compiles a
//! loop body again for AVX-512 (x86-64-v4) and for AVX2 + FMA and picks the
//! widest the CPU has, once per call. Rust never contracts `a·b + c` into a
//! fused multiply-add, and adds, products, conversions and selects round the
//! same at any width, so every path gives the same bits: the dispatch is a
//! speed choice, never a numerical one.

/// `fn $name(args)` runs `$body(args)` compiled for AVX-512 (x86-64-v4),
/// else AVX2 and FMA, where the CPU has them, else for the default target.
///
/// `$body` must be `#[inline(always)]`, so that it is compiled into the
/// wide copy; what it calls should be too (a call the compiler keeps out of
/// line runs at the default width).
#[macro_export]
macro_rules! wide {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $ret:ty)? => $body:path) => {
        $(#[$doc])*
        $vis fn $name($($a: $t),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            if $crate::simd::has_x86_64_v4() {
                #[target_feature(enable = "avx512f,avx512bw,avx512cd,avx512dq,avx512vl,avx2,fma")]
                fn wide($($a: $t),*) $(-> $ret)? {
                    $body($($a),*)
                }
                // SAFETY: the CPU has the features `wide` is compiled for.
                return unsafe { wide($($a),*) };
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                #[target_feature(enable = "avx2,fma")]
                fn wide($($a: $t),*) $(-> $ret)? {
                    $body($($a),*)
                }
                // SAFETY: the CPU has the features `wide` is compiled for.
                return unsafe { wide($($a),*) };
            }
            $body($($a),*)
        }
    };
}

/// Whether the CPU has x86-64-v4's AVX-512 subsets, the level `gemm`'s
/// and burn-flex's 16-lane kernels run at (never with the `x86-64-v3`
/// feature, which measures AVX2 paths on an AVX-512 CPU).
#[cfg(target_arch = "x86_64")]
pub fn has_x86_64_v4() -> bool {
    !cfg!(feature = "x86-64-v3")
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512cd")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

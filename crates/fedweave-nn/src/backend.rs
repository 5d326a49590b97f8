//! Which burn backend local training runs on: `[device] backend`.
//!
//! The models and the trainers are written once against burn's tensor API;
//! the backend is a run-time [`Device`] (burn 0.22 dispatches on it). The
//! CPU backend (`flex`) is always built in; `cuda` and `wgpu` exist only in
//! binaries built with the cargo features of the same names (see the
//! README), so a configuration asking for one the binary lacks gets a clear
//! error before any work starts.
//!
//! Reproducibility: on the CPU results are bit-identical at any thread
//! count, and across machines of the same SIMD level: burn-flex's
//! vectorised kernels pick their width when they run (see
//! [`cpu_uses_avx512`]), and 16-lane reductions sum in another order than
//! 8-lane ones, so the batch-norm model's numbers differ in the last bits
//! between an AVX2 and an AVX-512 CPU. On a GPU the kernels' reduction order is the backend's (autotuned
//! matrix products, atomics in some reductions), so runs agree to
//! floating-point tolerance, not bit for bit; nothing here has been measured
//! on a GPU yet.

use crate::NnError;
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

/// A burn backend fedweave can train on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// burn's pure-Rust `flex` CPU backend (always available).
    #[default]
    Cpu,
    /// NVIDIA GPUs through CubeCL's CUDA runtime (cargo feature `cuda`; the
    /// driver is loaded at run time, so building should need no CUDA
    /// toolkit).
    Cuda,
    /// Any GPU through wgpu (Vulkan, Metal, DX12; cargo feature `wgpu`).
    Wgpu,
}

impl Backend {
    /// The name used in configurations.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Wgpu => "wgpu",
        }
    }

    /// Whether this binary was built with the backend.
    pub fn available(self) -> bool {
        match self {
            Backend::Cpu => true,
            Backend::Cuda => cfg!(feature = "cuda"),
            Backend::Wgpu => cfg!(feature = "wgpu"),
        }
    }

    /// The backend's default device (the first GPU for `cuda`, wgpu's
    /// preferred adapter for `wgpu`), checked by one tiny tensor operation.
    ///
    /// # Errors
    ///
    /// [`NnError::BackendMissing`] when the binary was built without the
    /// backend's cargo feature; [`NnError::DeviceUnavailable`] when the
    /// device does not work (cudarc, for one, panics when it finds no
    /// driver library: that panic is caught here and becomes the error).
    pub fn device(self) -> Result<Device, NnError> {
        let device = match self {
            Backend::Cpu => Device::flex(),
            #[cfg(feature = "cuda")]
            Backend::Cuda => Device::cuda(0),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
            #[allow(unreachable_patterns)]
            missing => {
                return Err(NnError::BackendMissing {
                    backend: missing.name(),
                });
            }
        };
        let probe = device.clone();
        let works = std::panic::catch_unwind(move || {
            let t: Tensor<1> = Tensor::from_data(TensorData::new(vec![1.0f32], [1]), &probe);
            t.into_data().as_slice::<f32>().map(|s| s[0]) == Ok(1.0)
        });
        match works {
            Ok(true) => Ok(device),
            _ => Err(NnError::DeviceUnavailable {
                backend: self.name(),
            }),
        }
    }
}

/// Whether burn-flex's CPU kernels run at AVX-512 width on this machine
/// (macerator's x86-64-v4 level: AVX-512 F, BW, CD, DQ and VL). Results are
/// bit-reproducible between machines that agree on this; between machines
/// that do not, f32 reductions (batch-norm statistics) round differently.
pub fn cpu_uses_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512cd")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_always_there_and_gpus_follow_the_features() {
        assert_eq!(Backend::Cpu.device().unwrap(), Device::flex());
        for b in [Backend::Cuda, Backend::Wgpu] {
            assert_eq!(b.available(), b.device().is_ok(), "{b:?}");
            if let Err(e) = b.device() {
                let msg = e.to_string();
                assert!(
                    msg.contains(b.name()) && msg.contains("--features"),
                    "{msg}"
                );
            }
        }
    }

    #[test]
    fn names_round_trip_through_serde() {
        for b in [Backend::Cpu, Backend::Cuda, Backend::Wgpu] {
            let v: Backend = serde_json_like(b.name());
            assert_eq!(v, b);
        }
    }

    /// Deserialises a bare string as a configuration value would be.
    fn serde_json_like(name: &str) -> Backend {
        use serde::de::IntoDeserializer;
        let de: serde::de::value::StrDeserializer<serde::de::value::Error> =
            name.into_deserializer();
        Backend::deserialize(de).unwrap()
    }
}

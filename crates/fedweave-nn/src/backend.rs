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
//! count, run to run, and across machines of the same [`CpuKernelClass`]:
//! burn-flex's kernels choose at run time how they order floating-point
//! sums (the vector width of its reductions, the depth of gemm's k-blocks),
//! so machines of another class agree to rounding, not bit for bit. On a
//! GPU the kernels' reduction order is the backend's (autotuned matrix
//! products, atomics in some reductions), so runs agree to floating-point
//! tolerance, not bit for bit.

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
    /// driver library: that panic is caught here and becomes the error);
    /// [`NnError::LibdeviceMissing`] when a CUDA binary that compiles its
    /// kernels through LLVM finds no `libdevice.10.bc` (else the first
    /// kernel calling `exp` or `log` would fail mid-run).
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
        // The panic of a missing driver is expected here: keep its message and
        // backtrace off the user's terminal (the error below says it), then
        // put the previous hook back.
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let works = std::panic::catch_unwind(move || {
            let t: Tensor<1> = Tensor::from_data(TensorData::new(vec![1.0f32], [1]), &probe);
            t.into_data().as_slice::<f32>().map(|s| s[0]) == Ok(1.0)
        });
        std::panic::set_hook(hook);
        match works {
            #[cfg(all(feature = "cuda", not(feature = "cuda-nvrtc")))]
            Ok(true) if self == Backend::Cuda => {
                let env = std::env::var_os("CUDA_PATH").map(std::path::PathBuf::from);
                libdevice(env.as_deref())
                    .map(|_| device)
                    .map_err(|looked| NnError::LibdeviceMissing { looked })
            }
            Ok(true) => Ok(device),
            _ => Err(NnError::DeviceUnavailable {
                backend: self.name(),
            }),
        }
    }
}

/// Where cubecl's LLVM path loads `libdevice.10.bc` from (cubecl-llvm
/// 0.11's search, mirrored so that its absence is an error before the run
/// starts): `$CUDA_PATH/nvvm/libdevice/` when `CUDA_PATH` is set (`cuda_path`),
/// else the first of the usual toolkit roots holding `nvvm/libdevice/`.
/// `Err` names the places looked at.
#[cfg_attr(
    not(all(feature = "cuda", not(feature = "cuda-nvrtc"))),
    allow(dead_code)
)]
fn libdevice(cuda_path: Option<&std::path::Path>) -> Result<std::path::PathBuf, String> {
    use std::path::Path;
    const ROOTS: [&str; 4] = ["/usr/local/cuda", "/opt/cuda", "/usr/lib/cuda", "/usr"];
    let file = |root: &Path| root.join("nvvm/libdevice/libdevice.10.bc");
    let root = match cuda_path {
        Some(root) => Some(root.to_path_buf()),
        None => ROOTS
            .iter()
            .map(Path::new)
            .find(|r| r.join("nvvm/libdevice").is_dir())
            .map(Path::to_path_buf),
    };
    match root.map(|r| file(&r)) {
        Some(found) if found.is_file() => Ok(found),
        Some(missing) => Err(missing.display().to_string()),
        None => Err(format!(
            "{} (CUDA_PATH is not set)",
            ROOTS
                .map(|r| file(Path::new(r)).display().to_string())
                .join(", ")
        )),
    }
}

/// What fixes the order of the CPU kernels' floating-point sums on this
/// machine, and so the last bits of every CPU result: two machines of the
/// same class give bit-identical runs, machines of different classes agree
/// to rounding only.
///
/// Two choices made at run time decide it (measured: each alone moves the
/// goldens' bits, nothing else does on x86-64):
/// - the vector level of burn-flex's element-wise kernels and reductions
///   (macerator's `Arch`: x86-64-v4 = AVX-512 sums in 16 lanes, v3 = AVX2
///   in 8), which is also the level of gemm's microkernels (16-lane
///   AVX-512 tiles on v4, 8-lane AVX2 ones on v3);
/// - the L1 data cache as gemm reads it (size, ways, line): gemm's k-block
///   depth comes from it (512 terms on a 32 KiB 8-way L1, 1024 on a 48 KiB
///   12-way one), and a product with more terms than a block is summed in
///   block-sized partial sums.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuKernelClass {
    /// `ARCH-LEVEL` of burn-flex's vector kernels, e.g. `x86_64-v4`.
    pub simd: String,
    /// L1 data cache size in bytes, as gemm reads it.
    pub l1d_bytes: usize,
    /// L1 data cache associativity (ways), as gemm reads it.
    pub l1d_ways: usize,
    /// L1 data cache line size in bytes, as gemm reads it.
    pub l1d_line: usize,
}

impl CpuKernelClass {
    /// The class of this machine, read the way the kernels read it.
    pub fn detect() -> Self {
        let l1 = gemm_common::cache::CACHE_INFO[0];
        let level = format!("{:?}", macerator::Arch::detect()).to_lowercase();
        Self {
            simd: format!("{}-{level}", std::env::consts::ARCH),
            l1d_bytes: l1.cache_bytes,
            l1d_ways: l1.associativity,
            l1d_line: l1.cache_line_bytes,
        }
    }

    /// A file-name-safe identifier, e.g. `x86_64-v4-l1d-32k-8w-64b`.
    pub fn id(&self) -> String {
        format!(
            "{}-l1d-{}k-{}w-{}b",
            self.simd,
            self.l1d_bytes / 1024,
            self.l1d_ways,
            self.l1d_line
        )
    }
}

impl std::fmt::Display for CpuKernelClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libdevice is found where `CUDA_PATH` says, and its absence names the
    /// file looked for.
    #[test]
    fn libdevice_is_looked_for_under_cuda_path() {
        let dir = std::env::temp_dir().join(format!("fedweave-libdevice-{}", std::process::id()));
        let nvvm = dir.join("nvvm/libdevice");
        std::fs::create_dir_all(&nvvm).unwrap();
        let missing = libdevice(Some(&dir)).unwrap_err();
        assert!(
            missing.ends_with("nvvm/libdevice/libdevice.10.bc"),
            "{missing}"
        );
        std::fs::write(nvvm.join("libdevice.10.bc"), b"BC").unwrap();
        assert_eq!(libdevice(Some(&dir)), Ok(nvvm.join("libdevice.10.bc")));
        std::fs::remove_dir_all(&dir).unwrap();
        let gone = libdevice(Some(&dir)).unwrap_err();
        assert!(gone.contains("fedweave-libdevice-"), "{gone}");
    }

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
    fn the_kernel_class_names_what_the_kernels_read() {
        let c = CpuKernelClass::detect();
        assert!(c.simd.starts_with(std::env::consts::ARCH), "{c}");
        assert!(
            c.l1d_bytes >= 1024 && c.l1d_ways >= 1 && c.l1d_line >= 1,
            "{c:?}"
        );
        let id = c.id();
        assert!(
            id.chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_'),
            "{id}"
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            c.simd.ends_with("-v4"),
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw"),
            "{c}"
        );
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

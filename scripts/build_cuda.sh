#!/usr/bin/env bash
# Builds the CUDA release binary of fedweave offline (no network beyond a package registry).
#
# burn 0.22.1's `cuda` feature reaches cubecl-cuda 0.11.3, which always depends on
# cubecl-llvm (its NVPTX backend); cubecl-llvm's build dependency tracel-llvm-bundler
# 23.1.0-4 downloads an LLVM bundle from GitHub unless
# `${XDG_DATA_HOME:-~/.local/share}/tracel/tracel-llvm-23.1.0-4/.tracel-llvm-installed`
# exists, and cubecl-llvm then runs `bin/llvm-config --link-static` from that folder.
# This script fills that folder with a wrapper around a distribution LLVM (>= 22; Debian 12
# has llvm-22-dev in bookworm-backports) so the build never downloads anything.
#
# Usage: scripts/build_cuda.sh [--target-dir DIR] [--nvrtc]
#   --nvrtc  compile kernels with NVRTC (cubecl's CUDA C++ path) instead of LLVM's NVPTX
#            backend: needs `libnvrtc` at run time, works with any driver that loads the
#            PTX NVRTC emits (use it when the driver reports CUDA newer than 13.0, whose PTX
#            LLVM 22 cannot emit).
# The binary lands in DIR/release/fedweave (default DIR: target/cuda).
# At run time: the NVIDIA driver (libcuda) and, for kernels using exp/log/tanh on the
# LLVM path, `libdevice.10.bc` under `$CUDA_PATH/nvvm/libdevice/` (a CUDA toolkit, or
# PyPI's `nvidia-cuda-nvcc-cu12` wheel: CUDA_PATH=…/site-packages/nvidia/cuda_nvcc).
set -euo pipefail

target_dir=target/cuda
features=cuda
while [ $# -gt 0 ]; do
    case "$1" in
    --target-dir) target_dir=$2; shift 2 ;;
    --nvrtc) features=cuda-nvrtc; shift ;;
    *) echo "build_cuda.sh: unknown argument \`$1\` (expected --target-dir DIR or --nvrtc)" >&2; exit 2 ;;
    esac
done

# 1. A distribution LLVM of version 22 or newer.
llvm_config=""
for v in 24 23 22; do
    if [ -x "/usr/lib/llvm-$v/bin/llvm-config" ]; then llvm_config=/usr/lib/llvm-$v/bin/llvm-config; break; fi
done
if [ -z "$llvm_config" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        . /etc/os-release
        if [ "${VERSION_CODENAME:-}" = bookworm ] && ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d; then
            echo 'deb http://deb.debian.org/debian bookworm-backports main' > /etc/apt/sources.list.d/bookworm-backports.list
        fi
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq llvm-22-dev libzstd-dev libz3-dev libxml2-dev >/dev/null
        llvm_config=/usr/lib/llvm-22/bin/llvm-config
    else
        echo "build_cuda.sh: no LLVM >= 22 found (looked for /usr/lib/llvm-{22,23,24}/bin/llvm-config)." >&2
        echo "  Install llvm-22-dev and libzstd-dev (Debian 12: from bookworm-backports), then rerun." >&2
        exit 1
    fi
fi
echo "using $($llvm_config --version) at $llvm_config"

# 2. The bundler's folder: a wrapper llvm-config and the 'installed' marker.
bundle="${XDG_DATA_HOME:-$HOME/.local/share}/tracel/tracel-llvm-23.1.0-4"
# Both are rewritten only when they change: the bundler's build script watches them, and
# a new timestamp rebuilds cubecl and burn (minutes) on every run of this script.
mkdir -p "$bundle/bin"
cat > "$bundle/bin/llvm-config.new" <<EOF
#!/usr/bin/env bash
# Written by fedweave's scripts/build_cuda.sh: the distribution's llvm-config, minus the
# Polly libraries the distribution does not ship, with libz3 named by -l.
out=\$("$llvm_config" "\$@") || exit \$?
printf '%s\n' "\$out" | sed -E 's/(^| )-lPolly[A-Za-z]*//g; s#[^ ]*/libz3\.so#-lz3#g'
EOF
chmod +x "$bundle/bin/llvm-config.new"
if cmp -s "$bundle/bin/llvm-config.new" "$bundle/bin/llvm-config"; then
    rm "$bundle/bin/llvm-config.new"
else
    mv "$bundle/bin/llvm-config.new" "$bundle/bin/llvm-config"
fi
[ -e "$bundle/.tracel-llvm-installed" ] || touch "$bundle/.tracel-llvm-installed"

# 3. The build.
cargo build --release -p fedweave-cli --features "$features" --target-dir "$target_dir"
echo "built $target_dir/release/fedweave ($(du -h "$target_dir/release/fedweave" | cut -f1))"

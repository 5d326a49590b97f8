#!/usr/bin/env bash
# CI's second look at the numbers that depend on the CPU (README
# "Determinism"): the golden and gradient tests again, as on other recorded
# CPU kernel classes than the host's, through scripts/as_cpu.sh:
# - the host's SIMD level with the other recorded L1 data cache (native speed);
# - on an AVX-512 host, the AVX2 level under qemu-user (the local-training
#   golden only: the engine goldens take ~25 min under qemu and the gradient
#   checks ~8; AVX2 hosts run both natively).
# Reuses `cargo test --workspace`'s build (same features, no rebuild). Needs
# root for the mount namespace; says so and skips where it has none.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! unshare -m mount --bind /sys/devices/system/cpu /sys/devices/system/cpu 2>/dev/null; then
  echo "second_class_tests: no mount namespace here (needs root); skipped" >&2
  exit 0
fi
if [ ! -r /sys/devices/system/cpu/cpu0/cache/index0/size ] || ! command -v unshare >/dev/null; then
  echo "second_class_tests: no cache information in sysfs (or no unshare); skipped" >&2
  exit 0
fi
level=$(scripts/host_simd_level.sh)
l1=$(cat /sys/devices/system/cpu/cpu0/cache/index0/size)
if [ "$l1" = 32K ]; then other=(48K 12); else other=(32K 8); fi
echo "== $level with a ${other[0]} ${other[1]}-way L1d"
scripts/as_cpu.sh "$level" "${other[@]}" -- cargo test --workspace -- golden gradient
if [ "$level" = x86-64-v4 ]; then
  echo "== x86-64-v3 (qemu) with a 32K 8-way L1d"
  scripts/as_cpu.sh x86-64-v3 32K 8 -- cargo test --workspace -- golden_train
fi

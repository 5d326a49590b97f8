#!/usr/bin/env bash
# Runs a command as if on another CPU class, to check that results that
# depend on the CPU (docs: README "Determinism") are recorded for it:
#   scripts/as_cpu.sh x86-64-v3 32K 8 -- cargo test ...
# SIMD level: x86-64-v4 runs natively (needs an AVX-512 host); x86-64-v3 runs
# natively on a host without AVX-512 and otherwise every binary under
# qemu-user's TCG CPU `max` (AVX2 + FMA, no AVX-512; Debian package qemu-user).
# L1 data cache (size, ways): what gemm's blocking reads from sysfs, shown
# through a bind mount in a private mount namespace (needs root and util-linux
# `unshare`).
set -euo pipefail
[ $# -ge 4 ] && [ "$4" = "--" ] || { echo "usage: $0 x86-64-v3|x86-64-v4 L1D_SIZE L1D_WAYS -- COMMAND..." >&2; exit 2; }
level=$1 size=$2 ways=$3; shift 4
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
cp -r /sys/devices/system/cpu/online /sys/devices/system/cpu/possible "$fake"/ 2>/dev/null || true
for cpu in /sys/devices/system/cpu/cpu[0-9]*; do
  for idx in "$cpu"/cache/index*; do
    out="$fake/$(basename "$cpu")/cache/$(basename "$idx")"
    mkdir -p "$out"
    for f in level type size ways_of_associativity coherency_line_size shared_cpu_list; do
      cat "$idx/$f" > "$out/$f"
    done
    if [ "$(cat "$idx/level")" = 1 ] && [ "$(cat "$idx/type")" = Data ]; then
      echo "$size" > "$out/size"
      echo "$ways" > "$out/ways_of_associativity"
    fi
  done
done
# The host's own level needs no emulator: an AVX2 host without AVX-512 runs
# x86-64-v3 natively (under qemu the golden tests take ~25 min more, which
# once pushed CI past its limit on such a host).
host=$("$(dirname "$0")"/host_simd_level.sh)
case "$level" in
  x86-64-v4) [ "$host" = x86-64-v4 ] || { echo "x86-64-v4 needs an AVX-512 host (this one is $host)" >&2; exit 2; }
             runner="" ;;
  x86-64-v3) if [ "$host" = x86-64-v3 ]; then runner=""; else runner="qemu-x86_64 -cpu max"; fi ;;
  *) echo "unknown level $level" >&2; exit 2 ;;
esac
# cargo runs test binaries through the runner; any other command runs under it.
if [ -n "$runner" ]; then
  export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$runner"
  if [ "$1" != cargo ]; then set -- $runner "$@"; fi
fi
exec unshare -m bash -c 'mount --bind "$0" /sys/devices/system/cpu && exec "$@"' "$fake" "$@"

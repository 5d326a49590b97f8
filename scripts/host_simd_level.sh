#!/usr/bin/env bash
# Prints this host's SIMD level as scripts/as_cpu.sh names it: x86-64-v4
# (macerator's v4: AVX-512 F, BW, CD, DQ and VL) or x86-64-v3.
set -euo pipefail
level=x86-64-v4
for f in avx512f avx512bw avx512cd avx512dq avx512vl; do
  grep -qw "$f" /proc/cpuinfo || level=x86-64-v3
done
echo "$level"

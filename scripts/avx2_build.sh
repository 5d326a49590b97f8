#!/usr/bin/env bash
# Builds a release `fedweave` that runs the code paths of an AVX2 host on an
# AVX-512 one, to measure them (docs/results.md, session 39): fedweave's own
# kernels through the `fedweave-core/x86-64-v3` feature, and `gemm`, pulp and
# macerator (burn-flex) through copies of their feature-detection macros that
# answer "no" for every AVX-512 feature. The copies, a worktree of HEAD and
# the build live in target/avx2/ (kept, so a second build is incremental);
# the checkout, its Cargo.lock and cargo's registry are left as they are.
# For speed figures only: the tests' CPU classes come from scripts/as_cpu.sh.
#   scripts/avx2_build.sh [OUT_BINARY]   (default target/avx2/fedweave)
# Measure PyTorch the same way with ATEN_CPU_CAPABILITY=avx2
# ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
out=$(realpath -m "${1:-$root/target/avx2/fedweave}")
work=$root/target/avx2
mkdir -p "$work"
git -C "$root" worktree remove --force "$work/tree" 2>/dev/null || rm -rf "$work/tree"
git -C "$root" worktree prune
git -C "$root" worktree add --quiet --detach "$work/tree" HEAD
trap 'git -C "$root" worktree remove --force "$work/tree" 2>/dev/null || true' EXIT
cd "$work/tree"
cargo fetch --quiet
registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
config=()
for crate in gemm-common pulp macerator; do
  version=$(awk -v n="\"$crate\"" '$1 == "name" && $3 == n { getline; gsub(/"/, "", $3); print $3; exit }' Cargo.lock)
  copy=$work/$crate-$version
  config+=(--config "patch.crates-io.$crate.path=\"$copy\"")
  [ -d "$copy" ] && continue
  rm -rf "$copy.tmp"
  cp -r "$(ls -d "$registry"/*/"$crate-$version" | head -n 1)" "$copy.tmp"
  # The crate's x86 macro calls `is_x86_feature_detected!($x)` once; the
  # copy asks first whether the feature's name starts with "avx512".
  python3 - "$copy.tmp" <<'PY'
import pathlib, re, sys
call = re.compile(r"::std::(?:arch::)?is_x86_feature_detected!\((\$\w+)\)")
hits = [(p, call.findall(p.read_text())) for p in pathlib.Path(sys.argv[1], "src").rglob("*.rs")]
hits = [(p, found) for p, found in hits if found]
if len(hits) != 1 or len(hits[0][1]) != 1:
    sys.exit(f"{sys.argv[1]}: expected one x86 detection call, found {hits}")
path = hits[0][0]
path.write_text(call.sub(lambda m: '{ let f: &str = %s; !f.starts_with("avx512") && %s }'
                         % (m.group(1), m.group(0)), path.read_text()))
PY
  mv "$copy.tmp" "$copy"
done
CARGO_TARGET_DIR="$work/build" cargo build --release --quiet -p fedweave-cli \
  --features fedweave-core/x86-64-v3 "${config[@]}"
mkdir -p "$(dirname "$out")"
cp "$work/build/release/fedweave" "$out"
echo "$out"

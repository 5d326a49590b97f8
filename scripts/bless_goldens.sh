#!/usr/bin/env bash
# Re-records the golden files (engine and local training) on every CPU kernel
# class listed in their classes.txt, canonical class first, from one
# AVX-512 x86-64 machine (as root, with qemu-user for the AVX2 classes):
#   scripts/bless_goldens.sh            # every class
#   scripts/bless_goldens.sh CLASS...   # some classes
#   FEDWEAVE_GOLDEN_CASES=fedfomo,l2c scripts/bless_goldens.sh   # some cases
# Only for an intended change of the numbers: say which and why in
# docs/results.md. See scripts/as_cpu.sh and tests/support/golden_set.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
nn_list=crates/fedweave-nn/tests/golden/classes.txt
sim_list=crates/fedweave-sim/tests/golden/classes.txt
classes=("$@")
if [ ${#classes[@]} -eq 0 ]; then
  # Both folders' classes, canonical first (the local-training golden has one more).
  mapfile -t classes < <(grep -hv '^#' "$sim_list" "$nn_list" | awk '!seen[$0]++')
fi
cargo test -p fedweave-nn -p fedweave-sim --test it --no-run
for class in "${classes[@]}"; do
  # x86_64-v3-l1d-32k-8w-64b -> x86-64-v3 32K 8
  if [[ ! $class =~ ^x86_64-(v[34])-l1d-([0-9]+)k-([0-9]+)w-64b$ ]]; then
    echo "cannot emulate class $class" >&2; exit 2
  fi
  args=("x86-64-${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}K" "${BASH_REMATCH[3]}")
  echo "== $class"
  if grep -qx "$class" "$nn_list"; then
    FEDWEAVE_BLESS=1 scripts/as_cpu.sh "${args[@]}" -- \
      cargo test -p fedweave-nn --test it golden_train -- --exact golden_train::train_local_matches_the_recorded_bits
  fi
  if grep -qx "$class" "$sim_list"; then
    FEDWEAVE_BLESS=1 scripts/as_cpu.sh "${args[@]}" -- \
      cargo test -p fedweave-sim --test it golden -- --exact golden::every_algorithm_reproduces_its_golden_numbers
  fi
done

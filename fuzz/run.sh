#!/usr/bin/env bash
# Runs each fuzz target for SECONDS (default 30) and fails if any of them finds an input
# that panics, overflows, hangs (10 s on one input) or runs out of memory.
#
#   fuzz/run.sh 30                  what ./x test runs
#   fuzz/run.sh 300 rsp             one target, longer
#
# The seeds in corpus/TARGET are kept in git; what a run discovers goes to a scratch
# corpus that is thrown away, so a run leaves the tree as it was. A crashing input is
# written to artifacts/TARGET/: reproduce it with `cargo fuzz run -s none TARGET FILE`,
# and once the bug is fixed, add the input to corpus/TARGET.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(glass_file snapshot rsp target_xml)

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked --version 0.13.2
fi

# Only stable Rust can be installed here. cargo fuzz's coverage instrumentation uses
# stable -C options; what needs nightly is a sanitizer (-Zsanitizer), so none is used
# (-s none): the fuzzed code has no unsafe, Rust's own checks catch what matters, and
# the runs are faster without ASan. (To run one anyway: RUSTC_BOOTSTRAP=1 lets
# the stable compiler take -Z options.) Debug assertions and overflow checks are on, by
# Cargo.toml's release profile.
flags=(-s none)

cargo fuzz build "${flags[@]}"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
passed=0
failed=()
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target"
    log="$scratch/$target.log"
    # The first corpus directory receives new inputs; corpus/TARGET is only read.
    if cargo fuzz run "${flags[@]}" "$target" "$scratch/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        passed=$((passed + 1))
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        coverage=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
        echo "fuzz: $target: no crash in ${seconds} s (${runs:-?} inputs, $coverage)"
    else
        failed+=("$target")
        tail -n 40 "$log"
        echo "fuzz: $target FAILED: the input is in fuzz/artifacts/$target/"
    fi
done
echo "fuzz: $passed passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]

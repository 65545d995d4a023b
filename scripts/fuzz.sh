#!/usr/bin/env bash
# Runs every fuzz target under fuzz/ for a bounded time (docs/fuzzing.md).
#
#   FUZZ_SECONDS     seconds each target runs (default 30)
#   FUZZ_TARGETS     the targets to run, space separated (default: all)
#   FUZZ_JOBS        targets run at once (default: the number of CPUs)
#   FUZZ_TARGET_DIR  build directory (default ~/.cache/keel-fuzz-target),
#                    outside the repository so clones share the build
#
# The toolchain is stable. cargo-fuzz's default build adds AddressSanitizer
# with `-Zsanitizer=address`, which stable rustc refuses ("the option `Z`
# is only accepted on the nightly compiler"). With `--sanitizer none`,
# cargo-fuzz 0.13 passes only flags stable rustc accepts (`-Cpasses=
# sancov-module`, `-Cllvm-args=-sanitizer-coverage-…`, `--cfg fuzzing`,
# `-Cdebug-assertions`), so neither nightly nor RUSTC_BOOTSTRAP is needed:
# libFuzzer still steers by coverage, and debug assertions still turn
# overflows into crashes. What is given up is ASan's memory checking,
# which has little to find in crates that forbid `unsafe`.
#
# New inputs the fuzzer finds go to a scratch corpus in the build
# directory; the committed seeds under fuzz/corpus/ are only read. A
# crashing input is saved under fuzz/artifacts/<target>/ and the script
# fails after the other targets have run.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-30}"
parallel="${FUZZ_JOBS:-$(nproc)}"
target_dir="${FUZZ_TARGET_DIR:-$HOME/.cache/keel-fuzz-target}"
logs="$target_dir/logs"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

started=$SECONDS
# One build of every target; each run below then starts at once.
cargo fuzz build --sanitizer none --target-dir "$target_dir"
echo "fuzz build: $((SECONDS - started)) s"

if [[ -n "${FUZZ_TARGETS:-}" ]]; then
    read -r -a targets <<<"$FUZZ_TARGETS"
else
    mapfile -t targets < <(cargo fuzz list)
fi
mkdir -p "$logs"

run_one() {
    local target="$1" scratch="$target_dir/corpus/$1"
    mkdir -p "$scratch" "fuzz/corpus/$target"
    # The first corpus directory receives new inputs; the seeds are read.
    cargo fuzz run --sanitizer none --target-dir "$target_dir" "$target" \
        "$scratch" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
        -print_final_stats=1 >"$logs/$target.log" 2>&1
}

declare -A pid_of=()
for target in "${targets[@]}"; do
    while (($(jobs -rp | wc -l) >= parallel)); do
        wait -n || true
    done
    run_one "$target" &
    pid_of[$target]=$!
done

failed=()
for target in "${targets[@]}"; do
    if wait "${pid_of[$target]}"; then
        result=ok
    else
        result=FAILED
        failed+=("$target")
    fi
    log="$logs/$target.log"
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    corpus=$(sed -n 's/.*DONE .*corp: \([0-9]*\)\/.*/\1/p' "$log" | tail -n 1)
    printf '%-20s %10s runs %7s exec/s %5s inputs  %s\n' \
        "$target" "${runs:-?}" "${rate:-?}" "${corpus:-?}" "$result"
done

for target in "${failed[@]}"; do
    echo "== $target failed; the end of its log ($logs/$target.log):"
    tail -n 40 "$logs/$target.log"
done
echo "fuzz total: $((SECONDS - started)) s"
((${#failed[@]} == 0))

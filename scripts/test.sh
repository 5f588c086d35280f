#!/usr/bin/env bash
# Sets up and runs every test and quality gate (this is what CI runs, from .ci/run):
#   1. clang-format: no file differs from its formatted self
#   2. the release build's unit and black-box tests (CTest)
#   2b. Perseus installed: cmake --install, pip install . in a venv, the .deb (tests/install)
#   3. the same tests in a build with AddressSanitizer and UndefinedBehaviorSanitizer
#   4. the libFuzzer target for the hostfile and -H parsers, for PERSEUS_FUZZ_SECONDS (60)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)

echo "== clang-format"
mapfile -t sources < <(git ls-files '*.cc' '*.c' '*.h' 2>/dev/null || find apps lib tests bench -name '*.cc' -o -name '*.h')
clang-format --dry-run --Werror "${sources[@]}"

echo "== tests (release build)"
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== install (cmake --install, pip install ., the .deb; tests/install/run.sh)"
tests/install/run.sh

echo "== tests (AddressSanitizer + UndefinedBehaviorSanitizer)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DPERSEUS_SANITIZE=address,undefined >/dev/null
cmake --build build-asan
# Full stacks on malloc, so that tests/lsan.supp can name the library function that leaks.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0 \
  LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"

echo "== fuzzing the hostfile and -H parsers"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPERSEUS_BUILD_TESTS=OFF -DPERSEUS_BUILD_FUZZERS=ON >/dev/null
cmake --build build-fuzz --target fuzz_host_parsers
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
cp tests/fuzz/corpus/host_parsers/* "$corpus"/
build-fuzz/tests/fuzz/fuzz_host_parsers -max_total_time="${PERSEUS_FUZZ_SECONDS:-60}" \
  -print_final_stats=1 "$corpus" 2>&1 | tail -n 12
echo "== all gates passed"

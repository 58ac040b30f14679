#!/usr/bin/env bash
# The CPU tier under AddressSanitizer and UndefinedBehaviorSanitizer (every C++ CPU test), and the
# cache and threading tests under ThreadSanitizer, each in a build folder of its own. CI runs it
# after the README's test command; any report fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
targets=(fusedattn_cpu_tests fusedattn_plan_payload_tests)
# The tests that run threads or processes against the caches: the plan cache's single-flight
# builds and eviction, the config registry, the disk cache's files and its racing processes.
threaded='LruCache*:PlanFolder*:PlanFileFormat*:ConfigRegistry*:PlanKeyEvents*'
for sanitize in address,undefined thread; do
  dir=build-${sanitize//,/-}
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSEDATTN_SANITIZE="$sanitize" \
    -DFUSEDATTN_PYTHON=OFF >/dev/null
  cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}"
  if [ "$sanitize" = thread ]; then
    echo "== ThreadSanitizer: $threaded"
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
      "$dir/tests/fusedattn_cpu_tests" --gtest_filter="$threaded" --gtest_brief=1
  else
    echo "== AddressSanitizer and UndefinedBehaviorSanitizer: the whole CPU tier"
    export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:strict_string_checks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    "$dir/tests/fusedattn_cpu_tests" --gtest_brief=1
    "$dir/tests/fusedattn_plan_payload_tests" --gtest_brief=1
  fi
done
echo "sanitize: no reports"

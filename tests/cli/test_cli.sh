#!/usr/bin/env bash
# tests/cli/test_cli.sh — the `fusedattn` CLI's exit codes and messages, runnable without a GPU.
# Usage: FUSEDATTN_CLI=/path/to/fusedattn bash tests/cli/test_cli.sh
set -u

CLI="${FUSEDATTN_CLI:?set FUSEDATTN_CLI to the fusedattn binary}"
passed=0
failed=0

# A GPU changes what some commands do (they run instead of explaining why not); nvidia-smi is the
# one probe that does not depend on the binary under test.
has_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  has_gpu=1
fi

# expect NAME RC_REGEX OUTPUT_REGEX -- ARGS...: runs the CLI, checks its exit code against
# RC_REGEX (e.g. '^2$' or '^(0|1)$') and that stdout+stderr match OUTPUT_REGEX (grep -E, -i).
expect() {
  local name="$1" rc_pattern="$2" out_pattern="$3"
  shift 4
  local out rc
  out="$("$CLI" "$@" 2>&1)"
  rc=$?
  local problem=""
  [[ "$rc" =~ $rc_pattern ]] || problem="exit code $rc, wanted $rc_pattern"
  if [[ -z "$problem" && -n "$out_pattern" ]] && ! grep -Eqi -- "$out_pattern" <<<"$out"; then
    problem="output does not match /$out_pattern/"
  fi
  if [[ -z "$problem" ]]; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name: $problem"
    echo "     command: $CLI $*"
    sed 's/^/     | /' <<<"$out" | head -20
  fi
}

VALID="layout=bshd b=2 s=128 h=8 d=64"

# Usage errors: exit 2 with a usage line.
expect "no arguments"            '^2$' 'usage'                  --
expect "unknown command"         '^2$' 'usage'                  -- frobnicate
expect "support without spec"    '^2$' 'usage'                  -- support
expect "run without spec"        '^2$' 'usage'                  -- run
expect "bench without spec"      '^2$' 'usage'                  -- bench
expect "unknown option"          '^2$' 'unknown option --bogus' -- support "$VALID" --bogus
expect "bad --pass value"        '^2$' 'pass'                   -- support "$VALID" --pass sideways
expect "bad --seed value"        '^2$' 'seed'                   -- run "$VALID" --seed abc
expect "two specs"               '^2$' 'usage'                  -- support "$VALID" "$VALID"
expect "--help"                  '^0$' 'usage: fusedattn'       -- --help

# Malformed or invalid specs: exit 2, "invalid_argument:" naming the field.
expect "heads not divisible"     '^2$' 'invalid_argument.*h_q'  -- support "layout=bshd b=2 s=128 h_q=12 h_kv=8 d=64"
expect "unknown key"             '^2$' 'invalid_argument.*frobnicate' -- support "$VALID frobnicate=3"
expect "head dim not mult. of 8" '^2$' 'invalid_argument.*d_qk' -- support "layout=bshd b=2 s=128 h=8 d=60"
expect "unknown layout"          '^2$' 'invalid_argument.*layout' -- support "layout=bogus b=2 s=128 h=8 d=64"
expect "run validates first"     '^2$' 'invalid_argument.*h_q'  -- run "layout=bshd b=2 s=128 h_q=12 h_kv=8 d=64"

# causal closes the window's right side: beside W,-1 it is the causal sliding window W,0 (printed
# as such), and beside a window that looks ahead it is refused in the core's words.
expect "causal sliding window"   '^(0|1)$' 'spec="layout=bshd .* window=100,0"' -- support "$VALID causal window=100,-1"
expect "causal refuses R >= 1"   '^2$' "invalid_argument: window = 100,5: a right bound of 0 or -1 with causal \\(causal closes the window's right side\\)" \
                                                                -- support "$VALID window=100,5 causal"

# Support answers: the policy path without a GPU, the full check with one.
if [[ "$has_gpu" == 1 ]]; then
  expect "support valid spec"    '^0$' 'forward: supported'     -- support "$VALID"
else
  expect "support valid spec"    '^0$' 'no GPU: showing the policy for SM 9\.0 only' -- support "$VALID"
  expect "support says verdict"  '^0$' 'backward: supported'    -- support "$VALID"
fi
expect "support one pass"        '^(0|1)$' 'forward: '          -- support "$VALID" --pass forward
expect "d=512 not supported"     '^1$' 'not supported'          -- support "layout=bshd b=1 s=128 h=8 d=512"
expect "d=512 reason names 256"  '^1$' '256'                    -- support "layout=bshd b=1 s=128 h=8 d=512"
expect "verdict carries spec"    '^(0|1)$' 'spec="layout='      -- support "$VALID"

# Ragged and paged specs: the layout implies padding, page keys size the pool, and a paged cache
# has no backward, with its reason.
RAGGED="layout=thd_thd_thd b=5 s_q=333 s_kv=517 h_q=8 h_kv=2 d=128 causal"
PAGED="layout=bshd_paged_sbhd b=4 s_q=1 s_kv=1024 h_q=32 h_kv=8 d=128 page_size=64 pages=100 causal align=bottom_right"
expect "ragged spec round-trips" '^0$' 'spec="layout=thd_thd_thd dtype=bf16 b=5 s_q=333 s_kv=517 h_q=8 h_kv=2' -- support "$RAGGED"
expect "paged: forward only"     '^1$' 'kv_pages = 16: needs no backward through paged caches' -- support "$PAGED"
expect "paged needs whole pages" '^2$' 'invalid_argument.*s_kv = 1000.*multiple of page_size' -- support "${PAGED/s_kv=1024/s_kv=1000}"
expect "page keys need paging"   '^2$' 'invalid_argument.*page_size.*paged layout' -- support "$VALID page_size=16 pages=4"

# FP8: what Hopper's FP8 kernels take, with what lifts each limit (the policy answers the same with
# and without a GPU here: each case is one the policy refuses before cuDNN is asked).
FP8="layout=bshd dtype=e4m3 b=1 s=128 h=8 d=128 causal"
expect "fp8 spec round-trips"    '^0$' 'spec="layout=bshd dtype=e4m3 b=1'         -- support "$FP8"
expect "fp8 backward needs 128"  '^1$' 'd_qk = 64: needs 128 for the FP8 backward on SM 9.x.*Blackwell' \
                                                                            -- support "${FP8/d=128/d=64}"
expect "fp8 takes no bias"       '^1$' 'no bias with FP8'                         -- support "$FP8 bias=11ss"
# MXFP8 writes O unscaled, so its O is 16-bit: the short form's FP8 O is refused as invalid.
MXFP8="q=e4m3[1,8,128,128]/[131072,128,1024,1] k=e4m3[1,8,128,128]/[131072,128,1024,1] v=e4m3[1,8,128,128]/[131072,128,1024,1] o=bf16[1,8,128,128]/[131072,128,1024,1] window=-1,0 fp8_scaling=mxfp8"
expect "mxfp8 needs cuDNN 9.21"  '^1$' 'fp8_scaling = mxfp8: needs cuDNN 9.21'    -- support "$MXFP8"
expect "mxfp8 needs a 16-bit O"  '^2$' 'invalid_argument.*o\.dtype.*f16 or bf16 with fp8_scaling=mxfp8' \
                                                                            -- support "$FP8 fp8_scaling=mxfp8"
expect "fp8 takes no score_mod"   '^1$' 'score_mod = mul\(tanh\(div\(score,\$0\)\),\$0\): needs f16 or bf16 inputs' \
  -- support "$FP8 score_mod=mul(tanh(div(score,\$0)),\$0)"
expect "alibi beside a score_mod" '^1$' 'alibi = 1: needs no alibi beside a score modifier.*add\(score,mul\(t0\[h\],sub\(kv,q\)\)\)' \
  -- support "layout=bshd b=1 s=64 h=2 d=64 causal alibi=1 score_mod=mul(tanh(div(score,\$0)),\$0)"
expect "a bad score_mod, named"  '^2$' 'score_mod = "mul\(score\)" at character 9' -- support "layout=bshd b=1 s=64 h=2 d=64 score_mod=mul(score)"
expect "fp8 names torch's dtype" '^0$' 'dtype=e4m3'                               -- support "${FP8/e4m3/float8_e4m3fn}"

# Commands that need a GPU say plainly when there is none.
expect "info"                    '^0$' ''                       -- info
if [[ "$has_gpu" == 1 ]]; then
  expect "demo"                  '^0$' 'demo: PASS'             -- demo
else
  expect "run without GPU"       '^4$' 'no GPU'                 -- run "$VALID"
  expect "bench without GPU"     '^4$' 'no GPU'                 -- bench "$VALID"
  expect "fp8 run without GPU"   '^4$' 'no GPU'                 -- run "$FP8"
  expect "demo without GPU"      '^0$' 'no GPU found'           -- demo
  expect "demo self-checks pass" '^0$' 'finite differences.*PASS' -- demo
  expect "support matrix says policy only" '^0$' 'No GPU: these are the pure policy' -- support-matrix
fi
expect "support matrix lists every reason" '^0$' 'both: bias = 1hss: needs no bottom-right diagonal' -- support-matrix

echo "$passed passed, $failed failed"
[[ "$failed" == 0 ]]

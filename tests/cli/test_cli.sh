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
    local command="$CLI $*"
    echo "     command: ${command:0:300}"
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
expect "--help lists commands"   '^0$' 'support-matrix +check_support' -- --help

# Each command's own help (--help, -h, `help NAME`): its usage line and every option it takes.
declare -A OPTIONS=(
  [info]=""
  [support]="--pass"
  [run]="--no-backward --seed --scale --autotune"
  [bench]="--iters --autotune"
  [warmup]="--file --buckets --pass --threads --autotune"
  [demo]=""
  [support-matrix]="--out"
)
for command in "${!OPTIONS[@]}"; do
  expect "$command --help"        '^0$' "^usage: fusedattn $command( |\$)" -- "$command" --help
  expect "$command -h"            '^0$' "^usage: fusedattn $command( |\$)" -- "$command" -h
  expect "help $command"          '^0$' "^usage: fusedattn $command( |\$)" -- help "$command"
  for option in ${OPTIONS[$command]}; do
    expect "$command --help: $option" '^0$' "^  $option( |\$)" -- "$command" --help
  done
done
expect "help wins over a bad option" '^0$' '^usage: fusedattn support ' -- support "$VALID" --bogus --help
expect "help of an unknown command"  '^2$' "unknown command 'frobnicate'" -- help frobnicate

# Options that do not apply to a command are refused, naming the option, the command and the
# options it does take.
expect "support refuses --iters"  '^2$' "option --iters does not apply to 'support' \(it is an option of bench\); 'support' takes --pass" \
                                                                -- support "$VALID" --iters 5
expect "info refuses --pass"      '^2$' "option --pass does not apply to 'info'.*'info' takes no options" -- info --pass both
expect "demo refuses --iters"     '^2$' "option --iters does not apply to 'demo'" -- demo --iters 3
expect "run refuses --pass"       '^2$' "option --pass does not apply to 'run'.*takes --no-backward, --seed N, --scale X, --autotune" \
                                                                -- run "$VALID" --pass forward
expect "bench refuses --seed"     '^2$' "option --seed does not apply to 'bench'.*it is an option of run\)" -- bench "$VALID" --seed 1
expect "warmup refuses --scale"   '^2$' "option --scale does not apply to 'warmup'" -- warmup "$VALID" --scale 1
expect "support-matrix refuses --autotune" '^2$' "option --autotune does not apply to 'support-matrix'.*run, bench, warmup" \
                                                                -- support-matrix --autotune
expect "info takes no spec"       '^2$' "'info' takes no spec"  -- info "$VALID"
expect "a flag takes no value"    '^2$' '--no-backward is a flag' -- run "$VALID" --no-backward=1
expect "--iters=N form checked"   '^2$' "--iters needs a non-negative integer, got 'abc'" -- bench "$VALID" --iters=abc
expect "refusal shows the usage"  '^2$' 'usage: fusedattn support SPEC \[--pass' -- support "$VALID" --iters 5

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

# Progress of long work goes to stderr, stdout keeps the result alone. Without a GPU the report
# takes well under the default 2 s between lines, so a line for every item is asked for; with one
# it builds every plan (minutes), which the command above did already.
expect_streams() {  # NAME CONDITION: CONDITION (shell code) reads $out and $err
  local name="$1" condition="$2"
  if eval "$condition"; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name: [[ $condition ]] does not hold"
    head -3 <<<"$err" | sed 's/^/     stderr | /'
  fi
}
if [[ "$has_gpu" == 0 ]]; then
  out="$(FUSEDATTN_PROGRESS_SECONDS=0 "$CLI" support-matrix 2>/tmp/fusedattn_cli_err.$$)"
  err="$(cat /tmp/fusedattn_cli_err.$$)"
  rm -f /tmp/fusedattn_cli_err.$$
  expect_streams "support-matrix progress on stderr" \
    'grep -Eq "^support-matrix: 1/[0-9]+ combinations \([0-9]+ s\)$" <<<"$err" && grep -Eq "^support-matrix: ([0-9]+)/\1 combinations \([0-9]+ s\): done$" <<<"$err"'
  expect_streams "support-matrix stdout is the report alone" \
    '[[ "$out" == "# Support matrix"* ]] && ! grep -Eq "^support-matrix: [0-9]+/" <<<"$out"'
  out="$(FUSEDATTN_PROGRESS_SECONDS=off "$CLI" support-matrix 2>/tmp/fusedattn_cli_err.$$)"
  err="$(cat /tmp/fusedattn_cli_err.$$)"
  rm -f /tmp/fusedattn_cli_err.$$
  expect_streams "support-matrix progress off" '[[ -z "$err" && "$out" == "# Support matrix"* ]]'
fi

# Long values are shown cut in errors (the core's InvalidArgument, and the CLI's own usage errors):
# their start, " ... ", their end and their length, with the field and the requirement intact.
LONG="$(printf 'z%.0s' {1..5000})"
expect "a long layout is cut"    '^2$' '^invalid_argument: layout = z{150} \.\.\. z{50} \(5000 characters\): one of bshd' \
                                                                -- support "layout=$LONG b=2 s=128 h=8 d=64"
# A constant of 5000 digits and one ')' too many: the end, where the parse failed, is kept.
expect "a long score_mod is cut" '^2$' '^invalid_argument: score_mod = "mul\(score,1\.0{137} \.\.\. 0{29}\)\)" at character 5013 \(5034 characters\): the end of the expression there$' \
  -- support "layout=bshd b=1 s=64 h=2 d=64 score_mod=mul(score,1.${LONG//z/0}))"
expect "a long argument is cut"  '^2$' "unexpected argument 'z{150} \.\.\. z{50} \(5000 characters\)'" -- support "$VALID" "$LONG"
long_error="$("$CLI" support "layout=$LONG b=2 s=128 h=8 d=64" 2>&1)"
expect_streams "a long value's error stays short" '(( ${#long_error} < 1000 ))'

echo "$passed passed, $failed failed"
[[ "$failed" == 0 ]]

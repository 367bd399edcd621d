#!/usr/bin/env bash
# The device check of issue 53 (item 6): one prepared script, at most 9 minutes on one H100.
#   parity     the kernel backends against reference (`ablate kernels check --quick`)
#   andrea     andrea-120m, STEPS steps: tokens/s and MFU for reference (twice: its own run-to-run
#              loss spread is the floor of the tolerance), reference + torch.compile, cuda, triton
#   packs      per-member tokens/s of packs of 1, 8 and 32 at widths 64 and 256, eager and
#              captured (CUDA graphs), when the pack code (ablate/engine/pack_train.py) is present
#   decide     `ablate reproduce prenorm-wins --decide` with packs: its wall time and verdict
#   bench      the kernel bench (device time by graph replay, host time beside), if time is left
# The cuda extension builds in the background from the start (nvcc takes a minute or two); the
# stages that need it wait for it. Every stage runs under its own `timeout` inside one overall
# deadline, so one hang cannot eat the rest: a stage cut short says so and the script goes on.
# Figures go to $OUT/figures.txt ("key: value" lines), logs to $OUT/*.log ($OUT: a fresh temp
# dir unless set).
#
# Tiny mode, to prove on a CPU that it parses and runs end to end (2-5 minutes on 2 cores):
#   GPU_CHECK_TINY=1 bash scripts/gpu_check.sh     (or: bash scripts/gpu_check.sh --tiny)
# the tiny model cut to 1 block for a few steps, Triton in its interpreter, packs of 1 and 2, eager
# only, and --decide --dry-run (the design and its estimate: a look takes 15 minutes on 2 cores).
#
# On the device machine (no network): scripts/gpu_wheels.sh here first, then run this with carry
# .whl; wheels in .whl/ are installed into /tmp/site. PYTHON=... picks the interpreter.
set -u -o pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = "--tiny" ] && GPU_CHECK_TINY=1
TINY=${GPU_CHECK_TINY:-0}
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! (cd /tmp && "$PY" -c "import ablate.variants") 2>/dev/null; then
  "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . || { echo "gpu_check: could not install ablate from $(pwd)"; exit 2; }
fi
missing=$("$PY" -c "
import importlib.util as u
print(' '.join(m for m in ('torch', 'triton', 'numpy', 'scipy', 'pandas', 'seaborn', 'jsonlines', 'tqdm', 'tokenizers')
               if u.find_spec(m) is None))")
if [ -n "$missing" ]; then
  echo "gpu_check: $PY lacks: $missing (fetch wheels into .whl/ with scripts/gpu_wheels.sh and carry .whl)"
  exit 2
fi
OUT=${OUT:-$(mktemp -d /tmp/ablate-gpu-check.XXXXXX)}
mkdir -p "$OUT"
FIG="$OUT/figures.txt"
: >"$FIG"

if [ "$TINY" = 1 ]; then
  BUDGET=${BUDGET:-330}; MODEL=${MODEL:-tiny}; STEPS=${STEPS:-3}
  PACK_WIDTHS=${PACK_WIDTHS:-64}; PACK_KS=${PACK_KS:-1,2}; PACK_LAYERS=${PACK_LAYERS:-1}; PACK_STEPS=${PACK_STEPS:-3}
  PACK_ARGS=(--device cpu)  # eager only: capture needs CUDA
  COMPILE_ENV=(TORCHDYNAMO_DISABLE=1)  # the flag's plumbing only: inductor takes minutes on 2 loaded cores
  TRAIN_ARGS=(--layers 1 --batch-size 2)  # the plumbing, not the model: interpreted Triton is slow
  DECIDE_ARGS=(--dry-run)  # the design and its estimate; a look takes 15 minutes on 2 cores
  export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=""
  # caps for 2 loaded cores: each Python process alone takes 5-20 s to start there
  C_BUILD=30; C_REF=50; C_REF2=40; C_COMPILE=50; C_CUDA=15; C_TRITON=60; C_PARITY=45; C_PACKS=60; C_DECIDE=40
  PARITY_BACKENDS=triton
else
  BUDGET=${BUDGET:-510}; MODEL=${MODEL:-andrea-120m}; STEPS=${STEPS:-30}  # + install: under 9 minutes
  PACK_WIDTHS=${PACK_WIDTHS:-64,256}; PACK_KS=${PACK_KS:-1,8,32}; PACK_LAYERS=${PACK_LAYERS:-12}; PACK_STEPS=${PACK_STEPS:-30}
  PACK_ARGS=(--captured)
  COMPILE_ENV=()
  TRAIN_ARGS=()
  DECIDE_ARGS=()  # no --budget: a look whose estimate overruns it would not start; the cap stops it instead
  C_BUILD=200; C_REF=70; C_REF2=35; C_COMPILE=100; C_CUDA=40; C_TRITON=60; C_PARITY=60; C_PACKS=120; C_DECIDE=200
  PARITY_BACKENDS=triton,cuda
fi
START=$(date +%s)
DEADLINE=$((START + BUDGET))
STATUS=0
TRAIN_ENV=()

left() { echo $((DEADLINE - $(date +%s))); }
cap() { local c=$1 l; l=$(left); if [ "$l" -lt "$c" ]; then c=$l; fi; if [ "$c" -lt 1 ]; then c=1; fi; echo "$c"; }
stage() { echo; echo "=== [$(($(date +%s) - START))s] $* ==="; }
fail() { echo "!!! $*"; STATUS=1; }
fig() { echo "$1: $2" | tee -a "$FIG"; }
# run CAP CMD...: CMD under timeout (SIGTERM, then SIGKILL 5 s later); says when it was cut short
run() {
  local c; c=$(cap "$1"); shift
  timeout --kill-after=5 "$c" "$@"; local rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then echo "(stopped at its ${c}s cap)"; fi
  return $rc
}

stage "environment (output in $OUT; tiny=$TINY, budget ${BUDGET}s)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
"$PY" -c "
import torch, triton
gpu = (torch.cuda.get_device_name(0) + ' sm_%d%d' % torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else 'NO CUDA DEVICE'
print('torch', torch.__version__, '| cuda', torch.version.cuda, '| triton', triton.__version__, '|', gpu)" | tee "$OUT/env.txt"
fig device "$(tail -c 200 "$OUT/env.txt" | sed 's/.*| //')"

stage "cuda extension: building in the background (cap ${C_BUILD}s)"
( timeout --kill-after=5 "$(cap $C_BUILD)" "$PY" - >"$OUT/build.log" 2>&1 <<'EOF'
import time
t = time.time()
from ablate.core.errors import ConfigError
from ablate.kernels import get_backend
try:
    get_backend("cuda", "cuda")
    print(f"cuda backend ready in {time.time() - t:.0f}s")
except ConfigError as e:
    print(e)
    raise SystemExit(1)
EOF
) &
BUILD_PID=$!
BUILD_RC=
wait_build() {
  if [ -z "$BUILD_RC" ]; then wait "$BUILD_PID"; BUILD_RC=$?; echo "cuda extension: $(tail -n 1 "$OUT/build.log") (exit $BUILD_RC)"; fi
}

# train NAME CAP KERNELS [ARGS...]: STEPS steps of MODEL into $OUT/train-NAME; its wall time
train() {
  local name=$1 c=$2 k=$3; shift 3
  local t0; t0=$(date +%s)
  run "$c" env ${TRAIN_ENV[@]+"${TRAIN_ENV[@]}"} "$PY" -m ablate train --model "$MODEL" --steps "$STEPS" --kernels "$k" --seed 0 --eval-every 1000 \
      --final-eval-batches 1 --out "$OUT/train-$name" --quiet ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"} "$@" \
      >"$OUT/train-$name.log" 2>&1
  local rc=$?
  tail -n 2 "$OUT/train-$name.log"
  echo "  ($name: $(($(date +%s) - t0))s wall, exit $rc)"
  return $rc
}

stage "$STEPS steps of $MODEL: reference twice, reference + compile, triton"
train reference "$C_REF" reference || fail "train reference failed or timed out"
train reference2 "$C_REF2" reference || fail "train reference (second run) failed or timed out"
TRAIN_ENV=(${COMPILE_ENV[@]+"${COMPILE_ENV[@]}"})
train compile "$C_COMPILE" reference --compile true || fail "train reference + compile failed or timed out"
TRAIN_ENV=()
train triton "$C_TRITON" triton || fail "train --kernels triton failed or timed out"

stage "parity (cap ${C_PARITY}s): ablate kernels check --quick --backends $PARITY_BACKENDS"
wait_build
run "$C_PARITY" "$PY" -m ablate kernels check --quick --verbose --backends "$PARITY_BACKENDS" >"$OUT/parity.log" 2>&1
prc=$?
grep -v '^  ok ' "$OUT/parity.log" | tail -n 25
fig parity "$(grep -E 'cases passed' "$OUT/parity.log" | tail -n 1 || true) (exit $prc)"
[ $prc = 0 ] || fail "parity: failures, or it did not finish (see $OUT/parity.log)"

stage "$STEPS steps of $MODEL with the cuda kernels"
if [ "$BUILD_RC" = 0 ]; then
  train cuda "$C_CUDA" cuda || fail "train --kernels cuda failed or timed out"
else
  echo "cuda backend unavailable: $(tail -n 1 "$OUT/build.log")"
  [ "$TINY" = 1 ] || fail "cuda extension did not build"
fi

stage "tokens/s, MFU and the loss curves against reference's own spread"
"$PY" - "$OUT" "$MODEL" "$FIG" <<'EOF' || fail "loss curves differ beyond tolerance"
import glob, json, statistics, sys
import torch
from ablate.bench.flops import flops_per_token
from ablate.engine.sizes import get_size
out, model, fig = sys.argv[1:4]
PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 FLOP/s
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
peak = next((v for k, v in PEAK.items() if k in name), None)
fpt = flops_per_token(get_size(model))
curves, speed = {}, {}
for k in ("reference", "reference2", "compile", "cuda", "triton"):
    files = glob.glob(f"{out}/train-{k}/*/metrics.jsonl")
    if not files:
        continue
    rows = [json.loads(line) for line in open(files[0]) if line.strip()]
    curves[k] = {r["step"]: r["loss"] for r in rows if r.get("loss") is not None}
    last = max((r["step"] for r in rows), default=0)
    tps = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s") and r["step"] >= last // 5]  # past warm-up
    speed[k] = statistics.median(tps) if tps else float("nan")
ref = curves.get("reference")
if not ref:
    print("no reference curve")
    raise SystemExit(1)

def rel(a, b, steps):
    return [abs(a[s] - b[s]) / abs(b[s]) for s in steps if s in a and s in b]

steps = sorted(ref)
with open(fig, "a") as f:
    for k, v in speed.items():
        mfu = f"{v * fpt / peak:.1%}" if peak else "n/a (unknown peak)"
        line = f"tokens/s {k}: {v:,.0f} ({v / speed['reference']:.2f}x reference), MFU {mfu} at {fpt / 1e6:.1f} MFLOP/token"
        print(line)
        f.write(line + "\n")
    spread = rel(curves.get("reference2", {}), ref, steps)
    first_floor = spread[0] if spread else 0.0
    worst_floor = max(spread, default=0.0)
    line = f"reference run-to-run loss spread: step 0 {first_floor:.2e}, max {worst_floor:.2e}"
    print(line)
    f.write(line + "\n")
    ok = True
    tol_first, tol_worst = max(2e-3, first_floor), max(2e-2, worst_floor)  # the spread is the floor
    for k in ("compile", "cuda", "triton"):
        if k not in curves:
            continue
        d = rel(curves[k], ref, steps)
        if len(d) < len(steps):
            print(f"{k}: {len(d)}/{len(steps)} steps logged")
        verdict = bool(d) and d[0] <= tol_first and max(d) <= tol_worst and len(d) == len(steps)
        ok &= verdict
        line = (f"loss vs reference {k}: step 0 {d[0] if d else float('nan'):.2e} (tol {tol_first:.1e}), "
                f"max {max(d, default=float('nan')):.2e} (tol {tol_worst:.1e}): {'PASS' if verdict else 'FAIL'}")
        print(line)
        f.write(line + "\n")
raise SystemExit(0 if ok else 1)
EOF

stage "packs: tokens/s a member at widths $PACK_WIDTHS, members $PACK_KS, eager and captured (cap ${C_PACKS}s)"
# python -m ablate.bench.packs (the packs' own bench): tokens/s a member and in all against one cell
# alone, and with --captured the largest loss difference of the captured pack from the eager one
if (cd /tmp && "$PY" -c "import ablate.bench.packs") 2>/dev/null; then
  run "$C_PACKS" "$PY" -m ablate.bench.packs --widths "$PACK_WIDTHS" --members "$PACK_KS" --steps "$PACK_STEPS" \
      --layers "$PACK_LAYERS" ${PACK_ARGS[@]+"${PACK_ARGS[@]}"} 2>&1 | tee "$OUT/packs.log"
  [ "${PIPESTATUS[0]}" = 0 ] || fail "packs stage failed or timed out (see $OUT/packs.log)"
  grep -E '^width' "$OUT/packs.log" | sed 's/^/packs: /' >>"$FIG"
else
  echo "packs not available (no ablate/bench/packs.py in this tree)"
  fig packs "not available"
fi

stage "ablate reproduce prenorm-wins --decide with packs (cap ${C_DECIDE}s)"
dcap=$(cap "$C_DECIDE")
t0=$(date +%s)
run "$dcap" "$PY" -m ablate reproduce prenorm-wins --decide --stack auto --quiet --out "$OUT/decide" \
    ${DECIDE_ARGS[@]+"${DECIDE_ARGS[@]}"} >"$OUT/decide.log" 2>&1
drc=$?
tail -n 12 "$OUT/decide.log"
case $drc in
  0) dv="exit 0: $(grep -E '^prenorm-wins: ' "$OUT/decide.log" | tail -n 1 | grep . || tail -n 1 "$OUT/decide.log")";;
  3) dv="stopped before deciding";;
  124|137) dv="cut at its ${dcap}s cap";;
  *) dv="failed (exit $drc)";;
esac
fig "prenorm-wins --decide" "$(($(date +%s) - t0))s wall, $dv; CPU: about 16 min on 2 cores (README)"
[ $drc = 0 ] || fail "decide did not decide"

stage "kernel bench with the $(left)s left"
if [ "$(left)" -gt 25 ]; then
  # the ops andrea-120m's dense GPT-2 block runs through the kernels (a compile per case: the others would not fit)
  if [ "$TINY" = 1 ]; then bargs=(--rows 16 --ops layer_norm --repeats 2 --no-compile)
  else bargs=(--ops act:gelu,bias_act:gelu,layer_norm,add_layer_norm --repeats 5); fi
  run 300 "$PY" -m ablate kernels bench "${bargs[@]}" 2>&1 | tee "$OUT/bench.log" \
    || echo "(bench stopped at the deadline; the rows above are complete)"
else
  echo "no time left for the bench"
fi

stage "done in $(($(date +%s) - START))s: $( [ $STATUS = 0 ] && echo 'all checks passed' || echo 'SOME CHECKS FAILED' ) ($OUT)"
echo "figures ($FIG):"
cat "$FIG"
exit $STATUS

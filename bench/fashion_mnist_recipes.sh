#!/bin/bash
# Issue 55's figures (bench/README.md, the fast recipes), one run at a time, logs in $LOG.
# Run it on a quiet host, or as measured there: setsid bash -c 'echo -20 > /proc/self/autogroup;
# nice -n -20 bash bench/fashion_mnist_recipes.sh fast' (its own autogroup at raised priority).
#
#   bash bench/fashion_mnist_recipes.sh                      # every stage, most important first
#   bash bench/fashion_mnist_recipes.sh fast ablation        # only these stages, in this order
#   SMOKE=1 bash bench/fashion_mnist_recipes.sh fast         # a check of the script: 2 updates a run
#   bash bench/fashion_mnist_recipes.sh summary              # the table of what has run so far
#
# Stages (the default order): fast (flags/fashion_mnist_fast.flags, seeds 0 1 2: the recipe's
# median of 3), ablation (airbench's methods added in turn, each run evaluated every epoch,
# plus the left-out padded crops and six-view TTA), dtype (the fast recipe, seed 0, float32
# then --dtype=auto back to back), 94 (flags/fashion_mnist_94.flags seed 0), peers
# (bench/time_to_accuracy.py: tfgpu, keras, torch, airbench with the fast recipe, airbench
# preset 93), 94more (the 94 recipe, seeds 1 2), peers94 (the same bench with the 94 recipe
# and airbench preset 94), best (flags/fashion_mnist_best.flags, seed 0: about 55 minutes;
# not in the default order), summary (always printed at the end).
#
# Every training run is a whole command (TensorFlow's start, evaluation and export included)
# timed by /usr/bin/time -v, in a fresh --model_dir (an existing one would resume); each log
# starts with the load average and the calibration line, its output lines are prefixed with
# the seconds since the command started (the time to 93% of the ablation is read from them).
# The calibration line is also taken before the first and after the last stage (calibration.log).
#
# Environment: REPO (the tree to run; default this script's checkout), PY (default
# REPO/.venv/bin/python), DATA (default
# /tmp/fastwork/fm-tfr if it holds the converted data, else /tmp/m55/fm-tfr, converted from
# /usr/share/datasets/fashion-mnist by tools/to_tfrecord.py as the flagfile says; the
# conversion is timed apart and not counted), TORCH_PY (default /tmp/torchenv/bin/python; here /work/torchenv,
# created if missing: python3 -m venv /tmp/torchenv && pip install torch==2.13.0 numpy),
# RUNS (default /tmp/m55/runs), LOG (default /tmp/m55/logs).
set -u
REPO=${REPO:-$(cd "$(dirname "$0")/.." && pwd)}
PY=${PY:-$REPO/.venv/bin/python}
LOG=${LOG:-/tmp/m55/logs}
RUNS=${RUNS:-/tmp/m55/runs}
TORCH_PY=${TORCH_PY:-/tmp/torchenv/bin/python}
SMOKE=${SMOKE:-}
FAST=flags/fashion_mnist_fast.flags
N94=flags/fashion_mnist_94.flags
BEST=flags/fashion_mnist_best.flags
mkdir -p "$LOG" "$RUNS"
cd "$REPO" || exit 1
export PYTHONPATH=$REPO

for f in $FAST $N94 bench/time_to_accuracy_airbench.py bench/calibration.py; do
  [ -e "$f" ] || { echo "$REPO has no $f: REPO must be a tfgpu checkout with issue 55 in it"; exit 2; }
done

# A tiny run for checking this script: 2 updates, no evaluation but the final one.
SMOKE_FLAGS=()
[ -n "$SMOKE" ] && SMOKE_FLAGS=(--train_steps=2 --epochs=0 --eval_every_epochs=0)

say() { echo "$(date -u +%T) $*" | tee -a "$LOG/measure.log"; }
calib() { echo "load $(cut -d' ' -f1-3 /proc/loadavg) | $("$PY" bench/calibration.py 2>/dev/null)"; }

data_dir() {
  if [ -z "${DATA:-}" ]; then
    if [ -f /tmp/fastwork/fm-tfr/dataset_info.json ]; then DATA=/tmp/fastwork/fm-tfr; else DATA=/tmp/m55/fm-tfr; fi
  fi
  if [ ! -f "$DATA/dataset_info.json" ]; then
    say "converting /usr/share/datasets/fashion-mnist into $DATA (not counted)"
    /usr/bin/time -v -o "$LOG/convert.time" "$PY" tools/to_tfrecord.py \
      --input=/usr/share/datasets/fashion-mnist --output_dir="$DATA" \
      '--class_names=T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot' \
      > "$LOG/convert.log" 2>&1 || { say "conversion failed: $LOG/convert.log"; exit 3; }
  fi
}

# run NAME FLAGS...: one tfgpu.main command, timed, in a fresh model_dir.
run() {
  local name=$1; shift
  local dir=$RUNS/$name log=$LOG/$name.log
  rm -rf "$dir"
  say "run $name: $*"
  { echo "# $(date -u) $(calib)"; echo "# commit $(git -C "$REPO" rev-parse --short HEAD)";
    echo "# $PY -m tfgpu.main --data_dir=$DATA --model_dir=$dir $* ${SMOKE_FLAGS[*]}"; } > "$log"
  /usr/bin/time -v -o "$LOG/$name.time" "$PY" -u -m tfgpu.main --data_dir="$DATA" \
    --model_dir="$dir" "$@" "${SMOKE_FLAGS[@]}" 2>&1 \
    | perl -MTime::HiRes=time -ne 'BEGIN{$t=time} printf "%8.2f %s", time-$t, $_; STDOUT->flush()' >> "$log"
  echo "# end $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$log"
  grep -h "Elapsed (wall" "$LOG/$name.time" | sed "s/^/# /" >> "$log"
}

stage_fast() { for s in 0 1 2; do run fast_s$s --flagfile=$FAST --seed=$s; done; }

stage_ablation() {
  local off=(--nodirac_init --batchnorm_lr_multiplier=1 --lookahead_steps=0 --noalternating_flips --eval_tta=none)
  local e=(--flagfile=$FAST --seed=0 --eval_every_epochs=1)
  run abl0_all_off "${e[@]}" --whitening=trained "${off[@]}"
  run abl1_whitening "${e[@]}" "${off[@]}"
  run abl2_dirac "${e[@]}" --batchnorm_lr_multiplier=1 --lookahead_steps=0 --noalternating_flips --eval_tta=none
  run abl3_bn_lr64 "${e[@]}" --lookahead_steps=0 --noalternating_flips --eval_tta=none
  run abl4_lookahead "${e[@]}" --noalternating_flips --eval_tta=none
  run abl5_alt_flips "${e[@]}" --eval_tta=none
  run abl6_flip_tta "${e[@]}"
  run abl7_padded_crops "${e[@]}" --crop_padding=2
  run abl8_six_view_tta "${e[@]}" --eval_tta=flip_translate
}

stage_dtype() {
  run dtype_float32 --flagfile=$FAST --seed=0 --dtype=float32
  run dtype_auto --flagfile=$FAST --seed=0 --dtype=auto
}

stage_94() { run n94_s0 --flagfile=$N94 --seed=0; }
stage_best() { run best_s0 --flagfile=$BEST --seed=0; }
stage_94more() { for s in 1 2; do run n94_s$s --flagfile=$N94 --seed=$s; done; }

torch_env() {
  [ -x "$TORCH_PY" ] && return
  say "creating /tmp/torchenv (torch 2.13.0, numpy)"
  python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install -q torch==2.13.0 numpy \
    > "$LOG/torchenv.log" 2>&1 || say "torchenv failed: $LOG/torchenv.log (torch, airbench get skipped)"
}

# peers NAME FLAGFILE PRESET: bench/time_to_accuracy.py, the four contenders one after another.
peers() {
  local name=$1 flagfile=$2 preset=$3 extra=()
  torch_env
  [ -n "$SMOKE" ] && extra=(--epochs=1 --train_limit=1000)
  rm -rf "$RUNS/$name"
  say "peers $name: $flagfile, airbench preset $preset"
  { echo "# $(date -u) $(calib)"; echo "# commit $(git -C "$REPO" rev-parse --short HEAD)"; } > "$LOG/$name.log"
  /usr/bin/time -v -o "$LOG/$name.time" "$PY" bench/time_to_accuracy.py --data_dir="$DATA" \
    --flagfile="$flagfile" --contenders=tfgpu,keras,torch,airbench --torch_python="$TORCH_PY" \
    --airbench_preset="$preset" --work_dir="$RUNS/$name" --output="$LOG/$name.json" \
    "${extra[@]}" >> "$LOG/$name.log" 2>&1
  echo "# end $(date -u) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$LOG/$name.log"
}
stage_peers() { peers peers_fast $FAST 93; }
stage_peers94() { peers peers_94 $N94 94; }

summary() {
  "$PY" - "$LOG" "$RUNS" <<'EOF'
import glob, json, os, re, sys
log, runs = sys.argv[1], sys.argv[2]
def wall(name):
    try:
        text = open(f"{log}/{name}.time").read()
    except OSError:
        return None
    m = re.search(r"Elapsed \(wall clock\) time .*: (?:(\d+):)?(\d+):([\d.]+)", text)
    return m and int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
print(f"{'run':22} {'top-1':>7} {'wall s':>8} {'img/s':>7} {'93% at':>16} {'load':>6}  calibration")
for path in sorted(glob.glob(f"{log}/*.log")):
    name = os.path.basename(path)[:-4]
    if name in ("measure", "convert", "torchenv", "calibration") or name.startswith("peers"):
        continue
    lines = open(path).read().splitlines()
    calib = (lines[0].split("| ", 1)[1] if lines and "| " in lines[0] else "").replace("numpy sgemm 2048^2: ", "")
    load = re.search(r"load ([\d.]+)", lines[0]) if lines else None
    top1 = ips = None
    try:
        s = json.load(open(f"{runs}/{name}/summary.json"))
        top1, ips = s["final_eval"]["top1"], s.get("train_images_per_sec")
    except (OSError, KeyError, ValueError):
        pass
    at93 = ""
    for line in lines:
        m = re.match(r"\s*([\d.]+) eval\s+step (\d+): top1 ([\d.]+)", line)
        if m and float(m.group(3)) >= 0.93:
            at93 = f"{float(m.group(1)):.0f}s step {m.group(2)}"
            break
    w = wall(name)
    f = lambda v, fmt: format(v, fmt) if v is not None else "-"
    print(f"{name:22} {f(top1, '.4f'):>7} {f(w, '.1f'):>8} {f(ips, '.0f'):>7} {at93:>16} "
          f"{load.group(1) if load else '-':>6}  {calib}")
for path in sorted(glob.glob(f"{log}/peers*.json")):
    r = json.load(open(path))
    print(f"\n{os.path.basename(path)}: {r.get('calibration', '')}")
    for name, c in r.get("contenders", {}).items():
        if "skipped" in c:
            print(f"  {name:9} skipped: {c['skipped']}")
            continue
        ips = c.get("train_images_per_sec")
        print(f"  {name:9} top-1 {c.get('final_top1')}  wall {c.get('wall_s', 0):.1f} s  "
              f"img/s {ips and round(ips)}  time to {c.get('time_to')}")
    for name, v in r.get("ratios", {}).items():
        print(f"  tfgpu / {name}: {v}  (goal <= {r.get('goal')} at 0.93 and 0.94)")
EOF
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(fast ablation dtype 94 peers 94more peers94)
if [ "${stages[*]}" != "summary" ]; then
  data_dir
  say "start: stages ${stages[*]} in $REPO, data $DATA${SMOKE:+ (SMOKE: not figures)}"
  echo "before $(date -u) $(calib)" | tee -a "$LOG/calibration.log"
  load=$(cut -d' ' -f1 /proc/loadavg)
  awk -v l="$load" 'BEGIN{exit !(l > 1.0)}' && say "WARNING: load average $load: not a quiet host"
  for s in "${stages[@]}"; do
    case $s in
      fast|ablation|dtype|94|94more|peers|peers94|best) "stage_$s" ;;
      summary) ;;
      *) say "unknown stage $s (fast ablation dtype 94 peers 94more peers94 best summary)"; exit 2 ;;
    esac
  done
  echo "after  $(date -u) $(calib)" | tee -a "$LOG/calibration.log"
fi
summary | tee "$LOG/summary.txt"

#!/usr/bin/env bash
# One GPU session of measurements, at most eight minutes on a fresh machine.
#
#   benchmarks/gpu_session.sh              run every step, results under $OUT
#   benchmarks/gpu_session.sh --dry-run    on any machine: check each step's command and inputs, and the time plan
#   benchmarks/gpu_session.sh --wheels     put the wheels a bare GPU machine lacks into .whl/ (needs pip's index)
#
# Steps, each under its own time limit (`timeout`; a step cut short keeps what it wrote, and the
# profiler resumes from its CSVs if the session is run again):
#   describe   the machine: GPU, driver, CUDA, torch, triton, Python, CPU (machine.json)
#   install    simspec onto a machine that lacks it: the wheels in .whl/ and this checkout on PYTHONPATH
#   gpu_tests  pytest -m gpu (the Triton kernels against their references on CUDA, the 7B-shape live step)
#   kernels    python benchmarks/kernels_bench.py (selection, tree-verify vs masked SDPA, drafter step, int8)
#   profile_*  simspec profile-gpu --quick for LLaVA-1.5-7B and Qwen2.5-VL-7B (operators, drafter step)
#   live       simspec live --timing-only LLaVA-1.5-7B: the engine's own steps, the per-round costs included
#
# What comes back under $OUT (at most eight files, none deeper than one folder): machine.json,
# steps.tsv (step, limit, seconds, exit status), session.log (every step's output), kernels.txt,
# profiles.tar.gz (profiles/<device>/<model>/), live.tar.gz (the live run folder), pytest.txt.
# Without $OUT the results go to ./gpu-session.

set -u
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
LIMIT_S=${SESSION_LIMIT_S:-480}   # the whole session's time limit

# step name, time limit in seconds; in running order
STEPS=(describe:10 install:30 gpu_tests:110 kernels:50 profile_llava:110 profile_qwen:110 live:60)
GPU_TEST_PATHS=(tests/kernel_tests tests/test_timing.py)
WHEELS=(simpy==4.1.2 tomli-w==1.2.0)  # simspec's needs the GPU machine's image lacks (torch, numpy, scipy, pandas, numba, tqdm are there)
LIVE_ARGS=(--timing-only LLaVA-1.5-7B --policy ar --policy linear:k=3 --policy marginal
           --num-requests 12 --rate 4 --output-mean 48 --seed 0 --quiet)
SECONDS_PER_POINT=0.4   # profile-gpu's estimate per quick-grid point: 50 ms timed, warm-up, tensor set-up, Triton compiles

die() { echo "gpu_session: $*" >&2; exit 2; }

simspec() { "$PY" -m simspec.cli "$@"; }

step_describe() {
    "$PY" - "$OUT/machine.json" <<'EOF'
import json, os, platform, subprocess, sys
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
info = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
        "nvidia_smi": run("nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem",
                          "--format=csv,noheader")}
try:
    import torch
    info.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_bytes=p.total_memory, multiprocessors=p.multi_processor_count,
                    capability=f"{p.major}.{p.minor}")
except ImportError:
    info["torch"] = None
try:
    import triton
    info["triton"] = triton.__version__
except ImportError:
    info["triton"] = None
with open(sys.argv[1], "w") as f:
    json.dump(info, f, indent=2)
print(json.dumps(info, indent=2))
EOF
}

deps_importable() { "$PY" -c "import simpy, tomli_w, numpy, scipy, pandas, numba, tqdm, torch" 2>/dev/null; }

step_install() {
    if "$PY" -c "import simspec.cli, simspec_kernels" 2>/dev/null && deps_importable; then
        echo "simspec and its needs are importable already"; return 0
    fi
    local site=/tmp/simspec-site
    mkdir -p "$site"
    if ls "$REPO"/.whl/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "$REPO"/.whl/*.whl || return 1
    fi
    ln -sfn "$REPO/kernels" "$site/simspec_kernels"     # the packages' installed names (pyproject's package-dir)
    ln -sfn "$REPO/dashboard" "$site/simspec_dashboard"
    export PYTHONPATH="$site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
    echo "PYTHONPATH=$PYTHONPATH"
    "$PY" -c "import simspec.cli, simspec_kernels" && deps_importable
}

step_gpu_tests() {
    "$PY" -m pytest -m gpu -q -p no:cacheprovider "${GPU_TEST_PATHS[@]}" 2>&1 | tee "$OUT/pytest.txt"
    return "${PIPESTATUS[0]}"
}

step_kernels() {
    "$PY" benchmarks/kernels_bench.py 2>&1 | tee "$OUT/kernels.txt"
    return "${PIPESTATUS[0]}"
}

step_profile_llava() { simspec profile-gpu --device cuda --model LLaVA-1.5-7B --quick --quiet --out "$WORK/profiles"; }
step_profile_qwen() { simspec profile-gpu --device cuda --model Qwen2.5-VL-7B --quick --quiet --out "$WORK/profiles"; }

step_live() {
    local gpu
    gpu=$("$PY" -c "
import torch
from simspec.profiling.store import device_slug
from simspec import costs
slug = device_slug(torch.cuda.get_device_name(0), 'cuda')
print(slug if slug in costs.GPUS else 'h100-sxm')")
    simspec live "${LIVE_ARGS[@]}" --device cuda --gpu "$gpu" --out "$WORK/live"
}

# --- the dry run: everything checked that can be without a GPU ---------------------------------

profile_estimate_s() {  # the quick CUDA grid's points of model $1, at SECONDS_PER_POINT each
    "$PY" -c "
from simspec.profiling import grid; from simspec import costs
m = costs.model_spec('$1'); print(round(sum(len(grid.points(o, grid.QUICK_CUDA, m)) for o in grid.ops_for(m)) * $SECONDS_PER_POINT))"
}

estimate_s() {  # a step's expected seconds on an H100/H200 (the limit is what bounds it)
    case $1 in
        profile_llava) profile_estimate_s LLaVA-1.5-7B ;;
        profile_qwen) profile_estimate_s Qwen2.5-VL-7B ;;
        describe) echo 3 ;;
        install) echo 10 ;;
        gpu_tests) echo 70 ;;      # 67 tests: Triton compiles each kernel per dtype and shape
        kernels) echo 30 ;;
        live) echo 45 ;;           # a 7B random-weight model built on the GPU, 3 policies x 12 requests
    esac
}

dry_run() {
    local bad=0 total=0 name limit est
    check() { if "$@" >/dev/null 2>&1; then echo "  ok    $DESC"; else echo "  FAIL  $DESC"; bad=1; fi; }
    echo "commands and inputs:"
    DESC="python ($PY) runs"; check "$PY" -c pass
    for cmd in timeout tar tee; do DESC="$cmd on PATH"; check command -v "$cmd"; done
    if command -v nvidia-smi >/dev/null; then echo "  ok    nvidia-smi on PATH"; else echo "  note  no nvidia-smi here: describe records none"; fi
    if ls "$REPO"/.whl/*.whl >/dev/null 2>&1; then
        for w in "${WHEELS[@]}"; do
            local stem=${w%%==*}; stem=${stem//-/_}
            DESC="wheel ${w} in .whl/"; check ls "$REPO"/.whl/"${stem}"-"${w##*==}"-*.whl
        done
    else
        DESC="simspec's needs importable by $PY (a bare GPU machine needs .whl/: run --wheels)"; check deps_importable
    fi
    DESC="install: simspec and its needs import (from .whl/ and this checkout where $PY lacks them)"
    if step_install >/dev/null 2>&1; then echo "  ok    $DESC"; else echo "  FAIL  $DESC"; bad=1; fi
    for p in "${GPU_TEST_PATHS[@]}" benchmarks/kernels_bench.py; do DESC="$p exists"; check test -e "$p"; done
    DESC="pytest collects the gpu tests in ${GPU_TEST_PATHS[*]}, and no gpu test lies elsewhere"
    check "$PY" - "${GPU_TEST_PATHS[@]}" <<'EOF'
import subprocess, sys
def collect(*paths):
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *paths], capture_output=True, text=True)
    return done.returncode, {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
rc, files = collect(*sys.argv[1:])
if rc != 0 or not files:
    sys.exit(1)
rc, everywhere = collect("tests")  # every test module: some import packages a GPU machine need not have
sys.exit(1 if rc == 0 and not everywhere <= files else 0)
EOF
    DESC="profile-gpu knows LLaVA-1.5-7B and Qwen2.5-VL-7B"
    check "$PY" -c "from simspec import costs; costs.model_spec('LLaVA-1.5-7B'); costs.model_spec('Qwen2.5-VL-7B')"
    DESC="profile-gpu's flags parse"
    check "$PY" -c "from simspec.cli import parser; parser().parse_args(['profile-gpu', '--device', 'cuda', '--model', 'LLaVA-1.5-7B', '--quick', '--quiet', '--out', '/tmp/x'])"
    DESC="live's flags run (simspec-tiny-vlm on the CPU, 2 requests)"
    check run_tiny_live "${LIVE_ARGS[@]/#LLaVA-1.5-7B/simspec-tiny-vlm}"
    echo "time plan (seconds; estimate for an H100/H200, limit enforced by timeout):"
    printf '  %-14s %9s %6s\n' step estimate limit
    for s in "${STEPS[@]}"; do
        name=${s%%:*}; limit=${s##*:}; est=$(estimate_s "$name")
        printf '  %-14s %9s %6s\n' "$name" "$est" "$limit"
        if ((est > limit)); then echo "  FAIL  $name's estimate exceeds its limit"; bad=1; fi
        total=$((total + limit))
    done
    printf '  %-14s %9s %6s\n' total "" "$total"
    if ((total > LIMIT_S)); then echo "  FAIL  the steps' limits add up to ${total} s, over the session's ${LIMIT_S} s"; bad=1
    else echo "  ok    the steps' limits add up to ${total} s, within the session's ${LIMIT_S} s"; fi
    return $bad
}

run_tiny_live() {  # the live step's flags on the tiny spec: every flag but the shape and the count kept
    local out; out=$(mktemp -d)
    local args=() skip=0
    for a in "$@"; do
        if ((skip)); then skip=0; continue; fi
        [[ $a == --num-requests ]] && { args+=(--num-requests 2); skip=1; continue; }
        args+=("$a")
    done
    simspec live "${args[@]}" --device cpu --gpu h100-sxm --out "$out/live"
    local rc=$?
    rm -rf "$out"
    return $rc
}

fetch_wheels() {
    mkdir -p .whl
    grep -qx '/.whl/' .gitignore 2>/dev/null || die ".whl/ is not in .gitignore"
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "${WHEELS[@]}"
}

case ${1:-} in
    --dry-run) dry_run; exit $? ;;
    --wheels) fetch_wheels; exit $? ;;
    --step) [[ -n ${OUT:-} && -n ${WORK:-} ]] || die "--step is the session's own call"; "step_$2"; exit $? ;;
    "") ;;
    *) die "unknown argument $1 (allowed: --dry-run, --wheels, or none)" ;;
esac

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
    || die "no CUDA GPU for $PY's torch: the session measures a GPU (--dry-run checks it on any machine)"
OUT=${OUT:-$REPO/gpu-session}
mkdir -p "$OUT" || die "cannot write $OUT"
WORK=$(mktemp -d)
export OUT WORK PYTHONUNBUFFERED=1
printf 'step\tlimit_s\tseconds\texit\n' >"$OUT/steps.tsv"
began=$SECONDS
for s in "${STEPS[@]}"; do
    name=${s%%:*}; limit=${s##*:}
    left=$((LIMIT_S - (SECONDS - began)))
    ((limit > left)) && limit=$left
    if ((limit <= 0)); then printf '%s\t0\t0\tskipped\n' "$name" >>"$OUT/steps.tsv"; continue; fi
    echo "=== $name (limit ${limit} s) ===" | tee -a "$OUT/session.log"
    t0=$SECONDS
    if [[ $name == install ]]; then  # sets PYTHONPATH for the steps after it: in this shell
        step_install >>"$OUT/session.log" 2>&1; rc=$?
    else
        timeout --signal=INT --kill-after=10 "$limit" bash "$0" --step "$name" >>"$OUT/session.log" 2>&1; rc=$?
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$limit" "$((SECONDS - t0))" "$rc" | tee -a "$OUT/steps.tsv"
done
[[ -d $WORK/profiles ]] && tar -czf "$OUT/profiles.tar.gz" -C "$WORK" profiles
[[ -d $WORK/live ]] && tar -czf "$OUT/live.tar.gz" -C "$WORK" live
rm -rf "$WORK"
echo "session: $((SECONDS - began)) s; results in $OUT"

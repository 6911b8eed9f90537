#!/usr/bin/env bash
# hvdtrain on an NVIDIA GPU: builds Horovod with CUDA and NCCL and runs hvdtrain's torch
# checks on CUDA tensors, one summary line per check (docs/setup.md, "GPUs and NCCL").
#
#   scripts/gpu-check.sh --fetch       (with network) put the Horovod source in .gpu-check/
#   scripts/gpu-check.sh [--dry-run]   the check; --dry-run (and any machine without a GPU,
#                                      nvcc or a CUDA torch) prints the build flags and
#                                      skips the GPU steps, each with its reason
#
# Needs no network: the Horovod source comes from .gpu-check/ (or HVDTRAIN_HOROVOD_SDIST),
# the frameworks from the machine (PYTHON, default python3, with a CUDA build of torch).
# nvcc, the CUDA runtime and NCCL are found as scripts/build-horovod.sh finds them (the
# nvidia-* wheels of a pip torch, a toolkit, CUDA_HOME; the path tests/test_cuda_build.py
# proves on a machine without a GPU). It builds Horovod twice, in
# parallel: with NCCL, and without GPU operations (CUDA tensors staged through host
# memory for Gloo), since NCCL refuses two ranks on one GPU. Where the GPU steps skip,
# the correctness checks are rehearsed on the CPU with the installed Horovod. Work
# files and logs go to HVDTRAIN_GPU_CHECK_DIR (default /tmp/hvdtrain-gpu-check). Exit
# status: 0 when nothing failed (skips included), 1 otherwise.
set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="${HVDTRAIN_GPU_CHECK_DIR:-/tmp/hvdtrain-gpu-check}"
FETCHED="$REPO_ROOT/.gpu-check"
BUILD_LIMIT_S=360
RUN_LIMIT_S=150
CHECKS=(
    "build with NCCL"
    "build with host staging"
    "NCCL, 1 rank: equivalence (flat and per-tensor), NaN check, bfloat16 allreduce"
    "host-staged Gloo, 2 ranks: equivalence (flat and per-tensor), NaN check, bfloat16 allreduce, join"
    "NCCL, 2 ranks on one GPU"
    "DDP comparison"
)
FAILED=0

say() { printf 'gpu-check: %s\n' "$*"; }
fail() { say "FAIL $*"; FAILED=1; }

fetch() {
    mkdir -p "$FETCHED"
    local pin
    pin="$(sed -n 's/^horovod==\(.*\)$/\1/p' "$REPO_ROOT/constraints.txt")"
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "horovod==$pin" -d "$FETCHED"
    say "fetched $(ls "$FETCHED"/horovod-*.tar.gz)"
}

# Why the GPU steps cannot run here, or nothing.
missing() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 \
        || { echo "no NVIDIA GPU visible (nvidia-smi)"; return; }
    "$PYTHON" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1 \
        || { echo "$PYTHON has no CUDA build of torch that sees the GPU"; return; }
    command -v cmake >/dev/null 2>&1 || { echo "no cmake"; return; }
    # nvcc, the CUDA runtime and NCCL: where scripts/build-horovod.sh finds them, or its reason.
    local flags
    flags="$(HVDTRAIN_NCCL=1 PYTHON="$PYTHON" bash "$REPO_ROOT/scripts/build-horovod.sh" --print-flags 2>&1)" \
        || { echo "no CUDA/NCCL build: $(tail -n 1 <<<"$flags" | sed 's/^build-horovod: //')"; return; }
    [ -n "$(sdist)" ] || { echo "no Horovod source: run scripts/gpu-check.sh --fetch where there is network, or set HVDTRAIN_HOROVOD_SDIST"; return; }
}

sdist() { echo "${HVDTRAIN_HOROVOD_SDIST:-$(ls "$FETCHED"/horovod-*.tar.gz 2>/dev/null | head -n 1)}"; }

probe() {
    say "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1 || echo 'no GPU'); $(nproc) cores"
    say "python: $("$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo "$PYTHON without torch")"
    say "nvcc: $( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) | xargs -I{} sh -c '{} --version 2>/dev/null | tail -n 2 | head -n 1' || true)"
    local mode
    for mode in 1 0; do
        local flags
        if flags="$(HVDTRAIN_NCCL=$mode PYTHON="$PYTHON" bash "$REPO_ROOT/scripts/build-horovod.sh" --print-flags 2>&1)"; then
            say "build flags ($([ $mode = 1 ] && echo NCCL || echo host staging)): $(echo "$flags" | paste -sd' ' -)"
        else
            say "build flags ($([ $mode = 1 ] && echo NCCL || echo host staging)): cannot build here: $(echo "$flags" | tail -n 1)"
        fi
    done
}

build() {  # build NAME NCCL(1|0) JOBS -> $WORK/site-NAME
    local name="$1" nccl="$2" jobs="$3" started=$SECONDS
    rm -rf "$WORK/wheel-$name" "$WORK/site-$name"
    if HVDTRAIN_NCCL="$nccl" HVDTRAIN_BUILD_JOBS="$jobs" HVDTRAIN_HOROVOD_SDIST="$(sdist)" \
            PYTHON="$PYTHON" timeout "$BUILD_LIMIT_S" \
            bash "$REPO_ROOT/scripts/build-horovod.sh" "$WORK/wheel-$name" >"$WORK/build-$name.out" 2>&1 \
        && "$PYTHON" -m pip install --quiet --no-deps --no-index --no-compile \
            --target "$WORK/site-$name" "$WORK/wheel-$name"/horovod-*.whl >>"$WORK/build-$name.out" 2>&1; then
        echo "ok $((SECONDS - started))"
    else
        echo "failed $((SECONDS - started))"
    fi
}

horovodrun_in() {  # horovodrun_in NAME NP TIMEOUT ARGS...: a launch with build NAME
    local name="$1" np="$2" limit="$3" site=""
    shift 3
    [ "$name" = installed ] || site="$WORK/site-$name:"
    PYTHONPATH="$site$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 \
        timeout "$limit" "$PYTHON" -c 'import sys; from horovod.runner.launch import run_commandline; sys.argv[0] = "horovodrun"; run_commandline()' \
        --gloo -np "$np" "$PYTHON" "$@"
}

# Runs the correctness checks in one launch; passes on the worker's own verdict lines.
correctness() {  # correctness NAME NP LABEL
    local name="$1" np="$2" label="$3" log="$WORK/run-$1-$2.out"
    horovodrun_in "$name" "$np" "$RUN_LIMIT_S" "$REPO_ROOT/scripts/gpu_check_worker.py" correctness >"$log" 2>&1
    local status=$?
    local verdicts
    verdicts="$(sed -n 's/^\(\[[0-9]*\]<stdout>:\)\{0,1\}gpu-check: //p' "$log")"
    [ -n "$verdicts" ] && printf '%s\n' "$verdicts" | while IFS= read -r line; do say "$line"; done
    if printf '%s\n' "$verdicts" | grep -q '^FAIL'; then
        FAILED=1
    fi
    if [ $status -ne 0 ] || [ -z "$verdicts" ]; then
        fail "$label: the launch exited $status; last lines of $log:"
        tail -n 15 "$log" | sed 's/^/    /'
        return 1
    fi
}

nccl_two_ranks() {
    local log="$WORK/run-nccl-2.out"
    if horovodrun_in nccl 2 90 "$REPO_ROOT/scripts/gpu_check_worker.py" correctness >"$log" 2>&1; then
        say "PASS NCCL, 2 ranks on one GPU: NCCL accepted two ranks on one device"
        sed -n 's/^\[0\]<stdout>:gpu-check: /    /p' "$log"
    else
        say "SKIP NCCL, 2 ranks on one GPU: NCCL refused, as expected: $(grep -m1 -io 'duplicate gpu[^"]*\|ncclInvalidUsage[^"]*\|nccl[^"]*error[^"]*' "$log" | head -c 200)"
    fi
}

speed_result() {  # speed_result LOG -> the step time in ms, or nothing
    sed -n 's/^.*RESULT //p' "$1" | "$PYTHON" -c 'import json, sys; print(f"{json.loads(sys.stdin.read())["step_s"] * 1000:.3f}")' 2>/dev/null
}

ddp_comparison() {
    local round hvd ddp ratios=() hvds=() ddps=()
    for round in 1 2 3; do
        horovodrun_in staged 2 "$RUN_LIMIT_S" "$REPO_ROOT/scripts/gpu_check_worker.py" speed >"$WORK/speed-hvd-$round.out" 2>&1
        PYTHONPATH="$REPO_ROOT" OMP_NUM_THREADS=1 timeout "$RUN_LIMIT_S" "$PYTHON" -m torch.distributed.run \
            --nproc_per_node 2 "$REPO_ROOT/scripts/gpu_check_worker.py" speed >"$WORK/speed-ddp-$round.out" 2>&1
        hvd="$(speed_result "$WORK/speed-hvd-$round.out")"
        ddp="$(speed_result "$WORK/speed-ddp-$round.out")"
        if [ -z "$hvd" ] || [ -z "$ddp" ]; then
            fail "DDP comparison: round $round gave no step time (logs $WORK/speed-*-$round.out)"
            tail -n 8 "$WORK/speed-hvd-$round.out" "$WORK/speed-ddp-$round.out" | sed 's/^/    /'
            return 1
        fi
        hvds+=("$hvd"); ddps+=("$ddp")
        ratios+=("$("$PYTHON" -c "print(f'{$hvd / $ddp:.3f}')")")
    done
    say "INFO DDP comparison: convdense on CUDA, 2 ranks on one GPU over Gloo, median step over 3 interleaved rounds: hvdtrain (host-staged) $(median "${hvds[@]}") ms, DDP (Gloo backend) $(median "${ddps[@]}") ms, ratio $(median "${ratios[@]}") (rounds ${ratios[*]})"
}

median() { printf '%s\n' "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }

main() {
    local dry_run=""
    case "${1:-}" in
        --fetch) fetch; return ;;
        --dry-run) dry_run=1 ;;
        "") ;;
        *) echo "usage: $0 [--dry-run | --fetch]" >&2; return 2 ;;
    esac
    mkdir -p "$WORK"
    local started=$SECONDS
    probe
    local why
    why="$(missing)"
    if [ -n "$dry_run" ] || [ -n "$why" ]; then
        why="${dry_run:+dry run}${dry_run:+${why:+; }}${why}"
        local check
        for check in "${CHECKS[@]}"; do
            say "SKIP $check: $why"
        done
        if "$PYTHON" -c 'import horovod.torch' >/dev/null 2>&1; then
            say "rehearsing the correctness checks on the CPU with the installed Horovod:"
            correctness installed 2 "CPU rehearsal, 2 ranks"
        else
            say "SKIP the CPU rehearsal: $PYTHON has no Horovod"
        fi
        return $FAILED
    fi

    local half=$(( $(nproc) / 2 )) nccl_result staged_result
    say "building Horovod twice in parallel ($half jobs each, at most $BUILD_LIMIT_S s; logs $WORK/build-*.out)"
    build nccl 1 "$half" >"$WORK/nccl.result" &
    local nccl_pid=$!
    build staged 0 "$half" >"$WORK/staged.result" &
    wait "$nccl_pid"; wait
    read -r nccl_result nccl_s <"$WORK/nccl.result"
    read -r staged_result staged_s <"$WORK/staged.result"
    for pair in "nccl:NCCL:$nccl_result:$nccl_s" "staged:host staging:$staged_result:$staged_s"; do
        IFS=: read -r name label result seconds <<<"$pair"
        if [ "$result" = ok ]; then
            say "PASS build with $label: $seconds s"
        else
            fail "build with $label: after $seconds s; last lines of $WORK/build-$name.out:"
            tail -n 25 "$WORK/build-$name.out" | sed 's/^/    /'
        fi
    done
    "$PYTHON" "$REPO_ROOT/setup.py" -q build_ext --inplace >"$WORK/hvdtrain-build.out" 2>&1 \
        || say "hvdtrain's C helper did not build (the torch adapter falls back to torch's own copies): $(tail -n 1 "$WORK/hvdtrain-build.out")"

    if [ "$nccl_result" = ok ]; then
        correctness nccl 1 "NCCL, 1 rank"
    else
        say "SKIP NCCL, 1 rank: no NCCL build"
    fi
    if [ "$staged_result" = ok ]; then
        correctness staged 2 "host-staged Gloo, 2 ranks"
    else
        say "SKIP host-staged Gloo, 2 ranks: no build"
    fi
    if [ "$nccl_result" = ok ]; then
        nccl_two_ranks
    else
        say "SKIP NCCL, 2 ranks on one GPU: no NCCL build"
    fi
    if [ "$staged_result" = ok ]; then
        ddp_comparison
    else
        say "SKIP DDP comparison: no build"
    fi
    say "done in $((SECONDS - started)) s: $([ $FAILED = 0 ] && echo 'nothing failed' || echo 'FAILURES above')"
    return $FAILED
}

main "$@"

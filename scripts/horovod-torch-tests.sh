#!/usr/bin/env bash
# Horovod 0.28.1's own test suite for horovod.torch (test/parallel/test_torch.py), with
# its one import changed to hvdtrain's adapter, on 2 ranks: what docs/torch.md claims
# ("every public name of horovod.torch is there"), and a hard test of init() after
# shutdown(), which its tearDown does under Gloo after every test.
#
#   scripts/horovod-torch-tests.sh HOROVOD_CHECKOUT [gloo|mpi] [RUNS]
#
# HOROVOD_CHECKOUT is a clone of https://github.com/horovod/horovod (the tests are not in
# its PyPI sdist; the files are read at its tag v0.28.1, or as they are in a folder that
# is not a git clone). Default controller gloo, 1 run. Each run ends with one line; the
# script fails unless every run passed at least MIN_PASSED tests and failed none but
# KNOWN_FAILURES (docs/torch.md says why each of those fails), and no rank aborted.
# Needs pytest and mock for PYTHON (default .venv/bin/python); mock is installed into
# that environment when missing.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$REPO_ROOT/.venv/bin/python}"
TAG=v0.28.1
MIN_PASSED=99  # Gloo: 101; MPI: 99 (2 more are skipped there)
# Three fail on Horovod itself (torch 2.13's Muon takes only 2-D parameters); the last
# trains a GAN loop to an infinite loss, where hvdtrain raises NonFiniteGradientError.
KNOWN_FAILURES="test_broadcast_state test_broadcast_state_options test_force_allreduce test_dynamic_requires_grad"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

die() { printf 'horovod-torch-tests: %s\n' "$*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: $0 HOROVOD_CHECKOUT [gloo|mpi] [RUNS]"
CHECKOUT="$1"
CONTROLLER="${2:-gloo}"
RUNS="${3:-1}"
case "$CONTROLLER" in gloo|mpi) ;; *) die "the controller is gloo or mpi, not '$CONTROLLER'" ;; esac
[ -x "$PYTHON" ] || die "$PYTHON not found: run scripts/setup.sh first, or set PYTHON"
# Absolute, as the tests run in a folder of their own (not resolved: a venv's python is a link).
PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
take() {  # take PATH_IN_HOROVOD: the file at $TAG (or as it is), into $WORK
    if git -C "$CHECKOUT" rev-parse --git-dir >/dev/null 2>&1; then
        git -C "$CHECKOUT" show "$TAG:$1" >"$WORK/$(basename "$1")" \
            || die "$CHECKOUT has no $1 at $TAG (git -C $CHECKOUT fetch --tags)"
    else
        [ -f "$CHECKOUT/$1" ] || die "$CHECKOUT/$1 not found: HOROVOD_CHECKOUT is a clone of Horovod"
        cp "$CHECKOUT/$1" "$WORK/"
    fi
}
take test/parallel/test_torch.py
take test/utils/common.py
grep -q '^import horovod.torch as hvd$' "$WORK/test_torch.py" \
    || die "test_torch.py does not import horovod.torch as hvd: not Horovod's $TAG"
sed -i 's/^import horovod.torch as hvd$/import hvdtrain.adapters.torch as hvd/' "$WORK/test_torch.py"

if ! "$PYTHON" -c 'import mock' 2>/dev/null; then
    echo "installing mock (Horovod's tests import it) for $PYTHON"
    "$PYTHON" -m pip install --quiet mock
fi

failed_runs=0
for run in $(seq "$RUNS"); do
    log="$WORK/run$run.log"
    status=0
    (cd "$WORK" && timeout 1500 "$(dirname "$PYTHON")/horovodrun" -np 2 "--$CONTROLLER" \
        "$PYTHON" -m pytest -q -rf --color=no -p no:cacheprovider test_torch.py) >"$log" 2>&1 \
        || status=$?
    # pytest's summary per rank, e.g. "[0]<stdout>:4 failed, 101 passed, 10 skipped in 95s"
    summaries="$(grep -E '[0-9]+ (passed|failed)' "$log" | grep -E ' in [0-9.]+s' || true)"
    failures="$(sed -n 's/.*FAILED test_torch.py::TorchTests::\([a-z0-9_]*\).*/\1/p' "$log" | sort -u)"
    most_failed="$(sed -n 's/.*[^0-9]\([0-9][0-9]*\) failed.*/\1/p' <<<"$summaries" | sort -n | tail -1)"
    unexpected=""
    for name in $failures; do
        case " $KNOWN_FAILURES " in *" $name "*) ;; *) unexpected="$unexpected $name" ;; esac
    done
    fewest_passed="$(sed -n 's/.*[^0-9]\([0-9][0-9]*\) passed.*/\1/p' <<<"$summaries" | sort -n | head -1)"
    # An abort or a crash; not 143, the launcher's SIGTERM to a rank still exiting when
    # the other exited 1 (pytest's status with the known failures).
    aborted="$(grep -m1 -E 'terminate called|Fatal Python error|exit with status code (134|135|136|139)' "$log" || true)"
    verdict=ok
    if [ -z "$summaries" ] || [ "$(wc -l <<<"$summaries")" -ne 2 ]; then
        verdict="a rank did not finish (launcher status $status)"
    elif [ -n "$aborted" ]; then
        verdict="a rank aborted: $aborted"
    elif [ "$(grep -c . <<<"$failures")" -lt "${most_failed:-0}" ]; then
        verdict="$most_failed failed, but their names could not be read"
    elif [ -n "$unexpected" ]; then
        verdict="unexpected failures:$unexpected"
    elif [ "${fewest_passed:-0}" -lt "$MIN_PASSED" ]; then
        verdict="only $fewest_passed passed (at least $MIN_PASSED expected)"
    fi
    echo "run $run/$RUNS ($CONTROLLER): $(tr '\n' ';' <<<"$summaries" | sed 's/\[[0-9,]*\]<stdout>://g')" \
         "failed: $(tr '\n' ' ' <<<"$failures")-> $verdict"
    if [ "$verdict" != ok ]; then
        failed_runs=$((failed_runs + 1))
        cp "$log" "$REPO_ROOT/horovod-torch-tests-run$run.log"
        echo "    its output: horovod-torch-tests-run$run.log"
    fi
done
[ "$failed_runs" -eq 0 ] || die "$failed_runs of $RUNS runs failed"
echo "horovod-torch-tests: $RUNS of $RUNS runs ok"

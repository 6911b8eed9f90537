#!/usr/bin/env bash
# Sets up everything hvdtrain needs on a fresh Debian machine, idempotently:
#   1. Debian packages: Open MPI (openmpi-bin, libopenmpi-dev), cmake, g++, make, patch;
#      and for the cluster tests (real sshd hosts, a one-node Slurm): openssh-server,
#      openssh-client, iproute2, slurm-wlm, munge (where they cannot be installed, those
#      tests skip, saying why)
#   2. a virtual environment in .venv
#   3. pip, setuptools and wheel in it, pinned like everything else by constraints.txt
#   4. torch, tensorflow-cpu and mpi4py: what Horovod's build compiles against
#   5. Horovod built from its PyPI source distribution against exactly those
#      frameworks, with hvdtrain's patches (scripts/patches/horovod/*.patch, each
#      starting with a line saying why) applied first, and installed, by
#      `scripts/build-horovod.sh --install` (the same step as in your own environment);
#      cached as a wheel outside the repository, keyed by the versions and the
#      patches' contents
#   6. hvdtrain itself, editable, with its test and plot extras (setup.py compiles its
#      one C helper, hvdtrain._packing, in place), and a check that Horovod's build is
#      complete
#
# Environment:
#   HVDTRAIN_CACHE   where the built Horovod wheel is kept (default ~/.cache/hvdtrain)
#   HVDTRAIN_CUDA, HVDTRAIN_NCCL  passed to scripts/build-horovod.sh, which builds
#                    Horovod with CUDA and NCCL for a CUDA build of torch only: the
#                    pinned torch here is the CPU build, so its Horovod is CPU-only
#                    (docs/setup.md, "GPUs and NCCL").
#   PYTHON           the interpreter to build the venv from (default python3.11)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO_ROOT/.venv"
CONSTRAINTS="$REPO_ROOT/constraints.txt"
PYTHON="${PYTHON:-python3.11}"
CACHE_ROOT="${HVDTRAIN_CACHE:-$HOME/.cache/hvdtrain}"
DEBIAN_PACKAGES=(openmpi-bin libopenmpi-dev cmake g++ make patch)
CLUSTER_TEST_PACKAGES=(openssh-server openssh-client iproute2 slurm-wlm munge)

BUILD_DIR="$(mktemp -d)"  # scratch files; removed on exit
trap 'rm -rf "$BUILD_DIR"' EXIT

STAGE=0
STAGES=6
stage() {
    STAGE=$((STAGE + 1))
    printf '\n==> [%d/%d] %s\n' "$STAGE" "$STAGES" "$*"
}
note() { printf '    %s\n' "$*"; }
die() {
    printf '\nsetup failed: %s\n' "$*" >&2
    exit 1
}

pin() {  # pin NAME -> the version constraints.txt gives NAME
    sed -n "s/^$1==\(.*\)$/\1/p" "$CONSTRAINTS"
}

missing_debian_packages() {  # missing_debian_packages PACKAGE... -> the missing ones
    local package
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
            || printf '%s ' "$package"
    done
}

apt_install() {  # apt_install PACKAGE...: as root, or through sudo; fails without either
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || return 1
        sudo=(sudo)
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

install_debian_packages() {
    stage "Debian packages: ${DEBIAN_PACKAGES[*]} (and for the cluster tests: ${CLUSTER_TEST_PACKAGES[*]})"
    local missing optional
    read -r -a missing <<<"$(missing_debian_packages "${DEBIAN_PACKAGES[@]}")"
    read -r -a optional <<<"$(missing_debian_packages "${CLUSTER_TEST_PACKAGES[@]}")"
    if [ ${#missing[@]} -eq 0 ] && [ ${#optional[@]} -eq 0 ]; then
        note "already installed"
        return
    fi
    if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
        [ ${#missing[@]} -eq 0 ] || die "missing Debian packages and no sudo to install them. As root, run:
    apt-get update && apt-get install -y ${missing[*]} ${optional[*]}
then run this script again."
        note "not installing ${optional[*]} without root or sudo: the sshd and Slurm tests will skip"
        return
    fi
    note "installing ${missing[*]} ${optional[*]}"
    if [ ${#missing[@]} -gt 0 ]; then
        apt_install "${missing[@]}" || die "apt-get install ${missing[*]} failed"
    fi
    if [ ${#optional[@]} -gt 0 ]; then
        # slurm-wlm's and munge's install scripts may try to start services; the tests start
        # their own daemons (scripts/slurm-local.sh, tests/ssh_hosts.py).
        apt_install "${optional[@]}" \
            || note "could not install ${optional[*]}: the sshd and Slurm tests will skip"
    fi
}

create_venv() {
    stage "virtual environment in .venv"
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; install Python 3.11 or set PYTHON=/path/to/python3.11"
    if [ -x "$VENV/bin/python" ]; then
        note "already there ($("$VENV/bin/python" --version))"
    else
        "$PYTHON" -m venv "$VENV"
        note "created with $("$VENV/bin/python" --version)"
    fi
}

pip_run() {
    # Some machines list index folders that do not exist; pip warns once per package.
    "$VENV/bin/python" -m pip --disable-pip-version-check "$@" \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

pip_install() {
    pip_run install --quiet -c "$CONSTRAINTS" "$@"
}

install_frameworks() {
    stage "torch $(pin torch), tensorflow-cpu $(pin tensorflow-cpu), mpi4py $(pin mpi4py)"
    # torch first and by itself: asked for alongside packages that merely depend on
    # "torch", pip could otherwise resolve a CUDA build from the index.
    pip_install "torch==$(pin torch)"
    # What Horovod's build compiles against; the rest comes with hvdtrain's extras.
    pip_install tensorflow-cpu mpi4py cloudpickle psutil pyyaml packaging
    note "$("$VENV/bin/python" -c 'import torch, tensorflow as tf, keras, mpi4py; print(f"torch {torch.__version__}, tensorflow {tf.__version__}, keras {keras.__version__}, mpi4py {mpi4py.__version__}")' 2>/dev/null)"
}

horovod_works() {  # the installed Horovod imports with both frameworks, MPI and Gloo
    "$VENV/bin/python" - <<'EOF' >/dev/null 2>&1
import horovod.torch as hvd_torch
import horovod.tensorflow as hvd_tf
assert hvd_torch.mpi_built() and hvd_torch.gloo_built()
assert hvd_tf.mpi_built() and hvd_tf.gloo_built()
EOF
}

build_horovod() {  # build_horovod ARGS...: scripts/build-horovod.sh for .venv
    PYTHON="$VENV/bin/python" HVDTRAIN_HOROVOD_FRAMEWORKS="pytorch tensorflow" \
        HVDTRAIN_CACHE="$CACHE_ROOT" bash "$REPO_ROOT/scripts/build-horovod.sh" "$@"
}

install_horovod() {
    local key
    key="$(build_horovod --cache-key)"
    local with_nccl=""
    [[ "$key" == *-nccl* ]] && with_nccl=1
    stage "Horovod $(pin horovod) with PyTorch, TensorFlow, MPI and Gloo${with_nccl:+ and NCCL} (cache: $CACHE_ROOT/wheels/$key)"
    local marker="$VENV/.horovod-build-key"
    if horovod_works && [ "$(cat "$marker" 2>/dev/null)" = "$key" ]; then
        note "already installed and working"
        return
    fi
    build_horovod --install
    horovod_works || die "Horovod was installed but does not import with both frameworks; see $CACHE_ROOT/wheels/$key/build.log"
    echo "$key" >"$marker"
}

install_hvdtrain() {
    stage "hvdtrain (editable, with its examples, test, benchmark, docs and ray extras) and a check of Horovod's build"
    # ray always: tests/test_ray.py runs in CI, and it costs about 240 MB and half a minute.
    pip_install --no-build-isolation -e "$REPO_ROOT[torch,tensorflow,examples,test,bench,docs,ray]"
    # setup.py marks the helper optional (pip installs without a compiler); here it must be.
    "$VENV/bin/python" -c "import hvdtrain._packing" \
        || die "hvdtrain._packing (the torch adapter's fused gradient packing) was not built"
    # stderr only carries TensorFlow's start-up chatter, unless the load itself fails.
    TF_CPP_MIN_LOG_LEVEL=2 KERAS_BACKEND=tensorflow "$VENV/bin/python" -c \
        "from hvdtrain.adapters.keras import tally; assert tally.native_ops(), 'not built'" \
        2>"$BUILD_DIR/tf-packing.err" \
        || { cat "$BUILD_DIR/tf-packing.err" >&2
             die "hvdtrain._tf_packing (the Keras adapter's flat-buffer ops) was not built or does not load"; }
    local report
    # stderr only carries TensorFlow's start-up chatter, unless the check itself fails.
    report="$("$VENV/bin/horovodrun" --check-build 2>"$BUILD_DIR/check-build.err")" \
        || { cat "$BUILD_DIR/check-build.err" >&2; die "horovodrun --check-build failed"; }
    printf '%s\n' "$report" | sed 's/^/    /'
    local wanted
    for wanted in TensorFlow PyTorch MPI Gloo; do
        printf '%s\n' "$report" | grep -Eq "\[X\] $wanted\$" \
            || die "horovodrun --check-build does not show $wanted"
    done
}

main() {
    cd "$REPO_ROOT"
    install_debian_packages
    create_venv
    stage "pip and build tools in the venv"
    pip_install pip setuptools wheel
    install_frameworks
    install_horovod
    install_hvdtrain
    printf '\nsetup complete: activate with  source .venv/bin/activate\n'
}

main "$@"

#!/usr/bin/env bash
# Builds hvdtrain's Horovod: the horovod==PIN source distribution (constraints.txt) with
# hvdtrain's patches (scripts/patches/horovod/*.patch) and the fixes any current-torch
# or current-TensorFlow build needs, into a wheel. No root, no apt: it uses the
# compilers, cmake and MPI on PATH and the interpreter in PYTHON. scripts/setup.sh and
# scripts/gpu-check.sh build through it; in your own venv or conda environment,
# `scripts/build-horovod.sh --install` is the whole Horovod install (docs/setup.md, "Installing
# into your own environment").
#
#   scripts/build-horovod.sh [--stock] --install    build the wheel (or take it from the
#                                                    cache) and pip-install it for PYTHON
#   scripts/build-horovod.sh [--stock] --cached     print the cached wheel's path,
#                                                    building it first when there is none
#   scripts/build-horovod.sh [--stock] --cache-key  print the cache key and stop
#   scripts/build-horovod.sh [--stock] OUTPUT_DIR   build; the wheel lands in OUTPUT_DIR
#   scripts/build-horovod.sh --print-flags          print the build's environment and stop
#
# --stock builds Horovod as its admins would: the build fixes only, none of hvdtrain's
# patches and no marker (tests/test_stock_horovod.py trains on it). A patched build
# carries the marker horovod/hvdtrain_patches.py naming its patches; hvdtrain reads it
# at init() (hvdtrain/horovod_patches.py).
#
# Environment:
#   PYTHON                     the interpreter to build for (default python3); the
#                              frameworks it can import are the ones built in
#   HVDTRAIN_CACHE             wheels are kept in $HVDTRAIN_CACHE/wheels/KEY (default
#                              ~/.cache/hvdtrain), KEY naming the Horovod, framework
#                              and Python versions, the patches' digest (or "stock")
#                              and whether NCCL and MPI are in
#   HVDTRAIN_HOROVOD_FRAMEWORKS  "pytorch tensorflow" to insist on them (a missing one
#                              then fails the build) instead of taking what imports
#   HVDTRAIN_HOROVOD_SDIST     a local horovod-PIN.tar.gz (else pip downloads it)
#   HVDTRAIN_NCCL              1: with NCCL (HOROVOD_GPU_OPERATIONS=NCCL), 0: without;
#                              unset: with it when nvidia-smi sees a GPU and nccl.h is
#                              found ($HOROVOD_NCCL_HOME/include, /usr/include,
#                              /usr/local/cuda/include or the nvidia-nccl Python package)
#   HOROVOD_BUILD_CUDA_CC_LIST the GPU architectures to compile kernels for (default:
#                              the visible GPUs' own)
#   HVDTRAIN_BUILD_JOBS        parallel compile jobs (default: nproc)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
PATCHES="$REPO_ROOT/scripts/patches/horovod"
# Part of the cache key: raise it when a change here changes what the build produces.
BUILD_REVISION=2
STOCK=0
PIN="$(sed -n 's/^horovod==\(.*\)$/\1/p' "$REPO_ROOT/constraints.txt")"

note() { printf '    %s\n' "$*"; }
die() { printf '\nbuild-horovod: %s\n' "$*" >&2; exit 1; }

# "NAME VERSION" per framework PYTHON imports, and "python cpXY": probed once (importing
# TensorFlow takes seconds), by probe_frameworks before anything else runs.
FOUND=""
probe_frameworks() {
    FOUND="$("$PYTHON" -c '
import importlib, sys
print(f"python cp{sys.version_info[0]}{sys.version_info[1]}")
for name in ("torch", "tensorflow"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception:
        pass
' 2>/dev/null)" || die "$PYTHON does not run"
}
found_version() { sed -n "s/^$1 //p" <<<"$FOUND"; }
importable() { [ -n "$(found_version "$1")" ]; }

nccl_include() {  # the folder holding nccl.h, or nothing
    local dir
    for dir in "${HOROVOD_NCCL_HOME:-/nonexistent}/include" /usr/include /usr/local/cuda/include \
               "$("$PYTHON" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null)"; do
        [ -n "$dir" ] && [ -f "$dir/nccl.h" ] && { echo "$dir"; return 0; }
    done
    return 0
}

want_nccl() {
    case "${HVDTRAIN_NCCL:-auto}" in
        1) return 0 ;;
        0) return 1 ;;
    esac
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || return 1
    [ -n "$(nccl_include)" ]
}

# The build's environment, one NAME=value per line.
build_flags() {
    local frameworks="${HVDTRAIN_HOROVOD_FRAMEWORKS:-}"
    if [ -z "$frameworks" ]; then
        importable torch && frameworks="pytorch"
        importable tensorflow && frameworks="$frameworks tensorflow"
    fi
    [ -n "$frameworks" ] || die "$PYTHON imports neither torch nor tensorflow: install a framework first"
    echo "HOROVOD_WITHOUT_MXNET=1"
    case " $frameworks " in *" pytorch "*) echo "HOROVOD_WITH_PYTORCH=1" ;; *) echo "HOROVOD_WITHOUT_PYTORCH=1" ;; esac
    case " $frameworks " in *" tensorflow "*) echo "HOROVOD_WITH_TENSORFLOW=1" ;; *) echo "HOROVOD_WITHOUT_TENSORFLOW=1" ;; esac
    echo "HOROVOD_WITH_GLOO=1"
    if command -v mpicxx >/dev/null 2>&1; then
        echo "HOROVOD_WITH_MPI=1"
    else
        echo "HOROVOD_WITHOUT_MPI=1"
    fi
    if want_nccl; then
        local include
        include="$(nccl_include)"
        [ -n "$include" ] || die "HVDTRAIN_NCCL=1 but no nccl.h found; set HOROVOD_NCCL_HOME"
        echo "HOROVOD_GPU_OPERATIONS=NCCL"
        echo "HOROVOD_NCCL_INCLUDE=$include"
        echo "HOROVOD_NCCL_LINK=SHARED"
        local arch="${HOROVOD_BUILD_CUDA_CC_LIST:-}"
        if [ -z "$arch" ] && command -v nvidia-smi >/dev/null 2>&1; then
            arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
                    | tr -d '.' | sort -u | paste -sd, -)"
        fi
        [ -n "$arch" ] && echo "HOROVOD_BUILD_CUDA_CC_LIST=$arch"
    fi
    echo "MAKEFLAGS=-j${HVDTRAIN_BUILD_JOBS:-$(nproc)}"
}

# A folder holding libnccl.so for the linker: a pip-installed NCCL ships only libnccl.so.2.
nccl_lib_dir() {  # nccl_lib_dir INCLUDE_DIR WORK_DIR
    local lib="$1/../lib" link="$2/nccl-lib"
    [ -f "$lib/libnccl.so" ] && { (cd "$lib" && pwd); return; }
    [ -f "$lib/libnccl.so.2" ] || die "no libnccl.so or libnccl.so.2 beside $1"
    mkdir -p "$link"
    ln -sf "$(cd "$lib" && pwd)/libnccl.so.2" "$link/libnccl.so"
    echo "$link"
}

# Applies every patch to the Horovod source in $1 and writes the marker naming them.
apply_patches() {
    local src="$1" patch_file names=""
    for patch_file in "$PATCHES"/*.patch; do
        [ -e "$patch_file" ] || continue
        note "patching: $(basename "$patch_file"): $(head -n 1 "$patch_file" | sed 's/^Why: //')"
        patch -p1 --forward --quiet -d "$src" <"$patch_file" \
            || die "$(basename "$patch_file") does not apply to horovod==$PIN"
        names="$names    \"$(basename "$patch_file" .patch)\",\n"
    done
    printf '"""Written by hvdtrain'\''s scripts/build-horovod.sh: the hvdtrain patches this\nHorovod was built with (hvdtrain/horovod_patches.py reads it)."""\n\nPATCHES = (\n'"$names"')\n' \
        >"$src/horovod/hvdtrain_patches.py"
}

# The cache key: what makes two builds interchangeable.
cache_key() {
    local flags frameworks="" versions="" patches
    flags="$(build_flags)"
    grep -q '^HOROVOD_WITH_PYTORCH=1$' <<<"$flags" && frameworks="torch"
    grep -q '^HOROVOD_WITH_TENSORFLOW=1$' <<<"$flags" && frameworks="$frameworks tensorflow"
    local name
    for name in $frameworks; do
        [ -n "$(found_version "$name")" ] || die "$PYTHON cannot import $name"
        versions="$versions$( [ "$name" = torch ] && echo torch || echo tf )$(found_version "$name")-"
    done
    versions="$versions$(found_version python)"
    if [ "$STOCK" = 1 ]; then
        patches="stock"
    else
        patches="patches$(cat "$PATCHES"/*.patch | sha256sum | cut -c1-12)"
    fi
    local key="horovod$PIN-$versions-r$BUILD_REVISION-$patches"
    grep -q '^HOROVOD_GPU_OPERATIONS=NCCL$' <<<"$flags" && key="$key-nccl"
    grep -q '^HOROVOD_WITHOUT_MPI=1$' <<<"$flags" && key="$key-nompi"
    echo "${key//+/_}"
}

cache_dir() { echo "${HVDTRAIN_CACHE:-$HOME/.cache/hvdtrain}/wheels/$(cache_key)"; }

cached_wheel() {  # the cached wheel's path, or nothing
    find "$(cache_dir)" -maxdepth 1 -name 'horovod-*.whl' 2>/dev/null | head -n 1 || true
}

# The cached wheel's path, building it into the cache first when there is none.
wheel_from_cache() {
    local wheel
    wheel="$(cached_wheel)"
    if [ -z "$wheel" ]; then
        build "$(cache_dir)" >&2
        wheel="$(cached_wheel)"
        [ -n "$wheel" ] || die "the build left no wheel in $(cache_dir)"
    fi
    echo "$wheel"
}

# Whether the installed Horovod imports for every framework it was built with.
horovod_imports() {
    local flags
    flags="$(build_flags)"
    if grep -q '^HOROVOD_WITH_PYTORCH=1$' <<<"$flags"; then
        "$PYTHON" -c "import horovod.torch" >/dev/null 2>&1 || return 1
    fi
    if grep -q '^HOROVOD_WITH_TENSORFLOW=1$' <<<"$flags"; then
        "$PYTHON" -c "import horovod.tensorflow" >/dev/null 2>&1 || return 1
    fi
}

pip_install() {
    # Some machines list index folders that do not exist; pip warns once per package.
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
        "$1" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

install() {
    local wheel
    wheel="$(wheel_from_cache)"
    note "installing $(basename "$wheel") for $PYTHON"
    pip_install "$wheel"
    if ! horovod_imports; then
        note "the cached wheel does not import here; rebuilding it"
        rm -rf "$(cache_dir)"
        wheel="$(wheel_from_cache)"
        pip_install "$wheel"
        horovod_imports \
            || die "Horovod was built and installed but does not import; see $(cache_dir)/build.log"
    fi
    note "installed $(basename "$wheel")"
}

WORK=""
trap '[ -z "$WORK" ] || rm -rf "$WORK"' EXIT

build() {
    local output_dir="$1"
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT  # also when build runs in a subshell of its own
    local work="$WORK"
    local -a flags
    mapfile -t flags < <(build_flags)
    if [ -n "${HVDTRAIN_HOROVOD_SDIST:-}" ]; then
        cp "$HVDTRAIN_HOROVOD_SDIST" "$work/"
    else
        note "downloading the horovod==$PIN source distribution"
        "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
            --no-binary :all: "horovod==$PIN" -d "$work" \
            2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    fi
    tar -xzf "$work"/horovod-*.tar.gz -C "$work"
    local src
    src="$(find "$work" -maxdepth 1 -type d -name 'horovod-*')"

    if [ "$STOCK" = 1 ]; then
        note "stock: none of hvdtrain's patches, no marker"
    else
        apply_patches "$src"
    fi

    # xla_mpi_ops.cc (an optional XLA lowering, off at run time unless
    # HOROVOD_ENABLE_XLA_OPS=1) does not compile against TF 2.21's XLA headers.
    sed -i '/xla_mpi_ops\.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    # Its CUDA kernels ask for C++11, which CUDA 13's headers no longer accept.
    sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' \
        "$src/horovod/common/ops/cuda/CMakeLists.txt"

    # PyTorch >= 2.1 headers need C++17 but Horovod's torch target asks for C++14;
    # the last -std flag on a compiler command line wins, so a wrapper appends it.
    local real_cxx
    real_cxx="$(command -v g++ || command -v c++)" || die "no C++ compiler (g++) on PATH"
    printf '#!/bin/sh\nexec "%s" "$@" -std=c++17\n' "$real_cxx" >"$work/cxx17"
    chmod +x "$work/cxx17"
    # nvcc gets the compiler itself as its host compiler, not the wrapper.
    sed -i "s|set(CMAKE_CUDA_HOST_COMPILER \"\${CMAKE_CXX_COMPILER}\")|set(CMAKE_CUDA_HOST_COMPILER \"$real_cxx\")|" \
        "$src/CMakeLists.txt"
    if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
        export PATH="/usr/local/cuda/bin:$PATH"
    fi

    local extra_flags=""
    if importable tensorflow; then
        local tf_include
        tf_include="$("$PYTHON" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())' 2>/dev/null)"
        extra_flags="-I$tf_include/external/highwayhash -I$tf_include/external/farmhash_archive/src"
    fi
    local flag
    for flag in "${flags[@]}"; do
        case "$flag" in
            HOROVOD_NCCL_INCLUDE=*) flags+=("HOROVOD_NCCL_LIB=$(nccl_lib_dir "${flag#*=}" "$work")") ;;
        esac
    done

    mkdir -p "$output_dir"
    note "building with: ${flags[*]}"
    note "compiling (about 8 minutes on 2 cores; log in $output_dir/build.log)"
    env CXX="$work/cxx17" CXXFLAGS="${CXXFLAGS:-} $extra_flags" "${flags[@]}" \
        "$PYTHON" -m pip wheel --verbose --no-build-isolation --no-deps \
        --disable-pip-version-check -w "$output_dir" "$src" >"$output_dir/build.log" 2>&1 &
    local build_pid=$! started=$SECONDS
    while kill -0 "$build_pid" 2>/dev/null; do
        sleep 5
        if kill -0 "$build_pid" 2>/dev/null && (( (SECONDS - started) % 60 < 5 )); then
            note "... still compiling after $(( (SECONDS - started) / 60 )) min" \
                "$(grep -o '^\[ *[0-9]*%\]' "$output_dir/build.log" | tail -n 1 || true)"
        fi
    done
    if ! wait "$build_pid"; then
        tail -n 30 "$output_dir/build.log" >&2
        die "the Horovod build failed; the whole log is $output_dir/build.log"
    fi
    note "built $(find "$output_dir" -maxdepth 1 -name 'horovod-*.whl' | head -n 1)"
}

if [ "${1:-}" = "--stock" ]; then
    STOCK=1
    shift
fi
probe_frameworks
case "${1:-}" in
    --print-flags) build_flags ;;
    --cache-key) cache_key ;;
    --cached) wheel_from_cache ;;
    --install) install ;;
    ""|-*) die "usage: $0 [--stock] --install | --cached | --cache-key | OUTPUT_DIR; $0 --print-flags" ;;
    *) build "$1" ;;
esac

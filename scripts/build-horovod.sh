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
#   HVDTRAIN_CUDA              1: with CUDA, 0: for the CPU only (also with a CUDA build of
#                              torch); unset: with CUDA when torch is a CUDA build (pip's
#                              default torch on x86_64 Linux is). No GPU is needed to build:
#                              nvcc and the CUDA runtime's headers and library are taken,
#                              of one major version, from HVDTRAIN_CUDA_HOME if set, else
#                              from the first that has them of: PYTHON's nvidia-* wheels
#                              (torch's own runtime; nvcc there from nvidia-cuda-nvcc),
#                              $CUDA_HOME, $CUDA_PATH, the toolkit of the nvcc on PATH,
#                              /usr/local/cuda
#   HVDTRAIN_CUDA_HOME         a CUDA toolkit to take nvcc and the runtime from, only
#   HVDTRAIN_NCCL              1: with NCCL (HOROVOD_GPU_OPERATIONS=NCCL), 0: without (a
#                              CUDA build then stages GPU tensors through host memory);
#                              unset: with it in a CUDA build when nccl.h is found
#                              ($HOROVOD_NCCL_HOME/include, PYTHON's nvidia-nccl wheel,
#                              the CUDA runtime's include folder, /usr/include)
#   HOROVOD_BUILD_CUDA_CC_LIST the GPU architectures to compile kernels for (default: those
#                              torch was built for, that nvcc supports; else the visible
#                              GPUs'; else every one nvcc supports)
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
try:
    import torch
    if torch.version.cuda:
        print("torch_cuda", torch.version.cuda)
        arches = sorted({int(a[3:]) for a in torch.cuda.get_arch_list() if a[3:].isdigit()})
        print("torch_arches", ",".join(map(str, arches)))
except Exception:
    pass
try:
    import nvidia
    for path in nvidia.__path__:
        print("nvidia_path", path)
except Exception:
    pass
' 2>/dev/null)" || die "$PYTHON does not run"
}
found_version() { sed -n "s/^$1 //p" <<<"$FOUND"; }
importable() { [ -n "$(found_version "$1")" ]; }

nvidia_paths() { sed -n 's/^nvidia_path //p' <<<"$FOUND"; }

# --- CUDA: nvcc and the CUDA runtime's headers and library, of one major version ---

cuda_major() {  # the major CUDA version torch was built with, or nothing
    local version
    version="$(found_version torch_cuda)"
    echo "${version%%.*}"
}

want_cuda() {
    case "${HVDTRAIN_CUDA:-}" in
        1) return 0 ;;
        0) return 1 ;;
        "") [ -n "$(found_version torch_cuda)" ] || [ "${HVDTRAIN_NCCL:-}" = 1 ] ;;
        *) die "HVDTRAIN_CUDA=$HVDTRAIN_CUDA: use 1 (with CUDA), 0 (for the CPU only) or leave it unset" ;;
    esac
}

nvcc_top() {  # the toolkit root of the nvcc $1 (through wrapper scripts), or nothing
    local scratch top
    scratch="$(mktemp -d)"
    : >"$scratch/probe.cu"
    top="$("$1" -v --dryrun -c "$scratch/probe.cu" -o "$scratch/probe.o" 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)"
    rm -rf "$scratch"
    [ -n "$top" ] && (cd "$top" 2>/dev/null && pwd)
    return 0
}

# The folders that may be a CUDA toolkit root (or hold the runtime or nvcc), in order.
cuda_roots() {
    if [ -n "${HVDTRAIN_CUDA_HOME:-}" ]; then
        echo "$HVDTRAIN_CUDA_HOME"
        return
    fi
    local dir major nvcc
    major="$(cuda_major)"
    while IFS= read -r dir; do
        [ -n "$dir" ] || continue
        [ -n "$major" ] && echo "$dir/cu$major"           # CUDA 13's wheels: one folder
        echo "$dir/cuda_runtime"; echo "$dir/cuda_nvcc"   # CUDA 12's: one per component
    done <<<"$(nvidia_paths)"
    [ -n "${CUDA_HOME:-}" ] && echo "$CUDA_HOME"
    [ -n "${CUDA_PATH:-}" ] && echo "$CUDA_PATH"
    if nvcc="$(command -v nvcc)"; then
        nvcc_top "$nvcc"
    fi
    echo /usr/local/cuda
}

cudart_include() {  # cudart_include ROOT: the folder holding cuda_runtime_api.h, or nothing
    local dir
    for dir in "$1/include" "$1/targets/$(uname -m)-linux/include"; do
        [ -f "$dir/cuda_runtime_api.h" ] && { echo "$dir"; return; }
    done
    return 0
}

cudart_library() {  # cudart_library ROOT: the CUDA runtime's shared library, or nothing
    local lib
    for lib in "$1"/lib64/libcudart.so* "$1"/lib/libcudart.so* "$1"/targets/*/lib/libcudart.so*; do
        [ -f "$lib" ] && { echo "$lib"; return; }
    done
    return 0
}

cudart_version() {  # cudart_version INCLUDE_DIR: MAJOR.MINOR from cuda_runtime_api.h
    local number
    number="$(sed -n 's/^#define CUDART_VERSION *\([0-9]*\).*/\1/p' "$1/cuda_runtime_api.h" | head -n 1)"
    [ -n "$number" ] && echo "$((number / 1000)).$((number % 1000 / 10))"
}

nvcc_version() {  # nvcc_version NVCC: MAJOR.MINOR, or nothing when it does not run
    "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -n 1
}

# "INCLUDE_DIR<TAB>LIBRARY": the first CUDA runtime of cuda_roots, or nothing.
cuda_runtime() {
    local root include lib
    while IFS= read -r root; do
        [ -n "$root" ] && [ -d "$root" ] || continue
        include="$(cudart_include "$root")"
        lib="$(cudart_library "$root")"
        [ -n "$include" ] && [ -n "$lib" ] && { printf '%s\t%s\n' "$include" "$lib"; return; }
    done <<<"$(cuda_roots)"
    return 0
}

# Sets NVCC to the first nvcc of cuda_roots (or PATH) whose major version is $1 (or to
# nothing), and NVCC_SEEN to every nvcc found, with its version.
NVCC="" NVCC_SEEN=""
find_nvcc() {
    local root candidate version
    NVCC="" NVCC_SEEN=""
    while IFS= read -r candidate; do
        [ -n "$candidate" ] && [ -x "$candidate" ] || continue
        version="$(nvcc_version "$candidate")"
        [ -n "$version" ] || continue
        NVCC_SEEN="${NVCC_SEEN:+$NVCC_SEEN, }$candidate (CUDA $version)"
        [ "${version%%.*}" = "$1" ] && { NVCC="$candidate"; return; }
    done <<<"$(while IFS= read -r root; do [ -n "$root" ] && echo "$root/bin/nvcc"; done <<<"$(cuda_roots)"
              [ -n "${HVDTRAIN_CUDA_HOME:-}" ] || command -v nvcc || true)"
}

# The GPU architectures for the kernels, comma-separated.
cuda_arches() {  # cuda_arches NVCC
    if [ -n "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
        echo "$HOROVOD_BUILD_CUDA_CC_LIST"
        return
    fi
    local supported wanted=""
    supported="$("$1" --list-gpu-arch 2>/dev/null | sed -n 's/^compute_\([0-9]*\)$/\1/p' | sort -n -u)"
    wanted="$(found_version torch_arches | tr ',' '\n' | grep -Fx -f <(echo "$supported") | paste -sd, -)"
    if [ -z "$wanted" ] && command -v nvidia-smi >/dev/null 2>&1; then
        wanted="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
                  | tr -d '.' | sort -n -u | paste -sd, -)"
    fi
    echo "${wanted:-$(paste -sd, - <<<"$supported")}"
}

nccl_include() {  # the folder holding nccl.h, or nothing
    local dir runtime
    runtime="$(cuda_runtime)"
    while IFS= read -r dir; do
        [ -n "$dir" ] && [ -f "$dir/nccl.h" ] && { echo "$dir"; return 0; }
    done <<<"$( [ -n "${HOROVOD_NCCL_HOME:-}" ] && echo "$HOROVOD_NCCL_HOME/include"
               while IFS= read -r dir; do [ -n "$dir" ] && echo "$dir/nccl/include"; done <<<"$(nvidia_paths)"
               [ -n "$runtime" ] && cut -f1 <<<"$runtime"
               echo /usr/include)"
    return 0
}

nccl_version() {  # nccl_version INCLUDE_DIR: MAJOR.MINOR.PATCH from nccl.h
    local part version=""
    for part in NCCL_MAJOR NCCL_MINOR NCCL_PATCH; do
        version="$version.$(sed -n "s/^#define $part *\([0-9]*\).*/\1/p" "$1/nccl.h" | head -n 1)"
    done
    echo "${version#.}"
}

want_nccl() {
    case "${HVDTRAIN_NCCL:-}" in
        1) return 0 ;;
        0) return 1 ;;
        "") want_cuda && [ -n "$(nccl_include)" ] ;;
        *) die "HVDTRAIN_NCCL=$HVDTRAIN_NCCL: use 1 (with NCCL), 0 (without) or leave it unset" ;;
    esac
}

# The build's CUDA and NCCL settings (build_flags), one NAME=value per line: Horovod's
# own, and HVDTRAIN_NVCC, HVDTRAIN_CUDA_INCLUDE and HVDTRAIN_CUDART, which build() turns
# into a toolkit folder for Horovod's CMake. Where CUDA was not asked for by name
# (HVDTRAIN_CUDA or HVDTRAIN_NCCL set to 1) but a part is missing, the build is for the
# CPU only and HVDTRAIN_CPU_ONLY says why; asked for by name, it fails saying the same.
cuda_flags() {  # cuda_flags FRAMEWORKS
    local torch_cuda
    torch_cuda="$(found_version torch_cuda)"
    if ! want_cuda; then
        [ "${HVDTRAIN_NCCL:-}" = 1 ] && die "HVDTRAIN_NCCL=1 needs CUDA, but HVDTRAIN_CUDA=0"
        # Horovod's CMake adds CUDA for any CUDA build of torch; the patched CMake
        # (build()) leaves it out on this.
        [ -n "$torch_cuda" ] && echo "HVDTRAIN_CUDA=0"
        return 0
    fi
    case " $1 " in
        *" pytorch "*) [ -n "$torch_cuda" ] \
            || die "a CUDA build was asked for, but torch $(found_version torch) is not a CUDA build: install one, or unset HVDTRAIN_CUDA/HVDTRAIN_NCCL" ;;
    esac
    local runtime include cudart version major
    runtime="$(cuda_runtime)"
    if [ -z "$runtime" ]; then
        cuda_unavailable "no CUDA runtime headers and library were found (looked in: $(cuda_roots | paste -sd' ' -)): install torch's, \`$PYTHON -m pip install 'nvidia-cuda-runtime==$torch_cuda.*'\` (CUDA 12: nvidia-cuda-runtime-cu12), or set HVDTRAIN_CUDA_HOME to a CUDA toolkit"
        return 0
    fi
    include="$(cut -f1 <<<"$runtime")"
    cudart="$(cut -f2 <<<"$runtime")"
    version="$(cudart_version "$include")"
    major="${version%%.*}"
    if [ -n "$torch_cuda" ] && [ "$major" != "${torch_cuda%%.*}" ]; then
        cuda_unavailable "torch $(found_version torch) is built with CUDA $torch_cuda, but the CUDA runtime found in $include is $version: install torch's, \`$PYTHON -m pip install 'nvidia-cuda-runtime==$torch_cuda.*'\`, or set HVDTRAIN_CUDA_HOME to a CUDA ${torch_cuda%%.*} toolkit"
        return 0
    fi
    find_nvcc "$major"
    if [ -z "$NVCC" ]; then
        cuda_unavailable "no nvcc for CUDA $major was found (seen: ${NVCC_SEEN:-none}), and Horovod's CUDA kernels need it: put one into this environment without root, \`$PYTHON -m pip install 'nvidia-cuda-nvcc==$version.*'\` (CUDA 12: nvidia-cuda-nvcc-cu12), or load your cluster's CUDA module"
        return 0
    fi
    echo "HVDTRAIN_NVCC=$NVCC"
    echo "HVDTRAIN_CUDA_INCLUDE=$include"
    echo "HVDTRAIN_CUDART=$cudart"
    echo "HOROVOD_BUILD_CUDA_CC_LIST=$(cuda_arches "$NVCC")"
    if want_nccl; then
        local nccl
        nccl="$(nccl_include)"
        [ -n "$nccl" ] || die "HVDTRAIN_NCCL=1 but no nccl.h was found: \`$PYTHON -m pip install nvidia-nccl-cu$major\`, or set HOROVOD_NCCL_HOME"
        echo "HOROVOD_GPU_OPERATIONS=NCCL"
        echo "HOROVOD_NCCL_INCLUDE=$nccl"
        echo "HOROVOD_NCCL_LINK=SHARED"
    fi
}

cuda_unavailable() {  # cuda_unavailable WHY: fail if CUDA was asked for by name, else CPU only
    if [ "${HVDTRAIN_CUDA:-}" = 1 ] || [ "${HVDTRAIN_NCCL:-}" = 1 ]; then
        die "a CUDA build was asked for, but $1; HVDTRAIN_CUDA=0 builds for the CPU only"
    fi
    [ -n "$(found_version torch_cuda)" ] && echo "HVDTRAIN_CUDA=0"
    echo "HVDTRAIN_CPU_ONLY=$1"
}

# One line: what build_flags builds (CPU only, CUDA, CUDA with NCCL) and why.
build_summary() {
    local flags torch_cuda torch_name
    flags="$(build_flags)"
    torch_cuda="$(found_version torch_cuda)"
    torch_name="torch $(found_version torch)"
    flag() { sed -n "s/^$1=//p" <<<"$flags"; }
    if [ -z "$(flag HVDTRAIN_NVCC)" ]; then
        if [ -n "$(flag HVDTRAIN_CPU_ONLY)" ]; then
            echo "for the CPU only, although $torch_name is a CUDA build: $(flag HVDTRAIN_CPU_ONLY); then run this again for CUDA and NCCL"
        elif [ -n "$torch_cuda" ]; then
            echo "for the CPU only, as HVDTRAIN_CUDA=0 asks ($torch_name is a CUDA build; unset HVDTRAIN_CUDA for CUDA and NCCL)"
        elif importable torch; then
            echo "for the CPU only: $torch_name is not a CUDA build"
        else
            echo "for the CPU only (no CUDA build of torch here; HVDTRAIN_CUDA=1 asks for CUDA)"
        fi
        return
    fi
    local include why nccl
    include="$(flag HVDTRAIN_CUDA_INCLUDE)"
    why="$( [ "${HVDTRAIN_CUDA:-}" = 1 ] && echo "HVDTRAIN_CUDA=1" || echo "$torch_name is a CUDA build")"
    why="$why; no GPU is needed to build it; HVDTRAIN_CUDA=0 builds for the CPU only"
    if [ -n "$(flag HOROVOD_NCCL_INCLUDE)" ]; then
        nccl="with NCCL $(nccl_version "$(flag HOROVOD_NCCL_INCLUDE)") from $(flag HOROVOD_NCCL_INCLUDE)"
    elif [ "${HVDTRAIN_NCCL:-}" = 0 ]; then
        nccl="without NCCL, as HVDTRAIN_NCCL=0 asks (GPU tensors go through host memory)"
    else
        nccl="without NCCL: no nccl.h found (\`$PYTHON -m pip install nvidia-nccl-cu$(cudart_version "$include" | cut -d. -f1)\` adds it; until then GPU tensors go through host memory)"
    fi
    echo "with CUDA $(cudart_version "$include") ($why): nvcc $(flag HVDTRAIN_NVCC), runtime from $include, kernels for sm $(flag HOROVOD_BUILD_CUDA_CC_LIST); $nccl"
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
    cuda_flags "$frameworks"
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

nccl_library() {  # nccl_library FLAG_LINES: the libnccl.so* beside HOROVOD_NCCL_INCLUDE, or nothing
    local include
    include="$(sed -n 's/^HOROVOD_NCCL_INCLUDE=//p' <<<"$1")"
    [ -n "$include" ] || return 0
    ls "$include"/../lib/libnccl.so* 2>/dev/null | head -n 1
}

# The run path (CMake list) for Horovod's libraries to find these shared libraries
# without torch having loaded them first (horovod.tensorflow next to a CUDA torch): one
# in PYTHON's site-packages, as pip's nvidia-* wheels are, relative to the libraries'
# own folder (site-packages/horovod/<framework>/), so the cached wheel serves any
# environment; one elsewhere, by its absolute folder.
library_rpath() {  # library_rpath LIBRARY...
    local site lib dir entries=()
    site="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
    site="$(cd "$site" && pwd -P)"
    for lib in "$@"; do
        [ -n "$lib" ] || continue
        dir="$(cd "$(dirname "$(readlink -f "$lib")")" && pwd -P)"
        case "$dir" in
            "$site"/*) entries+=("\$ORIGIN/../../${dir#"$site"/}") ;;
            *) entries+=("$dir") ;;
        esac
    done
    local IFS=";"
    echo "${entries[*]}"
}

# A CUDA toolkit folder made of links, laid out as Horovod's CMake looks for one (nvcc in
# bin/, whose parent holds include/ and lib64/libcudart.so): the parts may come from
# different places, such as a system nvcc and the CUDA runtime of torch's nvidia-* wheels,
# which ship only libcudart.so.MAJOR.
cuda_toolkit() {  # cuda_toolkit NVCC INCLUDE_DIR CUDART WORK_DIR
    local toolkit="$4/cuda" static
    mkdir -p "$toolkit/bin" "$toolkit/lib64"
    # A wrapper, not a link: nvcc finds its own headers and tools beside where it lies.
    printf '#!/bin/sh\nexec "%s" "$@"\n' "$1" >"$toolkit/bin/nvcc"
    chmod +x "$toolkit/bin/nvcc"
    ln -s "$2" "$toolkit/include"
    ln -s "$3" "$toolkit/lib64/libcudart.so"
    static="$(dirname "$3")/libcudart_static.a"
    [ -f "$static" ] && ln -s "$static" "$toolkit/lib64/libcudart_static.a"
    echo "$toolkit"
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
    local include arches
    include="$(sed -n 's/^HVDTRAIN_CUDA_INCLUDE=//p' <<<"$flags")"
    arches="$(sed -n 's/^HOROVOD_BUILD_CUDA_CC_LIST=//p' <<<"$flags")"
    [ -n "$include" ] && key="$key-cuda$(cudart_version "$include")-sm${arches//,/.}"
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

pip_install() {  # pip_install WHEEL: over any Horovod installed, then what it needs that is missing
    # Some machines list index folders that do not exist; pip warns once per package.
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
        "$1" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    "$PYTHON" -m pip install --quiet --disable-pip-version-check "$1" \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) \
        || die "Horovod's own dependencies (cloudpickle, psutil, pyyaml, packaging) did not install; install them into $PYTHON's environment"
}

install() {
    local wheel
    wheel="$(wheel_from_cache)"
    note "installing $(basename "$wheel") for $PYTHON: Horovod $(build_summary)"
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
    local flag_lines  # (HVDTRAIN_CPU_ONLY's reason is in build_summary's line already)
    flag_lines="$(build_flags | grep -v '^HVDTRAIN_CPU_ONLY=')"
    mapfile -t flags <<<"$flag_lines"
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

    # HVDTRAIN_RPATH (below): where Horovod's libraries look for the CUDA runtime and NCCL.
    sed -i '1a list(APPEND CMAKE_BUILD_RPATH $ENV{HVDTRAIN_RPATH})' "$src/CMakeLists.txt"
    # HVDTRAIN_CUDA=0 (build_flags): a CUDA build of torch is taken as a CPU one (Horovod
    # would otherwise add CUDA for it, and link torch's CUDA libraries and the runtime).
    sed -i '/string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)/a if("$ENV{HVDTRAIN_CUDA}" STREQUAL "0")\n    set(Pytorch_CUDA FALSE)\nendif()' \
        "$src/cmake/Modules/FindPytorch.cmake"

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
    local flag nvcc="" cuda_include="" cudart="" build_path="$PATH"
    for flag in "${flags[@]}"; do
        case "$flag" in
            HOROVOD_NCCL_INCLUDE=*) flags+=("HOROVOD_NCCL_LIB=$(nccl_lib_dir "${flag#*=}" "$work")") ;;
            HVDTRAIN_NVCC=*) nvcc="${flag#*=}" ;;
            HVDTRAIN_CUDA_INCLUDE=*) cuda_include="${flag#*=}" ;;
            HVDTRAIN_CUDART=*) cudart="${flag#*=}" ;;
        esac
    done
    if [ -n "$nvcc" ]; then
        local toolkit
        toolkit="$(cuda_toolkit "$nvcc" "$cuda_include" "$cudart" "$work")"
        # Horovod's CMake and torch's CUDA_HOME (which decides Pytorch_CUDA) both look there.
        build_path="$toolkit/bin:$PATH"
        flags+=("HOROVOD_CUDA_HOME=$toolkit" "CUDA_HOME=$toolkit"
                "LDFLAGS=${LDFLAGS:-} -L$toolkit/lib64"
                "HVDTRAIN_RPATH=$(library_rpath "$cudart" "$(nccl_library "$flag_lines")")")
    fi

    mkdir -p "$output_dir"
    note "building $(build_summary)"
    note "building with: ${flags[*]}"
    note "compiling (about 8 minutes on 2 cores; log in $output_dir/build.log)"
    env PATH="$build_path" CXX="$work/cxx17" CXXFLAGS="${CXXFLAGS:-} $extra_flags" "${flags[@]}" \
        "$PYTHON" -m pip wheel --verbose --no-build-isolation --no-deps \
        --disable-pip-version-check -w "$output_dir" "$src" >"$output_dir/build.log" 2>&1 &
    local build_pid=$! started=$SECONDS
    while kill -0 "$build_pid" 2>/dev/null; do
        sleep 5
        if kill -0 "$build_pid" 2>/dev/null && (( (SECONDS - started) % 60 < 5 )); then
            note "... still compiling after $(( (SECONDS - started) / 60 )) min" \
                "$(grep -o '\[ *[0-9]*%\]' "$output_dir/build.log" | tail -n 1 || true)"
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

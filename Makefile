# The two commands of README.md:  `make demo` (set up, then a 2-worker training run)
# and `make test` (set up, then lint and the whole test suite). Both set everything up.
VENV := .venv
PYTHON := $(VENV)/bin/python
# Open MPI refuses to run as root without both of these (CI runs as root).
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: setup demo test lint doctor bench stock-horovod docs horovod-tests cuda-build

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/horovodrun -np 2 --mpi $(PYTHON) examples/torch_train.py

lint: setup
	$(VENV)/bin/ruff check .

test: lint stock-horovod
	$(PYTHON) -m pytest

doctor: setup
	$(VENV)/bin/hvdtrain doctor

# The benchmarks of benchmarks/README.md (about 50 min on 2 cores): results and
# plots go to benchmarks/results/.
bench: setup
	$(PYTHON) benchmarks/run.py

# Horovod built without hvdtrain's patches, as a cluster's admins would build it, into
# the wheel cache (about 8 minutes on 2 cores, once): tests/test_stock_horovod.py trains
# on it, and skips, saying so, until it is there.
stock-horovod: setup
	PYTHON=$(PYTHON) HVDTRAIN_HOROVOD_FRAMEWORKS="pytorch tensorflow" \
		bash scripts/build-horovod.sh --stock --cached

# The API reference, generated from the docstrings into docs/api/ (open
# docs/api/index.html); tests/test_docs.py builds it and checks every cross-reference.
docs: setup
	KERAS_BACKEND=tensorflow $(PYTHON) -m pdoc --docformat google hvdtrain '!hvdtrain\._.*' --output-directory docs/api

# Horovod 0.28.1's own test_torch.py with its import changed to hvdtrain's adapter, on 2
# ranks, RUNS times (about 75 s each); it is not in Horovod's PyPI sdist, so it needs a
# clone of https://github.com/horovod/horovod:
#   make horovod-tests HOROVOD_CHECKOUT=../horovod [CONTROLLER=mpi] [RUNS=5]
CONTROLLER ?= gloo
RUNS ?= 1
horovod-tests: setup
	@test -n "$(HOROVOD_CHECKOUT)" || { echo "set HOROVOD_CHECKOUT to a clone of https://github.com/horovod/horovod"; exit 2; }
	PYTHON=$(PYTHON) bash scripts/horovod-torch-tests.sh "$(HOROVOD_CHECKOUT)" $(CONTROLLER) $(RUNS)

# The no-root install with pip's default torch (a CUDA build) on this machine without a
# GPU, both Horovod builds compiled afresh (CUDA and NCCL; HVDTRAIN_CUDA=0): about 3.5 GB
# of downloads and 8 minutes on 2 cores (measured: 7m50s, of which 1 min the venv, 3.7 min
# the NCCL build and its run, 2.6 min the CPU-only one). `make test` runs the same test
# with the user's wheel cache.
cuda-build: setup
	HVDTRAIN_TEST_COLD_CACHE=1 $(PYTHON) -m pytest -p no:cacheprovider tests/test_cuda_build.py

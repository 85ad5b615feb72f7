# hetsync: `make run` (the main job) and `make test` (the suite). Both set everything up first.
SHELL := /bin/bash
# TensorFlow version and virtual environment: `make test VENV=.venv-tf218 TF_VERSION=2.18.1` sets up and
# tests a second environment beside the default one (one TensorFlow per venv; the horovod wheel is
# cached per TensorFlow version under ~/.cache/hetsync; the op library is built once per TensorFlow
# version, hetsync/_hetsync_ops_tf<version>*.so, so both venvs work from one checkout).
TF_VERSION ?= 2.21.0
VENV ?= .venv
PY := $(VENV)/bin/python
HOROVODRUN := $(VENV)/bin/horovodrun
STAMP := $(VENV)/.hetsync-deps-tf$(TF_VERSION)
NP ?= 4
PROTOCOLS ?= bsp rna
SLOWDOWN ?= device:40+random:6
# SGD learning rates of the main job: LR for every protocol, LR_<protocol> where the study chose another
LR ?= 0.2
LR_bsp ?= 0.4
LR_rna ?= 0.8
ARGS_rna ?= --protocol-arg update_rule=samples --protocol-arg wait_for_round=true
MNIST_DIR := ../shared/data/mnist-t10k
# The MNIST files beside the repository when present (3 epochs), else scikit-learn's embedded digits (16 epochs).
# TARGET: the highest test accuracy (0.01 steps) BSP reached within the first half of its run on each of seeds 6-8,
# which the main job does not use (docs: first run): 0.9 on MNIST, 0.94 on the digits.
ifneq ($(wildcard $(MNIST_DIR)/*idx*),)
# the data location is a setting (HETSYNC_DATA_DIR) for the jobs, the benchmarks and the suite's MNIST cases
export HETSYNC_DATA_DIR ?= $(abspath $(MNIST_DIR))
DATA ?= --dataset mnist-idx --data-dir $(MNIST_DIR)
EPOCHS ?= 3
EVAL_EVERY ?= 8
TARGET ?= 0.9
else
DATA ?= --dataset digits
EPOCHS ?= 16
EVAL_EVERY ?= 4
TARGET ?= 0.94
endif
RUN_OUT ?= runs/main
# the seed of the main job (initial weights, the stragglers' draws, the data order): `make run SEED=3`
SEED ?= 0
# horovodrun's own process imports TensorFlow: quiet unless HETSYNC_VERBOSE is set (the jobs quiet themselves)
ifeq ($(HETSYNC_VERBOSE),)
export TF_CPP_MIN_LOG_LEVEL ?= 2
endif
export TF_NUM_INTRAOP_THREADS ?= 1
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: deps run test test-full build clean bench bench-quick docs
deps: $(STAMP)

# Idempotent: scripts/deps.sh checks before it acts; rerun when what it installs changes.
$(STAMP): scripts/deps.sh requirements-dev.txt setup.py pyproject.toml $(wildcard tf_ops/*.cc tf_ops/*.h)
	HETSYNC_VENV=$(VENV) HETSYNC_TF_VERSION=$(TF_VERSION) bash scripts/deps.sh
	touch $@

# Rebuild only the op library (after editing tf_ops/).
build: deps
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .

# The main job: 4 ranks on the emulated cluster (40 ms per 32-sample step, each rank 6x slower with
# probability 1/4 per step) train on real data, once per protocol in PROTOCOLS, then a side-by-side table.
# Each protocol runs at its own learning rate, LR_<protocol> (LR when unset), with ARGS_<protocol> added: the
# statistical-efficiency study chose them on seeds that are not the main job's (docs: benchmarks page).
run: deps
	@rm -rf $(RUN_OUT)
	@set -e; $(foreach p,$(PROTOCOLS),\
	  echo "=== $(p): $(NP) ranks, --slowdown $(SLOWDOWN), seed $(SEED), lr $(or $(LR_$(p)),$(LR)) $(ARGS_$(p))"; \
	  $(HOROVODRUN) --mpi -np $(NP) $(PY) examples/keras_digits.py --protocol $(p) --slowdown $(SLOWDOWN) \
	    $(DATA) --model mlp --lr $(or $(LR_$(p)),$(LR)) $(ARGS_$(p)) --epochs $(EPOCHS) --eval-every $(EVAL_EVERY) \
	    --target-accuracy $(TARGET) --seed $(SEED) --quiet --out $(RUN_OUT)/$(p);)
	$(PY) -m hetsync.bench.report $(RUN_OUT)

# Benchmark suite (hetsync.bench): every registered protocol x scenarios x seeds, real horovodrun launches.
# `bench` is the report: it writes its run into the documentation (docs/results/full.json, the results page;
# its last duration is on the benchmarks page, from that file; `--dry-run` lists the plan); `bench-quick` a
# smoke check.
bench: deps
	$(PY) -m hetsync.bench --preset full --update-docs --out runs/bench-full

bench-quick: deps
	$(PY) -m hetsync.bench --preset quick --out runs/bench-quick

# The suite (scripts/test.sh): tests/unit in-process beside tests/mp + tests/e2e (real launches, one at a time).
# `test` is what CI runs (everything not marked slow); `test-full` adds the slow tier (matrices, soak sample, the
# quick benchmark preset from outside the checkout). Logs, durations and JUnit files land under runs/.
# Extra pytest arguments: `make test ARGS="-k bsp"`.
test: deps
	PY=$(PY) bash scripts/test.sh quick $(ARGS)

test-full: deps
	PY=$(PY) bash scripts/test.sh full $(ARGS)

# The documentation site: docs/ (Markdown, Sphinx with MyST and furo) -> site/ (open site/index.html).
# Strict: a warning or a broken internal link fails the build.
docs: deps
	$(PY) -m sphinx -W --keep-going -q -b html docs site

clean:
	rm -rf site build dist *.egg-info hetsync/_hetsync_ops*.so hetsync/_hetsync_ops*_build.json runs .pytest_cache

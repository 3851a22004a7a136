# Every target does its own set-up: a virtual environment in .venv with what
# that target needs, created from nothing on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU build of torch, pinned: an unpinned torch pulls a multi-GB CUDA build.
TORCH  := torch==2.13.0
# Ray for feedmux.ray (the feedmux[ray] extra), pinned like torch.
RAY    := ray[train]==2.60.*

.PHONY: demo test test-matrix test-ray lint bench soak soak-ci chaos container-test clean

$(VENV)/.python: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	touch $@

$(VENV)/.base: $(VENV)/.python
	$(PY) -m pip install -q -e .
	touch $@

# One resolve for feedmux, the test extra and torch, pinned in it (lightning must not pull
# another build); it holds everything .base installs, so .base is marked done with it.
$(VENV)/.test: $(VENV)/.python
	$(PY) -m pip install -q -e '.[test]' $(TORCH)
	touch $(VENV)/.base $@

# Ray only (the pin is within the ray extra's range): feedmux is installed, editable,
# already, and torch stays the pinned build.
$(VENV)/.ray: $(VENV)/.test
	$(PY) -m pip install -q '$(RAY)' $(TORCH)
	touch $@

$(VENV)/.bench: $(VENV)/.test
	$(PY) -m pip install -q -e '.[bench]' $(TORCH)
	touch $@

## demo: a sampler server and two trainers on built-in example data
demo: $(VENV)/.base
	$(VENV)/bin/feedmux demo

## test: install the test dependencies, then lint, type-check and run the whole suite (4 processes: most tests wait on sockets, not on the CPU: a run on 2 cores uses a third of them; idle processes steal queued tests, so the long tests left at the end do not wait behind one busy process: 13:38 -> 7:19 on 2 cores)
test: $(VENV)/.test
	$(VENV)/bin/ruff check feedmux tests benchmarks examples
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -n 4 --dist worksteal tests feedmux

## test-matrix: every combination of delivery modes end to end, one trainer SIGKILLed and restarted in each (marker matrix; not in make test)
test-matrix: $(VENV)/.test
	$(PY) -m pytest -q -m matrix -n 3 --dist worksteal tests/integration/test_matrix.py

## test-ray: install Ray, then the fleet tests on a two-node local Ray cluster (marker ray)
test-ray: $(VENV)/.ray
	$(PY) -m pytest -q -m ray tests/ray

lint: $(VENV)/.test
	$(VENV)/bin/ruff check feedmux tests benchmarks examples
	$(VENV)/bin/mypy

## bench: every benchmark, feedmux and its peers side by side (feedmux across two hosts in network namespaces against raw pyzmq over the same link, unshaped and 1 Gbit, as root; --workers auto against the best fixed count; and consumer groups vs separate servers, the cost of resuming mid-epoch, CURVE delivery against the default, a seeded run's server CPU against an unseeded one, 16 MiB samples through the pool with --workers 2, 2 to 64 ranks and 256 free trainers on one server, coordinated steps for variable lengths against today's ranked dealing, and the ImageNet-style JPEG pipeline against torch's DataLoader, torchdata.nodes and SPDL; and 20 of 21 sampling workers SIGKILLed at random moments in a 2-minute run through the pool, nothing lost)
bench: $(VENV)/.bench
	$(PY) -m benchmarks
	$(PY) -m benchmarks.bench_groups
	$(PY) -m benchmarks.bench_resume
	$(PY) -m benchmarks.bench_modes
	$(PY) -m benchmarks.bench_seeded
	$(PY) -m benchmarks.bench_shm_workers
	$(PY) -m benchmarks.bench_scale
	$(PY) -m benchmarks.bench_buckets
	$(PY) -m benchmarks.bench_hosts
	$(PY) -m benchmarks.bench_autoscale
	$(PY) -m benchmarks.bench_images
	$(PY) -m benchmarks.worker_kills --workers 21 --kills 20

## soak: 10 minutes of churn (trainers SIGKILLed, the server restarted, a ranked job killed and resumed from its checkpoints, 2 workers per server): fails on any lost or repeated sample, or an RSS slope above 1 MiB/min once warm
soak: $(VENV)/.test
	$(PY) -m benchmarks.soak --minutes 10 --workers 2

## soak-ci: the same for 1 minute (in .ci/run), one sampling process per server; RSS slopes shown, judged only by the 10-minute soak
soak-ci: $(VENV)/.test
	$(PY) -m benchmarks.soak --minutes 1

## chaos: the model-based chaos test, long form (docs/chaos.md): 20 seeds of every event for 2 minutes each, then each focused scenario (a ranked job resumed from checkpoints, ranks restarted without one, free servers restarted, a DataLoader with non-persistent workers); every run is audited, and the target fails if any run found a problem
chaos: $(VENV)/.test
	status=0; \
	$(PY) -m benchmarks.chaos --focus mix --minutes 2 --seed $$(seq 1 20) || status=1; \
	$(PY) -m benchmarks.chaos --focus checkpoint server-restart --minutes 2 --seed $$(seq 1 5) || status=1; \
	$(PY) -m benchmarks.chaos --focus rank-restart --seed $$(seq 1 20) || status=1; \
	$(PY) -m benchmarks.chaos --focus dataloader --seed 1 2 || status=1; \
	exit $$status

container-test:
	scripts/container-test.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

"""The benchmark suite still runs: every scenario, every contender, a few samples each.

Nothing here is timed or compared: figures from a run this short mean
nothing. It only keeps ``python -m benchmarks`` from rotting.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import run
from benchmarks.scenarios import SCENARIOS, Contender


@pytest.mark.timeout(120)
def test_every_scenario_runs_for_a_few_samples(tmp_path):
    result = run(quick=True, results_dir=tmp_path, progress=None)

    planned = {(s.key, c.key) for s in SCENARIOS for c in s.contenders}
    measured = {(r["scenario"], _key(r)) for r in result["measurements"]}
    assert measured == planned

    for record in result["measurements"]:
        assert "error" not in record, f"{record['label']} in {record['scenario']}: {record}"
        assert record["samples"] > 0
        assert record["trainer_cpu_us_per_sample"] > 0  # the trainer's loop costs some CPU
    two_trainers = [r for r in result["measurements"] if r["contender"]["trainers"] == 2]
    assert two_trainers
    for record in two_trainers:
        assert len(record["shares"]) == 2

    for scenario in SCENARIOS:
        assert f"### {scenario.number}. " in result["markdown"]
    assert "### Targets" in result["markdown"]
    saved = json.loads((tmp_path / next(p.name for p in tmp_path.iterdir())).read_text())
    assert len(saved["measurements"]) == len(planned)


def _key(record):
    return Contender(**record["contender"]).key


def test_scenarios_are_picked_by_key_or_number():
    from benchmarks.scenarios import select

    assert [s.key for s in select(["1", "large"])] == ["small", "large"]
    with pytest.raises(ValueError, match="unknown scenario"):
        select(["nope"])


@pytest.mark.timeout(120)
def test_the_resume_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_resume

    assert bench_resume.main(["--quick"]) == 0
    table = capsys.readouterr().out
    assert "| fast-forward (resume_at + first chunk) |" in table
    assert "| first sample of 2 ranks, resumed |" in table


@pytest.mark.timeout(60)
def test_the_small_sample_steps_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_small

    bench_small.main(["--quick"])
    table = capsys.readouterr().out
    for step in ("generator", "produce, zero-copy", "decode", "unstacked", "indexed"):
        assert f"| {step} |" in table


@pytest.mark.timeout(120)
def test_the_delivery_modes_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_modes

    assert bench_modes.main(["--quick"]) == 0
    table = capsys.readouterr().out
    for mode in bench_modes.MODES:
        assert f"| {mode} | " in table
    assert "ratio to default (paired" in table


@pytest.mark.timeout(120)
def test_the_seeded_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_seeded

    assert bench_seeded.main(["--quick"]) == 0
    table = capsys.readouterr().out
    for mode in bench_seeded.MODES:
        assert f"| {mode} | " in table
    assert "Seeded / unseeded server CPU per sample (paired)" in table


@pytest.mark.timeout(180)
def test_the_scale_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_scale

    assert bench_scale.main(["--quick"]) == 0
    table = capsys.readouterr().out
    for row in ("| 2 ranks | ", "| 4 ranks | ", "| 8 free | "):
        assert row in table
    assert "| 0/1 |" in table and "failed:" not in table  # every run measured
    two_ranks = next(line for line in table.splitlines() if line.startswith("| 2 ranks | "))
    assert float(two_ranks.split("|")[4]) > 0  # the server's CPU per sample was measured


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_shared_memory_workers_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_shm_workers

    assert bench_shm_workers.main(["--quick"]) == 0
    table = capsys.readouterr().out
    for label in bench_shm_workers.CONTENDERS:
        assert f"| {label} | " in table
    assert "raw pyzmq, one 56-byte message received" in table and "failed" not in table
    assert "raw pyzmq, one 56-byte message at the pool's rate (polled)" in table


@pytest.mark.timeout(300)
def test_the_images_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("PIL")
    pytest.importorskip("skimage")
    pytest.importorskip("torchdata")
    from benchmarks import bench_images

    assert bench_images.main(["--quick", "--no-offload"]) == 0
    table = capsys.readouterr().out
    for label in ("feedmux", "torch DataLoader", "torchdata.nodes", "one process"):
        assert f"| {label} | " in table
    assert "failed" not in table
    assert "| feedmux server CPU per image / one worker's CPU per image <= 0.1 |" in table


@pytest.mark.timeout(120)
def test_the_control_latency_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import bench_control

    assert bench_control.main(["--quick", "--ms", "5"]) == 0
    table = capsys.readouterr().out
    for kind in bench_control.KINDS:
        for workers in bench_control.WORKERS:
            assert f"| {kind} | {workers} | " in table

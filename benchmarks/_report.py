"""Medians, ratios, the issue's targets and the markdown table, from raw measurements.

Pure functions of the list of measurement records the harness returns: no
processes, no clocks. A figure is the median over the rounds that succeeded.
A ratio is *paired*: the two contenders' rates are divided round by round
(they ran seconds apart, under the same load from the rest of the machine)
and the median of those quotients is reported; this cancels most of the drift
of a shared machine that medians taken separately keep.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks.scenarios import (
    BATCH_SIZE,
    CPU,
    IMAGES,
    LARGE,
    MODES,
    SMALL,
    TWO_TRAINERS,
    Contender,
    Scenario,
)

GB = 1e9


def derive(record: dict[str, Any], sample_bytes: int) -> dict[str, Any]:
    """Add the per-second and per-sample figures to one raw measurement."""
    if "error" in record or not record.get("samples"):
        return record
    batch_size = record["contender"].get("batch_size") or 0
    if batch_size and "steps" not in record:
        # The trainer loop counted steps (one batch each): the figures are per sample.
        record["steps"] = record["samples"]
        record["samples"] = record["steps"] * batch_size
    samples, seconds = record["samples"], record["seconds"]
    record["samples_per_second"] = samples / seconds
    # No bytes move when the generator runs in the trainer itself.
    moved = record["contender"]["transport"] != "none"
    record["gb_per_second"] = samples * sample_bytes / seconds / GB if moved else None
    record["trainer_cpu_us_per_sample"] = record["cpu_seconds"] / samples * 1e6
    if record.get("producer_cpu_seconds") is not None:
        record["producer_cpu_us_per_sample"] = record["producer_cpu_seconds"] / samples * 1e6
    trainers = record.get("trainers")
    if trainers:
        counts = [t["samples"] for t in trainers]
        record["shares"] = [count / max(1, sum(counts)) for count in counts]
    return record


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(scenario: Scenario, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per contender of a scenario: medians, spread and the ratio to feedmux."""
    rows = []
    for contender in scenario.contenders:
        mine = [
            r
            for r in records
            if r["scenario"] == scenario.key and Contender(**r["contender"]) == contender
        ]
        good = [r for r in mine if "error" not in r and r.get("samples")]
        rates = [r["samples_per_second"] for r in good]
        row: dict[str, Any] = {
            "scenario": scenario.key,
            "contender": contender.key,
            "label": contender.label,
            "transport": contender.transport,
            "runs": len(good),
            "failed": len(mine) - len(good),
            "errors": sorted({_first_line(r["error"]) for r in mine if "error" in r}),
            "samples_per_second": _median(rates),
            "gb_per_second": _median(r["gb_per_second"] for r in good),
            "trainer_cpu_us_per_sample": _median(r["trainer_cpu_us_per_sample"] for r in good),
            "producer_cpu_us_per_sample": _median(
                r.get("producer_cpu_us_per_sample") for r in good
            ),
            "spread": (max(rates) - min(rates)) / statistics.median(rates)
            if len(rates) > 1
            else None,
        }
        shares = [min(r["shares"]) for r in good if r.get("shares")]
        row["min_share"] = _median(shares)
        row["by_round"] = {
            r["round"]: {"samples_per_second": r["samples_per_second"]} for r in good
        }
        rows.append(row)
    for row, contender in zip(rows, scenario.contenders, strict=True):
        reference = _reference_row(scenario, contender, rows)
        row["reference"] = reference["contender"] if reference else None
        row["ratio_to_feedmux"] = _ratio(row, reference) if contender.peer != "inline" else None
    return rows


def _first_line(error: str) -> str:
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "error"


def _reference_row(
    scenario: Scenario, contender: Contender, rows: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The feedmux row a contender is compared with: same transport, workers and trainers
    when feedmux was measured that way, else feedmux over tcp with one of each."""
    candidates = [
        Contender("feedmux", t, workers=w, trainers=n, show_workers=s)
        for t in (contender.transport, "tcp")
        for w in (contender.workers, 1)
        for n in (contender.trainers, 1)
        for s in (True, False)
    ]
    by_key = {row["contender"]: row for row in rows}
    for candidate in candidates:
        if candidate.key in by_key and candidate in scenario.contenders:
            return by_key[candidate.key]
    return None


# --------------------------------------------------------------------------
# The targets


def _row(
    rows: list[dict[str, Any]], peer: str, transport: str = "tcp", mode: str = "", **options: int
) -> Any:
    for row in rows:
        contender = row["contender"]
        peer_of, transport_of, workers, trainers, *flags = contender.split("/")
        if peer_of != peer or transport_of != transport or "zc" in flags:
            continue
        if ("ranked" in flags) != bool(options.get("ranked", 0)):
            continue
        if ("seeded" in flags) != bool(options.get("seeded", 0)):
            continue
        if (flags[-1] if flags and flags[-1] in MODES else "") != mode:
            continue
        if int(workers[1:]) != options.get("workers", int(workers[1:])):
            continue
        if int(trainers[1:]) != options.get("trainers", 1):
            continue
        batch = next((int(flag[1:]) for flag in flags if flag[:1] == "b" and flag[1:].isdigit()), 0)
        if batch != options.get("batch", 0):
            continue
        return row
    return None


def _cpu_check(check: Check, label: str, row: Any, most: float | None) -> None:
    """A target on the trainer's CPU per sample in ``row``: at most ``most`` µs (None: a
    figure for context)."""
    check(label, row["trainer_cpu_us_per_sample"] if row else None, most, "µs", at_most=True)


def _ratio(a: Any, b: Any) -> float | None:
    """The median over rounds of a's rate divided by b's rate in the same round."""
    if a is None or b is None:
        return None
    field = "samples_per_second"
    quotients = [
        figures[field] / b["by_round"][round_index][field]
        for round_index, figures in a["by_round"].items()
        if round_index in b["by_round"] and b["by_round"][round_index][field]
    ]
    return float(statistics.median(quotients)) if quotients else None


def targets(summary: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each target of the issue with its figure from this run and whether it is met."""
    checks: list[dict[str, Any]] = []

    def check(
        name: str, figure: float | None, bound: float | None, unit: str, at_most: bool = False
    ) -> None:
        """A target (``bound`` given) or a figure that puts one in context (``bound`` None)."""
        met = None
        if figure is not None and bound is not None:
            met = figure <= bound if at_most else figure >= bound
        checks.append({"target": name, "figure": figure, "bound": bound, "unit": unit, "met": met})

    small = summary.get(SMALL)
    if small:
        feedmux = _row(small, "feedmux")
        check(
            "small: feedmux ≥ 10x pescador ZMQStreamer samples/s",
            _ratio(feedmux, _row(small, "pescador")),
            10,
            "x",
        )
        check(
            "small: feedmux ≥ 5x torch DataLoader (2 workers) samples/s",
            _ratio(feedmux, _row(small, "torch", "queue", workers=2)),
            5,
            "x",
        )
        _cpu_check(check, "small: trainer CPU ≤ 3 µs per sample", feedmux, 3)
        check(
            "context: feedmux / raw pyzmq with one pre-built message per sample",
            _ratio(feedmux, _row(small, "pyzmq")),
            None,
            "x",
        )
        _small_targets(check, small, feedmux)
    large = summary.get(LARGE)
    if large:
        for transport in ("tcp", "ipc"):
            check(
                f"large: feedmux ≥ 90% of raw pyzmq GB/s ({transport})",
                _ratio(_row(large, "feedmux", transport), _row(large, "pyzmq", transport)),
                0.9,
                "x",
            )
        check(
            "large: feedmux ≥ 1.5x pescador ZMQStreamer",
            _ratio(_row(large, "feedmux"), _row(large, "pescador")),
            1.5,
            "x",
        )
        check(
            "context: feedmux over ipc / pescador ZMQStreamer (tcp, its only transport), large",
            _ratio(_row(large, "feedmux", "ipc"), _row(large, "pescador")),
            None,
            "x",
        )
        check(
            "context: raw pyzmq / pescador ZMQStreamer, large (the most a transport over "
            "the same sockets can show)",
            _ratio(_row(large, "pyzmq"), _row(large, "pescador")),
            None,
            "x",
        )
        _large_targets(check, large)
    images = summary.get(IMAGES)
    if images:
        for peer, name in (("pescador", "pescador ZMQStreamer"), ("torch", "torch DataLoader")):
            check(
                f"context: images (no target in the issue): feedmux / {name}",
                _ratio(
                    _row(images, "feedmux"),
                    _row(images, peer, "queue" if peer == "torch" else "tcp"),
                ),
                None,
                "x",
            )
        check(
            "images: feedmux ≥ 2x torch DataLoader (2 workers)",
            _ratio(_row(images, "feedmux"), _row(images, "torch", "queue", workers=2)),
            2,
            "x",
        )
        check(
            "context: images, feedmux with shared_empty / feedmux",
            _ratio(_row(images, "feedmux", mode="shared"), _row(images, "feedmux")),
            None,
            "x",
        )
    cpu = summary.get(CPU)
    if cpu:
        check(
            "cpu-bound: feedmux --workers 2 ≥ 1.7x --workers 1",
            _ratio(_row(cpu, "feedmux", workers=2), _row(cpu, "feedmux", workers=1)),
            1.7,
            "x",
        )
        check(
            "context: cpu-bound, feedmux --workers 2: seeded (fixed merge order) / unseeded",
            _ratio(_row(cpu, "feedmux", workers=2, seeded=1), _row(cpu, "feedmux", workers=2)),
            None,
            "x",
        )
    two = summary.get(TWO_TRAINERS)
    if two:
        pair = _row(two, "feedmux", trainers=2)
        check(
            "two trainers: aggregate ≥ 90% of one trainer",
            _ratio(pair, _row(two, "feedmux", trainers=1)),
            0.9,
            "x",
        )
        check(
            "two trainers: neither gets < 40% of the total",
            pair["min_share"] if pair else None,
            0.4,
            "share",
        )
        for workers in (1, 2):
            check(
                f"two ranked trainers: aggregate ≥ 90% of two free trainers (--workers {workers})",
                _ratio(_row(two, "feedmux", workers=workers, trainers=2, ranked=1),
                       _row(two, "feedmux", workers=workers, trainers=2)),
                0.9,
                "x",
            )
    return checks


Check = Any  # the ``check`` function of ``targets``


def _small_targets(check: Check, small: list[dict[str, Any]], feedmux: Any) -> None:
    """Issue 14's small-sample targets: rate, trainer CPU, and CURVE against the default
    delivery (the acknowledged one: the plain delivery the issue compared with is gone, and
    with it the target of --reliable against plain)."""
    inline = _row(small, "inline", "none")
    rate = feedmux["samples_per_second"] if feedmux else None
    check("small: feedmux ≥ 1.5 M samples/s (or the next target)", rate, 1.5e6, "samples/s")
    check(
        "small: feedmux ≥ 60% of the in-process generator's samples/s",
        _ratio(feedmux, inline),
        0.6,
        "x",
    )
    _cpu_check(check, "small: trainer CPU ≤ 0.6 µs per sample", feedmux, 0.6)
    _batch_targets(check, small, feedmux)
    check(
        "small: CURVE ≥ 50% of the default delivery (acknowledged; plain is gone)",
        _ratio(_row(small, "feedmux", mode="curve"), feedmux),
        0.5,
        "x",
    )


def _batch_targets(check: Check, small: list[dict[str, Any]], feedmux: Any) -> None:
    """Issue 24's batch targets: batches stacked by the server, against single samples and
    against torch's DataLoader collating the same batches."""
    batched = _row(small, "feedmux", batch=BATCH_SIZE)
    torch = _row(small, "torch", "queue", workers=2, batch=BATCH_SIZE)
    check(
        f"small: trainer CPU per sample at batch_size={BATCH_SIZE} ≤ 10% of one sample per step",
        _cpu_quotient(batched, feedmux), 0.1, "x", at_most=True,
    )
    check(
        f"small: feedmux batch_size={BATCH_SIZE} ≥ 3x torch DataLoader (2 workers, "
        f"batch_size={BATCH_SIZE}) samples/s",
        _ratio(batched, torch), 3, "x",
    )
    _cpu_check(check, f"context: small, trainer CPU per sample, feedmux batch_size={BATCH_SIZE}",
               batched, None)
    check(
        f"context: small, trainer CPU per sample, torch DataLoader batch_size={BATCH_SIZE} / "
        f"feedmux batch_size={BATCH_SIZE}",
        _cpu_quotient(torch, batched), None, "x",
    )


def _cpu_quotient(a: Any, b: Any) -> float | None:
    """a's trainer CPU per sample divided by b's (medians over the rounds)."""
    if (a is None or b is None or a["trainer_cpu_us_per_sample"] is None
            or not b["trainer_cpu_us_per_sample"]):  # a contender left out (--peer) or failed
        return None
    return float(a["trainer_cpu_us_per_sample"] / b["trainer_cpu_us_per_sample"])


def _large_targets(check: Check, large: list[dict[str, Any]]) -> None:
    """Issue 14's 16 MiB targets (same host: the shared-memory path) and the other modes."""
    feedmux, pyzmq = _row(large, "feedmux"), _row(large, "pyzmq")
    check("large, same host: feedmux ≥ 2.0x raw pyzmq (tcp)", _ratio(feedmux, pyzmq), 2.0, "x")
    check(
        "large, same host: feedmux ≥ 2.5x pescador ZMQStreamer",
        _ratio(feedmux, _row(large, "pescador")),
        2.5,
        "x",
    )
    _cpu_check(check, "large, same host: trainer CPU ≤ 200 µs per 16 MiB sample", feedmux, 200)
    check(
        "large, same host: feedmux with shared_empty ≥ 3x raw pyzmq (tcp)",
        _ratio(_row(large, "feedmux", mode="shared"), pyzmq),
        3.0,
        "x",
    )
    for mode, name in (("noshm", "--no-shm"), ("curve", "CURVE")):
        check(
            f"context: large, feedmux {name} / feedmux",
            _ratio(_row(large, "feedmux", mode=mode), feedmux),
            None,
            "x",
        )


# --------------------------------------------------------------------------
# Markdown


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def markdown(
    scenarios: Sequence[Scenario],
    summary: dict[str, list[dict[str, Any]]],
    checks: list[dict[str, Any]],
) -> str:
    """The summary as markdown: one table per scenario, then the targets."""
    out: list[str] = []
    for scenario in scenarios:
        rows = summary.get(scenario.key)
        if not rows:
            continue
        out.append(f"### {scenario.number}. {scenario.title}\n")
        head = ["contender", "transport", "samples/s"]
        if scenario.large:
            head.append("GB/s")
        head += ["trainer CPU µs/sample", "producer CPU µs/sample", "÷ feedmux", "spread", "runs"]
        if scenario.key == TWO_TRAINERS:
            head.insert(len(head) - 5, "smaller share")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join("---" for _ in head) + "|")
        for row in rows:
            if not row["runs"] and not row["failed"]:
                continue  # not part of this run (--peer)
            cells = [row["label"], row["transport"], _fmt(row["samples_per_second"])]
            if scenario.large:
                cells.append(_fmt(row["gb_per_second"]))
            if scenario.key == TWO_TRAINERS:
                share = row["min_share"]
                cells.append("-" if share is None else f"{share:.0%}")
            cells += [
                _fmt(row["trainer_cpu_us_per_sample"]),
                _fmt(row["producer_cpu_us_per_sample"]),
                "-" if row["ratio_to_feedmux"] is None else f"{row['ratio_to_feedmux']:.2f}x",
                "-" if row["spread"] is None else f"{row['spread']:.0%}",
                f"{row['runs']}" + (f" ({row['failed']} failed)" if row["failed"] else ""),
            ]
            out.append("| " + " | ".join(cells) + " |")
        errors = [(row["label"], row["transport"], e) for row in rows for e in row["errors"]]
        if errors:
            out.append("")
        for label, transport, error in errors:
            out.append(f"- {label} ({transport}) failed: `{error}`")
        out.append("")
    if checks:
        out.append("### Targets\n")
        out.append("| target | this run | met |")
        out.append("|---|---|---|")
        for item in checks:
            figure = item["figure"]
            if figure is None:
                shown = "not measured"
            elif item["unit"] == "share":
                shown = f"{figure:.0%}"
            elif item["unit"] == "x":
                # More digits when two would round a miss onto its bound.
                digits = 4 if item["met"] is False and round(figure, 2) == item["bound"] else 2
                shown = f"{figure:.{digits}f}x"
            else:
                shown = f"{figure:.2f} {item['unit']}"
            if item["bound"] is None:
                met = "(context)"
            else:
                met = {True: "met", False: "**missed**", None: "-"}[item["met"]]
            out.append(f"| {item['target']} | {shown} | {met} |")
        out.append("")
    return "\n".join(out)

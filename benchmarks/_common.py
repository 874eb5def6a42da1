"""Helpers the benchmarks share (the process harness itself is tests/support's)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SRC_PATHS = [REPO / "client", REPO / "server", REPO / "proto" / "gen"]


def src_env() -> dict[str, str]:
    """This environment with this tree's sources (client, server, proto/gen) first on
    PYTHONPATH: the processes a benchmark starts run this tree's SDK and server, also when the
    benchmark runs from a copy of the repository with another tree's virtualenv."""
    env = dict(os.environ)
    src = os.pathsep.join(str(p) for p in SRC_PATHS)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (0 < q <= 100) of ascending `sorted_values`, in
    their unit; NaN when there are none."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, int(q / 100.0 * len(sorted_values) + 0.5) - 1))
    return float(sorted_values[index])


_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def rfc3339_s(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time with any number of fraction digits (ghz
    writes nanoseconds, which `datetime.fromisoformat` does not take)."""
    match = _RFC3339.match(text)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    whole, fraction, zone = match.groups()
    stamp = dt.datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    return stamp.timestamp() + (float("0." + fraction) if fraction else 0.0)


def longest_stall_ms(details: Sequence[dict[str, Any]]) -> float:
    """The longest time in which none of a ghz run's calls completed, in ms, from its
    `--format json` details (each call's start `timestamp` and `latency` in ns). With calls in
    flight, a stall far above the usual gap between completions is the server answering nothing
    at all for that long (a pause of its event loop, say); with one call in flight it is the
    slowest call. NaN without details."""
    if not details:
        return float("nan")
    starts = [rfc3339_s(d["timestamp"]) for d in details]
    ends = sorted(start + d["latency"] / 1e9 for start, d in zip(starts, details, strict=True))
    gaps = [ends[0] - min(starts), *(b - a for a, b in itertools.pairwise(ends))]
    return float(max(gaps)) * 1000.0


def proc_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), None if unknown or gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_times(pid: int) -> dict[str, tuple[str, float, float]]:
    """Each thread of `pid` as the scheduler counts it: thread id -> (name, seconds it ran,
    seconds it was ready to run but waited for a core). From /proc/PID/task/TID/schedstat; a
    thread that ended meanwhile is left out. Waiting means the host's cores were all busy: a
    server whose threads wait is CPU-bound, whatever each one's own share."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            ran, waited = parse_schedstat((task / "schedstat").read_text())
        except OSError:
            continue
        found[task.name] = (name, ran, waited)
    return found


def parse_schedstat(text: str) -> tuple[float, float]:
    """(seconds on a core, seconds waiting in the run queue) of a /proc schedstat line:
    three numbers, the first two in nanoseconds (the third, time slices, is not used)."""
    fields = text.split()
    if len(fields) != 3 or not all(field.isdigit() for field in fields):
        raise ValueError(f"not a schedstat line: {text!r}")
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


def fmt(x: float | None, digits: int = 2) -> str:
    """`x` with `digits` decimals; "-" for None or NaN."""
    if x is None or x != x:
        return "-"
    return f"{x:.{digits}f}"


def no_nan(obj: Any) -> Any:
    """`obj` with NaN/inf (e.g. a percentile of zero samples) as None, for strict JSON."""
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {str(k): no_nan(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [no_nan(v) for v in obj]
    return obj


def write_report(report: dict[str, Any], out: Path, load_start: Sequence[float]) -> None:
    """Write a benchmark's JSON report to `out` and say where, with the machine's load average at
    the start and now (the figures' context)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(no_nan(report), indent=2, default=str) + "\n")
    print(f"\nload average {load_start[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print(f"JSON: {out}")


def git_info() -> dict[str, Any]:
    """The commit, branch and whether tracked files differ from it (None where git fails)."""

    def run(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    status = run("status", "--porcelain", "--untracked-files=no")
    return {
        "sha": run("rev-parse", "HEAD"),
        "branch": run("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(status) if status is not None else None,
    }


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return v


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt meanwhile, so the cleanup of Ctrl-C runs for it too."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# --------------------------------------------------------------------------- servers' own counters


Sample = tuple[str, dict[str, str], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?\s*')


def parse_prometheus(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition: (name, labels, value) for each line that is
    neither blank nor a comment. Raises ValueError on a line that is not a sample."""
    samples: list[Sample] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"line {number} is not a Prometheus sample: {line[:200]!r}")
        name, label_text, value = match.groups()
        labels: dict[str, str] = {}
        if label_text:
            position = 0
            while position < len(label_text):
                label = _LABEL.match(label_text, position)
                if label is None:
                    raise ValueError(f"line {number}: bad labels {label_text[:200]!r}")
                raw = label.group(2)
                labels[label.group(1)] = (
                    raw.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
                )
                position = label.end()
        samples.append((name, labels, float(value)))
    return samples


def counter_by(
    samples: Sequence[Sample], name: str, label: str | None = None, **where: str
) -> dict[str, float]:
    """The sum of the samples called `name` whose labels match `where`, grouped by the value of
    `label` (one group called `name` when `label` is None; a sample without `label` counts
    under "")."""
    found: dict[str, float] = {}
    for sample_name, labels, value in samples:
        if sample_name != name or any(labels.get(k) != v for k, v in where.items()):
            continue
        key = name if label is None else labels.get(label, "")
        found[key] = found.get(key, 0.0) + value
    return found


def parse_mntr(text: str) -> dict[str, float]:
    """ZooKeeper's `mntr` answer (one `zk_name<TAB>value` a line) as numbers; the lines whose
    value is not a number (version, server state) are left out."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        try:
            found[key.strip()] = float(value)
        except ValueError:
            continue
    return found


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """`after - before` per key present in either (a key missing on one side counts 0), the
    keys that did not change left out."""
    keys = sorted(set(before) | set(after))
    deltas = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys}
    return {k: round(v, 3) for k, v in deltas.items() if v}

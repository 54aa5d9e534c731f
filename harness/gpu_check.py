"""The prepared GPU run: conformance on CUDA and the GPU-size benchmarks, in one call.

    PYTHONPATH=. python3 -m harness.gpu_check OUT_DIR [--backend NAME ...] [--quick]

Made for the lent H200 machine (torch 2.11, triton 3.6, nothing installable,
the project not installed): every step is a subprocess with this checkout on
``PYTHONPATH`` and the pytest plugin loaded with ``-p``, under its own time
limit, so one hung step cannot eat the lease. Full logs, the JUnit report and
the results JSON go to ``OUT_DIR``; a short table is printed last.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(name: str, command: list[str], out: Path, timeout: float) -> tuple[int, float]:
    """Run one step, its output teed to ``OUT_DIR/<name>.log``; returns (rc, seconds)."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    start = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        try:
            rc = subprocess.run(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\n[gpu_check] {name} stopped after {timeout:.0f} s\n")
            rc = 124
    return rc, time.monotonic() - start


def _environment(out: Path) -> str:
    import torch

    lines = [f"python {sys.version.split()[0]}, torch {torch.__version__}"]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(
            f"device {props.name}, {props.total_memory / 2**30:.0f} GiB, "
            f"{props.multi_processor_count} SMs, CUDA {torch.version.cuda}"
        )
    else:
        lines.append("no CUDA device visible")
    try:
        import triton

        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton not installed")
    text = "\n".join(lines)
    (out / "environment.txt").write_text(text + "\n")
    return text


def _conformance_counts(report: Path) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {}
    if not report.exists():
        return counts
    for case in ET.parse(report).iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        backend = props.get("backend") or "(no backend)"
        outcome = (
            "failed"
            if case.find("failure") is not None or case.find("error") is not None
            else "skipped"
            if case.find("skipped") is not None
            else "passed"
        )
        counts.setdefault(backend, Counter())[outcome] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for logs and results")
    parser.add_argument("--backend", action="append", default=[], help="default: the built-ins")
    parser.add_argument("--quick", action="store_true", help="kill profile, decode sweep only")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    backends = args.backend or ["reference", "sdpa"]
    env_text = _environment(out)
    profile = "kill" if args.quick else "ci"
    conform = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "suites.conformance",
        "-q",
        "-p",
        "attn_harness_pytest",
        "-p",
        "no:cacheprovider",
        "--conformance-device",
        "cuda",
        "--conformance-profile",
        profile,
        f"--junitxml={out / 'conformance.xml'}",
    ]
    for backend in backends:
        conform += ["--backend", backend]
    conform_rc, conform_s = _run("conformance", conform, out, timeout=240)
    results = out / "bench-cuda.json"
    bench = [
        sys.executable,
        "-m",
        "harness",
        "bench",
        "--device",
        "cuda",
        "--no-progress",
        "--workload",
        "decode-sweep",
        "--timeout",
        "90",
        "--out",
        str(results),
    ]
    if not args.quick:
        bench += ["--workload", "prefill-sweep"]
    for backend in backends:
        bench += ["--backend", backend]
    bench_rc, bench_s = _run("bench", bench, out, timeout=300)

    print(env_text)
    print(f"\nconformance ({profile} profile, cuda): exit {conform_rc}, {conform_s:.0f} s")
    for backend, counts in sorted(_conformance_counts(out / "conformance.xml").items()):
        print(
            f"  {backend:12} passed {counts['passed']:3}  failed {counts['failed']:3}  "
            f"skipped {counts['skipped']:3}"
        )
    print(f"\nbench (cuda): exit {bench_rc}, {bench_s:.0f} s")
    if results.exists():
        from harness.bench_cli import render
        from harness.results import load_results

        print(render(load_results(results)))
    else:
        print("  no results file; see bench.log")
    return 0 if conform_rc == 0 and bench_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

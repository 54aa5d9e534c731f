"""Shared fixtures for the harness's own unit tests."""

import pathlib
import sys

# Let the tests run from a plain checkout (no install), as on the GPU machine.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from harness.core.triton_mode import interpret_triton_here

# The unit tests run on the CPU: Triton kernels (the triton backend) run in its
# interpreter, which must be chosen before anything imports triton.
interpret_triton_here()


import os  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

DEPRECATED_PATHS = ("harness.contract", "harness.errors", "reference_backends.paged_base")
"""Moved modules kept to warn and re-export (``tests/test_backend_kit.py``): not loaded here."""


def _import_every_project_module() -> None:
    """Load every module of the library, the built-ins and the planted bugs up front.

    Hypothesis mixes literal constants of the loaded local modules into its draws,
    so a derandomized test's draws depend on what else the process has imported.
    Without this, which tests an xdist worker happened to run first would change
    what a later test draws (seen: a count of rare draws met alone, missed after
    two other test files). Loading everything first makes the set the same in
    every process.
    """
    import importlib
    import pkgutil

    for root in ("harness", "reference_backends", "suites.mutants"):
        package = importlib.import_module(root)
        for module in pkgutil.walk_packages(package.__path__, f"{root}."):
            if not module.name.endswith("__main__") and module.name not in DEPRECATED_PATHS:
                importlib.import_module(module.name)


_import_every_project_module()

if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    # One worker per core (-n auto): torch's own threads would only fight over the cores.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def variant_ratios() -> dict[tuple[str, str, str], float]:
    """``harness.numerics.discrimination.variant_table()``, once per test process.

    On one torch thread: the same figures as on two, and several times faster
    when other work shares a 2-core machine.
    """
    from harness.numerics.discrimination import variant_table

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return variant_table()
    finally:
        torch.set_num_threads(threads)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers it too; here so that --strict-markers holds without xdist
    config.addinivalue_line(
        "markers", "xdist_group(name): run on one xdist worker (nox -s tests: --dist loadgroup)"
    )


@pytest.fixture
def ratio_ci_by_hand():
    """The documented ratio interval re-derived by hand, to check the code against."""
    import statistics

    import numpy as np

    def ratio_ci_by_hand(top, bottom, confidence=0.95, resamples=2000, seed=0) -> list[float]:
        """The documented interval re-derived: both sample sets resampled on their own, one seed."""
        rng = np.random.default_rng(seed)
        top, bottom = np.asarray(top, dtype=float), np.asarray(bottom, dtype=float)
        tops = np.median(top[rng.integers(0, top.size, size=(resamples, top.size))], axis=1)
        bottoms = np.median(
            bottom[rng.integers(0, bottom.size, size=(resamples, bottom.size))], axis=1
        )
        tail = (1 - confidence) / 2 * 100
        low, high = np.percentile(tops / bottoms, [tail, 100 - tail])
        point = statistics.median(top) / statistics.median(bottom)
        return [min(float(low), point), max(float(high), point)]

    return ratio_ci_by_hand


def pytest_collection_finish(session: pytest.Session) -> None:
    """Say so when ``--dist loadgroup`` cannot group: the tests still pass, only slower.

    pytest-xdist groups a test by renaming its node id on the worker; a pytest that
    keeps node ids elsewhere drops the new name silently, and then every worker
    computes the shared fixtures (the kill matrix, the discrimination tables) itself.
    """
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist's workers
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rpartition("]")[2]
    ]
    if lost and os.environ.get("PYTEST_XDIST_WORKER") == "gw0":
        import warnings

        warnings.warn(
            pytest.PytestWarning(
                f"--dist loadgroup does not group on pytest {pytest.__version__} "
                f"({len(lost)} grouped tests, e.g. {lost[0]}): each worker computes the "
                "shared fixtures itself. Install with -c constraints.txt (pins pytest)."
            ),
            stacklevel=1,
        )


@pytest.fixture(autouse=True)
def _no_columns_from_xdist(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist sets ``COLUMNS=80`` in its workers; without it a test sees what a log
    or a pipe sees (no width asked). Tests about widths set ``COLUMNS`` themselves."""
    monkeypatch.delenv("COLUMNS", raising=False)


@dataclass
class Ran:
    """What a command printed and returned, as ``subprocess.CompletedProcess`` has it."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def conform(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``attn-harness conform ARGS`` run in this process: each run reads its own options."""
    from harness.cli.main import main

    monkeypatch.chdir(pathlib.Path(__file__).resolve().parents[1])

    def run(*args: str) -> Ran:
        capfd.readouterr()
        workers = [] if "--workers" in args else ["--workers", "1"]  # spread: tests that ask
        code = main(["conform", *workers, *args])
        out, err = capfd.readouterr()
        return Ran(code, out, err)

    return run

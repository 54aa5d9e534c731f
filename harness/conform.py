"""``attn-harness conform``: the conformance suite through pytest, with the CLI's exit codes.

The suite is ``suites.conformance`` run by pytest with this project's plugin,
exactly as ``pytest --pyargs suites.conformance --backend SPEC`` would run it;
this module only checks the arguments first and maps pytest's exit codes:
0 every property held; 1 a property failed or nothing could be checked;
2 a usage error (a spec that cannot be loaded, an unknown profile).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from attn_harness_pytest import PROFILES as PROFILE_NAMES
from harness.errors import BackendLoadError
from harness.registry import default_registry

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def pytest_arguments(
    specs: Sequence[str],
    profile: str,
    junitxml: str | None,
    extra: Sequence[str] = (),
    device: str = "cpu",
) -> list[str]:
    # This process imported the plugin to check the profile name; pytest would warn that
    # it can no longer rewrite the plugin's (assert-free) module.
    args = [
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--pyargs",
        "suites.conformance",
        "-p",
        "attn_harness_pytest",
        "-p",
        "no:cacheprovider",
        "--conformance-profile",
        profile,
        "--conformance-device",
        device,
    ]
    for spec in specs:
        args += ["--backend", spec]
    if junitxml:
        args += ["--junitxml", junitxml]
    return args + list(extra)


def usage_problem(specs: Sequence[str], profile: str, device: str = "cpu") -> str | None:
    """Why these arguments cannot run, checked before pytest starts."""
    if profile not in PROFILE_NAMES:
        return f"unknown profile {profile!r}; choose from {', '.join(PROFILE_NAMES)}"
    if device not in ("cpu", "cuda"):
        return f"unknown device {device!r}; choose cpu or cuda"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "--device cuda: no CUDA device is available"
    registry = default_registry()
    for spec in specs:
        try:
            registry.resolve(spec)
        except (BackendLoadError, KeyError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            return f"--backend {spec}: {message}"
    return None


def run_conformance(
    specs: Sequence[str],
    profile: str = "ci",
    junitxml: str | None = None,
    extra: Sequence[str] = (),
    device: str = "cpu",
) -> int:
    problem = usage_problem(specs, profile, device)
    if problem is not None:
        print(f"attn-harness conform: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    import pytest

    code = int(pytest.main(pytest_arguments(specs, profile, junitxml, extra, device)))
    if code == pytest.ExitCode.OK:
        return EXIT_OK
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("attn-harness conform: nothing could be checked (no test ran)", file=sys.stderr)
        return EXIT_FAILED
    if code == pytest.ExitCode.TESTS_FAILED:
        return EXIT_FAILED
    return EXIT_USAGE if code == pytest.ExitCode.USAGE_ERROR else EXIT_FAILED

"""``attn-harness conform``: the conformance suite through pytest, isolated, with its own report.

The suite is ``suites.conformance`` (as a path: the package's folder) run
by pytest with this project's plugin.
The run is isolated from the caller's pytest set-up: no ``pytest.ini`` /
``pyproject.toml`` / ``conftest.py`` of the current folder, no
``PYTEST_ADDOPTS``, no plugins installed for other projects (unless
``user_plugins``), no cache folder, and hypothesis keeps its files outside
the current folder. Exit codes: 0 every property held; 1 a property failed,
nothing could be checked, or a backend cannot even be built; 2 a usage error
(a spec that cannot be loaded, an unknown profile or pytest option); 130
interrupted (no report file is left behind). How the verdict is reached:
``docs/conformance.md``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from harness.conformance.plugin_names import PROFILE_NAMES
from harness.core.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

_VERBOSE = ("-v", "-vv", "-vvv", "--verbose", "--full-trace", "-r", "--tb")
_ISOLATED_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")


def suite_root() -> Path:
    """The folder holding the ``suites`` package: the run's rootdir (checkout or site-packages).

    Found, not imported: the library runs the suite's files and uses none of its code.
    """
    spec = importlib.util.find_spec("suites")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the conformance suite (the package `suites`) is not installed")
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def suite_modules() -> set[str]:
    """Every test module of ``suites.conformance``, by its dotted name."""
    folder = suite_root() / "suites" / "conformance"
    return {f"suites.conformance.{path.stem}" for path in folder.glob("test_*.py")}


def wants_pytest_output(extra: Sequence[str]) -> bool:
    """Whether pytest arguments ask for pytest's own report (verbosity, tracebacks)."""
    return any(arg == flag or arg.startswith(f"{flag}=") for arg in extra for flag in _VERBOSE)


def pytest_arguments(
    specs: Sequence[str],
    profile: str,
    junitxml: str | None,
    extra: Sequence[str] = (),
    device: str = "cpu",
    *,
    pytest_output: bool = False,
    replay: str | None = None,
    user_plugins: bool = False,
    coverage_json: str | None = None,
    workers: int = 1,
    shard: str | None = None,
) -> list[str]:
    from harness.conformance.workers import xdist_arguments

    root = suite_root()
    # This process imported the plugin to check the profile name; pytest would warn that
    # it can no longer rewrite the plugin's (assert-free) module.
    args = [
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        str(root / "suites" / "conformance"),  # a path, so no conftest.py of the cwd loads
        "-c",
        str(root / "suites" / "conformance" / "isolated.ini"),  # none of the caller's
        "--rootdir",
        str(root),
        "--confcutdir",
        str(root / "suites"),  # no conftest.py above the suite
        "-p",
        "attn_harness_pytest",
        "-p",
        "no:cacheprovider",
        "--conformance-cli",
        "--conformance-output",
        "pytest" if pytest_output else "compact",
        "--conformance-profile",
        profile,
        "--conformance-device",
        device,
    ]
    if not user_plugins:  # plugin autoloading is off: load hypothesis's own explicitly
        args += ["-p", "_hypothesis_pytestplugin"]
    for spec in specs:
        args += ["--backend", spec]
    if junitxml:
        args += ["--junitxml", junitxml]
    if coverage_json:
        args += ["--coverage-json", coverage_json]
    if replay:
        args += ["--replay", replay]
    if shard:
        args += ["--shard", shard]
    return args + xdist_arguments(workers) + list(extra)


def usage_problem(
    specs: Sequence[str], profile: str, device: str = "cpu", workers: int = 1
) -> str | None:
    """Why these arguments cannot run, checked before pytest starts."""
    if workers < 1:
        return f"--workers must be at least 1, got {workers}"
    if workers > 1:
        from harness.conformance.workers import xdist_available

        if not xdist_available():
            return (
                f"--workers {workers} needs pytest-xdist (python -m pip install pytest-xdist); "
                "--workers 1 runs every test in this process"
            )
    if profile not in PROFILE_NAMES:
        return f"unknown profile {profile!r}; choose from {', '.join(PROFILE_NAMES)}"
    if device not in ("cpu", "cuda"):
        return f"unknown device {device!r}; choose cpu or cuda"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "--device cuda: no CUDA device is available"
    from harness.core.errors import BackendLoadError
    from harness.core.registry import default_registry

    registry = default_registry()
    for spec in specs:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # a chatty module keeps our output
                registry.resolve(spec)
        except (BackendLoadError, KeyError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            return f"--backend {spec}: {message}"
    return None


def construction_problem(specs: Sequence[str]) -> str | None:
    """A backend that raises when built with valid arguments: every property would fail alike."""
    from harness.core.errors import Unsupported
    from harness.core.registry import HeadConfig, default_registry

    registry = default_registry()
    entries = [registry.resolve(s) for s in specs] if specs else registry.entries()
    for entry in entries:
        try:
            head_dims = entry.capabilities.head_dims
        except Exception:  # a bad capabilities() fails inside the suite, with its own message
            continue
        head_dim = head_dims[0] if head_dims else 16
        kwargs = HeadConfig(
            num_heads=2, num_kv_heads=1, head_dim=head_dim, scale=head_dim**-0.5
        ).kwargs()
        try:
            with contextlib.redirect_stdout(sys.stderr):
                entry.cls(**kwargs)
        except Unsupported:
            continue  # outside its claim: the suite draws only what it claims
        except Exception as exc:
            shown = ", ".join(
                f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in kwargs.items()
            )
            return (
                f"backend {entry.name!r} cannot be built with valid arguments ({shown}): "
                f"{type(exc).__name__}: {exc}"
            )
    return None


@contextlib.contextmanager
def isolated_environment(user_plugins: bool) -> Iterator[None]:
    """No ``PYTEST_ADDOPTS``/``PYTEST_PLUGINS`` and no plugin autoloading, unless asked."""
    saved = {k: os.environ.get(k) for k in (*_ISOLATED_ENV, "PYTEST_DISABLE_PLUGIN_AUTOLOAD")}
    if not user_plugins:
        for key in _ISOLATED_ENV:
            os.environ.pop(key, None)
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def fresh_suite_modules() -> Iterator[None]:
    """The suite's modules imported anew for this run, and the caller's restored after it.

    The suite's tests take their hypothesis settings from the run's profile
    when their modules are imported; a second run in one process (a caller
    that runs ``attn-harness conform`` twice, a test of this runner) must not
    reuse modules made for the first run's options.
    """
    suite = ("suites.conformance", "suites.conformance.")
    saved = {name: module for name, module in sys.modules.items() if name.startswith(suite)}
    for name in saved:
        del sys.modules[name]
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n.startswith(suite)]:
            del sys.modules[name]
        sys.modules.update(saved)


def one_line(error: BaseException) -> str:
    """pytest's usage error (usage text, then ``prog: error: ...``) as its one telling line."""
    lines = str(error.args[0] if error.args else error).splitlines()
    for line in lines:
        if ": error: " in line:
            return line.split(": error: ", 1)[1] + " (arguments after -- go to pytest)"
    return lines[0] if lines else type(error).__name__


def run_pytest(args: list[str]) -> int:
    """``pytest.main(args)``, but a usage error comes back as one line on stderr.

    Mirrors ``pytest.main`` (prepare the config, run the session, unconfigure);
    ``_prepareconfig`` is private, so a pytest without it falls back to
    ``pytest.main`` and its multi-line usage message.
    """
    import pytest

    try:
        from _pytest.config import _prepareconfig
    except ImportError:  # pragma: no cover - a future pytest
        return int(pytest.main(args))
    try:
        config = _prepareconfig(args)
        try:
            return int(config.hook.pytest_cmdline_main(config=config))
        finally:
            config._ensure_unconfigure()
    except pytest.UsageError as exc:
        print(f"attn-harness conform: error: {one_line(exc)}", file=sys.stderr)
        return int(pytest.ExitCode.USAGE_ERROR)


def _partial(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial")


def run_conformance(
    specs: Sequence[str],
    profile: str = "ci",
    junitxml: str | None = None,
    extra: Sequence[str] = (),
    device: str = "cpu",
    *,
    verbose: bool = False,
    replay: str | None = None,
    user_plugins: bool = False,
    workers: int = 1,
    shard: str | None = None,
) -> int:
    """Run the suite; ``workers`` processes share its tests (a replay always runs in one);
    ``shard`` (``K/N``) runs that share of them, leaving files for ``attn-harness merge``."""
    if replay:
        workers = 1
    if device == "cpu":  # before any backend module (which may import triton) is loaded
        from harness.core.triton_mode import interpret_triton_here

        interpret_triton_here()
    problem = usage_problem(specs, profile, device, workers)
    if problem is None and shard and not junitxml:
        problem = f"--shard {shard} needs --junitxml FILE: the shard's files are what merge reads"
    if problem is None and shard and replay:
        problem = "--replay reruns one example: it takes no --shard"
    if problem is None and junitxml:
        from harness.core.atomic_file import unwritable_reason

        unwritable = unwritable_reason(junitxml)
        problem = f"--junitxml {junitxml}: {unwritable}" if unwritable else None
    if problem is not None:
        print(f"attn-harness conform: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    broken = construction_problem(specs)
    if broken is not None:
        print(f"attn-harness conform: FAILED: {broken}", file=sys.stderr)
        return EXIT_FAILED
    import pytest

    # Reports go to a hidden file first and take their name only when the run finished.
    junit = Path(junitxml) if junitxml else None
    coverage = None
    if junit is not None and "--coverage-json" not in extra:
        coverage = str(junit.with_suffix(".coverage.json"))
    if verbose and not wants_pytest_output(extra):
        extra = ["-v", *extra]
    args = pytest_arguments(
        specs,
        profile,
        str(_partial(junit)) if junit else None,
        extra,
        device,
        pytest_output=verbose or wants_pytest_output(extra),
        replay=replay,
        user_plugins=user_plugins,
        coverage_json=coverage,
        workers=workers,
        shard=shard,
    )
    try:
        with isolated_environment(user_plugins), fresh_suite_modules():
            code = run_pytest(args)
    except KeyboardInterrupt:
        code = int(pytest.ExitCode.INTERRUPTED)
    finished = code not in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR)
    if junit is not None and _partial(junit).exists():
        if finished:
            os.replace(_partial(junit), junit)
        else:
            _partial(junit).unlink()
    if code == pytest.ExitCode.OK:
        return EXIT_OK
    if code == pytest.ExitCode.INTERRUPTED:
        return EXIT_INTERRUPTED
    if code == pytest.ExitCode.USAGE_ERROR:
        return EXIT_USAGE
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("attn-harness conform: nothing could be checked (no test ran)", file=sys.stderr)
    return EXIT_FAILED

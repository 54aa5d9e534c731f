"""Process-level state mutants: one plan per step, shared by instances configured differently.

Engines plan a step once for every layer (FlashInfer's wrappers take the
window, soft-cap and scale at ``plan()`` time). Each class below keeps such a
plan per metadata object, made from the configuration of the first (or the
last) instance prepared on it, and every instance attends with the plan's
values of the fields it names (``PLANNED``) instead of its own. An instance
alone, or several each prepared on its own metadata, is exact; instances
configured differently and prepared on one step's metadata are not
(``harness.conformance.instances``). The thread of each is in its ``Source:`` line.
"""

from __future__ import annotations

import weakref
from dataclasses import replace
from typing import Any, ClassVar

import torch

from harness.core.contract import AttentionMetadata, LayerCache
from harness.core.paged_base import PreparedStep
from reference_backends.reference import ReferenceBackend


class _PlannedOncePerStep(ReferenceBackend):
    """A plan per metadata object; the fields in ``PLANNED`` come from it, not the instance."""

    PLANNED: ClassVar[tuple[str, ...]] = ()  # "scale", or ``AttentionVariant`` fields
    LAST_PLAN_WINS: ClassVar[bool] = False  # True: each prepare overwrites the step's plan
    plans: ClassVar[weakref.WeakKeyDictionary[AttentionMetadata, dict[str, Any]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.plans = weakref.WeakKeyDictionary()  # one per class, freed with each step

    def _configuration(self) -> dict[str, Any]:
        return {
            name: self.scale if name == "scale" else getattr(self.variant, name)
            for name in self.PLANNED
        }

    def prepare(self, metadata: AttentionMetadata, graph_mode: bool = False) -> None:
        super().prepare(metadata, graph_mode=graph_mode)
        if self.LAST_PLAN_WINS or metadata not in self.plans:
            self.plans[metadata] = self._configuration()
        self._planned_on = metadata

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        plan = dict(self.plans[self._planned_on])
        own = (self.scale, self.variant)
        self.scale = plan.pop("scale", self.scale)
        self.variant = replace(self.variant, **plan)
        try:
            return super().attend_with_lse(query, cache, step)
        finally:
            self.scale, self.variant = own


class WindowPlannedOncePerStep(_PlannedOncePerStep):
    """Every layer attends with the sliding window of the first layer planned for the step.

    Source: vllm-project/vllm#51756 (Gemma-3's window taken from the KV cache group, not the
    layer: the global layers lost every key older than the window); sgl-project/sglang#31501
    (the sliding-window prefill wrapper planned without ``window_left``).
    Regime: instances with different windows (or one with none) prepared on one step.
    """

    PLANNED = ("sliding_window",)


class SoftCapPlannedOncePerStep(_PlannedOncePerStep):
    """Every layer attends with the logits soft-cap of the first layer planned for the step.

    Source: sgl-project/sglang#33915 (``logits_soft_cap`` is fixed at ``plan()`` time but was
    passed only to ``forward()``, so Gemma-2 and Grok ran uncapped).
    Regime: instances with different soft-caps (or one with none) prepared on one step.
    """

    PLANNED = ("logits_soft_cap",)


class ScalePlannedOncePerStep(_PlannedOncePerStep):
    """Every layer attends with the softmax scale of the first layer planned for the step.

    Source: vllm-project/vllm#11194 (FlashInfer 0.2 plans ``sm_scale``, ``window_left`` and
    ``logits_soft_cap`` once per step, so vLLM requires every layer to share them:
    ``infer_global_hyperparameters``).
    Regime: instances with different scales prepared on one step.
    """

    PLANNED = ("scale",)


class SinksPlannedByFirstLayer(_PlannedOncePerStep):
    """Every layer attends with the sinks of the first layer planned for the step.

    Source: vllm-project/vllm#22678 (``has_sinks`` joined the per-layer parameters, and
    ``infer_global_hyperparameters`` takes ``param_sets[0]``: the first layer decides).
    Regime: instances with different sinks (or one with none) prepared on one step.
    """

    PLANNED = ("sinks",)


class KvScalesFromLastPlan(_PlannedOncePerStep):
    """Every layer reads its FP8 cache with the k/v scales of the last layer planned.

    Source: vllm-project/vllm#11194 (a reviewer asked that ``k_scale`` and ``v_scale`` join
    the parameters every layer must share); sgl-project/sglang#32625 ("the last plan
    overwrote the shared planner state").
    Regime: FP8 caches whose instances have different scales, prepared on one step: each
    writes with its own scales and reads with the last instance's.
    """

    PLANNED = ("k_scale", "v_scale")
    LAST_PLAN_WINS = True


STATE_MUTANTS: tuple[type, ...] = (
    WindowPlannedOncePerStep,
    SoftCapPlannedOncePerStep,
    ScalePlannedOncePerStep,
    SinksPlannedByFirstLayer,
    KvScalesFromLastPlan,
)

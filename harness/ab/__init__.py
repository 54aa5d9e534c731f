"""Paired A/B comparison of two revisions of a backend on one machine (``attn-harness ab``).

``sequential`` decides each case from its paired per-round ratios, ``sides``
says where each side's backend comes from (a spec, a git revision of the
project), ``worker`` is one side's process, ``rounds`` interleaves the two,
``record`` is the results document. How to use it: ``docs/ab.md``.
"""

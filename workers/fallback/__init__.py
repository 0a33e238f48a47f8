"""Graceful degradation (issue 26): a fallback chain per model, tried when the model cannot
answer, and answers marked ``degraded`` so nobody mistakes them for the model's.

``chain``: the pure grammar of ``--fallback`` and ``--degrade-on`` and the start-up checks;
``answers``: degraded and fail-closed answers (pure); ``steps``: running a chain's steps
over jobs; ``policy``: the ``error`` trigger, wrapped around the failure policy;
``middleware``: ``Degrade``, which owns the rest (start-up checks, the ``breaker`` trigger,
the start/end log lines, the counts). See docs/degradation.md.
"""

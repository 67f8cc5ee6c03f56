"""Verifiable math rewards: answer extraction, normalisation, equivalence, batch scoring.

Host-side only (no JAX). The usual entry point is `RewardScorer`::

    from da3po_jax.rewards import RewardScorer

    with RewardScorer(num_workers=4, timeout_s=5.0) as scorer:
        batch = scorer.score_batch(responses, references)
    batch.rewards, batch.stats  # [1.0, 0.0, ...], {"ok": 7, "no_answer": 1, ...}

The verifiers are registered by name (`verifiers.py: VERIFIERS`, `register_verifier`).

Model output is never evaluated as code: answers are parsed by a whitelist parser
(`latex.parse_math`), and the only slow stage (sympy) runs in worker processes that are killed
at a hard per-response timeout.
"""

from da3po_jax.rewards.extract import (
    FALLBACKS,
    extract_answer,
    extract_answer_line,
    extract_boxed,
    extract_boxes,
    extract_reference,
    last_expression,
)
from da3po_jax.rewards.latex import ParseError, eval_rational, parse_math
from da3po_jax.rewards.normalize import normalize_answer
from da3po_jax.rewards.numeric import parse_number
from da3po_jax.rewards.scorer import (
    STATUSES,
    VERIFIERS,
    BatchScores,
    RewardScorer,
    ScoreResult,
    score_batch,
)
from da3po_jax.rewards.verifiers import (
    Verifier,
    register_verifier,
    unregister_verifier,
    verifier_names,
)
from da3po_jax.rewards.verify import (
    fast_verdict,
    is_equivalent,
    split_sequence,
    symbolic_equal,
    symbolic_equations_equal,
)

__all__ = [
    "FALLBACKS",
    "STATUSES",
    "VERIFIERS",
    "BatchScores",
    "ParseError",
    "RewardScorer",
    "ScoreResult",
    "Verifier",
    "eval_rational",
    "extract_answer",
    "extract_answer_line",
    "extract_boxed",
    "extract_boxes",
    "extract_reference",
    "fast_verdict",
    "is_equivalent",
    "last_expression",
    "normalize_answer",
    "parse_math",
    "parse_number",
    "register_verifier",
    "score_batch",
    "split_sequence",
    "symbolic_equal",
    "symbolic_equations_equal",
    "unregister_verifier",
    "verifier_names",
]

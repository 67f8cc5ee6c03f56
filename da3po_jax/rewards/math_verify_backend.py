"""Optional Math-Verify backend (`reward.verifier = "math_verify"`).

`math_verify_equivalent` checks an extracted answer against a reference with the Math-Verify
package (`pip install math-verify`) instead of the built-in verifier. It is meant to run as a
`RewardScorer` `verify_fn`, that is inside the scorer's worker processes: Math-Verify parses
LaTeX with an ANTLR grammar and sympy, which can be slow on adversarial input, so the
scorer's hard per-response timeout (a killed worker) bounds it. Math-Verify's own timeouts are
switched off (`parsing_timeout=None`, `timeout_seconds=None`): they use `signal.alarm`, which
only works in a process's main thread, and ours already covers the whole call.

Both sides are wrapped in `\\boxed{}` before parsing, so that Math-Verify reads them as one
final answer each (the scorer has already extracted the answer from the response).
"""

from __future__ import annotations

import importlib.util
import logging

__all__ = ["INSTALL_HINT", "math_verify_equivalent", "require_math_verify"]

INSTALL_HINT = (
    "reward.verifier=math_verify needs the Math-Verify package: "
    'pip install "math-verify>=0.9" (or pip install -e ".[verify]")'
)


def require_math_verify() -> None:
    """Raises ImportError with the install command if Math-Verify is not installed.

    Checked in the parent process when the scorer is built, so that a missing package is a
    clear configuration error at start-up, not a worker crash at the first batch.
    """
    if importlib.util.find_spec("math_verify") is None:
        raise ImportError(INSTALL_HINT)


def _quiet() -> None:
    """Silences Math-Verify's one-time warning that its timeout is disabled (on purpose)."""
    for name in ("math_verify", "math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)


def math_verify_equivalent(pred: str, ref: str) -> bool:
    """Whether Math-Verify finds the answer `pred` equivalent to the reference `ref`.

    Args:
      pred: the extracted model answer (at most the scorer's `MAX_ANSWER_CHARS`).
      ref: the reference answer.

    Returns:
      Math-Verify's verdict; False if either side does not parse.
    """
    from math_verify import parse, verify

    _quiet()
    gold = parse("\\boxed{" + ref + "}", parsing_timeout=None)
    answer = parse("\\boxed{" + pred + "}", parsing_timeout=None)
    if not gold or not answer:
        return False
    return bool(verify(gold, answer, timeout_seconds=None))

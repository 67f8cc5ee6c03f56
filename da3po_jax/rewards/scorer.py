"""Batch reward scoring with a hard per-response timeout in killable worker processes.

`RewardScorer.score_batch(responses, references)` reads each distinct reference's final
answer (`extract_reference`: the last box, `Answer:` line, `The answer is ...` or `#### 72` of
a worked solution, the content of a reference written as `$...$`; a bare answer as it is; a
list of such strings, OlympiadBench's `final_answer`, as the unordered list of their answers),
extracts each response's final answer (`extract_answer`, with the `fallback` to the last math
expression of a response that states none; when the reference is a set of several answers and
the final answer is the last of several boxes, all the boxes together, `extract_boxes`), then
decides equivalence with the reference's answer:

* an answer equal to the reference's up to whitespace is correct first, whatever its size
  (a 5,000-digit integer that is the reference scores correct, with no parsing); with a
  custom `verify_fn` that function decides alone;
* a response longer than `MAX_RESPONSE_CHARS`, or whose answer is longer than
  `MAX_ANSWER_CHARS` and not the reference's, scores `incorrect_reward` with status
  "no_answer" (no usable answer) before any parsing;
* in the parent process, with the cheap bounded stages (`fast_verdict`: normalised string
  match, exact numbers, rational arithmetic): most answers are decided here without IPC;
* otherwise in a worker process running the full check with sympy (`is_equivalent`), under
  a hard timeout: a worker that runs past `timeout_s` is killed (SIGKILL) and replaced, and
  its response scores `incorrect_reward` with status "timeout". A worker that crashes scores
  status "error". Identical (answer, reference) pairs in a batch are checked once.

With `verifier="math_verify"` every extracted answer is checked by Math-Verify
(`math_verify_backend`) in the workers instead, under the same timeout and with no parent
fast path. The verifiers are registered by name in `verifiers.py: VERIFIERS` (a factory
each, called when the scorer is built).

What bounds the work on model output. The parent process has no timeout (it runs JAX and
cannot interrupt itself), so everything it does with a response is linear in bounded sizes:

* extraction (`extract_answer`) is a few scans, most at C speed (`rfind`, `count`, regexes
  without nested quantifiers), over at most `MAX_RESPONSE_CHARS` characters; the brace scan
  of a box and the search for the end of a math span stop after `MAX_ANSWER_CHARS`
  characters (or twice the reference's length, for an exact match past the cap); the exact
  comparison is one linear whitespace squash of each side;
* normalisation and `fast_verdict` only ever see an answer of at most `MAX_ANSWER_CHARS`
  characters, and every step of them is linear (brace matching in one pass with a stack,
  text groups unwrapped in one pass) or capped further (the parser at `latex.MAX_CHARS`,
  numbers at `numeric.MAX_DIGITS`, tuples at `verify.MAX_SEQUENCE_CHARS`); so an answer costs
  at most a few milliseconds in the parent, whatever it contains;
* sympy (`is_equivalent`, which also repeats the normalisation) runs only in the workers,
  under the hard `timeout_s` limit. A custom `verify_fn` also runs only there.

References are trusted data and are not capped (their normalisation is linear too).

Why processes that we manage ourselves, not `concurrent.futures.ProcessPoolExecutor`: an
executor cannot cancel a running task, so one hung `sympy.simplify` would hold a worker
forever; and signal-based timeouts (`signal.alarm`) only work in the main thread and cannot
interrupt C code. Workers start with the `forkserver` method by default (never `fork`: the
parent runs multithreaded JAX), ignore SIGINT (the parent owns shutdown), cap their address
space (`memory_limit_mb` above what they use after start-up) and exit when the parent goes.

The scorer is not thread-safe; use one per thread. Workers start lazily on the first batch
that needs sympy and stay up until `close()` (or the end of a `with` block). As with any
non-`fork` start method, a script that scores at import time must guard its entry point with
`if __name__ == "__main__":` (the forkserver imports the main module).
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
import weakref
from collections.abc import Sequence
from typing import Any

from da3po_jax.rewards.extract import FALLBACKS, extract_answer, extract_boxes, extract_reference
from da3po_jax.rewards.normalize import normalize_answer, squash_whitespace
from da3po_jax.rewards.verifiers import (
    VERIFIERS,
    Verifier,
    VerifyFn,
    custom_verifier,
    verifier_names,
)
from da3po_jax.rewards.verify import fast_verdict, is_equivalent, split_sequence

__all__ = [
    "FALLBACKS",
    "MAX_ANSWER_CHARS",
    "MAX_RESPONSE_CHARS",
    "STATUSES",
    "VERIFIERS",
    "BatchScores",
    "RewardScorer",
    "ScoreResult",
    "score_batch",
]

STATUSES = ("ok", "no_answer", "timeout", "error")
# A longer extracted answer is no answer ("no_answer"): real final answers are far shorter,
# and every string stage past this size (parser, numbers, tuples) gives up anyway.
MAX_ANSWER_CHARS = 4_096
# A longer response is not scanned at all ("no_answer"): about 500k tokens, far beyond any
# generation budget; extraction of this much text takes well under a second.
MAX_RESPONSE_CHARS = 2_000_000
_Task = tuple[int, str, str]  # (task id, extracted answer, reference)
_Reference = str | tuple[str, ...]  # one reference answer, or several (an unordered list)


@dataclasses.dataclass(frozen=True)
class ScoreResult:
    """The score of one response.

    Attributes:
      correct: whether the extracted answer is equivalent to the reference.
      reward: `correct_reward` if correct else `incorrect_reward`.
      extracted: the extracted final answer (several boxes joined with ", " when the
        reference is a set of answers), or None if there is none (or it is past the size
        caps).
      status: "ok" (verification finished), "no_answer" (nothing extracted, or the response
        or its answer is past `MAX_RESPONSE_CHARS` / `MAX_ANSWER_CHARS`), "timeout"
        (verification ran past the time limit) or "error" (verification crashed).
    """

    correct: bool
    reward: float
    extracted: str | None
    status: str


@dataclasses.dataclass(frozen=True)
class BatchScores:
    """Scores of a batch, in input order, and counters.

    Attributes:
      results: one `ScoreResult` per response, in input order.
      stats: counts of each status in `STATUSES`, plus "correct", "total", "symbolic"
        (distinct pairs sent to worker processes) and "worker_restarts".
    """

    results: list[ScoreResult]
    stats: dict[str, int]

    @property
    def rewards(self) -> list[float]:
        """The reward of each response, in input order."""
        return [r.reward for r in self.results]

    @property
    def correct(self) -> list[bool]:
        """Whether each response is correct, in input order."""
        return [r.correct for r in self.results]


def _limit_memory(memory_limit_mb: int | None) -> None:
    """Caps the address space at the current size plus `memory_limit_mb` (Linux only)."""
    if not memory_limit_mb:
        return
    try:
        import resource

        with open("/proc/self/status") as f:
            vm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
        limit = (vm_kb * 1024) + memory_limit_mb * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError, StopIteration, ImportError):
        pass  # best effort: the timeout still bounds the damage


def _worker_main(
    conn: Any, verify_fn: VerifyFn | None, warm_up: bool, memory_limit_mb: int | None
) -> None:
    """Worker loop: answers `(task_id, pred, ref)` with `(task_id, status, correct)`
    (`verify_fn` None: sympy's `is_equivalent`; `warm_up`: `Verifier.warm_up`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if verify_fn is None:
        verify_fn = is_equivalent
    if warm_up:  # imports and warms up the verifier (sympy) before reporting ready
        verify_fn("\\sqrt{2}+x", "x+\\sqrt{3}")
    _limit_memory(memory_limit_mb)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        task_id, pred, ref = task
        try:
            reply = (task_id, "ok", bool(verify_fn(pred, ref)))
        except Exception:  # includes RecursionError and MemoryError (address-space cap)
            reply = (task_id, "error", False)
        conn.send(reply)


class _Worker:
    """One worker process, its pipe, and the task it is running (if any)."""

    def __init__(
        self,
        ctx: Any,
        verifier: Verifier,
        memory_limit_mb: int | None,
        startup_timeout_s: float,
    ):
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=_worker_main,
            args=(child_conn, verifier.verify_fn, verifier.warm_up, memory_limit_mb),
            daemon=True,
            name="da3po-reward-worker",
        )
        self.proc.start()
        child_conn.close()
        self.ready = False
        self.task: _Task | None = None
        self.deadline = time.monotonic() + startup_timeout_s

    @property
    def waiting(self) -> bool:
        return not self.ready or self.task is not None

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.join(timeout=5)
        except (OSError, ValueError, AttributeError):
            pass
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=1)
        if self.proc.is_alive():
            self.kill()
        else:
            self.conn.close()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        w.stop()
    workers.clear()


class _Pool:
    """A fixed number of workers with hard per-task deadlines; dead workers are replaced."""

    def __init__(
        self,
        num_workers: int,
        verifier: Verifier,
        start_method: str,
        memory_limit_mb: int | None,
        startup_timeout_s: float,
    ):
        self.ctx = multiprocessing.get_context(start_method)
        self.num_workers = num_workers
        self.verifier = verifier
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout_s = startup_timeout_s
        self.workers: list[_Worker] = []
        self.restarts = 0
        self.startup_failures = 0

    def _spawn(self) -> None:
        self.workers.append(
            _Worker(self.ctx, self.verifier, self.memory_limit_mb, self.startup_timeout_s)
        )

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self.workers.remove(w)
        self.restarts += 1
        if not w.ready:
            self.startup_failures += 1
            if self.startup_failures > 2 * self.num_workers + 2:
                raise RuntimeError("reward worker processes keep failing to start")
        self._spawn()

    def _dispatch(self, w: _Worker, pending: collections.deque, timeout_s: float) -> None:
        task = pending.popleft()
        try:
            w.conn.send(task)
        except (OSError, ValueError):
            pending.appendleft(task)  # the worker died while idle: not the task's fault
            self._replace(w)
            return
        w.task = task
        w.deadline = time.monotonic() + timeout_s

    def _receive(self, w: _Worker, out: dict[int, tuple[str, bool]]) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            if w.task is not None:
                out[w.task[0]] = ("error", False)
            self._replace(w)
            return
        if msg[0] == "ready":
            w.ready, w.deadline = True, float("inf")
            self.startup_failures = 0
        elif w.task is not None and msg[0] == w.task[0]:
            out[msg[0]] = (msg[1], bool(msg[2]))
            w.task, w.deadline = None, float("inf")

    def run(self, tasks: list[_Task], timeout_s: float) -> dict[int, tuple[str, bool]]:
        """Runs every task; returns {task id: (status, correct)}."""
        out: dict[int, tuple[str, bool]] = {}
        pending = collections.deque(tasks)
        while len(self.workers) < min(self.num_workers, len(tasks)):
            self._spawn()
        while len(out) < len(tasks):
            for w in list(self.workers):
                if w.ready and w.task is None and pending:
                    self._dispatch(w, pending, timeout_s)
            waiting = [w for w in self.workers if w.waiting]
            assert waiting, "unfinished tasks but no busy or starting worker"
            wait_s = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
            ready = multiprocessing.connection.wait([w.conn for w in waiting], timeout=wait_s)
            for w in waiting:
                if w.conn in ready:
                    self._receive(w, out)
            now = time.monotonic()
            for w in [w for w in self.workers if w.waiting and w.deadline <= now]:
                if w.task is not None:
                    out[w.task[0]] = ("timeout", False)
                self._replace(w)
        return out


class RewardScorer:
    """Scores responses against reference answers (see the module docstring).

    Args:
      num_workers: worker processes for the symbolic stage.
      timeout_s: hard limit in seconds for one symbolic check in a worker.
      correct_reward: reward of a correct response.
      incorrect_reward: reward of any other response (wrong, no answer, timeout, error).
      verify_fn: optional custom `(answer, reference) -> bool`, a picklable module-level
        function. When given it replaces the math check entirely (no parent fast path):
        every extracted answer goes to a worker.
      verifier: a name registered in `verifiers.py: VERIFIERS`: "builtin" (this package's
        verifier: fast path in the parent, sympy in the workers) or "math_verify"
        (Math-Verify in the workers for every answer, under the same timeout; needs
        `pip install math-verify`). Ignored when `verify_fn` is given.
      start_method: multiprocessing start method: "forkserver" or "spawn" ("fork" is unsafe
        with JAX's threads).
      memory_limit_mb: address space a worker may add after start-up; None for no limit.
      startup_timeout_s: time a new worker may take to import and warm up.
      fallback: "last_expression" (a response with no box, `Answer:` line or `answer is`
        phrase answers with its last math expression or number) or "none" (it has no
        answer). See `extract.extract_answer`.
    """

    def __init__(
        self,
        *,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        verify_fn: VerifyFn | None = None,
        start_method: str = "forkserver",
        memory_limit_mb: int | None = 2048,
        startup_timeout_s: float = 120.0,
        verifier: str = "builtin",
        fallback: str = "last_expression",
    ):
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        if verifier not in VERIFIERS:
            raise ValueError(f"verifier must be one of {verifier_names()}, got {verifier!r}")
        chosen = VERIFIERS[verifier]() if verify_fn is None else custom_verifier(verify_fn)
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
        self.timeout_s = float(timeout_s)
        self.correct_reward = float(correct_reward)
        self.incorrect_reward = float(incorrect_reward)
        self.verify_fn = chosen.verify_fn
        self.verifier = verifier
        self.fallback = fallback
        # A custom `verify_fn` decides alone; the math verifiers accept an exact match first.
        self._exact_first = chosen.exact_first
        self._pool = _Pool(num_workers, chosen, start_method, memory_limit_mb, startup_timeout_s)
        self._finalizer = weakref.finalize(self, _shutdown, self._pool.workers)

    def close(self) -> None:
        """Stops the worker processes (a later batch starts new ones)."""
        _shutdown(self._pool.workers)

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def score(self, response: str, reference: str) -> ScoreResult:
        """Scores one response; see `score_batch`."""
        return self.score_batch([response], [reference]).results[0]

    def _extract(self, response: Any, answer_set: bool, gold: str) -> str | None:
        """The response's answer, or None if there is none or it is past the size caps.

        With `answer_set` (the reference is an unordered set of several answers), a response
        whose final answer is the last of several boxes answers with all of them:
        `\\boxed{1}` and `\\boxed{2}` is `1, 2`. An answer past `MAX_ANSWER_CHARS` (read up
        to twice the length of the reference `gold`) is kept only when it equals `gold` up to
        whitespace and the verifier accepts exact matches; it is none otherwise.
        """
        if not isinstance(response, str) or len(response) > MAX_RESPONSE_CHARS:
            return None
        cap = max(MAX_ANSWER_CHARS, 2 * len(gold))
        answer = extract_answer(response, max_chars=cap, fallback=self.fallback)
        if answer is not None and len(answer) > MAX_ANSWER_CHARS:
            return answer if self._exact_first and _same_text(answer, gold) else None
        if answer is None or not answer_set:
            return answer
        boxes = extract_boxes(response, max_chars=MAX_ANSWER_CHARS)
        if not boxes or len(boxes) < 2 or boxes[-1] != answer:
            return answer
        joined = ", ".join(boxes)
        return joined if len(joined) <= MAX_ANSWER_CHARS else answer

    @staticmethod
    def _is_answer_set(reference: str) -> bool:
        """Whether the reference is a list or set (unordered) of several answers."""
        try:
            parts = split_sequence(normalize_answer(reference))
        except Exception:  # a bug must not stop training: read boxes the usual way
            return False
        return parts is not None and parts[0] in ("", "{}")

    def _decide_fast(self, answer: str, reference: str) -> tuple[str, bool] | None:
        if self._exact_first and _same_text(answer, reference):
            return ("ok", True)
        if self.verify_fn is not None:
            return None
        try:
            verdict = fast_verdict(answer, reference)
        except Exception:  # a bug must not stop training: score 0 and count it
            return ("error", False)
        return None if verdict is None else ("ok", verdict)

    def score_batch(
        self, responses: Sequence[str], references: Sequence[str | Sequence[str]]
    ) -> BatchScores:
        """Scores `responses[i]` against `references[i]` for every i.

        Args:
          responses: model responses (full text; the final answer is extracted here). A
            response over `MAX_RESPONSE_CHARS` characters, or with an answer over
            `MAX_ANSWER_CHARS` that is not the reference's, scores as "no_answer".
          references: reference answers: bare answers such as `\\frac{1}{2}`, or worked
            solutions and `$...$` spans, whose final answer is read by `extract_reference`;
            a list or tuple of such strings is a reference of several answers, compared as
            one unordered list (`["$2$", "$-3$"]` is `2, -3`).

        Returns:
          A `BatchScores` with results in input order and status counts.

        Raises:
          ValueError: if the two sequences differ in length.
          TypeError: if a reference is not a string or a list or tuple of strings.
        """
        if len(responses) != len(references):
            raise ValueError(f"{len(responses)} responses but {len(references)} references")
        references = [_reference_key(ref) for ref in references]
        golds = self._golds(references)
        answers = [self._extract(r, *golds[ref]) for r, ref in zip(responses, references)]
        references = [golds[ref][1] for ref in references]
        decided: dict[tuple[str, str], tuple[str, bool]] = {}
        tasks: list[_Task] = []
        for answer, ref in zip(answers, references):
            key = (answer, ref)
            if answer is None or key in decided:
                continue
            fast = self._decide_fast(answer, ref)
            if fast is not None:
                decided[key] = fast
            else:
                decided[key] = ("pending", False)
                tasks.append((len(tasks), answer, ref))
        restarts_before = self._pool.restarts
        if tasks:
            for task_id, (status, correct) in self._pool.run(tasks, self.timeout_s).items():
                decided[tasks[task_id][1:]] = (status, correct)
        return self._assemble(
            answers, references, decided, len(tasks), self._pool.restarts - restarts_before
        )

    def _golds(self, references: Sequence[_Reference]) -> dict[_Reference, tuple[bool, str]]:
        """{reference: (is an answer set, its final answer)}, once per distinct reference."""
        golds: dict[_Reference, tuple[bool, str]] = {}
        for ref in references:
            if ref not in golds:
                gold = extract_reference(ref)
                golds[ref] = (self._is_answer_set(gold), gold)
        return golds

    def _assemble(
        self,
        answers: list[str | None],
        references: Sequence[str],
        decided: dict[tuple[str, str], tuple[str, bool]],
        num_symbolic: int,
        restarts: int,
    ) -> BatchScores:
        results = []
        for answer, ref in zip(answers, references):
            status, correct = ("no_answer", False) if answer is None else decided[(answer, ref)]
            reward = self.correct_reward if correct else self.incorrect_reward
            results.append(ScoreResult(correct, reward, answer, status))
        stats = {s: 0 for s in STATUSES}
        for r in results:
            stats[r.status] += 1
        stats.update(
            correct=sum(r.correct for r in results),
            total=len(results),
            symbolic=num_symbolic,
            worker_restarts=restarts,
        )
        return BatchScores(results, stats)


def _reference_key(reference: Any) -> _Reference:
    """A reference as a hashable key: a string, or a tuple of the strings of a list."""
    if isinstance(reference, str):
        return reference
    if isinstance(reference, (list, tuple)) and all(isinstance(r, str) for r in reference):
        return tuple(reference)
    raise TypeError(
        f"references must be strings or lists of strings, got {type(reference).__name__}"
    )


def _same_text(answer: str, reference: str) -> bool:
    """Whether the two strings are equal up to whitespace (`squash_whitespace`)."""
    return answer == reference or squash_whitespace(answer) == squash_whitespace(reference)


def score_batch(
    responses: Sequence[str],
    references: Sequence[str | Sequence[str]],
    *,
    timeout_s: float = 5.0,
    num_workers: int = 2,
    correct_reward: float = 1.0,
    incorrect_reward: float = 0.0,
    verifier: str = "builtin",
    fallback: str = "last_expression",
) -> BatchScores:
    """One-shot `RewardScorer(...).score_batch(...)`; the workers are stopped afterwards.

    A training loop should hold one `RewardScorer` instead, so that worker processes (which
    only start when a batch needs sympy) are reused across steps.
    """
    with RewardScorer(
        num_workers=num_workers,
        timeout_s=timeout_s,
        correct_reward=correct_reward,
        incorrect_reward=incorrect_reward,
        verifier=verifier,
        fallback=fallback,
    ) as s:
        return s.score_batch(responses, references)

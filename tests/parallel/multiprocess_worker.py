"""One process of a (possibly multi-process) 2-step RL run on the micro config.

  python multiprocess_worker.py WORKDIR [COORDINATOR NUM_PROCESSES PROCESS_ID]

The device count comes from XLA_FLAGS set by the caller. Rewards come from a hash of
the response text (a random policy is almost never right), so groups are mixed and the
run is deterministic. Environment: WORKER_ENGINE (rollout.engine, default static),
WORKER_STEPS (train.steps, default 2), WORKER_KILL_AT=S (process 1 kills itself with
SIGKILL as RL step S begins, a lost host), WORKER_HEARTBEAT_S (default 100) and
WORKER_STALENESS (rollout.max_staleness, default 0; > 0: partial rollouts, 24-token
responses decoded 2 steps per call, so groups are still generating when a batch is full).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _smoke_module():
    path = os.path.join(os.path.dirname(HERE), "train", "test_train_smoke.py")
    spec = importlib.util.spec_from_file_location("train_smoke", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> None:
    workdir = argv[0]
    from da3po_jax.parallel import initialize

    if len(argv) > 1:
        heartbeat = int(os.environ.get("WORKER_HEARTBEAT_S", "100"))
        initialize(argv[1], int(argv[2]), int(argv[3]), heartbeat)
    import jax

    print(
        f"process {jax.process_index()} of {jax.process_count()}: "
        f"{jax.local_device_count()} local / {jax.device_count()} global devices",
        flush=True,
    )
    import da3po_jax.run.context as context_lib
    from da3po_jax.run import train

    smoke = _smoke_module()
    context_lib.RewardScorer = smoke.HashScorer
    kill_at = int(os.environ.get("WORKER_KILL_AT", "0"))
    if kill_at and jax.process_index() == 1:
        _kill_at(kill_at)
    cfg = smoke.micro_config(
        "da3po",
        **{
            "rollout.prompts_per_round": 8,
            "rollout.engine": os.environ.get("WORKER_ENGINE", "static"),
            "rollout.slots": 8,
            "rl.train_prompts": 8,
            "rl.mini_batch_prompts": 4,
            "train.steps": int(os.environ.get("WORKER_STEPS", "2")),
            "train.export_final": True,
            "eval.prompts_per_call": 8,
            "mesh.shape": (-1, 1, 1),
            **_partial(int(os.environ.get("WORKER_STALENESS", "0"))),
        },
    )
    train(cfg, workdir)


def _partial(staleness: int) -> dict:
    """The overrides of partial rollouts with bound `staleness` (none for 0)."""
    if not staleness:
        return {}
    return {
        "rollout.max_staleness": staleness,
        "rollout.steps_per_call": 2,
        "rollout.max_new_tokens": 24,
    }


def _kill_at(step: int) -> None:
    """This process dies (SIGKILL: no handler, no flush) when RL step `step` begins."""
    from da3po_jax.rollout import collector

    collect = collector.Collector.collect

    def dying(self, params, carry, key, version=0):
        if version + 1 == step:
            print(f"process 1: kill -9 at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return collect(self, params, carry, key, version)

    collector.Collector.collect = dying


if __name__ == "__main__":
    main(sys.argv[1:])

"""Device memory against the planner (`da3po_jax.plan`): no KV cache outlives generation.

The sampler keeps at most one donated cache and frees it for good (`delete`) when the
shapes change or on `Sampler.clear`; the trainer clears it before every update and
`evaluate` at its end. Live bytes are read off `jax.live_arrays()` (device 0's shards),
counting only the arrays a test created: arrays other tests left alive are held aside.
"""

from __future__ import annotations

import gc
import math
import os

import jax
import pytest
from conftest import left_padded_batch
from flax import nnx
from test_train_smoke import HashScorer, micro_config

from da3po_jax.config import resolve_settings
from da3po_jax.models import get_preset, init_model
from da3po_jax.parallel import make_mesh
from da3po_jax.plan import plan_memory, plan_settings
from da3po_jax.rollout import PromptEncoder
from da3po_jax.run.build import build_trainer
from da3po_jax.run.context import RunContext
from da3po_jax.run.inputs import load_datasets, policy_model, prompt_renderer, tokenizer_for
from da3po_jax.sampling import GenerateConfig, Sampler
from da3po_jax.update import UpdateBatch


class LiveBytes:
    """Device-0 bytes of the arrays alive now (after gc) that did not exist at creation.

    The arrays alive at creation are referenced here, so they stay alive and no new array
    can take one of their ids."""

    def __init__(self):
        gc.collect()
        self.device = jax.devices()[0]
        self._before = jax.live_arrays()
        self._ids = {id(x) for x in self._before}

    def arrays(self) -> list[jax.Array]:
        gc.collect()
        return [x for x in jax.live_arrays() if id(x) not in self._ids]

    def __call__(self) -> int:
        """From the shardings' metadata only: no shard buffer is touched (reading `.data`
        of every live array, some of them mid-donation, aborted a long test process)."""
        total = 0
        for x in self.arrays():
            if x.is_deleted():
                continue
            here = sum(d == self.device for d in x.sharding.devices_indices_map(x.shape))
            total += here * math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
        return total


def _nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def test_sampler_keeps_one_cache_and_clear_deletes_it():
    model = init_model(get_preset("tiny-qwen2"), seed=0)
    graphdef, state = nnx.split(model)
    sampler = Sampler(graphdef, model.config, GenerateConfig(num_samples=2, max_new_tokens=5))
    short = left_padded_batch(model.config.vocab_size, (8, 3, 5), seed=0)  # [3, 8]
    again = left_padded_batch(model.config.vocab_size, (2, 8, 6), seed=1)  # same bucket
    # [3, 130]: past the 128 slots the cache length is rounded up to, a longer cache
    long = left_padded_batch(model.config.vocab_size, (130, 4, 9), seed=2)
    live = LiveBytes()

    sampler.generate(state, *short, seed=0)
    (first,) = sampler._caches.values()
    first_bytes, first_k = _nbytes(first), first.k[0]
    del first  # (jit does not donate its unused `index`: holding it keeps 4 bytes alive)
    assert sampler.cache_nbytes == first_bytes > 0
    assert live() == first_bytes, "something besides the cache outlived the call"

    sampler.generate(state, *again, seed=1)  # rounds of one bucket still reuse the cache
    (reused,) = sampler._caches.values()
    assert first_k.is_deleted(), "the cache was not donated"
    assert live() == _nbytes(reused) == first_bytes

    sampler.generate(state, *long, seed=2)  # new shapes: the old cache is freed first
    (second,) = sampler._caches.values()
    assert all(x.is_deleted() for x in jax.tree.leaves(reused)), "old bucket's cache alive"
    assert _nbytes(second) > first_bytes
    assert live() == sampler.cache_nbytes == _nbytes(second)

    sampler.clear()
    assert all(x.is_deleted() for x in jax.tree.leaves(second)), "clear left buffers alive"
    assert sampler.cache_nbytes == 0 and not sampler._caches
    assert live() == 0

    with pytest.raises(ValueError, match="max_caches=0"):
        Sampler(graphdef, model.config, sampler.config, max_caches=0)


def _micro_trainer(tmp_path, engine: str):
    """The micro config's trainer on one device, for `engine`, and its memory plan."""
    c = micro_config(
        "da3po",
        **{"loss.kl_coef": 0.05, "train.eval_every": 0, "train.checkpoint_every": 0},
        **({"rollout.engine": "continuous", "rollout.slots": 8} if engine == "continuous" else {}),
    )
    c.mesh.shape = (1, 1, 1)
    cfg = resolve_settings(c)
    workdir = str(tmp_path / "run")
    os.makedirs(workdir)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    tokenizer = tokenizer_for(cfg, workdir)
    data = load_datasets(cfg.data, cfg.seed)
    encoder = PromptEncoder(tokenizer, prompt_renderer(cfg, tokenizer), cfg.rollout.buckets)
    model = policy_model(cfg.model, tokenizer, seed=cfg.seed, mesh=mesh)
    ctx = RunContext(cfg, workdir, tokenizer, encoder, data, HashScorer(), mesh)
    trainer = build_trainer(ctx, model)
    del model  # its buffers are the policy's (the first update donates them)
    c.tokenizer.vocab_size = tokenizer.vocab_size  # the model's real vocabulary
    plan = plan_memory(
        plan_settings(c), num_devices=1, prompt_len=trainer.collector.engine.prompt_len
    )
    resident = plan.params + plan.optimizer + plan.reference + plan.teacher + plan.batch
    assert plan.reference == plan.params > 0 and plan.gathered == 0
    assert plan.params == _nbytes(trainer.state.params)
    assert plan.optimizer == _nbytes(trainer.state.opt_state)
    return trainer, plan, resident


@pytest.mark.slow
def test_trainer_keeps_only_what_the_planner_counts(tmp_path):
    """Rollout + update + eval on the micro config (static engines): while generating, one
    cache is held, by the rollout or the eval engine, and it is the planner's `kv_cache`;
    when the update starts, and after evaluation, the live bytes are the planner's
    resident part (params, optimizer, reference, batch and surplus buffers; all exact) and
    no array has a KV cache's shape."""
    live = LiveBytes()
    trainer, plan, resident = _micro_trainer(tmp_path, "static")
    samplers = [trainer.collector.engine.sampler, trainer._evaluate.runs[0][1].sampler]
    cache_shapes: set[tuple[int, ...]] = set()
    held: list[tuple[int, int]] = []  # (caches held, their bytes) after each generate call

    def held_now():
        return sum(len(s._caches) for s in samplers), sum(s.cache_nbytes for s in samplers)

    def recording(sampler):
        generate = sampler.generate

        def recording_generate(*args, **kwargs):
            out = generate(*args, **kwargs)
            for cache in sampler._caches.values():
                cache_shapes.update(x.shape for x in cache.k + cache.v)
            held.append(held_now())
            return out

        return recording_generate

    for sampler in samplers:
        sampler.generate = recording(sampler)
    at_update: dict[str, object] = {}
    update = trainer.update.fn

    def measuring_update(*args, **kwargs):
        at_update["bytes"] = live()
        at_update["shapes"] = {x.shape for x in live.arrays()}
        at_update["held"] = held_now()[1]
        at_update["batch"] = sum(_nbytes(a.batch) for a in args if isinstance(a, UpdateBatch))
        return update(*args, **kwargs)

    trainer.update.fn = measuring_update

    def no_cache_alive() -> bool:
        return not cache_shapes & {x.shape for x in live.arrays()} and held_now() == (0, 0)

    try:
        trainer.evaluate()  # as `run` does at step 0
        assert no_cache_alive()
        trainer.step()
        assert at_update, "the update did not run"
        assert at_update["held"] == 0 and not cache_shapes & at_update["shapes"]
        assert at_update["bytes"] == pytest.approx(resident, rel=0.1)
        # the batch term: the step's groups and the surplus carried to the next step
        surplus = _nbytes(trainer.carry.surplus)
        assert plan.batch == pytest.approx(at_update["batch"] + surplus, rel=0.01)
        trainer.evaluate()
        assert no_cache_alive()
        assert live() == pytest.approx(resident, rel=0.1)
    finally:
        trainer.close()
    # every eval and rollout call held exactly one cache, no larger than the planner's
    assert len(held) >= 3 and all(n == 1 for n, _ in held)
    assert max(b for _, b in held) == pytest.approx(plan.kv_cache, rel=0.01)
    # rollout (16 rows) and eval (8 prompts x 2) caches have the same bytes here
    assert plan.info["rollout_rows"] == plan.info["eval_rows"] == 16
    print(
        f"live at update {at_update['bytes']} B, planner resident {resident} B "
        f"(params {plan.params}, optimizer {plan.optimizer}, reference {plan.reference}, "
        f"batch {plan.batch}); kv cache {plan.kv_cache} B"
    )


@pytest.mark.slow
def test_continuous_engine_frees_its_slots_before_the_update(tmp_path):
    """The continuous engine: while it decodes, its slots are the planner's `kv_cache`
    (plus the small per-slot state); at the update and after evaluation no slot is alive
    and the live bytes are the planner's resident part."""
    live = LiveBytes()
    trainer, plan, resident = _micro_trainer(tmp_path, "continuous")
    decoders = [trainer.collector.engine.decoder, trainer._evaluate.runs[0][1].decoder]
    held: list[int] = []
    for decoder in decoders:
        step = decoder.step

        def recording_step(params, step=step, decoder=decoder):
            out = step(params)
            held.append(decoder._slots.cache.k[0].nbytes * 2 * len(decoder._slots.cache.k))
            assert sum(d.nbytes > 0 for d in decoders) == 1  # one engine's slots at a time
            return out

        decoder.step = recording_step
    at_update = {}
    update = trainer.update.fn

    def measuring_update(*args, **kwargs):
        at_update["bytes"], at_update["slots"] = live(), sum(d.nbytes for d in decoders)
        return update(*args, **kwargs)

    trainer.update.fn = measuring_update
    try:
        trainer.evaluate()
        assert sum(d.nbytes for d in decoders) == 0
        trainer.step()
        assert at_update["slots"] == 0
        assert at_update["bytes"] == pytest.approx(resident, rel=0.1)
        trainer.evaluate()
        assert live() == pytest.approx(resident, rel=0.1)
    finally:
        trainer.close()
    assert held and max(held) == plan.kv_cache

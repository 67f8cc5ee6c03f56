"""`sample_from_folder` on meshes of 8 simulated CPU devices; `test_sample_cli.py` runs
this file in a subprocess with `XLA_FLAGS=--xla_force_host_platform_device_count=8` (the
device count is fixed when JAX starts) and compares its greedy samples with one device's.

Usage: python sample_mesh_worker.py MODEL_FOLDER OUT.npz
"""

from __future__ import annotations

import sys

PROMPTS = ["What is 3 + 4?", "Hello world, this is a tiny tokenizer for tests.", "x"]
GEN = dict(num_samples=2, max_new_tokens=8, temperature=0.0)
# (mesh flag, rows the 3 prompts are padded to: a multiple of the data x fsdp devices)
MESHES = (("8,1,1", 8), ("1,-1,1", 8), ("2,2,2", 4))


def main(folder: str, out: str) -> None:
    import jax
    import numpy as np
    from flax import nnx

    from da3po_jax.parallel import make_mesh, tree_shardings
    from da3po_jax.sampling.host import load_on_mesh, parse_mesh_shape, sample_from_folder

    assert jax.device_count() == 8, jax.devices()
    results = {}
    for flag, rows in MESHES:
        mesh = make_mesh(parse_mesh_shape(flag))
        state = nnx.state(load_on_mesh(folder, mesh))
        got = jax.tree.map(lambda x: x.sharding, state)
        want = tree_shardings(state, mesh)
        for (path, g), w in zip(jax.tree.leaves_with_path(got), jax.tree.leaves(want)):
            assert g == w, (flag, jax.tree_util.keystr(path), g, w)
        split = sum(not s.is_fully_replicated for s in jax.tree.leaves(got))
        if flag != "8,1,1":
            assert split > 0, f"mesh {flag}: no parameter is sharded"
        res = sample_from_folder(folder, PROMPTS, mesh_shape=flag, **GEN)
        assert res.prompts.tokens.shape[0] == rows, (flag, res.prompts.tokens.shape)
        results[f"{flag}/tokens"] = res.output.tokens
        results[f"{flag}/lengths"] = res.output.lengths
        results[f"{flag}/prompt_tokens"] = res.prompts.tokens[: len(PROMPTS)]
        print(f"mesh {flag}: {split} sharded parameters, batch {res.prompts.tokens.shape}")
    np.savez(out, **results)


if __name__ == "__main__":
    main(*sys.argv[1:])

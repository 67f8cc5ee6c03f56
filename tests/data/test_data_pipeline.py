"""PromptIterator: seeded order, epoch reshuffle, any batch sizes, exact resume, host shards."""

from __future__ import annotations

import json

import pytest

from da3po_jax.data import IteratorState, MathProblem, PromptIterator


def _problems(n: int) -> list[MathProblem]:
    return [MathProblem(f"p{i}", f"What is {i} + 1?", str(i + 1)) for i in range(n)]


def _ids(batch) -> list[str]:
    return [p.id for p in batch]


def test_same_seed_same_stream_other_seed_differs():
    data = _problems(50)
    a = PromptIterator(data, seed=3)
    b = PromptIterator(data, seed=3)
    c = PromptIterator(data, seed=4)
    stream_a = [_ids(a.next_batch(16)) for _ in range(5)]
    assert stream_a == [_ids(b.next_batch(16)) for _ in range(5)]
    assert stream_a != [_ids(c.next_batch(16)) for _ in range(5)]


def test_each_epoch_is_a_fresh_permutation():
    data = _problems(40)
    it = PromptIterator(data, seed=0)
    epochs = [_ids(it.next_batch(40)) for _ in range(3)]
    for order in epochs:
        assert sorted(order) == sorted(p.id for p in data)
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]
    assert epochs[0] != [p.id for p in data]
    assert it.state.epoch == 3 and it.state.position == 0


def test_stream_does_not_depend_on_how_it_is_cut():
    data = _problems(23)
    sizes = [3, 5, 0, 1, 17, 30, 2, 7]  # crosses several epochs, one call spans more than one
    cut = PromptIterator(data, seed=9)
    pieces = [cut.next_batch(n) for n in sizes]
    assert [len(p) for p in pieces] == sizes
    one_by_one = PromptIterator(data, seed=9)
    assert _ids(sum(pieces, [])) == _ids(one_by_one.next_batch(1)[0] for _ in range(sum(sizes)))
    assert cut.state == one_by_one.state


@pytest.mark.parametrize("consumed", [0, 7, 20, 21, 45])
def test_resume_from_saved_state_continues_exactly(consumed):
    data = _problems(21)
    it = PromptIterator(data, seed=5)
    it.next_batch(consumed)
    saved = json.loads(json.dumps(it.state.to_dict()))  # as a checkpoint would store it
    expected = [_ids(it.next_batch(n)) for n in (4, 9, 30)]
    fresh = PromptIterator(data, seed=5)
    fresh.restore(IteratorState.from_dict(saved))
    assert [_ids(fresh.next_batch(n)) for n in (4, 9, 30)] == expected
    other = PromptIterator(data, seed=5)
    other.restore(saved)  # a plain dict works too
    assert _ids(other.next_batch(4)) == expected[0]


def test_restore_refuses_a_state_from_another_setup():
    data = _problems(10)
    state = PromptIterator(data, seed=1).state
    with pytest.raises(ValueError, match="different dataset"):
        PromptIterator(data, seed=2).restore(state)
    with pytest.raises(ValueError, match="different dataset"):
        PromptIterator(_problems(11), seed=1).restore(state)
    with pytest.raises(ValueError, match="different dataset"):
        PromptIterator(data, seed=1, shard_index=1, num_shards=2).restore(state)
    with pytest.raises(ValueError, match="out of range"):
        PromptIterator(data, seed=1).restore({"epoch": 0, "position": 10})
    with pytest.raises(ValueError, match="not a data iterator state"):
        PromptIterator(data, seed=1).restore({"epoch": 0})


def test_host_shards_are_disjoint_and_cover_each_epoch():
    data = _problems(32)
    hosts = [PromptIterator(data, seed=11, shard_index=h, num_shards=4) for h in range(4)]
    assert all(h.epoch_length == 8 for h in hosts)
    for _ in range(3):  # epochs, taken in uneven pieces as dynamic sampling would
        per_host = [_ids(h.next_batch(3) + h.next_batch(5)) for h in hosts]
        flat = sum(per_host, [])
        assert len(set(flat)) == len(flat) == 32
    assert all(h.state.epoch == 3 for h in hosts)


def test_uneven_shards_stay_in_step_and_skip_different_records_each_epoch():
    data = _problems(10)
    hosts = [PromptIterator(data, seed=2, shard_index=h, num_shards=3) for h in range(3)]
    assert all(h.epoch_length == 3 for h in hosts)
    skipped = []
    for _ in range(12):
        flat = sum((_ids(h.next_batch(3)) for h in hosts), [])
        assert len(set(flat)) == 9
        skipped.append(({p.id for p in data} - set(flat)).pop())
    assert len(set(skipped)) > 1  # the dropped record rotates with the epoch's shuffle
    with pytest.raises(ValueError, match="shards"):
        PromptIterator(_problems(2), num_shards=3)
    with pytest.raises(ValueError, match="shard_index"):
        PromptIterator(data, shard_index=3, num_shards=3)


def test_unshuffled_order_and_iteration_protocol():
    data = _problems(5)
    it = PromptIterator(data, shuffle=False)
    assert _ids(it.next_batch(7)) == ["p0", "p1", "p2", "p3", "p4", "p0", "p1"]
    assert next(it).id == "p2"
    with pytest.raises(ValueError, match="batch size"):
        it.next_batch(-1)

"""GRPO / Dr.GRPO advantages and group statistics against hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from da3po_jax.rl import (
    AdvantageConfig,
    DAAConfig,
    compute_advantages,
    group_accuracy,
    group_stats,
    grpo_advantages,
)

EPS = 1e-6


def test_grpo_ddof1_hand_values():
    # group 0: [1, 0, 0, 0]: mean 0.25, sample var 0.75 / 3 = 0.25, std 0.5
    # group 1: [1, 1, 0, 0]: mean 0.5, sample var 1 / 3, std 0.5773503
    r = jnp.array([1.0, 0, 0, 0, 1, 1, 0, 0])
    adv = grpo_advantages(r, 4, std_ddof=1, eps=EPS)
    s1 = np.sqrt(1 / 3)
    expected = [
        0.75 / (0.5 + EPS),
        -0.25 / (0.5 + EPS),
        -0.25 / (0.5 + EPS),
        -0.25 / (0.5 + EPS),
        0.5 / (s1 + EPS),
        0.5 / (s1 + EPS),
        -0.5 / (s1 + EPS),
        -0.5 / (s1 + EPS),
    ]
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(adv[:4], [1.5, -0.5, -0.5, -0.5], rtol=1e-5)
    np.testing.assert_allclose(adv[4:], [0.8660254, 0.8660254, -0.8660254, -0.8660254], rtol=1e-5)


def test_grpo_ddof0_hand_values():
    # [1, 0, 0, 0]: population std sqrt(0.1875) = 0.4330127; [1, 1, 0, 0]: std 0.5
    r = jnp.array([[1.0, 0, 0, 0], [1, 1, 0, 0]])
    adv = grpo_advantages(r, 4, std_ddof=0, eps=0.0)
    np.testing.assert_allclose(
        adv, [[1.7320508, -0.5773503, -0.5773503, -0.5773503], [1, 1, -1, -1]], rtol=1e-6
    )
    assert adv.shape == (2, 4)


def test_grpo_nonbinary_rewards_ddof0():
    # rewards [1, 0.5, 0, -1]: mean 0.125, population var 2.1875 / 4 = 0.546875
    adv = grpo_advantages(jnp.array([1.0, 0.5, 0.0, -1.0]), 4, std_ddof=0, eps=0.0)
    std = np.sqrt(0.546875)
    np.testing.assert_allclose(adv, np.array([0.875, 0.375, -0.125, -1.125]) / std, rtol=1e-6)
    np.testing.assert_allclose(adv, [1.1832160, 0.5070926, -0.1690309, -1.5212777], rtol=1e-6)


@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("norm", ["std", "none"])
def test_degenerate_groups_get_zero(ddof, norm):
    r = jnp.array([1.0, 1, 1, 1, 0, 0, 0, 0, 0.3, 0.3, 0.3, 0.3])
    adv = grpo_advantages(r, 4, std_ddof=ddof, norm=norm)
    np.testing.assert_array_equal(adv, np.zeros(12))


@pytest.mark.parametrize("ddof", [0, 1])
def test_single_sample_group_gets_zero(ddof):
    adv = grpo_advantages(jnp.array([1.0]), 1, std_ddof=ddof)
    np.testing.assert_array_equal(adv, [0.0])
    # one valid sample in a masked group of 4
    adv = grpo_advantages(
        jnp.array([1.0, 0, 0, 0]), 4, std_ddof=ddof, valid=jnp.array([1, 0, 0, 0], bool)
    )
    np.testing.assert_array_equal(adv, np.zeros(4))
    assert not np.any(np.isnan(adv))


def test_dr_grpo_centre_only():
    adv = grpo_advantages(jnp.array([1.0, 0, 0, 0, 2, 0, 1, 1]), 4, norm="none")
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25, 1, -1, 0, 0], atol=1e-7)


def test_valid_mask_excludes_responses():
    # valid responses of the group: [1, 0, 0] -> mean 1/3, sample std sqrt(1/3)
    r = jnp.array([1.0, 0, 0, 5.0])
    adv = grpo_advantages(r, 4, valid=jnp.array([1, 1, 1, 0], bool), eps=0.0)
    s = np.sqrt(1 / 3)
    np.testing.assert_allclose(adv, [(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0.0], rtol=1e-6)


def test_group_stats_and_accuracy():
    st = group_stats(jnp.array([1.0, 0, 0, 0, 1, 1, 1, 1]), 4, std_ddof=0)
    np.testing.assert_allclose(st.mean, [0.25, 1.0])
    np.testing.assert_allclose(st.std, [np.sqrt(0.1875), 0.0], rtol=1e-6)
    np.testing.assert_array_equal(st.constant, [False, True])
    np.testing.assert_array_equal(st.count, [4, 4])
    mu, k, n = group_accuracy(
        jnp.array([1, 0, 0, 1, 1, 1]), 3, valid=jnp.array([1, 1, 1, 1, 1, 0], bool)
    )
    np.testing.assert_allclose(mu, [1 / 3, 1.0])
    np.testing.assert_array_equal(k, [1, 2])
    np.testing.assert_array_equal(n, [3, 2])


POWER = DAAConfig(estimator="power")


def test_compute_advantages_config_metrics_and_daa():
    r = jnp.array([1.0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0])
    adv, met = compute_advantages(r, r, 4, config=AdvantageConfig(norm="none"))
    np.testing.assert_allclose(
        adv, [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75, 0, 0, 0, 0], atol=1e-7
    )
    np.testing.assert_allclose(met["adv/zero_var_frac"], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(met["adv/abs_mean"], 3.0 / 12, rtol=1e-6)
    # with DAA (power, beta 0.5, tau 0.5): group 0 (mu = 0.25) correct x sqrt(odds(.5)/odds(.25))
    adv2, met2 = compute_advantages(r, r, 4, config=AdvantageConfig(norm="none"), daa=POWER)
    np.testing.assert_allclose(adv2[0], 0.75 * np.sqrt(3.0), rtol=1e-6)
    np.testing.assert_allclose(adv2[1:], adv[1:], atol=0)
    np.testing.assert_allclose(met2["daa/frac_hard"], 1 / 2, rtol=1e-6)  # 1 of 2 kept groups


def test_compute_advantages_jits_with_static_config():
    f = jax.jit(compute_advantages, static_argnames=("group_size", "config", "daa"))
    r = jnp.array([1.0, 0, 0, 0])
    adv, _ = f(r, r, group_size=4, config=AdvantageConfig(std_ddof=0), daa=POWER)
    np.testing.assert_allclose(
        adv, [1.7320508 * np.sqrt(3.0), -0.5773503, -0.5773503, -0.5773503], rtol=1e-5
    )


def test_advantage_config_validation():
    with pytest.raises(ValueError, match="norm"):
        AdvantageConfig(norm="mad")
    with pytest.raises(ValueError, match="std_ddof"):
        AdvantageConfig(std_ddof=2)
    assert hash(AdvantageConfig()) == hash(AdvantageConfig())

"""Each setting is declared once (`da3po_jax.rl.fields.setting`): the config every recipe
starts from, the reference page, the field's own rule (for a run and for direct users of
the class) and a new field all come from that one declaration."""

from __future__ import annotations

import dataclasses
import os

import pytest
from ml_collections import config_dict

from da3po_jax.config import default_config, reference_markdown, resolve_settings
from da3po_jax.config import resolve as resolve_module
from da3po_jax.config import sections as sections_module
from da3po_jax.config.sections import SECTIONS, RewardSettings, section
from da3po_jax.config.settings import TOP_LEVEL
from da3po_jax.rl import DAAConfig, LossConfig, OverlongConfig
from da3po_jax.rl.fields import SettingError, check_fields, config_fields, setting, unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tiny(**overrides) -> config_dict.ConfigDict:
    c = default_config()
    c.tokenizer.build_tiny = True
    for key, value in overrides.items():
        name, leaf = key.split(".")
        c[name][leaf] = value
    return c


def test_docs_settings_md_is_the_declarations():
    with open(os.path.join(ROOT, "docs", "settings.md")) as f:
        assert f.read() == reference_markdown(), (
            "rerun: python -m da3po_jax.config > docs/settings.md"
        )


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_every_config_field_has_a_doc_and_a_default(name):
    for f in config_fields(SECTIONS[name]):
        assert f.metadata["doc"].strip(), f"{name}.{f.name}"
        assert f.default is not dataclasses.MISSING, f"{name}.{f.name}"
        assert not isinstance(f.default, list | dict), f"{name}.{f.name}: mutable default"


def test_default_config_holds_every_declared_field_and_presets_unset():
    c = default_config()
    assert sorted(c.keys()) == sorted([*TOP_LEVEL, *SECTIONS])
    for name, cls in SECTIONS.items():
        fields = config_fields(cls)
        assert sorted(c[name].keys()) == sorted(f.name for f in fields)
        for f in fields:
            expected = None if f.metadata["preset"] else f.default
            assert c[name][f.name] == expected, f"{name}.{f.name}"
    # a placeholder keeps its type: a command-line string parses to it
    assert c.loss.eps_high is None
    assert c.loss.get_type("eps_high") is float and c.ds.get_type("enable") is bool


def test_a_fields_own_rule_speaks_to_a_run_and_to_a_direct_user():
    with pytest.raises(SettingError, match=r"^DAAConfig.prior_ema=1.5 must be in \[0, 1\]$"):
        DAAConfig(prior_ema=1.5)
    with pytest.raises(ValueError, match=r"^config.daa.prior_ema=1.5 must be in \[0, 1\]$"):
        resolve_settings(_tiny(**{"daa.prior_ema": 1.5}))
    with pytest.raises(ValueError, match=r"^config.loss.eps_low=1.0 must be in \[0, 1\)$"):
        resolve_settings(_tiny(**{"loss.eps_low": 1.0}))
    with pytest.raises(ValueError, match=r"^config.overlong.buffer=65 exceeds max_len=64"):
        resolve_settings(_tiny(**{"overlong.buffer": 65}))
    with pytest.raises(SettingError, match=r"^OverlongConfig.buffer=9 exceeds max_len=8"):
        OverlongConfig(8, buffer=9)


def test_fields_derived_from_the_rollout_follow_it():
    tempered = {"rollout.max_new_tokens": 48, "rollout.temperature": 0.7}
    s = resolve_settings(_tiny(**tempered, **{"loss.train_temperature": 1.0}))
    assert s.overlong.max_len == 48
    assert s.loss.tis_cap == 2.0  # sampling is not the trained (untempered) policy
    assert s.loss.temperature == 1.0
    s = resolve_settings(_tiny(**tempered))  # the default trains the sampled policy
    assert (s.loss.tis_cap, s.loss.temperature) == (0.0, 0.7)
    exact = resolve_settings(_tiny(**{"rollout.max_new_tokens": 48}))
    assert exact.loss.tis_cap == 0.0
    for derived in ("tis_cap", "temperature"):  # derived, not config fields
        assert derived not in exact.to_dict()["loss"]
    assert "max_len" not in exact.to_dict()["overlong"]


def test_the_run_hands_its_sections_to_the_math_unchanged():
    s = resolve_settings(_tiny(**{"daa.prior_ema": 0.8, "loss.kl_coef": 0.1}))
    assert isinstance(s.loss, LossConfig) and s.loss.kl_coef == 0.1
    assert s.daa_on is s.daa and s.daa.prior_ema == 0.8
    c = _tiny()
    c.algo = "grpo"
    grpo = resolve_settings(c)
    assert grpo.daa_on is None and grpo.opd_on is None and grpo.ra_opd_on is None


def test_a_new_setting_is_one_declaration(monkeypatch):
    """A field added to a section's class reaches the default config, the command line's
    overrides, its own rule and the resolved settings with no other edit."""

    @section
    class Reward2(RewardSettings):
        shaping_weight: float = setting(0.0, "weight of an extra shaping term", unit)

    monkeypatch.setitem(SECTIONS, "reward", Reward2)
    assert sections_module.SECTIONS["reward"] is Reward2
    assert resolve_module.SECTIONS["reward"] is Reward2  # the same table
    c = _tiny()
    assert c.reward.shaping_weight == 0.0
    c.reward.shaping_weight = 0.25
    assert resolve_settings(c).reward.shaping_weight == 0.25
    c.reward.shaping_weight = 2.0
    with pytest.raises(ValueError, match=r"config.reward.shaping_weight=2.0 must be in \[0, 1\]"):
        resolve_settings(c)
    assert "`reward.shaping_weight` | float | `0.0` | weight of an extra shaping term" in (
        reference_markdown()
    )


def test_check_fields_reports_the_first_broken_rule_by_name():
    @dataclasses.dataclass(frozen=True)
    class Two:
        a: float = setting(0.5, "a", unit)
        b: float = setting(0.5, "b", unit)

        def __post_init__(self):
            check_fields(self)

    with pytest.raises(SettingError) as e:
        Two(a=2.0, b=3.0)
    assert (e.value.name, e.value.value, str(e.value)) == ("a", 2.0, "Two.a=2.0 must be in [0, 1]")
    Two(a=1.0, b=0.0)

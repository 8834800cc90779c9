"""The scripted intervener's rule: `patience` straying decisions, then `steps` decisions of the expert."""

from __future__ import annotations

import pytest
import torch

from embodrl.config import compose
from embodrl.errors import ConfigError, UserError
from embodrl.sims.interventions import ScriptedIntervener
from embodrl.train.intervention_config import InterventionConfig


def test_the_expert_takes_over_after_patience_straying_decisions_and_hands_back_after_steps():
    intervener = ScriptedIntervener(
        InterventionConfig(mode="expert", threshold=0.5, patience=2, steps=3), 2, 1
    )
    expert = torch.zeros(2, 1)
    policy = torch.tensor([[[1.0]], [[0.2]]])  # env 0 strays (|1 - 0| > 0.5), env 1 follows
    driven = []
    for _ in range(6):
        actions, mask = intervener.choose(policy, expert)
        driven.append(mask.tolist())
        torch.testing.assert_close(actions[mask], expert.view(2, 1, 1)[mask])
        torch.testing.assert_close(actions[~mask], policy[~mask])
    # env 0: strays once, takes over on the second (and drives 3), then strays once more, again...
    assert [d[0] for d in driven] == [False, True, True, True, False, True]
    assert not any(d[1] for d in driven)
    metrics = intervener.pop_metrics(episodes=2)
    assert metrics["rollout/intervention_rate"] == pytest.approx(4 / 12)
    assert metrics["rollout/interventions_per_episode"] == pytest.approx(2 / 2)
    assert intervener.pop_metrics(episodes=0)["rollout/intervention_rate"] == 0.0  # counts restart


def test_an_episode_end_hands_control_back():
    intervener = ScriptedIntervener(InterventionConfig(mode="expert", patience=1, steps=5), 1, 1)
    assert intervener.choose(torch.ones(1, 1, 1), torch.zeros(1, 1))[1].item()
    intervener.end_episodes(torch.tensor([True]))
    assert not intervener.choose(torch.zeros(1, 1, 1), torch.zeros(1, 1))[1].item()


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="intervention.mode"):
        compose("sac_pendulum", ["intervention.mode=human"])
    with pytest.raises(ConfigError, match="use algo=sac"):
        compose("reach_ppo", ["intervention.mode=expert"])
    with pytest.raises(ConfigError, match="intervention.patience"):
        InterventionConfig(mode="expert", patience=0)
    with pytest.raises(UserError, match="chunk_size=1") as error:
        ScriptedIntervener(InterventionConfig(mode="expert"), 2, 4)
    assert "\n" not in str(error.value)

"""The scripted intervener's rules: `patience` decisions that stray from the expert (or make no headway),
then `steps` decisions of the expert."""

from __future__ import annotations

import pytest
import torch

from embodrl.config import compose
from embodrl.errors import ConfigError, UserError
from embodrl.sims.interventions import ScriptedIntervener
from embodrl.sims.registry import make_env
from embodrl.train.intervention_config import InterventionConfig


class ScriptedEnv:
    """The two things the intervener reads, set by the test."""

    def __init__(self, expert: torch.Tensor, progress: torch.Tensor | None = None) -> None:
        self.expert, self.progress = expert, progress

    def expert_actions(self) -> torch.Tensor:
        return self.expert

    def task_progress(self) -> torch.Tensor:
        return self.progress


def test_the_expert_takes_over_after_patience_straying_decisions_and_hands_back_after_steps():
    intervener = ScriptedIntervener(
        InterventionConfig(mode="expert", threshold=0.5, patience=2, steps=3), 2, 1
    )
    env = ScriptedEnv(expert=torch.zeros(2, 1))
    policy = torch.tensor([[[1.0]], [[0.2]]])  # env 0 strays (|1 - 0| > 0.5), env 1 follows
    driven = []
    for _ in range(6):
        actions, mask = intervener.choose(policy, env)
        driven.append(mask.tolist())
        torch.testing.assert_close(actions[mask], env.expert.view(2, 1, 1)[mask])
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
    env = ScriptedEnv(expert=torch.zeros(1, 1))
    assert intervener.choose(torch.ones(1, 1, 1), env)[1].item()
    intervener.end_episodes(torch.tensor([True]))
    assert not intervener.choose(torch.zeros(1, 1, 1), env)[1].item()


def test_stall_takes_over_after_patience_decisions_without_headway_whatever_the_action():
    cfg = InterventionConfig(mode="expert", trigger="stall", min_progress=0.05, patience=2, steps=2)
    intervener = ScriptedIntervener(cfg, 2, 1)
    policy = torch.ones(2, 1, 1)  # far from the expert's action: only progress counts
    env = ScriptedEnv(expert=torch.zeros(2, 1))
    # env 0 climbs by 0.1 a decision, env 1 creeps by 0.01 (no headway past 0.05), then the expert drives
    # it up by 0.2 twice and hands back at 0.42; from there the policy must beat 0.47
    progress = [[0.0, 0.0], [0.1, 0.01], [0.2, 0.02], [0.3, 0.22], [0.4, 0.42], [0.5, 0.43], [0.6, 0.48]]
    driven = []
    for level in progress:
        env.progress = torch.tensor(level)
        driven.append(intervener.choose(policy, env)[1].tolist())
    assert [d[0] for d in driven] == [False] * 7
    assert [d[1] for d in driven] == [False, False, True, True, False, False, False]


def test_stall_spares_the_scripted_expert_and_takes_over_a_frozen_policy():
    """The tabletop's own expert makes headway at least every 5 decisions at min_progress 0.005 (its grasp
    pauses the longest); a policy that holds still is taken over after `patience`."""
    cfg = compose("pick_image_sac", ["env.obs_mode=state", "env.num_envs=8", "env.control_mode=ee_delta_pos"])
    rule = InterventionConfig(mode="expert", trigger="stall", min_progress=0.005, patience=6, steps=10)
    env = make_env(cfg.env)
    env.reset_to(torch.arange(8))
    intervener = ScriptedIntervener(rule, env.num_envs, 1)
    succeeded = torch.zeros(8, dtype=torch.bool)
    for _ in range(80):
        actions, driven = intervener.choose(env.expert_actions()[:, None].float(), env)
        assert not driven.any()
        result = env.step(actions)
        intervener.end_episodes(result.done)
        succeeded |= result.success
    assert succeeded.all()
    env.reset_to(torch.arange(8))
    intervener = ScriptedIntervener(rule, env.num_envs, 1)
    still = torch.tensor([0.0, 0.0, 0.0, -1.0]).expand(8, 1, 4)  # no motion, gripper open
    taken = [intervener.choose(still, env)[1].all().item() for _ in range(7)]
    assert taken == [False] * 6 + [True]  # the first decision's progress is the headway to beat


def test_patience_grows_to_patience_final_over_trust_steps():
    cfg = InterventionConfig(mode="expert", patience=2, steps=1, patience_final=6, trust_steps=100)
    intervener = ScriptedIntervener(cfg, 1, 1)
    assert [intervener.trust(n) for n in (0, 25, 50, 100, 10_000)] == [2, 3, 4, 6, 6]
    env = ScriptedEnv(expert=torch.zeros(1, 1))
    straying = torch.ones(1, 1, 1)
    # at patience 6 the expert takes over on the sixth straying decision, not the second
    taken = [intervener.choose(straying, env)[1].item() for _ in range(6)]
    assert taken == [False] * 5 + [True]
    assert ScriptedIntervener(InterventionConfig(mode="expert", patience=3), 1, 1).trust(10**6) == 3


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="intervention.mode"):
        compose("sac_pendulum", ["intervention.mode=human"])
    with pytest.raises(ConfigError, match="use algo=sac"):
        compose("reach_ppo", ["intervention.mode=expert"])
    with pytest.raises(ConfigError, match="intervention.trigger"):
        compose("sac_pendulum", ["intervention.trigger=slow"])
    with pytest.raises(ConfigError, match="intervention.patience"):
        InterventionConfig(mode="expert", patience=0)
    with pytest.raises(ConfigError, match="go together"):
        InterventionConfig(mode="expert", patience_final=20)
    with pytest.raises(UserError, match="chunk_size=1") as error:
        ScriptedIntervener(InterventionConfig(mode="expert"), 2, 4)
    assert "\n" not in str(error.value)

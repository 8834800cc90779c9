"""Simulated interventions behind the actor/learner split: with the experiment's `intervention.mode=expert` a
simulated actor lets the env's scripted expert take over where the policy strays; those decisions arrive
flagged, join the learner's demo buffer, and the share the expert drove is in the episodes' outcomes."""

from __future__ import annotations

import numpy as np
import torch

from embodrl.config import compose
from embodrl.remote.actor import run_actor
from tests.remote.tiny import TABLETOP_SAC, connection, serving_learner

torch.set_num_threads(1)
EXPERT = [
    *TABLETOP_SAC,
    "env.num_envs=2",
    "env.max_episode_steps=12",
    "intervention.mode=expert",
    "intervention.threshold=0.05",  # uniform random actions always stray this far
    "intervention.patience=2",
    "intervention.steps=3",
]


def test_the_experts_takeovers_arrive_flagged_and_join_the_learners_demos(tmp_path):
    cfg = compose(None, EXPERT)
    with serving_learner(EXPERT, tmp_path / "learner") as learner:
        stats, _ = run_actor(
            cfg.env, connection(learner), batch_steps=6, decisions=48, intervention=cfg.intervention
        )
        arrivals = learner.intake.take()
        for arrival in arrivals:
            learner._take(arrival)
    assert stats.decisions == len(learner.buffer) == 48
    flags = np.concatenate([a.transitions["intervention"] for a in arrivals])
    # per env: 2 straying decisions, then 3 of the expert's, again and again (reset by episode ends)
    assert 0 < flags.sum() == len(learner.demos) < 48
    driven = np.concatenate([a.transitions["action"] for a in arrivals])[flags]
    np.testing.assert_array_equal(learner.demos.data["action"][: len(learner.demos)].numpy(), driven)
    summaries = [a.episodes for a in arrivals if a.episodes is not None]
    assert summaries and all(0 < s["intervention_rate"] < 1 for s in summaries)

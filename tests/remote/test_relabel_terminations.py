"""reward.model on the learner: the classifier's reward on what actors send, and the actors' own
terminations kept (an episode that really ended is never bootstrapped through), time limits not."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from tensordict import TensorDict

from embodrl.train.learned_reward_env import ClassifierReward


class FirstTwoSucceed:
    """A stand-in classifier: the first two next observations are successes, the others not."""

    spec = SimpleNamespace(obs_keys=("state",), shapes={"state": (3,)})

    def probability(self, obs: TensorDict) -> torch.Tensor:
        return torch.tensor([0.9, 0.9, 0.1, 0.1])


def _sent() -> TensorDict:
    """Four transitions as an actor sends them: 1 and 3 ended their episodes (terminated), 0 and 2 did not
    (running on, or cut by the time limit: a truncation, never flagged terminated)."""
    return TensorDict(
        {
            "obs": TensorDict({"state": torch.zeros(4, 3)}, batch_size=[4]),
            "action": torch.zeros(4, 1, 2),
            "reward": torch.tensor([0.0, 1.0, 0.0, 0.0]),
            "next_obs": TensorDict({"state": torch.ones(4, 3)}, batch_size=[4]),
            "terminated": torch.tensor([False, True, False, True]),
        },
        batch_size=[4],
    )


def test_the_actors_terminations_are_kept_beside_the_classifiers():
    relabelled = ClassifierReward(
        FirstTwoSucceed(), 0.5, terminate_on_success=False, seed=0
    ).relabel_transitions(_sent())
    assert relabelled["reward"].tolist() == [1.0, 1.0, 0.0, 0.0]  # the classifier's, never the actor's
    assert relabelled["terminated"].tolist() == [False, True, False, True]  # only the actor's own ends


def test_terminate_on_success_also_ends_where_the_classifier_predicts_success():
    relabelled = ClassifierReward(
        FirstTwoSucceed(), 0.5, terminate_on_success=True, seed=0
    ).relabel_transitions(_sent())
    assert relabelled["reward"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert relabelled["terminated"].tolist() == [True, True, False, True]  # 2: a time limit bootstraps

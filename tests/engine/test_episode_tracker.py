import pytest
import torch
from tensordict import TensorDict

from embodrl.engine.episode_tracker import EpisodeTracker, mean_over_ranks


def _per_decision(tracker, reward, steps, done, success, flag):
    """The slow reference: walk every decision of every env."""
    finished = []
    for t in range(reward.shape[0]):
        for i in range(reward.shape[1]):
            tracker["returns"][i] += float(reward[t, i].sum())
            tracker["lengths"][i] += int(steps[t, i])
            if done[t, i]:
                ret, length = tracker["returns"][i], tracker["lengths"][i]
                finished.append((ret, length, bool(success[t, i]), bool(flag[t, i])))
                tracker["returns"][i], tracker["lengths"][i] = 0.0, 0
    return finished


def test_record_rollout_matches_a_per_decision_walk_across_rollouts():
    gen = torch.Generator().manual_seed(0)
    t, n, c = 12, 5, 3
    tracker = EpisodeTracker.zeros(n)
    reference = {"returns": [0.0] * n, "lengths": [0] * n}
    for _ in range(3):  # episodes run across rollouts: the running sums carry over
        reward = torch.randn(t, n, c, generator=gen)
        steps = torch.randint(1, c + 1, (t, n), generator=gen)
        done = torch.rand(t, n, generator=gen) < 0.2
        done[:, 0] = False  # an env whose episode never ends here
        done[3, 1] = done[4, 1] = True  # back-to-back ends: a one-decision episode
        success = torch.rand(t, n, generator=gen) < 0.5
        flag = torch.rand(t, n, generator=gen) < 0.3  # an env's episode flag, read where episodes end
        expected = _per_decision(reference, reward, steps, done, success, flag)
        tracker.record_rollout(reward, steps, done, success, TensorDict({"flag": flag}, batch_size=[t, n]))
        assert len(tracker.finished) == len(expected)
        for outcome, (ret_ref, length_ref, ok_ref, flag_ref) in zip(tracker.finished, expected, strict=True):
            assert outcome["return"] == pytest.approx(ret_ref, abs=1e-4)
            assert (outcome["length"], outcome["success"], outcome["flag"]) == (length_ref, ok_ref, flag_ref)
        torch.testing.assert_close(tracker.returns, torch.tensor(reference["returns"]), atol=1e-4, rtol=0)
        assert tracker.lengths.tolist() == reference["lengths"]
        outcomes = tracker.pop()
        assert outcomes["episodes"] == len(expected) and tracker.finished == []
        assert outcomes["flag"] == pytest.approx(sum(e[3] for e in expected) / len(expected))


def test_a_resetting_rollout_counts_only_the_episodes_that_could_end_inside_it():
    """Episode limit 6 steps, chunks of 2: a whole episode takes 3 decisions, so in a 5-decision rollout
    only episodes that began at decisions 0-2 count. A quick success begun at decision 3 is dropped: its
    failing twin would still be running when the rollout ends."""
    t, n, c = 5, 3, 2
    reward = torch.zeros(t, n, c)
    steps = torch.full((t, n), c)
    done = torch.zeros(t, n, dtype=torch.bool)
    success = torch.zeros(t, n, dtype=torch.bool)
    done[2, 0] = True  # env 0: a failure at the limit (decisions 0-2), then a success in one decision
    done[3, 0] = success[3, 0] = True  # begun at decision 3: dropped
    done[0, 1] = success[0, 1] = True  # env 1: success at decision 0, another begun at 1 ends at 2
    done[2, 1] = success[2, 1] = True
    done[1, 2] = success[1, 2] = True  # env 2: a success at decision 1, then an episode still running
    counted = EpisodeTracker.zeros(n, episode_limit=6)
    counted.record_rollout(reward, steps, done, success)
    assert counted.pop() == {"episodes": 4.0, "return": 0.0, "length": 4.0, "success": 0.75}
    every = EpisodeTracker.zeros(n)  # rollouts that carry episodes over lose none: every end counts
    every.record_rollout(reward, steps, done, success)
    assert every.pop()["episodes"] == 5.0


def test_without_finished_episodes_every_outcome_is_still_named_and_ranks_report_only_the_count():
    """A rank whose envs finished no episode passes the same keys to the sum over ranks as the others."""
    tracker = EpisodeTracker.zeros(2)
    no = torch.zeros(3, 2, dtype=torch.bool)
    tracker.record_rollout(
        torch.zeros(3, 2, 1), torch.ones(3, 2, dtype=torch.long), no, no, TensorDict({"flag": no}, [3, 2])
    )
    outcomes = tracker.pop()
    assert set(outcomes) == {"episodes", "return", "length", "success", "flag"} and outcomes["episodes"] == 0
    assert mean_over_ranks(outcomes) == {"episodes": 0.0}
    assert mean_over_ranks({"episodes": 4.0, "success": 0.5, "flag": 0.25}) == {
        "episodes": 4.0,
        "success": 0.5,
        "flag": 0.25,
    }

"""`reward.model=CHECKPOINT`: the trainer's env, its reward and success replaced by a success classifier's.

The learner then never sees the simulator's success flag: the reward is sparse (1 at the last executed
action of a decision whose resulting observation the classifier calls a success), `success` is that
prediction, and the simulator's own success no longer ends episodes (env.terminate_on_success is turned
off). With `reward.terminate_on_success` an episode ends where the classifier predicts success, and its
env restarts from a random initial state (seeded). The simulator's flag is kept only to count how often
the classifier disagrees with it (`reward/*` metrics), which a real robot could not log.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict

from embodrl.engine.config import EngineConfig
from embodrl.engine.env_client import StagedEnv
from embodrl.errors import UserError
from embodrl.rewards.classifier import SuccessClassifier, load_classifier
from embodrl.rewards.config import RewardConfig
from embodrl.sims.base import StepResult, VecEnv
from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env
from embodrl.sims.wrapped import WrappedEnv

COUNTS = ("decisions", "predicted", "simulator", "false_positive", "false_negative")


class ClassifierReward:
    """Relabels step results with the classifier's reward and success, and counts its disagreements with
    the simulator's flag (module docstring)."""

    def __init__(
        self, classifier: SuccessClassifier, threshold: float, terminate_on_success: bool, seed: int
    ) -> None:
        self.classifier, self.threshold, self.terminate = classifier, threshold, terminate_on_success
        self.restarts = torch.Generator().manual_seed(seed)
        self.counts = dict.fromkeys(COUNTS, 0)

    def check(self, env: VecEnv) -> None:
        """A one-line error when the env does not observe what the classifier reads."""
        shapes = {k: tuple(spec.shape) for k, spec in env.observation_spec.items()}
        spec = self.classifier.spec
        wrong = {k: shapes.get(k) for k in spec.obs_keys if shapes.get(k) != spec.shapes[k]}
        if wrong:
            raise UserError(
                f"the reward model reads {dict((k, spec.shapes[k]) for k in wrong)} but the env "
                f"observes {wrong}; set env.obs_mode / env.image_size as the model was trained"
            )

    def judge(self, obs: TensorDict, simulator: torch.Tensor, ran: torch.Tensor) -> torch.Tensor:
        """Whether the classifier calls each observation [N] a success (False where nothing `ran`),
        counting its disagreements with the `simulator`'s flag [N]."""
        predicted = (self.classifier.probability(obs) > self.threshold).to(simulator.device)
        self.counts["decisions"] += int(ran.sum())
        self.counts["predicted"] += int((predicted & ran).sum())
        self.counts["simulator"] += int((simulator & ran).sum())
        self.counts["false_positive"] += int((predicted & ~simulator & ran).sum())
        self.counts["false_negative"] += int((~predicted & simulator & ran).sum())
        return predicted & ran

    def relabel(self, res: StepResult) -> StepResult:
        """`res` with the classifier's sparse reward and success on its resulting observations."""
        ran = res.steps_executed > 0  # a soft-failed stage's placeholder executed nothing
        predicted = self.judge(res.final_obs, res.success, ran)
        reward = torch.zeros_like(res.reward)
        last = (res.steps_executed - 1).clamp_min(0)
        reward[torch.arange(len(reward)), last] = predicted.to(reward.dtype)
        return res.with_fields(reward=reward, success=predicted)

    def terminated(self, own: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        """Where episodes end without bootstrapping: where the env itself terminated them (a time limit only
        truncates, so those keep bootstrapping) or, with terminate_on_success, the classifier predicts
        success."""
        return own | (predicted & self.terminate)

    def relabel_transitions(self, transitions: TensorDict) -> TensorDict:
        """Transitions [B] as an actor sent them (raw observations) with the classifier's sparse reward on
        `next_obs`: 1 where it predicts success; terminated where the actor's episode really ended or, with
        terminate_on_success, at that success (`terminated`). The actor's own reward > 0 is the flag its
        counts compare with (a simulator's sparse reward, a robot's task done)."""
        sent = transitions["reward"] > 0
        predicted = self.judge(transitions["next_obs"], sent, torch.ones_like(sent))
        transitions["reward"] = predicted.to(transitions["reward"].dtype)
        transitions["terminated"] = self.terminated(transitions["terminated"], predicted)
        return transitions

    def end_on_success(self, env: VecEnv, res: StepResult) -> StepResult:
        """With terminate_on_success: episodes the classifier calls done end (terminated, no bootstrap, also
        where the time limit truncated them at the same step), and their envs restart from random initial
        states (seeded); those the time limit ended have restarted already."""
        if not self.terminate or not res.success.any():
            return res
        obs, ended = res.obs, (res.success & ~res.done).nonzero().flatten()
        if len(ended):
            states = torch.randint(env.num_init_states, (len(ended),), generator=self.restarts)
            obs = res.obs.clone()
            obs[ended] = env.reset_to(states, ended)[ended]
        return res.with_fields(obs=obs, terminated=self.terminated(res.terminated, res.success))

    def pop_metrics(self) -> dict[str, float]:
        """Since the last call: how often the classifier predicted success, how often the simulator had
        it, and the shares of decisions where they disagree (false positives / negatives)."""
        counts, self.counts = self.counts, dict.fromkeys(COUNTS, 0)
        n = max(counts["decisions"], 1)
        return {
            "reward/predicted_success": counts["predicted"] / n,
            "reward/simulator_success": counts["simulator"] / n,
            "reward/disagreement": (counts["false_positive"] + counts["false_negative"]) / n,
            "reward/false_positive": counts["false_positive"] / n,
            "reward/false_negative": counts["false_negative"] / n,
        }


class LearnedRewardEnv(StagedEnv):
    """A StagedEnv whose step results carry the classifier's reward and success (module docstring)."""

    def __init__(
        self,
        env_cfg: EnvConfig,
        engine: EngineConfig,
        classifier: SuccessClassifier,
        threshold: float,
        terminate_on_success: bool = False,
        device: str = "cpu",
    ) -> None:
        if terminate_on_success and engine.schedule != "sequential":
            raise UserError(
                f"reward.terminate_on_success restarts envs between steps, which engine.schedule="
                f"{engine.schedule} does not allow; use engine.schedule=sequential"
            )
        super().__init__(dataclasses.replace(env_cfg, terminate_on_success=False), engine, device=device)
        self.judge = ClassifierReward(classifier, threshold, terminate_on_success, env_cfg.seed)
        self.judge.check(self)

    def recv_step(self, stage: int) -> StepResult:
        return self.judge.relabel(super().recv_step(stage))

    def step(self, actions: torch.Tensor) -> StepResult:
        # every stage through recv_step: the classifier's reward and success
        return self.judge.end_on_success(self, super().step(actions))

    def pop_metrics(self) -> dict[str, float]:
        return self.judge.pop_metrics()


class LearnedRewardVecEnv(WrappedEnv):
    """A simulator (VecEnv, built with env.terminate_on_success off) whose steps carry the classifier's
    reward and success: the off-policy runner's env for `reward.model`."""

    def __init__(self, env: VecEnv, judge: ClassifierReward) -> None:
        super().__init__(env)
        self.judge = judge
        judge.check(env)

    def step(self, actions: torch.Tensor) -> StepResult:
        return self.judge.end_on_success(self.env, self.judge.relabel(self.env.step(actions)))

    def pop_metrics(self) -> dict[str, float]:
        return self.judge.pop_metrics()


def load_judge(cfg: RewardConfig, device: str = "cpu") -> tuple[SuccessClassifier, float]:
    """`reward.model`'s classifier (a one-line error when it is not one) and its threshold."""
    classifier = load_classifier(cfg.model, device)
    return classifier, cfg.threshold if cfg.threshold is not None else classifier.spec.threshold


def learned_reward_env(
    cfg: RewardConfig, env_cfg: EnvConfig, engine: EngineConfig, device: str = "cpu"
) -> LearnedRewardEnv:
    """The trainer's env for `reward.model`."""
    return LearnedRewardEnv(env_cfg, engine, *load_judge(cfg, device), cfg.terminate_on_success, device)


def learned_reward_vecenv(cfg: RewardConfig, env_cfg: EnvConfig, device: str = "cpu") -> LearnedRewardVecEnv:
    """The simulator of `env_cfg` (its own success no longer ending episodes) behind `reward.model`."""
    judge = ClassifierReward(*load_judge(cfg, device), cfg.terminate_on_success, env_cfg.seed)
    env = make_env(dataclasses.replace(env_cfg, terminate_on_success=False), device=device)
    return LearnedRewardVecEnv(env, judge)

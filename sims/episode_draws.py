"""The per-episode draws of env.randomize, shared by the suites that implement the axes (tabletop, LIBERO).

Every draw of an episode is a function of env.randomize.seed, the axis and the episode's initial-state id
alone: a level changes the size of a perturbation, never its direction, and the same state id gets the
same perturbation in every split of the envs.
"""

from __future__ import annotations

import numpy as np

from embodrl.sims.perturbation import AXES, RandomizeConfig

SALT = 0x9E27B  # separates perturbation streams from layouts and auto-reset draws
PROPRIO_STD = 0.005  # per unit of severity
ACTION_STD = 0.1  # of the action range [-1, 1], per unit of severity


def level_of(severity: float) -> int:
    """The whole step of a severity (axes that count: latency steps, text levels, distractors)."""
    return int(np.floor(severity + 0.5))


class EpisodeDraws:
    """The severities and random streams of the axes env.randomize turns on."""

    def __init__(self, cfg: RandomizeConfig) -> None:
        self.cfg = cfg
        self.axes = list(cfg.active)
        self._axis_id = {axis: i for i, axis in enumerate(AXES)}

    def severity(self, axis: str, state_id: int) -> float:
        top = self.cfg.severities()[axis]
        if self.cfg.exact:
            return top
        draw = np.random.default_rng([SALT, self.cfg.seed, self._axis_id[axis], state_id, 0])
        return float(draw.uniform(0, top))

    def rng(self, axis: str, state_id: int, *more: int) -> np.random.Generator:
        """The episode's draws of `axis` (directions, signs, places): the same at every severity."""
        return np.random.default_rng([SALT, self.cfg.seed, self._axis_id[axis], state_id, 1, *more])

    def step_noise(
        self, axis: str, std: float, shape: tuple[int, ...], state_ids: np.ndarray, steps: np.ndarray
    ) -> np.ndarray:
        """[n, *shape] Gaussian noise of `std` per unit of the axis's severity: a function of the episode
        and its step alone, so an observation read twice (a reset of other envs) is the same."""
        return np.stack(
            [
                self.rng(axis, int(s), int(t)).normal(size=shape) * std * self.severity(axis, int(s))
                for s, t in zip(state_ids, steps, strict=True)
            ]
        )

    def noisy_state(self, state: np.ndarray, state_ids: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """`state` [n, D] with proprioceptive noise."""
        if "proprio_noise" not in self.axes:
            return state
        return state + self.step_noise("proprio_noise", PROPRIO_STD, state.shape[1:], state_ids, steps)

    def noisy_action(self, action: np.ndarray, state_ids: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """The executed actions [n, A] with actuation noise, clipped to the action range."""
        if "action_noise" not in self.axes:
            return action
        noise = self.step_noise("action_noise", ACTION_STD, action.shape[1:], state_ids, steps)
        return np.clip(action + noise, -1.0, 1.0).astype(action.dtype)

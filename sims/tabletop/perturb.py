"""The tabletop env's perturbations (env.randomize): per-episode draws, and the hooks the env calls at
reset (its MjModel, the layout), on the instruction table, on observations and on actions.

Every draw of an episode is a function of env.randomize.seed, the axis and the episode's initial-state
id (sims/episode_draws.py): a level changes the size of a perturbation, never its direction, and nominal
objects keep their places.
"""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np

from embodrl.sims.episode_draws import SALT, EpisodeDraws, level_of
from embodrl.sims.perturbation import MODEL_AXES, TEXT_AXES, RandomizeConfig
from embodrl.sims.tabletop import paraphrase
from embodrl.sims.tabletop.layout import (
    EE_START_HIGH,
    EE_START_LOW,
    MAX_CUBE_YAW,
    OBJECT_HIGH,
    OBJECT_LOW,
    RADIUS,
    Layout,
    is_free,
)
from embodrl.sims.tabletop.perturb_model import MODEL_EDITS, NEEDS_SET_CONST, ModelParts
from embodrl.sims.tabletop.scene import SceneIndex
from embodrl.sims.tabletop.tasks import COLOR_NAMES, TASKS, Instruction

SPAWN_WIDENING = 0.2  # of the start regions, per unit of severity
DISTRACTORS_PER_UNIT = 2
OBJECT_STD = 0.005  # m per unit of severity


class Perturbations(EpisodeDraws):
    """What env.randomize does to one TabletopEnv."""

    def __init__(
        self, cfg: RandomizeConfig, model: mujoco.MjModel, idx: SceneIndex, table: list[Instruction]
    ) -> None:
        super().__init__(cfg)
        self._nominal = model
        self._parts = ModelParts.of(model, idx)
        self._scratch = mujoco.MjData(model)
        self.model_axes = [a for a in self.axes if a in MODEL_AXES]
        self.text_axis = next((a for a in self.axes if a in TEXT_AXES), None)  # one at most (RandomizeConfig)
        self._table = table
        # the shown table holds every level up to the largest: task id = entry + len(table) * level
        top = level_of(cfg.severities()[self.text_axis]) if self.text_axis else 0
        self.shown_table = [
            self._text(entry, i, level) for level in range(top + 1) for i, entry in enumerate(table)
        ]

    @property
    def adds_objects(self) -> bool:
        return "distractors" in self.axes or self.text_axis == "conflict"

    # ---- the MjModel -------------------------------------------------------------------------------
    def edit_model(self, model: mujoco.MjModel, state_id: int) -> None:
        """Env `model` (a copy of the nominal one) as the episode from `state_id` perturbs it."""
        for axis in self.model_axes:
            severity = self.severity(axis, state_id)
            MODEL_EDITS[axis](model, self._nominal, self._parts, self.rng(axis, state_id), severity)
        if NEEDS_SET_CONST & set(self.model_axes):
            mujoco.mj_setConst(model, self._scratch)

    # ---- the initial state -------------------------------------------------------------------------
    def edit_layout(self, layout: Layout, state_id: int) -> Layout:
        """The nominal layout with objects added, then the start regions widened (each axis that is on)."""
        objects = {kind: dict(placed) for kind, placed in layout.objects.items()}
        entry = self._table[layout.instruction]
        if self.text_axis == "conflict" and level_of(self.severity("conflict", state_id)) >= 2:
            kind = TASKS[entry.task].main
            _add(objects, kind, paraphrase.contradicting_colour(entry), self.rng("conflict", state_id))
        if "distractors" in self.axes:
            rng = self.rng("distractors", state_id)
            unused = [(k, c) for k in RADIUS for c in range(len(COLOR_NAMES)) if c not in objects.get(k, {})]
            count = DISTRACTORS_PER_UNIT * level_of(self.severity("distractors", state_id))
            for n in rng.permutation(len(unused))[:count]:
                _add(objects, *unused[n], rng)
        turn = np.random.default_rng([SALT, self.cfg.seed, state_id, 2])  # added cubes' yaw
        cube_yaw = {
            c: layout.cube_yaw.get(c, float(turn.uniform(-MAX_CUBE_YAW, MAX_CUBE_YAW)))
            for c in sorted(objects.get("cube", {}))
        }
        ee_start = layout.ee_start
        if "spawn" in self.axes:
            widen = 1.0 + SPAWN_WIDENING * self.severity("spawn", state_id)
            objects = {
                kind: {c: _widen(xy, OBJECT_LOW, OBJECT_HIGH, widen) for c, xy in placed.items()}
                for kind, placed in objects.items()
            }
            ee_start = _widen(ee_start, EE_START_LOW[:2], EE_START_HIGH[:2], widen)
        return dataclasses.replace(layout, objects=objects, cube_yaw=cube_yaw, ee_start=ee_start)

    # ---- instructions ------------------------------------------------------------------------------
    def _text(self, entry: Instruction, index: int, level: int) -> str:
        if self.text_axis == "instruction":
            return paraphrase.paraphrase(entry, level)
        if self.text_axis == "conflict":
            return paraphrase.conflict(entry, index, level)
        return entry.text

    def shown_instruction(self, instruction: int, state_id: int) -> int:
        """The index into `shown_table` of the text an episode's instruction is given as."""
        if self.text_axis is None:
            return instruction
        return instruction + len(self._table) * level_of(self.severity(self.text_axis, state_id))

    # ---- observations and actions ------------------------------------------------------------------
    def noisy_objects(
        self, main: np.ndarray, goal: np.ndarray, same: np.ndarray, state_ids: np.ndarray, steps: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The observed positions [n, 3] of the instructed object and the goal with estimation noise; where
        `same` ([n] bool: the task has no goal object), the goal is the object and reads its noise."""
        if "object_noise" not in self.axes:
            return main, goal
        noise = self.step_noise("object_noise", OBJECT_STD, (2, 3), state_ids, steps)
        return main + noise[:, 0], goal + np.where(same[:, None], noise[:, 0], noise[:, 1])

    def delay_steps(self, state_id: int) -> int:
        return level_of(self.severity("latency", state_id)) if "latency" in self.axes else 0

    @property
    def max_delay(self) -> int:
        return level_of(self.cfg.latency)


def _add(objects: dict[str, dict[int, np.ndarray]], kind: str, color: int, rng: np.random.Generator) -> None:
    """Place an object of `kind` and `color` where it overlaps nothing (left out where the table is full)."""
    if color in objects.get(kind, {}):
        return
    placed = [(xy, RADIUS[k]) for k, v in objects.items() for xy in v.values()]
    for _ in range(1000):
        xy = rng.uniform(OBJECT_LOW, OBJECT_HIGH)
        if is_free(xy, RADIUS[kind], placed):
            if kind == "target":  # they float above the table, as the layout's
                xy = np.array([*xy, rng.uniform(0.05, 0.25)])
            objects.setdefault(kind, {})[color] = xy
            return


def _widen(pos: np.ndarray, low: np.ndarray, high: np.ndarray, factor: float) -> np.ndarray:
    """`pos` moved away from the centre of the region [low, high] (in x and y) by `factor`."""
    centre = (low + high) / 2
    out = pos.copy()
    out[:2] = centre + (pos[:2] - centre) * factor
    return out


class ActionDelay:
    """Latency: each env executes the action of `delay` control steps ago (a hold action before)."""

    def __init__(self, num_envs: int, max_delay: int, action_dim: int):
        self._queue = np.zeros((num_envs, max_delay + 1, action_dim))  # oldest first, newest last
        self._delay = np.zeros(num_envs, dtype=np.int64)

    def reset(self, env_ids: np.ndarray, delays: np.ndarray, hold: np.ndarray) -> None:
        self._queue[env_ids] = hold[:, None]
        self._delay[env_ids] = delays

    def __call__(self, action: np.ndarray) -> np.ndarray:
        self._queue[:, :-1] = self._queue[:, 1:]
        self._queue[:, -1] = action
        last = self._queue.shape[1] - 1
        return self._queue[np.arange(len(action)), last - self._delay].astype(action.dtype)

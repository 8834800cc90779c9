"""Initial states: a state id deterministically picks the instruction and the object layout.

The same id always gives the same layout (a numpy generator seeded by the id alone), which is
what GRPO groups and fixed evaluation sets need.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embodrl.sims.tabletop.tasks import COLOR_NAMES, TASKS, Instruction

NUM_INIT_STATES = 100_000
OBJECT_LOW = np.array([0.35, -0.25])  # xy region where objects are placed
OBJECT_HIGH = np.array([0.65, 0.25])
EE_START_LOW = np.array([0.35, -0.12, 0.22])
EE_START_HIGH = np.array([0.5, 0.12, 0.32])
MAX_CUBE_YAW = np.pi / 6
_SALT = 0x7AB1E  # separates layout streams from other users of the same integers
# clearance radius per kind, so objects never start overlapping
PUSH_DISTANCE = (0.1, 0.18)  # m from the cube to its plate, so a push fits the horizon
RADIUS = {"cube": 0.045, "bowl": 0.085, "target": 0.03, "plate": 0.06, "button": 0.06}


@dataclass
class Layout:
    """Where every used object starts; kinds map colour index -> xy (or xyz for targets)."""

    instruction: int
    objects: dict[str, dict[int, np.ndarray]]
    cube_yaw: dict[int, float]
    ee_start: np.ndarray  # [3]


def is_free(xy: np.ndarray, radius: float, placed: list[tuple[np.ndarray, float]]) -> bool:
    """An object of `radius` at `xy` keeps clear of every (position, radius) in `placed`."""
    return all(np.linalg.norm(xy - p[:2]) > radius + r for p, r in placed)


def sample_layout(state_id: int, table: list[Instruction], distractors: bool) -> Layout:
    """The initial state with id `state_id` for an env with instruction table `table`."""
    rng = np.random.default_rng([_SALT, int(state_id)])
    tasks = list(
        dict.fromkeys(e.task for e in table)
    )  # each task equally likely, whatever its template count
    task = tasks[int(rng.integers(len(tasks)))]
    choices = [i for i, e in enumerate(table) if e.task == task]
    instruction = choices[int(rng.integers(len(choices)))]
    entry = table[instruction]
    spec = TASKS[entry.task]
    wanted = [(spec.main, entry.main)]
    if spec.goal:
        wanted.append((spec.goal, entry.goal))
    if distractors:  # one or two more of each kind, in colours the instruction does not name
        kinds = {spec.main} | ({spec.goal} if spec.goal else set())
        for kind in sorted(kinds):
            used = {c for k, c in wanted if k == kind}
            free = [c for c in range(len(COLOR_NAMES)) if c not in used]
            count = int(rng.integers(1, 3))
            wanted += [(kind, int(c)) for c in rng.choice(free, size=min(count, len(free)), replace=False)]
    objects: dict[str, dict[int, np.ndarray]] = {}
    placed: list[tuple[np.ndarray, float]] = []
    for n, (kind, color) in enumerate(wanted):
        radius = RADIUS[kind]
        for _ in range(1000):
            xy = rng.uniform(OBJECT_LOW, OBJECT_HIGH)
            free = is_free(xy, radius, placed)
            if n == 1 and kind == "plate":  # the goal plate of a push
                free &= PUSH_DISTANCE[0] < np.linalg.norm(xy - placed[0][0]) < PUSH_DISTANCE[1]
            if free:
                break
        placed.append((xy, radius))
        if kind == "target":  # reach targets float above the table
            xy = np.array([*xy, rng.uniform(0.05, 0.25)])
        objects.setdefault(kind, {})[color] = xy
    cube_yaw = {c: float(rng.uniform(-MAX_CUBE_YAW, MAX_CUBE_YAW)) for c in objects.get("cube", {})}
    return Layout(instruction, objects, cube_yaw, rng.uniform(EE_START_LOW, EE_START_HIGH))

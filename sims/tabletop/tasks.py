"""Tabletop tasks and suites: names, instruction templates, which objects each task places.

Import-light (no mujoco): `embodrl envs` lists these without building a simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.85, 0.1, 0.1),
    "green": (0.1, 0.65, 0.15),
    "blue": (0.1, 0.25, 0.9),
    "yellow": (0.95, 0.8, 0.1),
}
COLOR_NAMES = tuple(COLORS)


@dataclass(frozen=True)
class TaskSpec:
    """One task: its object kinds and the instruction templates that name their colours.

    `main` is the object the robot acts on, `goal` the kind of the second object (or None);
    templates use {main} and {goal} for the colour names.
    """

    name: str
    main: str  # object kind: cube | target | button
    goal: str | None  # object kind: plate | bowl | cube | None
    templates: tuple[str, ...]


TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec(
            "reach",
            "target",
            None,
            ("reach the {main} target", "move the gripper to the {main} ball", "touch the {main} sphere"),
        ),
        TaskSpec(
            "push",
            "cube",
            "plate",
            ("push the {main} cube onto the {goal} plate", "slide the {main} block to the {goal} goal"),
        ),
        TaskSpec("pick", "cube", None, ("pick up the {main} cube", "lift the {main} block")),
        TaskSpec(
            "place",
            "cube",
            "bowl",
            ("put the {main} cube in the {goal} bowl", "place the {main} block into the {goal} bowl"),
        ),
        TaskSpec(
            "stack",
            "cube",
            "cube",
            ("stack the {main} cube on the {goal} cube", "put the {main} block on top of the {goal} block"),
        ),
        TaskSpec("press", "button", None, ("press the {main} button", "push down the {main} button")),
    )
}
TASK_NAMES = tuple(TASKS)


@dataclass(frozen=True)
class SuiteSpec:
    """A group of tasks; `distractors` adds objects of other colours so the instruction matters."""

    name: str
    tasks: tuple[str, ...]
    distractors: bool


SUITES: dict[str, SuiteSpec] = {
    "tabletop-basic": SuiteSpec("tabletop-basic", TASK_NAMES, distractors=False),
    "tabletop-lang": SuiteSpec("tabletop-lang", TASK_NAMES, distractors=True),
}


@dataclass(frozen=True)
class Instruction:
    """One entry of an env's instruction table."""

    task: str
    template: int
    main: int  # colour index of the main object
    goal: int  # colour index of the goal object (-1 when the task has none)
    text: str


def instruction_entries(tasks: tuple[str, ...]) -> list[Instruction]:
    """Every instruction the given tasks can produce, in a fixed order."""
    out = []
    n = len(COLOR_NAMES)
    for name in tasks:
        spec = TASKS[name]
        for k, template in enumerate(spec.templates):
            pairs = product(range(n), range(n) if spec.goal else [-1])
            for main, goal in pairs:
                if spec.goal == spec.main and main == goal:  # stacking a cube on itself
                    continue
                text = template.format(main=COLOR_NAMES[main], goal=COLOR_NAMES[goal] if goal >= 0 else "")
                out.append(Instruction(name, k, main, goal, text))
    return out

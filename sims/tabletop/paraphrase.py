"""Instruction texts a policy never saw in training, for the instruction and conflict perturbation axes.

Import-light (no mujoco). Every text is a function of the table entry and the level alone.
"""

from __future__ import annotations

import functools
import re

from embodrl.sims.tabletop.tasks import COLOR_NAMES, TASKS, Instruction

# word -> a synonym the training templates never use
SYNONYMS = {
    "cube": "box",
    "block": "brick",
    "target": "marker",
    "ball": "marker",
    "sphere": "orb",
    "plate": "pad",
    "goal": "pad",
    "bowl": "dish",
    "button": "switch",
    "pick up": "grab",
    "lift": "raise",
    "push": "shove",
    "slide": "shove",
    "put": "set",
    "place": "drop",
    "stack": "pile",
    "press": "hit",
    "reach": "go to",
    "touch": "tap",
    "move": "bring",
    "gripper": "hand",
}

# one template per task in words none of the training templates use
UNSEEN_TEMPLATES = {
    "reach": "bring your hand to the {main} target",
    "push": "move the {main} cube until it rests on the {goal} plate",
    "pick": "raise the {main} cube off the table",
    "place": "drop the {main} cube inside the {goal} bowl",
    "stack": "set the {main} cube onto the {goal} cube",
    "press": "hit the {main} button",
}
FILLER = "please, when you are ready, {text}, thank you"
# texts that ask for nothing on the table
IRRELEVANT = (
    "what a lovely day it is outside",
    "tell me a story about a ship",
    "the meeting moved to three o'clock",
    "count the clouds in the sky",
)


def _colours(entry: Instruction, main: int) -> dict[str, str]:
    return {"main": COLOR_NAMES[main], "goal": COLOR_NAMES[entry.goal] if entry.goal >= 0 else ""}


@functools.cache
def _any_of(words: tuple[str, ...]) -> re.Pattern:
    return re.compile(r"\b(" + "|".join(sorted(map(re.escape, words), key=len, reverse=True)) + r")\b")


def synonyms(text: str, table: dict[str, str] = SYNONYMS) -> str:
    """`text` with every word (or phrase) of `table` replaced by its synonym, longest first."""
    return _any_of(tuple(table)).sub(lambda m: table[m.group(0)], text)


def paraphrase(entry: Instruction, level: int) -> str:
    """Level 0: the training text; 1: synonyms; 2: an unseen template; 3: both, inside filler words."""
    if level <= 0:
        return entry.text
    if level == 1:
        return synonyms(entry.text)
    unseen = UNSEEN_TEMPLATES[entry.task].format(**_colours(entry, entry.main))
    return unseen if level == 2 else FILLER.format(text=synonyms(unseen))


def contradicting_colour(entry: Instruction) -> int:
    """Another colour of the main object's kind: the next one that is neither the main nor the goal's."""
    n = len(COLOR_NAMES)
    return next((entry.main + k) % n for k in range(1, n) if (entry.main + k) % n != entry.goal)


def conflict(entry: Instruction, index: int, level: int) -> str:
    """Level 0: the training text; 1: an irrelevant text; 2: the training template naming another object
    of the main kind (the layout places it, so the policy can follow either)."""
    if level <= 0:
        return entry.text
    if level == 1:
        return IRRELEVANT[index % len(IRRELEVANT)]
    template = TASKS[entry.task].templates[entry.template]
    return template.format(**_colours(entry, contradicting_colour(entry)))

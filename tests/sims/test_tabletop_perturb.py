"""The tabletop perturbation axes: each changes what it claims, deterministically from the seed, with the
nominal initial state kept at every level (sims/tabletop/perturb.py)."""

import numpy as np
import pytest
import torch

from embodrl.sims.config import EnvConfig
from embodrl.sims.episode_draws import ACTION_STD, PROPRIO_STD
from embodrl.sims.perturbation import RandomizeConfig, exact
from embodrl.sims.registry import make_env
from embodrl.sims.tabletop import physics
from embodrl.sims.tabletop.layout import OBJECT_HIGH, OBJECT_LOW
from embodrl.sims.tabletop.perturb import OBJECT_STD, SPAWN_WIDENING
from embodrl.sims.tabletop.scene import PARK_X
from embodrl.sims.tabletop.tasks import COLOR_NAMES

STATES = torch.tensor([0, 7])


def _env(randomize=None, **kw):
    cfg = {"num_envs": 2, "suite": "tabletop-lang", "task": "pick", **kw}
    return make_env(EnvConfig(**cfg, randomize=randomize or RandomizeConfig()))


def _start(randomize=None, **kw):
    env = _env(randomize, **kw)
    obs = env.reset_to(STATES)
    return env, obs


def _placed(env) -> np.ndarray:
    """[N, slots] bool: the object slots on the table (not parked)."""
    return env._object_positions()[..., 0] < PARK_X / 2


@pytest.mark.parametrize("axis", ["camera", "lighting", "color"])
def test_image_axes_change_the_image_and_nothing_else(axis):
    nominal, seen = _start(obs_mode="rgb")
    env, obs = _start(exact(axis, 2), obs_mode="rgb")
    assert not torch.equal(obs["rgb"], seen["rgb"])
    assert torch.equal(obs["state"], seen["state"]) and np.array_equal(env.physics.qpos, nominal.physics.qpos)
    again = _start(exact(axis, 2), obs_mode="rgb")[1]
    assert torch.equal(again["rgb"], obs["rgb"])  # a function of the seed and the state ids
    other_seed = _start(RandomizeConfig(**{axis: 2}, exact=True, seed=1), obs_mode="rgb")[1]
    assert not torch.equal(other_seed["rgb"], obs["rgb"])


def test_a_level_scales_the_same_draw():
    nominal = _env().model
    offsets = [
        _start(exact("camera", level), obs_mode="rgb")[0].physics.model_of(1).cam_pos[0] for level in (1, 2)
    ]
    assert np.allclose(offsets[1] - nominal.cam_pos[0], 2 * (offsets[0] - nominal.cam_pos[0]))
    assert np.isclose(np.linalg.norm(offsets[0] - nominal.cam_pos[0]), 0.03)


@pytest.mark.parametrize(
    ("axis", "read", "factor"),
    [
        ("friction", lambda m: m.geom_friction[:, 0], 1.3**2),
        ("mass", lambda m: m.body_mass, 1.6**2),
        ("gains", lambda m: m.actuator_gainprm[:, 0], 1.3**2),
    ],
)
def test_dynamics_axes_scale_the_mjmodel_of_each_env(axis, read, factor):
    env, _ = _start(exact(axis, 2))
    nominal = read(env.model)
    for i in range(2):
        ratio = read(env.physics.model_of(i))[nominal > 0] / nominal[nominal > 0]
        changed = ratio[~np.isclose(ratio, 1.0)]
        assert len(changed) and np.allclose(changed, factor) | np.allclose(changed, 1 / factor)
    assert np.array_equal(read(env.model), nominal)  # the nominal model stays as compiled


def test_size_scales_the_cubes_and_starts_them_on_the_table():
    env, _ = _start(exact("size", 3))
    for i in range(2):
        half = env.physics.model_of(i).geom_size[env.idx.cube_geom, 2]
        assert np.allclose(half / 0.0225, 1.18) or np.allclose(half / 0.0225, 0.82)
        cubes = _placed(env)[i, : len(COLOR_NAMES)]
        z = env.physics.qpos[i, env.idx.cube_qpos + 2]
        assert np.allclose(z[cubes], half[cubes])


def test_distractors_add_objects_and_keep_the_nominal_ones_in_place():
    nominal, _ = _start()
    env, _ = _start(exact("distractors", 2))
    before, after = _placed(nominal), _placed(env)
    assert (after.sum(1) == before.sum(1) + 4).all() and (after >= before).all()
    assert np.array_equal(env._object_positions()[before], nominal._object_positions()[before])
    assert env.episode_flag_names == ("wrong_object",)


def test_distractors_apply_to_tabletop_basic_beside_the_instructed_cube():
    nominal, seen = _start(suite="tabletop-basic")
    env, obs = _start(exact("distractors", 1), suite="tabletop-basic")
    before, after = _placed(nominal), _placed(env)
    assert (before.sum(1) == 1).all() and (after.sum(1) == 3).all() and (after >= before).all()
    assert torch.equal(obs["privileged"], seen["privileged"])  # the instructed cube keeps its place
    again = _start(exact("distractors", 1), suite="tabletop-basic")[0]
    assert np.array_equal(again._object_positions(), env._object_positions())
    level_0 = _start(exact("distractors", 0), suite="tabletop-basic")[0]
    assert np.array_equal(level_0._object_positions(), nominal._object_positions())


def test_spawn_widens_the_start_region_about_its_centre():
    nominal, _ = _start()
    env, _ = _start(exact("spawn", 2))
    placed = _placed(nominal)
    centre = (OBJECT_LOW + OBJECT_HIGH) / 2
    widened = centre + (nominal._object_positions()[placed][:, :2] - centre) * (1 + 2 * SPAWN_WIDENING)
    assert np.allclose(env._object_positions()[placed][:, :2], widened)


def test_instruction_texts_are_unseen_and_keep_the_task():
    nominal, seen = _start()
    env, obs = _start(exact("instruction", 2))
    colours = [text.split()[-2] for text in nominal.instructions(seen["task_id"])]  # "pick up the red cube"
    assert env.instructions(obs["task_id"]) == [f"raise the {c} cube off the table" for c in colours]
    assert not set(env.instructions(obs["task_id"])) & set(nominal.instruction_table)
    assert np.array_equal(env.physics.qpos, nominal.physics.qpos)
    assert [env.instruction_tasks[i] for i in obs["task_id"].tolist()] == ["pick"] * len(colours)


def test_a_contradicting_instruction_names_another_object_that_is_in_the_scene():
    nominal, seen = _start()
    env, obs = _start(exact("conflict", 2))
    for i, (was, now) in enumerate(
        zip(nominal.instructions(seen["task_id"]), env.instructions(obs["task_id"]), strict=True)
    ):
        colour, named = was.split()[-2], now.split()[-2]
        assert named != colour and was.replace(colour, named) == now
        assert _placed(env)[i, COLOR_NAMES.index(named)]  # that cube is on the table too
    irrelevant, obs = _start(exact("conflict", 1))
    assert not {"cube", "block"} & set(" ".join(irrelevant.instructions(obs["task_id"])).split())


def test_proprio_noise_perturbs_the_state_alone_and_reads_the_same_twice():
    _, seen = _start()
    env, obs = _start(exact("proprio_noise", 2))
    noise = (obs["state"] - seen["state"]).numpy()
    assert 0.5 * 2 * PROPRIO_STD < noise.std() < 2 * 2 * PROPRIO_STD
    assert torch.equal(obs["privileged"], seen["privileged"])
    again = env.reset_to(torch.tensor([7]), torch.tensor([1]))  # env 0 is observed again, unchanged
    assert torch.equal(again["state"][0], obs["state"][0])
    assert not torch.equal(env.step(torch.zeros(2, 1, 7)).obs["state"], obs["state"])


# privileged: main position 0:3, quaternion 3:7, goal 7:10, main - ee 10:13, goal - main 13:16
def test_object_noise_moves_the_observed_object_consistently_and_nothing_else():
    nominal, seen = _start()
    env, obs = _start(exact("object_noise", 2))
    error = (obs["privileged"] - seen["privileged"]).numpy()
    assert 0.5 * 2 * OBJECT_STD < error[:, 0:3].std() < 2 * 2 * OBJECT_STD
    assert np.allclose(error[:, 10:13], error[:, 0:3], atol=1e-6)  # main - ee reads the same estimate
    assert np.allclose(error[:, 7:10], error[:, 0:3], atol=1e-6)  # pick: the goal is the cube itself
    assert np.allclose(error[:, 13:], 0, atol=1e-6) and np.allclose(error[:, 3:7], 0)
    assert torch.equal(obs["state"], seen["state"]) and np.array_equal(env.physics.qpos, nominal.physics.qpos)
    level_1 = _start(exact("object_noise", 1))[1]["privileged"] - seen["privileged"]
    assert np.allclose(error[:, 0:3], 2 * level_1[:, 0:3].numpy(), atol=1e-6)  # a level scales the draw
    assert torch.equal(_start(exact("object_noise", 0))[1]["privileged"], seen["privileged"])
    again = env.reset_to(torch.tensor([7]), torch.tensor([1]))
    assert torch.equal(again["privileged"][0], obs["privileged"][0])


def test_object_noise_gives_a_goal_object_its_own_error():
    tasks = {"task": "stack"}
    _, seen = _start(**tasks)
    _, obs = _start(exact("object_noise", 2), **tasks)
    error = (obs["privileged"] - seen["privileged"]).numpy()
    assert not np.allclose(error[:, 7:10], error[:, 0:3], atol=1e-4)
    assert np.allclose(error[:, 13:16], error[:, 7:10] - error[:, 0:3], atol=1e-6)


def test_action_noise_perturbs_the_executed_actions_deterministically():
    env, _ = _start(exact("action_noise", 2))
    still = np.zeros((2, 7))
    noisy = env._perturb.noisy_action(still, np.array([0, 7]), np.array([0, 0]))
    assert np.array_equal(noisy, env._perturb.noisy_action(still, np.array([0, 7]), np.array([0, 0])))
    assert 0.5 * 2 * ACTION_STD < noisy.std() < 2 * 2 * ACTION_STD
    assert not np.array_equal(noisy, env._perturb.noisy_action(still, np.array([0, 7]), np.array([1, 1])))
    assert np.abs(env._perturb.noisy_action(np.ones((2, 7)), np.array([0, 7]), np.array([0, 0]))).max() <= 1
    hold = torch.zeros(2, 3, 7)
    hold[..., -1] = -1
    runs = [_start(randomize)[0] for randomize in (None, exact("action_noise", 2), exact("action_noise", 2))]
    for run in runs:
        run.step(hold)
    assert not np.allclose(runs[1].physics.qpos, runs[0].physics.qpos)
    assert np.array_equal(runs[1].physics.qpos, runs[2].physics.qpos)


def test_latency_executes_each_action_k_steps_later():
    actions = torch.rand(4, 2, 1, 7) * 2 - 1
    delayed, _ = _start(exact("latency", 2))
    for a in actions:
        delayed.step(a)
    nominal, _ = _start()
    hold = torch.zeros(2, 1, 7)
    hold[..., -1] = -1
    for a in [hold, hold, *actions[:2]]:
        nominal.step(a)
    assert np.allclose(delayed.physics.qpos, nominal.physics.qpos)


def test_training_randomization_draws_severities_per_episode_up_to_the_range():
    env = _env(RandomizeConfig(friction=2), num_envs=8)
    env.reset_to(torch.arange(8))
    scales = (
        np.array([env.physics.model_of(i).geom_friction[0, 0] for i in range(8)])
        / env.model.geom_friction[0, 0]
    )
    assert len(np.unique(scales.round(6))) == 8 and (np.abs(np.log(scales)) <= 2 * np.log(1.3) + 1e-9).all()


def test_the_loop_backend_runs_the_same_per_env_models(monkeypatch):
    randomize = RandomizeConfig(friction=3, mass=3, lighting=3)
    batched, _ = _start(randomize, obs_mode="rgb")
    monkeypatch.setattr(physics, "_mj_batch", None)
    looped, _ = _start(randomize, obs_mode="rgb")
    assert isinstance(looped.physics, physics.LoopPhysics)
    for _ in range(10):
        ra = batched.step(batched.expert_actions())
        rb = looped.step(looped.expert_actions())
    assert torch.allclose(ra.obs["privileged"], rb.obs["privileged"], atol=1e-5)
    assert torch.equal(ra.obs["rgb"], rb.obs["rgb"])

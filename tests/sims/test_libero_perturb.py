"""env.randomize through the LIBERO adapter and LIBERO-PRO's perturbed suites (sims/libero/perturb.py,
paraphrase.py, loader.py); they run in .venv-libero (`make test-libero`), LIBERO pins mujoco<4."""

import numpy as np
import pytest
import torch

from embodrl.sims.config import EnvConfig
from embodrl.sims.perturbation import RandomizeConfig, exact
from embodrl.sims.registry import make_env

pytest.importorskip("libero.libero", reason="LIBERO not installed here: run `make test-libero`")

from embodrl.sims.libero.loader import PRO_VARIANTS, load_suite  # noqa: E402
from embodrl.sims.libero.paraphrase import load_paraphrases  # noqa: E402
from embodrl.sims.libero.perturb import (  # noqa: E402
    JOINT_TURN,
    OBJECT_SHIFT,
    LiberoPerturbations,
    movable_bodies,
)

STATE = torch.tensor([3])


def _cfg(**overrides) -> EnvConfig:
    base = dict(
        suite="libero-spatial", task="0", num_envs=1, num_threads=1, max_episode_steps=20, image_size=64
    )
    return EnvConfig(**{**base, **overrides})


def _task_env(env):
    """The in-process LiberoTaskEnv of a one-worker VecEnv's first env."""
    return env._groups[0].envs[0]


@pytest.fixture(scope="module")
def nominal():
    env = make_env(_cfg(obs_mode="rgb"))
    yield env
    env.close()


def _camera_shift(model, nominal_model) -> np.ndarray:
    return np.linalg.norm(model.cam_pos - nominal_model.cam_pos, axis=1)  # m, per camera


def _light_tilt(model, nominal_model) -> np.ndarray:
    cos = (model.light_dir * nominal_model.light_dir).sum(1)
    return np.rad2deg(np.arccos(np.clip(cos, -1, 1)))  # degrees, per light


@pytest.mark.parametrize(
    ("axis", "measure", "per_unit"), [("camera", _camera_shift, 0.03), ("lighting", _light_tilt, 15)]
)
def test_image_axes_change_the_image_not_the_state_by_their_unit(nominal, axis, measure, per_unit):
    env = make_env(_cfg(obs_mode="rgb", randomize=exact(axis, 2)))
    try:
        clean, perturbed, again = nominal.reset_to(STATE), env.reset_to(STATE), env.reset_to(STATE)
        assert torch.equal(clean["rgb"], nominal.reset_to(STATE)["rgb"])  # one init state, one scene
        assert torch.equal(clean["state"], perturbed["state"])
        assert (clean["rgb"].float() - perturbed["rgb"].float()).abs().mean() > 2
        assert torch.equal(perturbed["rgb"], again["rgb"])  # the same state id, the same draw
        model, nominal_model = _task_env(env)._model, _task_env(nominal)._model
        np.testing.assert_allclose(measure(model, nominal_model), 2 * per_unit, rtol=1e-6)
        first = model.cam_pos.copy(), model.light_dir.copy()
        env.reset_to(torch.tensor([4]))  # another episode: the same size in another direction
        assert not (np.array_equal(first[0], model.cam_pos) and np.array_equal(first[1], model.light_dir))
        np.testing.assert_allclose(measure(model, nominal_model), 2 * per_unit, rtol=1e-6)
    finally:
        env.close()


def test_spawn_moves_objects_and_arm_by_its_unit_and_a_level_scales_the_same_draw(nominal):
    env = make_env(_cfg(randomize=exact("spawn", 1)))
    try:
        task_env = _task_env(env)
        init = np.asarray(task_env.spec.init_states[3])
        one = task_env.perturb.edit_init_state(init, 3) - init
        three = LiberoPerturbations(exact("spawn", 3), task_env._model, 10).edit_init_state(init, 3) - init
        np.testing.assert_allclose(three, 3 * one, atol=1e-12)  # the same directions, three times as far
        objects, arm = 1 + task_env.perturb._object_qpos, 1 + task_env.perturb._arm_qpos
        assert len(objects) >= 3 and len(arm) == 7
        shifts = np.linalg.norm(np.stack([one[objects], one[objects + 1]], 1), axis=1)
        np.testing.assert_allclose(shifts, OBJECT_SHIFT)
        np.testing.assert_allclose(np.abs(one[arm]), JOINT_TURN)
        moved = np.zeros(len(init), dtype=bool)
        moved[np.concatenate([objects, objects + 1, arm])] = True
        assert not one[~moved].any()  # heights, orientations, velocities and fixtures stay nominal
        obs = env.reset_to(STATE)
        np.testing.assert_allclose(
            task_env.env.sim.data.qpos, (init + one)[1 : 1 + len(task_env.env.sim.data.qpos)]
        )
        assert not torch.equal(obs["state"], nominal.reset_to(STATE)["state"])  # the hand starts elsewhere
        other = task_env.perturb.edit_init_state(np.asarray(task_env.spec.init_states[4]), 4)
        assert not np.allclose(other - task_env.spec.init_states[4], one)  # each state id has its own draw
    finally:
        env.close()


def test_dynamics_axes_scale_friction_and_the_objects_masses_not_the_state(nominal):
    env = make_env(_cfg(randomize=RandomizeConfig(friction=2, mass=2, exact=True)))
    try:
        obs = env.reset_to(STATE)
        assert torch.equal(obs["state"], nominal.reset_to(STATE)["state"])
        model, clean = _task_env(env)._model, _task_env(nominal)._model
        friction = np.log(model.geom_friction[:, 0] / clean.geom_friction[:, 0]) / np.log(1.3)
        np.testing.assert_allclose(np.abs(friction), 2)  # every geom, one sign
        assert np.ptp(friction) < 1e-9
        movable = movable_bodies(model)
        assert len(movable) >= 5  # the bowls, the cookie box, the ramekin and the plate, and their parts
        scaled = np.log(model.body_mass[movable] / clean.body_mass[movable]) / np.log(1.6)
        np.testing.assert_allclose(np.abs(scaled), 2)
        others = np.setdiff1d(np.arange(model.nbody), movable)  # the robot and the fixtures
        np.testing.assert_array_equal(model.body_mass[others], clean.body_mass[others])
        assert np.isclose(model.body_subtreemass[0], model.body_mass.sum())  # derived constants follow
        assert torch.isfinite(env.step(torch.zeros(1, 2, 7)).obs["state"]).all()
    finally:
        env.close()


@pytest.fixture(scope="module")
def text_env():
    env = make_env(
        _cfg(task=None, num_envs=2, randomize=RandomizeConfig(instruction=3, proprio_noise=2, exact=True))
    )
    yield env
    env.close()


def test_instruction_levels_are_unseen_texts_of_the_same_task(nominal, text_env):
    training, table = nominal.instruction_table, text_env.instruction_table
    tasks = load_suite("libero-spatial")
    assert len(training) == 10 and table[:10] == training and len(table) == 40
    ids = text_env.reset_to(torch.tensor([0, 0]))["task_id"]
    assert ids.tolist() == [30, 35]  # tasks 0 and 5 (10 tasks over 2 envs) at level 3
    unseen = load_paraphrases("libero_spatial")
    shown_by_lan_suite = {t.language for t in load_suite("libero-spatial-lan")}
    for level in (1, 2, 3):
        texts = table[10 * level : 10 * (level + 1)]
        assert not set(texts) & set(training) and not set(texts) & shown_by_lan_suite
        assert len(set(texts)) == 10
    # level 2 is LIBERO-PRO's second paraphrase of that very task (the task is kept)
    assert table[20:30] == [unseen[t.name][1] for t in tasks]
    assert text_env.instruction_tasks == [t.name for t in tasks] * 4  # per-task results count every level


def test_training_draws_give_every_level_deterministically_from_the_seed(text_env):
    model = _task_env(text_env)._model
    shown = {
        seed: [
            LiberoPerturbations(RandomizeConfig(instruction=3, seed=seed), model, 10).shown_task(2, s)
            for s in range(50)
        ]
        for seed in (0, 0, 1)
    }
    assert {(t - 2) // 10 for t in shown[0]} == {0, 1, 2, 3} and all(t % 10 == 2 for t in shown[0])
    assert shown[0] == [
        LiberoPerturbations(RandomizeConfig(instruction=3), model, 10).shown_task(2, s) for s in range(50)
    ]
    assert shown[0] != shown[1]


def test_noise_axes_perturb_the_observed_state_and_executed_actions_the_same_way_twice(nominal, text_env):
    clean = nominal.reset_to(torch.tensor([0]))["state"][0]
    noisy = [text_env.reset_to(torch.tensor([0, 0]))["state"][0] for _ in range(2)]
    assert torch.equal(noisy[0], noisy[1])
    assert 0.001 < (noisy[0] - clean).numpy().std() < 0.05  # std 0.005 per unit, at 2
    actuation = LiberoPerturbations(exact("action_noise", 2), _task_env(text_env)._model, 10)
    hold = np.zeros(7)
    executed = [actuation.episode_action(hold, 3, step) for step in (5, 5, 6)]
    assert np.array_equal(executed[0], executed[1]) and not np.array_equal(executed[0], executed[2])
    assert 0.05 < np.abs(executed[0]).mean() < 0.5 and np.abs(executed[0]).max() <= 1  # std 0.1 per unit


def test_libero_pro_suites_keep_the_base_tasks_and_change_what_they_perturb():
    base = load_suite("libero-goal")
    for variant in PRO_VARIANTS:
        tasks = load_suite(f"libero-goal-{variant}")
        assert [t.name for t in tasks] == [t.name for t in base]  # the same task ids
        assert all(f"libero_goal_{variant}/" in t.bddl_file for t in tasks)
        same_text = [a.language == b.language for a, b in zip(base, tasks, strict=True)]
        if variant in ("lan", "task"):  # LIBERO-PRO's own instructions
            assert sum(same_text) <= 2
        else:
            assert all(same_text)
    swapped = load_suite("libero-goal-swap")
    assert not np.allclose(swapped[0].init_states[0], base[0].init_states[0])


def test_a_libero_pro_suite_runs_with_a_perturbation():
    env = make_env(_cfg(suite="libero-spatial-swap", obs_mode="rgb", randomize=exact("camera", 1)))
    try:
        obs = env.reset_to(STATE)
        res = env.step(torch.zeros(1, 2, 7))
        assert obs["rgb"].float().std() > 5 and torch.isfinite(res.obs["state"]).all()
        assert env.instructions(obs["task_id"]) == [load_suite("libero-spatial")[0].language]
    finally:
        env.close()

import numpy as np
import pytest
import torch

from embodrl.errors import ConfigError, UserError
from embodrl.sims.base import VecEnv
from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env
from embodrl.sims.tabletop import describe, physics
from embodrl.sims.tabletop.env import MOVED_CUBE, WRONG_OBJECT
from embodrl.sims.tabletop.layout import sample_layout
from embodrl.sims.tabletop.tasks import COLOR_NAMES, TASK_NAMES, instruction_entries


def _env(**kw):
    return make_env(EnvConfig(**{"num_envs": 4, **kw}))


def test_reset_to_is_bit_identical_across_envs_instances_and_history():
    env, other = _env(suite="tabletop-lang"), _env(suite="tabletop-lang", seed=5)
    ids = torch.tensor([11, 12, 11, 99_999])
    first = env.reset_to(ids)
    qpos = env.physics.qpos.copy()
    for _ in range(3):  # history must not leak into the initial state
        env.step(torch.rand(4, 2, 7) * 2 - 1)
        other.step(torch.rand(4, 2, 7) * 2 - 1)
    again, there = env.reset_to(ids), other.reset_to(ids)
    assert np.array_equal(env.physics.qpos, qpos) and np.array_equal(other.physics.qpos, qpos)
    assert np.array_equal(qpos[0], qpos[2]) and not np.array_equal(qpos[0], qpos[1])
    for key in first.keys():
        assert torch.equal(first[key], again[key]) and torch.equal(first[key], there[key])


def test_reset_to_subset_leaves_other_envs_alone():
    env = _env()
    env.reset(seed=0)
    env.step(torch.rand(4, 1, 7) * 2 - 1)
    before = env.physics.qpos.copy()
    env.reset_to(torch.tensor([3]), env_ids=torch.tensor([2]))
    assert np.array_equal(env.physics.qpos[[0, 1, 3]], before[[0, 1, 3]])
    assert not np.array_equal(env.physics.qpos[2], before[2])


def test_seeded_reset_reproduces_episodes():
    a, b = _env(), _env()
    acts = torch.rand(5, 4, 3, 7) * 2 - 1
    oa, ob = a.reset(seed=7), b.reset(seed=7)
    assert torch.equal(oa["state"], ob["state"]) and torch.equal(oa["task_id"], ob["task_id"])
    for act in acts:
        ra, rb = a.step(act), b.step(act)
        assert torch.equal(ra.obs["privileged"], rb.obs["privileged"]) and torch.equal(ra.reward, rb.reward)


def test_auto_reset_returns_final_obs_and_new_episode():
    env = _env(task="pick", max_episode_steps=3, reward="dense")
    obs = env.reset(seed=0)
    hold = torch.zeros(4, 2, 7)
    res = env.step(hold)
    assert not res.done.any() and torch.equal(res.obs["state"], res.final_obs["state"])
    res = env.step(hold)  # third action ends every episode: truncation mid-chunk
    assert res.truncated.all() and not res.terminated.any()
    assert (res.steps_executed == 1).all() and (res.reward[:, 1] == 0).all()
    # final_obs is where the arm ended; obs is a fresh start drawn from the seeded stream
    assert not torch.equal(res.final_obs["privileged"], res.obs["privileged"])
    assert torch.equal(res.final_obs["task_id"], obs["task_id"])
    assert (env._steps == 0).all()


def test_auto_reset_states_follow_from_the_reset_to_ids_whatever_the_history_or_stage_split():
    """What a finished env starts next depends on its own seed and its episode's initial state only: a
    rollout is fixed by its reset_to ids (exact resume; the same episodes under any K stages)."""
    whole = _env(task="pick", max_episode_steps=3)
    halves = [_env(task="pick", max_episode_steps=3, num_envs=2, seed=s) for s in (0, 2)]  # as stages
    for _ in range(4):  # history: other episodes, other auto-resets
        whole.step(torch.rand(4, 2, 7) * 2 - 1)
    ids = torch.tensor([11, 12, 11, 99_999])
    whole.reset_to(ids)
    for half, part in zip(halves, ids.split(2), strict=True):
        half.reset_to(part)
    hold = torch.zeros(4, 2, 7)
    for _ in range(2):
        res = whole.step(hold)
        parts = [half.step(hold[2 * k : 2 * k + 2]) for k, half in enumerate(halves)]
    assert res.truncated.all()
    joined = torch.cat([p.obs["privileged"] for p in parts])
    assert torch.equal(res.obs["privileged"], joined)
    assert not torch.equal(res.obs["privileged"][0], res.obs["privileged"][2])  # env seeds differ


def test_expert_success_terminates_with_sparse_reward_one():
    env = _env(task="reach")
    env.reset(seed=1)
    for _ in range(40):
        res = env.step(env.expert_actions())
        if res.done.any():
            break
    i = res.done.nonzero()[0, 0]
    assert res.terminated[i] and res.success[i] and res.reward[i, 0] == 1.0


def test_instruction_table_and_task_ids_name_the_task():
    env = _env(task="place", suite="tabletop-lang")
    obs = env.reset(seed=0)
    assert all(s.startswith(("put the", "place the")) for s in env.instruction_table)
    assert all("bowl" in s for s in env.instructions(obs["task_id"]))
    assert len(set(env.instruction_table)) == len(env.instruction_table)


def test_all_tasks_sampled_when_task_is_none():
    env = make_env(EnvConfig(num_envs=60))
    assert set(env._task.tolist()) == set(range(len(TASK_NAMES)))


def test_joint_pos_mode_moves_the_arm_to_the_target():
    env = _env(control_mode="joint_pos")
    env.reset(seed=0)
    assert env.action_spec.dim == 8
    target = torch.zeros(4, 1, 8)
    for _ in range(20):
        env.step(target)
    low, high = env.model.jnt_range[:7].T
    assert np.allclose(env.physics.qpos[:, :7], (low + high) / 2, atol=0.05)
    with pytest.raises(UserError, match="ee_delta"):
        env.expert_actions()


def test_loop_backend_matches_batch_backend(monkeypatch):
    batched = _env(task="pick")
    monkeypatch.setattr(physics, "_mj_batch", None)
    looped = _env(task="pick")
    assert isinstance(looped.physics, physics.LoopPhysics)
    batched.reset(seed=2), looped.reset(seed=2)
    for _ in range(25):
        ra = batched.step(batched.expert_actions())
        rb = looped.step(looped.expert_actions())
    assert torch.allclose(ra.obs["privileged"], rb.obs["privileged"], atol=1e-5)
    assert torch.equal(batched.render(), looped.render())


def test_bad_input_errors():
    with pytest.raises(UserError, match="valid tasks: reach, push, pick, place, stack, press"):
        _env(task="juggle")
    with pytest.raises(ConfigError, match="image_size"):
        EnvConfig(image_size=100)
    env = _env()
    bad = torch.zeros(4, 2, 7)
    bad[2, 1, 3] = float("inf")
    bad[3, 0, 0] = float("nan")
    with pytest.raises(UserError, match=r"\[2, 3\]"):
        env.step(bad)
    with pytest.raises(UserError, match="shape"):
        env.step(torch.zeros(4, 2, 6))
    with pytest.raises(UserError, match="out of range"):
        env.reset_to(torch.tensor([0, 1, 2, -1]))
    with pytest.raises(UserError, match="render env ids"):
        env.render(torch.tensor([4]))


def test_actions_outside_bounds_are_clipped():
    a, b = _env(), _env()
    a.reset(seed=0), b.reset(seed=0)
    big = torch.full((4, 1, 7), 5.0)
    assert torch.equal(a.step(big).obs["state"], b.step(big.clamp(-1, 1)).obs["state"])


def test_expert_actions_default_raises_for_other_suites():
    class NoExpert(VecEnv):
        action_spec = observation_spec = instruction_table = num_init_states = None
        reset = reset_to = step = render = None

    with pytest.raises(UserError, match="no scripted expert"):
        NoExpert().expert_actions()


def test_describe_lists_every_task_of_both_suites():
    suites = describe()
    assert set(suites) == {"tabletop-basic", "tabletop-lang"}
    for tasks in suites.values():
        assert set(tasks) == set(TASK_NAMES) and all(tasks.values())


def test_dense_reward_is_progress_difference_plus_success_bonus():
    env = _env(task="pick", reward="dense")
    env.reset(seed=4)
    start = env._progress.copy()
    total = torch.zeros(4)
    finished = torch.zeros(4, dtype=torch.bool)
    succeeded = torch.zeros(4, dtype=torch.bool)
    while not finished.all():
        res = env.step(env.expert_actions())
        total += torch.where(finished, 0.0, res.reward[:, 0])
        succeeded |= res.success & ~finished
        finished |= res.done
    assert succeeded.all()
    # progress telescopes: the sum is progress(end) - progress(start) + 1, and progress(end) ~ 1 at a lift
    assert ((total - 1 + torch.from_numpy(start).float()) > 0.8).all() and (total < 2).all()


def test_ee_delta_yaw_mode_holds_roll_and_pitch_and_the_expert_still_succeeds():
    from embodrl.sims.tabletop.env import EE_MODE_DIMS

    full = make_env(EnvConfig(task="pick", num_envs=4, num_threads=1))
    yaw = make_env(EnvConfig(task="pick", num_envs=4, num_threads=1, control_mode="ee_delta_yaw"))
    assert yaw.action_spec.dim == 5 and yaw.action_spec.names == ("dx", "dy", "dz", "dyaw", "gripper")
    ids = torch.arange(4)
    full.reset_to(ids)
    yaw.reset_to(ids)
    expert = full.expert_actions()
    assert torch.equal(yaw.expert_actions(), expert[:, EE_MODE_DIMS["ee_delta_yaw"]])
    # The expert barely rolls or pitches (it corrects drift of ~1e-6), so the 5-D mode loses nothing.
    assert expert[:, 3:5].abs().max() < 1e-3
    a = full.step(expert[:, None])
    b = yaw.step(expert[:, None, EE_MODE_DIMS["ee_delta_yaw"]])
    assert torch.allclose(a.obs["state"], b.obs["state"], atol=1e-4)
    successes = torch.zeros(4, dtype=torch.bool)
    for _ in range(80):
        successes |= yaw.step(yaw.expert_actions()[:, None]).success
    assert successes.all()


def test_ee_delta_pos_mode_keeps_the_hand_down_and_the_expert_grasps_yawed_cubes():
    env = make_env(EnvConfig(task="pick", num_envs=8, num_threads=1, control_mode="ee_delta_pos"))
    assert env.action_spec.names == ("dx", "dy", "dz", "gripper")
    env.reset_to(torch.arange(8))
    start_rot = env.reset_to(torch.arange(8))["state"][:, 3:9].clone()
    successes = torch.zeros(8, dtype=torch.bool)
    for _ in range(80):
        res = env.step(env.expert_actions()[:, None])
        successes |= res.success
        if not res.done.any():  # the hand's orientation (state[3:9]) is held while the episode runs
            assert torch.allclose(res.obs["state"][:, 3:9], start_rot, atol=0.05)
    assert successes.all()


def _layout_with(task: str, kind: str) -> tuple[int, int, int, int, int]:
    """A tabletop-lang `task` state id with a distractor and a parked object of `kind`: (state id, main
    colour, goal colour, distractor colour, parked colour)."""
    table = instruction_entries((task,))
    for state_id in range(100):
        layout = sample_layout(state_id, table, distractors=True)
        entry = table[layout.instruction]
        placed = layout.objects[kind]
        distractors = [c for c in placed if c not in (entry.main, entry.goal)]
        parked = [c for c in range(len(COLOR_NAMES)) if c not in placed]
        if distractors and parked:
            return state_id, entry.main, entry.goal, distractors[0], parked[0]
    raise AssertionError(f"no {task} layout with a distractor and a parked {kind}")


def _wrong_object_at_episode_end(env) -> np.ndarray:
    """Hold still until every env's first episode ends; the flag of each where it ended."""
    flags, finished = np.zeros(env.num_envs, bool), np.zeros(env.num_envs, bool)
    while not finished.all():
        res = env.step(torch.zeros(env.num_envs, 1, 7))
        ended = res.done.numpy() & ~finished
        flags[ended] = res.episode_flags[WRONG_OBJECT].numpy()[ended]
        finished |= ended
    return flags


def test_wrong_object_flags_an_episode_in_which_an_unnamed_placed_cube_moved_at_any_step():
    state_id, main, goal, distractor, parked = _layout_with("stack", "cube")  # stack: the goal is a cube
    env = _env(suite="tabletop-lang", task="stack", num_envs=6, max_episode_steps=4)
    assert env.episode_flag_names == (WRONG_OBJECT,) and _env().episode_flag_names == ()  # basic: none
    env.reset_to(torch.full((6,), state_id))
    xyz = env.idx.cube_qpos[distractor] + np.arange(3)
    start = env.physics.qpos[1, xyz].copy()
    # env 0 untouched; the others have a cube lifted, which falls back to its start within two steps
    lifted = [(distractor, 0.05), (distractor, 0.01), (main, 0.05), (goal, 0.05), (parked, 0.05)]
    for i, (color, height) in enumerate(lifted, 1):
        env.physics.qpos[i, env.idx.cube_qpos[color] + 2] += height
    expected = [False, True, False, False, False, False]  # parked cubes are out of reach: never counted
    assert env.step(torch.zeros(6, 1, 7)).episode_flags[WRONG_OBJECT].tolist() == expected
    assert env.step(torch.zeros(6, 1, 7)).episode_flags[WRONG_OBJECT].tolist() == expected
    assert (
        np.linalg.norm(env.physics.qpos[1, xyz] - start) < MOVED_CUBE
    )  # back, yet the episode stays flagged
    assert _wrong_object_at_episode_end(env).tolist() == expected
    assert not env.step(torch.zeros(6, 1, 7)).episode_flags[WRONG_OBJECT].any()  # the next episodes


def test_wrong_object_flags_a_pressed_unnamed_button_but_not_the_named_one():
    state_id, main, _, distractor, parked = _layout_with("press", "button")
    env = _env(suite="tabletop-lang", task="press", num_envs=4, max_episode_steps=3)
    env.reset_to(torch.full((4,), state_id))
    for i, color in enumerate([distractor, parked, main], 1):  # env 0 untouched
        env.physics.qpos[i, env.idx.button_qpos[color]] = -0.015  # pushed all the way in
    assert _wrong_object_at_episode_end(env).tolist() == [False, True, False, False]


def test_the_expert_on_the_named_cube_is_not_flagged_and_on_a_distractor_it_is():
    state_id, _, _, distractor, _ = _layout_with("pick", "cube")
    env = _env(suite="tabletop-lang", task="pick", num_envs=2, max_episode_steps=60)
    env.reset_to(torch.full((2,), state_id))
    env._main_slot[1] = distractor  # env 1's expert picks up the distractor (cube slots are colours)
    flags, success, finished = np.zeros(2, bool), np.zeros(2, bool), np.zeros(2, bool)
    while not finished.all():
        res = env.step(env.expert_actions())
        ended = res.done.numpy() & ~finished
        flags[ended], success[ended] = (
            res.episode_flags[WRONG_OBJECT].numpy()[ended],
            res.success.numpy()[ended],
        )
        finished |= ended
    assert success.all() and flags.tolist() == [False, True]

import pytest
import torch

from embodrl.errors import UserError
from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env

from .vecenv_contract import check_vecenv_contract

pytest.importorskip("mani_skill", reason="ManiSkill3 not installed (pip install 'embodrl[maniskill]')")
# ManiSkill's agent code trips a NumPy 2 deprecation on every step.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:mani_skill")


def _cfg(**overrides) -> EnvConfig:
    base = dict(suite="maniskill", task="PushCube-v1", num_envs=2, max_episode_steps=8)
    return EnvConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def vulkan():
    """Skip the module's sim tests when no Vulkan driver SAPIEN accepts is set up."""
    try:
        make_env(_cfg(num_envs=1)).close()
    except UserError as exc:
        if "Vulkan" in str(exc):
            pytest.skip("no Vulkan driver for SAPIEN: run `make maniskill-cpu` (see README)")
        raise


def test_pushcube_state_passes_contract(vulkan):
    check_vecenv_contract(lambda: make_env(_cfg()), chunk=3, steps=6)


def test_reset_to_gives_each_id_its_own_state_and_actions_move_the_arm(vulkan):
    env = make_env(_cfg(num_envs=3))
    try:
        obs = env.reset_to(torch.tensor([5, 5, 6]))
        priv = obs["privileged"]
        assert torch.equal(priv[0], priv[1]) and not torch.equal(priv[0], priv[2])
        assert env.instructions(obs["task_id"]) == ["push the cube to the goal region"] * 3
        # +x end-effector motion for a few steps moves the TCP (last 7 of state: pose) along +x.
        up = torch.zeros(3, 4, 7)
        up[..., 0] = 1.0
        res = env.step(up)
        assert (res.steps_executed == 4).all()
        assert (res.obs["state"][:, -7] - obs["state"][:, -7] > 0.02).all()
    finally:
        env.close()


def test_rgb_observation_has_images(vulkan):
    env = make_env(_cfg(task="PickCube-v1", num_envs=1, obs_mode="rgb", wrist_camera=True))
    try:
        obs = env.reset(seed=0)
        for key in ("rgb", "wrist_rgb"):
            img = obs[key]
            assert img.shape == (1, 64, 64, 3) and img.dtype == torch.uint8
            assert img.float().std() > 5  # a rendered scene, not a blank frame
        assert not torch.equal(obs["rgb"], obs["wrist_rgb"])
        res = env.step(torch.zeros(1, 1, 7))
        assert res.obs["rgb"].shape == (1, 64, 64, 3)
    finally:
        env.close()


def test_bad_task_and_wrist_camera_are_user_errors():
    with pytest.raises(UserError, match="PushCube-v1"):
        make_env(_cfg(task="NoSuchTask-v0"))
    with pytest.raises(UserError, match="env.task"):
        make_env(_cfg(task=None))
    with pytest.raises(UserError, match="wrist_camera=false"):
        make_env(_cfg(task="PushT-v1", wrist_camera=True))


def test_gpu_sim_without_physx_gpu_library_says_where_to_put_it(tmp_path, monkeypatch):
    import requests
    from sapien import physx

    if physx.is_gpu_enabled():
        pytest.skip("GPU PhysX already running in this process")
    monkeypatch.setenv("HOME", str(tmp_path))  # no cached library; SAPIEN would fetch it now

    def offline(*args, **kwargs):
        raise requests.ConnectionError("no network")

    monkeypatch.setattr(requests, "get", offline)
    with pytest.raises(UserError, match=r"libPhysXGpu_64\.so.*ConnectionError.*device=cpu") as err:
        make_env(_cfg(), device="cuda")
    assert str(tmp_path / ".sapien" / "physx" / physx.version()) in str(err.value)


@pytest.mark.slow
def test_ppo_learns_pushcube_from_state(vulkan, tmp_path):
    from embodrl.config import compose, make_run_dir
    from embodrl.train.logger import read_metrics
    from embodrl.train.rl_runner import OnPolicyRunner

    torch.manual_seed(0)
    overrides = [
        *("env.suite=maniskill", "env.task=PushCube-v1", "env.num_envs=8", "env.max_episode_steps=50"),
        *("env.reward=dense", "policy.family=gaussian", "policy.chunk_size=1", "policy.action_dim=7"),
        *("policy.obs_keys=[state,privileged]", "policy.gaussian.hidden_dims=[64,64]"),
        *("policy.value_hidden_dims=[64,64]", "algo.minibatch_size=200", "algo.critic_warmup_iters=1"),
        *("algo.gamma=0.8", "algo.gae_lambda=0.9", "algo.actor_lr=1e-3", "algo.target_kl=null"),
        *("algo.num_epochs=8", "train.iterations=20", "train.eval_every=0", "train.eval_episodes=8"),
        *("train.tensorboard=false", f"run_root={tmp_path}"),
    ]
    cfg = compose(None, overrides)
    runner = OnPolicyRunner(cfg, make_run_dir(cfg))
    runner.learn()
    returns = [r["rollout/return"] for r in read_metrics(runner.run_dir) if "rollout/return" in r]
    # Dense PushCube return per 50-step episode: ~2.5 while the arm flails, rising as it reaches and pushes.
    assert sum(returns[-3:]) > 1.3 * sum(returns[:3]), returns

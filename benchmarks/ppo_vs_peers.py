"""PPO on gymnasium HalfCheetah-v5: embodrl beside stable-baselines3 and rsl-rl-lib, matched settings.

Every library trains the same actor-critic (separate 64x64 tanh MLPs, state-independent std
starting at 1) on one env for the same number of env-steps with CleanRL's MuJoCo PPO settings:
2048 steps per rollout carried across rollouts, 10 epochs of 32 minibatches (64 samples), Adam lr
3e-4 (eps 1e-5 where settable) annealed linearly to 0, gamma 0.99, GAE lambda 0.95, ratio clip 0.2,
value clip 0.2, effective value loss 0.25 * MSE, no entropy bonus, grad-norm 0.5, advantages
normalized per minibatch, orthogonal initialization, observations normalized by running mean/std
(clip 10), rewards scaled by the running std of the discounted return (clip 10). Peers come from the
`bench` extra (`pip install -e .[bench]`); a peer that is not installed is skipped with the reason.
What each library can do of that:
- embodrl: all of it (algo.obs_normalization, algo.reward_scaling, algo.normalize_advantages=minibatch,
  algo.lr_schedule=linear, policy.gaussian.init=orthogonal), with the env stepped on the training
  thread (engine=inline) as in the peers' loops.
- stable-baselines3: all of it (VecNormalize, as CleanRL and rl-zoo; lr as a function of progress).
- rsl-rl-lib: EmpiricalNormalization of observations only, no reward scaling, a fixed lr, PyTorch's
  default initialization.
"Return" is the mean undiscounted env reward of the last 10 finished training episodes (stochastic
policy), read from the raw env in every library. "Wall" is the training loop alone (rollouts and
updates; model building excluded); embodrl's whole `learn()`, which adds checkpoints, a one-episode
final evaluation and its video, is printed beside it.

    python benchmarks/ppo_vs_peers.py                  # 1M steps x 3 seeds per library: hours on a CPU
    python benchmarks/ppo_vs_peers.py --quick          # 20k steps, 1 seed: ~2 minutes
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from embodrl.config import compose, make_run_dir
from embodrl.train.logger import read_metrics
from embodrl.train.rl_runner import OnPolicyRunner

ENV_ID, EPISODE_STEPS = "HalfCheetah-v5", 1000
LAST_EPISODES = 10  # the final return averages this many training episodes
TIMED_STAGES = ("rollout", "inference", "env_step", "update")  # embodrl's per-iteration timings


@dataclass(frozen=True)
class PPOSettings:
    """CleanRL's ppo_continuous_action defaults, applied to every library as far as it can."""

    rollout_steps: int = 2048  # per env, one env
    num_epochs: int = 10
    num_minibatches: int = 32
    lr: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2  # ratio and value clipping
    value_coef: float = 0.5  # on 0.5 * MSE (CleanRL, embodrl); libraries on plain MSE get half
    max_grad_norm: float = 0.5
    hidden_dims: tuple[int, ...] = (64, 64)
    init_std: float = 1.0
    obs_clip: float = 10.0  # on normalized observations
    reward_clip: float = 10.0  # on scaled rewards

    @property
    def minibatch_size(self) -> int:
        return self.rollout_steps // self.num_minibatches


@dataclass
class Result:
    """One training run: its final return, training-loop seconds and env-steps trained on."""

    library: str
    seed: int
    final_return: float
    wall_s: float
    env_steps: int
    note: str = ""


def make_env() -> gym.Env:
    return gym.make(ENV_ID, max_episode_steps=EPISODE_STEPS)


# ---- embodrl --------------------------------------------------------------------------------------
def run_embodrl(s: PPOSettings, iterations: int, seed: int, threads: int, workdir: Path) -> Result:
    hidden = "[" + ",".join(map(str, s.hidden_dims)) + "]"
    overrides = [
        "env=halfcheetah",
        "env.num_envs=1",
        "engine=inline",  # one cheap env: stepped on the training thread, as the peers' loops do
        f"env.max_episode_steps={EPISODE_STEPS}",
        "policy.family=gaussian",
        "policy.chunk_size=1",
        "policy.action_dim=6",
        "policy.obs_keys=[state]",
        f"policy.gaussian.hidden_dims={hidden}",
        "policy.gaussian.activation=tanh",
        f"policy.gaussian.init_std={s.init_std}",
        "policy.gaussian.init=orthogonal",
        f"policy.obs_clip={s.obs_clip}",
        "policy.action_normalization=identity",  # no demos, no action statistics to map by
        "policy.state_std_min=0",  # CleanRL divides by sqrt(var + 1e-8): no floor
        f"policy.value_hidden_dims={hidden}",
        "algo.name=ppo",
        f"algo.gamma={s.gamma}",
        f"algo.gae_lambda={s.gae_lambda}",
        f"algo.clip_eps_low={s.clip}",
        f"algo.clip_eps_high={s.clip}",
        "algo.value_loss=mse",
        f"algo.value_clip={s.clip}",
        f"algo.value_coef={s.value_coef}",
        "algo.entropy_coef=0.0",
        f"algo.max_grad_norm={s.max_grad_norm}",
        f"algo.actor_lr={s.lr}",
        f"algo.critic_lr={s.lr}",
        "algo.lr_schedule=linear",
        "algo.normalize_advantages=minibatch",
        "algo.obs_normalization=true",
        "algo.reward_scaling=true",
        f"algo.reward_clip={s.reward_clip}",
        "algo.critic_warmup_iters=0",
        "algo.target_kl=null",
        f"algo.num_epochs={s.num_epochs}",
        f"algo.minibatch_size={s.minibatch_size}",
        f"train.iterations={iterations}",
        f"train.rollout_steps={s.rollout_steps}",
        "train.eval_every=0",
        "train.eval_episodes=1",
        "train.videos=0",  # the final evaluation would render and encode a 1000-frame episode (~30 s)
        f"train.save_every={iterations}",
        "train.tensorboard=false",
        f"train.torch_threads={threads}",
        f"seed={seed}",
        f"run_root={workdir}",
        f"name=embodrl-seed{seed}",
    ]
    cfg = compose(None, overrides)
    runner = OnPolicyRunner(cfg, make_run_dir(cfg))
    start = time.perf_counter()
    runner.learn()
    whole = time.perf_counter() - start
    rows = read_metrics(runner.run_dir)
    episodes: list[float] = []  # per-iteration means repeated by their episode counts, newest last
    for row in rows:
        episodes += [row.get("rollout/return", 0.0)] * int(row.get("rollout/episodes", 0))
    spent = {key: sum(row.get(f"time/{key}", 0.0) for row in rows) for key in TIMED_STAGES}
    note = ", ".join(f"{key} {seconds:.1f} s" for key, seconds in spent.items())
    return Result(
        "embodrl",
        seed,
        float(np.mean(episodes[-LAST_EPISODES:])),
        rows[-1]["time/wall"],
        int(rows[-1]["rollout/env_steps"]),
        note=f"({note}; whole learn() {whole:.1f} s)",
    )


# ---- stable-baselines3 ----------------------------------------------------------------------------
def run_sb3(s: PPOSettings, iterations: int, seed: int) -> Result:
    from stable_baselines3 import PPO
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    # Monitor sits inside VecNormalize, so the episode returns it records are raw env rewards.
    venv = VecNormalize(
        DummyVecEnv([lambda: Monitor(make_env())]),
        gamma=s.gamma,
        clip_obs=s.obs_clip,
        clip_reward=s.reward_clip,
    )
    model = PPO(
        "MlpPolicy",
        venv,
        learning_rate=lambda progress_remaining: progress_remaining * s.lr,  # linear to 0
        n_steps=s.rollout_steps,
        batch_size=s.minibatch_size,
        n_epochs=s.num_epochs,
        gamma=s.gamma,
        gae_lambda=s.gae_lambda,
        clip_range=s.clip,
        clip_range_vf=s.clip,
        ent_coef=0.0,
        vf_coef=s.value_coef / 2,  # SB3's value loss is plain MSE
        max_grad_norm=s.max_grad_norm,
        stats_window_size=LAST_EPISODES,
        policy_kwargs=dict(
            net_arch=dict(pi=list(s.hidden_dims), vf=list(s.hidden_dims)),
            activation_fn=torch.nn.Tanh,
            log_std_init=float(np.log(s.init_std)),
        ),
        seed=seed,
        device="cpu",
    )
    start = time.perf_counter()
    model.learn(total_timesteps=iterations * s.rollout_steps)
    wall = time.perf_counter() - start
    returns = [info["r"] for info in model.ep_info_buffer]
    venv.close()
    return Result("stable-baselines3", seed, float(np.mean(returns)), wall, model.num_timesteps)


# ---- rsl-rl-lib -----------------------------------------------------------------------------------
def rsl_rl_vec_env(num_envs: int, seed: int):
    """gymnasium envs behind rsl-rl's VecEnv (built on demand: rsl_rl is an optional import)."""
    from rsl_rl.env import VecEnv
    from tensordict import TensorDict

    class GymnasiumVecEnv(VecEnv):
        """Auto-resetting gymnasium envs; `time_outs` marks truncations; raw episode returns are kept."""

        def __init__(self) -> None:
            self.envs = [make_env() for _ in range(num_envs)]
            space = self.envs[0].action_space
            self.low, self.high = torch.as_tensor(space.low), torch.as_tensor(space.high)
            self.num_envs, self.num_actions = num_envs, int(np.prod(space.shape))
            self.max_episode_length, self.device, self.cfg = EPISODE_STEPS, "cpu", {}
            self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long)
            self.returns = np.zeros(num_envs)
            self.finished: deque[float] = deque(maxlen=LAST_EPISODES)
            self.obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)])

        def get_observations(self) -> TensorDict:
            obs = torch.as_tensor(self.obs, dtype=torch.float32)  # [N, S]
            return TensorDict({"policy": obs}, batch_size=[self.num_envs])

        def step(self, actions: torch.Tensor):
            actions = torch.clamp(actions.cpu(), self.low, self.high).numpy()  # [N, A], as SB3 and CleanRL
            rewards, dones, time_outs = (
                np.zeros(self.num_envs),
                np.zeros(self.num_envs),
                np.zeros(self.num_envs),
            )
            for i, env in enumerate(self.envs):
                obs, reward, terminated, truncated, _ = env.step(actions[i])
                rewards[i], self.returns[i] = reward, self.returns[i] + reward
                self.episode_length_buf[i] += 1
                if terminated or truncated:
                    dones[i], time_outs[i] = 1.0, float(truncated and not terminated)
                    self.finished.append(self.returns[i])
                    self.returns[i], self.episode_length_buf[i] = 0.0, 0
                    obs, _ = env.reset()
                self.obs[i] = obs
            as_t = lambda a: torch.as_tensor(a, dtype=torch.float32)
            return self.get_observations(), as_t(rewards), as_t(dones), {"time_outs": as_t(time_outs)}

    return GymnasiumVecEnv()


def run_rsl_rl(s: PPOSettings, iterations: int, seed: int) -> Result:
    from rsl_rl.runners import OnPolicyRunner as RslRunner

    torch.manual_seed(seed)
    env = rsl_rl_vec_env(1, seed)
    model = dict(hidden_dims=list(s.hidden_dims), activation="tanh", obs_normalization=True)
    train_cfg = {
        "num_steps_per_env": s.rollout_steps,
        "save_interval": iterations,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": s.num_epochs,
            "num_mini_batches": s.num_minibatches,
            "clip_param": s.clip,
            "gamma": s.gamma,
            "lam": s.gae_lambda,
            "value_loss_coef": s.value_coef / 2,  # rsl-rl's value loss is plain MSE
            "entropy_coef": 0.0,
            "learning_rate": s.lr,
            "max_grad_norm": s.max_grad_norm,
            "use_clipped_value_loss": True,
            "schedule": "fixed",
            "normalize_advantage_per_mini_batch": True,  # as CleanRL and SB3
        },
        "actor": {
            "class_name": "MLPModel",
            **model,
            "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": s.init_std},
        },
        "critic": {"class_name": "MLPModel", **model},
    }
    runner = RslRunner(env, train_cfg, log_dir=None, device="cpu")
    start = time.perf_counter()
    runner.learn(num_learning_iterations=iterations)
    wall = time.perf_counter() - start
    return Result("rsl-rl-lib", seed, float(np.mean(env.finished)), wall, iterations * s.rollout_steps)


# ---- the comparison -------------------------------------------------------------------------------
PEERS = {"stable-baselines3": ("stable_baselines3", run_sb3), "rsl-rl-lib": ("rsl_rl", run_rsl_rl)}
NORMALIZATION = {
    "embodrl": "obs + reward, linear lr, orthogonal init",
    "stable-baselines3": "obs + reward (VecNormalize), linear lr, orthogonal init",
    "rsl-rl-lib": "obs (EmpiricalNormalization), fixed lr, default init",
}


def missing_peer(module: str) -> str | None:
    """Why a peer cannot run here, or None."""
    try:
        __import__(module)
    except ImportError as error:
        return f"not installed ({error}); pip install -e .[bench]"
    return None


def summarize(results: list[Result]) -> None:
    by_library: dict[str, list[Result]] = {}
    for result in results:
        by_library.setdefault(result.library, []).append(result)
    ours = by_library["embodrl"]
    ours_return = statistics.mean(r.final_return for r in ours)
    ours_wall = statistics.mean(r.wall_s for r in ours)
    print(
        f"\n| library | CleanRL details | return (last {LAST_EPISODES} episodes) | wall s | env-steps/s "
        "| wall / embodrl | return - embodrl |"
    )
    print("|---|---|---|---|---|---|---|")
    for library, runs in by_library.items():
        returns = [r.final_return for r in runs]
        spread = f" +- {statistics.stdev(returns):.1f}" if len(returns) > 1 else ""
        wall = statistics.mean(r.wall_s for r in runs)
        rate = statistics.mean(r.env_steps / r.wall_s for r in runs)
        print(
            f"| {library} | {NORMALIZATION[library]} | {statistics.mean(returns):.1f}{spread} | {wall:.1f} "
            f"| {rate:,.0f} | {wall / ours_wall:.2f}x | {statistics.mean(returns) - ours_return:+.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="env-steps per run")
    parser.add_argument("--seeds", type=int, default=3, help="seeds first..first+n-1 per library")
    parser.add_argument("--first-seed", type=int, default=0, help="to split seeds over processes")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, every library alike")
    names = ["embodrl", *PEERS]
    parser.add_argument("--libraries", nargs="+", choices=names, default=names, help="which libraries run")
    parser.add_argument("--quick", action="store_true", help="20k steps, 1 seed")
    args = parser.parse_args()
    steps, seeds = (20_000, 1) if args.quick else (args.steps, args.seeds)
    settings = PPOSettings()
    iterations = max(1, steps // settings.rollout_steps)  # whole rollouts: every library trains as long
    torch.set_num_threads(args.threads)
    print(
        f"{ENV_ID}: {iterations} iterations x {settings.rollout_steps} steps = "
        f"{iterations * settings.rollout_steps} env-steps, {seeds} seed(s), {args.threads} torch thread(s)"
    )
    libraries = {"embodrl": None} if "embodrl" in args.libraries else {}
    for name, (module, run) in PEERS.items():
        if name not in args.libraries:
            continue
        reason = missing_peer(module)
        if reason:
            print(f"skipping {name}: {reason}")
        else:
            libraries[name] = run
    results = []
    with tempfile.TemporaryDirectory(prefix="embodrl-ppo-peers-") as workdir:
        for seed in range(args.first_seed, args.first_seed + seeds):
            for name, run in libraries.items():
                if run is None:
                    result = run_embodrl(settings, iterations, seed, args.threads, Path(workdir))
                else:
                    result = run(settings, iterations, seed)
                results.append(result)
                print(
                    f"{name} seed {seed}: return {result.final_return:.1f}, wall {result.wall_s:.1f} s, "
                    f"{result.env_steps} env-steps {result.note}".rstrip(),
                    flush=True,
                )
    if "embodrl" in libraries:  # the table is relative to embodrl; otherwise the lines above are the result
        summarize(results)


if __name__ == "__main__":
    main()

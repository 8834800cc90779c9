"""Scripted-expert demonstrations played live, for pretraining on more scenes than a dataset holds.

`embodrl pretrain` draws its SFT batches from here instead of a LeRobotDataset: the env's scripted expert
plays episodes from initial states that no evaluation or collected demo uses, every successful episode's
frames become action-chunk samples (the same as `ActionChunkDataset` gives: observation, the next C
expert actions, padding past the episode's end, task id and instruction), and batches are drawn from a
pool of the most recent samples. The env steps just often enough that each sample is drawn
`stream_reuse` times on average, so a long run sees tens of thousands of scenes, each only a few times.

Demos of a flawless expert never show a state it would not reach itself, so a policy that drifts a little
off them (a hand 2 cm beside the cube at grasp height) has never seen what to do there. Perturbation bursts
(DART's noise injection, in bursts) fix that: with probability `perturb` per step an env's executed actions
are pushed in a random direction for `perturb_steps` steps while the expert keeps steering; the samples whose
chunk holds a pushed step are dropped, those after it keep the expert's own actions, which steer back.

Bursts show random mistakes; DAgger shows the policy's own. With `policy_share` > 0, that share of the
episodes is played by the policy being trained (`policy`: its action chunks for some envs' observations),
each step labelled with the action the expert would take in the state the policy reached; all of those
episodes enter the pool, failed ones first of all, since they hold the states the policy fails from.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
import torch
from tensordict import TensorDict

from embodrl.data.lerobot_format import feature_stats
from embodrl.errors import UserError
from embodrl.obs_keys import INSTRUCTION, TASK_ID
from embodrl.sims.base import VecEnv

Step = tuple[dict[str, torch.Tensor], torch.Tensor, bool]  # observation, the expert's action, pushed
POSITION_DIMS = 3  # the pushed action dimensions: the end-effector's x, y, z moves
ChunkFn = Callable[[TensorDict], torch.Tensor]  # some envs' observations -> their action chunks [n, C, A]


class SimulatedDemos:
    """Samples of the scripted expert's successful episodes in `env`, kept in a ring of `pool_size`.

    `obs_keys`: the observations a sample holds (the policy's inputs and auxiliary targets); initial
    states cycle through [first_state_id, first_state_id + num_states), from an offset set by `seed`;
    `perturb`, `perturb_steps`: the perturbation bursts; `policy`, `policy_share`: the episodes the policy
    plays (module docstring; 0 plays the expert alone, unperturbed).
    """

    def __init__(
        self,
        env: VecEnv,
        obs_keys: tuple[str, ...],
        chunk_size: int,
        pool_size: int,
        reuse: float,
        first_state_id: int,
        num_states: int,
        seed: int,
        perturb: float = 0.0,
        perturb_steps: int = 3,
        policy: ChunkFn | None = None,
        policy_share: float = 0.0,
    ) -> None:
        if first_state_id + num_states > env.num_init_states:
            raise UserError(
                f"sft.stream_first_state_id + sft.stream_states = {first_state_id + num_states} is past the "
                f"env's {env.num_init_states} initial states"
            )
        missing = [k for k in obs_keys if k not in env.observation_spec]
        if missing:
            raise UserError(f"the env does not observe {missing}, which the policy reads")
        self.env, self.obs_keys, self.chunk_size = env, tuple(obs_keys), chunk_size
        self.pool_size, self.reuse = pool_size, reuse
        self.perturb, self.perturb_steps = perturb, perturb_steps
        self.policy, self.policy_share = policy, policy_share if policy is not None else 0.0
        self.first_state_id = first_state_id
        self.num_states = num_states
        self.rng = np.random.default_rng(seed)
        self.next_state = int(self.rng.integers(self.num_states))
        self.pool: dict[str, torch.Tensor] = {}
        self.filled = self.cursor = 0
        self.samples_made = self.samples_drawn = 0
        self.episodes = self.failures = self.bursts = 0
        # per env, the running episode's steps, and the push of a running burst and its steps left
        self.episode: list[list[Step]] = [[] for _ in range(env.num_envs)]
        self.push = torch.zeros(env.num_envs, POSITION_DIMS)
        self.push_left = torch.zeros(env.num_envs, dtype=torch.long)
        # per env, whether the policy plays its episode, and the rest of the policy's last chunk
        self.driven = torch.zeros(env.num_envs, dtype=torch.bool)
        self.queued: list[list[torch.Tensor]] = [[] for _ in range(env.num_envs)]
        self.policy_episodes = 0
        self.policy_outcomes: deque[bool] = deque(maxlen=100)  # the policy's latest episodes: succeeded
        self.obs = self._start(list(range(env.num_envs)))

    def _start(self, env_ids: list[int]) -> TensorDict:
        ids = [self.first_state_id + (self.next_state + k) % self.num_states for k in range(len(env_ids))]
        self.next_state = (self.next_state + len(env_ids)) % self.num_states
        if self.policy_share > 0:
            self.driven[env_ids] = torch.from_numpy(self.rng.random(len(env_ids)) < self.policy_share)
            for i in env_ids:
                self.queued[i] = []
        return self.env.reset_to(torch.tensor(ids), torch.tensor(env_ids))

    @property
    def policy_success(self) -> float:
        """The success rate of the policy's latest (up to 100) episodes in the stream; nan before any."""
        return sum(self.policy_outcomes) / len(self.policy_outcomes) if self.policy_outcomes else float("nan")

    # ---- filling -------------------------------------------------------------------------------------
    def step(self) -> None:
        """One step of every env: the expert's action, pushed during a burst, or the policy's; every step is
        labelled with the expert's. The expert's successful episodes and all the policy's enter the pool."""
        obs = self.obs
        actions = self.env.expert_actions().float()  # [N, A]
        pushed = self._pushes()
        keep = {k: obs[k].cpu() for k in (*self.obs_keys, TASK_ID) if k in obs.keys()}
        for i, trace in enumerate(self.episode):
            trace.append(({k: v[i] for k, v in keep.items()}, actions[i].cpu(), bool(self.push_left[i] > 0)))
        executed = actions.clone()
        executed[:, :POSITION_DIMS] = (executed[:, :POSITION_DIMS] + pushed.to(executed.device)).clamp(-1, 1)
        if self.driven.any():
            executed[self.driven.to(executed.device)] = self._policy_actions(obs).to(executed)
        result = self.env.step(executed[:, None, :])
        done = result.done.cpu().nonzero().flatten().tolist()
        for i in done:
            success = bool(result.success[i])
            if self.driven[i]:
                self._add(self.episode[i])
                self.policy_episodes += 1
                self.policy_outcomes.append(success)
            elif success:
                self._add(self.episode[i])
                self.episodes += 1
            else:
                self.failures += 1
            self.episode[i] = []
            self.push_left[i] = 0
        self.push_left = (self.push_left - 1).clamp(min=0)
        self.obs = self._start(done) if done else result.obs

    def _pushes(self) -> torch.Tensor:
        """[N, 3] this step's push of each env's executed position action (zero outside a burst); a burst
        starts with probability `perturb`, in a direction drawn uniformly from [-1, 1]^3."""
        if self.perturb > 0:
            draw = torch.from_numpy(self.rng.random(len(self.push_left)) < self.perturb)
            start = (self.push_left == 0) & draw & ~self.driven
            n = int(start.sum())
            if n:
                self.push[start] = torch.from_numpy(self.rng.uniform(-1.0, 1.0, (n, POSITION_DIMS))).float()
                self.push_left[start] = self.perturb_steps
                self.bursts += n
        return torch.where((self.push_left > 0)[:, None], self.push, 0.0)

    def _policy_actions(self, obs: TensorDict) -> torch.Tensor:
        """[n, A] the next action of each env the policy plays, from its last chunk or, where that is spent,
        a new one (one policy call for those envs)."""
        driven = self.driven.nonzero().flatten().tolist()
        spent = [i for i in driven if not self.queued[i]]
        if spent:
            chunks = self.policy(obs[torch.tensor(spent)]).cpu()  # [n, C, A]
            for i, chunk in zip(spent, chunks, strict=True):
                self.queued[i] = list(chunk)
        return torch.stack([self.queued[i].pop(0) for i in driven])

    def _add(self, trace: list[Step]) -> None:
        actions = torch.stack([a for _, a, _ in trace])  # [T, A]
        pushed = torch.tensor([p for _, _, p in trace])
        steps = torch.arange(len(trace))[:, None] + torch.arange(self.chunk_size)  # [T, C]
        inside = steps.clamp(max=len(trace) - 1)
        clean = ~(pushed[inside] & (steps < len(trace))).any(-1)  # no pushed step in the sample's chunk
        samples = {k: torch.stack([o[k] for o, _, _ in trace])[clean] for k in trace[0][0]}
        samples["action"] = actions[inside][clean]
        samples["action_is_pad"] = (steps >= len(trace))[clean]
        length = int(clean.sum())
        if length == 0:
            return
        if not self.pool:
            self.pool = {
                k: torch.zeros((self.pool_size, *v.shape[1:]), dtype=v.dtype) for k, v in samples.items()
            }
        kept = min(length, self.pool_size)  # of an episode longer than the pool, its tail would remain
        rows = (self.cursor + torch.arange(kept)) % self.pool_size
        for k, v in samples.items():
            self.pool[k][rows] = v[length - kept :]
        self.cursor = (self.cursor + kept) % self.pool_size
        self.filled = min(self.pool_size, self.filled + kept)
        self.samples_made += length

    def fill(self, samples: int) -> None:
        """Step until the pool holds `samples` (at most pool_size); raises if the expert never succeeds."""
        samples = min(samples, self.pool_size)
        while self.filled < samples:
            self.step()
            if self.failures > 100 and self.episodes == 0:
                raise UserError("the scripted expert failed its first 100 episodes; check the env settings")

    # ---- reading -------------------------------------------------------------------------------------
    def normalization_stats(self) -> dict[str, dict[str, np.ndarray]]:
        """Stats of the pool's action and vector observations, as `ActionChunkDataset.normalization_stats`."""
        out = {}
        for key, value in self.pool.items():
            if key in ("action_is_pad", TASK_ID) or value.dtype == torch.uint8:
                continue
            rows = value[: self.filled]
            if key == "action":
                rows = rows[:, 0]  # each frame's own action
            out[key] = feature_stats(rows.numpy())
        return out

    def batch(self, batch_size: int, generator: torch.Generator) -> TensorDict:
        """A batch drawn from the pool, after stepping the env as often as `reuse` asks."""
        self.samples_drawn += batch_size
        while self.samples_made * self.reuse < self.samples_drawn:
            self.step()
        rows = torch.randint(self.filled, (batch_size,), generator=generator)
        out = TensorDict({k: v[rows] for k, v in self.pool.items()}, batch_size=[batch_size])
        if TASK_ID in out.keys():
            out[INSTRUCTION] = self.env.instructions(out[TASK_ID])
        return out

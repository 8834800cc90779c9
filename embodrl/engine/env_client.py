"""The VecEnv the trainer sees: N envs in K stages, stepped by an env worker behind two channels.

`step` steps every stage (sequential use); `send_step` / `recv_step` let a schedule keep one stage
simulating while it infers another (pipelined use). Replies come back in request order.
"""

from __future__ import annotations

import time
from collections import deque

import torch
from tensordict import TensorDict

from embodrl.engine.channel import ChannelTimeout, Header, make_channel, make_request_channel
from embodrl.engine.config import EngineConfig
from embodrl.engine.launch import launch_env_worker
from embodrl.engine.timer import StageTimer
from embodrl.errors import UserError
from embodrl.sims.base import ActionSpec, StepResult, TensorSpec, VecEnv
from embodrl.sims.config import EnvConfig

_POLL_S = 1.0  # how often a waiting client checks that its worker is alive


class EnvWorkerError(RuntimeError):
    """An env worker raised, died or stalled; its stage is rebuilt and the iteration can be retried."""

    def __init__(self, stage: int, message: str) -> None:
        super().__init__(f"env worker stage {stage}: {message}")
        self.stage = stage


class StagedEnv(VecEnv):
    """N = K * (N / K) envs served by one env worker (thread, process or Ray actor)."""

    def __init__(self, env_cfg: EnvConfig, engine: EngineConfig, device: str = "cpu") -> None:
        if env_cfg.num_envs % engine.num_stages:
            raise UserError(
                f"env.num_envs={env_cfg.num_envs} must be a multiple of engine.num_stages={engine.num_stages}"
            )
        self.env_cfg, self.engine = env_cfg, engine
        self.num_envs, self.num_stages = env_cfg.num_envs, engine.num_stages
        self.stage_size = self.num_envs // self.num_stages
        self.device = torch.device(device)
        # env_step (inside the worker), env_wait (the caller blocked), transfer (the caller's copies)
        self.timer = StageTimer()
        self._obs: list[TensorDict | None] = [None] * self.num_stages  # latest observation per stage
        # fail_soft (ranks in lockstep): a failed step is kept in `failure` and answered with placeholders
        # until the rollout ends, so this rank runs the same forwards as the others; then all retry
        self.fail_soft = False
        self.failure: EnvWorkerError | None = None
        self._chunk = [1] * self.num_stages  # chunk length of each stage's last actions, for placeholders
        self._start()
        self._request(Header("spec"))
        self._spec = self._receive()[0].info

    def _start(self) -> None:
        transport = self.engine.transport
        if transport == "ray":  # the channels are Ray actors too: Ray must run before they are made
            from embodrl.engine.ray_backend import init_ray

            init_ray(self.engine.ray)
        self.requests, self.replies = make_request_channel(transport), make_channel(transport)
        self._pending: deque[tuple[str, int]] = deque()  # (kind, stage) of requests not yet answered
        device = str(self.device)
        self.worker = launch_env_worker(self.env_cfg, self.engine, device, self.requests, self.replies)

    # --- protocol --------------------------------------------------------------------------------
    def _request(self, header: Header, payload: TensorDict | None = None) -> None:
        self._pending.append((header.kind, header.stage))
        self.requests.put(header, payload)

    def _receive(self) -> tuple[Header, TensorDict | None]:
        """The reply to the oldest pending request; raises EnvWorkerError if the worker failed."""
        start = time.perf_counter()
        _, stage = self._pending[0]
        while True:
            try:
                header, payload = self.replies.get(timeout=_POLL_S)
                break
            except ChannelTimeout:
                if not self.worker.alive():
                    reason = self.worker.describe_exit()
                elif time.perf_counter() - start > self.engine.env_timeout_s:
                    reason = f"stalled: no reply within engine.env_timeout_s={self.engine.env_timeout_s}"
                    self.worker.join(timeout=0)  # stops a process or Ray actor; a stuck thread is abandoned
                else:
                    continue
                self._start()  # a fresh worker on fresh channels; the caller's retry resets every env
                raise EnvWorkerError(stage, f"{reason}; started a new env worker") from None
        self._pending.popleft()
        self.timer.add("env_wait", time.perf_counter() - start)
        transfer = self.requests.pop_transfer_s() + self.replies.pop_transfer_s()
        if transfer:  # this side's copies and serialization (multiprocess, Ray); threads hand over references
            self.timer.add("transfer", transfer)
        if header.kind == "error":
            if isinstance(header.info, UserError):  # the worker could not build the envs from env.*
                raise header.info
            self._drain()
            raise EnvWorkerError(header.stage, f"raised; restarted from its seed state:\n{header.info}")
        if header.info and "env_step" in header.info:  # a step's timings: env_step and the env's own parts
            for name, seconds in header.info.items():
                self.timer.add(name, seconds)
        return header, payload

    def _receive_stage(self, stage: int) -> tuple[Header, TensorDict | None]:
        """`_receive`, for a reply that must be stage `stage`'s."""
        header, payload = self._receive()
        if header.stage != stage:
            raise RuntimeError(f"expected the reply of stage {stage}, got stage {header.stage}")
        return header, payload

    def _drain(self) -> None:
        """Discard the replies to requests sent before a failure, so the next request starts clean."""
        while self._pending:
            self.replies.get(timeout=self.engine.env_timeout_s)
            self._pending.popleft()

    # --- stage-level API (pipelined schedules) ---------------------------------------------------
    def send_step(self, stage: int, actions: torch.Tensor, version: int = 0, step: int = 0) -> None:
        """Start stepping one stage with actions [N/K, C, A]; collect the result with `recv_step`."""
        self._chunk[stage] = actions.shape[1]
        if self.failure is not None:
            return  # this rollout is lost; its remaining steps are placeholders
        payload = TensorDict({"actions": actions}, batch_size=actions.shape[:1])
        self._request(Header("step", stage, version, step), payload)

    def recv_step(self, stage: int) -> StepResult:
        """The StepResult [N/K] of the oldest pending step, which must be stage `stage`'s."""
        if self.failure is not None:
            return self._placeholder(stage)
        try:
            payload = self._receive_stage(stage)[1]
        except EnvWorkerError as error:
            if not self.fail_soft:
                raise
            self.failure = error
            return self._placeholder(stage)
        result = StepResult.from_tensordict(payload)
        self._obs[stage] = result.obs
        return result

    def send_reset_to(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None = None) -> list[int]:
        """Start `reset_to` with one request per stage it touches; returns those stages, in the order in
        which `recv_reset` must collect them. A schedule may infer one stage while the next resets."""
        env_ids = self.check_state_ids(state_ids, env_ids)
        state_ids = torch.as_tensor(state_ids).flatten()
        stages = env_ids // self.stage_size
        touched = stages.unique().tolist()
        for s in touched:
            mine = stages == s
            local = env_ids[mine] - s * self.stage_size
            payload = TensorDict({"state_ids": state_ids[mine], "env_ids": local}, batch_size=local.shape)
            self._request(Header("reset_to", s), payload)
        return touched

    def recv_reset(self, stage: int) -> TensorDict:
        """The observation [N/K] of stage `stage` after the oldest pending reset, which must be its own."""
        self._obs[stage] = self._receive_stage(stage)[1]
        return self._obs[stage]

    def _placeholder(self, stage: int) -> StepResult:
        """What a stage "returns" after a soft failure: its last observation again, nothing executed."""
        obs = self._obs[stage]
        n, chunk = self.stage_size, self._chunk[stage]
        no = torch.zeros(n, dtype=torch.bool, device=self.device)
        return StepResult.build(
            obs=obs,
            reward=torch.zeros(n, chunk, device=self.device),
            terminated=no,
            truncated=no.clone(),
            success=no.clone(),
            final_obs=obs,
            steps_executed=torch.zeros(n, dtype=torch.int64, device=self.device),
            device=self.device,
            episode_flags={name: no.clone() for name in self.episode_flag_names},  # as the other stages'
        )

    def take_failure(self) -> EnvWorkerError | None:
        """The soft failure of the last rollout, if any; clears it."""
        failure, self.failure = self.failure, None
        return failure

    def stage_slice(self, stage: int) -> slice:
        return slice(stage * self.stage_size, (stage + 1) * self.stage_size)

    # --- VecEnv ----------------------------------------------------------------------------------
    @property
    def action_spec(self) -> ActionSpec:
        return self._spec["action_spec"]

    @property
    def observation_spec(self) -> dict[str, TensorSpec]:
        return self._spec["observation_spec"]

    @property
    def instruction_table(self) -> list[str]:
        return self._spec["instruction_table"]

    @property
    def num_init_states(self) -> int:
        return self._spec["num_init_states"]

    @property
    def episode_flag_names(self) -> tuple[str, ...]:
        return self._spec["episode_flag_names"]

    @property
    def instruction_tasks(self) -> list[str]:
        return self._spec["instruction_tasks"]

    def _all_obs(self) -> TensorDict:
        return torch.cat(self._obs)

    def reset(self, seed: int | None = None, options: dict | None = None) -> TensorDict:
        for s in range(self.num_stages):
            self._request(Header("reset", s, info=None if seed is None else seed + s * self.stage_size))
        for s in range(self.num_stages):
            self._obs[s] = self._receive()[1]
        return self._all_obs()

    def reset_to(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None = None) -> TensorDict:
        for s in self.send_reset_to(state_ids, env_ids):
            self.recv_reset(s)
        if any(obs is None for obs in self._obs):
            raise UserError("reset_to touched only some stages before any full reset; reset all envs first")
        return self._all_obs()

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = self.check_actions(actions)
        if self.num_stages == 1:  # no slice, no concatenation
            self.send_step(0, actions)
            return self.recv_step(0)
        for s in range(self.num_stages):
            self.send_step(s, actions[self.stage_slice(s)])
        return torch.cat([self.recv_step(s) for s in range(self.num_stages)])

    def render(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        env_ids = torch.arange(self.num_envs) if env_ids is None else torch.as_tensor(env_ids).flatten()
        stages = env_ids // self.stage_size
        touched = stages.unique().tolist()
        for s in touched:
            local = env_ids[stages == s] - s * self.stage_size
            self._request(Header("render", s), TensorDict({"env_ids": local}, batch_size=local.shape))
        frames = None  # [n, H, W, 3] in the order of env_ids
        for s in touched:
            part = self._receive()[1]["frames"]
            if frames is None:
                frames = part.new_empty((env_ids.numel(), *part.shape[1:]))
            frames[stages == s] = part
        return frames

    def close(self) -> None:
        if not self.worker.alive():
            return
        self._pending.clear()
        self.requests.put(Header("close"))
        try:
            self.replies.get(timeout=30)
        except ChannelTimeout:
            pass  # join below stops a worker that did not answer
        self.worker.join(timeout=30)

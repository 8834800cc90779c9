"""The env worker: owns K stages of num_envs / K envs and answers requests from one channel in order.

Requests (Header.kind, payload) and their replies:
  spec      -> spec (info: action/observation specs, instruction table, number of initial states,
               episode flag names)
  reset     -> ok (payload: obs of the stage)                 info: base seed
  reset_to  -> ok (payload: obs of the stage)                 payload: state_ids [n], env_ids [n]
  step      -> ok (payload: StepResult as a TensorDict)       payload: actions [N/K, C, A]
  render    -> ok (payload: frames [n, H, W, 3])              payload: env_ids [n]
  close     -> ok, then the worker exits
The worker serves from its own thread, process or Ray actor, or (transport `inline`) answers each
request inside the caller's `put`.
A request that raises is answered with `error` (info: the traceback) after the stage's envs are
rebuilt from their config (their seed state), so the caller can retry the iteration.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback

from tensordict import TensorDict

from embodrl.engine.channel import Channel, Header
from embodrl.errors import UserError
from embodrl.sims.base import VecEnv
from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env

log = logging.getLogger(__name__)


def stage_configs(env_cfg: EnvConfig, num_stages: int) -> list[EnvConfig]:
    """One config per stage: num_envs / K envs each, seeds offset by the stage's first global env index."""
    size = env_cfg.num_envs // num_stages
    return [
        dataclasses.replace(env_cfg, num_envs=size, seed=env_cfg.seed + s * size) for s in range(num_stages)
    ]


class EnvWorker:
    """K VecEnvs (the stages) behind a request/reply protocol (module docstring)."""

    def __init__(self, env_cfg: EnvConfig, num_stages: int, device: str) -> None:
        self.cfgs, self.device = stage_configs(env_cfg, num_stages), device
        self.stages: list[VecEnv] = [make_env(cfg, device=device) for cfg in self.cfgs]

    def spec(self) -> dict:
        env = self.stages[0]
        return {
            "action_spec": env.action_spec,
            "observation_spec": env.observation_spec,
            "instruction_table": env.instruction_table,
            "num_init_states": env.num_init_states,
            "episode_flag_names": env.episode_flag_names,
            "instruction_tasks": env.instruction_tasks,
        }

    def handle(self, header: Header, payload: TensorDict | None) -> tuple[Header, TensorDict | None]:
        """Answer one request; raises what the env raises."""
        env = self.stages[header.stage]
        if header.kind == "spec":
            return Header("spec", info=self.spec()), None
        if header.kind == "reset":
            return Header("ok", header.stage), env.reset(seed=header.info)
        if header.kind == "reset_to":
            return Header("ok", header.stage), env.reset_to(payload["state_ids"], payload["env_ids"])
        if header.kind == "step":
            env.pop_timings()  # drop what resets spent: the parts reported below lie inside env_step
            start = time.perf_counter()
            result = env.step(payload["actions"]).as_tensordict()
            timings = {"env_step": time.perf_counter() - start, **env.pop_timings()}
            return Header("ok", header.stage, header.version, header.step, timings), result
        if header.kind == "render":
            frames = env.render(payload["env_ids"])
            return Header("ok", header.stage), TensorDict({"frames": frames}, batch_size=frames.shape[:1])
        raise ValueError(f"unknown env worker request {header.kind!r}")

    def restart(self, stage: int) -> None:
        """Rebuild one stage's envs from their config (their seed state)."""
        try:
            self.stages[stage].close()
        except Exception:  # a broken env may fail to close too; it is replaced either way
            log.exception("closing the failed env of stage %d", stage)
        self.stages[stage] = make_env(self.cfgs[stage], device=self.device)

    def close(self) -> None:
        for env in self.stages:
            env.close()

    def serve_one(self, header: Header, payload: TensorDict | None, replies: Channel) -> bool:
        """Answer one request on `replies`; False once it was `close`."""
        if header.kind == "close":
            self.close()
            replies.put(Header("ok"))
            return False
        try:
            reply, out = self.handle(header, payload)
        except Exception:
            error = traceback.format_exc()
            log.warning("env worker stage %d failed; restarting its envs:\n%s", header.stage, error)
            try:
                self.restart(header.stage)
            except Exception:
                error += "\nrestarting the stage failed too:\n" + traceback.format_exc()
            replies.put(Header("error", header.stage, header.version, header.step, error))
            return True
        replies.put(reply, out)
        return True

    def serve(self, requests: Channel, replies: Channel) -> None:
        """Answer requests until `close`."""
        while self.serve_one(*requests.get(), replies):
            pass


def build_env_worker(env_cfg: EnvConfig, num_stages: int, device: str, replies: Channel) -> EnvWorker | None:
    """The env worker, or None after answering `error` on `replies` (a UserError as it is, for the
    caller to re-raise; anything else as its traceback)."""
    try:
        return EnvWorker(env_cfg, num_stages, device)
    except UserError as e:
        replies.put(Header("error", info=e))
    except Exception:
        replies.put(Header("error", info=traceback.format_exc()))
    return None


def serve_env_worker(
    env_cfg: EnvConfig, num_stages: int, device: str, requests: Channel, replies: Channel
) -> None:
    """Entry point of an env worker thread or process: build the envs, then serve until `close`."""
    worker = build_env_worker(env_cfg, num_stages, device, replies)
    if worker is not None:
        worker.serve(requests, replies)

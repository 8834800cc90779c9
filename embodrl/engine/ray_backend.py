"""Env workers as Ray actors (`engine.transport=ray`), on a local Ray or an existing cluster.

Ray's token authentication stays as Ray sets it; nothing here turns it off:
- local Ray (`engine.ray.address=""`): Ray >= 2.59 enables token auth for the cluster it starts and
  creates a token in ~/.ray/auth_token when there is none (set RAY_AUTH_MODE=disabled yourself to opt out);
- an existing cluster (`engine.ray.address=auto` or `<head-ip>:6379`): start it with
  `RAY_AUTH_MODE=token ray start --head` and `ray start --address=<head-ip>:6379` on the other nodes;
  the training process needs the same token: `ray get-auth-token` on the head, then
  RAY_AUTH_MODE=token with RAY_AUTH_TOKEN=<token> or RAY_AUTH_TOKEN_PATH=<file>.
"""

from __future__ import annotations

import logging

from embodrl.engine.channel import Channel
from embodrl.engine.config import RayConfig
from embodrl.engine.env_worker import serve_env_worker
from embodrl.engine.worker_handle import WorkerHandle
from embodrl.errors import UserError
from embodrl.sims.config import EnvConfig

log = logging.getLogger(__name__)


def init_ray(cfg: RayConfig) -> None:
    """Connect to the cluster at `cfg.address`, or start a local Ray; once per process."""
    try:
        import ray
        from ray.exceptions import AuthenticationError
    except ImportError:
        raise UserError("engine.transport=ray needs Ray: pip install 'embodrl[ray]'") from None
    if ray.is_initialized():
        return
    try:
        if cfg.address:
            ray.init(address=cfg.address, log_to_driver=False)
        else:
            ray.init(num_cpus=cfg.num_cpus or None, include_dashboard=False, log_to_driver=False)
    except AuthenticationError as e:
        raise UserError(
            f"the Ray cluster at {cfg.address!r} requires a token ({e}); run `ray get-auth-token` on "
            "its head node, then set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<token> (or RAY_AUTH_TOKEN_PATH)"
        ) from None
    except ConnectionError as e:
        raise UserError(
            f"cannot reach a Ray cluster at engine.ray.address={cfg.address!r} ({e}); start one with "
            "`ray start --head`, or leave engine.ray.address empty for a local Ray"
        ) from None


class _EnvWorkerActor:
    """The Ray actor: serves env requests until `close`."""

    def serve(self, *args) -> None:
        serve_env_worker(*args)


class RayHandle(WorkerHandle):
    """An env worker running as a Ray actor (one CPU)."""

    def __init__(
        self,
        cfg: RayConfig,
        env_cfg: EnvConfig,
        num_stages: int,
        device: str,
        requests: Channel,
        replies: Channel,
    ) -> None:
        import ray

        init_ray(cfg)
        self.actor = ray.remote(num_cpus=1)(_EnvWorkerActor).remote()
        self.done = self.actor.serve.remote(env_cfg, num_stages, device, requests, replies)

    def alive(self) -> bool:
        import ray

        finished, _ = ray.wait([self.done], timeout=0)
        return not finished

    def describe_exit(self) -> str:
        import ray

        try:
            ray.get(self.done, timeout=0)
        except Exception as e:  # the actor's failure, as Ray reports it
            return f"the env worker Ray actor failed: {type(e).__name__}: {e}"
        return "the env worker Ray actor ended"

    def join(self, timeout: float) -> None:
        import ray

        finished, _ = ray.wait([self.done], timeout=timeout)
        if not finished:
            ray.kill(self.actor)

"""Engine configuration (torch-free; composed into the experiment config as `engine`)."""

from dataclasses import dataclass, field

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError

SCHEDULES = ("sequential", "pipelined", "async")
TRANSPORTS = ("inproc", "multiprocess", "ray")
PLACEMENTS = ("colocated", "disaggregated")
# Under torchrun every rank keeps whole weights, for its rollouts, and rank 0 for checkpoints and evaluation.
# FSDP (engine/data_parallel.py) needs full weights gathered for those: not wired into the runner yet.
RUNNER_DATA_PARALLEL = ("ddp",)


@dataclass
class RayConfig:
    """Where the Ray workers run: a local Ray started by the run, or an existing cluster."""

    # "" starts a local Ray inside the run; "auto" or "<head-ip>:6379" joins a cluster started with
    # `ray start --head` (and `ray start --address=<head-ip>:6379` on the other machines).
    address: str = ""
    num_cpus: int = 0  # local Ray only; 0 = every core


@dataclass
class EngineConfig:
    """How rollouts are produced: schedule, pipeline stages, transport between workers, placement."""

    # sequential: infer all envs, then step all envs; pipelined: stage i simulates while stage i+1
    # infers; async: rollouts continue while the actor trains, with samples at most max_staleness
    # weight versions old.
    schedule: str = "sequential"
    num_stages: int = 1  # K: the env worker's envs split into K stages of num_envs / K envs
    # inproc: env worker on a thread; multiprocess: a process with shared-memory tensors; ray: a Ray actor
    transport: str = "inproc"
    max_staleness: int = 0  # async: 0 reproduces the synchronous result
    # colocated: the rollout worker uses the actor's policy (sync schedules); disaggregated: a copy on
    # rollout_device that receives versioned weights after every update (async always uses a copy)
    placement: str = "colocated"
    rollout_device: str = ""  # "" = the experiment's device
    env_timeout_s: float = 600.0  # an env worker silent for this long is reported as stalled
    max_retries: int = 2  # retries of an iteration whose env worker failed; then the error is raised
    # Under `torchrun --nproc_per_node=K -m embodrl.cli train`: how the K actor copies share the update
    # (each rank collects env.num_envs envs of its own; gradients are averaged over ranks)
    data_parallel: str = "ddp"
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self) -> None:
        check_choice("engine.schedule", self.schedule, SCHEDULES)
        check_choice("engine.transport", self.transport, TRANSPORTS)
        check_choice("engine.placement", self.placement, PLACEMENTS)
        check_choice("engine.data_parallel", self.data_parallel, RUNNER_DATA_PARALLEL)
        check_positive("engine.num_stages", self.num_stages)
        check_positive("engine.max_staleness", self.max_staleness, allow_zero=True)
        check_positive("engine.env_timeout_s", self.env_timeout_s)
        check_positive("engine.max_retries", self.max_retries, allow_zero=True)
        check_positive("engine.ray.num_cpus", self.ray.num_cpus, allow_zero=True)
        if self.schedule == "pipelined" and self.num_stages < 2:
            raise ConfigError("engine.schedule=pipelined needs engine.num_stages >= 2 (e.g. 2 or 4)")

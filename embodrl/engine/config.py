"""Engine configuration (torch-free; composed into the experiment config as `engine`)."""

from dataclasses import dataclass, field

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError

SCHEDULES = ("sequential", "pipelined", "async")
TRANSPORTS = ("inproc", "inline", "multiprocess", "ray")
PLACEMENTS = ("colocated", "disaggregated")
# parallel/data_parallel.py's strategies (this module stays torch-free)
DATA_PARALLEL = ("ddp", "fsdp")


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
    # inproc: env worker on a thread; inline: on the caller's thread (the least per-step overhead, for
    # a few envs with cheap steps; no stall timeout, no overlap); multiprocess: a process with
    # shared-memory tensors; ray: a Ray actor
    transport: str = "inproc"
    max_staleness: int = 0  # async: 0 reproduces the synchronous result
    # colocated: the inference worker uses the actor's policy (sync schedules); disaggregated: a copy on
    # rollout_device that receives versioned weights after every update (async always uses a copy)
    placement: str = "colocated"
    rollout_device: str = ""  # "" = the experiment's device
    # sync schedules: what a phase leaves idle waits in host memory (the optimizer state and gradients,
    # and a disaggregated actor's weights, during rollouts; a disaggregated inference copy during updates)
    offload: bool = False
    env_timeout_s: float = 600.0  # an env worker silent for this long is reported as stalled
    max_retries: int = 2  # retries of an iteration whose env worker failed; then the error is raised
    # Under `torchrun --nproc_per_node=K -m embodrl.cli train`: how the K actor copies share the update
    # (each rank collects env.num_envs envs of its own; gradients are averaged over ranks). ddp: every
    # rank holds all weights; fsdp: 1/K of each weight and optimizer state, with transformer blocks sharded
    # one by one (for policies too large to replicate)
    data_parallel: str = "ddp"
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self) -> None:
        check_choice("engine.schedule", self.schedule, SCHEDULES)
        check_choice("engine.transport", self.transport, TRANSPORTS)
        check_choice("engine.placement", self.placement, PLACEMENTS)
        check_choice("engine.data_parallel", self.data_parallel, DATA_PARALLEL)
        check_positive("engine.num_stages", self.num_stages)
        check_positive("engine.max_staleness", self.max_staleness, allow_zero=True)
        check_positive("engine.env_timeout_s", self.env_timeout_s)
        check_positive("engine.max_retries", self.max_retries, allow_zero=True)
        check_positive("engine.ray.num_cpus", self.ray.num_cpus, allow_zero=True)
        if self.schedule == "pipelined" and self.num_stages < 2:
            raise ConfigError("engine.schedule=pipelined needs engine.num_stages >= 2 (e.g. 2 or 4)")
        if self.schedule == "pipelined" and self.transport == "inline":
            raise ConfigError(
                "engine.schedule=pipelined overlaps simulation with inference, and engine.transport=inline "
                "simulates on the inferring thread: use engine.transport=inproc or multiprocess"
            )
        if self.offload and self.schedule == "async":
            raise ConfigError(
                "engine.offload=true needs engine.schedule=sequential or pipelined: async rollouts run "
                "during the updates, so nothing waits idle to offload"
            )
        if self.offload and self.data_parallel == "fsdp":
            raise ConfigError(
                "engine.offload=true does not apply with engine.data_parallel=fsdp, which shards the "
                "weights and optimizer state instead; use engine.offload=false"
            )
        if self.data_parallel == "fsdp":
            self._check_lockstep()

    def _check_lockstep(self) -> None:
        """FSDP all-gathers in every forward, so all ranks must run the same forwards in the same order.
        The sequential and pipelined schedules do (T decisions of every stage per rollout, on every rank)."""
        if self.schedule == "async":
            raise ConfigError(
                "engine.data_parallel=fsdp needs engine.schedule=sequential or pipelined: async rollouts "
                "would all-gather on a second thread while the update all-gathers on the first"
            )
        if self.placement == "disaggregated":
            raise ConfigError(
                "engine.data_parallel=fsdp needs engine.placement=colocated: the rollouts use the sharded "
                "actor itself (a whole copy per rank is what fsdp avoids; use ddp for that)"
            )

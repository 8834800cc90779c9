"""Environment configuration (torch-free; composed into the experiment config)."""

from dataclasses import dataclass, field

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError
from embodrl.sims.perturbation import RandomizeConfig, check_randomize

OBS_MODES = ("state", "rgb")
IMAGE_SIZES = (64, 128, 224)
REWARD_TYPES = ("sparse", "dense")
CONTROL_MODES = ("ee_delta", "ee_delta_yaw", "ee_delta_pos", "joint_pos")
# mujoco: the C library (threads); warp: MuJoCo Warp on a CUDA GPU; warp-cpu: MuJoCo Warp on Warp's CPU device
PHYSICS_BACKENDS = ("mujoco", "warp", "warp-cpu")
# env=none: no simulator; `embodrl sft` then takes the policy's inputs, sizes and tasks from its dataset
NO_SIMULATOR = "none"


@dataclass
class EnvConfig:
    """Which simulator, which tasks, how many envs, what they observe and how they are rewarded."""

    suite: str = "tabletop-basic"  # `embodrl envs` lists the suites
    task: str | None = None  # one task of the suite; None samples all tasks of the suite
    num_envs: int = 8
    seed: int = 0
    max_episode_steps: int = 80  # control steps (0.05 s each in the tabletop suite)
    obs_mode: str = "state"  # "rgb" adds camera images to the state observation
    image_size: int = 64
    wrist_camera: bool = False
    reward: str = "sparse"  # sparse: 1 on success; dense: shaped progress reward + success bonus
    terminate_on_success: bool = True
    # ee_delta: 7-D [dxyz, drpy, gripper]; ee_delta_yaw: 5-D [dxyz, dyaw, gripper] with roll and pitch held
    # (top-down grasping: no action dimension the tasks never use); ee_delta_pos: 4-D [dxyz, gripper]
    # with the hand held pointing down (as ManiSkill's pd_ee_delta_pos); joint_pos: absolute joint targets
    control_mode: str = "ee_delta"
    render_shadows: bool = False  # shadows cost ~10x render time on CPU; turn on for videos
    num_threads: int = 0  # physics threads (LIBERO: worker processes); 0 = one per core
    physics_backend: str = "mujoco"  # tabletop suites: who steps the MJCF (PHYSICS_BACKENDS)
    gym_id: str = ""  # suite "gym": any gymnasium env id
    libero_assets: str = ""  # suites "libero-*": LIBERO's assets folder; "" = the installed package's
    # per-episode perturbations (sims/perturbation.py): training-time randomization, or a robustness level
    randomize: RandomizeConfig = field(default_factory=RandomizeConfig)

    def __post_init__(self) -> None:
        check_positive("env.num_envs", self.num_envs)
        check_positive("env.seed", self.seed, allow_zero=True)  # seeds numpy streams, which take no negatives
        check_positive("env.max_episode_steps", self.max_episode_steps)
        check_positive("env.num_threads", self.num_threads, allow_zero=True)
        check_choice("env.obs_mode", self.obs_mode, OBS_MODES)
        check_choice("env.image_size", self.image_size, IMAGE_SIZES)
        check_choice("env.reward", self.reward, REWARD_TYPES)
        check_choice("env.control_mode", self.control_mode, CONTROL_MODES)
        check_choice("env.physics_backend", self.physics_backend, PHYSICS_BACKENDS)
        if self.physics_backend != "mujoco" and not self.suite.startswith("tabletop"):
            raise ConfigError(
                f"env.physics_backend={self.physics_backend} applies to the tabletop suites only; "
                f"suite {self.suite!r} brings its own physics: set env.physics_backend=mujoco"
            )
        check_randomize(self.randomize, self.suite, self.obs_mode, self.physics_backend)

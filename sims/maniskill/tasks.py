"""Which ManiSkill3 task to build and how: validation, instructions, gym.make arguments."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from embodrl.errors import UserError
from embodrl.sims.config import EnvConfig

INSTALL_HINT = "pip install 'embodrl[maniskill]'"
VULKAN_HINT = (
    "ManiSkill (SAPIEN) needs a Vulkan driver even for state observations. On a CPU-only Debian "
    "machine run `make maniskill-cpu` and `. .cache/vulkan-lvp/env.sh`; on a GPU machine install the "
    "NVIDIA Vulkan driver (libnvidia-gl)"
)
# SAPIEN's messages when no usable Vulkan device exists (no ICD, or one lacking required features).
VULKAN_ERRORS = ("vk::", "ErrorIncompatibleDriver", "supported physical device", "rendering device")

CONTROL_MODES = {"ee_delta": "pd_ee_delta_pose", "joint_pos": "pd_joint_pos"}
REWARD_MODES = {"sparse": "sparse", "dense": "normalized_dense"}
WRIST_ROBOT = "panda_wristcam"  # the Panda with a hand camera, swapped in for the Panda

# ManiSkill tasks carry no language; these follow each task's success condition.
INSTRUCTIONS = {
    "PushCube-v1": "push the cube to the goal region",
    "PullCube-v1": "pull the cube to the goal region",
    "PickCube-v1": "pick up the cube and move it to the goal position",
    "StackCube-v1": "stack the red cube on top of the green cube",
    "PegInsertionSide-v1": "insert the peg into the hole in the box",
    "PlugCharger-v1": "plug the charger into the wall receptacle",
    "PushT-v1": "push the T-shaped block onto the T-shaped target",
    "LiftPegUpright-v1": "lift the peg and stand it upright",
    "PokeCube-v1": "use the peg to poke the cube to the goal region",
    "PullCubeTool-v1": "use the tool to pull the cube closer",
    "RollBall-v1": "roll the ball to the goal region",
    "PlaceSphere-v1": "place the sphere into the bin",
}


def instruction(task: str) -> str:
    """The instruction for a task: the table above, else the task id split into words."""
    if task in INSTRUCTIONS:
        return INSTRUCTIONS[task]
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", task.rsplit("-v", 1)[0]).lower()
    return f"complete the task: {words}"


def registered_tasks() -> dict:
    """ManiSkill's task registry (id -> EnvSpec); importing mani_skill.envs fills it."""
    try:
        import mani_skill.envs  # noqa: F401 (registers the tasks)
        from mani_skill.utils.registration import REGISTERED_ENVS
    except ImportError as exc:
        raise UserError(f"suite 'maniskill' needs ManiSkill3: {INSTALL_HINT} ({exc})") from exc
    return REGISTERED_ENVS


def check_task(cfg: EnvConfig) -> None:
    """Raise a UserError for an unknown task, missing assets or an unsupported wrist camera."""
    tasks = registered_tasks()
    if cfg.task is None or cfg.task not in tasks:
        examples = ", ".join(t for t in INSTRUCTIONS if t in tasks)
        raise UserError(
            f"suite 'maniskill' needs env.task=<a ManiSkill task id>, got {cfg.task!r}; e.g. {examples}. "
            f"All {len(tasks)} ids: {', '.join(sorted(tasks))}"
        )
    from mani_skill.utils import assets

    spec = tasks[cfg.task]
    expand = assets.expand_data_group_into_individual_data_source_ids
    sources = [
        s for a in spec.asset_download_ids or [] for s in (expand(a) if a in assets.DATA_GROUPS else [a])
    ]
    missing = [s for s in sources if not assets.is_data_source_downloaded(s)]
    if missing:
        raise UserError(
            f"ManiSkill task {cfg.task} needs assets {missing} that are not installed; run "
            f"`python -m mani_skill.utils.download_asset {cfg.task}` on a machine with network access"
        )
    robots = spec.cls.SUPPORTED_ROBOTS
    if cfg.wrist_camera and robots is not None and "panda" not in robots:
        raise UserError(
            f"ManiSkill task {cfg.task} does not use the Panda arm, so it has no wrist camera "
            f"(robots: {robots}); set env.wrist_camera=false"
        )


def check_gpu_physx() -> None:
    """Start SAPIEN's GPU PhysX. SAPIEN fetches PhysX's GPU library over the network the first time; on a
    machine that cannot, say which file to bring and where, instead of failing inside `requests`."""
    import requests
    from sapien import physx

    try:
        physx.enable_gpu()
    except (requests.RequestException, zipfile.BadZipFile) as exc:
        version = physx.version()
        folder = Path.home() / ".sapien" / "physx" / version
        raise UserError(
            f"ManiSkill's GPU simulation needs SAPIEN's PhysX GPU library (libPhysXGpu_64.so), which SAPIEN "
            f"downloads on first use and could not ({type(exc).__name__}). Unzip linux-so.zip of the "
            f"sapien-sim/physx-precompiled release {version} into {folder} (copy it from a machine that has "
            f"network access), or run ManiSkill on the CPU with device=cpu"
        ) from exc


def make_kwargs(cfg: EnvConfig, num_envs: int, sim_backend: str) -> dict:
    """Keyword arguments for gym.make(cfg.task, ...)."""
    if cfg.control_mode not in CONTROL_MODES:
        raise UserError(
            f"env.control_mode={cfg.control_mode!r} is not available in ManiSkill; "
            f"use one of {list(CONTROL_MODES)}"
        )
    size = {"width": cfg.image_size, "height": cfg.image_size}
    kwargs = dict(
        num_envs=num_envs,
        obs_mode="rgb" if cfg.obs_mode == "rgb" else "state_dict",
        control_mode=CONTROL_MODES[cfg.control_mode],
        reward_mode=REWARD_MODES[cfg.reward],
        sim_backend=sim_backend,
        max_episode_steps=cfg.max_episode_steps,
        render_mode="rgb_array",
        sensor_configs=size,
        human_render_camera_configs=size,
    )
    if cfg.wrist_camera:
        kwargs["robot_uids"] = WRIST_ROBOT
    return kwargs

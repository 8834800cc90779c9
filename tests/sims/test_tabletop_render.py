"""Camera images show the instructed object in its colour where the camera projects it."""

import mujoco
import numpy as np
import pytest

from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env
from embodrl.sims.tabletop.tasks import COLOR_NAMES


def _project(env, world: np.ndarray, size: int) -> tuple[int, int]:
    data = env.physics.data(0, mujoco.MjData(env.model))
    cam = mujoco.mj_name2id(env.model, mujoco.mjtObj.mjOBJ_CAMERA, "front")
    rel = data.cam_xmat[cam].reshape(3, 3).T @ (world - data.cam_xpos[cam])
    f = 0.5 * size / np.tan(np.deg2rad(env.model.cam_fovy[cam]) / 2)
    return int(size / 2 - f * rel[1] / -rel[2]), int(size / 2 + f * rel[0] / -rel[2])  # row, col


@pytest.mark.parametrize("state_id", [0, 1, 2, 3, 4, 5])
def test_instructed_cube_has_its_colour_in_the_image(state_id):
    size = 128
    env = make_env(EnvConfig(task="pick", num_envs=1, obs_mode="rgb", image_size=size))
    obs = env.reset_to([state_id])
    color = next(c for c in COLOR_NAMES if c in env.instructions(obs["task_id"])[0])
    row, col = _project(env, env._frame().main[0], size)
    patch = obs["rgb"][0, row - 2 : row + 3, col - 2 : col + 3].reshape(-1, 3).float().mean(0).numpy()
    r, g, b = patch
    expected = {
        "red": r > g + 60 and r > b + 60,
        "green": g > r + 40 and g > b + 40,
        "blue": b > r + 60 and b > g + 40,
        "yellow": r > b + 60 and g > b + 60,
    }
    assert expected[color], f"{color} cube renders as mean rgb {patch.round()}"
    # the same scene renders for videos, at least 128 px
    assert tuple(env.render().shape) == (1, size, size, 3)

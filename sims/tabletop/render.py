"""Offscreen camera images of the batch: one GL context per camera; shadows, reflections off by default."""

from __future__ import annotations

import mujoco
import numpy as np

from embodrl.errors import UserError

_COSTLY_FLAGS = (
    mujoco.mjtRndFlag.mjRND_SHADOW,
    mujoco.mjtRndFlag.mjRND_REFLECTION,
    mujoco.mjtRndFlag.mjRND_SKYBOX,
)


class BatchRenderer:
    """Renders one camera's view of envs from a physics batch into uint8 [n, H, W, 3]."""

    def __init__(self, model: mujoco.MjModel, size: int, shadows: bool, camera: str):
        try:
            self._renderer = mujoco.Renderer(model, size, size)
        except Exception as exc:  # no EGL/OSMesa: say how to get one instead of a GL traceback
            raise UserError(
                f"offscreen rendering failed ({exc}); install EGL or OSMesa (e.g. apt-get install libegl1 "
                "libosmesa6) and set MUJOCO_GL=egl or MUJOCO_GL=osmesa, or use obs_mode=state"
            ) from exc
        self._scratch = mujoco.MjData(model)
        self._shadows = shadows
        self.size = size
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._camera.fixedcamid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        self._option = mujoco.MjvOption()
        self._warm = False

    def render(self, physics, ids: np.ndarray) -> np.ndarray:
        """Images [len(ids), H, W, 3] of envs `ids`."""
        out = np.empty((len(ids), self.size, self.size, 3), dtype=np.uint8)
        if not self._warm and len(ids):
            # The first frame of a context (and the first after a camera change, hence one context
            # per camera) differs by a few levels in some pixels on llvmpipe; render one and discard
            # it, so that equal states always give equal images (reset_to determinism for pixels).
            self._draw(physics, int(ids[0]), out[0])
            self._warm = True
        for j, i in enumerate(ids):
            self._draw(physics, int(i), out[j])
        return out

    def _draw(self, physics, i: int, out: np.ndarray) -> None:
        # env i's own model where perturbations gave it one: its colours, lights and cameras
        scene = self._renderer.scene
        data = physics.data(i, self._scratch)
        mujoco.mjv_updateScene(
            physics.model_of(i), data, self._option, None, self._camera, mujoco.mjtCatBit.mjCAT_ALL, scene
        )
        if not self._shadows:
            for flag in _COSTLY_FLAGS:
                self._renderer.scene.flags[flag] = 0
        self._renderer.render(out=out)

    def close(self) -> None:
        self._renderer.close()

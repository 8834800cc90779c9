"""N copies of one MuJoCo model stepped together: `mujoco.batch` (C thread pool) or a plain loop.

`mujoco.batch.Batch` (mujoco >= 4.0) steps all simulations in C without the GIL; on older
bindings a loop over MjData with `mj_step(nstep=...)` keeps the substeps in C. Both expose the
same numpy arrays [N, ...], so the env above never knows which one runs.
"""

from __future__ import annotations

import copy
import os

import mujoco
import numpy as np

try:
    from mujoco import batch as _mj_batch
except ImportError:  # mujoco < 4.0
    _mj_batch = None


def default_threads(num_threads: int) -> int:
    """0 means one thread per core, as in EnvConfig.num_threads."""
    return num_threads or len(os.sched_getaffinity(0))


class BatchPhysics:
    """Persistent `mujoco.batch.Batch`: live [N, ...] views of the state, outputs refreshed per call."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, num_threads: int):
        self.model = model
        self.num_envs = num_envs
        threads = min(default_threads(num_threads), num_envs)
        self._batch = _mj_batch.Batch(model, num_envs, threads, persistent=True)
        self.qpos = self._batch.bind("qpos")  # [N, nq] writable state
        self.qvel = self._batch.bind("qvel")
        self.ctrl = self._batch.bind("ctrl")
        self.mocap_pos = self._batch.bind("mocap_pos")
        self.site_xpos = self._batch.bind("site_xpos")  # [N, nsite, 3] output of the last call
        self.site_xmat = self._batch.bind("site_xmat")
        self.xanchor = self._batch.bind("xanchor")  # [N, njnt, 3] joint anchors in the world
        self.xaxis = self._batch.bind("xaxis")  # [N, njnt, 3] joint axes in the world
        self.models: list[mujoco.MjModel] | None = None  # per-env models, once use_own_models was called

    def use_own_models(self) -> list[mujoco.MjModel]:
        """A copy of the model per env from now on, for the caller to edit (then `models_edited`)."""
        self.models = [copy.copy(self.model) for _ in range(self.num_envs)]
        self._batch.set_models(self.models)
        return self.models

    def models_edited(self) -> None:
        self._batch.set_models(self.models)  # the batch reads caller models again only when set

    def model_of(self, i: int) -> mujoco.MjModel:
        """The model env i runs on (for rendering)."""
        return self.model if self.models is None else self.models[i]

    def reset(self, ids: np.ndarray) -> None:
        """Model defaults for envs `ids` (time, warm starts, everything), before the caller writes state."""
        self._batch.reset(ids, stage=mujoco.mjtStage.mjSTAGE_NONE)

    def forward(self, ids: np.ndarray | None = None) -> None:
        self._batch.forward(ids)

    def step(self, nstep: int) -> None:
        """nstep substeps per env, then positions and velocities recomputed at the new state."""
        self._batch.step(None, nstep, mujoco.mjtStage.mjSTAGE_VEL)

    def data(self, i: int, out: mujoco.MjData) -> mujoco.MjData:
        """Env i's state copied into `out` (for rendering)."""
        return self._batch.get_data(i, out)


class LoopPhysics:
    """A list of MjData; the fallback where `mujoco.batch` is missing (mujoco < 4.0)."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, num_threads: int):
        del num_threads  # a Python loop holds the GIL: threads would not help
        self.model = model
        self.num_envs = num_envs
        self._datas = [mujoco.MjData(model) for _ in range(num_envs)]
        self.qpos = np.zeros((num_envs, model.nq))
        self.qvel = np.zeros((num_envs, model.nv))
        self.ctrl = np.zeros((num_envs, model.nu))
        self.mocap_pos = np.zeros((num_envs, model.nmocap, 3))
        self.site_xpos = np.zeros((num_envs, model.nsite, 3))
        self.site_xmat = np.zeros((num_envs, model.nsite, 9))
        self.xanchor = np.zeros((num_envs, model.njnt, 3))
        self.xaxis = np.zeros((num_envs, model.njnt, 3))
        self.models: list[mujoco.MjModel] | None = None
        for d in self._datas:
            mujoco.mj_forward(model, d)
        self._pull(range(num_envs))

    def use_own_models(self) -> list[mujoco.MjModel]:
        """A copy of the model per env from now on, for the caller to edit (then `models_edited`)."""
        self.models = [copy.copy(self.model) for _ in range(self.num_envs)]
        return self.models

    def models_edited(self) -> None:
        """Nothing to do: each step reads the models."""

    def model_of(self, i: int) -> mujoco.MjModel:
        return self.model if self.models is None else self.models[i]

    def _pull(self, ids) -> None:
        for i in ids:
            d = self._datas[i]
            self.qpos[i], self.qvel[i], self.ctrl[i] = d.qpos, d.qvel, d.ctrl
            self.mocap_pos[i], self.site_xpos[i], self.site_xmat[i] = d.mocap_pos, d.site_xpos, d.site_xmat
            self.xanchor[i], self.xaxis[i] = d.xanchor, d.xaxis

    def _push(self, ids) -> None:
        for i in ids:
            d = self._datas[i]
            d.qpos[:], d.qvel[:], d.ctrl[:], d.mocap_pos[:] = (
                self.qpos[i],
                self.qvel[i],
                self.ctrl[i],
                self.mocap_pos[i],
            )

    def reset(self, ids: np.ndarray) -> None:
        for i in ids:
            mujoco.mj_resetData(self.model_of(i), self._datas[i])
        self._pull(ids)

    def forward(self, ids: np.ndarray | None = None) -> None:
        ids = range(self.num_envs) if ids is None else ids
        self._push(ids)
        for i in ids:
            mujoco.mj_forward(self.model_of(i), self._datas[i])
        self._pull(ids)

    def step(self, nstep: int) -> None:
        ids = range(self.num_envs)
        self._push(ids)
        for i, d in enumerate(self._datas):
            model = self.model_of(i)
            mujoco.mj_step(model, d, nstep)
            mujoco.mj_kinematics(model, d)  # sites, joint axes and cameras at the new state
            mujoco.mj_camlight(model, d)
        self._pull(ids)

    def data(self, i: int, out: mujoco.MjData) -> mujoco.MjData:
        """Env i's live MjData (no copy needed; `out` is unused)."""
        return self._datas[i]


def has_batch() -> bool:
    """Whether these bindings have `mujoco.batch` (mujoco >= 4.0)."""
    return _mj_batch is not None


def make_physics(model: mujoco.MjModel, num_envs: int, num_threads: int, backend: str):
    """MuJoCo Warp for warp/warp-cpu; else `mujoco.batch` if present (measured faster), else a loop."""
    if backend != "mujoco":
        from embodrl.sims.tabletop.physics_warp import WarpPhysics, warp_device  # optional package

        return WarpPhysics(model, num_envs, warp_device(backend))
    cls = BatchPhysics if has_batch() else LoopPhysics
    return cls(model, num_envs, num_threads)

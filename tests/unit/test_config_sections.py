"""Config flows down as sections (issue 14, item 4): every ``cfg`` parameter in gyre_hpc and in the entry points
(jobs/, issue 30) is annotated, none is ``Any`` outside ``ANY_OK``, and in gyre_hpc the root ``GyreConfig`` is taken
only by the functions in ``ROOT_OK`` (path:function), the ones that compose sections: the launcher and the rank entry
points, the sbatch/submitit rendering, the run directory's config file, the simulator's runs of a whole config. A
live component (a cell's sides, rollouts, the engine's start directory) takes the typed sections it needs. The
entry points in jobs/ compose sections by definition: they may take the root."""
from __future__ import annotations

import ast
from pathlib import Path

import gyre_hpc

PACKAGE = Path(gyre_hpc.__file__).parent
JOBS = PACKAGE.parent / "jobs"

ANY_OK = {
    "gyre_hpc/config.py:to_dict",  # any config dataclass, the root or a section
    "gyre_hpc/files/hf_config.py:resolve_fields",  # a ModelConfig; this module sits below config and cannot name it
}

ROOT_OK = {
    # rank entry point and rank 0's driver: they hand each component its sections
    *(f"gyre_hpc/live/rank.py:{f}" for f in ("check_resume_config", "run_rank", "_shared_initial_model",
                                             "_last_event_t", "_role")),
    "gyre_hpc/live/root.py:run_root",
    "gyre_hpc/live/root_files.py:load_resume",  # checks the resume state against the config (allocator.steps)
    # the run directory's config file holds the whole (resolved) config
    *(f"gyre_hpc/rundir.py:RunDir.{f}" for f in ("write_config", "keep_config")),
    "gyre_hpc/live/root_files.py:summary",  # the run's summary names the policy, the engine, the events file
    # the run's initial model: model + run.seed in, a config with model.hf_path (and engine.model_path) out
    *(f"gyre_hpc/models/run_init.py:{f}" for f in ("init_args", "materialise", "prepare", "new_run", "for_run")),
    # the sbatch script and the submitit parameters render the whole config
    *(f"gyre_hpc/slurm/sbatch.py:{f}" for f in ("node_count", "render_sbatch", "_header", "_directives",
                                                "_environment", "_launch", "_relaunch")),
    *(f"gyre_hpc/slurm/jobspec.py:{f}" for f in ("timeout_minutes", "_site", "setup_lines", "train_parameters",
                                                 "single_task_parameters")),
    "gyre_hpc/slurm/layout.py:preflight",
    # the simulator runs a whole config (scheduler, sim, workload, cluster) and its variations
    *(f"gyre_hpc/allocator/sim/compare.py:{f}" for f in ("validate_all", "queries_needed", "simulate_policy",
                                                         "compare")),
    *(f"gyre_hpc/allocator/sim/replay.py:{f}" for f in ("_valid", "_result")),
    *(f"gyre_hpc/allocator/sim/tune.py:{f}" for f in ("grid", "_relevant", "_with", "evaluate", "tune",
                                                      "workload_for")),
    *(f"gyre_hpc/allocator/sim/uncertainty.py:{f}" for f in ("inputs", "_get", "_with", "_scaled", "band",
                                                             "sensitivity")),
}


def cfg_parameters(source: str, path: str) -> list[tuple[str, str | None]]:
    """(``path:qualname``, annotation text or None) of every parameter named ``cfg`` in ``source``."""
    found: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
                    if arg.arg == "cfg":
                        ann = ast.unparse(arg.annotation).strip("'\"") if arg.annotation is not None else None
                        found.append((f"{path}:{'.'.join(scope + [child.name])}", ann))
            named = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            visit(child, scope + [child.name] if named else scope)

    visit(ast.parse(source), [])
    return found


def all_cfg_parameters(root: Path = PACKAGE) -> list[tuple[str, str | None]]:
    out = []
    for path in sorted(root.rglob("*.py")):
        out += cfg_parameters(path.read_text(), f"{root.name}/{path.relative_to(root).as_posix()}")
    return out


def test_every_cfg_parameter_is_annotated_with_a_config_type():
    params = all_cfg_parameters()
    assert params, "the scan found no cfg parameter at all"
    assert any(where.startswith("jobs/") for where, _ in all_cfg_parameters(JOBS)), "the scan missed jobs/"
    params += all_cfg_parameters(JOBS)
    bare = [where for where, ann in params if ann is None]
    assert not bare, "cfg parameters without a type: " + ", ".join(bare)
    loose = [where for where, ann in params if ann in ("Any", "typing.Any", "object") and where not in ANY_OK]
    assert not loose, "cfg parameters typed Any (name the section): " + ", ".join(loose)


def test_only_the_composers_take_the_root_config():
    roots = {where for where, ann in all_cfg_parameters() if ann == "GyreConfig"}
    assert not roots - ROOT_OK, "the root GyreConfig passed to a component (give it its sections): " + ", ".join(
        sorted(roots - ROOT_OK))
    assert not ROOT_OK - roots, f"stale ROOT_OK entries: {sorted(ROOT_OK - roots)}"


def test_live_components_take_sections_not_the_root():
    live = {where.split(":")[1] for where, _ in all_cfg_parameters() if where.startswith("gyre_hpc/live/")}
    for component in ("CellRunner.__init__", "RolloutSide.__init__", "Rollouts.__init__", "_Side.__init__",
                      "CoreTrainer.__init__", "SatelliteTrainer.__init__", "start_model_dir"):
        assert component not in live, f"{component} takes a cfg"


def test_scanner_sees_methods_nested_functions_and_missing_annotations():
    src = ("class A:\n    def __init__(self, cfg: 'EngineConfig'):\n        def f(cfg):\n            pass\n"
           "def g(x, *, cfg: GyreConfig = None):\n    pass\n")
    assert cfg_parameters(src, "m.py") == [("m.py:A.__init__", "EngineConfig"), ("m.py:A.__init__.f", None),
                                           ("m.py:g", "GyreConfig")]

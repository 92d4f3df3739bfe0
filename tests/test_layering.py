"""The package's structure, as code: imports run one way (policies -> engine -> rollout, cluster ->
hybrid / trainer -> sim / bench -> assembly / train / cli), the light entry points (the config,
`rlboost simulate`, `rlboost report`, the command's help) load neither Ray nor torch, and no module
needs a table of contents."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import rlboost

ROOT = Path(rlboost.__file__).parent
LAYERS = [
    {"policies", "spot", "_lazy", "run_log", "stopping", "tables", "configs"},  # pure decisions, utilities, shipped configs
    {"engine", "histospec", "models", "data", "rewards", "tracking", "run_dir"},  # engine and its peers
    {"rollout", "cluster"},                                                  # the step, colocated rollout; Ray, weights
    {"hybrid", "trainer", "checkpoint"},                                     # Ray runtime, training
    {"sim", "bench"},                                                        # simulator, benchmarks
    {"config", "checks", "assembly", "train", "cli"},                        # the run and the command
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}
MAX_LINES = 450


def unit_of(path: Path) -> str:
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def imports_of(path: Path) -> set[str]:
    """Every rlboost module `path` imports, at its top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        out |= {n for n in names if n.startswith("rlboost.")}
    return out


MODULES = sorted(p for p in ROOT.rglob("*.py") if p.name != "__init__.py" or p.parent != ROOT)


def test_every_module_has_a_layer():
    assert {unit_of(p) for p in MODULES} <= set(LAYER), {unit_of(p) for p in MODULES} - set(LAYER)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_imports_upward(path):
    mine = LAYER[unit_of(path)]
    upward = sorted(m for m in imports_of(path) if LAYER[m.split(".")[1]] > mine)
    assert not upward, f"{path.relative_to(ROOT)} (layer {mine}) imports {upward}"


def test_the_runtime_never_imports_the_simulator_nor_rollout_the_runtime():
    for path in (ROOT / "hybrid").rglob("*.py"):
        assert not {m for m in imports_of(path) if m.startswith("rlboost.sim")}, path
    for path in (ROOT / "rollout").rglob("*.py"):
        assert not {m for m in imports_of(path) if m.startswith("rlboost.hybrid")}, path


def test_the_cluster_layer_serves_rollout_and_imports_none_of_it():
    """Rollout names its worker kinds after the cluster's resources, so imports run rollout -> cluster,
    never back; hybrid and trainer (above) are out of reach already."""
    for path in (ROOT / "cluster").rglob("*.py"):
        assert not {m for m in imports_of(path) if m.startswith("rlboost.rollout")}, path


def loaded_after(code: str) -> set[str]:
    """Which of ray and torch are in sys.modules after running `code` in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint('loaded:', *(m for m in ('ray', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return set(out.splitlines()[-1].split()[1:])  # the code's own output comes before


def test_configs_the_trainer_the_policies_and_the_simulator_load_no_ray():
    assert "ray" not in loaded_after("import rlboost.config, rlboost.trainer, rlboost.policies, rlboost.sim.simulator, "
                                     "rlboost.cluster.config, rlboost.cluster.manifest, rlboost.cluster.resources")


def test_the_config_loads_neither_torch_nor_ray():
    """Every config dataclass is torch-free: reading a YAML (`rlboost simulate`'s) costs no torch."""
    assert loaded_after("import rlboost.config\nfrom rlboost.trainer import TrainerConfig") == set()


def test_the_trainer_s_schedule_stats_and_protocol_are_torch_free():
    assert loaded_after("import rlboost.trainer.schedule, rlboost.trainer.stats, rlboost.trainer.protocol") == set()


def test_the_simulator_loads_no_torch_even_while_it_runs():
    code = ("from rlboost.sim.simulator import SimConfig, simulate\n"
            "r = simulate(SimConfig(duration_s=300))\nassert r.steps")
    assert loaded_after(code) == set()


def test_rlboost_simulate_loads_neither_torch_nor_ray_while_it_runs(tmp_path):
    code = ("from rlboost.cli import main\n"
            f"assert main(['simulate', '--models', 'qwen3-8b', '--segments', 'A', '--policies', 'verl,rlboost', "
            f"'--plots', {str(tmp_path)!r}, 'duration_s=600']) == 0")
    assert loaded_after(code) == set()


def test_rlboost_report_on_a_run_folder_loads_neither_torch_nor_ray(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": k, "critic/score/mean": 0.1 * k, "timing_s/step": 2.0}) + "\n" for k in (1, 2)))
    code = f"from rlboost.cli import main\nassert main(['report', {str(tmp_path)!r}]) == 0"
    assert loaded_after(code) == set()
    assert (tmp_path / "report" / "report.md").is_file()


def test_the_command_line_help_loads_neither_torch_nor_ray():
    code = ("from rlboost.cli import main\n"
            "for argv in (['--help'], ['bench', '--help'], ['simulate', '--help'], ['report', '--help'], "
            "['train', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass")
    assert loaded_after(code) == set()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_needs_a_table_of_contents(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})"

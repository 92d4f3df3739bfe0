"""The `rlboost` command: the one entry point.

    rlboost train [CONFIG.yaml] [key=value ...]
    rlboost simulate [CONFIG.yaml] [key=value ...] [--models M,..] [--segments ABC] [--staleness 1,2,4]
                     [--json PATH] [--plots DIR]
    rlboost generate [CONFIG.yaml] [key=value ...] --prompt TEXT [--prompt TEXT ...]
    rlboost bench NAME [--json PATH] [--<field> VALUE ...]   (NAME: see `rlboost bench --help`)
    rlboost report RUN_DIR

A bench's flags are its config dataclass's fields (`rlboost/bench/<name>.py`), documented there; lists
are comma-separated (`--batches 1,8,32`), booleans `--flag` / `--no-flag`. Nothing heavy is imported to
parse a command: a bench's module is loaded only when that bench runs or shows its help.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import json
import sys
import typing
from pathlib import Path

from rich.console import Console

console = Console()

BENCHES: dict[str, tuple[str, str, str]] = {
    # name: (module under rlboost.bench, what it measures, status line while it runs)
    "engine": ("engine", "engine decode throughput vs HF generate and the roofline",
               "benchmarking: engine, HF generate and the hardware roofline take turns..."),
    "hybrid": ("hybrid", "one rollout step colocated vs hybrid (Ray workers, real SIGKILLs)",
               "benchmarking: colocated, then hybrid undisturbed, then hybrid with SIGKILLs..."),
    "spec": ("spec", "HistoSpec vs plain decoding on repeated prompts, before and after GRPO steps",
             "benchmarking: history rollout, then plain and HistoSpec take turns, before and after GRPO steps..."),
    "weights": ("weights", "instances joining together: provisioning time vs the transfer floor",
                "benchmarking: bare fetches, then instances joining and pulling, for each pool size..."),
    "histopipe": ("histopipe", "a rollout step's tail with and without HistoPipe's order (H100 profile)",
                  "benchmarking: each step in the dataset's order, then in HistoPipe's..."),
    "calibration": ("calibration", "the simulator's H100 profile: its fit to veRL and its tables",
                    "computing the calibration tables..."),
    "emulation": ("emulation", "simulated vs emulated steps: the simulator against the real control plane",
                  "running the real runtime on emulated engines, then the simulator..."),
    "regret": ("regret", "RLBoost vs colocated on the real control plane in a scarce, bursty spot market",
               "running the real runtime on emulated engines: the market, then colocated, in turns..."),
    "trainer": ("trainer", "the trainer at world sizes 1, 2, ...: memory per rank, step time, gradient vs world 1",
                "benchmarking: world 1 in process, then FSDP2 ranks on Ray..."),
    "control-plane": ("control_plane", "the rollout manager's loop CPU per step at 4 / 16 / 64 emulated instances",
                      "running the real runtime on emulated instances..."),
    "cluster": ("cluster", "hybrid rollout on emulated hosts behind 10G/1G/100M links: joins, steps, vanished hosts",
                "running a room of emulated hosts per model and link..."),
    "staleness": ("staleness", "rollout ahead of the trainer at max_staleness 0/1/2/4 on the real control plane",
                  "running the real runtime on emulated engines at each staleness bound, then the simulator..."),
}


def _bench_parts(name: str):
    """(config class, bench function, render) of bench `name`: its module's `*BenchConfig`,
    `bench_*` and `render`."""
    module = importlib.import_module(f"rlboost.bench.{BENCHES[name][0]}")
    config = next(obj for key, obj in vars(module).items() if key.endswith("BenchConfig") and inspect.isclass(obj))
    run = next(obj for key, obj in vars(module).items() if key.startswith("bench_") and callable(obj))
    return config, run, module.render


def _field_docs(cls) -> dict[str, str]:
    """The docstring under each field of a dataclass and of the dataclasses it extends (its
    documentation in the source; a subclass's own wins)."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        body = ast.parse(inspect.getsource(klass)).body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _add_config_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """One flag per field of the config dataclass `cls`, with its default and its documentation."""
    hints, docs = typing.get_type_hints(cls), _field_docs(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        flag, kind, default = f"--{f.name.replace('_', '-')}", hints[f.name], getattr(defaults, f.name)
        help_text = f"{docs.get(f.name, '')} (default: {default})".strip()
        help_text = help_text.replace("%", "%%")
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif typing.get_origin(kind) is list:
            item = typing.get_args(kind)[0]
            parser.add_argument(flag, dest=f.name, default=default, help=help_text,
                                type=lambda text, item=item: [item(x) for x in text.split(",") if x.strip()])
        else:
            parser.add_argument(flag, dest=f.name, type=kind, default=default, help=help_text)


BENCH_LOGS = Path("outputs") / "bench"
"""Where `rlboost bench NAME` writes its log (NAME.log): Ray's messages, the run's events."""


def partial_writer(path: Path):
    """What a long bench calls with its result so far: written beside `path` (`NAME.partial.json`),
    whole or not at all; the final result replaces it."""
    partial = path.with_suffix(".partial.json")

    def save(result: dict) -> None:
        partial.parent.mkdir(parents=True, exist_ok=True)
        tmp = partial.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(partial)
    return save


def _bench(args: argparse.Namespace) -> int:
    from rlboost.run_log import run_log
    from rlboost.tables import log_for, print_line, print_output

    from rlboost.config import ConfigError, check_finite
    from rlboost.stopping import StopRequested

    config_class, run, render = _bench_parts(args.what)
    cfg = config_class(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_class)})
    check_finite(cfg, name=lambda key: "--" + key.split("[")[0].replace("_", "-"))  # argparse's float takes nan and inf
    if hasattr(cfg, "validate"):
        try:
            cfg.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None
    for config, overrides in getattr(cfg, "train_runs", list)():  # a bench's `rlboost train` runs, checked now
        from rlboost.checks import validate
        from rlboost.config import RLBoostConfig, load_config

        validate(load_config(RLBoostConfig, config, overrides))
    needs_room = getattr(importlib.import_module(f"rlboost.bench.{BENCHES[args.what][0]}"), "NEEDS_ROOM", False)
    if needs_room(cfg) if callable(needs_room) else needs_room:
        _enter_room(args.argv)  # the bench goes on inside a room of emulated hosts
    kwargs = {"log": log_for(console)} if "log" in inspect.signature(run).parameters else {}
    if args.json and "save_partial" in inspect.signature(run).parameters:  # hours of rows survive a stop
        kwargs["save_partial"] = partial_writer(Path(args.json))
    # Ray's messages (a paragraph per worker the bench kills) and the events go to a log file; the
    # console keeps the bench's own lines and the events
    log = BENCH_LOGS / f"{args.what}.log"
    try:
        with run_log(log, console), console.status(BENCHES[args.what][2]):
            result = run(cfg, **kwargs)
    except StopRequested as stop:  # a bench that stops cleanly on a signal (its rows so far are kept)
        partial = Path(args.json).with_suffix(".partial.json") if args.json else None
        kept = f"; the rows so far: {partial}" if partial is not None and partial.exists() else ""
        print_line(console, f"stopped by {stop.signal_name}{kept}")
        return stop.exit_status
    print_output(console, render(result))
    print_line(console, f"log: {log}")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        path.with_suffix(".partial.json").unlink(missing_ok=True)
        print_line(console, f"wrote {path}")
    return 0


def _enter_room(argv: list[str]) -> None:
    """Re-execute `rlboost ARGV` inside a room of emulated hosts (`rlboost.cluster.hosts`); returns at
    once when already inside one."""
    from rlboost.cluster.hosts import enter_room
    from rlboost.config import ConfigError

    try:
        enter_room([sys.executable, "-m", "rlboost.cli", *argv])
    except RuntimeError as e:  # this machine refuses the namespaces
        raise ConfigError(str(e)) from e


def _simulate(args: argparse.Namespace) -> int:
    from rlboost.config import ConfigError, load_config
    from rlboost.sim.report import evaluate, plot, render, windows
    from rlboost.sim.simulator import POLICIES, SimConfig
    from rlboost.tables import print_line, print_output

    try:
        base = load_config(SimConfig, args.config, args.overrides)
        base.validate()
        policies = args.policies.split(",") if args.policies else list(POLICIES)
        unknown = sorted(set(policies) - set(POLICIES))
        if unknown:
            raise ConfigError(f"--policies: unknown {', '.join(unknown)}; valid: {', '.join(POLICIES)}")
        if "verl" not in policies or "rlboost" not in policies:
            raise ConfigError("--policies must include verl (the reference) and rlboost")
        runs = windows(base, args.segments, args.windows)
        staleness = _bounds(args.staleness)
    except (ConfigError, ValueError) as e:
        console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        return 2
    if base.trace.path and base.trace.sample != 1:
        print_line(console, f"note: trace.sample={base.trace.sample:g} keeps that fraction of {base.trace.path}'s "
                            "instances (the paper's sampling of the bundled trace); trace.sample=1 keeps them all")
    with console.status(f"simulating {len(args.models.split(','))} models x {len(runs)} trace windows x "
                        f"{len(policies)} policies..."):
        result, runs = evaluate(base, args.models.split(","), args.segments, policies, args.windows, staleness)
    print_output(console, render(result))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print_line(console, f"wrote {path}")
    for path in plot(result, runs, Path(args.plots)):
        print_line(console, f"wrote {path}")
    return 0


def _bounds(text: str) -> tuple[int, ...]:
    """`--staleness 1,2,4`: the bounds rlboost also runs at ("" or "0": none beside its own)."""
    from rlboost.config import ConfigError

    try:
        bounds = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--staleness: {text!r} is not a list of whole numbers like 1,2,4") from None
    if any(k < 0 for k in bounds):
        raise ConfigError(f"--staleness: {text!r}: a bound is a number of versions, >= 0")
    return tuple(k for k in bounds if k)


def _generate(args: argparse.Namespace) -> int:
    from rlboost.config import RLBoostConfig, load_config
    from rlboost.engine import SamplingParams
    from rlboost.engine.factory import make_engine
    from rlboost.models import load_model

    cfg = load_config(RLBoostConfig, args.config, args.overrides)
    loaded = load_model(cfg.model)
    if loaded.tokenizer is None:
        raise SystemExit(f"error: model {cfg.model.path!r} has no tokenizer; `generate` needs text in and out")
    engine = make_engine(cfg.model, cfg.engine, loaded.eos_token_ids)
    tok = loaded.tokenizer
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                            seed=args.seed)
    for i, text in enumerate(args.prompt):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)["input_ids"]
        engine.add(str(i), list(ids), params)
    responses: dict[str, list[int]] = {str(i): [] for i in range(len(args.prompt))}
    single = len(args.prompt) == 1
    while engine.has_unfinished():
        for chunk in engine.step():
            tokens = responses[chunk.request_id]
            if single:  # stream the text as the chunks arrive
                before = tok.decode(tokens, skip_special_tokens=True)
                text = tok.decode(tokens + chunk.token_ids, skip_special_tokens=True)
                console.print(text[len(before):], end="", markup=False, highlight=False)
            tokens += chunk.token_ids
    if single:
        console.print()
    else:
        for i, text in enumerate(args.prompt):
            console.rule(text)
            console.print(tok.decode(responses[str(i)], skip_special_tokens=True), markup=False, highlight=False)
    return 0


def _train(args: argparse.Namespace) -> int:
    from rlboost.checks import check_hosts_config, uses_hosts
    from rlboost.checkpoint import latest_checkpoint
    from rlboost.config import RLBoostConfig, load_config
    from rlboost.configs import SHOWCASE
    from rlboost.rollout.step_data import StepError
    from rlboost.run_dir import run_folder
    from rlboost.stopping import StopRequested
    from rlboost.train import RUN_LOG, train

    config, overrides = args.config, list(args.overrides)
    config, base = base_config(config, overrides)
    cfg = load_config(RLBoostConfig, config, overrides)
    if uses_hosts(cfg):
        check_hosts_config(cfg)  # before the room: its mistakes cost no second start
        _enter_room(args.argv)  # rollout.hybrid.instances=hosts: this command goes on inside a room of hosts
    console.print(base, markup=False, highlight=False, soft_wrap=True)
    # fixed now, so that a stop can name the folder to resume (a default name carries the start time)
    cfg.run.output_dir = str(run_folder(cfg.run, config))

    def how_to_resume() -> str:
        """Where the run stands and the command that resumes it from its last checkpoint."""
        last = latest_checkpoint(Path(cfg.run.output_dir))
        kept = (f"the last checkpoint is {last}" if last is not None else
                f"no checkpoint was written yet (run.save_freq={cfg.run.save_freq}): a restart begins at step 1")
        command = ["rlboost", "train", *([str(config)] if config != SHOWCASE else []),
                   *[o for o in overrides if not o.startswith(("run.output_dir=", "run.resume="))],
                   f"run.output_dir={cfg.run.output_dir}"]
        return f"{kept}.\nresume with:  {' '.join(command)}\n(log: {Path(cfg.run.output_dir) / RUN_LOG})"

    try:
        run_dir = train(cfg, config, console, resume_hint=how_to_resume)
    except StopRequested as stop:
        console.print(f"{stop}: the step under way was abandoned and every worker shut down; {how_to_resume()}",
                      markup=False, highlight=False, soft_wrap=True)
        return stop.exit_status
    except StepError as e:  # a step that cannot finish (no rollout worker left): the run stopped at it
        console.print(f"[red]error:[/red] the step could not finish: {e}", markup=True, highlight=False,
                      soft_wrap=True)
        console.print(f"every worker was shut down; {how_to_resume()}", markup=False, highlight=False,
                      soft_wrap=True)
        return 2
    console.print(f"run folder: {run_dir}  (metrics.jsonl, run.log, tensorboard/, checkpoints/, report/)",
                  markup=False, highlight=False, soft_wrap=True)
    return 0


GENERIC_SECTIONS = ("data.", "reward.")
"""Overrides that describe another task: the showcase's task, reward file and hybrid set-up would not fit it."""


def base_config(config: str | None, overrides: list[str]) -> tuple[str | Path | None, str]:
    """The config file `rlboost train` starts from, and the line that says so. With no file: the
    showcase when no override names another task, else the built-in defaults (RLBoostConfig's:
    colocated rollout, the built-in reward functions chosen by each row's data_source)."""
    from rlboost.configs import SHOWCASE

    if config is not None:
        return config, f"config: {config}" + (f" with {len(overrides)} override(s)" if overrides else "")
    if any(o.startswith(GENERIC_SECTIONS) for o in overrides):
        return None, ("config: the built-in defaults (colocated rollout, built-in rewards by data_source; "
                      "see `rlboost/config.py`) with your overrides; no config file given")
    return SHOWCASE, f"config: the showcase ({SHOWCASE}); no config file given"


def _report(args: argparse.Namespace) -> int:
    from rlboost.tables import print_line
    from rlboost.tracking.report import HTML_REPORT, write_report

    try:
        markdown = write_report(Path(args.run_dir))
    except ValueError as e:  # no metrics.jsonl, or nothing in it
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False, soft_wrap=True)
        return 2
    print_line(console, f"wrote {markdown} and {markdown.with_name(HTML_REPORT)}")
    return 0


def build_parser(bench: str | None = None) -> argparse.ArgumentParser:
    """The command's parser; the flags of bench `bench` only (its module is imported for them)."""
    parser = argparse.ArgumentParser(prog="rlboost", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    benches = commands.add_parser("bench", help="benchmarks: ours and its baseline measured in one run")
    which = benches.add_subparsers(dest="what", required=True, metavar="NAME")
    for name, (_, what, _) in BENCHES.items():
        sub = which.add_parser(name, help=what, description=what)
        if name == bench:
            _add_config_arguments(sub, _bench_parts(name)[0])
        sub.add_argument("--json", help="write the results to this JSON file")
        sub.set_defaults(func=_bench)

    sim = commands.add_parser("simulate", help="simulated runs at cluster scale: every policy, model and trace segment")
    sim.add_argument("config", nargs="?", help="YAML of SimConfig fields (optional)")
    sim.add_argument("overrides", nargs="*", help="dotted overrides, e.g. workload.median_response=2000")
    sim.add_argument("--models", default="qwen3-8b,qwen3-14b,qwen3-32b")
    sim.add_argument("--segments", default="ABC", help="segments of the bundled trace, e.g. AB")
    sim.add_argument("--windows", default="", help="with trace.path=FILE.csv: windows of it in hours, e.g. "
                     "0-2,2-4 (default: one run over the whole file)")
    sim.add_argument("--policies", default="", help="comma-separated, with verl and rlboost (default: every policy)")
    sim.add_argument("--staleness", default="1,2,4", help="bounds (max_staleness) rlboost also runs at, each a "
                     "row of its own; 0 or '': none (default 1,2,4)")
    sim.add_argument("--json", help="write the results to this JSON file")
    sim.add_argument("--plots", default="outputs/simulate", help="folder for the plots")
    sim.set_defaults(func=_simulate)

    gen = commands.add_parser("generate", help="chat with the model through the rollout engine")
    gen.add_argument("config", nargs="?", help="YAML config (optional)")
    gen.add_argument("overrides", nargs="*", help="dotted overrides, e.g. engine.stream_interval=4")
    gen.add_argument("--prompt", action="append", required=True, help="a user message (repeat for a batch)")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=_generate)

    report = commands.add_parser("report", help="(re)build a run folder's report: report/report.md and report.html")
    report.add_argument("run_dir", help="the run folder (it holds metrics.jsonl), also of a stopped or killed run")
    report.set_defaults(func=_report)

    train = commands.add_parser("train", help="GRPO training (rollout.mode=colocated or hybrid)")
    train.add_argument("config", nargs="?", help="YAML config, e.g. configs/smoke.yaml (default: the showcase, "
                                                 "rlboost/configs/showcase.yaml)")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=8 run.total_steps=20")
    train.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    bench = argv[1] if len(argv) > 1 and argv[0] == "bench" and argv[1] in BENCHES else None
    args = build_parser(bench).parse_args(argv)
    args.argv = argv  # what re-executes this command inside a room of emulated hosts
    if getattr(args, "config", None) and "=" in args.config:  # `rlboost train key=value` with no YAML
        args.overrides.insert(0, args.config)
        args.config = None
    from rlboost.config import ConfigError
    from rlboost.data import DatasetError
    from rlboost.engine import InvalidRequestError
    from rlboost.rewards import RewardConfigError, RewardFunctionError
    from rlboost.trainer.errors import TrainerRankError

    try:
        return args.func(args)
    except (ConfigError, InvalidRequestError, FileNotFoundError, DatasetError, RewardConfigError) as e:
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False, soft_wrap=True)
        return 2
    except (RewardFunctionError, TrainerRankError) as e:  # the run stopped; its checkpoints and metrics are kept
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False, soft_wrap=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())

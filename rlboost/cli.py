"""The `rlboost` command.

    rlboost bench engine [--json PATH] [--model M] [--batch B] [--prompt-len P] [--new-tokens N] [--device D]
    rlboost bench hybrid [--json PATH] [--preemptible N] [--kills K] [--max-tokens T] ...
    rlboost bench spec [--json PATH] [--model M] [--batches 1,8,32] [--temperatures 1.0,0.6] ...
    rlboost bench weights [--json PATH] [--model M] [--workers 1,2,4] [--bucket-mb MB]
    rlboost bench histopipe [--json PATH] [--model M] [--engines 8,16] [--slots 32,64,128] [--alternate]
    rlboost generate [CONFIG.yaml] [key=value ...] --prompt TEXT [--prompt TEXT ...]
    rlboost simulate [CONFIG.yaml] [key=value ...] [--models M,..] [--segments ABC] [--json PATH] [--plots DIR]
    rlboost train [CONFIG.yaml] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

console = Console()


def _bench_engine(args: argparse.Namespace) -> int:
    from rlboost.bench.engine import EngineBenchConfig, bench_engine, render

    cfg = EngineBenchConfig(model=args.model, batch=args.batch, prompt_len=args.prompt_len,
                            new_tokens=args.new_tokens, device=args.device, dtype=args.dtype, repeats=args.repeats,
                            hf_baseline=not args.no_hf, compare_cpu_linear=args.compare_cpu_linear)
    status = f"benchmarking: engine, HF generate and the hardware roofline take turns, {cfg.repeats} rounds..."
    return _run_bench(status, bench_engine, cfg, render, args.json)


def _run_bench(status: str, bench, cfg, render, json_path: str | None) -> int:
    """Run a benchmark under a status line, print its table, and write its JSON if asked."""
    with console.status(status):
        result = bench(cfg)
    console.print(render(result))
    if json_path:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {path}")
    return 0


def _bench_hybrid(args: argparse.Namespace) -> int:
    from rlboost.bench.hybrid import HybridBenchConfig, bench_hybrid, render

    cfg = HybridBenchConfig(model=args.model, prompts=args.prompts, n=args.n, max_tokens=args.max_tokens,
                            preemptible=args.preemptible, kills=args.kills, seed_window_s=args.seed_window_s,
                            stream_interval=args.stream_interval, seed=args.seed)
    return _run_bench("benchmarking: colocated, then hybrid undisturbed, then hybrid with SIGKILLs...",
                      bench_hybrid, cfg, render, args.json)


def _bench_weights(args: argparse.Namespace) -> int:
    from rlboost.bench.weights import WeightsBenchConfig, bench_weights, render

    cfg = WeightsBenchConfig(model=args.model, workers=[int(n) for n in args.workers.split(",")],
                             bucket_mb=args.bucket_mb)
    return _run_bench("benchmarking: bare fetches, then instances joining and pulling, for each pool size...",
                      bench_weights, cfg, render, args.json)


def _bench_spec(args: argparse.Namespace) -> int:
    from rlboost.bench.spec import SpecBenchConfig, bench_spec, render

    cfg = SpecBenchConfig(model=args.model, prompts=args.prompts, max_tokens=args.max_tokens,
                          batches=[int(b) for b in args.batches.split(",")],
                          temperatures=[float(t) for t in args.temperatures.split(",")],
                          history_samples=args.history_samples, train_steps=args.train_steps, seed=args.seed)
    return _run_bench("benchmarking: history rollout, then plain and HistoSpec take turns, before and after GRPO "
                      "steps...", bench_spec, cfg, render, args.json)


def _bench_histopipe(args: argparse.Namespace) -> int:
    from rlboost.bench.histopipe import HistoPipeBenchConfig, bench_histopipe, render

    cfg = HistoPipeBenchConfig(model=args.model, engines=[int(n) for n in args.engines.split(",")],
                               slots=[int(n) for n in args.slots.split(",")], steps=args.steps,
                               alternate=args.alternate, seed=args.seed)
    return _run_bench("benchmarking: each step in the dataset's order, then in HistoPipe's...",
                      bench_histopipe, cfg, render, args.json)


def _simulate(args: argparse.Namespace) -> int:
    from rlboost.config import ConfigError, load_config
    from rlboost.sim.report import evaluate, plot, render
    from rlboost.sim.simulator import POLICIES, SimConfig

    try:
        base = load_config(SimConfig, args.config, args.overrides)
        base.validate()
        policies = args.policies.split(",")
        unknown = sorted(set(policies) - set(POLICIES))
        if unknown:
            raise ConfigError(f"--policies: unknown {', '.join(unknown)}; valid: {', '.join(POLICIES)}")
        if "verl" not in policies or "rlboost" not in policies:
            raise ConfigError("--policies must include verl (the reference) and rlboost")
    except (ConfigError, ValueError) as e:
        console.print(f"[red]error:[/red] {e}")
        return 2
    with console.status(f"simulating {len(args.models.split(','))} models x {len(args.segments)} segments x "
                        f"{len(policies)} policies..."):
        result, runs = evaluate(base, args.models.split(","), args.segments, policies)
    console.print(render(result))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {path}")
    for path in plot(result, runs, Path(args.plots)):
        console.print(f"wrote {path}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from rlboost.config import RLBoostConfig, load_config
    from rlboost.engine import LLMEngine, SamplingParams
    from rlboost.models import load_model

    cfg = load_config(RLBoostConfig, args.config, args.overrides)
    loaded = load_model(cfg.model)
    if loaded.tokenizer is None:
        raise SystemExit(f"error: model {cfg.model.path!r} has no tokenizer; `generate` needs text in and out")
    engine = LLMEngine(loaded.model, cfg.engine, eos_token_ids=loaded.eos_token_ids)
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


SHOWCASE = Path(__file__).parent / "configs" / "showcase.yaml"


def _train(args: argparse.Namespace) -> int:
    from rlboost.config import RLBoostConfig, load_config
    from rlboost.train import train

    config, overrides = args.config, list(args.overrides)
    if config is None or "=" in config:  # no file: the showcase, with any overrides given
        overrides = ([config] if config else []) + overrides
        config = SHOWCASE
        console.print(f"no config given: running the showcase ({SHOWCASE})")
    cfg = load_config(RLBoostConfig, config, overrides)
    run_dir = train(cfg, config)
    console.print(f"run folder: {run_dir}  (metrics.jsonl, tensorboard/, checkpoints/, report/report.md)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlboost", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    from rlboost.bench.engine import EngineBenchConfig

    defaults = EngineBenchConfig()
    bench = commands.add_parser("bench", help="benchmarks").add_subparsers(dest="what", required=True)
    engine = bench.add_parser("engine", help="engine decode throughput vs HF generate and the roofline")
    engine.add_argument("--model", default=defaults.model, help="model.path to benchmark (default: the bundled SmolLM2)")
    engine.add_argument("--batch", type=int, default=defaults.batch)
    engine.add_argument("--prompt-len", type=int, default=defaults.prompt_len)
    engine.add_argument("--new-tokens", type=int, default=defaults.new_tokens)
    engine.add_argument("--device", default=defaults.device)
    engine.add_argument("--dtype", default=defaults.dtype, choices=["float32", "bfloat16", "float16"])
    engine.add_argument("--repeats", type=int, default=defaults.repeats, help="interleaved rounds; medians are reported")
    engine.add_argument("--no-hf", action="store_true", help="skip the HF generate baseline")
    engine.add_argument("--compare-cpu-linear", action="store_true",
                        help="on CPU, also time engine.cpu_linear=torch (F.linear) in the same run")
    engine.add_argument("--json", help="write the results to this JSON file")
    engine.set_defaults(func=_bench_engine)

    from rlboost.bench.hybrid import HybridBenchConfig

    hdefaults = HybridBenchConfig()
    hybrid = bench.add_parser("hybrid", help="one rollout step colocated vs hybrid (Ray workers, real SIGKILLs)")
    for name, value in vars(hdefaults).items():
        hybrid.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    hybrid.add_argument("--json", help="write the results to this JSON file")
    hybrid.set_defaults(func=_bench_hybrid)

    from rlboost.bench.spec import SpecBenchConfig

    sdefaults = SpecBenchConfig()
    spec = bench.add_parser("spec", help="HistoSpec vs plain decoding on repeated prompts, before and after GRPO steps")
    spec.add_argument("--model", default=sdefaults.model)
    spec.add_argument("--prompts", type=int, default=sdefaults.prompts)
    spec.add_argument("--max-tokens", type=int, default=sdefaults.max_tokens)
    spec.add_argument("--batches", default=",".join(map(str, sdefaults.batches)), help="comma-separated batch sizes")
    spec.add_argument("--temperatures", default=",".join(map(str, sdefaults.temperatures)))
    spec.add_argument("--history-samples", type=int, default=sdefaults.history_samples)
    spec.add_argument("--train-steps", type=int, default=sdefaults.train_steps)
    spec.add_argument("--seed", type=int, default=sdefaults.seed)
    spec.add_argument("--json", help="write the results to this JSON file")
    spec.set_defaults(func=_bench_spec)

    from rlboost.bench.weights import WeightsBenchConfig

    wdefaults = WeightsBenchConfig()
    weights = bench.add_parser("weights", help="instances joining together: provisioning time vs the transfer floor")
    weights.add_argument("--model", default=wdefaults.model)
    weights.add_argument("--workers", default=",".join(map(str, wdefaults.workers)), help="comma-separated pool sizes")
    weights.add_argument("--bucket-mb", type=float, default=wdefaults.bucket_mb)
    weights.add_argument("--json", help="write the results to this JSON file")
    weights.set_defaults(func=_bench_weights)

    from rlboost.bench.histopipe import HistoPipeBenchConfig

    pdefaults = HistoPipeBenchConfig()
    pipe = bench.add_parser("histopipe", help="a rollout step's tail with and without HistoPipe's order (H100 profile)")
    pipe.add_argument("--model", default=pdefaults.model)
    pipe.add_argument("--engines", default=",".join(map(str, pdefaults.engines)), help="comma-separated engine counts")
    pipe.add_argument("--slots", default=",".join(map(str, pdefaults.slots)), help="comma-separated slots per engine")
    pipe.add_argument("--steps", type=int, default=pdefaults.steps)
    pipe.add_argument("--alternate", action="store_true", help="odd steps shortest first")
    pipe.add_argument("--seed", type=int, default=pdefaults.seed)
    pipe.add_argument("--json", help="write the results to this JSON file")
    pipe.set_defaults(func=_bench_histopipe)

    sim = commands.add_parser("simulate", help="simulated runs at cluster scale: every policy, model and trace segment")
    sim.add_argument("config", nargs="?", help="YAML of SimConfig fields (optional)")
    sim.add_argument("overrides", nargs="*", help="dotted overrides, e.g. workload.median_response=2000")
    sim.add_argument("--models", default="qwen3-8b,qwen3-14b,qwen3-32b")
    sim.add_argument("--segments", default="ABC", help="trace segments, e.g. AB")
    sim.add_argument("--policies", default="verl,verl2x,disagg,rlboost,rlboost-noseed,rlboost-nomemory")
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

    train = commands.add_parser("train", help="GRPO training (rollout.mode=colocated or hybrid)")
    train.add_argument("config", nargs="?", help="YAML config, e.g. configs/smoke.yaml (default: the showcase, "
                                                 "rlboost/configs/showcase.yaml)")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=8 run.total_steps=20")
    train.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "config", None) and "=" in args.config:  # `rlboost train key=value` with no YAML
        args.overrides.insert(0, args.config)
        args.config = None
    from rlboost.config import ConfigError
    from rlboost.data import DatasetError
    from rlboost.engine import InvalidRequestError
    from rlboost.rewards import RewardConfigError, RewardFunctionError

    try:
        return args.func(args)
    except (ConfigError, InvalidRequestError, FileNotFoundError, DatasetError, RewardConfigError) as e:
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        return 2
    except RewardFunctionError as e:  # the run stopped; its checkpoints and metrics so far are kept
        console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())

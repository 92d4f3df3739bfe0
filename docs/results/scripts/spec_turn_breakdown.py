"""Usage: spec_turn_breakdown.py DRAFTER BATCH TURNS [MIN_ORDER] (run from the repo root).
rlboost's engine, T=0.6, `bench spec`'s prompts, history and same weights: a plain turn and a
speculating turn in turn, each speculating turn's time by part (forward steps, verify steps, drafting,
the drafter's hooks) beside the plain turn's, to see where a row's speed-up goes."""
import collections
import sys
import time

from rlboost.bench.grpo import chat_prompts
from rlboost.bench.spec import SpecBenchConfig, _timed, previous_epoch
from rlboost.data import arithmetic_rows
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.engine.protocol import SpecStats
from rlboost.histospec import make_drafter
from rlboost.models import ModelConfig, load_model

drafter_name, batch, turns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = SpecBenchConfig(drafters=[drafter_name], temperatures=[0.6], batches=[batch],
                      min_order=int(sys.argv[4]) if len(sys.argv) > 4 else 3)
loaded = load_model(ModelConfig(path=cfg.model))
prompts = chat_prompts(loaded.tokenizer, arithmetic_rows(cfg.prompts, cfg.seed, "train"))
engine_cfg = EngineConfig(device="cpu", max_num_seqs=max(cfg.batches + [cfg.prompts]), spec_max_batch=max(cfg.batches))
plain = LLMEngine(loaded.model, engine_cfg, eos_token_ids=loaded.eos_token_ids)
spec = LLMEngine(load_model(ModelConfig(path=cfg.model)).model, engine_cfg, eos_token_ids=loaded.eos_token_ids)

store = previous_epoch(cfg, plain, prompts, 0.6)

spent: collections.Counter = collections.Counter()


def timed(obj, name: str, key: str) -> None:
    """Add the seconds and calls of `obj.name` to `spent[key]` and `spent[key + '#']`."""
    call = getattr(obj, name)

    def wrapped(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t0
            spent[key + "#"] += 1
    setattr(obj, name, wrapped)


timed(spec, "_drafts", "drafting")
timed(spec, "_verify", "verify")
timed(spec.runner, "forward", "forward")
timed(plain.runner, "forward", "plain forward")
waves = [[p] for p in prompts[:cfg.batch1_requests]] if batch == 1 else [prompts[:batch]]
wave_params = SamplingParams(temperature=0.6, max_tokens=cfg.max_tokens, seed=cfg.seed + 1)
for turn in range(turns):
    spec.drafter = make_drafter(store, cfg.draft_config(drafter_name))
    for hook in ("start", "propose", "feedback", "finish"):
        timed(spec.drafter, hook, hook)
    spent.clear()
    plain_s, plain_out = _timed(plain, waves, wave_params, turn)
    spec.spec_stats = SpecStats()
    spec_s, spec_out = _timed(spec, waves, wave_params, turn)
    stats = spec.spec_stats
    plain_step = spent["plain forward"] / spent["plain forward#"]
    print(f"turn {turn}: plain {plain_s:.2f} s, speculating {spec_s:.2f} s "
          f"(speed-up {plain_s / spec_s * sum(map(len, spec_out)) / sum(map(len, plain_out)):.3f}); "
          f"forward steps {spent['plain forward#']} plain, {spent['forward#']} speculating of which "
          f"{spent['verify#']} verified: {spent['verify']:.2f} s where plain steps take "
          f"{spent['verify#'] * plain_step:.2f} s; "
          f"drafting {spent['drafting']:.3f} s ({spent['drafting#']} steps; propose {spent['propose']:.3f} s "
          f"over {spent['propose#']} calls, start {spent['start']:.3f} s, feedback {spent['feedback']:.3f} s, "
          f"finish {spent['finish']:.3f} s); accepted per verify {stats.accepted / max(1, stats.verifications):.2f}",
          flush=True)

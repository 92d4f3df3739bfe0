"""Usage: vllm_spec_drafters.py T BATCH MAX_TOKENS ROUNDS (run from the repo root in .venv-vllm).
vLLM, T=0.6, batch 8: HistoSpec's suffix drafter with and without the per-request draft cap, and
ngram, each against plain vLLM, taking turns twice; SpecStats per turn (drafted/accepted per verify,
verify steps' cost against plain). The same history and prompts as `bench spec`."""
import json, sys, time
from rlboost.bench.grpo import chat_prompts
from rlboost.bench.spec import _timed
from rlboost.bench.spec_vllm import VllmEngines
from rlboost.data import arithmetic_rows
from rlboost.engine import EngineConfig, LLMEngine, SamplingParams
from rlboost.engine.protocol import SpecStats
from rlboost.histospec import DraftConfig, HistoryStore, make_drafter
from rlboost.models import ModelConfig, load_model
from rlboost.policies.spec_budget import SpecBudget

T, batch, max_tokens, rounds = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
loaded = load_model(ModelConfig(path="smollm2"))
prompts = chat_prompts(loaded.tokenizer, arithmetic_rows(8, 0, "train"))[:batch]
cfg = EngineConfig(device="cpu", max_num_seqs=8, spec_max_batch=8)
ours = LLMEngine(load_model(ModelConfig(path="smollm2")).model, cfg, eos_token_ids=loaded.eos_token_ids)
store = HistoryStore()
params = [SamplingParams(temperature=T, max_tokens=max_tokens, seed=7919 * j + i) for i in range(len(prompts)) for j in range(4)]
outs = ours.generate([p for p in prompts for _ in range(4)], params)
for i, p in enumerate(prompts):
    store.update(p, [o.token_ids for o in outs[i * 4:(i + 1) * 4]])
v = VllmEngines(ModelConfig(path="smollm2"), cfg, loaded.eos_token_ids, [], 4)
run = SamplingParams(temperature=T, max_tokens=max_tokens, seed=1)
variants = {"none": None, "suffix": DraftConfig(drafter="suffix"), "suffix-capped": DraftConfig(drafter="suffix", suffix_adaptive=True),
            "ngram": DraftConfig(drafter="ngram")}
propose_s = [0.0]
def timed_propose(drafter):
    inner = drafter.propose
    def propose(*a):
        t0 = time.perf_counter(); out = inner(*a); propose_s[0] += time.perf_counter() - t0; return out
    drafter.propose = propose
    return drafter
rows = []
for r in range(rounds):
    for name, dc in variants.items():
        base_s, base = _timed(v.plain, [prompts], run)
        v.spec.drafter = None if dc is None else timed_propose(make_drafter(store, dc))
        propose_s[0] = 0.0
        v.spec.spec_budget = SpecBudget(8, ragged=True)  # each turn as a fresh worker: its own probes
        v.spec.spec_stats = st = SpecStats()
        s, out = _timed(v.spec, [prompts], run)
        nb, ns = sum(map(len, base)), sum(map(len, out))
        row = {"round": r, "drafter": name, "plain_tok_s": nb / base_s, "spec_tok_s": ns / s, "speedup": (ns / s) / (nb / base_s),
               "verify_steps": st.verify_steps, "decode_steps": st.decode_steps,
               "drafted_per_verify": st.drafted / max(st.verifications, 1), "accepted_per_verify": st.accepted / max(st.verifications, 1),
               "verify_cost": st.verify_s / st.plain_equivalent_s if st.plain_equivalent_s else None,
               "propose_s": propose_s[0], "spec_s": s, "plain_s": base_s}
        rows.append(row)
        print(json.dumps({k: round(x, 3) if isinstance(x, float) else x for k, x in row.items()}), flush=True)
v.shutdown()

"""Plain vLLM as built by default against plain vLLM with async_scheduling forced off (it prints what each
engine runs with), and the HistoSpec
engine (custom_class proposer, no drafter): T=0.6, batch 8, 64 tokens, taking turns."""
import json
import vllm
from rlboost.bench.grpo import chat_prompts
from rlboost.bench.spec import _timed
from rlboost.bench.spec_vllm import VllmEngines
from rlboost.data import arithmetic_rows
from rlboost.engine import EngineConfig, SamplingParams
from rlboost.models import ModelConfig, load_model
import rlboost.engine.vllm_backend as vb

loaded = load_model(ModelConfig(path="smollm2"))
prompts = chat_prompts(loaded.tokenizer, arithmetic_rows(8, 0, "train"))
cfg = EngineConfig(device="cpu", max_num_seqs=8, spec_max_batch=8)
v = VllmEngines(ModelConfig(path="smollm2"), cfg, loaded.eos_token_ids, [], 4)
real = vllm.EngineArgs
class SyncArgs(real):
    def __init__(self, *a, **k):
        super().__init__(*a, **k); self.async_scheduling = False
vllm.EngineArgs = SyncArgs
sync = vb.VllmEngine(v.plain.model_path, v.plain.config, loaded.eos_token_ids, num_threads=__import__("torch").get_num_threads())
vllm.EngineArgs = real
print("async:", v.plain._engine.vllm_config.scheduler_config.async_scheduling, sync._engine.vllm_config.scheduler_config.async_scheduling,
      v.spec._engine.vllm_config.scheduler_config.async_scheduling)
run = SamplingParams(temperature=0.6, max_tokens=64, seed=1)
times = {"plain (default)": [], "plain (async_scheduling off)": [], "histospec engine, no drafter": []}
for r in range(4):
    for name, eng in (("plain (default)", v.plain), ("plain (async_scheduling off)", sync), ("histospec engine, no drafter", v.spec)):
        s, out = _timed(eng, [prompts], run)
        times[name].append(sum(map(len, out)) / s)
print(json.dumps({k: [round(x, 1) for x in xs] for k, xs in times.items()}))
sync.shutdown(); v.shutdown()

"""The most any drafter over the suffix drafter's three tries could accept on a recording: at every
decode step, the longest run of the tokens actually sampled next that some trie holds as a path from
a matched suffix of the context (min_order..23 tokens), found knowing those tokens. A bound for
drafting from these sources, paths and trees alike, not a drafter.

    PYTHONPATH=. python docs/results/scripts/replay_ceiling.py RECORDING.jsonl [MIN_ORDER]
"""
import sys
from collections import defaultdict

from rlboost.histospec import DraftConfig, HistoryStore
from rlboost.histospec.recording import read_recording
from rlboost.histospec.suffix_drafter import SuffixDrafter


def longest_known_run(trie, tail, future, min_order):
    best = 0
    for k in range(min_order, min(len(tail), trie.max_depth - 1) + 1):
        node = trie._node(tail[len(tail) - k:])
        if node is None:
            break
        path, n = list(tail[len(tail) - k:]), 0
        while n < len(future):
            if not node.total and len(path) >= trie.max_depth:  # re-anchor at the depth bound, as drafting does
                node = trie._node(path[len(path) - trie.max_depth + 1:]) or node
            child = node.children.get(future[n])
            if child is None:
                break
            node, n = child, n + 1
            path.append(future[n - 1])
        best = max(best, n)
    return best


groups, min_order = read_recording(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3
cfg = DraftConfig(drafter="suffix", min_order=min_order, max_order=max(7, min_order))
store, seen = HistoryStore(max_tokens=2**62), defaultdict(int)
drafter = SuffixDrafter(store, cfg)
steps, plain = defaultdict(int), defaultdict(int)
for run in dict.fromkeys(g.run for g in groups):
    for step in sorted({g.step for g in groups if g.run == run}):
        batch = [g for g in groups if g.run == run and g.step == step]
        live = []
        for n, g in enumerate(batch):
            for j, tokens in enumerate(g.responses):
                rid = f"{run}/{step}/{n}/{j}"
                drafter.start(rid, g.prompt)
                live.append([rid, g, tokens, min(1, len(tokens)), seen[g.prompt]])
                plain[run, seen[g.prompt]] += max(len(tokens) - 1, 0)
        while live := [r for r in live if r[3] < len(r[2])]:
            for r in live:  # in lockstep, as the replay runs them
                rid, g, tokens, pos, epoch = r
                context = list(g.prompt) + list(tokens[:pos])
                tries = [t for t in (drafter._update(s, drafter._requests[rid], context) for s in drafter.sources) if t]
                tail, future = context[-(cfg.suffix_max_depth - 1):], tokens[pos:len(tokens) - 1]
                accepted = max((longest_known_run(t, tail, future, min_order) for t in tries), default=0)
                steps[run, epoch] += 1
                r[3] = pos + accepted + 1
                if r[3] >= len(tokens):
                    drafter.finish(rid)
        for g in batch:
            seen[g.prompt] += 1
            store.update(g.prompt, g.responses)
        drafter.invalidate([g.prompt for g in batch])
for (run, epoch), n in sorted(steps.items()):
    print(f"{run} epoch {epoch}: at most {1 - n / plain[run, epoch]:.0%} of decode steps saved "
          f"({n} steps instead of {plain[run, epoch]})")

"""Which sequences run in the next engine step.

Prefill first (vLLM v0 style): when requests wait and slots are free, the step prefills as many
waiting prompts as fit the slot count and the padded token budget; otherwise every running sequence
decodes one token. Running sequences occupy KV-cache slots 0..n-1 in order; `remove` keeps it so by
moving the last sequence into a freed slot.
"""

from __future__ import annotations

from collections import deque

from rlboost.engine.kv_cache import KVCache
from rlboost.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """(sequences, is_prefill). Prefill batches sit in consecutive slots at the end of running."""
        if self.waiting and len(self.running) < self.max_num_seqs:
            batch: list[Sequence] = []
            longest = 0
            while self.waiting and len(self.running) + len(batch) < self.max_num_seqs:
                n = self.waiting[0].num_tokens
                if batch and (len(batch) + 1) * max(longest, n) > self.max_num_batched_tokens:
                    break
                batch.append(self.waiting.popleft())
                longest = max(longest, n)
            for seq in batch:
                seq.slot = len(self.running)
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
            return batch, True
        return list(self.running), False

    def unschedule_prefill(self, batch: list[Sequence]) -> None:
        """Undo a prefill admission whose forward pass failed: the batch waits again, first in line."""
        del self.running[len(self.running) - len(batch):]
        for seq in reversed(batch):
            seq.slot, seq.status = None, SequenceStatus.WAITING
            self.waiting.appendleft(seq)

    def remove(self, seqs: list[Sequence], cache: KVCache) -> None:
        """Drop sequences (finished or aborted) from the queue or their slots, keeping slots compact."""
        leaving = {id(s) for s in seqs}
        if any(s.status is SequenceStatus.WAITING for s in seqs):
            self.waiting = deque(s for s in self.waiting if id(s) not in leaving)
        # Highest slot first: every slot above the one being freed is then occupied by a live sequence.
        for slot in sorted((s.slot for s in seqs if s.slot is not None), reverse=True):
            last = len(self.running) - 1
            if slot != last:
                moved = self.running[last]
                cache.move(last, slot, moved.num_cached)
                moved.slot = slot
                self.running[slot] = moved
            self.running.pop()
        for s in seqs:
            s.slot = None

"""A worker's token ledger: the most of each count ever written, and a last line a kill cut short left out
(the manager reads a dead worker's ledger to count exactly what it lost)."""

from __future__ import annotations

from rlboost.hybrid.token_ledger import TokenLedger, ledger_path, read_ledger


def test_the_ledger_keeps_the_most_of_each_count_and_ignores_a_line_cut_short(tmp_path):
    path = ledger_path(tmp_path, "pree-1")
    ledger = TokenLedger(path)
    ledger.generated({"1:0:0#0": 4, "1:0:1#0": 4})
    ledger.sent({"1:0:0#0": 4})
    ledger.generated({"1:0:0#0": 8, "1:0:1#0": 5})
    ledger.generated({})  # nothing to say: no line
    with open(path, "a") as f:  # a kill in the middle of a write
        f.write("1:0:0#0=12 1:0:1#0=")
    got = read_ledger(path)
    assert got.generated == {"1:0:0#0": 8, "1:0:1#0": 5}
    assert got.sent == {"1:0:0#0": 4}
    assert path.read_text().count("\n") == 3

"""`rlboost report RUN_DIR` and the report's HTML page, checked in a real headless browser: every plot
decodes and is drawn."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hybrid_util import patience
from rlboost.cli import main

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


INSTALL_HINT = "`make install-browser` installs Debian's chromium (it needs root and apt-get; .ci/run runs it)"


@pytest.fixture(scope="session")
def chromium() -> str:
    """A headless browser on PATH. None is installed here: a test run changes nothing on the machine. Without
    one the test fails, in one line saying what it needs and the command that installs it (a skip would let
    a suite without a browser pass unseen)."""
    if (path := find_browser()) is None:
        pytest.fail(f"no chromium on PATH (looked for {', '.join(BROWSERS)}): {INSTALL_HINT}", pytrace=False)
    return path


def write_run(run_dir: Path, steps: int = 6) -> Path:
    """A hybrid run's metrics.jsonl with the names the plots read, its last line cut off as by a kill."""
    run_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = [json.dumps({"step": 0, "val/score/mean": 0.03})]
    for step in range(1, steps + 1):
        lines.append(json.dumps({
            "step": step, "critic/score/mean": 0.05 * step, "response_length/mean": 30 - step,
            "response_length/max": 48, "response_length/min": 5, "timing_s/step": 40 + rng.uniform(0, 5),
            "timing_s/gen": 20.0, "timing_s/update_actor": 25.0, "timing_s/wait_train": 10.0,
            "timing_s/wait_remote": 5.0, "timing_s/update_weights": 0.7, "spot/instances": 2 + step % 2,
            "spot/instances_end": 2, "spot/cap": 3, "spot/preemptions": step % 2, "spot/joins": 1 - step % 2,
            "migration/samples": 10 * (step % 2), "migration/wasted_tokens": 0, "weights/pull_s": 0.5,
            "rollout/seed_window_s": 2.0, "cost/tokens_per_usd": 900.0, "cost/colocated_est_tokens_per_usd": 1100.0,
            "cost/total_usd": 1.5 * step, "perf/throughput": 60.0, **({"val/score/mean": 0.2} if step == 5 else {})}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 7, "critic/sco')
    return run_dir


def test_report_rebuilds_both_files_of_an_interrupted_run(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run")
    assert main(["report", str(run_dir)]) == 0
    assert "report.html" in capsys.readouterr().out
    page = (run_dir / "report" / "report.html").read_text()
    assert "(7 logged steps)" in (run_dir / "report" / "report.md").read_text()  # 0-6; the cut-off 7 is skipped
    assert "(7 logged steps)" in page and "<h1>run</h1>" in page
    assert not re.search(r"(src|href)=\"https?://", page)  # self-contained: nothing from the network
    images = re.findall(r'<img class="plot" id="([^"]+)" alt="[^"]*" src="data:image/png;base64,([^"]+)">', page)
    pngs = sorted(p.stem for p in (run_dir / "report").glob("*.png"))
    assert sorted(name for name, _ in images) == pngs and len(pngs) >= 5
    for _, data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")


def test_report_without_metrics_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "metrics.jsonl does not exist" in out and "Traceback" not in out
    assert not (tmp_path / "report").exists()
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "critic/sco')  # killed while writing its first line
    assert main(["report", str(tmp_path)]) == 2
    assert "metrics.jsonl is empty" in capsys.readouterr().out


def test_report_of_a_run_stopped_after_its_step_0_validation(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/score/mean": 0.03}) + "\n")
    assert main(["report", str(tmp_path)]) == 0
    assert "| val/score/mean | first 0.03 · last 0.03 · best 0.03 (step 0) |" in (
        tmp_path / "report" / "report.md").read_text()
    page = (tmp_path / "report" / "report.html").read_text()
    assert re.findall(r'<img class="plot" id="([^"]+)"', page) == ["reward"]
    assert "<td>steps</td>" not in page  # no step trained


def test_report_command_loads_neither_torch_nor_ray(tmp_path):
    """`rlboost report` is run on a laptop over a copied run folder: torch and Ray would cost seconds or be
    missing there."""
    run_dir = write_run(tmp_path / "run")
    code = (f"import sys\nfrom rlboost.cli import main\nassert main(['report', {str(run_dir)!r}]) == 0\n"
            "print('loaded:', *(m for m in ('ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=patience(60), check=True).stdout
    assert out.splitlines()[-1] == "loaded:", out


def test_the_html_report_renders_with_its_plots_in_a_headless_browser(tmp_path, chromium):
    run_dir = write_run(tmp_path / "run")
    assert main(["report", str(run_dir)]) == 0
    page = run_dir / "report" / "report.html"
    # a copy that, once loaded, writes how each image decoded into the page, read back with --dump-dom
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", """<script>
window.addEventListener('load', () => {
  const out = document.createElement('pre'); out.id = 'probe';
  out.textContent = Array.from(document.images).map(i => i.id + '=' + (i.complete ? i.naturalWidth : 0)).join(' ');
  document.body.appendChild(out);
});
</script></body>"""))
    browser = [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*browser, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=patience(60), check=True).stdout
    [decoded] = re.findall(r'<pre id="probe">([^<]*)</pre>', dom)
    widths = dict(item.split("=") for item in decoded.split())
    assert sorted(widths) == sorted(p.stem for p in (run_dir / "report").glob("*.png"))
    assert all(int(width) > 100 for width in widths.values()), widths

    shot = tmp_path / "shot.png"
    subprocess.run([*browser, f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri()],
                   capture_output=True, timeout=patience(60), check=True)
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]
    drawn = (pixels < 0.9).any(axis=-1)  # ink: text, axes, lines
    assert drawn[:600].mean() > 0.005 and drawn[600:].mean() > 0.01  # the summary at the top, plots below

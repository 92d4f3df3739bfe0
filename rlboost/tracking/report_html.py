"""The report as one self-contained HTML page: `report/report.html`, plots inline.

Same content as `report.md` (title, summary table, one section per plot), with each PNG embedded as
a base64 `data:` URI, so the page can be mailed, attached to a CI run or opened from any folder
without its PNG files, and it loads nothing from the network.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.75rem; text-align: left; }
td.value { text-align: right; font-variant-numeric: tabular-nums; }
img.plot { max-width: 100%; height: auto; border: 1px solid #eee; }
"""


def write_html(path: Path, title: str, intro: str, summary: list[tuple[str, str]],
               plots: list[tuple[str, Path]]) -> Path:
    """Write the page to `path`: `summary` as (metric, value) rows, `plots` as (heading, PNG file)."""
    parts = [(f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
              f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>"),
             f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(intro)}</p>", "<h2>Summary</h2>",
             "<table>\n<tr><th>metric</th><th>value</th></tr>"]
    parts += [f"<tr><td>{html.escape(name)}</td><td class=\"value\">{html.escape(value)}</td></tr>"
              for name, value in summary]
    parts.append("</table>")
    for heading, png in plots:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts += [f"<h2>{html.escape(heading)}</h2>",
                  (f"<img class=\"plot\" id=\"{html.escape(png.stem)}\" alt=\"{html.escape(heading)}\" "
                   f"src=\"data:image/png;base64,{data}\">")]
    parts.append("</body>\n</html>\n")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


__all__ = ["write_html"]

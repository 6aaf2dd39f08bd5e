"""A report as a flat list of blocks, rendered to Markdown and to self-contained HTML.

The two renderers read the same blocks, so the Markdown and HTML reports always say the same
thing. HTML embeds every image as a base64 ``data:`` URI and its CSS inline: it references no
URL and opens offline. Inline text may use `code` spans and **bold**; everything else is
escaped. URLs quoted from artifacts (e.g. a server address in an error) are defanged to
``http[:]//...`` in both renderings, so the report holds no fetchable or clickable link.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import re

import pandas as pd
from matplotlib.figure import Figure


@dataclasses.dataclass(frozen=True, slots=True)
class Heading:
    text: str
    level: int = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Bullets:
    items: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Code:
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Table:
    frame: pd.DataFrame
    caption: str = ""
    folded: bool = False
    """Rendered closed (`<details>`, in both renderings): details a reader opens on demand."""


@dataclasses.dataclass(frozen=True, slots=True)
class Image:
    name: str
    """File stem: the Markdown report links ``figures/<name>.png``."""
    png: bytes
    caption: str = ""


Block = Heading | Text | Bullets | Code | Table | Image

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; line-height: 1.45; }
h1, h2, h3 { line-height: 1.2; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .5em 0 1.2em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } tr:nth-child(even) td { background: #fafafa; }
figure { margin: 1em 0 1.5em; } img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption, .caption { font-size: 13px; color: #555; }
code, pre { font-family: ui-monospace, Menlo, Consolas, monospace; background: #f5f5f5; }
pre { padding: .6em; overflow-x: auto; }
"""


def figure_png(fig: Figure, dpi: int = 110) -> bytes:
    """A figure as PNG bytes, without the PNG 'Software' text chunk (it holds a URL)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    return buffer.getvalue()


def defang(text: str) -> str:
    """``http://x`` -> ``http[:]//x``: quoted URLs stay readable but are not links."""
    return re.sub(r"(?i)\b(https?|ftp|wss?):(?=//)", r"\1[:]", text)


# --- Markdown ---------------------------------------------------------------------------------


def _md_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no dependency on `tabulate`)."""
    header = "| " + " | ".join(_md_cell(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in frame.to_numpy()]
    return "\n".join([header, rule, *body])


def _md_block(block: Block, figure_dir: str) -> str:
    if isinstance(block, Heading):
        return f"{'#' * block.level} {block.text}"
    if isinstance(block, Text):
        return block.text
    if isinstance(block, Bullets):
        return "\n".join(f"- {item}" for item in block.items)
    if isinstance(block, Code):
        return f"```\n{block.text}\n```"
    if isinstance(block, Table):
        if block.folded:
            summary = html.escape(block.caption or "details")
            table = markdown_table(block.frame)
            return f"<details><summary>{summary}</summary>\n\n{table}\n\n</details>"
        caption = f"{block.caption}\n\n" if block.caption else ""
        return caption + markdown_table(block.frame)
    caption = f"\n\n*{block.caption}*" if block.caption else ""
    return f"![{block.name}]({figure_dir}/{block.name}.png){caption}"


def render_markdown(blocks: list[Block], figure_dir: str = "figures") -> str:
    """Markdown text; images link to ``<figure_dir>/<name>.png``."""
    return defang("\n\n".join(_md_block(b, figure_dir) for b in blocks)) + "\n"


# --- HTML -------------------------------------------------------------------------------------


def _inline(text: str) -> str:
    """Escape, then turn `code` and **bold** spans into tags."""
    escaped = html.escape(defang(text))
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


def _html_table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(defang(str(c)))}</th>" for c in frame.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(defang(str(v)))}</td>" for v in row) + "</tr>"
        for row in frame.to_numpy()
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _html_block(block: Block) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{_inline(block.text)}</h{block.level}>"
    if isinstance(block, Text):
        return f"<p>{_inline(block.text)}</p>"
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block.items) + "</ul>"
    if isinstance(block, Code):
        return f"<pre><code>{html.escape(defang(block.text))}</code></pre>"
    if isinstance(block, Table):
        if block.folded:
            summary = _inline(block.caption or "details")
            return f"<details><summary>{summary}</summary>{_html_table(block.frame)}</details>"
        caption = f'<p class="caption">{_inline(block.caption)}</p>' if block.caption else ""
        return caption + _html_table(block.frame)
    data = base64.b64encode(block.png).decode("ascii")
    caption = f"<figcaption>{_inline(block.caption)}</figcaption>" if block.caption else ""
    alt = html.escape(block.name)
    return f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">{caption}</figure>'


def render_html(blocks: list[Block], title: str) -> str:
    """One self-contained HTML page: inline CSS, images as data URIs, no external references."""
    body = "\n".join(_html_block(b) for b in blocks)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )

"""A tiny document model (sections of paragraphs, tables, figures, code) with two renderers:
Markdown (figures as relative PNG paths) and self-contained HTML (figures as base64 data URIs).
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Para:
    """A paragraph of plain text."""

    text: str


@dataclass
class Note:
    """A highlighted caveat."""

    text: str


@dataclass
class Table:
    """A table; cells are rendered with ``str``."""

    headers: list[str]
    rows: list[list[Any]]


@dataclass
class Figure:
    """A PNG figure."""

    name: str
    """File stem (``best_so_far`` -> ``report_files/best_so_far.png``)."""
    png: bytes
    caption: str


@dataclass
class Code:
    """Preformatted text (a diff, JSON)."""

    text: str
    lang: str = ""


Block = Para | Note | Table | Figure | Code


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)


def _md_cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def to_markdown(title: str, sections: list[Section], files_dir: str) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Para):
                out += [b.text, ""]
            elif isinstance(b, Note):
                out += [f"> **Note:** {b.text}", ""]
            elif isinstance(b, Table):
                out.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
                out.append("|" + "---|" * len(b.headers))
                out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
                out.append("")
            elif isinstance(b, Figure):
                out += [f"![{b.name}]({files_dir}/{b.name}.png)", "", f"*{b.caption}*", ""]
            elif isinstance(b, Code):
                out += [f"```{b.lang}", b.text.rstrip("\n"), "```", ""]
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
h1{border-bottom:2px solid #2a7ab9;padding-bottom:.2em}h2{margin-top:1.6em;color:#1d4f7a}
table{border-collapse:collapse;margin:.6em 0;font-size:.86em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#eef4fa}tr:nth-child(even) td{background:#fafafa}
.note{background:#fff4e5;border-left:4px solid #ff9800;padding:.5em .8em;margin:.6em 0}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #ddd}
figcaption{font-size:.85em;color:#555}pre{background:#f6f8fa;padding:.7em;overflow-x:auto;
font-size:.82em}.wrap{overflow-x:auto}
"""


def to_html(title: str, sections: list[Section]) -> str:
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    for s in sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        for b in s.blocks:
            if isinstance(b, Para):
                out.append(f"<p>{e(b.text)}</p>")
            elif isinstance(b, Note):
                out.append(f"<div class='note'>{e(b.text)}</div>")
            elif isinstance(b, Table):
                head = "".join(f"<th>{e(str(h))}</th>" for h in b.headers)
                body = "".join(
                    "<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>"
                    for row in b.rows
                )
                out.append(
                    f"<div class='wrap'><table><thead><tr>{head}</tr></thead>"
                    f"<tbody>{body}</tbody></table></div>"
                )
            elif isinstance(b, Figure):
                data = base64.b64encode(b.png).decode("ascii")
                out.append(
                    f"<figure id='fig-{e(b.name)}'><img alt='{e(b.name)}' "
                    f"src='data:image/png;base64,{data}'><figcaption>{e(b.caption)}"
                    f"</figcaption></figure>"
                )
            elif isinstance(b, Code):
                out.append(f"<pre>{e(b.text)}</pre>")
    out.append("</body></html>")
    return "\n".join(out)


__all__ = ["Block", "Code", "Figure", "Note", "Para", "Section", "Table", "to_html", "to_markdown"]

"""docs/KNOBS.md, generated from the knob registry so that a knob's documentation is declared once.

``render()`` builds the page from every registered knob (``KNOBS``: values, default, memory and speed tags,
``after=`` order, process environment, documentation line) and from the repository's search
spaces (which space searches which values). ``python -m infrarsi.execution.knobs.docs`` writes
it; ``--check`` exits 1 when the committed file is stale. tests/execution/knobs/test_docs.py fails
on a stale file with the command that regenerates it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from infrarsi.execution.knobs.registry import KNOBS, KnobSpec, handler_order

ROOT = Path(__file__).resolve().parents[3]
"""The repository root (the directory holding ``infrarsi/``)."""
KNOBS_MD = ROOT / "docs" / "KNOBS.md"
"""The generated page."""
SPACES_DIR = ROOT / "search_spaces"
"""The search spaces whose knobs the page lists."""
COMMAND = "python -m infrarsi.execution.knobs.docs"
"""The command that regenerates the page."""

HEADER = f"""# Built-in knobs and the DeepSpeed keys they set

<!-- Generated from the knob registry by `{COMMAND}`; do not edit by hand. -->

Back to the [README](../README.md).

Every knob is declared once, by `register_knob` in `infrarsi/execution/knobs/registry.py`: its
handler, the values it accepts, its default, its memory and speed tags, the knobs its handler runs after, the
environment it needs at process start and its documentation line. This page is generated from
those declarations. The built-in handlers are in `infrarsi/execution/knobs/deepspeed.py`, the
`code_patch` knob's in `infrarsi/execution/knobs/code_patch.py` (see `docs/PATCHES.md`), the
`loss_chunk_tokens` knob's in `infrarsi/execution/knobs/loss_chunk.py`; the simulated `surrogate`
backend registers record-only handlers for its own knobs in `infrarsi/execution/surrogate/backend.py`.
The pure search core reads knob names from `infrarsi/knob_names.py`.

`build_trial(workload, config, world_size, num_params, hidden_size)` in `deepspeed.py` is the one
translation. It starts from a base DeepSpeed config: `train_batch_size` = `tokens_per_step /
seq_len` (the contract's fixed global batch), `gradient_clipping: 0`,
`zero_allow_untested_optimizer: true`, `zero_force_ds_cpu_optimizer: false`, no `optimizer` block
(the harness builds a torch AdamW from the workload's `optimizer:` section and passes it to
`deepspeed.initialize`, so DeepSpeedCPUAdam is never compiled), `steps_per_print` effectively off.
It then applies every handler in the order below: each knob after those its `after=` names, ties in
registration order. A knob the config does not hold takes its registered default; one without a
default is skipped. Inside a search space the space's own default wins (every config it hands out
holds every knob); the registered default is for a config without the knob.
"""

ADDING = """## Adding a knob

Two places, nothing else:

1. An entry under `knobs:` in a search space, e.g. `- {name: gradient_clipping, type: choice,
   values: [0.0, 1.0]}`. Add `memory: saver` or `memory: hungry`, with the values ordered from the
   least to the most saving (or hungry), when the knob moves memory: pairing and the memory model use it.
   Add `speed: slower` or `speed: faster`, with the values ordered the same way (larger numbers
   further along), when the knob's effect on step time has a direction on any hardware: the
   step-time model without an analytic prior starts from it (a weak claim the trials overrule).
2. One registered handler that applies the value to the trial's build (DeepSpeed config dict,
   model options, runtime options or environment), declaring everything else about the knob:

```python
from infrarsi.execution.knobs import KnobContext, TrialBuild, one_of, register_knob

@register_knob("gradient_clipping", values=one_of(0.0, 1.0), default=0.0)
def gradient_clipping(value: float, build: TrialBuild, ctx: KnobContext) -> None:
    \"\"\"Clips the global gradient norm at this value (0: off). Sets `gradient_clipping`.\"\"\"
    build.ds_config["gradient_clipping"] = float(value)
```

`register_knob` takes `values=` (`one_of(...)`, `integer(lo, hi)`, `boolean()`, `either(...)`,
`checked_by(fn, text)`; the values a search space may give the knob), `default=`, `memory=`
(`saver`, `hungry` or `neutral`), `speed=` (`slower`, `faster` or `neutral`),
`after=("zero_stage",)` (handlers whose output this one reads),
`process_env=` (the environment a value needs at process start) and `doc=` (else the handler's
docstring). A duplicate name, a default outside the knob's values or an `after=` cycle is a
`KnobError` at import. `init` and the trial runner check a space against the registry before any
trial (`check_space`): a knob with no handler (listing the known knobs), a value its handler's
`values=` rejects, or a memory or speed tag opposite to the registered one is refused with exit code 2,
naming the file, the knob, the rule and the fix. Then regenerate this page with
`{command}`.

The handler must be registered in the driver and in every rank process; both import
`infrarsi.execution.knobs`, so put it in `infrarsi/execution/knobs/deepspeed.py` with the built-in
handlers or in a module imported from that package's `__init__.py`.
""".replace("{command}", COMMAND)


def _md(text: str) -> str:
    """A docstring as one Markdown table cell: RST double backticks become single, pipes escaped."""
    return re.sub(r"``([^`]+)``", r"`\1`", " ".join(text.split())).replace("|", "\\|")


def _value(v: object) -> str:
    return "true" if v is True else "false" if v is False else str(v)


def _row(spec: KnobSpec) -> str:
    default = f"`{_value(spec.default)}`" if spec.has_default else "none (skipped unless set)"
    after = ", ".join(f"`{a}`" for a in spec.after) or "-"
    effect = _md(spec.doc)
    if spec.process_env is not None:
        effect += " (`process_env`: sets the rank processes' environment at start.)"
    return (
        f"| `{spec.name}` | {_md(spec.values.text)} | {default} | {spec.memory} | {spec.speed} "
        f"| {after} | {effect} |"
    )


def package_knobs() -> list[str]:
    """The knobs registered by infrarsi's own modules, in handler order (a test's or a user's
    knob registered elsewhere is not the package's to document)."""
    return [n for n in handler_order() if KNOBS[n].handler.__module__.startswith("infrarsi.")]


def space_table(spaces_dir: Path = SPACES_DIR) -> list[str]:
    """Lines listing, per registered knob, the repository's spaces that search it and their values."""
    from infrarsi.search.space import SearchSpace

    found: dict[str, dict[str, list[str]]] = {}
    for path in sorted(spaces_dir.glob("*.yaml")):
        space = SearchSpace.from_yaml(path)
        for k in space.knobs:
            vals = ", ".join(_value(v) for v in k.values)
            key = f"{vals} (default {_value(k.default)}; memory {k.memory}; speed {k.speed})"
            found.setdefault(k.name, {}).setdefault(key, []).append(f"`{path.name}`")
    lines = [
        "## Which space searches which values",
        "",
        "Generated from `search_spaces/*.yaml`: each knob's values in each space (spaces with the same "
        "values share a line).",
        "",
    ]
    for name in package_knobs():
        if name not in found:
            continue
        lines.append(f"- `{name}`:")
        lines += [f"  - {', '.join(files)}: {key}" for key, files in found[name].items()]
    return lines


def render() -> str:
    """The whole of docs/KNOBS.md, from the registry as imported now (built-in and surrogate knobs)."""
    import infrarsi.execution.knobs
    import infrarsi.execution.surrogate.backend  # noqa: F401  (registers the surrogate knobs)

    lines = [
        HEADER,
        "## Every registered knob, in handler order",
        "",
        "| knob | values its handler accepts | default | memory | speed | after | what it does and the keys it sets |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [_row(KNOBS[name]) for name in package_knobs()]
    lines.append("")
    if SPACES_DIR.is_dir():
        lines += [*space_table(), ""]
    lines.append(ADDING)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write docs/KNOBS.md (``--check``: exit 1, writing nothing, when the file differs)."""
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Generate docs/KNOBS.md from the knob registry."
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if docs/KNOBS.md is stale; write nothing"
    )
    args = parser.parse_args(argv)
    text = render()
    current = KNOBS_MD.read_text() if KNOBS_MD.is_file() else ""
    if args.check:
        if current != text:
            print(f"{KNOBS_MD} is stale; regenerate it with `{COMMAND}`.", file=sys.stderr)
            return 1
        return 0
    KNOBS_MD.write_text(text)
    print(f"wrote {KNOBS_MD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

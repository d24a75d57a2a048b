"""The tools' config schema, built from a search space: knobs as properties with their values,
the baseline, the ``when`` condition and the handler's documentation, in plain text."""

from __future__ import annotations

from infrarsi.integrations.mcp_server.schema import config_schema, knob_doc, knob_schema, plain_text
from infrarsi.search.space import SearchSpace

SPACE = SearchSpace.from_yaml("""
name: tiny
knobs:
  - {name: zero_stage, type: choice, values: [0, 1, 2, 3], memory: saver}
  - {name: micro_batch_size, type: int, values: [1, 2, 4], memory: hungry}
  - {name: offload_optimizer, type: bool, when: "zero_stage >= 1", default: false}
  - {name: lr_scale, type: float, range: [0.5, 2.0], log: true}
  - {name: dtype, type: choice, values: [fp32, bf16]}
constraints:
  - "micro_batch_size <= 2 or zero_stage >= 1"
""")
BASE = {
    "zero_stage": 3,
    "micro_batch_size": 1,
    "offload_optimizer": False,
    "lr_scale": 1.0,
    "dtype": "fp32",
}


def test_plain_text_drops_rst_quoting_and_joins_lines() -> None:
    assert plain_text(
        "Sets ``zero_optimization.stage``;\n  see :func:`deepspeed.initialize`.\n\nMore."
    ) == ("Sets zero_optimization.stage; see deepspeed.initialize.\n\nMore.")


def test_each_knob_kind_gets_its_values_and_a_description() -> None:
    zero = knob_schema(SPACE.knob("zero_stage"), 3, "ZeRO stage.")
    assert zero["enum"] == [0, 1, 2, 3] and zero["default"] == 3
    assert (
        zero["description"].startswith("ZeRO stage. Baseline: 3.")
        and "use less memory" in zero["description"]
    )
    assert knob_schema(SPACE.knob("micro_batch_size"), 1)["type"] == "integer"
    off = knob_schema(SPACE.knob("offload_optimizer"), False)
    assert (
        off["type"] == "boolean"
        and "Active only where 'zero_stage >= 1' holds" in off["description"]
    )
    lr = knob_schema(SPACE.knob("lr_scale"), 1.0)
    assert (lr["type"], lr["minimum"], lr["maximum"]) == ("number", 0.5, 2.0) and "enum" not in lr


def test_the_config_schema_lists_editable_knobs_and_names_the_pinned_ones() -> None:
    s = config_schema(SPACE, ["zero_stage", "micro_batch_size"], BASE)
    assert (
        list(s["properties"]) == ["zero_stage", "micro_batch_size"]
        and s["additionalProperties"] is False
    )
    assert (
        "'dtype': 'fp32'" in s["description"]
        and "micro_batch_size <= 2 or zero_stage >= 1" in s["description"]
    )
    assert set(config_schema(SPACE, SPACE.names, BASE)["properties"]) == set(SPACE.names)


def test_a_registered_knob_is_described_by_its_registered_doc_in_plain_text() -> None:
    from infrarsi.execution.knobs import KNOBS

    doc = knob_doc("zero_stage")
    assert (
        doc
        and doc.split()[:3] == KNOBS["zero_stage"].doc.split()[:3]
        and "``" not in doc
        and "\n" not in doc
    )
    assert knob_doc("no_such_knob") == ""

"""The README's benchmark tables are generated (bench/*.py --write-readme): each section is filled, says
when, on what and by which command it was measured, and holds a table."""

from __future__ import annotations

import re

from .conftest import REPO


def test_generated_sections_are_filled_and_dated():
    text = (REPO / "README.md").read_text()
    sections = re.findall(r"<!-- generated:(\w+) begin -->\n(.*?)<!-- generated:\1 end -->", text, re.DOTALL)
    assert {name for name, _ in sections} >= {"bench_corpus", "bench_quantized", "bench_startup"}
    for name, body in sections:
        assert re.match(r"Measured \d{4}-\d{2}-\d{2}; OpenCL device: .+; host CPU: .+; LiteRT .+Command: `.*python "
                        rf"bench/{name}\.py .*--write-readme", body), f"{name}: {body[:300]!r}"
        assert "\n|---|" in body, f"{name} has no table"

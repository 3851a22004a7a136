"""Every page of the documentation that names a delivery mode links the combination table.

The modes (consumer groups, ranks, shared memory, workers, server batches, buckets,
resume) combine as one table says, docs/server.md "Which options combine"; a reader who
meets a mode on any page is one link away from it. This module only reads the documents.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TABLE = ROOT / "docs" / "server.md"

#: A delivery mode, as the documents name it.
MODES = re.compile(r"consumer groups?|\bgroup=|\branks?\b|\brank=|shared[- ]memory|--workers"
                   r"|batch_size=|server batches|\bbuckets?\b|--bucket|\bresum(?:e|ed|ing)\b",
                   re.IGNORECASE)
LINK = re.compile(r"\]\((?:docs/)?server\.md#which-options-combine\)")


def test_every_page_naming_a_mode_links_the_combination_table() -> None:
    missing = {}
    for path in DOCUMENTS:
        if path == TABLE:
            continue
        text = path.read_text()
        named = MODES.search(text)
        if named is not None and LINK.search(text) is None:
            missing[str(path.relative_to(ROOT))] = named[0]
    assert not missing, ("expected a link to the combination table "
                         "(server.md#which-options-combine) on each page naming a mode, "
                         f"missing from (page: the mode named): {missing}")
    assert "## Which options combine" in TABLE.read_text()

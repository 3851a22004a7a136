"""What pytest leaves out of a run: the Ray and torch glue when they are not installed.

Ray is an optional extra (``feedmux[ray]``): ``make test`` does not install it,
and then ``feedmux/ray`` (collected for its doctests) and ``tests/ray`` cannot
even be imported. With Ray installed they are collected, and the ``ray`` marker
keeps the cluster tests out of the default run (``make test-ray`` runs them).
"""

from __future__ import annotations

import importlib.util

collect_ignore = [] if importlib.util.find_spec("ray") else ["feedmux/ray", "tests/ray"]
# feedmux.torch (the feedmux[torch] extra) is collected for its doctests only with torch.
if not importlib.util.find_spec("torch"):
    collect_ignore.append("feedmux/torch.py")

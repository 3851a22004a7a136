"""What pytest leaves out of a run: the Ray glue and its tests when Ray is not installed.

Ray is an optional extra (``feedmux[ray]``): ``make test`` does not install it,
and then ``feedmux/ray`` (collected for its doctests) and ``tests/ray`` cannot
even be imported. With Ray installed they are collected, and the ``ray`` marker
keeps the cluster tests out of the default run (``make test-ray`` runs them).
"""

from __future__ import annotations

import importlib.util

collect_ignore = [] if importlib.util.find_spec("ray") else ["feedmux/ray", "tests/ray"]

"""``python -m feedmux`` runs the command line."""

import sys

from feedmux.apps.cli import main

sys.exit(main())

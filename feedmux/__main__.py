"""``python -m feedmux`` runs the command line."""

import sys

from feedmux.cli import main

sys.exit(main())

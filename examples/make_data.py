"""Write example npz files for examples/sampler.py: ``python examples/make_data.py DIR``."""

from __future__ import annotations

import sys

from feedmux.apps.demo import write_example_files

if __name__ == "__main__":
    directory = sys.argv[1] if len(sys.argv) > 1 else "feedmux-data"
    import os

    os.makedirs(directory, exist_ok=True)
    paths = write_example_files(directory, files=3, examples=1000)
    print(f"wrote {len(paths)} files to {directory}")

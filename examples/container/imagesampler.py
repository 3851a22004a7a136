"""A sampler of one's own, as the container template serves it: images decoded with Pillow.

The data is a folder of images, a subfolder per class (``DATA/<class>/<image>.png``);
in the container it is mounted read-only at ``/data``, and the sampler only opens
files for reading. Every epoch yields every image once, as
``{"image": uint8 array (height, width, 3), "label": class index, "name": "class/file"}``.

Outside a container, from this folder::

    python make_images.py data
    feedmux serve imagesampler:make_mux --arg data_dir=data --epochs 1
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import feedmux

#: The files read as images; anything else in a class folder is left alone.
SUFFIXES = {".png", ".jpg", ".jpeg"}


def read_class(folder: str, label: int) -> Iterator[dict[str, Any]]:
    """Yield the images of one class folder, decoded to RGB arrays, in name order."""
    for path in sorted(Path(folder).iterdir()):
        if path.suffix.lower() in SUFFIXES:
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB"))
            yield {"image": pixels, "label": label, "name": f"{path.parent.name}/{path.name}"}


def make_mux(data_dir: str = "/data", n_active: int = 4,
             seed: int | None = None) -> feedmux.StochasticMux:
    """A streamer per class folder of ``data_dir``; an epoch is every image once."""
    classes = sorted(path for path in Path(data_dir).iterdir() if path.is_dir())
    if not classes:
        raise FileNotFoundError(f"expected a folder per class in {data_dir}, found none "
                                "(is the data mounted there?)")
    streams = [feedmux.Streamer(read_class, str(folder), label)
               for label, folder in enumerate(classes)]
    return feedmux.StochasticMux(streams, n_active, rate=None, mode="exhaustive",
                                 random_state=seed)

"""Write example data for the container template: a folder per class of PNG images.

    python make_images.py data                # 3 classes x 8 images of 320 x 320

Each image says what it is, so that a trainer can check what it received: red is the
image's index in its class, green its class index (blue is a gradient). At 300 KiB
decoded, an image is above the 256 KiB from which the shared-memory pool carries an
array. The files are created world-readable (mode 644, folders 755), as the sampler's
user in the container (uid 10001) must be able to read them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
from PIL import Image

SIZE = 320


def pixels(label: int, index: int) -> np.ndarray:
    """The RGB array of image ``index`` of class ``label``."""
    image = np.empty((SIZE, SIZE, 3), np.uint8)
    image[..., 0] = index
    image[..., 1] = label
    image[..., 2] = np.add.outer(np.arange(SIZE), np.arange(SIZE)) % 256
    return image


def write_images(folder: Path, classes: int = 3, per_class: int = 8) -> list[str]:
    """Write the images into ``folder``; return their names (``class/file``)."""
    names = []
    for label in range(classes):
        class_folder = folder / f"class{label}"
        class_folder.mkdir(parents=True, exist_ok=True)
        os.chmod(class_folder, 0o755)
        for index in range(per_class):
            path = class_folder / f"{index:04d}.png"
            Image.fromarray(pixels(label, index)).save(path)
            os.chmod(path, 0o644)
            names.append(f"{class_folder.name}/{path.name}")
    os.chmod(folder, 0o755)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=8)
    options = parser.parse_args()
    names = write_images(options.folder, options.classes, options.per_class)
    print(f"{len(names)} images in {options.folder}")


if __name__ == "__main__":
    main()

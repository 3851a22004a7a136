"""The container template (examples/container): what docs/containers.md promises of it.

Static, from the files: the Dockerfile builds on an image given as a build argument,
installs packages as root and switches back to the feedmux image's non-root user; the
compose file mounts the data read-only and shares the host's IPC and PID namespaces (the
shared-memory pool with a trainer on the host needs both). Live: the command of the image,
run as written but for its addresses and data folder, with the module imported from the
folder the image copies it into, serves the template's example images on 127.0.0.1 to a
real ``RemoteLoader``. No image is built here: ``make container-test`` builds and runs the
template with a container engine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import yaml  # PyYAML, a dependency of lightning (the test extra)

from feedmux import RemoteLoader
from tests.integration.conftest import Spawned

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "examples" / "container"


def instructions(path: Path) -> list[tuple[str, str]]:
    """A Dockerfile's instructions, (KEYWORD, arguments), continuation lines joined."""
    joined = re.sub(r"\\\n", " ", path.read_text())
    found = []
    for line in joined.split("\n"):
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            found.append((keyword.upper(), " ".join(arguments.split())))
    return found


def the_one(path: Path, keyword: str) -> str:
    found = [arguments for key, arguments in instructions(path) if key == keyword]
    assert len(found) == 1, f"expected one {keyword} in {path}, found {found}"
    return found[0]


def template_command() -> list[str]:
    command: list[str] = json.loads(the_one(TEMPLATE / "Dockerfile", "CMD"))
    return command


def feedmux_user() -> tuple[str, str]:
    """(name, uid) of the non-root user the project's Dockerfile creates."""
    run = next(arguments for key, arguments in instructions(ROOT / "Dockerfile")
               if key == "RUN" and "useradd" in arguments)
    words = run[run.index("useradd"):].split("&&")[0].split()
    assert "--uid" in words, f"no useradd --uid in the project's Dockerfile: {run}"
    return words[-1], words[words.index("--uid") + 1]


def sampler_service() -> dict[str, Any]:
    compose = yaml.safe_load((TEMPLATE / "compose.yml").read_text())
    service: dict[str, Any] = compose["services"]["sampler"]
    return service


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dockerfile_builds_on_the_feedmux_image_given_as_a_build_argument() -> None:
    steps = instructions(TEMPLATE / "Dockerfile")
    first_from = next(index for index, (key, _) in enumerate(steps) if key == "FROM")
    base = re.fullmatch(r"\$\{?(\w+)\}?", steps[first_from][1])
    assert base is not None, f"expected FROM ${{ARG}}, got FROM {steps[first_from][1]}"
    arguments = dict(arguments.partition("=")[::2] for key, arguments in steps[:first_from]
                     if key == "ARG")
    assert base[1] in arguments, f"FROM ${base[1]} with no ARG {base[1]} before it"
    # The default is the tag the project's Dockerfile says to build it with.
    image = arguments[base[1]].split(":")[0]
    assert f"-t {image} ." in (ROOT / "Dockerfile").read_text()


def test_packages_are_installed_as_root_then_the_feedmux_user_is_back() -> None:
    steps = instructions(TEMPLATE / "Dockerfile")
    name, uid = feedmux_user()
    users = [(index, arguments) for index, (key, arguments) in enumerate(steps)
             if key == "USER"]
    install = next(index for index, (key, arguments) in enumerate(steps)
                   if key == "RUN" and "pip install" in arguments)
    as_root = [index for index, user in users if user in ("root", "0") and index < install]
    assert as_root, "expected USER root before the pip install (the environment is root's)"
    last_index, last_user = users[-1]
    assert last_user in (uid, name, f"{uid}:{uid}"), (
        f"expected the feedmux image's user ({name}, uid {uid}) last, got USER {last_user}")
    assert all(key != "RUN" for key, _ in steps[last_index:]), "a RUN after the last USER"


def test_the_image_serves_the_module_it_copies_from_the_data_mount() -> None:
    steps = instructions(TEMPLATE / "Dockerfile")
    command = template_command()
    assert command[0] == "serve", command
    module = command[1].split(":")[0]
    copies = [arguments.split() for key, arguments in steps if key == "COPY"]
    destination = next(target for *sources, target in copies if f"{module}.py" in sources)
    assert (TEMPLATE / f"{module}.py").is_file()
    assert f"PYTHONPATH={destination.rstrip('/')}" in [a for k, a in steps if k == "ENV"]
    # Every file copied is in the build context (the .dockerignore lets it in).
    allowed = {line[1:] for line in (TEMPLATE / ".dockerignore").read_text().split("\n")
               if line.startswith("!")}
    assert {source for *sources, _ in copies for source in sources} <= allowed
    assert command[command.index("--bind") + 1].startswith("tcp://0.0.0.0:")
    assert "data_dir=/data" in command


def test_the_compose_file_mounts_the_data_read_only_and_shares_ipc_and_pid() -> None:
    service = sampler_service()
    assert service["build"]["context"] == "."
    assert "FEEDMUX_IMAGE" in service["build"]["args"]
    mounts = [volume for volume in service["volumes"] if ":/data" in volume]
    assert len(mounts) == 1 and mounts[0].endswith(":/data:ro"), service["volumes"]
    # The pool is a file in /dev/shm (the host's IPC namespace) and is taken back when the
    # holding trainer's pid is gone (the host's PID namespace, or host trainers look dead).
    assert (service.get("ipc"), service.get("pid")) == ("host", "host"), (
        f"expected ipc: host and pid: host, got ipc: {service.get('ipc')}, "
        f"pid: {service.get('pid')}")
    assert not service.get("privileged") and not service.get("cap_add")
    _, uid = feedmux_user()
    assert service["user"].endswith(f":-{uid}}}"), service["user"]
    assert all(port.startswith("127.0.0.1:") for port in service["ports"])


def test_feedmux_serve_serves_the_template_module(tmp_path: Path) -> None:
    make_images = load(TEMPLATE / "make_images.py")
    data = tmp_path / "data"
    names = make_images.write_images(data, classes=3, per_class=4)
    command = template_command()
    command[command.index("--bind") + 1] = "tcp://127.0.0.1:0"
    command[command.index("--control") + 1] = "tcp://127.0.0.1:0"
    command[command.index("data_dir=/data")] = f"data_dir={data}"
    # As in the image: the module found through PYTHONPATH, not the working directory.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TEMPLATE), str(ROOT)])}
    server = Spawned(subprocess.Popen(
        [sys.executable, "-m", "feedmux", *command, "--epochs", "2"], env=env, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    try:
        endpoints = server.endpoints()
        seen: Counter[str] = Counter()
        with RemoteLoader(endpoints.data, control=endpoints.control, timeout=60) as loader:
            for sample in loader:
                name = str(sample["name"])
                label, index = int(sample["label"]), int(name[-8:-4])
                assert name.startswith(f"class{label}/")
                np.testing.assert_array_equal(sample["image"], make_images.pixels(label, index))
                seen[name] += 1
        assert seen == Counter({name: 2 for name in names})
        assert server.wait(30) == 0, server.stderr
    finally:
        server.kill()
        server.wait(10)

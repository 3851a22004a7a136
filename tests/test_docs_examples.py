"""Every fenced example of README.md and docs/*.md, run as written on a fresh set-up.

This module owns the rules by which a documentation block is run, and the list of
blocks that cannot run on one machine with no GPU (each with its reason). It must
never edit what a block says beyond the substitutions listed here, never talk to
anything but loopback, and never wait without a bound.

How a block is read, by its fence's language:

- ``python``: run, in order, in one fresh interpreter per *session* (a temporary
  folder as its working directory, as a user running ``python`` there); the blocks of
  a session share their names, as the prose around them does. A block whose first
  line is a comment naming a file (``# mydata.py``) is that file: it is written into
  the folder, not run. A block of ``>>>`` lines is a doctest.
- ``pycon``: a doctest, run in the session's interpreter.
- ``sh``: each command is run by bash in the folder, with this environment's
  ``feedmux`` first on ``PATH`` (the console script, as installed), and must exit 0.
  ``feedmux serve`` starts in the background (stopped when the session ends); the
  next commands and blocks wait for its start line.
- ``text``: output, a diagram or a format: never run. A block without a language
  fails the test, so a new command cannot slip in unrun.

The examples' module docstrings say how to run them, in indented lines: each such
block is a shell block, run in a folder that holds a copy of ``examples/`` (the root
of a fresh clone, where they say to run them).

Addresses are substituted, never edited by hand: a ``feedmux serve`` binds a free
pair of ports on 127.0.0.1 (data, and control on the next port, as by default)
instead of its documented ``--bind`` (tests run side by side on one machine; 5555
would collide), and in what follows the documented endpoints (:data:`DATA_ENDPOINTS`
on 5555, :data:`CONTROL_ENDPOINTS` on 5556; ``hostN`` for the N-th server started)
become the ones that server got; ``--metrics-port N`` becomes ``--metrics-port 0``,
and ``/tmp/`` a folder of the session's own (another run may write the same path).
Names a block takes from its reader's own code (a model, a training step) are given
by :data:`GIVEN`, block by block.

The blocks of a file form one session, in order, unless :data:`SESSIONS` splits them
(alternatives the prose offers side by side). :data:`SKIPPED` lists the blocks that
cannot run here, with the reason; every entry of these tables must match exactly one
block, so none goes stale.
"""

from __future__ import annotations

import ast
import doctest
import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.conftest import Spawned

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: The examples, whose module docstrings show how to run them (indented command lines).
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
LANGUAGES = {"python", "pycon", "sh", "text"}

#: Seconds one block may run (a loaded machine is slow; a block that hangs fails).
BLOCK_TIMEOUT = 180.0
#: Seconds one session may take in all (torchrun's ranks import torch on a loaded machine).
SESSION_TIMEOUT = 400
#: Seconds a documented server may take to log its start line: one serving a torch
#: ``Dataset`` imports torch first (12 s for the import alone with the machine's load at
#: 14 on 2 cores; 30 s was too short for it under a loaded suite).
START_TIMEOUT = 120.0

#: Where a documented server's ports are drawn from (halved: an even data port, control
#: the next one), below the ephemeral range other tests' port-0 servers get.
PORT_RANGE = (10_000, 16_000)
PORT_TRIES = 20

#: Documented data endpoints, replaced by the data endpoint of the session's server.
DATA_ENDPOINTS = re.compile(r"tcp://(?:127\.0\.0\.1|localhost|sampler|host):5555\b")
#: Documented control endpoints, replaced by the control endpoint of the session's server.
CONTROL_ENDPOINTS = re.compile(r"tcp://(?:127\.0\.0\.1|localhost|sampler|host):5556\b")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is and what it says."""

    document: str  # relative to the repository root
    line: int  # of its opening fence, 1-based
    language: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"


#: Blocks that cannot run on this machine: (document, a string only that block holds)
#: -> why.
SKIPPED: dict[tuple[str, str], str] = {
    ("README.md", "make demo"): "make test runs this very test; make demo is `feedmux demo` "
    "after the set-up, run by tests/integration/test_demo.py",
    ("README.md", "podman-compose up --build"): "needs a container engine "
    "(scripts/container-test.sh runs it: make container-test)",
    ("README.md", "FEEDMUX_TRAINERS=4 FEEDMUX_WORKERS=2"): "needs a container engine",
    ("README.md", "docker compose up -d sampler"): "needs a container engine",
    ("README.md", "# published on other ports?"): "talks to the sampler container above",
    ("docs/containers.md", "scripts/container-test.sh"): "needs a container engine",
    ("docs/containers.md", "docker compose up --build -d"): "needs a container engine "
    "(scripts/container-test.sh builds and serves the template: make container-test)",
    ("docs/performance.md", "make bench"): "benchmark runs of minutes each; "
    "tests/test_benchmarks_smoke.py runs them with --quick",
    ("docs/chaos.md", "python -m benchmarks.chaos  "): "chaos runs of minutes each, with "
    "real kills: .ci/run runs the short form and make chaos the long one",
    ("docs/scale-out.md", "from feedmux.ray import SamplerFleet"): "needs Ray, not in the "
    "test set-up (tests/ray/test_example.py runs these steps: make test-ray)",
    ("docs/stream.md", "for item in loader:"): "an endless loop by design (the pattern Stream "
    "replaces)",
    ("docs/migrating.md", "import zero"): "zero, the library this section migrates from, "
    "is not installed here",
    ("examples/ray_train.py", "python examples/ray_train.py"): "needs Ray, not in the test "
    "set-up (tests/ray/test_example.py runs it: make test-ray)",
    ("docs/torch.md", 'os.environ["RANK"]'): "a rank started by torchrun; the same loop runs "
    "as 2 ranks under gloo in tests/integration/test_torch_dataloader.py",
    ("docs/torch.md", "python examples/lightning_train.py"): "the commands of "
    "examples/lightning_train.py's docstring (see there)",
}

#: Commands of shell blocks that cannot run here: (document, a string only that
#: command holds) -> why. The other commands of the block run.
SKIPPED_COMMANDS: dict[tuple[str, str], str] = {
    ("docs/ddp.md", "torchrun --nproc_per_node 8"): "eight ranks of the reader's train.py, "
    "one per GPU (the README's torchrun block runs two on CPU)",
    ("docs/ddp.md", "--node_rank 0"): "torchrun across two hosts",
    ("docs/ddp.md", "--node_rank 1"): "torchrun across two hosts",
    ("docs/observability.md", "pip install"): "installs from the package index (the test "
    "set-up has prometheus-client)",
    ("docs/scale-out.md", "pip install"): "installs Ray from the package index",
    ("examples/ddp_train.py", "torchrun"): "run by tests/integration/test_ddp.py "
    "(test_torchrun_runs_the_ddp_example, over a smaller sampler: minutes of all_reduce "
    "steps on a loaded machine); the commands before it run here",
    ("examples/lightning_train.py", "python examples/lightning_train.py"): "run by "
    "tests/integration/test_torch_dataloader.py (over a smaller sampler: 6,000 "
    "single-sample Lightning steps take minutes on a loaded machine); the commands before "
    "it run here",
}

#: What a block takes from its reader's own code or set-up: (document, a string only
#: that block holds) -> blocks (language, code) run in the session just before it.
GIVEN: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("docs/migrating.md", "pescador.ZMQStreamer"): [("python", """
        from mypkg.data import paths, read_file

        def train_step(batch):
            pass
        """)],
    ("docs/migrating.md", "for sample in RemoteLoader("): [("python", """
        def train_step(sample):
            pass
        """)],
    ("docs/migrating.md", "shuffle=True, num_workers=2"): [("python", """
        def train_step(images, labels):
            assert images.shape[1:] == (3, 32, 32) and not labels.dtype.is_floating_point
        """)],
    ("docs/migrating.md", "stream.epochs(n_epochs)"): [("python", """
        import torch

        world_size, n_epochs = 1, 2
        model = torch.nn.Linear(4, 1)

        def train_step(sample):
            pass
        """)],
    ("docs/ddp.md", "for epoch in range(epochs):"): [
        ("sh", "feedmux serve mypkg.data:make_mux --epochs 2"),
        ("python", """
        import os

        import torch.distributed as dist

        import feedmux

        dist.init_process_group("gloo", init_method="file://" + os.path.abspath("rendezvous"),
                                rank=0, world_size=1)
        address, epochs = "tcp://127.0.0.1:5555", 2
        """)],
    ("docs/resume.md", "if resuming:"): [
        ("sh", "feedmux serve mypkg.data:make_mux --epochs 2"),
        ("python", """
        address = "tcp://127.0.0.1:5555"
        rank, world_size, epochs, resuming = 0, 1, 2, False
        """)],
    ("docs/sampling.md", "read_rows(path)"): [("python", """
        from types import SimpleNamespace

        import numpy as np

        paths = ["a", "b"]

        def read_rows(path):
            for i in range(100):
                yield SimpleNamespace(features=np.full(3, i, np.float32), label=i % 2)
        """)],
    ("docs/groups.md", 'group="ddp"'): [("python", "rank = 0")],
    ("docs/stream.md", "batch_size=256)"): [
        ("sh", "feedmux serve mypkg.data:make_mux --epochs 1")],
    ("docs/torch.md", "one pass = one server epoch"): [
        ("sh", "feedmux serve mypkg.data:make_mux --epochs 3")],
    ("docs/torch.md", "dataset.track(loader)"): [
        ("sh", "feedmux serve mypkg.data:make_mux --epochs 2"),
        ("python", """
        import torch
        from torch.utils.data import DataLoader

        from feedmux.torch import RemoteDataset

        dataset = RemoteDataset("tcp://127.0.0.1:5555", rank=0, world_size=1, timeout=60)
        model, rank, epochs, path = torch.nn.Linear(4, 1), 0, 2, "checkpoint.pt"
        """)],
    ("examples/trainer.py", "python examples/trainer.py"): [("sh", """
        python examples/make_data.py feedmux-data
        feedmux serve examples.sampler:make_mux --arg data_dir=feedmux-data --epochs 3
        """)],
    ("docs/scale-out.md", "rank=rank, world_size=world_size)"): [("python", """
        import feedmux

        rank, world_size = 0, 1
        """)],
}

#: The reader's own package the documents name (``mypkg.data:make_mux``), written
#: into every session's folder: 1000 numbered samples per epoch over 8 files'
#: worth of streamers (the examples append to it, as a reader adds to their module).
READER_FILES: dict[str, str] = {
    "mypkg/__init__.py": "",
    "mypkg/data.py": '''
        import numpy as np

        import feedmux

        paths = [f"part-{k}" for k in range(8)]

        def read_file(path):
            first = 125 * int(path.rsplit("-", 1)[1])
            for i in range(first, first + 125):
                yield {"X": np.full(4, i, np.float32), "y": i % 10, "id": i}

        def make_mux():
            streams = [feedmux.Streamer(read_file, path) for path in paths]
            return feedmux.StochasticMux(streams, 4, rate=None, mode="exhaustive",
                                         random_state=0)
        ''',
}

#: Documents whose blocks are alternatives: the sessions, each a list of strings that
#: name its blocks (a string only that block holds), run in that order.
SESSIONS: dict[str, list[list[str]]] = {
    "README.md": [
        ["make demo", "# mydata.py", "rng = np.random.default_rng(0)", "--workers 2 --epochs 10",
         "print(epoch, loader.last_epoch)", "stream.data(math.inf)", "--epochs 4",
         "print(epoch, len(loader))", "--epochs 3", "batch_size=32, timeout=60)\nbatches"],
        ["# mydata.py", "rng = np.random.default_rng(0)", "files=a.npz,b.npz --epochs 2",
         "# train.py", "torchrun --standalone"],
        ["podman-compose up --build", "FEEDMUX_TRAINERS=4 FEEDMUX_WORKERS=2",
         "docker compose up -d sampler", "# published on other ports?"],
        ["# mydataset.py", "mydataset:Points", "cross_entropy(model(x), label)"],
    ],
    "docs/migrating.md": [
        ["pescador.ZMQStreamer"],
        ["# mypkg/data.py", "--workers 4 --epochs 2", "for sample in RemoteLoader("],
        ["import zero", "--epoch-size 1000", "stream.epochs(n_epochs)"],
        ["# mypkg/images.py", "np.save(folder", "shuffle=True, num_workers=2",
         "mypkg.images:train_set", "RemoteDataset(\"tcp://127.0.0.1:5555\", timeout=60), "
         "batch_size=16"],
    ],
}

#: Sessions that take more than a few seconds (several interpreters importing torch).
SLOW_SESSIONS = {"README.md#1", "README.md#2", "README.md#4", "docs/ddp.md",
                 "docs/resume.md", "docs/torch.md", "docs/migrating.md#3",
                 "docs/migrating.md#4"}


def read_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file (fences may be indented, as in a list)."""
    blocks = []
    lines = path.read_text().split("\n")
    index = 0
    while index < len(lines):
        opening = re.match(r"^(\s*)```(\S*)\s*$", lines[index])
        if opening is None:
            index += 1
            continue
        indent, start, body = opening[1], index, []
        index += 1
        while not re.match(r"^\s*```\s*$", lines[index]):
            body.append(lines[index][len(indent):] if lines[index].startswith(indent)
                        else lines[index])
            index += 1
        blocks.append(Block(str(path.relative_to(ROOT)), start + 1, opening[2],
                            "\n".join(body) + "\n"))
        index += 1
    return blocks


def read_command_blocks(path: Path) -> list[Block]:
    """The indented command blocks of an example's module docstring (each a shell block)."""
    docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    blocks = []
    lines = docstring.split("\n")
    index = 0
    while index < len(lines):
        if lines[index].startswith("    ") and (index == 0 or not lines[index - 1].strip()):
            start = index
            while index < len(lines) and lines[index].startswith("    "):
                index += 1
            text = textwrap.dedent("\n".join(lines[start:index])) + "\n"
            blocks.append(Block(str(path.relative_to(ROOT)), start + 1, "sh", text))
        index += 1
    return blocks


def blocks_of(path: Path) -> list[Block]:
    return read_blocks(path) if path.suffix == ".md" else read_command_blocks(path)


ALL_BLOCKS = [block for path in [*DOCUMENTS, *EXAMPLES] for block in blocks_of(path)]


def matching(document: str, marker: str) -> list[Block]:
    return [b for b in ALL_BLOCKS if b.document == document and marker in b.text]


def the_block(document: str, marker: str) -> Block:
    found = matching(document, marker)
    assert len(found) == 1, (f"{document}: expected one block holding {marker!r}, "
                             f"found {len(found)}: {[b.name for b in found]}")
    return found[0]


def sessions() -> Iterator[tuple[str, list[Block]]]:
    """Every session to run: an id and its blocks, in order."""
    for path in [*DOCUMENTS, *EXAMPLES]:
        document = str(path.relative_to(ROOT))
        runnable = [b for b in blocks_of(path) if b.language != "text"]
        if not runnable:
            continue
        if document in SESSIONS:
            for number, markers in enumerate(SESSIONS[document], 1):
                yield f"{document}#{number}", [the_block(document, m) for m in markers]
        else:
            yield document, runnable


# --- the session's interpreter -------------------------------------------------------

# Runs in a fresh interpreter in the session's folder: each request (a JSON line on
# stdin) is a block to run in one namespace; each answer is a JSON line on the
# descriptor that was stdout (what the block prints goes to stderr, read by the test).
_KERNEL = r"""
import doctest, json, os, sys, traceback
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    request = json.loads(line)
    try:
        if request["doctest"]:
            test = doctest.DocTestParser().get_doctest(
                request["code"], namespace, request["name"], request["name"], 0)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
            runner.run(test, out=sys.stderr.write, clear_globs=False)
            namespace.update(test.globs)  # a DocTest runs in a copy of the names
            error = (None if runner.failures == 0
                     else f"{runner.failures} doctest failure(s), shown above")
        else:
            exec(compile(request["code"], request["name"], "exec"), namespace)
            error = None
    except BaseException:
        error = traceback.format_exc()
    answers.write(json.dumps({"error": error}) + "\n")
    answers.flush()
"""


@dataclass
class Session:
    """The folder, the interpreter and the servers of one session."""

    folder: Path
    env: dict[str, str]
    servers: list[Spawned] = field(default_factory=list)
    kernel: Spawned | None = None
    answered: int = 0

    def __post_init__(self) -> None:
        for name, text in READER_FILES.items():
            self.write(name, textwrap.dedent(text).lstrip())

    def write(self, name: str, text: str) -> None:
        """Add ``text`` to the file ``name`` of the folder (created if need be)."""
        target = self.folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as file:
            file.write(text)

    def substitute(self, text: str) -> str:
        """The documented endpoints replaced by those the session's servers bound, and
        ``/tmp/`` by a folder of the session's own."""
        text = text.replace("/tmp/", f"{self.folder}/tmp/")
        if not self.servers:
            return text
        bound = [server.endpoints(START_TIMEOUT) for server in self.servers]

        def numbered(match: re.Match[str]) -> str:
            endpoints = bound[min(int(match[1]), len(bound) - 1)]
            return endpoints.data if match[2] == "5555" else endpoints.control

        text = re.sub(r"tcp://host(\d):(5555|5556)\b", numbered, text)
        text = DATA_ENDPOINTS.sub(bound[-1].data, text)
        return CONTROL_ENDPOINTS.sub(bound[-1].control, text)

    def log(self) -> str:
        parts = [f"--- server {s.process.args}:\n{s.stderr[-4000:]}" for s in self.servers]
        if self.kernel is not None:
            parts.append(f"--- python:\n{self.kernel.stderr[-4000:]}")
        return "\n".join(parts)

    def python(self, name: str, code: str, *, is_doctest: bool) -> None:
        if self.kernel is None:
            self.kernel = Spawned(subprocess.Popen(
                [sys.executable, "-c", _KERNEL], cwd=self.folder, env=self.env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        kernel = self.kernel
        assert kernel.process.stdin is not None
        request = {"code": code, "name": name, "doctest": is_doctest}
        kernel.process.stdin.write((json.dumps(request) + "\n").encode())
        kernel.process.stdin.flush()
        answer = self._answer(kernel, name)
        if answer["error"] is not None:
            raise AssertionError(f"{name} failed:\n{answer['error']}\n{self.log()}")

    def _answer(self, kernel: Spawned, name: str) -> dict[str, str | None]:
        """The kernel's next answer line (it answers each request once, in order)."""
        try:
            kernel.wait_for_stdout(lambda text: text.count("\n") > self.answered,
                                   BLOCK_TIMEOUT, f"the answer to {name}")
        except AssertionError:
            raise AssertionError(f"{name} did not finish within {BLOCK_TIMEOUT} s "
                                 f"(exit code {kernel.returncode})\n{self.log()}") from None
        answer: dict[str, str | None] = json.loads(kernel.stdout.split("\n")[self.answered])
        self.answered += 1
        return answer

    def shell(self, name: str, command: str) -> None:
        command = self.substitute(command)
        if re.match(r"feedmux\s+serve\b", command):
            self.serve(name, command)
            return
        try:
            done = subprocess.run(["bash", "-c", command], cwd=self.folder, env=self.env,
                                  capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired as timeout:
            raise AssertionError(f"{name}: `{command}` did not finish within {BLOCK_TIMEOUT} "
                                 f"s:\n{timeout.stdout!r}\n{timeout.stderr!r}\n{self.log()}"
                                 ) from None
        if done.returncode != 0:
            raise AssertionError(f"{name}: `{command}` exited {done.returncode}:\n"
                                 f"{done.stdout}{done.stderr}\n{self.log()}")

    def serve(self, name: str, command: str) -> None:
        """Start a documented ``feedmux serve`` on a free pair of ports (data, data + 1).

        The pair keeps the documented rule that control is the data port + 1, which a
        loader given only the data endpoint relies on. The server itself binds (a port
        is never picked by binding and releasing it): a pair in use makes it exit with
        ``Address already in use``, and another pair is tried.
        """
        command = re.sub(r"\s--(bind|control)[ =]\S+", "", command)
        command = re.sub(r"--metrics-port[ =]\d+", "--metrics-port 0", command)
        for _ in range(PORT_TRIES):
            port = 2 * random.randrange(*PORT_RANGE)
            bound = (f"{command} --bind tcp://127.0.0.1:{port} "
                     f"--control tcp://127.0.0.1:{port + 1}")
            server = Spawned(subprocess.Popen(
                ["bash", "-c", f"exec {bound}"], cwd=self.folder, env=self.env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            try:
                server.endpoints(START_TIMEOUT)
            except AssertionError as error:
                server.kill()
                server.wait(timeout=10)
                if "Address already in use" in server.stderr:
                    continue
                raise AssertionError(f"{name}: `{bound}` did not start: {error}") from None
            self.servers.append(server)
            return
        raise AssertionError(f"{name}: no free pair of ports in {PORT_TRIES} tries")

    def close(self) -> None:
        for spawned in [*self.servers, *([self.kernel] if self.kernel else [])]:
            spawned.kill()
            spawned.wait(timeout=10)


def shell_commands(text: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments, blanks and
    ``host$`` prompts dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    commands = []
    for line in joined.split("\n"):
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        line = re.sub(r"^\w+\$\s+", "", line)
        if line:
            commands.append(line)
    return commands


def skip_reason(table: dict[tuple[str, str], str], document: str, text: str) -> str | None:
    return next((why for (where, marker), why in table.items()
                 if where == document and marker in text), None)


def run_block(session: Session, block: Block) -> None:
    for language, code in [given for (document, marker), givens in GIVEN.items()
                           if document == block.document and marker in block.text
                           for given in givens]:
        run_code(session, f"{block.name} (given)", language, textwrap.dedent(code))
    if skip_reason(SKIPPED, block.document, block.text) is not None:
        return
    if block.language == "sh":
        for command in shell_commands(block.text):
            if skip_reason(SKIPPED_COMMANDS, block.document, command) is None:
                session.shell(block.name, command)
    else:
        run_code(session, block.name, block.language, block.text)


def run_code(session: Session, name: str, language: str, code: str) -> None:
    if language == "sh":
        for command in shell_commands(code):
            session.shell(name, command)
        return
    code = session.substitute(code)
    named = re.fullmatch(r"#\s*(\S+\.py)\s*", code.split("\n", 1)[0])
    if language == "python" and named is not None:
        session.write(named[1], "\n" + code)
        return
    session.python(name, code,
                   is_doctest=language == "pycon" or code.lstrip().startswith(">>>"))


@pytest.fixture
def environment() -> dict[str, str]:
    """A user's shell: this environment's scripts first on PATH, no PYTHONPATH."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.parametrize(("name", "blocks"), [
    pytest.param(name, blocks, id=name,
                 marks=[pytest.mark.slow] if name in SLOW_SESSIONS else [])
    for name, blocks in sessions()])
@pytest.mark.timeout(SESSION_TIMEOUT)
def test_the_documented_examples_run(name: str, blocks: list[Block], tmp_path: Path,
                                     environment: dict[str, str]) -> None:
    session = Session(tmp_path, environment)
    if name.startswith("examples/"):  # run from the root of a fresh clone, as they say
        shutil.copytree(ROOT / "examples", tmp_path / "examples")
    try:
        for block in blocks:
            run_block(session, block)
    finally:
        session.close()


def test_every_block_says_its_language() -> None:
    untagged = [b.name for b in ALL_BLOCKS if b.language not in LANGUAGES]
    assert not untagged, (f"expected every fenced block tagged one of {sorted(LANGUAGES)} "
                          f"(text: never run), got others at {untagged}")


def test_the_tables_name_existing_blocks() -> None:
    for document, marker in [*SKIPPED, *GIVEN]:
        the_block(document, marker)
    for document, marker in SKIPPED_COMMANDS:
        commands = [command for block in ALL_BLOCKS if block.document == document
                    and block.language == "sh" for command in shell_commands(block.text)
                    if marker in command]
        assert len(commands) == 1, (f"{document}: expected one command holding {marker!r}, "
                                    f"got {commands}")
    for document, markers in SESSIONS.items():
        covered = {the_block(document, m).name for session in markers for m in session}
        runnable = {b.name for b in ALL_BLOCKS if b.document == document and b.language != "text"}
        assert covered == runnable, (f"{document}: expected its sessions to cover every "
                                     f"runnable block, missing {sorted(runnable - covered)}")


def test_doctest_blocks_are_found() -> None:
    # The doctest runner must see the examples (a parser that finds none passes them all).
    block = next(b for b in ALL_BLOCKS if b.language == "pycon")
    assert doctest.DocTestParser().get_examples(block.text)


#: The module each runtime dependency is imported as.
IMPORT_NAMES = {"pyzmq": "zmq", "numpy": "numpy", "msgpack": "msgpack"}


def _module_level_imports(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports unconditionally."""
    imported = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    return imported - set(sys.stdlib_module_names) - {"feedmux", "__future__"}


def test_the_runtime_dependencies_are_what_feedmux_imports() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {re.split(r"[<>=!~ \[]", spec, maxsplit=1)[0]
                for spec in project["dependencies"]}
    extras = set(project["optional-dependencies"])
    imported: set[str] = set()
    for path in (ROOT / "feedmux").rglob("*.py"):
        part = path.relative_to(ROOT / "feedmux").parts[0].removesuffix(".py")
        if part not in extras:  # feedmux.ray, feedmux.torch: their extra's packages
            imported |= _module_level_imports(path)
    assert {IMPORT_NAMES.get(name, name) for name in required} == imported, (
        f"expected the runtime dependencies {sorted(required)} to be what feedmux imports "
        f"at module level, got imports of {sorted(imported)}")
    listed = re.search(r"runtime dependencies: ([^;]+);", (ROOT / "README.md").read_text())
    assert listed is not None, "expected the README to list the runtime dependencies"
    assert set(re.split(r",\s*", listed[1].strip())) == required, (
        f"expected the README's runtime dependencies {listed[1]!r} to be {sorted(required)}")


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_links_between_documents_resolve() -> None:
    for path in DOCUMENTS:
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md|)(?:#([\w-]+))?\)",
                                         path.read_text()):
            linked = (path.parent / target) if target else path
            assert linked.exists(), f"{path.name}: expected {target} to exist"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
                assert anchor in {_anchor(h) for h in headings}, (
                    f"{path.name}: expected a heading of {target or path.name} with the "
                    f"anchor #{anchor}, got {sorted(_anchor(h) for h in headings)}")


def test_a_block_that_fails_fails_its_session(tmp_path: Path,
                                              environment: dict[str, str]) -> None:
    session = Session(tmp_path, environment)
    try:
        with pytest.raises(AssertionError, match="ZeroDivisionError"):
            run_block(session, Block("x.md", 1, "python", "1 / 0\n"))
        with pytest.raises(AssertionError, match="doctest failure"):
            run_block(session, Block("x.md", 2, "pycon", ">>> 1 + 1\n3\n"))
        with pytest.raises(AssertionError, match="exited 3"):
            run_block(session, Block("x.md", 3, "sh", "true\nexit 3\n"))
        run_block(session, Block("x.md", 4, "python", "# shared.py\nVALUE = 7\n"))
        run_block(session, Block("x.md", 5, "python", "import shared\nassert shared.VALUE == 7\n"))
    finally:
        session.close()

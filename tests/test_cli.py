"""The ``feedmux`` command line's parsing: levels, groups, defaults, one-line errors."""

from __future__ import annotations

import argparse
import warnings

import pytest

from feedmux.apps.cli import build_parser, main


def _serve_parser() -> argparse.ArgumentParser:
    commands = next(action for action in build_parser()._actions
                    if isinstance(action, argparse._SubParsersAction))
    return commands.choices["serve"]


@pytest.mark.parametrize("argv", [
    ["--log-level", "debug", "stats", "tcp://127.0.0.1:1"],
    ["stats", "tcp://127.0.0.1:1", "--log-level", "DEBUG"],  # before: "unrecognized arguments"
    ["serve", "mydata:make_mux", "--log-level", "DEBUG"],
    ["--log-level", "WARNING", "serve", "--log-level", "debug", "mydata:make_mux"],
    ["keygen", "keys", "--log-level", "DEBUG"],
    ["demo", "--log-level", "DEBUG"],
])
def test_log_level_is_taken_before_or_after_any_command(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).log_level == "DEBUG"


def test_a_command_without_log_level_keeps_the_one_given_before() -> None:
    args = build_parser().parse_args(["--log-level", "ERROR", "ping", "tcp://127.0.0.1:1"])
    assert args.log_level == "ERROR"
    assert build_parser().parse_args(["ping", "tcp://127.0.0.1:1"]).log_level == "INFO"


def test_an_unknown_log_level_is_a_parse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--log-level", "LOUD", "ping", "tcp://127.0.0.1:1"])
    assert caught.value.code == 2
    error = capsys.readouterr().err
    # Before: a ValueError traceback from logging.basicConfig.
    assert "argument --log-level: expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL, " \
           "got 'LOUD'" in error
    assert "Traceback" not in error


def test_serve_help_is_in_groups_and_every_option_says_its_default() -> None:
    serve = _serve_parser()
    titles = [group.title for group in serve._action_groups]
    for title in ("the basics", "several trainers and DDP", "reliability and resume",
                  "consumer groups", "performance", "security", "observability"):
        assert title in titles
    for action in serve._actions:
        if action.option_strings and action.dest != "help":
            assert "default" in (action.help or ""), action.option_strings
    basics = next(group for group in serve._action_groups if group.title == "the basics")
    assert {action.dest for action in basics._group_actions} >= {"source", "bind", "epochs"}


def test_min_trainers_help_says_its_real_default() -> None:
    action = next(a for a in _serve_parser()._actions if a.dest == "min_trainers")
    # Before: "(default 0)", while the server logged "waiting for 1 trainer(s)".
    assert action.default == 1 and "default 1" in (action.help or "")


@pytest.mark.parametrize(("argv", "said"), [
    (["stats", "127.0.0.1:5556"], "got '127.0.0.1:5556': add tcp:// (tcp://127.0.0.1:5556)"),
    (["ping", "localhost:5556"], "add tcp://"),
    (["top", "tcp://127.0.0.1:1", "127.0.0.1:2", "--count", "1"], "add tcp://"),
    (["stats", "http://127.0.0.1:5556"], "starting with tcp://, ipc:// or inproc://"),
])
def test_an_address_without_a_scheme_is_one_line_saying_to_add_it(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: a raw ZMQError traceback ("Invalid argument (addr='127.0.0.1:5556')").
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert said in error and "Traceback" not in error
    assert error.count("\n") == 1


def test_keygen_into_an_unwritable_place_is_one_line(
        tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keygen", "/proc/feedmux-no-such-place"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("feedmux keygen: error: ") and "Traceback" not in error


def test_reliable_is_one_warning_line_saying_it_does_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    # The server's options are refused after the flag was read: nothing is served here.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the line says it; no DeprecationWarning on top
        assert main(["serve", "m:a", "--reliable", "--group-buffer", "lots"]) == 2
    said = capsys.readouterr().err.splitlines()
    assert said[0].startswith("feedmux serve: warning: --reliable is deprecated and does "
                              "nothing: every free trainer gets every sample of an epoch "
                              "exactly once by default")
    assert [line for line in said if "warning" in line] == said[:1]

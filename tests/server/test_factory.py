"""Resolving MODULE:ATTR (and objects) into a streamer."""

from __future__ import annotations

import pytest

import feedmux
from feedmux.errors import FactoryError
from feedmux.server.factory import parse_factory_args, resolve_source


def make(n: int = 3, name: str = "x") -> feedmux.Streamer[str]:
    return feedmux.Streamer([f"{name}{i}" for i in range(n)])


def broken() -> feedmux.Streamer[int]:
    raise RuntimeError("no data here")


def test_a_factory_gets_its_keyword_arguments() -> None:
    streamer = resolve_source(f"{__name__}:make", {"n": 2, "name": "y"})
    assert list(streamer) == ["y0", "y1"]


def test_objects_and_callables_are_accepted() -> None:
    streamer = make()
    assert resolve_source(streamer) is streamer
    assert list(resolve_source(make, {"n": 1})) == ["x0"]


@pytest.mark.parametrize(
    ("source", "kwargs", "message"),
    [
        ("nope", None, "expected MODULE:ATTR"),
        ("no_such_module_abc:x", None, "cannot import module 'no_such_module_abc'"),
        (f"{__name__}:missing", None, "has no attribute 'missing'"),
        (f"{__name__}:broken", None, "factory .* raised RuntimeError: no data here"),
        (f"{__name__}:make", {"bogus": 1}, "raised TypeError"),
        ("feedmux:Streamer", None, "is a streamer class, not a streamer"),
        ("math:pi", None, "expected a feedmux Streamer or mux"),
        ("math:pi", {"a": 1}, "is not callable, so it takes no arguments"),
    ],
)
def test_failures_name_what_was_looked_up(source: str, kwargs: dict[str, int] | None,
                                          message: str) -> None:
    with pytest.raises(FactoryError, match=message):
        resolve_source(source, kwargs)


def test_arguments_parse_as_json_or_strings() -> None:
    assert parse_factory_args(["a=[1, 2]", "b=null", "c=hello world", "d="]) == {
        "a": [1, 2], "b": None, "c": "hello world", "d": "",
    }
    with pytest.raises(FactoryError, match="expected --arg KEY=VALUE"):
        parse_factory_args(["novalue"])
    with pytest.raises(FactoryError, match="expected --arg KEY=VALUE"):
        parse_factory_args(["1x=2"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"workers": 0}, "expected workers N >= 1, 'auto'.*got 0"),
        ({"on_error": "ignore"}, "expected on_error 'raise' or 'skip', got 'ignore'"),
        ({"hwm": 0}, "expected hwm >= 1"),
        ({"epochs": 0}, "expected epochs None or >= 1"),
        ({"min_trainers": -1}, "expected min_trainers >= 0"),
    ],
)
def test_server_settings_are_checked_with_their_names(options: dict[str, object],
                                                      message: str) -> None:
    with pytest.raises(feedmux.ConfigurationError, match=message):
        feedmux.Server(make(), **options)
    assert issubclass(feedmux.ConfigurationError, ValueError)

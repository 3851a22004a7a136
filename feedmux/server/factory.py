"""Resolve what ``feedmux serve`` was asked to run into a streamer.

A source is given as a ``"package.module:attr"`` string (the command line's
form, and the one worker processes can re-import), as a streamer or mux
object, a map-style dataset (served as it is:
:func:`~feedmux.sampling.datasets.from_dataset`), or as a callable returning
one of those (a torch ``Dataset`` class is one). Every failure is a
:class:`~feedmux.errors.FactoryError` whose one-line message names what was
looked up and why it failed. This module never touches a socket.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from feedmux.errors import FactoryError, SamplingError
from feedmux.sampling.datasets import dataset_of, from_dataset, is_map_dataset
from feedmux.sampling.epochs import is_streamer

__all__ = ["Source", "parse_factory_args", "resolve_source"]

#: What a server can be asked to run.
Source = Any  # a streamer/mux, a dataset, a callable returning one, or "module:attr"


def parse_factory_args(pairs: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are JSON when they parse, strings otherwise.

    Examples
    --------
    >>> parse_factory_args(["n_files=3", "name=train", "rate=0.5", "flag=true"])
    {'n_files': 3, 'name': 'train', 'rate': 0.5, 'flag': True}
    """
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.isidentifier():
            raise FactoryError(
                f"expected --arg KEY=VALUE with KEY a Python identifier, got {pair!r}"
            )
        try:
            parsed[key] = json.loads(text)
        except ValueError:
            parsed[key] = text
    return parsed


def _import_attr(spec: str) -> Any:
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise FactoryError(f"expected MODULE:ATTR (e.g. 'mypkg.data:make_mux'), got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as error:
        raise FactoryError(_import_failure(module_name, spec, error)) from error
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise FactoryError(
                f"module {module_name!r} has no attribute {attr_path!r} (from {spec!r})"
            ) from None
    return obj


def _import_failure(module_name: str, spec: str, error: Exception) -> str:
    """Why ``module_name`` did not import: not found (and where it was looked for), or
    found but failing inside (the error it raised)."""
    head = f"cannot import module {module_name!r} (from {spec!r}): {type(error).__name__}: {error}"
    missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    if missing is None or not (module_name == missing or module_name.startswith(missing + ".")):
        return head  # the module was found: something it imports or runs failed
    places = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    shown = ", ".join(places[:_SHOWN_PATHS]) + (
        f" and {len(places) - _SHOWN_PATHS} more" if len(places) > _SHOWN_PATHS else "")
    return (f"{head}; looked in {shown} (the current directory is {os.getcwd()}: run from "
            "the folder that holds it, or add its folder to PYTHONPATH)")


#: How many entries of the import path an import error lists.
_SHOWN_PATHS = 6


def resolve_source(source: Source, kwargs: Mapping[str, Any] | None = None,
                   shuffle: bool = True) -> Any:
    """Turn ``source`` into a streamer, calling it with ``kwargs`` if it is a factory.

    A map-style dataset (``__len__`` and ``__getitem__``) becomes a
    :class:`~feedmux.sampling.datasets.DatasetStreamer`: epochs are
    permutations of its indices (in order with ``shuffle=False``).

    Parameters
    ----------
    source : str, streamer, dataset or callable
        ``"module:attr"``, a Streamer/mux, a map-style dataset, or a callable
        returning one (a torch ``Dataset`` class: called with ``kwargs``).
    kwargs : mapping, optional
        Keyword arguments for the factory. Giving them for a non-callable is an error.
    shuffle : bool
        False keeps a dataset's indices in order (``--no-shuffle``); refused
        for a streamer or mux, whose order is its own.

    Examples
    --------
    >>> resolve_source("feedmux:Streamer")
    Traceback (most recent call last):
    ...
    feedmux.errors.FactoryError: 'feedmux:Streamer' is a streamer class, not a streamer: ...
    >>> resolve_source(lambda: list("abc"), shuffle=False)
    DatasetStreamer(<list of 3>, shuffle=False)
    """
    label = source if isinstance(source, str) else repr(source)
    obj = _import_attr(source) if isinstance(source, str) else source
    kwargs = dict(kwargs or {})
    if isinstance(obj, type) and is_streamer_class(obj):
        raise FactoryError(
            f"{label!r} is a streamer class, not a streamer: expected an instance or a "
            "factory function returning one"
        )
    if not is_streamer(obj) and not is_map_dataset(obj) and callable(obj):
        factory: Callable[..., Any] = obj
        try:
            obj = factory(**kwargs)
        except Exception as error:
            raise FactoryError(
                f"factory {label!r} raised {type(error).__name__}: {error}"
            ) from error
    elif kwargs:
        raise FactoryError(f"{label!r} is not callable, so it takes no arguments; got {kwargs}")
    if is_map_dataset(obj):
        try:
            obj = from_dataset(obj)
        except SamplingError as error:
            raise FactoryError(f"{label!r} gave a dataset that cannot be served: {error}") from None
    if not is_streamer(obj):
        raise FactoryError(
            f"{label!r} gave {type(obj).__name__} {obj!r:.80}: expected a feedmux Streamer or "
            "mux, or a map-style dataset with __len__ and __getitem__ (wrap a generator "
            "function with feedmux.Streamer)"
        )
    if not shuffle:
        dataset = dataset_of(obj)
        if dataset is None:
            raise FactoryError(
                f"--no-shuffle (shuffle=False) keeps the order of a map-style dataset, but "
                f"{label!r} gave {obj!r:.80}, a streamer whose order is its own (seed it with "
                "random_state, or serve the dataset itself)")
        obj = dataset.ordered()
    return obj


def is_streamer_class(obj: type) -> bool:
    """Whether ``obj`` is a streamer class (a common slip: naming the class, not an instance)."""
    from feedmux.sampling.streamer import Streamer

    return issubclass(obj, Streamer)

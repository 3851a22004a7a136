"""The combination table beside ServerConfig: each rule, its engine, where it applies."""

from __future__ import annotations

import dataclasses
import pickle
import warnings

import pytest

from feedmux.server.config import ASKS, OFF, REFUSED, ServerConfig, disabled, refusal


def test_every_rule_names_asks_the_table_knows_and_gives_a_reason() -> None:
    for first, second in [*REFUSED, *OFF]:
        assert first in ASKS and second in ASKS and first != second
    for reason in [*REFUSED.values(), *OFF.values()]:
        assert len(reason) > 40 and not reason.endswith(".")  # a reason, in the message


@pytest.mark.parametrize(("first", "second"), list(REFUSED))
def test_each_refused_pair_is_refused_with_its_reason_in_either_order(
        first: str, second: str) -> None:
    for asked in ({first, second}, {second, first, "shm"}):
        message = refusal(asked)
        assert message is not None
        assert message.startswith(f"expected {ASKS[first]} or {ASKS[second]}, got both: ")
        assert message.endswith(REFUSED[(first, second)])


def test_what_no_rule_refuses_combines() -> None:
    refused = {frozenset(pair) for pair in REFUSED}
    for first in ASKS:
        for second in ASKS:
            if frozenset((first, second)) not in refused:
                assert refusal({first, second}) is None, (first, second)
    assert refusal(set()) is None and refusal(set(ASKS)) is not None


def test_a_switched_off_ask_says_why_only_alongside_its_pair() -> None:
    assert disabled({"groups", "shm"}, "shm") is None  # each member holds a cell of a run
    assert disabled({"shm"}, "shm") is None
    assert disabled({"groups"}, "shm") is None  # nothing asked for shm: nothing is off
    assert disabled({"groups", "shm"}, "groups") is None  # the first one stays on


def test_the_config_applies_the_table_to_its_options() -> None:
    assert ServerConfig(source="m:a", shm=True).asks == {"shm"}
    assert ServerConfig(source="m:a", group_buffer="8MiB", shm=False).asks == {"group_buffer"}
    assert ServerConfig(source="m:a", group_buffer=8).asks == {"group_buffer", "shm"}
    # Every server deals its free trainers by credit and acknowledgements: no option asks
    # for it, so the table has no word for it (it was "reliable", always asked).
    assert "reliable" not in ASKS and not ServerConfig(source="m:a", shm=False).asks


@pytest.mark.parametrize("reliable", [False, True])
def test_reliable_is_a_deprecated_no_op_whatever_its_value(reliable: bool) -> None:
    import feedmux

    said = r"reliable is deprecated and does nothing: .*exactly once by default"
    # Before, ServerConfig(reliable=True) said nothing (it was the field's default).
    with pytest.warns(DeprecationWarning, match=said) as caught:
        config = ServerConfig(source="m:a", reliable=reliable)
    assert config.reliable and "reliable" not in config.options()
    with pytest.warns(DeprecationWarning, match=said) as caught_too:
        server = feedmux.Server("m:a", reliable=reliable)
    assert server.config.reliable
    # Once each, where it was given.
    assert [warning.filename for warning in [*caught, *caught_too]] == [__file__] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not given: no warning, and reliable all the same
        assert feedmux.Server("m:a").config.reliable
        # Copies of a config (the server's own, a worker's) never warn again.
        assert dataclasses.replace(config, workers=2).reliable
        assert pickle.loads(pickle.dumps(config)) == config


def test_serve_given_reliable_warns_its_caller_once() -> None:
    import feedmux

    # It warned from inside feedmux.server, where Python's default filters hide it. The
    # source does not import: serve returns at once, having warned first.
    with pytest.warns(DeprecationWarning, match="reliable is deprecated") as caught:
        code = feedmux.serve("no_such_module_for_feedmux:source", reliable=True)
    assert code != 0
    assert [warning.filename for warning in caught] == [__file__]


def test_the_groups_buffer_has_a_memory_bound_by_default() -> None:
    assert ServerConfig(source="m:a").group_limits == (0, 64 << 20)
    assert ServerConfig(source="m:a", group_buffer=16).group_limits == (16, 0)
    assert ServerConfig(source="m:a", group_buffer="1MiB").group_limits == (0, 1 << 20)
    assert not ServerConfig(source="m:a").grouped  # groups open with the first that asks

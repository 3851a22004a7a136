"""Serving side of feedmux: the server process, its workers and its control logic.

The sampling library it runs (streamers, muxes, maps, epochs) lives in
:mod:`feedmux.sampling`, which never imports this package.
"""

"""Sampler side of feedmux: streamers, muxes and maps (pure) and the server (sockets)."""

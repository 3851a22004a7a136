"""feedmux on Ray: a fleet of sampler servers as Ray actors (``pip install feedmux[ray]``).

This package is the only part of feedmux that imports Ray; nothing outside it
imports this package, so feedmux itself never needs Ray. It owns the glue:
placing servers, restarting them, telling loaders where they are. Sampling,
delivery and the wire stay in the server, client and protocol layers.
"""

from __future__ import annotations

from feedmux.ray.fleet import FleetEndpoints, SamplerFleet

__all__ = ["FleetEndpoints", "SamplerFleet"]

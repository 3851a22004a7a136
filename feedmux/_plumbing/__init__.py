"""The plumbing the server and the trainers share: ZeroMQ sockets, CURVE, the
handshake watch and the same-host shared-memory pool.

Each module here wraps one mechanism and decides nothing about delivery: which
message goes where is the server's, what a trainer does with it the client's.
Nothing here imports ``feedmux.server`` or ``feedmux.client``.
"""

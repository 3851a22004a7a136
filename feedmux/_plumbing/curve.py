"""CURVE encryption and authentication for the public sockets (optional).

The server holds a key pair (a secret certificate file); trainers need its
public key. With a directory of allowed client certificates the server lets in
only those clients (a ZAP handler checks every connection); without one, any
client that knows the server's public key gets in — the server says so in its
log. Certificates are the files ``zmq.auth`` writes (``NAME.key`` public,
``NAME.key_secret`` secret); ``feedmux keygen`` makes them. This module never
touches message contents; CURVE costs about 3x on large messages and loses
zero-copy, so keep it for traffic that leaves a trusted host.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from feedmux.errors import ConfigurationError

__all__ = [
    "ClientCurve",
    "ServerCurve",
    "create_keys",
    "load_public_key",
]

log = logging.getLogger("feedmux.security")

_Z85_KEY_LENGTH = 40


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise ConfigurationError(
            "CURVE security was asked for, but this libzmq was built without it"
        )


def load_public_key(key: str | bytes) -> bytes:
    """A server's public key from a certificate file, or the 40-character Z85 key itself."""
    if isinstance(key, bytes):
        key = key.decode("ascii", "replace")
    if len(key) == _Z85_KEY_LENGTH and not os.path.exists(key):
        return key.encode("ascii")
    try:
        public, _ = zmq.auth.load_certificate(key)
    except (OSError, ValueError) as error:
        raise ConfigurationError(
            f"expected a certificate file or a 40-character Z85 public key, got {key!r}: {error}"
        ) from error
    return public


def _load_secret(path: str) -> tuple[bytes, bytes]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as error:
        raise ConfigurationError(f"cannot read the certificate {path!r}: {error}") from error
    if secret is None:
        raise ConfigurationError(
            f"expected a secret certificate (NAME.key_secret), got the public-only file {path!r}"
        )
    return public, secret


def create_keys(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Write a new key pair ``NAME.key`` / ``NAME.key_secret`` into ``directory``."""
    _require_curve()
    Path(directory).mkdir(parents=True, exist_ok=True)
    public_key, secret_key = zmq.curve_keypair()
    public = Path(directory) / f"{name}.key"
    secret = Path(directory) / f"{name}.key_secret"
    _write_certificate(public, 0o644, public_key, None)
    _write_certificate(secret, 0o600, public_key, secret_key)
    return public, secret


def _write_certificate(path: Path, mode: int, public: bytes, secret: bytes | None) -> None:
    """Write a certificate in ``zmq.auth``'s format, created with ``mode`` from the start.

    The secret file never exists with a wider mode, whatever the umask (the mode is
    set on the open descriptor before anything is written).
    """
    lines = ["#   ZeroMQ CURVE " + ("**Secret** " if secret else "Public ") + "Certificate",
             "", "metadata", "curve", f'    public-key = "{public.decode("ascii")}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(descriptor, mode)
        os.write(descriptor, ("\n".join(lines) + "\n").encode("ascii"))
    finally:
        os.close(descriptor)


@dataclass(frozen=True)
class ServerCurve:
    """A server's CURVE settings: its secret certificate and, optionally, who may connect."""

    secret_file: str
    clients_dir: str | None = None

    def start(self, context: zmq.Context[Any]) -> ThreadAuthenticator:
        """Start the ZAP handler of ``context`` (call once, before binding)."""
        _require_curve()
        if self.clients_dir is not None and not Path(self.clients_dir).is_dir():
            raise ConfigurationError(
                f"expected a directory of client certificates, got {self.clients_dir!r}"
            )
        authenticator = ThreadAuthenticator(context, log=logging.getLogger("feedmux.zap"))
        authenticator.start()
        if self.clients_dir is None:
            log.warning("CURVE without --curve-clients: any client that knows the server's "
                        "public key may connect")
            authenticator.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
        else:
            authenticator.configure_curve(domain="*", location=self.clients_dir)
        return authenticator

    def apply(self, socket: zmq.Socket[Any]) -> None:
        public, secret = _load_secret(self.secret_file)
        socket.curve_publickey = public
        socket.curve_secretkey = secret
        socket.curve_server = True


@dataclass(frozen=True)
class ClientCurve:
    """A client's CURVE settings: the server's public key and the client's own keys."""

    server_key: bytes
    public: bytes
    secret: bytes

    @classmethod
    def create(cls, server_key: str | bytes, certificate: str | None = None) -> ClientCurve:
        """From the server's public key and the client's secret certificate (None: a
        fresh key pair, enough when the server lets in any client)."""
        _require_curve()
        if certificate is None:
            public, secret = zmq.curve_keypair()
        else:
            public, secret = _load_secret(certificate)
        return cls(load_public_key(server_key), public, secret)

    def apply(self, socket: zmq.Socket[Any]) -> None:
        socket.curve_serverkey = self.server_key
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret

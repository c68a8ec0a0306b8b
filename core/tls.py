"""TLS for every listener and client: certificates and CA from PEM files, mTLS optional.

One :class:`TlsFiles` describes one side of one hop. A listener needs ``cert`` + ``key``;
with ``ca`` it also asks for and verifies client certificates (mTLS). A client verifies
the server against ``ca`` (the system's CAs when unset) and presents ``cert`` + ``key``
when given (mTLS). ``server_name`` overrides the name checked in the server's
certificate (default: the host dialled). The same object makes the grpcio credentials
and the ``ssl.SSLContext`` (aiohttp, asyncio, the load generator's HTTP client), so every process
checks certificates the same way.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathprobe.errors import ConfigError

if TYPE_CHECKING:
    import grpc


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str | None = None  # our certificate chain (PEM)
    key: str | None = None  # its private key (PEM)
    ca: str | None = None  # CA bundle that verifies the peer (PEM)
    server_name: str | None = None  # client side: name expected in the server's certificate
    #: where the values came from, for error messages (e.g. "--tls" or "--upstream-tls")
    flag: str = "--tls"

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ConfigError(f"{self.flag}-cert/{self.flag}-key: give both or neither")
        for name in ("cert", "key", "ca"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(f"{self.flag}-{name}: no such file {path!r}")

    @classmethod
    def from_env(
        cls,
        prefix: str,
        given: Mapping[str, str | None] | None = None,
        environ: Mapping[str, str] | None = None,
        flag: str = "--tls",
    ) -> TlsFiles:
        """``given`` (flags) > ``{prefix}_CERT``/``_KEY``/``_CA``/``_SERVER_NAME`` > unset."""
        env = os.environ if environ is None else environ
        given = given or {}
        values = {
            k: given.get(k) or env.get(f"{prefix}_{k.upper()}") or None for k in ("cert", "key", "ca", "server_name")
        }
        return cls(**values, flag=flag)

    # ------------------------------------------------------------------ listeners
    @property
    def serving(self) -> bool:
        return bool(self.cert)

    @property
    def mutual(self) -> bool:
        """A listener with a CA asks for (and requires) client certificates."""
        return self.serving and bool(self.ca)

    def server_context(self, alpn: tuple[str, ...] = ("h2", "http/1.1")) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert, self.key)  # type: ignore[arg-type]
        if self.ca:
            ctx.load_verify_locations(cafile=self.ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def grpc_server_credentials(self) -> grpc.ServerCredentials:
        import grpc

        return grpc.ssl_server_credentials(
            [(_read(self.key), _read(self.cert))],
            root_certificates=_read(self.ca) if self.ca else None,
            require_client_auth=self.mutual,
        )

    # ------------------------------------------------------------------ clients
    def client_context(self, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def grpc_channel_credentials(self) -> grpc.ChannelCredentials:
        import grpc

        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca) if self.ca else None,
            private_key=_read(self.key) if self.key else None,
            certificate_chain=_read(self.cert) if self.cert else None,
        )

    def grpc_options(self) -> list[tuple[str, str | int]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _read(path: str | None) -> bytes:
    try:
        return Path(path or "").read_bytes()
    except OSError as exc:
        raise ConfigError(f"TLS file {path!r}: {exc.strerror}") from None


def grpc_channel(
    target: str, tls: TlsFiles | None, options: Sequence[tuple[str, str | int]] | None = None, aio: bool = False
) -> Any:
    """A grpcio channel to ``target``: TLS when ``tls`` is given, else plaintext."""
    import grpc
    import grpc.aio

    opts = list(options or [])
    if tls is None:
        return (grpc.aio.insecure_channel if aio else grpc.insecure_channel)(target, options=opts)
    opts += tls.grpc_options()
    make = grpc.aio.secure_channel if aio else grpc.secure_channel
    return make(target, tls.grpc_channel_credentials(), options=opts)


def add_port(server: Any, address: str, tls: TlsFiles | None) -> int:
    """Bind a grpcio (sync or aio) server: TLS when ``tls`` serves, else plaintext."""
    bound: int = (
        server.add_secure_port(address, tls.grpc_server_credentials())
        if tls is not None and tls.serving
        else server.add_insecure_port(address)
    )
    return bound

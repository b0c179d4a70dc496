"""The one place the Python client opens connections to a hub.

Every client (``StoreClient``, ``GradClient``, ``Learner``,
``AggregatorClient``, ``ARSWorker``, weight sync) gets its gRPC channel from
:func:`channel`, and the data plane (``rlhub._bulk``) its TLS settings and
token from :func:`default_security`, so TLS, the bearer token and message
limits are configured once.

What to connect with is a :class:`Security`: passed explicitly, set for the
process with :func:`configure`, or read from the environment variables the
``rlhub`` command line reads too::

    RLHUB_TLS_CA           PEM CA that signs the hub's certificate: use TLS
    RLHUB_TLS_CERT/KEY     this client's certificate and key (mutual TLS)
    RLHUB_TLS_SERVER_NAME  name to check the hub's certificate against
    RLHUB_TOKEN_FILE       file holding the token (or RLHUB_TOKEN, the token)

With none of them set a channel is plaintext with no token: what a hub on
loopback without a token file expects.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
import threading
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc

DEFAULT_MAX_MSG_BYTES = 16 << 20
"""Message limit in each direction (the Go seam's dial.DefaultMaxMsgBytes)."""

BULK_ALPN = "rlhub-dp/2"
"""TLS application protocol of the data plane (Go: bulk.ALPN)."""


@dataclasses.dataclass(frozen=True)
class Security:
    """How to reach a hub: TLS files and a bearer token (all optional)."""

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    server_name: Optional[str] = None
    token: Optional[str] = None

    @classmethod
    def from_env(cls) -> "Security":
        """Reads the RLHUB_* variables (see the module doc)."""
        token = os.environ.get("RLHUB_TOKEN") or None
        path = os.environ.get("RLHUB_TOKEN_FILE")
        if token is None and path:
            token = read_token(path)
        return cls(ca=os.environ.get("RLHUB_TLS_CA") or None, cert=os.environ.get("RLHUB_TLS_CERT") or None,
                   key=os.environ.get("RLHUB_TLS_KEY") or None,
                   server_name=os.environ.get("RLHUB_TLS_SERVER_NAME") or None, token=token)

    @property
    def tls(self) -> bool:
        return self.ca is not None or self.cert is not None

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        def read(p: Optional[str]) -> Optional[bytes]:
            if p is None:
                return None
            with open(p, "rb") as f:
                return f.read()
        if (self.cert is None) != (self.key is None):
            raise ValueError("rlhub: a client certificate needs both cert and key")
        return grpc.ssl_channel_credentials(root_certificates=read(self.ca), private_key=read(self.key),
                                            certificate_chain=read(self.cert))

    def bulk_context(self) -> ssl.SSLContext:
        """An SSL context for the data plane (ALPN ``rlhub-dp/2``)."""
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None:
            ctx.load_cert_chain(self.cert, self.key)
        ctx.set_alpn_protocols([BULK_ALPN])
        return ctx


def read_token(path: str) -> str:
    """The token in a file (surrounding white space ignored)."""
    with open(path, "r", encoding="utf-8") as f:
        tok = f.read().strip()
    if not tok or any(c.isspace() for c in tok):
        raise ValueError(f"rlhub: token file {path} must hold one token")
    return tok


_mu = threading.Lock()
_default: Optional[Security] = None


def configure(security: Optional[Security]) -> None:
    """Sets the process-wide :class:`Security` every client uses from now on
    (``None`` goes back to the environment)."""
    global _default
    with _mu:
        _default = security


def default_security() -> Security:
    """The :func:`configure`'d Security, else one read from the environment."""
    with _mu:
        d = _default
    return d if d is not None else Security.from_env()


def channel(addr: str, options: Optional[Sequence[Tuple[str, Any]]] = None,
            security: Optional[Security] = None) -> grpc.Channel:
    """A gRPC channel to ``addr``: TLS when ``security`` (default
    :func:`default_security`) names a CA or certificate, the token on every
    call, message limits of ``DEFAULT_MAX_MSG_BYTES`` unless ``options``
    set them."""
    sec = security if security is not None else default_security()
    opts: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", DEFAULT_MAX_MSG_BYTES),
                                   ("grpc.max_send_message_length", DEFAULT_MAX_MSG_BYTES)]
    given = dict(options or ())
    opts = [(k, given.pop(k, v)) for k, v in opts] + list(given.items())
    if sec.tls:
        if sec.server_name:
            opts.append(("grpc.ssl_target_name_override", sec.server_name))
        ch = grpc.secure_channel(addr, sec.grpc_credentials(), options=opts)
    else:
        ch = grpc.insecure_channel(addr, options=opts)
    if sec.token:
        ch = grpc.intercept_channel(ch, _TokenInterceptor(sec.token))
    return ch


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Metadata = Tuple[Tuple[str, Union[str, bytes]], ...]


class _Details(grpc.ClientCallDetails):
    def __init__(self, d: grpc.ClientCallDetails, metadata: _Metadata):
        self.method = d.method
        self.timeout = d.timeout
        self.metadata = metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call (plaintext or
    TLS alike; the Go seam does the same)."""

    def __init__(self, token: str):
        self._md = ("authorization", "Bearer " + token)

    def _details(self, d: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _Details(d, tuple(d.metadata or ()) + (self._md,))

    def intercept_unary_unary(self, continuation: Callable[[grpc.ClientCallDetails, _Req], _Resp],
                              client_call_details: grpc.ClientCallDetails, request: _Req) -> _Resp:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Callable[[grpc.ClientCallDetails, _Req], _Resp],
                               client_call_details: grpc.ClientCallDetails, request: _Req) -> _Resp:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation: Callable[[grpc.ClientCallDetails, Iterator[_Req]], _Resp],
                               client_call_details: grpc.ClientCallDetails,
                               request_iterator: Iterator[_Req]) -> _Resp:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation: Callable[[grpc.ClientCallDetails, Iterator[_Req]], _Resp],
                                client_call_details: grpc.ClientCallDetails,
                                request_iterator: Iterator[_Req]) -> _Resp:
        return continuation(self._details(client_call_details), request_iterator)

"""Mutual TLS: a server with `server.tls_client_ca_path` serves a client whose certificate that
CA signed and refuses, at the handshake, one without a certificate or with another CA's.

The certificates are the committed test set `server/tests/fixtures/tls/` (its README), shared
with the Rust and Node tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Optional

import pytest

import sepp

from conftest import REPO, Server, start_server

FIXTURES = REPO / "server" / "tests" / "fixtures" / "tls"


def pem(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server over TLS for `localhost` that asks for a certificate signed by client-ca.pem."""
    paths = {
        "tls_cert_path": FIXTURES / "server.pem",
        "tls_key_path": FIXTURES / "server.key",
        "tls_client_ca_path": FIXTURES / "client-ca.pem",
    }
    s = start_server(
        tmp_path_factory.mktemp("mtls"),
        "[server]\n" + "".join(f"{k} = {json.dumps(str(v))}\n" for k, v in paths.items()),
    )
    yield s
    s.stop()


async def connect(
    server: Server, cert: Optional[bytes] = None, key: Optional[bytes] = None
) -> sepp.SeppClient:
    return await sepp.SeppClient.connect(
        f"https://{server.addr}",
        tls=sepp.TlsOptions(
            ca_pem=pem("server.pem"),
            domain="localhost",
            client_cert_pem=cert,
            client_key_pem=key,
        ),
        rpc_timeout=timedelta(seconds=10),
        retry_policy=None,
    )


async def test_a_client_certificate_signed_by_the_client_ca_is_served(
    mtls_server: Server,
) -> None:
    async with await connect(mtls_server, pem("client.pem"), pem("client.key")) as client:
        ack = await client.enqueue(sepp.EnqueueRequest("mtls", "t"))
        job = await client.get_job(ack.job_id)
        assert job.queue == "mtls"


async def test_a_client_without_a_certificate_is_refused_with_transport_error(
    mtls_server: Server,
) -> None:
    with pytest.raises(sepp.TransportError) as caught:
        await connect(mtls_server)
    assert caught.value.code == "TRANSPORT"


async def test_a_certificate_of_another_ca_is_refused_with_transport_error(
    mtls_server: Server,
) -> None:
    with pytest.raises(sepp.TransportError):
        await connect(mtls_server, pem("other-client.pem"), pem("other-client.key"))


async def test_a_client_certificate_without_its_key_is_invalid_config(
    mtls_server: Server,
) -> None:
    with pytest.raises(sepp.InvalidConfigError, match="client_key_pem"):
        await connect(mtls_server, cert=pem("client.pem"))

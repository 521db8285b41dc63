"""The operator's API client against an in-process HTTP server answering as the API server does:
the pod log read (plain text, or a Status object when it fails) and errors that are not JSON."""

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from gymkube_operator.kube import KubeClient, KubeError

pytestmark = pytest.mark.unit

LOG = 'step 1\ngymkube-progress {"step": 1}\n'


async def pod_log(request: web.Request) -> web.Response:
    namespace, pod = request.match_info["namespace"], request.match_info["pod"]
    if pod == "pending":
        status = {
            "kind": "Status",
            "status": "Failure",
            "message": f'pod "{pod}" in namespace "{namespace}" has no host assigned',
            "code": 400,
        }
        return web.json_response(status, status=400)
    return web.Response(text=f"{namespace}/{pod} {dict(request.query)}\n{LOG}")


async def plain_failure(_: web.Request) -> web.Response:
    return web.Response(text="upstream connect error", status=503)


@pytest.fixture
async def client() -> AsyncIterator[KubeClient]:
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{namespace}/pods/{pod}/log", pod_log)
    app.router.add_get("/api/v1/namespaces/{namespace}/configmaps/{name}", plain_failure)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        yield KubeClient(session, str(server.make_url("")), "test")


async def test_pod_log_reads_the_tail_of_one_container(client: KubeClient) -> None:
    text = await client.pod_log("rl", "run-train-x1", "trainer", 2000)
    first, rest = text.split("\n", 1)
    assert first == "rl/run-train-x1 {'container': 'trainer', 'tailLines': '2000'}"
    assert rest == LOG


async def test_a_refused_log_read_raises_with_the_api_servers_message(client: KubeClient) -> None:
    with pytest.raises(
        KubeError, match='400: pod "pending" in namespace "rl" has no host'
    ) as error:
        await client.pod_log("rl", "pending", "trainer", 10)
    assert error.value.status == 400


async def test_an_error_that_is_not_json_is_still_a_kube_error(client: KubeClient) -> None:
    with pytest.raises(KubeError, match="503: upstream connect error"):
        await client.get("v1", "ConfigMap", "rl", "cm")

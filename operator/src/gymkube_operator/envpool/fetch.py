"""One GET of an env server's page for the watchdog, its failures named as probe failures (both
probes use it: gymkube's /status and an OpenEnv server's /health)."""

import aiohttp

from gymkube_operator.envpool.models import WatchdogSpec
from gymkube_operator.envpool.watchdog import Failure, Probe


async def get_page(
    session: aiohttp.ClientSession, base_url: str, path: str, policy: WatchdogSpec
) -> tuple[str, Probe | None]:
    """The body of GET base_url+path, or the failed Probe that says why there is none."""
    timeout = aiohttp.ClientTimeout(total=policy.probe_timeout_seconds)
    try:
        async with session.get(f"{base_url}{path}", timeout=timeout) as response:
            if response.status != 200:
                return "", Probe(Failure.BAD_STATUS, f"{path} answered HTTP {response.status}")
            return await response.text(), None
    except TimeoutError:
        message = f"{path} gave no answer in {policy.probe_timeout_seconds}s"
        return "", Probe(Failure.NO_ANSWER, message)
    except aiohttp.ClientError as error:
        return "", Probe(Failure.NO_ANSWER, f"{path} failed: {type(error).__name__}: {error}")

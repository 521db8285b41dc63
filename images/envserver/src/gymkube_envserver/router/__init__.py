"""``gymkube-router``: one URL for a pool of env servers (see ``app`` for the entry point).

- ``app``: the aiohttp server, dispatch and the HTTP session endpoints.
- ``pool``: backends, their polled load, placement and the session ids that name a backend.
- ``upstream``: keep-alive HTTP/1.1 connections to the env servers.
- ``metrics``: the router's Prometheus metrics.
- ``settings``: ``GYMKUBE_ROUTER_*`` settings and CLI flags.
- ``endpoints``: which paths the router serves itself and which it routes by session.
"""

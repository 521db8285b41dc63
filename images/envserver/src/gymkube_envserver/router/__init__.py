"""``gymkube-router``: one URL for a pool of env servers (``cli`` is the entry point).

- ``cli``: the entry point: settings, the aiohttp server, signals.
- ``app``: dispatch, the HTTP session endpoints and WebSocket placement.
- ``bodies``: request bytes to a backend; session ids spliced into bodies.
- ``status``: the router's ``/status``.
- ``tunnel``: one WebSocket tunnelled to its backend.
- ``pool``: backends, their polled load, placement and the session ids that name a backend.
- ``upstream``: keep-alive HTTP/1.1 connections to the env servers.
- ``metrics``: the router's Prometheus metrics.
- ``settings``: ``GYMKUBE_ROUTER_*`` settings and CLI flags.
- ``endpoints``: which paths the router serves itself and which it routes by session.
"""

"""The HTTP app: audio.cpp-shaped API over the runtime.

Starlette on anyio, served by ``server.http.listener``.
"""

"""The HTTP surface of the `tinker` SDK: FastAPI routes (`app`), API keys (`auth`) and bounded
request bodies (`http_body`). Turns protocol errors into the SDK's error shape.

May import `server.service` and everything below it; not `distributed` or `entrypoints`.
"""

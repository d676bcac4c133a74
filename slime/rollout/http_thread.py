"""An ASGI app served by uvicorn in a daemon thread: how the embedded engine and our router run
inside their Ray actors (and inside test processes) on 127.0.0.1."""
from __future__ import annotations

import socket
import threading
import time
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ThreadedServer:
    def __init__(self, app: Any, host: str, port: int | None, name: str):
        import uvicorn

        self.host, self.port, self.name = host, port or free_port(host), name
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name=name)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"{self.name} did not start on {self.url}")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

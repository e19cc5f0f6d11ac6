"""The fresh-interpreter servers this pytest process started end with its session (before the suite's check of its
temporary directory: a server's torch may hold a folder there until it exits), not only at interpreter exit."""

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    from torch_serial_testing.paths.forkserver import shutdown

    shutdown()

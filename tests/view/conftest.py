"""A real headless Chromium for the live view's tests (fixture ``browser``).

Debian's ``chromium`` and ``chromium-driver`` (``deploy/setup.sh`` installs them where
apt-get is available), driven with selenium. A missing browser fails the test when ``CI``
is set (a CI run must never pass by skipping its browser test) and skips it elsewhere,
like a missing Kafka broker (``tests/conftest.py``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

from tests.conftest import in_ci


def _missing_browser(reason: str) -> NoReturn:
    if in_ci():
        pytest.fail(f"no headless browser for tests/view: {reason}", pytrace=False)
    pytest.skip(f"no headless browser: {reason} (bash deploy/setup.sh installs one)")


def _find(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium WebDriver, always quit at the end of the test."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing_browser("selenium is not installed (pip install -e '.[dev]')")
    chromium = _find("chromium", "chromium-browser", "google-chrome")
    driver_path = _find("chromedriver")
    if chromium is None or driver_path is None:
        _missing_browser("`chromium` or `chromedriver` is not on PATH")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--window-size=1280,1600"):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium refuses to sandbox as root
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    except Exception as exc:  # the browser is there but does not start: a real failure
        pytest.fail(f"headless chromium did not start: {exc}", pytrace=False)
    try:
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()

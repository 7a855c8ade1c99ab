"""Fixtures of the job-queue tests."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from jobs_helpers import CHROMEDRIVER, CHROMIUM


@pytest.fixture
def data_root(tmp_path) -> Path:
    """An empty folder the server may read data from (its real path)."""
    root = tmp_path / "data"
    root.mkdir()
    return root.resolve()

@pytest.fixture
def browser():
    """Debian's headless Chromium driven by Selenium (nothing downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="trainforge-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)  # with the driver path below, Selenium Manager downloads nothing
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)

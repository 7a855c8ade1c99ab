"""Debian's headless Chromium driven by Selenium, for the tests that load pages in a real browser (the job
dashboard, the `runs compare` page). Nothing is downloaded: the browser and its driver are the system's."""
from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_MISSING = None if CHROMIUM.exists() and CHROMEDRIVER.exists() else (
    "needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver); "
    "as root, `make test` installs them (scripts/test-system-packages.sh)")


@contextmanager
def headless_chromium() -> Iterator:
    """A Selenium driver of a fresh headless Chromium profile, quit and removed afterwards."""
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

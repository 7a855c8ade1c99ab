"""The dashboard in headless Chromium (Debian's chromium + chromedriver, driven by Selenium): submit a job
through the page's form, watch it reach `succeeded`, and see its loss curve drawn as an SVG path."""
from __future__ import annotations

import pytest

from jobs_helpers import CHROMIUM_MISSING, QUICK, LiveServer, make_service

pytestmark = pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")


@pytest.mark.slow
def test_submit_through_the_page_and_watch_the_curves(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with LiveServer(make_service(tmp_path, "cpu:2")) as server:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 120, poll_frequency=0.3)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#recipe option[value="digits_cnn"]'))  # from /api/recipes
        Select(browser.find_element(By.ID, "recipe")).select_by_value("digits_cnn")
        browser.find_element(By.ID, "overrides").send_keys("\n".join(QUICK))
        browser.find_element(By.ID, "max_restarts").clear()
        browser.find_element(By.ID, "max_restarts").send_keys("1")
        browser.find_element(By.ID, "submit").click()
        wait.until(lambda d: d.find_element(By.ID, "submit-status").get_attribute("data-job-id") == "1")
        assert server.service.store.get(1).max_restarts == 1  # the form's fields reached the job

        # the table refreshes itself: the row appears, then turns succeeded
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#jobs tr[data-job-id="1"][data-state="succeeded"]'))
        row = browser.find_element(By.CSS_SELECTOR, '#jobs tr[data-job-id="1"]')
        assert "20/20" in row.text and "cpu0" in row.text

        row.find_element(By.LINK_TEXT, "1").click()
        wait.until(lambda d: d.find_element(By.ID, "job-state").text == "succeeded")
        path = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '#chart-loss path.series[data-series="train loss"]'))
        assert int(path.get_attribute("data-points")) >= 5  # train rows every 2 of 20 steps
        assert path.get_attribute("d").count("L") >= 4
        metric = browser.find_element(By.CSS_SELECTOR, '#chart-metric path.series[data-series="val accuracy"]')
        assert int(metric.get_attribute("data-points")) == 2  # evaluations at steps 10 and 20
        wait.until(lambda d: "test accuracy" in d.find_element(By.ID, "log").text)
        assert "max_steps: 20" in browser.find_element(By.ID, "config").text
        # issue 55: a CPU slot's memory is per slot, on the page and in the API's job document
        assert browser.find_element(By.ID, "job-memory-label").text == "memory per slot"
        assert server.service.view(server.service.get(1))["memory_per"] == "slot"
        assert not browser.find_element(By.ID, "val-images").is_displayed()  # a classifier draws no picture

        # a run with a validation picture (detection, segmentation write val_images.png) shows it, fetched with the
        # page's headers into a blob URL the page's CSP allows
        import numpy as np
        from PIL import Image

        run_dir = server.service.store.get(1).run_dir
        Image.fromarray(np.full((20, 30, 3), 200, np.uint8)).save(f"{run_dir}/val_images.png")
        browser.refresh()
        wait.until(lambda d: d.find_element(By.ID, "val-images").is_displayed())
        image = browser.find_element(By.ID, "val-images-img")
        wait.until(lambda d: d.execute_script("return arguments[0].naturalWidth", image) == 30)
        assert image.get_attribute("src").startswith("blob:")
        assert "step 20" in browser.find_element(By.ID, "val-images-step").text

        browser.get(server.url + "/gpus")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#slots tr[data-slot-id="cpu1"]'))
        assert "1024.0 MiB" in browser.find_element(By.ID, "slots").text

        # a bad submission shows the server's one-line reason on the page
        browser.get(server.url + "/")
        browser.find_element(By.ID, "overrides").send_keys("optim.lr=fast")
        browser.find_element(By.ID, "submit").click()
        wait.until(lambda d: "optim.lr: expected a number" in d.find_element(By.ID, "submit-status").text)

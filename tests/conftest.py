"""Shared fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def single_thread():
    """Small models run faster on one thread than on two cores shared with other work."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def numpy_print_defaults():
    """The examples set NumPy's print precision for their output; no test sees another test's setting."""
    import numpy as np

    saved = np.get_printoptions()
    yield
    np.set_printoptions(**saved)


def assert_picture(path, min_width: int = 200, min_height: int = 150, min_colours: int = 3) -> None:
    """A PNG that decodes, has a plausible size and shows something (not one flat colour): more than its
    first eight bytes."""
    import matplotlib.image
    import numpy as np

    image = matplotlib.image.imread(str(path))  # (H, W, C)
    height, width = image.shape[:2]
    assert width >= min_width and height >= min_height, (path, image.shape)
    colours = np.unique(image.reshape(-1, image.shape[-1] if image.ndim == 3 else 1), axis=0)
    assert len(colours) >= min_colours, (path, len(colours))


HEADLESS_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,1000"]


def headless_chromium(chromium: str, chromedriver: str):
    """A selenium driver on Debian's chromium with a throwaway profile (a generator: yield it from a fixture;
    the browser and its profile go when the fixture ends)."""
    import shutil
    import tempfile

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="lmforge-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*HEADLESS_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)

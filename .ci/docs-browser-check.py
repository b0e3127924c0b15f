"""Loads pages of the built site in headless Chromium; fails on console errors.

    python .ci/docs-browser-check.py out/site [SCREENSHOT_DIR]

Serves the site folder over a local HTTP server and opens, in Debian's
Chromium driven by selenium through Debian's chromedriver, the home page,
one Python reference page, one R reference page and two R articles (the
placement article and the keras3 multi-device guide). A page
fails when the browser's console has an error (a JavaScript error, a
resource that failed to load) or when the page has no title or no heading.
With SCREENSHOT_DIR, a screenshot of each page is written there.
"""

import contextlib
import functools
import http.server
import pathlib
import shutil
import sys
import threading

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

PAGES = (
    "index.html",
    "reference/python.html",
    "r/reference/placement_report.html",
    "r/articles/placement.html",
    "r/articles/multi-device-guide.html",
)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@contextlib.contextmanager
def serve(folder):
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-dev-shm-usage", "--window-size=1280,900",
                 "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)


def root_favicon(url):
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}/favicon.ico "


def check_page(driver, url):
    driver.get(url)
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete")
    # Scripts that run on load (pkgdown's, MkDocs Material's) have run now;
    # give deferred ones a moment, then read the console.
    driver.execute_script("return new Promise(r => setTimeout(r, 500))")
    problems = [
        f"console {entry['level']}: {entry['message']}"
        for entry in driver.get_log("browser")
        if entry["level"] in ("SEVERE", "ERROR")
        # The browser asks the server root for /favicon.ico by itself when
        # a page names no icon (pkgdown's): no page links it, and on a host
        # serving the site under a path it is not the site's to answer.
        and not entry["message"].startswith(root_favicon(url))
    ]
    if not driver.title.strip():
        problems.append("the page has no title")
    if not driver.find_elements(By.CSS_SELECTOR, "h1"):
        problems.append("the page has no h1 heading")
    return problems


def main(argv):
    site = pathlib.Path(argv[1]).resolve()
    shots = pathlib.Path(argv[2]).resolve() if len(argv) > 2 else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    failed = False
    with serve(site) as root:
        driver = browser()
        try:
            for page in PAGES:
                if not (site / page).is_file():
                    print(f"browser-check: {page}: not built", file=sys.stderr)
                    failed = True
                    continue
                problems = check_page(driver, root + page)
                if shots:
                    driver.save_screenshot(str(shots / (page.replace("/", "_") + ".png")))
                for problem in problems:
                    print(f"browser-check: {page}: {problem}", file=sys.stderr)
                failed |= bool(problems)
                if not problems:
                    print(f"browser-check: {page}: rendered, no console error")
        finally:
            driver.quit()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

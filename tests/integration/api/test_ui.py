"""The status page (GET /ui) in a real headless Chromium (Debian's chromium + chromedriver, via Selenium).

A person's view of the API: the page polls GET /jobs, shows the jobs and their split bars, and its buttons
pause, resume and throttle a job in the real registry behind a real server. No Spark or Kafka.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from source_backfill.api.app import create_app
from source_backfill.api.server import ApiServer
from source_backfill.config import JobSpec
from source_backfill.runtime.progress import JobProgress, LiveLatency, SplitProgress, TableProgress
from source_backfill.runtime.registry import JobRegistry
from tests.integration.api.conftest import SOURCES, TOKEN

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.select import Select  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (`apt-get install chromium chromium-driver`; "
           "make test installs them when root)",
)

#: Free text a job carries (its failure and its transform) that tries to run script if shown as HTML.
HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1200,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser, live_api) -> webdriver.Chrome:
    """The status page of a token-guarded server, with one job half backfilled; no token entered yet."""
    live_api.registry.create(JobSpec(name="orders-copy", source="events", sink_path="/t/oc"))
    live_api.registry.publish_progress("orders-copy", _progress())
    browser.get(f"{live_api.url}/ui")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    return browser


def _progress() -> JobProgress:
    return JobProgress(
        epoch=9, status="backfilling", rows_history=5300, rows_live=12, eta_seconds=125, splits=[
            SplitProgress("events:0", "backfilling", 4999, 9999, 5000, 5000),
            SplitProgress("events:1", "finished", 299, 299, 300, 0),
        ],
    )


def until(check: Callable[[], object], timeout_s: float = 60.0) -> object:
    """``check()``'s first truthy value, retried while the page re-renders; fails after ``timeout_s`` (a
    ceiling for a busy machine: a check that holds returns at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not true within {timeout_s}s: {check.__doc__ or check}")
        time.sleep(0.05)


def job(driver, name: str):
    return until(lambda: driver.find_elements(By.CSS_SELECTOR, f'section[data-job="{name}"]'))[0]


def enter_token(driver, token: str = TOKEN) -> None:
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "use-token").click()


def test_jobs_and_split_bars_render(page) -> None:
    assert page.find_element(By.ID, "auth").is_displayed()  # the daemon has a token: the page asks for it
    section = job(page, "orders-copy")
    assert section.find_element(By.CLASS_NAME, "name").text == "orders-copy"
    until(lambda: section.find_element(By.CLASS_NAME, "status").text == "backfilling")
    facts = section.find_element(By.CLASS_NAME, "facts").text
    assert "1/2 finished" in facts and "backfilling 1" in facts and "finished 1" in facts
    assert "ETA 2m 05s" in facts and "limit unlimited" in facts
    rows = section.find_elements(By.CSS_SELECTOR, "tr.split")
    assert [r.find_element(By.TAG_NAME, "td").text for r in rows] == ["events:0", "events:1"]
    bars = [r.find_element(By.TAG_NAME, "progress") for r in rows]
    assert [float(b.get_attribute("value")) for b in bars] == [0.5, 1.0]
    assert "50%" in rows[0].text and "100%" in rows[1].text
    # Without the token a mutation would be refused: the buttons say so instead of failing.
    pause = section.find_element(By.CLASS_NAME, "pause")
    assert not pause.is_enabled() and "token" in pause.get_attribute("title")


def test_pause_resume_and_throttle_with_the_token(page, live_api) -> None:
    registry = live_api.registry
    section = job(page, "orders-copy")
    enter_token(page)
    assert page.execute_script("return sessionStorage.getItem('source-backfill-token')") == TOKEN
    assert TOKEN not in page.current_url
    pause = section.find_element(By.CLASS_NAME, "pause")
    until(pause.is_enabled)

    pause.click()
    until(lambda: registry.get("orders-copy").paused)
    until(lambda: "paused" in section.find_element(By.CLASS_NAME, "status").text)
    time.sleep(1.5)  # the next poll, from GET /jobs, still shows it paused
    assert section.get_attribute("data-paused") == "true"
    assert "(paused)" in section.find_element(By.CLASS_NAME, "status").text

    section.find_element(By.CLASS_NAME, "resume").click()
    until(lambda: not registry.get("orders-copy").paused)
    until(lambda: section.get_attribute("data-paused") == "false")

    section.find_element(By.CLASS_NAME, "rate").send_keys("100")
    section.find_element(By.CLASS_NAME, "throttle").click()
    until(lambda: registry.get("orders-copy").rate_limit == 100)
    until(lambda: "limit 100 rows/s" in section.find_element(By.CLASS_NAME, "facts").text)
    section.find_element(By.CLASS_NAME, "rate").clear()
    section.find_element(By.CLASS_NAME, "throttle").click()  # empty: unlimited
    until(lambda: registry.get("orders-copy").rate_limit is None)
    assert page.find_element(By.ID, "message").text == ""


#: The page's ``GET jobs`` answered with the listing it got last (every other request goes through).
HOLD_LISTING = """
window.__fetch = window.fetch;
window.fetch = async (path, init) => {
  const listing = (!init || !init.method || init.method === "GET") && String(path).endsWith("jobs");
  if (!listing) return window.__fetch(path, init);
  if (window.__held === undefined) window.__held = await (await window.__fetch(path, init)).text();
  return new Response(window.__held, {status: 200, headers: {"Content-Type": "application/json"}});
};
"""


def test_api_errors_are_shown(page, live_api) -> None:
    section = job(page, "orders-copy")
    enter_token(page, "not-the-token")
    pause = section.find_element(By.CLASS_NAME, "pause")
    until(pause.is_enabled)
    pause.click()
    message = until(lambda: page.find_element(By.ID, "message").text)
    assert "401" in message and "missing or wrong bearer token" in message and "enter the token" in message
    assert not live_api.registry.get("orders-copy").paused

    page.find_element(By.ID, "forget-token").click()
    enter_token(page)
    # each of the two clicks re-renders the buttons once its poll answers (disabled without a token): a
    # click on "throttle" while the forget's render still holds it disabled does nothing
    until(section.find_element(By.CLASS_NAME, "throttle").is_enabled)
    section.find_element(By.CLASS_NAME, "rate").send_keys("-3")
    section.find_element(By.CLASS_NAME, "throttle").click()
    assert ">= 0" in until(lambda: page.find_element(By.ID, "message").text)
    # the page's polls keep seeing the job (its listing held), so the section stays while the job is
    # dropped under it: a busy machine may otherwise poll between the drop and the click
    page.execute_script(HOLD_LISTING)
    until(lambda: page.execute_script("return window.__held !== undefined"))
    live_api.registry.drop("orders-copy")  # gone under the page: the API's 404 is shown
    section.find_element(By.CLASS_NAME, "rate").clear()
    section.find_element(By.CLASS_NAME, "throttle").click()
    until(lambda: 'job "orders-copy" not found' in page.find_element(By.ID, "message").text)
    page.execute_script("window.fetch = window.__fetch")  # the listing as it is
    until(lambda: not page.find_elements(By.CSS_SELECTOR, "section.job"))  # the next poll drops it


def test_user_text_is_shown_as_text_and_never_run(browser, live_api) -> None:
    registry = live_api.registry
    registry.create(JobSpec(name="hostile", source="events", sink_path="/t/h",
                            transform=f"SELECT '{HOSTILE}' AS v FROM {{source}}"))
    registry.set_failed("hostile", HOSTILE)
    browser.get(f"{live_api.url}/ui")
    section = job(browser, "hostile")
    until(lambda: section.find_element(By.CLASS_NAME, "error").text == HOSTILE)
    assert HOSTILE in section.find_element(By.CLASS_NAME, "transform").text
    assert section.find_elements(By.TAG_NAME, "img") == []
    assert section.find_elements(By.TAG_NAME, "script") == []
    assert browser.execute_script("return window.pwned") is None
    assert section.find_element(By.CLASS_NAME, "retry").is_displayed()  # a failed job offers Retry


def test_guarded_reads_ask_for_the_token(browser, tmp_path: Path) -> None:
    registry = JobRegistry(tmp_path / "state", SOURCES)
    registry.create(JobSpec(name="secret-job", source="events", sink_path="/t/s"))
    server = ApiServer(create_app(registry, SecretStr(TOKEN), guard_reads=True), "127.0.0.1", 0)
    server.start()
    try:
        assert httpx.get(f"{server.url}/ui").status_code == 200  # the page itself holds no data
        browser.get(f"{server.url}/ui")
        browser.execute_script("sessionStorage.clear()")
        browser.refresh()
        status = until(lambda: browser.find_element(By.ID, "poll").text)
        assert "enter the token" in status
        assert not browser.find_elements(By.CSS_SELECTOR, "section.job")
        enter_token(browser)
        job(browser, "secret-job")
        until(lambda: browser.find_element(By.ID, "poll").text.startswith("updated"))
    finally:
        server.stop()
        registry.close()


def test_without_a_token_the_buttons_work_and_the_page_is_not_in_the_schema(browser, tmp_path: Path) -> None:
    registry = JobRegistry(tmp_path / "state", SOURCES)
    registry.create(JobSpec(name="open-job", source="events", sink_path="/t/o"))
    server = ApiServer(create_app(registry), "127.0.0.1", 0)
    server.start()
    try:
        response = httpx.get(f"{server.url}/ui")
        assert response.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert "/ui" not in httpx.get(f"{server.url}/openapi.json").json()["paths"]
        browser.get(f"{server.url}/ui")
        browser.execute_script("sessionStorage.clear()")
        section = job(browser, "open-job")
        assert not browser.find_element(By.ID, "auth").is_displayed()  # no token: no token box
        until(lambda: section.find_element(By.CLASS_NAME, "pause").is_enabled())
        section.find_element(By.CLASS_NAME, "pause").click()
        until(lambda: registry.get("open-job").paused)
    finally:
        server.stop()
        registry.close()


def test_a_table_job_shows_its_phase_vnodes_and_lag(page, live_api) -> None:
    spec = JobSpec(name="table-copy", source="events", sink_path="/t/tc", strategy="snapshot")
    live_api.registry.create(spec)
    live_api.registry.publish_progress("table-copy", JobProgress(
        epoch=3, status="backfilling", rows_history=100, rows_live=0,
        table=TableProgress("snapshot", "consuming_snapshot", 64, 256, 7, 7, 2, {"consuming_snapshot": 100})))
    section = job(page, "table-copy")
    until(lambda: "vnodes 64/256" in section.find_element(By.CLASS_NAME, "facts").text)
    facts = section.find_element(By.CLASS_NAME, "facts").text
    assert "snapshot: consuming_snapshot" in facts and "lag 2 versions" in facts and "splits" not in facts


def test_latency_percentage_paused_and_read_ahead_show_as_in_the_cli(page, live_api) -> None:
    # 98 % copied by a read ahead, nothing committed: the page said "backfilled -1, rows 0" beside it
    spec = JobSpec(name="lat", source="events", sink_path="/t/lat")
    live_api.registry.create(spec)
    live_api.registry.publish_progress("lat", JobProgress(
        epoch=4, status="backfilling", rows_history=0, rows_live=7, eta_seconds=None, progress=0.98,
        history_paused=True, rows_read_ahead=9800, splits=[
            SplitProgress("events:0", "backfilling", None, 9999, 0, 199, read_ahead_offset=9799,
                          rows_read_ahead=9800)],
        live_latency=LiveLatency(0.213, 0.84, 60.0, 7, "create_time")))
    section = job(page, "lat")
    until(lambda: "latency p50 0.21 s / p99 0.84 s" in section.find_element(By.CLASS_NAME, "facts").text)
    facts = section.find_element(By.CLASS_NAME, "facts").text
    assert "98.0% · paused" in facts and "ETA" not in facts and "read ahead)" in facts
    cells = [c.text for c in section.find_elements(By.CSS_SELECTOR, "tr.split td")]
    assert any("read ahead to" in c for c in cells) and any("read ahead)" in c for c in cells), cells


def test_a_job_reading_an_archive_shows_its_tiers_and_broker_bytes_as_in_the_cli(page, live_api) -> None:
    spec = JobSpec(name="tiered", source="events", sink_path="/t/tiered")
    live_api.registry.create(spec)
    live_api.registry.publish_progress("tiered", JobProgress(
        epoch=5, status="finished", rows_history=790, rows_live=0, splits=[],
        history_tiers={"archive": 390, "kafka": 400, "gap": 10, "loss": 0}, history_broker_bytes=12345))
    section = job(page, "tiered")
    until(lambda: "history from" in section.find_element(By.CLASS_NAME, "facts").text)
    facts = section.find_element(By.CLASS_NAME, "facts").text
    assert "history from archive 390, kafka 400, gap 10; 12,345 bytes from the broker" in facts, facts
    # a job that reads no archive shows no such line
    assert "history from" not in job(page, "orders-copy").find_element(By.CLASS_NAME, "facts").text


def _shown(driver) -> list[str]:
    """The jobs the page shows (sections of the namespaces filtered out are there, hidden)."""
    return sorted(s.get_attribute("data-job") for s in driver.find_elements(By.CSS_SELECTOR, "section.job")
                  if s.is_displayed())


def _create_in_namespaces(registry) -> None:
    for ns in ("team-a", "team-b"):
        registry.create(JobSpec(name=f"{ns}.orders", namespace=ns, source="events", sink_path=f"/t/{ns}"))


def test_the_namespace_filter_shows_one_namespaces_jobs_and_keeps_it_in_the_url(page, live_api) -> None:
    section = job(page, "orders-copy")
    # one namespace: neither a filter nor a tag to tell jobs apart
    assert not page.find_element(By.ID, "namespace-filter").is_displayed()
    assert not section.find_element(By.CLASS_NAME, "namespace").is_displayed()
    _create_in_namespaces(live_api.registry)
    until(lambda: _shown(page) == ["orders-copy", "team-a.orders", "team-b.orders"])
    until(lambda: page.find_element(By.ID, "namespace-filter").is_displayed())
    choice = Select(page.find_element(By.ID, "namespace"))
    assert [o.text for o in choice.options] == ["all", "default", "team-a", "team-b"]
    assert choice.first_selected_option.text == "all"
    tags = {s.get_attribute("data-job"): s.find_element(By.CLASS_NAME, "namespace").text
            for s in page.find_elements(By.CSS_SELECTOR, "section.job")}
    assert tags == {"orders-copy": "default", "team-a.orders": "team-a", "team-b.orders": "team-b"}

    choice.select_by_value("team-a")
    until(lambda: _shown(page) == ["team-a.orders"])
    assert page.current_url.endswith("/ui?namespace=team-a")
    time.sleep(1.5)  # the next polls keep to the filter
    assert _shown(page) == ["team-a.orders"]
    choice = Select(page.find_element(By.ID, "namespace"))
    choice.select_by_value("default")
    until(lambda: _shown(page) == ["orders-copy"])
    assert page.current_url.endswith("/ui?namespace=default")
    choice.select_by_visible_text("all")
    until(lambda: len(_shown(page)) == 3)
    assert page.current_url.endswith("/ui")
    assert TOKEN not in page.current_url


def test_the_namespace_in_the_url_is_chosen_on_load(browser, live_api) -> None:
    live_api.registry.create(JobSpec(name="orders-copy", source="events", sink_path="/t/oc"))
    _create_in_namespaces(live_api.registry)
    browser.get(f"{live_api.url}/ui?namespace=team-b")
    until(lambda: _shown(browser) == ["team-b.orders"])
    assert Select(browser.find_element(By.ID, "namespace")).first_selected_option.text == "team-b"
    assert len(browser.find_elements(By.CSS_SELECTOR, "section.job")) == 3  # the others kept, hidden
    # a namespace without jobs (yet): chosen all the same, and the page says it has none
    browser.get(f"{live_api.url}/ui?namespace=team-c")
    until(lambda: browser.find_element(By.ID, "empty").is_displayed())
    assert browser.find_element(By.ID, "empty").text == 'No jobs in namespace "team-c".'
    assert _shown(browser) == []
    assert Select(browser.find_element(By.ID, "namespace")).first_selected_option.text == "team-c"
    live_api.registry.create(JobSpec(name="team-c.x", namespace="team-c", source="events", sink_path="/t/c"))
    until(lambda: _shown(browser) == ["team-c.x"])
    assert not browser.find_element(By.ID, "empty").is_displayed()


#: Where the page's screenshots are kept (the checkout's var/, ignored by git), for a person to look at.
SCREENSHOTS = Path(__file__).resolve().parents[3] / "var" / "test-screenshots"


def _bar_fraction(section) -> float:
    """The job bar's drawn width over its track's, as the browser laid them out."""
    return section.find_element(By.CSS_SELECTOR, ".jobbar .fill").rect["width"] / \
        section.find_element(By.CLASS_NAME, "jobbar").rect["width"]


def _many_splits(n: int, done: int) -> list[SplitProgress]:
    return [SplitProgress(f"events:{i}", "finished" if i < done else "backfilling",
                          999 if i < done else 499, 999, 1000 if i < done else 500, 0 if i < done else 500)
            for i in range(n)]


def test_a_backfilling_and_a_finished_job_drawn_as_they_are(page, live_api) -> None:
    registry = live_api.registry
    enter_token(page)
    registry.create(JobSpec(name="wide-copy", source="events", sink_path="/t/wc"))
    registry.publish_progress("wide-copy", JobProgress(
        epoch=9, status="backfilling", rows_history=5300, rows_live=12, eta_seconds=125, progress=0.37,
        history_rows_per_s=800.0, splits=_many_splits(12, 3),
        live_latency=LiveLatency(0.4, 0.9, 60.0, 40, "create_time")))
    registry.create(JobSpec(name="done-copy", source="events", sink_path="/t/dc"))
    registry.publish_progress("done-copy", JobProgress(
        epoch=9, status="finished", rows_history=2000, rows_live=300, eta_seconds=0, progress=1.0,
        splits=_many_splits(2, 2), live_latency=LiveLatency(0.3, 0.7, 60.0, 300, "create_time")))
    busy, done = job(page, "wide-copy"), job(page, "done-copy")
    until(lambda: abs(_bar_fraction(busy) - 0.37) <= 0.05)
    until(lambda: abs(_bar_fraction(done) - 1.0) <= 0.05)
    assert busy.find_element(By.CLASS_NAME, "pct").text == "37.0%"
    # controls only where they apply: history left -> pause and throttle; finished -> neither; drop on both
    until(lambda: not done.find_element(By.CLASS_NAME, "pause").is_displayed())
    assert busy.find_element(By.CLASS_NAME, "pause").is_displayed()
    assert busy.find_element(By.CLASS_NAME, "throttle").is_displayed()
    assert not done.find_element(By.CLASS_NAME, "throttle").is_displayed()
    assert not done.find_element(By.CLASS_NAME, "retry").is_displayed()
    assert done.find_element(By.CLASS_NAME, "drop").is_displayed()
    # many splits start folded, a few open
    assert busy.find_element(By.CSS_SELECTOR, "details.splits").get_attribute("open") is None
    assert busy.find_element(By.CSS_SELECTOR, "details.splits summary").text == "12 splits"
    assert done.find_element(By.CSS_SELECTOR, "details.splits").get_attribute("open") == "true"
    # the sparklines fill as the polls come in: rows/s and the live latency's p99
    for n in range(3):
        registry.publish_progress("wide-copy", JobProgress(
            epoch=10 + n, status="backfilling", rows_history=5300 + 900 * (n + 1), rows_live=12,
            eta_seconds=100, progress=0.37, splits=_many_splits(12, 3),
            live_latency=LiveLatency(0.4, 0.9 + n / 10, 60.0, 40, "create_time")))
        time.sleep(1.1)

    def drawn(kind: str) -> bool:
        points = busy.find_element(By.CSS_SELECTOR, f".{kind} polyline").get_attribute("points")
        return len(points.split()) >= 2

    until(lambda: drawn("rates") and drawn("latencies"))
    assert busy.find_element(By.CSS_SELECTOR, ".latencies .value").text.endswith(" s")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "status-page-backfilling-and-finished.png"
    assert page.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000

    page.execute_script("window.confirm = () => true")
    done.find_element(By.CLASS_NAME, "drop").click()
    until(lambda: registry.get("done-copy") is None or registry.get("done-copy").dropped)

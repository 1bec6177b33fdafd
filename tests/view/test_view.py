"""The live view (`python -m processor view`'s server, run in this process from the
deployment's config file) in a real headless browser, on the real broker.

The page loads, shows every declared counter before any release, plots the releases
already on the topic, and a release produced while the page is open appears without a
reload (the DOM is polled with a deadline; a marker set on the page's `window` at load
proves no reload happened). In demo mode the demo's overlay file (true count, dead letters)
shows too. No worker runs: the records are the processor's own `Release` and `LedgerEntry`
types produced straight to the public topics, which is all the view reads.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from processor.stream.kafka import kafka_io
from processor.stream.model.config import ConfigError
from processor.stream.model.records import LedgerEntry, Release
from processor.view.feed import FeedLog, PublicFeed
from processor.view.overlay import OverlayFile, write_overlay
from processor.view.server import ViewServer

ROOT = Path(__file__).resolve().parents[2]
TICK_MS = 1000
START_MS = 1_700_000_000_000  # a tick boundary
FINGERPRINT = "0123456789abcdef" * 4
#: Where the screenshot tests also leave their PNGs for a person to look at (optional).
SCREENSHOT_DIR = os.environ.get("VIEW_SCREENSHOT_DIR")


def record_canvas_text(browser: Any) -> None:
    """From the next page load on, every text drawn on a canvas is recorded in
    `window.__canvasText`: uPlot draws its axis titles and tick labels on the canvas, so
    this is what the reader sees, read without OCR."""
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        window.__canvasText = [];
        const fill = CanvasRenderingContext2D.prototype.fillText;
        CanvasRenderingContext2D.prototype.fillText = function (text, x, y, w) {
          window.__canvasText.push(String(text));
          return fill.apply(this, arguments);
        };"""})


def canvas_text(browser: Any) -> list[str]:
    return list(browser.execute_script("return window.__canvasText || [];"))


def _release(counter: str, tick: int, value: float, kind: str = "change") -> bytes:
    return Release(counter=counter, tick=tick, tick_start_ms=START_MS + (tick - 1) * TICK_MS,
                   tick_ms=TICK_MS, value=value, kind=kind,  # type: ignore[arg-type]
                   mechanism="ecc", epsilon=1.0, delta=1e-6, error_bound=40.0, beta=0.05,
                   fingerprint="f" * 64).to_json()


def _wait(what: str, check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _row_cells(browser: Any, selector: str) -> list[str]:
    """The cells' text of the first row matching `selector`, read in one script: the page
    re-renders its tables at every poll, so element handles can go stale in between."""
    cells: list[str] | None = browser.execute_script(
        "const tr = document.querySelector(arguments[0]);"
        "return tr ? Array.from(tr.cells, c => c.textContent) : null;", selector)
    assert cells is not None, f"no row {selector}"
    return cells


@pytest.fixture
def view_process(deployment_factory: Callable[..., Any], tmp_path: Path
                 ) -> Iterator[tuple[Any, str, Path]]:
    """(deployment, URL, overlay path): topics created, the view's server running on them
    in demo mode in this process (the `python -m processor view` process itself is run by
    tests/devtools/test_demo.py, through the demo); always stopped."""
    from processor.stream.model.config import load_settings

    deployment = deployment_factory({"signups": START_MS, "purchases": START_MS},
                                    name="view", tick_ms=TICK_MS)
    overlay = tmp_path / "demo-overlay.json"
    # The settings as the command reads them: from the deployment's config file.
    server = ViewServer(load_settings(str(deployment.config), {}), port=0,
                        demo_file=str(overlay), poll_ms=200)
    try:
        server.start()
        yield deployment, server.url, overlay
    finally:
        server.stop()


def test_page_shows_counters_and_a_new_release_without_reload(
        view_process: tuple[Any, str, Path], browser: Any) -> None:
    from selenium.webdriver.common.by import By

    deployment, url, overlay = view_process
    conf, topics = deployment.conf, deployment.topics
    kafka_io.produce_all(conf, topics.ledger, [
        (b"signups", LedgerEntry("signups", "ecc", 1.0, 1e-6, TICK_MS, START_MS,
                                 fingerprint=FINGERPRINT).to_json())])
    kafka_io.produce_all(conf, topics.counts, [
        (b"signups", _release("signups", t, 10.0 * t)) for t in (1, 2, 3)])

    record_canvas_text(browser)
    browser.get(url)
    browser.execute_script("window.__loadedOnce = true;")

    def section(name: str) -> Any:
        found = browser.find_elements(By.CSS_SELECTOR, f'section.counter[data-counter="{name}"]')
        return found[0] if found else None

    # Both declared counters, the one without a release included.
    _wait("both declared counters", lambda: section("signups") and section("purchases"))
    _wait("the three releases already on the topic",
          lambda: section("signups").get_attribute("data-releases") == "3")
    _wait("the ledger entry", lambda: browser.find_elements(
        By.CSS_SELECTOR, '#ledger tbody tr[data-counter="signups"]'))
    assert "no release yet" in section("purchases").text
    # The status line counts in words that agree with the number.
    status = browser.find_element(By.ID, "status").text
    assert "· 3 releases · 1 ledger entry ·" in status, status
    # The chart is uPlot's (a canvas in the section), the other one still waits.
    assert section("signups").find_elements(By.CSS_SELECTOR, ".uplot canvas")
    assert not section("purchases").find_elements(By.CSS_SELECTOR, ".uplot")

    # A new release while the page is open.
    kafka_io.produce_all(conf, topics.counts, [(b"purchases", _release("purchases", 7, 123.5))])
    _wait("the new release on the page",
          lambda: section("purchases").get_attribute("data-last-tick") == "7")
    assert "123.50" in section("purchases").text
    cells = _row_cells(browser, '#releases tbody tr[data-counter="purchases"]')
    assert cells[1:7] == ["purchases", "7", "change", "123.50", "40.0", "0.05"], cells
    assert cells[0].count(":") == 2, cells  # the wall-clock column, HH:MM:SS
    # The ledger: the tick LENGTH under its own header, the fingerprint in full and not
    # clipped by its cell.
    header = browser.execute_script(
        "return Array.from(document.querySelectorAll('#ledger thead th'), h => h.textContent);")
    ledger = dict(zip(header, _row_cells(browser, '#ledger tbody tr[data-counter="signups"]'),
                      strict=True))
    assert ledger["tick length"] == f"{TICK_MS} ms" and ledger["from tick"] == "1", ledger
    assert ledger["configuration fingerprint"] == FINGERPRINT, ledger
    assert browser.execute_script(
        "const td = document.querySelector('#ledger td.fingerprint');"
        "return td.scrollWidth <= td.clientWidth + 1;"), "fingerprint clipped"

    # Demo mode: the demo's overlay file (its own true count, dead letters by reason).
    write_overlay(overlay, {"truth": {"signups": [[1, 9], [3, 31]]},
                            "start_ms": {"signups": START_MS}, "tick_ms": TICK_MS,
                            "dead_letters": {"unparsable": 4, "bad_timestamp": 1}})
    _wait("the dead letters of the overlay", lambda: browser.find_elements(
        By.CSS_SELECTOR, '#deadletters tbody tr[data-reason="unparsable"]'))
    assert _row_cells(browser, '#deadletters tr[data-reason="unparsable"]') == [
        "unparsable", "4"]
    _wait("the true count line", lambda: int(
        section("signups").get_attribute("data-truth-points") or 0) > 0)
    _wait("the true count in the chart's legend", lambda: "true (demo only)" in section(
        "signups").text)
    legend = browser.find_element(By.ID, "legend")
    # Closed, it is one line above the charts; opened, it explains every term.
    assert legend.size["height"] < 80, legend.size
    browser.execute_script("document.getElementById('legend').open = true;")
    for word in ("kind", "beta", "bound", "heartbeat"):
        assert word in legend.text
    assert browser.execute_script("return window.__loadedOnce === true;"), "page reloaded"
    # Nothing wider than the window (the ledger's ten columns could push the page).
    assert browser.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth;")
    if SCREENSHOT_DIR:
        Path(SCREENSHOT_DIR).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(SCREENSHOT_DIR) / "view-demo-page.png"))


def test_feed_reads_only_the_public_topics() -> None:
    for role in ("input", "timeline", "deadletter"):
        with pytest.raises(ValueError, match="public topics only"):
            PublicFeed({}, {"counts": "c", role: "x"})
    PublicFeed({}, {"counts": "c", "ledger": "l"})  # the control: accepted


def test_feed_log_skips_foreign_records_and_pages_by_sequence() -> None:
    log = FeedLog(cap=4)
    for t in range(1, 7):
        log.add("counts", _release("a", t, float(t)))
    log.add("counts", b"not json")
    log.add("counts", b'{"counter": "a", "tick": "7"}')
    log.add("ledger", b'{"counter": "a"}')  # no mechanism: not a ledger entry
    page = log.since(0, 0)
    # cap 4: the oldest half went when the fifth arrived; numbering continues.
    assert [r["tick"] for r in page["releases"]] == [3, 4, 5, 6]
    assert page["releases_next"] == 6 and page["unreadable"] == 3
    assert [r["tick"] for r in log.since(5, 0)["releases"]] == [6]
    first = log.since(0, 0, limit=3)  # paged: the rest comes with the next request
    assert [r["tick"] for r in first["releases"]] == [3, 4, 5] and first["more"]
    rest = log.since(first["releases_next"], 0, limit=3)
    assert [r["tick"] for r in rest["releases"]] == [6] and not rest["more"]
    assert log.since(6, 0)["releases"] == [] and page["ledger"] == []


def test_overlay_file_versions(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    reader = OverlayFile(path)
    assert reader.read() == (0, None)
    write_overlay(path, {"dead_letters": {"x": 1}})
    assert os.stat(path).st_mode & 0o777 == 0o600
    v1, data = reader.read()
    assert v1 == 1 and data == {"dead_letters": {"x": 1}}
    assert reader.read()[0] == 1  # unchanged file, same version
    write_overlay(path, {"dead_letters": {"x": 22}})
    assert reader.read() == (2, {"dead_letters": {"x": 22}})


def test_demo_overlay_only_on_loopback() -> None:
    from processor.stream.model.config import Settings

    with pytest.raises(ConfigError, match="loopback"):
        ViewServer(Settings(), host="0.0.0.0", demo_file="/tmp/x.json")
    ViewServer(Settings(), host="0.0.0.0")  # the control: public data on any interface


def test_cli_bad_config_is_one_error_line(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from processor.commands.main import main

    assert main(["view", "--config", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "missing.toml" in err


def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.view.conftest import _missing_browser

    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no headless browser"):
        _missing_browser("none here")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no headless browser"):
        _missing_browser("none here")


def test_compose_view_service_matches_the_command() -> None:
    """deploy/compose.yaml's `view` service runs this command with the compose config, gets
    no key, no state and no operator port, publishes its port on loopback, and its health
    check asks that port's /healthz. (No container engine here: deploy/README.md.)"""
    import shlex

    import yaml

    from processor.stream.model.config import load_settings
    from processor.view.server import build_parser

    deploy = ROOT / "deploy"
    doc = yaml.safe_load((deploy / "compose.yaml").read_text())
    view = doc["services"]["view"]
    entry = view["entrypoint"]
    assert entry[:4] == ["python", "-m", "processor", "view"], entry
    args = build_parser().parse_args(entry[4:])
    mounts = {c["target"]: deploy / doc["configs"][c["source"]]["file"]
              for c in view["configs"]}
    settings = load_settings(str(mounts[args.config]), {})
    assert settings.topics.counts and settings.topics.ledger
    assert args.demo_file is None and args.host == "0.0.0.0"
    assert "secrets" not in view and "volumes" not in view
    assert view["ports"] == [f"127.0.0.1:{args.port}:{args.port}"]
    health = shlex.join(view["healthcheck"]["test"])
    assert f"127.0.0.1:{args.port}/healthz" in health, health
    assert view.get("image") == doc["services"]["worker"]["image"]
    ViewServer(settings, host=args.host, port=args.port)  # builds from that config


def test_charts_have_dated_axes_titles_hover_and_zoom(
        view_process: tuple[Any, str, Path], browser: Any, tmp_path: Path) -> None:
    """A 50-hour window of releases (the window the issue saw labelled with two clock
    times): the time axis carries dates and a title with its time zone, the count axis a
    title with its unit (read from what is drawn on the canvas); hovering shows the values
    under the cursor in the chart's legend; dragging zooms in and a double-click zooms
    out; a screenshot is taken (and kept in $VIEW_SCREENSHOT_DIR when set). Control: the
    same canvas reading finds no axis title on a page that has no chart yet."""
    import datetime as dt

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    deployment, url, overlay = view_process
    conf, topics = deployment.conf, deployment.topics
    record_canvas_text(browser)
    browser.set_window_size(1280, 1000)
    browser.get(url)
    _wait("the page's charts area", lambda: browser.find_elements(
        By.CSS_SELECTOR, 'section.counter[data-counter="signups"]'))
    before = canvas_text(browser)
    assert not any("count (events)" in t for t in before), before  # control: no chart yet

    hours = 50
    step = hours * 3600 // 200  # ticks between releases
    kafka_io.produce_all(conf, topics.counts, [
        (b"signups", _release("signups", 1 + k * step, 5.0 * k + (k % 7) - 3,
                              kind="heartbeat" if k % 5 == 0 else "change"))
        for k in range(201)])
    write_overlay(overlay, {"truth": {"signups": [[1 + k * step, 5 * k] for k in range(201)]},
                            "start_ms": {"signups": START_MS}, "tick_ms": TICK_MS,
                            "dead_letters": {}})

    def section() -> Any:
        return browser.find_element(By.CSS_SELECTOR, 'section.counter[data-counter="signups"]')

    _wait("the 201 releases", lambda: section().get_attribute("data-releases") == "201")
    _wait("the truth overlay", lambda: int(section().get_attribute("data-truth-points")) > 0)
    texts = canvas_text(browser)
    assert "count (events)" in texts, texts
    x_title = [t for t in texts if t.startswith("wall-clock time at the end of each tick (UTC")]
    assert x_title, texts
    # Dated: the date of every day the window enters is drawn under the clock time of its
    # first tick mark (local time of the browser, which is this machine's).
    first = dt.datetime.fromtimestamp(START_MS / 1000).date()
    last = dt.datetime.fromtimestamp((START_MS + hours * 3600_000) / 1000).date()
    drawn = " ".join(texts)
    days = [first + dt.timedelta(days=n) for n in range(1, (last - first).days + 1)]
    assert len(days) >= 2
    for day in days:
        assert day.isoformat() in drawn, (day, texts)
    # Hover: the legend shows the values at the cursor.
    over = section().find_element(By.CSS_SELECTOR, ".u-over")
    ActionChains(browser).move_to_element_with_offset(over, 40, 20).perform()
    values = _wait("hover values", lambda: [v for v in browser.execute_script(
        "return Array.from(arguments[0].querySelectorAll('.u-legend .u-value'),"
        " v => v.textContent);", section()) if v not in ("", "–", "--")])
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", values[0]), values
    # Zoom: drag across the middle fifth; the x range shrinks; double-click restores it.
    scale = ("const p = window.dpcView.counters.get('signups').plot;"
             "return [p.scales.x.min, p.scales.x.max];")
    full = browser.execute_script(scale)
    w = over.size["width"]
    ActionChains(browser).move_to_element_with_offset(over, -w // 10, 0).click_and_hold() \
        .move_by_offset(w // 5, 0).release().perform()
    zoomed = _wait("the zoom", lambda: (lambda z: z if z[1] - z[0] < 0.5 * (full[1] - full[0])
                                        else None)(browser.execute_script(scale)))
    assert full[0] < zoomed[0] < zoomed[1] < full[1], (full, zoomed)
    shot = tmp_path / "view-zoomed.png"
    browser.save_screenshot(str(shot))
    ActionChains(browser).double_click(over).perform()
    _wait("the zoom reset", lambda: browser.execute_script(scale) == full)
    browser.execute_script("window.scrollTo(0, 0);")
    full_shot = tmp_path / "view.png"
    browser.save_screenshot(str(full_shot))
    for png in (shot, full_shot):
        assert png.stat().st_size > 10_000  # a rendered page, not a blank one
        if SCREENSHOT_DIR:
            Path(SCREENSHOT_DIR).mkdir(parents=True, exist_ok=True)
            (Path(SCREENSHOT_DIR) / png.name).write_bytes(png.read_bytes())


def test_view_without_brokers_is_one_error_line(tmp_path: Path) -> None:
    """`python -m processor view` fails like the other commands when the brokers do not
    answer: one `error:` line naming them, exit 2, no page left running."""
    import subprocess
    import sys

    cfg = tmp_path / "unreachable.toml"
    cfg.write_text('allow_undeclared = true\nbootstrap_servers = "127.0.0.1:9"\n')
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DPC_") and k != "KAFKA_BOOTSTRAP_SERVERS"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "processor", "view", "--config", str(cfg),
                           "--port", "0", "--broker-timeout", "2"], env=env, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stderr.startswith("error: the Kafka brokers at 127.0.0.1:9 do not answer")
    assert done.stderr.count("\n") == 1 and "KafkaError{" not in done.stderr, done.stderr
    assert "view: http" not in done.stdout


def test_one_release_and_a_few_seconds_of_them_get_a_readable_time_axis(
        view_process: tuple[Any, str, Path], browser: Any) -> None:
    """A counter with one release, and one with three releases within 3 s (a walk-through's
    first minute): each chart spans at least a minute and its time axis is labelled in
    clock time to the second, never in milliseconds (the issue saw a one-second axis with
    millisecond labels). Control: the same reading of the canvas finds millisecond labels
    once a chart is zoomed to half a second. The 50-hour window with many releases is
    test_charts_have_dated_axes_titles_hover_and_zoom's."""
    from selenium.webdriver.common.by import By

    deployment, url, _overlay = view_process
    conf, topics = deployment.conf, deployment.topics
    kafka_io.produce_all(conf, topics.counts, [(b"purchases", _release("purchases", 5, 42.0))]
                         + [(b"signups", _release("signups", t, 10.0 * t)) for t in (1, 2, 3)])
    record_canvas_text(browser)
    browser.set_window_size(1280, 1000)
    browser.get(url)

    def section(name: str) -> Any:
        found = browser.find_elements(By.CSS_SELECTOR, f'section.counter[data-counter="{name}"]')
        return found[0] if found else None

    _wait("both charts", lambda: section("purchases") and section("signups")
          and section("purchases").get_attribute("data-releases") == "1"
          and section("signups").get_attribute("data-releases") == "3"
          and section("purchases").find_elements(By.CSS_SELECTOR, ".uplot canvas"))
    span = ("const p = window.dpcView.counters.get(arguments[0]).plot;"
            "return p.scales.x.max - p.scales.x.min;")
    clock_label = re.compile(r"^\d\d:\d\d(:\d\d)?$")
    millis = re.compile(r"\d\d:\d\d:\d\d\.\d{3}")

    def labels() -> list[str]:
        return [line for t in canvas_text(browser) for line in t.split("\n")]

    for name in ("purchases", "signups"):
        assert browser.execute_script(span, name) >= 60, name
    drawn = _wait("time labels", lambda: [t for t in labels() if clock_label.match(t)])
    assert len(drawn) >= 4, drawn
    assert not [t for t in labels() if millis.search(t)], labels()
    # Control: a half-second window is labelled in milliseconds, and the check sees it.
    browser.execute_script(
        "const p = window.dpcView.counters.get('purchases').plot;"
        "p.setScale('x', {min: p.scales.x.max - 0.5, max: p.scales.x.max});")
    _wait("millisecond labels of the zoomed chart",
          lambda: [t for t in labels() if millis.search(t)])

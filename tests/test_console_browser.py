"""`mqconsole` end to end: real name server, a real three-broker DLedger group (and a
classic master/slave group) and the console as a real process, its page driven in
headless Chromium by Selenium.

Selenium is given Debian's chromium and chromedriver (`.ci/run` installs them), so it
never downloads a browser or a driver. With RAFTMQ_SCREENSHOTS_DIR set (the pictures
in docs/console.md: `RAFTMQ_SCREENSHOTS_DIR=docs`), each page is saved there as a PNG.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from raftmq.client import Producer
from raftmq.remoting import RequestCode, ResponseCode
from raftmq.tools.broker_local import LocalClassicGroup, LocalCluster
from tests.helpers import stopped

WINDOW = (1280, 800)
TOPIC, GROUP, KEY = "ConsoleOrders", "console-billing", "order-7"
ELECTION_RGB = (0xB3, 0x26, 0x1E)  # console.js's


def chrome():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    width, height = WINDOW  # the page's own size, whatever the window's frame takes
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    return driver


def screenshot(driver, name: str) -> None:
    where = os.environ.get("RAFTMQ_SCREENSHOTS_DIR")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(where) / f"console-{name}.png"))


def until(driver, condition, timeout_s: float = 10.0):
    """`condition(driver)`'s first truthy answer, polled every 50 ms."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.wait import WebDriverWait

    wait = WebDriverWait(
        driver, timeout_s, poll_frequency=0.05, ignored_exceptions=[StaleElementReferenceException]
    )
    return wait.until(condition)


def text_of(driver, selector: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0].text if found else ""


def shown_master(driver, broker_name: str) -> str | None:
    """The selfId the page shows as the group's master ('' for none, None before it renders)."""
    from selenium.webdriver.common.by import By

    found = driver.find_elements(
        By.CSS_SELECTOR, f'section.group[data-broker-name="{broker_name}"] .master'
    )
    return found[0].get_attribute("data-self-id") if found else None


def start_console(namesrv_addr: str, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """`mqconsole` on a free port; its URL from the line it prints once listening."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "raftmq.console",
            "-n",
            namesrv_addr,
            "--listen",
            "127.0.0.1:0",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
    )
    line = proc.stdout.readline().decode()
    match = re.match(r"mqconsole: (http://\S+/) ", line)
    assert match, f"mqconsole printed {line!r}: {log.read_text()}"
    return proc, match.group(1)


def png_pixels(png: bytes) -> tuple[int, list[bytes], int]:
    """A non-interlaced 8-bit RGB or RGBA PNG (what Chromium's screenshots are) as its
    width, its rows of unfiltered bytes and the bytes per pixel."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = {}, 8
    while at < len(png):
        (length,), kind = struct.unpack(">I", png[at : at + 4]), png[at + 4 : at + 8]
        chunks[kind] = chunks.get(kind, b"") + png[at + 8 : at + 8 + length]
        at += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    size = 3 if colour == 2 else 4
    raw, stride, rows = zlib.decompress(chunks[b"IDAT"]), width * size, []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            left = line[i - size] if i >= size else 0
            up, corner = previous[i], previous[i - size] if i >= size else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                guess = left + up - corner
                near = min((abs(guess - left), 0, left), (abs(guess - up), 1, up),
                           (abs(guess - corner), 2, corner))  # fmt: skip
                line[i] = (line[i] + near[2]) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, rows, size


def rgb(colour: str) -> tuple[int, int, int]:
    """'#2458c6' as (0x24, 0x58, 0xc6)."""
    return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))


def colour_counts(png: bytes, colours: set[tuple[int, int, int]], tolerance: int = 24) -> dict:
    """How many pixels of the picture are each of `colours` (within `tolerance` on each
    channel: antialiased edges are near it)."""
    _, rows, size = png_pixels(png)
    counts = dict.fromkeys(colours, 0)
    for row in rows:
        for x in range(0, len(row), size):
            red, green, blue = row[x : x + 3]
            for colour in colours:
                if (
                    max(abs(red - colour[0]), abs(green - colour[1]), abs(blue - colour[2]))
                    <= tolerance
                ):
                    counts[colour] += 1
    return counts


def fill(driver, values: dict[str, str]) -> None:
    from selenium.webdriver.common.by import By

    for element_id, value in values.items():
        field = driver.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(value)


@pytest.mark.processes
@pytest.mark.requires("chromium")
async def test_console_pages_actions_and_a_master_kill(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    conf = {"traceTopicEnable": "true"}
    async with LocalCluster(tmp_path / "cluster", nodes=3, extra_conf=conf) as cluster:
        master = await cluster.wait_master()
        console, url = start_console(
            cluster.namesrv_addr, tmp_path / "console.log", "--sample-interval-ms", "500"
        )
        driver = chrome()
        try:
            # the cluster at a glance: the group, its three members, its master
            driver.get(url + "#cluster")
            broker = cluster.broker_name
            until(driver, lambda d: shown_master(d, broker) == master)
            rows = f'section.group[data-broker-name="{broker}"] tbody tr'
            until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 3)
            roles = until(
                driver,
                lambda d: (
                    sorted(text_of(d, f'{rows}[data-self-id="{n}"] td.role') for n in cluster.ids)
                    == ["FOLLOWER", "FOLLOWER", "LEADER"]
                ),
            )
            assert roles
            assert text_of(driver, f'{rows}[data-self-id="{master}"] td.role') == "LEADER"
            screenshot(driver, "cluster")

            # a topic created through the page, then filled by a producer
            driver.get(url + "#topics")
            Select(driver.find_element(By.ID, "topic-cluster")).select_by_value(
                cluster.cluster_name
            )
            fill(driver, {"topic-name": TOPIC, "topic-read": "4", "topic-write": "4"})
            driver.find_element(By.ID, "topic-submit").click()
            until(driver, lambda d: f"Topic {TOPIC} written to" in text_of(d, "#notice"))
            topic_row = f'#topics-table tr[data-topic="{TOPIC}"]'
            until(driver, lambda d: text_of(d, f"{topic_row} td.messages") == "0")  # routed
            async with Producer(
                cluster.namesrv_addr, "console-test", enable_trace=True
            ) as producer:
                results = [
                    await producer.send(TOPIC, b"order %d" % n, tags="TagA", keys=f"order-{n}")
                    for n in range(12)
                ]
            sent = results[7]  # KEY's
            driver.find_element(By.CSS_SELECTOR, "button.refresh[data-page=topics]").click()
            until(driver, lambda d: text_of(d, f"{topic_row} td.messages") == "12")
            driver.find_element(By.CSS_SELECTOR, f"{topic_row} a.expand").click()
            until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.detail table"))
            screenshot(driver, "topics")

            # a subscription group created through the page, with lag once it commits
            driver.get(url + "#groups")
            fill(driver, {"group-name": GROUP, "group-retry": "5"})
            driver.find_element(By.ID, "group-submit").click()
            until(driver, lambda d: f"Subscription group {GROUP} written" in text_of(d, "#notice"))
            queue_id = sent.message_queue.queue_id
            ext = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": queue_id, "commitOffset": 1}
            node = await cluster.wait_master()
            response = await cluster.broker_call(node, RequestCode.UPDATE_CONSUMER_OFFSET, ext)
            assert response.code == ResponseCode.SUCCESS, response.remark
            group_row = f'#groups-table tr[data-group="{GROUP}"]'
            driver.find_element(By.CSS_SELECTOR, "button.refresh[data-page=groups]").click()
            until(driver, lambda d: text_of(d, f"{group_row} td.lag") == "2")  # 3 sent there
            driver.find_element(By.CSS_SELECTOR, f"{group_row} a.expand").click()
            until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "tr.detail table"))
            screenshot(driver, "groups")

            # the message looked up by its key
            driver.get(url + "#messages")
            Select(driver.find_element(By.ID, "lookup-by")).select_by_value("key")
            fill(driver, {"lookup-topic": TOPIC, "lookup-key": KEY})
            driver.find_element(By.ID, "lookup-submit").click()
            found = until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "article.message"))
            assert len(found) == 1
            assert found[0].get_attribute("data-msg-id") == sent.offset_msg_id
            assert "order 7" in text_of(driver, "article.message pre.body")
            assert sent.msg_id in found[0].text  # the unique key, shown with it
            found[0].find_element(By.CSS_SELECTOR, "button.trace-button").click()
            pub = 'article.message .trace tr[data-type="Pub"]'
            until(driver, lambda d: text_of(d, pub).split()[:2] == ["Pub", "console-test"])
            screenshot(driver, "messages")
            for by, field, value in (
                ("uniqKey", "lookup-uniq", sent.msg_id),
                ("msgId", "lookup-msgid", sent.offset_msg_id),
                ("offset", "lookup-offset", str(sent.queue_offset)),
            ):  # the other three ways: each finds the same message
                Select(driver.find_element(By.ID, "lookup-by")).select_by_value(by)
                if by == "offset":
                    queue = sent.message_queue
                    fill(driver, {"lookup-broker": queue.broker_name})
                    fill(driver, {"lookup-queue": str(queue.queue_id)})
                fill(driver, {field: value})
                driver.find_element(By.ID, "lookup-submit").click()
                until(
                    driver,
                    lambda d: (
                        text_of(d, "#lookup-results p") == "1 message(s)"
                        and d.find_element(By.CSS_SELECTOR, "article.message").get_attribute(
                            "data-msg-id"
                        )
                        == sent.offset_msg_id
                    ),
                )

            # the master killed: the page shows the new one
            driver.get(url + "#cluster")
            until(driver, lambda d: shown_master(d, broker) == master)
            old_term = int(text_of(driver, f'{rows}[data-self-id="{master}"] td.term'))
            killed_at = time.monotonic()
            cluster.kill(master)
            until(driver, lambda d: shown_master(d, broker) not in (None, "", master), 15)
            page_s = time.monotonic() - killed_at
            new_master = await cluster.wait_master(not_node=master)
            assert shown_master(driver, broker) == new_master  # the one the name server routes to
            unreachable = f'{rows}[data-self-id="{master}"] td.role'
            until(driver, lambda d: text_of(d, unreachable) == "UNREACHABLE")
            print(f"\nmaster {master} killed: the page showed {new_master} after {page_s:.2f} s")
            screenshot(driver, "failover")
            assert page_s < 3.0  # a couple of seconds

            # the charts under load: rates drawn, the election marked where the term rose
            charts_at = time.monotonic()
            driver.get(url + "#charts")
            Select(driver.find_element(By.ID, "charts-window")).select_by_value("300")  # 1 s
            chart_state = """
                const chart = document.querySelector('section.chart[data-chart="brokerPutTps"]');
                if (!chart) return null;
                const lines = [...chart.querySelectorAll("polyline.series")];
                const marks = [...chart.querySelectorAll("g.election")]
                    .filter((m) => m.dataset.brokerName === arguments[0]);
                const zeroY = chart.querySelector("line.grid-line").y1.baseVal.value;
                const electedX = Math.max(
                    ...marks.map((m) => m.querySelector("line").x1.baseVal.value));
                return {
                    strokes: lines.map((l) => l.getAttribute("stroke")),
                    terms: marks.map((m) => Number(m.dataset.term)),
                    loadedAfter: lines.some(
                        (l) => [...l.points].some((p) => p.x > electedX && p.y < zeroY)),
                };"""  # read at once: the charts are redrawn every second

            async with Producer(cluster.namesrv_addr, "console-charts") as producer:
                while True:
                    for n in range(20):
                        await producer.send(TOPIC, b"load %d" % n)
                    state = driver.execute_script(chart_state, broker)
                    if state and state["terms"] and state["loadedAfter"]:  # the new master's puts
                        break
                    assert time.monotonic() - charts_at < 15, f"charts not drawn: {state}"
            assert min(state["terms"]) > old_term  # one mark, or more after a split vote
            screenshot(driver, "charts")
            print(f"charts drawn {time.monotonic() - charts_at:.2f} s after opening")
            plot = 'section.chart[data-chart="brokerPutTps"] svg'
            png = until(driver, lambda d: d.find_element(By.CSS_SELECTOR, plot).screenshot_as_png)
            strokes = {rgb(colour) for colour in state["strokes"]}
            counts = colour_counts(png, strokes | {ELECTION_RGB})
            assert sum(counts[colour] for colour in strokes) > 50  # lines, not a blank chart
            assert counts[ELECTION_RGB] > 20  # the election's dashed line
            print(f"charts drawn and checked {time.monotonic() - charts_at:.2f} s after opening")

            # the name server down: the page says so instead of failing
            cluster.kill("namesrv")
            until(driver, lambda d: "no name server answered" in text_of(d, "#error"))
        finally:
            driver.quit()
            console.terminate()
            assert console.wait(10) == 0  # a clean stop on SIGTERM


@pytest.mark.processes
@pytest.mark.requires("chromium")
async def test_console_shows_a_classic_master_and_slave_and_the_slave_lag(tmp_path):
    """The cluster page on a classic group: master and slave rows with their brokerRole
    and the slave's lag; the slave stopped (SIGSTOP) while the master takes sends shows
    UNREACHABLE and the master's "slave fall behind" rises, then both fall to 0."""
    from selenium.webdriver.common.by import By

    slow_housekeeping = {"haHousekeepingInterval": "30000"}  # keep the stalled slave's link
    async with LocalClassicGroup(tmp_path / "classic", extra_conf=slow_housekeeping) as group:
        master_node, slave_node = group.ids
        await group.create_topic("ClassicPage")
        console, url = start_console(
            group.namesrv_addr, tmp_path / "console.log", "--timeout-ms", "1000"
        )
        driver = chrome()
        section = f'section.group[data-broker-name="{group.broker_name}"]'
        master_row, slave_row = (f'{section} tbody tr[data-broker-id="{i}"]' for i in (0, 1))

        def level(d) -> bool:
            """Both lags 0 and the slave's CommitLog end the master's."""
            lags = [text_of(d, f"{row} td.lag") for row in (master_row, slave_row)]
            ends = {text_of(d, f"{row} td.end") for row in (master_row, slave_row)}
            return lags == ["0", "0"] and len(ends) == 1

        try:
            driver.get(url + "#cluster")
            until(driver, lambda d: text_of(d, f"{master_row} td.role") == "ASYNC_MASTER")
            assert text_of(driver, f"{section} .master") == (
                f"brokerId 0 · {group.broker_addrs[master_node]}"
            )
            until(driver, lambda d: text_of(d, f"{slave_row} td.role") == "SLAVE")
            headers = [h.text for h in driver.find_elements(By.CSS_SELECTOR, f"{section} th")]
            assert "Slave fall behind (bytes)" in headers and "Term" not in headers
            async with Producer(group.namesrv_addr, "console-classic") as producer:
                for n in range(5):
                    await producer.send("ClassicPage", b"order %d" % n)
                until(driver, lambda d: text_of(d, f"{master_row} td.in") == "5" and level(d))

                with stopped(group.pid(slave_node)):
                    for _ in range(20):
                        await producer.send("ClassicPage", b"x" * 500)
                    until(driver, lambda d: text_of(d, f"{slave_row} td.role") == "UNREACHABLE")
                    behind = until(driver, lambda d: text_of(d, f"{master_row} td.lag.behind"))
                    assert int(behind) >= 20 * 500
                    screenshot(driver, "classic")
            until(driver, lambda d: text_of(d, f"{slave_row} td.role") == "SLAVE" and level(d), 20)
        finally:
            driver.quit()
            console.terminate()
            assert console.wait(10) == 0

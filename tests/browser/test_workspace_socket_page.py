"""The page's actions over the workspace socket (lab/web/api_socket.py) in Chromium: once the socket
is open the clicks go over it and draw exactly what the server renders; a refused socket leaves
every action to POST; an action in flight when the socket closes goes again by POST, and so does
one whose answer is not the server's (the page closes that socket)."""
from __future__ import annotations

import json

import pytest
from conftest import act, assert_clean, wait_until

from lab.core.experiment import Experiment
from lab.web.export import experiment_files

pytestmark = pytest.mark.browser


def _rollouts(page, n: int) -> None:
    box = page.locator('[data-field="task.num_rollout"]')
    act(page, lambda: box.fill(str(n)) or box.press("Enter"))


def _previews_are_the_servers(page) -> None:
    shown = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('details.preview')]
        .filter((d) => !d.hidden).map((d) => [d.dataset.file, d.querySelector('pre').textContent]))""")
    stored = json.loads(page.evaluate("localStorage.getItem('slime-lab.workspace')"))
    assert shown == experiment_files(Experiment.model_validate(stored["b"]))


def test_clicks_go_over_the_socket_once_it_is_open_and_draw_what_the_server_renders(new_page):
    page = new_page()
    wait_until(page, "performance.getEntriesByName('lab:complete').length > 0")
    for n in range(11, 23):
        _rollouts(page, n)
    act(page, lambda: page.locator("#undo").click())
    _previews_are_the_servers(page)
    vias = [via for via, _ in page.lab.actions]
    # The socket opens as the page completes; the clicks before it is open go by POST, none after.
    assert len(vias) == 13 and "socket" in vias, vias
    assert set(vias[vias.index("socket"):]) == {"socket"} and vias.count("socket") >= 6, vias
    assert page.locator('[data-field="task.num_rollout"]').input_value() == "21"
    assert_clean(page)


def test_a_refused_socket_leaves_every_action_to_post(new_page):
    page = new_page(websocket=False)  # a proxy that does not pass WebSockets
    for n in range(21, 25):
        _rollouts(page, n)
    _previews_are_the_servers(page)
    assert [via for via, _ in page.lab.actions] == ["post"] * 4
    assert_clean(page)


def _page_behind_a_middlebox(new_page, nth: int, misdeed) -> tuple[object, list[str]]:
    """A page whose socket passes through a middlebox: it forwards the page's messages to the server
    but for the `nth`, which it hands to `misdeed(ws)` instead. Returns the page (in) and the
    messages the page sent."""
    page = new_page(None)
    seen: list[str] = []

    def route(ws) -> None:
        server = ws.connect_to_server()

        def on_message(message) -> None:
            seen.append(message)
            if len(seen) == nth:
                misdeed(ws)
            else:
                server.send(message)
        ws.on_message(on_message)

    page.route_web_socket("**/api/workspace/socket", route)
    page.goto(page.lab.origin + "/")
    wait_until(page, "performance.getEntriesByName('lab:complete').length > 0")
    return page, seen


def test_an_action_in_flight_when_the_socket_closes_goes_again_by_post(new_page):
    page, seen = _page_behind_a_middlebox(new_page, 3, lambda ws: ws.close())  # dropped mid-request
    for n in range(31, 36):
        _rollouts(page, n)
    _previews_are_the_servers(page)
    assert page.locator('[data-field="task.num_rollout"]').input_value() == "35"
    cut = json.loads(seen[2].partition("\n")[2])
    assert ("post", cut) in page.lab.actions  # the request the socket dropped, sent again as it was
    assert len(seen) > 3  # and the actions after it went over a socket opened again
    assert_clean(page)


def test_an_answer_that_is_not_the_servers_closes_the_socket_and_the_action_goes_by_post(new_page):
    page, seen = _page_behind_a_middlebox(new_page, 1, lambda ws: ws.send("<html>proxy error</html>"))
    for n in range(41, 45):
        _rollouts(page, n)
    _previews_are_the_servers(page)
    assert page.locator('[data-field="task.num_rollout"]').input_value() == "44"
    assert ("post", json.loads(seen[0].partition("\n")[2])) in page.lab.actions
    assert_clean(page)

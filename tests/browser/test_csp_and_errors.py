"""The page under its own Content-Security-Policy, and what it shows when an answer is not JSON."""
from __future__ import annotations

import json

from conftest import act, assert_clean, wait_until


def test_the_page_runs_under_its_csp_with_no_violation(new_page):
    violations: list[str] = []
    page = new_page(None)
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    response = page.goto(page.lab.origin + "/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self' 'sha256-" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    wait_until(page, "document.body.dataset.ready === '1'")
    act(page, lambda: page.select_option('[data-field="placement.ownership"]', "colocated"))
    assert "--colocate" in page.text_content("#previews")
    assert violations == [] and page.evaluate("typeof window.slimeBoot") == "object"
    assert_clean(page)


def test_an_answer_that_is_not_json_is_shown_as_a_message_not_a_parser_error(new_page):
    page = new_page(websocket=False)  # a proxy without WebSockets, whose error page is not JSON
    page.route("**/api/workspace", lambda r: r.fulfill(status=502, content_type="text/plain",
                                                      body="Internal Server Error"))
    page.select_option('[data-field="placement.ownership"]', "colocated")
    wait_until(page, "document.querySelector('#error').textContent.includes('HTTP 502')")
    text = page.text_content("#error")
    assert "SyntaxError" not in text and "Unexpected token" not in text
    page.unroute("**/api/workspace")


def test_a_refused_value_shows_the_servers_message_naming_the_field(new_page):
    page = new_page(websocket=False)  # the request is rewritten on its way: by POST
    page.route("**/api/workspace", lambda r: r.continue_(post_data=json.dumps(
        {**json.loads(r.request.post_data), "action": {"type": "edit", "path": "task.input_key", "value": "-x"}})))
    page.select_option('[data-field="placement.ownership"]', "colocated")
    wait_until(page, "document.querySelector('#error').textContent.includes('must not begin with')")
    assert "task.input_key" in page.text_content("#error")
    page.unroute("**/api/workspace")

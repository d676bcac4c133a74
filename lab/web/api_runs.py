"""POST /api/run-metrics: a run's metrics.jsonl (as text in a JSON body) -> the series the
"Did it work?" step plots (lab/core/run_metrics.py). Nothing is stored; a bad file is a 422 naming
its line, in the page's language."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from lab.core.run_metrics import RunMetricsError, run_series
from lab.web.body import RUN_METRICS_MAX_BYTES, error, read_json, request_lang

router = APIRouter(prefix="/api", tags=["lab"])


class RunMetricsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="The content of OUTPUT_DIR/metrics.jsonl.")
    lang: str | None = Field(default=None, description="The page's language (en, zh).")


@router.post("/run-metrics")
async def run_metrics(request: Request) -> dict[str, Any]:
    body = await read_json(request, RunMetricsRequest, limit=RUN_METRICS_MAX_BYTES)
    lang = body.lang or request_lang(request)
    try:
        return run_series(body.text)
    except RunMetricsError as exc:
        loc = ["body", "text", exc.line] if exc.line else ["body", "text"]
        raise error(422, loc, exc.key, exc.params, lang) from None

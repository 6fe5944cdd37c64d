"""GET /kvdeck/v1/requests/{id}: why a request is slow. A live request's timeline, TTFT parts
and reason line come from the engine's latest stats snapshot; a finished one's from its
final output (an output listener keeps the last KEEP_FINISHED)."""

from collections import OrderedDict
from collections.abc import Callable

from kvdeck.app.serve.errors import OpenAIError
from kvdeck.engine.types.outputs import RequestOutput
from kvdeck.engine.types.request_timeline import TimelineSnapshot
from kvdeck.engine.types.stats import EngineStats, RequestStats

KEEP_FINISHED = 512


class RequestTimelines:
    def __init__(self, latest_stats: Callable[[], EngineStats | None], keep: int = KEEP_FINISHED) -> None:
        self.latest_stats = latest_stats
        self.keep = keep
        self.finished: OrderedDict[str, RequestOutput] = OrderedDict()

    def observe(self, output: RequestOutput) -> None:
        """An output listener: a finished request's timeline is kept (the oldest dropped)."""
        if output.finished and output.metrics.timeline is not None:
            self.finished.pop(output.request_id, None)
            self.finished[output.request_id] = output
            while len(self.finished) > self.keep:
                self.finished.popitem(last=False)

    def describe(self, request_id: str) -> dict:
        """The JSON body for one engine request id (a completion's id names its first choice
        too: cmpl-… as well as cmpl-…-0); OpenAIError 404 when unknown or long finished."""
        for rid in (request_id, f"{request_id}-0"):
            output = self.finished.get(rid)  # first: the latest snapshot may predate its finish
            if output is not None:
                timeline = output.metrics.timeline
                return _body(rid, "finished", f"finished: {timeline.finish_reason}", timeline)
            live = self._live(rid)
            if live is not None:
                return _body(rid, live.state, live.reason, live.timeline)
        raise OpenAIError(404, f"no request {request_id!r}: unknown, or finished long ago",
                          param="request_id", code="request_not_found")

    def _live(self, request_id: str) -> RequestStats | None:
        stats = self.latest_stats()
        if stats is None:
            return None
        return next((r for r in stats.requests if r.request_id == request_id), None)


def _body(request_id: str, state: str, reason: str, timeline: TimelineSnapshot | None) -> dict:
    return {"id": request_id, "object": "kvdeck.request", "state": state, "reason": reason,
            "ttft": _ttft_dict(timeline), "timeline": _timeline_dict(timeline)}


def _ttft_dict(timeline: TimelineSnapshot | None) -> dict | None:
    ttft = timeline.ttft if timeline is not None else None
    if ttft is None:
        return None
    return {"queue_s": ttft.queue_s, "prefill_s": ttft.prefill_s, "first_step_s": ttft.first_step_s,
            "total_s": ttft.total_s}


def _timeline_dict(timeline: TimelineSnapshot | None) -> dict | None:
    if timeline is None:
        return None
    data = {name: getattr(timeline, name) for name in TimelineSnapshot.__slots__ if name != "ttft"}
    data["durations"] = timeline.durations()  # (phase, seconds): the dashboard's bar
    return data

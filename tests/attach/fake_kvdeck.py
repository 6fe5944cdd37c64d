"""A stand-in for `kvdeck --serve`'s attach endpoints (models, info, the stats stream), cheap
to stop and start again on the same port: for the reconnection test."""

import asyncio
import json
import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from kvdeck.engine.types.stats import EngineStats, stats_to_dict

NUM_BLOCKS = 64


def snapshot(step: int) -> dict:
    stats = EngineStats(
        timestamp=time.time(), num_running=0, num_waiting=0, num_preempted=0,
        kv_cache_usage=0.0, num_blocks=NUM_BLOCKS, block_size=16, num_free_blocks=NUM_BLOCKS,
        num_cached_blocks=0, block_ref_counts=[0] * NUM_BLOCKS,
        block_is_cached=[False] * NUM_BLOCKS, blocks_written_last_step=[], requests=[],
        prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0, prompt_tokens_total=0,
        generation_tokens_total=0, num_requests_finished=0, num_steps=step,
        last_step_prefill_tokens=0, last_step_decode_tokens=0, last_step_num_seqs=0,
        last_step_duration_s=0.0)
    return {"stats": stats_to_dict(stats), "latencies": [["itl", time.time(), 0.01]]}


def create_app() -> FastAPI:
    app = FastAPI()
    info = {"model": "fake", "engine": "kvdeck", "health": "ready", "num_blocks": NUM_BLOCKS,
            "block_size": 16, "max_model_len": 256, "vocab_size": 1000}

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake", "max_model_len": 256}]})

    @app.get("/kvdeck/v1/info")
    async def kvdeck_info() -> JSONResponse:
        return JSONResponse(info)

    @app.get("/kvdeck/v1/stats")
    async def stats() -> StreamingResponse:
        async def events():
            yield f"event: info\ndata: {json.dumps(info)}\n\n"
            for step in range(1_000_000):
                yield f"event: stats\ndata: {json.dumps(snapshot(step))}\n\n"
                await asyncio.sleep(0.1)
        return StreamingResponse(events(), media_type="text/event-stream")

    return app

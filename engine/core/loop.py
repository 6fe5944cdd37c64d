"""The engine loop in its own process: owns the model and the KV cache.

Started by the subprocess client (`kvdeck.engine.core_client.process`, which names
`run_engine_core` by string, so the parent never imports torch). It steps while any
request is unfinished and blocks on its input pipe when idle, so an idle engine costs
nothing. Each step sends the per-request deltas; a stats snapshot rides along at most
STATS_HZ times a second, plus one whenever the engine goes idle (so gauges such as KV
usage settle at their idle values) and a slow heartbeat while idle.

The pipes are the liveness signal both ways: if the client process dies, the input pipe
reports EOF and this process exits; if this process dies, the client sees EOF on the
output pipe.
"""

import logging
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection

from kvdeck.engine.core.engine_core import EngineCore
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.stats import EngineStats
from kvdeck.engine.types.wire import (
    AbortRequests,
    AddRequest,
    EngineCoreOutput,
    EngineCrashed,
    EngineReady,
    RequestRejected,
    Shutdown,
    StartupFailed,
    StartupProgress,
    StepOutputs,
    UtilityCall,
    UtilityResult,
)

STATS_HZ = 15.0
IDLE_HEARTBEAT_S = 1.0
NOTHING_TO_RUN_WAIT_S = 0.002  # every waiting request is compiling its grammar

logger = logging.getLogger(__name__)


def configure_logging() -> None:
    """Log lines on stderr, which the spawner sends to the engine's log file (engine.log
    under the TUI): start-up, model, pool size, graph capture, errors."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_engine_core(config: EngineConfig, input_conn: Connection, output_conn: Connection) -> None:
    """Process entry point (spawned by name: `ENGINE_CORE_TARGET` in the client)."""
    # Ctrl-C reaches the whole process group; the client decides when the engine stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging()
    logger.info("engine process %d starting: model %s, device %s, dtype %s, max_model_len %s",
                os.getpid(), config.model or "(the bundled demo)", config.device, config.dtype,
                config.max_model_len or "(the model's)")
    try:
        core = _build_core(config, output_conn)
    except (EOFError, BrokenPipeError):
        logger.info("the client went away during start-up")
        sys.exit(0)  # the client went away while we loaded
    if core is None:
        sys.exit(1)
    try:
        EngineCoreLoop(core, input_conn, output_conn).run()
        logger.info("shut down on request")
    except (EOFError, BrokenPipeError, ConnectionResetError):
        logger.info("the client is gone: stopping")
    except BaseException as exc:
        logger.exception("engine crashed")
        try:
            output_conn.send(EngineCrashed(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        except OSError:
            pass
        sys.exit(1)
    finally:
        if core.kv_tiers is not None:  # the disk tier's queued writes reach the disk
            core.kv_tiers.close()


def _build_core(config: EngineConfig, output_conn: Connection) -> EngineCore | None:
    ready_message = ""

    def progress(stage: str, message: str) -> None:
        nonlocal ready_message
        if stage == "ready":
            ready_message = message  # reported with EngineReady, once the client can use it
            return
        logger.info("%s: %s", stage, message)
        output_conn.send(StartupProgress(stage, message))

    try:
        core = EngineCore(config, progress)
    except Exception as exc:
        logger.exception("start-up failed")
        output_conn.send(StartupFailed(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return None
    info = core.info
    logger.info("ready: %s on %s (%s), max_model_len %d; KV pool %d blocks x %d tokens = %.1f MiB"
                "; CUDA graphs %s", info.model_dir, info.device, info.dtype, info.max_model_len,
                info.num_blocks, info.block_size,
                info.num_blocks * info.block_size * info.kv_bytes_per_token / 2**20,
                "on" if info.cuda_graphs else "off")
    output_conn.send(EngineReady(info, ready_message, core.stats()))
    return core


class EngineCoreLoop:
    def __init__(self, core: EngineCore, input_conn: Connection, output_conn: Connection) -> None:
        self.core = core
        self.input_conn = input_conn
        self.output_conn = output_conn
        self.stats_interval = 1.0 / STATS_HZ
        self.last_stats_time = 0.0
        self.stats_dirty = False  # something changed since the last snapshot sent
        self.iteration_tokens: list[int] = []  # per step, until the next message carries them
        self.iteration_used_blocks: list[int] = []  # blocks held after each of those steps

    def run(self) -> None:
        while True:
            if not self.core.has_unfinished_requests():
                if self.stats_dirty:
                    # The last changes, at the stats rate like every snapshot (one of a 10,000-block
                    # pool takes a millisecond or two to build and send): a request arriving in
                    # the meantime runs first, and one after each short request did not wait on it.
                    wait = self.last_stats_time + self.stats_interval - time.monotonic()
                    if wait <= 0 or not self.input_conn.poll(wait):
                        self._send_stats()
                # Idle: sleep in the kernel until the client sends something.
                if not self.input_conn.poll(IDLE_HEARTBEAT_S):
                    self._send_stats()
                    continue
            while self.input_conn.poll():
                if not self._handle(self.input_conn.recv()):
                    return
            if not self.core.has_unfinished_requests():
                continue
            steps_before = self.core.num_steps
            outputs = self.core.step()
            if self.core.num_steps != steps_before:  # an empty schedule runs no step
                last = self.core.last_step
                self.iteration_tokens.append(last.prefill_tokens + last.decode_tokens)
                # (With async scheduling the next step is scheduled already: its blocks count.)
                pool = self.core.block_manager
                self.iteration_used_blocks.append(pool.num_blocks - pool.num_free_blocks)
            elif not outputs:
                self.input_conn.poll(NOTHING_TO_RUN_WAIT_S)  # grammars compiling: do not spin
            self.stats_dirty = True
            now = time.monotonic()
            stats = None
            if now - self.last_stats_time >= self.stats_interval:
                stats = self.core.stats()
                self.last_stats_time = now
                self.stats_dirty = False
            if outputs or stats is not None:
                self._send(outputs, stats)

    def _handle(self, message: object) -> bool:
        """Apply one client message; False means stop the loop."""
        match message:
            case AddRequest(request):
                try:
                    self.core.add_request(request)
                except ValueError as exc:
                    logger.warning("request %s refused: %s", request.request_id, exc)
                    self.output_conn.send(RequestRejected(request.request_id, str(exc)))
            case AbortRequests(request_ids, status):
                self.core.abort_requests(request_ids, status)
            case UtilityCall(call_id, method, args):
                try:
                    result = self.core.call_utility(method, args)
                except ValueError as exc:
                    self.output_conn.send(UtilityResult(call_id, error=str(exc)))
                else:
                    self.output_conn.send(UtilityResult(call_id, result))
            case Shutdown():
                return False
            case _:
                raise TypeError(f"unexpected message for the engine core: {type(message).__name__}")
        self.stats_dirty = True
        return True

    def _send(self, outputs: list[EngineCoreOutput], stats: EngineStats | None) -> None:
        self.output_conn.send(StepOutputs(outputs, stats, self.iteration_tokens,
                                          self.core.num_steps, self.iteration_used_blocks))
        self.iteration_tokens = []
        self.iteration_used_blocks = []

    def _send_stats(self) -> None:
        self._send([], self.core.stats())
        self.last_stats_time = time.monotonic()
        self.stats_dirty = False

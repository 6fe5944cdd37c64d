"""The chat: messages streamed as Markdown, a multi-line input, the transcript saved as it grows.

Its services come in through the constructor: the engine session (the current client),
the dashboard state (it records each reply's latencies), the settings and transcript
stores, and the activity tracker (a streaming reply is something quitting would cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream
from textual.worker import Worker, WorkerCancelled, WorkerFailed

from kvdeck.engine.frontend.reasoning import ReasoningFormat, ReasoningStream, detect_reasoning_format
from kvdeck.tui.activity import ActivityTracker
from kvdeck.tui.chat_context import FittedRequest, MessageTooLong, fit_to_context
from kvdeck.tui.dashboard_state import DashboardState
from kvdeck.tui.engine_protocol import EngineClientProtocol
from kvdeck.tui.engine_session import EngineSession
from kvdeck.tui.lora_choices import lora_enabled, lora_request_for
from kvdeck.tui.messages import EngineHealthCheck
from kvdeck.tui.reply_meter import ReplyMeter
from kvdeck.tui.settings_store import SettingsStore
from kvdeck.tui.transcripts import ChatTurn, Transcript, TranscriptStore
from kvdeck.tui.widgets.chat_input import ChatInput
from kvdeck.tui.widgets.chat_message import ChatMessage, displayable

SAVE_EVERY_S = 2.0  # how often a streaming reply is saved to the transcript
REPLY_ACTIVITY = "chat-reply"

WELCOME = (
    "Type a message and press Enter (ctrl+j starts a new line; pasted text keeps all its "
    "lines). Esc stops a reply; ctrl+s sets the system prompt and "
    "sampling; ctrl+l fires a load burst to watch the KV blocks on the right (f2 in a narrow "
    "terminal). F1 lists every key."
)


def without_blank_edges(text: str) -> str:
    """The message as sent: every line, its indentation kept (pasted code), without the
    blank lines around it or trailing spaces."""
    lines = text.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines).rstrip()


class ChatPane(Vertical):
    DEFAULT_CSS = """
    ChatPane { height: 1fr; }
    ChatPane #messages { height: 1fr; }
    ChatPane #chat-status { height: 1; color: $text-muted; padding: 0 1; }
    ChatPane #chat-welcome { color: $text-muted; padding: 1 1; }
    """

    def __init__(self, engine: EngineSession, state: DashboardState, settings: SettingsStore,
                 transcripts: TranscriptStore, activity: ActivityTracker, *,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self.engine = engine
        self.state = state
        self.settings = settings
        self.transcripts = transcripts
        self.activity = activity
        self.transcript = Transcript()
        self.active_request_id: str | None = None
        self.last_reply: ChatMessage | None = None
        self.reply_worker: Worker | None = None
        self._told_about_trimming: str | None = None  # the transcript last told
        self._note = ""  # what the status line says before the settings ("generating"...)
        self._fitting = False  # a message is being measured against the context
        self._reasoning_for: tuple[object, ReasoningFormat | None] | None = None  # (tokenizer, format)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="messages"):
            yield Static(WELCOME, id="chat-welcome")
        yield Static(id="chat-status")
        yield ChatInput(placeholder="Message · Enter sends · ctrl+j new line · Esc stops",
                        id="prompt")

    def on_mount(self) -> None:
        self.transcript.system_prompt = self.settings.current.system_prompt
        self.query_one("#messages", VerticalScroll).anchor()
        self.update_status()
        self._engine_seen: tuple[int, bool] = (id(self.engine.client), self.engine.ready)
        self.set_interval(0.5, self._follow_engine)

    def _follow_engine(self) -> None:
        """The status line names the context and reply budget of the engine now loaded."""
        seen = (id(self.engine.client), self.engine.ready)
        if seen != self._engine_seen:
            self._engine_seen = seen
            self.update_status(self._note)  # the same note, the new engine's figures

    @property
    def generating(self) -> bool:
        return self.active_request_id is not None

    @property
    def prompt_input(self) -> ChatInput:
        return self.query_one("#prompt", ChatInput)

    @property
    def has_draft(self) -> bool:
        """A message is being typed or a reply is streaming: the chat must stay in view."""
        return bool(self.prompt_input.text.strip()) or self.generating

    def update_status(self, note: str = "") -> None:
        self._note = note
        settings = self.settings.current
        seed = "random" if settings.seed is None else str(settings.seed)
        client = self.engine.usable
        if client is not None:
            max_tokens = f"max {settings.reply_budget(client.max_model_len)} tok"
        else:
            max_tokens = f"max {settings.max_tokens or 'auto'} tok"
        # The reply budget and the context first: what decides how much history fits.
        if client is not None:
            max_tokens += f" · ctx {client.max_model_len}"
        text = (f"{max_tokens} · temp {settings.temperature:g} · top_p {settings.top_p:g} · "
                f"seed {seed}")
        if settings.response_format == "json":
            text += " · JSON"
        elif settings.response_format == "schema":
            text += f" · schema {Path(settings.schema_file or '').name}"
        if note:
            text = f"{note} · {text}"
        self.query_one("#chat-status", Static).update(text)

    def _save(self) -> None:
        if not self.transcript.turns:
            return
        try:
            self.transcripts.save(self.transcript)
        except OSError as exc:
            self.notify(f"Could not save the chat: {exc}", severity="error")

    async def on_chat_input_submitted(self, event: ChatInput.Submitted) -> None:
        event.stop()
        text = without_blank_edges(event.text)
        if not text:
            return
        if self.generating:
            self.notify("A reply is still streaming: press Esc to stop it.", severity="warning")
            return
        client = self.engine.usable
        if client is None:
            self.notify("The engine is not ready yet.", severity="warning")
            return
        if self._fitting:
            return  # Enter pressed again while the last one is being measured
        self._fitting = True
        try:
            # In a thread: counting tokens may ask an attached server (HTTP), and a slow
            # one must not freeze the UI.
            fitted = await asyncio.to_thread(self._fit, client, text)
        except MessageTooLong as exc:  # the text stays in the input, to shorten
            self.notify(str(exc), severity="error", timeout=10)
            self.update_status(f"not sent: {exc.prompt_tokens} tokens")
            return
        except ValueError as exc:  # the chat template refused the messages
            self.notify(f"Not sent: {exc}", severity="error", timeout=10)
            return
        except Exception as exc:  # the engine or server could not count the tokens
            self.notify(f"Not sent: {type(exc).__name__}: {exc}", severity="error", timeout=10)
            return
        finally:
            self._fitting = False
        event.chat_input.clear()  # back to one line
        await self.send(text, client, fitted)

    def _fit(self, client: EngineClientProtocol, text: str) -> FittedRequest:
        settings = self.settings.current
        template = self._template_kwargs(client)  # what the request renders, counted as sent
        return fit_to_context(
            lambda messages: len(client.encode(None, messages, **template)[1]), client.max_model_len,
            settings.system_prompt, self.transcript.turns, text,
            settings.reply_budget(client.max_model_len),
        )

    async def send(self, text: str, client: EngineClientProtocol, fitted: FittedRequest) -> None:
        self.transcript.system_prompt = self.settings.current.system_prompt
        self.transcript.model = self.engine.name
        self.transcript.turns.append(ChatTurn("user", text))
        self._save()
        messages = self.query_one("#messages", VerticalScroll)
        await messages.query("#chat-welcome").remove()
        await messages.mount(ChatMessage("user", text))
        reply = ChatMessage("assistant")
        await messages.mount(reply)
        messages.anchor()
        self.last_reply = reply
        self.active_request_id = request_id = f"chat-{uuid.uuid4().hex[:8]}"
        self.activity.begin(REPLY_ACTIVITY, "a chat reply is streaming", self.stop)
        self.update_status("generating")
        if fitted.dropped and self._told_about_trimming != self.transcript.id:
            self._told_about_trimming = self.transcript.id
            self.notify(f"The conversation no longer fits the {client.max_model_len}-token "
                        "context: the oldest turns are left out of what the model sees (the "
                        "transcript keeps them). ctrl+n starts a new chat.", timeout=8)
        turn = ChatTurn("assistant", "")  # filled in as the reply streams, saved as it grows
        self.transcript.turns.append(turn)
        self.reply_worker = self._stream_reply(reply, client, turn, fitted, request_id)

    @work(group="chat", exclusive=True)
    async def _stream_reply(self, reply: ChatMessage, client: EngineClientProtocol,
                            turn: ChatTurn, fitted: FittedRequest, request_id: str) -> None:
        meter = ReplyMeter(self.state)
        # Made at the first delta: a MarkdownStream stopped before its task ever ran raises
        # CancelledError into the caller, which would end this worker before its cleanup.
        stream: MarkdownStream | None = None
        # A thinking model's <think> block goes above the reply, not into it (nor the transcript's
        # content, which the next request sends back).
        reasoner = ReasoningStream(self.reasoning_format(client))
        text = ""
        error = ""
        last_save = time.monotonic()
        adapter: dict = {}  # the LoRA adapter it runs under, as generate's keyword
        # The reply counts as streaming (`generating`) until its final text is in the
        # transcript: whoever waits for it to end reads the whole reply.
        try:
            try:
                adapter = self._adapter_for(client)
                params = self.settings.current.sampling_params(fitted.max_tokens)
                async for out in client.generate(None, params, request_id=request_id,
                                                 messages=fitted.messages,
                                                 **adapter, **self._template_kwargs(client)):
                    meter.observe(out)
                    new_text = out.delta_text
                    if out.outputs:
                        thought, new_text, text = reasoner.update(out.outputs[0].text, out.finished)
                        if thought:
                            reply.add_thinking(thought)
                            turn.thinking = reply.thinking
                    if new_text:
                        if stream is None:
                            stream = Markdown.get_stream(reply.markdown)
                        await stream.write(displayable(new_text))
                    if time.monotonic() - last_save > SAVE_EVERY_S:  # a crash loses little
                        turn.content = text
                        self._save()
                        last_save = time.monotonic()
            except Exception as exc:  # engine died or refused: keep what arrived, say why
                error = f"error: {exc}"
                self.post_message(EngineHealthCheck())
            finally:
                turn.content = text
                if stream is not None:
                    await stream.stop()
            reply.content = text
            stats = meter.result().describe()
            if adapter:
                stats += f" · LoRA {adapter['lora_request'].lora_name}"
            if fitted.dropped:
                stats += f" · {fitted.dropped} earlier messages left out"
            if error:
                stats = f"{stats} · {error}"
            reply.set_stats(stats, error=bool(error))
            turn.stats = stats
            self._save()
        finally:
            self.active_request_id = None
            self.activity.end(REPLY_ACTIVITY)
        self.update_status()

    def reasoning_format(self, client: EngineClientProtocol) -> ReasoningFormat | None:
        """The <think> format its chat template implies (read once per tokenizer)."""
        tokenizer = getattr(client, "tokenizer", None)
        if self._reasoning_for is None or self._reasoning_for[0] is not tokenizer:
            self._reasoning_for = (tokenizer, detect_reasoning_format(tokenizer))
        return self._reasoning_for[1]

    def _template_kwargs(self, client: EngineClientProtocol) -> dict:
        """Thinking switched off in the settings, for a model that thinks: generate's and
        encode's keyword (nothing otherwise, so clients that know no such keyword work)."""
        kwargs = self.settings.current.template_kwargs()
        if kwargs is None or self.reasoning_format(client) is None:
            return {}
        return {"chat_template_kwargs": kwargs}

    def _adapter_for(self, client: EngineClientProtocol) -> dict:
        """The chosen LoRA adapter, as generate's keyword (none with LoRA off: the base)."""
        adapter = self.settings.current.adapter
        if adapter is None or not lora_enabled(client):
            return {}
        return {"lora_request": lora_request_for(adapter)}

    async def stop(self) -> None:
        """Stop the streaming reply; the partial text stays in the chat and the transcript."""
        client = self.engine.client
        if self.active_request_id is not None and client is not None:
            await client.abort(self.active_request_id)

    async def new_chat(self) -> None:
        await self.stop()
        await self.workers_done()
        await self.show_transcript(Transcript(system_prompt=self.settings.current.system_prompt))

    async def workers_done(self) -> None:
        """Wait until the streaming reply (if any) has ended and been saved."""
        if self.reply_worker is not None:
            with contextlib.suppress(WorkerCancelled, WorkerFailed):
                await self.reply_worker.wait()

    async def show_transcript(self, transcript: Transcript) -> None:
        self.transcript = transcript
        messages = self.query_one("#messages", VerticalScroll)
        await messages.remove_children()
        if not transcript.turns:
            await messages.mount(Static(WELCOME, id="chat-welcome"))
        await messages.mount_all(
            [ChatMessage(turn.role, turn.content, turn.stats, turn.thinking) for turn in transcript.turns]
        )
        replies = messages.query(ChatMessage).filter(".-assistant")
        self.last_reply = replies.last() if replies else None
        messages.anchor()
        self.update_status()

    def copy_last_reply(self) -> None:
        if self.last_reply is None or not self.last_reply.content:
            self.notify("No reply to copy yet.", severity="warning")
            return
        self.last_reply.action_copy()

    def focus_input(self) -> None:
        self.prompt_input.focus()

    def type_into_input(self, text: str) -> None:
        """Keys typed while nothing that takes text had focus: they belong to the message."""
        self.prompt_input.focus()
        self.prompt_input.type_text(text)

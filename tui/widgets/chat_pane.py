"""The chat: messages streamed as Markdown, an input line, the transcript saved as it grows."""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import TYPE_CHECKING

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Input, Markdown, Static
from textual.widgets.markdown import MarkdownStream
from textual.worker import Worker, WorkerCancelled, WorkerFailed

from kvdeck.tui.reply_meter import ReplyMeter
from kvdeck.tui.transcripts import ChatTurn, Transcript
from kvdeck.tui.widgets.chat_message import ChatMessage, displayable

if TYPE_CHECKING:
    from kvdeck.tui.app import KvdeckApp


SAVE_EVERY_S = 2.0  # how often a streaming reply is saved to the transcript

WELCOME = (
    "Type a message and press Enter. Esc stops a reply; ctrl+s sets the system prompt and "
    "sampling; ctrl+l fires a load burst to watch the KV blocks on the right (f2 in a narrow "
    "terminal). F1 lists every key."
)


class ChatPane(Vertical):
    DEFAULT_CSS = """
    ChatPane { height: 1fr; }
    ChatPane #messages { height: 1fr; }
    ChatPane #chat-status { height: 1; color: $text-muted; padding: 0 1; }
    ChatPane #chat-welcome { color: $text-muted; padding: 1 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.transcript = Transcript()
        self.active_request_id: str | None = None
        self.last_reply: ChatMessage | None = None
        self.reply_worker: Worker | None = None

    @property
    def kvdeck(self) -> KvdeckApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="messages"):
            yield Static(WELCOME, id="chat-welcome")
        yield Static(id="chat-status")
        yield Input(placeholder="Message · Enter sends · Esc stops", id="prompt")

    def on_mount(self) -> None:
        self.transcript.system_prompt = self.kvdeck.chat_settings.system_prompt
        self.query_one("#messages", VerticalScroll).anchor()
        self.update_status()

    @property
    def generating(self) -> bool:
        return self.active_request_id is not None

    def update_status(self, note: str = "") -> None:
        settings = self.kvdeck.chat_settings
        seed = "random" if settings.seed is None else str(settings.seed)
        text = (f"temp {settings.temperature:g} · top_p {settings.top_p:g} · "
                f"max {settings.max_tokens} tok · seed {seed}")
        if note:
            text = f"{note} · {text}"
        self.query_one("#chat-status", Static).update(text)

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if not text:
            return
        if self.generating:
            self.notify("A reply is still streaming: press Esc to stop it.", severity="warning")
            return
        if not self.kvdeck.engine_ready:
            self.notify("The engine is not ready yet.", severity="warning")
            return
        event.input.value = ""
        await self.send(text)

    async def send(self, text: str) -> None:
        self.transcript.system_prompt = self.kvdeck.chat_settings.system_prompt
        self.transcript.model = self.kvdeck.model_name
        self.transcript.turns.append(ChatTurn("user", text))
        self.kvdeck.save_transcript(self.transcript)
        messages = self.query_one("#messages", VerticalScroll)
        await messages.query("#chat-welcome").remove()
        await messages.mount(ChatMessage("user", text))
        reply = ChatMessage("assistant")
        await messages.mount(reply)
        messages.anchor()
        self.last_reply = reply
        self.active_request_id = f"chat-{uuid.uuid4().hex[:8]}"
        self.update_status("generating")
        messages_so_far = self.transcript.messages()
        turn = ChatTurn("assistant", "")  # filled in as the reply streams, saved as it grows
        self.transcript.turns.append(turn)
        self.reply_worker = self._stream_reply(reply, self.transcript, turn, messages_so_far,
                                               self.active_request_id)

    @work(group="chat", exclusive=True)
    async def _stream_reply(self, reply: ChatMessage, transcript: Transcript, turn: ChatTurn,
                            messages: list[dict], request_id: str) -> None:
        app = self.kvdeck
        meter = ReplyMeter(app.dashboard_state)
        # Created at the first delta: a MarkdownStream stopped before its task ever ran
        # raises CancelledError into the caller (it killed this worker before it could
        # clear active_request_id, and the chat stayed "generating" for good).
        stream: MarkdownStream | None = None
        text = ""
        error = ""
        last_save = time.monotonic()
        try:
            params = app.chat_settings.sampling_params()
            async for out in app.client.generate(None, params, request_id=request_id,
                                                 messages=messages):
                meter.observe(out)
                if out.outputs:
                    text = out.outputs[0].text
                if out.delta_text:
                    if stream is None:
                        stream = Markdown.get_stream(reply.markdown)
                    await stream.write(displayable(out.delta_text))
                if time.monotonic() - last_save > SAVE_EVERY_S:  # a crash loses little
                    turn.content = text
                    app.save_transcript(transcript)
                    last_save = time.monotonic()
        except Exception as exc:  # engine died or bad input: keep what arrived, say why
            error = f"error: {exc}"
            app.check_engine_health()
        finally:
            self.active_request_id = None
            if stream is not None:
                await stream.stop()
        reply.content = text
        stats = meter.result().describe()
        if error:
            stats = f"{stats} · {error}"
        reply.set_stats(stats)
        turn.content, turn.stats = text, stats
        app.save_transcript(transcript)
        self.update_status()

    async def stop(self) -> None:
        """Stop the streaming reply; the partial text stays in the chat and the transcript."""
        if self.active_request_id is not None:
            await self.kvdeck.client.abort(self.active_request_id)

    async def new_chat(self) -> None:
        await self.stop()
        await self.workers_done()
        system_prompt = self.kvdeck.chat_settings.system_prompt
        await self.show_transcript(Transcript(system_prompt=system_prompt))

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
            [ChatMessage(turn.role, turn.content, turn.stats) for turn in transcript.turns]
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
        self.query_one("#prompt", Input).focus()

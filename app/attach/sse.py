"""Server-Sent Events from an httpx response: (event name, data) pairs as they arrive.

Only what the servers kvdeck attaches to send: `event:` and `data:` fields, events ended by
a blank line, comments (`:`) ignored, several data lines joined with newlines (the SSE
spec). An event without a name is a "message".
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx


@dataclass(slots=True)
class ServerSentEvent:
    event: str = "message"
    data_lines: list[str] = field(default_factory=list)

    @property
    def data(self) -> str:
        return "\n".join(self.data_lines)


async def server_sent_events(response: httpx.Response) -> AsyncIterator[ServerSentEvent]:
    current = ServerSentEvent()
    async for line in response.aiter_lines():
        if not line:
            if current.data_lines:
                yield current
            current = ServerSentEvent()
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            current.event = value
        elif name == "data":
            current.data_lines.append(value)
        # "id", "retry" and ":" comments are not used here
    if current.data_lines:  # a server that closed without the final blank line
        yield current

"""The dashboard's LoRA slots: which adapter sits in each of the engine's max_loras device
slots (with its rank; a free slot is a dot) and how many adapters the host keeps checked
(the LRU of max_cpu_loras). Hidden while the engine runs without LoRA."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import Static

if TYPE_CHECKING:
    from kvdeck.engine.types.stats import EngineStats

SLOT_COLOURS = ("#4363d8", "#3cb44b", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45", "#469990")
FREE_COLOUR = "#7a7a7a"


def lora_slots_text(stats: EngineStats | None) -> Text:
    """`slots [0 sql r8] [1 ·] ... · host 2/8`; empty without LoRA."""
    text = Text()
    slots = stats.lora if stats is not None else None
    if slots is None:
        return text
    text.append("slots ")
    for i, (name, rank) in enumerate(zip(slots.slot_adapters, slots.slot_ranks)):
        if name is None:
            text.append(f"[{i} ·]", style=FREE_COLOUR)
        else:
            text.append(f"[{i} ", style="bold")
            text.append(name, style=f"bold {SLOT_COLOURS[i % len(SLOT_COLOURS)]}")
            text.append(f" r{rank}]", style="bold")
        text.append(" ")
    used = sum(name is not None for name in slots.slot_adapters)
    text.append(f"· {used}/{len(slots.slot_adapters)} in use · host {slots.host_adapters}/"
                f"{slots.max_cpu_loras}", style="dim")
    return text


class LoRASlots(Static):
    DEFAULT_CSS = "LoRASlots { display: none; height: auto; }"

    def show(self, stats: EngineStats | None) -> None:
        text = lora_slots_text(stats)
        self.display = bool(text.plain)
        if self.display:
            self.update(text)

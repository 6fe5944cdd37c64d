"""The request inspector from the keyboard alone: Tab reaches the request table, ↑↓ and j/k
move the selection, Enter shows the request, Escape goes back to the chat input."""

from __future__ import annotations

import asyncio

from kvdeck.engine.types.sampling_params import SamplingParams
from kvdeck.tui.widgets.block_map import BlockMap
from kvdeck.tui.widgets.chat_input import ChatInput
from kvdeck.tui.widgets.request_inspector import NOTHING_SELECTED, RequestInspector
from kvdeck.tui.widgets.request_table import RequestTable
from tests.tui.conftest import wait_for


def block_table_line(factory, request_id: str) -> str:
    table = {r.request_id: r.block_table for r in factory.client.snapshot().requests}[request_id]
    return "  ".join(f"{i}→{b}" for i, b in enumerate(table))


async def test_tab_arrows_enter_and_escape_drive_the_inspector(make_app):
    # Slow tokens: the requests and their block tables hold still while the test looks.
    app, factory = make_app(token_delay=3.0, num_blocks=256)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        app.load_spec.num_requests = 3
        app.run_load(app.load_spec)
        screen = app.screen
        inspector = screen.query_one(RequestInspector)
        table = inspector.table
        assert await wait_for(pilot, lambda: table.row_count == 3)
        assert isinstance(app.focused, ChatInput)
        for _ in range(6):  # Tab, never a click, reaches the table
            if isinstance(app.focused, RequestTable):
                break
            await pilot.press("tab")
        assert app.focused is table
        assert inspector.selected_id is None  # passing through selects nothing
        # Its keys are in the footer while it has the focus.
        assert screen.active_bindings["enter"].binding.id == "inspect_request"
        assert screen.active_bindings["escape"].binding.id == "leave_request_table"
        rows = [table.coordinate_to_cell_key((row, 0)).row_key.value for row in range(3)]
        detail = inspector.query_one("#request-detail")
        assert NOTHING_SELECTED in str(detail.render())
        await pilot.press("down")
        assert await wait_for(pilot, lambda: inspector.selected_id == rows[1])
        await pilot.press("k")
        assert await wait_for(pilot, lambda: inspector.selected_id == rows[0])
        await pilot.press("j", "j")
        assert await wait_for(pilot, lambda: inspector.selected_id == rows[2])
        await pilot.press("up")
        assert await wait_for(pilot, lambda: inspector.selected_id == rows[1])
        await pilot.press("enter")
        await pilot.pause(0.2)  # a few dashboard redraws: the selection holds
        assert inspector.selected_id == rows[1] and table.cursor_request == rows[1]
        assert block_table_line(factory, rows[1]) in str(detail.render())
        assert screen.query_one(BlockMap).selected_request == rows[1]
        # Escape leaves the table for the chat input; the request stays shown; no reply
        # was stopped (none streams) and the load burst goes on.
        await pilot.press("escape")
        assert isinstance(app.focused, ChatInput)
        assert inspector.selected_id == rows[1]
        assert app.load.running
        await app.load.stop()


async def test_the_request_tables_keys_are_in_the_help(make_app):
    app, factory = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        ids = {binding.id for _, bindings in app.binding_groups() for binding in bindings}
        assert {"inspect_request", "next_request", "previous_request", "leave_request_table",
                "chat_newline", "chat_newline_shift"} <= ids


async def test_the_cursor_stays_on_its_request_when_the_rows_are_resorted(make_app):
    app, factory = make_app(token_delay=3.0, num_blocks=256)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        app.load_spec.num_requests = 3
        app.run_load(app.load_spec)
        inspector = app.screen.query_one(RequestInspector)
        table = inspector.table
        assert await wait_for(pilot, lambda: table.row_count == 3)
        rows = [table.coordinate_to_cell_key((row, 0)).row_key.value for row in range(3)]
        await factory.client.abort(rows[1])  # finished: listed last, dimmed
        assert await wait_for(pilot, lambda: table.get_row_index(rows[1]) == 2)
        table.focus()
        await pilot.press("down", "down")
        assert await wait_for(pilot, lambda: inspector.selected_id == rows[1])
        # A new request arrives: running requests sort above finished ones, so the
        # selected one moves down a row; the cursor moves with it.
        late = factory.client.generate([5] * 20, SamplingParams(max_tokens=4), request_id="late")
        first_output = asyncio.ensure_future(anext(late))
        assert await wait_for(pilot, lambda: table.row_count == 4)
        await pilot.pause(0.2)
        assert table.get_row_index("late") == 2 and table.get_row_index(rows[1]) == 3
        assert table.cursor_request == rows[1] == inspector.selected_id
        await pilot.press("up")  # from where the cursor is now: the new request
        assert await wait_for(pilot, lambda: inspector.selected_id == "late")
        await factory.client.abort("late")
        first_output.cancel()
        await app.load.stop()


async def test_f3_from_the_request_table_stays_on_the_next_tab(make_app):
    """The table lives in the Blocks tab: with the focus in it, f3 used to open the latency
    tab for a moment and TabbedContent went back to the tab holding the focus."""
    app, factory = make_app(token_delay=3.0, num_blocks=256)
    async with app.run_test(size=(160, 48)) as pilot:
        assert await wait_for(pilot, lambda: app.engine_ready)
        app.load_spec.num_requests = 2
        app.run_load(app.load_spec)
        screen = app.screen
        table = screen.query_one(RequestInspector).table
        assert await wait_for(pilot, lambda: table.row_count == 2)
        table.focus()
        await pilot.pause()
        tabs = screen.query_one("#dashboard-tabs")
        await pilot.press("f3")
        await pilot.pause(0.3)
        assert tabs.active == "tab-latency"
        assert not table.has_focus  # the focus went to the tab bar, out of the hidden tab
        await pilot.press("f3", "f3")  # latency → speculation → blocks
        await pilot.pause(0.3)
        assert tabs.active == "tab-blocks"

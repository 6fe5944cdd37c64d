"""The planner runs where torch is not installed: importing it (and the scheduler and block
manager it drives) loads no torch."""

import subprocess
import sys

MODULES = ("kvdeck.app.plan.planner", "kvdeck.app.plan.simulate", "kvdeck.app.plan.report",
           "kvdeck.app.plan.recording", "kvdeck.app.cli.plan", "kvdeck.engine.core.scheduler",
           "kvdeck.engine.core.block_manager")


def test_plan_imports_no_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "from kvdeck.app.plan.planner import PlanOptions, plan\n"
            + "plan(PlanOptions(model='Qwen3-0.6B', gpu='L4', users=2, prompt_len='64', output_len='8'))\n"
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout

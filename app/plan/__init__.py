"""`kvdeck plan`: a capacity planner on the real scheduler and block manager, torch-free.

The engine's own Scheduler and BlockManager (engine/core) run in simulated time against a
workload (workload.py: synthetic users and turns; recording.py: a recorded session); each
step's duration comes from a step-cost model (cost_model.py: fitted to measured steps, or a
roofline of a named GPU (gpus.py) and model shape (model_shapes.py)). simulate.py runs one
engine choice, choices.py names the alternatives, report.py prints the comparison and the
verdict. Nothing here imports torch (tests/app/test_plan_imports.py checks it).
"""

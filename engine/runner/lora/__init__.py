"""Multi-LoRA serving in the runner: adapters (adapter.py), device slots (slots.py), the
manager that loads them and tells each step's rows their slot (manager.py)."""

"""``recallspec bench --suite``: every method answers every question (``runner.py``),
the suite's methods (``methods.py``), the report (``report.py``); and EMS-SD's padded
batch layouts, the benchmark ablation of the engine's runner (``padded_layouts.py``)."""

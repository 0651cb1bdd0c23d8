"""The cost model: what a forward of k rows costs, measured, cached and used to size drafts.

``curve`` (``CostCurve``: a positive, rising price per rows and context), ``plan`` (which
points to measure within a time budget), ``calibration`` (measuring them), ``cache`` (curves
under the model cache), ``job`` (measuring in the background of a serving engine), ``source``
(where an engine's curve comes from), ``sizing`` (choosing each request's draft size
from acceptance estimates and the curve), and for a mixture of experts ``experts`` (its
curve re-priced at the experts its running forwards wake) and ``expert_counts`` (what
the native forward's counters and weights say of them).
"""

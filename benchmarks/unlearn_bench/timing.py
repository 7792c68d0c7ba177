"""The benchmark's timing references, data of the comparison rather than code: every row's wall time is also
given as a ratio to :data:`TIME_BASELINE`'s (the column ``time / GradDiff``), and the rows of
:data:`FORWARD_TIMED` (a one-shot fit whose cost is a few forward passes) as a ratio to one plain forward pass
over the same rows (``time / forward pass``)."""

#: The method whose wall time is the unit of ``time_vs_grad_diff``.
TIME_BASELINE = "grad_diff"
#: The methods timed against one plain forward pass (``time_vs_forward``).
FORWARD_TIMED = ("grom",)

"""voxpool's pure decision logic: no I/O, no threads, no clock, no async.

Every state machine here is sans-IO in the style of h11: methods take an event
(and ``now`` in seconds where time matters, supplied by the caller), mutate
state, and return a value that says what the caller must do and why.
"""

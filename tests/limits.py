"""Time limits of the tests, in a module that imports nothing (a spawned test process imports it cheaply)."""

# How long a stop (a signal, a cancelled queue, an abort) may take before a test calls it a hang. The promise is
# seconds, and the tests check what a stop keeps and cancels; this bound only tells a hang from a stop, with room
# to spare on a cold or loaded machine, so that no wall clock decides a test of working code.
STOP_WITHIN = 30.0

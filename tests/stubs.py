"""Stand-ins shared by the tests and their subprocesses (tests/cli_worker.py)."""

from scalelong_edu import cost


def untimed_estimate(*args) -> cost.Estimate:
    """``experiments.estimate_here`` as a zero-minute stub, for tests about something else: the
    estimate builds, counts and times models of its own, seconds a process, and for the `gpu`
    presets on a CPU as much as training them (tests/test_cost.py tests the estimate)."""
    work = cost.Work((cost.RunWork(cost.ModelCost("stub", 1.0, 1.0), 1, 0, 0),), "stub", 16, 8)
    return cost.Estimate(work, 0.0, "cpu", "not timed here")

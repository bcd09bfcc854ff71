"""`python -m scalelong_edu run` on a tiny experiment, as a separate process (see test_experiments.py).

``python cli_worker.py [STEPS SEEDS [CLI ARGS ...]]``: each run trains STEPS steps (default 4) over
SEEDS seeds (default 1); under torchrun, or with ``--workers 2`` to kill a worker from outside.
"""

import sys
from dataclasses import replace

from scalelong_edu import experiments as ex
from scalelong_edu.__main__ import main
from scalelong_edu.profiles import PROFILES
from stubs import untimed_estimate

steps, seeds = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (4, 1)
PROFILES["tiny"] = replace(PROFILES["ci"], name="tiny", steps=steps, eval_every=2 if steps < 10 else steps // 2,
                           batch_size=8, n_samples=4, sample_steps=2, seeds=seeds, seed_cap=None)
ex.estimate_here = untimed_estimate
ex.EXPERIMENTS["quick"] = ex.Experiment("quick", "two tiny runs", (ex.RunSpec("none"), ex.RunSpec("CS", method="cs")),
                                        robustness_sigmas=(0.0, 0.1))
if __name__ == "__main__":  # spawned worker processes import this file too
    sys.exit(main(["run", "quick", "--profile", "tiny", *sys.argv[3:]]))

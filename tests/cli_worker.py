"""`python -m scalelong_edu run` on a tiny experiment; run under torchrun (see test_experiments.py)."""

import sys
from dataclasses import replace

from scalelong_edu import experiments as ex
from scalelong_edu.__main__ import main
from scalelong_edu.profiles import PROFILES

PROFILES["tiny"] = replace(PROFILES["ci"], name="tiny", steps=4, eval_every=2, batch_size=8, n_samples=4,
                           sample_steps=2, seeds=1)
ex.EXPERIMENTS["quick"] = ex.Experiment("quick", "two tiny runs", (ex.RunSpec("none"), ex.RunSpec("CS", method="cs")),
                                        robustness_sigmas=(0.0, 0.1))
sys.exit(main(["run", "quick", "--profile", "tiny"]))

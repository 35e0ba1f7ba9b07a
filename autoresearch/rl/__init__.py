"""One RL trial: its config, the GRPO loop over the `tinker` SDK, advantages, and its record.

Owns `TrialConfig`, `run_trial`, the trial directory format (`TrialRecord`) and reading back
the samples a trial wrote. May import `autoresearch.evaluation`, `rewards` and `sqltasks`;
knows nothing of studies or notebooks.
"""

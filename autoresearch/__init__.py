"""autoresearch: an LLM research agent that runs RL post-training studies over the `tinker` SDK.

Layers, each a folder that imports only the ones below it (checked by `lint-imports`):

    cli            the `autoresearch` command
    ui             notebooks: live study snapshots, widgets, plots, the HTML report
    study          studies: spec, search space, proposers, executors, journal, runner, report
    rl             one trial: config, GRPO loop over the SDK, advantages, its record on disk
    evaluation     greedy evaluation of a sampler on a split, and the statistics of accuracy

It may import `rewards`, `sqltasks` and (for an embedded training server) `server`.
"""

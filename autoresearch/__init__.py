"""autoresearch: an LLM research agent that runs RL post-training studies over the `tinker` SDK.

Layers, each a folder that imports only the ones below it (checked by `lint-imports`):

    cli            the `autoresearch` command
    ui             notebooks: live study snapshots, widgets, plots, the HTML report
    study          studies: spec, search space, proposers, executors, journal, runner, report
    rl             one trial: config, GRPO loop over the SDK, advantages, its record on disk
    evaluation     greedy evaluation of a sampler on a split, and the statistics of accuracy

It may import `rewards`, `sqltasks` and (for an embedded training server) `server`.
"""

from server.engine.host_memory import one_malloc_arena

# An embedded training server may run in this process (the command line, a notebook, a
# benchmark): its engine thread must share the one malloc arena whose freed memory it keeps, and
# the imports below this package (numpy, scipy, statsmodels) start threads that would otherwise
# make a second one (`server.engine.host_memory`).
one_malloc_arena()

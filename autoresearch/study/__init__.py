"""Studies: a declared search (spec, search space, budget), proposers, executors, the journal,
keep/discard decisions, the runner that drives them, steering, tracing and the report.

Inside, from top to bottom: `runner`; `control` and `report`; `executors` and `proposers`;
`spec`, `decisions`, `journal` and `tracing`; `space`. May import `autoresearch.rl`,
`autoresearch.evaluation`, `rewards`, and `server.entrypoints.runtime` (an embedded server);
never `autoresearch.ui`.
"""

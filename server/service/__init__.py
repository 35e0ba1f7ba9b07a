"""The request service: sessions, training runs, sampling and REST/checkpoint requests,
turned into engine work behind quotas and futures.

One module per concern, all sharing the state in `core`: `sessions` (sessions, heartbeats,
the idle-time lifecycle hooks), `ordering` (each run's `seq_id` order, duplicates, refusals
that keep their place), `training` (runs created, forward/backward, optimizer steps, deleted),
`checkpoints` (run state saved and loaded), `exports` (PEFT exports over signed URLs),
`sampling` (sampling sessions, snapshots, sample requests) and `rest` (runs and checkpoints
listed, deleted, published). `service.TrainingService` combines them into the one object the
API and the distributed trainer use. Below them: `errors`, `records`, `lifecycle`,
`request_fields`, `optim_params`, `sampling_records`, `session_search`.

May import `server.scheduling`, `storage`, `engine`, `protocol` and `observability`.
"""

"""Rehearse the GKE deployment on one machine, from the manifests as rendered.

`manifests` reads what `kustomize build` gives (workloads, images, environment, volumes,
Services); `cluster` runs it as local processes the way a kubelet would (volumes as
directories, read-only mounts enforced when run as root, Services as local proxies, probes,
restarts); `scenario` drives an SDK training loop through the API Service while it kills and
restarts one role at a time, and reports the timeline.

    python -m tools.rehearsal split --trainers 2
"""

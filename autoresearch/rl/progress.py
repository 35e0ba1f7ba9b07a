"""Progress display for trials: a tqdm bar showing the current reward and accuracy."""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm


class TrialProgress:
    """A callable for `Trial(progress=...)` that drives one progress bar per trial."""

    def __init__(self, total_steps: int, description: str = "trial"):
        self.bar = tqdm(total=total_steps, desc=description, unit="step", dynamic_ncols=True)
        self.last: dict[str, Any] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("type") == "step":
            self.bar.update(1)
            post = {"phase": event["phase"]}
            if "reward_mean" in event:
                post["reward"] = f"{event['reward_mean']:.3f}"
                post["acc"] = f"{event['accuracy']:.2f}"
            if "loss_per_token" in event:
                post["loss"] = f"{event['loss_per_token']:.3f}"
            if "dev_acc" in self.last:
                post["dev_acc"] = self.last["dev_acc"]
            self.bar.set_postfix(post)
        elif event.get("phase") == "eval":
            self.last["dev_acc"] = f"{event['accuracy']:.3f}"
            self.bar.write(
                f"eval {event['stage']} on {event['split']}: accuracy {event['accuracy']:.3f}"
            )
        elif event.get("phase") == "done":
            self.bar.close()

    def close(self) -> None:
        self.bar.close()

"""Reads a TensorBoard log directory with tensorboard's own event reader and
prints {tag: [[step, value, wall_time], ...]} as JSON (for Go tests)."""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({tag: [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}))

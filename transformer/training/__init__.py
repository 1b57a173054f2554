"""Training: the loop (`train_lib.py`), the pure train/eval steps (`steps.py`), the
label-smoothed loss (`losses.py`), the paper's optimizer and schedule (`optimizer.py`), data
parallelism over a mesh or pmap (`parallel.py`), multi-host start-up (`distributed.py`),
metrics (`metric_writer.py`), and run supervision beside the loop (`supervision.py`, over the
peers' watch `peer_watch.py` and the stop signals `preemption.py`)."""

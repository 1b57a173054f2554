"""What training and evaluation both stand on: the config's schema and checks (`schema.py`,
`config_checks.py`), the config a workdir keeps and its lock (`workdir.py`), checkpoints, the
parameter snapshots kept for averaging and their averaging (`checkpoint.py`), the disk they
take (`disk.py`), how orbax saves replicated arrays on the CPU (`cpu_saves.py`), orbax's
failure reports kept behind one line (`orbax_failures.py`), the writability check
(`writable.py`) and the compilation cache (`compilation.py`)."""

"""What training and evaluation both stand on: the config's checks (`config_checks.py`), the
config a workdir keeps and its lock (`workdir.py`), checkpoints and their averaging
(`checkpoint.py`), and the compilation cache (`compilation.py`)."""

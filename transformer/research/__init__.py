"""Research tools over trained workdirs: sweeps of named variants (`sweep.py`), reports beside
the paper's tables (`report.py`, `plots.py`), attention heatmaps and sentence embeddings
(`inspection.py`), parameter counts (`params.py`)."""

"""Research tools over trained workdirs: sweeps of named variants, grids and seeds (`sweep.py`;
the runs a sweep makes, `grid.py`; running several at once, each on its own devices,
`launch.py`), reports beside the paper's tables with mean ± std over seeds (`report.py`,
`plots.py`) and paired significance against a baseline through sacreBLEU (`significance.py`),
attention heatmaps and sentence embeddings (`inspection.py`), parameter counts
(`params.py`)."""

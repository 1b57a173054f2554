"""Evaluation: sacreBLEU, the paper's tokenized compound-split BLEU and chrF (`scoring.py`),
and a trained workdir translated and scored (`evaluate_lib.py`, behind `evaluate.py`)."""

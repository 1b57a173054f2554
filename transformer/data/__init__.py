"""Data: corpora (TFDS, aligned text files, the built-in synthetic pair) and their tokenized
cache (`datasets.py`), the shared SentencePiece vocabulary (`tokenizer.py`), one builder per
cache entry among processes sharing a cache (`cache_lock.py`), token-count batches by length
bucket or packing (`batch_layouts.py`) and the datasets training reads (`input_pipeline.py`),
UTF-8 text files (`textio.py`)."""

"""Reserved token ids, shared by the tokenizer, the model, the pipeline and decoding.

The SentencePiece vocabulary is trained with exactly these ids (`pad_id=0, eos_id=1,
unk_id=2, bos_id=-1`). PAD_ID doubles as the decoder's start symbol: targets are shifted
right with it, as in tensor2tensor and Flax's WMT example.
"""

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2

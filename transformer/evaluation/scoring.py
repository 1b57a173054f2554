"""Translation quality scores, shared by training-time evaluation and evaluate.py.

Two BLEU figures, each labelled, and chrF (paper §6.1, PAPER.md "Inference and scoring"):
- sacreBLEU on detokenized text (13a tokenizer, mixed case), with its signature: the
  comparable standard today.
- Tokenized BLEU with compound splitting, as tensor2tensor's `get_ende_bleu.sh` computed the
  paper's Table 2 figures: the Moses tokenizer (sacremoses, escaping on as in tokenizer.perl),
  then every `a-b` rewritten `a ##AT##-##AT## b` in hypotheses and references alike, then
  corpus BLEU on those tokens (sacreBLEU with tokenize='none' and no smoothing, as
  multi-bleu.perl). It runs about 0.7-1.0 above sacreBLEU on the same output.
- chrF (sacreBLEU's defaults: character 6-grams, β = 2).

Each BLEU carries its brevity penalty and the hypothesis/reference length ratio beside the
score: the same BLEU can come from short output with precise n-grams (BP < 1) or from output
of the right length, and only these two figures tell them apart.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
from typing import Sequence

import sacrebleu

from transformer.errors import ConfigError
from transformer.data.textio import write_lines

SACREBLEU_LABEL = "sacreBLEU (detokenized, 13a, mixed case)"
TOKENIZED_LABEL = ("tokenized BLEU with compound splitting (Moses + ##AT##, multi-bleu style), "
                   "comparable to the paper's Table 2")
CHRF_LABEL = "chrF (sacreBLEU)"

# get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'. Python's re.sub scans
# non-overlapping matches left to right exactly as Perl's s///g does ("a-b-c" keeps "b-c").
_COMPOUND = re.compile(r"(\S)-(\S)")


def _moses(lang: str):
  # Imported here: compiling its patterns takes 0.3-0.4 s, which the processes that import
  # this module without scoring (a refused evaluate.py, report.py) need not spend.
  import sacremoses

  return sacremoses.MosesTokenizer(lang=lang)


def tokenize_compound_split(lines: Sequence[str], lang: str = "de") -> list[str]:
  """Moses-tokenizes each line and splits hyphenated compounds as get_ende_bleu.sh does."""
  moses = _moses(lang)
  return [_COMPOUND.sub(r"\1 ##AT##-##AT## \2", moses.tokenize(line, return_str=True,
                                                               escape=True))
          for line in lines]


def _check(hypotheses: Sequence[str], references: Sequence[str]) -> None:
  if len(hypotheses) != len(references):
    raise ConfigError(f"{len(hypotheses)} hypotheses but {len(references)} references; they "
                     "must be aligned line by line")


def _lengths(bleu: sacrebleu.metrics.bleu.BLEUScore) -> dict:
  """sacreBLEU's brevity penalty and lengths (in the tokens it counts) of one corpus BLEU."""
  return {"brevity_penalty": float(bleu.bp), "length_ratio": float(bleu.ratio),
          "hyp_len": int(bleu.sys_len), "ref_len": int(bleu.ref_len)}


def sacrebleu_score(hypotheses: Sequence[str], references: Sequence[str]
                    ) -> tuple[float, str, dict]:
  """Corpus sacreBLEU on detokenized text: `(score, signature, lengths)`, the lengths as
  `brevity_penalty`, `length_ratio`, `hyp_len` and `ref_len` (13a tokens)."""
  _check(hypotheses, references)
  bleu = sacrebleu.metrics.BLEU()
  score = bleu.corpus_score(list(hypotheses), [list(references)])
  return score.score, str(bleu.get_signature()), _lengths(score)


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str],
                   lang: str = "de") -> tuple[float, str, dict]:
  """The paper's tokenized, compound-split BLEU: `(score, signature, lengths)` (lengths as
  `sacrebleu_score`'s, in Moses tokens)."""
  _check(hypotheses, references)
  # force: the input is tokenized on purpose; no warning about it.
  bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
  score = bleu.corpus_score(tokenize_compound_split(hypotheses, lang),
                            [tokenize_compound_split(references, lang)])
  return (score.score, f"moses:{lang}|compound-split:##AT##|{bleu.get_signature()}",
          _lengths(score))


def chrf_score(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
  """Corpus chrF: `(score, signature)`."""
  _check(hypotheses, references)
  chrf = sacrebleu.metrics.CHRF()
  return chrf.corpus_score(list(hypotheses), [list(references)]).score, str(chrf.get_signature())


def score(hypotheses: Sequence[str], references: Sequence[str], lang: str = "de") -> dict:
  """All three scores, each with its signature and a label saying what it is comparable to;
  the two BLEUs with their brevity penalty and length ratio.

  Args:
    hypotheses: detokenized system output, one sentence per item.
    references: the aligned reference translations.
    lang: target language, for the Moses tokenizer.

  Returns:
    `{'sacrebleu' | 'tokenized_bleu' | 'chrf': {'score': float, 'signature': str,
    'label': str}}`, JSON-serialisable; the two BLEUs also hold `brevity_penalty`,
    `length_ratio` (hypothesis / reference length) and `hyp_len`, `ref_len` (in the tokens
    that BLEU counts: 13a tokens for sacreBLEU, Moses tokens for the tokenized BLEU).
  """
  results = {}
  for name, fn, label in [
      ("sacrebleu", sacrebleu_score, SACREBLEU_LABEL),
      ("tokenized_bleu", functools.partial(tokenized_bleu, lang=lang), TOKENIZED_LABEL)]:
    value, signature, lengths = fn(hypotheses, references)
    results[name] = {"score": float(value), "signature": signature, "label": label, **lengths}
  value, signature = chrf_score(hypotheses, references)
  results["chrf"] = {"score": float(value), "signature": signature, "label": CHRF_LABEL}
  return results


def scalars(scores: dict) -> dict[str, float]:
  """`{'sacrebleu': ..., 'tokenized_bleu': ..., 'chrf': ...}` from `score`'s result, for logs,
  with sacreBLEU's `sacrebleu_brevity_penalty` and `sacrebleu_length_ratio` beside them."""
  out = {name: s["score"] for name, s in scores.items()}
  if "length_ratio" in scores.get("sacrebleu", {}):
    out["sacrebleu_brevity_penalty"] = scores["sacrebleu"]["brevity_penalty"]
    out["sacrebleu_length_ratio"] = scores["sacrebleu"]["length_ratio"]
  return out


def format_lengths(result: dict) -> str:
  """`BP 0.690, length ratio 0.730 (hyp 1234 / ref 1690)` for one BLEU of `score`'s result;
  '' for a score without lengths (chrF)."""
  if "length_ratio" not in result:
    return ""
  return (f"BP {result['brevity_penalty']:.3f}, length ratio {result['length_ratio']:.3f} "
          f"(hyp {result['hyp_len']} / ref {result['ref_len']})")


def format_scores(scores: dict) -> str:
  """Readable lines, one per score: `label: value  BP …, length ratio …  (signature)`, the
  value to the score's `digits` (2 unless it says)."""
  lines = []
  for s in scores.values():
    lengths = format_lengths(s)
    lines.append(f"{s['label']}: {s['score']:.{s.get('digits', 2)}f}  "
                 f"{lengths + '  ' if lengths else ''}({s['signature']})")
  return "\n".join(lines)


def write_tokenized(hypotheses: Sequence[str], references: Sequence[str],
                    directory: str | os.PathLike, lang: str = "de",
                    prefix: str = "") -> tuple[pathlib.Path, pathlib.Path]:
  """Writes the compound-split tokenized hypotheses and references, for multi-bleu.perl or
  `sacrebleu REF -i HYP --tokenize none --smooth-method none`.

  Returns:
    `(hypotheses_path, references_path)`: `<prefix>hyp.tok.atat`, `<prefix>ref.tok.atat`.
  """
  _check(hypotheses, references)
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  return (write_lines(directory / f"{prefix}hyp.tok.atat",
                      tokenize_compound_split(hypotheses, lang)),
          write_lines(directory / f"{prefix}ref.tok.atat",
                      tokenize_compound_split(references, lang)))

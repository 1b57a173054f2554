"""Scores, brevity penalty and length ratio against sacreBLEU's own command line on the same
files, on German sentences written here, and newstest2014 (from the shared data) scored
against itself."""

import json
import re
import subprocess
import sys

import pytest

from transformer.evaluation import scoring
from transformer.data import textio


def _sacrebleu_cli(reference, hypothesis, *options) -> float:
  out = subprocess.run(
      [sys.executable, "-m", "sacrebleu", str(reference), "-i", str(hypothesis), "-b", "-w", "6",
       *options], check=True, capture_output=True, text=True)
  return float(out.stdout.strip())


def _degrade(lines):
  """A deterministic imperfect "system output": drops and swaps some words."""
  out = []
  for n, line in enumerate(lines):
    words = line.split()
    words = [w for i, w in enumerate(words) if (i + n) % 7 != 3]
    if len(words) > 3 and n % 3 == 0:
      words[1], words[2] = words[2], words[1]
    out.append(" ".join(words))
  return out


# News-style German written for these tests: hyphenated compounds to split, quotes, numbers,
# abbreviations and punctuation for the Moses tokenizer.
GERMAN = [
    "Die Bundesregierung hat am Mittwoch ein neues Klima-Paket vorgestellt, das bis 2030 "
    "gelten soll.",
    "Nach Angaben des Statistischen Bundesamts stiegen die Verbraucherpreise im März um "
    "2,4 Prozent.",
    "„Wir haben keine Zeit zu verlieren“, sagte die Ministerin in Berlin.",
    "Der SPD-Vorsitzende kündigte eine Reform der Renten-Versicherung an.",
    "Die Polizei sperrte die A7 zwischen Hamburg-Nord und Quickborn für mehrere Stunden.",
    "Im Ost-West-Vergleich liegen die Löhne in Sachsen noch immer deutlich niedriger.",
    "Der Aufsichtsrat der Deutschen Bahn trifft sich am 12. Mai zu einer Sondersitzung.",
    "Experten warnen vor einem Fachkräfte-Mangel in Pflege und Handwerk.",
    "Die E-Mail-Adresse des Vereins wurde nach dem Hackerangriff gesperrt.",
    "Mehr als 40.000 Menschen besuchten am Wochenende das Open-Air-Konzert im Stadtpark.",
    "Die Stadt will bis Ende des Jahres 300 neue Ladesäulen für Elektro-Autos bauen.",
    "Ein Sprecher des Unternehmens bestätigte, dass die Gespräche fortgesetzt werden.",
    "Die CDU/CSU-Fraktion lehnte den Antrag der Opposition geschlossen ab.",
    "Wegen des Sturms fielen im Nordwesten zahlreiche Züge aus.",
    "Der 54-jährige Trainer verlängerte seinen Vertrag um zwei weitere Jahre.",
    "Laut einer Umfrage halten 62 Prozent der Befragten die Maßnahmen für richtig.",
    "Die Europäische Zentralbank ließ den Leitzins unverändert bei 4,5 Prozent.",
    "Das Museum zeigt ab Freitag Werke des Expressionismus aus Privat-Sammlungen.",
    "Auf der Pressekonferenz wollte sich der Minister nicht zu Details äußern.",
    "Die Gewerkschaft rief für Donnerstag zu einem ganztägigen Warnstreik auf.",
    "Nach dem Unfall auf der B-27 bildete sich ein kilometerlanger Stau.",
    "Die Forscher veröffentlichten ihre Ergebnisse in der Fachzeitschrift „Nature“.",
    "Der Bürgermeister sprach von einem „schwarzen Tag“ für die Gemeinde.",
    "Bei der Landtagswahl erreichte die Partei 18,3 Prozent der Stimmen.",
]


@pytest.fixture
def newstest(shared_data):
  return textio.read_lines(shared_data / "wmt-newstest-ende" / "newstest2014.de")


def test_references_as_hypotheses_score_100(newstest):
  assert len(newstest) == 3003
  scores = scoring.score(newstest, newstest)
  for name in ("sacrebleu", "tokenized_bleu", "chrf"):
    assert scores[name]["score"] == pytest.approx(100.0)
  assert "tok:13a" in scores["sacrebleu"]["signature"]
  assert "case:mixed" in scores["sacrebleu"]["signature"]
  assert "Table 2" in scores["tokenized_bleu"]["label"]
  assert scoring.scalars(scores) == {
      **{k: v["score"] for k, v in scores.items()}, "sacrebleu_brevity_penalty": 1.0,
      "sacrebleu_length_ratio": 1.0}


def test_both_bleu_figures_agree_with_sacrebleu_run_on_the_files(tmp_path):
  references = GERMAN
  hypotheses = _degrade(references)
  assert any("-" in line for line in references)  # compounds to split
  ref_file = textio.write_lines(tmp_path / "ref.de", references)
  hyp_file = textio.write_lines(tmp_path / "hyp.de", hypotheses)
  scores = scoring.score(textio.read_lines(hyp_file), textio.read_lines(ref_file))

  assert 10 < scores["sacrebleu"]["score"] < 90
  assert scores["sacrebleu"]["score"] == pytest.approx(_sacrebleu_cli(ref_file, hyp_file),
                                                       abs=1e-4)

  hyp_tok, ref_tok = scoring.write_tokenized(hypotheses, references, tmp_path)
  assert "##AT##-##AT##" in ref_tok.read_text(encoding="utf-8")
  cli = _sacrebleu_cli(ref_tok, hyp_tok, "--tokenize", "none", "--smooth-method", "none")
  assert scores["tokenized_bleu"]["score"] == pytest.approx(cli, abs=1e-4)
  assert scores["tokenized_bleu"]["score"] != pytest.approx(scores["sacrebleu"]["score"])

  chrf = _sacrebleu_cli(ref_file, hyp_file, "--metrics", "chrf")
  assert scores["chrf"]["score"] == pytest.approx(chrf, abs=1e-4)


def test_brevity_penalty_and_length_ratio_are_sacrebleus(tmp_path):
  references = GERMAN
  short = [" ".join(line.split()[:-2]) for line in references]  # every hypothesis too short
  ref_file = textio.write_lines(tmp_path / "ref.de", references)
  hyp_file = textio.write_lines(tmp_path / "hyp.de", short)
  out = subprocess.run([sys.executable, "-m", "sacrebleu", str(ref_file), "-i", str(hyp_file),
                        "--format", "json"], check=True, capture_output=True, text=True)
  verbose = json.loads(out.stdout)["verbose_score"]  # '…/… (BP = 0.686 ratio = 0.726 …)'
  bp, ratio, hyp_len, ref_len = re.search(
      r"BP = ([\d.]+) ratio = ([\d.]+) hyp_len = (\d+) ref_len = (\d+)", verbose).groups()

  scores = scoring.score(short, references)
  s = scores["sacrebleu"]
  assert s["brevity_penalty"] == pytest.approx(float(bp), abs=5e-4) and float(bp) < 0.9
  assert s["length_ratio"] == pytest.approx(float(ratio), abs=5e-4)
  assert (s["hyp_len"], s["ref_len"]) == (int(hyp_len), int(ref_len))
  assert s["length_ratio"] == s["hyp_len"] / s["ref_len"]
  assert scores["tokenized_bleu"]["length_ratio"] < 1 and "length_ratio" not in scores["chrf"]
  line = scoring.format_scores(scores).splitlines()[0]
  assert line.startswith(f"{scoring.SACREBLEU_LABEL}: {s['score']:.2f}  BP {float(bp):.3f}, "
                         f"length ratio {float(ratio):.3f} (hyp {hyp_len} / ref {ref_len})  "
                         "(nrefs:1|")
  assert scoring.scalars(scores)["sacrebleu_length_ratio"] == s["length_ratio"]


def test_compound_splitting_follows_get_ende_bleu():
  # Perl's s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g: non-overlapping, so a one-letter middle part
  # ("b" in a-b-c) keeps its second hyphen.
  assert scoring.tokenize_compound_split(
      ["Die Mehrwert-Steuer-Erhöhung kam, a-b-c & x - Haus."]) == [
          "Die Mehrwert ##AT##-##AT## Steuer ##AT##-##AT## Erhöhung kam , "
          "a ##AT##-##AT## b-c &amp; x - Haus ."]


def test_misaligned_inputs_are_refused():
  with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
    scoring.score(["a", "b"], ["a"])

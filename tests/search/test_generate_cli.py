"""`nmt generate` and `nmt score` through the CLI, on a tiny trained checkpoint."""

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
from conftest import ONE_ROUTE, nmt

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def test_generate_split_fairseq_format(tiny_checkpoint, toy_data_bin, toy_corpus):
    r = nmt(
        "generate",
        toy_data_bin,
        "--path",
        tiny_checkpoint,
        "--gen-subset",
        "test",
        "--beam",
        3,
        "--nbest",
        2,
        "--max-len-b",
        5,
    )
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    n = len((toy_corpus / "test.src").read_text().splitlines())
    ids = [int(line.split("\t")[0][2:]) for line in lines if line.startswith("S-")]
    assert ids == list(range(n))
    assert sum(line.startswith("H-") for line in lines) == 2 * n
    assert lines[0] == "S-0\t" + (toy_corpus / "test.src").read_text().splitlines()[0]
    h = next(line for line in lines if line.startswith("H-")).split("\t")
    p = next(line for line in lines if line.startswith("P-")).split("\t")
    assert len(p[1].split()) == len(h[2].split()) + 1 if h[2] else 1
    assert "sentences/s" in r.stderr


@ONE_ROUTE  # the subject is reading, ordering and truncating lines, whatever route the products take
def test_generate_raw_text_in_order_with_empty_and_long_lines(tiny_checkpoint, tmp_path):
    src = ["1 2 3", "", "4 5 6 7 8 9", " ".join(["7"] * 300), "0"]
    r = nmt(
        "generate",
        "--path",
        tiny_checkpoint,
        "--input",
        "-",
        "--beam",
        2,
        "--buffer-size",
        2,
        input="\n".join(src) + "\n",
    )
    assert r.exit_code == 0, r.output
    out = r.stdout.split("\n")[:-1]
    assert len(out) == len(src) and out[1] == ""
    assert "truncated" in r.stderr
    f = tmp_path / "in.txt"
    f.write_text("\n".join(src) + "\n")
    r2 = nmt("generate", "--path", tiny_checkpoint, "--input", f, "--beam", 2, "--output-format", "jsonl")
    assert r2.exit_code == 0
    records = [json.loads(line) for line in r2.stdout.splitlines()]
    assert [rec["id"] for rec in records] == list(range(5))
    assert [rec["hypotheses"][0]["text"] for rec in records] == out


@ONE_ROUTE  # the subject is splitting the input and merging the outputs
def test_shards_merge_back_in_order(tiny_checkpoint, tmp_path):
    f = tmp_path / "in.txt"
    f.write_text("\n".join(f"{i} {i + 1}" for i in range(7)) + "\n")
    whole = nmt("generate", "--path", tiny_checkpoint, "--input", f).stdout
    parts = [
        nmt("generate", "--path", tiny_checkpoint, "--input", f, "--num-shards", 3, "--shard-id", i).stdout
        for i in range(3)
    ]
    assert "".join(parts) == whole


def test_greedy_and_sampling_run(tiny_checkpoint):
    for extra in (["--beam", 1], ["--sampling", "--sampling-topk", 3, "--seed", 2, "--nbest", 2]):
        r = nmt("generate", "--path", tiny_checkpoint, "--input", "-", *extra, input="1 2 3\n4 5\n")
        assert r.exit_code == 0, r.output
        assert len(r.stdout.splitlines()) == (2 if extra[0] == "--beam" else 4)


def test_an_empty_line_gets_nbest_empty_hypotheses(tiny_checkpoint):
    """One line had come out for an empty input where every other input gets --nbest: groups misaligned."""
    for fmt, per_input in (("plain", 3), ("fairseq", None)):
        args = ["--input", "-", "--nbest", 3, "--beam", 3, "--output-format", fmt]
        r = nmt("generate", "--path", tiny_checkpoint, *args, input="1 2\n\n3 4\n")
        assert r.exit_code == 0, r.output
        if per_input:
            assert len(r.stdout.splitlines()) == 9
        else:
            assert [line.split("\t")[0] for line in r.stdout.splitlines() if line.startswith("H-")] == [
                f"H-{i}" for i in range(3) for _ in range(3)
            ]


@ONE_ROUTE  # the subject is the output file's name
def test_results_path_names_the_file_after_what_is_translated(tiny_checkpoint, toy_data_bin, tmp_path):
    """Every --input had written generate-input.txt: a second file translated into the directory replaced the first."""
    (tmp_path / "a.src").write_text("1 2\n")
    (tmp_path / "b.src").write_text("3 4\n5\n")
    out = tmp_path / "out"
    for name in ("a.src", "b.src"):
        r = nmt("generate", "--path", tiny_checkpoint, "--input", tmp_path / name, "--results-path", out)
        assert r.exit_code == 0, r.output
    r = nmt("generate", "--path", tiny_checkpoint, "--input", "-", "--results-path", out, input="1\n")
    assert r.exit_code == 0, r.output
    r = nmt("generate", toy_data_bin, "--path", tiny_checkpoint, "--gen-subset", "valid", "--results-path", out)
    assert r.exit_code == 0, r.output
    names = ["generate-a.src.txt", "generate-b.src.txt", "generate-stdin.txt", "generate-valid.txt"]
    assert sorted(p.name for p in out.iterdir()) == names
    assert len((out / "generate-b.src.txt").read_text().splitlines()) == 2


def test_under_torchrun_each_rank_writes_its_shard_file(tiny_checkpoint, tmp_path, monkeypatch):
    """Every rank had written its shard to the one stdout: lines of the ranks mixed, in no fixed order."""
    (tmp_path / "in.src").write_text("".join(f"{i} {i}\n" for i in range(1, 8)))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    args = ["generate", "--path", tiny_checkpoint, "--input", tmp_path / "in.src"]
    r = nmt(*args)
    assert r.exit_code == 1 and "give --results-path DIR (one file per shard" in r.output, r.output
    r = nmt("generate", "--path", tiny_checkpoint, "--input", "-", input="1\n")
    assert r.exit_code == 1 and "under torchrun every rank translates a shard, and stdin cannot be split" in r.output
    r = nmt(*args, "--results-path", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert len((tmp_path / "out" / "generate-in.src.shard1-of-2.txt").read_text().splitlines()) == 4  # lines 4-7


def test_generate_bad_inputs(tiny_checkpoint, toy_data_bin, tmp_path):
    r = nmt("generate", "--path", tmp_path / "none.pt", "--input", "-", input="1\n")
    assert r.exit_code == 1 and "none.pt does not exist" in r.output
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00garbage")
    r = nmt("generate", "--path", junk, "--input", "-", input="1\n")
    assert r.exit_code == 1 and "not a readable nmt checkpoint" in r.output
    r = nmt("generate", "--path", tiny_checkpoint, "--input", tmp_path / "missing.txt")
    assert r.exit_code == 1 and "missing.txt does not exist" in r.output
    r = nmt("generate", toy_data_bin, "--path", tiny_checkpoint, "--input", "-")
    assert r.exit_code == 1 and "either DATA_DIR" in r.output
    r = nmt("generate", toy_data_bin, "--path", tiny_checkpoint, "--gen-subset", "test7")
    assert r.exit_code == 1 and "no split 'test7'" in r.output
    r = nmt("generate", "--path", tiny_checkpoint, "--input", "-", "--lenpen-style", "wu")
    assert r.exit_code == 2 and "--lenpen-style" in r.output
    r = nmt("generate", "--path", tiny_checkpoint, "--input", "-", "--beam", 2, "--nbest", 3, input="1\n")
    assert r.exit_code == 1 and "--nbest 3 cannot exceed --beam 2" in r.output
    r = nmt("generate", "--path", tiny_checkpoint, "--input", "-", "--max-len-a", 0, "--max-len-b", 5, "--min-len", 6)
    assert r.exit_code == 1 and "--min-len 6 exceeds every output's maximum length, --max-len-b 5" in r.output


@ONE_ROUTE  # refused before any product
def test_search_sizes_that_cannot_fit_are_one_error_line_naming_the_option(tiny_checkpoint):
    """--beam 1000000000 had died in the allocator with a traceback; --sampling's --nbest is its number of rows."""
    for options, words in [
        (["--beam", 10**9], "--beam 1000000000 cannot fit: searching even one sentence with 1000000000 hypotheses"),
        (["--sampling", "--nbest", 10**9], "--nbest 1000000000 cannot fit"),
    ]:
        r = nmt("generate", "--path", tiny_checkpoint, "--input", "-", *options, input="1 2\n")
        assert r.exit_code == 1 and words in r.output, r.output
        assert r.output.count("\n") == 1 and r.output.startswith("error: ") and "Traceback" not in r.output
    r = nmt("generate", "--path", tiny_checkpoint, "--input", "-", "--max-len-b", 10**30, input="1 2\n")
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 1, r.output  # the model's positions are the limit


def test_inputs_too_short_for_min_len_are_counted(tiny_checkpoint):
    """a*|x|+b under --min-len ends those outputs at a*|x|+b: said, not silent (2 of 3 inputs here)."""
    args = ["--max-len-a", 1, "--max-len-b", 2, "--min-len", 6]
    r = nmt("generate", "--path", tiny_checkpoint, "--input", "-", *args, input="1 2\n1 2 3 4 5 6 7\n3\n")
    assert r.exit_code == 0, r.output
    assert "2 input(s) allow fewer than --min-len 6 pieces" in r.output


def test_sampling_draws_afresh_in_every_chunk_and_follows_the_seed(tiny_checkpoint):
    """One generator for the whole run: the same line in four chunks of one line gets four samples (each
    chunk had been reseeded, so they came out alike), and a second run gives the same four."""
    args = ["--sampling", "--temperature", 5, "--max-len-a", 0, "--max-len-b", 8, "--buffer-size", 1, "--seed", 3]
    runs = [nmt("generate", "--path", tiny_checkpoint, "--input", "-", *args, input="1 2 3 4\n" * 4) for _ in range(2)]
    assert all(r.exit_code == 0 for r in runs), runs[0].output
    samples = runs[0].stdout.splitlines()
    assert len(samples) == 4 and len(set(samples)) > 1
    assert runs[1].stdout == runs[0].stdout


@ONE_ROUTE  # the subject is how a terminal's lines are read, whatever route the products take
def test_a_terminal_gets_each_translation_as_its_line_is_typed(tiny_checkpoint):
    """stdin a terminal: one line at a time (it had waited for 1,000 lines or the end of input)."""
    main, typed = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    args = ["--no-progress", "generate", "--path", str(tiny_checkpoint), "--input", "-", "--max-len-a", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_cli", *args, "--max-len-b", "3"],
        stdin=typed,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        os.write(main, b"1 2 3\n")
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and proc.stdout.readline().strip(), "no translation before the end of input"
        os.write(main, b"\x04")  # Ctrl-D: the end of input, as typed
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        os.close(main)
        os.close(typed)


def test_a_split_is_translated_in_chunks_with_the_same_output(tiny_checkpoint, toy_data_bin, monkeypatch):
    """A split goes SPLIT_CHUNK sentences at a time (a training set of millions is not held in memory whole):
    the records are the same, in the same order, as in one go: the same sources, references and hypotheses,
    and scores within SCORE_TOLERANCE.

    Not bit for bit: a sentence's batch is another in chunks, and its float32 sums are then taken in another
    order (oneDNN chooses its kernel and blocking by the row count; attention runs over the batch's padded
    length). Scores then differ in their last bits, which can move a printed 4th decimal; a hypothesis changes
    only where two candidates tie to within those bits, which this toy model's do not."""
    from nmt_cli.commands import generate as command

    whole = nmt("generate", toy_data_bin, "--path", tiny_checkpoint, "--max-len-b", 4)
    monkeypatch.setattr(command, "SPLIT_CHUNK", 7)
    chunked = nmt("generate", toy_data_bin, "--path", tiny_checkpoint, "--max-len-b", 4)
    assert whole.exit_code == chunked.exit_code == 0, chunked.output
    records = [line for line in chunked.stdout.splitlines() if line.startswith("S-")]
    assert len(records) > 7
    assert [int(line.split("\t")[0][2:]) for line in records] == list(range(len(records)))
    assert split_scores(chunked.stdout)[0] == split_scores(whole.stdout)[0]
    scores = zip(split_scores(chunked.stdout)[1], split_scores(whole.stdout)[1], strict=True)
    assert all(abs(a - b) <= SCORE_TOLERANCE for a, b in scores)


# Two float32 sums of one sentence's ~10 log-probabilities taken in another order differ by ~1e-6; printed to 4
# decimals the difference is at most one unit in the last place.
SCORE_TOLERANCE = 1.5e-4


def split_scores(output: str) -> tuple[list[str], list[float]]:
    """generate's records with every score replaced by "#" (H-, D-: the second field; P-: every field), and
    the scores in order."""
    text, scores = [], []
    for line in output.splitlines():
        fields = line.split("\t")
        numbered = range(1, len(fields)) if line.startswith("P-") else [1] if line[:2] in ("H-", "D-") else []
        for i in numbered:
            scores += [float(x) for x in fields[i].split()]
            fields[i] = "#"
        text.append("\t".join(fields))
    return text, scores


def test_checkpoint_of_another_shape(tiny_checkpoint, tmp_path):
    import torch

    state = torch.load(tiny_checkpoint, weights_only=True)
    state["model_config"]["d_ff"] = 128
    bad = tmp_path / "bad.pt"
    torch.save(state, bad)
    r = nmt("generate", "--path", bad, "--input", "-", input="1\n")
    assert r.exit_code == 1 and "does not fit this model" in r.output and "Traceback" not in r.output


@pytest.fixture
def sys_ref(tmp_path):
    hyps = ["The cat sat on the mat.", "A well-known dog barked loudly .", "Hello world"]
    refs = ["The cat sat on a mat.", "A well-known dog barked .", "Hello, world!"]
    (tmp_path / "hyp").write_text("\n".join(hyps) + "\n")
    (tmp_path / "ref").write_text("\n".join(refs) + "\n")
    return tmp_path / "hyp", tmp_path / "ref", hyps, refs


def test_score_equals_sacrebleu(sys_ref):
    hyp, ref, hyps, refs = sys_ref
    r = nmt("score", "--sys", hyp, "--ref", ref, "--json")
    assert r.exit_code == 0, r.output
    scores = {json.loads(line)["metric"]: json.loads(line) for line in r.stdout.splitlines()}
    assert scores["sacrebleu"]["score"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert scores["chrf"]["score"] == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
    assert "tok:13a" in scores["sacrebleu"]["signature"]
    plain = nmt("score", "--sys", hyp, "--ref", ref)
    assert plain.stdout.startswith("BLEU = ") and "nrefs:1" in plain.stdout


def test_several_references_score_as_sacrebleu_multi_reference(sys_ref):
    """--ref twice had kept the last one, without a word (sacreBLEU takes several)."""
    hyp, ref, hyps, refs = sys_ref
    other = ["The cat sat on the mat.", "A dog barked loudly.", "Hello world"]
    (ref.parent / "ref2").write_text("\n".join(other) + "\n")
    for metric, name in (("sacrebleu", "corpus_bleu"), ("chrf", "corpus_chrf")):
        r = nmt("score", "--sys", hyp, "--ref", ref, "--ref", ref.parent / "ref2", "--metric", metric, "--json")
        assert r.exit_code == 0, r.output
        expected = getattr(sacrebleu, name)(hyps, [refs, other])
        assert (
            json.loads(r.stdout)["score"]
            == round(expected.score, 2)
            != round(getattr(sacrebleu, name)(hyps, [other]).score, 2)
        )
    assert "nrefs:2" in nmt("score", "--sys", hyp, "--ref", ref, "--ref", ref.parent / "ref2").stdout
    (ref.parent / "short").write_text("one line\n")
    r = nmt("score", "--sys", hyp, "--ref", ref, "--ref", ref.parent / "short")
    assert r.exit_code == 1 and "has 3 hypotheses but" in r.output and "short has 1 lines" in r.output


def test_lines_end_at_newlines_only(sys_ref):
    """A form feed or U+2028 inside a line split it (str.splitlines): 'has 3 hypotheses but ... 4 lines'."""
    hyp, ref, hyps, refs = sys_ref
    ref.write_text("\n".join([refs[0].replace(" ", " \u2028", 1), refs[1].replace(" ", " \x0c", 1), refs[2]]) + "\n")
    r = nmt("score", "--sys", hyp, "--ref", ref, "--json")
    assert r.exit_code == 0, r.output


def test_tokenized_compound_bleu_is_labelled(sys_ref):
    hyp, ref, *_ = sys_ref
    r = nmt("score", "--sys", hyp, "--ref", ref, "--metric", "tok-bleu-compound", "--lang", "en")
    assert r.exit_code == 0 and "NOT comparable with sacreBLEU" in r.stdout

    from nmt_cli.metrics import moses_tokenize

    assert moses_tokenize(["A well-known dog."], "en", True) == ["A well ##AT##-##AT## known dog ."]
    r = nmt("score", "--sys", hyp, "--ref", ref, "--metric", "tok-bleu", "--lang", "ger")  # a typo for de
    assert r.exit_code == 1 and "--lang 'ger' is not a language code of the Moses tokenizer" in r.output
    r = nmt("score", "--sys", hyp, "--ref", ref, "--lang", "de")  # sacreBLEU's 13a would ignore it
    assert r.exit_code == 1 and "--lang de sets the Moses tokenizer of tok-bleu metrics" in r.output
    r = nmt("score", "--sys", hyp, "--ref", ref, "--verbose")
    assert r.exit_code == 1 and "--verbose adds EVALB's line per sentence to --metric bracket-f1" in r.output


def test_score_reads_fairseq_and_jsonl_output(tiny_checkpoint, toy_data_bin, tmp_path):
    """Both of generate's record formats give the plain text's scores (jsonl had been scored as text)."""
    ref = tmp_path / "ref"
    ref.write_text("".join(f"{i}\n" for i in range(30)))
    scores = {}
    for fmt in ("fairseq", "jsonl", "plain"):
        out = tmp_path / f"gen.{fmt}"
        args = ["--max-len-b", 3, "--nbest", 2, "--output-format", fmt]
        out.write_text(nmt("generate", toy_data_bin, "--path", tiny_checkpoint, *args).stdout)
        if fmt == "plain":  # --nbest lines per input: keep each input's best
            out.write_text("".join(line + "\n" for line in out.read_text().splitlines()[::2]))
        r = nmt("score", "--sys", out, "--ref", ref)
        assert r.exit_code == 0, r.output
        scores[fmt] = r.stdout
    assert scores["fairseq"] == scores["jsonl"] == scores["plain"]
    (tmp_path / "bad.jsonl").write_text('{"id": 0, "hypotheses": []}\n')
    r = nmt("score", "--sys", tmp_path / "bad.jsonl", "--ref", ref)
    assert r.exit_code == 1 and "bad.jsonl:1: not a record of `nmt generate --output-format jsonl`" in r.output


def test_score_bad_inputs(sys_ref, tmp_path):
    hyp, ref, *_ = sys_ref
    short = tmp_path / "short"
    short.write_text("one line\n")
    r = nmt("score", "--sys", short, "--ref", ref)
    assert r.exit_code == 1 and "has 1 hypotheses" in r.output and "has 3 lines" in r.output
    pieces = tmp_path / "pieces"
    pieces.write_text("\u2581The \u2581cat\nb\nc\n")
    r = nmt("score", "--sys", pieces, "--ref", ref)
    assert r.exit_code == 1 and "sentencepiece pieces" in r.output
    r = nmt("score", "--sys", hyp, "--ref", pieces)  # the encoded reference had been scored as text
    assert r.exit_code == 1 and "pieces:1: the reference contains sentencepiece pieces" in r.output
    blank = tmp_path / "blank"
    blank.write_text("\n" * 3)  # a model that output nothing: sacreBLEU's 0, not "0 hypotheses"
    r = nmt("score", "--sys", blank, "--ref", ref)
    assert r.exit_code == 0 and "BLEU = 0.00" in r.output, r.output
    r = nmt("score", "--sys", tmp_path / "nope", "--ref", ref)
    assert r.exit_code == 1 and r.output.strip() == f"error: --sys {tmp_path / 'nope'} does not exist"

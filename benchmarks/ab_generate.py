"""Beam search of the working tree against another revision's, alternated in one process.

A change to the decoding step is often worth a few percent, less than this project's machines drift
between two runs of a benchmark; alternating both versions in one process, round after round, puts the
drift on both alike. The other revision's `nmt_cli` is taken from git (`git archive`) into a temporary
package of its own name, and each version loads the checkpoint and translates with its own code
(packing, encoder, beam search): 2 threads, batches of 64 Multi30k test sentences, beam 4, every
hypothesis forced to 24 tokens as in bench_generate.py and the peer harness. Prints each version's median
time, the median of the per-round ratios to the other revision, and whether the translations are the same.

    python benchmarks/ab_generate.py --rev HEAD~2 --shapes small,base --sentences 256 --rounds 8
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import io
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch
from common import BATCH, FORCED_SEARCH, ROOT, checkpoint, data_bin, report

sys.path.insert(0, str(ROOT))
from nmt_cli.allocator import tune_allocator  # noqa: E402
from nmt_cli.data.dataset import ParallelDataset  # noqa: E402


def revision_package(rev: str) -> str:
    """Import `rev`'s nmt_cli as a package of its own name (nmt_cli references renamed); return the name."""
    name = "nmt_rev_" + "".join(c if c.isalnum() else "_" for c in rev)
    archive = subprocess.run(["git", "archive", rev, "nmt_cli"], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode:
        raise SystemExit(f"error: git archive {rev}: {archive.stderr.decode().strip()}")
    where = Path(tempfile.mkdtemp(prefix="ab_generate_"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(where, filter="data")
    (where / "nmt_cli").rename(where / name)
    for source in (where / name).rglob("*.py"):
        source.write_text(source.read_text().replace("nmt_cli", name))
    sys.path.insert(0, str(where))
    return name


class Version:
    """One version's loaded translator and its own translate function."""

    def __init__(self, package: str, path: Path) -> None:
        translate: ModuleType = importlib.import_module(f"{package}.search.translate")
        config: ModuleType = importlib.import_module(f"{package}.config")
        self.translator, _ = translate.load_translator(path, torch.device("cpu"), None)
        self.translate = translate.translate
        self.request = getattr(translate, "SearchRequest", None)  # a revision before it took positional settings
        self.cfg = config.SearchConfig(**FORCED_SEARCH)
        self.seconds: list[float] = []

    def run(self, sources: list) -> list[list[int]]:
        start = time.perf_counter()
        if self.request is None:
            results = self.translate(self.translator, sources, self.cfg, 10**9, BATCH)
        else:
            results = self.translate(self.translator, self.request(sources, self.cfg, 10**9, BATCH))
        self.seconds.append(time.perf_counter() - start)
        return [hyps[0].tokens for hyps in results]


def compare(shape: str, rev: str, package: str, n_sentences: int, rounds: int) -> dict[str, object]:
    path = checkpoint(shape)
    data = ParallelDataset(data_bin(), "test")
    sources = [data.src[i] for i in range(min(n_sentences, len(data)))]
    versions = {"working tree": Version("nmt_cli", path), rev: Version(package, path)}
    outputs = {}
    for v in versions.values():
        v.run(sources[:BATCH])  # oneDNN builds its kernels
        v.seconds.clear()
    for r in range(rounds):  # alternated, the order flipped every round
        for name, v in list(versions.items())[:: 1 if r % 2 == 0 else -1]:
            outputs[name] = v.run(sources)
    new, old = versions["working tree"].seconds, versions[rev].seconds
    return {
        "shape": shape,
        "sentences": len(sources),
        "rounds": rounds,
        "working tree s": round(statistics.median(new), 3),
        f"{rev} s": round(statistics.median(old), 3),
        "time ratio (median of rounds)": round(statistics.median(a / b for a, b in zip(new, old)), 3),
        "same translations": outputs["working tree"] == outputs[rev],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", required=True, help="The git revision to compare with (e.g. HEAD~1, a tag).")
    parser.add_argument("--shapes", default="small,base")
    parser.add_argument("--sentences", type=int, default=256, help="Test sentences translated per round.")
    parser.add_argument("--rounds", type=int, default=8, help="Translations of each version, alternated.")
    args = parser.parse_args()
    torch.set_num_threads(2)
    tune_allocator()  # as the nmt command does at start-up
    package = revision_package(args.rev)
    rows = [compare(shape, args.rev, package, args.sentences, args.rounds) for shape in args.shapes.split(",")]
    report("ab_generate", rows)


if __name__ == "__main__":
    main()

"""The configs of the commands that translate with a checkpoint (generate, serve, score-pairs): what they share
(InferenceConfig), what the two that search share (SearchingConfig), and each one's own options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nmt_cli.errors import ConfigError
from nmt_cli.flags import check_fields, flag

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True, kw_only=True)
class InferenceConfig:
    """The checkpoint and where and how its model runs (search/translate.py's `open_for_inference` reads them)."""

    path: str = flag(
        help="Checkpoint to translate with; A.pt:B.pt (colon-separated, as fairseq's) translates with their ensemble."
    )
    weights: str | None = flag(
        None,
        "An ensemble's weights, one per checkpoint of --path, comma-separated (e.g. 0.6,0.4), normalised to sum 1; "
        "each step scores by the weighted average of the members' log-probabilities [default: equal].",
    )
    device: str = flag("auto", "Where to translate (auto: CUDA when available).", choices=("auto", "cpu", "cuda"))
    threads: int = flag(0, "CPU threads (0: torch's default).", min=0)
    precision: str | None = flag(
        None, "fp32, bf16 or fp16 (CUDA) [default: the checkpoint's on CUDA, fp32 on CPU].", choices=PRECISIONS
    )
    quantize: str | None = flag(
        None, "CPU: dynamic int8 linear layers, the output projection included [default: float32].", choices=("int8",)
    )
    cudnn_attention: bool = flag(
        False,
        "CUDA: let attention use cuDNN's kernels, which build a plan for every new batch shape (slow: every "
        "search step is a new shape) [default: flash, memory-efficient or math].",
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.quantize and self.precision not in (None, "fp32"):  # before the precision's own checks and warnings
            raise ConfigError(f"--quantize {self.quantize} runs on the CPU in fp32; drop --precision {self.precision}")
        if self.weights is not None:
            ensemble_weights(self.weights)


def ensemble_weights(text: str) -> tuple[float, ...]:
    """--weights' values normalised to sum 1 (search/ensemble.py checks their count against --path's checkpoints);
    ConfigError naming --weights for anything but positive finite numbers."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"--weights {text!r} must be positive numbers separated by commas, like 0.6,0.4") from None
    total = sum(values)
    if not all(w > 0 for w in values) or not math.isfinite(total):
        raise ConfigError(f"--weights {text!r} must be positive finite numbers, like 0.6,0.4")
    return tuple(w / total for w in values)


@dataclass(frozen=True, kw_only=True)
class SearchingConfig(InferenceConfig):
    """How generate's and serve's plain beam search runs (search/slots.py's `slot_search_for` reads them)."""

    fixed_slots: bool = flag(
        False,
        "Beam search over fixed slots, for CUDA graphs: a batch's sentences keep their rows (finished ones masked) "
        "until the live ones fit in fewer, and the decoder's keys and values fill buffers sized to the batch's "
        "longest output, so no step between moves changes a shape; the same translations as the default search. "
        "Only a plain beam search (--beam 2 or more) runs so; constraints, prefixes, --no-repeat-ngram-size and "
        "sampling keep the default search. Off by default until its exactness test passes on CUDA (on an H200 it "
        "searched 1.5-3.7x faster a step); on the CPU it runs the same step without graphs, for no gain.",
    )
    cuda_graphs: bool = flag(
        True,
        "CUDA, with fixed slots: capture the decoder step once per batch shape (sentences rounded up to a power of "
        "two or a multiple of 64, lengths to a multiple of 64; the last 16 shapes kept) as a CUDA graph and replay "
        "it each step; --no-cuda-graphs runs it eagerly.",
    )


@dataclass(frozen=True, kw_only=True)
class GenerateConfig(SearchingConfig):
    """`nmt generate` apart from the search itself (SearchConfig, whose defaults come from the checkpoint)."""

    data_dir: str | None = flag(
        None, "Data directory made by `nmt preprocess` (or use --input).", path="dir", argument=True
    )
    gen_subset: str = flag("test", "Split of DATA_DIR to translate.")
    input: str | None = flag(None, "Raw text file to translate, or - for stdin (instead of DATA_DIR).")
    buffer_size: int | None = flag(
        None,
        "Lines read at a time with --input [default: 1000; 1 when stdin is a terminal, so that each line "
        "is translated as it is typed].",
        min=1,
    )
    output_format: str | None = flag(
        None,
        "[default: fairseq for DATA_DIR, plain for --input]; plain writes --nbest lines per input, in order "
        "(as OpenNMT-py); scores are in nats (natural log).",
        choices=("plain", "fairseq", "jsonl"),
    )
    print_alignment: str | None = flag(
        None,
        "Align each output to its source after the search: hard writes each output piece's most attended source "
        "piece as fairseq's S-T pairs (indices of sentencepiece pieces, EOS excluded), soft the weights; an A- line "
        "in fairseq output, an alignment field in jsonl [default: none].",
        choices=("hard", "soft"),
    )
    alignment_layer: int | None = flag(
        None, "Decoder layer --print-alignment reads, 0 the bottom one [default: the penultimate].", min=0
    )
    results_path: str | None = flag(
        None,
        "Write generate-SUBSET.txt (with --input FILE: generate-FILE.txt, stdin: generate-stdin.txt) into this "
        "directory instead of stdout.",
        path="new",
    )
    max_tokens: int = flag(8000, "Source tokens per batch.", min=1)
    batch_size: int = flag(0, "Also cap sentences per batch (0: no cap).", min=0)
    num_shards: int = flag(1, "Split the input into contiguous shards.", min=1)
    shard_id: int = flag(0, "Which shard to translate.", min=0)
    rule_files: tuple[tuple[str, str], ...] = flag(
        (), "Each per-sentence rule's --NAME-file given, as (NAME, FILE) (search/rules.py's OPTIONS).", cli=False
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.print_alignment and (self.output_format or ("fairseq" if self.data_dir else "plain")) == "plain":
            raise ConfigError(
                f"--print-alignment {self.print_alignment} writes an A- line (--output-format fairseq) or an "
                "alignment field (jsonl); plain output holds the translations alone, one per line: add "
                "--output-format fairseq or jsonl"
            )
        if self.alignment_layer is not None and self.print_alignment is None:
            raise ConfigError(
                f"--alignment-layer {self.alignment_layer} picks the layer --print-alignment reads; add "
                "--print-alignment hard|soft or drop it"
            )


@dataclass(frozen=True, kw_only=True)
class ServeConfig(SearchingConfig):
    """`nmt serve` apart from the search (SearchConfig, whose defaults come from the checkpoint)."""

    # --path is repeatable for serve: cli/serve.py gives its first value to `path`, the others to `more_paths`
    path: str = flag(
        help="Checkpoint to serve, as [NAME=]CKPT (NAME: what requests choose it by [default: SRC-TGT, else the "
        "file's stem]); repeat --path to serve several models, the first answering requests that name none.",
        cli=False,
    )
    more_paths: tuple[str, ...] = flag((), "The models served beside `path`, each [NAME=]CKPT.", cli=False)
    host: str = flag("127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
    port: int = flag(8080, "Port to listen on (0: a free one, logged at start).", min=0, max=65535)
    threads: int = flag(
        0,
        "CPU threads of the search (0: every core this process may use: its CPU affinity's, at most its cgroup's "
        "CPU quota).",
        min=0,
    )
    max_batch_tokens: int = flag(8000, "Padded source tokens per batch, as generate's --max-tokens.", min=1)
    max_wait_ms: float = flag(
        25.0,
        "How long a sentence waits for others to batch with; while the clients just answered keep coming back, an "
        "idle worker waits on, up to a quarter of a usual batch's search time.",
        min=0,
    )
    max_request_sentences: int = flag(256, "Sentences one request may hold.", min=1)
    max_queue: int = flag(4096, "Sentences waiting at most; a request that would exceed it gets 503.", min=1)
    timeout: float = flag(60.0, "Seconds a request may take before it gets 504.", min=0, min_open=True)
    max_beam: int | None = flag(None, "Largest beam a request may ask for [default: 16, or --beam].", min=1)
    max_nbest: int | None = flag(None, "Most hypotheses per text a request may ask for [default: --max-beam's].", min=1)
    max_output_tokens: int | None = flag(None, "Longest output a request may ask for [default: the model's].", min=1)
    max_input_chars: int = flag(10_000, "Longest text a request may send, in characters.", min=1)
    drain_timeout: float = flag(
        30.0,
        "At SIGTERM or Ctrl-C, seconds the requests already open may take to be answered before each still open "
        "gets 503 (a second signal ends the wait at once).",
        min=0,
    )
    drain_grace: float = flag(
        0.0,
        "At SIGTERM, seconds /ready answers 503 while requests are still served, so that a load balancer stops "
        "sending new ones before the drain (--drain-timeout) begins.",
        min=0,
    )
    max_body_bytes: int = flag(8 << 20, "Bytes a request body may hold; a longer one gets 413 unread.", min=1)
    api_key: str | None = flag(None, "Key a client sends as `Authorization: Bearer KEY` (seen in process lists).")
    api_key_file: str | None = flag(
        None,
        "File of API keys, a line each: KEY [ID] [req-limit=N] [char-limit-per-minute=N] [req-limit-daily=N] (ID: "
        "what the log names; its own limits); read again when it changes. Or set NMT_API_KEY.",
        path="file",
    )
    metrics_token: str | None = flag(
        None, "Key a scraper sends for /metrics as `Authorization: Bearer TOKEN` [default: the API key, if any]."
    )
    metrics_token_file: str | None = flag(None, "File whose first line is --metrics-token.", path="file")
    cors_origin: str | None = flag(None, "Origins a browser may call the API from, comma-separated (none: same).")
    max_client_sentences: int | None = flag(
        None,
        "Sentences one client (its address) may have queued or in progress; a request past it gets 429 [default: "
        "no limit: behind a proxy every client has the proxy's address, unless the proxy sends X-Forwarded-For "
        "and --forwarded-allow-ips trusts it].",
        min=1,
    )
    log_format: str = flag(
        "text",
        "json: each log record (each request's too) as a line of JSON, for a log collector.",
        choices=("text", "json"),
    )
    req_limit: int | None = flag(
        None,
        "Requests a client (its API key's id in --api-key-file, else its address) may send a minute, as "
        "LibreTranslate's; past it 429 with Retry-After [default: no limit].",
        min=1,
    )
    char_limit_per_minute: int | None = flag(None, "Characters of text a client may send a minute.", min=1)
    req_limit_daily: int | None = flag(None, "Requests a client may send a day (UTC).", min=1)
    forwarded_allow_ips: str | None = flag(
        None,
        "Proxy addresses (comma-separated, or *) whose X-Forwarded-For gives the client's address "
        "[default: $FORWARDED_ALLOW_IPS, else the loopback addresses].",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_request_sentences > self.max_queue:
            raise ConfigError(
                f"--max-request-sentences {self.max_request_sentences} exceeds --max-queue {self.max_queue}: "
                "such a request could never be queued"
            )
        if self.max_client_sentences is not None and self.max_request_sentences > self.max_client_sentences:
            raise ConfigError(
                f"--max-request-sentences {self.max_request_sentences} exceeds --max-client-sentences "
                f"{self.max_client_sentences}: such a request could never be queued; lower --max-request-sentences"
            )


@dataclass(frozen=True, kw_only=True)
class ScorePairsConfig(InferenceConfig):
    """`nmt score-pairs`: the model's score of given translations (search/forced.py), with the search's length
    penalty and unknown-piece penalty (SearchConfig's, whose defaults come from the checkpoint)."""

    source: str = flag(help="Source text, one sentence per line.", path="file")
    target: str = flag(help="Its translations to score, one per line of --source.", path="file")
    target_format: str = flag(
        "text",
        "text: encoded with the checkpoint's sentencepiece model; pieces: space-separated pieces as generate writes "
        "them (H- lines, jsonl tokens), scored as they are, so that a hypothesis scores its search score exactly "
        "even where its text would encode to other pieces.",
        choices=("text", "pieces"),
    )
    output_format: str = flag(
        "plain",
        "plain: one score per line; jsonl: score, log_prob (nats, EOS included), tokens and token_scores per pair.",
        choices=("plain", "jsonl"),
    )
    max_tokens: int = flag(8000, "Padded source (and target) tokens per batch.", min=1)
    batch_size: int = flag(0, "Also cap pairs per batch (0: no cap).", min=0)

#!/usr/bin/env python3
"""nmt vs Hugging Face transformers vs CTranslate2 on the OPUS-MT architecture.

    python benchmarks/bench_import_speed.py [--sentences 200] [--length 30] [--rounds 3] \
        [--threads 2] [--json out.json] [--markdown out.md] [--quick]

One random-weight MarianMTModel with OPUS-MT en-de's configuration (6+6 layers, d_model 512,
8 heads, FFN 2048, swish, scaled embeddings, 58,101 pieces, one embedding matrix tied to the
output) is built here with transformers and saved as OPUS-MT ships it; the very same weights
go to nmt (nmt-import huggingface: nmt.interop.hf_import) and to CTranslate2 (nmt-export
--format ctranslate2 of that checkpoint, float32 and int8), and to ``nmt-generate --engine
ctranslate2`` (nmt's Translator over that conversion, in each environment CTranslate2 runs
in, compared with CTranslate2 in the same one). The engines then translate
the same source sentences (random pieces, Multi30k's lengths, fed as ids: tokenization is
outside the timing) to the same fixed length:

- random weights never stop sensibly, so the model's ``final_logits_bias`` is -1e4 on </s>
  and <pad>: no engine ends a sentence before its length limit, and every sentence gets
  exactly ``--length`` target tokens from every engine (the limit: nmt ``max_len_b``,
  transformers ``max_new_tokens = length + 1`` with the forced </s>, CTranslate2
  ``max_decoding_length``). nmt and transformers compute one more step, whose output is the
  forced </s>; CTranslate2 stops after the last token. Tokens/s counts the ``--length``
  tokens only;
- greedy and beam 4, batches of 64 sentences sorted by length (nmt's Translator,
  CTranslate2's ``max_batch_size=64``, the same batches for transformers' ``generate``);
- fp32 and int8: nmt ``--precision int8``, CTranslate2 ``compute_type="int8"`` (weights
  exported int8), transformers with torch's dynamic quantization of its nn.Linear layers
  (``torch.ao.quantization.quantize_dynamic``: int8 weights, activations quantized per call);
- ``--threads`` threads everywhere (torch.set_num_threads, OMP_NUM_THREADS); CTranslate2
  decodes two batches at once (``inter_threads`` 2, ``intra_threads`` threads // 2; with one
  thread, 1 and 1), the setting benchmarks/bench_ct2.py's tuning picked for it in every
  configuration on this project's 2-core machine, and so does ``--engine ctranslate2`` by
  default; nmt's own engine at this width decodes one batch at a time (its default).

Each engine runs in a child process of its own, its configurations in turns (a warm-up batch
each, then one timed pass of all sentences); ``--rounds`` rounds, the engines' order reversed
every other round; the table reports medians. "same as nmt fp32" is the share of sentences
whose output is nmt fp32's with the same beam: 100% in fp32 greedy is the check that the
engines compute the same thing (``--quick`` checks it on tiny sizes in seconds,
tests/test_bench_import_speed.py). The load average before and after goes into the JSON.
Needs transformers, sentencepiece and ctranslate2 (pip install 'nmt[hf,export]').
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# CTranslate2 runs in three environments, each a child of its own (the variables are read when
# it loads): as shipped; CT2_PACKED_GEMM=0, several times faster on some Intel CPUs;
# CT2_USE_MKL=0, its oneDNN/ruy backends instead of MKL (AMD CPUs). The fastest one counts.
CT2_ENVS = {"ct2": {}, "ct2-nopack": {"CT2_PACKED_GEMM": "0"}, "ct2-nomkl": {"CT2_USE_MKL": "0"}}
# nmt-generate --engine ctranslate2 (nmt's Translator over CTranslate2) in each of those
# environments, compared with CTranslate2 called directly in the same one
ENGINE_ENVS = {f"nmt-{e}": e for e in CT2_ENVS}
ENGINES = ("nmt", "hf", *CT2_ENVS, *ENGINE_ENVS)
NAMES = {"nmt": "nmt", "hf": "transformers", "ct2": "CTranslate2",
         "ct2-nopack": "CTranslate2 (CT2_PACKED_GEMM=0)",
         "ct2-nomkl": "CTranslate2 (CT2_USE_MKL=0)"}
NAMES.update({e: NAMES[c].replace("CTranslate2", "nmt --engine ctranslate2", 1)
              for e, c in ENGINE_ENVS.items()})
PRECISIONS = ("fp32", "int8")
BEAMS = (1, 4)
BATCH = 64
FORBIDDEN = -1e4          # final_logits_bias of </s> and <pad>: a fixed output length
OPUS_MT = {"vocab": 58101, "d_model": 512, "layers": 6, "heads": 8, "ffn": 2048,
           "init_std": 0.02, "min_len": 8, "max_len": 24}
QUICK = {"vocab": 300, "d_model": 32, "layers": 2, "heads": 4, "ffn": 64,
         "init_std": 0.3, "min_len": 3, "max_len": 9}


# --- the model, three ways ----------------------------------------------------------------------
def build_marian(d: Path, size: dict, seed: int = 0) -> list[str]:
    """A random MarianMTModel of ``size`` saved to ``d`` as OPUS-MT ships one; its pieces."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    v = size["vocab"]
    cfg = MarianConfig(
        vocab_size=v, decoder_vocab_size=v, d_model=size["d_model"],
        encoder_layers=size["layers"], decoder_layers=size["layers"],
        encoder_attention_heads=size["heads"], decoder_attention_heads=size["heads"],
        encoder_ffn_dim=size["ffn"], decoder_ffn_dim=size["ffn"], activation_function="swish",
        scale_embedding=True, max_position_embeddings=512, pad_token_id=v - 1, eos_token_id=0,
        decoder_start_token_id=v - 1, forced_eos_token_id=0, init_std=size["init_std"],
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        # </s>'s row along the decoder's mean output: without the bias below, sentences would
        # end early, so that the forced length shows (tests/test_bench_import_speed.py).
        x = torch.randint(2, v - 1, (4, 12), generator=torch.Generator().manual_seed(seed))
        h = model.model(input_ids=x, decoder_input_ids=x).last_hidden_state.mean((0, 1))
        emb = model.model.shared.weight
        emb[0] = h / h.norm() * 4 * emb.norm(dim=1).mean()
        model.final_logits_bias[0, 0] = FORBIDDEN
        model.final_logits_bias[0, v - 1] = FORBIDDEN
    model.save_pretrained(d)
    proto = tiny_sentencepiece(seed)
    pieces = pieces_of(proto, v)
    (d / "source.spm").write_bytes(proto)
    (d / "target.spm").write_bytes(proto)
    (d / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}),
                                  encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "en", "target_lang": "de", "separate_vocabs": False}))
    return pieces


def tiny_sentencepiece(seed: int) -> bytes:
    """A small sentencepiece model: the text side is not timed, nmt-import needs one."""
    import sentencepiece as spm

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
             for _ in range(300)]
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(500)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out,
                                   vocab_size=200, model_type="unigram", minloglevel=2)
    return out.getvalue()


def pieces_of(proto: bytes, v: int) -> list[str]:
    """vocab.json's pieces as OPUS-MT's: </s> 0, <unk> 1, sentencepiece's, then made-up ones
    up to the vocabulary size, <pad> last."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=proto)
    own = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    pieces = ["</s>", "<unk>"] + [p for p in own if p not in ("<unk>", "<s>", "</s>")]
    pieces = pieces[:v - 1]
    pieces += [f"\u2581w{i}" for i in range(v - 1 - len(pieces))]
    return pieces + ["<pad>"]


def prepare(work: Path, size: dict, n: int, seed: int) -> dict:
    """The Marian directory, the nmt checkpoint, the CTranslate2 directories and the sources
    (lists of pieces), all under ``work``; returns their paths."""
    from nmt.interop.ct2_export import export_model
    from nmt.interop.hf_import import import_huggingface

    hf_dir = work / "marian"
    hf_dir.mkdir(parents=True, exist_ok=True)
    pieces = build_marian(hf_dir, size, seed)
    ckpt = import_huggingface(hf_dir, work / "nmt.pt")             # nmt-import huggingface
    paths = {"hf": str(hf_dir), "nmt": str(ckpt)}
    for q in ("float32", "int8"):                                   # nmt-export ctranslate2
        paths[f"ct2_{q}"] = str(export_model(ckpt, work / f"ct2-{q}", quantization=q,
                                             force=True))
    rng = random.Random(seed)
    usable = pieces[2:-1]
    sources = [[rng.choice(usable) for _ in range(rng.randint(size["min_len"], size["max_len"]))]
               for _ in range(n)]
    paths["sources"] = str(work / "sources.json")
    Path(paths["sources"]).write_text(json.dumps(sources), encoding="utf-8")
    return paths


# --- the engines (each in a child process) --------------------------------------------------------
def nmt_engine(paths: dict, precision: str, beam: int, length: int,
               threads: int | None = None, engine: str = "nmt"):
    """nmt's Translator (``engine`` "nmt") or nmt's Translator over CTranslate2 ("ctranslate2",
    ``threads`` its intra-op threads), decoding ids as nmt-generate's text output does (no
    scores)."""
    from nmt.search.config import BatchConfig, SearchConfig

    opts = dict(device="cpu", precision=precision, batch=BatchConfig(batch_size=BATCH),
                search=SearchConfig(beam=beam, max_len_a=0.0, max_len_b=length))
    if engine == "ctranslate2":
        from nmt.engines.ctranslate2 import CTranslate2Translator

        # the imported preset's length penalty (transformers' rule) is one the engine refuses;
        # every hypothesis here has the same length, so GNMT's ranks them the same
        opts["search"] = SearchConfig(beam=beam, max_len_a=0.0, max_len_b=length,
                                      lenpen_formula="gnmt")
        t = CTranslate2Translator.from_checkpoint(paths["nmt"], threads=threads, **opts)
    else:
        from nmt.search.translator import Translator

        t = Translator.from_checkpoint(paths["nmt"], **opts)
    d = t.src_codec.dictionary

    def encode(sources):
        return [[d.index(p) for p in s] for s in sources]

    def decode(ids):
        return [[p for p in r.hypotheses[0].tokens if p != "</s>"]
                for r in t.translate_ids(ids, sources=[""] * len(ids), scores=False)]
    return encode, decode


def hf_engine(paths: dict, precision: str, beam: int, length: int):
    import torch
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(paths["hf"]).eval()
    if precision == "int8":
        import warnings

        from torch.ao.quantization import quantize_dynamic
        with warnings.catch_warnings():        # torch's deprecation notice of qint8 tensors
            warnings.simplefilter("ignore")
            model = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    vocab = json.loads((Path(paths["hf"]) / "vocab.json").read_text(encoding="utf-8"))
    pieces = {i: p for p, i in vocab.items()}
    pad, eos = vocab["<pad>"], vocab["</s>"]

    def encode(sources):
        return [[vocab[p] for p in s] + [eos] for s in sources]

    def decode(ids):
        out: list = [None] * len(ids)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        for k in range(0, len(order), BATCH):
            batch = order[k:k + BATCH]
            x = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids[i]) for i in batch],
                                                batch_first=True, padding_value=pad)
            with torch.inference_mode():
                y = model.generate(input_ids=x, attention_mask=x.ne(pad), num_beams=beam,
                                   do_sample=False, max_new_tokens=length + 1)
            for i, row in zip(batch, y.tolist()):
                out[i] = [pieces[t] for t in row[1:] if t not in (pad, eos)]
        return out
    return encode, decode


def engine_precisions(engine: str) -> tuple[str, ...]:
    """fp32 and int8 for every engine; nmt also bf16 where the CPU has native bf16."""
    if engine == "nmt":
        from nmt.runtime import cpu_has_native_bf16

        return ("fp32", "bf16", "int8") if cpu_has_native_bf16() else PRECISIONS
    return PRECISIONS


def ct2_engine(paths: dict, precision: str, beam: int, length: int, threads: int):
    import ctranslate2

    q = "float32" if precision == "fp32" else "int8"
    inter = min(2, threads)         # two batches at once: its fastest in bench_ct2's tuning
    tr = ctranslate2.Translator(paths[f"ct2_{q}"], device="cpu", compute_type=q,
                                intra_threads=max(1, threads // inter), inter_threads=inter)

    def decode(sources):
        res = tr.translate_batch(sources, beam_size=beam, max_batch_size=BATCH,
                                 max_decoding_length=length)
        return [r.hypotheses[0] for r in res]
    return (lambda sources: sources), decode


def child(args) -> None:
    """Time one engine's configurations in turns; print one JSON line."""
    if args.child not in CT2_ENVS and args.child not in ENGINE_ENVS:
        import torch
        torch.set_num_threads(args.threads)
    if args.child == "hf":
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    paths = json.loads(args.paths)
    sources = json.loads(Path(paths["sources"]).read_text(encoding="utf-8"))
    out = {}
    for precision in engine_precisions(args.child):
        for beam in BEAMS:
            if args.child in CT2_ENVS:
                encode, decode = ct2_engine(paths, precision, beam, args.length, args.threads)
            elif args.child in ENGINE_ENVS:
                encode, decode = nmt_engine(paths, precision, beam, args.length, args.threads,
                                            engine="ctranslate2")
            else:
                make = nmt_engine if args.child == "nmt" else hf_engine
                encode, decode = make(paths, precision, beam, args.length)
            ids = encode(sources)
            if not args.quick:
                decode(ids[:8])                                 # warm-up
            t0 = time.perf_counter()
            hyps = decode(ids)
            wall = time.perf_counter() - t0
            out[f"{precision}/{beam}"] = {"wall_s": wall, "tokens": sum(map(len, hyps)),
                                          "outputs": hyps}
            print(f"{NAMES[args.child]} {precision} beam {beam}: {wall:.1f} s", file=sys.stderr,
                  flush=True)
    print(json.dumps(out))


def run_child(engine: str, paths: dict, args) -> dict:
    cmd = [sys.executable, __file__, "--child", engine, "--paths", json.dumps(paths),
           "--threads", str(args.threads), "--length", str(args.length)] + (
               ["--quick"] if args.quick else [])
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
           **CT2_ENVS.get(ENGINE_ENVS.get(engine, engine), {})}
    # the child's progress lines go straight to this process's stderr
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench_import_speed: the {NAMES[engine]} run failed (exit {p.returncode})")
    return json.loads(p.stdout.strip().splitlines()[-1])


# --- the run and its report ---------------------------------------------------------------------
def measure(args, paths: dict) -> list[dict]:
    walls: dict = {}
    outputs: dict = {}
    engines = [e for e in ENGINES if e in args.engines]
    for r in range(args.rounds):
        for engine in (engines if r % 2 == 0 else engines[::-1]):
            for key, res in run_child(engine, paths, args).items():
                walls.setdefault((engine, key), []).append(res["wall_s"])
                outputs[(engine, key)] = res["outputs"]
    rows = []
    for precision in ("fp32", "bf16", "int8"):
        for beam in BEAMS:
            key = f"{precision}/{beam}"
            ref = outputs[("nmt", f"fp32/{beam}")]
            for engine in engines:
                if (engine, key) not in walls:
                    continue
                wall = statistics.median(walls[(engine, key)])
                hyps = outputs[(engine, key)]
                tokens = sum(map(len, hyps))
                rows.append({
                    "engine": engine, "precision": precision, "beam": beam,
                    "median_wall_s": round(wall, 4), "walls_s": walls[(engine, key)],
                    "sentences_per_s": round(len(hyps) / wall, 2),
                    "tokens_per_s": round(tokens / wall, 1), "target_tokens": tokens,
                    "same_as_nmt_fp32": sum(a == b for a, b in zip(hyps, ref)) / len(ref),
                    "outputs": hyps if args.keep_outputs else None})
    return rows


def fastest_ct2(rows: list[dict], precision: str, beam: int) -> dict | None:
    """CTranslate2's fastest environment for ``precision`` (fp32 or int8) at ``beam``."""
    mine = [r for r in rows if r["engine"] in CT2_ENVS and r["precision"] == precision
            and r["beam"] == beam]
    return min(mine, key=lambda r: r["median_wall_s"]) if mine else None


def markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    head = (f"{s['sentences']} sentences of {s['min_len']}-{s['max_len']} source pieces, "
            f"exactly {s['length']} target tokens each, batches of {BATCH}, {s['threads']} "
            f"threads, median of {s['rounds']} rounds. {m['cpu']}, torch {m['torch']}, "
            f"transformers {m['transformers']}, CTranslate2 {m['ctranslate2']}; load average "
            f"{report['loadavg_before'][0]:.2f} before, {report['loadavg_after'][0]:.2f} after.")
    out = [head, "", "| engine | precision | beam | sentences/s | target tokens/s "
           "| tokens/s, fastest round | vs transformers | vs CTranslate2's fastest setting "
           "| same output as nmt fp32 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    rows = report["rows"]
    by = {(r["engine"], r["precision"], r["beam"]): r for r in rows}
    for r in rows:
        hf = by.get(("hf", r["precision"], r["beam"]))
        prec = r["precision"] + (" (torch dynamic, nn.Linear)" if r["engine"] == "hf"
                                 and r["precision"] == "int8" else "")
        # nmt against CTranslate2's fastest environment at the same precision; bf16 against
        # its int8 (CTranslate2 has no bf16 on CPUs)
        ct2 = None
        if r["engine"] == "nmt":
            ct2 = fastest_ct2(rows, "int8" if r["precision"] == "bf16" else r["precision"],
                              r["beam"])
        elif r["engine"] in ENGINE_ENVS:      # the engine against CTranslate2 in its own env
            ct2 = by.get((ENGINE_ENVS[r["engine"]], r["precision"], r["beam"]))
        vs_hf = "" if not hf or r["engine"] in ENGINE_ENVS else \
            f"{hf['median_wall_s'] / r['median_wall_s']:.2f}x"
        vs_ct2 = (f"{ct2['median_wall_s'] / r['median_wall_s']:.2f}x ({ct2['precision']}, "
                  f"{NAMES[ct2['engine']]})" if ct2 else "")
        out.append(f"| {NAMES[r['engine']]} | {prec} | {r['beam']} | "
                   f"{r['sentences_per_s']:,.1f} | {r['tokens_per_s']:,.0f} | "
                   f"{r['target_tokens'] / min(r['walls_s']):,.0f} | {vs_hf} | {vs_ct2} | "
                   f"{100 * r['same_as_nmt_fp32']:.0f}% |")
    return "\n".join(out)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--length", type=int, default=30, help="target tokens per sentence")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", help="where the models go (default: a temporary directory)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--markdown", help="write the table here")
    ap.add_argument("--keep-outputs", action="store_true", help="output pieces in the JSON")
    ap.add_argument("--quick", action="store_true",
                    help="tiny model, 6 sentences of 6 tokens, 1 round, no warm-up: checks "
                         "the harness")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help=f"which to run, of {','.join(ENGINES)} (default: all)")
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--paths", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.sentences, args.length, args.rounds = 6, 6, 1
    args.engines = args.engines.split(",")
    if "nmt" not in args.engines or set(args.engines) - set(ENGINES):
        ap.error(f"--engines: nmt and any of {', '.join(ENGINES[1:])}")
    if min(args.sentences, args.length, args.rounds, args.threads) < 1:
        ap.error("--sentences, --length, --rounds and --threads must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    import tempfile

    import ctranslate2
    import transformers

    sys.path.insert(0, str(HERE))
    from run_all import machine_info

    size = QUICK if args.quick else OPUS_MT
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        paths = prepare(Path(args.work or tmp), size, args.sentences, args.seed)
        before = os.getloadavg()
        rows = measure(args, paths)
        after = os.getloadavg()
    machine = {**machine_info(args.threads, "cpu"), "transformers": transformers.__version__,
               "ctranslate2": ctranslate2.__version__}
    report = {"command": "python benchmarks/bench_import_speed.py " + " ".join(
                  a for a in (argv if argv is not None else sys.argv[1:])),
              "machine": machine, "model": size,
              "settings": {"sentences": args.sentences, "length": args.length,
                           "rounds": args.rounds, "threads": args.threads, "batch": BATCH,
                           "min_len": size["min_len"], "max_len": size["max_len"]},
              "loadavg_before": before, "loadavg_after": after, "rows": rows}
    table = markdown(report)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

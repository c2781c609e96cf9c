"""``lmctl frame encode|inspect``: frame v1 files (docs/frame-format.md).

``encode`` refuses (exit 2, nothing written) a frame over ``LM_MAX_FRAME_BYTES``, the limit ingest
answers 413 above — one setting for both (6 MiB by default, locally; the CDK stack sets 4 MiB, the
``max_frame_bytes`` context: ``lmctl --max-frame-bytes 4194304 frame encode ...`` checks against a
stack's limit). ``--allow-oversize`` writes it anyway (to test a collector's refusal).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import click

from lightmetrics.cli.options import identity_options, identity_or_exit, json_option
from lightmetrics.cli.output import EXIT_USAGE, console, emit_json, err_console, fail, kv_table
from lightmetrics.protocol.errors import ConfigError, FrameError


@click.group()
def frame() -> None:
    """Encode and inspect Lightmetrics frame v1 files."""


@frame.command("encode")
@identity_options
@click.option("--samples", "samples_path", required=True, type=click.Path(dir_okay=False), help="Samples JSONL.")
@click.option("--zstd", is_flag=True, help="Compress the samples block with zstd (frame flag).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the frame.")
@click.option("--allow-oversize", is_flag=True,
              help="Write a frame over LM_MAX_FRAME_BYTES anyway (ingest answers it 413).")
@json_option
def frame_encode(agent_id, boot_id, seq_start, seq_end, samples_path, zstd, output, allow_oversize,  # type: ignore[no-untyped-def]
                 as_json) -> None:
    """Encode samples (JSONL: metric, labels, ts_unix_ns, value) into a frame file (exit 2, nothing
    written, if it is over LM_MAX_FRAME_BYTES, unless --allow-oversize)."""
    from lightmetrics.deployment.settings import setting_from_env
    from lightmetrics.protocol.frame import encode_frame, load_samples_jsonl

    ident = identity_or_exit(agent_id, boot_id, seq_start, seq_end, as_json)
    try:
        limit = int(setting_from_env("max_frame_bytes"))
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE, as_json=as_json)
    try:
        lines = Path(samples_path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read samples file: {exc}", EXIT_USAGE, as_json=as_json)
    try:
        data = encode_frame(ident, load_samples_jsonl(lines), compress=zstd)
    except FrameError as exc:
        fail(f"{samples_path}: {exc}", EXIT_USAGE, as_json=as_json)
    over = len(data) > limit
    if over and not allow_oversize:
        fail(f"frame is {len(data)} bytes, over the {limit} byte limit (LM_MAX_FRAME_BYTES): ingest would answer "
             f"413; nothing written. Send fewer samples per batch{'' if zstd else ' or add --zstd'}, or pass "
             f"--allow-oversize to write it anyway", EXIT_USAGE, as_json=as_json)
    Path(output).write_bytes(data)
    info = {"output": output, "frame_bytes": len(data), "frame_sha256": hashlib.sha256(data).hexdigest(),
            "max_frame_bytes": limit, "oversize": over}
    if as_json:
        emit_json(info)
    else:
        console.print(kv_table("frame written", info.items()))
    if over:
        err_console.print(f"warning: {output} is {len(data)} bytes, over the {limit} byte limit (LM_MAX_FRAME_BYTES): "
                          f"ingest answers it 413 (written because of --allow-oversize)", markup=False)


@frame.command("inspect")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--samples", "show_samples", is_flag=True, help="Also list the samples.")
@json_option
def frame_inspect(path: str, show_samples: bool, as_json: bool) -> None:
    """Validate a frame file and summarize it (exit 2 if invalid)."""
    from lightmetrics.protocol.frame import decode_frame, summarize_frame

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        fail(f"cannot read {path}: {exc}", EXIT_USAGE, as_json=as_json)
    try:
        decoded = decode_frame(data)
    except FrameError as exc:
        fail(f"{path} is not a valid frame: {exc}", EXIT_USAGE, as_json=as_json)
    summary = summarize_frame(decoded, data)
    if show_samples:
        summary["samples"] = [s.to_json() for s in decoded.samples]
    if as_json:
        emit_json(summary)
        return
    console.print(kv_table(f"frame {path}", ((k, v) for k, v in summary.items() if k != "samples")))
    for s in summary.get("samples", []):
        console.print(json.dumps(s, sort_keys=True))


__all__ = ["frame"]

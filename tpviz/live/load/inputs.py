"""Input ids in (safetensors, JSON, text prompt or seeded random) and logits out (safetensors)."""
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tpviz.live.errors import LiveError


def check_input_ids(ids, vocab_size: int | None = None) -> torch.Tensor:
    """Return ids as an int64 [batch, seq] tensor with every id in [0, vocab_size), or raise one line."""
    if not isinstance(ids, torch.Tensor):
        try:
            ids = torch.tensor(ids)
        except (TypeError, ValueError, RuntimeError):
            raise LiveError("input ids must be equal-length rows of integers, "
                            "e.g. [[1, 2], [3, 4]]") from None
    if ids.numel() == 0:  # before the dtype: torch reads [] as float32
        raise LiveError(f"input ids are empty (shape {list(ids.shape)}): give at least one token id")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise LiveError(f"input ids must be integers, got {str(ids.dtype).replace('torch.', '')}")
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.numel() == 0:
        raise LiveError(f"input ids must have shape [batch, seq] and not be empty, got {list(ids.shape)}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0:
        raise LiveError(f"input id {lo} is negative")
    if vocab_size is not None and hi >= vocab_size:
        raise LiveError(f"input id {hi} is outside the vocabulary [0, {vocab_size})")
    return ids.to(torch.int64).contiguous()


def read_input_ids(path: str | Path, vocab_size: int | None = None) -> torch.Tensor:
    """Read --input-ids: a .safetensors file with an int64 `input_ids` [batch, seq], or a .json nested
    list."""
    path = Path(path)
    if path.is_dir():
        raise LiveError(f"input ids file {path} is a folder: give a .safetensors or .json file")
    if not path.is_file():
        raise LiveError(f"input ids file {path} does not exist")
    if path.suffix == ".json":
        try:
            return check_input_ids(json.loads(path.read_text()), vocab_size)
        except (ValueError, UnicodeDecodeError) as e:
            if isinstance(e, LiveError):
                raise
            raise LiveError(f"{path} is not valid JSON ({str(e).splitlines()[0]})") from None
    if path.suffix != ".safetensors":
        raise LiveError(f"input ids file {path.name} must end in .safetensors or .json")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise LiveError(f"{path} is not a readable safetensors file ({e})") from None
    if "input_ids" not in tensors:
        raise LiveError(f"{path} has no input_ids tensor (found: {', '.join(sorted(tensors)) or 'none'})")
    return check_input_ids(tensors["input_ids"], vocab_size)


def is_ids_text(text: str) -> bool:
    """Whether typed text is token ids (a JSON list, or integers separated by spaces or commas), not words."""
    text = text.strip()
    parts = text.replace(",", " ").split()
    return text.startswith("[") or bool(parts) and all(p.isascii() and p.isdigit() for p in parts)


def parse_ids_text(text: str, vocab_size: int | None) -> torch.Tensor:
    """Token ids typed by a user: JSON ([[1, 2], [3, 4]]) or whitespace/comma separated (one row)."""
    text = text.strip()
    if text.startswith("["):
        try:
            return check_input_ids(json.loads(text), vocab_size)
        except ValueError as e:
            if isinstance(e, LiveError):
                raise
            raise LiveError("token ids are not valid JSON; write e.g. [[1, 2, 3]] or 1 2 3") from None
    parts = text.replace(",", " ").split()
    # not '²', which int() refuses
    if not parts or not all(p.isascii() and p.lstrip("-").isdigit() for p in parts):
        raise LiveError("token ids must be integers, e.g. 1 2 3 (this model has no tokenizer, "
                        "so its input is token ids, not text)")
    return check_input_ids([[int(p) for p in parts]], vocab_size)


class TextTokenizer:
    """A checkpoint folder's own tokenizer: the tokenizers library on tokenizer.json when there is one (no
    transformers import, no remote code), else transformers' AutoTokenizer on local files
    (tokenizer.model)."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        try:
            if (folder / "tokenizer.json").is_file():  # start-up: a tokenizer library loads only for a prompt
                from tokenizers import Tokenizer
                self._fast, self._tok = True, Tokenizer.from_file(str(folder / "tokenizer.json"))
            else:  # start-up, as above; transformers is needed for tokenizer.model alone
                from transformers import AutoTokenizer
                self._fast = False
                self._tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except ImportError as e:  # tokenizers is a requirement; transformers (tokenizer.model only) is not
            raise LiveError(f"the tokenizer in {folder} needs the {e.name} package (pip "
                            f"install {e.name}), or give token ids") from None
        except Exception as e:  # both libraries raise many kinds for a broken tokenizer folder
            raise LiveError(f"cannot load the tokenizer in {folder} ({type(e).__name__})") from None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids if self._fast else self._tok(text)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        """Text of ids; ids the tokenizer does not know (a padded vocabulary's spare rows) are left out."""
        return self._tok.decode(list(ids), skip_special_tokens=False)


def tokenize(prompt: str, tokenizer_dir: str | Path, vocab_size: int) -> torch.Tensor:
    """Tokenize a text prompt with the checkpoint folder's own tokenizer (local files only, no remote
    code)."""
    if not prompt.strip():
        raise LiveError("the prompt is empty")
    ids = TextTokenizer(tokenizer_dir).encode(prompt)
    if not ids:
        raise LiveError("the prompt tokenizes to no tokens")
    return check_input_ids([ids], vocab_size)


def random_input_ids(vocab_size: int, batch: int = 2, seq_len: int = 32, seed: int = 0) -> torch.Tensor:
    """Seeded random ids over the whole vocabulary, so every rank's vocab block is looked up."""
    for what, n in (("batch", batch), ("seq_len", seq_len)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise LiveError(f"{what}={n!r} must be a positive integer")
    return torch.randint(0, vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(seed + 1))


def write_logits(path: str | Path, logits: torch.Tensor) -> None:
    """--dump-logits: a safetensors file with `logits`, float32 [batch, seq, vocab], vocab padding removed."""
    try:
        save_file({"logits": logits.detach().float().cpu().contiguous()}, str(path))
    except (OSError, SafetensorError) as e:  # safetensors reports an unwritable path as its own error
        raise LiveError(f"cannot write logits to {path} ({getattr(e, 'strerror', None) or e})") from None

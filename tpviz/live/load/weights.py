"""Safetensors checkpoints: load through the layers' weight_loaders, reading only this rank's slices.

The loader gets a CheckpointTensor instead of a tensor: when the loader narrows or chunks it, only
that slice is read from disk (safetensors `get_slice`), and its bytes are counted.
"""
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from tpviz.errors import TensorError, WeightsError
from tpviz.live.load.targets import MXFP4_PARTS, LoadingMap, layer_of
from tpviz.trace.checkpoint import index_weight_map



@dataclass
class ReadStats:
    """Bytes this rank read: `read` counts slice bytes, `spanned` the file range those slices cover."""
    read: int = 0
    spanned: int = 0  # a column slice of a row-major tensor spans (and pages in) nearly all of it


FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # safetensors' names; Run live computes in floating point
PACKED_DTYPES = ("U8",)


class CheckpointTensor:
    """A checkpoint tensor not read yet; `narrow` and `chunk(...)[i]` read just that part."""

    def __init__(self, handle, name: str, stats: ReadStats, box: list[tuple[int, int]] | None = None,
                 packed: bool = False):
        self._slice, self._handle, self.name, self._stats = handle.get_slice(name), handle, name, stats
        self.packed = packed  # MXFP4 blocks / scales: uint8 the loader dequantizes, not a float weight
        dtype = self._slice.get_dtype()
        if packed and dtype not in PACKED_DTYPES:
            raise TensorError(f"checkpoint tensor {name} is stored as {dtype}; MXFP4 blocks and scales are "
                               f"{', '.join(PACKED_DTYPES)}")
        if not packed and dtype not in FLOAT_DTYPES:  # a bool or int "weight" is no weight
            raise TensorError(f"checkpoint tensor {name} is stored as {dtype}; Run live reads float weights "
                               f"({', '.join(FLOAT_DTYPES)})")
        self._full = list(self._slice.get_shape())
        self._box = box or [(0, n) for n in self._full]

    @property
    def shape(self) -> torch.Size:
        return torch.Size(b - a for a, b in self._box)

    @property
    def ndim(self) -> int:
        return len(self._box)

    def dim(self) -> int:
        return self.ndim

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def _sub(self, dim: int, start: int, length: int) -> list[tuple[int, int]]:
        dim = dim % self.ndim
        if start < 0 or length < 0 or start + length > self.shape[dim]:
            raise TensorError(f"{self.name}: slice {start}:{start + length} is outside dim {dim} "
                               f"of {tuple(self.shape)}")
        box = list(self._box)
        box[dim] = (box[dim][0] + start, box[dim][0] + start + length)
        return box

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        return self._read(self._sub(dim, start, length))

    def chunk(self, chunks: int, dim: int = 0) -> list:
        # torch.chunk: equal chunks of ceil(n / chunks), last may be short
        size = -(-self.shape[dim] // chunks)
        return _LazyParts([(start, min(size, self.shape[dim] - start))
                           for start in range(0, self.shape[dim], size)],
                          self, dim)

    def split(self, sizes: list[int] | int, dim: int = 0) -> tuple["CheckpointTensor", ...]:
        if isinstance(sizes, int):
            sizes = [min(sizes, self.shape[dim] - s) for s in range(0, self.shape[dim], sizes)]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return tuple(CheckpointTensor(self._handle, self.name, self._stats, self._sub(dim, s, n), self.packed)
                     for s, n in zip(starts, sizes))

    def materialize(self) -> torch.Tensor:
        """Read this (possibly already narrowed) view."""
        return self._read(self._box)

    def __getattr__(self, attr):  # anything else a loader does: read the view whole, never silently wrong
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.materialize(), attr)

    def _read(self, box: list[tuple[int, int]]) -> torch.Tensor:
        t = self._slice[tuple(slice(a, b) for a, b in box)] if box else self._handle.get_tensor(self.name)
        if not torch.isfinite(t).all():  # a broken checkpoint, not a TP mismatch: say so before any forward
            where = ", ".join(f"{a}:{b}" for a, b in box) if box else "all"
            raise TensorError(f"checkpoint tensor {self.name} holds NaN or Inf values (in the "
                              f"part [{where}] this "
                               "rank reads); the checkpoint itself is broken, whatever the tp")
        self._stats.read += t.numel() * t.element_size()
        self._stats.spanned += _span(self._full, box, t.element_size())
        return t


class _LazyParts(list):
    """chunk() result: indexing reads only the chosen part."""

    def __init__(self, ranges, tensor: CheckpointTensor, dim: int):
        super().__init__(ranges)
        self._tensor, self._dim = tensor, dim

    def __getitem__(self, i):
        start, length = super().__getitem__(i)
        return self._tensor.narrow(self._dim, start, length)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _span(full: list[int], box: list[tuple[int, int]], itemsize: int) -> int:
    """Bytes from the first to the last element of `box` in a row-major tensor of shape `full`."""
    if not box or any(b <= a for a, b in box):
        return 0
    strides = [1] * len(full)
    for d in range(len(full) - 2, -1, -1):
        strides[d] = strides[d + 1] * full[d + 1]
    first = sum(a * st for (a, _), st in zip(box, strides))
    last = sum((b - 1) * st for (_, b), st in zip(box, strides))
    return (last - first + 1) * itemsize


def weights_root(folder: Path) -> Path:
    """Where a checkpoint's files may resolve to: the folder itself, or for a Hugging Face cache snapshot
    (models--owner--name/snapshots/<commit>, whose files link to ../../blobs) that repo's cache folder."""
    folder = folder.resolve()
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent
    return folder


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (via its index when sharded)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = index_weight_map(index, WeightsError)
        names = list(dict.fromkeys(weight_map.values()))
        if bad := [f for f in names if not isinstance(f, str) or not f]:
            raise WeightsError(f"{index} is not a valid safetensors index (weight_map value "
                               f"{bad[0]!r} is not a file name)")
        root, files = weights_root(folder), []
        for name in names:
            try:
                f = (folder / name).resolve()
            except (OSError, RuntimeError) as e:
                raise WeightsError(f"{index.name} names {name!r}, which cannot be resolved ({e})") from None
            if not f.is_relative_to(root):
                raise WeightsError(f"{index.name} names {name!r}, which is outside {folder}")
            files.append(f)
        # a Hugging Face cache snapshot may lack shards holding only decoder layers,
        if root != folder.resolve():
            # when a shrunk run fetched just the first ones (load_weights still refuses any tensor it lacks)
            others = {f for n, f in weight_map.items() if layer_of(n) is None}
            files = [f for f, name in zip(files, names) if f.exists() or name in others]
        missing = [f.name for f in files if not f.is_file()]  # is_file: a FIFO or device is no weight file
        if missing:
            raise WeightsError(f"{index.name} names {missing[0]}, which is not a regular file in {folder}")
        return files
    # as transformers picks: the index's shards, else model.safetensors (never a stray adapter or consolidated
    # file)
    single = folder / "model.safetensors"
    try:
        resolved = single.resolve()
    except (OSError, RuntimeError) as e:
        raise WeightsError(f"{single} cannot be resolved ({e})") from None
    if single.exists() and not resolved.is_relative_to(weights_root(folder)):  # a symlink out of the folder
        raise WeightsError(f"{single.name} points outside {folder}; copy the weights into the folder")
    if single.exists() and not resolved.is_file():
        raise WeightsError(f"{single.name} in {folder} is not a regular file (a FIFO, device or socket?)")
    return [resolved] if single.exists() else []


def _complete(owner: nn.Module, shard_ids: set) -> bool:
    """A fused parameter is loaded once all its parts are (or the fused tensor itself was)."""
    if None in shard_ids:
        return True
    if hasattr(owner, "packed_parts"):  # gpt-oss MXFP4 experts: blocks and scales both
        return shard_ids >= owner.packed_parts
    if hasattr(owner, "output_sizes"):  # MergedColumnParallelLinear
        return shard_ids >= set(range(len(owner.output_sizes)))
    if hasattr(owner, "kv_shard_index"):  # QKVParallelLinear
        return shard_ids >= {"q", "k", "v"}
    return bool(shard_ids)


def load_weights(model: nn.Module, folder: str | Path) -> ReadStats:
    """Load every parameter of a LiveForCausalLM through its weight_loader; return the bytes this rank
    read."""
    folder, stats = Path(folder), ReadStats()
    params = dict(model.named_parameters())  # tied lm_head shares embed_tokens' Parameter, listed once
    owners = {}  # parameter name -> the layer whose weight_loader and tp_dim apply to it
    for mname, module in model.named_modules():
        for pname, _ in module.named_parameters(recurse=False):
            owners[f"{mname}.{pname}" if mname else pname] = module
    tied, stage = model.cfg.spec.tie_word_embeddings, model.stage
    files = checkpoint_files(folder)
    if not files:
        raise WeightsError(f"no *.safetensors files in {folder}")
    loaded: dict[str, set] = {}
    targets = LoadingMap(model.cfg.spec, model.cfg.rules)
    for path in files:
        try:
            handle_ctx = safe_open(str(path), framework="pt", device="cpu")
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise WeightsError(f"{path.name} is not a readable safetensors file ({e})") from None
        with handle_ctx as handle:
            for ckpt_name in handle.keys():
                target = targets.target(ckpt_name)
                if target is None or (tied and target[0] == "lm_head.weight"):
                    continue
                pname, shard_id = target
                if tied and pname == "model.embed_tokens.weight" and not stage.embed and stage.last:
                    pname = "lm_head.weight"  # a later pipeline stage holds the tied head itself
                elif stage.elsewhere(pname):  # another stage's layer or another EP rank's expert: never read
                    continue
                if pname not in params:
                    raise WeightsError(f"checkpoint tensor {ckpt_name} has no place in this "
                                       f"{model.cfg.spec.model_type} model (wrong architecture?)")
                param, owner = params[pname], owners[pname]
                # sharded params get a lazy view; replicated ones (norms, row-parallel bias) are read whole
                tp_dim = getattr(owner, "tp_dim", None)
                data = CheckpointTensor(handle, ckpt_name, stats, packed=shard_id in MXFP4_PARTS.values())
                if tp_dim is None or param.ndim <= tp_dim:
                    data = data.materialize()
                try:
                    if shard_id is None:
                        param.weight_loader(param, data)
                    else:
                        param.weight_loader(param, data, shard_id)
                except TensorError:  # already names the tensor
                    raise
                except (WeightsError, RuntimeError) as e:  # name the tensor, whatever the loader said
                    raise TensorError(f"checkpoint tensor {ckpt_name} does not fit {pname}: {e}") from None
                loaded.setdefault(pname, set()).add(shard_id)
    missing = [n for n in params if not _complete(owners[n], loaded.get(n, set()))]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise WeightsError(f"checkpoint in {folder} lacks {missing[0]}{more}")
    return stats



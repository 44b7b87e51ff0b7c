"""Block-sparsity patterns for flashgen.attention(sparsity=...).

BlockLayout: a 0/1 block mask turned into the C library's fg_layout once per
device and reused by every call. BlockMask: a mask predicate's blocks,
classified on the GPU (flashgen.create_block_mask). Butterfly: a fixed
pattern, no mask at all. Block sizes are (queries, keys), multiples of 16."""
import threading
import weakref

from . import _native


def _block_size(block_size):
    if isinstance(block_size, int):
        block_size = (block_size, block_size)
    try:
        bq, bk = (int(b) for b in block_size)
    except (TypeError, ValueError):
        raise ValueError(f"block_size: {block_size!r}; an int or a (queries, keys) pair") from None
    if bq < 16 or bk < 16 or bq % 16 or bk % 16:
        raise ValueError(f"block_size: ({bq}, {bk}); both must be positive multiples of 16")
    return bq, bk


def _mask_bytes(mask):
    """(heads, blocks_q, blocks_k) and the row-major 0/1 bytes of a 2-D or
    3-D mask: a torch tensor, a NumPy array or nested lists."""
    if hasattr(mask, "detach"):  # torch
        mask = mask.detach().cpu().tolist()
    elif hasattr(mask, "tolist"):  # numpy
        mask = mask.tolist()
    rows = mask if mask and isinstance(mask[0][0], (list, tuple)) else [mask]
    heads, blocks_q = len(rows), len(rows[0])
    blocks_k = len(rows[0][0]) if blocks_q else 0
    flat = []
    for h, head in enumerate(rows):
        if len(head) != blocks_q or any(len(r) != blocks_k for r in head):
            raise ValueError(f"mask: head {h} is not a ({blocks_q}, {blocks_k}) matrix")
        for r in head:
            flat.extend(r)
    if not flat:
        raise ValueError("mask: empty")
    bad = next((x for x in flat if x not in (0, 1, True, False)), None)
    if bad is not None:
        raise ValueError(f"mask: holds {bad!r}; entries must be 0 or 1")
    return (heads, blocks_q, blocks_k), bytes(int(x) for x in flat)


_registry = weakref.WeakValueDictionary()
_next_id = [1]
_registry_lock = threading.Lock()


class BlockLayout:
    """mask: (heads, blocks_q, blocks_k) or (blocks_q, blocks_k) of 0/1,
    heads 1 (shared) or the number of query heads; block (i, j) kept when 1.
    blocks_q and blocks_k must be ceil(seqlen / block) of the calls it serves.
    Keep the object while calls (or a compiled graph) use it."""

    def __init__(self, mask, block_size):
        self.block_size = _block_size(block_size)
        self.shape, self._bytes = _mask_bytes(mask)
        self._handles = {}  # device index -> fg_layout
        self._lock = threading.Lock()
        with _registry_lock:
            self.id = _next_id[0]
            _next_id[0] += 1
            _registry[self.id] = self

    def __repr__(self):
        return f"flashgen.BlockLayout(shape={self.shape}, block_size={self.block_size})"

    def handle(self, device_index):
        """The fg_layout on a device, uploaded on first use."""
        h = self._handles.get(device_index)
        if h is None:
            with self._lock:
                h = self._handles.get(device_index)
                if h is None:
                    ctx = _native.device_context(device_index)
                    h = self._handles[device_index] = ctx.layout(self._bytes, *self.shape)
        return h

    def __del__(self, destroy=_native.destroy_layout):  # bound now: at exit _native may be gone
        for h in getattr(self, "_handles", {}).values():
            destroy(h)


class BlockMask:
    """A mask predicate's block mask, made by flashgen.create_block_mask: for
    each block of queries and keys, whether the predicate holds nowhere (the
    kernels skip the block), everywhere (they skip its test) or in part.
    Pass it as sparsity= to flashgen.attention with calls of its lengths
    (and its batch and heads where the predicate reads b or h); the call
    takes its mask_mod and aux unless given its own. It holds the aux
    tensors' contents at the build: make it again when they change. Keep it
    while calls or compiled graphs use it."""

    def __init__(self, handle, device_index, mask_mod, aux, block_size, lengths):
        self._handles = {device_index: handle}
        self.device_index = device_index
        self.mask_mod = mask_mod
        self.aux = dict(aux)  # name -> tensor, kept referenced
        self.block_size = block_size
        self.seq_lengths = lengths
        with _registry_lock:
            self.id = _next_id[0]
            _next_id[0] += 1
            _registry[self.id] = self

    def __repr__(self):
        return (f"flashgen.BlockMask({self.mask_mod!r}, seq_lengths={self.seq_lengths}, "
                f"block_size={self.block_size})")

    def handle(self, device_index):
        if device_index != self.device_index:
            raise ValueError(f"sparsity: a block mask built on cuda:{self.device_index}, used on "
                             f"cuda:{device_index} (build one for that device)")
        return self._handles[device_index]

    def __del__(self, destroy=_native.destroy_layout):
        for h in getattr(self, "_handles", {}).values():
            destroy(h)


class Butterfly:
    """Block (i, j) kept iff i xor j is 0 or a power of two below 2**factors."""

    def __init__(self, factors, block_size):
        factors = int(factors)
        if not 0 <= factors <= 30:
            raise ValueError(f"factors: {factors}; must be in 0..30")
        self.factors = factors
        self.block_size = _block_size(block_size)

    def __repr__(self):
        return f"flashgen.Butterfly(factors={self.factors}, block_size={self.block_size})"


def layout_by_id(layout_id):
    layout = _registry.get(layout_id)
    if layout is None:
        raise ValueError(f"sparsity: block layout {layout_id} no longer exists (keep the "
                         "BlockLayout while calls or compiled graphs use it)")
    return layout


def describe(sparsity):
    """(kind, block_q, block_k, butterfly_factors, layout_id) for the ops."""
    if sparsity is None:
        return 0, 0, 0, 0, 0
    if isinstance(sparsity, (BlockLayout, BlockMask)):
        return 1, *sparsity.block_size, 0, sparsity.id
    if isinstance(sparsity, Butterfly):
        return 2, *sparsity.block_size, sparsity.factors, 0
    raise TypeError(f"sparsity: {type(sparsity).__name__}; expected None, "
                    "flashgen.BlockLayout, flashgen.BlockMask or flashgen.Butterfly")

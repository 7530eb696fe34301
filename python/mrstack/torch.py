"""mrstack as PyTorch's CUDA allocator.

    import mrstack.torch
    mrstack.torch.install()   # before PyTorch touches CUDA

PyTorch then allocates through `torch.cuda.memory.CUDAPluggableAllocator`, loading
``mrstack_torch_alloc`` and ``mrstack_torch_free`` from the same libmrstack_c.so this
package uses, so its tensors come from the same per-device stacks as Numba's and CuPy's
arrays, ordered on PyTorch's current stream, and count under the client "torch"
(`mrstack.statistics()`).

PyTorch can swap its allocator only before it initializes CUDA; `install()` says so
clearly when it is too late. PyTorch does not check what its allocator returns: when
mrstack refuses a request, the reason is printed on stderr (and kept as the thread's last
error) and PyTorch receives a null pointer.
"""

from . import _lib
from ._lib import MrstackError

__all__ = ["install", "installed"]

_installed = None


def installed():
    """True once `install()` succeeded in this process."""
    return _installed is not None


def install():
    """Makes PyTorch allocate CUDA memory from mrstack. Idempotent."""
    global _installed
    if _installed is not None:
        return _installed
    import torch

    path = _lib.library().path  # the very file this package loaded: one set of stacks per process
    if torch.cuda.is_initialized():
        raise MrstackError(
            "mrstack.torch.install(): PyTorch has already initialized CUDA and with it its own "
            "allocator, which it cannot swap any more; call install() before the first CUDA "
            "tensor or torch.cuda call (for example right after `import torch`)", "MRSTACK_ERROR_STATE")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "mrstack_torch_alloc", "mrstack_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise MrstackError(
            f"mrstack.torch.install(): PyTorch refused to change its allocator ({e}); call install() "
            "before PyTorch allocates CUDA memory", "MRSTACK_ERROR_STATE") from e
    _installed = allocator
    return allocator

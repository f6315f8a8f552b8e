"""meshminer's own GPU kernels (Triton), each with a pure-torch reference.

What the rest of meshminer calls:
- `quantize_blockwise(x, block_size=256, bits=8) -> QuantizedTensor` and
  `dequantize_blockwise(q) -> Tensor`: int8 codes (-127..127, or -7..7 with `bits=4`,
  which only the reference computes) with a float32 absmax scale per block, for
  weight changes on the wire (`quant`).
- `outer_nesterov_step_(params, momentum_buffer, deltas, lr=, momentum=)`: the
  owner's elastic-round step, dequantize + average K deltas + Nesterov SGD in one
  pass (`outer`); `QuantizedBatch` holds the K deltas.
- `adamw_step_(params, grads, exp_avg, exp_avg_sq, lr=, ..., step=)` and
  `FlatAdamW`: AdamW over one flat buffer, one launch per step (`adamw`).
- `encode_delta`, `decode_delta`, `to_wire`, `from_wire`: to and from
  `protocol.tensors.CompressedTensor` and its bytes (`wire`).

Every op is a `torch.library` custom op (`torch.ops.meshminer.*`) with a fake
implementation, so it traces under torch.compile. It runs its Triton kernel
(`_kernels`) on CUDA tensors when Triton is installed, and its reference
(`reference`) otherwise: on CPU, and in the base install, which has no Triton; the
choice is `_dispatch`'s. In a process started with `TRITON_INTERPRET=1`,
`triton_on_cpu()` (`testing`) runs the kernels on CPU tensors in Triton's
interpreter: that is how the tests check kernels against references without a GPU.
See docs/ops.md for tolerances, error bounds, dispatch and benchmarks.
"""

from training.ops._dispatch import triton_available
from training.ops.adamw import FlatAdamW, adamw_step_
from training.ops.outer import outer_nesterov_step_
from training.ops.quant import (
    DEFAULT_BLOCK_SIZE,
    QuantizedBatch,
    QuantizedTensor,
    dequantize_blockwise,
    quantize_blockwise,
)
from training.ops.wire import decode_delta, encode_delta, from_wire, to_wire
from training.run.no_dynamo import skip_dynamo_wrappers

# nothing here runs under torch.compile: the ops' kernels need not import torch._dynamo
skip_dynamo_wrappers()

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "FlatAdamW",
    "QuantizedBatch",
    "QuantizedTensor",
    "adamw_step_",
    "decode_delta",
    "dequantize_blockwise",
    "encode_delta",
    "from_wire",
    "outer_nesterov_step_",
    "quantize_blockwise",
    "to_wire",
    "triton_available",
]

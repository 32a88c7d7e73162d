"""rpa: ragged paged attention on the CPU, with JAX's API.

Switching from JAX is a one-line import change:

    # from jax.experimental.pallas.ops.tpu.ragged_paged_attention import (
    #     ragged_paged_attention)
    from rpa import ragged_paged_attention

    out = ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens,
                                 num_seqs, sm_scale=head_dim ** -0.5)

Inputs are NumPy arrays (float32, float16) or torch tensors (float32, float16,
bfloat16), read in place whenever their memory layout allows; the result is of
the caller's kind. Separate K/V caches (vLLM, FlashInfer) are passed as
`kv_pages=(k_pages, v_pages)` with `kv_layout="NHD"` or `"HND"`. Every invalid
input raises ValueError (rpa.Error) with JAX's message and a fix, before
anything is written. `python -m rpa` prints the build and runs an example.
"""

from ._rpa import __version__, build_info
from ._api import (
    DEFAULT_MASK_VALUE,
    Error,
    dynamic_validate_inputs,
    explain_block_sizes,
    get_tuned_block_sizes,
    load_tuned_block_sizes,
    paged_attention,
    ragged_paged_attention,
    ref_ragged_paged_attention,
    static_validate_inputs,
)

__all__ = [
    "DEFAULT_MASK_VALUE",
    "Error",
    "__version__",
    "build_info",
    "dynamic_validate_inputs",
    "explain_block_sizes",
    "get_tuned_block_sizes",
    "load_tuned_block_sizes",
    "paged_attention",
    "ragged_paged_attention",
    "ref_ragged_paged_attention",
    "static_validate_inputs",
]

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

The functions:

    ragged_paged_attention        JAX's kernel: mixed prefill and decode
    ref_ragged_paged_attention    the reference it is tested against
    static_validate_inputs        JAX's checks of shapes, dtypes, options
    dynamic_validate_inputs       ... and of the metadata's values
    paged_attention               JAX's decode-only paged attention
    ragged_paged_attention_with_kv_write
                                  write the step's new K/V into the cache
                                  (in place), then attend, in one call
    merge_states                  combine two partial attentions (their
                                  outputs and LSEs) over disjoint keys
    quantize, dequantize          float8_e4m3fn / float8_e5m2 / int8 codes
                                  with a scale, as the library converts them
    get_tuned_block_sizes         JAX's block-size lookup (the library's
    explain_block_sizes           choice, and why)
    load_tuned_block_sizes        use a table written by `rpa tune`

Beyond JAX's arguments, keyword-only: `kv_layout`, `kv_dtype` (a uint8 cache
of float8 codes, since NumPy has no float8), `sinks`, `return_lse`,
`num_threads`, `out`.
"""

from ._rpa import __version__, build_info
from ._api import (
    DEFAULT_MASK_VALUE,
    Error,
    dequantize,
    dynamic_validate_inputs,
    explain_block_sizes,
    get_tuned_block_sizes,
    load_tuned_block_sizes,
    merge_states,
    paged_attention,
    quantize,
    ragged_paged_attention,
    ragged_paged_attention_with_kv_write,
    ref_ragged_paged_attention,
    static_validate_inputs,
)

__all__ = [
    "DEFAULT_MASK_VALUE",
    "Error",
    "__version__",
    "build_info",
    "dequantize",
    "dynamic_validate_inputs",
    "explain_block_sizes",
    "get_tuned_block_sizes",
    "load_tuned_block_sizes",
    "merge_states",
    "paged_attention",
    "quantize",
    "ragged_paged_attention",
    "ragged_paged_attention_with_kv_write",
    "ref_ragged_paged_attention",
    "static_validate_inputs",
]

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
    BatchAttention                plan once per step, run per layer
                                  (FlashInfer's plan/run; its CSR page
                                  table with plan_csr)
    CascadeAttention              shared-prefix attention: one CSR page
                                  table per level of sharing, merged by LSE
                                  (FlashInfer's MultiLevelCascadeAttention)
    vllm_page_table               vLLM's query_start_loc / seq_lens /
                                  block_table as JAX's page table
    BatchMLAAttention             DeepSeek's multi-head latent attention
                                  (FlashInfer's MLA plan/run; docs/mla.md)
    quantize, dequantize          float8_e4m3fn / float8_e5m2 / int8 codes
                                  with a scale, as the library converts them
    get_tuned_block_sizes         JAX's block-size lookup (the library's
    explain_block_sizes           choice, and why)
    load_tuned_block_sizes        use a table written by `rpa tune`

Beyond JAX's arguments, keyword-only: `kv_layout`, `kv_dtype` (a uint8 cache
of float8 codes, since NumPy has no float8), `sinks`, `return_lse`,
`num_threads`, `out`, `causal`, `alibi_slopes`, `custom_mask`,
`packed_custom_mask`.

Past one machine: `rpa.distributed` (import it explicitly; torch.distributed)
splits a batch's pages across ranks and merges their partial attentions
(context parallelism), or slices the heads (tensor parallelism).

torch operators: `torch.ops.rpa.ragged_paged_attention` (and `.out`),
`ragged_paged_attention_with_lse`, `reshape_and_cache`, `merge_states`,
`concat_and_cache_mla` and `cache_mla` (rpa.torch), registered as soon as
torch is imported, before or after rpa;
`import rpa` never imports torch itself.
"""

from ._rpa import __version__, build_info
from ._batch import BatchAttention, vllm_page_table
from ._cascade import CascadeAttention
from ._mla import BatchMLAAttention
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
    default_num_threads,
    describe_threads,
    set_cpu_binding,
    static_validate_inputs,
)



def _register_torch_ops():
  """Imports rpa.torch, which defines torch.ops.rpa.*; a failure (an old
  torch) is a warning, never an error of `import rpa` or `import torch`."""
  try:
    import importlib

    importlib.import_module(__name__ + ".torch")
  except Exception as e:  # noqa: BLE001
    import warnings

    warnings.warn(f"rpa: torch.ops.rpa is not registered: {type(e).__name__}: {e}")


class _TorchImportHook:
  """A sys.meta_path finder that waits for `import torch`: it lets the usual
  finders locate torch and registers rpa's operators once torch's module has
  executed. Removes itself at once, so it runs at most one time."""

  @classmethod
  def find_spec(cls, name, path=None, target=None):
    if name != "torch":
      return None
    import sys

    if cls in sys.meta_path:
      sys.meta_path.remove(cls)
    import importlib.util

    spec = importlib.util.find_spec(name)
    loader = getattr(spec, "loader", None)
    if loader is None or not hasattr(loader, "exec_module"):
      return spec
    exec_module = loader.exec_module

    def exec_then_register(module):
      exec_module(module)
      _register_torch_ops()

    loader.exec_module = exec_then_register
    return spec


def _torch_ops_when_torch_loads():
  import sys

  if "torch" in sys.modules:
    _register_torch_ops()
  elif _TorchImportHook not in sys.meta_path:
    sys.meta_path.insert(0, _TorchImportHook)


_torch_ops_when_torch_loads()

__all__ = [
    "BatchAttention",
    "CascadeAttention",
    "BatchMLAAttention",
    "DEFAULT_MASK_VALUE",
    "Error",
    "__version__",
    "build_info",
    "dequantize",
    "dynamic_validate_inputs",
    "explain_block_sizes",
    "get_tuned_block_sizes",
    "load_tuned_block_sizes",
    "set_cpu_binding",
    "default_num_threads",
    "describe_threads",
    "merge_states",
    "paged_attention",
    "quantize",
    "ragged_paged_attention",
    "ragged_paged_attention_with_kv_write",
    "ref_ragged_paged_attention",
    "static_validate_inputs",
    "vllm_page_table",
]
